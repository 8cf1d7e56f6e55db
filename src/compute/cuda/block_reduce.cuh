// Block-wide reductions in a fixed order, shared by the kernels whose results must not depend on
// timing (ops.cu's norms and softmax, matmul.cu's fused norm + quantizer).
//
// Contract: every thread of the block calls them (they synchronise); the result is returned to
// every thread. The order is each warp's xor butterfly, then the warp results in warp order:
// fixed by blockDim alone, so two kernels with the same block size sum the same values to the
// same bits. `shared` holds at least blockDim.x / 32 floats and may be reused right after.
#pragma once

#include <cuda_runtime.h>

namespace strata::compute::cuda {

// Sum over the block in a fixed order: each warp's xor butterfly, then warp sums in warp order.
__device__ __forceinline__ float block_sum(float v, float* shared) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // `shared` may still be read from a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = shared[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) total = __fadd_rn(total, shared[w]);
  return total;
}

__device__ __forceinline__ float block_max(float v, float* shared) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = shared[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) total = fmaxf(total, shared[w]);
  return total;
}

}  // namespace strata::compute::cuda
