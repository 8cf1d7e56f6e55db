// The launch plan of the CUDA quantized matmul (internal to compute/cuda/): what the dispatch
// in matmul.cu and the per-weight-type kernel files matmul/*.cu (through matmul_kernels.cuh) share:
// the kernels' arguments, the launch-shape rules (lanes and rows per warp, the staged path's plan)
// and the per-type entry launch_matmul<Q>. Contract of the whole in matmul.h.
//
// Why two headers and matmul/*.cu: the kernels, instantiated for every weight type x rows per pass
// x rows per warp x staged variant (364 of them), took ~3.5 min to compile as one translation unit
// (nvcc 13, sm_90a), which a parallel build could not spread. matmul.cu sees only this header, with
// launch_matmul<Q> declared and not defined, so it never instantiates a kernel; each matmul/*.cu
// includes matmul_kernels.cuh and explicitly instantiates launch_matmul<Q> for a few types, and a
// parallel build compiles those files side by side.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "compute/cuda/matmul.h"
#include "compute/cuda/quant/blocks32.cuh"
#include "compute/cuda/quant/common.cuh"
#include "compute/cuda/quant/float.cuh"
#include "compute/cuda/quant/iq2xs.cuh"
#include "compute/cuda/quant/iq4.cuh"
#include "compute/cuda/quant/iq_lowbit.cuh"
#include "compute/cuda/quant/kquants.cuh"
#include "compute/cuda/quant/staging.cuh"

