// CPU matrix × activations for quantized weights: y = W·x for a window of n_rows input rows.
//
// Contract
// - WeightMatrix is a non-owning view of ggml weights with ne = {n_in, n_out}: row o holds the n_in
//   weights of output o, rows are row_stride_bytes apart (>= row_bytes(type, n_in); larger strides
//   let a view skip padding or pick every k-th expert row block).
// - matmul computes y[t*n_out + o] = Σ_i W[o,i]·x[t*n_in + i] for t < n_rows, o < n_out.
// - Window identity (exact speculative decoding depends on it): every output is computed as
//     quant::dot(w.type, row o, quantize_activation(w.type, x_t), n_in)
//   for the one activation row t alone, so y[t, o] is bitwise the same whatever n_rows is, wherever
//   row t sits in the window, and whatever the thread count. Nothing ever sums across rows or
//   splits one dot between threads. (Windows of several rows go through quant::dot_tile, whose
//   kernels decode each weight block once for a register tile of activation rows and load each
//   activation block once for a tile of weight rows, and promise exactly those bits.)
// - Memory traffic: outputs are processed in tiles against all n_rows rows (a tile of weight rows
//   stays in cache while every activation row passes over it), so each weight byte is read from
//   DRAM once per call, not once per row. Work is split over outputs between the pool's threads,
//   unless the call's estimated time (compute/cpu/work_estimate.h) is under the pool's
//   inline_work_ns(): then it runs on the calling thread (thread_pool.h, the inline rule).
// - Several matrices over the same rows (matmul_many) or rows converted once and gathered
//   (matmul_rows, the routed experts) share one conversion: same bits as one matmul each.
// - Scratch: activations are quantized once per call into a ScratchBuffer that only grows, so
//   steady-state calls allocate nothing. The overload without a scratch argument uses the pool's
//   scratch slot of the calling thread (ThreadPool::scratch(current_thread_index())); pass your own
//   when several threads share one pool outside its tasks.
// - Errors: a type without kernels, n_in not a positive multiple of the block size, a stride
//   smaller than a row, or a null pointer with work to do throws strata::Error.
// - x and y must not overlap. Thread safety: concurrent calls need distinct scratch buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "compute/cpu/thread_pool.h"
#include "quant/ggml_type.h"

namespace strata::compute {

struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  const void* data = nullptr;
  size_t row_stride_bytes = 0;

  // A densely packed matrix: row_stride_bytes = row_bytes(type, n_in).
  static WeightMatrix dense(GgmlType type, int64_t n_in, int64_t n_out, const void* data);
  const std::byte* row(int64_t o) const {
    return static_cast<const std::byte*>(data) + size_t(o) * row_stride_bytes;
  }
};

void matmul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_rows, float* y,
            ScratchBuffer& activation_scratch);

// Several products over the same input rows: y_i = W_i·x for each {W_i, y_i}. Each distinct
// activation format is converted once (not once per matrix) and all products' tiles run in one
// parallel_for (one wait instead of one per matrix). Every output is bitwise what matmul(pool,
// W_i, x, n_rows, y_i) gives. At most kMaxProducts products; the y_i must not overlap each other
// or x. The overload without scratch uses the calling thread's pool slot, as matmul's.
struct MatmulProduct {
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
};
inline constexpr size_t kMaxProducts = 8;
void matmul_many(ThreadPool& pool, std::span<const MatmulProduct> products, const float* x,
                 int64_t n_rows, ScratchBuffer& activation_scratch);
void matmul_many(ThreadPool& pool, std::span<const MatmulProduct> products, const float* x,
                 int64_t n_rows);

// A window's input rows already in the dot format of some weight type (quant::quantize_activation
// of each row), row t at data + t·row_stride_bytes: the routed experts convert a window once and
// hand each expert its rows. activation_row_stride is the stride matmul itself uses (64-byte
// multiples), quantize_activation_rows fills such rows (split over the pool's threads).
struct ActivationRows {
  GgmlType activation_type = GgmlType::F32;  // quant::activation_type of the weights
  int64_t n_in = 0;
  int64_t n_rows = 0;
  const std::byte* data = nullptr;
  size_t row_stride_bytes = 0;
};
size_t activation_row_stride(GgmlType weight_type, int64_t n_in);
ActivationRows quantize_activation_rows(ThreadPool& pool, GgmlType weight_type, const float* x,
                                        int64_t n_rows, int64_t n_in, std::byte* dst);
// Products over converted rows: bitwise what matmul gives on the rows' f32 source. Every W_i must
// take rows.activation_type and rows.n_in inputs (throws strata::Error otherwise).
void matmul_rows(ThreadPool& pool, std::span<const MatmulProduct> products,
                 const ActivationRows& rows);
void matmul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_rows, float* y);

// Outputs [o_begin, o_end) of y = W·rows on the calling thread alone (no hand-out): y[t·n_out + o]
// for every row t, the layout matmul writes; nothing else of y is touched. Bitwise what
// matmul_rows gives for those outputs (each is one dot). For callers that split products over
// their own tasks, e.g. the steps of a ThreadPool::run_phases chain. Throws strata::Error as
// matmul_rows, and for a range outside [0, n_out].
void matmul_rows_range(const WeightMatrix& w, const ActivationRows& rows, int64_t o_begin,
                       int64_t o_end, float* y);

// Products each over its own converted rows, every tile of every product in one hand-out (one
// wait): the routed experts of a decode step, gate and up of all of them at once, then all the
// downs. Each y_i is bitwise matmul_rows(pool, {W_i, y_i}, rows_i). At most kMaxRowsProducts
// products (throws strata::Error beyond); the y_i must not overlap each other or any rows.
struct RowsProduct {
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
  ActivationRows rows;
};
inline constexpr size_t kMaxRowsProducts = 64;
void matmul_rows_each(ThreadPool& pool, std::span<const RowsProduct> products);

// n_rows = 1.
void matvec(ThreadPool& pool, const WeightMatrix& w, const float* x, float* y);

// Software prefetch of a decode row's weights: when a product has one activation row, the bytes
// requested past the end of the row (or one-row tile) about to be computed (0: off). Default
// kDefaultWeightPrefetchBytes, or STRATA_CPU_PREFETCH_BYTES (a byte size up to 1M, "2K" too; read
// at the first product; a malformed value throws strata::Error). Outputs never depend on it; set_weight_prefetch_bytes is for benches and tests
// (process-wide, not meant to change while products run).
inline constexpr size_t kDefaultWeightPrefetchBytes = 2048;
size_t weight_prefetch_bytes();
void set_weight_prefetch_bytes(size_t bytes);

}  // namespace strata::compute
