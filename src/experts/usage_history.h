// UsageHistory — which routed experts a model has been using, carried across restarts in
// `<model>.usage`: per (block, expert) a decayed hit count, plus each block's LRU order at save time.
// A fresh run ranks its startup fill and its prompt-hot pins from it instead of starting cold.
//
// Counting: every routed (row, expert) adds 1; before a window's rows are added, the block's counts
// are multiplied by 2^(-rows / half_life_tokens), so a count is "hits in about the last half-life
// tokens" and old habits fade.
//
// File (little-endian, written atomically through AtomicFile: a crash leaves the old or the new file):
//   0   char[8]  "STRUSAGE"
//   8   u32      version (1)
//   12  u32      n_block
//   16  u32      n_expert
//   20  u32      reserved (0)
//   24  u64      model identity (gguf_identity of the GGUF, as sidecars and profiles use)
//   32  u64      tokens observed (rows of the first block seen, summed)
//   40  f64      half_life_tokens
//   48  f32      heat[n_block][n_expert]
//   ..  per block: u32 n, then n × i32 expert ids, most recently used first
//   ..  u64      XXH3-64 of every byte before it
// `load` refuses a file made for another model or block/expert shape (an Error naming the file and
// both identities: the user has to decide), but treats a damaged file (bad magic, version, size or
// checksum) as absent and says why in LoadResult::problem — losing a cache hint must never stop a run.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "experts/expert_source.h"

namespace strata {

struct ExpertProfile;
struct UsageHistoryLoad;

class UsageHistory {
 public:
  UsageHistory(uint64_t model_identity, int n_block, int n_expert, double half_life_tokens = 2048);

  // Counts one window's routing of block `layer` (called from ExpertSource::observe_routing).
  void record(int layer, const Routing& routing);
  void set_lru(int layer, std::vector<int32_t> most_recent_first);

  uint64_t model_identity() const { return model_identity_; }
  int n_block() const { return n_block_; }
  int n_expert() const { return n_expert_; }
  uint64_t tokens() const { return tokens_; }
  double half_life_tokens() const { return half_life_tokens_; }
  std::span<const float> heat(int layer) const;
  const std::vector<int32_t>& lru(int layer) const { return lru_[size_t(layer)]; }

  void save(const std::string& path) const;

  using LoadResult = UsageHistoryLoad;
  static LoadResult load(const std::string& path, uint64_t expected_identity, int n_block, int n_expert);

 private:
  uint64_t model_identity_;
  int n_block_, n_expert_;
  double half_life_tokens_;
  uint64_t tokens_ = 0;
  int first_block_ = -1;  // the block whose rows count tokens
  std::vector<float> heat_;  // [n_block][n_expert]
  std::vector<std::vector<int32_t>> lru_;
};

struct UsageHistoryLoad {
  std::optional<UsageHistory> history;  // empty when the file is missing or damaged
  std::string problem;                  // why a present file was ignored ("" when none)
};

// "<model>.usage"
std::string usage_path_for(const std::string& model_path);

// Per block, experts ranked by score = alpha·history share + (1 − alpha)·profile share (each
// normalised to sum 1 over the block), highest first, ties by lower id. A missing source (nullptr,
// or a history with fewer than `min_history_tokens` tokens) drops out and the other counts fully.
// Experts with score 0 are left out.
std::vector<std::vector<int32_t>> rank_experts(const UsageHistory* history, const ExpertProfile* profile,
                                               double alpha, uint64_t min_history_tokens, int n_block,
                                               int n_expert);

// Hot-pin choice for one block with bounded churn: keeps the `current` pins (the weakest dropped if
// there are more than n_hot), fills free places with the best unpinned experts scoring > 0, then
// swaps the weakest pin for the best candidate while candidate > (1 + hysteresis)·weakest, at most
// `max_swaps` times — a pin the new prompt does not use at all also waits for a swap. Returns the
// new pin set (ascending ids).
std::vector<int32_t> choose_hot_pins(std::span<const int32_t> current, std::span<const double> score,
                                     int n_hot, int max_swaps, double hysteresis);

struct HotPinOptions {
  int n_hot = 0;              // pins per layer (capped at half the layer's slots)
  int max_swaps = 2;          // per layer per call, once a layer has its pins
  double hysteresis = 0.25;   // a candidate must score > (1 + h) x the weakest pin to replace it
  double alpha = 0.5;         // weight of the usage history against this prompt's counts
  uint64_t min_history_tokens = 256;  // below this the history is not trusted
};

// The prompt-hot pins block `block` should hold next (ascending ids), as every arena picks them
// (the RAM arena, experts/expert_store.h, and the GPU arena, compute/cuda/expert_tier.h): experts
// scored by (1 − alpha)·their share of this prompt's routed (row, expert) pairs (`prompt_heat`,
// per expert) + alpha·their share of the history's heat (when `history` is given and holds at
// least min_history_tokens; else the prompt counts fully), experts `fill_pinned` says the startup
// fill pinned left out (score 0), then chosen from `current` (the block's pins now) with bounded
// churn by choose_hot_pins: the first call of a block takes n_hot, later ones at most max_swaps.
// `score` is scratch (n_expert values).
std::vector<int32_t> prompt_hot_pins(std::span<const uint64_t> prompt_heat, const UsageHistory* history, int block,
                                     const HotPinOptions& options, int n_hot, std::span<const int32_t> current,
                                     const std::function<bool(int32_t)>& fill_pinned, std::vector<double>& score);

}  // namespace strata
