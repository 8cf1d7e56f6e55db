// util/core_latency.h: the CPUs a process may use, and the cache-line round trip between two of
// them (what `strata bench cpu` prints): a positive time when both CPUs can be pinned, nothing for
// the same CPU or one outside the affinity mask, and the caller's own mask left as it was.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>

#include "util/core_latency.h"

namespace strata {
namespace {

TEST(CoreLatency, AllowedCpusAreAscendingAndIncludeTheCurrentOne) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  EXPECT_NE(std::find(cpus.begin(), cpus.end(), sched_getcpu()), cpus.end());
}

TEST(CoreLatency, RoundTripBetweenTwoCpusIsPositiveAndLeavesTheMaskAlone) {
  const std::vector<int> cpus = allowed_cpus();
  EXPECT_FALSE(cache_line_round_trip_ns(cpus.front(), cpus.front()).has_value());
  EXPECT_FALSE(cache_line_round_trip_ns(cpus.front(), -1).has_value());
  EXPECT_FALSE(cache_line_round_trip_ns(cpus.front(), cpus.back() + 1).has_value());
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU: no pair to measure";
  cpu_set_t before, after;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(before), &before), 0);
  // Few round trips: on a loaded box a descheduled partner costs a scheduler tick each.
  const std::optional<double> ns = cache_line_round_trip_ns(cpus[0], cpus[1], 200);
  ASSERT_TRUE(ns.has_value());
  EXPECT_GT(*ns, 0.0);
  EXPECT_LT(*ns, 50e6);  // 50 ms a round trip would mean the measurement is broken
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(after), &after), 0);
  EXPECT_TRUE(CPU_EQUAL(&before, &after));
}

}  // namespace
}  // namespace strata
