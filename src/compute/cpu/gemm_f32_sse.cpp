// gemm_f32 at the sse level (see gemm_f32_kernel.inc).
#define STRATA_GEMM_NAME gemm_f32_sse
#define STRATA_GEMM_VECTOR_BYTES 16
#define STRATA_GEMM_MR 4
#include "compute/cpu/gemm_f32_kernel.inc"
