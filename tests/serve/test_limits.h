// The request limits the request-parsing tests share: a 1000-token vocabulary, 4096-token context.
#pragma once

#include <string>

#include "serve/request.h"

namespace strata::serve::test_support {

inline RequestLimits test_limits(const std::string& model_id = "m") {
  RequestLimits out;
  out.model_id = model_id;
  out.n_vocab = 1000;
  out.n_ctx = 4096;
  return out;
}

}  // namespace strata::serve::test_support
