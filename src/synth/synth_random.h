// Deterministic random numbers for `strata synth`: a splitmix64 stream per tensor, seeded from
// the file seed and the tensor name, so a tensor's values never depend on which others exist.
// The stream is counter-based (value i is splitmix64(seed + i)), so any part of it can be
// produced on its own: what lets synth fill row blocks on several threads with the same bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "util/fp16.h"

namespace strata::synth_detail {

inline uint64_t splitmix64(uint64_t v) {
  v += 0x9E3779B97F4A7C15ull;
  v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
  v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
  return v ^ (v >> 31);
}

// Small fast generator (splitmix64 stream).
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_++); }
  // Moves the stream forward by n values, as n calls of next() would: the stream is a counter,
  // so a row block can start at its own position without drawing the rows before it.
  void skip(uint64_t n) { state_ += n; }
  // Uniform in [0, 1).
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }
  // Approximately standard normal (Irwin–Hall with 4 uniforms, rescaled): cheap, bounded tails,
  // plenty for random weights.
  float normal() {
    const float sum = uniform() + uniform() + uniform() + uniform();
    return (sum - 2.0f) * 1.7320508f;
  }

 private:
  uint64_t state_;
};

// A random but valid IQ2_XS block (74 bytes): small f16 scale, random grid/sign codes and
// sub-scales. Consumes kGridCodeDraws values of the stream.
inline constexpr uint64_t kGridCodeDraws = 10;
inline void random_iq2xs_block(Random& rng, uint8_t* block) {
  const uint16_t d = f32_to_f16(0.002f + 0.004f * rng.uniform());
  std::memcpy(block, &d, 2);
  for (int i = 0; i < 64; i += 8) {
    const uint64_t bits = rng.next();
    std::memcpy(block + 2 + i, &bits, 8);
  }
  const uint64_t scales = rng.next();
  std::memcpy(block + 66, &scales, 8);
}

inline uint64_t name_hash(std::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

}  // namespace strata::synth_detail
