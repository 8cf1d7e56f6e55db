// The CUDA quantized matmul's kernels and their launches (internal to compute/cuda/, included
// only by matmul/*.cu): one generic warp-per-row kernel and the staged kernel, instantiated per
// weight type (quant/*.cuh), rows per pass NR, rows per warp RW and (staged) activations in shared
// memory; launch_matmul<Q> (declared in matmul_plan.cuh) picks the instantiation of each pass.
//
// Why apart from matmul.cu: ~3.5 min of compile time as one translation unit (matmul_plan.cuh).
// Each matmul/*.cu explicitly instantiates launch_matmul<Q> for its types, so every kernel is
// compiled in exactly one file and a parallel build runs the files side by side.
//
// Decode tables: quant/iq2xs.cuh and quant/iq_lowbit.cuh define them as __device__ variables.
// Without relocatable device code (kept off: it slows kernels and links) every translation unit
// that includes them has its own device copy and its own host shadow (internal linkage), so the
// file whose kernels read a table uploads its own copy: upload_tables<Q>, specialised there.
//
// Per-kernel state: launch_staged_kernel's `raised` flag is a function-local static of each
// instantiation, which lives in exactly one matmul/*.cu, as the kernel it guards does.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "compute/cuda/launch.cuh"
#include "compute/cuda/matmul_plan.cuh"
#include "compute/cuda/quant/activation_store.cuh"
#include "compute/cuda/runtime.h"

