#include "layers/moe.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>

#include "compute/cpu/ops.h"
#include "compute/cpu/row_slices.h"
#include "quant/quant.h"
#include "route/moce.h"
#include "util/error.h"
#include "util/phase_timer.h"

namespace strata {
namespace {

// g ← silu(g) ⊙ u (row by row), then y = down·g.
void glu_and_down(compute::ThreadPool& pool, const compute::WeightMatrix& down,
                  std::vector<float>& g, const std::vector<float>& u, int64_t n_rows, float* y) {
  const int64_t n_ff = down.n_in;
  compute::parallel_rows(pool, n_rows, [&](int64_t begin, int64_t end, int) {
    compute::silu_mul(g.data() + begin * n_ff, u.data() + begin * n_ff, (end - begin) * n_ff);
  });
  compute::matmul(pool, down, g.data(), n_rows, y);
}

// y[rows x n_out] = down(silu(gate·x) ⊙ up·x) for a SwiGLU over n_rows rows of x. The scratch is
// reserved for max_rows (>= n_rows): routed experts get a varying share of the window's rows.
void swiglu(compute::ThreadPool& pool, compute::Workspace& ws, const compute::WeightMatrix& gate,
            const compute::WeightMatrix& up, const compute::WeightMatrix& down, const float* x,
            int64_t n_rows, int64_t max_rows, float* y) {
  compute::Workspace::Frame frame(ws);
  const int64_t n_ff = gate.n_out;
  std::vector<float>& g = ws.scratch_floats(static_cast<size_t>(n_rows * n_ff));
  std::vector<float>& u = ws.scratch_floats(static_cast<size_t>(n_rows * n_ff));
  g.reserve(static_cast<size_t>(max_rows * n_ff));
  u.reserve(static_cast<size_t>(max_rows * n_ff));
  const compute::MatmulProduct gate_up[] = {{&gate, g.data()}, {&up, u.data()}};
  compute::matmul_many(pool, gate_up, x, n_rows);
  glu_and_down(pool, down, g, u, n_rows, y);
}

// The routed form: x already converted to the gate and up weights' activation format.
void swiglu(compute::ThreadPool& pool, compute::Workspace& ws, const compute::WeightMatrix& gate,
            const compute::WeightMatrix& up, const compute::WeightMatrix& down,
            const compute::ActivationRows& x, int64_t max_rows, float* y) {
  compute::Workspace::Frame frame(ws);
  const int64_t n_ff = gate.n_out, n_rows = x.n_rows;
  std::vector<float>& g = ws.scratch_floats(static_cast<size_t>(n_rows * n_ff));
  std::vector<float>& u = ws.scratch_floats(static_cast<size_t>(n_rows * n_ff));
  g.reserve(static_cast<size_t>(max_rows * n_ff));
  u.reserve(static_cast<size_t>(max_rows * n_ff));
  const compute::MatmulProduct gate_up[] = {{&gate, g.data()}, {&up, u.data()}};
  compute::matmul_rows(pool, gate_up, x);
  glu_and_down(pool, down, g, u, n_rows, y);
}

// A Routing whose vectors are the workspace's for the scope (so building one allocates nothing).
class LentRouting {
 public:
  explicit LentRouting(compute::Workspace& ws) : experts_(ws.ids(0)), weights_(ws.floats(0)) {
    routing.experts.swap(experts_);
    routing.weights.swap(weights_);
  }
  ~LentRouting() {
    routing.experts.swap(experts_);
    routing.weights.swap(weights_);
  }
  LentRouting(const LentRouting&) = delete;
  LentRouting& operator=(const LentRouting&) = delete;
  Routing routing;

