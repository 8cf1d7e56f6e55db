#include "layers/gated_deltanet.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <span>

#include "compute/cpu/gemm_f32.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/row_slices.h"
#include "compute/cpu/subnormals.h"
#include "compute/cpu/work_estimate.h"
#include "util/error.h"
#include "util/phase_timer.h"

namespace strata {

// Each product below is a compute::gemm_f32 call, whose per-element sequence (a sum in index
// order from its start value, every product and sum rounded on its own) is the one the plain
// loops of delta_rule_token's contract run, so the bits are theirs: the kernels vectorise over
// the value columns j instead of summing a strided column over i one float at a time (measured:
// this loop was 12 % of a 16-row batched decode step on the default model, docs/serve.md).
void delta_rule_token(const float* q, const float* k, const float* v, float beta, float decay_log,
                      int dk, int dv, float* state, float* out) {
  delta_rule_token_columns(q, k, v, beta, decay_log, dk, dv, 0, dv, state, out);
}

void delta_rule_token_columns(const float* q, const float* k, const float* v, float beta,
                              float decay_log, int dk, int dv, int j_begin, int j_end, float* state,
                              float* out) {
  const float decay = std::exp(decay_log);
  if (j_begin == 0 && j_end == dv) {
    for (int i = 0; i < dk * dv; ++i) state[i] *= decay;
  } else {
    for (int i = 0; i < dk; ++i)
      for (int j = j_begin; j < j_end; ++j) state[i * dv + j] *= decay;
  }
  // Columns in blocks of kColumns: a block's recalled values (Sᵀk)_j read its columns before
  // their update, as the column-by-column loop does; other columns are not touched.
  constexpr int kColumns = 64;
  float u[kColumns];
  for (int j0 = j_begin; j0 < j_end; j0 += kColumns) {
    const int n = std::min(kColumns, j_end - j0);
    compute::gemm_f32(1, n, dk, k, dk, state + j0, dv, u, n, /*accumulate=*/false);
    for (int j = 0; j < n; ++j) u[j] = (v[j0 + j] - u[j]) * beta;
    compute::gemm_f32(dk, n, 1, k, 1, u, n, state + j0, dv, /*accumulate=*/true);
  }
  if (out)
    compute::gemm_f32(1, j_end - j_begin, dk, q, dk, state + j_begin, dv, out + j_begin, dv,
                      /*accumulate=*/false);
}

namespace {

// Scales v to unit L2 norm the way HF does: v·rsqrt(Σv² + 1e-6), then by `extra`.
void l2_normalize(float* v, int n, float extra) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += v[i] * v[i];
  const float scale = extra / std::sqrt(sum + 1e-6f);
  for (int i = 0; i < n; ++i) v[i] *= scale;
}

using DeltaInputs = GatedDeltaNetInputs;

// Recurrent form, token by token, over rows [first_row, end_row), for state columns
// [j_begin, j_end) (a column's recurrence reads no other column). state: [dk][dv] of V head h;
// out: core [n_rows][nv·dv] (row t at row t), or nullptr to advance the state only (rollback
// replay; the state update is the same code either way, so the same bits).
void delta_rule_recurrent(const DeltaInputs& in, int64_t first_row, int64_t end_row,
                          const DeltaNetDims& dims, int h, int kh, float* state, float* out,
                          int j_begin, int j_end) {
  const int dk = dims.head_k_dim, dv = dims.head_v_dim, nv = dims.n_v_heads;
  const int64_t key_dim = dims.key_dim(), value_dim = dims.value_dim();
  for (int64_t t = first_row; t < end_row; ++t) {
    delta_rule_token_columns(in.q.data() + t * key_dim + kh * dk,
                             in.k.data() + t * key_dim + kh * dk,
                             in.v.data() + t * value_dim + h * dv, in.beta[size_t(t * nv + h)],
                             in.decay_log[size_t(t * nv + h)], dk, dv, j_begin, j_end, state,
                             out ? out + t * value_dim + h * dv : nullptr);
  }
}
void delta_rule_recurrent(const DeltaInputs& in, int64_t n_rows, const DeltaNetDims& dims, int h,
                          int kh, float* state, float* out) {
  delta_rule_recurrent(in, 0, n_rows, dims, h, kh, state, out, 0, dims.head_v_dim);
}

// Column blocks per V head for the recurrent form on `threads` threads: 1 while the heads give
// every thread about three tasks, else the fewest powers of two that do, each block at least
// kMinColumns wide. The mid shape's 12 heads on 16 threads: 4 blocks of 32 columns, 48 tasks
// (by heads alone 4 of the 16 threads waited and the others ran a whole head each).
int column_blocks(int threads, int n_heads, int dv) {
  constexpr int kMinColumns = 8;
  int blocks = 1;
  while (n_heads * blocks < 3 * threads && dv / (2 * blocks) >= kMinColumns) blocks *= 2;
  return blocks;
}

// Chunked form for V head h of the first n_rows rows of `in` (contract and order in the
// header's delta_rule_chunked_head).
void delta_rule_chunked(const DeltaInputs& in, int64_t n_rows, const DeltaNetDims& dims, int h,
                        int kh, float* state, float* out) {
  const int dk = dims.head_k_dim, dv = dims.head_v_dim, nv = dims.n_v_heads;
  const int64_t key_dim = dims.key_dim(), value_dim = dims.value_dim();
  const DeltaRuleHeadRows rows{.q = in.q.data() + kh * dk,
                               .k = in.k.data() + kh * dk,
                               .key_stride = key_dim,
                               .v = in.v.data() + h * dv,
                               .value_stride = value_dim,
                               .beta = in.beta.data() + h,
                               .decay_log = in.decay_log.data() + h,
                               .gate_stride = nv,
                               .n_rows = n_rows,
                               .dk = dk,
                               .dv = dv};
  delta_rule_chunked_head(rows, state, out + h * dv, value_dim);
}

// The delta rule of a window for V head h, in the form delta_rule_window_chunked_rows picks:
// the chunked form over its whole 64-row chunks (and a trailing chunk of >= 32 rows), the
// recurrent form over a trailing chunk of fewer rows. Each chunk so runs exactly what a window of
// its own rows would run (a chunk's computation reads only its rows and the state before it),
// hence a window is bitwise its 64-row windows one after the other.
void delta_rule_window(const DeltaInputs& in, const DeltaNetDims& dims, int h, int kh, float* state,
                       float* out) {
  const int64_t chunked_rows = delta_rule_window_chunked_rows(in.n_rows);
  if (chunked_rows > 0) delta_rule_chunked(in, chunked_rows, dims, h, kh, state, out);
  if (chunked_rows < in.n_rows)
    delta_rule_recurrent(in, chunked_rows, in.n_rows, dims, h, kh, state, out, 0, dims.head_v_dim);
}

// delta_rule_chunked_head's computation, run inside its FlushSubnormals scope. Each product is a
// compute::gemm_f32 call, whose per-element order (a sum in index order from its start value, no
// fused multiply-add) is the one the header's contract spells out per entry. noinline: the
// compiler does not order floating-point operations after a write of MXCSR, so none of these may
// be inlined into the caller and moved across the scope's ends.
[[gnu::noinline]] void chunked_head_without_subnormals(const DeltaRuleHeadRows& rows, float* state,
                                                       float* out, int64_t out_stride) {
  const int dk = rows.dk, dv = rows.dv;
  const int64_t key_stride = rows.key_stride, value_stride = rows.value_stride;
  constexpr int C = kDeltaRuleChunkRows;
  const int uw_width = dv + dk;  // a row of [U | W]: both substitutions share L
  std::vector<float> gamma(C), decay(size_t(C) * C), kk(size_t(C) * C), qk(size_t(C) * C);
  std::vector<float> kt(size_t(dk) * C), uw(size_t(C) * uw_width), wsp(size_t(C) * dv),
      vp(size_t(C) * dv);
  for (int64_t c0 = 0; c0 < rows.n_rows; c0 += C) {
    const int n = int(std::min<int64_t>(C, rows.n_rows - c0));
    const float* K = rows.k + c0 * key_stride;  // rows key_stride apart
    const float* Q = rows.q + c0 * key_stride;
    const float* V = rows.v + c0 * value_stride;  // rows value_stride apart
    auto beta = [&](int i) { return rows.beta[(c0 + i) * rows.gate_stride]; };
    float acc_gamma = 0.0f;
    for (int i = 0; i < n; ++i)
      gamma[size_t(i)] = acc_gamma += rows.decay_log[(c0 + i) * rows.gate_stride];
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j)
        decay[size_t(i * C + j)] = std::exp(gamma[size_t(i)] - gamma[size_t(j)]);
    // Kᵀ [dk][C], then K Kᵀ and Q Kᵀ [n][n] (row i, column j: the dot of rows i and j).
    for (int i = 0; i < n; ++i)
      for (int r = 0; r < dk; ++r) kt[size_t(r * C + i)] = K[i * key_stride + r];
    compute::gemm_f32(n, n, dk, K, key_stride, kt.data(), C, kk.data(), C, false);
    compute::gemm_f32(n, n, dk, Q, key_stride, kt.data(), C, qk.data(), C, false);
    // −L in kk's strict lower triangle.
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j)
        kk[size_t(i * C + j)] = -(beta(i) * kk[size_t(i * C + j)] * decay[size_t(i * C + j)]);
    // Forward substitution: row i of [U | W] = [β_i v_i | β_i e^{γ_i} k_i] + Σ_{j<i} (−l_ij)·row j.
    for (int i = 0; i < n; ++i) {
      float* u = uw.data() + size_t(i) * uw_width;
      float* wv = u + dv;
      const float* v = V + i * value_stride;
      const float* k = K + i * key_stride;
      const float scale_w = beta(i) * std::exp(gamma[size_t(i)]);
      for (int c = 0; c < dv; ++c) u[c] = beta(i) * v[c];
      for (int c = 0; c < dk; ++c) wv[c] = scale_w * k[c];
      compute::gemm_f32(1, uw_width, i, kk.data() + size_t(i) * C, C, uw.data(), uw_width, u,
                        uw_width, true);
    }
    // V' = U − W·S  (S is [dk][dv]).
    compute::gemm_f32(n, dv, dk, uw.data() + dv, uw_width, state, dv, wsp.data(), dv, false);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < dv; ++c)
        vp[size_t(i) * dv + c] = uw[size_t(i) * uw_width + c] - wsp[size_t(i) * dv + c];
    // O = diag(e^γ)·Q·S + (Q Kᵀ ⊙ Γ)·V'  (the causal part: j ≤ i).
    compute::gemm_f32(n, dv, dk, Q, key_stride, state, dv, wsp.data(), dv, false);
    for (int i = 0; i < n; ++i) {
      float* o = out + (c0 + i) * out_stride;
      const float eg = std::exp(gamma[size_t(i)]);
      for (int c = 0; c < dv; ++c) o[c] = eg * wsp[size_t(i) * dv + c];
      float* a = qk.data() + size_t(i) * C;
      for (int j = 0; j <= i; ++j) a[j] = a[j] * decay[size_t(i * C + j)];
      compute::gemm_f32(1, dv, i + 1, a, C, vp.data(), dv, o, out_stride, true);
    }
    // S ← e^{γ_C}·S + Σ_i e^{γ_C−γ_i} k_i V'_iᵀ  (kt becomes the scaled Kᵀ).
    const float g_last = gamma[size_t(n - 1)];
    const float e_last = std::exp(g_last);
    for (int i = 0; i < dk * dv; ++i) state[i] *= e_last;
    for (int i = 0; i < n; ++i) {
      const float scale = std::exp(g_last - gamma[size_t(i)]);
      for (int r = 0; r < dk; ++r) kt[size_t(r * C + i)] = scale * kt[size_t(r * C + i)];
    }
    compute::gemm_f32(dk, dv, n, kt.data(), C, vp.data(), dv, state, dv, true);
  }
}

}  // namespace

