// The matmul kernels of Q2_K, Q5_K and Q6_K (quant/kquants.cuh, the types without a staged kernel):
// launch_matmul<Q> (matmul_kernels.cuh) instantiated here. The kernels are split by weight type
// over matmul/*.cu so that a parallel build compiles them side by side (matmul_plan.cuh says why).
#include "compute/cuda/matmul_kernels.cuh"

namespace strata::compute::cuda::matmul_detail {

template void launch_matmul<Q2_KWeights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);
template void launch_matmul<Q5_KWeights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);
template void launch_matmul<Q6_KWeights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);

}  // namespace strata::compute::cuda::matmul_detail