namespace strata::compute::cuda::matmul_detail {

using namespace quant_device;

inline constexpr int kWarpsPerBlock = 8;
inline constexpr int kMaxRowsPerPass = 8;

// One matrix of a dense launch over several matrices (matmul_quantized_many).
struct DenseTarget {
  const uint8_t* w;
  size_t row_stride;
  int64_t n_out;
  float* y;
};

struct MatmulArgs {
  const uint8_t* w;  // dense: the matrix; experts: the arena base
  size_t row_stride;
  int64_t n_in, n_out;
  ActView act;
  float* y;
  int row_pass;  // first row of this pass (dense: window row; experts: index into each row list)
  int n_rows;    // dense: rows in the window
  // experts (expert_ids == nullptr for a dense matrix)
  size_t slot_bytes, matrix_offset;
  const uint32_t* smap_layer;
  const int32_t* expert_ids;
  const int32_t* row_ids;
  const int32_t* row_counts;
  int max_rows;
  // A second matrix of the same shape in each listed expert's slot (gate and up in one launch):
  // grid rows n_listed .. 2·n_listed − 1 compute it into second_y. second_y == nullptr: none.
  int n_listed;
  size_t second_offset;
  float* second_y;
  // Dynamic shared memory: the type's decode table (Q::kTableBytes rounded to 16), then for the
  // staged kernel the window's activations (act_bytes, 0 unless MatmulTuning::act_shared) and each
  // warp's `stages` weight stage buffers.
  int table_bytes;
  int act_bytes;
  int stages;
  // Dense matrices reading the same activations, one per grid row (blockIdx.y picks dense[j]);
  // n_dense == 0: the one matrix w / row_stride / n_out / y above.
  int n_dense;
  DenseTarget dense[kMaxDenseMatrices];
  // Lanes per weight row (a power of two, host-chosen by lanes_per_row()): 32, or for rows of
  // fewer than 32 units the next power of two at or above the unit count, so one warp computes
  // 32 / lanes row groups side by side instead of leaving lanes idle.
  int lanes;
  // The in-block quantizer (matmul.h InBlockActivations; in_prologue == None: off, `act` is read).
  // On: `act` is unused; every block computes its pass's activation rows from the floats in_a
  // (and in_b) of row width n_in, row rows[r] for r < nr (as select_pass numbers them), through
  // the prologue, and quantizes them into shared memory after the decode table (in_block_bytes).
  ActivationPrologue in_prologue;
  const float* in_a;
  const float* in_b;
  float in_scale;
  int in_block_bytes;
  // Warps sharing each weight row (dense only, host-chosen by wide_warps_per_row): 1, or
  // kWideWarpsPerRow for wide_matmul_kernel.
  int warps_per_row;
};

// The types the in-block quantizer is compiled for: quantized activations, and a decode /
// load_act form whose load_act reads a SharedActView (the others take ActView in unit<NR>).
template <class Q>
constexpr bool kInBlockable = Q::kActivation != GgmlType::F32 && requires { typename Q::Decoded; } &&
                              requires(const SharedActView& v) { Q::load_act(v, 0, 0); };

// The types the staged kernel is compiled for: the 2-byte-aligned blocks whose direct loads cost
// the most L1 wavefronts (Q8_0, IQ4_NL, Q3_K, IQ2_XS), and Q4_K (16-byte loads, but each warp
// instruction spans 8 blocks). Every type costs 20 more instantiations of compile time.
template <class Q>
constexpr bool kStageable = std::is_same_v<Q, Q8_0Weights> || std::is_same_v<Q, IQ4_NLWeights> ||
                            std::is_same_v<Q, Q3_KWeights> || std::is_same_v<Q, Q4_KWeights> ||
                            std::is_same_v<Q, IQ2_XSWeights>;

// ---- host helpers, defined once in matmul.cu (their caches are process-wide) ----------------

// SMs of the device current at the first call (cached).
int sm_count();
// The most dynamic shared memory a block may ask for (cached; 227 KiB on Hopper).
size_t shared_optin_bytes();
// Blocks of kWarpsPerBlock warps of `kernel` with `shared_bytes` of dynamic shared memory that
// fit one SM at once (the CUDA occupancy calculator), cached per kernel and size; thread-safe.
int resident_blocks_per_sm(const void* kernel, size_t shared_bytes);
// Weight rows per warp for rows of < 32 units when no tuning says otherwise: 1, or
// STRATA_CUDA_NARROW_ROWS_PER_WARP (matmul.cu says why).
int narrow_rows_per_warp();
// STRATA_CUDA_STAGED: 0 or 1, -1 when unset (matmul.cu).
int staged_env();
// STRATA_CUDA_IN_BLOCK: false when 0 (matmul.cu).
bool in_block_env();
// STRATA_CUDA_WIDE_ROWS: false when 0 (matmul.cu).
bool wide_rows_env();

// ---- launch shapes --------------------------------------------------------------------------

// Lanes per weight row (MatmulArgs::lanes): a full warp for rows of 32 units or more, or when
// asked (tuning lanes_per_row = 32); else the next power of two at or above the unit count.
template <class Q>
int lanes_per_row(int64_t n_in, const MatmulTuning* tuning) {
  const int64_t n_units = n_in / Q::kBlockElems * Q::kUnitsPerBlock;
  if (n_units >= 32 || (tuning && tuning->lanes_per_row == 32)) return 32;
  int lanes = 1;
  while (lanes < n_units) lanes *= 2;
  return lanes;
}

// Weight rows per warp by window size, from bench_cuda_matvec's sweep on the H200 (8192 x 16384,
// docs/bench-cuda.md): one row (or the type's kRowsPerWarp) for T = 1; sharing each activation
// load over 2-4 weight rows pays from T = 2 on (Q4_K T = 2: 0.24 -> 0.39 of HBM with 4).
template <class Q>
int default_rows_per_warp(int n_rows) {
  if (n_rows == 1) {
    if constexpr (requires { Q::kRowsPerWarp; }) return Q::kRowsPerWarp;
    return 1;
  }
  return n_rows <= 4 ? 4 : 2;
}

// Weight rows per warp of one pass of `rows` activation rows: the tuning's, else the default (the
// narrow rows' own for rows of < 32 units), as the kernels take it: 1, 2 or 4, at most 2 for
// windows of more than 4 rows.
template <class Q>
int pass_rows_per_warp(int rows, int lanes, const MatmulTuning* tuning) {
  const bool tuned = tuning && tuning->rows_per_warp > 0;
  int rw = tuned ? tuning->rows_per_warp : default_rows_per_warp<Q>(rows);
  if (!tuned && lanes < 32) rw = narrow_rows_per_warp();
  rw = rw >= 4 ? 4 : rw == 2 ? 2 : 1;
  return rows > 4 ? std::min(rw, 2) : rw;
}

// The staged path by default, from bench_cuda_matvec --compare on the H100 (session 38,
// docs/bench-cuda.md; 8192 x 16384 and 2560 x 10240, 3 stages, activations in shared memory, ×
// the direct kernel): Q8_0 1.26-1.30 at T = 1, 1.43-1.56 at T = 4; Q4_K 1.11-1.18 and 1.27-1.41;
// Q3_K 1.00-1.01 and 1.21-1.33; IQ4_NL 0.89-0.92 and 1.06-1.17; IQ2_XS 0.93-1.09 and 1.13-1.31.
// So: Q8_0 and Q4_K for windows of 1-4 rows, the others for 2-4 rows. Windows of 5-8 rows keep
// the direct kernel (no shared activations there, and staged Q4_K without them ran at 0.86).
// IQ2_XS from T = 1 too since session 43 (its sign table on the host, H100): 8192 x 16384 1369
// against 1205 GB/s, the flagship's expert shape 2560 x 640 1.08x with the default stages.
template <class Q>
bool default_staged(int rows) {
  if (rows > 4) return false;
  return std::is_same_v<Q, Q8_0Weights> || std::is_same_v<Q, Q4_KWeights> || std::is_same_v<Q, IQ2_XSWeights> ||
         rows >= 2;
}

// What the staged kernel needs for one pass, or staged = false for the direct kernel.
struct StagedPlan {
  bool staged = false;
  bool shared_act = false;
  int stages = 2;
  size_t act_bytes = 0;     // activations in shared memory
  size_t shared_bytes = 0;  // all dynamic shared memory
};

template <class Q>
StagedPlan plan_staged([[maybe_unused]] int64_t n_in, [[maybe_unused]] int rows, [[maybe_unused]] int rw,
                       [[maybe_unused]] int lanes, [[maybe_unused]] const MatmulTuning* tuning) {
  StagedPlan plan;
  if constexpr (kStageable<Q>) {
    const int choice = tuning ? tuning->staging : 0;
    const int env = staged_env();
    // By default (no tuning and no STRATA_CUDA_STAGED): 3 stages where they fit, the activations in
    // shared memory, and the direct kernel where those do not fit (what was measured).
    const bool by_default = choice == 0 && env < 0;
    const bool wanted = choice == 1 || (choice == 0 && (env >= 0 ? env == 1 : default_staged<Q>(rows)));
    if (!wanted || lanes != 32) return plan;
    const int row_bytes = rw == 4 ? stage_row_bytes<Q, 4>() : rw == 2 ? stage_row_bytes<Q, 2>() : stage_row_bytes<Q, 1>();
    const size_t table = size_t(Q::kTableBytes + 15) / 16 * 16;
    const size_t limit = shared_optin_bytes();
    const auto buffer_bytes = [&](int stages) { return size_t(kWarpsPerBlock) * size_t(stages) * size_t(rw) * size_t(row_bytes); };
    const int asked_stages = tuning ? tuning->stages : 0;
    plan.stages = asked_stages == 3 || (asked_stages == 0 && by_default && table + buffer_bytes(3) <= limit) ? 3 : 2;
    const size_t buffers = buffer_bytes(plan.stages);
    if (table + buffers > limit) return plan;
    const int act_choice = tuning ? tuning->act_shared : 0;
    if (rows <= 4 && (act_choice == 1 || (act_choice == 0 && (by_default || rows == 1)))) {
      const bool q8_k = Q::kActivation == GgmlType::Q8_K;
      const int scale_count = int(n_in / (q8_k ? 256 : 32)), sum_count = int(n_in / (q8_k ? 16 : 32));
      const size_t act = size_t(shared_activation_bytes(rows, int(n_in), scale_count, sum_count));
      if (table + act + buffers <= limit) {
        plan.shared_act = true;
        plan.act_bytes = act;
      }
    }
    if (by_default && !plan.shared_act) return plan;  // not measured without them: the direct kernel
    plan.staged = true;
    plan.shared_bytes = table + plan.act_bytes + buffers;
  }
  return plan;
}

// Wide rows: warps sharing one weight row of a dense matrix (wide_matmul_kernel).
inline constexpr int kWideWarpsPerRow = 4;

// Warps per weight row of a dense matrix of type Q (matmul.h wide_rows): kWideWarpsPerRow for
// rows of at least 128 units (4 trips of a warp) when the matrix has at most 1024 of them (one
// warp a row filled at most 128 blocks of 8 warps, about one block an SM on an H100), or where a
// tuning asks for it and the rows take a full warp; else 1. A function of the matrix and the
// tuning only (never the window's rows): every pass of every window runs the same kernel shape.
template <class Q>
int wide_warps_per_row(int64_t n_in, int64_t n_out, const MatmulTuning* tuning) {
  const int64_t n_units = n_in / Q::kBlockElems * Q::kUnitsPerBlock;
  if (tuning) return tuning->warps_per_row == kWideWarpsPerRow && lanes_per_row<Q>(n_in, tuning) == 32 ? kWideWarpsPerRow : 1;
  return wide_rows_env() && n_units >= 128 && n_out <= 1024 ? kWideWarpsPerRow : 1;
}

// Shared bytes of the in-block quantizer's rows (SharedActView's layout, as copy_activations').
template <class Q>
size_t in_block_bytes(int64_t n_in, int rows) {
  const bool q8_k = Q::kActivation == GgmlType::Q8_K;
  return size_t(shared_activation_bytes(rows, int(n_in), int(n_in / (q8_k ? 256 : 32)), int(n_in / (q8_k ? 16 : 32))));
}

// Whether the in-block quantizer takes a window of `rows` rows of type Q and width n_in under
// `tuning`: a type it is compiled for, rows of at most 16 units (lanes < 32: the narrow rows
// whose matmuls are latency-bound, where a launch saved counts), one pass of at most
// kMaxRowsPerPass rows, one weight row per lane group (the only instantiation), and the rows'
// activations small enough for shared memory beside the table.
template <class Q>
bool in_block_fits(int64_t n_in, int rows, const MatmulTuning* tuning) {
  if constexpr (!kInBlockable<Q>) {
    return false;
  } else {
    if (rows < 1 || rows > kMaxRowsPerPass) return false;
    const int lanes = lanes_per_row<Q>(n_in, tuning);
    if (lanes >= 32 || pass_rows_per_warp<Q>(rows, lanes, tuning) != 1) return false;
    return in_block_bytes<Q>(n_in, rows) + size_t(Q::kTableBytes + 15) / 16 * 16 <= 48 * 1024;
  }
}

// Launches weight type Q's matmul over rows_total activation rows, in passes of at most
// kMaxRowsPerPass rows (each pass the direct or the staged kernel, as plan_staged says). Defined
// in matmul_kernels.cuh and explicitly instantiated for each type in exactly one matmul/*.cu; a
// type without its instantiation fails at link time.
template <class Q>
void launch_matmul(MatmulArgs args, int n_launch, int rows_total, cudaStream_t stream,
                   const MatmulTuning* tuning);

}  // namespace strata::compute::cuda::matmul_detail
