// Core-to-core latency: how long one cache line takes to travel from one CPU to another and back.
//
// Why it is measured: every pool hand-out, and every output one thread writes that another reads,
// pays it. It is what decides whether a small product is worth splitting over threads: on the
// 2-vCPU build box the two CPUs are ~470 ns apart (a round trip), and a decode row of the small
// default model runs faster on one thread than on two (docs/serve.md, "Batch groups").
// `strata bench cpu` prints it next to its thread-scaling tables.
//
// Contract
// - cache_line_round_trip_ns(a, b, n): two threads pinned to CPUs a and b pass a counter back and
//   forth through one 64-byte-aligned cache line n times; returns the median over 5 runs of
//   (wall time / n), in ns. nullopt when either CPU cannot be pinned (not in this process's
//   affinity mask, or a == b). Busy-waits on both CPUs for the whole run (~n · 0.5 µs · 5).
// - allowed_cpus(): the CPUs this process may run on, ascending.
#pragma once

#include <optional>
#include <vector>

namespace strata {

std::optional<double> cache_line_round_trip_ns(int cpu_a, int cpu_b, int round_trips = 100000);
std::vector<int> allowed_cpus();

}  // namespace strata
