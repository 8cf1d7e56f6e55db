#include "experts/usage_history.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>

#include "experts/profile.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace strata {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'U', 'S', 'A', 'G', 'E'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 48;

template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}

// Reads little-endian values from a byte span; `ok` turns false on a read past the end.
struct Cursor {
  std::span<const uint8_t> bytes;
  size_t at = 0;
  bool ok = true;
  template <typename T>
  T get() {
    T value{};
    if (at + sizeof(T) > bytes.size()) {
      ok = false;
      return value;
    }
    std::memcpy(&value, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return value;
  }
};

}  // namespace

UsageHistory::UsageHistory(uint64_t model_identity, int n_block, int n_expert, double half_life_tokens)
    : model_identity_(model_identity),
      n_block_(n_block),
      n_expert_(n_expert),
      half_life_tokens_(half_life_tokens > 0 ? half_life_tokens : 2048),
      heat_(size_t(n_block) * size_t(n_expert), 0.0f),
      lru_(size_t(n_block)) {}

void UsageHistory::record(int layer, const Routing& routing) {
  if (layer < 0 || layer >= n_block_) return;
  const int64_t rows = routing.n_rows();
  if (rows <= 0) return;
  if (first_block_ < 0) first_block_ = layer;
  if (layer == first_block_) tokens_ += uint64_t(rows);
  float* row = heat_.data() + size_t(layer) * size_t(n_expert_);
  const float decay = float(std::exp2(-double(rows) / half_life_tokens_));
  for (int e = 0; e < n_expert_; ++e) row[e] *= decay;
  for (int32_t e : routing.experts)
    if (e >= 0 && e < n_expert_) row[e] += 1.0f;
}

void UsageHistory::set_lru(int layer, std::vector<int32_t> most_recent_first) {
  if (layer >= 0 && layer < n_block_) lru_[size_t(layer)] = std::move(most_recent_first);
}

std::span<const float> UsageHistory::heat(int layer) const {
  return {heat_.data() + size_t(layer) * size_t(n_expert_), size_t(n_expert_)};
}

void UsageHistory::save(const std::string& path) const {
  std::vector<uint8_t> bytes;
  bytes.insert(bytes.end(), std::begin(kMagic), std::end(kMagic));
  put<uint32_t>(bytes, kVersion);
  put<uint32_t>(bytes, uint32_t(n_block_));
  put<uint32_t>(bytes, uint32_t(n_expert_));
  put<uint32_t>(bytes, 0);
  put<uint64_t>(bytes, model_identity_);
  put<uint64_t>(bytes, tokens_);
  put<double>(bytes, half_life_tokens_);
  for (float h : heat_) put<float>(bytes, h);
  for (const auto& order : lru_) {
    put<uint32_t>(bytes, uint32_t(order.size()));
    for (int32_t e : order) put<int32_t>(bytes, e);
  }
  put<uint64_t>(bytes, XXH3_64bits(bytes.data(), bytes.size()));
  AtomicFile out(path);
  out.write(bytes);
  out.commit();
}

UsageHistory::LoadResult UsageHistory::load(const std::string& path, uint64_t expected_identity, int n_block,
                                            int n_expert) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  auto damaged = [&](const std::string& why) {
    return LoadResult{std::nullopt, fmt::format("{}: usage history ignored: {}", path, why)};
  };
  if (bytes.size() < kHeaderBytes + 8) return damaged(fmt::format("{} bytes, shorter than a header", bytes.size()));
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return damaged("bad magic (not a strata usage file)");
  Cursor c{bytes};
  c.at = sizeof(kMagic);
  const uint32_t version = c.get<uint32_t>();
  if (version != kVersion) return damaged(fmt::format("version {} (this strata reads {})", version, kVersion));
  const uint64_t stored_sum = [&] {
    uint64_t v;
    std::memcpy(&v, bytes.data() + bytes.size() - 8, 8);
    return v;
  }();
  if (stored_sum != XXH3_64bits(bytes.data(), bytes.size() - 8)) return damaged("checksum mismatch (damaged file)");
  const uint32_t file_blocks = c.get<uint32_t>();
  const uint32_t file_experts = c.get<uint32_t>();
  c.get<uint32_t>();
  const uint64_t identity = c.get<uint64_t>();
  if (identity != expected_identity || file_blocks != uint32_t(n_block) || file_experts != uint32_t(n_expert))
    fail("{}: usage history was made for another model (identity {:016x}, {} blocks x {} experts; this model "
         "is {:016x}, {} x {}); delete it or run with another --usage file",
         path, identity, file_blocks, file_experts, expected_identity, n_block, n_expert);
  UsageHistory h(identity, n_block, n_expert);
  h.tokens_ = c.get<uint64_t>();
  h.half_life_tokens_ = c.get<double>();
  if (!(h.half_life_tokens_ > 0) || !std::isfinite(h.half_life_tokens_))
    return damaged("half-life is not a positive number");
  const std::span<const uint8_t> body(bytes.data(), bytes.size() - 8);
  c.bytes = body;
  for (float& v : h.heat_) {
    v = c.get<float>();
    if (!std::isfinite(v) || v < 0) return damaged("a negative or non-finite count");
  }
  for (auto& order : h.lru_) {
    const uint32_t n = c.get<uint32_t>();
    if (!c.ok || n > uint32_t(n_expert)) return damaged("an LRU list longer than the expert count");
    order.resize(n);
    for (int32_t& e : order) {
      e = c.get<int32_t>();
      if (e < 0 || e >= n_expert) return damaged("an LRU entry out of range");
    }
  }
  if (!c.ok) return damaged("the file ends early");
  if (c.at != body.size()) return damaged(fmt::format("{} trailing bytes", body.size() - c.at));
  return {std::move(h), ""};
}

