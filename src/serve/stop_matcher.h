// StopMatcher — finds OpenAI "stop" strings in text that arrives in pieces.
//
// `push` returns the text that can be shown now, minus a held-back tail that could still become
// the start of a stop string (the longest suffix that is a proper prefix of one). The generation
// stops where a stop string is first complete, as it would be token by token: the text before
// that stop string (the longest one, when several complete at the same byte) is returned, the stop
// string and everything after it are dropped (OpenAI's rule), and `stopped()` turns true. `finish`
// releases the held-back tail at the end of generation. The concatenation of every returned piece
// is the same for any way of cutting the input into pieces, and contains no stop string.
// `matched()` names the stop string that ended it (Anthropic's stop_sequence).
// Stop strings are non-empty (empty ones are ignored). Not thread-safe.
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
  // The stop string that ended the text; empty until stopped().
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace strata::serve
