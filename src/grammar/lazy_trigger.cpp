#include "grammar/lazy_trigger.h"

#include "util/error.h"

namespace strata::grammar {

TriggerScanner::Word::Word(std::string word) : text(std::move(word)), failure(text.size(), 0) {
  for (size_t i = 1, k = 0; i < text.size(); ++i) {
    while (k > 0 && text[i] != text[k]) k = failure[k - 1];
    if (text[i] == text[k]) ++k;
    failure[i] = k;
  }
}

size_t TriggerScanner::Word::next(size_t matched, uint8_t byte) const {
  if (matched == text.size()) matched = failure[matched - 1];
  while (matched > 0 && uint8_t(text[matched]) != byte) matched = failure[matched - 1];
  return uint8_t(text[matched]) == byte ? matched + 1 : 0;
}

TriggerScanner::TriggerScanner(const LazyTrigger& trigger) {
  if (trigger.word.empty() || trigger.block_close.empty())
    fail("lazy grammar: the trigger word and the think block's close tag must not be empty");
  words_ = std::make_shared<const Words>(
      Words{Word(trigger.word), Word(trigger.block_open), Word(trigger.block_close)});
  phase_ = trigger.starts_in_block      ? Phase::InBlock
           : trigger.block_open.empty() ? Phase::Armed
                                        : Phase::Leading;
}

bool TriggerScanner::step(uint8_t byte) {
  const Words& w = *words_;
  switch (phase_) {
    case Phase::Leading: {
      const bool space = byte == ' ' || byte == '\n' || byte == '\t' || byte == '\r';
      if ((a_ == 0 && space) || uint8_t(w.open.text[a_]) == byte) {
        b_ = w.word.next(b_, byte);  // "<t" starts both "<think>" and "<tool_call>"
        if (b_ == w.word.text.size()) {
          phase_ = Phase::Fired;
          a_ = b_ = 0;
          return true;
        }
        if (!(a_ == 0 && space) && ++a_ == w.open.text.size()) {
          phase_ = Phase::InBlock;
          a_ = b_ = 0;
        }
        return false;
      }
      phase_ = Phase::Armed;  // not a think block: everything from here is answer
      a_ = 0;
      [[fallthrough]];
    }
    case Phase::Armed:
      b_ = w.word.next(b_, byte);
      if (b_ < w.word.text.size()) return false;
      phase_ = Phase::Fired;
      b_ = 0;
      return true;
    case Phase::InBlock:
      a_ = w.close.next(a_, byte);
      if (a_ == w.close.text.size()) {
        phase_ = Phase::Armed;
        a_ = b_ = 0;
      }
      return false;
    case Phase::Fired:
      return false;
  }
  return false;
}

size_t TriggerScanner::feed(std::string_view bytes) {
  if (fired()) return std::string_view::npos;
  for (size_t i = 0; i < bytes.size(); ++i)
    if (step(uint8_t(bytes[i]))) return i + 1;
  return std::string_view::npos;
}

}  // namespace strata::grammar