std::string usage_path_for(const std::string& model_path) { return model_path + ".usage"; }

std::vector<std::vector<int32_t>> rank_experts(const UsageHistory* history, const ExpertProfile* profile,
                                               double alpha, uint64_t min_history_tokens, int n_block,
                                               int n_expert) {
  if (history && history->tokens() < min_history_tokens) history = nullptr;
  if (profile && profile->counts.empty()) profile = nullptr;
  const double a = !history ? 0.0 : !profile ? 1.0 : std::clamp(alpha, 0.0, 1.0);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n_block));
  std::vector<double> score(static_cast<size_t>(n_expert));
  for (int b = 0; b < n_block; ++b) {
    std::fill(score.begin(), score.end(), 0.0);
    if (history && b < history->n_block()) {
      const auto heat = history->heat(b);
      const double sum = std::accumulate(heat.begin(), heat.end(), 0.0);
      if (sum > 0)
        for (int e = 0; e < n_expert && e < int(heat.size()); ++e) score[size_t(e)] += a * heat[size_t(e)] / sum;
    }
    if (profile && size_t(b) < profile->counts.size()) {
      const auto& counts = profile->counts[size_t(b)];
      const double sum = double(std::accumulate(counts.begin(), counts.end(), uint64_t{0}));
      if (sum > 0)
        for (int e = 0; e < n_expert && e < int(counts.size()); ++e)
          score[size_t(e)] += (1.0 - a) * double(counts[size_t(e)]) / sum;
    }
    for (int e = 0; e < n_expert; ++e)
      if (score[size_t(e)] > 0) out[size_t(b)].push_back(e);
    std::stable_sort(out[size_t(b)].begin(), out[size_t(b)].end(),
                     [&](int32_t x, int32_t y) { return score[size_t(x)] > score[size_t(y)]; });
  }
  return out;
}

std::vector<int32_t> choose_hot_pins(std::span<const int32_t> current, std::span<const double> score,
                                     int n_hot, int max_swaps, double hysteresis) {
  auto score_of = [&](int32_t e) { return e >= 0 && size_t(e) < score.size() ? score[size_t(e)] : 0.0; };
  std::vector<int32_t> pins(current.begin(), current.end());
  // Weakest first; ties: higher id first, so the lower id stays (the ranking's tie rule).
  auto weakest_first = [&](int32_t x, int32_t y) {
    return score_of(x) != score_of(y) ? score_of(x) < score_of(y) : x > y;
  };
  std::sort(pins.begin(), pins.end(), weakest_first);
  while (int(pins.size()) > n_hot) pins.erase(pins.begin());

  std::vector<int32_t> candidates;
  for (int32_t e = 0; e < int32_t(score.size()); ++e)
    if (score[size_t(e)] > 0 && std::find(pins.begin(), pins.end(), e) == pins.end()) candidates.push_back(e);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int32_t x, int32_t y) { return score_of(x) > score_of(y); });
  size_t next = 0;
  while (int(pins.size()) < n_hot && next < candidates.size()) pins.push_back(candidates[next++]);
  std::sort(pins.begin(), pins.end(), weakest_first);
  for (int swaps = 0; swaps < max_swaps && next < candidates.size() && !pins.empty(); ++swaps) {
    if (!(score_of(candidates[next]) > (1.0 + hysteresis) * score_of(pins.front()))) break;
    pins.front() = candidates[next++];
    std::sort(pins.begin(), pins.end(), weakest_first);
  }
  std::sort(pins.begin(), pins.end());
  return pins;
}

std::vector<int32_t> prompt_hot_pins(std::span<const uint64_t> prompt_heat, const UsageHistory* history, int block,
                                     const HotPinOptions& o, int n_hot, std::span<const int32_t> current,
                                     const std::function<bool(int32_t)>& fill_pinned, std::vector<double>& score) {
  const int n_expert = int(prompt_heat.size());
  const bool use_history = history && history->tokens() >= o.min_history_tokens;
  const double alpha = use_history ? std::clamp(o.alpha, 0.0, 1.0) : 0.0;
  score.assign(size_t(n_expert), 0.0);
  const double heat_sum = double(std::accumulate(prompt_heat.begin(), prompt_heat.end(), uint64_t{0}));
  if (heat_sum > 0)
    for (int e = 0; e < n_expert; ++e) score[size_t(e)] = (1.0 - alpha) * double(prompt_heat[size_t(e)]) / heat_sum;
  if (use_history && block < history->n_block()) {
    const auto h = history->heat(block);
    const double sum = std::accumulate(h.begin(), h.end(), 0.0);
    if (sum > 0)
      for (int e = 0; e < n_expert && size_t(e) < h.size(); ++e) score[size_t(e)] += alpha * double(h[size_t(e)]) / sum;
  }
  // Experts the startup fill pinned are pinned already: not candidates.
  for (int e = 0; e < n_expert; ++e)
    if (fill_pinned(e)) score[size_t(e)] = 0.0;
  const int max_swaps = current.empty() ? n_hot : o.max_swaps;
  return choose_hot_pins(current, score, n_hot, max_swaps, o.hysteresis);
}

}  // namespace strata
