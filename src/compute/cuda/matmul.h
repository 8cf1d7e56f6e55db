// CUDA matrix × activations for weights in their GGUF block layout: y = W·x for a window of
// n_rows activation rows (T = 1 decode, 1+k speculative verify, a prefill chunk), dense weights
// or routed experts addressed through the slot map. The CUDA twin of compute/cpu/matmul.h.
//
// Contract
// - Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL (Q8_0-style activations), Q2_K,
//   Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
//   (Q8_K-style activations): has_cuda_kernel() says which. Others throw strata::Error naming
//   the type.
// - Activations are quantized once per call (quantize_activations) into the format the CPU's
//   quant::quantize_activation produces: the same quants, scales and block sums, bit for bit
//   (tests/cuda checks it), stored as separate arrays (ActivationLayout) so kernels load them
//   16 bytes at a time.
// - The dot of one weight row with one activation row is an integer dot per block portion
//   ("unit") scaled in f32, the units of a row summed by the 32 lanes of one warp in a fixed
//   order (lane l takes units l, l+32, ...; then a fixed xor-butterfly; rows of fewer than 32
//   units use fewer lanes each, with the same sums bit for bit). That order depends only
//   on n_in and the type, never on n_rows, n_out, the row's place in the window or the expert
//   list: window identity holds bitwise (y[t] is the same in a T = 1 and a T = k call), and
//   repeated runs are bitwise equal. No atomics, no split-K.
// - Against the CPU (quant::ref::dot, exact integer units summed in f64): within the f32
//   rounding bound of the chain, see tests/cuda/matmul_test.cpp for the bound used.
// - Alignment: the matrix base and row stride must be multiples of the type's widest aligned load
//   (16 bytes for F32/F16/BF16/Q4_K/Q5_K, 8 for IQ4_XS/IQ1_M, 4 for Q2_K/Q4_1/Q5_1, 2 for the
//   others: GGUF data is 32-byte aligned and real row sizes satisfy these); arena base, slot size
//   and matrix offsets are multiples of 16. Checked; a violation throws strata::Error naming the
//   type and the values.
// - All pointers are device pointers; launches go on `stream` and return at once. Errors in the
//   arguments throw before anything is launched.
// - Dense weights are read-only for the life of a launch's stream work: no kernel on the stream
//   writes them (they are uploaded by synchronous copies). The kernel prefetches a dense matrix's
//   rows into L2 before its dependent-launch wait (launch.cuh), so the HBM latency overlaps the
//   previous kernel; a prefetch is a hint and never changes what the loads after the wait see.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "compute/cuda/hyper_connection.h"
#include "quant/ggml_type.h"

