// Block quantization formats: dequantize, quantize and dot products for the types with kernels
// (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, Q2_K, IQ2_XS; and Q4_1, Q5_0, Q5_1, IQ4_NL with Q8_0
// activations, Q3_K, Q5_K, IQ4_XS with Q8_K activations: kTableKernels in quant/kernels.h), and dequantize
// and dot products only for the low-bit IQ types of llama.cpp's importance-matrix files (IQ2_XXS,
// IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M).
//
// Contract
// - A "row" is n weights of one type, n a multiple of the type's block size (caller checks).
// - Dot products take the weight row and an *activation row already converted* to the type that
//   `activation_type(weight_type)` names: F32 for F32/F16/BF16 weights, Q8_0 for Q8_0/Q4_0, Q8_K
//   for the K-quants and the IQ types. `quantize_activation` produces it from f32.
// - Determinism: for given inputs every function returns the same bits on every call and thread.
//   The reduction order of `dot` depends only on n, never on where the row sits in a matrix; this
//   is what makes a row's result identical in a 1-row and a T-row window.
// - Implementations live side by side: `quant::ref` (scalar, the specification), the AVX2 path
//   (quant/avx2/*.cpp) and AVX-512 dot kernels for Q4_0, Q4_K, Q6_K and IQ2_XS and tile kernels
//   (many weight rows × many activation rows) for Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_K, Q6_K, IQ4_XS and
//   IQ2_XS (quant/avx512/*.cpp, bitwise equal to the AVX2 dots; a NaN result is the canonical NaN). The public functions dispatch to the best level the CPU has.
//   Tests compare every path with ref on random inputs and compare ref against hand-computed
//   blocks.
// - Thread safety: all functions are pure; call them from any thread. None allocates.
// - Alignment: weight rows at least 2-byte aligned (GGUF data always is), activation buffers
//   4-byte aligned. Activations must come from quantize_activation (its quants stay in
//   [-127, 127], which the AVX2 sign tricks rely on).
// - Errors: a type without kernels or a length that is not a multiple of the block size throws
//   strata::Error (except through the raw DotKernel pointer, which checks nothing).
// - STRATA_QUANT_MAX=scalar|avx2|avx512 in the environment (read once, at the first dispatched
//   call) caps the level the dispatched functions use, for tests and A/B measurements; any other
//   value makes that first call throw strata::Error. STRATA_QUANT_SCALAR=1 means
//   STRATA_QUANT_MAX=scalar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "quant/ggml_type.h"

namespace strata::quant {

// The activation format the dot product of `weight_type` consumes.
GgmlType activation_type(GgmlType weight_type);
// Bytes needed for an activation row of n elements for weights of `weight_type`.
size_t activation_row_bytes(GgmlType weight_type, int64_t n);

// Fast paths (dispatched). `type` must have kernels; throws strata::Error otherwise.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
// Quantizes n floats into `type` blocks. IQ2_XS is quantized without an importance matrix
// (llama.cpp insists on one): fine for synthetic/test models, noticeably worse for real ones.
// IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M have no quantizer: throws strata::Error
// naming the type (ref::quantize_row too).
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);
// True when quantize_row can write `type` (false for types without kernels and for the low-bit
// IQ types above, which strata only reads).
bool has_quantizer(GgmlType type);
// Converts an f32 activation row into activation_type(weight_type) at `dst`.
void quantize_activation(GgmlType weight_type, const float* src, void* dst, int64_t n);
// Σ_i w[i]·x[i] over n elements; `activation` is in activation_type(weight_type).
float dot(GgmlType weight_type, const void* weight_row, const void* activation, int64_t n);

// Dots of one weight row with n_activations activation rows: activation t starts
// t·activation_stride bytes after `activations` (each 4-byte aligned), and
// out[t·out_stride] = dot(weight_type, weight_row, activation t, n) bitwise, for every t and every
// n_activations (what compute::matmul's window identity rests on). Types with a tile kernel (see
// dot_tile) decode each weight block once for several activations; the others call the dot kernel
// per activation.
void dot_many(GgmlType weight_type, const void* weight_row, const void* activations,
              size_t activation_stride, int64_t n_activations, int64_t n, float* out,
              size_t out_stride);

// Dots of n_weights weight rows (row r at weights + r·weight_stride bytes) with n_activations
// activation rows (as dot_many): out[r·out_weight_stride + t·out_activation_stride] =
// dot(weight_type, row r, activation t, n) bitwise, for every r, t and tile shape. Types with a tile
// kernel decode each weight block once for several activations and load each activation block
// once for several weight rows (under AVX-512: Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_K, Q6_K, IQ4_XS,
// IQ2_XS; under AVX2: Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_K, Q5_K, IQ2_XS); the others run dot_many per
// weight row.
void dot_tile(GgmlType weight_type, const void* weights, size_t weight_stride, int64_t n_weights,
              const void* activations, size_t activation_stride, int64_t n_activations, int64_t n,
              float* out, size_t out_weight_stride, size_t out_activation_stride);

// NaN results: every dispatched dot, dot_many and dot_tile result that is a NaN is this one quiet
// NaN. Which NaN payload survives an add or FMA of two NaNs depends on the instruction form the
// compiler picked, and that differs between a one-row kernel and a tile; a weight row with NaN
// scales must still give the same bits in a one-row and a T-row window.
[[gnu::always_inline]] inline float canonical_nan(float v) {
  return v == v ? v : __builtin_nanf("");
}

// The dispatched dot kernel of `weight_type`, for hot loops that call it once per row: same
// result as dot(), minus the per-call type and length checks (n must be a block multiple) and
// the NaN canonicalisation (apply canonical_nan to its result).
using DotKernel = float (*)(const void* weight_row, const void* activation, int64_t n);
DotKernel dot_kernel(GgmlType weight_type);

// True when the CPU has AVX2, FMA, F16C and BMI1; the dispatched functions then use the AVX2
// kernels (unless capped by the environment, see above).
bool cpu_has_avx2();
// True when the CPU (and OS) also has AVX-512 F, BW, VL, VBMI, VNNI and BITALG; the dispatched
// functions then use the AVX-512 kernels listed above (unless capped).
bool cpu_has_avx512();

enum class KernelLevel { Scalar, Avx2, Avx512 };
// The level the dispatched functions use in this process (CPU check and environment cap).
KernelLevel active_kernel_level();
std::string_view kernel_level_name(KernelLevel level);  // "scalar", "avx2", "avx512"

namespace ref {
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);
void quantize_activation(GgmlType weight_type, const float* src, void* dst, int64_t n);
float dot(GgmlType weight_type, const void* weight_row, const void* activation, int64_t n);
}  // namespace ref

}  // namespace strata::quant
