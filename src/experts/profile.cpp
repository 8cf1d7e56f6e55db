#include "experts/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "util/atomic_file.h"
#include "util/error.h"

namespace strata {

void ExpertProfile::record(int layer, const Routing& routing, int n_block, int n_expert) {
  if (counts.empty()) counts.assign(size_t(n_block), {});
  if (layer < 0 || layer >= int(counts.size())) return;
  auto& row = counts[size_t(layer)];
  if (row.empty()) row.assign(size_t(n_expert), 0);
  for (int32_t e : routing.experts)
    if (e >= 0 && e < n_expert) ++row[size_t(e)];
  if (layer == 0) tokens += uint64_t(routing.n_rows());
}

std::vector<std::vector<int32_t>> ExpertProfile::ranking() const {
  std::vector<std::vector<int32_t>> out(counts.size());
  for (size_t b = 0; b < counts.size(); ++b) {
    out[b].resize(counts[b].size());
    std::iota(out[b].begin(), out[b].end(), 0);
    std::stable_sort(out[b].begin(), out[b].end(),
                     [&](int32_t x, int32_t y) { return counts[b][size_t(x)] > counts[b][size_t(y)]; });
  }
  return out;
}

void ExpertProfile::save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = "strata-expert-profile";
  j["version"] = 1;
  j["model_identity"] = fmt::format("{:016x}", model_identity);
  j["tokens"] = tokens;
  j["counts"] = counts;
  const std::string text = j.dump() + "\n";
  AtomicFile out(path);
  out.write(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  out.commit();
}

ExpertProfile ExpertProfile::load(const std::string& path, uint64_t expected_identity) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open expert profile", path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a JSON expert profile: {}", path, e.what());
  }
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) fail("{}: expert profile has no field '{}'", path, key);
    return j[key];
  };
  if (field("format") != "strata-expert-profile")
    fail("{}: field 'format' is not \"strata-expert-profile\"", path);
  if (field("version") != 1) fail("{}: profile version {} (this strata reads 1)", path, field("version").dump());
  ExpertProfile p;
  const auto& id = field("model_identity");
  if (!id.is_string()) fail("{}: field 'model_identity' must be a hex string", path);
  const std::string hex = id.get<std::string>();
  const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), p.model_identity, 16);
  if (ec != std::errc() || end != hex.data() + hex.size())
    fail("{}: field 'model_identity' must be a hex string, found '{}'", path, hex);
  if (p.model_identity != expected_identity)
    fail("{}: profile was made for another model (identity {} vs this model's {:016x}); re-run "
         "`strata profile`",
         path, id.get<std::string>(), expected_identity);
  try {
    p.tokens = field("tokens").get<uint64_t>();
    p.counts = field("counts").get<std::vector<std::vector<uint64_t>>>();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: fields 'tokens'/'counts' malformed: {}", path, e.what());
  }
  return p;
}

}  // namespace strata
