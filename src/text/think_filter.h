// ThinkFilter — splits a streamed assistant reply into its thinking part and its answer, and
// decides what to show.
//
// A Qwen reply may start with a think block: "<think>\n…\n</think>\n\n" followed by the answer
// (or, when the prompt already opened "<think>\n", just "…\n</think>\n\nanswer"). Only a block at the
// very start of the reply (after optional whitespace) counts; tags that appear later are answer
// text. Like the chat templates, the thinking text drops the newlines next to its tags and the
// answer drops the newlines right after "</think>". Text arrives in arbitrary chunks (a tag may be
// split across chunks): the filter holds back only what it cannot classify yet.
//
// Mode::Show passes every chunk through verbatim; Mode::Hide shows only the answer. Both report the
// split in `ReplyDelta`. Not thread-safe (one per reply).
#pragma once

#include <string>
#include <string_view>

namespace strata {

class ThinkFilter {
 public:
  enum class Mode { Show, Hide };
  struct ReplyDelta {
    std::string visible;   // what to print now, per the mode
    std::string thinking;  // new thinking text (without tags)
    std::string answer;    // new answer text
  };

  // `starts_in_thinking`: the prompt ended with an open "<think>\n" (ChatTemplate::prompt_opens_thinking).
  ThinkFilter(Mode mode, bool starts_in_thinking);
  ReplyDelta push(std::string_view text);
  // End of the reply: flushes held-back text (an unterminated think block stays thinking).
  ReplyDelta finish();
  bool in_thinking() const { return state_ == State::Thinking || state_ == State::ThinkingStart; }

 private:
  enum class State { Start, ThinkingStart, Thinking, AfterThink, Answer };
  void process(ReplyDelta& delta, bool at_end);
  Mode mode_;
  State state_;
  std::string held_;  // undecided text
};

}  // namespace strata