 private:
  std::vector<int32_t>& experts_;
  std::vector<float>& weights_;
};

}  // namespace

namespace {

// moe_route after the router's matmul: `probs` holds the n_rows rows of router logits (and is
// overwritten by their softmax).
void route_logits(compute::Workspace& ws, const MoeDims& dims, std::vector<float>& probs,
                  int64_t n_rows, Routing& routing, ExpertSource* cache_aware, int layer,
                  Routing* exact, bool count_stats) {
  compute::Workspace::Frame frame(ws);
  const int n_expert = dims.n_expert, k = dims.n_expert_used;
  MocePolicy* moce = cache_aware ? cache_aware->moce() : nullptr;
  if (moce && !moce->options.enabled()) moce = nullptr;
  auto shape = [&](Routing& r) {
    r.k = k;
    r.experts.resize(static_cast<size_t>(n_rows * k));
    r.weights.resize(static_cast<size_t>(n_rows * k));
  };
  shape(routing);
  if (exact) shape(*exact);
  std::vector<int32_t>& picked = ws.ids(static_cast<size_t>(k));
  std::vector<int32_t>& scratch = ws.ids(0);
  // Two references: small enough for std::function's inline storage (no allocation).
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

}  // namespace

void moe_route(compute::ThreadPool& pool, compute::Workspace& ws, const MoeDims& dims,
               const MoeWeights& w, const float* x, int64_t n_rows, Routing& routing,
               ExpertSource* cache_aware, int layer, Routing* exact, bool count_stats) {
  compute::Workspace::Frame frame(ws);
  std::vector<float>& probs = ws.scratch_floats(static_cast<size_t>(n_rows * dims.n_expert));
  compute::matmul(pool, w.router, x, n_rows, probs.data());
  route_logits(ws, dims, probs, n_rows, routing, cache_aware, layer, exact, count_stats);
}

void moe_predict(compute::ThreadPool& pool, compute::Workspace& ws, const MoeDims& dims,
                 const MoeWeights& next_router, const float* x, int64_t n_rows,
                 std::vector<int32_t>& ids, ExpertSource* source, int next_layer) {
  compute::Workspace::Frame frame(ws);
  LentRouting lent(ws);
  Routing& guess = lent.routing;
  moe_route(pool, ws, dims, next_router, x, n_rows, guess, source, next_layer);
  // Best routing weight per expert over the rows (renormalised weights rank like probabilities
  // within a row; across rows they are comparable enough for an ordering hint). Indexed by expert
  // id: this runs every layer, so no search per entry.
  std::vector<float>& best = ws.floats(static_cast<size_t>(dims.n_expert));
  std::fill(best.begin(), best.end(), -1.0f);
  for (size_t i = 0; i < guess.experts.size(); ++i)
    best[size_t(guess.experts[i])] = std::max(best[size_t(guess.experts[i])], guess.weights[i]);
  ids.clear();
  for (int32_t e = 0; e < dims.n_expert; ++e)
    if (best[size_t(e)] >= 0.0f) ids.push_back(e);
  // Descending weight, ties by lower id: the order a stable sort of the ascending ids gives, with
  // no temporary buffer (std::stable_sort allocates one).
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return best[size_t(a)] > best[size_t(b)] || (best[size_t(a)] == best[size_t(b)] && a < b);
  });
}

