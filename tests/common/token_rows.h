// Helpers the engine and spec tests share: random token ids and a bitwise comparison of float rows
// (logits, states). Header-only.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace strata::test_support {

// n ids drawn uniformly from [0, n_vocab), the same for the same seed.
inline std::vector<int32_t> random_tokens(int64_t n_vocab, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(n_vocab - 1));
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = pick(rng);
  return out;
}

// The same size and the same bits (NaN payloads and signed zeros included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // Empty vectors have no data pointer, and memcmp's arguments must not be null (UBSan).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace strata::test_support
