#include "route/cache_replay.h"

#include <algorithm>
#include <span>

#include "util/error.h"

namespace strata {
namespace {

constexpr uint32_t kMiss = UINT32_MAX;

ExpertStoreStats& operator+=(ExpertStoreStats& a, const ExpertStoreStats& b) {
  a.layer_visits += b.layer_visits;
  a.needed += b.needed;
  a.hits += b.hits;
  a.misses += b.misses;
  a.read_ahead_issued += b.read_ahead_issued;
  a.read_ahead_used += b.read_ahead_used;
  a.bytes_read += b.bytes_read;
  a.miss_bytes += b.miss_bytes;
  return a;
}

// The residency state of a store with no bytes: which expert each slot holds and when it was
// last used. Only the window's thread exists, so no I/O timing can enter: a slot counts as
// resident from the moment it is assigned, as in the store.
class CacheModel {
 public:
  CacheModel(const RoutingTraceHeader& header, int slots_per_layer, bool read_ahead)
      : header_(header), read_ahead_(read_ahead) {
    layers_.resize(header.n_block);
    for (uint32_t b = 0; b < header.n_block; ++b) {
      if (header.record_bytes[b] == 0) continue;
      Layer& l = layers_[b];
      l.present = true;
      l.record_bytes = header.record_bytes[b];
      l.slots.resize(size_t(slots_per_layer));
      l.smap.assign(header.n_expert, kMiss);
      l.kept.assign(header.n_expert, 0);
      total_slots_ += uint64_t(slots_per_layer);
    }
    all_resident_ = uint32_t(slots_per_layer) == header.n_expert;
  }

  const ExpertStoreStats& stats() const { return stats_; }

  bool wants_prediction() const {
    return read_ahead_ && !(all_resident_ && filled_slots_ == total_slots_);
  }

  void begin_layer(int layer_index, std::span<const uint16_t> experts) {
    Layer& layer = layers_[size_t(layer_index)];  // the trace reader checked it is present
    ++clock_;
    ++stamp_;
    ++stats_.layer_visits;
    stats_.needed += experts.size();
    for (uint16_t e : experts) layer.kept[e] = stamp_;
    missing_.clear();
    for (uint16_t e : experts) {
      const uint32_t slot = layer.smap[e];
      if (slot == kMiss) {
        missing_.push_back(e);
        continue;
      }
      Slot& s = layer.slots[slot];
      ++stats_.hits;
      s.last_use = clock_;
      if (s.read_ahead_unused) ++stats_.read_ahead_used;
      s.read_ahead_unused = false;
    }
    // A prediction this visit did not use is spent.
    for (Slot& s : layer.slots) s.read_ahead_unused = false;
    for (uint16_t e : missing_) {
      ++stats_.misses;
      stats_.miss_bytes += layer.record_bytes;
      stats_.bytes_read += layer.record_bytes;
      const int victim = victim_of(layer);
      if (victim >= 0) assign(layer, victim, e);  // else a transient slot: residency unchanged
    }
  }

  void predict(int layer_index, std::span<const uint16_t> experts) {
    if (!read_ahead_ || layer_index < 0 || size_t(layer_index) >= layers_.size() ||
        !layers_[size_t(layer_index)].present)
      return;
    Layer& layer = layers_[size_t(layer_index)];
    const size_t cap = std::min(experts.size(), std::max<size_t>(1, layer.slots.size() / 2));
    ++clock_;
    ++stamp_;
    for (size_t i = 0; i < cap; ++i) layer.kept[experts[i]] = stamp_;
    for (size_t i = 0; i < cap; ++i) {
      const uint32_t slot = layer.smap[experts[i]];
      if (slot != kMiss) {
        layer.slots[slot].last_use = clock_;
        continue;
      }
      const int victim = victim_of(layer);
      if (victim < 0) break;
      assign(layer, victim, experts[i]);
      layer.slots[size_t(victim)].read_ahead_unused = true;
      ++stats_.read_ahead_issued;
      stats_.bytes_read += layer.record_bytes;
    }
  }

