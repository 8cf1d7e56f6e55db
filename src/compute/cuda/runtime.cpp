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
  STRATA_CUDA_CHECK(cudaMalloc(&data_, bytes + kDevicePadBytes));
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
