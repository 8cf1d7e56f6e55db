// CUDA twins of the Gated DeltaNet steps of layers/gated_deltanet.cpp: the recurrent form for
// short windows (decode and speculative verify, T < 32 rows) and the chunked (WY) form for
// prefill windows.
//
// Contract
// - deltanet_conv_silu: causal depthwise conv over [history (K-1 rows) | the window's rows],
//   then SiLU, row by row; the history is shifted in place exactly as the CPU does (it ends as
//   the last K-1 input rows). Sums in the CPU's order (taps oldest first) with explicitly rounded
//   f32 operations, so the pre-SiLU sums are bitwise the CPU's; SiLU uses CUDA's expf (≤ 2 ulp).
// - delta_rule_recurrent: per V head h (K head kmap(h): h % nk when `tiled`, h / (nv/nk) else),
//   token by token:  S ← decay·S;  u = β(v − Sᵀk);  S ← S + k uᵀ;  o = Sᵀq.  It takes the decay
//   itself (e^g, computed by the caller), and performs every multiply and add in the CPU's order
//   with explicit rounding: for the same inputs, state and outputs are bitwise the CPU's.
//   One thread block per V head, one thread per state column (dv of them); the state lives in
//   device memory ([nv][dk][dv], the CPU layout). For dk in {16, 32, 64, 128} and dv <= 256 each
//   column is held in registers for the whole window (read once, written once: 55.6 → 8.5 µs per
//   decode call on the 48-layer model, where the version that reads and writes it twice per
//   token was 16 % of the GPU time); other shapes read and write it twice per token. Both give
//   the same bits.
//   The key head dim dk (q, k) may differ from the value head dim dv (v, the output).
// - delta_rule_chunked: the chunked (WY) form of the same rule, layers/gated_deltanet.h's
//   delta_rule_chunked_head per V head (its contract lists the order): 64-row chunks in order;
//   per chunk KKᵀ, QKᵀ ⊙ Γ, the forward substitution for [U|W], V' = U − W S, the outputs and the
//   state update. It takes g itself (decay_log, the exponent, [n_rows][nv]; γ is its running sum
//   within a chunk) instead of e^g, and performs every multiply and add in the CPU's order with
//   explicit rounding (__fmul_rn/__fadd_rn/__fsub_rn, no contraction): with the same e^x values
//   and no subnormal on the way the bits would be the CPU's (the CPU flushes subnormals to zero,
//   layers/gated_deltanet.h; this kernel keeps them, nvcc's default -ftz=false, and a GPU pays no
//   assist for them; a flushed term is under 2^-126 next to O(1) sums, so it moves a result by at
//   most one rounding). The e^x differ (CUDA's expf, ≤ 2 ulp, vs glibc's), so the
//   outputs and state are the CPU's within a tolerance (tests/cuda/deltanet_test.cpp says which),
//   not bitwise, and they are not the recurrent form's bits either (the two forms round
//   differently; equal up to fp32 rounding). Valid for any n_rows >= 1; the backend uses it for
//   windows of >= 32 rows (the CPU's switch) that are not recorded, only with
//   STRATA_CUDA_CHUNKED_DELTANET=1: it has not run on a GPU yet (written without one), so it is
//   off by default until tests/cuda/deltanet_test.cpp has passed on one and it is measured.
//   Design: one thread block (kChunkedThreads) per V head; the state stays in device memory
//   ([nv][dk][dv], as above), read and written once per chunk by its update and read once per
//   8 rows by the W·S and Q·S products (coalesced, from L2); the chunk's k̂ and q̂ rows, −L,
//   QKᵀ ⊙ Γ, [U|W] (U becomes V' in place) and γ, β, e^γ, β·e^γ, e^{γ_last−γ} live in shared
//   memory: 64·(3·dk + dv + 134) floats for even dk (the k̂ rows padded to dk + 1 against bank
//   conflicts; 133 for odd dk), 165,376 bytes for dk = dv = 128, 198,144 for dk 128, dv 256.
//   Shapes needing more than kMaxChunkedSharedBytes (227 KiB, the H100/H200 per-block opt-in
//   maximum) or the device's opt-in maximum are refused with strata::Error (no global-memory
//   fallback): delta_rule_chunked_supported says beforehand. out is required (nullptr throws).
// - Window identity: each row is processed by the same code whatever the window size; a T-row
//   recurrent call equals T one-row calls bitwise (tested). The chunked form depends on where
//   the chunks start, so it has no such property (as on the CPU).
// - Device pointers; launches on `stream`; argument errors throw strata::Error first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace strata::compute::cuda {

