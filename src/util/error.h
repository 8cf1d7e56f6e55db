// strata::Error — the one error type for user-facing failures.
//
// Contract: every failure caused by input (a file, a flag, a request) throws strata::Error whose
// message names the thing (file, tensor, key, field), what was expected and what was found, e.g.
//   "model.gguf: tensor blk.3.ffn_up_exps: expected shape [2560, 640, 512], found [2560, 512, 512]".
// Programming errors (broken invariants) may use assert; bad input never aborts.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace strata {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws strata::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace strata
