// Backend — the seam between the forward pass (written once per architecture, in src/model/) and
// the hardware that runs it. In the style of ggml's backend interface: a small table of virtual
// functions; the forward never calls a kernel directly.
//
// What a backend is
// - An owner of buffers: `alloc` returns a Tensor handle (shape, dtype, an id into the backend's
//   storage). The caller never sees the storage; the CPU backend keeps host vectors, a GPU backend
//   would keep device memory. Buffers are allocated when a session starts (sized for the largest
//   window it will run) and reused by every window.
// - Weights are the GGUF views (compute::WeightMatrix and the layer weight structs of
//   src/layers/), mapped once at load. The CPU backend reads them in place; a GPU backend uploads
//   each once, keyed by the view's address, before the first window.
// - Sizes are the blocks' own dimension structs (layers/dims.h: AttentionDims, DeltaNetDims,
//   MoeDims, PleDims; ForwardDims for the whole layer sequence), never the model's HParams.
//   Like the weight structs they are only declared here: compute/ sits below layers/ and model/
//   and includes neither (docs/architecture.md, "Layout").
// - A set of ops on handles. Ops never return data to the caller; granularity is chosen so that a
//   GPU can run each as one or a few kernels (the coarse ones — gated_deltanet, attention, ple,
//   moe — are one function on the CPU today and one fused kernel sequence on a GPU).
// - Host-facing points: reading back a tensor at the end of a window (`read`, the window
//   runner's), the routed experts of a layer (inside `moe`: the ExpertSource handshake of
//   experts/expert_source.h — publish the layer's union and the read-ahead guess for the next
//   layer, then wait for the experts as they become resident, the hits first) and the PLE rows
//   (`ple` waits on the PleRowReader the window runner started).
//
// Contract (every backend)
// - Results: the CPU backend is the reference; any backend that claims exactness must give
//   bitwise the CPU backend's logits (tests/compute/recording_backend_test.cpp checks a
//   pass-through backend on every fixture). Row independence (window identity) is each op's
//   promise: row t's outputs never depend on the other rows of the window.
// - n_rows: every op works on rows [0, n_rows) of its tensors; n_rows <= each tensor's max_rows,
//   widths as documented per op (checked by the CPU backend; a mismatch throws strata::Error).
// - Threads: a backend is used by one window thread at a time (`begin_window` binds the host
//   thread pool for the window). Not thread-safe.
// - Errors: strata::Error naming the op and the sizes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "util/error.h"

namespace strata {
struct ForwardDims;
struct AttentionDims;
struct DeltaNetDims;
struct MoeDims;
struct PleDims;
struct HyperConnectionWeights;
struct GatedDeltaNetWeights;
struct GatedDeltaNetState;
struct AttentionWeights;
struct KvCache;
struct MoeWeights;
struct PleWeights;
struct PleState;
class PleRowReader;
class ExpertSource;
}  // namespace strata

namespace strata::compute {

struct WeightMatrix;
class ThreadPool;

enum class DType : uint8_t { F32, I32 };

// A handle to a backend buffer of max_rows x width elements (row-major, rows = window rows).
struct Tensor {
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t id = kNone;
  DType type = DType::F32;
  int64_t max_rows = 0;
  int64_t width = 0;
  bool valid() const { return id != kNone; }
};

// The same buffer seen as rows of `width` values, e.g. a matmul's [n·S][H] output as the [n][S·H]
// streams it is. REQUIRES t.max_rows · t.width to be a multiple of width.
inline Tensor with_width(Tensor t, int64_t width) {
  return Tensor{t.id, t.type, t.max_rows * t.width / width, width};
}

// Rows [first_row, first_row + n_rows) of a window: one sequence's part of a batched window.
struct RowSegment {
  int64_t first_row = 0;
  int64_t n_rows = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // --- buffers ---
  // A new buffer of zeros. REQUIRES max_rows >= 1, width >= 1.
  virtual Tensor alloc(DType type, int64_t max_rows, int64_t width) = 0;
  virtual void release(Tensor t) = 0;
  // Copies rows [first_row, first_row + n_rows) of t to out (n_rows x t.width floats). The only
  // path from a backend buffer to the host; used by the window runner at the end of a window.
  virtual void read(Tensor t, int64_t first_row, int64_t n_rows, float* out) = 0;
  // The other way: rows [first_row, first_row + n_rows) of t from `in` (n_rows x t.width floats).
  virtual void write(Tensor t, int64_t first_row, int64_t n_rows, const float* in) = 0;
  // dst rows [dst_row, dst_row + n_rows) = src rows [src_row, src_row + n_rows); REQUIRES equal
  // widths and types, and src != dst. The batched forward (WindowRunner::run_batch) moves one
  // sequence's rows of a window in and out of the token mixers with it. The default stages the
  // rows through the host (read + write, allocating); a backend may copy in place.
  virtual void copy_rows(Tensor src, int64_t src_row, Tensor dst, int64_t dst_row, int64_t n_rows) {
    std::vector<float> staging(size_t(n_rows * src.width));
    read(src, src_row, n_rows, staging.data());
    write(dst, dst_row, n_rows, staging.data());
  }

