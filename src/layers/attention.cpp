#include "layers/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <optional>

#include "compute/cpu/gemm_f32.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/row_slices.h"
#include "compute/cpu/work_estimate.h"
#include "util/error.h"
#include "util/phase_timer.h"

namespace strata {

// The index set torch.topk selects on the CPU, ties included. relu makes exact-zero block scores
// common, so which zero-score blocks fill the budget is decided by the tie rule, and the reference
// (HF, torch CPU) has one: std::partial_sort when k·64 ≤ n, else std::nth_element at k-1, over
// (value, index) pairs compared by value only. libstdc++'s algorithms are deterministic, so making
// the same calls on the same sequence reproduces the same set (verified on the fixtures, where a
// plain "lower index wins" rule picks a different zero block at position 15 of prompt 0).
void torch_cpu_top_k_set(const std::vector<float>& values, int64_t k, std::vector<int64_t>& set) {
  // The queue holds indices compared by their value only: the algorithms make the same
  // comparisons and moves as on (value, index) pairs compared by value, so the same set results.
  set.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) set[i] = int64_t(i);
  auto larger = [&values](int64_t a, int64_t b) { return values[size_t(a)] > values[size_t(b)]; };
  if (k * 64 <= int64_t(set.size()))
    std::partial_sort(set.begin(), set.begin() + k, set.end(), larger);
  else
    std::nth_element(set.begin(), set.begin() + (k - 1), set.end(), larger);
  set.resize(size_t(k));
}

