// Device pieces of the staged matvec path (matmul_kernels.cuh staged_matmul_kernel; internal to
// compute/cuda/): asynchronous global → shared copies (cp.async), a warp's weight-row chunks copied
// into one shared-memory stage buffer while it decodes another, and a window's activations copied
// once per thread block into shared memory in a bank-friendly layout.
//
// Why (docs/bench-cuda.md, "Why IQ2_XS stays at a quarter of HBM"): blocks of 74, 34, 18 or 110
// bytes keep rows only 2-byte aligned, so the direct kernel reads each unit with narrow loads that
// span ~8 blocks per warp instruction (~35 L1 wavefronts per 592 bytes of IQ2_XS against 4 for a
// coalesced 16-byte load). Copying the rows' raw bytes with coalesced 16-byte cp.async and decoding
// from shared memory (any alignment is free there; ~13 wavefronts per 592 bytes of IQ2_XS, at most
// 2-way bank conflicts) moves the same bytes through fewer wavefronts. A one-stage copy lost 15-25
// % (session 33: copy and decode serialised); here each warp keeps 2 or 3 stage buffers and the
// copy of the next stage is in flight while the current one is decoded.
//
// Nothing here changes a result bit: a staged row holds the same bytes at the same offsets modulo
// 16 as the row in global memory, and the types' decode() reads them with the same operations.
#pragma once

#include <cstdint>

#include "compute/cuda/quant/common.cuh"

namespace strata::compute::cuda::quant_device {

// ---- cp.async (sm_80+): 16 bytes global → shared, L1 bypassed, tracked per thread in groups ----

__device__ __forceinline__ void cp_async_16(void* shared, const void* global) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(address), "l"(global)
               : "memory");
}
// Closes this thread's copies issued since the last commit into one group (possibly empty).
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight. Other lanes' copies
// become visible to this lane only after a barrier that both take part in (__syncwarp).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- weight stages ----

// Units of each weight row one stage holds: one per lane (32) when a warp takes several rows, two
// per lane for one row per warp (more independent units per lane in flight). A multiple of every
// kUnitsPerBlock (1, 4, 8), so a stage is whole blocks and a lane's units stay l, l + 32, ... in
// order.
template <int RW>
inline constexpr int kStageUnits = RW == 1 ? 64 : 32;

// Shared bytes per weight row per stage: the stage's blocks, the row's misalignment modulo 16
// (kept, so the staged bytes have the global ones' alignment) and the funnel-shift over-read of
// ld_words_a2 (< 4 bytes past the last byte a unit uses), rounded up to 16-byte vectors.
template <class Q, int RW>
__host__ __device__ constexpr int stage_row_bytes() {
  return (kStageUnits<RW> / Q::kUnitsPerBlock * Q::kBlockBytes + 15 + 16 + 15) / 16 * 16;
}

// Byte offset of stage `chunk` inside a row (chunk·kStageUnits units).
template <class Q, int RW>
__device__ __forceinline__ int stage_offset(int chunk) {
  return chunk * (kStageUnits<RW> / Q::kUnitsPerBlock) * Q::kBlockBytes;
}

// The 16-byte vectors of one stage of weight rows first_row .. first_row + RW − 1 (rows past n_out
// repeat the last row: computed, never stored), copied by the warp's lanes into `buffer` (RW rows
// of stage_row_bytes), spread evenly over the lanes, then committed as one group. Copies the
// aligned vectors covering [row + offset, row + offset + bytes): the vector holding a row's last
// byte is read whole, as the direct kernel's aligned over-reads do (DeviceBuffer pads its end).
template <class Q, int RW>
__device__ __forceinline__ void issue_stage(uint8_t* buffer, const uint8_t* w, size_t row_stride,
                                            int64_t first_row, int64_t n_out, int chunk,
                                            int n_units, int lane) {
  constexpr int kRowBytes = stage_row_bytes<Q, RW>();
  constexpr int kRowVectors = kRowBytes / 16;
  const int first_unit = chunk * kStageUnits<RW>;
  const int units = min(kStageUnits<RW>, n_units - first_unit);
  const int offset = stage_offset<Q, RW>(chunk);
  const int bytes = units / Q::kUnitsPerBlock * Q::kBlockBytes;
#pragma unroll
  for (int k = 0; k < (RW * kRowVectors + 31) / 32; ++k) {
    const int v = lane + 32 * k;
    const int i = v / kRowVectors, j = v - i * kRowVectors;  // row i of the stage, vector j of it
    if (i < RW) {
      const uintptr_t start =
          reinterpret_cast<uintptr_t>(w + size_t(min(first_row + i, n_out - 1)) * row_stride) +
          offset;
      const uintptr_t aligned = start & ~uintptr_t(15);
      const int n_vectors = int((start + uintptr_t(bytes) - aligned + 15) / 16);
      if (j < n_vectors)
        cp_async_16(buffer + i * kRowBytes + 16 * j,
                    reinterpret_cast<const void*>(aligned + 16 * uintptr_t(j)));
    }
  }
  cp_async_commit();
}

