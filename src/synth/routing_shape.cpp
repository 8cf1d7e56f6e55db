#include "synth/routing_shape.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "synth/synth_random.h"
#include "util/error.h"

namespace strata {

using synth_detail::name_hash;
using synth_detail::Random;
using synth_detail::splitmix64;

namespace {

// Embedding rows have norm 1: anchor A, token part τ, the rest √(1 − A² − τ²). The subspace thus
// holds half of every embedding's energy; the other half is the usual random row.
constexpr double kAnchor = 0.5;
constexpr double kTokenNorm = 0.5;
// Layer-0 context head: v = silu(pre-activation); ballast channels get silu(kBallastPre) ≈ 3.9,
// pairs ±a with a ~ N(0, 1), so the ballast carries almost all of the head's mean square and its
// RMS norm stays nearly constant; the output gate gets pre-activation kGatePre.
constexpr double kBallastPre = 4.0;
constexpr double kGatePre = 2.0;
// ≈ E[a·tanh(a/2)]² for a ~ N(0, 1): the square of a pair's (always positive) sum, averaged.
constexpr double kPairSumSquare = 0.17;

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
double silu(double x) {
  return x * sigmoid(x);
}

// Φ⁻¹(p) by bisection on erfc (called a few times per file).
double normal_quantile(double p) {
  double lo = -10.0, hi = 10.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// A random unit vector of n values, deterministic in `seed`.
std::vector<double> unit_vector(uint64_t seed, int64_t n) {
  Random rng(seed);
  std::vector<double> v(static_cast<size_t>(n));
  double norm = 0.0;
  for (double& x : v) {
    x = rng.normal();
    norm += x * x;
  }
  norm = std::sqrt(norm);
  for (double& x : v) x /= norm;
  return v;
}

// `rows` unit vectors in `dims` dimensions: orthonormal when rows ≤ dims (Gram–Schmidt), so that
// projections of an isotropic vector onto them are exchangeable (no row is favoured by the
// geometry); independent random directions otherwise.
std::vector<std::vector<double>> unit_rows(uint64_t seed, int64_t rows, int64_t dims) {
  std::vector<std::vector<double>> out;
  out.reserve(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> v = unit_vector(seed ^ splitmix64(uint64_t(r)), dims);
    if (rows <= dims) {
      for (int pass = 0; pass < 2; ++pass)  // twice: orthogonal to fp64 precision
        for (const std::vector<double>& u : out) {
          double dot = 0.0;
          for (int64_t i = 0; i < dims; ++i) dot += v[size_t(i)] * u[size_t(i)];
          for (int64_t i = 0; i < dims; ++i) v[size_t(i)] -= dot * u[size_t(i)];
        }
      double norm = 0.0;
      for (double x : v) norm += x * x;
      for (double& x : v) x /= std::sqrt(norm);
    }
    out.push_back(std::move(v));
  }
  return out;
}

// "blk.<l>.<base>.weight" → (l, base); −1 and the name without ".weight" for global tensors.
std::pair<int, std::string> split_name(const std::string& name) {
  std::string base = name;
  if (base.size() > 7 && base.compare(base.size() - 7, 7, ".weight") == 0)
    base.resize(base.size() - 7);
  if (base.rfind("blk.", 0) != 0) return {-1, base};
  const size_t dot = base.find('.', 4);
  if (dot == std::string::npos) return {-1, base};
  return {std::stoi(base.substr(4, dot - 4)), base.substr(dot + 1)};
}

}  // namespace

struct RoutingShaper::Layout {
  HParams hp;
  RoutingShape shape;
  uint64_t seed = 0;
  int64_t H = 0, anchor = 0, token_begin = 0, n_token = 0, context_begin = 0, n_context = 0;
  // Layer 0's mixer input is c0 × the embedding in the subspace (all rows have norm 1).
  double c0 = 1.0;
  double theta = 1.0;  // top-k threshold of N(0, 1) noise
  double rho = 0.0;    // weight of the context part in the logits (ρ² = λ)
  double beta = 0.0;   // context heads' β = 1 − λ
  // Context heads: V heads 0 .. n_context_heads−1 of layer 0, head h carrying context dims
  // [h·pairs_per_head, ...) as pairs; kappa[h] is its ssm_out weight of a pair difference.
  int64_t pairs_per_head = 0;
  int n_context_heads = 0;
  std::vector<double> kappa;
  std::vector<bool> context_k_head;  // [n_k_heads]: K heads read by a context head (q = k = e₀)

