// CUDA elementwise and small-reduction ops. Contract in ops.h.
#include "compute/cuda/ops.h"

#include <algorithm>
#include <climits>
#include <string>

#include "compute/cuda/activation_math.cuh"
#include "compute/cuda/block_reduce.cuh"
#include "compute/cuda/launch.cuh"
#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

constexpr int kThreads = 256;

// One block of norm_threads(group_size) per (row, group): group i of group_size values at
// x + i·stride (stride = group_size for contiguous groups), its weight at weight + (i %
// groups_per_row)·group_size.
__global__ void rms_norm_kernel(const float* x, const float* weight, int64_t group_size, int64_t groups_per_row,
                                int64_t stride, float eps, float* out) {
  pdl_begin();
  __shared__ float shared[32];
  const float* row = x + size_t(blockIdx.x) * stride;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x) sum = __fmaf_rn(row[i], row[i], sum);
  sum = block_sum(sum, shared);
  const float mean = __fdiv_rn(sum, float(group_size));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  const float* w = weight ? weight + size_t(blockIdx.x % groups_per_row) * group_size : nullptr;
  float* y = out + size_t(blockIdx.x) * stride;
  for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x) {
    const float v = __fmul_rn(row[i], r);
    y[i] = w ? __fmul_rn(v, w[i]) : v;
  }
}

__global__ void softmax_kernel(float* x, int64_t n) {
  pdl_begin();
  __shared__ float shared[32];
  float* row = x + size_t(blockIdx.x) * n;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, row[i]);
  m = block_max(m, shared);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = expf(__fsub_rn(row[i], m));
    row[i] = e;
    sum = __fadd_rn(sum, e);
  }
  sum = block_sum(sum, shared);
  const float inverse = __fdiv_rn(1.0f, sum);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) row[i] = __fmul_rn(row[i], inverse);
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = silu_mul_value(gate[i], up[i]);
}

__global__ void activation_kernel(Activation kind, const float* x, int64_t n, float* out) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    switch (kind) {
      case Activation::Sigmoid: out[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v))); break;
      case Activation::Silu: out[i] = silu_value(v); break;
      case Activation::Softplus: out[i] = v > 20.0f ? v : log1pf(expf(v)); break;
    }
  }
}

// NeoX RoPE of pair j (of n_rot/2) at `pos`: its cos/sin, evaluated from the f32 angle in double.
__device__ __forceinline__ void rope_cos_sin(int j, int n_rot, float pos, float theta, float& c, float& s) {
  const float exponent = __fdiv_rn(float(2 * j), float(n_rot));
  const float base_power = float(pow(double(theta), double(exponent)));
  const float inv_freq = __fdiv_rn(1.0f, base_power);
  const float angle = __fmul_rn(pos, inv_freq);
  c = float(cos(double(angle)));
  s = float(sin(double(angle)));
}

// One block per row; thread j < n_rot/2 computes pair j's cos/sin once and rotates every head.
// Row r starts at x + r·row_stride, its heads head_stride apart.
__global__ void rope_neox_kernel(float* x, int64_t row_stride, int n_heads, int64_t head_stride, int n_rot,
                                 const int32_t* positions, float theta) {
  pdl_begin();
  const int half = n_rot / 2;
  float* row = x + size_t(blockIdx.x) * row_stride;
  const float pos = float(positions[blockIdx.x]);
  // Heads taken kHeld at a time, their pairs loaded before any is stored: the stores may alias
  // the next head's loads as far as the compiler knows, so one head at a time waited out an L2
  // round trip per head. The same operations per element.
  constexpr int kHeld = 8;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float c, s;
    rope_cos_sin(j, n_rot, pos, theta, c, s);
    for (int h0 = 0; h0 < n_heads; h0 += kHeld) {
      float a[kHeld], b[kHeld];
#pragma unroll
      for (int n = 0; n < kHeld; ++n) {
        const float* head = row + size_t(h0 + n) * head_stride;
        a[n] = h0 + n < n_heads ? head[j] : 0.0f;
        b[n] = h0 + n < n_heads ? head[j + half] : 0.0f;
      }
#pragma unroll
      for (int n = 0; n < kHeld; ++n) {
        if (h0 + n >= n_heads) break;
        float* head = row + size_t(h0 + n) * head_stride;
        head[j] = __fsub_rn(__fmul_rn(a[n], c), __fmul_rn(b[n], s));
        head[j + half] = __fadd_rn(__fmul_rn(b[n], c), __fmul_rn(a[n], s));
      }
    }
  }
}