namespace {

constexpr int kMaxRopeHalf = 512;  // rotary pairs a row's table holds (real models: n_rot <= 256)

struct Shape {
  int n_head, n_head_kv, head_dim, n_rot;
  int64_t q_row, kv_dim;
  int idx_heads, idx_dim;
};

// A row's scratch inside the attention task of one thread, reserved for the whole context the
// caches are reserved for (so a growing context does not reallocate it step by step). Taken in
// the same order by the task and by `reserve_row_scratch`, which the window thread runs for every
// thread before the parallel_for: which thread runs which rows is not deterministic, so each
// thread's scratch must be ready before the first task.
struct RowScratch {
  std::vector<int64_t>& tokens;
  std::vector<float>& weights;
  std::vector<float>& scores;      // QSA: one per complete block
  std::vector<int32_t>& selected;  // QSA
  std::vector<int64_t>& top;       // QSA
};

// weights holds one row of attention weights per query head of a KV head (the matrix path).
RowScratch take_row_scratch(compute::Workspace& tw, int64_t capacity_tokens, int ratio,
                            int heads_per_kv) {
  RowScratch r{tw.ints(0), tw.floats(0), tw.floats(0), tw.ids(0), tw.ints(0)};
  r.tokens.reserve(size_t(capacity_tokens));
  r.weights.reserve(size_t(capacity_tokens) * size_t(heads_per_kv));
  if (ratio > 0) {
    const size_t blocks = size_t(capacity_tokens / ratio + 1);
    r.scores.reserve(blocks);
    r.selected.reserve(blocks);
    r.top.reserve(blocks);
  }
  return r;
}

// Chooses the tokens a QSA query at position `pos` attends to (ascending).
void select_tokens(RowScratch& scratch, const AttentionWeights& w, const AttentionDims& dims,
                   const Shape& shape, const KvCache& cache, const float* index_q, int64_t pos) {
  std::vector<int64_t>& tokens = scratch.tokens;
  tokens.clear();
  const int ratio = w.compress_ratio;
  const int64_t n_visible = pos + 1;
  const int64_t n_blocks = n_visible / ratio;
  const int64_t budget_blocks = dims.indexer_top_k / ratio;
  if (n_blocks <= budget_blocks) {
    for (int64_t t = 0; t < n_visible; ++t) tokens.push_back(t);
    return;
  }
  const float scale = 1.0f / std::sqrt(float(shape.idx_dim));
  std::vector<float>& scores = scratch.scores;
  scores.assign(static_cast<size_t>(n_blocks), 0.0f);
  // Eight blocks at a time, each its own sums in the one-block order (dot from 0 in i order,
  // heads added from 0 in h order): the chains are independent, so they overlap and vectorise
  // (one block at a time was one serial chain of idx_dim adds per head, session 44).
  constexpr int64_t kLanes = 8;
  const int64_t di = shape.idx_dim;
  const float* block_keys = cache.block_keys.data();
  int64_t b = 0;
  for (; b + kLanes <= n_blocks; b += kLanes) {
    float sum[kLanes] = {};
    for (int h = 0; h < shape.idx_heads; ++h) {
      const float* q = index_q + h * di;
      float dot[kLanes] = {};
      for (int64_t i = 0; i < di; ++i)
        for (int64_t l = 0; l < kLanes; ++l) dot[l] += q[i] * block_keys[(b + l) * di + i];
      for (int64_t l = 0; l < kLanes; ++l) sum[l] += std::max(dot[l], 0.0f);
    }
    for (int64_t l = 0; l < kLanes; ++l) scores[size_t(b + l)] = sum[l] * scale;
  }
  for (; b < n_blocks; ++b) {
    const float* key = block_keys + b * di;
    float sum = 0.0f;
    for (int h = 0; h < shape.idx_heads; ++h) {
      const float* q = index_q + h * di;
      float dot = 0.0f;
      for (int64_t i = 0; i < di; ++i) dot += q[i] * key[i];
      sum += std::max(dot, 0.0f);
    }
    scores[size_t(b)] = sum * scale;
  }
  std::vector<int32_t>& selected = scratch.selected;
  selected.assign(static_cast<size_t>(n_blocks), 0);
  std::vector<int64_t>& top = scratch.top;
  torch_cpu_top_k_set(scores, budget_blocks, top);
  for (int64_t b : top) selected[size_t(b)] = 1;
  for (int64_t b = 0; b < n_blocks; ++b)
    if (selected[size_t(b)])
      for (int64_t t = b * ratio; t < (b + 1) * ratio; ++t) tokens.push_back(t);
  for (int64_t t = n_blocks * ratio; t < n_visible; ++t) tokens.push_back(t);
}

// Appends raw indexer keys and computes the keys of blocks completed by them.
void extend_index(compute::Workspace& ws, const AttentionWeights& w, const AttentionDims& dims,
                  const Shape& shape, KvCache& cache, const float* raw_keys, int64_t n_rows) {
  compute::Workspace::Frame frame(ws);
  const int di = shape.idx_dim;
  const int ratio = w.compress_ratio;
  const int64_t first = cache.n_tokens;
  cache.index_k_raw.insert(cache.index_k_raw.end(), raw_keys, raw_keys + n_rows * di);
  const int64_t done_blocks = int64_t(cache.block_keys.size()) / di;
  const int64_t total_blocks = (first + n_rows) / ratio;
  std::vector<float>& key = ws.floats(static_cast<size_t>(di));
  for (int64_t b = done_blocks; b < total_blocks; ++b) {
    for (int i = 0; i < di; ++i) {
      float acc = 0.0f;
      for (int j = 0; j < ratio; ++j) acc += cache.index_k_raw[size_t((b * ratio + j) * di + i)];
      key[size_t(i)] = acc / float(ratio);
    }
    compute::rms_norm(key.data(), w.index_k_norm.data(), di, dims.rms_eps, key.data());
    compute::rope_neox(key.data(), di, dims.n_rot, b * ratio, dims.rope_theta);
    cache.block_keys.insert(cache.block_keys.end(), key.begin(), key.end());
  }
}

// out[j] = Σ_i weights[i]·v_i[j] over the keys of `tokens` (row t of values at values +
// t·stride), from 0 in i order. Four tokens a pass over out: each element's adds stay in token
// order (the same bits as one token a pass), with a quarter of the loads and stores of `out`
// (one token a pass was the largest part of a QSA decode row's core, session 44).
void weighted_values(const float* values, int64_t stride, int hd,
                     const std::vector<int64_t>& tokens, const std::vector<float>& weights,
                     float* out) {
  std::fill_n(out, hd, 0.0f);
  size_t i = 0;
  for (; i + 4 <= tokens.size(); i += 4) {
    const float* v0 = values + tokens[i] * stride;
    const float* v1 = values + tokens[i + 1] * stride;
    const float* v2 = values + tokens[i + 2] * stride;
    const float* v3 = values + tokens[i + 3] * stride;
    const float w0 = weights[i], w1 = weights[i + 1], w2 = weights[i + 2], w3 = weights[i + 3];
    for (int j = 0; j < hd; ++j) {
      float o = out[j];
      o += w0 * v0[j];
      o += w1 * v1[j];
      o += w2 * v2[j];
      o += w3 * v3[j];
      out[j] = o;
    }
  }
  for (; i < tokens.size(); ++i) {
    const float* vt = values + tokens[i] * stride;
    for (int j = 0; j < hd; ++j) out[j] += weights[i] * vt[j];
  }
}

// weights[i] = (Σ_j q[j]·k_i[j], from 0 in j order)·scale for the keys of `tokens` (row t of
// keys at keys + t·stride). Eight tokens at a time, each its own sum in the same order, so the
// bits are the one-chain loop's; the eight chains are independent, so the adds overlap instead
// of waiting on one another (a decode row's scores were one serial chain of head_dim adds per
// token: ~1.3 ms per QSA layer at 512 tokens of context, on one thread per head).
void score_tokens(const float* q, const float* keys, int64_t stride, int hd,
                  const std::vector<int64_t>& tokens, float scale, std::vector<float>& weights) {
  constexpr size_t kLanes = 8;
  size_t i = 0;
  for (; i + kLanes <= tokens.size(); i += kLanes) {
    const float* k[kLanes];
    float dot[kLanes];
    for (size_t l = 0; l < kLanes; ++l) {
      k[l] = keys + tokens[i + l] * stride;
      dot[l] = 0.0f;
    }
    for (int j = 0; j < hd; ++j) {
      const float qj = q[j];
      for (size_t l = 0; l < kLanes; ++l) dot[l] += qj * k[l][j];
    }
    for (size_t l = 0; l < kLanes; ++l) weights[i + l] = dot[l] * scale;
  }
  for (; i < tokens.size(); ++i) {
    const float* k = keys + tokens[i] * stride;
    float dot = 0.0f;
    for (int j = 0; j < hd; ++j) dot += q[j] * k[j];
    weights[i] = dot * scale;
  }
}

// The inline rule's estimate (compute/cpu/work_estimate.h) of attention_core's hand-out, 0 on a
// pool without the rule: per row, every head's scores and value sums over the tokens it attends
// (a sparse layer: at most its budget and the partial block) and the indexer's block scores, at
// the rate of the layers' plain f32 loops.
double attention_work_ns(const compute::ThreadPool& pool, const AttentionWeights& w,
                         const AttentionDims& dims, const Shape& shape, int64_t first_pos,
                         int64_t n_rows) {
  if (pool.inline_work_ns() <= 0) return 0;
  int64_t multiply_adds = 0;
  for (int64_t t = 0; t < n_rows; ++t) {
    const int64_t visible = first_pos + t + 1;
    const int64_t attended =
        w.sparse() ? std::min(visible, int64_t(dims.indexer_top_k) + w.compress_ratio) : visible;
    multiply_adds += int64_t(shape.n_head) * attended * 2 * shape.head_dim;
    if (w.sparse()) multiply_adds += visible / w.compress_ratio * shape.idx_heads * shape.idx_dim;
  }
  return compute::f32_loop_work_ns(multiply_adds);
}

// Windows of at least this many rows (prefill, as for Gated DeltaNet's chunked form) attend
// through matrix products over a transposed copy of the keys (below); shorter ones (decode,
// speculative verify) with one dot per (head, token). Both compute every score and every output
// element in the same order, so a row's bits do not depend on the path. The copy grows with the
// context, so short windows stay off it: steady decode and verify windows allocate nothing.
constexpr int64_t kMatrixAttentionMinRows = 32;

// Attention of one row over all of its first n_visible tokens (0 .. n_visible-1), the query heads
// of each KV head at once, as compute::gemm_f32 products whose per-element order is the one-dot
// path's: score = (Σ_j q_j·k_j from 0, in j order)·scale, out_j = Σ_i w_i·v_ij from 0 in i order.
// keys_t: per KV head, head_dim rows of the window's keys transposed (row j holds dimension j of
// every token, keys_t_stride floats apart).
void attend_all_visible(const Shape& shape, bool gated, const float* q_row, const float* keys_t,
                        int64_t keys_t_stride, const KvCache& cache, int64_t n_visible, float scale,
                        std::vector<float>& weights, float* out_row) {
  const int hd = shape.head_dim;
  const int heads_per_kv = shape.n_head / shape.n_head_kv;
  const int q_stride = gated ? 2 * hd : hd;
  weights.resize(size_t(heads_per_kv) * size_t(n_visible));
  for (int kvh = 0; kvh < shape.n_head_kv; ++kvh) {
    const int h0 = kvh * heads_per_kv;
    const float* q0 = q_row + h0 * q_stride;
    compute::gemm_f32(heads_per_kv, n_visible, hd, q0, q_stride,
                      keys_t + int64_t(kvh) * hd * keys_t_stride, keys_t_stride, weights.data(),
                      n_visible, false);
    for (int g = 0; g < heads_per_kv; ++g) {
      float* w = weights.data() + int64_t(g) * n_visible;
      for (int64_t i = 0; i < n_visible; ++i) w[i] = w[i] * scale;
      compute::softmax(w, n_visible);
    }
    float* out = out_row + int64_t(h0) * hd;
    compute::gemm_f32(heads_per_kv, hd, n_visible, weights.data(), n_visible,
                      cache.v.data() + int64_t(kvh) * hd, shape.kv_dim, out, hd, false);
    if (gated)
      for (int g = 0; g < heads_per_kv; ++g) {
        const float* gate = q0 + g * q_stride + hd;
        float* o = out + int64_t(g) * hd;
        compute::mul_sigmoid(o, gate, hd);
      }
  }
}

}  // namespace