namespace {

// A window's routing grouped by expert: the sorted union, and per expert its rows and weights in
// row order (expert i's entries are [offsets[i], offsets[i+1]) of rows/weights). by_row is the
// inverse, for the combine: row t's k entries are by_row[t·k, (t+1)·k), ascending (so in
// ascending expert id). All five are workspace vectors.
struct ExpertRows {
  std::vector<int32_t>* used;
  std::vector<int64_t>* offsets;  // [used + 1]
  std::vector<int64_t>* rows;
  std::vector<float>* weights;
  std::vector<int64_t>* by_row;  // [n_rows · k]
  int k = 0;
  int64_t count(size_t e) const { return (*offsets)[e + 1] - (*offsets)[e]; }
};

ExpertRows group_by_expert(compute::Workspace& ws, const Routing& routing) {
  ExpertRows g{&ws.ids(0), nullptr, nullptr, nullptr, nullptr, routing.k};
  std::vector<int32_t>& used = *g.used;
  used.assign(routing.experts.begin(), routing.experts.end());
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  g.offsets = &ws.ints(used.size() + 1);
  g.rows = &ws.ints(routing.experts.size());
  g.weights = &ws.floats(routing.experts.size());
  g.by_row = &ws.ints(routing.experts.size());
  std::vector<int64_t>& cursor = ws.ints(used.size());
  const int k = routing.k;
  auto index_of = [&](int32_t expert) {
    return size_t(std::lower_bound(used.begin(), used.end(), expert) - used.begin());
  };
  for (int32_t expert : routing.experts) ++(*g.offsets)[index_of(expert) + 1];
  for (size_t e = 0; e < used.size(); ++e) {
    (*g.offsets)[e + 1] += (*g.offsets)[e];
    cursor[e] = (*g.offsets)[e];
  }
  for (int64_t t = 0; t < routing.n_rows(); ++t) {
    int64_t* row_entries = g.by_row->data() + t * k;
    for (int j = 0; j < k; ++j) {
      const size_t e = index_of(routing.experts[size_t(t * k + j)]);
      const size_t at = size_t(cursor[e]++);
      (*g.rows)[at] = t;
      (*g.weights)[at] = routing.weights[size_t(t * k + j)];
      row_entries[j] = int64_t(at);
    }
    // A row's experts in ascending id (a routing row need not be sorted: MoCE's is not).
    std::sort(row_entries, row_entries + k);
  }
  return g;
}

// The window's rows in an expert's gate/up activation format, converted once for all experts
// (not once per expert and projection: every row goes to k experts) at the first expert that
// takes it; each expert gets its rows gathered from there. Bytes held in a float vector of the
// workspace.
struct ConvertedRows {
  std::vector<float>* store = nullptr;
  compute::ActivationRows rows;
  bool valid = false;
};

bool takes_shared_format(const ExpertMatrices& m, int64_t n_embd) {
  return quant::activation_type(m.gate.type) == quant::activation_type(m.up.type) &&
         m.gate.n_in == n_embd && m.up.n_in == n_embd;
}

void convert_rows_once(compute::ThreadPool& pool, const ExpertMatrices& m, int64_t n_embd,
                       const float* x, int64_t n_rows, ConvertedRows& converted) {
  if (converted.valid || !takes_shared_format(m, n_embd)) return;
  const size_t stride = compute::activation_row_stride(m.gate.type, n_embd);
  converted.store->resize((size_t(n_rows) * stride + sizeof(float) - 1) / sizeof(float));
  converted.rows = compute::quantize_activation_rows(
      pool, m.gate.type, x, n_rows, n_embd, reinterpret_cast<std::byte*>(converted.store->data()));
  converted.valid = true;
}

// Expert e of the union over its rows into rows [offsets[e], offsets[e+1]) of `outputs`:
// from the converted rows when the expert takes their format, else from its rows of x. Scratch
// from `ws` (the caller's, or the running thread's inside a task).
void run_expert(compute::ThreadPool& pool, compute::Workspace& ws, int64_t n_embd,
                const ExpertRows& g, size_t e, const ExpertMatrices& m,
                const ConvertedRows& converted, const float* x, int64_t n_rows, float* outputs) {
  compute::Workspace::Frame frame(ws);
  const int64_t n = g.count(e);
  const int64_t first = (*g.offsets)[e];
  if (converted.valid && takes_shared_format(m, n_embd) &&
      converted.rows.activation_type == quant::activation_type(m.gate.type)) {
    const size_t stride = converted.rows.row_stride_bytes;
    std::vector<float>& gathered_store = ws.floats(0);
    gathered_store.reserve(converted.store->size());
    gathered_store.resize((size_t(n) * stride + sizeof(float) - 1) / sizeof(float));
    auto* gathered = reinterpret_cast<std::byte*>(gathered_store.data());
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(gathered + size_t(i) * stride,
                  converted.rows.data + size_t((*g.rows)[size_t(first + i)]) * stride, stride);
    const compute::ActivationRows rows{converted.rows.activation_type, n_embd, n, gathered, stride};
    swiglu(pool, ws, m.gate, m.up, m.down, rows, n_rows, outputs + first * n_embd);
    return;
  }
  std::vector<float>& rows_in = ws.floats(0);
  rows_in.reserve(static_cast<size_t>(n_rows * n_embd));
  rows_in.resize(static_cast<size_t>(n * n_embd));
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(x + (*g.rows)[size_t(first + i)] * n_embd, n_embd, rows_in.data() + i * n_embd);
  swiglu(pool, ws, m.gate, m.up, m.down, rows_in.data(), n, n_rows, outputs + first * n_embd);
}

// The buffers the experts of a window share when several run side by side (run_batch_side_by_side):
// for every routed (row, expert) pair, at the rows [offsets[e], offsets[e+1]) of each, as
// `outputs`. Taken once per layer, right after the first batch tells the formats, so how many
// workspace vectors a layer takes, and their sizes, depend on the routing only, never on how the
// source batched its deliveries.
struct SideBySideScratch {
  bool taken = false;
  std::byte* gathered = nullptr;   // the converted input rows, gathered per expert
  std::byte* down_rows = nullptr;  // silu(g)⊙u converted to the down weights' format
  float* gate_out = nullptr;
  float* up_out = nullptr;
  int32_t* by_rows = nullptr;  // a batch's task order
  size_t in_stride = 0, down_stride = 0;
  int64_t n_ff = 0;
};

void take_side_by_side_scratch(compute::Workspace& ws, const ExpertRows& g,
                               const ConvertedRows& converted, const ExpertMatrices& first,
                               SideBySideScratch& s) {
  s.taken = true;
  s.n_ff = first.gate.n_out;
  const size_t total_rows = g.rows->size();
  s.in_stride = converted.rows.row_stride_bytes;
  s.down_stride = compute::activation_row_stride(first.down.type, s.n_ff);
  auto bytes_as_floats = [](size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); };
  auto scratch_bytes = [&](size_t bytes) {
    return reinterpret_cast<std::byte*>(ws.scratch_floats(bytes_as_floats(bytes)).data());
  };
  s.gathered = scratch_bytes(total_rows * s.in_stride);
  s.down_rows = scratch_bytes(total_rows * s.down_stride);
  s.gate_out = ws.scratch_floats(total_rows * size_t(s.n_ff)).data();
  s.up_out = ws.scratch_floats(total_rows * size_t(s.n_ff)).data();
  s.by_rows = ws.ids(g.used->size()).data();
}

