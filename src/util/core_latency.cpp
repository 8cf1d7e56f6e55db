#include "util/core_latency.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace strata {
namespace {

bool pin_this_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// One run: the caller (already pinned) writes odd values, the partner on cpu_b answers with the
// next even one.
std::optional<double> one_run(int cpu_b, int round_trips) {
  struct alignas(64) Line {
    std::atomic<int64_t> value{0};
  } line;
  std::atomic<int> partner_pinned{-1};  // -1 not yet, 0 failed, 1 pinned
  std::thread partner([&] {
    const bool pinned = pin_this_thread(cpu_b);
    partner_pinned.store(pinned ? 1 : 0);
    if (!pinned) return;
    for (int64_t i = 0; i < round_trips; ++i) {
      while (line.value.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      line.value.store(2 * i + 2, std::memory_order_release);
    }
  });
  while (partner_pinned.load() < 0) std::this_thread::yield();
  if (partner_pinned.load() == 0) {
    partner.join();
    return std::nullopt;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < round_trips; ++i) {
    line.value.store(2 * i + 1, std::memory_order_release);
    while (line.value.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  partner.join();
  return ns / round_trips;
}

}  // namespace

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

std::optional<double> cache_line_round_trip_ns(int cpu_a, int cpu_b, int round_trips) {
  if (cpu_a == cpu_b || round_trips < 1) return std::nullopt;
  const std::vector<int> cpus = allowed_cpus();
  const auto allowed = [&](int cpu) { return std::find(cpus.begin(), cpus.end(), cpu) != cpus.end(); };
  if (!allowed(cpu_a) || !allowed(cpu_b)) return std::nullopt;
  // The measuring thread is pinned for the runs and given its old mask back afterwards.
  cpu_set_t saved;
  CPU_ZERO(&saved);
  if (pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) != 0) return std::nullopt;
  if (!pin_this_thread(cpu_a)) return std::nullopt;
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    const std::optional<double> ns = one_run(cpu_b, round_trips);
    if (!ns) break;
    runs.push_back(*ns);
  }
  pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  if (runs.empty()) return std::nullopt;
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace strata
