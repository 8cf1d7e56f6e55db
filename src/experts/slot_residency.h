// SlotResidency — which routed experts hold which of a fixed set of cache slots, per layer: the
// residency policy, with no memory and no I/O attached. The RAM arena (ExpertStore,
// experts/expert_store.h) decides residency with it, and so does a tier that keeps its bytes
// elsewhere (the GPU expert arena, compute/cuda/expert_tier.h): both follow exactly these rules.
// cache_replay (route/cache_replay.h) reimplements them independently, as the tests' oracle.
//
// The policy
// - Each layer with experts has `slots` cache slots. smap[layer][expert] is the expert's cache
//   slot or kMiss. Eviction: LRU over the layer's slots that are neither pinned (fill), prompt-hot
//   (pin_hot) nor protected by the current call; ties go to the lower slot index; empty slots
//   count as the oldest.
// - resolve(layer, union): one LRU clock tick; the union (sorted, unique) is protected; hits are
//   touched; misses, in ascending id, take the LRU victim's slot, or, when every slot is
//   protected or pinned, a transient slot (0, 1, ... for this call only; no residency change).
// - predict(layer, ids): one tick; at most half the layer's slots (at least 1) of the ids, most
//   likely first, are protected; resident ones are touched, the others take victims' slots.
// - fill(layer, ranking, n_pinned): one tick; the ranking's first `slots` experts are protected;
//   those not resident take victims' slots (already resident ones keep their LRU time); each gets
//   pinned = (its rank < n_pinned).
// - pin_hot(layer, wanted): one tick; prompt-hot pins not in `wanted` are dropped, then `wanted`
//   is protected and made resident in order (touched, or a victim's slot) and marked hot, until
//   no victim is left. Hot pins are never evicted; a slot loses its mark only here.
// - Deterministic: the state depends only on the sequence of calls and their arguments.
// Each call lists the slots it assigned whose bytes must now be loaded (`loads`).
// The read-ahead policy is predict's: a guess can take at most half a layer's slots, so a wrong
// one cannot flush the cache; once every_expert_resident() there is nothing left to guess (the
// ExpertStore stops asking for predictions then). Which guesses to make is the caller's.
//
// Thread safety: none; one thread drives it (the tier's handshake thread).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata {

struct SlotResidencyStats {
  uint64_t layer_visits = 0, needed = 0, hits = 0, misses = 0;
  uint64_t transient = 0;  // misses that got a transient slot
  uint64_t read_ahead_issued = 0, read_ahead_used = 0;
};

class SlotResidency {
 public:
  static constexpr uint32_t kMiss = UINT32_MAX;
  struct Load {
    int32_t expert = 0;
    uint32_t slot = 0;       // cache slot, or transient slot when `transient`
    bool transient = false;
  };

  // slots_per_layer[layer]: cache slots (0 = the layer has no routed experts); each capped at
  // n_expert. n_transient: transient slots resolve may hand out per call.
  SlotResidency(std::vector<int> slots_per_layer, int n_expert, int n_transient);

  // REQUIRES (each call): `layer` has routed experts (has_experts), else strata::Error.
  // REQUIRES: experts sorted, unique, in [0, n_expert). Throws strata::Error when the misses need
  // more transient slots than exist. `loads` lists the misses in ascending id.
  void resolve(int layer, std::span<const int32_t> experts, std::vector<Load>& loads);
  // REQUIRES: experts unique, in [0, n_expert).
  void predict(int layer, std::span<const int32_t> experts, std::vector<Load>& loads);
  // REQUIRES: ranking unique; throws strata::Error for an id outside [0, n_expert).
  void fill(int layer, std::span<const int32_t> ranking, int n_pinned, std::vector<Load>& loads);
  // REQUIRES: wanted sorted, unique, in [0, n_expert). Returns the hot pins added or dropped.
  int pin_hot(int layer, std::span<const int32_t> wanted, std::vector<Load>& loads);
  // The expert's slot becomes empty (its load failed): it is no longer resident.
  void drop(int layer, int32_t expert);

  uint32_t slot_of(int layer, int32_t expert) const { return layers_[size_t(layer)].smap[size_t(expert)]; }
  bool pinned(int layer, int32_t expert) const;  // by fill
  bool hot(int layer, int32_t expert) const;     // by pin_hot
  int slots(int layer) const { return int(layers_[size_t(layer)].slots.size()); }
  bool has_experts(int layer) const {
    return layer >= 0 && size_t(layer) < layers_.size() && !layers_[size_t(layer)].slots.empty();
  }
  int n_layer() const { return int(layers_.size()); }
  int n_expert() const { return n_expert_; }
  int n_transient() const { return n_transient_; }
  // Cache slots holding an expert, all layers.
  uint64_t filled_slots() const { return filled_slots_; }
  // Every layer has a slot per expert and every slot is filled: nothing can miss any more.
  bool every_expert_resident() const { return filled_slots_ == all_experts_; }
  // Not for the decode path (they allocate): the layer's hot pins in ascending id, and its resident
  // experts most recently used first (ties: lower slot index). Empty for a layer without experts.
  std::vector<int32_t> hot_pins(int layer) const;
  std::vector<int32_t> lru_order(int layer) const;
  const SlotResidencyStats& stats() const { return stats_; }
  void reset_stats() { stats_ = SlotResidencyStats{}; }

 private:
  struct Slot {
    int32_t expert = -1;
    uint64_t last_use = 0;
    bool pinned = false;
    bool hot = false;
    bool read_ahead_unused = false;
  };
  struct Layer {
    std::vector<Slot> slots;
    std::vector<uint32_t> smap;  // [n_expert]
    std::vector<uint64_t> kept;  // [n_expert]: == stamp_ while protected
  };
  Layer& layer_at(int layer);
  int victim(const Layer& layer) const;
  void assign(Layer& layer, int slot, int32_t expert);

  int n_expert_ = 0, n_transient_ = 0;
  std::vector<Layer> layers_;
  uint64_t clock_ = 0, stamp_ = 0;
  uint64_t filled_slots_ = 0;
  uint64_t all_experts_ = 0;  // n_expert x the layers with experts
  SlotResidencyStats stats_;
};

}  // namespace strata
