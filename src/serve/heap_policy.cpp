#include "serve/heap_policy.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace strata::serve {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool HeapPolicy::limit_arenas() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_ARENA_MAX") || (tunables && std::strstr(tunables, "arena_max")))
    return false;
  return mallopt(M_ARENA_MAX, kMaxArenas) == 1;
}

void HeapPolicy::after_generation() {
  checks_.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = now_ns();
  int64_t next = next_trim_ns_.load(std::memory_order_relaxed);
  if (now < next) return;
  const int64_t interval = std::chrono::nanoseconds(kTrimInterval).count();
  if (!next_trim_ns_.compare_exchange_strong(next, now + interval)) return;  // another one trims
  malloc_trim(0);
  trims_.fetch_add(1, std::memory_order_relaxed);
  trim_ns_.fetch_add(uint64_t(now_ns() - now), std::memory_order_relaxed);
}

HeapTrimStats HeapPolicy::stats() const {
  return {trims_.load(std::memory_order_relaxed), double(trim_ns_.load()) * 1e-9,
          checks_.load(std::memory_order_relaxed)};
}

}  // namespace strata::serve
