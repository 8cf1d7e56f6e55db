// ExpertStore — routed experts staged in a RAM arena of fixed slots, read on demand from the
// sidecar or straight from the GGUF (an ExpertReader: experts/sidecar_reader.h,
// experts/gguf_reader.h).
//
// It puts four pieces together and hands the MoE layer its experts (ExpertSource):
//   residency   experts/slot_residency.h  smap, LRU, pins, limbo, read-ahead's cap: every decision
//   memory      experts/expert_arena.h    the one mapping and its slots
//   I/O         experts/expert_reads.h    reads on the I/O pool, the read in flight per slot
//   statistics  experts/store_stats.h     the counters (residency's, plus bytes and waits)
// What is left here: which experts each wait() delivers, transient slots, and prompt-hot pins'
// scores (prompt heat, usage history).
//
// What it promises
// - Memory: one anonymous mapping made at construction and never grown: `slots_per_layer` cache
//   slots for every block with routed experts (each the reader's slot_bytes for that block: the
//   size classes) plus `stream_slots` transient slots of the largest. A budget in bytes buys
//   slots_per_layer = budget / Σ_layers slot_bytes (at least 1). Nothing else grows with the model:
//   the GGUF mapping is never touched for routed experts (pread / io_uring reads only).
//   No heap allocation per layer once warm: publish / wait / publish_guess reuse member lists and
//   the I/O pool recycles its tickets and queue storage, reserved at construction for every read
//   the slots can have in flight (tests/engine/zero_alloc_test.cpp).
// - smap[layer][expert] holds the cache slot of every resident expert (or kMiss). Eviction is LRU
//   per layer over unpinned slots not used by the current window. A miss takes a cache slot when
//   one can be evicted, else a transient slot that is recycled as soon as that expert is computed
//   (so even 1 slot per layer works, streaming the rest).
// - Deterministic residency ("limbo"): smap and the LRU state change only on the window's thread,
//   at fixed points — publish (hits touched, misses given slots in ascending id) and publish_guess
//   (read-ahead targets given slots, most likely first) — never when a read completes. A slot whose
//   read is still in flight counts as resident; using it waits for the read. Which experts are
//   resident after any window therefore depends only on the tokens, never on I/O timing, which is
//   what lets MoCE-style routing read residency without making tokens depend on the disk.
// - Reads: misses go to the I/O pool's urgent queue, read-ahead to its read-ahead queue (a
//   read-ahead target that the layer then needs is promoted). The reader cuts an expert into
//   jobs (sidecar: chunk-aligned pieces of `split_bytes`, checksummed; GGUF: one io_uring
//   submission of the three slices, or one pread job per slice). A failed/short read or a checksum
//   mismatch throws strata::Error from wait() naming the file, layer and expert. O_DIRECT is used
//   when the filesystem allows it (otherwise a one-time warning and buffered reads).
// - Resident-first: the first wait() delivers every hit whose bytes are there (and any read that
//   already landed) at once; each later wait() blocks for the oldest read in flight unless one
//   finished, then delivers every finished one. A miss beyond the transient slots waits for the
//   slots of the batch before it (freed at the next wait).
// - Startup fill: `fill` loads the given experts per layer (a profile's or usage history's ranking)
//   and pins the first `n_pinned` of each layer; pinned slots are never evicted.
// - Prompt-hot pins: observe_routing counts every routed (row, expert) since reset_prompt_heat();
//   pin_prompt_hot (called between windows, e.g. after a prompt's prefill) pins the experts the
//   prompt used most (blended with the usage history when one is attached), at most half a layer's
//   slots, changing at most `max_swaps` pins per layer per call and only for a clearly better
//   candidate (hysteresis). Like everything above it depends only on the tokens.
// - Usage history: with attach_history, observe_routing also counts into it; export_lru fills in
//   each layer's LRU order before it is saved.
// - Values: a slot holds the exact bytes of the GGUF tensors (pack copies them verbatim; the GGUF
//   reader reads them in place), so results are bitwise those of the mapped source for every
//   budget, thread count, reader and setting.
// - Single window thread: publish/wait/publish_guess/fill and the stats are not thread-safe; the
//   I/O pool's threads only write slot bytes and completion flags.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compute/expert_tier.h"
#include "experts/expert_arena.h"
#include "experts/expert_reader.h"
#include "experts/expert_reads.h"
#include "experts/expert_source.h"
#include "experts/io_pool.h"
#include "experts/sidecar.h"
#include "experts/slot_residency.h"
#include "experts/store_stats.h"
#include "experts/usage_history.h"

