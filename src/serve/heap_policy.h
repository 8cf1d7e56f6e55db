// HeapPolicy — keeps the server's resident memory flat under a long load. What crept in the
// 10-minute `--parallel 8` load test (docs/serve.md "Load test") was glibc's allocator, not a
// leak: under heaptrack the live heap stays flat over thousands of requests (only OpenSSL's
// start-up tables are left at exit), while the bytes malloc keeps free inside its arenas grow.
// glibc makes up to 8 arenas per core, and the ~80 connection and slot threads spread their
// short-lived allocations (request bodies, JSON, sessions) over all of them; each arena keeps
// its own free memory, fragmented, and returns little of it.
// Two measures, both from the server's own threads:
// - `limit_arenas` (at start, before the threads): at most kMaxArenas arenas, unless the
//   environment chose (MALLOC_ARENA_MAX, or GLIBC_TUNABLES naming arena_max). Decode steps
//   allocate nothing (tests/engine zero_alloc_test), so fewer arenas cost no contention there.
// - `after_generation` (a slot thread, after each job and after each choice it ran for another
//   job — Scheduler's after_work —, no lock of the engine held): malloc_trim(0) at most once per
//   kTrimInterval, which gives the free pages of every arena back to the system.
//
// Thread safety: every method from any thread (an atomic decides which caller trims).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace strata::serve {

struct HeapTrimStats {
  uint64_t trims = 0;       // malloc_trim calls
  double trim_seconds = 0;  // time spent in them
  uint64_t checks = 0;      // after_generation calls (each may trim)
};

class HeapPolicy {
 public:
  // Measured on the 2-core box (docs/serve.md "Load test"): with 2 arenas the free bytes inside
  // them stayed at ~3 MiB for 3 minutes of 64 streams, against 7.7 -> 10.9 MiB with glibc's 16.
  static constexpr int kMaxArenas = 2;
  static constexpr std::chrono::milliseconds kTrimInterval{1000};

  // Returns whether it set the limit (false: the environment sets it, or mallopt refused).
  static bool limit_arenas();
  void after_generation();
  HeapTrimStats stats() const;

 private:
  std::atomic<int64_t> next_trim_ns_{0};  // steady_clock time before which nobody trims
  std::atomic<uint64_t> trims_{0};
  std::atomic<uint64_t> trim_ns_{0};
  std::atomic<uint64_t> checks_{0};
};

}  // namespace strata::serve