void KvCache::clear() {
  n_tokens = 0;
  k.clear();
  v.clear();
  index_k_raw.clear();
  block_keys.clear();
}

void KvCache::reserve(int64_t n, int64_t kv_dim, int index_dim, int compress_ratio) {
  k.reserve(static_cast<size_t>(n * kv_dim));
  v.reserve(static_cast<size_t>(n * kv_dim));
  if (compress_ratio > 0) {
    index_k_raw.reserve(static_cast<size_t>(n * index_dim));
    block_keys.reserve(static_cast<size_t>(n / compress_ratio * index_dim));
  }
}

void KvCache::truncate(int64_t n, int64_t kv_dim, int index_dim, int compress_ratio) {
  if (n >= n_tokens) return;
  n_tokens = n;
  k.resize(static_cast<size_t>(n * kv_dim));
  v.resize(static_cast<size_t>(n * kv_dim));
  if (compress_ratio > 0) {
    index_k_raw.resize(static_cast<size_t>(n * index_dim));
    block_keys.resize(static_cast<size_t>(n / compress_ratio * index_dim));
  }
}

namespace {

// Everything of one sequence's n_rows rows that depends on its cache and positions: q/k norms
// and RoPE, the KV (and QSA index) append, token selection and attention, into attn
// [n][n_head·head_dim]. q, k, v, index_q, raw: its rows of the projections (modified in place).
void attention_core(compute::ThreadPool& pool, compute::Workspace& ws, const AttentionDims& dims,
                    const AttentionWeights& w, const Shape& shape, KvCache& cache, float* q,
                    float* k, const float* v, float* index_q, const float* raw, int64_t n_rows,
                    float* attn, bool time_parts) {
  compute::Workspace::Frame frame(ws);
  const int hd = shape.head_dim;
  const int64_t first_pos = cache.n_tokens;
  const int q_stride = w.gated ? 2 * hd : hd;  // per head: [q | gate] when gated
  // Timed on the window thread only (a batched window runs this inside pool tasks).
  std::optional<ScopedPart> part;
  if (time_parts) part.emplace(Part::AttnPrep);
  // The rotation of a row's position once for all its heads (q, k and the indexer's q share
  // n_rot and theta): rope_neox is rope_cos_sin then rope_neox_apply, so the same bits, without
  // ~15 sets of pow/cos/sin per decode row (~50 µs of a QSA layer's step, on one thread).
  if (shape.n_rot / 2 > kMaxRopeHalf)
    fail("attention: n_rot {} above the supported {}", shape.n_rot, 2 * kMaxRopeHalf);
  compute::parallel_rows(pool, n_rows, [&](int64_t begin, int64_t end, int) {
    std::array<float, kMaxRopeHalf> cos_values, sin_values;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = first_pos + t;
      compute::rope_cos_sin(shape.n_rot, pos, dims.rope_theta, cos_values.data(),
                            sin_values.data());
      auto rotate = [&](float* x, int dim) {
        compute::rope_neox_apply(x, dim, shape.n_rot, cos_values.data(), sin_values.data());
      };
      for (int h = 0; h < shape.n_head; ++h) {
        float* qh = q + t * shape.q_row + h * q_stride;
        if (!w.q_norm.empty()) compute::rms_norm(qh, w.q_norm.data(), hd, dims.rms_eps, qh);
        rotate(qh, hd);
      }
      for (int h = 0; h < shape.n_head_kv; ++h) {
        float* kh = k + t * shape.kv_dim + h * hd;
        if (!w.k_norm.empty()) compute::rms_norm(kh, w.k_norm.data(), hd, dims.rms_eps, kh);
        rotate(kh, hd);
      }
      if (!w.sparse()) continue;
      for (int h = 0; h < shape.idx_heads; ++h) {
        float* qh = index_q + (t * shape.idx_heads + h) * shape.idx_dim;
        compute::rms_norm(qh, w.index_q_norm.data(), shape.idx_dim, dims.rms_eps, qh);
        rotate(qh, shape.idx_dim);
      }
    }
  });
  cache.k.insert(cache.k.end(), k, k + n_rows * shape.kv_dim);
  cache.v.insert(cache.v.end(), v, v + n_rows * shape.kv_dim);

