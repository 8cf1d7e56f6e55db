// DecodeBatcher — where the slots of `strata serve --parallel N` meet for continuous batching.
//
// Each slot is a scheduler worker thread running one generation (serve/generator.h) the way a
// single-slot server does; only its decode step goes through here. A step is one window with one
// row per slot in the decode phase (Session::decode_together → WindowRunner::run_batch): the dense
// weights and the union of the slots' experts are read once per step, and each slot's logits are
// bitwise what it would get alone. Slots join and leave between steps:
// - `join` when a slot has prefilled its prompt and is about to decode; `leave` when its
//   generation ends (finished, stopped, cancelled or failed). A slot that is still prefilling is
//   not a member, so it does not hold the step back; its prefill windows and the steps take
//   turns on the engine lock (a FairMutex: a step waits only for the windows queued before it).
// - `decode(session, token)` adds the slot's row to the coming step and returns once that step
//   ran. The step runs as soon as every member has added its row (the last one to arrive, or any
//   waiter woken by a leave, runs it on its own thread, holding the engine lock). A step that
//   throws rethrows in every slot of it.
// - `prefill(session, window)`: a slot that is not a member (still prefilling) puts one of its
//   prefill windows into the coming step as rows of its own (Session::set_prefill_runner), and
//   returns once that step ran. It does not hold the step back: the step waits for the members'
//   rows only (with no member it runs at once), so prompts of joining requests are processed in
//   the same windows as the others' decode rows, and the windows of prompts that arrive while a
//   step runs share the next one.
//   Each sequence's rows give the bits they give alone (Session::feed_together).
// - Groups (`BatchGroups`, strata serve --batch-groups G; by default G is chosen at start by
//   the auto rule of serve/batch_groups.h): a step of at least two sequences is cut into up to G
//   windows of consecutive sequences, about the same rows each, run side by side,
//   each on its own thread pool (threads / G threads) with its own window buffers and its own
//   view of the file mapping's experts. Why: on a small model a step is compute, not weight
//   reads, and a window split over threads hands out hundreds of tiny products per step whose
//   cache lines cross between cores; a group keeps its rows on its own cores (docs/serve.md,
//   "Batch groups"). The bits do not change (each sequence's rows give what they give alone), but
//   the dense weights and a shared expert are read once per group, not once per step. Groups need
//   the experts read from the mapping (no RAM-budget store: its residency is one state). The
//   sessions' own source still sees every group's routing and publishes, one group at a time
//   (UnionCounter), so the dashboard's expert heat and byte counts cover grouped steps. A full
//   context fails the whole step before any group runs (Session::check_together).
//
// Counters (`stats`): steps, rows (slot-steps), the largest step, and the experts each step's
// layers fetched (the union over its rows, counted by a pass-through ExpertSource around the
// slots' source), for /metrics and the bench.
//
// Thread safety: every method from any thread; `decode`, `join`, `leave` by member slots as
// stated. The batch window's buffers are touched only by the thread running a step, under the
// engine lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/session.h"
#include "experts/expert_source.h"
#include "util/fair_mutex.h"

namespace strata::serve {

struct BatchStats {
  uint64_t steps = 0;     // batched decode windows run
  uint64_t rows = 0;      // slot-steps: tokens decoded through them
  uint64_t max_rows = 0;  // the largest step
  // Routed layers of those steps, and the experts they fetched: each layer of a step reads the
  // union of its rows' experts once, so union / layer_steps against rows / steps · top-k says
  // how much the rows shared (where MoE batching pays).
  uint64_t layer_steps = 0;
  uint64_t expert_union = 0;
  // Prefill windows that rode in the steps, and their rows (prompt tokens; not in `rows`).
  uint64_t prefill_windows = 0;
  uint64_t prefill_rows = 0;
  // Windows run by steps cut into groups (--batch-groups; 0 with one group): a step of g groups
  // counts g here and 1 in `steps`.
  uint64_t group_windows = 0;
};

struct BatchGroups {
  int groups = 1;                // windows a step is cut into (1: one window, the default)
  int threads = 1;               // threads in all; each group's pool has threads / groups (>= 1)
  const Model* model = nullptr;  // whose mapping each group reads its experts from (groups > 1)
};

class DecodeBatcher {
 public:
  // `engine` is the lock every window of the server runs under (Session::set_window_lock).
  // Throws when groups > 1 without a model, or groups < 1.
  explicit DecodeBatcher(FairMutex& engine, const BatchGroups& groups = {});
  ~DecodeBatcher();

  void join();
  // REQUIRES: joined, not inside decode.
  void leave();
  // REQUIRES: joined. Feeds `token` to `session` in the next step; returns when it ran.
  void decode(Session& session, int32_t token);
  // REQUIRES: not joined. Feeds `window` (non-empty) to `session` in the next step; returns when
  // it ran.
  void prefill(Session& session, std::span<const int32_t> window);

