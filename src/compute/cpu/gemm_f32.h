// Small dense f32 matrix products for the CPU backend's matrix-shaped layer work (the chunked
// Gated DeltaNet form of prefill windows): C = C0 + A·B, all row-major with explicit leading
// dimensions.
//
// Contract
// - gemm_f32(m, n, k, a, lda, b, ldb, c, ldc, accumulate) sets, for i < m, j < n,
//     c[i·ldc + j] = acc, where acc starts at (accumulate ? c[i·ldc + j] : 0.0f) and then, for
//     r = 0, 1, ..., k−1 in that order, acc = acc + (a[i·lda + r] · b[r·ldb + j]),
//   every product and every sum rounded to f32 on its own (no fused multiply-add).
//   That per-element sequence is the specification (ref::gemm_f32 runs it literally): the SIMD
//   levels vectorise over j and block over i, which never changes it, so every level (scalar,
//   AVX2, AVX-512; chosen at run time like quant's, capped by STRATA_QUANT_MAX) and every
//   blocking gives the same bits; tests/compute/gemm_f32_test.cpp checks each level bitwise.
// - k = 0 leaves c as its start value (0 or unchanged). m, n, k >= 0; lda >= k, ldb >= n,
//   ldc >= n (not checked: internal callers). c must not overlap a or b.
// - Pure, allocation-free, thread-safe for distinct c.
#pragma once

#include <cstdint>

namespace strata::compute {

void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc, bool accumulate);

// The kernels of each level (gemm_f32 dispatches to the best the CPU has). Call avx2/avx512 only
// when quant::cpu_has_avx2() / quant::cpu_has_avx512() is true.
using GemmF32Fn = void (*)(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                           const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);
namespace ref {
void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc, bool accumulate);
}
namespace gemm_level {
void gemm_f32_sse(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, bool accumulate);
void gemm_f32_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate);
void gemm_f32_avx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                     int64_t ldb, float* c, int64_t ldc, bool accumulate);
}  // namespace gemm_level

}  // namespace strata::compute
