// Public quant API: type checks, the scalar reference dispatch (quant::ref) and the fast
// dispatch, which picks kernels once per process: AVX2 when the CPU has AVX2, FMA, F16C and BMI1
// (every AVX2 CPU has them; the IQ2_XS kernel uses BMI1's bextr), and on top of that the AVX-512
// dot kernels (Q4_0, Q4_K, Q6_K, IQ2_XS) and tile kernels (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_K, Q6_K,
// IQ4_XS, IQ2_XS) when it also has AVX-512 F/BW/VL/VBMI/VNNI/BITALG (Ice Lake, Zen 4 and later). STRATA_QUANT_MAX=scalar|avx2|avx512 caps the level (read once; for tests and
// A/B measurements); STRATA_QUANT_SCALAR=1 is the older spelling of STRATA_QUANT_MAX=scalar.
#include "quant/quant.h"

#include <cpuid.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "quant/kernels.h"
#include "util/error.h"

namespace strata::quant {
namespace {

struct TypeKernels {
  DequantizeFn dequantize = nullptr;
  QuantizeFn quantize = nullptr;
  QuantizeFn quantize_activation = nullptr;
  DotFn dot = nullptr;
  DotManyFn dot_many = nullptr;  // null: dot_many calls `dot_tile` or `dot` per activation
  DotTileFn dot_tile = nullptr;  // null: dot_tile calls dot_many per weight row (or `dot`)
};

constexpr size_t kMaxTypeId = 40;
using KernelArray = std::array<TypeKernels, kMaxTypeId>;

void copy_activation_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

KernelArray scalar_kernels() {
  KernelArray k{};
  auto set = [&](GgmlType type, TypeKernels kernels) { k[size_t(type)] = kernels; };
  set(GgmlType::F32, {scalar::dequantize_f32, scalar::quantize_f32, copy_activation_f32,
                      scalar::dot_f32});
  set(GgmlType::F16, {scalar::dequantize_f16, scalar::quantize_f16, copy_activation_f32,
                      scalar::dot_f16});
  set(GgmlType::BF16, {scalar::dequantize_bf16, scalar::quantize_bf16, copy_activation_f32,
                       scalar::dot_bf16});
  set(GgmlType::Q8_0, {scalar::dequantize_q8_0, scalar::quantize_q8_0, scalar::quantize_q8_0,
                       scalar::dot_q8_0});
  set(GgmlType::Q4_0, {scalar::dequantize_q4_0, scalar::quantize_q4_0, scalar::quantize_q8_0,
                       scalar::dot_q4_0});
  set(GgmlType::Q2_K, {scalar::dequantize_q2_K, scalar::quantize_q2_K, scalar::quantize_q8_K,
                       scalar::dot_q2_K});
  set(GgmlType::Q4_K, {scalar::dequantize_q4_K, scalar::quantize_q4_K, scalar::quantize_q8_K,
                       scalar::dot_q4_K});
  set(GgmlType::Q6_K, {scalar::dequantize_q6_K, scalar::quantize_q6_K, scalar::quantize_q8_K,
                       scalar::dot_q6_K});
  set(GgmlType::IQ2_XS, {scalar::dequantize_iq2_xs, scalar::quantize_iq2_xs,
                         scalar::quantize_q8_K, scalar::dot_iq2_xs});
  for (const TableKernels& more : kTableKernels) {
    const bool k_act = more.activation == GgmlType::Q8_K;
    set(more.type, {more.scalar_dequantize, more.quantize,
                    k_act ? scalar::quantize_q8_K : scalar::quantize_q8_0, more.scalar_dot});
  }
  // Low-bit IQ types: read and multiplied, never written (quantize stays null, see quantize_row).
  set(GgmlType::IQ2_XXS,
      {scalar::dequantize_iq2_xxs, nullptr, scalar::quantize_q8_K, scalar::dot_iq2_xxs});
  set(GgmlType::IQ2_S,
      {scalar::dequantize_iq2_s, nullptr, scalar::quantize_q8_K, scalar::dot_iq2_s});
  set(GgmlType::IQ3_XXS,
      {scalar::dequantize_iq3_xxs, nullptr, scalar::quantize_q8_K, scalar::dot_iq3_xxs});
  set(GgmlType::IQ3_S,
      {scalar::dequantize_iq3_s, nullptr, scalar::quantize_q8_K, scalar::dot_iq3_s});
  set(GgmlType::IQ1_S,
      {scalar::dequantize_iq1_s, nullptr, scalar::quantize_q8_K, scalar::dot_iq1_s});
  set(GgmlType::IQ1_M,
      {scalar::dequantize_iq1_m, nullptr, scalar::quantize_q8_K, scalar::dot_iq1_m});
  return k;
}

// The level the CPU supports, capped by STRATA_QUANT_MAX / STRATA_QUANT_SCALAR.
KernelLevel chosen_level() {
  KernelLevel level = cpu_has_avx512() ? KernelLevel::Avx512
                      : cpu_has_avx2() ? KernelLevel::Avx2
                                       : KernelLevel::Scalar;
  const char* force_scalar = std::getenv("STRATA_QUANT_SCALAR");
  if (force_scalar != nullptr && std::strcmp(force_scalar, "1") == 0) level = KernelLevel::Scalar;
  const char* max = std::getenv("STRATA_QUANT_MAX");
  if (max != nullptr && *max != '\0') {
    const std::string_view cap(max);
    KernelLevel cap_level = KernelLevel::Avx512;
    if (cap == "scalar") {
      cap_level = KernelLevel::Scalar;
    } else if (cap == "avx2") {
      cap_level = KernelLevel::Avx2;
    } else if (cap != "avx512") {
      fail("environment variable STRATA_QUANT_MAX: expected scalar, avx2 or avx512, found \"{}\"",
           cap);
    }
    level = std::min(level, cap_level);
  }
  return level;
}

KernelArray fast_kernels(KernelLevel level) {
  KernelArray k = scalar_kernels();
  if (level == KernelLevel::Scalar) return k;
  auto set = [&](GgmlType type, DequantizeFn dequantize, QuantizeFn activation, DotFn dot) {
    TypeKernels& entry = k[size_t(type)];
    entry.dequantize = dequantize;
    entry.dot = dot;
    if (activation != nullptr) entry.quantize_activation = activation;
  };
  set(GgmlType::F32, scalar::dequantize_f32, nullptr, avx2::dot_f32);
  set(GgmlType::F16, avx2::dequantize_f16, nullptr, avx2::dot_f16);
  set(GgmlType::BF16, avx2::dequantize_bf16, nullptr, avx2::dot_bf16);
  set(GgmlType::Q8_0, avx2::dequantize_q8_0, avx2::quantize_q8_0, avx2::dot_q8_0);
  k[size_t(GgmlType::Q8_0)].quantize = avx2::quantize_q8_0;  // same bits as the scalar one
  set(GgmlType::Q4_0, avx2::dequantize_q4_0, avx2::quantize_q8_0, avx2::dot_q4_0);
  set(GgmlType::Q2_K, avx2::dequantize_q2_K, avx2::quantize_q8_K, avx2::dot_q2_K);
  set(GgmlType::Q4_K, avx2::dequantize_q4_K, avx2::quantize_q8_K, avx2::dot_q4_K);
  set(GgmlType::Q6_K, avx2::dequantize_q6_K, avx2::quantize_q8_K, avx2::dot_q6_K);
  set(GgmlType::IQ2_XS, avx2::dequantize_iq2_xs, avx2::quantize_q8_K, avx2::dot_iq2_xs);
  for (const TableKernels& more : kTableKernels) {
    const bool k_act = more.activation == GgmlType::Q8_K;
    set(more.type, more.avx2_dequantize, k_act ? avx2::quantize_q8_K : avx2::quantize_q8_0,
        more.avx2_dot);
  }
  set(GgmlType::IQ2_XXS, avx2::dequantize_iq2_xxs, avx2::quantize_q8_K, avx2::dot_iq2_xxs);
  set(GgmlType::IQ3_XXS, avx2::dequantize_iq3_xxs, avx2::quantize_q8_K, avx2::dot_iq3_xxs);
  set(GgmlType::IQ2_S, avx2::dequantize_iq2_s, avx2::quantize_q8_K, avx2::dot_iq2_s);
  set(GgmlType::IQ3_S, avx2::dequantize_iq3_s, avx2::quantize_q8_K, avx2::dot_iq3_s);
  set(GgmlType::IQ1_S, avx2::dequantize_iq1_s, avx2::quantize_q8_K, avx2::dot_iq1_s);
  set(GgmlType::IQ1_M, avx2::dequantize_iq1_m, avx2::quantize_q8_K, avx2::dot_iq1_m);
  // Prompt windows: tiles that decode each weight block once for several activation rows
  // (bitwise the one-row dots above).
  k[size_t(GgmlType::Q8_0)].dot_tile = avx2::dot_tile_q8_0;
  k[size_t(GgmlType::Q4_0)].dot_tile = avx2::dot_tile_q4_0;
  k[size_t(GgmlType::Q5_0)].dot_tile = avx2::dot_tile_q5_0;
  k[size_t(GgmlType::IQ4_NL)].dot_tile = avx2::dot_tile_iq4_nl;
  k[size_t(GgmlType::Q4_K)].dot_tile = avx2::dot_tile_q4_K;
  k[size_t(GgmlType::Q5_K)].dot_tile = avx2::dot_tile_q5_K;
  k[size_t(GgmlType::IQ2_XS)].dot_tile = avx2::dot_tile_iq2_xs;
  if (level == KernelLevel::Avx2) return k;
  // One-row dots (decode) stay AVX2 where the AVX-512 form measured no faster on the Xeon
  // (bench_matmul_tile rows:1: Q8_0, Q5_0, IQ4_NL, IQ4_XS); their tiles are bitwise those AVX2 dots.
  k[size_t(GgmlType::Q4_0)].dot = avx512::dot_q4_0;
  k[size_t(GgmlType::Q4_0)].dot_tile = avx512::dot_tile_q4_0;
  k[size_t(GgmlType::Q5_0)].dot_tile = avx512::dot_tile_q5_0;
  k[size_t(GgmlType::IQ4_NL)].dot_tile = avx512::dot_tile_iq4_nl;
  k[size_t(GgmlType::Q8_0)].dot_tile = avx512::dot_tile_q8_0;
  k[size_t(GgmlType::Q4_K)].dot = avx512::dot_q4_K;
  k[size_t(GgmlType::Q4_K)].dot_many = avx512::dot_many_q4_K;
  k[size_t(GgmlType::Q4_K)].dot_tile = avx512::dot_tile_q4_K;
  k[size_t(GgmlType::Q6_K)].dot = avx512::dot_q6_K;
  k[size_t(GgmlType::IQ4_XS)].dot_tile = avx512::dot_tile_iq4_xs;
  k[size_t(GgmlType::Q6_K)].dot_tile = avx512::dot_tile_q6_K;
  k[size_t(GgmlType::IQ2_XS)].dot = avx512::dot_iq2_xs;
  k[size_t(GgmlType::IQ2_XS)].dot_many = avx512::dot_many_iq2_xs;
  k[size_t(GgmlType::IQ2_XS)].dot_tile = avx512::dot_tile_iq2_xs;
  return k;
}

const KernelArray& scalar_table() {
  static const KernelArray table = scalar_kernels();
  return table;
}

KernelLevel fast_level() {
  static const KernelLevel level = chosen_level();
  return level;
}

const KernelArray& fast_table() {
  static const KernelArray table = fast_kernels(fast_level());
  return table;
}

std::string_view printable_name(GgmlType type) {
  const TypeTraits* traits = type_traits_or_null(static_cast<uint32_t>(type));
  return traits != nullptr ? traits->name : std::string_view("unknown");
}

const TypeKernels& kernels_for(const KernelArray& table, GgmlType type, const char* operation) {
  const auto id = static_cast<uint32_t>(type);
  if (id >= kMaxTypeId || table[id].dot == nullptr) {
    fail(
        "quant::{}: type {} (id {}) has no kernels; expected one of f32, f16, bf16, q8_0, q4_0, "
        "q2_K, q4_K, q6_K, iq2_xs, q4_1, q5_0, q5_1, iq4_nl, q3_K, q5_K, iq4_xs, iq2_xxs, iq2_s, "
        "iq3_xxs, iq3_s, iq1_s, iq1_m",
        operation, printable_name(type), id);
  }
  return table[id];
}

// Types strata reads but cannot write: llama.cpp quantizes them only with an importance matrix.
QuantizeFn quantizer_for(const TypeKernels& kernels, GgmlType type, const char* operation) {
  if (kernels.quantize == nullptr) {
    fail(
        "quant::{}: type {} can be read (dequantized, multiplied) but not written: strata has no "
        "quantizer for it (llama.cpp's needs an importance matrix); expected one of f32, f16, "
        "bf16, q8_0, q4_0, q2_K, q4_K, q6_K, iq2_xs",
        operation, printable_name(type));
  }
  return kernels.quantize;
}

void check_length(GgmlType type, int64_t n, const char* operation) {
  const int64_t block = type_traits(type).block_elems;
  if (n < 0 || n % block != 0) {
    fail("quant::{}: row of {} elements of type {}: expected a multiple of the block size {}",
         operation, n, printable_name(type), block);
  }
}

// dot_many on a type's kernels: its own kernel, else a one-row tile, else one dot per activation.
void dot_many_with(const TypeKernels& k, const void* weight_row, const void* activations,
                   size_t activation_stride, int64_t n_activations, int64_t n, float* out,
                   size_t out_stride) {
  if (k.dot_many != nullptr) {
    k.dot_many(weight_row, activations, activation_stride, n_activations, n, out, out_stride);
    return;
  }
  if (k.dot_tile != nullptr) {
    k.dot_tile(weight_row, 0, 1, activations, activation_stride, n_activations, n, out, 0,
               out_stride);
    return;
  }
  const auto* activation = static_cast<const std::byte*>(activations);
  for (int64_t t = 0; t < n_activations; ++t) {
    out[size_t(t) * out_stride] =
        canonical_nan(k.dot(weight_row, activation + size_t(t) * activation_stride, n));
  }
}

}  // namespace

bool cpu_has_avx2() {
  // F16C via CPUID leaf 1, ECX bit 29: clang 14's __builtin_cpu_supports does not know "f16c".
  // (The avx2 check already covers OS support for the YMM state F16C needs.)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi") && f16c;
  }();
  return has;
}