// Subnormals flushed to zero (header contract). Why: with a strong decay (per-token log-decay
// around -2; issue 16's audit simulated ~3 such heads of 12 per layer) the chunk's factors
// e^{γ_i}, e^{γ_i−γ_j} and e^{γ_z−γ_i} fall below 2^-126 (γ < -87.3) for rows ~44 apart, and the
// rows of W = β e^γ K, of −L, of the scaled Kᵀ and the products with them follow: counted on
// bench_deltanet_heads' decay-20 head (g in [-3, -1]), 6.6 M of its 63 M multiplies and adds per
// 512 rows have a subnormal operand or result, most in W·S and the state update (decay 5: none). An
// Intel core takes a microcode assist for each, so on the 16-core Xeon such a head, and the layer
// that waits for its slowest head, can run many times slower than a mild one (issue 16: "gdn delta
// rule+norm" 551 ms per 512-row window at 16 threads, as if the heads ran one after another).
// FTZ + DAZ (MXCSR) rather than clamping the exponents: writing 0 for a subnormal e^x still
// leaves 4.1 M of the 6.6 M (tiny normal factors times O(0.1) values, the W rows built on them),
// while FTZ/DAZ removes them all for two MXCSR writes per call. What is flushed is below 2^-126
// next to the O(1) scale of v, q̂, k̂ and the state, far under the f32 rounding of any sum it
// joins; the bits differ from unflushed arithmetic only where a subnormal appeared. The scope is
// opened here, on whichever thread runs the head, so every caller (layer, tests, bench) and every
// thread count gets the same bits.
void delta_rule_chunked_head(const DeltaRuleHeadRows& rows, float* state, float* out,
                             int64_t out_stride) {
  const compute::FlushSubnormals flush;
  chunked_head_without_subnormals(rows, state, out, out_stride);
}

