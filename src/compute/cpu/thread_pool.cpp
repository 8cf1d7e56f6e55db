#include "compute/cpu/thread_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <optional>
#include <string_view>
#include <utility>

#include "util/error.h"

namespace strata::compute {

namespace {

// Which pool's task (if any) the current thread is running, and its index there. Set for a
// worker's whole life and for the caller while it runs its own chunks; read to detect nesting.
thread_local const ThreadPool* tls_running_pool = nullptr;
thread_local int tls_thread_index = 0;

// Restores the thread-locals on scope exit (also when a task throws).
class RunningPoolScope {
 public:
  RunningPoolScope(const ThreadPool* pool, int thread_index)
      : saved_pool_(tls_running_pool), saved_index_(tls_thread_index) {
    tls_running_pool = pool;
    tls_thread_index = thread_index;
  }
  ~RunningPoolScope() {
    tls_running_pool = saved_pool_;
    tls_thread_index = saved_index_;
  }
  RunningPoolScope(const RunningPoolScope&) = delete;
  RunningPoolScope& operator=(const RunningPoolScope&) = delete;

 private:
  const ThreadPool* saved_pool_;
  int saved_index_;
};

constexpr size_t kScratchAlignment = 64;
// Bound on the caller's poll for workers finishing their last chunk (a chunk is normally far
// shorter; past this the caller sleeps on done_cv_).
constexpr int kCallerSpinMicros = 100;

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Polls `done` with a CPU pause between polls until it holds or the time `deadline_ns()` gives
// (re-read between rounds of polls, so it may move later) has passed; true if it held.
template <typename Done, typename Deadline>
bool spin_until(Done done, Deadline deadline_ns) {
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();  // tells the core we spin: saves power, frees the pipeline
#endif
    }
    if (now_ns() >= deadline_ns()) return done();
  }
}

constexpr const char* kInlineWorkVariable = "STRATA_INLINE_WORK_NS";

// STRATA_INLINE_WORK_NS when set: nanoseconds >= 0 (a plain number, "1e9" too).
std::optional<double> inline_work_from_environment() {
  const char* value = std::getenv(kInlineWorkVariable);
  if (value == nullptr) return std::nullopt;
  char* end = nullptr;
  const double ns = std::strtod(value, &end);
  if (end == value || *end != '\0' || !std::isfinite(ns) || ns < 0)
    fail("{}: expected a number of nanoseconds >= 0 (0 turns the inline rule off), found '{}'",
         kInlineWorkVariable, value);
  return ns;
}

constexpr const char* kPhaseChainsVariable = "STRATA_PHASE_CHAINS";