// QSA block keys completed by a window, one block of norm_threads(di) per candidate block: the
// steps of block means -> rms_norm_kernel -> rope_neox_kernel with the same operations in the
// same order (the norm's per-thread strided sums and block_sum over as many threads), so the keys are
// bitwise the three-kernel chain's. Candidate j is block first/ratio + j; it returns at once when
// that block does not complete inside the window [first, first + n_rows).
__global__ void qsa_block_keys_kernel(const float* raw, const int32_t* first_pos, int64_t n_rows, int ratio, int di,
                                      const float* norm_weight, float eps, int n_rot, float theta, float* keys) {
  pdl_begin();
  extern __shared__ float key[];  // [di]
  __shared__ float shared[32];
  const int64_t first = *first_pos, b = first / ratio + blockIdx.x;
  if ((b + 1) * ratio > first + n_rows) return;
  for (int i = threadIdx.x; i < di; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < ratio; ++j) acc = __fadd_rn(acc, raw[(b * ratio + j) * di + i]);
    key[i] = __fdiv_rn(acc, float(ratio));
  }
  __syncthreads();
  float sum = 0.0f;
  for (int i = threadIdx.x; i < di; i += blockDim.x) sum = __fmaf_rn(key[i], key[i], sum);
  sum = block_sum(sum, shared);
  const float mean = __fdiv_rn(sum, float(di));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  for (int i = threadIdx.x; i < di; i += blockDim.x) {
    const float v = __fmul_rn(key[i], r);
    key[i] = norm_weight ? __fmul_rn(v, norm_weight[i]) : v;
  }
  __syncthreads();
  float* out = keys + b * di;
  for (int i = n_rot + threadIdx.x; i < di; i += blockDim.x) out[i] = key[i];  // past the rotated part
  const int half = n_rot / 2;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float c, s;
    rope_cos_sin(j, n_rot, float(b * ratio), theta, c, s);
    const float a = key[j], bb = key[j + half];
    out[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, s));
    out[j + half] = __fadd_rn(__fmul_rn(bb, c), __fmul_rn(a, s));
  }
}

// True when (va, a) ranks before (vb, b): NaN first, then larger value, then lower index.
__device__ __forceinline__ bool ranks_before(float va, int a, float vb, int b) {
  const bool nan_a = isnan(va), nan_b = isnan(vb);
  if (nan_a != nan_b) return nan_a;
  if (!nan_a) {
    if (va > vb) return true;
    if (va < vb) return false;
  }
  return a < b;
}

// Block-wide best (value, index) by ranks_before; index -1 = none.
__device__ void block_best(float& value, int& index, float* shared_v, int* shared_i) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, value, off);
    const int oi = __shfl_xor_sync(0xffffffffu, index, off);
    if (oi >= 0 && (index < 0 || ranks_before(ov, oi, value, index))) {
      value = ov;
      index = oi;
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) {
    shared_v[warp] = value;
    shared_i[warp] = index;
  }
  __syncthreads();
  value = shared_v[0];
  index = shared_i[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w)
    if (shared_i[w] >= 0 && (index < 0 || ranks_before(shared_v[w], shared_i[w], value, index))) {
      value = shared_v[w];
      index = shared_i[w];
    }
}

constexpr int kMaxRouteK = 32;
// Experts per lane held in registers by the router's pick loop (n_expert <= 32 · this).
constexpr int kRouteSlotsPerLane = 16;

// ranks_before as one 64-bit key for the router's probabilities (never negative, never −0: each
// is expf(…)·(1/Σ) with Σ > 0, or NaN): the value's bits, NaN as the largest, then the index
// reversed, so that the larger key ranks first and no two experts share a key. 0 = none.
__device__ __forceinline__ uint64_t route_key(float p, int i) {
  const uint32_t bits = isnan(p) ? 0xffffffffu : __float_as_uint(p);
  return uint64_t(bits) << 32 | uint64_t(0xffffffffu - uint32_t(i));
}
__device__ __forceinline__ int route_key_index(uint64_t key) { return int(0xffffffffu - uint32_t(key)); }

