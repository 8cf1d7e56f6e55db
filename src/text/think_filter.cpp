#include "text/think_filter.h"

namespace strata {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag` (a tag cut by a chunk end).
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t len = std::min(text.size(), tag.size() - 1); len > 0; --len) {
    if (tag.starts_with(text.substr(text.size() - len))) return len;
  }
  return 0;
}

}  // namespace

ThinkFilter::ThinkFilter(Mode mode, bool starts_in_thinking)
    : mode_(mode), state_(starts_in_thinking ? State::ThinkingStart : State::Start) {}

ThinkFilter::ReplyDelta ThinkFilter::push(std::string_view text) {
  ReplyDelta delta;
  held_ += text;
  process(delta, /*at_end=*/false);
  delta.visible = mode_ == Mode::Show ? std::string(text) : delta.answer;
  return delta;
}

ThinkFilter::ReplyDelta ThinkFilter::finish() {
  ReplyDelta delta;
  process(delta, /*at_end=*/true);
  if (mode_ == Mode::Hide) delta.visible = delta.answer;
  return delta;
}

void ThinkFilter::process(ReplyDelta& delta, bool at_end) {
  for (;;) {
    switch (state_) {
      case State::Start: {
        const size_t k = held_.find_first_not_of(" \t\r\n");
        if (k == std::string::npos) {
          if (!at_end) return;  // only whitespace so far: a think block may still follow
          state_ = State::Answer;
          break;
        }
        const std::string_view rest = std::string_view(held_).substr(k);
        if (rest.starts_with(kOpen)) {
          held_.erase(0, k + kOpen.size());
          state_ = State::ThinkingStart;
          break;
        }
        if (!at_end && kOpen.starts_with(rest)) return;  // "<thi" so far
        state_ = State::Answer;
        break;
      }
      case State::ThinkingStart: {
        const size_t k = held_.find_first_not_of('\n');
        if (k == std::string::npos) {
          held_.clear();
          return;
        }
        held_.erase(0, k);
        state_ = State::Thinking;
        break;
      }
      case State::Thinking: {
        const size_t close = held_.find(kClose);
        if (close != std::string::npos) {
          const size_t end = held_.find_last_not_of('\n', close == 0 ? 0 : close - 1);
          if (close > 0 && end != std::string::npos) delta.thinking.append(held_, 0, end + 1);
          held_.erase(0, close + kClose.size());
          state_ = State::AfterThink;
          break;
        }
        if (at_end) {
          delta.thinking += held_;
          held_.clear();
          return;
        }
        // Hold back a possible cut tag and the newlines just before it (dropped if the tag follows).
        size_t keep = partial_tag_suffix(held_, kClose);
        while (keep < held_.size() && held_[held_.size() - keep - 1] == '\n') ++keep;
        delta.thinking.append(held_, 0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case State::AfterThink: {
        const size_t k = held_.find_first_not_of('\n');
        if (k == std::string::npos) {
          held_.clear();
          return;
        }
        held_.erase(0, k);
        state_ = State::Answer;
        break;
      }
      case State::Answer:
        delta.answer += held_;
        held_.clear();
        return;
    }
  }
}

}  // namespace strata
