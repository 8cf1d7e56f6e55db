#include "layers/moe.h"

#include <algorithm>
#include <functional>

#include "compute/cpu/ops.h"
#include "route/moce.h"
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
               int64_t n_rows, Routing& routing, ExpertSource* cache_aware, int layer, Routing* exact,
               bool count_stats) {
  const int n_expert = hp.n_expert, k = hp.n_expert_used;
  MocePolicy* moce = cache_aware ? cache_aware->moce() : nullptr;
  if (moce && !moce->options.enabled()) moce = nullptr;
  std::vector<float> probs(static_cast<size_t>(n_rows * n_expert));
  compute::matmul(pool, w.router, x, n_rows, probs.data());
  auto shape = [&](Routing& r) {
    r.k = k;
    r.experts.resize(static_cast<size_t>(n_rows * k));
    r.weights.resize(static_cast<size_t>(n_rows * k));
  };
  shape(routing);
  if (exact) shape(*exact);
  std::vector<int32_t> picked(static_cast<size_t>(k)), scratch;
  const std::function<bool(int32_t)> resident = [&](int32_t e) { return cache_aware->resident(layer, e); };
  for (int64_t t = 0; t < n_rows; ++t) {
    float* p = probs.data() + t * n_expert;
    compute::softmax(p, n_expert);
    if (moce)
      moce_select(std::span<const float>(p, size_t(n_expert)), k, moce->options, resident, scratch,
                  routing.experts.data() + t * k, routing.weights.data() + t * k,
                  count_stats ? &moce->stats : nullptr);
    if (moce && !exact) continue;
    Routing& out = moce ? *exact : routing;
    compute::top_k(p, n_expert, k, picked.data());
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += p[picked[size_t(j)]];
    std::sort(picked.begin(), picked.end());
    for (int j = 0; j < k; ++j) {
      out.experts[size_t(t * k + j)] = picked[size_t(j)];
      out.weights[size_t(t * k + j)] = p[picked[size_t(j)]] / sum;
    }
  }
  if (exact && !moce) *exact = routing;
}

