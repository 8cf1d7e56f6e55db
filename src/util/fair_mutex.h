// FairMutex — a mutex that hands itself out in arrival order (a ticket lock on a condition
// variable; BasicLockable, so std::lock_guard / std::unique_lock work).
//
// Why: `strata serve --parallel` runs every window (one slot's prefill windows, the batched decode
// steps of the others) under one lock, because they share the thread pool and the expert source.
// A prefilling slot unlocks between its windows and at once asks again; std::mutex would usually
// let it straight back in and starve the waiting decode step for the whole prompt. With tickets
// the decode step runs after the windows already queued before it (one per prefilling slot).
//
// Thread safety: any thread. Not recursive. Waiters sleep (nothing spins).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace strata {

class FairMutex {
 public:
  void lock() {
    std::unique_lock guard(mutex_);
    const uint64_t ticket = next_ticket_++;
    turn_.wait(guard, [&] { return serving_ == ticket; });
  }
  void unlock() {
    {
      std::lock_guard guard(mutex_);
      ++serving_;
    }
    turn_.notify_all();
  }

 private:
  std::mutex mutex_;  // guards the two counters
  std::condition_variable turn_;
  uint64_t next_ticket_ = 0;  // the ticket the next lock() takes
  uint64_t serving_ = 0;      // the ticket that holds the lock (or may take it)
};

}  // namespace strata