// Whether the experts of a batch can run side by side over the shared scratch: every one takes
// the converted rows and has the first expert's formats and shapes (true of every model here).
bool uniform_batch(std::span<const DeliveredExpert> batch, const ExpertMatrices& first,
                   const ConvertedRows& converted, int64_t n_embd) {
  if (!converted.valid ||
      converted.rows.activation_type != quant::activation_type(first.gate.type) ||
      quant::activation_type(first.down.type) == GgmlType::F32 ||
      first.up.n_out != first.gate.n_out || first.down.n_in != first.gate.n_out)
    return false;
  for (const DeliveredExpert& d : batch) {
    const ExpertMatrices& m = d.matrices;
    if (m.gate.type != first.gate.type || m.up.type != first.up.type ||
        m.down.type != first.down.type || m.gate.n_out != first.gate.n_out ||
        m.up.n_out != first.up.n_out || m.down.n_in != first.down.n_in || m.gate.n_in != n_embd ||
        m.up.n_in != n_embd)
      return false;
  }
  return true;
}

// Gathers expert d's rows of the converted window into the side-by-side scratch and returns them.
compute::ActivationRows gather_rows(const ExpertRows& g, const DeliveredExpert& d,
                                    const ConvertedRows& converted, const SideBySideScratch& s,
                                    int64_t n_embd) {
  const int64_t n = g.count(size_t(d.index)), row0 = (*g.offsets)[size_t(d.index)];
  std::byte* rows_in = s.gathered + size_t(row0) * s.in_stride;
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(rows_in + size_t(r) * s.in_stride,
                converted.rows.data + size_t((*g.rows)[size_t(row0 + r)]) * s.in_stride,
                s.in_stride);
  return compute::ActivationRows{converted.rows.activation_type, n_embd, n, rows_in, s.in_stride};
}

// The experts of one batch side by side on the pool's threads, each its own task: gate and up
// over its gathered converted rows, silu(g)⊙u, that converted to the down weights' format, down.
// A task allocates nothing and uses no thread's workspace or scratch. Bitwise run_expert's result
// (matmul_rows gives matmul's bits on the converted rows).
void run_batch_side_by_side(compute::ThreadPool& pool, int64_t n_embd, const ExpertRows& g,
                            std::span<const DeliveredExpert> batch, const ConvertedRows& converted,
                            const SideBySideScratch& s, float* outputs) {
  const int64_t n_ff = s.n_ff;
  // Largest expert first (longest processing time first): the threads finish together, and no
  // thread is left with a chunk of big experts at the end.
  int32_t* by_rows = s.by_rows;
  for (size_t i = 0; i < batch.size(); ++i) by_rows[i] = int32_t(i);
  std::sort(by_rows, by_rows + batch.size(), [&](int32_t a, int32_t b) {
    const int64_t rows_a = g.count(size_t(batch[size_t(a)].index));
    const int64_t rows_b = g.count(size_t(batch[size_t(b)].index));
    return rows_a > rows_b || (rows_a == rows_b && a < b);
  });
  pool.parallel_for_each_task(int64_t(batch.size()), [&](int64_t begin, int64_t end, int) {
    for (int64_t task = begin; task < end; ++task) {
      const DeliveredExpert& d = batch[size_t(by_rows[task])];
      const ExpertMatrices& m = d.matrices;
      const size_t e = size_t(d.index);
      const int64_t n = g.count(e), row0 = (*g.offsets)[e];
      float* gate_rows = s.gate_out + row0 * n_ff;
      const float* up_rows = s.up_out + row0 * n_ff;
      const compute::MatmulProduct gate_up[] = {{&m.gate, gate_rows},
                                                {&m.up, s.up_out + row0 * n_ff}};
      compute::matmul_rows(pool, gate_up, gather_rows(g, d, converted, s, n_embd));
      compute::silu_mul(gate_rows, up_rows, n * n_ff);
      const compute::ActivationRows down_in = compute::quantize_activation_rows(
          pool, m.down.type, gate_rows, n, n_ff, s.down_rows + size_t(row0) * s.down_stride);
      const compute::MatmulProduct down[] = {{&m.down, outputs + row0 * n_embd}};
      compute::matmul_rows(pool, down, down_in);
    }
  });
}