// The staged copy of row first_row + i, stage `chunk`: decode(row, u − chunk·kStageUnits) reads the
// bytes decode(global row, u) would.
template <class Q, int RW>
__device__ __forceinline__ const uint8_t* staged_row(const uint8_t* buffer, const uint8_t* w,
                                                     size_t row_stride, int64_t row, int chunk,
                                                     int i) {
  const uintptr_t start =
      reinterpret_cast<uintptr_t>(w + size_t(row) * row_stride) + stage_offset<Q, RW>(chunk);
  return buffer + i * stage_row_bytes<Q, RW>() + int(start & 15);
}

// A warp's stages in the order it decodes them (row groups o, o + row_step, ...; each row's chunks
// in order), copied `n_stages` − 1 ahead into its ring of n_stages buffers of RW rows each.
template <class Q, int RW>
struct StageIssuer {
  uint8_t* buffers;
  const uint8_t* w;
  size_t row_stride;
  int64_t n_out, row_step;
  int64_t o;  // the next stage's first row
  int n_units, n_chunks, n_stages;
  int chunk = 0, buffer = 0;  // the next stage's chunk and buffer

  // Points the issuer at `matrix` and copies its first n_stages − 1 stages (the kernel's loop
  // issues one more per stage it decodes); for an expert's matrix once the slot is known.
  __device__ __forceinline__ void start(const uint8_t* matrix, int lane) {
    w = matrix;
    for (int k = 1; k < n_stages; ++k) next(lane);
  }

  // Copies the next stage (one committed group; an empty one past the warp's last row, so that
  // wait_group's count stays the same every trip).
  __device__ __forceinline__ void next(int lane) {
    if (o < n_out) {
      issue_stage<Q, RW>(buffers + buffer * RW * stage_row_bytes<Q, RW>(), w, row_stride, o, n_out,
                         chunk, n_units, lane);
      if (++chunk == n_chunks) {
        chunk = 0;
        o += row_step;
      }
    } else {
      cp_async_commit();
    }
    buffer = buffer + 1 == n_stages ? 0 : buffer + 1;
  }
};

// ---- activations in shared memory ----

// A window's quantized activation rows copied into shared memory (the staged kernel's option for
// T <= 4): the same interface as ActView for the types' load_act (qs_at, scales, sums), rows
// numbered 0 .. nr − 1 in the window's order. The quants carry 16 bytes of padding after every 128
// (byte x of a row at x + 16·⌊x/128⌋), so the 16-byte loads of lanes 32 or 64 bytes apart (one unit
// each) fall in distinct banks: a quarter-warp's 8 loads cover all 32 banks once, where the dense
// layout would put 2 or 4 of them on the same banks.
struct SharedActView {
  const uint8_t* qs_base;
  int qs_row_bytes;
  const float* scale_base;
  int scale_row_count;
  const int32_t* sum_base;
  int sum_row_count;
  // The span [offset, offset + len) of row `row` must lie inside one 128-byte-aligned piece of the
  // row (true of every use: 16-, 32- and 64-byte spans at multiples of their size).
  __device__ const int8_t* qs_at(int row, int offset) const {
    return reinterpret_cast<const int8_t*>(qs_base + row * qs_row_bytes + offset +
                                           ((offset >> 7) << 4));
  }
  __device__ const float* scales(int row) const { return scale_base + row * scale_row_count; }
  __device__ const int32_t* sums(int row) const { return sum_base + row * sum_row_count; }
};

__host__ __device__ constexpr int padded_qs_row_bytes(int n_in) {
  return n_in + (n_in + 127) / 128 * 16;
}

// Shared bytes of `n_rows` activation rows of width n_in in the layout above (scale and sum counts
// per row as ActivationLayout's), a multiple of 16.
__host__ __device__ constexpr int shared_activation_bytes(int n_rows, int n_in, int scale_count,
                                                          int sum_count) {
  return (n_rows * (padded_qs_row_bytes(n_in) + 4 * scale_count + 4 * sum_count) + 15) / 16 * 16;
}

// Every thread of the block copies its share of the nr <= NR rows `rows` of `act` into `shared`;
// the caller synchronises the block before reading the view.
template <int NR>
__device__ __forceinline__ SharedActView copy_activations(const ActView& act, const int (&rows)[NR],
                                                          int nr, int n_in, uint8_t* shared) {
  const int row_bytes = padded_qs_row_bytes(n_in), scale_count = int(act.scale_row_count),
            sum_count = int(act.sum_row_count);
  SharedActView view{
      shared,
      row_bytes,
      reinterpret_cast<const float*>(shared + nr * row_bytes),
      scale_count,
      reinterpret_cast<const int32_t*>(shared + nr * row_bytes + 4 * nr * scale_count),
      sum_count};
  const int n_vectors = n_in / 16;
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if (r < nr) {
      const int4* from = reinterpret_cast<const int4*>(act.qs(rows[r]));
      uint8_t* to = shared + r * row_bytes;
      for (int v = threadIdx.x; v < n_vectors; v += blockDim.x)
        *reinterpret_cast<int4*>(to + 16 * v + ((v >> 3) << 4)) = from[v];
      float* scales = const_cast<float*>(view.scales(r));
      for (int i = threadIdx.x; i < scale_count; i += blockDim.x)
        scales[i] = act.scales(rows[r])[i];
      int32_t* sums = const_cast<int32_t*>(view.sums(r));
      for (int i = threadIdx.x; i < sum_count; i += blockDim.x) sums[i] = act.sums(rows[r])[i];
    }
  }
  return view;
}

}  // namespace strata::compute::cuda::quant_device
