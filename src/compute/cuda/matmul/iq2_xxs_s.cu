// The matmul kernels of IQ2_XXS and IQ2_S (quant/iq_lowbit.cuh): launch_matmul<Q>
// (matmul_kernels.cuh) instantiated here. The kernels are split by weight type over matmul/*.cu so
// that a parallel build compiles them side by side (matmul_plan.cuh says why).
#include <mutex>

#include "compute/cuda/matmul_kernels.cuh"
#include "compute/cuda/runtime.h"
#include "quant/iq_lowbit_tables.h"

namespace strata::compute::cuda::matmul_detail {

// This file's copy of the grid (quant/iq_lowbit.cuh: one per translation unit).
template <>
void upload_tables<IQ2_XXSWeights>() {
  static std::once_flag once;
  std::call_once(once, [] { upload_table(g_iq2xxs_grid, strata::quant::kIq2xxsGrid); });
}

// This file's copy of the grid (quant/iq_lowbit.cuh: one per translation unit).
template <>
void upload_tables<IQ2_SWeights>() {
  static std::once_flag once;
  std::call_once(once, [] { upload_table(g_iq2s_grid, strata::quant::kIq2sGrid); });
}

template void launch_matmul<IQ2_XXSWeights>(MatmulArgs, int, int, cudaStream_t,
                                            const MatmulTuning*);
template void launch_matmul<IQ2_SWeights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);

}  // namespace strata::compute::cuda::matmul_detail