  // --- window ---
  // Binds the host threads the backend may use for the next ops (the CPU backend computes on
  // them; a GPU backend may use them for the host side of the handshake).
  virtual void begin_window(ThreadPool& host_pool) = 0;

  // What the window runner knows of the window before its first op (called right after
  // begin_window): a backend may prepare for it, e.g. replay the CUDA graphs recorded for an
  // earlier window of the same shape (compute/cuda/window_graph.h). logit_rows: 0 none, 1 the
  // last row, 2 every row (model/model.h LogitRows). `dims` is the model's (Model::dims()) and
  // lives as long as the model: a backend may keep a pointer to it (CUDA rolls back with it).
  struct WindowShape {
    int64_t n_rows = 0;
    int64_t n_past = 0;  // tokens before the window
    bool record = false;  // the mixers keep what a rollback needs (record_window)
    int logit_rows = 0;
  };
  virtual void describe_window(const ForwardDims& dims, const WindowShape& shape) {
    (void)dims;
    (void)shape;
  }

  // --- ops (rows [0, n_rows) unless stated) ---
  // out[t] = dequantized row tokens[t] of table. out.width = table.n_in; n_rows = tokens.size().
  virtual void embed(const WeightMatrix& table, std::span<const int32_t> tokens, Tensor out) = 0;
  // out[t] = x[t] repeated n_copies times (out.width = n_copies * x.width).
  virtual void repeat(Tensor x, int n_copies, Tensor out, int64_t n_rows) = 0;
  // out[t·S + s] = [a[t] | b[t][s·W, (s+1)·W)] for t < n_rows, s < S = n_streams, W = b.width / S
  // (out.width = a.width + W): the MTP head's eh_proj inputs, each stream's hidden beside the
  // token's embedding. The default stages the rows through the host (allocating).
  virtual void pair_rows(Tensor a, Tensor b, int n_streams, Tensor out, int64_t n_rows) {
    const int64_t w = b.width / n_streams;
    std::vector<float> ha(size_t(n_rows * a.width)), hb(size_t(n_rows * b.width));
    std::vector<float> ho(size_t(n_rows * n_streams * out.width));
    read(a, 0, n_rows, ha.data());
    read(b, 0, n_rows, hb.data());
    pair_rows_host(ha.data(), a.width, hb.data(), w, n_streams, n_rows, ho.data());
    write(out, 0, n_rows * n_streams, ho.data());
  }
  // pair_rows on host rows (the reference, and the CPU backend's).
  static void pair_rows_host(const float* a, int64_t a_width, const float* b, int64_t w,
                             int n_streams, int64_t n_rows, float* out) {
    for (int64_t t = 0; t < n_rows; ++t)
      for (int s = 0; s < n_streams; ++s) {
        float* row = out + (t * n_streams + s) * (a_width + w);
        std::copy_n(a + t * a_width, a_width, row);
        std::copy_n(b + t * n_streams * w + s * w, w, row + a_width);
      }
  }
  // out[t] = RMSNorm(x[t]) * weight (compute::rms_norm); out may be x.
  virtual void rms_norm(Tensor x, std::span<const float> weight, float eps, Tensor out,
                        int64_t n_rows) = 0;
  // acc[t] += y[t].
  virtual void add(Tensor acc, Tensor y, int64_t n_rows) = 0;
  // y[t] = W x[first_row + t] for t < n_rows (compute::matmul); y.width = w.n_out.
  virtual void matmul(const WeightMatrix& w, Tensor x, int64_t first_row, int64_t n_rows,
                      Tensor y) = 0;
  // Index of the largest value of each row of x (compute::argmax) into ids (I32, width 1).
  virtual void argmax(Tensor x, int64_t n_rows, Tensor ids) = 0;

  // Hyper-connections (layers/hyper_connection.h): x = mix(X), inject (when valid) the
  // per-stream injection weights; then X += inject * y.
  virtual void hyper_connection_in(const HyperConnectionWeights& w, int n_streams, float eps,
                                   Tensor X, Tensor x, Tensor inject, int64_t n_rows) = 0;
  virtual void hyper_connection_out(int n_streams, Tensor y, Tensor inject, Tensor X,
                                    int64_t n_rows) = 0;
  // hyper_connection_out, then the next mixer's hyper_connection_in of the updated X (into x and
  // next_inject, which may be `inject`): one op, so that a backend can run both per row in one
  // pass (the CPU backend's row slices). The default makes the two calls.
  virtual void hyper_connection_out_in(int n_streams, Tensor y, Tensor inject, Tensor X,
                                       const HyperConnectionWeights& next, float eps, Tensor x,
                                       Tensor next_inject, int64_t n_rows) {
    hyper_connection_out(n_streams, y, inject, X, n_rows);
    hyper_connection_in(next, n_streams, eps, X, x, next_inject, n_rows);
  }

