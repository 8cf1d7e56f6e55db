// CUDA quantized matmul: activation quantizers (bitwise the CPU's) and the dispatch to one generic
// warp-per-row kernel instantiated per weight type (compute/cuda/quant/*.cuh): the launch-shape
// rules in matmul_plan.cuh, the kernels in matmul_kernels.cuh, compiled in matmul/*.cu (split off
// for compile time; matmul_plan.cuh says why). Contract in matmul.h.
#include "compute/cuda/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "compute/cuda/activation_math.cuh"
#include "compute/cuda/block_reduce.cuh"
#include "compute/cuda/quant/activation_store.cuh"
#include "compute/cuda/quant/blocks32.cuh"
#include "compute/cuda/quant/float.cuh"
#include "compute/cuda/quant/iq2xs.cuh"
#include "compute/cuda/quant/iq4.cuh"
#include "compute/cuda/quant/iq_lowbit.cuh"
#include "compute/cuda/quant/kquants.cuh"
#include "compute/cuda/quant/staging.cuh"
#include "compute/cuda/launch.cuh"
#include "compute/cuda/matmul_plan.cuh"
#include "compute/cuda/ops.h"
#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

using namespace quant_device;
using namespace matmul_detail;

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

// ---- activation quantizers ------------------------------------------------------------------

// The 8 floats at x + offset (16-byte aligned) the quantizers read, after the optional
// elementwise prologue (activation_math.cuh): the floats themselves, silu(a)·b, or silu(a·scale).
// HcCombine (hyper_connection_in's last step, deferred into the quantizer of the matmul that
// reads x): x_i = hc_combine_value(gates, normed, ...) computed here and stored to `store`; the
// launch's first CUDA block also turns the block's injection logits into weights in place
// (hc_inject_value), as hc_combine's launch does.
struct Inputs {
  ActivationPrologue prologue;
  const float* a;  // x; HcCombine's gates
  const float* b;  // SiluMul's up; HcCombine's normed
  float scale;     // ScaledSilu's; HcCombine's 1/n_streams
  int n_streams = 0;        // HcCombine
  int64_t n_in = 0;         // HcCombine: the row width of x
  float* store = nullptr;   // HcCombine: x (null: not stored, e.g. the second layout of a two-layout launch)
  float* inject = nullptr;  // HcCombine: [n_inject] logits → weights, or null
  int64_t n_inject = 0;
};

// HcCombine's injection step, by the first CUDA block of the launch (every kernel with a prologue
// calls it after pdl_begin).
__device__ __forceinline__ void apply_inject(const Inputs& in) {
  if (in.prologue != ActivationPrologue::HcCombine || !in.inject || blockIdx.x != 0 || blockIdx.y != 0) return;
  for (int64_t i = threadIdx.x; i < in.n_inject; i += blockDim.x) in.inject[i] = hc_inject_value(in.inject[i], in.scale);
}

// Streams whose inputs load8 holds in registers for HcCombine (the hyper-connections' 4; more take
// hc_combine_value's loop).
constexpr int kHeldStreams = 4;
__device__ __forceinline__ float component(const float4& f, int c) { return c == 0 ? f.x : c == 1 ? f.y : c == 2 ? f.z : f.w; }