// The router's first steps for one row (one block, blockDim a multiple of 32): probs[i] =
// softmax(row)[i] in shared memory, then the n_picks best experts, best first (higher p, ties by
// lower id, NaN first), into picked[0 .. n_picks). `chosen`: n_expert ints of shared scratch.
// Both router kernels run exactly this, so the exact router's bits are the MoCE router's when
// nothing is boosted.
__device__ __forceinline__ void route_softmax_and_pick(const float* row, int n_expert, int n_picks, float* probs,
                                                       int* chosen, int* picked, float* shared_v) {
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n_expert; i += blockDim.x) {
    m = fmaxf(m, row[i]);
    chosen[i] = 0;
  }
  m = block_max(m, shared_v);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n_expert; i += blockDim.x) {
    const float e = expf(__fsub_rn(row[i], m));
    probs[i] = e;
    sum = __fadd_rn(sum, e);
  }
  sum = block_sum(sum, shared_v);
  const float inverse = __fdiv_rn(1.0f, sum);
  for (int i = threadIdx.x; i < n_expert; i += blockDim.x) probs[i] = __fmul_rn(probs[i], inverse);
  __syncthreads();
  // The picks by one warp, without block barriers: lane l keeps the best unchosen expert among
  // i ≡ l (mod 32); each pick is the warp's largest key (a total order, so every lane agrees),
  // and only the winning lane looks for its next best. The same picks in the same order as
  // rounds of a block-wide search by ranks_before, whoever finds them. Up to 512 experts the
  // lane's keys live in registers; above, the winner rescans its share in shared memory.
  if (threadIdx.x < 32) {
    const int lane = int(threadIdx.x);
    if (n_expert <= 32 * kRouteSlotsPerLane) {
      uint64_t keys[kRouteSlotsPerLane];
#pragma unroll
      for (int slot = 0; slot < kRouteSlotsPerLane; ++slot) {
        const int i = lane + 32 * slot;
        keys[slot] = i < n_expert ? route_key(probs[i], i) : 0;
      }
      auto lane_best = [&] {
        uint64_t best = 0;
#pragma unroll
        for (int slot = 0; slot < kRouteSlotsPerLane; ++slot) best = keys[slot] > best ? keys[slot] : best;
        return best;
      };
      uint64_t mine = lane_best();
      for (int j = 0; j < n_picks; ++j) {
        uint64_t best = mine;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          const uint64_t other = __shfl_xor_sync(0xffffffffu, best, off);
          best = other > best ? other : best;
        }
        const int index = route_key_index(best);
        if (lane == 0) picked[j] = index;
        if ((index & 31) == lane) {
#pragma unroll
          for (int slot = 0; slot < kRouteSlotsPerLane; ++slot)
            if (slot == (index >> 5)) keys[slot] = 0;
          mine = lane_best();
        }
      }
    } else {
      auto rescan = [&] {
        uint64_t best = 0;
        for (int i = lane; i < n_expert; i += 32)
          if (!chosen[i]) {
            const uint64_t key = route_key(probs[i], i);
            best = key > best ? key : best;
          }
        return best;
      };
      uint64_t mine = rescan();
      for (int j = 0; j < n_picks; ++j) {
        uint64_t best = mine;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          const uint64_t other = __shfl_xor_sync(0xffffffffu, best, off);
          best = other > best ? other : best;
        }
        const int index = route_key_index(best);
        if (lane == 0) picked[j] = index;
        if ((index & 31) == lane) {
          chosen[index] = 1;
          mine = rescan();
        }
      }
    }
    __syncwarp();
  }
}

// Writes the k experts of `picked` (best first) in ascending id with w = p / Σ p, the sum taken
// best first (the CPU's order). Lane 0 .. k-1 of warp 0; total_shared: one float of shared memory.
__device__ __forceinline__ void route_write(const int* picked, int k, const float* probs, float* total_shared,
                                            int32_t* experts_out, float* weights_out) {
  const int lane = int(threadIdx.x);
  if (lane == 0) {
    float total = 0.0f;
    for (int j = 0; j < k; ++j) total = __fadd_rn(total, probs[picked[j]]);
    *total_shared = total;
  }
  __syncwarp();
  // Written in ascending expert id: pick j goes to the place its id has among the k.
  if (lane < k) {
    const int id = picked[lane];
    int place = 0;
    for (int j = 0; j < k; ++j) place += picked[j] < id;
    experts_out[size_t(blockIdx.x) * k + place] = id;
    weights_out[size_t(blockIdx.x) * k + place] = __fdiv_rn(probs[id], *total_shared);
  }
}

