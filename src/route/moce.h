// MoCE — cache-conditional routing with a max-rank window (after arXiv 2412.00099, "Mixture of
// Cache-Conditional Experts"). Opt-in: it changes which experts a token uses, trading a little
// accuracy for fewer expert misses. Off (lambda = 0) it is not consulted at all, so tokens are the
// unmodified model's bit for bit.
//
// Rule for one row, given the router's softmax p over all experts and which experts are resident:
//   - rank the experts by p (ties: lower id), the true order;
//   - ranks 0 .. protect-1 are always the true ones;
//   - the other k - protect places go to the best of the true ranks protect .. max_rank-1 by
//     score = p·(1 + lambda) for a resident expert and p for one that is not (ties: higher p, then
//     lower id). Nothing outside the true top-max_rank can be chosen, so a cold expert far down the
//     ranking never displaces the model's choice;
//   - the chosen experts' weights are their true p renormalised over the chosen set, as the model
//     renormalises its top-k.
// With every expert resident (or none) the scores rank exactly like p, so routing is exact.
//
// "Resident" is ExpertSource::resident(), which for the ExpertStore is its smap: deterministic
// (it changes only at fixed points of the window thread), so MoCE tokens depend on the tokens and
// the budget, never on I/O timing. The read-ahead guess applies the same rule to the next layer.
//
// Telemetry (MoceStats), per routed row: swaps = chosen experts outside the true top-k;
// agreement = |chosen ∩ true top-k| / k; KL(p ‖ p') in nats where p' ∝ p·(1 + lambda) on the
// eligible resident experts (the distribution MoCE effectively routes by); and, on sampled windows,
// relMSE = ‖y_used − y_exact‖² / ‖y_exact‖² of the MoE output, y_exact computed with the true
// routing from the exact source (the file mapping), without touching the cache.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace strata {

class ExpertSource;

struct MoceOptions {
  double lambda = 0.0;  // resident boost; 0 = off
  int protect = 1;      // ranks always kept true
  int max_rank = 0;     // substitutes only from the true top-max_rank; 0 = every expert
  int sample_every = 8;  // relMSE on every n-th routed window per layer; 0 = never
  bool enabled() const { return lambda > 0.0; }
};

struct MoceStats {
  uint64_t rows = 0;            // routed rows (all layers)
  uint64_t swaps = 0;           // chosen experts outside the true top-k
  double agreement_sum = 0.0;   // Σ |chosen ∩ true| / k
  double kl_sum = 0.0;          // Σ KL(p ‖ p') in nats
  uint64_t mse_samples = 0;     // windows whose relMSE was measured
  double relmse_sum = 0.0;
  uint64_t windows = 0;         // routed windows (all layers): the sampling clock

  double agreement() const { return rows ? agreement_sum / double(rows) : 1.0; }
  double kl() const { return rows ? kl_sum / double(rows) : 0.0; }
  double relmse() const { return mse_samples ? relmse_sum / double(mse_samples) : 0.0; }
};

// The options, the running stats, and the exact source for relMSE samples (may be null: no relMSE).
struct MocePolicy {
  MoceOptions options;
  MoceStats stats;
  ExpertSource* exact_source = nullptr;
};

// Applies the rule to one row. `p`: the softmax over all n experts. `true_order`: scratch, filled
// with the true ranking's first max(k, max_rank) ids. Writes k ids (ascending) and their
// renormalised weights. Adds the row's swaps/agreement/KL to `stats` when given.
void moce_select(std::span<const float> p, int k, const MoceOptions& options,
                 const std::function<bool(int32_t)>& resident, std::vector<int32_t>& true_order,
                 int32_t* ids_out, float* weights_out, MoceStats* stats);

}  // namespace strata