namespace strata::compute::cuda {

// A weight matrix on the device: ne = {n_in, n_out}, row o at data + o·row_stride_bytes.
struct DeviceMatrix {
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  const void* data = nullptr;
  size_t row_stride_bytes = 0;
};

bool has_cuda_kernel(GgmlType type);

// Launch shape knobs for benchmarks and tests; they never change a result bit (every output's
// arithmetic is the same whatever the shape). Zero means the default.
//
// The staged path (staging = 1; Q8_0, IQ4_NL, Q3_K, Q4_K, IQ2_XS, rows of >= 32 units): each warp
// copies its weight rows' raw bytes into shared memory with coalesced 16-byte cp.async, `stages`
// buffers deep (the next stage's copy in flight while the current one is decoded), and decodes
// from there; optionally the window's activations are copied into shared memory once per thread
// block (act_shared, windows of <= 4 rows). The grid is the number of blocks that fit the GPU at
// once, each warp walking its rows. Bitwise the direct path (tests/cuda/matmul_test.cpp).
// Default (measured on the H100, sessions 38 and 43: docs/bench-cuda.md): Q8_0, Q4_K and IQ2_XS
// windows of 1-4 rows, IQ4_NL and Q3_K windows of 2-4 rows, 3 stages where they fit, the activations in
// shared memory (else the direct kernel); or as STRATA_CUDA_STAGED=0|1 says for every type that
// has it.
struct MatmulTuning {
  int rows_per_warp = 0;  // 1, 2 or 4
  int staging = 0;        // 1: the staged path where the type and shape have it; 2: never; 0: the default
  int lanes_per_row = 0;  // 32: a full warp per weight row always; 0: fewer for rows of < 32 units
  int stages = 0;         // staged path: shared-memory buffers per warp, 2 or 3 (0: 2)
  int act_shared = 0;     // staged path: 1: activations in shared memory when they fit; 2: never; 0: T = 1 only (the default's rule without tuning)
  int warps_per_row = 0;  // dense matrices: 4: wide rows (four warps share each weight row) wherever the rows take a full warp; 0 or 1: one warp a row (the default rule applies only without tuning)
};

// Whether a dense matrix of `type`, n_in x n_out runs as wide rows (four warps per weight row,
// their partial sums added in a fixed order) under `tuning`. Without tuning: rows of at least
// 128 units and at most 1024 of them (the hyper-connection's down and inject, routers), whose one
// warp a row left most SMs idle; STRATA_CUDA_WIDE_ROWS=0 turns it off. The choice depends on the
// matrix only, never on the window's rows, so a row's result is the same in every window; it is
// not the one-warp kernel's bits (another summation order), which is why it is a rule of the
// matrix and not of the launch.
bool wide_rows(GgmlType type, int64_t n_in, int64_t n_out, const MatmulTuning* tuning = nullptr);

// Which kernel matmul_quantized (and the expert and many-matrix forms) runs for a window of
// n_rows (its first pass of at most 8 rows) under `tuning`: benchmarks print it, tests assert it.
enum class MatvecPath { Direct, Staged, StagedSharedActivations };
MatvecPath matvec_path(GgmlType type, int64_t n_in, int64_t n_rows, const MatmulTuning* tuning = nullptr);

// Where the quantized activations of n_rows rows live inside one scratch allocation.
struct ActivationLayout {
  GgmlType format = GgmlType::F32;  // F32, Q8_0 or Q8_K (quant::activation_type of the weights)
  int64_t n_in = 0;
  int64_t n_rows = 0;
  size_t qs_offset = 0, qs_row_bytes = 0;        // int8 quants (F32: the floats themselves)
  size_t scale_offset = 0, scale_row_count = 0;  // f32 scale per block (Q8_0: the f16 value)
  size_t sum_offset = 0, sum_row_count = 0;      // i32 sum per 16 (Q8_K) or 32 (Q8_0) quants
  size_t total_bytes = 0;
};
ActivationLayout activation_layout(GgmlType weight_type, int64_t n_in, int64_t n_rows);

// x: [n_rows][n_in] f32 (row stride n_in) → the scratch at `scratch` laid out as `layout`.
void quantize_activations(const ActivationLayout& layout, const float* x, void* scratch,
                          cudaStream_t stream);
// x into two layouts at once (the experts' Q8_K and the router's Q8_0, say): one launch where both
// are quantized formats of the same width and rows, the same bytes as two quantize_activations.
// With `combine`, x is hc_combine's output, computed in the launch (below) instead of read.
struct HcCombineInputs;
void quantize_activations_two(const ActivationLayout& first, void* first_scratch, const ActivationLayout& second,
                              void* second_scratch, const float* x, cudaStream_t stream,
                              const HcCombineInputs* combine = nullptr);
// The same with an elementwise step applied to the inputs first, in the quantizer's launch (one
// launch instead of two): x_i = silu(a_i)·b_i (SwiGLU's middle) or silu(a_i·scale) (the
// hyper-connection's mixing activation), with the f32 operations of compute/cuda/ops.h silu_mul
// and hyper_connection.h hc_scaled_silu (activation_math.cuh): bitwise the two steps
// (tests/cuda/matmul_test.cpp). a and b are [n_rows][n_in], 16-byte aligned.
// (HcCombine is quantize_activations_combined's, not accepted here.)
enum class ActivationPrologue { None, SiluMul, ScaledSilu, HcCombine };
void quantize_activations_fused(const ActivationLayout& layout, ActivationPrologue prologue, const float* a,
                                const float* b, float scale, void* scratch, cudaStream_t stream);

// The activations of a narrow matmul computed by the matmul's own launch (one launch instead of
// quantize_activations_fused + the matmul): each CUDA block applies the prologue to the rows it
// needs and quantizes them into shared memory with the quantizers' per-block arithmetic
// (quant/activation_store.cuh), so every output is bitwise quantize_activations_fused then
// matmul_quantized (tests/cuda/matmul_test.cpp). Worth it where the blocks' repeated work is
// small: the rows it takes are narrow (at most 16 units, a lane group of < 32 lanes each: the
// hyper-connection's up matrix, SwiGLU's down of routed and shared experts up to 512 wide), where
// one launch fewer is most of the cost.
// can_quantize_in_block says which (type, width, rows) it takes; STRATA_CUDA_IN_BLOCK=0 turns it
// off (can_quantize_in_block false) for before/after measurements.
struct InBlockActivations {
  ActivationPrologue prologue = ActivationPrologue::SiluMul;  // SiluMul or ScaledSilu
  const float* a = nullptr;  // [rows][n_in], 16-byte aligned
  const float* b = nullptr;  // SiluMul's up, laid out as a
  float scale = 0.0f;        // ScaledSilu's
};
bool can_quantize_in_block(GgmlType type, int64_t n_in, int64_t n_rows, const MatmulTuning* tuning = nullptr);

// hyper_connection_in's last step deferred into the quantizer of the matmul that reads its
// output (one launch instead of two): x = hc_combine(gates, normed) (hyper_connection.h) is
// computed per element with hc_combine's f32 operations (activation_math.cuh hc_combine_value),
// stored to `x` and quantized into `layout` (Q8_0 or Q8_K, n_in = the row width of x); with
// `inject`, its n_rows·n_streams logits become weights in place (hc_inject). Bitwise hc_combine
// then quantize_activations (tests/cuda/matmul_test.cpp).
struct HcCombineInputs {
  const float* gates = nullptr;   // [n_rows][n_streams·n_in], 16-byte aligned
  const float* normed = nullptr;  // [n_rows][n_streams·n_in], 16-byte aligned
  int n_streams = 0;
  float inv_streams = 0.0f;
  float* x = nullptr;       // [n_rows][n_in], 16-byte aligned
  float* inject = nullptr;  // [n_rows][n_streams] or null
};
void quantize_activations_combined(const ActivationLayout& layout, const HcCombineInputs& in, void* scratch,
                                   cudaStream_t stream);

// The grouped RMS norm of hyper_connection_in fused with the quantizer of the matmul that reads
// it (one launch instead of two): x is [n_rows][n_groups·group_size], group g normalised with
// weight + g·group_size (null: no weight). Writes `normed` bitwise as rms_norm_grouped_rows (ops.h)
// and `scratch` bitwise as quantize_activations(layout, normed) (tests/cuda/matmul_test.cpp).
// With fold_y/fold_inject ([n_rows][group_size] / [n_rows][n_groups]), first x_g += inject_g·y in
// place, bitwise hc_out (hyper_connection.h): the previous block's residual update, folded in.
// With fold_combine too, y is not read but computed from moe_combine's inputs and stored to
// fold_y, bitwise moe_combine (the MoE layer's combine, folded in as well).
// can_norm_quantize says whether the layout allows it (F32, Q8_0 with group_size % 32 == 0, Q8_K
// with group_size % 256 == 0); otherwise the call throws.
bool can_norm_quantize(const ActivationLayout& layout, int64_t n_groups, int64_t group_size);
void rms_norm_quantize_activations(const ActivationLayout& layout, float* x, const float* weight, int64_t n_groups,
                                   int64_t group_size, float eps, float* normed, void* scratch, cudaStream_t stream,
                                   float* fold_y = nullptr, const float* fold_inject = nullptr,
                                   const MoeCombineInputs* fold_combine = nullptr);

// Gated DeltaNet's output norm fused the same way (one launch instead of three): x is
// [n_rows][n_groups·group_size] (the heads), each head RMS-normed with the one `weight` they
// share, then ·= σ(gate) (sigmoid_gate) or silu(gate) (gate laid out as x), written back to x in
// place and quantized into `layout`: bitwise rms_norm_rows, gate_rows (window_ops.h) and
// quantize_activations (tests/cuda/matmul_test.cpp). The layouts of can_norm_quantize.
void rms_norm_gate_quantize_activations(const ActivationLayout& layout, float* x, const float* weight,
                                        int64_t n_groups, int64_t group_size, float eps, const float* gate,
                                        bool sigmoid_gate, void* scratch, cudaStream_t stream);

// The activations matmul_quantized reads for `layout`: x itself when its floats already are the
// layout (F32 activations, x 16-byte aligned, rows contiguous: no copy, no launch), else `scratch`
// after quantize_activations into it.
const void* prepare_activations(const ActivationLayout& layout, const float* x, void* scratch,
                                cudaStream_t stream);

// y[t·n_out + o] = Σ_i W[o,i]·x_t[i] for t < n_rows; activations already quantized into
// `scratch` (layout from activation_layout(w.type, w.n_in, >= n_rows)).
void matmul_quantized(const DeviceMatrix& w, const ActivationLayout& layout, const void* scratch,
                      int64_t n_rows, float* y, cudaStream_t stream,
                      const MatmulTuning* tuning = nullptr);
// Several matrices of the same type and input width reading the same activations, in one launch
// (the projections of one input: DeltaNet's qkv/z/beta/alpha, attention's q/k/v, the hyper-
// connection's down and inject): outputs[j].y as matmul_quantized(outputs[j].w, ...) gives it,
// bitwise (a row's arithmetic never depends on the launch), with the latency of one launch.
inline constexpr int kMaxDenseMatrices = 8;
struct DenseOutput {
  DeviceMatrix w;
  float* y = nullptr;
};
void matmul_quantized_many(std::span<const DenseOutput> outputs, const ActivationLayout& layout, const void* scratch,
                           int64_t n_rows, cudaStream_t stream, const MatmulTuning* tuning = nullptr);
// Both steps; `scratch` holds at least activation_layout(w.type, w.n_in, n_rows).total_bytes.
void matmul(const DeviceMatrix& w, const float* x, int64_t n_rows, float* y, void* scratch,
            cudaStream_t stream);

// matmul_quantized of the activations `in` describes, computed in the launch (InBlockActivations
// above); throws unless can_quantize_in_block(w.type, w.n_in, n_rows, tuning).
void matmul_in_block(const DeviceMatrix& w, const InBlockActivations& in, int64_t n_rows, float* y,
                     cudaStream_t stream, const MatmulTuning* tuning = nullptr);

// Routed experts through the slot map. Expert e of `layer` lives in arena slot
// smap[layer·n_expert + e] (kSlotMiss: not resident; the caller guarantees residency before the
// launch, a miss writes NaN so it cannot go unnoticed); its matrix starts `matrix_offset` bytes
// into the slot, rows row_stride_bytes apart.
inline constexpr uint32_t kSlotMiss = 0xffffffffu;
struct ExpertArenaView {
  const uint8_t* base = nullptr;  // device
  size_t slot_bytes = 0;
  const uint32_t* smap = nullptr;  // device, [n_layer][n_expert]
  int n_expert = 0;
};
struct ExpertMatrixShape {
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  size_t matrix_offset = 0;
  size_t row_stride_bytes = 0;
};
// For each j < n_launch: expert expert_ids[j] of `layer` multiplies the activation rows
// row_ids[j·max_rows + i] (i < row_counts[j] <= max_rows) of the quantized activations, writing
// y[(j·max_rows + i)·n_out + o]. expert_ids, row_ids, row_counts are device arrays. Each output is
// bitwise what matmul_quantized gives for that row and matrix alone.
void expert_matmul_quantized(const ExpertArenaView& arena, int layer, const ExpertMatrixShape& shape,
                             const int32_t* expert_ids, int n_launch, const int32_t* row_ids,
                             const int32_t* row_counts, int max_rows, const ActivationLayout& layout,
                             const void* scratch, float* y, cudaStream_t stream,
                             const MatmulTuning* tuning = nullptr);
// Two matrices of each listed expert in one launch (SwiGLU's gate and up: the same activations,
// twice the blocks in flight): y_first as expert_matmul_quantized with `first`, y_second with
// `second`, bitwise. Both must have the same type, n_in, n_out and row stride (can_pair_experts).
bool can_pair_experts(const ExpertMatrixShape& a, const ExpertMatrixShape& b);
// expert_matmul_quantized with the activations computed in the launch (InBlockActivations): row
// row_ids[...] of in.a / in.b ([rows][n_in] floats) is the activation row. Throws unless
// can_quantize_in_block(shape.type, shape.n_in, max_rows, tuning).
void expert_matmul_in_block(const ExpertArenaView& arena, int layer, const ExpertMatrixShape& shape,
                            const int32_t* expert_ids, int n_launch, const int32_t* row_ids,
                            const int32_t* row_counts, int max_rows, const InBlockActivations& in, float* y,
                            cudaStream_t stream, const MatmulTuning* tuning = nullptr);
void expert_matmul_quantized_pair(const ExpertArenaView& arena, int layer, const ExpertMatrixShape& first,
                                  const ExpertMatrixShape& second, const int32_t* expert_ids, int n_launch,
                                  const int32_t* row_ids, const int32_t* row_counts, int max_rows,
                                  const ActivationLayout& layout, const void* scratch, float* y_first,
                                  float* y_second, cudaStream_t stream, const MatmulTuning* tuning = nullptr);

}  // namespace strata::compute::cuda
