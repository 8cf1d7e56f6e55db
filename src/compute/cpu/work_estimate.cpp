#include "compute/cpu/work_estimate.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

#include "quant/quant.h"

namespace strata::compute {
namespace {

constexpr int kTimedPasses = 3;

// Best of kTimedPasses runs of `pass` (after one untimed run that brings its data into cache), ns.
template <typename Pass>
double best_pass_ns(Pass pass) {
  pass();
  double best = std::numeric_limits<double>::max();
  for (int i = 0; i < kTimedPasses; ++i) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    best = std::min(
        best,
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// ns per multiply-add of every type with kernels, indexed by the type id (0 for the others).
constexpr uint32_t kMaxTypeId = 64;
using DotRates = std::array<double, kMaxTypeId>;

DotRates measure_dot_rates() {
  constexpr int64_t kRows = 32, kInputs = 1024;
  DotRates rates{};
  for (uint32_t id = 0; id < kMaxTypeId; ++id) {
    const TypeTraits* traits = type_traits_or_null(id);
    if (traits == nullptr || !traits->has_kernels) continue;
    const GgmlType type = traits->type;
    const int64_t n_in =
        (kInputs + traits->block_elems - 1) / traits->block_elems * traits->block_elems;
    const size_t stride = row_bytes(type, n_in);
    // Weights: every byte 0x3C, a valid encoding of every type whose scales are normal floats
    // (f16 1.06, bf16/f32 0.011, e8m0 2^-67), so no denormal slows the kernel down.
    std::vector<uint64_t> weights((stride * kRows + 7) / 8);
    std::memset(weights.data(), 0x3C, weights.size() * 8);
    std::vector<uint64_t> activation((quant::activation_row_bytes(type, n_in) + 7) / 8);
    std::vector<float> source(size_t(n_in), 0.5f);
    quant::quantize_activation(type, source.data(), activation.data(), n_in);
    const quant::DotKernel dot = quant::dot_kernel(type);
    const auto* rows = reinterpret_cast<const std::byte*>(weights.data());
    volatile float sink = 0;
    const double ns = best_pass_ns([&] {
      float sum = 0;
      for (int64_t r = 0; r < kRows; ++r)
        sum += dot(rows + size_t(r) * stride, activation.data(), n_in);
      sink = sum;
    });
    rates[id] = ns / double(kRows * n_in);
  }
  return rates;
}

// Eight multiply-add chains over eight rows (score_tokens in layers/attention.cpp: eight keys'
// dots with one query), no vectorisation across the chains' rows.
double measure_f32_loop_rate() {
  constexpr int kLanes = 8, kWidth = 128, kKeys = 64;
  std::vector<float> keys(size_t(kKeys) * kWidth, 0.25f), query(size_t(kWidth), 0.5f);
  volatile float sink = 0;
  const double ns = best_pass_ns([&] {
    float total = 0;
    for (int key = 0; key + kLanes <= kKeys; key += kLanes) {
      const float* k[kLanes];
      float dot[kLanes];
      for (int l = 0; l < kLanes; ++l) {
        k[l] = keys.data() + size_t(key + l) * kWidth;
        dot[l] = 0.0f;
      }
      for (int j = 0; j < kWidth; ++j) {
        const float qj = query[size_t(j)];
        for (int l = 0; l < kLanes; ++l) dot[l] += qj * k[l][j];
      }
      for (int l = 0; l < kLanes; ++l) total += dot[l];
    }
    sink = total;
  });
  return ns / double(kKeys * kWidth);
}

struct Rates {
  DotRates dot_ns_per_mac;
  double f32_loop_ns_per_mac;
};

const Rates& rates() {
  static const Rates measured{measure_dot_rates(), measure_f32_loop_rate()};
  return measured;
}

}  // namespace

double dot_work_ns(GgmlType type, int64_t n_dots, int64_t n_in) {
  const uint32_t id = static_cast<uint32_t>(type);
  const double ns_per_mac = id < kMaxTypeId ? rates().dot_ns_per_mac[id] : 0.0;
  // A type without a measured rate has no kernels either: never estimate it small.
  if (ns_per_mac == 0.0) return std::numeric_limits<double>::infinity();
  return ns_per_mac * double(n_dots) * double(n_in);
}

double f32_loop_work_ns(int64_t multiply_adds) {
  return rates().f32_loop_ns_per_mac * double(multiply_adds);
}

}  // namespace strata::compute
