#include "layers/hyper_connection.h"

#include <algorithm>
#include <optional>

#include "compute/cpu/ops.h"
#include "compute/cpu/row_slices.h"
#include "compute/cpu/work_estimate.h"
#include "quant/quant.h"
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

// Tasks of about this many multiply-adds at least in the chained path: ~8 KiB of Q8_0 weights
// for a decode row, about a microsecond, well above taking a task (one counter increment).
constexpr int64_t kChainMinTaskMacs = 8 * 1024;
// Tasks per thread a chained step is cut into when it has the work (as the pool's chunking).
constexpr int64_t kChainTasksPerThread = 4;
// Windows up to this many rows (that do not take row slices) take the chain; longer ones (prompt
// windows) the per-step split, whose products tile over all the rows and whose row loops split.
constexpr int64_t kChainMaxRows = compute::kRowSlicesMaxRows;

// How many tasks a step of `macs` multiply-adds over `n_units` units (outputs, columns) gets,
// with units per task a multiple of `align`: units_per_task.
int64_t units_per_task(int64_t n_units, int64_t macs, int n_threads, int64_t align) {
  const int64_t by_work = std::max<int64_t>(1, macs / kChainMinTaskMacs);
  const int64_t n_tasks =
      std::clamp<int64_t>(std::min(by_work, kChainTasksPerThread * n_threads), 1, n_units);
  const int64_t per_task = (n_units + n_tasks - 1) / n_tasks;
  return (per_task + align - 1) / align * align;
}

// Whether the chained path below can take these weights: the down and inject read one converted
// copy of the normed rows (one activation format), and both products read converted rows (not
// the f32 ones: a type without conversion takes the per-step path).
bool chains(const HyperConnectionWeights& w) {
  const GgmlType format = quant::activation_type(w.down.type);
  return format != GgmlType::F32 && quant::activation_type(w.up.type) != GgmlType::F32 &&
         (!w.has_inject() || quant::activation_type(w.inject.type) == format);
}

