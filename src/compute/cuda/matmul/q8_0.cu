// The matmul kernels of Q8_0 (direct and staged): launch_matmul<Q> (matmul_kernels.cuh)
// instantiated here. The kernels are split by weight type over matmul/*.cu so that a parallel build
// compiles them side by side (matmul_plan.cuh says why).
#include "compute/cuda/matmul_kernels.cuh"

namespace strata::compute::cuda::matmul_detail {

template void launch_matmul<Q8_0Weights>(MatmulArgs, int, int, cudaStream_t, const MatmulTuning*);

}  // namespace strata::compute::cuda::matmul_detail
