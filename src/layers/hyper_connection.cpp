#include "layers/hyper_connection.h"

#include <algorithm>
#include <optional>

#include "compute/cpu/ops.h"
#include "compute/cpu/row_slices.h"
#include "util/phase_timer.h"

namespace strata {

namespace {

// Scratch for rows [0, n_rows) of a window; a row range uses its own rows of each.
struct HcScratch {
  float* normed;  // [n_rows][width]
  float* mix;     // [n_rows][rank]
  float* gates;   // [n_rows][width]
};

// Rows [begin, end) of hyper_connection_in. Called on the whole window (its products and row
// loops hand out over the pool), or from inside a pool task on a slice of it (every call on the
// pool then runs inline on that thread: ThreadPool's nested rule). Rows never mix, so either
// way each row gets the same bits.
void hc_in_rows(compute::ThreadPool& pool, const HyperConnectionWeights& w, int n_streams,
                int64_t n_embd, float eps, const float* X, int64_t begin, int64_t end, float* x,
                float* inject, const HcScratch& scratch) {
  const int64_t width = n_streams * n_embd;
  const int64_t rank = w.down.n_out;
  const int64_t n_rows = end - begin;
  const float inv_streams = 1.0f / float(n_streams);
  X += begin * width;
  x += begin * n_embd;
  if (inject) inject += begin * n_streams;
  float* normed = scratch.normed + begin * width;
  float* mix = scratch.mix + begin * rank;
  float* gates = scratch.gates + begin * width;
  // Row-wise loops run split over the pool's threads (each row on its own: same bits).
  compute::parallel_rows(pool, n_rows, [&](int64_t first, int64_t last, int) {
    for (int64_t t = first; t < last; ++t)
      compute::rms_norm_grouped(X + t * width, w.norm.data(), n_streams, n_embd, eps,
                                normed + t * width);
  });

  // down and inject read the same normed rows: one call converts them once.
  if (inject) {
    const compute::MatmulProduct products[] = {{&w.down, mix}, {&w.inject, inject}};
    compute::matmul_many(pool, products, normed, n_rows);
  } else {
    compute::matmul(pool, w.down, normed, n_rows, mix);
  }
  compute::parallel_rows(pool, n_rows, [&](int64_t first, int64_t last, int) {
    for (int64_t i = first * rank; i < last * rank; ++i) mix[size_t(i)] *= inv_streams;
    compute::silu(mix + first * rank, (last - first) * rank, mix + first * rank);
  });
  compute::matmul(pool, w.up, mix, n_rows, gates);

  compute::parallel_rows(pool, n_rows, [&](int64_t first, int64_t last, int) {
    // The gates in place first (the same sigmoid bits, vectorised), then the stream sums.
    compute::sigmoid(gates + first * width, (last - first) * width, gates + first * width);
    // out_i = (Σ_s g_si·xn_si, s = 0, 1, ... from 0.0f) · 1/S, summed stream by stream so the
    // loops run along i (contiguous, vectorised) with each element's adds in the same order.
    for (int64_t t = first; t < last; ++t) {
      float* __restrict out = x + t * n_embd;
      std::fill_n(out, n_embd, 0.0f);
      for (int s = 0; s < n_streams; ++s) {
        const float* __restrict g = gates + t * width + s * n_embd;
        const float* __restrict xn = normed + t * width + s * n_embd;
        for (int64_t i = 0; i < n_embd; ++i) out[i] += g[i] * xn[i];
      }
      for (int64_t i = 0; i < n_embd; ++i) out[i] *= inv_streams;
    }
  });

  if (inject)
    for (int64_t i = 0; i < n_rows * n_streams; ++i)
      inject[i] = 2.0f * compute::sigmoid(inject[i] * inv_streams);
}

// The scratch of hyper_connection_in over n_rows rows, from `ws` (inside the caller's frame).
// normed and gates are written whole before they are read (every row's norm; the up projection's
// n_rows × width outputs): no zeroing, which was 16 MiB per call in a 512-row window.
HcScratch take_scratch(compute::Workspace& ws, const HyperConnectionWeights& w, int64_t width,
                       int64_t n_rows) {
  return HcScratch{ws.scratch_floats(static_cast<size_t>(n_rows * width)).data(),
                   ws.floats(static_cast<size_t>(n_rows * w.down.n_out)).data(),
                   ws.scratch_floats(static_cast<size_t>(n_rows * width)).data()};
}

}  // namespace

void hyper_connection_in(compute::ThreadPool& pool, compute::Workspace& ws,
                         const HyperConnectionWeights& w, int n_streams, int64_t n_embd, float eps,
                         const float* X, int64_t n_rows, float* x, float* inject) {
  const int64_t width = n_streams * n_embd;
  compute::Workspace::Frame frame(ws);
  const HcScratch scratch = take_scratch(ws, w, width, n_rows);
  float* const inject_out = w.has_inject() ? inject : nullptr;
  // A window of a few rows per thread (batched decode steps of `serve --parallel`): each thread
  // runs its own slice of rows through every step, one hand-out instead of five. The steps are
  // small here (rank 32 against a 1024-wide X on the default model), so five waits for five short
  // splits cost more than the work they share, and a thread's slice still fills the tile kernels'
  // rows. Prompt windows keep the split per step, whose products then tile over all rows.
  if (compute::takes_row_slices(pool, n_rows)) {
    compute::for_each_row_slice(pool, n_rows, [&](int64_t begin, int64_t end, int) {
      hc_in_rows(pool, w, n_streams, n_embd, eps, X, begin, end, x, inject_out, scratch);
    });
    return;
  }
  hc_in_rows(pool, w, n_streams, n_embd, eps, X, 0, n_rows, x, inject_out, scratch);
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

void hyper_connection_out_in(compute::ThreadPool& pool, compute::Workspace& ws, int n_streams,
                             int64_t n_embd, const float* y, const float* inject, float* X,
                             const HyperConnectionWeights& next, float eps, int64_t n_rows,
                             float* x, float* next_inject) {
  if (!compute::takes_row_slices(pool, n_rows)) {
    hyper_connection_out(n_streams, n_embd, y, inject, n_rows, X);
    hyper_connection_in(pool, ws, next, n_streams, n_embd, eps, X, n_rows, x, next_inject);
    return;
  }
  const int64_t width = n_streams * n_embd;
  compute::Workspace::Frame frame(ws);
  const HcScratch scratch = take_scratch(ws, next, width, n_rows);
  float* const inject_out = next.has_inject() ? next_inject : nullptr;
  compute::for_each_row_slice(pool, n_rows, [&](int64_t begin, int64_t end, int thread) {
    std::optional<ScopedPart> part;
    if (thread == 0) part.emplace(Part::HcOut);
    hyper_connection_out(n_streams, n_embd, y + begin * n_embd, inject + begin * n_streams,
                         end - begin, X + begin * width);
    if (thread == 0) part.emplace(Part::HcIn);
    hc_in_rows(pool, next, n_streams, n_embd, eps, X, begin, end, x, inject_out, scratch);
  });
}

}  // namespace strata