  if (w.sparse()) extend_index(ws, w, dims, shape, cache, raw, n_rows);
  cache.n_tokens += n_rows;
  if (time_parts) part.emplace(Part::AttnCore);

  // Attention per (row, head); every pair is independent, so the split across threads cannot
  // change any result.
  const int64_t attn_width = int64_t(shape.n_head) * hd;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int heads_per_kv = shape.n_head / shape.n_head_kv;
  const int64_t capacity_tokens =
      std::max(int64_t(cache.k.capacity()) / shape.kv_dim, first_pos + n_rows);
  const int ratio = w.sparse() ? w.compress_ratio : 0;
  // The matrix path's transposed keys: [kv head][dimension][token], tokens 0 .. n_ctx-1.
  const bool matrix_path = n_rows >= kMatrixAttentionMinRows;
  const int64_t n_ctx = first_pos + n_rows;
  std::vector<float>& keys_t =
      ws.floats(matrix_path ? static_cast<size_t>(n_ctx * shape.kv_dim) : 0);
  if (matrix_path)
    for (int64_t i = 0; i < n_ctx; ++i) {
      const float* key = cache.k.data() + i * shape.kv_dim;
      for (int64_t d = 0; d < shape.kv_dim; ++d) keys_t[size_t(d * n_ctx + i)] = key[d];
    }
  ws.reserve_threads(pool.size());
  for (int i = 0; i < pool.size(); ++i) {
    compute::Workspace::Frame reserve_frame(ws.for_thread(i));
    take_row_scratch(ws.for_thread(i), capacity_tokens, ratio, heads_per_kv);
  }
  // Short windows (decode) split each row's heads over the threads too: a decode step is one row,
  // and its heads were one thread's work. A task is (row, head) there, a row in the matrix path;
  // a task selects its row's tokens itself (the same deterministic set for every head).
  const int64_t heads_per_task = matrix_path ? shape.n_head : 1;
  const int64_t tasks_per_row = shape.n_head / heads_per_task;
  const int64_t n_tasks = n_rows * tasks_per_row;
  const double work_ns = attention_work_ns(pool, w, dims, shape, first_pos, n_rows);
  pool.parallel_for(n_tasks, work_ns, [&](int64_t begin, int64_t end, int thread_index) {
    compute::Workspace& tw = ws.for_thread(thread_index);
    compute::Workspace::Frame task_frame(tw);
    RowScratch scratch = take_row_scratch(tw, capacity_tokens, ratio, heads_per_kv);
    std::vector<int64_t>& tokens = scratch.tokens;
    std::vector<float>& weights = scratch.weights;
    int64_t selected_row = -1;  // the row `tokens` holds
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / tasks_per_row;
      const int h_begin = int((task % tasks_per_row) * heads_per_task);
      const int h_end = int(h_begin + heads_per_task);
      const int64_t pos = first_pos + t;
      if (selected_row != t) {
        if (w.sparse()) {
          select_tokens(scratch, w, dims, shape, cache,
                        index_q + t * shape.idx_heads * shape.idx_dim, pos);
        } else {
          tokens.resize(static_cast<size_t>(pos + 1));
          std::iota(tokens.begin(), tokens.end(), int64_t{0});
        }
        selected_row = t;
      }
      // Every visible token selected (dense attention, or QSA within its budget): the matrix path.
      if (matrix_path && int64_t(tokens.size()) == pos + 1) {
        attend_all_visible(shape, w.gated, q + t * shape.q_row, keys_t.data(), n_ctx, cache,
                           pos + 1, scale, weights, attn + t * attn_width);
        continue;
      }
      weights.resize(tokens.size());
      for (int h = h_begin; h < h_end; ++h) {
        const float* qh = q + t * shape.q_row + h * q_stride;
        const int kvh = h / heads_per_kv;
        score_tokens(qh, cache.k.data() + kvh * hd, shape.kv_dim, hd, tokens, scale, weights);
        compute::softmax(weights.data(), int64_t(weights.size()));
        float* out = attn + t * attn_width + h * hd;
        weighted_values(cache.v.data() + kvh * hd, shape.kv_dim, hd, tokens, weights, out);
        if (w.gated) {
          const float* gate = qh + hd;
          compute::mul_sigmoid(out, gate, hd);
        }
      }
    }
  });
}