  bool reserved(int64_t d) const { return d % H >= anchor; }
  bool correlated() const { return n_context > 0; }
  int64_t pairs(int h) const { return std::min(pairs_per_head, n_context - h * pairs_per_head); }
  int k_head(int v_head) const {
    return hp.ssm_v_heads_tiled ? v_head % hp.ssm_n_k_heads
                                : v_head / (hp.ssm_n_v_heads / hp.ssm_n_k_heads);
  }
  // Row weight on the anchor that gives pre-activation `value` at layer 0.
  double from_anchor(double value) const { return value / (kAnchor * c0); }
};

namespace {

using Layout = RoutingShaper::Layout;
using Row = TensorShaping::Row;

enum class Kind {
  Embedding,         // token_embd rows: anchor, token vector, norm 1
  Router,            // ffn_gate_inp rows: read the subspace only
  ReservedOnes,      // 1-D norms: weight 1 in the subspace (hc norms: in every stream)
  ZeroReserved,      // residual writers: rows of the subspace are zero
  ZeroAll,           // layer 0 hc_attn_inject (correlation): injection 2·σ(0) = 1 in every stream
  ContextQkv,        // layer 0 attn_qkv: q, k of the context K heads, v of the context V heads
  ContextConv,       // layer 0 ssm_conv1d: identity taps on those channels
  ContextGate,       // layer 0 attn_gate: constant gate for the context heads
  ContextBeta,       // layer 0 ssm_beta: constant β for the context heads
  ContextFusedBeta,  // layer 0 ssm_ba (qwen3next): the same, in its (b | a per K head) layout
  ContextDecay,      // layer 0 ssm_a: A = 0 for the context heads, so the decay e^g is exactly 1
  ContextNorm,       // layer 0 ssm_norm: weight 1
  ContextOut,        // layer 0 ssm_out: pair differences into the context dims, zero elsewhere
};

class Plan final : public TensorShaping {
 public:
  Plan(const Layout& layout, Kind kind, int layer, const std::string& name)
      : l_(layout), kind_(kind), seed_(layout.seed ^ name_hash(name) ^ 0x5A17C0DE5A17C0DEull) {
    if (kind_ == Kind::Router) {
      make_biases(layer);
      token_rows_ = unit_rows(seed_ ^ 1, l_.hp.n_expert, l_.n_token);
      if (l_.correlated()) context_rows_ = unit_rows(seed_ ^ 2, l_.hp.n_expert, l_.n_context);
    }
    // The pair projections: orthonormal (n_context ≤ n_token), so the pairs' inputs are
    // independent N(0, 1) over tokens.
    if (kind_ == Kind::ContextQkv) pair_rows_ = unit_rows(seed_ ^ 3, l_.n_context, l_.n_token);
  }

  bool has_shaped_rows() const override {
    return kind_ != Kind::ZeroReserved && kind_ != Kind::ZeroAll;
  }