// The experts of one batch of a window of a few rows (decode, short verify windows) in two
// hand-outs for the whole batch rather than two per expert: the gate and up tiles of every expert
// in one (compute::matmul_rows_each), silu(g)⊙u converted to the down weights' format on the
// calling thread (a row of n_ff values per routed row), then every expert's down tiles in one.
// Each expert's tiles spread over all threads, so 8 experts of one row keep 16 threads busy.
// Bitwise run_expert's result (the same products, conversions and order per expert).
// extra_down (the shared expert's down, when given) joins the first hand-out of downs and is
// then set to nullptr: one hand-out less per layer.
void run_batch_grouped(compute::ThreadPool& pool, int64_t n_embd, const ExpertRows& g,
                       std::span<const DeliveredExpert> batch, const ConvertedRows& converted,
                       const SideBySideScratch& s, float* outputs,
                       const compute::RowsProduct*& extra_down) {
  const int64_t n_ff = s.n_ff;
  constexpr size_t kExpertsPerHandOut = compute::kMaxRowsProducts / 2;
  for (size_t first = 0; first < batch.size(); first += kExpertsPerHandOut) {
    const std::span<const DeliveredExpert> part =
        batch.subspan(first, std::min(kExpertsPerHandOut, batch.size() - first));
    std::array<compute::RowsProduct, compute::kMaxRowsProducts> products;
    size_t n_products = 0;
    for (const DeliveredExpert& d : part) {
      const int64_t row0 = (*g.offsets)[size_t(d.index)];
      const compute::ActivationRows rows = gather_rows(g, d, converted, s, n_embd);
      products[n_products++] = {&d.matrices.gate, s.gate_out + row0 * n_ff, rows};
      products[n_products++] = {&d.matrices.up, s.up_out + row0 * n_ff, rows};
    }
    compute::matmul_rows_each(pool, std::span(products.data(), n_products));
    n_products = 0;
    for (const DeliveredExpert& d : part) {
      const int64_t n = g.count(size_t(d.index)), row0 = (*g.offsets)[size_t(d.index)];
      float* gate_rows = s.gate_out + row0 * n_ff;
      compute::silu_mul(gate_rows, s.up_out + row0 * n_ff, n * n_ff);
      const compute::ActivationRows down_in =
          compute::quantize_activation_rows(pool, d.matrices.down.type, gate_rows, n, n_ff,
                                            s.down_rows + size_t(row0) * s.down_stride);
      products[n_products++] = {&d.matrices.down, outputs + row0 * n_embd, down_in};
    }
    if (extra_down) {
      products[n_products++] = *extra_down;
      extra_down = nullptr;
    }
    compute::matmul_rows_each(pool, std::span(products.data(), n_products));
  }
}

// ---- A batched decode window by row slices (compute/cpu/row_slices.h) ----
// The stages whose work is per row run as one slice of rows per thread, so each row's data stays
// on one core: (1) the router, the shared expert's gate and up, silu(g)⊙u and down; (2) on the
// window thread the routing, publish and wait; (3) the routed experts side by side as in
// run_routed (one task per expert over all its rows: split by rows, a 16-row step's ~21 experts
// of ~3 rows each became ~2× as many products of fewer rows, measured slower); (4) the combine
// (combine_rows, as every window's) and the gated shared expert by the slices of (1). Every
// row's bits are those of the per-product path: each product is per row (window identity), and
// the combine is per row.

// y += σ(w_sg·x)·shared for rows [begin, end) (after the routed sum: the reference's order).
// Each row's gate logit is one chain of adds in column order (the reference's bits), so a row
// alone waits on the add latency; kRows rows' chains side by side overlap. On one Zen 4 thread,
// the mid model's 12 layers of 512 rows took ~7 ms one row at a time, 4-5 ms so (a copy of the
// loop timed alone; what is left is the memory traffic of shared and y).
void add_gated_shared_rows(const MoeWeights& w, int64_t n_embd, const float* x, int64_t begin,
                           int64_t end, const float* shared, float* y) {
  constexpr int64_t kRows = 8;
  const float* gate_inp = w.shared_gate_inp.data();
  // Rows [t, t + count) with count known at compile time (kRows, or 1 for the tail), so the
  // logits stay in registers.
  auto gate_rows = [&](int64_t t, auto count) {
    constexpr int64_t n = decltype(count)::value;
    const float* xt = x + t * n_embd;
    float logit[n] = {};
    for (int64_t c = 0; c < n_embd; ++c)
      for (int64_t r = 0; r < n; ++r) logit[r] += gate_inp[c] * xt[r * n_embd + c];
    for (int64_t r = 0; r < n; ++r) {
      const float gate = compute::sigmoid(logit[r]);
      float* out = y + (t + r) * n_embd;
      const float* in = shared + size_t((t + r) * n_embd);
      for (int64_t c = 0; c < n_embd; ++c) out[c] += gate * in[c];
    }
  };
  int64_t t = begin;
  for (; t + kRows <= end; t += kRows) gate_rows(t, std::integral_constant<int64_t, kRows>{});
  for (; t < end; ++t) gate_rows(t, std::integral_constant<int64_t, 1>{});
}

