// SamplingConstraint — the hook through which a Sampler (engine/sampler.h) is restricted to the
// tokens a constraint allows (grammar-constrained sampling: grammar/token_mask.h).
//
// Contract: before each draw the sampler copies the row of logits and calls `mask` on the copy,
// which sets every token that may not come next to -infinity (and leaves the others as they
// are); after `Sampler::sample` picked a token it calls `accept` with it, so the constraint's
// state follows the tokens drawn, in order. `mask` leaves at least one token finite unless the
// constraint is finished (a caller stops generating then). Used by the sequence's thread only.
#pragma once

#include <cstdint>
#include <span>

namespace strata {

class SamplingConstraint {
 public:
  virtual ~SamplingConstraint() = default;
  virtual void mask(std::span<float> logits) = 0;
  virtual void accept(int32_t token) = 0;
};

}  // namespace strata
