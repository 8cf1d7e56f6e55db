#include "layers/moe.h"

#include <algorithm>

#include "compute/cpu/ops.h"
#include "util/error.h"
#include "util/phase_timer.h"

namespace strata {
namespace {

// y[rows x n_out] = down(silu(gate·x) ⊙ up·x) for a SwiGLU over n_rows rows of x.
void swiglu(compute::ThreadPool& pool, const compute::WeightMatrix& gate,
            const compute::WeightMatrix& up, const compute::WeightMatrix& down, const float* x,
            int64_t n_rows, float* y) {
  const int64_t n_ff = gate.n_out;
  std::vector<float> g(static_cast<size_t>(n_rows * n_ff)), u(static_cast<size_t>(n_rows * n_ff));
  compute::matmul(pool, gate, x, n_rows, g.data());
  compute::matmul(pool, up, x, n_rows, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = compute::silu(g[i]) * u[i];
  compute::matmul(pool, down, g.data(), n_rows, y);
}

}  // namespace

void moe_route(compute::ThreadPool& pool, const HParams& hp, const MoeWeights& w, const float* x,
               int64_t n_rows, Routing& routing) {
  const int n_expert = hp.n_expert, k = hp.n_expert_used;
  std::vector<float> probs(static_cast<size_t>(n_rows * n_expert));
  compute::matmul(pool, w.router, x, n_rows, probs.data());
  routing.k = k;
  routing.experts.resize(static_cast<size_t>(n_rows * k));
  routing.weights.resize(static_cast<size_t>(n_rows * k));
  std::vector<int32_t> picked(static_cast<size_t>(k));
  for (int64_t t = 0; t < n_rows; ++t) {
    float* p = probs.data() + t * n_expert;
    compute::softmax(p, n_expert);
    compute::top_k(p, n_expert, k, picked.data());
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += p[picked[size_t(j)]];
    std::sort(picked.begin(), picked.end());
    for (int j = 0; j < k; ++j) {
      routing.experts[size_t(t * k + j)] = picked[size_t(j)];
      routing.weights[size_t(t * k + j)] = p[picked[size_t(j)]] / sum;
    }
  }
}

std::vector<int32_t> moe_predict(compute::ThreadPool& pool, const HParams& hp,
                                 const MoeWeights& next_router, const float* x, int64_t n_rows) {
  Routing guess;
  moe_route(pool, hp, next_router, x, n_rows, guess);
  // Best routing weight per expert over the rows (renormalised weights rank like probabilities
  // within a row; across rows they are comparable enough for an ordering hint). Indexed by expert
  // id: this runs every layer, so no search per entry.
  std::vector<float> best(static_cast<size_t>(hp.n_expert), -1.0f);
  for (size_t i = 0; i < guess.experts.size(); ++i)
    best[size_t(guess.experts[i])] = std::max(best[size_t(guess.experts[i])], guess.weights[i]);
  std::vector<int32_t> ids;
  for (int32_t e = 0; e < hp.n_expert; ++e)
    if (best[size_t(e)] >= 0.0f) ids.push_back(e);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return best[size_t(a)] > best[size_t(b)]; });
  return ids;
}

void moe_forward(compute::ThreadPool& pool, const HParams& hp, const MoeWeights& w,
                 ExpertSource& experts, int layer, const float* x, int64_t n_rows, float* y,
                 const MoeWeights* next_router) {
  const int64_t n_embd = hp.n_embd;
  Routing routing;
  {
    ScopedPhase phase(Phase::Router);
    moe_route(pool, hp, w, x, n_rows, routing);
  }
  experts.observe_routing(layer, routing);
  const int k = routing.k;

  std::vector<int32_t> used(routing.experts);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  experts.begin_layer(layer, used);
  if (next_router && experts.wants_prediction()) {
    ScopedPhase phase(Phase::Router);
    experts.predict(layer + 1, moe_predict(pool, hp, *next_router, x, n_rows));
  }

  // The shared expert first: it needs no routed bytes, so it overlaps the misses' reads.
  std::vector<float> shared;
  if (w.has_shared()) {
    shared.resize(static_cast<size_t>(n_rows * n_embd));
    ScopedPhase phase(Phase::SharedExpert);
    swiglu(pool, w.shared_gate, w.shared_up, w.shared_down, x, n_rows, shared.data());
  }

  // Rows routed to each expert of the union, in row order, with their weights.
  std::vector<std::vector<int64_t>> row_ids(used.size());
  std::vector<std::vector<float>> row_weights(used.size());
  for (int64_t t = 0; t < n_rows; ++t)
    for (int j = 0; j < k; ++j) {
      const size_t e = size_t(std::lower_bound(used.begin(), used.end(), routing.experts[size_t(t * k + j)]) -
                              used.begin());
      row_ids[e].push_back(t);
      row_weights[e].push_back(routing.weights[size_t(t * k + j)]);
    }

  // Each expert's output rows, computed in whatever order the source hands experts out.
  std::vector<std::vector<float>> outputs(used.size());
  std::vector<float> rows_in;
  int index = -1;
  ExpertMatrices matrices;
  while (true) {
    {
      ScopedPhase phase(Phase::ExpertFetch);
      if (!experts.next(index, matrices)) break;
    }
    const size_t e = size_t(index);
    const int64_t n = int64_t(row_ids[e].size());
    rows_in.resize(static_cast<size_t>(n * n_embd));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(x + row_ids[e][size_t(i)] * n_embd, n_embd, rows_in.data() + i * n_embd);
    outputs[e].resize(static_cast<size_t>(n * n_embd));
    ScopedPhase phase(Phase::RoutedExperts);
    swiglu(pool, matrices.gate, matrices.up, matrices.down, rows_in.data(), n, outputs[e].data());
  }

  // Combine in ascending expert id, then the gated shared expert (the reference's order).
  std::fill_n(y, n_rows * n_embd, 0.0f);
  for (size_t e = 0; e < used.size(); ++e) {
    if (outputs[e].empty() && !row_ids[e].empty())
      fail("expert source did not hand out layer {} expert {}", layer, used[e]);
    for (size_t i = 0; i < row_ids[e].size(); ++i) {
      float* out = y + row_ids[e][i] * n_embd;
      const float* src = outputs[e].data() + i * size_t(n_embd);
      for (int64_t c = 0; c < n_embd; ++c) out[c] += row_weights[e][i] * src[c];
    }
  }
  if (w.has_shared()) {
    for (int64_t t = 0; t < n_rows; ++t) {
      const float* xt = x + t * n_embd;
      float logit = 0.0f;
      for (int64_t c = 0; c < n_embd; ++c) logit += w.shared_gate_inp[size_t(c)] * xt[c];
      const float gate = compute::sigmoid(logit);
      for (int64_t c = 0; c < n_embd; ++c) y[t * n_embd + c] += gate * shared[size_t(t * n_embd + c)];
    }
  }
}

}  // namespace strata