__device__ __forceinline__ void load8(const Inputs& in, int64_t offset, float v[8]) {
  if (in.prologue == ActivationPrologue::HcCombine) {
    const int64_t t = offset / in.n_in, i = offset % in.n_in;
    if (in.n_streams <= kHeldStreams) {
      // Every stream's 8 gates and normed values loaded first (16-byte loads, all in flight at
      // once), then hc_combine_value's operations in its order: the same bits, one L2 round trip
      // instead of one per stream.
      const int64_t row = t * in.n_streams * in.n_in + i;
      float4 gates[kHeldStreams][2], normed[kHeldStreams][2];
#pragma unroll
      for (int s = 0; s < kHeldStreams; ++s)
        if (s < in.n_streams) {
          gates[s][0] = reinterpret_cast<const float4*>(in.a + row + s * in.n_in)[0];
          gates[s][1] = reinterpret_cast<const float4*>(in.a + row + s * in.n_in)[1];
          normed[s][0] = reinterpret_cast<const float4*>(in.b + row + s * in.n_in)[0];
          normed[s][1] = reinterpret_cast<const float4*>(in.b + row + s * in.n_in)[1];
        }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float sum = 0.0f;
#pragma unroll
        for (int s = 0; s < kHeldStreams; ++s)
          if (s < in.n_streams)
            sum = hc_combine_step(sum, component(gates[s][j / 4], j % 4), component(normed[s][j / 4], j % 4));
        v[j] = __fmul_rn(sum, in.scale);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = hc_combine_value(in.a, in.b, in.n_streams, in.n_in, t, i + j, in.scale);
    }
    if (in.store) {
      reinterpret_cast<float4*>(in.store + offset)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(in.store + offset)[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    return;
  }
  load8_elementwise(in.prologue, in.a, in.b, in.scale, offset, v);
}

// F32 activations through a prologue: the floats into the layout's rows.
__global__ void prologue_f32_kernel(Inputs in, int64_t n_in, int64_t n_rows, ActView act) {
  pdl_begin();
  const int64_t groups_per_row = n_in / 8;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups_per_row * n_rows;
       g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = g / groups_per_row, i = (g % groups_per_row) * 8;
    float v[8];
    load8(in, row * n_in + i, v);
    auto* dst = reinterpret_cast<float4*>(const_cast<int8_t*>(act.qs(int(row)))) + i / 4;
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// The quantizers' stores (store_q8_K_block, store_q8_0_block) are quant/activation_store.cuh's,
// shared by the plain quantizer kernels, the fused norm + quantizer and the matmul's in-block
// quantizer: the same arithmetic for the same 8 values, so all give the same bits.

// The quantizer kernels' bodies for CUDA block `block_x` of a launch of 256 threads over one
// layout: Q8_K one warp per 256-value block, 8 values per lane; Q8_0 four lanes per 32-value block.
__device__ __forceinline__ void quantize_q8_K_part(const Inputs& in, int64_t n_in, int64_t n_blocks_total,
                                                   const ActView& act, int64_t blocks_per_row, int64_t block_x) {
  const int64_t block = block_x * (blockDim.x / 32) + threadIdx.x / 32;
  if (block >= n_blocks_total) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = block / blocks_per_row, b = block % blocks_per_row;
  float v[8];
  load8(in, row * n_in + b * 256 + 8 * lane, v);
  store_q8_K_block(v, lane, int(row), b, act);
}

__device__ __forceinline__ void quantize_q8_0_part(const Inputs& in, int64_t n_in, int64_t n_blocks_total,
                                                   const ActView& act, int64_t blocks_per_row, int64_t block_x) {
  const int64_t thread = block_x * blockDim.x + threadIdx.x;
  const int64_t block = thread / 4;
  const bool active = block < n_blocks_total;
  const int64_t row = active ? block / blocks_per_row : 0, b = active ? block % blocks_per_row : 0;
  float v[8] = {};
  if (active) load8(in, row * n_in + b * 32 + 8 * (thread & 3), v);
  store_q8_0_block(v, int(thread & 3), active, int(row), b, act);
}

constexpr int kQuantizeThreads = 256;
// CUDA blocks of kQuantizeThreads a layout's quantizer needs.
__host__ __device__ inline int64_t quantize_blocks(GgmlType format, int64_t n_blocks_total) {
  return format == GgmlType::Q8_K ? (n_blocks_total + kQuantizeThreads / 32 - 1) / (kQuantizeThreads / 32)
                                  : (n_blocks_total * 4 + kQuantizeThreads - 1) / kQuantizeThreads;
}

__global__ void quantize_q8_K_kernel(Inputs in, int64_t n_in, int64_t n_blocks_total, ActView act,
                                     int64_t blocks_per_row) {
  pdl_begin();
  apply_inject(in);
  quantize_q8_K_part(in, n_in, n_blocks_total, act, blocks_per_row, blockIdx.x);
}

__global__ void quantize_q8_0_kernel(Inputs in, int64_t n_in, int64_t n_blocks_total, ActView act,
                                     int64_t blocks_per_row) {
  pdl_begin();
  apply_inject(in);
  quantize_q8_0_part(in, n_in, n_blocks_total, act, blocks_per_row, blockIdx.x);
}

// Two layouts of the same input in one launch (blockIdx.y picks the layout).
struct QuantizeTarget {
  GgmlType format;
  ActView act;
  int64_t n_blocks_total, blocks_per_row;
};
__global__ void quantize_two_kernel(Inputs in, int64_t n_in, QuantizeTarget first, QuantizeTarget second) {
  pdl_begin();
  apply_inject(in);
  if (blockIdx.y != 0) in.store = nullptr;  // the first layout's blocks store x
  const QuantizeTarget& t = blockIdx.y == 0 ? first : second;
  if (int64_t(blockIdx.x) >= quantize_blocks(t.format, t.n_blocks_total)) return;
  if (t.format == GgmlType::Q8_K) quantize_q8_K_part(in, n_in, t.n_blocks_total, t.act, t.blocks_per_row, blockIdx.x);
  else quantize_q8_0_part(in, n_in, t.n_blocks_total, t.act, t.blocks_per_row, blockIdx.x);
}

// Grouped RMS norm + quantizer (matmul.h rms_norm_quantize_activations). One block of
// norm_threads(group size) per (row, group), as ops.cu's rms_norm_kernel: the same Σx² order
// (block_sum over the same block size) and the same per-element operations, so `normed` is bitwise
// rms_norm_grouped_rows' output; each thread then quantizes 8 consecutive normed values, the
// quantizers' own per-block arithmetic. With fold_y, X_s += inject_s·y first (hc_out's f32
// operations), written back; with fold_combine (k > 0) y is moe_combine's, computed here from its
// inputs (moe_combine_value, the combine kernel's arithmetic) and stored to fold_y by group 0's block.
// Elements a thread holds in registers: groups up to 8 · norm_threads (8192 values) take the held
// path below. (Holding 12 or 16 at 256 threads instead, for the flagship's 2560-wide streams, was
// slower end to end, session 43: the folded MoE combine's loads per element made a thread's
// held set too large.)
constexpr int kNormHeld = 8;
struct NormQuantizeArgs {
  float* x;
  float* fold_y;
  const float* fold_inject;
  MoeCombineInputs fold_combine;
  const float* weight;
  int64_t n_groups, group_size;
  float eps;
  float* normed;
  GgmlType format;
  ActView act;
  bool weight_shared = false;  // one weight of group_size for every group (else one per group)
  const float* gate = nullptr;  // laid out as x: normed values ·= σ(gate) or silu(gate) (gate_rows)
  bool sigmoid_gate = false;
};

template <int kThreads>
__global__ void __launch_bounds__(kThreads) norm_quantize_kernel(NormQuantizeArgs p) {
  pdl_begin();
  __shared__ float shared[32];
  const int64_t t = blockIdx.x / p.n_groups, g = blockIdx.x % p.n_groups, gs = p.group_size;
  const int64_t offset = t * p.n_groups * gs + g * gs;
  float* x = p.x + offset;
  const MoeCombineInputs& c = p.fold_combine;
  const float shared_gate = c.k > 0 && c.shared ? sigmoid_value(c.shared_gate_logit[t]) : 0.0f;
  // Element i's value (after the folded update) and the y it used; loads only.
  auto folded = [&](int64_t i, float& y) {
    float v = x[i];
    y = 0.0f;
    if (p.fold_y) {
      y = c.k > 0 ? moe_combine_value(c.expert_out, c.weights, c.k, gs, t, i, c.shared, shared_gate)
                  : p.fold_y[t * gs + i];
      v = __fadd_rn(v, __fmul_rn(p.fold_inject[t * p.n_groups + g], y));
    }
    return v;
  };
  auto store = [&](int64_t i, float v, float y) {
    if (!p.fold_y) return;
    if (c.k > 0 && g == 0) p.fold_y[t * gs + i] = y;
    x[i] = v;
  };
  float sum = 0.0f;
  if (gs <= int64_t(kThreads) * kNormHeld) {
    // A thread's elements held in registers, every load issued before the first store: the
    // stores to x and y may alias later loads as far as the compiler knows, so the loop below
    // waits out one L2 round trip per element (the folded MoE combine makes each ~10 loads).
    // The same values, summed in the same order: bitwise the loop.
    float held[kNormHeld], held_y[kNormHeld];
#pragma unroll
    for (int n = 0; n < kNormHeld; ++n) {
      const int64_t i = threadIdx.x + int64_t(n) * kThreads;
      held[n] = i < gs ? folded(i, held_y[n]) : 0.0f;
    }
#pragma unroll
    for (int n = 0; n < kNormHeld; ++n) {
      const int64_t i = threadIdx.x + int64_t(n) * kThreads;
      if (i < gs) {
        store(i, held[n], held_y[n]);
        sum = __fmaf_rn(held[n], held[n], sum);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < gs; i += blockDim.x) {
      float y;
      const float v = folded(i, y);
      store(i, v, y);
      sum = __fmaf_rn(v, v, sum);
    }
  }
  sum = block_sum(sum, shared);
  const float mean = __fdiv_rn(sum, float(gs));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, p.eps)));
  const float* w = p.weight ? p.weight + (p.weight_shared ? 0 : g * gs) : nullptr;
  const float* gate = p.gate ? p.gate + offset : nullptr;
  float* normed = p.normed + offset;
  const int64_t per_pass = int64_t(blockDim.x) * 8;
  for (int64_t base = 0; base < gs; base += per_pass) {
    const int64_t i0 = base + int64_t(threadIdx.x) * 8;
    const bool active = i0 < gs;
    float v[8] = {};
    if (active) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float a = __fmul_rn(x[i0 + j], r);
        v[j] = w ? __fmul_rn(a, w[i0 + j]) : a;
        if (gate) v[j] = __fmul_rn(v[j], p.sigmoid_gate ? sigmoid_value(gate[i0 + j]) : silu_value(gate[i0 + j]));
        normed[i0 + j] = v[j];
      }
    }
    const int64_t column = g * gs + i0;  // in the activation row
    if (p.format == GgmlType::Q8_0) {
      store_q8_0_block(v, int(threadIdx.x & 3), active, int(t), column / 32, p.act);
    } else if (p.format == GgmlType::Q8_K) {
      if (active) store_q8_K_block(v, int(threadIdx.x & 31), int(t), column / 256, p.act);  // whole warps (gs % 256 == 0)
    } else if (active) {
      float* dst = const_cast<float*>(p.act.floats(int(t))) + column;
#pragma unroll
      for (int j = 0; j < 8; ++j) dst[j] = v[j];
    }
  }
}

