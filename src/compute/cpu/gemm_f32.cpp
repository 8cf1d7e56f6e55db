#include "compute/cpu/gemm_f32.h"

#include "quant/quant.h"

namespace strata::compute {

namespace ref {
void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = accumulate ? c[i * ldc + j] : 0.0f;
      for (int64_t r = 0; r < k; ++r) acc = acc + a[i * lda + r] * b[r * ldb + j];
      c[i * ldc + j] = acc;
    }
}
}  // namespace ref

namespace {
// The level quant's kernels use (same CPU check and STRATA_QUANT_MAX cap); every level gives the
// same bits, so this only picks the speed.
GemmF32Fn chosen_gemm() {
  switch (quant::active_kernel_level()) {
    case quant::KernelLevel::Avx512:
      return gemm_level::gemm_f32_avx512;
    case quant::KernelLevel::Avx2:
      return gemm_level::gemm_f32_avx2;
    case quant::KernelLevel::Scalar:
      break;
  }
  return gemm_level::gemm_f32_sse;
}
}  // namespace

void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  static const GemmF32Fn kernel = chosen_gemm();
  if (m <= 0 || n <= 0) return;
  kernel(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

}  // namespace strata::compute