void GatedDeltaNetState::reset(const DeltaNetDims& dims) {
  conv.assign(static_cast<size_t>((dims.conv_kernel - 1) * dims.conv_dim()), 0.0f);
  ssm.assign(static_cast<size_t>(dims.n_v_heads) * dims.head_k_dim * dims.head_v_dim, 0.0f);
}

namespace {

// Estimates for the pool's inline rule (compute/cpu/work_estimate.h), 0 on a pool that has no
// rule (the rates are then never measured). The delta rule: per row and V head, four passes over
// its dk x dv state (decay, recall, update, read-out), gemm_f32's vectorised work, costed as the
// F32 dot's. The conv: per row and channel, its taps and the SiLU, the layers' plain loops.
double delta_rule_work_ns(const compute::ThreadPool& pool, const DeltaNetDims& dims,
                          int64_t n_rows) {
  if (pool.inline_work_ns() <= 0) return 0;
  return compute::dot_work_ns(GgmlType::F32, n_rows * dims.n_v_heads * 4 * dims.head_v_dim,
                              dims.head_k_dim);
}
double conv_work_ns(const compute::ThreadPool& pool, const DeltaNetDims& dims, int64_t n_rows) {
  if (pool.inline_work_ns() <= 0) return 0;
  return compute::f32_loop_work_ns(n_rows * dims.conv_dim() * (dims.conv_kernel + 1));
}

// Phase 1 for one sequence (sequential in t: the conv history): conv + SiLU, split, normalise,
// gates, from its rows of the projections into `in` (sized for n_rows by the caller).
// With `then` (steps that read `in`: the delta rule's), the whole of it and those steps go out as
// one chain (ThreadPool::run_phases, work_ns its estimate): the conv with the history of each
// task's channels, then the split, norms and gates per (row, K head) and per row, then `then`.
// A decode row's conv, its per-row pass and the delta rule were up to three hand-outs with the
// per-row pass on the calling thread between them ("gdn conv+gates" did not scale with threads:
// 1.2 ms a token on 1 thread, 1.5 on 16, docs/bench-cpu-scaling.md). Each value goes through
// the same operations either way, so the same bits.
void deltanet_inputs(compute::ThreadPool& pool, compute::Workspace& ws, const DeltaNetDims& dims,
                     const GatedDeltaNetWeights& w, GatedDeltaNetState& state, const float* mixed,
                     const float* beta, const float* alpha, int64_t n_rows, DeltaInputs& in,
                     std::span<const compute::ThreadPool::Phase> then = {}, double work_ns = 0) {
  compute::Workspace::Frame frame(ws);
  const int nk = dims.n_k_heads, nv = dims.n_v_heads;
  const int dk = dims.head_k_dim;
  const int kernel = dims.conv_kernel;
  const int64_t key_dim = dims.key_dim(), value_dim = dims.value_dim();
  const int64_t conv_dim = dims.conv_dim();
  std::vector<float>& conv_out = ws.floats(static_cast<size_t>(n_rows * conv_dim));
  const float q_scale = 1.0f / std::sqrt(float(dk));  // HF: query.shape[-1] ** -0.5
  // Causal depthwise conv over [history (K-1 rows) | the window's rows], then SiLU. Row r of that
  // concatenation is history row r for r < K-1, else window row r-(K-1); token t's taps read rows
  // t .. t+K-1, oldest first. Channels are independent, so they run split over the threads.
  const int64_t history_rows = kernel - 1;
  auto conv_row = [&](int64_t r) {
    return r < history_rows ? state.conv.data() + r * conv_dim
                            : mixed + (r - history_rows) * conv_dim;
  };
  constexpr int64_t kConvChannelsPerTask = 64;
  const int64_t conv_tasks = (conv_dim + kConvChannelsPerTask - 1) / kConvChannelsPerTask;
  auto convolve = [&](int64_t begin, int64_t end, int) {
    const int64_t ch_begin = begin * kConvChannelsPerTask;
    const int64_t ch_end = std::min(conv_dim, end * kConvChannelsPerTask);
    // Tap by tap over the task's channels (each channel's sum still starts at 0 and adds its
    // taps oldest first, so the same bits): the inner loop runs over consecutive channels of one
    // row and vectorises, where a loop over a channel's taps picked the row per tap (~1 GMAC/s:
    // 6 % of a 16-row step on one thread, session 44).
    for (int64_t t = 0; t < n_rows; ++t) {
      float* out = conv_out.data() + t * conv_dim;
      std::fill(out + ch_begin, out + ch_end, 0.0f);
      for (int j = 0; j < kernel; ++j) {
        const float* row = conv_row(t + j);
        const float* taps = w.conv.data() + j;
        for (int64_t ch = ch_begin; ch < ch_end; ++ch) out[ch] += taps[ch * kernel] * row[ch];
      }
    }
    // silu over the task's channels of every row (vectorised; the same bits per element).
    for (int64_t t = 0; t < n_rows; ++t) {
      float* row = conv_out.data() + t * conv_dim;
      compute::silu(row + ch_begin, ch_end - ch_begin, row + ch_begin);
    }
  };
  // The new history: the last K-1 rows of the concatenation, channels [ch_begin, ch_end) (moved
  // in order, oldest first, so a history row is read before it is overwritten; a channel's
  // history is read by its own conv only).
  auto move_history = [&](int64_t ch_begin, int64_t ch_end) {
    for (int64_t j = 0; j < history_rows && n_rows > 0; ++j)
      std::copy_n(conv_row(n_rows + j) + ch_begin, ch_end - ch_begin,
                  state.conv.data() + j * conv_dim + ch_begin);
  };
  // Split, normalise, gates of row t: part h < nk is K head h's q and k (copied, L2-normalised),
  // part nk the row's v and gates.
  auto split_part = [&](int64_t t, int part) {
    const float* conv_t = conv_out.data() + t * conv_dim;
    if (part < nk) {
      float* q = in.q.data() + t * key_dim + part * dk;
      float* k = in.k.data() + t * key_dim + part * dk;
      std::copy_n(conv_t + part * dk, dk, q);
      std::copy_n(conv_t + key_dim + part * dk, dk, k);
      l2_normalize(q, dk, q_scale);
      l2_normalize(k, dk, 1.0f);
      return;
    }
    std::copy_n(conv_t + 2 * key_dim, value_dim, in.v.data() + t * value_dim);
    for (int h = 0; h < nv; ++h) {
      in.beta[t * nv + h] = compute::sigmoid(beta[t * nv + h]);
      in.decay_log[size_t(t * nv + h)] =
          w.a[size_t(h)] * compute::softplus(alpha[t * nv + h] + w.dt_bias[size_t(h)]);
    }
  };
  if (!then.empty()) {
    // About two tasks per thread for each step: a task is taken from one shared counter, a cache
    // line that travels between the cores (~470 ns a round trip on the 2-vCPU build VM), so the
    // conv's 64-channel units and a row's nk + 1 parts go in groups where threads are few.
    // A conv under the inline threshold (compute/cpu/thread_pool.h) is one task, and the split
    // one more: spread over the 2-vCPU build VM's threads they made a decode token's DeltaNet
    // part 0.25 ms slower (10 alternated rounds, 12 x 512 file), every row's conv outputs then
    // crossing between the cores; as the chain's first tasks they still run while the workers
    // join.
    const double conv_ns = conv_work_ns(pool, dims, n_rows);
    const int threads = conv_ns < pool.inline_work_ns() ? 1 : pool.size();
    const int64_t units_per_task =
        threads == 1 ? conv_tasks : std::max<int64_t>(1, conv_tasks / (2 * int64_t(threads)));
    const int64_t conv_step_tasks = (conv_tasks + units_per_task - 1) / units_per_task;
    const auto conv_step = [&](int64_t begin, int64_t end, int thread) {
      const int64_t unit_begin = begin * units_per_task;
      const int64_t unit_end = std::min(conv_tasks, end * units_per_task);
      convolve(unit_begin, unit_end, thread);
      move_history(unit_begin * kConvChannelsPerTask,
                   std::min(conv_dim, unit_end * kConvChannelsPerTask));
    };
    const int groups = std::min(nk + 1, threads);
    const auto split_step = [&](int64_t begin, int64_t end, int) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / groups, g = task % groups;
        for (int64_t part = g * (nk + 1) / groups; part < (g + 1) * (nk + 1) / groups; ++part)
          split_part(t, int(part));
      }
    };
    const auto unused = [](int64_t, int64_t, int) {};  // placeholders for `then`'s slots
    std::array<compute::ThreadPool::Phase, 4> phases{
        {{conv_step_tasks, conv_step}, {n_rows * groups, split_step}, {1, unused}, {1, unused}}};
    if (then.size() + 2 > phases.size())
      fail("deltanet_inputs: expected at most 2 steps after the inputs, found {}", then.size());
    std::copy(then.begin(), then.end(), phases.begin() + 2);
    pool.run_phases(std::span(phases.data(), then.size() + 2), work_ns + conv_ns);
    return;
  }
  // On the pool for decode rows too: 2560 channels x 4 taps were ~20 µs of a decode step on one
  // thread while the others waited (strata bench cpu, "gdn conv+gates"); a conv smaller than a
  // hand-out runs on the caller (the inline rule).
  pool.parallel_for(conv_tasks, conv_work_ns(pool, dims, n_rows), convolve);
  move_history(0, conv_dim);
  // Split, normalise, gates: row by row.
  compute::parallel_rows(pool, n_rows, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t)
      for (int part = 0; part <= nk; ++part) split_part(t, part);
  });
}