// STRATA_PHASE_CHAINS when set: 0 or 1 (ThreadPool::phase_chains).
bool phase_chains_from_environment() {
  const char* value = std::getenv(kPhaseChainsVariable);
  if (value == nullptr) return false;
  const std::string_view v(value);
  if (v != "0" && v != "1") fail("{}: expected 0 or 1, found '{}'", kPhaseChainsVariable, value);
  return v == "1";
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void ScratchBuffer::FreeAligned::operator()(std::byte* p) const {
  ::operator delete(p, std::align_val_t(kScratchAlignment));
}

std::byte* ScratchBuffer::reserve(size_t bytes) {
  if (bytes > capacity_bytes_) {
    // Grow geometrically so a slowly growing sequence of requests allocates O(log) times.
    const size_t new_capacity = std::max(bytes, capacity_bytes_ + capacity_bytes_ / 2);
    data_.reset();
    capacity_bytes_ = 0;
    data_.reset(static_cast<std::byte*>(
        ::operator new(new_capacity, std::align_val_t(kScratchAlignment))));
    capacity_bytes_ = new_capacity;
  }
  return data_.get();
}

ThreadPool::ThreadPool(int n_threads, int worker_spin_us, double inline_work_ns)
    : n_threads_(n_threads), worker_spin_us_(worker_spin_us) {
  if (n_threads < 1) fail("ThreadPool: expected n_threads >= 1, found {}", n_threads);
  if (worker_spin_us < 0) fail("ThreadPool: expected worker_spin_us >= 0, found {}", worker_spin_us);
  if (!(inline_work_ns >= 0 || inline_work_ns == kMeasureInlineWork))
    fail("ThreadPool: expected inline_work_ns >= 0 or kMeasureInlineWork, found {}",
         inline_work_ns);
  const std::optional<double> from_environment =
      inline_work_ns == kMeasureInlineWork ? inline_work_from_environment() : std::nullopt;
  phase_chains_ = phase_chains_from_environment();
  scratch_.resize(size_t(n_threads));
  workers_.reserve(size_t(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_main(i); });
  if (n_threads == 1) return;  // nothing is ever handed out
  if (inline_work_ns != kMeasureInlineWork) {
    inline_work_ns_ = inline_work_ns;
    inline_work_origin_ = InlineWorkOrigin::kConstructor;
  } else if (from_environment) {
    inline_work_ns_ = *from_environment;
    inline_work_origin_ = InlineWorkOrigin::kEnvironment;
  } else {
    measured_handout_ns_ = measure_handout_ns();
    inline_work_ns_ = measured_handout_ns_ * n_threads / (n_threads - 1);
    inline_work_origin_ = InlineWorkOrigin::kMeasured;
  }
}

double ThreadPool::measure_handout_ns() {
  // 4 tasks per thread (parallel_for's chunking), each ~1 µs of a dependent integer chain that
  // ends in its own cache line, read by the caller after the job as a product's outputs are. Run
  // back to back the workers stay in their poll, as in a decode step's stream of hand-outs.
  constexpr int kTasksPerThread = 4, kWarmups = 3, kRounds = 9;
  const int64_t n_tasks = int64_t(n_threads_) * kTasksPerThread;
  struct alignas(64) Slot {
    uint64_t value = 0;
  };
  std::vector<Slot> slots(static_cast<size_t>(n_tasks));
  // Read through a volatile so the compiler cannot fold the chain.
  volatile int64_t steps_source = 512;
  const int64_t steps = steps_source;
  const auto task = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      uint64_t x = uint64_t(t) + 1;
      for (int64_t i = 0; i < steps; ++i) x = x * 6364136223846793005u + 1442695040888963407u;
      slots[size_t(t)].value = x;
    }
  };
  uint64_t sink = 0;
  const auto timed = [&](bool split) {
    const auto start = std::chrono::steady_clock::now();
    if (split) {
      run_job(task, n_tasks, 1);
    } else {
      RunningPoolScope scope(this, 0);
      task(0, n_tasks, 0);
    }
    for (const Slot& slot : slots) sink += slot.value;
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
        .count();
  };
  // Threads that have not started yet would be timed as slow workers.
  while (workers_started_.load(std::memory_order_acquire) < n_threads_ - 1)
    std::this_thread::yield();
  for (int i = 0; i < kWarmups; ++i) timed(true);
  std::vector<double> split_ns, inline_ns;
  for (int i = 0; i < kRounds; ++i) split_ns.push_back(timed(true));
  for (int i = 0; i < kRounds; ++i) inline_ns.push_back(timed(false));
  volatile uint64_t keep = sink;
  (void)keep;
  jobs_run_.store(0, std::memory_order_relaxed);  // the calibration is not the caller's work
  return std::max(0.0, median_of(split_ns) - median_of(inline_ns) / n_threads_);
}

std::string ThreadPool::describe_inline_rule() const {
  switch (inline_work_origin_) {
    case InlineWorkOrigin::kOneThread:
      return "1 thread: every hand-out runs on the caller";
    case InlineWorkOrigin::kConstructor:
      return fmt::format(
          "hand-outs under {:.1f} µs of one thread's work run on the caller (set by the caller)",
          inline_work_ns_ * 1e-3);
    case InlineWorkOrigin::kEnvironment:
      return fmt::format("hand-outs under {:.1f} µs of one thread's work run on the caller ({}={})",
                         inline_work_ns_ * 1e-3, kInlineWorkVariable, inline_work_ns_);
    case InlineWorkOrigin::kMeasured:
      break;
  }
  return fmt::format(
      "hand-outs under {:.1f} µs of one thread's work run on the caller (measured: a hand-out "
      "costs {:.1f} µs over an even split on {} threads; {} overrides, 0 = off)",
      inline_work_ns_ * 1e-3, measured_handout_ns_ * 1e-3, n_threads_, kInlineWorkVariable);
}

