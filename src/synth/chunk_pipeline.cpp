#include "synth/chunk_pipeline.h"

#include <algorithm>
#include <atomic>

#include "util/error.h"

namespace strata {

ChunkPipeline::ChunkPipeline(size_t n_jobs, int n_threads, Produce produce, size_t max_in_flight)
    : n_jobs_(n_jobs), produce_(std::move(produce)) {
  if (n_threads <= 1) {
    slots_.resize(1);
    return;
  }
  // Two chunks per worker keeps every worker busy while the consumer writes one.
  const size_t in_flight = max_in_flight > 0 ? max_in_flight : 2 * size_t(n_threads) + 2;
  slots_.resize(std::max<size_t>(in_flight, 2));
  const int n_workers = int(std::min<size_t>(size_t(n_threads), std::max<size_t>(n_jobs, 1)));
  workers_.reserve(size_t(n_workers));
  for (int i = 0; i < n_workers; ++i) workers_.emplace_back([this] { work(); });
}

ChunkPipeline::~ChunkPipeline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  slot_freed_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ChunkPipeline::work() {
  const size_t n_slots = slots_.size();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // Jobs [next_to_return_ - 1 (held by the consumer), ...) occupy the slots; job j may start
    // once job j - n_slots has been handed back, i.e. j < released + n_slots.
    slot_freed_.wait(lock, [&] {
      return stop_ || next_to_take_ >= n_jobs_ || next_to_take_ < released() + n_slots;
    });
    if (stop_ || next_to_take_ >= n_jobs_) return;
    const size_t job = next_to_take_++;
    Slot& slot = slots_[job % n_slots];
    lock.unlock();
    std::exception_ptr error;
    try {
      produce_(job, slot.bytes);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    slot.error = error;
    slot.ready = true;
    job_ready_.notify_all();
  }
}

std::span<const uint8_t> ChunkPipeline::next() {
  if (next_to_return_ >= n_jobs_)
    fail("ChunkPipeline: next() called after all {} jobs were returned", n_jobs_);
  if (workers_.empty()) {
    Slot& slot = slots_[0];
    produce_(next_to_return_++, slot.bytes);
    return slot.bytes;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  consumer_holds_ = false;  // the previous chunk is no longer needed
  slot_freed_.notify_all();
  Slot& slot = slots_[next_to_return_ % slots_.size()];
  job_ready_.wait(lock, [&] { return slot.ready; });
  slot.ready = false;
  ++next_to_return_;
  consumer_holds_ = true;
  if (slot.error) {
    std::exception_ptr error = slot.error;
    slot.error = nullptr;
    std::rethrow_exception(error);
  }
  return slot.bytes;
}

void parallel_for(size_t n, int n_threads, const std::function<void(size_t)>& fn) {
  const size_t n_workers = std::min<size_t>(size_t(std::max(n_threads, 1)), n);
  if (n_workers <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next_item{0};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  auto run = [&] {
    for (size_t i; (i = next_item.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        next_item = n;  // stop handing out items
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(n_workers - 1);
  for (size_t t = 1; t < n_workers; ++t) threads.emplace_back(run);
  run();
  for (std::thread& thread : threads) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace strata