namespace strata::compute::cuda::matmul_detail {

// Copies this translation unit's decode table of Q (a type with Q::kTableBytes > 0) to the
// device, once; launch_matmul<Q> calls it first. Specialised in the matmul/*.cu that instantiates
// Q's kernels (no generic definition: a missing one fails at link time).
template <class Q>
void upload_tables();

// Copies a host table into the caller's translation unit's copy of a __device__ table (its host
// shadow `device`) of the same size.
template <typename Device, size_t N, typename Host, size_t M>
void upload_table(Device (&device)[N], const Host (&host)[M]) {
  static_assert(sizeof(device) == sizeof(host));
  STRATA_CUDA_CHECK(cudaMemcpyToSymbol(device, host, sizeof(device)));
}

// ---- the matmul kernel -----------------------------------------------------------------------

// L2 prefetch hints for the bytes of rows [first, first + n) of a dense matrix, spread over the
// lanes of a warp. Issued before the dependency wait: the weights are never written by a kernel
// of the stream (matmul.h), and a prefetch is only a hint, so the loads after the wait see
// exactly what they would without it; the HBM latency overlaps the previous kernel's tail.
__device__ __forceinline__ void prefetch_rows_l2(const uint8_t* w, size_t row_stride, int64_t first, int n,
                                                 int64_t n_out, size_t row_bytes, int lane) {
  for (int i = 0; i < n && first + i < n_out; ++i) {
    const uintptr_t row = reinterpret_cast<uintptr_t>(w + size_t(first + i) * row_stride);
    for (uintptr_t line = (row & ~uintptr_t(127)) + 128 * uintptr_t(lane); line < row + row_bytes; line += 128 * 32)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
}

// What a block of either matmul kernel works on, decided after the wait for the previous kernel
// (the expert list, row lists and slot map are written by the stream's routing kernels): the
// activation rows of its pass, rows[0, nr) with nr <= NR; its outputs, y moved to the pass's first
// row (for an expert: that expert's row list, and grid rows n_listed and on write the second
// matrix's outputs to p.second_y); and for an expert its matrix, w moved into the expert's
// resident slot at the matrix's offset, where `stages` starts copying it (StageIssuer::start; the
// direct kernel passes NoStages). Shared by quant_matmul_kernel and staged_matmul_kernel so the
// two cannot read MatmulArgs' pass and expert fields differently.
//
// w, row_stride, n_out and y are the block's matrix and outputs as the kernel chose them (its
// dense target, or p's fields). All four are taken by reference, row_stride unread, and the staged
// kernel's first stages go through `stages` rather than a callback: of the forms tried, the one
// whose SASS (nvcc 13.0, sm_90a) stays closest to the prologue written out in each kernel. Every
// staged kernel is byte-identical to it, as is the direct kernel for the float types, Q8_0,
// IQ4_NL, IQ2_XS, Q4_K and Q6_K; for the other types the direct kernel loads the four fields in
// the reverse order, which reschedules it (same registers, instruction counts within 3).
//
// An expert missing from the slot map gets NaN outputs, written by the lanes lane_in,
// lane_in + lanes, ... of the lane group `group` (RW rows each) from first_row on, and false is
// returned: the block returns without computing.
struct NoStages {
  __device__ __forceinline__ void start(const uint8_t*, int) {}
};

template <int NR, int RW, class Stages>
__device__ __forceinline__ bool select_pass(const MatmulArgs& p, const uint8_t*& w,
                                            [[maybe_unused]] const size_t& row_stride, const int64_t& n_out, float*& y,
                                            int (&rows)[NR], int& nr, int64_t first_row, int64_t row_step, int group,
                                            int lane_in, int lanes, Stages& stages) {
  if (p.expert_ids) {
    int j = blockIdx.y;
    size_t matrix_offset = p.matrix_offset;
    if (p.second_y && j >= p.n_listed) {
      j -= p.n_listed;
      matrix_offset = p.second_offset;
      y = p.second_y;
    }
    nr = min(max(p.row_counts[j] - p.row_pass, 0), NR);
#pragma unroll
    for (int r = 0; r < NR; ++r) rows[r] = r < nr ? p.row_ids[size_t(j) * p.max_rows + p.row_pass + r] : 0;
    y += (size_t(j) * p.max_rows + p.row_pass) * size_t(n_out);
    const uint32_t slot = p.smap_layer[p.expert_ids[j]];
    if (slot == kSlotMiss) {  // the caller broke the residency promise: make it visible
      for (int64_t o = first_row + group * RW; o < n_out; o += row_step)
        for (int i = 0; i < RW; ++i)
          for (int r = lane_in; r < nr; r += lanes)
            if (o + i < n_out) y[size_t(r) * n_out + o + i] = __int_as_float(0x7fc00000);
      return false;
    }
    w += size_t(slot) * p.slot_bytes + matrix_offset;
    stages.start(w, lane_in);
  } else {
    nr = min(p.n_rows - p.row_pass, NR);
#pragma unroll
    for (int r = 0; r < NR; ++r) rows[r] = p.row_pass + r;
    y += size_t(p.row_pass) * size_t(n_out);
  }
  return true;
}

// Types describe a unit as decode / load_act / dot (preferred: activations are loaded once for
// all the weight rows of a warp) or as one unit<NR>() doing all three.
template <class Q>
constexpr bool kHasDecode = requires { typename Q::Decoded; };

// Units per lane per loop trip: the type's kUnroll, else 2.
template <class Q>
constexpr int unroll_of() {
  if constexpr (requires { Q::kUnroll; }) return Q::kUnroll;
  else return 2;
}

// The in-block quantizer (MatmulArgs::in_prologue): the pass's nr activation rows computed by
// the whole block from p.in_a / p.in_b through the prologue and quantized into `shared` in
// SharedActView's layout (rows 0 .. nr - 1), with the quantizer kernels' own per-block arithmetic
// (activation_store.cuh: load8_elementwise, store_q8_K_block, store_q8_0_block), so the view holds
// the bytes quantize_activations_fused writes and every dot reads the same activations. Q8_K: one
// warp per 256-value block; Q8_0: four lanes per 32-value block, every lane of the block through
// every trip (the stores' shuffles). The caller synchronises the block before reading the view.
template <class Q, int NR>
__device__ __forceinline__ SharedActView quantize_in_block(const MatmulArgs& p, const int (&rows)[NR], int nr,
                                                           uint8_t* shared) {
  constexpr bool kQ8K = Q::kActivation == GgmlType::Q8_K;
  const int n_in = int(p.n_in);
  const int scale_count = n_in / (kQ8K ? 256 : 32), sum_count = n_in / (kQ8K ? 16 : 32);
  const int row_bytes = padded_qs_row_bytes(n_in);
  const SharedActView view{shared,
                           row_bytes,
                           reinterpret_cast<const float*>(shared + nr * row_bytes),
                           scale_count,
                           reinterpret_cast<const int32_t*>(shared + nr * row_bytes + 4 * nr * scale_count),
                           sum_count};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if constexpr (kQ8K) {
    const int blocks_per_row = n_in / 256;
    for (int task = warp; task < nr * blocks_per_row; task += kWarpsPerBlock) {
      const int r = task / blocks_per_row, b = task % blocks_per_row;
      float v[8];
      load8_elementwise(p.in_prologue, p.in_a, p.in_b, p.in_scale, int64_t(rows[r]) * n_in + b * 256 + 8 * lane, v);
      store_q8_K_block(v, lane, r, b, view);
    }
  } else {
    const int blocks_per_row = n_in / 32, total = nr * blocks_per_row;
    for (int first = 0; first < total; first += kWarpsPerBlock * 8) {
      const int block = first + int(threadIdx.x >> 2), part = int(threadIdx.x & 3);
      const bool active = block < total;
      const int r = active ? block / blocks_per_row : 0, b = active ? block % blocks_per_row : 0;
      float v[8] = {};
      if (active) load8_elementwise(p.in_prologue, p.in_a, p.in_b, p.in_scale, int64_t(rows[r]) * n_in + b * 32 + 8 * part, v);
      store_q8_0_block(v, part, active, r, b, view);
    }
  }
  return view;
}

// One warp computes RW consecutive output rows (their units interleaved in each trip, so the
// warp has RW rows' loads in flight) for nr <= NR activation rows. Each output's arithmetic is
// exactly that of RW = 1: the per-row sum order never depends on RW, NR or nr.
//
// Narrow rows (fewer than 32 units: IQ2_XS experts' 1024- and 512-wide gate/up and down, 16 and
// 8 units) take p.lanes < 32 lanes each, 32 / p.lanes groups of RW rows per warp: the expert
// launches then fit one wave of the GPU instead of two (bench_cuda_latency). Bitwise the same as
// a full warp per row: there lanes >= the unit count hold +0 (an accumulator that starts at +0
// never becomes -0), so the butterfly's first steps add exact zeros and the rest is the same
// tree over the first p.lanes lanes, which is the sub-group's butterfly.
//
// kInBlock: the activations come from quantize_in_block (above) instead of p.act, the same bytes
// read the same way, so the outputs are bitwise those of the quantizer's launch + this kernel.
template <class Q, int NR, int RW, bool kInBlock = false>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) quant_matmul_kernel(MatmulArgs p) {
  extern __shared__ __align__(16) uint8_t table[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint8_t* w = p.w;
  size_t row_stride = p.row_stride;
  int64_t n_out = p.n_out;
  float* y = p.y;
  if (p.n_dense > 0) {
    const DenseTarget& d = p.dense[blockIdx.y];
    w = d.w;
    row_stride = d.row_stride;
    n_out = d.n_out;
    y = d.y;
  }
  const int lanes = p.lanes, groups = 32 / lanes;
  const int group = lane / lanes, lane_in = lane % lanes;
  const int64_t first_row = (int64_t(blockIdx.x) * kWarpsPerBlock + warp) * RW * groups;
  const int64_t row_step = int64_t(gridDim.x) * kWarpsPerBlock * RW * groups;
  const size_t row_bytes = size_t(p.n_in / Q::kBlockElems) * Q::kBlockBytes;
  // Before the wait for the previous kernel (launch.cuh): only what no kernel of the stream writes,
  // the type's constant decode table and prefetches of a dense matrix's first rows.
  if constexpr (Q::kTableBytes > 0) Q::load_table(table);
  if (!p.expert_ids) prefetch_rows_l2(w, row_stride, first_row, RW * groups, n_out, row_bytes, lane);
  pdl_begin();
  if constexpr (Q::kTableBytes > 0) __syncthreads();
  int rows[NR];
  int nr;
  NoStages no_stages;
  if (!select_pass<NR, RW>(p, w, row_stride, n_out, y, rows, nr, first_row, row_step, group, lane_in, lanes, no_stages))
    return;  // the whole block (its expert is the block's)
  [[maybe_unused]] SharedActView in_block{};
  if constexpr (kInBlock) {
    in_block = quantize_in_block<Q, NR>(p, rows, nr, table + p.table_bytes);
    __syncthreads();
  }
  const int n_units = int(p.n_in / Q::kBlockElems) * Q::kUnitsPerBlock;
  for (int64_t o_warp = first_row; o_warp < n_out; o_warp += row_step) {
    const int64_t o = o_warp + group * RW;  // this lane group's first row
    const uint8_t* wrow[RW];
#pragma unroll
    for (int i = 0; i < RW; ++i) wrow[i] = w + size_t(min(o + i, n_out - 1)) * row_stride;  // past the end: recompute the last row, never stored
    float acc[RW][NR];
#pragma unroll
    for (int i = 0; i < RW; ++i)
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[i][r] = 0.0f;
    // kUnroll units per lane per trip, their loads issued together: one unit in flight per warp
    // was latency-bound (in-order issue stalls at the first use). The sum order is unchanged:
    // units lane, lane+32, lane+64, ... in increasing order (lanes < 32: one unit per lane).
    constexpr int kUnroll = unroll_of<Q>();
    for (int u0 = lane_in; u0 < n_units; u0 += lanes * kUnroll) {
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int u = u0 + lanes * k;
        if (u >= n_units) break;
        if constexpr (kHasDecode<Q>) {
          // Each weight unit decoded once, each activation unit loaded once per row and used
          // for all RW weight rows.
          typename Q::Decoded decoded[RW];
#pragma unroll
          for (int i = 0; i < RW; ++i) decoded[i] = Q::decode(wrow[i], u, table);
#pragma unroll
          for (int r = 0; r < NR; ++r) {
            if (r < nr) {
              typename Q::Act a;
              if constexpr (kInBlock) a = Q::load_act(in_block, r, u);
              else a = Q::load_act(p.act, rows[r], u);
#pragma unroll
              for (int i = 0; i < RW; ++i) acc[i][r] = Q::dot(decoded[i], a, acc[i][r]);
            }
          }
        } else {
#pragma unroll
          for (int i = 0; i < RW; ++i) Q::template unit<NR>(wrow[i], u, p.act, rows, nr, table, acc[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < RW; ++i)
#pragma unroll
      for (int r = 0; r < NR; ++r) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
          if (off < lanes) acc[i][r] = __fadd_rn(acc[i][r], __shfl_xor_sync(0xffffffffu, acc[i][r], off));
      }
    if (lane_in == 0) {
#pragma unroll
      for (int i = 0; i < RW; ++i)
#pragma unroll
        for (int r = 0; r < NR; ++r)
          if (r < nr && o + i < n_out) y[size_t(r) * n_out + o + i] = acc[i][r];
    }
  }
}

// ---- wide rows (matmul.h wide_rows) -----------------------------------------------------------

// A dense matrix of few, wide rows (the hyper-connection's 10240-wide down and inject, routers):
// one warp a row left most SMs idle, each warp walking its long row alone. Here WPR warps share a
// row: warp part p takes units 32·p + lane, + 32·WPR, ... in increasing order (the type's kUnroll
// per trip, as quant_matmul_kernel), reduces them with the full butterfly, and part 0's lane 0
// adds the WPR partial sums in part order. That order is fixed by the row's width and WPR, which
// the host chooses from the matrix alone (wide_warps_per_row), so a row's result is the same in
// every window (T = 1 or T = k) and every pass. Every block walks its row groups the same number
// of times (teams past the end recompute the last row and store nothing), so __syncthreads is
// reached by all its threads.
template <class Q, int NR, int WPR>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) wide_matmul_kernel(MatmulArgs p) {
  static_assert(kWarpsPerBlock % WPR == 0);
  constexpr int kTeams = kWarpsPerBlock / WPR;
  extern __shared__ __align__(16) uint8_t table[];
  __shared__ float partial[kWarpsPerBlock][NR];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int team = warp / WPR, part = warp % WPR;
  const uint8_t* w = p.w;
  size_t row_stride = p.row_stride;
  int64_t n_out = p.n_out;
  float* y = p.y;
  if (p.n_dense > 0) {
    const DenseTarget& d = p.dense[blockIdx.y];
    w = d.w;
    row_stride = d.row_stride;
    n_out = d.n_out;
    y = d.y;
  }
  const int64_t first_row = int64_t(blockIdx.x) * kTeams;
  const int64_t row_step = int64_t(gridDim.x) * kTeams;
  const size_t row_bytes = size_t(p.n_in / Q::kBlockElems) * Q::kBlockBytes;
  // Before the wait for the previous kernel: the decode table and a prefetch of the first rows.
  if constexpr (Q::kTableBytes > 0) Q::load_table(table);
  if (part == 0) prefetch_rows_l2(w, row_stride, first_row + team, 1, n_out, row_bytes, lane);
  pdl_begin();
  if constexpr (Q::kTableBytes > 0) __syncthreads();
  int rows[NR];
  int nr;
  NoStages no_stages;
  select_pass<NR, 1>(p, w, row_stride, n_out, y, rows, nr, first_row, row_step, 0, lane, 32, no_stages);  // dense: always true
  const int n_units = int(p.n_in / Q::kBlockElems) * Q::kUnitsPerBlock;
  constexpr int kUnroll = unroll_of<Q>();
  for (int64_t o_block = first_row; o_block < n_out; o_block += row_step) {
    const int64_t o = o_block + team;
    const uint8_t* wrow = w + size_t(min(o, n_out - 1)) * row_stride;  // past the end: recomputed, never stored
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
    for (int u0 = 32 * part + lane; u0 < n_units; u0 += 32 * WPR * kUnroll) {
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int u = u0 + 32 * WPR * k;
        if (u >= n_units) break;
        if constexpr (kHasDecode<Q>) {
          const typename Q::Decoded decoded = Q::decode(wrow, u, table);
#pragma unroll
          for (int r = 0; r < NR; ++r)
            if (r < nr) acc[r] = Q::dot(decoded, Q::load_act(p.act, rows[r], u), acc[r]);
        } else {
          Q::template unit<NR>(wrow, u, p.act, rows, nr, table, acc);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r] = __fadd_rn(acc[r], __shfl_xor_sync(0xffffffffu, acc[r], off));
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < NR; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();
    if (part == 0 && lane == 0 && o < n_out) {
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        if (r < nr) {
          float sum = partial[warp][r];
#pragma unroll
          for (int q = 1; q < WPR; ++q) sum = __fadd_rn(sum, partial[warp + q][r]);
          y[size_t(r) * n_out + o] = sum;
        }
      }
    }
    __syncthreads();  // the partials are read before the next row group overwrites them
  }
}

// ---- the staged kernel (MatmulTuning::staging, quant/staging.cuh) -----------------------------

// quant_matmul_kernel's arithmetic with the weights read from shared memory: each warp walks its
// groups of RW rows (a full warp per row), each row in stages of kStageUnits units; stage k + S − 1
// is copied (cp.async, issue_stage) while stage k is decoded, S = p.stages buffers per warp. A
// lane's units are l, l + 32, ... in increasing order across the stages and the reduction is the
// same butterfly, so every output is bitwise quant_matmul_kernel's. With kSharedAct the window's
// activation rows are first copied into shared memory by the whole block (copy_activations).
//
// Synchronisation, per warp: cp.async.wait_group leaves this lane's copies of stage k complete;
// the __syncwarp after it makes every lane's copies visible to every lane; the __syncwarp after
// the decode orders all of the stage's reads before the next issue() overwrites that buffer.
template <class Q, int NR, int RW, bool kSharedAct>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) staged_matmul_kernel(MatmulArgs p) {
  extern __shared__ __align__(16) uint8_t shared[];
  constexpr int kUnits = kStageUnits<RW>;
  constexpr int kRowBytes = stage_row_bytes<Q, RW>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint8_t* w = p.w;
  size_t row_stride = p.row_stride;
  int64_t n_out = p.n_out;
  float* y = p.y;
  if (p.n_dense > 0) {
    const DenseTarget& d = p.dense[blockIdx.y];
    w = d.w;
    row_stride = d.row_stride;
    n_out = d.n_out;
    y = d.y;
  }
  const int64_t first_row = (int64_t(blockIdx.x) * kWarpsPerBlock + warp) * RW;
  const int64_t row_step = int64_t(gridDim.x) * kWarpsPerBlock * RW;
  const int n_units = int(p.n_in / Q::kBlockElems) * Q::kUnitsPerBlock;
  const int n_chunks = (n_units + kUnits - 1) / kUnits;
  const int n_stages = p.stages;
  uint8_t* buffers = shared + p.table_bytes + p.act_bytes + size_t(warp) * n_stages * RW * kRowBytes;
  StageIssuer<Q, RW> issuer{buffers, w, row_stride, n_out, row_step, first_row, n_units, n_chunks, n_stages};
  // Before the wait for the previous kernel (launch.cuh): the decode table, and for a dense matrix
  // (never written by a kernel of the stream) the first stages' copies and an L2 prefetch of the
  // warp's first rows.
  if constexpr (Q::kTableBytes > 0) Q::load_table(shared);
  if (!p.expert_ids) {
    const size_t row_bytes = size_t(p.n_in / Q::kBlockElems) * Q::kBlockBytes;
    prefetch_rows_l2(w, row_stride, first_row, RW, n_out, row_bytes, lane);
    for (int k = 1; k < n_stages; ++k) issuer.next(lane);
  }
  pdl_begin();
  int rows[NR];
  int nr;
  // A full warp per row group; a missing expert: the whole block returns.
  if (!select_pass<NR, RW>(p, w, row_stride, n_out, y, rows, nr, first_row, row_step, 0, lane, 32, issuer)) return;
  [[maybe_unused]] SharedActView shared_act{};
  if constexpr (kSharedAct) shared_act = copy_activations<NR>(p.act, rows, nr, int(p.n_in), shared + p.table_bytes);
  if constexpr (Q::kTableBytes > 0 || kSharedAct) __syncthreads();
  int buffer = 0;
  for (int64_t o = first_row; o < n_out; o += row_step) {
    float acc[RW][NR];
#pragma unroll
    for (int i = 0; i < RW; ++i)
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[i][r] = 0.0f;
    for (int chunk = 0; chunk < n_chunks; ++chunk) {
      issuer.next(lane);
      if (n_stages == 3) cp_async_wait<2>();
      else cp_async_wait<1>();
      __syncwarp();
      const uint8_t* stage = buffers + buffer * RW * kRowBytes;
      const uint8_t* wrow[RW];
#pragma unroll
      for (int i = 0; i < RW; ++i) wrow[i] = staged_row<Q, RW>(stage, w, row_stride, min(o + i, n_out - 1), chunk, i);
      const int first_unit = chunk * kUnits;
#pragma unroll
      for (int k = 0; k < kUnits / 32; ++k) {
        const int u = first_unit + lane + 32 * k;
        if (u < n_units) {
          typename Q::Decoded decoded[RW];
#pragma unroll
          for (int i = 0; i < RW; ++i) decoded[i] = Q::decode(wrow[i], u - first_unit, shared);
#pragma unroll
          for (int r = 0; r < NR; ++r) {
            if (r < nr) {
              typename Q::Act a;
              if constexpr (kSharedAct) a = Q::load_act(shared_act, r, u);
              else a = Q::load_act(p.act, rows[r], u);
#pragma unroll
              for (int i = 0; i < RW; ++i) acc[i][r] = Q::dot(decoded[i], a, acc[i][r]);
            }
          }
        }
      }
      __syncwarp();
      buffer = buffer + 1 == n_stages ? 0 : buffer + 1;
    }
#pragma unroll
    for (int i = 0; i < RW; ++i)
#pragma unroll
      for (int r = 0; r < NR; ++r) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[i][r] = __fadd_rn(acc[i][r], __shfl_xor_sync(0xffffffffu, acc[i][r], off));
      }
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < RW; ++i)
#pragma unroll
        for (int r = 0; r < NR; ++r)
          if (r < nr && o + i < n_out) y[size_t(r) * n_out + o + i] = acc[i][r];
    }
  }
  cp_async_wait<0>();
}

