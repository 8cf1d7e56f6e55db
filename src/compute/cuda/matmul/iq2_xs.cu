// The matmul kernels of IQ2_XS (direct and staged): launch_matmul<Q> (matmul_kernels.cuh)
// instantiated here. The kernels are split by weight type over matmul/*.cu so that a parallel build
// compiles them side by side (matmul_plan.cuh says why).
#include <mutex>

#include "compute/cuda/matmul_kernels.cuh"
#include "compute/cuda/runtime.h"
#include "quant/iq2xs_tables.h"

namespace strata::compute::cuda::matmul_detail {

// This file's copy of the decode table: codes, then sign selectors (quant/iq2xs.cuh: one per
// translation unit).
template <>
void upload_tables<IQ2_XSWeights>() {
  static std::once_flag once;
  std::call_once(once, [] {
    namespace q = strata::quant;
    static_assert(sizeof(g_iq2xs_codes) / 4 == q::kIq2xsGridSize + 128);
    uint32_t iq2xs[q::kIq2xsGridSize + 128];
    for (int i = 0; i < q::kIq2xsGridSize; ++i) iq2xs[i] = iq2xs_codes(q::kIq2xsGrid[i]);
    for (uint32_t s7 = 0; s7 < 128; ++s7) iq2xs[q::kIq2xsGridSize + s7] = iq2xs_sign_selector(s7);
    STRATA_CUDA_CHECK(cudaMemcpyToSymbol(g_iq2xs_codes, iq2xs, sizeof(iq2xs)));
  });
}

template void launch_matmul<IQ2_XSWeights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);

}  // namespace strata::compute::cuda::matmul_detail
