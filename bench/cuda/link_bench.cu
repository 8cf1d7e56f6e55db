// bench_cuda_link: what one dependent step of a decode window costs, four ways. A decode token on
// the GPU is a chain of ~27 dependent small kernels a layer (docs/bench-cuda.md, sessions 39-45),
// each ~2.5 µs in a replayed graph while its bytes would take a fraction of that: the question
// this answers is how much of a step is the kernel boundary itself, and what a chain of stages
// inside ONE launch (blocks handing data on through counters in L2, the persistent-kernel route)
// would save.
//
// The chain: S stages, each a small matvec v[s+1] = W[s] · v[s] (R rows of W int8 values, W
// rows apart in memory, v float), every stage reading all of the previous stage's output, so
// each step is a full dependency, as between two of the window's kernels. The weights of all
// stages (S · R · W bytes) exceed the L2, so they come from HBM as a decode token's do.
//   graph         one kernel per stage, captured into a CUDA graph, plain launches
//   graph+pdl     the same with programmatic dependent launch (the backend's launch.cuh): each
//                 kernel prefetches its weight rows into L2 before griddepcontrol.wait
//   pdl+regs      as graph+pdl, but each warp LOADS its rows' weights into registers before the
//                 wait (weights are never written, so the launch.cuh contract allows it)
//   pdl+smem      as graph+pdl, the block's weight rows copied into shared memory (cp.async)
//                 before the wait: overlap without holding registers
//   chain         one launch of G co-resident blocks running every stage: a block waits until
//                 all G blocks have published stage s-1 (an acquire load of a counter in L2),
//                 computes its rows, then publishes (release add)
//   chain+regs    as chain, but each warp loads its next rows' weights into registers BEFORE the
//                 wait, so the HBM latency of the weights overlaps the dependency
// Every variant's output is checked against the plain graph's (bitwise: the same per-row order).
// Prints µs per stage (median of 15 timed runs after 3 warm-ups) for each G.
//   bench_cuda_link [--stages 256] [--rows 1024] [--width 1024] [--blocks 16,32,66,132]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

#define CHECK(call)                                                                                     \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxWidth = 2048;  // 64 int8 weights a lane at most (the register variant's load)

