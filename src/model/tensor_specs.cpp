#include "model/tensor_specs.h"

#include <fmt/format.h>

namespace strata {

int64_t TensorSpec::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<TensorSpec> tensor_specs(const HParams& hp) {
  switch (hp.arch) {
    case Arch::Qwen4Exp: return qwen4exp_tensor_specs(hp);
    case Arch::Qwen3Next: return qwen3next_tensor_specs(hp);
    case Arch::Qwen3Moe: return qwen3moe_tensor_specs(hp);
  }
  return {};
}

}  // namespace strata