ActView view_of(const ActivationLayout& layout, const void* scratch) {
  return ActView{static_cast<const uint8_t*>(scratch), layout.qs_offset, layout.qs_row_bytes,
                 layout.scale_offset, layout.scale_row_count, layout.sum_offset, layout.sum_row_count};
}

// A quantized (Q8_0 or Q8_K) layout as its quantizer's launch sees it.
QuantizeTarget target_of(const ActivationLayout& layout, const void* scratch) {
  const int64_t block = layout.format == GgmlType::Q8_K ? 256 : 32, per_row = layout.n_in / block;
  return QuantizeTarget{layout.format, view_of(layout, scratch), per_row * layout.n_rows, per_row};
}

// Calls fn.template operator()<Q>() with the device description of `type`.
template <typename Fn>
void with_weights(GgmlType type, Fn&& fn) {
  switch (type) {
    case GgmlType::F32: return fn.template operator()<FloatWeights<GgmlType::F32>>();
    case GgmlType::F16: return fn.template operator()<FloatWeights<GgmlType::F16>>();
    case GgmlType::BF16: return fn.template operator()<FloatWeights<GgmlType::BF16>>();
    case GgmlType::Q8_0: return fn.template operator()<Q8_0Weights>();
    case GgmlType::Q4_0: return fn.template operator()<Q4_0Weights>();
    case GgmlType::Q4_1: return fn.template operator()<Q4_1Weights>();
    case GgmlType::Q5_0: return fn.template operator()<Q5_0Weights>();
    case GgmlType::Q5_1: return fn.template operator()<Q5_1Weights>();
    case GgmlType::IQ4_NL: return fn.template operator()<IQ4_NLWeights>();
    case GgmlType::Q2_K: return fn.template operator()<Q2_KWeights>();
    case GgmlType::Q3_K: return fn.template operator()<Q3_KWeights>();
    case GgmlType::Q4_K: return fn.template operator()<Q4_KWeights>();
    case GgmlType::Q5_K: return fn.template operator()<Q5_KWeights>();
    case GgmlType::Q6_K: return fn.template operator()<Q6_KWeights>();
    case GgmlType::IQ4_XS: return fn.template operator()<IQ4_XSWeights>();
    case GgmlType::IQ2_XXS: return fn.template operator()<IQ2_XXSWeights>();
    case GgmlType::IQ2_XS: return fn.template operator()<IQ2_XSWeights>();
    case GgmlType::IQ2_S: return fn.template operator()<IQ2_SWeights>();
    case GgmlType::IQ3_XXS: return fn.template operator()<IQ3_XXSWeights>();
    case GgmlType::IQ3_S: return fn.template operator()<IQ3_SWeights>();
    case GgmlType::IQ1_S: return fn.template operator()<IQ1_SWeights>();
    case GgmlType::IQ1_M: return fn.template operator()<IQ1_MWeights>();
    default: cuda_fail("CUDA matmul: weight type " + std::string(type_name(type)) + " has no CUDA kernel");
  }
}

