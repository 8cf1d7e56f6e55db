// ggml tensor types: ids as stored in GGUF files and the one traits table (block size, bytes per
// block, name) every other module consults.
//
// The table lists every type id a GGUF file may legally carry, so files can be validated and
// inspected even when strata has no kernels for a type; `has_kernels` says whether quant/ can
// dequantize it and take dot products with it. Unknown ids are refused by `type_traits_or_null`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct TypeTraits {
  GgmlType type;
  std::string_view name;  // ggml's spelling, lower case: "f32", "q4_K", "iq2_xs"
  int64_t block_elems;    // weights per block (1 for scalar types)
  size_t block_bytes;     // bytes per block
  bool has_kernels;       // strata can dequantize / dot / (mostly) quantize this type
};

// Traits for a raw type id from a file, or nullptr when the id is not a ggml type we know.
const TypeTraits* type_traits_or_null(uint32_t type_id);
// Traits for a known type (never null).
const TypeTraits& type_traits(GgmlType type);
// "f32", "q4_K", ...
std::string_view type_name(GgmlType type);
// Parses a user-facing name, case-insensitive ("q4_k", "Q4_K", "iq2_xs"); nullopt when unknown.
std::optional<GgmlType> type_from_name(std::string_view name);

// Bytes of a row of `n_elems` weights; the caller guarantees n_elems % block_elems == 0.
size_t row_bytes(GgmlType type, int64_t n_elems);

// The type a quantizer should store rows of `row_elems` weights in when `requested` was asked
// for: `requested` when its block size divides the row, else llama.cpp's substitute
// (llama_cpp_fallback: IQ4_NL for IQ4_XS and the IQ1-3 types, Q4_0 for Q2_K/Q3_K/TQ1_0/TQ2_0,
// Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K) when strata has kernels for it and it divides the
// row, else Q8_0, else F16 (llama.cpp goes straight to F16; Q8_0 differs only for types without
// a substitute, whose 32-blocks then do not divide either).
GgmlType llama_cpp_fallback(GgmlType requested);
GgmlType storable_type(GgmlType requested, int64_t row_elems);

}  // namespace strata