// Phase 3 for V head h of rows [0, n_rows): the gated RMS norm of its core output, in place.
// Heads are independent, so it runs in the task that ran the head's delta rule (no pass of its
// own over the window after every head is done).
void gated_norm_head(const DeltaNetDims& dims, const GatedDeltaNetWeights& w, float* core_rows,
                     const float* z_rows, int64_t n_rows, int h) {
  const int dv = dims.head_v_dim;
  const int64_t value_dim = dims.value_dim();
  for (int64_t t = 0; t < n_rows; ++t) {
    float* o = core_rows + t * value_dim + h * dv;
    const float* zh = z_rows + t * value_dim + h * dv;
    compute::rms_norm(o, w.norm.data(), dv, dims.rms_eps, o);
    if (dims.gate_sigmoid)
      compute::mul_sigmoid(o, zh, dv);
    else
      compute::mul_silu(o, zh, dv);
  }
}

// Phases 1, 2 and 3 for one sequence: conv + SiLU (with its history), split, normalise, gates,
// the delta rule and the gated norm, over its n_rows rows of the projections (mixed [n][conv_dim],
// beta and alpha [n][nv], z [n][value_dim]) into core [n][value_dim]. Everything here is the
// sequence's own (state, positions) except the norm, which is per (row, head) and rides along in
// each head's task; the projections before and the output after are row-wise.
void deltanet_core(compute::ThreadPool& pool, compute::Workspace& ws, const DeltaNetDims& dims,
                   const GatedDeltaNetWeights& w, GatedDeltaNetState& state, const float* mixed,
                   const float* beta, const float* alpha, const float* z, int64_t n_rows,
                   float* core_rows, bool record_window) {
  compute::Workspace::Frame frame(ws);
  const int nk = dims.n_k_heads, nv = dims.n_v_heads;
  const int dk = dims.head_k_dim, dv = dims.head_v_dim;
  const int64_t key_dim = dims.key_dim(), value_dim = dims.value_dim();
  const int64_t conv_dim = dims.conv_dim();
  const int v_per_k = nv / nk;

  // Phase 1 (sequential in t: the conv history): conv + SiLU, split, normalise, gates.
  // The inputs' buffers: the workspace's, lent to `in` for the window and given back after it;
  // for a recorded window the state's spare set, which then trades places with the log's.
  std::vector<float>* const lent[5] = {&ws.floats(static_cast<size_t>(n_rows * key_dim)),
                                       &ws.floats(static_cast<size_t>(n_rows * key_dim)),
                                       &ws.floats(static_cast<size_t>(n_rows * value_dim)),
                                       &ws.floats(static_cast<size_t>(n_rows * nv)),
                                       &ws.floats(static_cast<size_t>(n_rows * nv))};
  DeltaInputs in;
  in.n_rows = n_rows;
  std::vector<float>* const parts[5] = {&in.q, &in.k, &in.v, &in.beta, &in.decay_log};
  std::vector<float>* const spare[5] = {&state.spare_inputs.q, &state.spare_inputs.k,
                                        &state.spare_inputs.v, &state.spare_inputs.beta,
                                        &state.spare_inputs.decay_log};
  for (int i = 0; i < 5; ++i) {
    if (record_window) {
      spare[i]->assign(lent[i]->size(), 0.0f);
      parts[i]->swap(*spare[i]);
    } else {
      parts[i]->swap(*lent[i]);
    }
  }
  GatedDeltaNetWindowLog& log = state.window_log;
  log.valid = false;
  if (record_window) {
    if (n_rows >= kDeltaRuleChunkedMinRows)
      fail(
          "gated deltanet: a recorded (speculative verify) window must have fewer than {} rows, "
          "got {}",
          kDeltaRuleChunkedMinRows, n_rows);
    log.ssm_before = state.ssm;
    log.conv_before = state.conv;
  }
  // Phase 2: the delta rule per V head (heads are independent, so the split across threads
  // cannot change a bit), the gated norm in each head's task. Short windows (decode, speculative
  // verify) use the recurrent form, which is what makes a row's result independent of the window
  // size; long prefill windows use the chunked form, which touches the state once per chunk
  // instead of once per token.
  const bool chunked = n_rows >= kDeltaRuleChunkedMinRows;
  const double delta_rule_ns = delta_rule_work_ns(pool, dims, n_rows);
  const auto head_of = [&](int64_t h) {
    return dims.v_heads_tiled ? int(h) % nk : int(h) / v_per_k;
  };
  const auto heads = [&](int64_t begin, int64_t end, int) {
    for (int64_t h = begin; h < end; ++h) {
      float* head_state = state.ssm.data() + size_t(h) * dk * dv;
      delta_rule_window(in, dims, int(h), head_of(h), head_state, core_rows);
      gated_norm_head(dims, w, core_rows, z, n_rows, int(h));
    }
  };
  if (chunked || !pool.phase_chains()) {
    // The chunked form, and the recurrent one without phase chains (ThreadPool::phase_chains):
    // the inputs, then one hand-out over the V heads.
    {
      ScopedPart part(Part::GdnConv);
      deltanet_inputs(pool, ws, dims, w, state, mixed, beta, alpha, n_rows, in);
    }
    ScopedPart delta_rule_part(Part::GdnDeltaRule);
    pool.parallel_for(nv, delta_rule_ns, heads);
  } else {
    // The recurrent form: the inputs and the delta rule as one chain (deltanet_inputs), timed as
    // "gdn delta rule+norm". With more threads than the heads can feed, the recurrence goes per
    // (head, column block) (a column's recurrence reads no other column), then the gated norms
    // (a head's norm reads all its columns) per head.
    ScopedPart delta_rule_part(Part::GdnDeltaRule);
    const int blocks = column_blocks(pool.size(), nv, dv);
    const auto columns = [&](int64_t begin, int64_t end, int) {
      for (int64_t task = begin; task < end; ++task) {
        const int h = int(task / blocks), b = int(task % blocks);
        delta_rule_recurrent(in, 0, in.n_rows, dims, h, head_of(h),
                             state.ssm.data() + size_t(h) * dk * dv, core_rows, dv * b / blocks,
                             dv * (b + 1) / blocks);
      }
    };
    const auto norms = [&](int64_t begin, int64_t end, int) {
      for (int64_t h = begin; h < end; ++h) gated_norm_head(dims, w, core_rows, z, n_rows, int(h));
    };
    const compute::ThreadPool::Phase by_heads[] = {{nv, heads}};
    const compute::ThreadPool::Phase by_columns[] = {{int64_t(nv) * blocks, columns}, {nv, norms}};
    deltanet_inputs(pool, ws, dims, w, state, mixed, beta, alpha, n_rows, in,
                    blocks > 1 ? std::span<const compute::ThreadPool::Phase>(by_columns)
                               : std::span<const compute::ThreadPool::Phase>(by_heads),
                    delta_rule_ns);
  }
  if (record_window) {
    // The log takes this window's buffers; its old ones become the spares.
    state.spare_conv_inputs.assign(mixed, mixed + n_rows * conv_dim);
    log.conv_inputs.swap(state.spare_conv_inputs);
    log.inputs.n_rows = in.n_rows;
    std::vector<float>* const logged[5] = {&log.inputs.q, &log.inputs.k, &log.inputs.v,
                                           &log.inputs.beta, &log.inputs.decay_log};
    for (int i = 0; i < 5; ++i) {
      logged[i]->swap(*parts[i]);
      spare[i]->swap(*parts[i]);
    }
    log.valid = true;
  } else {
    for (int i = 0; i < 5; ++i) lent[i]->swap(*parts[i]);
  }
}