// y = Σ weight·output over each row's experts, for rows [begin, end): every output element adds
// its experts in ascending id from +0 (the reference's order, so the same bits on any split of
// the rows). Row by row, so each expert's output row streams in whole: a split by columns read
// 256 bytes of every 4 KiB output row per task, latency-bound and slower on 2 threads than on 1
// (docs/bench-cpu-scaling.md, session 53). A block of 32 columns stays in registers across the
// row's experts (GCC/Clang vector extensions, lanes independent: plain C++ over a float[32]
// block compiled to scalar code for a runtime k).
void combine_rows(const ExpertRows& g, int64_t n_embd, const float* outputs, int64_t begin,
                  int64_t end, float* y) {
  typedef float Vec __attribute__((vector_size(16)));
  constexpr int64_t kLanes = 4, kVectors = 8, kBlock = kLanes * kVectors;
  const int k = g.k;
  const float* weights = g.weights->data();
  for (int64_t t = begin; t < end; ++t) {
    const int64_t* entries = g.by_row->data() + t * k;
    float* out = y + t * n_embd;
    int64_t c0 = 0;
    for (; c0 + kBlock <= n_embd; c0 += kBlock) {
      Vec sum[kVectors] = {};
      for (int j = 0; j < k; ++j) {
        const float* src = outputs + entries[j] * n_embd + c0;
        const float weight = weights[entries[j]];
        for (int64_t v = 0; v < kVectors; ++v) {
          Vec x;
          std::memcpy(&x, src + v * kLanes, sizeof x);
          sum[v] = sum[v] + weight * x;
        }
      }
      std::memcpy(out + c0, sum, sizeof sum);
    }
    std::fill(out + c0, out + n_embd, 0.0f);
    for (int j = 0; j < k; ++j) {
      const float* src = outputs + entries[j] * n_embd;
      const float weight = weights[entries[j]];
      for (int64_t c = c0; c < n_embd; ++c) out[c] += weight * src[c];
    }
  }
}

// A row-sliced combine (moe_forward's row slices): the gated shared expert (shared: its output
// rows, nullptr without one) is added in the same hand-out, to the slice's rows.
struct SlicedCombine {
  const MoeWeights* w = nullptr;
  const float* shared = nullptr;
};

// Runs every expert of the published union as the source delivers them (resident first) and
// writes y = Σ over experts in ascending id of weight·output, so neither the delivery order nor
// the batching ever matters. A window of several rows runs a batch of several experts side by
// side on the pool's threads: a decode step of 16 sequences routes to ~20 small experts of ~3
// rows each, too little work per expert to split one across threads. Each expert's rows give the
// same bits on any thread. shared_down (optional) is run with the first grouped batch's downs;
// returns whether it was (false: the caller runs it).
bool run_routed(compute::ThreadPool& pool, compute::Workspace& ws, int64_t n_embd,
                ExpertSource& experts, int layer, const ExpertRows& g, const float* x,
                int64_t n_rows, float* y, const compute::RowsProduct* shared_down = nullptr,
                const SlicedCombine* sliced = nullptr) {
  const compute::RowsProduct* pending_down = shared_down;
  compute::Workspace::Frame frame(ws);
  const std::vector<int32_t>& used = *g.used;
  // Expert e's output rows sit at rows [offsets[e], offsets[e+1]) of `outputs`.
  std::vector<float>& outputs = ws.scratch_floats(g.rows->size() * size_t(n_embd));
  std::vector<int32_t>& handed = ws.ids(used.size());
  ConvertedRows converted{&ws.floats(0)};
  // Several experts at once (needs the shared scratch): side by side, one task each, for windows
  // of several rows; grouped, every expert's tiles in one hand-out, for a few rows.
  const bool several_at_once = pool.size() > 1 && used.size() > 1;
  const bool few_rows = n_rows < compute::kParallelRowsMin;
  SideBySideScratch scratch;
  ExpertMatrices first{};
  while (true) {
    std::span<const DeliveredExpert> batch;
    {
      ScopedPart part(Part::ExpertFetch);
      batch = experts.wait();
    }
    if (batch.empty()) break;
    for (const DeliveredExpert& d : batch) {
      if (d.index < 0 || size_t(d.index) >= used.size() || handed[size_t(d.index)])
        fail("expert source delivered index {} of layer {}'s {} experts twice or out of range",
             d.index, layer, used.size());
      handed[size_t(d.index)] = 1;
    }
    ScopedPart part(Part::RoutedExperts);
    if (!scratch.taken) {
      first = batch.front().matrices;
      convert_rows_once(pool, first, n_embd, x, n_rows, converted);
      if (several_at_once && uniform_batch(std::span(&batch.front(), 1), first, converted, n_embd))
        take_side_by_side_scratch(ws, g, converted, first, scratch);
      else
        scratch.taken = true;  // one expert at a time for this layer (no scratch to take)
    }
    if (scratch.gathered && batch.size() > 1 && uniform_batch(batch, first, converted, n_embd)) {
      if (few_rows)
        run_batch_grouped(pool, n_embd, g, batch, converted, scratch, outputs.data(), pending_down);
      else
        run_batch_side_by_side(pool, n_embd, g, batch, converted, scratch, outputs.data());
      continue;
    }
    // One after the other (a lone expert, a one-row window, or mixed formats no model here has).
    for (const DeliveredExpert& d : batch) {
      convert_rows_once(pool, d.matrices, n_embd, x, n_rows, converted);
      run_expert(pool, ws, n_embd, g, size_t(d.index), d.matrices, converted, x, n_rows,
                 outputs.data());
    }
  }
  for (size_t e = 0; e < used.size(); ++e)
    if (!handed[e] && g.count(e) > 0)
      fail("expert source did not deliver layer {} expert {}", layer, used[e]);
  ScopedPart part(Part::Combine);
  if (sliced) {
    compute::for_each_row_slice(pool, n_rows, [&](int64_t begin, int64_t end, int) {
      combine_rows(g, n_embd, outputs.data(), begin, end, y);
      if (sliced->shared)
        add_gated_shared_rows(*sliced->w, n_embd, x, begin, end, sliced->shared, y);
    });
    return false;
  }
  compute::parallel_rows(pool, n_rows, [&](int64_t begin, int64_t end, int) {
    combine_rows(g, n_embd, outputs.data(), begin, end, y);
  });
  return shared_down != nullptr && pending_down == nullptr;
}