namespace strata {

struct ExpertStoreOptions {
  uint64_t budget_bytes = 0;   // cache bytes; used when slots_per_layer == 0
  int slots_per_layer = 0;     // > 0: exactly this many cache slots per block (capped at n_expert)
  int io_threads = 4;
  int urgent_only_threads = 1;  // of io_threads, reserved for misses
  bool read_ahead = true;
  bool direct_io = true;
  bool io_uring = true;               // when the kernel allows it; else pread
  uint64_t split_bytes = 512 * 1024;  // sidecar: rounded up to its checksum chunk
  int stream_slots = 0;               // 0: max(4, io_threads)
};

class GgufFile;
class UsageHistory;
class DensePrefetch;

// The shape of every block's routed experts ([block], the MTP block included; present = false for
// a block without them): Model::block_expert_layouts() (model/model.h).
using ExpertLayout = std::vector<compute::ExpertLayerLayout>;

// A model the store can be built for: it says its expert layout and its GGUF (Model,
// model/model.h).
template <class M>
concept ExpertModel = requires(const M& m) {
  { m.block_expert_layouts() } -> std::convertible_to<ExpertLayout>;
  { m.file() } -> std::convertible_to<const GgufFile&>;
};

class ExpertStore final : public ExpertSource {
 public:
  static constexpr uint32_t kMiss = UINT32_MAX;

  // REQUIRES: `reader` reads the experts `layout` describes (the same model). Throws
  // strata::Error when the reader's blocks or record sizes disagree with the layout.
  ExpertStore(ExpertLayout layout, std::unique_ptr<ExpertReader> reader,
              const ExpertStoreOptions& options);
  // Reads from the sidecar (validated by Sidecar::open).
  ExpertStore(ExpertLayout layout, Sidecar sidecar, const ExpertStoreOptions& options);
  // Reads straight from the model's GGUF (no sidecar needed).
  ExpertStore(ExpertLayout layout, const GgufFile& gguf, const ExpertStoreOptions& options);
  // The same for a model (the store needs only its layout and file, so experts/ does not depend
  // on model/: the caller, who has the model, makes the call).
  template <ExpertModel M>
  ExpertStore(const M& model, const ExpertStoreOptions& options)
      : ExpertStore(model.block_expert_layouts(), model.file(), options) {}
  template <ExpertModel M>
  ExpertStore(const M& model, Sidecar sidecar, const ExpertStoreOptions& options)
      : ExpertStore(model.block_expert_layouts(), std::move(sidecar), options) {}
  template <ExpertModel M>
  ExpertStore(const M& model, std::unique_ptr<ExpertReader> reader,
              const ExpertStoreOptions& options)
      : ExpertStore(model.block_expert_layouts(), std::move(reader), options) {}
  ~ExpertStore() override;

  // ExpertSource
  void observe_routing(int layer, const Routing& routing) override;
  // REQUIRES: `experts` sorted and unique; `layer` has routed experts and the ids lie in
  // [0, n_expert) (else strata::Error). The previous layer's matrices are invalid from here on.
  void publish(int layer, std::span<const int32_t> experts) override;
  // REQUIRES: after publish. Throws strata::Error when a read failed; that expert is then not
  // resident and the layer is over (wait returns nothing until the following publish).
  std::span<const DeliveredExpert> wait() override;
  // Read-ahead runs until every expert is resident (then the guess would only cost router time).
  bool wants_guess() const override {
    return options_.read_ahead && !residency_.every_expert_resident();
  }
  bool read_ahead_enabled() const { return options_.read_ahead; }
  // Ignored with read-ahead off or for a layer without experts. REQUIRES: ids unique, in range.
  void publish_guess(int layer, std::span<const int32_t> experts) override;
  MocePolicy* moce() override { return moce_.get(); }
  bool resident(int layer, int32_t expert) const override {
    return residency_.has_experts(layer) && residency_.slot_of(layer, expert) != kMiss;
  }
  // The arena (cache and transient slots). With a slot for every expert nothing is ever evicted
  // or streamed, so a handed-out pointer stays valid for the store's life.
  std::vector<HostRegion> host_regions() const override {
    return {HostRegion{arena_->data(), size_t(arena_->bytes())}};
  }
  bool pointers_stay_valid() const override { return all_resident_; }
  // Opt-in cache-aware routing (null = exact routing). A unique_ptr converts at the call, where
  // route/moce.h is known: the store only holds the policy for the router.
  void set_moce(std::shared_ptr<MocePolicy> policy);

