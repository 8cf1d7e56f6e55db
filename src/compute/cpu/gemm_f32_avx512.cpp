// gemm_f32 at the avx512 level (see gemm_f32_kernel.inc).
#define STRATA_GEMM_NAME gemm_f32_avx512
#define STRATA_GEMM_VECTOR_BYTES 64
#define STRATA_GEMM_MR 6
#include "compute/cpu/gemm_f32_kernel.inc"
