// Job and Scheduler — generations run in arrival order on `slots` worker threads (one by
// default; `strata serve --parallel N`: N).
//
// Why one at a time by default: the model's forward uses the whole shared compute::ThreadPool, so
// two independent generations would only take turns on it; a FIFO with one worker keeps each
// generation at full speed and makes the queue (and the 429 when it is full) explicit. With N
// slots the workers' decode steps meet in one batched window (serve/decode_batcher.h), which reads
// the weights once for all of them: that is where running several at once pays.
//
// Job: one generation request and the channel its results travel through. The worker thread
// appends text deltas and finally an outcome (or an error); the HTTP thread that owns the request
// takes them with `wait_*`. The worker never waits for the HTTP thread, so a slow or stalled
// client cannot slow the generation or those queued behind it: its deltas accumulate in the job
// (bounded by max_tokens) while the socket drains at its own pace.
//
// Scheduler: a bounded FIFO (`max_queue` waiting jobs, not counting the running ones) and its
// workers. A job is admitted while the queue plus the busy workers (running a job or a lent task)
// stay below max_queue + slots: a free worker takes a queued job at once, a worker busy with
// another job's lent part does not, so the bound counts slots, not jobs (an n=3 request on two
// slots holds both). Lent tasks waiting for a worker are not counted: they are optional and end
// at once when the lender already did their part. `cancel` removes a waiting job at once, or asks a
// running one to stop (the runner polls `Job::cancel_requested` between tokens and prefill chunks).
// `shutdown` refuses new jobs, fails the waiting ones (503), gives the running ones a grace period,
// then cancels them, and joins.
//
// Lent tasks (`lend`): a running job may ask for more of the slots it runs on, for parts of its
// own work (the other choices of an n > 1 request, serve/generator.h): a worker that is free takes
// a lent task before any queued job, so the job's parts and the other requests share the `slots`
// workers (no thread beyond them). A lent task is optional help: the job must be able to do the
// part itself when no worker takes it (all busy, or shutting down: pending tasks are then dropped
// unrun), so a job never waits for a task that has not started.
//
// `after_work` (optional) runs on the worker after each job and after each lent task that did
// some work (it returns true), with no lock held: the server's heap trim (serve/heap_policy.h),
// which must follow the choices that ran on other slots as well as whole jobs, and only
// generations that happened (a lent choice that found nothing left to claim ran none).
//
// Thread safety: every method of both classes may be called from any thread; the runner and the
// lent tasks run on up to `slots` workers at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "serve/api_error.h"
#include "serve/openai_format.h"
#include "serve/plan.h"

namespace strata::serve {

using Clock = std::chrono::steady_clock;

enum class JobState { Queued, Running, Finished };
enum class CancelReason { None, ClientGone, Shutdown };

struct GenerationOutcome {
  FinishReason finish = FinishReason::Stop;  // choice 0's
  std::string stop_sequence;  // the stop string that ended choice 0 ("" when none did)
  std::vector<FinishReason> choice_finish;   // every choice's, by index (GenerationPlan::n_choices)
  Usage usage;             // prompt tokens once, completion tokens summed over the choices
  bool cancelled = false;  // stopped early by Job::cancel; finish/usage cover what was made
  double prefill_s = 0;
  double decode_s = 0;
};

class Job {
 public:
  Job(GenerationPlan plan, Clock::time_point received_at);
  const GenerationPlan& plan() const { return plan_; }
  Clock::time_point received_at() const { return received_at_; }

  // Worker side.
  bool cancel_requested() const {
    return cancel_.load(std::memory_order_relaxed) != CancelReason::None;
  }
  void mark_running();
  void emit(TextDelta delta);
  void finish(const GenerationOutcome& outcome);
  void fail(ApiError error);  // ends the job without a result

  // Any thread.
  void request_cancel(CancelReason reason);
  CancelReason cancel_reason() const { return cancel_.load(); }
  JobState state() const;

  // HTTP side. Waits until the job left the queue (or `timeout`); returns the state.
  JobState wait_started(std::chrono::milliseconds timeout);
  struct Update {
    JobState state = JobState::Queued;
    std::vector<TextDelta> deltas;             // taken from the job: each is returned once
    std::optional<GenerationOutcome> outcome;  // set once Finished with a result
    std::optional<ApiError> error;             // set once Finished by fail()
  };
  // Waits until a delta is pending or the job finished (or `timeout`) and takes what is there.
  Update wait_update(std::chrono::milliseconds timeout);

 private:
  const GenerationPlan plan_;
  const Clock::time_point received_at_;
  std::atomic<CancelReason> cancel_{CancelReason::None};
  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  JobState state_ = JobState::Queued;
  std::vector<TextDelta> pending_;
  std::optional<GenerationOutcome> outcome_;
  std::optional<ApiError> error_;
};

class Scheduler {
 public:
  // Runs one job: emits its deltas and ends it with finish() or fail(). Exceptions become a 500.
  using Runner = std::function<void(Job&)>;
  // REQUIRES: slots >= 1.
  Scheduler(size_t max_queue, Runner runner, size_t slots = 1,
            std::function<void()> after_work = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Admission { Accepted, QueueFull, ShuttingDown };
  Admission submit(const std::shared_ptr<Job>& job);
  // A part of a job, run on another worker; returns whether it did any work (false: the lender
  // had done it already), which decides whether after_work follows it.
  using LentTask = std::function<bool()>;
  // Runs `task` on the next free worker, before the queued jobs (see the class comment).
  void lend(LentTask task);
  void cancel(const std::shared_ptr<Job>& job, CancelReason reason);

  size_t queue_depth() const;
  size_t max_queue() const { return max_queue_; }
  size_t slots() const { return slots_; }
  bool busy() const;             // a job is running
  size_t running_count() const;  // jobs running now (<= slots)
  size_t busy_slots() const;     // workers running a job or a lent task now (<= slots)

  // Idempotent; returns once the worker has exited.
  void shutdown(std::chrono::milliseconds grace);
  // Cancels the running jobs now (a second SIGTERM during shutdown).
  void cancel_running();

 private:
  void work();

  const size_t max_queue_;
  const size_t slots_;
  const Runner runner_;
  const std::function<void()> after_work_;
  mutable std::mutex mutex_;  // guards queue_, lent_, running_, busy_workers_, stopping_
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::deque<LentTask> lent_;
  std::vector<std::shared_ptr<Job>> running_;
  size_t busy_workers_ = 0;  // running a job (in running_) or a lent task
  bool stopping_ = false;
  std::mutex join_mutex_;  // one thread joins the workers
  std::vector<std::thread> workers_;
};

}  // namespace strata::serve
