// The matmul kernels of IQ1_S and IQ1_M (quant/iq_lowbit.cuh): launch_matmul<Q>
// (matmul_kernels.cuh) instantiated here. The kernels are split by weight type over matmul/*.cu so
// that a parallel build compiles them side by side (matmul_plan.cuh says why).
#include <mutex>

#include "compute/cuda/matmul_kernels.cuh"
#include "compute/cuda/runtime.h"
#include "quant/iq_lowbit_tables.h"

namespace strata::compute::cuda::matmul_detail {

namespace {

// This file's copy of the grid IQ1_S and IQ1_M share (quant/iq_lowbit.cuh: one per translation
// unit).
void upload_iq1s_grid() {
  static std::once_flag once;
  std::call_once(once, [] { upload_table(g_iq1s_grid, strata::quant::kIq1sGrid); });
}

}  // namespace

template <>
void upload_tables<IQ1_SWeights>() {
  upload_iq1s_grid();
}
template <>
void upload_tables<IQ1_MWeights>() {
  upload_iq1s_grid();
}

template void launch_matmul<IQ1_SWeights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);
template void launch_matmul<IQ1_MWeights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);

}  // namespace strata::compute::cuda::matmul_detail