ThreadPool::~ThreadPool() {
  {
    // A new generation wakes the polling workers too; they see stop_ before joining anything.
    std::lock_guard lock(mutex_);
    stop_.store(true, std::memory_order_seq_cst);
    published_generation_.fetch_add(1, std::memory_order_seq_cst);
  }
  work_cv_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

int ThreadPool::current_thread_index() const {
  return tls_running_pool == this ? tls_thread_index : 0;
}

void ThreadPool::run_chunks(const TaskFn& fn, int64_t n_tasks, int64_t chunk_tasks,
                            int thread_index) {
  for (;;) {
    const int64_t begin = next_task_.value.fetch_add(chunk_tasks, std::memory_order_relaxed);
    if (begin >= n_tasks) return;
    const int64_t end = std::min(n_tasks, begin + chunk_tasks);
    try {
      fn(begin, end, thread_index);
    } catch (...) {
      // Stop the hand-out: every later fetch_add sees a begin >= n_tasks.
      next_task_.value.store(n_tasks, std::memory_order_relaxed);
      std::lock_guard lock(mutex_);
      if (!first_exception_) first_exception_ = std::current_exception();
      return;
    }
  }
}

void ThreadPool::parallel_for(int64_t n_tasks, const TaskFn& fn) {
  if (n_tasks <= 0) return;
  if (tls_running_pool == this) {
    // Nested call from one of our own tasks: the other threads may be busy in the outer job
    // (or waiting for this very thread), so run everything here.
    fn(0, n_tasks, tls_thread_index);
    return;
  }
  if (n_threads_ == 1 || n_tasks == 1) {
    run_inline(n_tasks, fn);
    return;
  }

  run_job(fn, n_tasks, default_chunk_tasks(n_tasks));
}

// About 4 chunks per thread: enough slack to absorb a worker that wakes late, few enough that
// each chunk is a long contiguous stretch of work (matters for streaming weights from DRAM).
int64_t ThreadPool::default_chunk_tasks(int64_t n_tasks) const {
  return std::max<int64_t>(1, n_tasks / (int64_t(n_threads_) * 4));
}

void ThreadPool::parallel_for(int64_t n_tasks, double work_ns, const TaskFn& fn) {
  if (n_tasks > 1 && n_threads_ > 1 && work_ns < inline_work_ns_ && tls_running_pool != this) {
    jobs_inline_.fetch_add(1, std::memory_order_relaxed);
    note_caller_activity();
    // Serialised with other outside callers like a hand-out: the task uses slot 0's scratch,
    // which a concurrent caller's job would use too (an uncontended lock costs ~20 ns).
    std::lock_guard caller_lock(caller_mutex_);
    run_inline(n_tasks, fn);
    return;
  }
  parallel_for(n_tasks, fn);
}

void ThreadPool::note_caller_activity() {
  // At most one store per quarter of the poll: the line is read by every polling worker, so each
  // store costs them a transfer (and the caller a store that waits for ownership, off its path).
  if (worker_spin_us_ == 0) return;  // the workers sleep at once anyway
  const int64_t now = now_ns();
  if (now - caller_activity_ns_.value.load(std::memory_order_relaxed) >
      int64_t(worker_spin_us_) * 250)
    caller_activity_ns_.value.store(now, std::memory_order_relaxed);
}

void ThreadPool::run_inline(int64_t n_tasks, const TaskFn& fn) {
  if (tls_running_pool == this) {
    fn(0, n_tasks, tls_thread_index);
    return;
  }
  RunningPoolScope scope(this, 0);
  fn(0, n_tasks, 0);
}

void ThreadPool::parallel_for_each_task(int64_t n_tasks, const TaskFn& fn) {
  if (n_tasks <= 0) return;
  if (tls_running_pool == this) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i, i + 1, tls_thread_index);
    return;
  }
  if (n_threads_ == 1 || n_tasks == 1) {
    RunningPoolScope scope(this, 0);
    for (int64_t i = 0; i < n_tasks; ++i) fn(i, i + 1, 0);
    return;
  }
  run_job(fn, n_tasks, 1);
}

