#include "compute/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <new>
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

// Polls `done` with a CPU pause between polls for at most `micros` microseconds; true if it held.
template <typename Done>
bool spin_until(Done done, int micros) {
  if (micros <= 0) return done();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();  // tells the core we spin: saves power, frees the pipeline
#endif
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
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

ThreadPool::ThreadPool(int n_threads, int worker_spin_us)
    : n_threads_(n_threads), worker_spin_us_(worker_spin_us) {
  if (n_threads < 1) fail("ThreadPool: expected n_threads >= 1, found {}", n_threads);
  if (worker_spin_us < 0) fail("ThreadPool: expected worker_spin_us >= 0, found {}", worker_spin_us);
  scratch_.resize(size_t(n_threads));
  workers_.reserve(size_t(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
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
    RunningPoolScope scope(this, 0);
    fn(0, n_tasks, 0);
    return;
  }

  // About 4 chunks per thread: enough slack to absorb a worker that wakes late, few enough that
  // each chunk is a long contiguous stretch of work (matters for streaming weights from DRAM).
  run_job(fn, n_tasks, std::max<int64_t>(1, n_tasks / (int64_t(n_threads_) * 4)));
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

void ThreadPool::run_job(const TaskFn& fn, int64_t n_tasks, int64_t chunk_tasks) {
  std::lock_guard caller_lock(caller_mutex_);
  jobs_run_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    job_fn_ = &fn;
    job_n_tasks_ = n_tasks;
    job_chunk_tasks_ = chunk_tasks;
    first_exception_ = nullptr;
    next_task_.value.store(0, std::memory_order_relaxed);
    job_open_ = true;
    ++generation_;
    published_generation_.store(generation_, std::memory_order_release);
  }
  work_cv_.notify_all();

  {
    RunningPoolScope scope(this, 0);
    run_chunks(fn, n_tasks, chunk_tasks, 0);
  }

  {
    // The counter is exhausted, so every chunk still running belongs to a worker that joined the
    // job; closing it keeps late wakers out, then we wait for the joined ones to leave.
    std::lock_guard lock(mutex_);
    job_open_ = false;
  }
  // The caller has nothing else to do: poll briefly before sleeping, since waking a sleeping
  // caller costs as much as waking a worker (tens of µs on this VM).
  spin_until([this] { return active_workers_.load(std::memory_order_acquire) == 0; },
             kCallerSpinMicros);
  std::exception_ptr exception;
  {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [this] { return active_workers_.load(std::memory_order_relaxed) == 0; });
    job_fn_ = nullptr;
    exception = std::exchange(first_exception_, nullptr);
  }
  if (exception) std::rethrow_exception(exception);
}

void ThreadPool::worker_main(int thread_index) {
  RunningPoolScope scope(this, thread_index);
  uint64_t seen_generation = 0;
  for (;;) {
    const TaskFn* fn = nullptr;
    int64_t n_tasks = 0;
    int64_t chunk_tasks = 1;
    spin_until(
        [&] { return published_generation_.load(std::memory_order_acquire) != seen_generation; },
        worker_spin_us_);
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen_generation; });
      if (stop_) return;
      seen_generation = generation_;
      if (!job_open_) continue;  // woke after the caller finished this job alone
      active_workers_.fetch_add(1, std::memory_order_relaxed);
      fn = job_fn_;
      n_tasks = job_n_tasks_;
      chunk_tasks = job_chunk_tasks_;
    }
    run_chunks(*fn, n_tasks, chunk_tasks, thread_index);
    bool last = false;
    {
      std::lock_guard lock(mutex_);
      last = active_workers_.fetch_sub(1, std::memory_order_release) == 1;
    }
    if (last) done_cv_.notify_one();
  }
}

}  // namespace strata::compute