  BatchStats stats() const;

  // A slot's membership: `join` once (later calls do nothing), `leave` when done; the
  // destructor leaves (also when the generation throws).
  class Membership {
   public:
    Membership() = default;
    ~Membership() { leave(); }
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;
    void join(DecodeBatcher& batcher) {
      if (batcher_) return;
      batcher.join();
      batcher_ = &batcher;
    }
    void leave() {
      if (batcher_) batcher_->leave();
      batcher_ = nullptr;
    }

   private:
    DecodeBatcher* batcher_ = nullptr;
  };

 private:
  // Adds session's rows to the coming step and waits for it (member: one of the rows a step
  // waits for).
  void feed(Session& session, std::span<const int32_t> tokens, bool member);
  // REQUIRES: lock held, not running, the step full. Runs it (unlocking meanwhile).
  void run_step(std::unique_lock<std::mutex>& lock);
  bool step_ready() const { return !running_ && !sessions_.empty() && member_rows_ >= members_; }

  FairMutex& engine_;
  mutable std::mutex mutex_;  // guards everything below but window_
  std::condition_variable changed_;
  size_t members_ = 0;
  std::vector<Session*> sessions_;  // the coming step's sequences
  std::vector<int32_t> tokens_;     // their tokens, one after the other
  std::vector<size_t> counts_;      // how many each
  std::vector<bool> decoding_;      // whether a member's decode row (or a prefill window)
  size_t member_rows_ = 0;          // members' rows in the coming step
  bool running_ = false;
  uint64_t completed_ = 0;  // steps run so far; a step's number is completed_ when it starts
  uint64_t failed_step_ = UINT64_MAX;
  std::exception_ptr failure_;
  BatchStats stats_;
  // Passes every call to `inner` unchanged and counts the union each publish asks for. In a group
  // (`observer` set), the sessions' own source (the dashboard's monitor around the model's
  // mapping) also sees each routing and each publish, one group at a time under
  // `observer_mutex`, so its expert heat and byte counts cover grouped steps; what it would
  // deliver is drained and dropped (the group computes with its own views of the same matrices).
  class UnionCounter final : public ExpertSource {
   public:
    ExpertSource* inner = nullptr;
    ExpertSource* observer = nullptr;
    std::mutex* observer_mutex = nullptr;
    uint64_t layers = 0, experts = 0;
    void observe_routing(int layer, const Routing& routing) override {
      inner->observe_routing(layer, routing);
      if (!observer) return;
      std::lock_guard lock(*observer_mutex);
      observer->observe_routing(layer, routing);
    }
    void publish(int layer, std::span<const int32_t> ids) override {
      ++layers;
      experts += ids.size();
      inner->publish(layer, ids);
      if (!observer) return;
      std::lock_guard lock(*observer_mutex);
      observer->publish(layer, ids);
      observer->wait();
    }
    std::span<const DeliveredExpert> wait() override { return inner->wait(); }
    bool wants_guess() const override { return inner->wants_guess(); }
    void publish_guess(int layer, std::span<const int32_t> ids) override {
      inner->publish_guess(layer, ids);
    }
    MocePolicy* moce() override { return inner->moce(); }
    bool resident(int layer, int32_t expert) const override {
      return inner->resident(layer, expert);
    }
    std::vector<HostRegion> host_regions() const override { return inner->host_regions(); }
    bool pointers_stay_valid() const override { return inner->pointers_stay_valid(); }
  };

  // One window of a step cut into groups: its pool, buffers and expert views, and its sequences.
  struct Group {
    std::unique_ptr<compute::ThreadPool> pool;
    std::unique_ptr<ExpertSource> experts;
    BatchWindow window;
    UnionCounter counter;
    std::vector<Session*> sessions;
    std::vector<std::span<const int32_t>> spans;
  };
  // Runs step_sessions_ as groups (REQUIRES: at least two groups and two sequences, engine_ held);
  // returns how many groups ran.
  size_t run_groups();

  BatchWindow window_;  // only the thread running a step, under engine_
  UnionCounter counter_;
  std::vector<std::unique_ptr<Group>> groups_;         // empty: one window per step
  std::mutex observer_mutex_;  // the groups' calls into the sessions' source (UnionCounter)
  std::unique_ptr<compute::ThreadPool> group_runner_;  // one thread per group, the caller's first
  std::vector<Session*> step_sessions_;
  std::vector<int32_t> step_tokens_;
  std::vector<size_t> step_counts_;
  std::vector<bool> step_decoding_;
  std::vector<std::span<const int32_t>> step_spans_;
};

}  // namespace strata::serve