// The input projections of rows [first, first + n) in one call (x converted once per activation
// format, one wait), into those rows of mixed, z, beta and alpha (ba: the fused beta/alpha
// projection's rows, when the weights have it).
void project_rows(compute::ThreadPool& pool, const DeltaNetDims& dims,
                  const GatedDeltaNetWeights& w, const float* x, int64_t first, int64_t n,
                  float* mixed, float* z, float* beta, float* alpha, float* ba) {
  const int nk = dims.n_k_heads, nv = dims.n_v_heads, v_per_k = nv / nk;
  const int64_t n_in = w.qkv.n_in, conv_dim = dims.conv_dim(), value_dim = dims.value_dim();
  x += first * n_in;
  mixed += first * conv_dim;
  z += first * value_dim;
  beta += first * nv;
  alpha += first * nv;
  if (w.fused_beta_alpha()) {
    ba += first * 2 * nv;
    const compute::MatmulProduct projections[] = {{&w.qkv, mixed}, {&w.z, z}, {&w.beta_alpha, ba}};
    compute::matmul_many(pool, projections, x, n);
    // Group g holds b for V heads g·r .. g·r+r-1, then a for the same heads.
    for (int64_t t = 0; t < n; ++t)
      for (int g = 0; g < nk; ++g)
        for (int j = 0; j < v_per_k; ++j) {
          beta[t * nv + g * v_per_k + j] = ba[t * 2 * nv + g * 2 * v_per_k + j];
          alpha[t * nv + g * v_per_k + j] = ba[t * 2 * nv + g * 2 * v_per_k + v_per_k + j];
        }
  } else {
    const compute::MatmulProduct projections[] = {
        {&w.qkv, mixed}, {&w.z, z}, {&w.beta, beta}, {&w.alpha, alpha}};
    compute::matmul_many(pool, projections, x, n);
  }
}

