// Kernel launches with programmatic dependent launch (PDL, Hopper and later).
//
// Why: a decode window is ≈ 2900 small kernels, each a few µs, and between two dependent kernels
// the GPU idles while the next grid is launched and its blocks are scheduled. With PDL the next
// kernel's blocks are launched while the previous kernel finishes and wait at pdl_begin() until
// it has completed and its writes are visible; the launch latency overlaps the tail.
//
// Contract
// - Every kernel launched through launch() calls pdl_begin() before any access to memory that a
//   kernel of the stream may write: then the kernel sees exactly what stream order would give it
//   (the wait returns once the previous kernel in the stream has completed and flushed), so
//   results are bitwise those of plain launches. pdl_begin() then lets its own dependents launch.
//   Only memory no kernel writes may be touched before it: the quantized matmul loads its
//   constant decode table and prefetches dense weight rows into L2 there (matmul.h), work that
//   then overlaps the previous kernel.
// - On devices before sm_90, or with STRATA_CUDA_PDL=0, launch() is a plain launch and
//   pdl_begin() does nothing.
// - Errors: a shape beyond the device's limits throws strata::Error naming it before the launch
//   (runtime.h check_launch_shape: also inside a graph capture, where CUDA would only fail the
//   capture); the launch's own error is thrown as strata::Error at the launch site.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
  check_launch_shape(grid, block, shared_bytes);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = dependent_launch_enabled() ? 1 : 0;
  STRATA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace strata::compute::cuda
