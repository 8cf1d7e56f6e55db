// Cache replay — ExpertStore's residency policy simulated over a routing trace
// (route/routing_trace.h).
//
// What it promises
// - For the same settings (slots per layer or budget, read-ahead on/off, fill ranking + pins),
//   replaying the trace of a run gives exactly the counters a live ExpertStore had after that run:
//   layer visits, needed, hits, misses, miss bytes, read-ahead issued/used, and bytes read (the
//   live counter counts a read when it completes, so it equals this one once the reads in flight
//   have landed). io_wait_ms stays 0: a replay has no clock. tests/route checks replay == live.
// - It is an independent reimplementation of the policy described in expert_store.h, not a call
//   into it: the per-layer LRU over unpinned slots (ties to the lower slot; empty slots first),
//   the union of a window's rows protected from eviction while its misses get slots in ascending
//   id, transient slots (no residency change) when every slot is protected or pinned, read-ahead
//   capped at half the layer's slots and stopping once an all-resident store is full, one LRU
//   clock tick per begin_layer / predict / fill.
// - Pure function of (trace, settings): no I/O, no threads; sweeps can run settings in parallel.
#pragma once

#include <cstdint>
#include <vector>

#include "experts/store_stats.h"
#include "route/routing_trace.h"

namespace strata {

struct CacheReplaySettings {
  int slots_per_layer = 0;  // > 0: exactly this many cache slots per block (capped at n_expert)
  // When slots_per_layer == 0: budget / Σ record bytes slots (at least 1).
  uint64_t budget_bytes = 0;
  bool read_ahead = true;
  // [block]: loaded first, most wanted first, as ExpertStore::fill does; empty: no fill.
  std::vector<std::vector<int32_t>> fill_ranking;
  int n_pinned = 0;  // of each block's ranking, pinned
};

struct CacheReplayResult {
  int slots_per_layer = 0;
  // slots × Σ record bytes: the store's arena without its transient slots.
  uint64_t cache_bytes = 0;
  ExpertStoreStats stats;   // the whole trace, fill included: a store's counters since construction
  ExpertStoreStats decode;  // the 1-row windows only (decode steps), fill excluded
};

// The slots per layer a store with these settings gets (ExpertStore's rule).
int replay_slots_per_layer(const RoutingTraceHeader& header, const CacheReplaySettings& settings);

// Throws strata::Error when the fill ranking names an expert or block the trace's model lacks.
CacheReplayResult replay_cache(const RoutingTrace& trace, const CacheReplaySettings& settings);

}  // namespace strata