// Phase 1's outputs of several sequences (never recorded), each sized for its rows, lent by the
// workspace for the scope.
class LentSequenceInputs {
 public:
  LentSequenceInputs(compute::Workspace& ws, const DeltaNetDims& dims,
                     std::span<GatedDeltaNetState* const> states,
                     std::span<const compute::RowSegment> segments)
      : inputs(segments.size()) {
    const int64_t key_dim = dims.key_dim(), value_dim = dims.value_dim(), nv = dims.n_v_heads;
    for (size_t s = 0; s < segments.size(); ++s) {
      const int64_t n = segments[s].n_rows;
      DeltaInputs& in = inputs[s];
      in.n_rows = n;
      const int64_t widths[5] = {key_dim, key_dim, value_dim, nv, nv};
      for (int i = 0; i < 5; ++i) {
        lent_.push_back(&ws.floats(static_cast<size_t>(n * widths[i])));
        parts(in)[i]->swap(*lent_.back());
      }
      states[s]->window_log.valid = false;
    }
  }
  ~LentSequenceInputs() {
    for (size_t s = 0; s < inputs.size(); ++s)
      for (int i = 0; i < 5; ++i) lent_[s * 5 + size_t(i)]->swap(*parts(inputs[s])[i]);
  }
  LentSequenceInputs(const LentSequenceInputs&) = delete;
  LentSequenceInputs& operator=(const LentSequenceInputs&) = delete;
  std::vector<DeltaInputs> inputs;