__device__ __forceinline__ void pdl_wait_then_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// One row's dot product, lane-strided 4 values at a time, then the butterfly: the same order in
// every variant, so their outputs are bitwise equal.
__device__ __forceinline__ float row_dot(const int8_t* w, const float* v, int width) {
  const int lane = int(threadIdx.x) & 31;
  float acc = 0.0f;
  for (int i = lane * 4; i < width; i += 128) {
    const char4 q = *reinterpret_cast<const char4*>(w + i);
    const float4 x = *reinterpret_cast<const float4*>(v + i);
    acc = fmaf(float(q.x), x.x, acc);
    acc = fmaf(float(q.y), x.y, acc);
    acc = fmaf(float(q.z), x.z, acc);
    acc = fmaf(float(q.w), x.w, acc);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

// The scale keeps values bounded along the chain (no inf/NaN after 256 stages).
__device__ __forceinline__ float squash(float a, int width) { return tanhf(a / float(width)); }

// Block b of G computes rows [b·R/G, (b+1)·R/G) of one stage, a warp per row.
__device__ void stage_rows(const int8_t* w, const float* v_in, float* v_out, int rows, int width, int block,
                           int n_blocks) {
  const int per_block = (rows + n_blocks - 1) / n_blocks;
  const int first = block * per_block, last = min(rows, first + per_block);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  for (int r = first + warp; r < last; r += kWarps) {
    const float a = row_dot(w + size_t(r) * width, v_in, width);
    if (lane == 0) v_out[r] = squash(a, width);
  }
}

__global__ void stage_kernel(const int8_t* w, const float* v_in, float* v_out, int rows, int width, int pdl) {
  if (pdl) {
    // The weights are never written: prefetch this block's rows before the wait (as matmul.h does).
    const int per_block = (rows + int(gridDim.x) - 1) / int(gridDim.x);
    const int first = int(blockIdx.x) * per_block, last = min(rows, first + per_block);
    const size_t begin = size_t(first) * width, end = size_t(last) * width;
    for (size_t i = begin + size_t(threadIdx.x) * 128; i < end; i += size_t(kThreads) * 128) prefetch_l2(w + i);
    pdl_wait_then_release();
  }
  stage_rows(w, v_in, v_out, rows, width, int(blockIdx.x), int(gridDim.x));
}

// All stages in one launch. v holds S + 1 vectors of `rows` floats (rows == width). done[s]
// counts the blocks that have published stage s.
__global__ void chain_kernel(const int8_t* w, float* v, int* done, int stages, int rows, int width) {
  const size_t matrix = size_t(rows) * width;
  for (int s = 0; s < stages; ++s) {
    if (s > 0) {
      if (threadIdx.x == 0)
        while (load_acquire(done + s - 1) < int(gridDim.x)) {
        }
      __syncthreads();
    }
    stage_rows(w + size_t(s) * matrix, v + size_t(s) * rows, v + size_t(s + 1) * rows, rows, width,
               int(blockIdx.x), int(gridDim.x));
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      add_release(done + s, 1);
    }
  }
}

// The register variants: each warp's rows of a stage (at most kRowsPerWarp, width <= kMaxWidth)
// loaded into registers, then the dot products from them, in row_dot's order.
constexpr int kRowsPerWarp = 4;
constexpr int kChunks = kMaxWidth / 128;  // 4-byte chunks a lane holds per row
struct WarpRows {
  char4 q[kRowsPerWarp][kChunks];
};

__device__ __forceinline__ void block_rows(int rows, int& first, int& last) {
  const int per_block = (rows + int(gridDim.x) - 1) / int(gridDim.x);
  first = int(blockIdx.x) * per_block;
  last = min(rows, first + per_block);
}

__device__ __forceinline__ void load_rows(const int8_t* w, int width, int first, int last, WarpRows& rows) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int r = first + warp + j * kWarps;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int i = lane * 4 + c * 128;
      rows.q[j][c] = r < last && i < width ? *reinterpret_cast<const char4*>(w + size_t(r) * width + i) : char4{};
    }
  }
}

__device__ __forceinline__ void dot_rows(const WarpRows& rows, const float* v_in, float* v_out, int width, int first,
                                         int last) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int r = first + warp + j * kWarps;
    if (r >= last) break;
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int i = lane * 4 + c * 128;
      if (i < width) {
        const float4 x = *reinterpret_cast<const float4*>(v_in + i);
        acc = fmaf(float(rows.q[j][c].x), x.x, acc);
        acc = fmaf(float(rows.q[j][c].y), x.y, acc);
        acc = fmaf(float(rows.q[j][c].z), x.z, acc);
        acc = fmaf(float(rows.q[j][c].w), x.w, acc);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) v_out[r] = squash(acc, width);
  }
}

// One stage a launch with PDL, the block's weights loaded into registers before
// griddepcontrol.wait (not only prefetched into L2): the load itself overlaps the previous grid.
__global__ void pdl_regs_kernel(const int8_t* w, const float* v_in, float* v_out, int rows, int width) {
  int first, last;
  block_rows(rows, first, last);
  WarpRows mine;
  load_rows(w, width, first, last, mine);
  pdl_wait_then_release();
  dot_rows(mine, v_in, v_out, width, first, last);
}