__global__ void route_top_k_kernel(const float* logits, int n_expert, int k, int32_t* experts_out, float* weights_out) {
  pdl_begin();
  extern __shared__ float probs[];  // n_expert, then n_expert chosen flags
  __shared__ float shared_v[32];
  __shared__ int picked[kMaxRouteK];
  __shared__ float total_shared;
  auto* chosen = reinterpret_cast<int*>(probs + n_expert);
  route_softmax_and_pick(logits + size_t(blockIdx.x) * n_expert, n_expert, k, probs, chosen, picked, shared_v);
  if (threadIdx.x < 32) route_write(picked, k, probs, &total_shared, experts_out, weights_out);
}

// MoCE (route/moce.h moce_select, the CPU's rule): the true order's first `window` experts, ranks
// 0 .. protect-1 kept, the other k - protect places to the best of ranks protect .. window-1 by
// p·boost for a resident expert and p otherwise (in double, as the CPU; ties to the lower rank),
// weights p / Σ p over the chosen, summed best first. Resident: the row's slot-map entry names a
// cache slot (below `resident_below`; transient slots are not residency). Rows >= n_main use the
// next layer's slot map (the read-ahead guess) and count no telemetry; main rows add rows, swaps,
// agreement and KL (as MoceStats) into stats[0..3].
__global__ void route_top_k_moce_kernel(const float* logits, int n_main, int n_expert, int k, int window, int protect,
                                        double boost, const uint32_t* smap, const uint32_t* smap_next,
                                        uint32_t resident_below, int32_t* experts_out, float* weights_out,
                                        double* stats) {
  pdl_begin();
  extern __shared__ float probs[];  // n_expert, n_expert chosen flags, n_expert picks (window)
  __shared__ float shared_v[32];
  __shared__ int final_picks[kMaxRouteK];
  __shared__ float total_shared;
  auto* chosen = reinterpret_cast<int*>(probs + n_expert);
  int* picked = chosen + n_expert;
  route_softmax_and_pick(logits + size_t(blockIdx.x) * n_expert, n_expert, window, probs, chosen, picked, shared_v);
  if (threadIdx.x >= 32) return;
  const int lane = int(threadIdx.x);
  const bool main_row = int(blockIdx.x) < n_main;
  const uint32_t* map = main_row ? smap : smap_next;
  // `chosen` (the pick loop's flags, no longer needed) now holds per rank: bit 0 resident, bit 1
  // taken. kMiss is above every offset, so one compare says resident.
  for (int r = lane; r < window; r += 32) chosen[r] = map[picked[r]] < resident_below ? 1 : 0;
  if (lane < protect) final_picks[lane] = picked[lane];
  __syncwarp();
  // Each of the k - protect places: the best untaken rank by (score, then lower rank), the score
  // p·boost for a resident expert and p otherwise, in double as on the CPU; lanes scan the ranks
  // r ≡ lane (mod 32), then a butterfly over the warp (a total order: every lane agrees).
  for (int j = protect; j < k; ++j) {
    double best_score = -1.0;
    int best = INT_MAX;
    for (int r = protect + lane; r < window; r += 32) {
      if (chosen[r] & 2) continue;
      const double score = double(probs[picked[r]]) * ((chosen[r] & 1) ? boost : 1.0);
      if (score > best_score || (score == best_score && r < best)) {
        best_score = score;
        best = r;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const double other_score = __shfl_xor_sync(0xffffffffu, best_score, off);
      const int other = __shfl_xor_sync(0xffffffffu, best, off);
      if (other_score > best_score || (other_score == best_score && other < best)) {
        best_score = other_score;
        best = other;
      }
    }
    if (lane == 0) {
      final_picks[j] = picked[best];
      chosen[best] |= 2;
    }
    __syncwarp();
  }
  if (main_row && stats) {
    // Telemetry as MoceStats counts it: KL(p ‖ p') = log Z − m·log(boost), m the boosted mass.
    double boosted_mass = 0.0;
    for (int r = protect + lane; r < window; r += 32)
      if (chosen[r] & 1) boosted_mass += double(probs[picked[r]]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) boosted_mass += __shfl_xor_sync(0xffffffffu, boosted_mass, off);
    if (lane == 0) {
      int agree = 0;
      for (int j = 0; j < k; ++j)
        for (int t = 0; t < k; ++t) agree += final_picks[j] == picked[t];
      const double z = 1.0 + boosted_mass * (boost - 1.0);
      atomicAdd(stats + 0, 1.0);
      atomicAdd(stats + 1, double(k - agree));
      atomicAdd(stats + 2, double(agree) / double(k));
      atomicAdd(stats + 3, log(z) - boosted_mass * log(boost));
    }
  }
  if (lane == 0)  // best first by probability (ties: lower id), the order the sum is taken in
    for (int a = 1; a < k; ++a)
      for (int b = a; b > 0; --b) {
        const int x = final_picks[b - 1], y = final_picks[b];
        if (!(probs[y] > probs[x] || (probs[y] == probs[x] && y < x))) break;
        final_picks[b - 1] = y;
        final_picks[b] = x;
      }
  __syncwarp();
  route_write(final_picks, k, probs, &total_shared, experts_out, weights_out);
}

__global__ void argmax_kernel(const float* x, int64_t n, int32_t* out) {
  pdl_begin();
  __shared__ float shared_v[32];
  __shared__ int shared_i[32];
  const float* row = x + size_t(blockIdx.x) * n;
  float best_v = 0.0f;
  int best_i = -1;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    if (best_i < 0 || ranks_before(row[i], int(i), best_v, best_i)) {
      best_v = row[i];
      best_i = int(i);
    }
  block_best(best_v, best_i, shared_v, shared_i);
  if (threadIdx.x == 0) out[blockIdx.x] = best_i;
}

void require(bool ok, const std::string& message) {
  if (!ok) cuda_fail(message);
}

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

}  // namespace