 private:
  static std::array<std::vector<float>*, 5> parts(DeltaInputs& in) {
    return {&in.q, &in.k, &in.v, &in.beta, &in.decay_log};
  }
  std::vector<std::vector<float>*> lent_;
};

// V head h of sequence s (rows of `in` at segment.first_row of the window): its delta rule
// (recurrent or chunked) and gated norm, into core; the state's head h advances.
void delta_rule_head(const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                     GatedDeltaNetState& state, const DeltaInputs& in,
                     const compute::RowSegment& segment, int h, const float* z, float* core) {
  const int nk = dims.n_k_heads, nv = dims.n_v_heads, dk = dims.head_k_dim, dv = dims.head_v_dim;
  const int v_per_k = nv / nk;
  const int64_t value_dim = dims.value_dim();
  const int kh = dims.v_heads_tiled ? h % nk : h / v_per_k;
  float* head_state = state.ssm.data() + size_t(h) * dk * dv;
  float* out = core + segment.first_row * value_dim;
  delta_rule_window(in, dims, h, kh, head_state, out);
  gated_norm_head(dims, w, out, z + segment.first_row * value_dim, in.n_rows, h);
}

// The whole layer over a window whose rows [segments[s].first_row, + n_rows) belong to
// states[s]: input projections over all rows at once, the core per sequence, the gated norm and
// the output projection over all rows. Rows are independent in the projections, the norm and
// the output (window identity), so each sequence gets the bits it gets alone.
// A batched decode step of a few rows per thread goes by row slices (compute/cpu/row_slices.h):
// each thread takes the whole sequences of its slice through all four stages, one hand-out
// instead of four, and its rows' data stays on its core (the parts time the window thread's
// slice).
void deltanet_rows(compute::ThreadPool& pool, compute::Workspace& ws, const DeltaNetDims& dims,
                   const GatedDeltaNetWeights& w, std::span<GatedDeltaNetState* const> states,
                   std::span<const compute::RowSegment> segments, const float* x, int64_t n_rows,
                   float* y, bool record_window) {
  compute::Workspace::Frame frame(ws);
  const int nv = dims.n_v_heads;
  const int64_t value_dim = dims.value_dim();
  const int64_t conv_dim = dims.conv_dim();

  std::vector<float>& mixed = ws.floats(static_cast<size_t>(n_rows * conv_dim));
  std::vector<float>& z = ws.floats(static_cast<size_t>(n_rows * value_dim));
  std::vector<float>& beta = ws.floats(static_cast<size_t>(n_rows * nv));
  std::vector<float>& alpha = ws.floats(static_cast<size_t>(n_rows * nv));
  std::vector<float>& ba =
      ws.floats(static_cast<size_t>(w.fused_beta_alpha() ? n_rows * 2 * nv : 0));
  std::vector<float>& core = ws.floats(static_cast<size_t>(n_rows * value_dim));
  auto project = [&](int64_t first, int64_t n) {
    project_rows(pool, dims, w, x, first, n, mixed.data(), z.data(), beta.data(), alpha.data(),
                 ba.data());
  };
  auto phase1 = [&](compute::Workspace& thread_ws, size_t s, DeltaInputs& in) {
    const int64_t first = segments[s].first_row;
    deltanet_inputs(pool, thread_ws, dims, w, *states[s], mixed.data() + first * conv_dim,
                    beta.data() + first * nv, alpha.data() + first * nv, segments[s].n_rows, in);
  };
  const int64_t n_out = w.out.n_out;

  if (compute::takes_sequence_slices(pool, segments, n_rows)) {
    LentSequenceInputs lent(ws, dims, states, segments);
    ws.reserve_threads(pool.size());
    compute::for_each_sequence_slice(pool, segments, n_rows, [&](size_t s_first, size_t s_last, int64_t first,
                                                                 int64_t n, int thread) {
      std::optional<ScopedPart> part;
      if (thread == 0) part.emplace(Part::GdnProj);
      project(first, n);
      if (thread == 0) part.emplace(Part::GdnConv);
      for (size_t s = s_first; s < s_last; ++s) phase1(ws.for_thread(thread), s, lent.inputs[s]);
      if (thread == 0) part.emplace(Part::GdnDeltaRule);
      for (size_t s = s_first; s < s_last; ++s)
        for (int h = 0; h < nv; ++h)
          delta_rule_head(dims, w, *states[s], lent.inputs[s], segments[s], h, z.data(),
                          core.data());
      if (thread == 0) part.emplace(Part::GdnOut);
      compute::matmul(pool, w.out, core.data() + first * value_dim, n, y + first * n_out);
    });
    return;
  }

  std::optional<ScopedPart> part(std::in_place, Part::GdnProj);
  project(0, n_rows);
  part.reset();
  if (segments.size() == 1) {
    deltanet_core(pool, ws, dims, w, *states[0], mixed.data(), beta.data(), alpha.data(), z.data(),
                  segments[0].n_rows, core.data(), record_window);
  } else {
    // Several sequences (never recorded): phase 1 per sequence, then the delta rule of every
    // (sequence, V head) pair in one hand-out to the threads rather than one per sequence (the
    // pairs are independent, so the split cannot change a bit; decode rows are tiny work each).
    LentSequenceInputs lent(ws, dims, states, segments);
    // Phase 1 of the sequences side by side (each is its own state and rows; nested hand-outs
    // inside run inline), each on its thread's workspace.
    ws.reserve_threads(pool.size());
    part.emplace(Part::GdnConv);
    pool.parallel_for(int64_t(segments.size()), [&](int64_t begin, int64_t end, int thread) {
      for (int64_t s = begin; s < end; ++s)
        phase1(ws.for_thread(thread), size_t(s), lent.inputs[size_t(s)]);
    });
    part.emplace(Part::GdnDeltaRule);
    const int64_t n_tasks = int64_t(segments.size()) * nv;
    const double delta_rule_ns = delta_rule_work_ns(pool, dims, n_rows);
    pool.parallel_for(n_tasks, delta_rule_ns, [&](int64_t begin, int64_t end, int) {
      for (int64_t task = begin; task < end; ++task) {
        const size_t s = size_t(task / nv);
        delta_rule_head(dims, w, *states[s], lent.inputs[s], segments[s], int(task % nv), z.data(),
                        core.data());
      }
    });
  }

  part.emplace(Part::GdnOut);
  compute::matmul(pool, w.out, core.data(), n_rows, y);
}

}  // namespace