// The layer over a window whose rows segments[s] belong to caches[s]: the projections over all
// rows at once, the core per sequence, the output projection over all rows (row-wise: window
// identity), so each sequence gets the bits it gets alone.
void attention_rows(compute::ThreadPool& pool, compute::Workspace& ws, const AttentionDims& dims,
                    const AttentionWeights& w, std::span<KvCache* const> caches,
                    std::span<const compute::RowSegment> segments, const float* x, int64_t n_rows,
                    float* y) {
  compute::Workspace::Frame frame(ws);
  Shape shape{dims.n_head,
              dims.n_head_kv,
              dims.head_dim,
              dims.n_rot,
              int64_t(dims.n_head) * dims.head_dim * (w.gated ? 2 : 1),
              dims.kv_dim(),
              dims.indexer_n_head,
              dims.indexer_head_dim};
  const int hd = shape.head_dim;

  std::vector<float>& q = ws.floats(static_cast<size_t>(n_rows * shape.q_row));
  std::vector<float>& k = ws.floats(static_cast<size_t>(n_rows * shape.kv_dim));
  std::vector<float>& v = ws.floats(static_cast<size_t>(n_rows * shape.kv_dim));
  std::vector<float>& index_q = ws.floats(0);
  std::vector<float>& raw = ws.floats(0);
  const int64_t idx_row = int64_t(shape.idx_heads) * shape.idx_dim;
  if (w.sparse()) {
    index_q.resize(static_cast<size_t>(n_rows * idx_row));
    raw.resize(static_cast<size_t>(n_rows * shape.idx_dim));
  }
  // Every projection of rows [first, first + n) in one call (x converted once per activation
  // format, one wait).
  auto project = [&](int64_t first, int64_t n) {
    const float* xr = x + first * w.q.n_in;
    if (w.sparse()) {
      const compute::MatmulProduct projections[] = {
          {&w.q, q.data() + first * shape.q_row},
          {&w.k, k.data() + first * shape.kv_dim},
          {&w.v, v.data() + first * shape.kv_dim},
          {&w.index_q, index_q.data() + first * idx_row},
          {&w.index_k, raw.data() + first * shape.idx_dim}};
      compute::matmul_many(pool, projections, xr, n);
    } else {
      const compute::MatmulProduct projections[] = {{&w.q, q.data() + first * shape.q_row},
                                                    {&w.k, k.data() + first * shape.kv_dim},
                                                    {&w.v, v.data() + first * shape.kv_dim}};
      compute::matmul_many(pool, projections, xr, n);
    }
  };
  const int64_t attn_width = int64_t(shape.n_head) * hd;
  std::vector<float>& attn = ws.floats(static_cast<size_t>(n_rows * attn_width));
  auto core = [&](compute::Workspace& core_ws, size_t s, bool time_parts) {
    const int64_t first = segments[s].first_row;
    attention_core(pool, core_ws, dims, w, shape, *caches[s], q.data() + first * shape.q_row,
                   k.data() + first * shape.kv_dim, v.data() + first * shape.kv_dim,
                   w.sparse() ? index_q.data() + first * idx_row : nullptr,
                   w.sparse() ? raw.data() + first * shape.idx_dim : nullptr, segments[s].n_rows,
                   attn.data() + first * attn_width, time_parts);
  };
  const int64_t n_out = w.o.n_out;

  // A batched decode step of a few rows per thread goes by row slices (compute/cpu/row_slices.h):
  // each thread takes the whole sequences of its slice through the projections, the core and the
  // output projection, one hand-out instead of three, its rows' data staying on its core (the
  // parts time the window thread's slice).
  if (compute::takes_sequence_slices(pool, segments, n_rows)) {
    ws.reserve_threads(pool.size());
    compute::for_each_sequence_slice(pool, segments, n_rows, [&](size_t s_first, size_t s_last, int64_t first,
                                                                 int64_t n, int thread) {
      std::optional<ScopedPart> part;
      if (thread == 0) part.emplace(Part::AttnProj);
      project(first, n);
      part.reset();
      for (size_t s = s_first; s < s_last; ++s) core(ws.for_thread(thread), s, thread == 0);
      if (thread == 0) part.emplace(Part::AttnOut);
      compute::matmul(pool, w.o, attn.data() + first * attn_width, n, y + first * n_out);
    });
    return;
  }

  std::optional<ScopedPart> part(std::in_place, Part::AttnProj);
  project(0, n_rows);
  part.reset();
  if (segments.size() == 1) {
    core(ws, 0, true);
  } else {
    // Several sequences side by side, each on its thread's workspace (its own cache and rows;
    // the hand-outs inside a task run inline, so each sequence's work is what it does alone).
    ws.reserve_threads(pool.size());
    ScopedPart core_part(Part::AttnCore);
    pool.parallel_for(int64_t(segments.size()), [&](int64_t begin, int64_t end, int thread) {
      for (int64_t s = begin; s < end; ++s) core(ws.for_thread(thread), size_t(s), false);
    });
  }
  part.emplace(Part::AttnOut);
  compute::matmul(pool, w.o, attn.data(), n_rows, y);
}

}  // namespace

void attention_forward(compute::ThreadPool& pool, compute::Workspace& ws, const AttentionDims& dims,
                       const AttentionWeights& w, KvCache& cache, const float* x, int64_t n_rows,
                       float* y) {
  KvCache* const caches[1] = {&cache};
  const compute::RowSegment rows[1] = {{0, n_rows}};
  attention_rows(pool, ws, dims, w, caches, rows, x, n_rows, y);
}

void attention_forward_rows(compute::ThreadPool& pool, compute::Workspace& ws,
                            const AttentionDims& dims, const AttentionWeights& w,
                            std::span<KvCache* const> caches,
                            std::span<const compute::RowSegment> segments, const float* x,
                            int64_t n_rows, float* y) {
  if (caches.size() != segments.size())
    fail("attention: {} caches for {} row segments", caches.size(), segments.size());
  attention_rows(pool, ws, dims, w, caches, segments, x, n_rows, y);
}

}  // namespace strata