// add_gated_shared_rows over the window, row by row.
void add_gated_shared(compute::ThreadPool& pool, const MoeWeights& w, int64_t n_embd,
                      const float* x, int64_t n_rows, const float* shared, float* y) {
  ScopedPart part(Part::Combine);
  compute::parallel_rows(pool, n_rows, [&](int64_t begin, int64_t end, int) {
    add_gated_shared_rows(w, n_embd, x, begin, end, shared, y);
  });
}

}  // namespace

void moe_forward(compute::ThreadPool& pool, compute::Workspace& ws, const MoeDims& dims,
                 const MoeWeights& w, ExpertSource& experts, int layer, const float* x,
                 int64_t n_rows, float* y, const MoeWeights* next_router) {
  compute::Workspace::Frame frame(ws);
  const int64_t n_embd = dims.n_embd;
  MocePolicy* moce = experts.moce();
  if (moce && !moce->options.enabled()) moce = nullptr;
  // A batched decode step of a few rows per thread (no MoCE: its routing reads the residency)
  // goes by row slices (see "A batched decode window by row slices" above run_routed).
  const bool sliced = !moce && compute::takes_row_slices(pool, n_rows);
  // relMSE samples: every sample_every-th routed window of each layer, exact source permitting.
  const bool sample = moce && moce->exact_source && moce->options.sample_every > 0 &&
                      moce->stats.windows++ % uint64_t(moce->options.sample_every) == 0;
  LentRouting lent_routing(ws), lent_exact(ws);
  Routing &routing = lent_routing.routing, &exact = lent_exact.routing;
  // The router and the shared expert's gate and up read the same rows: one hand-out (x converted
  // once per format, one wait), each product bitwise its own matmul.
  std::vector<float>& probs = ws.scratch_floats(static_cast<size_t>(n_rows * dims.n_expert));
  const int64_t n_ff_shared = w.has_shared() ? w.shared_gate.n_out : 0;
  std::vector<float>& shared_g = ws.scratch_floats(static_cast<size_t>(n_rows * n_ff_shared));
  std::vector<float>& shared_u = ws.scratch_floats(static_cast<size_t>(n_rows * n_ff_shared));
  std::vector<float>& shared =
      ws.scratch_floats(w.has_shared() ? static_cast<size_t>(n_rows * n_embd) : 0);
  {
    ScopedPart part(Part::Router);
    if (sliced) {
      // The shared expert's silu(g)⊙u and down join its gate and up (timed as the router's part).
      const int64_t n_expert = dims.n_expert;
      compute::for_each_row_slice(pool, n_rows, [&](int64_t begin, int64_t end, int) {
        const int64_t n = end - begin;
        float* router_out = probs.data() + begin * n_expert;
        if (!w.has_shared()) {
          compute::matmul(pool, w.router, x + begin * n_embd, n, router_out);
          return;
        }
        float* g = shared_g.data() + begin * n_ff_shared;
        float* u = shared_u.data() + begin * n_ff_shared;
        const compute::MatmulProduct products[] = {
            {&w.router, router_out}, {&w.shared_gate, g}, {&w.shared_up, u}};
        compute::matmul_many(pool, products, x + begin * n_embd, n);
        compute::silu_mul(g, u, n * n_ff_shared);
        compute::matmul(pool, w.shared_down, g, n, shared.data() + begin * n_embd);
      });
    } else if (w.has_shared()) {
      const compute::MatmulProduct products[] = {{&w.router, probs.data()},
                                                 {&w.shared_gate, shared_g.data()},
                                                 {&w.shared_up, shared_u.data()}};
      compute::matmul_many(pool, products, x, n_rows);
    } else {
      compute::matmul(pool, w.router, x, n_rows, probs.data());
    }
    route_logits(ws, dims, probs, n_rows, routing, moce ? &experts : nullptr, layer,
                 sample ? &exact : nullptr, /*count_stats=*/true);
  }
  experts.observe_routing(layer, routing);

  const ExpertRows g = group_by_expert(ws, routing);
  experts.publish(layer, *g.used);
  if (next_router && experts.wants_guess()) {
    ScopedPart part(Part::Router);
    std::vector<int32_t>& predicted = ws.ids(0);
    moe_predict(pool, ws, dims, *next_router, x, n_rows, predicted, &experts, layer + 1);
    experts.publish_guess(layer + 1, predicted);
  }

  // The shared expert first: it needs no routed bytes, so it overlaps the misses' reads. In a
  // window of a few rows on several threads its down joins the routed experts' downs (one
  // hand-out less per layer; bitwise the same: matmul_rows on the converted rows is matmul).
  const bool fuse_shared_down = !sliced && w.has_shared() && n_rows < compute::kParallelRowsMin &&
                                pool.size() > 1 &&
                                quant::activation_type(w.shared_down.type) != GgmlType::F32;
  const size_t shared_stride =
      w.has_shared() ? compute::activation_row_stride(w.shared_down.type, n_ff_shared) : 0;
  auto shared_in_floats = [&](int64_t rows) {
    return (size_t(rows) * shared_stride + sizeof(float) - 1) / sizeof(float);
  };
  std::vector<float>& shared_in =
      ws.scratch_floats(fuse_shared_down ? shared_in_floats(n_rows) : 0);
  // Sized for its largest use at once (a fused window has fewer than kParallelRowsMin rows, so the
  // largest is not the largest window's): a steady state of varying windows allocates nothing.
  shared_in.reserve(shared_in_floats(compute::kParallelRowsMin - 1));
  compute::RowsProduct shared_down;
  if (fuse_shared_down) {
    ScopedPart part(Part::SharedExpert);
    compute::silu_mul(shared_g.data(), shared_u.data(), n_rows * n_ff_shared);
    shared_down = {&w.shared_down, shared.data(),
                   compute::quantize_activation_rows(
                       pool, w.shared_down.type, shared_g.data(), n_rows, n_ff_shared,
                       reinterpret_cast<std::byte*>(shared_in.data()))};
  } else if (w.has_shared() && !sliced) {
    ScopedPart part(Part::SharedExpert);
    glu_and_down(pool, w.shared_down, shared_g, shared_u, n_rows, shared.data());
  }
  // Sliced: the combine adds the gated shared expert to each slice's rows.
  const SlicedCombine sliced_combine{&w, w.has_shared() ? shared.data() : nullptr};
  if (!run_routed(pool, ws, n_embd, experts, layer, g, x, n_rows, y,
                  fuse_shared_down ? &shared_down : nullptr, sliced ? &sliced_combine : nullptr) &&
      fuse_shared_down) {
    ScopedPart part(Part::SharedExpert);
    const compute::MatmulProduct down[] = {{shared_down.w, shared_down.y}};
    compute::matmul_rows(pool, down, shared_down.rows);
  }
  if (w.has_shared() && !sliced) add_gated_shared(pool, w, n_embd, x, n_rows, shared.data(), y);

  if (sample) {
    double err = 0.0, ref = 0.0;
    std::vector<float> y_exact(static_cast<size_t>(n_rows * n_embd));
    if (exact.experts == routing.experts) {
      std::copy_n(y, n_rows * n_embd, y_exact.data());
    } else {
      const ExpertRows ge = group_by_expert(ws, exact);
      moce->exact_source->publish(layer, *ge.used);
      run_routed(pool, ws, n_embd, *moce->exact_source, layer, ge, x, n_rows, y_exact.data());
      if (w.has_shared()) add_gated_shared(pool, w, n_embd, x, n_rows, shared.data(), y_exact.data());
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
