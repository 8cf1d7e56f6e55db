// Small AVX-512 helpers shared by the avx512/*.cpp kernels. Include only from files compiled with
// the AVX-512 flags (src/quant/CMakeLists.txt); always_inline for the reason in avx2_common.h.
//
// g++ 12 warns (-Wuninitialized, -Wmaybe-uninitialized) inside its own AVX-512 intrinsics:
// _mm512_inserti64x4, _mm512_castsi512_si256 and others pass _mm*_undefined_*(), which are
// self-initialised on purpose (GCC bug 105593, fixed in GCC 13). Files that include this header
// should silence those two warnings after their includes with STRATA_AVX512_IGNORE_GCC12_WARNINGS.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "quant/quant.h"

// clang has neither the bug nor -Wmaybe-uninitialized (it would warn about the unknown group).
#if defined(__clang__)
#define STRATA_AVX512_IGNORE_GCC12_WARNINGS
#else
#define STRATA_AVX512_IGNORE_GCC12_WARNINGS             \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#endif

namespace strata::quant::avx512 {

// Lane k + lane 8 + k of 16 i32 lanes.
[[gnu::always_inline]] inline __m256i add_halves(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// The dot_many driver of the multi-activation kernels: activation rows 0..n_acts-1 in passes of up
// to kMaxRows, calling pass(rows, first) with rows a std::integral_constant<int, k> (so the kernel
// can be a template on k) and first the pass's first activation row.
template <int kRows, typename Pass>
[[gnu::always_inline]] inline void run_pass(int64_t rows, int64_t first, Pass& pass) {
  if constexpr (kRows == 1) {
    pass(std::integral_constant<int, 1>{}, first);
  } else if (rows >= kRows) {
    pass(std::integral_constant<int, kRows>{}, first);
  } else {
    run_pass<kRows - 1>(rows, first, pass);
  }
}

template <int kMaxRows, typename Pass>
[[gnu::always_inline]] inline void in_row_passes(int64_t n_acts, Pass pass) {
  for (int64_t first = 0; first < n_acts; first += kMaxRows) {
    run_pass<kMaxRows>(std::min<int64_t>(kMaxRows, n_acts - first), first, pass);
  }
}

}  // namespace strata::quant::avx512
