#include "quant/ggml_type.h"

#include <array>
#include <cctype>

namespace strata {
namespace {

// Block sizes follow ggml-common.h (see shared/reference/gguf-and-quants.md §2).
constexpr std::array kTypeTable = {
    TypeTraits{GgmlType::F32, "f32", 1, 4, true},
    TypeTraits{GgmlType::F16, "f16", 1, 2, true},
    TypeTraits{GgmlType::Q4_0, "q4_0", 32, 18, true},
    TypeTraits{GgmlType::Q4_1, "q4_1", 32, 20, true},
    TypeTraits{GgmlType::Q5_0, "q5_0", 32, 22, true},
    TypeTraits{GgmlType::Q5_1, "q5_1", 32, 24, true},
    TypeTraits{GgmlType::Q8_0, "q8_0", 32, 34, true},
    TypeTraits{GgmlType::Q8_1, "q8_1", 32, 36, false},
    TypeTraits{GgmlType::Q2_K, "q2_K", 256, 84, true},
    TypeTraits{GgmlType::Q3_K, "q3_K", 256, 110, true},
    TypeTraits{GgmlType::Q4_K, "q4_K", 256, 144, true},
    TypeTraits{GgmlType::Q5_K, "q5_K", 256, 176, true},
    TypeTraits{GgmlType::Q6_K, "q6_K", 256, 210, true},
    TypeTraits{GgmlType::Q8_K, "q8_K", 256, 292, false},
    TypeTraits{GgmlType::IQ2_XXS, "iq2_xxs", 256, 66, true},
    TypeTraits{GgmlType::IQ2_XS, "iq2_xs", 256, 74, true},
    TypeTraits{GgmlType::IQ3_XXS, "iq3_xxs", 256, 98, true},
    TypeTraits{GgmlType::IQ1_S, "iq1_s", 256, 50, true},
    TypeTraits{GgmlType::IQ4_NL, "iq4_nl", 32, 18, true},
    TypeTraits{GgmlType::IQ3_S, "iq3_s", 256, 110, true},
    TypeTraits{GgmlType::IQ2_S, "iq2_s", 256, 82, true},
    TypeTraits{GgmlType::IQ4_XS, "iq4_xs", 256, 136, true},
    TypeTraits{GgmlType::I8, "i8", 1, 1, false},
    TypeTraits{GgmlType::I16, "i16", 1, 2, false},
    TypeTraits{GgmlType::I32, "i32", 1, 4, false},
    TypeTraits{GgmlType::I64, "i64", 1, 8, false},
    TypeTraits{GgmlType::F64, "f64", 1, 8, false},
    TypeTraits{GgmlType::IQ1_M, "iq1_m", 256, 56, true},
    TypeTraits{GgmlType::BF16, "bf16", 1, 2, true},
    TypeTraits{GgmlType::TQ1_0, "tq1_0", 256, 54, false},
    TypeTraits{GgmlType::TQ2_0, "tq2_0", 256, 66, false},
    TypeTraits{GgmlType::MXFP4, "mxfp4", 32, 17, false},
};

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

const TypeTraits* type_traits_or_null(uint32_t type_id) {
  for (const TypeTraits& traits : kTypeTable) {
    if (static_cast<uint32_t>(traits.type) == type_id) return &traits;
  }
  return nullptr;
}

const TypeTraits& type_traits(GgmlType type) {
  return *type_traits_or_null(static_cast<uint32_t>(type));
}

std::string_view type_name(GgmlType type) { return type_traits(type).name; }

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const TypeTraits& traits : kTypeTable) {
    if (equal_ignoring_case(traits.name, name)) return traits.type;
  }
  return std::nullopt;
}

size_t row_bytes(GgmlType type, int64_t n_elems) {
  const TypeTraits& traits = type_traits(type);
  return static_cast<size_t>(n_elems / traits.block_elems) * traits.block_bytes;
}

// llama.cpp's substitute for a type whose block does not divide the row (llama-quant.cpp), or
// `requested` itself when it has none. shared/reference/gguf-and-quants.md §2 lists IQ4_NL for
// Q2_K/Q3_K; llama-quant.cpp and the libllama v0.4.0 the parity test drives pick Q4_0 (measured:
// Q3_K_M of a 64-wide model holds q4_0, tests/llama_cpp/llama_cpp_quantized_parity_test.cpp).
GgmlType llama_cpp_fallback(GgmlType requested) {
  switch (requested) {
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::TQ1_0:
    case GgmlType::TQ2_0:
      return GgmlType::Q4_0;
    case GgmlType::IQ1_S:
    case GgmlType::IQ1_M:
    case GgmlType::IQ2_XXS:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ4_XS:
      return GgmlType::IQ4_NL;
    case GgmlType::Q4_K:
      return GgmlType::Q5_0;
    case GgmlType::Q5_K:
      return GgmlType::Q5_1;
    case GgmlType::Q6_K:
      return GgmlType::Q8_0;
    default:
      return requested;
  }
}

GgmlType storable_type(GgmlType requested, int64_t row_elems) {
  if (row_elems % type_traits(requested).block_elems == 0) return requested;
  const GgmlType fallback = llama_cpp_fallback(requested);
  const TypeTraits& traits = type_traits(fallback);
  if (traits.has_kernels && row_elems % traits.block_elems == 0) return fallback;
  if (row_elems % type_traits(GgmlType::Q8_0).block_elems == 0) return GgmlType::Q8_0;
  return GgmlType::F16;
}

}  // namespace strata