// hyper_connection_in of a whole window as one chain of steps in one hand-out
// (ThreadPool::run_phases), for windows that take neither row slices (too few rows per thread,
// decode rows above all) nor the per-step split's tiles over many rows (prompt windows):
//   0. per row: the grouped norm, converted for the down and inject products;
//   1. the down and inject outputs, in tasks of a few outputs over every row;
//   2. per row: mix / S, SiLU, converted for the up product; the inject's 2·σ(· / S);
//   3. per slice of columns i: the up outputs s·H + i of every stream s, their sigmoid and the
//      stream sums into x (a column's gates and sums need no other column).
// At 16 threads the per-step form took two hand-outs a call (96 calls a token on the 48-layer
// file) with the norm, the conversions and the 4096-wide gates and sums on the calling thread
// between them: "hc in" scaled 1.18x from 2 to 16 threads (docs/bench-cpu-scaling.md).
// Every value goes through the per-step form's operations in the same order (the same
// element-wise functions, each output one dot), so each row gets the same bits.
// With `out` (hyper_connection_out_in), the block output is added to X row by row in the first
// step, before that row's norm (the next steps write the new inject, which may be out->inject:
// every row has read its old one by then).
struct PendingOut {
  const float* y;       // [n_rows][H]
  const float* inject;  // [n_rows][S]
  float* X;             // the X that hc in reads
};
void hc_in_chained(compute::ThreadPool& pool, const HyperConnectionWeights& w, int n_streams,
                   int64_t n_embd, float eps, const float* X, int64_t n_rows, float* x,
                   float* inject, const HcScratch& scratch, const PendingOut* out = nullptr) {
  const int64_t width = n_streams * n_embd;
  const int64_t rank = w.down.n_out;
  const float inv_streams = 1.0f / float(n_streams);
  const size_t x_stride = compute::activation_row_stride(w.down.type, width);
  const size_t mix_stride = compute::activation_row_stride(w.up.type, rank);
  std::byte* const converted =
      pool.scratch(pool.current_thread_index()).reserve((x_stride + mix_stride) * size_t(n_rows));
  const compute::ActivationRows x_rows{quant::activation_type(w.down.type), width, n_rows,
                                       converted, x_stride};
  const compute::ActivationRows mix_rows{quant::activation_type(w.up.type), rank, n_rows,
                                         converted + x_stride * size_t(n_rows), mix_stride};
  const int threads = pool.size();
  const int64_t down_per_task = units_per_task(rank, n_rows * rank * width, threads, 2);
  const int64_t down_tasks = (rank + down_per_task - 1) / down_per_task;
  const int64_t columns_per_task =
      units_per_task(n_embd, n_rows * width * rank, threads, /*align=*/8);
  const int64_t column_tasks = (n_embd + columns_per_task - 1) / columns_per_task;

  // Each step's tasks [begin, end): one at a time on the pool, all of them when run in order.
  const auto normalise = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      if (out)
        hyper_connection_out(n_streams, n_embd, out->y + t * n_embd, out->inject + t * n_streams, 1,
                             out->X + t * width);
      float* normed = scratch.normed + t * width;
      compute::rms_norm_grouped(X + t * width, w.norm.data(), n_streams, n_embd, eps, normed);
      quant::quantize_activation(w.down.type, normed,
                                 const_cast<std::byte*>(x_rows.data) + size_t(t) * x_stride, width);
    }
  };
  const auto down = [&](int64_t begin, int64_t end, int) {
    for (int64_t task = begin; task < end; ++task) {
      if (task == down_tasks) {  // the inject's few outputs: one task
        compute::matmul_rows_range(w.inject, x_rows, 0, w.inject.n_out, inject);
        continue;
      }
      const int64_t first = task * down_per_task;
      compute::matmul_rows_range(w.down, x_rows, first, std::min(rank, first + down_per_task),
                                 scratch.mix);
    }
  };
  const auto activate = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      float* mix = scratch.mix + t * rank;
      for (int64_t i = 0; i < rank; ++i) mix[i] *= inv_streams;
      compute::silu(mix, rank, mix);
      quant::quantize_activation(
          w.up.type, mix, const_cast<std::byte*>(mix_rows.data) + size_t(t) * mix_stride, rank);
      if (inject)
        for (int64_t i = t * n_streams; i < (t + 1) * n_streams; ++i)
          inject[i] = 2.0f * compute::sigmoid(inject[i] * inv_streams);
    }
  };
  const auto combine = [&](int64_t task_begin, int64_t task_end, int) {
    const int64_t begin = task_begin * columns_per_task;
    const int64_t end = std::min(n_embd, task_end * columns_per_task);
    const int64_t n = end - begin;
    for (int s = 0; s < n_streams; ++s)
      compute::matmul_rows_range(w.up, mix_rows, s * n_embd + begin, s * n_embd + end,
                                 scratch.gates);
    for (int64_t t = 0; t < n_rows; ++t) {
      for (int s = 0; s < n_streams; ++s) {
        float* g = scratch.gates + t * width + s * n_embd + begin;
        compute::sigmoid(g, n, g);
      }
      // The stream sums in the per-step form's order (see hc_in_rows).
      float* __restrict out = x + t * n_embd + begin;
      std::fill_n(out, n, 0.0f);
      for (int s = 0; s < n_streams; ++s) {
        const float* __restrict g = scratch.gates + t * width + s * n_embd + begin;
        const float* __restrict xn = scratch.normed + t * width + s * n_embd + begin;
        for (int64_t i = 0; i < n; ++i) out[i] += g[i] * xn[i];
      }
      for (int64_t i = 0; i < n; ++i) out[i] *= inv_streams;
    }
  };
  const compute::ThreadPool::Phase phases[] = {{n_rows, normalise},
                                               {down_tasks + (inject ? 1 : 0), down},
                                               {n_rows, activate},
                                               {column_tasks, combine}};
  double work_ns = 0;
  if (pool.size() > 1 && pool.inline_work_ns() > 0) {
    work_ns = compute::dot_work_ns(w.down.type, n_rows * rank, width) +
              compute::dot_work_ns(w.up.type, n_rows * width, rank);
    if (inject) work_ns += compute::dot_work_ns(w.inject.type, n_rows * n_streams, width);
  }
  pool.run_phases(phases, work_ns);
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
  if (pool.phase_chains() && n_rows <= kChainMaxRows && chains(w)) {
    hc_in_chained(pool, w, n_streams, n_embd, eps, X, n_rows, x, inject_out, scratch);
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
  const int64_t width = n_streams * n_embd;
  if (!compute::takes_row_slices(pool, n_rows)) {
    if (pool.phase_chains() && n_rows <= kChainMaxRows && chains(next)) {
      // The chain's first step adds the block output row by row: no pass over X on the calling
      // thread before the hand-out (timed with hc in).
      ScopedPart part(Part::HcIn);
      compute::Workspace::Frame frame(ws);
      const HcScratch scratch = take_scratch(ws, next, width, n_rows);
      const PendingOut out{y, inject, X};
      hc_in_chained(pool, next, n_streams, n_embd, eps, X, n_rows, x,
                    next.has_inject() ? next_inject : nullptr, scratch, &out);
      return;
    }
    {
      ScopedPart part(Part::HcOut);
      hyper_connection_out(n_streams, n_embd, y, inject, n_rows, X);
    }
    ScopedPart part(Part::HcIn);
    hyper_connection_in(pool, ws, next, n_streams, n_embd, eps, X, n_rows, x, next_inject);
    return;
  }
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
