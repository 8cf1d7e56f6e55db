#include "compute/cuda/runtime.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

#include "util/error.h"

namespace strata::compute::cuda {

void throw_cuda_error(cudaError_t code, const char* expr, const char* file, int line) {
  fail("CUDA: {} failed at {}:{}: {} ({})", expr, file, line, cudaGetErrorName(code),
       cudaGetErrorString(code));
}

void cuda_fail(const std::string& message) { throw Error(message); }

bool usable_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error for later callers
    return false;
  }
  return count > 0;
}

bool dependent_launch_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("STRATA_CUDA_PDL");
    if (env && std::string_view(env) == "0") return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return enabled;
}

void check_launch_shape(dim3 grid, dim3 block, size_t shared_bytes) {
  struct Limits {
    int grid[3], block[3], threads, shared_optin;
  };
  static const Limits limits = [] {
    Limits l{};
    int device = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    const cudaDeviceAttr grid_attrs[3] = {cudaDevAttrMaxGridDimX, cudaDevAttrMaxGridDimY, cudaDevAttrMaxGridDimZ};
    const cudaDeviceAttr block_attrs[3] = {cudaDevAttrMaxBlockDimX, cudaDevAttrMaxBlockDimY, cudaDevAttrMaxBlockDimZ};
    for (int i = 0; i < 3; ++i) {
      STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&l.grid[i], grid_attrs[i], device));
      STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&l.block[i], block_attrs[i], device));
    }
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&l.threads, cudaDevAttrMaxThreadsPerBlock, device));
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&l.shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return l;
  }();
  const unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
  for (int i = 0; i < 3; ++i) {
    if (g[i] == 0 || g[i] > unsigned(limits.grid[i]))
      cuda_fail(fmt::format("CUDA launch: grid ({}, {}, {}) is empty or beyond the device's ({}, {}, {})", g[0], g[1],
                            g[2], limits.grid[0], limits.grid[1], limits.grid[2]));
    if (b[i] == 0 || b[i] > unsigned(limits.block[i]))
      cuda_fail(fmt::format("CUDA launch: block ({}, {}, {}) is empty or beyond the device's ({}, {}, {})", b[0], b[1],
                            b[2], limits.block[0], limits.block[1], limits.block[2]));
  }
  if (uint64_t(b[0]) * b[1] * b[2] > uint64_t(limits.threads))
    cuda_fail(fmt::format("CUDA launch: block ({}, {}, {}) has more threads than the device's {}", b[0], b[1], b[2],
                          limits.threads));
  if (shared_bytes > size_t(limits.shared_optin))
    cuda_fail(fmt::format("CUDA launch: {} bytes of dynamic shared memory exceed the device's {} per block",
                          shared_bytes, limits.shared_optin));
}

std::string describe_device() {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no usable CUDA device ({})", cudaGetErrorString(code));
  }
  if (count == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB)", prop.name, prop.major, prop.minor,
                     prop.multiProcessorCount, double(prop.totalGlobalMem) / double(1ull << 30));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (const cudaError_t code = cudaMalloc(&data_, bytes + kDevicePadBytes);
      code == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: the context stays usable
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    data_ = nullptr;
    // The start check (compute/gpu_memory_plan.h) counted the weights, the expert arena and the
    // first windows' states; what grows later (KV past its first capacity, more sequences) lands
    // here.
    fail(
        "CUDA: out of device memory: {:.1f} MiB asked for, {:.1f} MiB free of {:.1f} MiB on {} "
        "(a longer context or more sequences than the start check counted: lower --gpu-budget "
        "or --ctx)",
        double(bytes) / (1 << 20), double(free_bytes) / (1 << 20), double(total_bytes) / (1 << 20),
        describe_device());
  } else {
    STRATA_CUDA_CHECK(code);
  }
  // The pad is read (never used) by aligned over-reads; keep it defined for the sanitizer.
  STRATA_CUDA_CHECK(cudaMemset(static_cast<char*>(data_) + bytes, 0, kDevicePadBytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_)
    fail("DeviceBuffer::upload: {} bytes at offset {} exceed the buffer's {}", bytes, offset, bytes_);
  STRATA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return once the bytes are staged, before the DMA into
  // the buffer is done (CUDA's "API synchronization behavior"), and the backend's streams are
  // non-blocking, so nothing orders their kernels after that DMA: wait for it here.
  STRATA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_)
    fail("DeviceBuffer::download: {} bytes at offset {} exceed the buffer's {}", bytes, offset, bytes_);
  STRATA_CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
}

Stream::Stream() { STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}

void Stream::synchronize() const { STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace strata::compute::cuda
