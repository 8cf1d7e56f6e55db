// The matmul kernels of IQ3_XXS and IQ3_S (quant/iq_lowbit.cuh): launch_matmul<Q>
// (matmul_kernels.cuh) instantiated here. The kernels are split by weight type over matmul/*.cu so
// that a parallel build compiles them side by side (matmul_plan.cuh says why).
#include <mutex>

#include "compute/cuda/matmul_kernels.cuh"
#include "compute/cuda/runtime.h"
#include "quant/iq_lowbit_tables.h"

namespace strata::compute::cuda::matmul_detail {

// This file's copy of the grid (quant/iq_lowbit.cuh: one per translation unit).
template <>
void upload_tables<IQ3_XXSWeights>() {
  static std::once_flag once;
  std::call_once(once, [] { upload_table(g_iq3xxs_grid, strata::quant::kIq3xxsGrid); });
}

// This file's copy of the grid (quant/iq_lowbit.cuh: one per translation unit).
template <>
void upload_tables<IQ3_SWeights>() {
  static std::once_flag once;
  std::call_once(once, [] { upload_table(g_iq3s_grid, strata::quant::kIq3sGrid); });
}

template void launch_matmul<IQ3_XXSWeights>(MatmulArgs, int, int, cudaStream_t,
                                            const MatmulTuning*);
template void launch_matmul<IQ3_SWeights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);

}  // namespace strata::compute::cuda::matmul_detail
