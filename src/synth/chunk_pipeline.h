// ChunkPipeline — produces numbered byte chunks on worker threads and hands them to one consumer
// thread strictly in order (job 0, 1, 2, ...), so a file can be written sequentially while its
// contents are computed in parallel.
//
// Contract
// - `produce(job, out)` fills `out` (resized by the callee) with job `job`'s bytes. It is called
//   exactly once per job, from a worker thread (or, with n_threads <= 1, from the consumer inside
//   `next`), possibly concurrently with other jobs: it must only read shared state. What a job
//   produces must depend on the job number alone, never on which thread runs it or when; then
//   the concatenated output is the same for every thread count.
// - `next()` returns the next job's bytes, valid until the following `next()` call or
//   destruction. Calling it more than n_jobs times throws. An exception thrown by `produce` is
//   rethrown from the `next()` that would have returned that job.
// - Memory: at most `max_in_flight` chunks exist at once (the one the consumer holds included);
//   workers wait when they are that far ahead of the consumer.
// - Threads: the owner thread constructs, calls `next` and destroys; the destructor stops and
//   joins the workers (jobs not yet taken are never produced).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace strata {

class ChunkPipeline {
 public:
  using Produce = std::function<void(size_t job, std::vector<uint8_t>& out)>;

  ChunkPipeline(size_t n_jobs, int n_threads, Produce produce, size_t max_in_flight = 0);
  ~ChunkPipeline();
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  std::span<const uint8_t> next();

 private:
  struct Slot {
    std::vector<uint8_t> bytes;
    std::exception_ptr error;
    bool ready = false;
  };
  void work();
  // Jobs whose slot the consumer has handed back (all returned ones but the one it holds).
  size_t released() const { return next_to_return_ - (consumer_holds_ ? 1 : 0); }

  const size_t n_jobs_;
  const Produce produce_;
  std::vector<Slot> slots_;  // job j lives in slots_[j % size]
  // Guarded by mutex_: the next job a worker takes, the next job the consumer returns, whether it
  // still holds the previous one, and stop.
  std::mutex mutex_;
  std::condition_variable job_ready_;   // a slot became ready (consumer waits)
  std::condition_variable slot_freed_;  // the consumer moved on (workers wait)
  size_t next_to_take_ = 0;
  size_t next_to_return_ = 0;
  bool consumer_holds_ = false;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Runs fn(i) for i in [0, n) on up to n_threads threads (the caller's included); rethrows the
// first exception after all threads have finished. fn must be safe to call concurrently.
void parallel_for(size_t n, int n_threads, const std::function<void(size_t)>& fn);

}  // namespace strata
