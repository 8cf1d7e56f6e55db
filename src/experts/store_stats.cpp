#include "experts/store_stats.h"

#include "experts/slot_residency.h"

namespace strata {

ExpertStoreStats ExpertStoreStats::operator-(const ExpertStoreStats& o) const {
  ExpertStoreStats d;
  d.layer_visits = layer_visits - o.layer_visits;
  d.needed = needed - o.needed;
  d.hits = hits - o.hits;
  d.misses = misses - o.misses;
  d.read_ahead_issued = read_ahead_issued - o.read_ahead_issued;
  d.read_ahead_used = read_ahead_used - o.read_ahead_used;
  d.bytes_read = bytes_read - o.bytes_read;
  d.miss_bytes = miss_bytes - o.miss_bytes;
  d.pin_changes = pin_changes - o.pin_changes;
  d.io_wait_ms = io_wait_ms - o.io_wait_ms;
  return d;
}

void ExpertStoreStats::set_residency(const SlotResidencyStats& r) {
  layer_visits = r.layer_visits;
  needed = r.needed;
  hits = r.hits;
  misses = r.misses;
  read_ahead_issued = r.read_ahead_issued;
  read_ahead_used = r.read_ahead_used;
}

}  // namespace strata
