// CUDA twins of compute/cpu/ops.h and the router step of layers/moe.h, on device rows.
//
// Contract
// - Every function takes device pointers, launches on `stream` and returns at once; argument
//   errors throw strata::Error before any launch.
// - Formulas are the CPU functions' (same names without _rows). Which results are bitwise the
//   CPU's and which only close (tests/cuda/ops_test.cpp bounds each):
//     rope_neox_rows        bitwise in practice: cos/sin from the same f32 angle evaluated in
//                           double, rotations in explicitly rounded f32 (no contraction)
//     top-k selection       bitwise the same experts for the same probabilities (same tie rule)
//     argmax_rows           bitwise (same tie rule; NaN wins)
//     rms_norm*, softmax    reductions in a fixed tree order (not the CPU's 8 lanes): a few ulp
//     silu/sigmoid/softplus CUDA's expf/log1pf (≤ 2 ulp) instead of glibc's: a few ulp
// - Every reduction order depends only on the row width, never on the number of rows, so a
//   row's result is bitwise the same in a T = 1 and a T = k window, and repeated runs agree.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::compute::cuda {

// Threads of one RMS norm block over a group of n values, for every kernel whose Σx² must match
// another's bits (these norms, QSA's block keys, matmul.h's fused norm + quantizers): the
// per-thread strided sums and the block sum's order depend on it. 256, or 1024 past 2048 values,
// so a thread sums at most 8 of a group up to 8192 wide. With 256 threads the flagship's
// 2560-wide hyper-connection streams were 4 blocks of 10 values a thread at T = 1 (17.9 µs a call
// against 9.7 for the mid model's 1024-wide ones; STRATA_CUDA_PROFILE, H100, session 43).
constexpr int norm_threads(int64_t n) { return n > 2048 ? 1024 : 256; }

// out[r·n + i] = (x[r·n + i]·inv_rms_r)·weight[i] (weight may be null), for n_rows rows of n.
void rms_norm_rows(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps,
                   float* out, cudaStream_t stream);
// Each row is n_groups groups of group_size values, each normalised alone; weight (nullable)
// spans the whole row (n_groups·group_size values), as compute::rms_norm_grouped.
void rms_norm_grouped_rows(const float* x, const float* weight, int64_t n_rows, int64_t n_groups,
                           int64_t group_size, float eps, float* out, cudaStream_t stream);
// The same norm on n_vectors vectors of n values, vector i at x + i·stride (out likewise), one
// weight of n values for all (per-head norms of interleaved [q | gate] heads: stride 2·head_dim).
void rms_norm_strided(const float* x, const float* weight, int64_t n_vectors, int64_t n, int64_t stride, float eps,
                      float* out, cudaStream_t stream);
// In place, each of n_rows rows of n values.
void softmax_rows(float* x, int64_t n_rows, int64_t n, cudaStream_t stream);
// out[i] = silu(gate[i])·up[i] for n values (the SwiGLU middle); out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);
enum class Activation { Sigmoid, Silu, Softplus };
void activation(Activation kind, const float* x, int64_t n, float* out, cudaStream_t stream);
// NeoX RoPE in place on rows of n_heads·head_dim values; row r uses position positions[r].
void rope_neox_rows(float* x, int64_t n_rows, int n_heads, int head_dim, int n_rot,
                    const int32_t* positions, float theta, cudaStream_t stream);
// The same with row r at x + r·row_stride and its heads head_stride apart (same arithmetic).
void rope_neox_strided(float* x, int64_t n_rows, int64_t row_stride, int n_heads, int64_t head_stride, int head_dim,
                       int n_rot, const int32_t* positions, float theta, cudaStream_t stream);
// QSA block keys completed by a window of n_rows rows starting at position *first_pos_device
// (read when the kernel runs, so one captured launch serves every n_past): for each block b with
// first < (b + 1)·ratio <= first + n_rows, κ_b = RoPE_{b·ratio}(rms_norm(mean of raw rows
// b·ratio .. b·ratio + ratio − 1; norm_weight)) written to block_keys + b·di; other slots are
// untouched. Bitwise the chain qsa_block_means → rms_norm_strided → rope_neox_rows (the same
// operations in the same order). raw: [tokens][di] raw indexer keys; n_rot <= di.
void qsa_block_keys_at(const float* raw, const int32_t* first_pos_device, int64_t n_rows, int ratio, int di,
                       const float* norm_weight, float eps, int n_rot, float theta, float* block_keys,
                       cudaStream_t stream);
// Router: per row, p = softmax(logits) (fp32), the k best experts (higher p first, ties by lower
// id, NaN first), w = p / Σ_picked p (summed best first), written in ascending expert id:
// experts_out/weights_out [n_rows][k]. n_expert <= 4096, k <= 32.
void route_top_k(const float* logits, int64_t n_rows, int n_expert, int k, int32_t* experts_out,
                 float* weights_out, cudaStream_t stream);
// Cache-aware routing (MoCE, route/moce.h) on the device: the rule of moce_select with residency
// read from the GPU expert tier's slot map (compute/cuda/expert_tier.h). smap / smap_next: the
// slot-map rows (n_expert entries, 256-byte units, kMiss = not resident) of this layer and of the
// next (for the read-ahead guess rows); an entry below resident_below is a cache slot (above it:
// a transient slot of an earlier window, not residency). stats (device, 4 doubles: rows, swaps,
// Σ agreement, Σ KL; may be null) accumulate over the main rows; atomics, so their last bits may
// vary, the routing never does.
struct RouteMoce {
  double lambda = 0.0;
  int protect = 1, max_rank = 0;
  const uint32_t* smap = nullptr;
  const uint32_t* smap_next = nullptr;
  uint32_t resident_below = 0;
  double* stats = nullptr;
};
// As route_top_k for rows [0, n_main) (this layer) and [n_main, n_rows) (the next layer's guess),
// choosing by the MoCE rule (n_expert <= 2048). With every expert of the window resident, or
// none, the exact router's experts and weights, bitwise (tested).
void route_top_k_moce(const float* logits, int64_t n_rows, int64_t n_main, int n_expert, int k, const RouteMoce& moce,
                      int32_t* experts_out, float* weights_out, cudaStream_t stream);
// out[r] = argmax of row r (first index among ties, NaN wins).
void argmax_rows(const float* x, int64_t n_rows, int64_t n, int32_t* out, cudaStream_t stream);

}  // namespace strata::compute::cuda
