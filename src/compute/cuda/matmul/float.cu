// The matmul kernels of F32, F16 and BF16 (quant/float.cuh): launch_matmul<Q> (matmul_kernels.cuh)
// instantiated here. The kernels are split by weight type over matmul/*.cu so that a parallel build
// compiles them side by side (matmul_plan.cuh says why).
#include "compute/cuda/matmul_kernels.cuh"

namespace strata::compute::cuda::matmul_detail {

template void launch_matmul<FloatWeights<GgmlType::F32>>(MatmulArgs, int, int, cudaStream_t,
                                                         const MatmulTuning*);
template void launch_matmul<FloatWeights<GgmlType::F16>>(MatmulArgs, int, int, cudaStream_t,
                                                         const MatmulTuning*);
template void launch_matmul<FloatWeights<GgmlType::BF16>>(MatmulArgs, int, int, cudaStream_t,
                                                          const MatmulTuning*);

}  // namespace strata::compute::cuda::matmul_detail
