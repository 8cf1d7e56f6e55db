// StopMatcher — finds OpenAI "stop" strings in text that arrives in pieces.
//
// `push` returns the text that can be shown now: everything before the first stop string, minus a
// held-back tail that could still become the start of one (the longest suffix that is a proper
// prefix of some stop string). Once a stop string has appeared, `stopped()` is true, the text
// before it has been returned and everything after it (and the stop string itself) is dropped, as
// OpenAI does. `finish` releases the held-back tail at the end of generation. Concatenating every
// returned piece gives the text up to (excluding) the earliest stop string, for any way of cutting
// the input into pieces. Stop strings are non-empty. Not thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::serve {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string push(std::string_view text);
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace strata::serve
