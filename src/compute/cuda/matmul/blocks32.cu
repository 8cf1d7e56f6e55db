// The matmul kernels of Q4_0, Q4_1, Q5_0 and Q5_1 (quant/blocks32.cuh, the types without a staged
// kernel): launch_matmul<Q> (matmul_kernels.cuh) instantiated here. The kernels are split by weight
// type over matmul/*.cu so that a parallel build compiles them side by side (matmul_plan.cuh says
// why).
#include "compute/cuda/matmul_kernels.cuh"

namespace strata::compute::cuda::matmul_detail {

template void launch_matmul<Q4_0Weights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);
template void launch_matmul<Q4_1Weights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);
template void launch_matmul<Q5_0Weights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);
template void launch_matmul<Q5_1Weights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);

}  // namespace strata::compute::cuda::matmul_detail