void gated_deltanet_forward(compute::ThreadPool& pool, compute::Workspace& ws,
                            const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                            GatedDeltaNetState& state, const float* x, int64_t n_rows, float* y,
                            bool record_window) {
  GatedDeltaNetState* const states[1] = {&state};
  const compute::RowSegment rows[1] = {{0, n_rows}};
  deltanet_rows(pool, ws, dims, w, states, rows, x, n_rows, y, record_window);
}

void gated_deltanet_forward_rows(compute::ThreadPool& pool, compute::Workspace& ws,
                                 const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                                 std::span<GatedDeltaNetState* const> states,
                                 std::span<const compute::RowSegment> segments, const float* x,
                                 int64_t n_rows, float* y) {
  if (states.size() != segments.size())
    fail("gated deltanet: {} states for {} row segments", states.size(), segments.size());
  deltanet_rows(pool, ws, dims, w, states, segments, x, n_rows, y, false);
}

void gated_deltanet_rollback(compute::ThreadPool& pool, const DeltaNetDims& dims,
                             GatedDeltaNetState& state, int64_t keep_rows) {
  GatedDeltaNetWindowLog& log = state.window_log;
  if (!log.valid) fail("gated deltanet rollback: the last window was not recorded");
  const int64_t n_rows = log.inputs.n_rows;
  if (keep_rows < 0 || keep_rows > n_rows)
    fail("gated deltanet rollback: cannot keep {} rows of a {}-row window", keep_rows, n_rows);
  log.valid = false;
  if (keep_rows == n_rows) return;
  const int nk = dims.n_k_heads, nv = dims.n_v_heads;
  const size_t head_state = size_t(dims.head_k_dim) * size_t(dims.head_v_dim);
  const int v_per_k = nv / nk;
  const int64_t conv_dim = dims.conv_dim();
  const int64_t history_rows = dims.conv_kernel - 1;
  // Conv history: the last K-1 rows of [history before | kept conv inputs].
  for (int64_t j = 0; j < history_rows; ++j) {
    const int64_t idx = keep_rows - history_rows + j;  // window-relative row
    const float* src = idx >= 0 ? log.conv_inputs.data() + idx * conv_dim
                                : log.conv_before.data() + (history_rows + idx) * conv_dim;
    std::copy_n(src, conv_dim, state.conv.data() + j * conv_dim);
  }
  // Recurrent state: the snapshot, then the kept rows' updates again.
  state.ssm.swap(log.ssm_before);
  if (keep_rows == 0) return;
  const double replay_ns = delta_rule_work_ns(pool, dims, keep_rows);
  pool.parallel_for(nv, replay_ns, [&](int64_t begin, int64_t end, int) {
    for (int64_t h = begin; h < end; ++h) {
      const int kh = dims.v_heads_tiled ? int(h) % nk : int(h) / v_per_k;
      delta_rule_recurrent(log.inputs, keep_rows, dims, int(h), kh,
                           state.ssm.data() + size_t(h) * head_state, nullptr);
    }
  });
}

}  // namespace strata
