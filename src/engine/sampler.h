// Sampler — turns a row of logits into the next token.
//
// Greedy when temperature == 0 (argmax; ties to the lower id). Otherwise, in this order:
// repetition penalty over the last `repeat_last_n` tokens (llama.cpp/CTRL rule: positive logits
// divided, negative multiplied), temperature, top-k, softmax, top-p (smallest prefix of the
// sorted distribution with mass ≥ p), min-p (drop p_i < min_p·p_max), renormalise, then one draw
// from a seeded 64-bit generator. The same seed, logits and history give the same token on every
// machine: the generator is std::mt19937_64 and the uniform draw is built from its raw bits.
// `distribution` exposes the final probabilities (speculative sampling needs them).
// With a SamplingConstraint (engine/sampling_constraint.h, e.g. a JSON grammar), its mask is
// applied to a copy of the logits before all of the above, tokens left with probability 0 are
// dropped from the candidates, and `sample` tells the constraint the token it drew.
// Not thread-safe; one per sequence.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/sampling_constraint.h"

namespace strata {

struct SamplerConfig {
  float temperature = 0.0f;
  int top_k = 0;               // 0 = off
  float top_p = 1.0f;          // 1 = off
  float min_p = 0.0f;          // 0 = off
  float repetition_penalty = 1.0f;
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

// A sparse distribution over token ids, probabilities summing to 1.
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<float> probs;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& config);
  const SamplerConfig& config() const { return config_; }
  bool greedy() const { return config_.temperature <= 0.0f; }

  // history: the tokens so far (prompt + generated), used by the repetition penalty.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // The distribution `sample` draws from (for greedy: all mass on the argmax).
  TokenDistribution distribution(std::span<const float> logits,
                                 std::span<const int32_t> history) const;
  // A uniform draw in [0, 1) from the sampler's generator.
  double uniform();
  // Restricts every later draw to what `constraint` allows (nullptr: none). Not owned; it must
  // outlive its use here.
  void set_constraint(SamplingConstraint* constraint) { constraint_ = constraint; }

 private:
  // distribution's working vectors; `sample` keeps its own, so a warm sampler allocates nothing.
  struct Scratch {
    std::vector<float> adjusted, masked;
    std::vector<int32_t> recent, order;
    std::vector<double> probs;
    TokenDistribution out;
  };
  void distribution_into(std::span<const float> logits, std::span<const int32_t> history,
                         Scratch& scratch) const;
  int32_t draw(std::span<const float> logits, std::span<const int32_t> history);

  SamplerConfig config_;
  std::mt19937_64 rng_;
  Scratch scratch_;
  SamplingConstraint* constraint_ = nullptr;
};

}  // namespace strata