void ThreadPool::run_phases(std::span<const Phase> phases) {
  run_phases(phases, std::numeric_limits<double>::infinity());
}

void ThreadPool::run_phases(std::span<const Phase> phases, double work_ns) {
  if (phases.size() > kMaxPhases)
    fail("ThreadPool::run_phases: expected at most {} phases, found {}", kMaxPhases, phases.size());
  // first_task[p]: the chain's number of phase p's first task; first_task[n] the task count.
  std::array<int64_t, kMaxPhases + 1> first_task{};
  for (size_t p = 0; p < phases.size(); ++p) {
    if (phases[p].n_tasks < 1)
      fail("ThreadPool::run_phases: phase {} has {} tasks, expected at least 1", p,
           phases[p].n_tasks);
    first_task[p + 1] = first_task[p] + phases[p].n_tasks;
  }
  const int64_t n_tasks = first_task[phases.size()];
  if (n_tasks == 0) return;
  const auto in_order = [&](int64_t, int64_t, int thread_index) {
    for (const Phase& phase : phases) phase.run(0, phase.n_tasks, thread_index);
  };
  if (tls_running_pool == this) {
    in_order(0, 1, tls_thread_index);
    return;
  }
  if (n_threads_ == 1 || n_tasks == 1) {
    run_inline(1, in_order);
    return;
  }
  if (work_ns < inline_work_ns_) {  // as parallel_for's inline rule
    jobs_inline_.fetch_add(1, std::memory_order_relaxed);
    note_caller_activity();
    std::lock_guard caller_lock(caller_mutex_);
    run_inline(1, in_order);
    return;
  }

  // done[p] counts phase p's finished tasks; the one that finishes it stores p + 1 into
  // completed (release), which a later phase's task reads (acquire) before it starts: that
  // orders every write of phase p before every read of a later phase.
  struct alignas(64) Counter {
    std::atomic<int64_t> value{0};
  };
  std::array<Counter, kMaxPhases> done;
  Counter completed;  // phases finished, in order (a phase's tasks start after the one before)
  std::atomic<bool> failed{false};
  const auto finish = [&](size_t p) {
    if (done[p].value.fetch_add(1, std::memory_order_acq_rel) + 1 == phases[p].n_tasks)
      completed.value.store(int64_t(p) + 1, std::memory_order_release);
  };
  // Waits until phases [0, p) are done; false when a task threw (the chain is off).
  const auto wait_for = [&](size_t p) {
    const int64_t start_ns = now_ns();
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        // A failed task counts as finished (so no wait hangs), hence the check after too.
        if (completed.value.load(std::memory_order_acquire) >= int64_t(p))
          return !failed.load(std::memory_order_relaxed);
        if (failed.load(std::memory_order_relaxed)) return false;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
      // A thread preempted inside an earlier task (a loaded machine) holds everyone here:
      // past the pool's own poll bound, give it the core.
      if (now_ns() - start_ns > int64_t(kCallerSpinMicros) * 1000) std::this_thread::yield();
    }
  };
  const auto phased = [&](int64_t begin, int64_t end, int thread_index) {
    for (int64_t task = begin; task < end; ++task) {
      size_t p = 0;
      while (task >= first_task[p + 1]) ++p;
      if (!wait_for(p)) return;
      const int64_t local = task - first_task[p];
      try {
        phases[p].run(local, local + 1, thread_index);
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
        finish(p);
        throw;
      }
      finish(p);
    }
  };
  // parallel_for's chunks, in increasing order: one task at a time, a product's tiles each paid a
  // grab of the shared counter (session 45). A thread that waits inside its chunk waits only for
  // earlier tasks, and the lowest unfinished task never waits, so the chain always ends.
  run_job(phased, n_tasks, default_chunk_tasks(n_tasks));
}