  Row shape_row(int64_t row, std::span<float> v) const override {
    const int64_t d = l_.hp.ssm_d_state, key_dim = l_.hp.ssm_key_dim();
    switch (kind_) {
      case Kind::Embedding:
        return embedding_row(row, v);
      case Kind::Router:
        return router_row(row, v);
      case Kind::ReservedOnes:
        for (size_t i = 0; i < v.size(); ++i)
          if (l_.reserved(int64_t(i))) v[i] = 1.0f;
        return Row::Shaped;
      case Kind::ZeroReserved:
        return l_.reserved(row) ? zero(v) : Row::Random;
      case Kind::ZeroAll:
        return zero(v);
      case Kind::ContextQkv:
        if (row < 2 * key_dim) {  // q or k: e₀ for the context K heads
          if (!l_.context_k_head[size_t((row % key_dim) / d)]) return Row::Random;
          zero(v);
          if (row % d == 0) v[size_t(l_.anchor)] = float(l_.from_anchor(1.0));
          return Row::Shaped;
        }
        return context_head(row - 2 * key_dim) ? value_row(row - 2 * key_dim, v) : Row::Random;
      case Kind::ContextConv:
        if (row < 2 * key_dim ? l_.context_k_head[size_t((row % key_dim) / d)]
                              : context_head(row - 2 * key_dim)) {
          zero(v);
          v.back() = 1.0f;  // taps are oldest first: the current token only
          return Row::Shaped;
        }
        return Row::Random;
      case Kind::ContextGate:
        if (!context_head(row)) return Row::Random;
        zero(v);
        v[size_t(l_.anchor)] = float(l_.from_anchor(kGatePre));
        return Row::Shaped;
      case Kind::ContextBeta:
      case Kind::ContextFusedBeta: {
        int64_t head = row;
        if (kind_ == Kind::ContextFusedBeta) {  // group g: b of its V heads, then their a
          const int64_t per_k = l_.hp.ssm_n_v_heads / l_.hp.ssm_n_k_heads;
          if (row % (2 * per_k) >= per_k) return Row::Random;
          head = row / (2 * per_k) * per_k + row % (2 * per_k);
        }
        if (head >= l_.n_context_heads) return Row::Random;
        zero(v);
        v[size_t(l_.anchor)] = float(l_.from_anchor(std::log(l_.beta / (1.0 - l_.beta))));
        return Row::Shaped;
      }
      case Kind::ContextDecay:
        std::fill_n(v.begin(), l_.n_context_heads, 0.0f);
        return Row::Shaped;
      case Kind::ContextNorm:
        std::fill(v.begin(), v.end(), 1.0f);
        return Row::Shaped;
      case Kind::ContextOut: {
        if (!l_.reserved(row)) return Row::Random;
        zero(v);
        const int64_t c = row - l_.context_begin;
        if (c < 0) return Row::Zero;
        const int64_t h = c / l_.pairs_per_head, p = c % l_.pairs_per_head;
        v[size_t(h * d + 2 * p)] = float(l_.kappa[size_t(h)]);
        v[size_t(h * d + 2 * p + 1)] = float(-l_.kappa[size_t(h)]);
        return Row::Shaped;
      }
    }
    return Row::Random;
  }

 private:
  static Row zero(std::span<float> v) {
    std::fill(v.begin(), v.end(), 0.0f);
    return Row::Zero;
  }

  // Is value channel j (of value_dim) in a context head?
  bool context_head(int64_t j) const { return j / l_.hp.ssm_d_state < l_.n_context_heads; }

  Row embedding_row(int64_t token, std::span<float> v) const {
    double rest = 0.0;
    for (int64_t i = 0; i < l_.anchor; ++i) rest += double(v[size_t(i)]) * v[size_t(i)];
    const double scale =
        std::sqrt(1.0 - kAnchor * kAnchor - kTokenNorm * kTokenNorm) / std::sqrt(rest);
    for (int64_t i = 0; i < l_.anchor; ++i) v[size_t(i)] = float(v[size_t(i)] * scale);
    std::fill(v.begin() + l_.anchor, v.end(), 0.0f);
    v[size_t(l_.anchor)] = float(kAnchor);
    const std::vector<double> t = unit_vector(seed_ ^ splitmix64(uint64_t(token)), l_.n_token);
    for (int64_t i = 0; i < l_.n_token; ++i)
      v[size_t(l_.token_begin + i)] = float(kTokenNorm * t[size_t(i)]);
    return Row::Shaped;
  }

  // Logit noise of unit variance per expert: a unit row against a unit vector in n dims has
  // variance 1/n, hence the √n.
  Row router_row(int64_t expert, std::span<float> v) const {
    std::fill(v.begin(), v.end(), 0.0f);
    v[size_t(l_.anchor)] = float(l_.from_anchor(biases_[size_t(expert)]));
    const double token_scale =
        std::sqrt((1.0 - l_.rho * l_.rho) * double(l_.n_token)) / (kTokenNorm * l_.c0);
    const std::vector<double>& u = token_rows_[size_t(expert)];
    for (int64_t i = 0; i < l_.n_token; ++i)
      v[size_t(l_.token_begin + i)] = float(token_scale * u[size_t(i)]);
    if (l_.correlated()) {
      const double context_scale = l_.rho * std::sqrt(double(l_.n_context)) / (kTokenNorm * l_.c0);
      const std::vector<double>& w = context_rows_[size_t(expert)];
      for (int64_t i = 0; i < l_.n_context; ++i)
        v[size_t(l_.context_begin + i)] = float(context_scale * w[size_t(i)]);
    }
    return Row::Shaped;
  }