void check_matrix(GgmlType type, int64_t n_in, int64_t n_out, size_t row_stride, const void* base) {
  with_weights(type, [&]<class Q>() {
    if (n_in <= 0 || n_in % Q::kBlockElems != 0)
      cuda_fail("CUDA matmul: " + std::string(type_name(type)) + " rows of " + std::to_string(n_in) +
                " weights: expected a positive multiple of " + std::to_string(Q::kBlockElems));
    if (n_out <= 0) cuda_fail("CUDA matmul: expected at least one output row, found " + std::to_string(n_out));
    const size_t row_bytes = size_t(n_in / Q::kBlockElems) * Q::kBlockBytes;
    if (row_stride < row_bytes)
      cuda_fail("CUDA matmul: row stride " + std::to_string(row_stride) + " bytes is smaller than a row (" +
                std::to_string(row_bytes) + ")");
    if ((reinterpret_cast<uintptr_t>(base) | row_stride) % Q::kRowAlign != 0)
      cuda_fail("CUDA matmul: " + std::string(type_name(type)) + " weights must be " + std::to_string(Q::kRowAlign) +
                "-byte aligned, rows a multiple of that apart (base % 16 = " +
                std::to_string(reinterpret_cast<uintptr_t>(base) % 16) + ", stride " + std::to_string(row_stride) + ")");
  });
}

}  // namespace

bool has_cuda_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::IQ4_NL:
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
    case GgmlType::IQ4_XS:
    case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S: case GgmlType::IQ3_XXS: case GgmlType::IQ3_S:
    case GgmlType::IQ1_S: case GgmlType::IQ1_M:
      return true;
    default:
      return false;
  }
}

bool wide_rows(GgmlType type, int64_t n_in, int64_t n_out, const MatmulTuning* tuning) {
  bool wide = false;
  with_weights(type, [&]<class Q>() {
    if (n_in > 0 && n_in % Q::kBlockElems == 0) wide = wide_warps_per_row<Q>(n_in, n_out, tuning) > 1;
  });
  return wide;
}

MatvecPath matvec_path(GgmlType type, int64_t n_in, int64_t n_rows, const MatmulTuning* tuning) {
  MatvecPath path = MatvecPath::Direct;
  with_weights(type, [&]<class Q>() {
    if (n_in <= 0 || n_in % Q::kBlockElems != 0) return;
    const int rows = int(std::clamp<int64_t>(n_rows, 1, kMaxRowsPerPass));
    const int lanes = lanes_per_row<Q>(n_in, tuning);
    const StagedPlan plan = plan_staged<Q>(n_in, rows, pass_rows_per_warp<Q>(rows, lanes, tuning), lanes, tuning);
    if (plan.staged) path = plan.shared_act ? MatvecPath::StagedSharedActivations : MatvecPath::Staged;
  });
  return path;
}

ActivationLayout activation_layout(GgmlType weight_type, int64_t n_in, int64_t n_rows) {
  ActivationLayout l;
  with_weights(weight_type, [&]<class Q>() {
    if (n_in <= 0 || n_in % Q::kBlockElems != 0)
      cuda_fail("CUDA activations for " + std::string(type_name(weight_type)) + ": width " + std::to_string(n_in) +
                " is not a positive multiple of " + std::to_string(Q::kBlockElems));
    l.format = Q::kActivation;
  });
  l.n_in = n_in;
  l.n_rows = n_rows;
  const size_t rows = size_t(std::max<int64_t>(n_rows, 1));
  if (l.format == GgmlType::F32) {
    l.qs_row_bytes = round_up(size_t(n_in) * 4, 16);
  } else {
    const int64_t block = l.format == GgmlType::Q8_K ? 256 : 32;
    l.qs_row_bytes = round_up(size_t(n_in), 16);
    l.scale_row_count = size_t(n_in / block);
    l.sum_row_count = l.format == GgmlType::Q8_K ? size_t(n_in / 16) : size_t(n_in / 32);
  }
  l.qs_offset = 0;
  l.scale_offset = round_up(l.qs_row_bytes * rows, 256);
  l.sum_offset = round_up(l.scale_offset + l.scale_row_count * 4 * rows, 256);
  l.total_bytes = round_up(l.sum_offset + l.sum_row_count * 4 * rows, 256);
  return l;
}

