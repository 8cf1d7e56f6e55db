// Sampler — turns a row of logits into the next token.
//
// First the logit rules of OpenAI's API, in this order: logit_bias added to its tokens, then
// frequency and presence penalties over the tokens this request generated (history after the
// first `n_prompt`): logit[t] -= count[t]·frequency_penalty + (count[t] > 0)·presence_penalty.
// They depend only on the logits and the history, so speculative decoding (which samples every
// verify row with that row's history) applies them exactly.
// Greedy when temperature == 0 (argmax of the biased, penalised logits; ties to the lower id;
// the repetition penalty is not applied when greedy). Otherwise, in this order:
// repetition penalty over the last `repeat_last_n` tokens (llama.cpp/CTRL rule: positive logits
// divided, negative multiplied), temperature, top-k, softmax, top-p (smallest prefix of the
// sorted distribution with mass ≥ p), min-p (drop p_i < min_p·p_max), renormalise, then one draw
// from a seeded 64-bit generator. The same seed, logits and history give the same token on every
// machine: the generator is std::mt19937_64 and the uniform draw is built from its raw bits.
// `distribution` exposes the final probabilities (speculative sampling needs them); `logprobs`
// the log-probabilities a response reports (see there).
// With a SamplingConstraint (engine/sampling_constraint.h, e.g. a JSON grammar), its mask is
// applied to a copy of the logits before all of the above, tokens left with probability 0 are
// dropped from the candidates, and `sample` tells the constraint the token it drew.
// Not thread-safe; one per sequence.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
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
  // OpenAI's rules (serve: logit_bias, frequency_penalty, presence_penalty). Bias entries whose
  // id is outside the logits are ignored (the request parser rejects them).
  std::vector<std::pair<int32_t, float>> logit_bias;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  size_t n_prompt = 0;  // history[0, n_prompt) is the prompt, which the two penalties ignore
};

// The log-probability of one token.
struct TokenLogprob {
  int32_t id = 0;
  double logprob = 0;
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
  // Log-probabilities of the distribution `sample` draws from before truncation: the log-softmax,
  // computed in double, of the logits after logit_bias, the penalties (the repetition penalty only
  // when not greedy) and temperature (1 when greedy), over the whole vocabulary; top-k, top-p and
  // min-p do not change them. `chosen`'s entry, and the `n_top` most likely tokens, most likely
  // first (ties to the lower id), into `top`. Allocates; for responses that ask for them.
  TokenLogprob logprobs(std::span<const float> logits, std::span<const int32_t> history,
                        int32_t chosen, int n_top, std::vector<TokenLogprob>& top) const;
  // Restricts every later draw to what `constraint` allows (nullptr: none). Not owned; it must
  // outlive its use here.
  void set_constraint(SamplingConstraint* constraint) { constraint_ = constraint; }

 private:
  // distribution's working vectors; `sample` keeps its own, so a warm sampler allocates nothing.
  struct Scratch {
    std::vector<float> adjusted, masked;
    std::vector<int32_t> recent, order, generated;
    std::vector<double> probs;
    TokenDistribution out;
  };
  bool has_logit_rules() const;
  // scratch.adjusted = logits with the logit rules (and, when `repetition`, the repetition
  // penalty) applied.
  void adjust_into(std::span<const float> logits, std::span<const int32_t> history,
                   bool repetition, Scratch& scratch) const;
  void distribution_into(std::span<const float> logits, std::span<const int32_t> history,
                         Scratch& scratch) const;
  int32_t draw(std::span<const float> logits, std::span<const int32_t> history);

  SamplerConfig config_;
  std::mt19937_64 rng_;
  Scratch scratch_;
  SamplingConstraint* constraint_ = nullptr;
};

}  // namespace strata