bool cpu_has_avx512() {
  // __builtin_cpu_supports also checks that the OS saves the ZMM and mask registers (XCR0).
  static const bool has =
      cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bitalg");
  return has;
}

KernelLevel active_kernel_level() {
  return fast_level();
}

std::string_view kernel_level_name(KernelLevel level) {
  switch (level) {
    case KernelLevel::Scalar:
      return "scalar";
    case KernelLevel::Avx2:
      return "avx2";
    case KernelLevel::Avx512:
      return "avx512";
  }
  return "unknown";
}

GgmlType activation_type(GgmlType weight_type) {
  switch (weight_type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
      return GgmlType::F32;
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
      return GgmlType::Q8_0;
    case GgmlType::Q2_K:
    case GgmlType::Q4_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_XXS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ1_S:
    case GgmlType::IQ1_M:
      return GgmlType::Q8_K;
    default:
      for (const TableKernels& more : kTableKernels) {
        if (more.type == weight_type) return more.activation;
      }
      fail("quant::activation_type: type {} (id {}) has no kernels", printable_name(weight_type),
           static_cast<uint32_t>(weight_type));
  }
}

size_t activation_row_bytes(GgmlType weight_type, int64_t n) {
  return row_bytes(activation_type(weight_type), n);
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const TypeKernels& k = kernels_for(fast_table(), type, "dequantize_row");
  check_length(type, n, "dequantize_row");
  k.dequantize(src, dst, n);
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const TypeKernels& k = kernels_for(fast_table(), type, "quantize_row");
  const QuantizeFn quantize = quantizer_for(k, type, "quantize_row");
  check_length(type, n, "quantize_row");
  quantize(src, dst, n);
}