  // Token mixers; they advance their state (KV append, DeltaNet/conv recurrence) by n_rows.
  // record_window keeps what a rollback of the window needs (layers/gated_deltanet.h).
  // `layer` names the state: a backend that keeps states in its own memory (a GPU) keeps layer
  // l's there, and the host struct then holds only the bookkeeping (KvCache::n_tokens); the CPU
  // backend reads and writes the host struct itself.
  virtual void gated_deltanet(const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                              GatedDeltaNetState& state, int layer, Tensor x, Tensor y,
                              int64_t n_rows, bool record_window) = 0;
  virtual void attention(const AttentionDims& dims, const AttentionWeights& w, KvCache& cache,
                         int layer, Tensor x, Tensor y, int64_t n_rows) = 0;

  // Batched token mixers (WindowRunner::run_batch, serve --parallel; and ple_rows below): rows
  // segments[s] of x belong to states[s] (caches[s]). The row-wise parts (projections, norms) may run once over all rows,
  // the recurrence or attention per sequence; each sequence's rows and state must be bitwise what
  // the single op gives it alone. Never recorded. A backend whose batched_mixers() is false does
  // not implement them: the forward then copies each sequence's rows through the single ops.
  virtual bool batched_mixers() const { return false; }
  virtual void gated_deltanet_rows(const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                                   std::span<GatedDeltaNetState* const> states,
                                   std::span<const RowSegment> segments, int layer, Tensor x,
                                   Tensor y, int64_t n_rows) {
    (void)dims, (void)w, (void)states, (void)segments, (void)layer, (void)x, (void)y, (void)n_rows;
    fail("{} backend: gated_deltanet_rows (batched windows) is not supported by this backend",
         name());
  }
  virtual void attention_rows(const AttentionDims& dims, const AttentionWeights& w,
                              std::span<KvCache* const> caches,
                              std::span<const RowSegment> segments, int layer, Tensor x, Tensor y,
                              int64_t n_rows) {
    (void)dims, (void)w, (void)caches, (void)segments, (void)layer, (void)x, (void)y, (void)n_rows;
    fail("{} backend: attention_rows (batched windows) is not supported by this backend", name());
  }

  // PLE (layers/ple.h): waits for the window's rows from `rows` (started by the window runner
  // before the first layer), then X += the PLE layer's output.
  virtual void ple(const PleDims& dims, const PleWeights& w, PleState& state, PleRowReader& rows,
                   Tensor X, int64_t n_rows, bool record_window) = 0;
  // PLE over a batched window (a batched mixer: implemented where batched_mixers() is true):
  // rows segments[s] of X belong to states[s], whose table rows come from readers[s]. The
  // row-wise parts may run once over all rows, the conv per sequence; each sequence's rows and
  // state must be bitwise what `ple` gives it alone. Never recorded.
  virtual void ple_rows(const PleDims& dims, const PleWeights& w, std::span<PleState* const> states,
                        std::span<PleRowReader* const> readers, std::span<const RowSegment> segments, Tensor X,
                        int64_t n_rows) {
    (void)dims, (void)w, (void)states, (void)readers, (void)segments, (void)X, (void)n_rows;
    fail("{} backend: ple_rows (batched windows) is not supported by this backend", name());
  }

  // MoE (layers/moe.h): router, top-k, publish the union to `experts`, the shared expert while
  // the misses load, the routed experts in the batches `experts` delivers (resident first), the
  // combine. next_router (optional) computes the read-ahead guess published for layer + 1.
  virtual void moe(const MoeDims& dims, const MoeWeights& w, ExpertSource& experts, int layer,
                   Tensor x, Tensor y, int64_t n_rows, const MoeWeights* next_router) = 0;

  // --- speculative rollback ---
  // Keeps only the first keep_rows rows of the last window (run with record_window) in the states
  // this backend keeps in its own memory, and returns true; the caller then only fixes the host
  // bookkeeping (n_past, the PLE n-gram context). Returns false when the states are the host
  // structs (the CPU backend): the caller rolls those back itself (Model::rollback_layers).
  virtual bool rollback_window(int64_t keep_rows) {
    (void)keep_rows;
    return false;
  }
};

}  // namespace strata::compute
