// Acceptance — which drafts of a verify window stand, exactly.
//
// Greedy (temperature 0): draft j stands iff the target's greedy token at that row equals it, so
// the emitted tokens are plain greedy decoding's, token for token.
// Sampled: the standard rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023).
// With target distribution p (the sampler's processed distribution at that row: repetition
// penalty over the history up to the row, temperature, top-k/p, min-p) and draft distribution q,
// a draft d stands with probability min(1, p(d)/q(d)); on rejection the row's token is drawn from
// the residual norm(max(0, p − q)). Every output token is then distributed exactly as p. strata's
// drafters are deterministic, so q is a point mass on d: accept with probability p(d), else draw
// from p without d, renormalised.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/sampler.h"

namespace strata::spec {

// Probability of `token` under a sparse distribution (0 when absent).
double probability_of(const TokenDistribution& dist, int32_t token);

// One step of the rejection rule. u_accept, u_residual: independent uniforms in [0, 1).
// Returns nullopt when the draft stands, else the token drawn from the residual.
std::optional<int32_t> rejection_step(const TokenDistribution& target,
                                      const TokenDistribution& draft_dist, int32_t draft,
                                      double u_accept, double u_residual);

}  // namespace strata::spec