// The hand-out protocol takes no lock on its fast path (session 38): on the 16-core GPU box a
// hand-out cost 34 µs over an even split at 16 threads (15 at 8, 4.5 at 4) when every worker
// took mutex_ to join a job and again to leave it — a convoy of futex hand-offs, ~480 of them a
// decode token. Now:
// - the caller writes the job, opens it (job_open_) and bumps published_generation_; it takes
//   mutex_ to notify only when a worker sleeps (sleepers_);
// - a worker that sees the new generation counts itself in active_workers_ and then reads
//   job_open_: both seq_cst, against the caller's close (job_open_ = false, then reading
//   active_workers_), so either the worker sees the job closed and reads nothing, or the caller
//   sees the worker and waits for it — the job's fields never change under a worker;
// - the last worker out takes mutex_ to notify only when the caller sleeps (caller_waiting_).
// Each pair (generation / sleepers_, active_workers_ / caller_waiting_) is a store then a load
// of the other's variable on each side, all seq_cst, so one side always sees the other.
void ThreadPool::run_job(const TaskFn& fn, int64_t n_tasks, int64_t chunk_tasks) {
  std::lock_guard caller_lock(caller_mutex_);
  jobs_run_.fetch_add(1, std::memory_order_relaxed);
  job_fn_ = &fn;
  job_n_tasks_ = n_tasks;
  job_chunk_tasks_ = chunk_tasks;
  next_task_.value.store(0, std::memory_order_relaxed);
  job_open_.store(true, std::memory_order_seq_cst);  // publishes the fields above
  published_generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard lock(mutex_);  // a sleeper is in wait() or about to test the generation
    work_cv_.notify_all();
  }

  {
    RunningPoolScope scope(this, 0);
    run_chunks(fn, n_tasks, chunk_tasks, 0);
  }

  // The counter is exhausted, so every chunk still running belongs to a worker that joined the
  // job; closing it keeps late joiners out, then we wait for the joined ones to leave. The
  // caller has nothing else to do: poll briefly before sleeping, since waking a sleeping caller
  // costs as much as waking a worker (tens of µs on this VM).
  job_open_.store(false, std::memory_order_seq_cst);
  const int64_t caller_deadline_ns = now_ns() + int64_t(kCallerSpinMicros) * 1000;
  const auto all_left = [this] { return active_workers_.load(std::memory_order_seq_cst) == 0; };
  std::exception_ptr exception;
  {
    const bool left = spin_until(all_left, [&] { return caller_deadline_ns; });
    std::unique_lock lock(mutex_);
    if (!left) {
      caller_waiting_.store(true, std::memory_order_seq_cst);
      done_cv_.wait(lock, all_left);
      caller_waiting_.store(false, std::memory_order_relaxed);
    }
    job_fn_ = nullptr;
    exception = std::exchange(first_exception_, nullptr);
  }
  if (exception) std::rethrow_exception(exception);
}

void ThreadPool::worker_main(int thread_index) {
  RunningPoolScope scope(this, thread_index);
  workers_started_.fetch_add(1, std::memory_order_release);
  uint64_t seen_generation = 0;
  const auto new_generation = [&] {
    return published_generation_.load(std::memory_order_seq_cst) != seen_generation;
  };
  for (;;) {
    // Poll until worker_spin_us_ after the later of this job's end and the caller's last run of
    // a hand-out on its own (note_caller_activity): a caller that runs a stretch of small
    // hand-outs inline keeps the workers ready for its next large one.
    if (worker_spin_us_ > 0) {
      const int64_t spin_ns = int64_t(worker_spin_us_) * 1000, idle_since_ns = now_ns();
      spin_until(new_generation, [&] {
        return std::max(idle_since_ns, caller_activity_ns_.value.load(std::memory_order_relaxed)) +
               spin_ns;
      });
    }
    if (!new_generation()) {
      std::unique_lock lock(mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      work_cv_.wait(lock, new_generation);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen_generation = published_generation_.load(std::memory_order_seq_cst);
    if (stop_.load(std::memory_order_seq_cst)) return;
    active_workers_.fetch_add(1, std::memory_order_seq_cst);
    if (job_open_.load(std::memory_order_seq_cst)) {
      // Open after we counted ourselves: the caller waits for us before it changes the job.
      run_chunks(*job_fn_, job_n_tasks_, job_chunk_tasks_, thread_index);
    }
    if (active_workers_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_waiting_.load(std::memory_order_seq_cst)) {
      std::lock_guard lock(mutex_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace strata::compute
