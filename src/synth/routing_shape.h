// Routing shapes for `strata synth`: Zipf-skewed and temporally correlated expert routing.
//
// Random routers give routing no chosen structure (near uniform at mid size, with an accidental
// popularity in small models; docs/synth.md), so cache policies cannot be measured against a
// known skew or locality. With a shape, synth rewrites a few weights so that routing becomes a
// controlled function of the token and of its context, while the file stays an ordinary GGUF of
// the same architecture (no extra tensors; the settings are only recorded under strata.synth.*).
//
// Construction (the "routing subspace": the last dimensions of the hidden state, at most half)
//   anchor dim     every token embedding holds A there: a constant that survives RMS norms
//   token dims T   a random unit vector τ·t̂(token) per token id (the token-specific part)
//   context dims C (correlation only) written once, by Gated DeltaNet heads of layer 0
// Nothing else writes into the subspace: the rows of every matrix that adds to the residual
// (attn_output, ssm_out, ffn_down_exps, ffn_down_shexp, ple_value) are zero there, norm weights
// are 1 there, and qwen4exp's hyper-connection gates are constant 1/2 there (zero hc_*_up rows),
// so at every layer the MoE input's subspace is (token-dependent scalar) × (the values above).
// Embedding rows all get norm 1, so layer 0's normalised input is known exactly there.
// Routers read the subspace only: logit_e ∝ b_e + √(1−ρ²)·√|T|·û_e·t̂ + ρ·√|C|·û'_e·ĉ with unit
// rows û, û' (orthonormal where there are at least as many dims as experts, which makes the
// noise exchangeable). A common scalar never changes a top-k, so at every depth routing is
//   top-k(b + noise(token) + noise(context)), noise ~ N(0, 1) per expert.
// - Skew S: b_e = −S·ln(rank_e)/θ, ranks a random permutation per layer and θ = Φ⁻¹(1 − k/n)
//   (the noise tail's slope at the top-k threshold), so the selection frequency falls roughly
//   as rank^−S (Zipf) until the top ranks saturate at one pick per token.
// - Correlation R: ρ² = λ = √R, so consecutive tokens' logits correlate ≈ ρ²·λ = R. The context
//   is an exponential moving average with retention λ of a token vector: each context head of
//   layer 0 has q = k = e₀ (from the anchor, identity conv), decay 1 (A = 0) and β = 1 − λ, so
//   its state row follows m ← λ·m + (1−λ)·v. v holds pairs silu(a), silu(−a) (their difference
//   is exactly a, a = an orthonormal projection of t̂) and constant "ballast" channels that keep
//   the head's RMS norm nearly constant; ssm_out maps the pair differences into C. This needs a
//   Gated DeltaNet layer 0 (qwen3next, qwen4exp); qwen3moe has none and is refused.
// Measurements: docs/synth.md.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/hparams.h"
#include "model/tensor_specs.h"

namespace strata {

struct RoutingShape {
  double skew = 0.0;         // Zipf exponent of expert popularity, 0 = off
  double correlation = 0.0;  // consecutive tokens' router-logit correlation, in [0, 1); 0 = off
  // Anything but the defaults (invalid values too, so that the shaper refuses them).
  bool enabled() const { return skew != 0.0 || correlation != 0.0; }
};

// How one tensor's rows are rewritten; made once per tensor, then asked row by row.
class TensorShaping {
 public:
  enum class Row { Random, Zero, Shaped };
  virtual ~TensorShaping() = default;
  // `values` holds the row's random draw (ne[0] values); returns what the row became.
  virtual Row shape_row(int64_t row, std::span<float> values) const = 0;
  // True if some row is Shaped: such a tensor cannot be stored as random IQ2_XS codes.
  virtual bool has_shaped_rows() const = 0;
};

class RoutingShaper {
 public:
  // Checks the shape against the architecture; throws naming the option on a mismatch.
  RoutingShaper(const HParams& hp, const RoutingShape& shape, uint64_t seed);
  ~RoutingShaper();
  // nullptr when the tensor is written as is. The plan refers to this shaper.
  std::unique_ptr<TensorShaping> plan(const TensorSpec& spec) const;

  struct Layout;  // the subspace layout and derived constants (routing_shape.cpp)

 private:
  std::unique_ptr<const Layout> layout_;
};

}  // namespace strata