bool has_quantizer(GgmlType type) {
  const auto id = static_cast<uint32_t>(type);
  return id < kMaxTypeId && scalar_table()[id].quantize != nullptr;
}

void quantize_activation(GgmlType weight_type, const float* src, void* dst, int64_t n) {
  const TypeKernels& k = kernels_for(fast_table(), weight_type, "quantize_activation");
  check_length(activation_type(weight_type), n, "quantize_activation");
  k.quantize_activation(src, dst, n);
}

float dot(GgmlType weight_type, const void* weight_row, const void* activation, int64_t n) {
  const TypeKernels& k = kernels_for(fast_table(), weight_type, "dot");
  check_length(weight_type, n, "dot");
  return canonical_nan(k.dot(weight_row, activation, n));
}

void dot_many(GgmlType weight_type, const void* weight_row, const void* activations,
              size_t activation_stride, int64_t n_activations, int64_t n, float* out,
              size_t out_stride) {
  const TypeKernels& k = kernels_for(fast_table(), weight_type, "dot_many");
  check_length(weight_type, n, "dot_many");
  if (n_activations <= 0) return;
  dot_many_with(k, weight_row, activations, activation_stride, n_activations, n, out, out_stride);
}

void dot_tile(GgmlType weight_type, const void* weights, size_t weight_stride, int64_t n_weights,
              const void* activations, size_t activation_stride, int64_t n_activations, int64_t n,
              float* out, size_t out_weight_stride, size_t out_activation_stride) {
  const TypeKernels& k = kernels_for(fast_table(), weight_type, "dot_tile");
  check_length(weight_type, n, "dot_tile");
  if (n_weights <= 0 || n_activations <= 0) return;
  if (k.dot_tile != nullptr) {
    k.dot_tile(weights, weight_stride, n_weights, activations, activation_stride, n_activations, n,
               out, out_weight_stride, out_activation_stride);
    return;
  }
  const auto* weight = static_cast<const std::byte*>(weights);
  for (int64_t r = 0; r < n_weights; ++r) {
    dot_many_with(k, weight + size_t(r) * weight_stride, activations, activation_stride,
                  n_activations, n, out + size_t(r) * out_weight_stride, out_activation_stride);
  }
}

DotKernel dot_kernel(GgmlType weight_type) {
  return kernels_for(fast_table(), weight_type, "dot_kernel").dot;
}

namespace ref {

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const TypeKernels& k = kernels_for(scalar_table(), type, "ref::dequantize_row");
  check_length(type, n, "ref::dequantize_row");
  k.dequantize(src, dst, n);
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const TypeKernels& k = kernels_for(scalar_table(), type, "ref::quantize_row");
  const QuantizeFn quantize = quantizer_for(k, type, "ref::quantize_row");
  check_length(type, n, "ref::quantize_row");
  quantize(src, dst, n);
}

void quantize_activation(GgmlType weight_type, const float* src, void* dst, int64_t n) {
  const TypeKernels& k = kernels_for(scalar_table(), weight_type, "ref::quantize_activation");
  check_length(activation_type(weight_type), n, "ref::quantize_activation");
  k.quantize_activation(src, dst, n);
}

float dot(GgmlType weight_type, const void* weight_row, const void* activation, int64_t n) {
  const TypeKernels& k = kernels_for(scalar_table(), weight_type, "ref::dot");
  check_length(weight_type, n, "ref::dot");
  return k.dot(weight_row, activation, n);
}

}  // namespace ref
}  // namespace strata::quant
