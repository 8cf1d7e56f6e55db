// Contract in device_slot_rows.h.
#include "experts/device_slot_rows.h"

#include <algorithm>

#include "util/error.h"

namespace strata {

DeviceSlotRows::DeviceSlotRows(int n_layer, int n_expert, uint32_t first_transient)
    : n_expert_(n_expert), first_transient_(first_transient) {
  if (n_layer < 0 || n_expert < 1) fail("device slot rows: {} layers of {} experts", n_layer, n_expert);
  rows_.assign(size_t(n_layer) * size_t(n_expert), kMiss);
}

void DeviceSlotRows::write(int layer, std::span<const uint32_t> row) {
  if (row.size() != size_t(n_expert_)) fail("device slot rows: a row of {} entries for {} experts", row.size(), n_expert_);
  std::copy(row.begin(), row.end(), rows_.begin() + ptrdiff_t(size_t(layer) * size_t(n_expert_)));
}

std::span<const uint32_t> DeviceSlotRows::row(int layer) const {
  if (layer < 0 || size_t(layer + 1) * size_t(n_expert_) > rows_.size()) fail("device slot rows: no layer {}", layer);
  return {rows_.data() + size_t(layer) * size_t(n_expert_), size_t(n_expert_)};
}

bool DeviceSlotRows::all_cached(int layer, std::span<const int32_t> experts) const {
  const std::span<const uint32_t> r = row(layer);
  return std::all_of(experts.begin(), experts.end(), [&](int32_t e) { return r[size_t(e)] < first_transient_; });
}

bool DeviceSlotRows::agrees(int layer, std::span<const uint32_t> cached) const {
  const std::span<const uint32_t> r = row(layer);
  if (cached.size() != r.size()) return false;
  for (size_t e = 0; e < r.size(); ++e)
    if (r[e] != cached[e] && !(cached[e] == kMiss && r[e] >= first_transient_)) return false;
  return true;
}

}  // namespace strata
