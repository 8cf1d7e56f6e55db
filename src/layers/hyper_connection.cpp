#include "layers/hyper_connection.h"

#include <algorithm>

#include "compute/cpu/ops.h"

namespace strata {

void hyper_connection_in(compute::ThreadPool& pool, compute::Workspace& ws,
                         const HyperConnectionWeights& w, int n_streams, int64_t n_embd, float eps,
                         const float* X, int64_t n_rows, float* x, float* inject) {
  const int64_t width = n_streams * n_embd;
  const int64_t rank = w.down.n_out;
  const float inv_streams = 1.0f / float(n_streams);
  compute::Workspace::Frame frame(ws);
  // normed and gates are written whole before they are read (every row's norm; the up
  // projection's n_rows × width outputs): no zeroing, which was 16 MiB per call in a 512-row
  // window.
  std::vector<float>& normed = ws.scratch_floats(static_cast<size_t>(n_rows * width));
  // Row-wise loops run split over the pool's threads (each row on its own: same bits).
  compute::parallel_rows(pool, n_rows, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t)
      compute::rms_norm_grouped(X + t * width, w.norm.data(), n_streams, n_embd, eps,
                                normed.data() + t * width);
  });

  std::vector<float>& mix = ws.floats(static_cast<size_t>(n_rows * rank));
  // down and inject read the same normed rows: one call converts them once.
  const bool with_inject = w.has_inject() && inject;
  if (with_inject) {
    const compute::MatmulProduct products[] = {{&w.down, mix.data()}, {&w.inject, inject}};
    compute::matmul_many(pool, products, normed.data(), n_rows);
  } else {
    compute::matmul(pool, w.down, normed.data(), n_rows, mix.data());
  }
  compute::parallel_rows(pool, n_rows, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin * rank; i < end * rank; ++i) mix[size_t(i)] *= inv_streams;
    compute::silu(mix.data() + begin * rank, (end - begin) * rank, mix.data() + begin * rank);
  });
  std::vector<float>& gates = ws.scratch_floats(static_cast<size_t>(n_rows * width));
  compute::matmul(pool, w.up, mix.data(), n_rows, gates.data());

  compute::parallel_rows(pool, n_rows, [&](int64_t begin, int64_t end, int) {
    // The gates in place first (the same sigmoid bits, vectorised), then the stream sums.
    compute::sigmoid(gates.data() + begin * width, (end - begin) * width,
                     gates.data() + begin * width);
    // out_i = (Σ_s g_si·xn_si, s = 0, 1, ... from 0.0f) · 1/S, summed stream by stream so the
    // loops run along i (contiguous, vectorised) with each element's adds in the same order.
    for (int64_t t = begin; t < end; ++t) {
      float* __restrict out = x + t * n_embd;
      std::fill_n(out, n_embd, 0.0f);
      for (int s = 0; s < n_streams; ++s) {
        const float* __restrict g = gates.data() + t * width + s * n_embd;
        const float* __restrict xn = normed.data() + t * width + s * n_embd;
        for (int64_t i = 0; i < n_embd; ++i) out[i] += g[i] * xn[i];
      }
      for (int64_t i = 0; i < n_embd; ++i) out[i] *= inv_streams;
    }
  });

  if (with_inject) {
    for (int64_t i = 0; i < n_rows * n_streams; ++i)
      inject[i] = 2.0f * compute::sigmoid(inject[i] * inv_streams);
  }
}

void hyper_connection_out(int n_streams, int64_t n_embd, const float* y, const float* inject,
                          int64_t n_rows, float* X) {
  const int64_t width = n_streams * n_embd;
  for (int64_t t = 0; t < n_rows; ++t)
    for (int s = 0; s < n_streams; ++s) {
      const float scale = inject[t * n_streams + s];
      float* stream = X + t * width + s * n_embd;
      const float* yt = y + t * n_embd;
      for (int64_t i = 0; i < n_embd; ++i) stream[i] += scale * yt[i];
    }
}

}  // namespace strata
