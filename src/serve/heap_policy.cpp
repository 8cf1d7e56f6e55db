#include "serve/heap_policy.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace strata::serve {

HeapPolicy::HeapPolicy() : HeapPolicy([] { malloc_trim(0); }, kTrimInterval) {}

HeapPolicy::HeapPolicy(std::function<void()> trim, std::chrono::nanoseconds interval)
    : trim_(std::move(trim)), interval_(interval), trimmer_([this] { trim_loop(); }) {}

HeapPolicy::~HeapPolicy() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  trimmer_.join();
}

bool HeapPolicy::limit_arenas() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_ARENA_MAX") || (tunables && std::strstr(tunables, "arena_max")))
    return false;
  return mallopt(M_ARENA_MAX, kMaxArenas) == 1;
}

void HeapPolicy::after_generation() {
  checks_.fetch_add(1, std::memory_order_relaxed);
  if (trim_wanted_.exchange(true)) return;  // asked already; the trim thread has not started it
  // Under the mutex, the trim thread has either not yet read trim_wanted_ (it will see it) or
  // waits (it is woken): no lost wake-up. It never holds the mutex while trimming.
  std::lock_guard lock(mutex_);
  wake_.notify_one();
}

void HeapPolicy::trim_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || trim_wanted_.load(); });
    if (stopping_) return;
    trim_wanted_.store(false);  // generations that end during the trim ask for the next one
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    trim_();
    const auto end = std::chrono::steady_clock::now();
    trims_.fetch_add(1, std::memory_order_relaxed);
    trim_ns_.fetch_add(
        uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count()),
        std::memory_order_relaxed);
    lock.lock();
    // At most one trim per interval: a generation that ends meanwhile wakes this wait, which
    // goes on; its trim starts when the interval has passed.
    wake_.wait_until(lock, end + interval_, [&] { return stopping_; });
  }
}

HeapTrimStats HeapPolicy::stats() const {
  return {trims_.load(std::memory_order_relaxed),
          double(trim_ns_.load(std::memory_order_relaxed)) * 1e-9,
          checks_.load(std::memory_order_relaxed)};
}

}  // namespace strata::serve
