#include "cli/reply_view.h"

#include <fmt/format.h>

namespace strata::cli {

ReplyView::ReplyView(std::ostream& out, bool show_thinking, bool color)
    : out_(out), show_thinking_(show_thinking), color_(color) {}

std::string ReplyView::dim(const std::string& text) const {
  return color_ && !text.empty() ? "\033[2m" + text + "\033[0m" : text;
}

void ReplyView::close_indicator(const std::string& note) {
  out_ << dim(fmt::format(" {} tokens{}]", thinking_tokens_, note));
  indicator_open_ = false;
}

void ReplyView::show(const ThinkFilter::ReplyDelta& delta, bool one_token) {
  if (!delta.thinking.empty()) thought_ = true;
  if (!delta.answer.empty()) answered_ = true;
  if (show_thinking_) {
    // Show mode passes the text through verbatim, tags included: dim what is not answer.
    out_ << (delta.answer.empty() ? dim(delta.visible) : delta.visible) << std::flush;
    return;
  }
  // Every token before the answer shows counts: tags and held-back whitespace are thinking too.
  if (delta.visible.empty() && !answered_ && one_token) ++thinking_tokens_;
  if (!delta.thinking.empty() && !indicator_open_ && !answered_) {
    indicator_open_ = true;
    out_ << dim("[thinking…") << std::flush;
  }
  if (!delta.visible.empty() && indicator_open_) {
    close_indicator("");
    out_ << "\n";
  }
  out_ << delta.visible << std::flush;
}

void ReplyView::finish(const std::string& cut_short) {
  if (indicator_open_) {
    close_indicator(
        ", no answer yet: the reply ended while the model was thinking (--show-thinking shows "
        "the thinking, --no-thinking asks for none)");
  } else if (!answered_ && !(show_thinking_ && thought_)) {
    out_ << dim("[empty reply]");
  }
  if (!cut_short.empty()) out_ << " [" << cut_short << "]";
  out_ << "\n" << std::flush;
}

}  // namespace strata::cli
