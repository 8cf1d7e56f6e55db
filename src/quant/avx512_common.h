// Small AVX-512 helpers shared by the *_avx512.cpp kernels. Include only from files compiled with
// the AVX-512 flags (src/quant/CMakeLists.txt); always_inline for the reason in avx2_common.h.
//
// g++ 12 warns (-Wuninitialized, -Wmaybe-uninitialized) inside its own AVX-512 intrinsics:
// _mm512_inserti64x4, _mm512_castsi512_si256 and others pass _mm*_undefined_*(), which are
// self-initialised on purpose (GCC bug 105593, fixed in GCC 13). Files that include this header
// should silence those two warnings after their includes with STRATA_AVX512_IGNORE_GCC12_WARNINGS.
#pragma once

#include <immintrin.h>

#define STRATA_AVX512_IGNORE_GCC12_WARNINGS             \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")

namespace strata::quant::avx512 {

// Lane k + lane 8 + k of 16 i32 lanes.
[[gnu::always_inline]] inline __m256i add_halves(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

}  // namespace strata::quant::avx512