void deltanet_conv_silu(const float* x, int64_t n_rows, int64_t channels, const float* taps, int kernel,
                        float* history, float* out, cudaStream_t stream);

// Splits each conv output row [q (nk·dk) | k (nk·dk) | v (nv·dv)] into q, k, v; L2-normalises each
// q and k head as the CPU's l2_normalize (sequential Σ, v·(extra/√(Σ+1e-6)), extra = 1/√d for q,
// 1 for k: bitwise the CPU's); beta = σ(beta_raw); decay = e^(a·softplus(alpha_raw + dt_bias)).
// beta and decay use CUDA's expf/log1pf: a few ulp from the CPU's. decay_log (optional: nullptr
// is not written) receives g = a·softplus(alpha_raw + dt_bias) itself, of which decay is expf(g)
// bitwise (the same g in the same register: tested), for the chunked form.
void deltanet_prepare(const float* conv_out, const float* beta_raw, const float* alpha_raw, const float* a,
                      const float* dt_bias, int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim,
                      int value_head_dim, float* q, float* k, float* v, float* beta, float* decay,
                      float* decay_log, cudaStream_t stream);

// deltanet_conv_silu then deltanet_prepare in one launch, for short windows (decode and
// speculative verify): the conv output never leaves the chip, one dependent launch fewer per
// DeltaNet layer. Bitwise the two launches (the same device functions per element: tested).
// One block per K head (its q and k channels and 1/nk of the v channels, one channel a thread,
// rows in order, so it alone reads and writes their conv history). The gates' raw logits come
// either as beta_raw/alpha_raw ([n_rows][nv]) or as `ba`, the fused projection's rows
// ([n_rows][nk][β of nv/nk | α of nv/nk], split_beta_alpha's input; the split is then not needed).
// Supported (deltanet_conv_prepare_supported): 1 <= n_rows <= kConvPrepareMaxRows, nv a multiple
// of nk, 2·dk + (nv/nk)·dv <= 1024 channels a block, kernel <= 8; else it throws.
inline constexpr int64_t kConvPrepareMaxRows = 16;
bool deltanet_conv_prepare_supported(int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim,
                                     int value_head_dim, int kernel);
void deltanet_conv_prepare(const float* x, int64_t n_rows, const float* taps, int kernel, float* history,
                           const float* beta_raw, const float* alpha_raw, const float* ba, const float* a,
                           const float* dt_bias, int n_k_heads, int n_v_heads, int key_head_dim, int value_head_dim,
                           float* q, float* k, float* v, float* beta, float* decay, float* decay_log,
                           cudaStream_t stream);

void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* beta, const float* decay,
                          int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim, int value_head_dim,
                          bool tiled, float* state, float* out, cudaStream_t stream);

// The chunked form's rows per chunk: the CPU's kDeltaRuleChunkRows (cuda_backend.cpp checks).
inline constexpr int kChunkedDeltaRuleRows = 64;
// Threads per block (one block per V head): enough warps to hide the latency of the dependent
// sums of the products with the state; the substitution uses dv + dk of them.
inline constexpr int kChunkedThreads = 512;
inline constexpr size_t kMaxChunkedSharedBytes = 227 * 1024;

// Shared memory the chunked form needs per block for these head dims (see the contract).
size_t delta_rule_chunked_shared_bytes(int key_head_dim, int value_head_dim);
// True when delta_rule_chunked accepts these head dims on the current device (shared memory
// within kMaxChunkedSharedBytes and the device's opt-in maximum, read once). Throws only when no
// device can be queried.
bool delta_rule_chunked_supported(int key_head_dim, int value_head_dim);

void delta_rule_chunked(const float* q, const float* k, const float* v, const float* beta, const float* decay_log,
                        int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim, int value_head_dim,
                        bool tiled, float* state, float* out, cudaStream_t stream);

}  // namespace strata::compute::cuda