void rms_norm_rows(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps, float* out,
                   cudaStream_t stream) {
  rms_norm_grouped_rows(x, weight, n_rows, 1, n, eps, out, stream);
}

void rms_norm_grouped_rows(const float* x, const float* weight, int64_t n_rows, int64_t n_groups,
                           int64_t group_size, float eps, float* out, cudaStream_t stream) {
  require(n_groups > 0 && group_size > 0, "CUDA rms_norm: expected groups and group size > 0, found " +
                                              std::to_string(n_groups) + " x " + std::to_string(group_size));
  if (n_rows <= 0) return;
  launch(rms_norm_kernel, unsigned(n_rows * n_groups), norm_threads(group_size), 0, stream, x, weight, group_size, n_groups,
         group_size, eps, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void rms_norm_strided(const float* x, const float* weight, int64_t n_vectors, int64_t n, int64_t stride, float eps,
                      float* out, cudaStream_t stream) {
  require(n > 0 && stride >= n, "CUDA rms_norm_strided: expected 0 < n <= stride, found n = " + std::to_string(n) +
                                    ", stride = " + std::to_string(stride));
  if (n_vectors <= 0) return;
  launch(rms_norm_kernel, unsigned(n_vectors), norm_threads(n), 0, stream, x, weight, n, 1, stride, eps, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void softmax_rows(float* x, int64_t n_rows, int64_t n, cudaStream_t stream) {
  require(n > 0, "CUDA softmax: expected n > 0, found " + std::to_string(n));
  if (n_rows <= 0) return;
  launch(softmax_kernel, unsigned(n_rows), kThreads, 0, stream, x, n);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch(silu_mul_kernel, grid_for(n), kThreads, 0, stream, gate, up, n, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void activation(Activation kind, const float* x, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch(activation_kernel, grid_for(n), kThreads, 0, stream, kind, x, n, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void rope_neox_rows(float* x, int64_t n_rows, int n_heads, int head_dim, int n_rot, const int32_t* positions,
                    float theta, cudaStream_t stream) {
  rope_neox_strided(x, n_rows, int64_t(n_heads) * head_dim, n_heads, head_dim, head_dim, n_rot, positions, theta,
                    stream);
}

void rope_neox_strided(float* x, int64_t n_rows, int64_t row_stride, int n_heads, int64_t head_stride, int head_dim,
                       int n_rot, const int32_t* positions, float theta, cudaStream_t stream) {
  require(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim && n_heads > 0,
          "CUDA rope: expected n_rot even, > 0 and <= head_dim " + std::to_string(head_dim) + ", found " +
              std::to_string(n_rot));
  if (n_rows <= 0) return;
  launch(rope_neox_kernel, unsigned(n_rows), 128, 0, stream, x, row_stride, n_heads, head_stride, n_rot, positions,
         theta);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void qsa_block_keys_at(const float* raw, const int32_t* first_pos_device, int64_t n_rows, int ratio, int di,
                       const float* norm_weight, float eps, int n_rot, float theta, float* block_keys,
                       cudaStream_t stream) {
  require(ratio > 0 && di > 0 && n_rot > 0 && n_rot % 2 == 0 && n_rot <= di,
          "CUDA qsa_block_keys_at: expected ratio > 0 and an even n_rot <= di, found ratio " + std::to_string(ratio) +
              ", di " + std::to_string(di) + ", n_rot " + std::to_string(n_rot));
  if (n_rows <= 0) return;
  launch(qsa_block_keys_kernel, unsigned(n_rows / ratio + 1), norm_threads(di), size_t(di) * sizeof(float), stream, raw,
         first_pos_device, n_rows, ratio, di, norm_weight, eps, n_rot, theta, block_keys);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void route_top_k(const float* logits, int64_t n_rows, int n_expert, int k, int32_t* experts_out, float* weights_out,
                 cudaStream_t stream) {
  require(n_expert > 0 && n_expert <= 4096 && k > 0 && k <= kMaxRouteK && k <= n_expert,
          "CUDA route_top_k: expected 0 < k <= min(32, n_expert) and n_expert <= 4096, found k = " +
              std::to_string(k) + ", n_expert = " + std::to_string(n_expert));
  if (n_rows <= 0) return;
  const size_t shared = size_t(n_expert) * (sizeof(float) + sizeof(int));
  launch(route_top_k_kernel, unsigned(n_rows), 128, shared, stream, logits, n_expert, k, experts_out, weights_out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void route_top_k_moce(const float* logits, int64_t n_rows, int64_t n_main, int n_expert, int k, const RouteMoce& moce,
                      int32_t* experts_out, float* weights_out, cudaStream_t stream) {
  // 12 bytes of shared memory per expert: 2048 experts stay within the default 48 KiB.
  require(n_expert > 0 && n_expert <= 2048 && k > 0 && k <= kMaxRouteK && k <= n_expert,
          "CUDA route_top_k_moce: expected 0 < k <= min(32, n_expert) and n_expert <= 2048, found k = " +
              std::to_string(k) + ", n_expert = " + std::to_string(n_expert));
  require(moce.lambda > 0 && moce.smap && (n_main == n_rows || moce.smap_next) && n_main <= n_rows,
          "CUDA route_top_k_moce: expected lambda > 0, the layer's slot map, and the next layer's for guess rows");
  if (n_rows <= 0) return;
  // The CPU's window and protect (route/moce.cpp): max_rank 0 = every expert, never below k.
  const int window = std::clamp(moce.max_rank > 0 ? std::max(moce.max_rank, k) : n_expert, k, n_expert);
  const int protect = std::clamp(moce.protect, 0, k);
  const size_t shared = size_t(n_expert) * (sizeof(float) + 2 * sizeof(int));
  launch(route_top_k_moce_kernel, unsigned(n_rows), 128, shared, stream, logits, int(n_main), n_expert, k, window,
         protect, 1.0 + moce.lambda, moce.smap, moce.smap_next, moce.resident_below, experts_out, weights_out,
         moce.stats);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void argmax_rows(const float* x, int64_t n_rows, int64_t n, int32_t* out, cudaStream_t stream) {
  require(n > 0 && n < (int64_t(1) << 31), "CUDA argmax: expected 0 < n < 2^31, found " + std::to_string(n));
  if (n_rows <= 0) return;
  launch(argmax_kernel, unsigned(n_rows), kThreads, 0, stream, x, n, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::compute::cuda