void quantize_activations_fused(const ActivationLayout& layout, ActivationPrologue prologue, const float* a,
                                const float* b, float scale, void* scratch, cudaStream_t stream) {
  if (layout.n_rows <= 0) return;
  if ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % 16 != 0 || layout.n_in % 8 != 0)
    cuda_fail("CUDA quantize_activations: inputs must be 16-byte aligned and the width a multiple of 8 (width " +
              std::to_string(layout.n_in) + ")");
  if (prologue == ActivationPrologue::SiluMul && !b)
    cuda_fail("CUDA quantize_activations: the silu-mul prologue needs its second input");
  if (prologue == ActivationPrologue::HcCombine)
    cuda_fail("CUDA quantize_activations_fused: hc_combine goes through quantize_activations_combined");
  const ActView act = view_of(layout, scratch);
  const Inputs in{prologue, a, b, scale};
  if (layout.format == GgmlType::F32) {
    if (prologue == ActivationPrologue::None) {
      STRATA_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<uint8_t*>(scratch) + layout.qs_offset, layout.qs_row_bytes, a,
                                          size_t(layout.n_in) * 4, size_t(layout.n_in) * 4, size_t(layout.n_rows),
                                          cudaMemcpyDeviceToDevice, stream));
      return;
    }
    const int64_t groups = layout.n_in / 8 * layout.n_rows;
    launch(prologue_f32_kernel, unsigned(std::min<int64_t>((groups + 255) / 256, 4096)), 256, 0, stream, in,
           layout.n_in, layout.n_rows, act);
  } else {
    const QuantizeTarget t = target_of(layout, scratch);
    launch(t.format == GgmlType::Q8_K ? quantize_q8_K_kernel : quantize_q8_0_kernel,
           unsigned(quantize_blocks(t.format, t.n_blocks_total)), kQuantizeThreads, 0, stream, in, layout.n_in,
           t.n_blocks_total, t.act, t.blocks_per_row);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void quantize_activations(const ActivationLayout& layout, const float* x, void* scratch, cudaStream_t stream) {
  quantize_activations_fused(layout, ActivationPrologue::None, x, nullptr, 0.0f, scratch, stream);
}

// The quantizer's inputs for hc_combine's output (quantize_activations_combined).
static Inputs combined_inputs(const HcCombineInputs& in, const ActivationLayout& layout) {
  if (!in.gates || !in.normed || !in.x || in.n_streams <= 0)
    cuda_fail("CUDA quantize_activations_combined: gates, normed, x and a positive stream count are required");
  if ((reinterpret_cast<uintptr_t>(in.x) | reinterpret_cast<uintptr_t>(in.gates) |
       reinterpret_cast<uintptr_t>(in.normed)) % 16 != 0 ||
      layout.n_in % 8 != 0)
    cuda_fail("CUDA quantize_activations_combined: x, gates and normed must be 16-byte aligned and the width a "
              "multiple of 8 (width " + std::to_string(layout.n_in) + ")");
  Inputs inputs{ActivationPrologue::HcCombine, in.gates, in.normed, in.inv_streams};
  inputs.n_streams = in.n_streams;
  inputs.n_in = layout.n_in;
  inputs.store = in.x;
  inputs.inject = in.inject;
  inputs.n_inject = in.inject ? layout.n_rows * in.n_streams : 0;
  return inputs;
}

void quantize_activations_combined(const ActivationLayout& layout, const HcCombineInputs& in, void* scratch,
                                   cudaStream_t stream) {
  if (layout.format == GgmlType::F32)
    cuda_fail("CUDA quantize_activations_combined: F32 activations are x itself (run hc_combine)");
  if (layout.n_rows <= 0) return;
  const Inputs inputs = combined_inputs(in, layout);
  const QuantizeTarget t = target_of(layout, scratch);
  launch(t.format == GgmlType::Q8_K ? quantize_q8_K_kernel : quantize_q8_0_kernel,
         unsigned(quantize_blocks(t.format, t.n_blocks_total)), kQuantizeThreads, 0, stream, inputs, layout.n_in,
         t.n_blocks_total, t.act, t.blocks_per_row);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void quantize_activations_two(const ActivationLayout& first, void* first_scratch, const ActivationLayout& second,
                              void* second_scratch, const float* x, cudaStream_t stream,
                              const HcCombineInputs* combine) {
  const bool quantized = first.format != GgmlType::F32 && second.format != GgmlType::F32;
  if (!quantized || first.n_rows != second.n_rows || first.n_in != second.n_in) {
    if (combine) {
      if (first.format == GgmlType::F32) cuda_fail("CUDA quantize_activations_two: F32 with hc_combine folded in");
      quantize_activations_combined(first, *combine, first_scratch, stream);
      quantize_activations(second, combine->x, second_scratch, stream);
      return;
    }
    quantize_activations(first, x, first_scratch, stream);
    quantize_activations(second, x, second_scratch, stream);
    return;
  }
  if (first.n_rows <= 0) return;
  if (!combine && (reinterpret_cast<uintptr_t>(x) % 16 != 0 || first.n_in % 8 != 0))
    cuda_fail("CUDA quantize_activations: inputs must be 16-byte aligned and the width a multiple of 8 (width " +
              std::to_string(first.n_in) + ")");
  const QuantizeTarget a = target_of(first, first_scratch), b = target_of(second, second_scratch);
  const int64_t blocks = std::max(quantize_blocks(a.format, a.n_blocks_total), quantize_blocks(b.format, b.n_blocks_total));
  launch(quantize_two_kernel, dim3(unsigned(blocks), 2), kQuantizeThreads, 0, stream,
         combine ? combined_inputs(*combine, first) : Inputs{ActivationPrologue::None, x, nullptr, 0.0f}, first.n_in, a,
         b);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

bool can_norm_quantize(const ActivationLayout& layout, int64_t n_groups, int64_t group_size) {
  if (n_groups <= 0 || group_size <= 0 || layout.n_in != n_groups * group_size || group_size % 8 != 0) return false;
  if (layout.format == GgmlType::Q8_K) return group_size % 256 == 0;
  if (layout.format == GgmlType::Q8_0) return group_size % 32 == 0;
  return layout.format == GgmlType::F32;
}

// The kernel instantiation of the group's block size (norm_threads, as ops.cu's norms).
static void launch_norm_quantize(const NormQuantizeArgs& args, unsigned blocks, cudaStream_t stream) {
  if (norm_threads(args.group_size) == 1024) launch(norm_quantize_kernel<1024>, blocks, 1024, 0, stream, args);
  else launch(norm_quantize_kernel<256>, blocks, 256, 0, stream, args);
}

void rms_norm_quantize_activations(const ActivationLayout& layout, float* x, const float* weight, int64_t n_groups,
                                   int64_t group_size, float eps, float* normed, void* scratch, cudaStream_t stream,
                                   float* fold_y, const float* fold_inject, const MoeCombineInputs* fold_combine) {
  if (!can_norm_quantize(layout, n_groups, group_size))
    cuda_fail("CUDA rms_norm_quantize_activations: " + std::to_string(n_groups) + " groups of " +
              std::to_string(group_size) + " do not fit " + std::string(type_name(layout.format)) +
              " activations of width " + std::to_string(layout.n_in) + " (see can_norm_quantize)");
  if ((fold_y == nullptr) != (fold_inject == nullptr))
    cuda_fail("CUDA rms_norm_quantize_activations: the folded residual update needs both y and inject");
  if (layout.n_rows <= 0) return;
  if (fold_combine && !fold_y)
    cuda_fail("CUDA rms_norm_quantize_activations: a folded MoE combine needs y (where it is stored)");
  const NormQuantizeArgs args{x, fold_y, fold_inject, fold_combine ? *fold_combine : MoeCombineInputs{}, weight, n_groups, group_size, eps, normed, layout.format,
                              view_of(layout, scratch)};
  launch_norm_quantize(args, unsigned(layout.n_rows * n_groups), stream);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void rms_norm_gate_quantize_activations(const ActivationLayout& layout, float* x, const float* weight,
                                        int64_t n_groups, int64_t group_size, float eps, const float* gate,
                                        bool sigmoid_gate, void* scratch, cudaStream_t stream) {
  if (!can_norm_quantize(layout, n_groups, group_size))
    cuda_fail("CUDA rms_norm_gate_quantize_activations: " + std::to_string(n_groups) + " heads of " +
              std::to_string(group_size) + " do not fit " + std::string(type_name(layout.format)) +
              " activations of width " + std::to_string(layout.n_in) + " (see can_norm_quantize)");
  if (!gate) cuda_fail("CUDA rms_norm_gate_quantize_activations: the gate input is required");
  if (layout.n_rows <= 0) return;
  NormQuantizeArgs args{x, nullptr, nullptr, MoeCombineInputs{}, weight, n_groups, group_size, eps, x, layout.format,
                        view_of(layout, scratch)};
  args.weight_shared = true;
  args.gate = gate;
  args.sigmoid_gate = sigmoid_gate;
  launch_norm_quantize(args, unsigned(layout.n_rows * n_groups), stream);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void matmul_quantized(const DeviceMatrix& w, const ActivationLayout& layout, const void* scratch, int64_t n_rows,
                      float* y, cudaStream_t stream, const MatmulTuning* tuning) {
  if (n_rows <= 0) return;
  check_matrix(w.type, w.n_in, w.n_out, w.row_stride_bytes, w.data);
  if (layout.n_in != w.n_in || layout.n_rows < n_rows)
    cuda_fail("CUDA matmul: activations of width " + std::to_string(layout.n_in) + " x " + std::to_string(layout.n_rows) +
              " rows do not fit a " + std::to_string(w.n_in) + "-wide matrix over " + std::to_string(n_rows) + " rows");
  MatmulArgs args{};
  args.w = static_cast<const uint8_t*>(w.data);
  args.row_stride = w.row_stride_bytes;
  args.n_in = w.n_in;
  args.n_out = w.n_out;
  args.act = view_of(layout, scratch);
  args.y = y;
  args.n_rows = int(n_rows);
  with_weights(w.type, [&]<class Q>() {
    if (Q::kActivation != layout.format)
      cuda_fail("CUDA matmul: activations quantized for another weight type (" + std::string(type_name(layout.format)) + ")");
    launch_matmul<Q>(args, 1, int(n_rows), stream, tuning);
  });
}

void matmul_quantized_many(std::span<const DenseOutput> outputs, const ActivationLayout& layout, const void* scratch,
                           int64_t n_rows, cudaStream_t stream, const MatmulTuning* tuning) {
  if (n_rows <= 0 || outputs.empty()) return;
  if (outputs.size() > size_t(kMaxDenseMatrices))
    cuda_fail("CUDA matmul: " + std::to_string(outputs.size()) + " matrices in one launch (at most " +
              std::to_string(kMaxDenseMatrices) + ")");
  const DeviceMatrix& first = outputs[0].w;
  // Wide rows are chosen per matrix (wide_rows): matrices that differ run in two launches, so
  // each gets the kernel shape, and the bits, it gets alone.
  const auto is_wide = [&](const DenseOutput& o) { return wide_rows(o.w.type, o.w.n_in, o.w.n_out, tuning); };
  if (std::any_of(outputs.begin(), outputs.end(), is_wide) && !std::all_of(outputs.begin(), outputs.end(), is_wide)) {
    std::vector<DenseOutput> wide, narrow;
    for (const DenseOutput& o : outputs) (is_wide(o) ? wide : narrow).push_back(o);
    matmul_quantized_many(wide, layout, scratch, n_rows, stream, tuning);
    matmul_quantized_many(narrow, layout, scratch, n_rows, stream, tuning);
    return;
  }
  MatmulArgs args{};
  args.n_in = first.n_in;
  args.act = view_of(layout, scratch);
  args.n_rows = int(n_rows);
  args.n_dense = int(outputs.size());
  for (size_t j = 0; j < outputs.size(); ++j) {
    const DeviceMatrix& w = outputs[j].w;
    check_matrix(w.type, w.n_in, w.n_out, w.row_stride_bytes, w.data);
    if (w.type != first.type || w.n_in != first.n_in)
      cuda_fail("CUDA matmul: the matrices of one launch must share the type and input width (" +
                std::string(type_name(first.type)) + " x " + std::to_string(first.n_in) + ", found " +
                std::string(type_name(w.type)) + " x " + std::to_string(w.n_in) + ")");
    args.dense[j] = DenseTarget{static_cast<const uint8_t*>(w.data), w.row_stride_bytes, w.n_out, outputs[j].y};
    args.n_out = std::max(args.n_out, w.n_out);  // sizes the grid; each row of the grid stops at its own
  }
  if (layout.n_in != first.n_in || layout.n_rows < n_rows)
    cuda_fail("CUDA matmul: activations of width " + std::to_string(layout.n_in) + " x " + std::to_string(layout.n_rows) +
              " rows do not fit a " + std::to_string(first.n_in) + "-wide matrix over " + std::to_string(n_rows) + " rows");
  // The unused fields of the one-matrix form point at the first matrix (never read with n_dense > 0).
  args.w = args.dense[0].w;
  args.row_stride = args.dense[0].row_stride;
  args.y = args.dense[0].y;
  with_weights(first.type, [&]<class Q>() {
    if (Q::kActivation != layout.format)
      cuda_fail("CUDA matmul: activations quantized for another weight type (" + std::string(type_name(layout.format)) + ")");
    launch_matmul<Q>(args, int(outputs.size()), int(n_rows), stream, tuning);
  });
}

const void* prepare_activations(const ActivationLayout& layout, const float* x, void* scratch, cudaStream_t stream) {
  if (layout.format == GgmlType::F32 && layout.qs_offset == 0 && layout.qs_row_bytes == size_t(layout.n_in) * 4 &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0)
    return x;
  quantize_activations(layout, x, scratch, stream);
  return scratch;
}

void matmul(const DeviceMatrix& w, const float* x, int64_t n_rows, float* y, void* scratch, cudaStream_t stream) {
  const ActivationLayout layout = activation_layout(w.type, w.n_in, n_rows);
  matmul_quantized(w, layout, prepare_activations(layout, x, scratch, stream), n_rows, y, stream);
}

bool can_quantize_in_block(GgmlType type, int64_t n_in, int64_t n_rows, const MatmulTuning* tuning) {
  if (!has_cuda_kernel(type) || n_rows < 1 || n_rows > kMaxRowsPerPass || !in_block_env()) return false;
  bool fits = false;
  with_weights(type, [&]<class Q>() { fits = n_in > 0 && n_in % Q::kBlockElems == 0 && in_block_fits<Q>(n_in, int(n_rows), tuning); });
  return fits;
}

namespace {

// The in-block fields of MatmulArgs from `in`, after the checks both forms share.
void set_in_block(MatmulArgs& args, const InBlockActivations& in, GgmlType type, int64_t n_in, int64_t n_rows,
                  const MatmulTuning* tuning) {
  if (in.prologue != ActivationPrologue::SiluMul && in.prologue != ActivationPrologue::ScaledSilu)
    cuda_fail("CUDA matmul in block: expected the prologue SiluMul or ScaledSilu (the others have their quantizer launch)");
  if (!in.a || (in.prologue == ActivationPrologue::SiluMul && !in.b) ||
      (reinterpret_cast<uintptr_t>(in.a) | reinterpret_cast<uintptr_t>(in.b)) % 16 != 0)
    cuda_fail("CUDA matmul in block: the input rows must be given and 16-byte aligned");
  if (!can_quantize_in_block(type, n_in, n_rows, tuning))
    cuda_fail("CUDA matmul in block: " + std::string(type_name(type)) + " x " + std::to_string(n_in) + " over " +
              std::to_string(n_rows) + " rows is not taken (see can_quantize_in_block)");
  args.in_prologue = in.prologue;
  args.in_a = in.a;
  args.in_b = in.b;
  args.in_scale = in.scale;
}

}  // namespace

void matmul_in_block(const DeviceMatrix& w, const InBlockActivations& in, int64_t n_rows, float* y,
                     cudaStream_t stream, const MatmulTuning* tuning) {
  if (n_rows <= 0) return;
  check_matrix(w.type, w.n_in, w.n_out, w.row_stride_bytes, w.data);
  MatmulArgs args{};
  set_in_block(args, in, w.type, w.n_in, n_rows, tuning);
  args.w = static_cast<const uint8_t*>(w.data);
  args.row_stride = w.row_stride_bytes;
  args.n_in = w.n_in;
  args.n_out = w.n_out;
  args.y = y;
  args.n_rows = int(n_rows);
  with_weights(w.type, [&]<class Q>() { launch_matmul<Q>(args, 1, int(n_rows), stream, tuning); });
}

namespace {

void check_expert_matrix(const ExpertArenaView& arena, const ExpertMatrixShape& shape, const ActivationLayout& layout) {
  check_matrix(shape.type, shape.n_in, shape.n_out, shape.row_stride_bytes, arena.base);
  if ((reinterpret_cast<uintptr_t>(arena.base) | arena.slot_bytes | shape.matrix_offset) % 16 != 0)
    cuda_fail("CUDA expert matmul: slot size " + std::to_string(arena.slot_bytes) + " and matrix offset " +
              std::to_string(shape.matrix_offset) + " (and the arena base) must be multiples of 16");
  if (layout.n_in != shape.n_in)
    cuda_fail("CUDA expert matmul: activations of width " + std::to_string(layout.n_in) + " for a " +
              std::to_string(shape.n_in) + "-wide matrix");
}

// With `in_block`, the activations are computed in the launch (layout and scratch unused).
void launch_experts(const ExpertArenaView& arena, int layer, const ExpertMatrixShape& shape,
                    const ExpertMatrixShape* second, const int32_t* expert_ids, int n_launch,
                    const int32_t* row_ids, const int32_t* row_counts, int max_rows, const ActivationLayout& layout,
                    const void* scratch, float* y, float* second_y, cudaStream_t stream, const MatmulTuning* tuning,
                    const InBlockActivations* in_block = nullptr) {
  if (n_launch <= 0 || max_rows <= 0) return;
  const int grid_rows = second ? 2 * n_launch : n_launch;
  if (grid_rows > 65535)
    cuda_fail("CUDA expert matmul: " + std::to_string(grid_rows) + " expert matrices in one launch (at most 65535)");
  check_expert_matrix(arena, shape, in_block ? activation_layout(shape.type, shape.n_in, max_rows) : layout);
  if (second) {
    check_expert_matrix(arena, *second, layout);
    if (second->type != shape.type || second->n_in != shape.n_in || second->n_out != shape.n_out ||
        second->row_stride_bytes != shape.row_stride_bytes || !second_y)
      cuda_fail("CUDA expert matmul: the second matrix of a launch must have the first's type and shape, and an output");
  }
  MatmulArgs args{};
  args.w = arena.base;
  args.row_stride = shape.row_stride_bytes;
  args.n_in = shape.n_in;
  args.n_out = shape.n_out;
  args.act = view_of(layout, scratch);
  args.y = y;
  args.slot_bytes = arena.slot_bytes;
  args.matrix_offset = shape.matrix_offset;
  args.smap_layer = arena.smap + size_t(layer) * size_t(arena.n_expert);
  args.expert_ids = expert_ids;
  args.row_ids = row_ids;
  args.row_counts = row_counts;
  args.max_rows = max_rows;
  args.n_listed = n_launch;
  args.second_offset = second ? second->matrix_offset : 0;
  args.second_y = second ? second_y : nullptr;
  if (in_block) {
    set_in_block(args, *in_block, shape.type, shape.n_in, max_rows, tuning);
    args.act = ActView{};
    with_weights(shape.type, [&]<class Q>() { launch_matmul<Q>(args, grid_rows, max_rows, stream, tuning); });
    return;
  }
  with_weights(shape.type, [&]<class Q>() {
    if (Q::kActivation != layout.format)
      cuda_fail("CUDA matmul: activations quantized for another weight type (" + std::string(type_name(layout.format)) + ")");
    launch_matmul<Q>(args, grid_rows, max_rows, stream, tuning);
  });
}

}  // namespace

void expert_matmul_quantized(const ExpertArenaView& arena, int layer, const ExpertMatrixShape& shape,
                             const int32_t* expert_ids, int n_launch, const int32_t* row_ids,
                             const int32_t* row_counts, int max_rows, const ActivationLayout& layout,
                             const void* scratch, float* y, cudaStream_t stream, const MatmulTuning* tuning) {
  launch_experts(arena, layer, shape, nullptr, expert_ids, n_launch, row_ids, row_counts, max_rows, layout, scratch, y,
                 nullptr, stream, tuning);
}

void expert_matmul_in_block(const ExpertArenaView& arena, int layer, const ExpertMatrixShape& shape,
                            const int32_t* expert_ids, int n_launch, const int32_t* row_ids,
                            const int32_t* row_counts, int max_rows, const InBlockActivations& in, float* y,
                            cudaStream_t stream, const MatmulTuning* tuning) {
  launch_experts(arena, layer, shape, nullptr, expert_ids, n_launch, row_ids, row_counts, max_rows, ActivationLayout{},
                 nullptr, y, nullptr, stream, tuning, &in);
}

bool can_pair_experts(const ExpertMatrixShape& a, const ExpertMatrixShape& b) {
  return a.type == b.type && a.n_in == b.n_in && a.n_out == b.n_out && a.row_stride_bytes == b.row_stride_bytes;
}

void expert_matmul_quantized_pair(const ExpertArenaView& arena, int layer, const ExpertMatrixShape& first,
                                  const ExpertMatrixShape& second, const int32_t* expert_ids, int n_launch,
                                  const int32_t* row_ids, const int32_t* row_counts, int max_rows,
                                  const ActivationLayout& layout, const void* scratch, float* y_first,
                                  float* y_second, cudaStream_t stream, const MatmulTuning* tuning) {
  launch_experts(arena, layer, first, &second, expert_ids, n_launch, row_ids, row_counts, max_rows, layout, scratch,
                 y_first, y_second, stream, tuning);
}

// ---- matmul_plan.cuh's host helpers: one definition each, so one cache each -----------------

namespace matmul_detail {

int sm_count() {
  static int count = [] {
    int device = 0, value = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device));
    return value;
  }();
  return count;
}

// The most dynamic shared memory a block may ask for (cudaFuncSetAttribute raises a kernel's limit
// from the default 48 KiB up to it): 227 KiB on Hopper.
size_t shared_optin_bytes() {
  static const size_t bytes = [] {
    int device = 0, value = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return size_t(value);
  }();
  return bytes;
}

// Blocks of kWarpsPerBlock warps of `kernel` with `shared_bytes` of dynamic shared memory that
// fit one SM at once (the CUDA occupancy calculator; registers, shared memory, threads), cached.
int resident_blocks_per_sm(const void* kernel, size_t shared_bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, size_t>, int> cache;
  const std::lock_guard lock(mutex);
  const auto key = std::pair(kernel, shared_bytes);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  int blocks = 0;
  STRATA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarpsPerBlock * 32, shared_bytes));
  return cache[key] = std::max(blocks, 1);
}

// Weight rows per warp for narrow rows (< 32 units: several rows share a warp) when no tuning
// says otherwise: 1. Measured end to end on the 48-layer, 512-expert mid-qwen4exp (IQ2_XS
// experts: 1024- and 512-wide rows), H200, session 32, three alternating rounds in one call:
// decode 181.2 -> 202.4 tok/s all in VRAM (1.12x), 136.6 -> 145.5 at a 50 % GPU budget (1.07x)
// against default_rows_per_warp's 4 (per kernel, session 25: 5.09 / 3.74 against 6.67 / 4.59 µs).
// STRATA_CUDA_NARROW_ROWS_PER_WARP=2|4 selects another for measuring without a rebuild; results
// do not change (the reduction order is fixed by the row's width).
int narrow_rows_per_warp() {
  static const int value = [] {
    const char* v = std::getenv("STRATA_CUDA_NARROW_ROWS_PER_WARP");
    if (!v || !*v) return 1;
    const int n = std::atoi(v);
    if (n != 1 && n != 2 && n != 4)
      cuda_fail(std::string("STRATA_CUDA_NARROW_ROWS_PER_WARP: expected 1, 2 or 4, found ") + v);
    return n;
  }();
  return value;
}

namespace {

// A 0/1 switch read once from the environment: unset or empty gives `unset`; anything but 0 or 1
// fails, naming the variable.
int env_switch(const char* name, int unset) {
  const char* v = std::getenv(name);
  if (!v || !*v) return unset;
  if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0)
    cuda_fail(std::string(name) + ": expected 0 or 1, found " + v);
  return *v - '0';
}

}  // namespace

// The switches below exist for before/after measurements without a rebuild (scripts/
// cuda-bench-ab.sh AB_AFTER_ENV); none changes a result.

// STRATA_CUDA_IN_BLOCK=0: the in-block quantizer off (can_quantize_in_block false); unset or 1: on.
bool in_block_env() {
  static const bool value = env_switch("STRATA_CUDA_IN_BLOCK", 1) == 1;
  return value;
}

// STRATA_CUDA_WIDE_ROWS=0: wide rows off (matmul.h wide_rows); unset or 1: on.
bool wide_rows_env() {
  static const bool value = env_switch("STRATA_CUDA_WIDE_ROWS", 1) == 1;
  return value;
}

// STRATA_CUDA_STAGED=0|1: the staged path off or on for every type that has it when no tuning
// says otherwise; unset (-1): default_staged.
int staged_env() {
  static const int value = env_switch("STRATA_CUDA_STAGED", -1);
  return value;
}

}  // namespace matmul_detail

}  // namespace strata::compute::cuda
