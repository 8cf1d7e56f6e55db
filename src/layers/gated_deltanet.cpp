#include "layers/gated_deltanet.h"

#include <cmath>

#include "compute/cpu/ops.h"

namespace strata {
namespace {

// Scales v to unit L2 norm the way HF does: v·rsqrt(Σv² + 1e-6), then by `extra`.
void l2_normalize(float* v, int n, float extra) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += v[i] * v[i];
  const float scale = extra / std::sqrt(sum + 1e-6f);
  for (int i = 0; i < n; ++i) v[i] *= scale;
}

// One delta-rule step for one V head. state: [dk][dv].
void delta_step(float* state, const float* k, const float* q, const float* v, float beta,
                float decay, int dk, int dv, float* out) {
  for (int i = 0; i < dk * dv; ++i) state[i] *= decay;
  for (int j = 0; j < dv; ++j) {
    float recalled = 0.0f;  // (Sᵀk)_j
    for (int i = 0; i < dk; ++i) recalled += state[i * dv + j] * k[i];
    const float u = (v[j] - recalled) * beta;
    for (int i = 0; i < dk; ++i) state[i * dv + j] += k[i] * u;
  }
  for (int j = 0; j < dv; ++j) {
    float o = 0.0f;
    for (int i = 0; i < dk; ++i) o += state[i * dv + j] * q[i];
    out[j] = o;
  }
}

}  // namespace

void GatedDeltaNetState::reset(const HParams& hp) {
  conv.assign(static_cast<size_t>((hp.ssm_conv_kernel - 1) * hp.ssm_conv_dim()), 0.0f);
  ssm.assign(static_cast<size_t>(hp.ssm_n_v_heads) * hp.ssm_d_state * hp.ssm_d_state, 0.0f);
}

void gated_deltanet_forward(compute::ThreadPool& pool, const HParams& hp,
                            const GatedDeltaNetWeights& w, GatedDeltaNetState& state,
                            const float* x, int64_t n_rows, float* y) {
  const int nk = hp.ssm_n_k_heads, nv = hp.ssm_n_v_heads, d = hp.ssm_d_state;
  const int kernel = hp.ssm_conv_kernel;
  const int64_t key_dim = hp.ssm_key_dim(), value_dim = hp.ssm_value_dim();
  const int64_t conv_dim = hp.ssm_conv_dim();
  const int v_per_k = nv / nk;

  std::vector<float> mixed(static_cast<size_t>(n_rows * conv_dim));
  std::vector<float> z(static_cast<size_t>(n_rows * value_dim));
  std::vector<float> beta(static_cast<size_t>(n_rows * nv)), alpha(static_cast<size_t>(n_rows * nv));
  compute::matmul(pool, w.qkv, x, n_rows, mixed.data());
  compute::matmul(pool, w.z, x, n_rows, z.data());
  if (w.fused_beta_alpha()) {
    std::vector<float> ba(static_cast<size_t>(n_rows * 2 * nv));
    compute::matmul(pool, w.beta_alpha, x, n_rows, ba.data());
    // Group g holds b for V heads g·r .. g·r+r-1, then a for the same heads.
    for (int64_t t = 0; t < n_rows; ++t)
      for (int g = 0; g < nk; ++g)
        for (int j = 0; j < v_per_k; ++j) {
          beta[t * nv + g * v_per_k + j] = ba[t * 2 * nv + g * 2 * v_per_k + j];
          alpha[t * nv + g * v_per_k + j] = ba[t * 2 * nv + g * 2 * v_per_k + v_per_k + j];
        }
  } else {
    compute::matmul(pool, w.beta, x, n_rows, beta.data());
    compute::matmul(pool, w.alpha, x, n_rows, alpha.data());
  }

  std::vector<float> core(static_cast<size_t>(n_rows * value_dim));
  std::vector<float> conv_out(static_cast<size_t>(conv_dim));
  std::vector<float> q_heads(static_cast<size_t>(key_dim)), k_heads(static_cast<size_t>(key_dim));
  const float q_scale = 1.0f / std::sqrt(float(d));
  for (int64_t t = 0; t < n_rows; ++t) {
    const float* in = mixed.data() + t * conv_dim;
    // Causal depthwise conv over [history (K-1 rows) | current row], then SiLU.
    for (int64_t ch = 0; ch < conv_dim; ++ch) {
      const float* taps = w.conv.data() + ch * kernel;
      float sum = 0.0f;
      for (int j = 0; j < kernel - 1; ++j) sum += taps[j] * state.conv[j * conv_dim + ch];
      sum += taps[kernel - 1] * in[ch];
      conv_out[size_t(ch)] = compute::silu(sum);
    }
    // Shift the history by one row.
    if (kernel > 1) {
      for (int j = 0; j + 1 < kernel - 1; ++j)
        std::copy_n(state.conv.data() + (j + 1) * conv_dim, conv_dim,
                    state.conv.data() + j * conv_dim);
      std::copy_n(in, conv_dim, state.conv.data() + (kernel - 2) * conv_dim);
    }
    std::copy_n(conv_out.data(), key_dim, q_heads.data());
    std::copy_n(conv_out.data() + key_dim, key_dim, k_heads.data());
    for (int h = 0; h < nk; ++h) {
      l2_normalize(q_heads.data() + h * d, d, q_scale);
      l2_normalize(k_heads.data() + h * d, d, 1.0f);
    }
    const float* v_all = conv_out.data() + 2 * key_dim;
    for (int h = 0; h < nv; ++h) {
      const int kh = hp.ssm_v_heads_tiled ? h % nk : h / v_per_k;
      const float b = compute::sigmoid(beta[t * nv + h]);
      const float g = w.a[h] * compute::softplus(alpha[t * nv + h] + w.dt_bias[h]);
      delta_step(state.ssm.data() + size_t(h) * d * d, k_heads.data() + kh * d,
                 q_heads.data() + kh * d, v_all + h * d, b, std::exp(g), d, d,
                 core.data() + t * value_dim + h * d);
    }
    // Gated RMS norm per V head.
    for (int h = 0; h < nv; ++h) {
      float* o = core.data() + t * value_dim + h * d;
      const float* zh = z.data() + t * value_dim + h * d;
      compute::rms_norm(o, w.norm.data(), d, hp.rms_eps, o);
      for (int j = 0; j < d; ++j)
        o[j] *= hp.ssm_gate_sigmoid ? compute::sigmoid(zh[j]) : compute::silu(zh[j]);
    }
  }
  compute::matmul(pool, w.out, core.data(), n_rows, y);
}

}  // namespace strata
