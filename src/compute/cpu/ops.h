// Elementwise and small reduction ops on f32 vectors (CPU reference and CPU backend).
//
// Contract
// - Plain scalar code, fp32 arithmetic unless a line below says otherwise; each function documents
//   its formula and the order of its sums, because the engine must match HF transformers' fp32
//   forward within ~1e-4 and the CUDA backend is checked against these functions.
// - Deterministic: the same inputs give the same bits on every call and thread.
// - `out` may alias `x` (in place) wherever a function takes both, unless noted.
// - Bad sizes (n <= 0 where a value is needed, k > n, odd n_rot, n_rot > head_dim) throw
//   strata::Error naming the op and the values.
// - Thread safety: pure functions; call from any thread.
#pragma once

#include <cstdint>

namespace strata::compute {

// Σ x[i]² in fp32, in a fixed order: eight interleaved partial sums (lane j takes every i with
// i % 8 == j, in increasing i), combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). This is closer
// to the vectorised pairwise sums torch uses than one serial chain, and it is exactly reproducible.
float sum_of_squares(const float* x, int64_t n);

// out[i] = (x[i] * r) * w[i], r = 1.0f / sqrtf(sum_of_squares(x, n) / float(n) + eps); with
// weight == nullptr the factor w[i] is omitted. Matches HF RMSNorm in fp32:
// x * rsqrt(x.pow(2).mean(-1) + eps) * w. For the "(1 + w)" norms pass the stored (already +1)
// weight, as in GGUF.
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out);

// Grouped RMS norm over n_groups * group_size values: each chunk [g*group_size, (g+1)*group_size)
// is normalised with its own r (computed as in rms_norm), and weight (if not null) spans the whole
// width: out[g*G + i] = (x[g*G + i] * r_g) * weight[g*G + i]. Used for per-stream norms.
void rms_norm_grouped(const float* x, const float* weight, int64_t n_groups, int64_t group_size,
                      float eps, float* out);

// In-place softmax over n values, all in fp32: m = max x; e_i = expf(x_i - m);
// s = Σ e_i (same lane order as sum_of_squares); x_i = e_i * (1.0f / s) — the reciprocal-multiply
// torch's CPU kernel uses. Inputs must be finite or -inf (not all -inf).
void softmax(float* x, int64_t n);

// Scalar activations (torch formulas, fp32).
float sigmoid(float x);   // 1 / (1 + expf(-x))
float silu(float x);      // x / (1 + expf(-x))
float softplus(float x);  // x > 20 ? x : log1pf(expf(x))   (torch's threshold, beta = 1)
// Same over n values; out may alias x. Each output bitwise the scalar function's (on AVX2 CPUs a
// vector exp that is bitwise glibc's expf does the work: exp_avx2.cpp).
void sigmoid(const float* x, int64_t n, float* out);
void silu(const float* x, int64_t n, float* out);
// g[i] = silu(g[i]) * u[i] (the SwiGLU product), bitwise the scalar expression.
void silu_mul(float* g, const float* u, int64_t n);
// o[i] *= sigmoid(gate[i]) and o[i] *= silu(gate[i]) (output gates), bitwise the scalar forms.
void mul_sigmoid(float* o, const float* gate, int64_t n);
void mul_silu(float* o, const float* gate, int64_t n);
void softplus(const float* x, int64_t n, float* out);

// RoPE, NeoX ("rotate_half") layout, partial: the first n_rot dims rotate, dim i paired with
// i + n_rot/2, the rest pass through unchanged.
//   inv_freq_j = 1.0f / float(pow(double(theta), double(float(2j) / float(n_rot))))   (j < n_rot/2)
//   angle_j    = float(pos) * inv_freq_j            (one fp32 multiply)
//   cos_j, sin_j = cos/sin of that fp32 angle evaluated in double, rounded to fp32
// This mirrors HF's fp32 computation (inv_freq = 1/(base ** (arange(0, d, 2).float() / d)),
// freqs = inv_freq * pos in fp32, emb.cos()), so the angles, not just the rotations, agree; it
// differs from llama.cpp's iterated theta_scale powers by a few ulp at large positions.
//   x_j'           = x_j * cos_j - x_{j+h} * sin_j
//   x_{j+h}'       = x_{j+h} * cos_j + x_j * sin_j             (h = n_rot / 2)
// rope_cos_sin fills cos_out[h] and sin_out[h] once per position so several heads can share it.
void rope_cos_sin(int n_rot, int64_t pos, float theta, float* cos_out, float* sin_out);
void rope_neox_apply(float* x, int head_dim, int n_rot, const float* cos_values,
                     const float* sin_values);
void rope_neox(float* x, int head_dim, int n_rot, int64_t pos, float theta);

// Indices of the k largest of v[0..n), best first. Order: higher value first; equal values (also
// -0.0 == +0.0) by lower index first; NaN ranks above every number (as in torch.topk), NaNs
// among themselves by lower index. No allocation; O(n·k) worst case, ~O(n) for typical data.
void top_k(const float* v, int n, int k, int32_t* idx_out);
// Index of the largest value with the same rule (first index among ties; NaN wins). n >= 1.
int64_t argmax(const float* v, int64_t n);

}  // namespace strata::compute
