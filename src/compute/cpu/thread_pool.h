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
// - Idle workers sleep on a condition variable; nothing spins. (A bounded spin before sleeping
//   was not added: see docs/bench-matvec.md for the wake-up cost measured without it.)
// - An exception thrown by fn on any thread stops the hand-out of further chunks, waits for the
//   chunks already running, and is rethrown on the calling thread (the first one; others dropped).
// - Nested use: parallel_for called from inside a task of this same pool runs fn(0, n_tasks,
//   current thread_index) inline on that thread, so it cannot deadlock.
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
#include <thread>
#include <vector>

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
  using TaskFn = std::function<void(int64_t begin, int64_t end, int thread_index)>;

  // n_threads counts the caller: n_threads - 1 workers are started. Throws strata::Error if
  // n_threads < 1.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  void parallel_for(int64_t n_tasks, const TaskFn& fn);

  // The thread_index the current thread has in this pool: its worker index inside a task of this
  // pool, otherwise 0 (the caller's slot).
  int current_thread_index() const;

  // Per-participant scratch, index in [0, size()); see the thread-safety contract above.
  ScratchBuffer& scratch(int thread_index) { return scratch_[size_t(thread_index)]; }

 private:
  void worker_main(int thread_index);
  // Takes chunks from the current job until none are left; records the first exception.
  void run_chunks(const TaskFn& fn, int64_t n_tasks, int64_t chunk_tasks, int thread_index);

  const int n_threads_;
  std::vector<std::thread> workers_;
  std::vector<ScratchBuffer> scratch_;

  std::mutex caller_mutex_;  // serialises parallel_for calls from different outside threads

  // Job state. Guarded by mutex_ except next_task_ (atomic, the hand-out counter).
  std::mutex mutex_;
  std::condition_variable work_cv_;  // workers wait here for a new generation or stop
  std::condition_variable done_cv_;  // the caller waits here for active_workers_ == 0
  uint64_t generation_ = 0;
  bool job_open_ = false;  // workers may join the current job only while this is true
  bool stop_ = false;
  const TaskFn* job_fn_ = nullptr;
  int64_t job_n_tasks_ = 0;
  int64_t job_chunk_tasks_ = 1;
  int active_workers_ = 0;  // workers that joined the current job and have not left it
  std::exception_ptr first_exception_;
  struct alignas(64) PaddedCounter {
    std::atomic<int64_t> value{0};
  };
  PaddedCounter next_task_;
};

}  // namespace strata::compute