  // Value channel j of a context head: pairs (2p, 2p+1) read ±a from the token dims, the rest
  // is ballast.
  Row value_row(int64_t j, std::span<float> v) const {
    zero(v);
    const int h = int(j / l_.hp.ssm_d_state);
    const int64_t c = j % l_.hp.ssm_d_state;
    if (c >= 2 * l_.pairs(h)) {
      v[size_t(l_.anchor)] = float(l_.from_anchor(kBallastPre));
      return Row::Shaped;
    }
    // a = √n_T · ĝ·t̂ ~ N(0, 1) over tokens.
    const double sign = c % 2 == 0 ? 1.0 : -1.0;
    const double scale = sign * std::sqrt(double(l_.n_token)) / (kTokenNorm * l_.c0);
    const std::vector<double>& g = pair_rows_[size_t(h * l_.pairs_per_head + c / 2)];
    for (int64_t i = 0; i < l_.n_token; ++i)
      v[size_t(l_.token_begin + i)] = float(scale * g[size_t(i)]);
    return Row::Shaped;
  }

  // b_e = −S·ln(rank_e)/θ with ranks 1..n in a random order per layer.
  void make_biases(int layer) {
    const int n = l_.hp.n_expert;
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    Random rng(l_.seed ^ splitmix64(uint64_t(layer) + 0x2545F4914F6CDD1Dull));
    for (int i = n - 1; i > 0; --i)
      std::swap(order[size_t(i)], order[size_t(rng.next() % uint64_t(i + 1))]);
    biases_.assign(static_cast<size_t>(n), 0.0);
    for (int rank = 0; rank < n; ++rank)
      biases_[size_t(order[size_t(rank)])] = -l_.shape.skew * std::log(double(rank + 1)) / l_.theta;
  }