  void fill(const std::vector<std::vector<int32_t>>& ranking, int n_pinned) {
    ++clock_;
    for (size_t b = 0; b < layers_.size() && b < ranking.size(); ++b) {
      Layer& layer = layers_[b];
      if (!layer.present) continue;
      ++stamp_;
      const size_t n = std::min(ranking[b].size(), layer.slots.size());
      for (size_t i = 0; i < n; ++i) {
        const int32_t e = ranking[b][i];
        if (e < 0 || uint32_t(e) >= header_.n_expert)
          fail("cache replay: fill ranking: block {} expert id {} out of range (n_expert {})", b, e,
               header_.n_expert);
        layer.kept[size_t(e)] = stamp_;
      }
      for (size_t i = 0; i < n; ++i) {
        const int32_t e = ranking[b][i];
        uint32_t slot = layer.smap[size_t(e)];
        if (slot == kMiss) {
          const int victim = victim_of(layer);
          if (victim < 0) break;
          assign(layer, victim, e);
          slot = uint32_t(victim);
          stats_.bytes_read += layer.record_bytes;
        }
        layer.slots[slot].pinned = int(i) < n_pinned;
      }
    }
  }

 private:
  struct Slot {
    int32_t expert = -1;
    uint64_t last_use = 0;
    bool pinned = false;
    bool read_ahead_unused = false;
  };
  struct Layer {
    bool present = false;
    uint64_t record_bytes = 0;
    std::vector<Slot> slots;
    std::vector<uint32_t> smap;  // [n_expert] → slot or kMiss
    std::vector<uint64_t> kept;  // [n_expert] == stamp_: protected by the current call
  };

  // Least recently used among the slots that are neither pinned nor protected; lower index wins
  // ties (empty slots have last_use 0, so they go first).
  int victim_of(const Layer& layer) const {
    int best = -1;
    for (size_t i = 0; i < layer.slots.size(); ++i) {
      const Slot& s = layer.slots[i];
      if (s.pinned || (s.expert >= 0 && layer.kept[size_t(s.expert)] == stamp_)) continue;
      if (best < 0 || s.last_use < layer.slots[size_t(best)].last_use) best = int(i);
    }
    return best;
  }

  void assign(Layer& layer, int slot_index, int32_t expert) {
    Slot& s = layer.slots[size_t(slot_index)];
    if (s.expert >= 0)
      layer.smap[size_t(s.expert)] = kMiss;
    else
      ++filled_slots_;
    s.expert = expert;
    s.last_use = clock_;
    s.read_ahead_unused = false;
    layer.smap[size_t(expert)] = uint32_t(slot_index);
  }

  const RoutingTraceHeader& header_;
  bool read_ahead_;
  std::vector<Layer> layers_;
  bool all_resident_ = false;
  uint64_t filled_slots_ = 0, total_slots_ = 0;
  uint64_t clock_ = 0, stamp_ = 0;
  ExpertStoreStats stats_;
  std::vector<uint16_t> missing_;
};

}  // namespace

int replay_slots_per_layer(const RoutingTraceHeader& header, const CacheReplaySettings& settings) {
  const int n_expert = int(header.n_expert);
  if (settings.slots_per_layer > 0) return std::min(settings.slots_per_layer, n_expert);
  uint64_t record_sum = 0;
  for (uint64_t b : header.record_bytes) record_sum += b;
  return int(std::clamp<uint64_t>(settings.budget_bytes / std::max<uint64_t>(record_sum, 1), 1,
                                  uint64_t(n_expert)));
}

CacheReplayResult replay_cache(const RoutingTrace& trace, const CacheReplaySettings& settings) {
  CacheReplayResult result;
  result.slots_per_layer = replay_slots_per_layer(trace.header, settings);
  for (uint64_t b : trace.header.record_bytes)
    result.cache_bytes += b * uint64_t(result.slots_per_layer);

  CacheModel cache(trace.header, result.slots_per_layer, settings.read_ahead);
  if (!settings.fill_ranking.empty()) cache.fill(settings.fill_ranking, settings.n_pinned);
  const std::span<const uint16_t> unions(trace.union_ids), predicted(trace.predicted);
  for (const RoutingTrace::Window& w : trace.windows) {
    const ExpertStoreStats before = cache.stats();
    for (uint32_t r = w.first_record; r < w.first_record + w.n_records; ++r) {
      const RoutingTrace::LayerRecord& rec = trace.records[r];
      cache.begin_layer(rec.layer, unions.subspan(rec.union_offset, rec.union_size));
      if (rec.predict_layer >= 0 && cache.wants_prediction())
        cache.predict(rec.predict_layer, predicted.subspan(rec.predict_offset, rec.predict_size));
    }
    if (w.n_rows == 1) result.decode += cache.stats() - before;
  }
  result.stats = cache.stats();
  return result;
}

}  // namespace strata
