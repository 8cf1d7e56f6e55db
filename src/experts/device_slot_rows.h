// DeviceSlotRows — the host's copy of the slot-map rows a device holds for a SlotResidency (the GPU
// expert tier, compute/cuda/expert_tier.h), and the rule by which the device's wait kernel goes on
// without the host ("self-release"): every routed expert of the layer has a cache slot in the
// device's row.
//
// Why a copy: the device's row is written at three points, none of which is "now" on the host:
// a layer's wait kernel writes the row of the host's job (the residency after resolve, plus that
// call's transient slots), a read-ahead job's row (the residency after predict) waits on the
// device until the layer's next wait applies it, and a change between windows (startup fill,
// prompt-hot pins) is uploaded at once. The host mirrors each write when it makes it; the device
// applies them in the same order (a layer's pending row before the rule, the job after), so the
// host evaluates the rule on what the device sees.
// What makes self-release exact: SlotResidency::resolve changes no assignment when every expert
// hits, so a row whose cache entries equal the residency's stays right; agrees() checks that.
// Offsets at or above `first_transient` are transient slots (a single call's): never cached.
//
// Thread safety: none (the tier's handshake thread, or the window thread between windows).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata {

class DeviceSlotRows {
 public:
  static constexpr uint32_t kMiss = UINT32_MAX;

  DeviceSlotRows() = default;
  DeviceSlotRows(int n_layer, int n_expert, uint32_t first_transient);

  // The device's row of `layer` is now `row` (n_expert offsets, kMiss for none).
  void write(int layer, std::span<const uint32_t> row);
  std::span<const uint32_t> row(int layer) const;
  // The wait kernel's rule: every expert of `experts` has a cache slot in the layer's row.
  bool all_cached(int layer, std::span<const int32_t> experts) const;
  // The row agrees with the residency's (`cached`: cache slots only, kMiss elsewhere): equal
  // entries, except that a stale transient entry may stand where the residency has none.
  bool agrees(int layer, std::span<const uint32_t> cached) const;
  uint32_t first_transient() const { return first_transient_; }

 private:
  int n_expert_ = 0;
  uint32_t first_transient_ = 0;
  std::vector<uint32_t> rows_;  // [n_layer][n_expert]
};

}  // namespace strata
