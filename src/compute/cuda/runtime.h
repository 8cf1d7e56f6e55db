// CUDA runtime helpers shared by the CUDA backend's host code: error checks that throw
// strata::Error, RAII device memory and streams, and the one question every command asks first
// ("is there a usable CUDA device?").
//
// Contract
// - STRATA_CUDA_CHECK(expr) throws strata::Error naming the call, the file:line and CUDA's error
//   name and text when expr does not return cudaSuccess. Kernel launches are followed by
//   STRATA_CUDA_CHECK(cudaGetLastError()) at the launch site (launch_check()).
// - DeviceBuffer owns one cudaMalloc'd region (plus kDevicePadBytes of slack so the kernels'
//   aligned over-reads of 2-byte-aligned blocks stay inside the allocation); move-only.
// - Stream owns one non-blocking cudaStream_t; move-only.
// - usable_device() never throws: false when the driver, a device or the runtime is missing.
// - Thread safety: the helpers hold no shared state; a DeviceBuffer or Stream is used by one
//   thread at a time (the backend's window thread).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace strata::compute::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t code, const char* expr, const char* file, int line);
// Throws strata::Error(message); for .cu files, which do not include fmt (nvcc's front end).
[[noreturn]] void cuda_fail(const std::string& message);

inline void check(cudaError_t code, const char* expr, const char* file, int line) {
  if (code != cudaSuccess) throw_cuda_error(code, expr, file, line);
}
#define STRATA_CUDA_CHECK(expr) ::strata::compute::cuda::check((expr), #expr, __FILE__, __LINE__)

// Bytes every DeviceBuffer allocates past its size (see the contract).
inline constexpr size_t kDevicePadBytes = 64;

// Programmatic dependent launch (launch.cuh): on for devices of compute capability >= 9.0 unless
// STRATA_CUDA_PDL=0; decided once per process.
bool dependent_launch_enabled();

// Checks a launch shape against the current device's limits (grid dimensions, threads per block,
// dynamic shared memory up to the opt-in maximum), read once per process: a shape beyond them
// throws strata::Error naming the shape and the limit, before anything is launched or captured
// (CUDA itself would fail the launch with a bare "invalid argument", or inside a graph capture).
// launch() (launch.cuh) calls it for every kernel.
void check_launch_shape(dim3 grid, dim3 block, size_t shared_bytes);

// True when a CUDA device can be used by this process (driver and device present).
bool usable_device();
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" for device 0, or why none is usable.
std::string describe_device();

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  // Synchronous copies (tests, set-up): upload returns once the bytes are in the buffer, so any
  // stream may use them next; the hot path uses the async copies of its stream.
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&&) = delete;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace strata::compute::cuda