// One stage a launch with PDL, the block's weight rows copied into shared memory (cp.async, 16
// bytes a thread at a time) before griddepcontrol.wait: the copy overlaps the previous grid and,
// unlike pdl+regs, costs no registers, so the next grid's blocks fit beside the running ones.
// Dynamic shared memory: the block's rows · width bytes.
__global__ void pdl_smem_kernel(const int8_t* w, const float* v_in, float* v_out, int rows, int width) {
  extern __shared__ __align__(16) int8_t staged[];
  int first, last;
  block_rows(rows, first, last);
  const int bytes = (last - first) * width;
  const int8_t* src = w + size_t(first) * width;
  for (int i = int(threadIdx.x) * 16; i < bytes; i += kThreads * 16) {
    const unsigned dst = unsigned(__cvta_generic_to_shared(staged + i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src + i) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  pdl_wait_then_release();
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  for (int r = first + warp; r < last; r += kWarps) {
    const float a = row_dot(staged + size_t(r - first) * width, v_in, width);
    if (lane == 0) v_out[r] = squash(a, width);
  }
}

// As chain_kernel, each warp's rows of stage s loaded into registers before waiting for s - 1.
__global__ void chain_regs_kernel(const int8_t* w, float* v, int* done, int stages, int rows, int width) {
  const size_t matrix = size_t(rows) * width;
  int first, last;
  block_rows(rows, first, last);
  for (int s = 0; s < stages; ++s) {
    WarpRows mine;
    load_rows(w + size_t(s) * matrix, width, first, last, mine);
    if (s > 0) {
      if (threadIdx.x == 0)
        while (load_acquire(done + s - 1) < int(gridDim.x)) {
        }
      __syncthreads();
    }
    dot_rows(mine, v + size_t(s) * rows, v + size_t(s + 1) * rows, width, first, last);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      add_release(done + s, 1);
    }
  }
}

// kind: 0 plain kernel, 1 registers before the wait, 2 shared memory before the wait.
void launch_stage(const int8_t* w, const float* v_in, float* v_out, int rows, int width, int blocks, bool pdl,
                  int kind, cudaStream_t stream) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  if (kind == 1) {
    CHECK(cudaLaunchKernelEx(&config, pdl_regs_kernel, w, v_in, v_out, rows, width));
    return;
  }
  if (kind == 2) {
    config.dynamicSmemBytes = size_t((rows + blocks - 1) / blocks) * width;
    CHECK(cudaLaunchKernelEx(&config, pdl_smem_kernel, w, v_in, v_out, rows, width));
    return;
  }
  CHECK(cudaLaunchKernelEx(&config, stage_kernel, w, v_in, v_out, rows, width, int(pdl)));
}

