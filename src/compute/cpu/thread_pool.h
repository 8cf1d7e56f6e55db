// ThreadPool — a fixed set of worker threads that run data-parallel loops with the caller.
//
// What it promises
// - `parallel_for(n_tasks, fn)` calls fn(begin, end, thread_index) on disjoint ranges that together
//   cover [0, n_tasks) exactly once, and returns when every range has run. The calling thread takes
//   part as thread_index 0; workers are 1 .. size()-1. thread_index is stable for a thread for the
//   pool's life, so it may index per-thread scratch (see `scratch`).
// - Work is handed out in chunks from one atomic counter; the chunk size is chosen per call
//   (about 4 chunks per thread, so a late-waking worker or a slow core does not stall the call).
//   Which thread runs which range is NOT deterministic; callers whose results must be bitwise
//   reproducible must make every task's result independent of the thread that runs it.
// - Idle workers sleep on a condition variable. Between jobs a worker first polls for up to
//   worker_spin_us (default 100 µs, constructor argument; 0 disables it) after its last job, or
//   after the caller's last hand-out that the inline rule (below) ran on the caller if that is
//   later, because back-to-back small jobs — a decode step is hundreds of matvecs of 20–100 µs —
//   otherwise pay a futex wake-up each, which made 2 threads slower than 1 (numbers in
//   docs/bench-matvec.md). An idle pool therefore stops using CPU 100 µs after its last call.
//   The caller likewise polls up to 100 µs for the workers' last chunks before sleeping.
// - An exception thrown by fn on any thread stops the hand-out of further chunks, waits for the
//   chunks already running, and is rethrown on the calling thread (the first one; others dropped).
// - Small hand-outs run on the caller. A hand-out costs a few cache-line round trips between the
//   caller and every worker (publish, join, the shared chunk counter, the wait) plus the
//   transfer of the chunks' outputs to whoever reads them next: on the 2-vCPU build VM, whose two
//   CPUs are ~470 ns apart, a decode row of the small default model ran slower on two threads
//   than on one (docs/bench-cpu-scaling.md, "Small hand-outs on the caller"). parallel_for with a
//   work estimate (work_ns: how long one thread needs for all n_tasks) runs fn(0, n_tasks, 0) on
//   the calling thread, as a one-thread pool would (thread_index 0: the caller's scratch slot),
//   when work_ns < inline_work_ns(); without an estimate it always hands out. inline_work_ns()
//   comes from the constructor argument, else the environment (STRATA_INLINE_WORK_NS,
//   nanoseconds; 0 turns the rule off), else a measurement at construction (see
//   measured_handout_ns; ~0.3-1 ms, pools of 2+ threads only). Where a task runs never changes
//   its result, so the rule cannot change a bit of what callers compute.
// - Nested use: parallel_for called from inside a task of this same pool runs fn(0, n_tasks,
//   current thread_index) inline on that thread, so it cannot deadlock. (A cycle across pools —
//   a task of A calling B whose task calls A — is not detected and would deadlock; don't.)
// - The destructor wakes the workers, lets them finish, and joins them. It must not run while a
//   parallel_for on this pool is in progress.
//
// Thread safety
// - parallel_for may be called from any thread; calls from different outside threads are
//   serialised (one job runs at a time). Nested calls from tasks run inline as above.
// - scratch(i) is owned by whoever runs as thread_index i: slot 0 by the thread currently calling
//   parallel_for (between and during its calls), slot k by worker k inside a task. Only "leaf"
//   operations (whose tasks do not call back into arbitrary code that may use the same slot) should
//   use it; matmul is one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "util/function_ref.h"

namespace strata::compute {

// A growable byte buffer reused across calls; grows (never shrinks) to the largest size asked for,
// so steady-state callers allocate nothing. Returned memory is 64-byte aligned.
class ScratchBuffer {
 public:
  // Pointer to at least `bytes` bytes; previous contents are not preserved when it grows.
  std::byte* reserve(size_t bytes);
  size_t capacity_bytes() const { return capacity_bytes_; }

 private:
  struct FreeAligned {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, FreeAligned> data_;
  size_t capacity_bytes_ = 0;
};

class ThreadPool {
 public:
  // Non-owning (parallel_for is synchronous): no allocation per call, whatever fn captures.
  using TaskFn = FunctionRef<void(int64_t begin, int64_t end, int thread_index)>;

  // Measured on the 2-vCPU build VM (docs/bench-matvec.md): with workers that go straight to
  // sleep, a 2560x640 Q4_K matvec takes ~60-70 µs on 2 threads vs ~46-58 µs on 1 (the futex
  // wake-up of an idle vCPU costs tens of µs); with a 100 µs poll it takes ~35 µs.
  static constexpr int kDefaultWorkerSpinMicros = 100;

