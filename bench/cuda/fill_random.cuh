// Shared by the CUDA micro-benchmarks: fills device words with a hash of their index (the same
// bytes for the same seed on every run), ANDed with `keep` (latency_bench clears the top bits of
// each half-word so f16 scale fields stay finite and small).
#pragma once

#include <cstddef>
#include <cstdint>

__global__ void fill_random_kernel(uint32_t* data, size_t n, uint32_t seed, uint32_t keep = 0xffffffffu) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    data[i] = x & keep;
  }
}