// Median ms of `run` over 15 timed runs after 3 warm-ups.
double median_ms(const std::function<void()>& run, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int r = 0; r < 18; ++r) {
    CHECK(cudaEventRecord(start, stream));
    run();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, start, stop));
    if (r >= 3) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]);
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int stages = 256, rows = 1024, width = 1024;
  std::vector<int> block_counts = {16, 32, 66, 132};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--stages") stages = std::atoi(argv[i + 1]);
    else if (key == "--rows") rows = std::atoi(argv[i + 1]);
    else if (key == "--width") width = std::atoi(argv[i + 1]);
    else if (key == "--blocks") block_counts = parse_list(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  if (rows != width || width % 128 != 0 || width > kMaxWidth || stages < 2) {
    std::fprintf(stderr, "expected --rows == --width, a multiple of 128 up to %d, and --stages >= 2\n", kMaxWidth);
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const size_t matrix = size_t(rows) * width, weight_bytes = matrix * size_t(stages);
  std::printf("device %s, %d SMs, L2 %.0f MiB; %d stages of %d x %d int8 (%.1f MiB of weights, %.1f x the L2)\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, stages, rows, width,
              weight_bytes / 1048576.0, double(weight_bytes) / prop.l2CacheSize);

  std::vector<int8_t> host_w(weight_bytes);
  std::mt19937 rng(7);
  for (auto& b : host_w) b = int8_t(int(rng() % 255) - 127);
  std::vector<float> host_v0(static_cast<size_t>(rows));
  for (auto& x : host_v0) x = float(int(rng() % 2001) - 1000) / 1000.0f;
  int8_t* w = nullptr;
  float* v = nullptr;  // stages + 1 vectors
  int* done = nullptr;
  CHECK(cudaMalloc(&w, weight_bytes));
  CHECK(cudaMalloc(&v, size_t(stages + 1) * rows * sizeof(float)));
  CHECK(cudaMalloc(&done, size_t(stages) * sizeof(int)));
  CHECK(cudaMemcpy(w, host_w.data(), weight_bytes, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto reset_v = [&] {
    CHECK(cudaMemsetAsync(v + rows, 0, size_t(stages) * rows * sizeof(float), stream));
    CHECK(cudaMemcpyAsync(v, host_v0.data(), size_t(rows) * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(cudaStreamSynchronize(stream));
  };
  auto last_vector = [&] {
    std::vector<float> out(static_cast<size_t>(rows));
    CHECK(cudaMemcpy(out.data(), v + size_t(stages) * rows, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  };

  std::printf("%8s %14s %14s %14s %14s %14s %14s   (µs per stage; a stage's %.2f MiB at 3 TB/s: %.2f µs)\n",
              "blocks", "graph", "graph+pdl", "pdl+regs", "pdl+smem", "chain", "chain+regs", matrix / 1048576.0,
              matrix / 3e6);
  CHECK(cudaFuncSetAttribute(pdl_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(prop.sharedMemPerBlockOptin)));
  for (const int blocks : block_counts) {
    if (blocks < 1 || blocks > prop.multiProcessorCount) {
      std::printf("%8d skipped: 1 .. %d blocks (one a SM, so all are co-resident)\n", blocks, prop.multiProcessorCount);
      continue;
    }
    constexpr int kVariants = 6;  // graph, graph+pdl, pdl+regs, pdl+smem, chain, chain+regs
    double us[kVariants];
    bool same[kVariants] = {true, true, true, true, true, true};
    std::vector<float> reference;
    const int per_warp = ((rows + blocks - 1) / blocks + kWarps - 1) / kWarps;
    const bool regs_fit = per_warp <= kRowsPerWarp;
    for (int variant = 0; variant < kVariants; ++variant) {
      const bool regs = variant == 2 || variant == 5;
      const size_t smem = size_t((rows + blocks - 1) / blocks) * width;
      if ((regs && !regs_fit) || (variant == 3 && smem > size_t(prop.sharedMemPerBlockOptin))) {
        us[variant] = -1;
        continue;
      }
      reset_v();
      if (variant < 4) {
        cudaGraph_t graph;
        CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
        for (int s = 0; s < stages; ++s)
          launch_stage(w + size_t(s) * matrix, v + size_t(s) * rows, v + size_t(s + 1) * rows, rows, width, blocks,
                       variant > 0, variant == 2 ? 1 : variant == 3 ? 2 : 0, stream);
        CHECK(cudaStreamEndCapture(stream, &graph));
        cudaGraphExec_t exec;
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        us[variant] = median_ms([&] { CHECK(cudaGraphLaunch(exec, stream)); }, stream) * 1e3 / stages;
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
      } else {
        auto run = [&] {
          CHECK(cudaMemsetAsync(done, 0, size_t(stages) * sizeof(int), stream));
          if (regs)
            chain_regs_kernel<<<blocks, kThreads, 0, stream>>>(w, v, done, stages, rows, width);
          else
            chain_kernel<<<blocks, kThreads, 0, stream>>>(w, v, done, stages, rows, width);
          CHECK(cudaGetLastError());
        };
        us[variant] = median_ms(run, stream) * 1e3 / stages;
      }
      const std::vector<float> out = last_vector();
      if (variant == 0) reference = out;
      else same[variant] = std::memcmp(out.data(), reference.data(), out.size() * 4) == 0;
    }
    std::printf("%8d", blocks);
    for (int variant = 0; variant < kVariants; ++variant) {
      if (us[variant] < 0) std::printf(" %14s", "n/a");
      else std::printf(" %11.2f%s", us[variant], same[variant] ? "   " : " !=");
    }
    std::printf("\n");
  }
  std::printf("(!= marks a variant whose last vector differs from the plain graph's: a bug)\n");
  CHECK(cudaFree(w));
  CHECK(cudaFree(v));
  CHECK(cudaFree(done));
  return 0;
}