std::vector<int32_t> moe_predict(compute::ThreadPool& pool, const HParams& hp,
                                 const MoeWeights& next_router, const float* x, int64_t n_rows,
                                 ExpertSource* source, int next_layer) {
  Routing guess;
  moe_route(pool, hp, next_router, x, n_rows, guess, source, next_layer);
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

namespace {

// A window's routing grouped by expert: the sorted union, and per expert its rows and weights in
// row order.
struct ExpertRows {
  std::vector<int32_t> used;
  std::vector<std::vector<int64_t>> row_ids;
  std::vector<std::vector<float>> row_weights;
};

ExpertRows group_by_expert(const Routing& routing) {
  ExpertRows g;
  g.used = routing.experts;
  std::sort(g.used.begin(), g.used.end());
  g.used.erase(std::unique(g.used.begin(), g.used.end()), g.used.end());
  g.row_ids.resize(g.used.size());
  g.row_weights.resize(g.used.size());
  const int k = routing.k;
  for (int64_t t = 0; t < routing.n_rows(); ++t)
    for (int j = 0; j < k; ++j) {
      const size_t e = size_t(std::lower_bound(g.used.begin(), g.used.end(), routing.experts[size_t(t * k + j)]) -
                              g.used.begin());
      g.row_ids[e].push_back(t);
      g.row_weights[e].push_back(routing.weights[size_t(t * k + j)]);
    }
  return g;
}

// Runs every expert of the union as the source hands them out (after its begin_layer) and writes
// y = Σ over experts in ascending id of weight·output, so the hand-out order never matters.
void run_routed(compute::ThreadPool& pool, int64_t n_embd, ExpertSource& experts, int layer, const ExpertRows& g,
                const float* x, int64_t n_rows, float* y) {
  std::vector<std::vector<float>> outputs(g.used.size());
  std::vector<float> rows_in;
  int index = -1;
  ExpertMatrices matrices;
  while (true) {
    {
      ScopedPhase phase(Phase::ExpertFetch);
      if (!experts.next(index, matrices)) break;
    }
    const size_t e = size_t(index);
    const int64_t n = int64_t(g.row_ids[e].size());
    rows_in.resize(static_cast<size_t>(n * n_embd));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(x + g.row_ids[e][size_t(i)] * n_embd, n_embd, rows_in.data() + i * n_embd);
    outputs[e].resize(static_cast<size_t>(n * n_embd));
    ScopedPhase phase(Phase::RoutedExperts);
    swiglu(pool, matrices.gate, matrices.up, matrices.down, rows_in.data(), n, outputs[e].data());
  }
  std::fill_n(y, n_rows * n_embd, 0.0f);
  for (size_t e = 0; e < g.used.size(); ++e) {
    if (outputs[e].empty() && !g.row_ids[e].empty())
      fail("expert source did not hand out layer {} expert {}", layer, g.used[e]);
    for (size_t i = 0; i < g.row_ids[e].size(); ++i) {
      float* out = y + g.row_ids[e][i] * n_embd;
      const float* src = outputs[e].data() + i * size_t(n_embd);
      for (int64_t c = 0; c < n_embd; ++c) out[c] += g.row_weights[e][i] * src[c];
    }
  }
}

// y += σ(w_sg·x)·shared, row by row (after the routed sum: the reference's order).
void add_gated_shared(const MoeWeights& w, int64_t n_embd, const float* x, int64_t n_rows, const float* shared,
                      float* y) {
  for (int64_t t = 0; t < n_rows; ++t) {
    const float* xt = x + t * n_embd;
    float logit = 0.0f;
    for (int64_t c = 0; c < n_embd; ++c) logit += w.shared_gate_inp[size_t(c)] * xt[c];
    const float gate = compute::sigmoid(logit);
    for (int64_t c = 0; c < n_embd; ++c) y[t * n_embd + c] += gate * shared[size_t(t * n_embd + c)];
  }
}

}  // namespace

void moe_forward(compute::ThreadPool& pool, const HParams& hp, const MoeWeights& w,
                 ExpertSource& experts, int layer, const float* x, int64_t n_rows, float* y,
                 const MoeWeights* next_router) {
  const int64_t n_embd = hp.n_embd;
  MocePolicy* moce = experts.moce();
  if (moce && !moce->options.enabled()) moce = nullptr;
  // relMSE samples: every sample_every-th routed window of each layer, exact source permitting.
  const bool sample = moce && moce->exact_source && moce->options.sample_every > 0 &&
                      moce->stats.windows++ % uint64_t(moce->options.sample_every) == 0;
  Routing routing, exact;
  {
    ScopedPhase phase(Phase::Router);
    moe_route(pool, hp, w, x, n_rows, routing, moce ? &experts : nullptr, layer, sample ? &exact : nullptr,
              /*count_stats=*/true);
  }
  experts.observe_routing(layer, routing);

  const ExpertRows g = group_by_expert(routing);
  experts.begin_layer(layer, g.used);
  if (next_router && experts.wants_prediction()) {
    ScopedPhase phase(Phase::Router);
    experts.predict(layer + 1, moe_predict(pool, hp, *next_router, x, n_rows, &experts, layer + 1));
  }

  // The shared expert first: it needs no routed bytes, so it overlaps the misses' reads.
  std::vector<float> shared;
  if (w.has_shared()) {
    shared.resize(static_cast<size_t>(n_rows * n_embd));
    ScopedPhase phase(Phase::SharedExpert);
    swiglu(pool, w.shared_gate, w.shared_up, w.shared_down, x, n_rows, shared.data());
  }
  run_routed(pool, n_embd, experts, layer, g, x, n_rows, y);
  if (w.has_shared()) add_gated_shared(w, n_embd, x, n_rows, shared.data(), y);

  if (sample) {
    double err = 0.0, ref = 0.0;
    std::vector<float> y_exact(static_cast<size_t>(n_rows * n_embd));
    if (exact.experts == routing.experts) {
      std::copy_n(y, n_rows * n_embd, y_exact.data());
    } else {
      const ExpertRows ge = group_by_expert(exact);
      moce->exact_source->begin_layer(layer, ge.used);
      run_routed(pool, n_embd, *moce->exact_source, layer, ge, x, n_rows, y_exact.data());
      if (w.has_shared()) add_gated_shared(w, n_embd, x, n_rows, shared.data(), y_exact.data());
    }
    for (size_t i = 0; i < y_exact.size(); ++i) {
      const double d = double(y[i]) - double(y_exact[i]);
      err += d * d;
      ref += double(y_exact[i]) * double(y_exact[i]);
    }
    ++moce->stats.mse_samples;
    moce->stats.relmse_sum += ref > 0 ? err / ref : 0.0;
  }
}

}  // namespace strata
