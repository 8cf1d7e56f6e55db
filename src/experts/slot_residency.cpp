#include "experts/slot_residency.h"

#include <algorithm>

#include "util/error.h"

namespace strata {

SlotResidency::SlotResidency(std::vector<int> slots_per_layer, int n_expert, int n_transient)
    : n_expert_(n_expert), n_transient_(n_transient) {
  if (n_expert < 1 || n_transient < 0) fail("slot residency: {} experts, {} transient slots", n_expert, n_transient);
  layers_.resize(slots_per_layer.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int n = std::clamp(slots_per_layer[l], 0, n_expert);
    if (n == 0) continue;
    all_experts_ += uint64_t(n_expert);
    layers_[l].slots.resize(size_t(n));
    layers_[l].smap.assign(size_t(n_expert), kMiss);
    layers_[l].kept.assign(size_t(n_expert), 0);
  }
}

SlotResidency::Layer& SlotResidency::layer_at(int layer) {
  if (layer < 0 || size_t(layer) >= layers_.size() || layers_[size_t(layer)].slots.empty())
    fail("slot residency: layer {} has no routed experts (of {} layers)", layer, layers_.size());
  return layers_[size_t(layer)];
}

bool SlotResidency::pinned(int layer, int32_t expert) const {
  const Layer& l = layers_[size_t(layer)];
  const uint32_t s = l.smap.empty() ? kMiss : l.smap[size_t(expert)];
  return s != kMiss && l.slots[s].pinned;
}

bool SlotResidency::hot(int layer, int32_t expert) const {
  const Layer& l = layers_[size_t(layer)];
  const uint32_t s = l.smap.empty() ? kMiss : l.smap[size_t(expert)];
  return s != kMiss && l.slots[s].hot;
}

std::vector<int32_t> SlotResidency::hot_pins(int layer) const {
  std::vector<int32_t> out;
  for (const Slot& s : layers_.at(size_t(layer)).slots)
    if (s.hot && s.expert >= 0) out.push_back(s.expert);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> SlotResidency::lru_order(int layer) const {
  std::vector<const Slot*> filled;
  for (const Slot& s : layers_.at(size_t(layer)).slots)
    if (s.expert >= 0) filled.push_back(&s);
  std::stable_sort(filled.begin(), filled.end(),
                   [](const Slot* a, const Slot* b) { return a->last_use > b->last_use; });
  std::vector<int32_t> out;
  for (const Slot* s : filled) out.push_back(s->expert);
  return out;
}

int SlotResidency::victim(const Layer& layer) const {
  int best = -1;
  for (size_t i = 0; i < layer.slots.size(); ++i) {
    const Slot& s = layer.slots[i];
    if (s.pinned || s.hot || (s.expert >= 0 && layer.kept[size_t(s.expert)] == stamp_)) continue;
    if (best < 0 || s.last_use < layer.slots[size_t(best)].last_use) best = int(i);
  }
  return best;
}

void SlotResidency::assign(Layer& layer, int slot, int32_t expert) {
  Slot& s = layer.slots[size_t(slot)];
  if (s.expert >= 0)
    layer.smap[size_t(s.expert)] = kMiss;
  else
    ++filled_slots_;
  s.expert = expert;
  s.read_ahead_unused = false;
  s.hot = false;
  s.last_use = clock_;
  layer.smap[size_t(expert)] = uint32_t(slot);
}

void SlotResidency::drop(int layer_index, int32_t expert) {
  Layer& layer = layer_at(layer_index);
  const uint32_t s = layer.smap.at(size_t(expert));
  if (s == kMiss) return;
  layer.slots[s].expert = -1;
  layer.smap[size_t(expert)] = kMiss;
  --filled_slots_;
}

void SlotResidency::resolve(int layer_index, std::span<const int32_t> experts, std::vector<Load>& loads) {
  Layer& layer = layer_at(layer_index);
  loads.clear();
  ++clock_;
  ++stamp_;
  ++stats_.layer_visits;
  stats_.needed += experts.size();
  for (const int32_t e : experts) {
    if (e < 0 || e >= n_expert_) fail("slot residency: layer {}: expert id {} out of range", layer_index, e);
    layer.kept[size_t(e)] = stamp_;
  }
  for (const int32_t e : experts) {
    const uint32_t s = layer.smap[size_t(e)];
    if (s == kMiss) continue;
    ++stats_.hits;
    layer.slots[s].last_use = clock_;
    if (layer.slots[s].read_ahead_unused) ++stats_.read_ahead_used;
    layer.slots[s].read_ahead_unused = false;
  }
  for (Slot& s : layer.slots) s.read_ahead_unused = false;  // this visit's guesses are spent
  uint32_t transient = 0;
  for (const int32_t e : experts) {
    if (layer.smap[size_t(e)] != kMiss) continue;
    ++stats_.misses;
    const int v = victim(layer);
    if (v >= 0) {
      assign(layer, v, e);
      loads.push_back({e, uint32_t(v), false});
      continue;
    }
    if (transient >= uint32_t(n_transient_))
      fail("slot residency: layer {}: {} experts need more than the {} transient slots (and {} cache slots)",
           layer_index, experts.size(), n_transient_, layer.slots.size());
    ++stats_.transient;
    loads.push_back({e, transient++, true});
  }
}

void SlotResidency::predict(int layer_index, std::span<const int32_t> experts, std::vector<Load>& loads) {
  Layer& layer = layer_at(layer_index);
  loads.clear();
  const size_t cap = std::min(experts.size(), std::max<size_t>(1, layer.slots.size() / 2));
  ++clock_;
  ++stamp_;
  for (size_t i = 0; i < cap; ++i) layer.kept[size_t(experts[i])] = stamp_;
  for (size_t i = 0; i < cap; ++i) {
    const int32_t e = experts[i];
    const uint32_t s = layer.smap[size_t(e)];
    if (s != kMiss) {
      layer.slots[s].last_use = clock_;
      continue;
    }
    const int v = victim(layer);
    if (v < 0) break;
    assign(layer, v, e);
    layer.slots[size_t(v)].read_ahead_unused = true;
    ++stats_.read_ahead_issued;
    loads.push_back({e, uint32_t(v), false});
  }
}

void SlotResidency::fill(int layer_index, std::span<const int32_t> ranking, int n_pinned, std::vector<Load>& loads) {
  Layer& layer = layer_at(layer_index);
  loads.clear();
  ++clock_;
  ++stamp_;
  const size_t n = std::min(ranking.size(), layer.slots.size());
  for (size_t i = 0; i < n; ++i) {
    if (ranking[i] < 0 || ranking[i] >= n_expert_)
      fail("slot residency: fill: layer {} expert id {} out of range", layer_index, ranking[i]);
    layer.kept[size_t(ranking[i])] = stamp_;
  }
  for (size_t i = 0; i < n; ++i) {
    const int32_t e = ranking[i];
    uint32_t s = layer.smap[size_t(e)];
    if (s == kMiss) {
      const int v = victim(layer);
      if (v < 0) break;
      assign(layer, v, e);
      loads.push_back({e, uint32_t(v), false});
      s = uint32_t(v);
    }
    layer.slots[s].pinned = int(i) < n_pinned;
  }
}

int SlotResidency::pin_hot(int layer_index, std::span<const int32_t> wanted,
                           std::vector<Load>& loads) {
  Layer& layer = layer_at(layer_index);
  loads.clear();
  int changes = 0;
  for (Slot& s : layer.slots)
    if (s.hot && !std::binary_search(wanted.begin(), wanted.end(), s.expert)) {
      s.hot = false;
      ++changes;
    }
  ++clock_;
  ++stamp_;
  for (const int32_t e : wanted) {
    if (e < 0 || e >= n_expert_)
      fail("slot residency: pin_hot: layer {} expert id {} out of range", layer_index, e);
    layer.kept[size_t(e)] = stamp_;
  }
  for (const int32_t e : wanted) {
    uint32_t s = layer.smap[size_t(e)];
    if (s == kMiss) {
      const int v = victim(layer);
      if (v < 0) break;
      assign(layer, v, e);
      loads.push_back({e, uint32_t(v), false});
      s = uint32_t(v);
    }
    Slot& slot = layer.slots[s];
    if (!slot.hot) ++changes;
    slot.hot = true;
    slot.last_use = clock_;
  }
  return changes;
}

}  // namespace strata
