// Loop drivers of the multi-row dot kernels (internal to quant/): a kernel computes a register tile
// of kW weight rows × kA activation rows with every count a compile-time constant, and these
// drivers cover any n_w × n_a with such tiles.
//
// Contract
// - for_each_tile<kMaxW, kMaxA>(n_w, n_a, tile) calls tile(w, a, w_first, a_first) once for each
//   tile, where w and a are std::integral_constant<int, k> (1 ≤ k ≤ kMaxW resp. kMaxA) and the
//   tiles cover [0, n_w) × [0, n_a) exactly once. Activation groups are the outer loop: one group's
//   kA rows stay in L1 while all n_w weight rows pass over them.
// - No ISA code here: the callers live in files compiled for their level, and everything is
//   always_inline so no out-of-line copy is shared between levels (see avx2/common.h).
// - Which tile computes an output never changes its bits: every kernel runs, per (weight row,
//   activation row) pair, exactly the single-row arithmetic (kernels_test checks each one).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace strata::quant::tiles {

// Calls f(std::integral_constant<int, count>{}) for a run-time count in [1, kMax].
template <int kMax, typename F>
[[gnu::always_inline]] inline void with_count(int64_t count, F&& f) {
  if constexpr (kMax == 1) {
    f(std::integral_constant<int, 1>{});
  } else if (count >= kMax) {
    f(std::integral_constant<int, kMax>{});
  } else {
    with_count<kMax - 1>(count, f);
  }
}

template <int kMaxW, int kMaxA, typename Tile>
[[gnu::always_inline]] inline void for_each_tile(int64_t n_w, int64_t n_a, Tile&& tile) {
  for (int64_t a_first = 0; a_first < n_a; a_first += kMaxA) {
    const int64_t a_count = std::min<int64_t>(kMaxA, n_a - a_first);
    for (int64_t w_first = 0; w_first < n_w; w_first += kMaxW) {
      const int64_t w_count = std::min<int64_t>(kMaxW, n_w - w_first);
      with_count<kMaxW>(w_count, [&](auto w) {
        with_count<kMaxA>(a_count, [&](auto a) { tile(w, a, w_first, a_first); });
      });
    }
  }
}

}  // namespace strata::quant::tiles
