// HeapPolicy — keeps the server's resident memory flat under a long load. What crept in the
// 10-minute `--parallel 8` load test (docs/serve.md "Load test") was glibc's allocator, not a
// leak: under heaptrack the live heap stays flat over thousands of requests (only OpenSSL's
// start-up tables are left at exit), while the bytes malloc keeps free inside its arenas grow.
// glibc makes up to 8 arenas per core, and the ~80 connection and slot threads spread their
// short-lived allocations (request bodies, JSON, sessions) over all of them; each arena keeps
// its own free memory, fragmented, and returns little of it.
// Two measures:
// - `limit_arenas` (at start, before the threads): at most kMaxArenas arenas, unless the
//   environment chose (MALLOC_ARENA_MAX, or GLIBC_TUNABLES naming arena_max). Decode steps
//   allocate nothing (tests/engine zero_alloc_test), so fewer arenas cost no contention there.
// - a trim thread, owned by the HeapPolicy: malloc_trim(0), which gives the free pages of every
//   arena back to the system, after generations and at most once per kTrimInterval (the next
//   trim starts at least that long after the last one ended). `after_generation` (a slot thread,
//   after each job and after each choice it ran for another job — Scheduler's after_work —, no
//   lock of the engine held) only wakes that thread. Why not trim on the slot thread itself: under
//   64 streams a trim took ~32 ms (strata_heap_trim_seconds_total / strata_heap_trims_total), a
//   pause in that slot's decoding. Generations that end during the wait after a trim are not
//   lost: one more trim follows when the interval has passed.
//
// Thread safety: `after_generation` and `stats` from any thread; `after_generation` never waits
// for a trim (it takes a mutex that the trim thread holds only to read its flags, never while
// trimming). The destructor stops the trim thread and joins it: at once when it is idle or
// waiting out the interval, after the trim when one is running. REQUIRES: no after_generation
// call runs or starts during or after the destructor (the server destroys the scheduler, whose
// workers call it, first).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace strata::serve {

struct HeapTrimStats {
  uint64_t trims = 0;       // malloc_trim calls
  double trim_seconds = 0;  // time spent in them
  uint64_t checks = 0;      // after_generation calls (each asks for a trim)
};

class HeapPolicy {
 public:
  // Measured on the 2-core box (docs/serve.md "Load test"): with 2 arenas the free bytes inside
  // them stayed at ~3 MiB for 3 minutes of 64 streams, against 7.7 -> 10.9 MiB with glibc's 16.
  static constexpr int kMaxArenas = 2;
  static constexpr std::chrono::milliseconds kTrimInterval{1000};

  // Trims with malloc_trim(0) at most once per kTrimInterval.
  HeapPolicy();
  // For tests: `trim` instead of malloc_trim(0), run on the trim thread; `interval` instead of
  // kTrimInterval.
  HeapPolicy(std::function<void()> trim, std::chrono::nanoseconds interval);
  ~HeapPolicy();
  HeapPolicy(const HeapPolicy&) = delete;
  HeapPolicy& operator=(const HeapPolicy&) = delete;

  // Returns whether it set the limit (false: the environment sets it, or mallopt refused).
  static bool limit_arenas();
  // A generation ended: counts a check and wakes the trim thread. Never waits for a trim.
  void after_generation();
  HeapTrimStats stats() const;

 private:
  void trim_loop();

  const std::function<void()> trim_;
  const std::chrono::nanoseconds interval_;
  // Set by after_generation, cleared by the trim thread when it starts a trim: while it is set,
  // after_generation neither locks nor notifies.
  std::atomic<bool> trim_wanted_{false};
  std::mutex mutex_;  // guards stopping_; taken with trim_wanted_'s wake-up (no lost notify)
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<uint64_t> trims_{0};
  std::atomic<uint64_t> trim_ns_{0};
  std::atomic<uint64_t> checks_{0};
  std::thread trimmer_;  // last: starts once the members above exist; the only caller of trim_
};

}  // namespace strata::serve
