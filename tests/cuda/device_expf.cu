// CUDA's expf evaluated on the device, for tests that check a kernel's exponentials bitwise (the
// host's std::exp is glibc's, a few ulp away). Compiled by nvcc with the kernels' flags (no fast
// math), so it is the expf the kernels call.
#include <cuda_runtime.h>

#include <cstdint>

#include "compute/cuda/runtime.h"

namespace strata::test_support {
namespace {

__global__ void expf_kernel(const float* x, float* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = expf(x[i]);
}

}  // namespace

void device_expf(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  expf_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(x, y, n);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::test_support