  const Layout& l_;
  Kind kind_;
  uint64_t seed_;
  std::vector<double> biases_;
  std::vector<std::vector<double>> token_rows_, context_rows_, pair_rows_;
};

}  // namespace

RoutingShaper::RoutingShaper(const HParams& hp, const RoutingShape& shape, uint64_t seed) {
  if (!(shape.skew >= 0.0) || shape.skew > 16.0)
    fail("synth: --routing-skew: expected a Zipf exponent in [0, 16], found {}", shape.skew);
  if (!(shape.correlation >= 0.0) || shape.correlation >= 1.0)
    fail("synth: --routing-correlation: expected a value in [0, 1), found {}", shape.correlation);
  auto layout = std::make_unique<Layout>();
  Layout& l = *layout;
  l.hp = hp;
  l.shape = shape;
  l.seed = seed;
  l.H = hp.n_embd;
  // At most half of the hidden state is reserved. Token and context parts get as many dims as
  // there are experts where that fits (then routing is exchangeable: only the biases favour an
  // expert); in smaller models the low rank leaves a mild popularity pattern (docs/synth.md).
  const int64_t budget = hp.n_embd / 2 - 1;
  const int64_t n_expert = hp.n_expert;
  const bool correlated = shape.correlation > 0.0;
  l.n_token = std::min(n_expert, correlated ? budget / 2 : budget);
  if (correlated) {
    if (hp.layer_kinds.empty() || hp.layer_kinds[0] != LayerKind::GatedDeltaNet)
      fail(
          "synth: --routing-correlation needs a Gated DeltaNet layer 0 (qwen3next, qwen4exp); "
          "this {} shape has none",
          arch_name(hp.arch));
    // The shaping below indexes key and value channels with one head width.
    if (hp.ssm_head_v_dim() != hp.ssm_head_k_dim())
      fail("synth: --routing-correlation: expected equal key and value head dims, found {} and {}",
           hp.ssm_head_k_dim(), hp.ssm_head_v_dim());
    if (hp.ssm_d_state < 8)
      fail("synth: --routing-correlation: expected ssm_d_state >= 8, found {}", hp.ssm_d_state);
    l.pairs_per_head = 3 * int64_t(hp.ssm_d_state) / 8;  // the rest of a head is ballast
    l.n_context = std::min({l.n_token, budget - l.n_token, hp.ssm_n_v_heads * l.pairs_per_head});
    l.n_context_heads = int((l.n_context + l.pairs_per_head - 1) / l.pairs_per_head);
  }
  if (l.n_token < 4)
    fail(
        "synth: --routing-skew/--routing-correlation: n_embd {} is too small for a routing "
        "subspace (found room for {} token dimensions, expected at least 4)",
        hp.n_embd, l.n_token);
  l.anchor = hp.n_embd - (1 + l.n_token + l.n_context);
  l.token_begin = l.anchor + 1;
  l.context_begin = l.token_begin + l.n_token;
  const double rms_embedding = std::sqrt(1.0 / double(hp.n_embd) + double(hp.rms_eps));
  // qwen4exp: every stream holds the embedding; the mixer averages them with gates σ(0) = 1/2.
  l.c0 = (hp.arch == Arch::Qwen4Exp ? 0.5 : 1.0) / rms_embedding;
  l.theta = hp.n_expert_used < hp.n_expert
                ? normal_quantile(1.0 - double(hp.n_expert_used) / double(hp.n_expert))
                : 1.0;
  if (correlated) {
    const double lambda = std::sqrt(shape.correlation);
    l.rho = std::sqrt(lambda);
    l.beta = std::clamp(1.0 - lambda, 1e-4, 1.0 - 1e-4);
    const double gate = hp.ssm_gate_sigmoid ? sigmoid(kGatePre) : silu(kGatePre);
    // Steady state of m ← λm + (1−λ)v: a pair difference D = EMA(a) has variance s²,
    // s² = (1−λ)/(1+λ); a head's RMS is set by its ballast plus its pairs' squares
    // ((D² + P²)/2 per pair, P the pair's sum). r = κ·gate·D/rms, so E|r|² = τ².
    const double s2 = (1.0 - lambda) / (1.0 + lambda);
    const double ballast = silu(kBallastPre);
    const double d = double(hp.ssm_d_state);
    for (int h = 0; h < l.n_context_heads; ++h) {
      const double pairs = double(l.pairs(h));
      const double rms = std::sqrt(
          ((d - 2.0 * pairs) * ballast * ballast + pairs * (s2 + kPairSumSquare) / 2.0) / d);
      l.kappa.push_back(kTokenNorm * rms / (gate * std::sqrt(double(l.n_context) * s2)));
    }
    l.context_k_head.assign(static_cast<size_t>(hp.ssm_n_k_heads), false);
    for (int h = 0; h < l.n_context_heads; ++h) l.context_k_head[size_t(l.k_head(h))] = true;
  }
  layout_ = std::move(layout);
}

RoutingShaper::~RoutingShaper() = default;

std::unique_ptr<TensorShaping> RoutingShaper::plan(const TensorSpec& spec) const {
  const Layout& l = *layout_;
  const std::pair<int, std::string> split = split_name(spec.name);
  const int layer = split.first;
  const std::string& base = split.second;
  auto make = [&](Kind kind) { return std::make_unique<Plan>(l, kind, layer, spec.name); };
  if (base == "token_embd") return make(Kind::Embedding);
  if (layer < 0) return nullptr;
  if (base == "ffn_gate_inp") return make(Kind::Router);
  if (base == "attn_norm" || base == "ffn_norm" || base == "post_attention_norm" ||
      base == "hc_attn_norm" || base == "hc_ffn_norm")
    return make(Kind::ReservedOnes);
  if (l.correlated() && layer == 0) {
    if (base == "hc_attn_inject") return make(Kind::ZeroAll);
    if (base == "attn_qkv") return make(Kind::ContextQkv);
    if (base == "ssm_conv1d") return make(Kind::ContextConv);
    if (base == "attn_gate") return make(Kind::ContextGate);
    if (base == "ssm_beta") return make(Kind::ContextBeta);
    if (base == "ssm_ba") return make(Kind::ContextFusedBeta);
    if (base == "ssm_a") return make(Kind::ContextDecay);
    if (base == "ssm_norm") return make(Kind::ContextNorm);
    if (base == "ssm_out") return make(Kind::ContextOut);
  }
  if (base == "attn_output" || base == "ssm_out" || base == "ffn_down_exps" ||
      base == "ffn_down_shexp" || base == "ple_value" || base == "hc_attn_up" ||
      base == "hc_ffn_up")
    return make(Kind::ZeroReserved);
  return nullptr;
}

}  // namespace strata
