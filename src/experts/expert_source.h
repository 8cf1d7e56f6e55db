// ExpertSource — where the MoE layer gets a routed expert's three matrices from.
//
// Contract: `acquire(layer, experts)` is called once per layer per window with the sorted union
// of expert ids the window routes to; it returns after every listed expert is usable and fills one
// ExpertMatrices per id. Views stay valid until the next `acquire` call for any layer. The source
// decides where bytes come from (the file mapping, an arena filled by pread from the sidecar, a
// GPU arena); it must never change which experts are used or their values. Called from the
// window's thread only.
#pragma once

#include <cstdint>
#include <span>

#include "compute/cpu/matmul.h"

namespace strata {

struct ExpertMatrices {
  compute::WeightMatrix gate;  // [n_ff x n_embd]
  compute::WeightMatrix up;    // [n_ff x n_embd]
  compute::WeightMatrix down;  // [n_embd x n_ff]
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual void acquire(int layer, std::span<const int32_t> experts,
                       std::span<ExpertMatrices> out) = 0;
};

}  // namespace strata
