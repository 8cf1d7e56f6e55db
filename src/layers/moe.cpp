#include "layers/moe.h"

#include <algorithm>

#include "compute/cpu/ops.h"

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

void moe_forward(compute::ThreadPool& pool, const HParams& hp, const MoeWeights& w,
                 ExpertSource& experts, int layer, const float* x, int64_t n_rows, float* y) {
  const int64_t n_embd = hp.n_embd;
  Routing routing;
  moe_route(pool, hp, w, x, n_rows, routing);
  const int k = routing.k;

  std::vector<int32_t> used(routing.experts);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  std::vector<ExpertMatrices> matrices(used.size());
  experts.acquire(layer, used, matrices);

  std::fill_n(y, n_rows * n_embd, 0.0f);
  std::vector<float> rows_in, rows_out;
  std::vector<int64_t> row_ids;
  std::vector<float> row_weights;
  for (size_t e = 0; e < used.size(); ++e) {
    row_ids.clear();
    row_weights.clear();
    for (int64_t t = 0; t < n_rows; ++t)
      for (int j = 0; j < k; ++j)
        if (routing.experts[size_t(t * k + j)] == used[e]) {
          row_ids.push_back(t);
          row_weights.push_back(routing.weights[size_t(t * k + j)]);
        }
    const int64_t n = int64_t(row_ids.size());
    rows_in.resize(static_cast<size_t>(n * n_embd));
    rows_out.resize(static_cast<size_t>(n * n_embd));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(x + row_ids[size_t(i)] * n_embd, n_embd, rows_in.data() + i * n_embd);
    swiglu(pool, matrices[e].gate, matrices[e].up, matrices[e].down, rows_in.data(), n,
           rows_out.data());
    for (int64_t i = 0; i < n; ++i) {
      float* out = y + row_ids[size_t(i)] * n_embd;
      const float* src = rows_out.data() + i * n_embd;
      for (int64_t c = 0; c < n_embd; ++c) out[c] += row_weights[size_t(i)] * src[c];
    }
  }

  if (w.has_shared()) {
    std::vector<float> shared(static_cast<size_t>(n_rows * n_embd));
    swiglu(pool, w.shared_gate, w.shared_up, w.shared_down, x, n_rows, shared.data());
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