  // inline_work_ns arguments: take STRATA_INLINE_WORK_NS when set, else measure (the default);
  // never run an estimated hand-out inline (the rule off); always run it inline.
  static constexpr double kMeasureInlineWork = -1;
  static constexpr double kInlineNever = 0;
  static constexpr double kInlineAlways = 1e18;

  // n_threads counts the caller: n_threads - 1 workers are started. After a job a worker polls
  // for the next one for worker_spin_us (a pause instruction between polls, no memory traffic)
  // before sleeping; 0 sleeps at once. inline_work_ns: see the contract (>= 0, or
  // kMeasureInlineWork). Throws strata::Error if n_threads < 1, spin < 0, inline_work_ns is
  // negative and not kMeasureInlineWork, or STRATA_INLINE_WORK_NS is set to anything but a
  // number >= 0.
  explicit ThreadPool(int n_threads, int worker_spin_us = kDefaultWorkerSpinMicros,
                      double inline_work_ns = kMeasureInlineWork);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Jobs handed to the workers so far (parallel_for calls that woke them; calls run inline on
  // one thread do not count): each is a synchronisation point of the caller with every worker,
  // what `strata bench cpu` reports per token. Read by the calling thread between calls.
  uint64_t jobs_run() const { return jobs_run_.load(std::memory_order_relaxed); }
  // parallel_for calls with a work estimate that the inline rule ran on the caller (a one-thread
  // pool counts none: it has nothing to hand out).
  uint64_t jobs_inline() const { return jobs_inline_.load(std::memory_order_relaxed); }

  // Estimated hand-outs under this much single-thread work (ns) run on the caller; 0 for a
  // one-thread pool. Where the value came from: InlineWorkOrigin.
  double inline_work_ns() const { return inline_work_ns_; }
  enum class InlineWorkOrigin { kOneThread, kConstructor, kEnvironment, kMeasured };
  InlineWorkOrigin inline_work_origin() const { return inline_work_origin_; }
  // What the construction measured (kMeasured only, else 0): the median time a hand-out of
  // 4 small tasks per thread took beyond an even split of the same tasks run on the caller.
  // inline_work_ns is that times n/(n-1): splitting work W saves W(n-1)/n and costs this.
  double measured_handout_ns() const { return measured_handout_ns_; }
  // One line for `strata run --profile` and `strata bench cpu`: the threshold, its origin and
  // the override.
  std::string describe_inline_rule() const;

  void parallel_for(int64_t n_tasks, const TaskFn& fn);
  // As parallel_for, but on the calling thread alone (fn(0, n_tasks, 0) there, or nested as
  // above) when work_ns, the caller's estimate of how long one thread takes for every task, is
  // below inline_work_ns().
  void parallel_for(int64_t n_tasks, double work_ns, const TaskFn& fn);
  // As parallel_for, but every task is handed out on its own (fn(i, i + 1, thread_index)), in
  // increasing i: for a few uneven tasks (a window's routed experts), where a chunk of several
  // would leave one thread with the tail. Order the tasks largest first for a balanced finish.
  // Nested calls run inline, task by task.
  void parallel_for_each_task(int64_t n_tasks, const TaskFn& fn);

  // Whether the layers hand a decode row's dependent steps out as one run_phases chain (the
  // hyper-connection's steps, the DeltaNet's conv, split and delta rule, a product's activation
  // conversion) or as one hand-out per step as before. Off by default: on the GPU box's 16-core
  // host (session 45, 2 alternated rounds against the build before the chains) decode was 0.85-
  // 0.88x with them, "gdn delta rule+norm" 1.2-1.3 -> 5.0 ms and "hc in" 3.6-4.2 -> 4.5-5.1 ms a
  // token, though the hand-outs fell 484 -> 387; on the 2-vCPU build VM the default model
  // decoded 0.88-0.96x with them (docs/bench-cpu-scaling.md). STRATA_PHASE_CHAINS=1 turns them on (read at construction;
  // anything but 0 or 1 is a strata::Error), set_phase_chains for tests and A/B runs. Every
  // output is bitwise the same either way (the same tasks, only how they are handed out differs).
  bool phase_chains() const { return phase_chains_; }
  void set_phase_chains(bool on) { phase_chains_ = on; }

  // A chain of dependent steps in one hand-out: phase p's tasks start only after every task of
  // phase p - 1 has finished (its writes are then visible), so a step may read anything the
  // steps before it wrote (a product's outputs, then the next product over them). One publish
  // and one final wait for the whole chain instead of one hand-out per step: at 16 threads a
  // hand-out costs 6-8 µs over an even split (docs/bench-cpu-scaling.md), more than the steps
  // of a decode row's small products. Tasks go out in chunks in increasing order, phase after
  // phase (about 4 chunks a thread, as parallel_for; a chunk may span phases), and a thread that
  // reaches a task of a later phase waits for the earlier ones, polling with a pause; every task
  // it can wait for was taken before its own by a thread that runs its chunk in order, and the
  // lowest unfinished task never waits, so the wait always ends. A task of a one-task
  // phase is a serial step between two split ones. run(begin, end, thread_index) gets the
  // phase's own task numbers, [0, n_tasks). The whole chain runs in order on one thread (each
  // phase's run(0, n_tasks, ...)) when nested, on a one-thread pool, for a single task, or when
  // work_ns (one thread's time for every phase) is under inline_work_ns(). An exception stops
  // the chain: later phases' waiting tasks return without running, and it is rethrown here.
  // Every phase needs n_tasks >= 1; at most kMaxPhases phases (strata::Error otherwise).
  struct Phase {
    int64_t n_tasks;
    TaskFn run;
  };
  static constexpr size_t kMaxPhases = 8;
  void run_phases(std::span<const Phase> phases);
  void run_phases(std::span<const Phase> phases, double work_ns);

  // The thread_index the current thread has in this pool: its worker index inside a task of this
  // pool, otherwise 0 (the caller's slot).
  int current_thread_index() const;

  // Per-participant scratch, index in [0, size()); see the thread-safety contract above.
  ScratchBuffer& scratch(int thread_index) { return scratch_[size_t(thread_index)]; }

 private:
  void worker_main(int thread_index);
  // Publishes one job (chunks of chunk_tasks from the shared counter), takes part, waits for it.
  void run_job(const TaskFn& fn, int64_t n_tasks, int64_t chunk_tasks);
  // Tasks per chunk of a hand-out of n_tasks (parallel_for and run_phases).
  int64_t default_chunk_tasks(int64_t n_tasks) const;
  // Takes chunks from the current job until none are left; records the first exception.
  void run_chunks(const TaskFn& fn, int64_t n_tasks, int64_t chunk_tasks, int thread_index);
  // All of fn on the calling thread as thread_index 0 (nested calls inside run inline too).
  void run_inline(int64_t n_tasks, const TaskFn& fn);
  // Restarts the workers' poll (see worker_spin_us) when the caller runs a hand-out itself.
  void note_caller_activity();
  // The construction's measurement (see measured_handout_ns).
  double measure_handout_ns();

  const int n_threads_;
  std::vector<std::thread> workers_;
  std::vector<ScratchBuffer> scratch_;

  std::mutex caller_mutex_;  // serialises parallel_for calls from different outside threads

  // Job state: the lock-free hand-out protocol is described at ThreadPool::run_job. mutex_
  // guards first_exception_ and the sleeps (work_cv_, done_cv_) only.
  std::mutex mutex_;
  std::condition_variable work_cv_;  // sleeping workers wait here for a new generation
  std::condition_variable done_cv_;  // a sleeping caller waits here for active_workers_ == 0
  std::atomic<bool> job_open_{false};  // workers may join the current job only while this is true
  std::atomic<bool> stop_{false};
  // The job's fields: written by the caller before it opens the job, read by joined workers.
  const TaskFn* job_fn_ = nullptr;
  int64_t job_n_tasks_ = 0;
  int64_t job_chunk_tasks_ = 1;
  std::atomic<int> active_workers_{0};  // workers counted into the current job (or checking it)
  std::atomic<uint64_t> published_generation_{0};  // bumped for every job and for stop
  std::atomic<int> sleepers_{0};          // workers in (or entering) work_cv_.wait
  std::atomic<bool> caller_waiting_{false};  // the caller sleeps on done_cv_
  const int worker_spin_us_;
  std::exception_ptr first_exception_;
  struct alignas(64) PaddedCounter {
    std::atomic<int64_t> value{0};
  };
  PaddedCounter next_task_;
  // steady_clock ns of the caller's last noted inline run; written by callers, read by polling
  // workers (its own line: they read it between polls).
  PaddedCounter caller_activity_ns_;
  std::atomic<uint64_t> jobs_run_{0};
  std::atomic<uint64_t> jobs_inline_{0};
  std::atomic<int> workers_started_{0};  // workers that entered worker_main (the measurement waits)
  double inline_work_ns_ = 0;
  InlineWorkOrigin inline_work_origin_ = InlineWorkOrigin::kOneThread;
  bool phase_chains_ = false;
  double measured_handout_ns_ = 0;
};

// Row-wise elementwise work of a window (norms, gates, activations: each row's result depends on
// that row alone, so the split cannot change a bit): on the pool for windows of at least
// kParallelRowsMin rows, inline on the caller below that, where waking the workers costs more
// than the rows (a decode row is a few microseconds of work).
inline constexpr int64_t kParallelRowsMin = 4;
inline void parallel_rows(ThreadPool& pool, int64_t n_rows, const ThreadPool::TaskFn& fn) {
  if (n_rows >= kParallelRowsMin) {
    pool.parallel_for(n_rows, fn);
  } else if (n_rows > 0) {
    fn(0, n_rows, pool.current_thread_index());
  }
}

}  // namespace strata::compute