// ---- launches -------------------------------------------------------------------------------

template <class Q, int NR, int RW, bool kInBlock = false>
void launch_nr(const MatmulArgs& args, int n_launch, cudaStream_t stream) {
  const int64_t rows_per_block = int64_t(kWarpsPerBlock) * RW * (32 / args.lanes);
  const int64_t blocks_needed = (args.n_out + rows_per_block - 1) / rows_per_block;
  // Enough blocks to fill every SM several times over (a shared-memory table costs one 4 KiB
  // copy per block, small next to the rows it serves).
  const int64_t cap = int64_t(sm_count()) * 16;
  const dim3 grid(unsigned(std::min(blocks_needed, std::max<int64_t>(1, cap / std::max(1, n_launch)))), unsigned(n_launch));
  MatmulArgs a = args;
  a.table_bytes = int((Q::kTableBytes + 15) / 16 * 16);
  const size_t shared_bytes = size_t(a.table_bytes) + (kInBlock ? size_t(a.in_block_bytes) : 0);
  launch(quant_matmul_kernel<Q, NR, RW, kInBlock>, grid, kWarpsPerBlock * 32, shared_bytes, stream, a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

template <class Q, int NR>
void launch_wide(const MatmulArgs& args, int n_launch, cudaStream_t stream) {
  constexpr int kTeams = kWarpsPerBlock / kWideWarpsPerRow;
  const int64_t blocks_needed = (args.n_out + kTeams - 1) / kTeams;
  const int64_t cap = int64_t(sm_count()) * 16;
  const dim3 grid(unsigned(std::min(blocks_needed, std::max<int64_t>(1, cap / std::max(1, n_launch)))), unsigned(n_launch));
  MatmulArgs a = args;
  a.table_bytes = int((Q::kTableBytes + 15) / 16 * 16);
  launch(wide_matmul_kernel<Q, NR, kWideWarpsPerRow>, grid, kWarpsPerBlock * 32, size_t(a.table_bytes), stream, a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

template <class Q, int NR>
void launch_rw(const MatmulArgs& args, int n_launch, cudaStream_t stream, int rows_per_warp) {
  if (rows_per_warp >= 4) launch_nr<Q, NR, 4>(args, n_launch, stream);
  else if (rows_per_warp == 2) launch_nr<Q, NR, 2>(args, n_launch, stream);
  else launch_nr<Q, NR, 1>(args, n_launch, stream);
}

template <class Q, int NR, int RW, bool kSharedAct>
void launch_staged_kernel(const MatmulArgs& args, int n_launch, cudaStream_t stream, const StagedPlan& plan) {
  const auto kernel = staged_matmul_kernel<Q, NR, RW, kSharedAct>;
  if (plan.shared_bytes > 48 * 1024) {  // raise this kernel's limit once per device
    static std::atomic<uint32_t> raised{0};
    int device = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    const uint32_t bit = 1u << (device & 31);
    if (!(raised.load() & bit)) {
      STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_optin_bytes())));
      raised.fetch_or(bit);
    }
  }
  // As many blocks as fit the GPU at once (each warp then walks its rows, its next stage's copy in
  // flight across row boundaries), or fewer when the matrix has fewer rows.
  const int64_t rows_per_block = int64_t(kWarpsPerBlock) * RW;
  const int64_t blocks_needed = (args.n_out + rows_per_block - 1) / rows_per_block;
  const int64_t resident = int64_t(sm_count()) * resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), plan.shared_bytes);
  const dim3 grid(unsigned(std::min(blocks_needed, std::max<int64_t>(1, resident / std::max(1, n_launch)))), unsigned(n_launch));
  MatmulArgs a = args;
  a.table_bytes = int((Q::kTableBytes + 15) / 16 * 16);
  a.act_bytes = int(plan.act_bytes);
  a.stages = plan.stages;
  launch(kernel, grid, kWarpsPerBlock * 32, plan.shared_bytes, stream, a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

template <class Q, int NR, int RW>
void launch_staged_act(const MatmulArgs& args, int n_launch, cudaStream_t stream, const StagedPlan& plan) {
  if constexpr (NR <= 4) {
    if (plan.shared_act) return launch_staged_kernel<Q, NR, RW, true>(args, n_launch, stream, plan);
  }
  launch_staged_kernel<Q, NR, RW, false>(args, n_launch, stream, plan);
}

template <class Q, int NR>
void launch_staged(const MatmulArgs& args, int n_launch, cudaStream_t stream, int rw, const StagedPlan& plan) {
  if constexpr (NR <= 4) {
    if (rw == 4) return launch_staged_act<Q, NR, 4>(args, n_launch, stream, plan);
  }
  if (rw == 2) launch_staged_act<Q, NR, 2>(args, n_launch, stream, plan);
  else launch_staged_act<Q, NR, 1>(args, n_launch, stream, plan);
}

template <class Q>
void launch_matmul(MatmulArgs args, int n_launch, int rows_total, cudaStream_t stream,
                   const MatmulTuning* tuning) {
  if constexpr (Q::kTableBytes > 0) upload_tables<Q>();
  args.lanes = lanes_per_row<Q>(args.n_in, tuning);
  if (args.in_prologue != ActivationPrologue::None) {
    // One pass, one weight row per lane group (the caller checked in_block_fits).
    if constexpr (kInBlockable<Q>) {
      args.row_pass = 0;
      args.in_block_bytes = int(in_block_bytes<Q>(args.n_in, rows_total));
      if (rows_total == 1) launch_nr<Q, 1, 1, true>(args, n_launch, stream);
      else if (rows_total == 2) launch_nr<Q, 2, 1, true>(args, n_launch, stream);
      else if (rows_total <= 4) launch_nr<Q, 4, 1, true>(args, n_launch, stream);
      else launch_nr<Q, 8, 1, true>(args, n_launch, stream);
      return;
    }
    cuda_fail("CUDA matmul: the in-block quantizer does not take this weight type (a bug: see in_block_fits)");
  }
  // Wide rows are a property of the dense matrix (every pass, every window); many matrices in
  // one launch share it (matmul_quantized_many splits a launch whose matrices differ).
  args.warps_per_row = args.expert_ids ? 1 : wide_warps_per_row<Q>(args.n_in, args.n_out, tuning);
  for (int pass = 0; pass < rows_total; pass += kMaxRowsPerPass) {
    args.row_pass = pass;
    const int rows = std::min(kMaxRowsPerPass, rows_total - pass);
    if (args.warps_per_row > 1) {
      if (rows == 1) launch_wide<Q, 1>(args, n_launch, stream);
      else if (rows == 2) launch_wide<Q, 2>(args, n_launch, stream);
      else if (rows <= 4) launch_wide<Q, 4>(args, n_launch, stream);
      else launch_wide<Q, 8>(args, n_launch, stream);
      continue;
    }
    const int rw = pass_rows_per_warp<Q>(rows, args.lanes, tuning);
    if constexpr (kStageable<Q>) {
      const StagedPlan plan = plan_staged<Q>(args.n_in, rows, rw, args.lanes, tuning);
      if (plan.staged) {
        if (rows == 1) launch_staged<Q, 1>(args, n_launch, stream, rw, plan);
        else if (rows == 2) launch_staged<Q, 2>(args, n_launch, stream, rw, plan);
        else if (rows <= 4) launch_staged<Q, 4>(args, n_launch, stream, rw, plan);
        else launch_staged<Q, 8>(args, n_launch, stream, rw, plan);
        continue;
      }
    }
    if (rows == 1) launch_rw<Q, 1>(args, n_launch, stream, rw);
    else if (rows == 2) launch_rw<Q, 2>(args, n_launch, stream, rw);
    else if (rows <= 4) launch_rw<Q, 4>(args, n_launch, stream, rw);
    else launch_rw<Q, 8>(args, n_launch, stream, rw);
  }
}

}  // namespace strata::compute::cuda::matmul_detail