  // Loads ranking[layer] (most wanted first, up to the layer's slots) and pins the first n_pinned;
  // returns once the reads landed. REQUIRES: between windows; ids in range (else strata::Error).
  void fill(const std::vector<std::vector<int32_t>>& ranking, int n_pinned);

  // Prompt-hot pins (see the contract). Returns the number of pins added or dropped.
  void reset_prompt_heat();
  int pin_prompt_hot(const HotPinOptions& options);
  std::vector<int32_t> hot_pins(int layer) const;  // ascending ids

  // Usage history: counted from observe_routing while attached; save_history writes it (with the
  // LRU order of every layer) atomically to `path`. Throws strata::Error on a failed write.
  void attach_history(std::unique_ptr<UsageHistory> history, std::string path);
  const UsageHistory* history() const { return history_.get(); }
  void save_history();
  uint64_t history_tokens_since_save() const;
  // Keeps the model mapping's dense read-ahead (gguf/mapping_advice.h) running for the store's life:
  // with experts streamed, the mapping serves only the dense tensors. REQUIRES: the GgufFile outlives
  // the store.
  void attach_dense_prefetch(std::unique_ptr<DensePrefetch> prefetch);
  // Resident experts of a layer, most recently used first (ties: lower slot index).
  std::vector<int32_t> lru_order(int layer) const;

  int slots_per_layer() const { return slots_per_layer_; }
  uint64_t arena_bytes() const { return arena_->bytes(); }
  bool direct_io() const { return reader_->direct_io(); }
  bool io_uring() const { return reader_->io_uring(); }
  const ExpertReader& reader() const { return *reader_; }
  const SidecarLayout& layout() const { return reader_->layout(); }
  ExpertStoreStats stats() const;
  void reset_stats();
  // smap view for tests and tools: the slot of (layer, expert), or kMiss.
  uint32_t slot_of(int layer, int expert) const;
  bool pinned(int layer, int expert) const;

 private:
  // One expert of the current layer's union, until a wait() delivers it.
  struct Pending {
    int index = 0;
    int32_t expert = 0;
    uint8_t* data = nullptr;  // null: waiting for a transient slot
    int transient = -1;       // transient slot index, or -1 for a cache slot
    IoPool::TicketPtr load;
  };

  static ReadOptions read_options(const ExpertStoreOptions& options);
  // Starts the reads of the cache slots a residency call assigned.
  void load_slots(int layer, IoPool::Priority priority);
  ExpertMatrices matrices(int layer, const uint8_t* data, int32_t expert) const;
  void release_transients();
  void deliver(const Pending& p);
  void settle(const Pending& p);

  // Declared in destruction order's reverse: the reads (and their threads) go before the arena
  // they write into and the reader whose jobs they run.
  std::unique_ptr<ExpertReader> reader_;
  ExpertStoreOptions options_;
  int slots_per_layer_ = 0;
  bool all_resident_ = false;
  ExpertLayout layout_;       // [block]
  SlotResidency residency_;
  std::unique_ptr<ExpertArena> arena_;
  std::unique_ptr<ExpertReads> reads_;
  std::vector<SlotResidency::Load> loads_;  // the last residency call's, reused

  std::vector<std::vector<uint64_t>> prompt_heat_;  // [block][expert], since reset_prompt_heat
  std::unique_ptr<UsageHistory> history_;
  std::unique_ptr<DensePrefetch> dense_prefetch_;
  std::string history_path_;
  uint64_t history_saved_tokens_ = 0;
  std::shared_ptr<MocePolicy> moce_;

  // Statistics besides the residency's (reset_stats zeroes them and rebases the others).
  uint64_t miss_bytes_ = 0, pin_changes_ = 0;
  uint64_t bytes_read_base_ = 0;  // reader_->bytes_read() at the last reset_stats
  double io_wait_base_ms_ = 0;    // reads_->wait_ms() at the last reset_stats

  // The current layer (between publish and the wait that delivers nothing more).
  int current_layer_ = -1;
  std::vector<Pending> ready_, waiting_, deferred_;  // deferred: no transient slot free yet
  std::vector<int> missing_;  // publish's misses (indices into its experts), as loads_
  std::vector<int> free_transient_;
  std::vector<int> handed_transients_;      // the transient slots of the last batch
  std::vector<DeliveredExpert> delivered_;  // the last batch
};

}  // namespace strata
