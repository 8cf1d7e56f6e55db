// ExpertStoreStats — what an ExpertStore counts (experts/expert_store.h), and what a replay of a
// routing trace reproduces (route/cache_replay.h).
//
// The residency counters (visits, needed, hits, misses, read-ahead issued and used) are
// SlotResidency's decisions, so they are a pure function of the tokens and the settings; the byte
// counters are the reader's requests; io_wait_ms is the only one that depends on the disk.
// Plain values: copy and subtract them freely (a window's counters = after - before).
#pragma once

#include <cstdint>

namespace strata {

struct SlotResidencyStats;

// Counters since construction (or the last reset_stats). "Needed" = the union a layer routes to.
struct ExpertStoreStats {
  uint64_t layer_visits = 0;
  uint64_t needed = 0;
  uint64_t hits = 0;               // needed and resident at publish (read-ahead ones included)
  uint64_t misses = 0;             // needed and not resident: urgent reads
  uint64_t read_ahead_issued = 0;  // read-ahead reads started
  uint64_t read_ahead_used = 0;    // of those, needed by the layer they were issued for
  uint64_t bytes_read = 0;         // all reads (misses, read-ahead, fill)
  uint64_t miss_bytes = 0;         // record bytes of the misses (what the window had to wait for)
  uint64_t pin_changes = 0;        // prompt-hot pins added or dropped
  double io_wait_ms = 0;           // the window thread blocked on reads

  // Read-ahead precision: used / issued. Recall: of the experts a layer needed that were not
  // resident before its prediction, the share read-ahead had brought in.
  double hit_rate() const { return needed ? double(hits) / double(needed) : 1.0; }
  double read_ahead_precision() const {
    return read_ahead_issued ? double(read_ahead_used) / double(read_ahead_issued) : 0.0;
  }
  double read_ahead_recall() const {
    const uint64_t cold = misses + read_ahead_used;
    return cold ? double(read_ahead_used) / double(cold) : 0.0;
  }
  ExpertStoreStats operator-(const ExpertStoreStats& o) const;
  // The residency counters taken from a SlotResidency; the others left as they are.
  void set_residency(const SlotResidencyStats& residency);
};

}  // namespace strata
