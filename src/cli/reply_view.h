// ReplyView — how `strata chat` prints one streamed reply: the answer as it comes, and the
// thinking either shown (dimmed on a terminal, --show-thinking) or replaced by a visible
// indicator, so that a reply that is still (or only) thinking never looks empty.
//
// Hidden thinking prints "[thinking…" when the first thinking text arrives and closes it with
// the tokens it took (" 143 tokens]" and a newline) when the answer starts. Tokens, not seconds:
// the output stays a function of the tokens (tests compare chat transcripts byte for byte). A reply
// that ends while still thinking closes it with the reason the caller gives ("the reply limit
// (--max-reply 512) ended it") and a hint how to see or skip the thinking. A reply with neither
// answer nor thinking says
// "[empty reply]". With `color` the indicator and shown thinking are dim (ANSI SGR 2), else
// plain text (a pipe, a file). Not thread-safe; one per reply.
#pragma once

#include <ostream>
#include <string>

#include "text/think_filter.h"

namespace strata::cli {

class ReplyView {
 public:
  ReplyView(std::ostream& out, bool show_thinking, bool color);
  // One token's delta, or (one_token false) text flushed at the end of the reply.
  void show(const ThinkFilter::ReplyDelta& delta, bool one_token = true);
  // End of the reply; `cut_short` is why it ended early ("" = it ended by itself).
  void finish(const std::string& cut_short);

 private:
  std::string dim(const std::string& text) const;
  void close_indicator(const std::string& note);

  std::ostream& out_;
  const bool show_thinking_, color_;
  bool indicator_open_ = false;
  bool answered_ = false, thought_ = false;
  int thinking_tokens_ = 0;
};

}  // namespace strata::cli
