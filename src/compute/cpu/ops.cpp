#include "compute/cpu/ops.h"

#include <cmath>
#include <limits>

#include "compute/cpu/exp_avx2.h"
#include "compute/cpu/exp_avx512.h"
#include "quant/quant.h"
#include "util/error.h"

namespace strata::compute {

namespace {

// The AVX2 exp forms (bitwise the scalar ones) where the CPU has AVX2 and FMA.
bool vector_exp() {
  static const bool on = quant::cpu_has_avx2();
  return on;
}

// The AVX-512 forms (no table gather) where the kernels run at that level (the environment's cap
// included): the same bits as the AVX2 ones.
bool vector_exp512() {
  static const bool on = quant::active_kernel_level() == quant::KernelLevel::Avx512;
  return on;
}

// Σ f(x[i]) with the fixed eight-lane order documented at sum_of_squares.
template <typename Term>
float lane_sum(const float* x, int64_t n, Term term) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += term(x[i + j]);
  }
  for (int j = 0; i + j < n; ++j) lanes[j] += term(x[i + j]);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

void require_positive(const char* op, const char* what, int64_t value) {
  if (value <= 0) fail("{}: expected {} > 0, found {}", op, what, value);
}

void check_rope_dims(int head_dim, int n_rot) {
  if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim) {
    fail("rope: expected n_rot even, > 0 and <= head_dim {}, found {}", head_dim, n_rot);
  }
}

// True when v[a] ranks before v[b] in top_k / argmax order.
bool ranks_before(const float* v, int64_t a, int64_t b) {
  const float va = v[a];
  const float vb = v[b];
  const bool nan_a = std::isnan(va);
  const bool nan_b = std::isnan(vb);
  if (nan_a != nan_b) return nan_a;
  if (!nan_a) {
    if (va > vb) return true;
    if (va < vb) return false;
  }
  return a < b;
}

}  // namespace

float sum_of_squares(const float* x, int64_t n) {
  return lane_sum(x, n, [](float value) { return value * value; });
}

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  require_positive("rms_norm", "n", n);
  const float mean_square = sum_of_squares(x, n) / float(n);
  const float r = 1.0f / std::sqrt(mean_square + eps);
  if (weight) {
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * r) * weight[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r;
  }
}

void rms_norm_grouped(const float* x, const float* weight, int64_t n_groups, int64_t group_size,
                      float eps, float* out) {
  require_positive("rms_norm_grouped", "n_groups", n_groups);
  require_positive("rms_norm_grouped", "group_size", group_size);
  for (int64_t g = 0; g < n_groups; ++g) {
    const int64_t offset = g * group_size;
    rms_norm(x + offset, weight ? weight + offset : nullptr, group_size, eps, out + offset);
  }
}

void softmax(float* x, int64_t n) {
  require_positive("softmax", "n", n);
  float max_value = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max_value = std::fmax(max_value, x[i]);
  if (vector_exp512()) {
    avx512::exp_minus_f32(x, max_value, n, x);
  } else if (vector_exp()) {
    avx2::exp_minus_f32(x, max_value, n, x);
  } else {
    for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - max_value);
  }
  const float sum = lane_sum(x, n, [](float value) { return value; });
  const float inv_sum = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv_sum;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void sigmoid(const float* x, int64_t n, float* out) {
  if (vector_exp512()) return avx512::sigmoid_f32(x, n, out);
  if (vector_exp()) return avx2::sigmoid_f32(x, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = sigmoid(x[i]);
}
void silu(const float* x, int64_t n, float* out) {
  if (vector_exp512()) return avx512::silu_f32(x, n, out);
  if (vector_exp()) return avx2::silu_f32(x, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = silu(x[i]);
}
void silu_mul(float* g, const float* u, int64_t n) {
  if (vector_exp512()) return avx512::silu_mul_f32(g, u, n);
  if (vector_exp()) return avx2::silu_mul_f32(g, u, n);
  for (int64_t i = 0; i < n; ++i) g[i] = silu(g[i]) * u[i];
}
void mul_sigmoid(float* o, const float* gate, int64_t n) {
  if (vector_exp512()) return avx512::mul_sigmoid_f32(o, gate, n);
  if (vector_exp()) return avx2::mul_sigmoid_f32(o, gate, n);
  for (int64_t i = 0; i < n; ++i) o[i] *= sigmoid(gate[i]);
}
void mul_silu(float* o, const float* gate, int64_t n) {
  if (vector_exp512()) return avx512::mul_silu_f32(o, gate, n);
  if (vector_exp()) return avx2::mul_silu_f32(o, gate, n);
  for (int64_t i = 0; i < n; ++i) o[i] *= silu(gate[i]);
}
void softplus(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = softplus(x[i]);
}

void rope_cos_sin(int n_rot, int64_t pos, float theta, float* cos_out, float* sin_out) {
  if (n_rot <= 0 || n_rot % 2 != 0) fail("rope: expected n_rot even and > 0, found {}", n_rot);
  const int half = n_rot / 2;
  const float pos_f32 = float(pos);
  for (int j = 0; j < half; ++j) {
    const float exponent = float(2 * j) / float(n_rot);
    const float base_power = float(std::pow(double(theta), double(exponent)));
    const float inv_freq = 1.0f / base_power;
    const float angle = pos_f32 * inv_freq;
    cos_out[j] = float(std::cos(double(angle)));
    sin_out[j] = float(std::sin(double(angle)));
  }
}

void rope_neox_apply(float* x, int head_dim, int n_rot, const float* cos_values,
                     const float* sin_values) {
  check_rope_dims(head_dim, n_rot);
  const int half = n_rot / 2;
  for (int j = 0; j < half; ++j) {
    const float a = x[j];
    const float b = x[j + half];
    x[j] = a * cos_values[j] - b * sin_values[j];
    x[j + half] = b * cos_values[j] + a * sin_values[j];
  }
}

void rope_neox(float* x, int head_dim, int n_rot, int64_t pos, float theta) {
  constexpr int kMaxHalf = 512;  // the tables live on the stack; real models use n_rot <= 256
  check_rope_dims(head_dim, n_rot);
  if (n_rot / 2 > kMaxHalf) fail("rope: n_rot {} above the supported {}", n_rot, 2 * kMaxHalf);
  float cos_values[kMaxHalf];
  float sin_values[kMaxHalf];
  rope_cos_sin(n_rot, pos, theta, cos_values, sin_values);
  rope_neox_apply(x, head_dim, n_rot, cos_values, sin_values);
}

void top_k(const float* v, int n, int k, int32_t* idx_out) {
  if (n < 0 || k < 0 || k > n) fail("top_k: expected 0 <= k <= n, found k = {}, n = {}", k, n);
  if (k == 0) return;
  int filled = 0;
  for (int i = 0; i < n; ++i) {
    // idx_out[0..filled) is sorted best first; insert i if it beats the current last.
    if (filled == k && !ranks_before(v, i, idx_out[k - 1])) continue;
    int position = filled < k ? filled++ : k - 1;
    while (position > 0 && ranks_before(v, i, idx_out[position - 1])) {
      idx_out[position] = idx_out[position - 1];
      --position;
    }
    idx_out[position] = i;
  }
}

int64_t argmax(const float* v, int64_t n) {
  require_positive("argmax", "n", n);
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (ranks_before(v, i, best)) best = i;
  }
  return best;
}

}  // namespace strata::compute
