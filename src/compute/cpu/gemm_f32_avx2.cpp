// gemm_f32 at the avx2 level (see gemm_f32_kernel.inc).
#define STRATA_GEMM_NAME gemm_f32_avx2
#define STRATA_GEMM_VECTOR_BYTES 32
#define STRATA_GEMM_MR 4
#include "compute/cpu/gemm_f32_kernel.inc"
