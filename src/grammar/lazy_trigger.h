// LazyTrigger and TriggerScanner — where a lazy grammar starts: llama.cpp's grammars "triggered
// by a word", for tool_choice "auto" (serve/plan.h): the model writes freely until it opens a
// tool call ("<tool_call>"), and from the byte after that word on every token is drawn under the
// calls' grammar (grammar/token_mask.h, GrammarConstraint with a trigger).
//
// What counts: the word in the reply's answer, not inside its thinking. A reply that starts in a
// think block (the prompt opened "<think>\n") is in it until the block's close tag; otherwise a
// reply whose first non-whitespace bytes are the open tag is (text/think_filter.h's rule: only a
// block at the very start, after optional whitespace, is thinking). Tags elsewhere are answer
// text. The word is matched on the reply's bytes (KMP), so it may be one token (a real Qwen
// vocabulary's user-defined <tool_call>) or spelled in pieces, and may end inside a token: the
// rest of that token is then the grammar's first bytes.
//
// TriggerScanner follows the bytes; `key` names its state (a few dozen at most: the position in
// the open tag, the close tag or the word), so what depends only on it (the tokens whose bytes
// would fire the word and go on where the grammar cannot: GrammarConstraint bans those) can be
// cached by it. Cheap to copy (the words are shared). Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::grammar {

struct LazyTrigger {
  std::string word;              // the grammar starts right after it; REQUIRES non-empty
  bool starts_in_block = false;  // the reply opens inside a think block
  std::string block_open = "<think>";
  std::string block_close = "</think>";  // REQUIRES non-empty
};

class TriggerScanner {
 public:
  explicit TriggerScanner(const LazyTrigger& trigger);

  // Follows `bytes`; when the word completes in them, returns the offset just past it (and
  // fired() is true from then on, later bytes ignored), else std::string_view::npos.
  size_t feed(std::string_view bytes);
  bool fired() const { return phase_ == Phase::Fired; }
  // The state: equal keys, equal futures.
  uint32_t key() const { return (uint32_t(phase_) << 24) | (uint32_t(a_) << 12) | uint32_t(b_); }
  uint8_t last_word_byte() const { return uint8_t(words_->word.text.back()); }

 private:
  // One word and its KMP failure table.
  struct Word {
    explicit Word(std::string text);
    size_t next(size_t matched, uint8_t byte) const;
    std::string text;
    std::vector<size_t> failure;
  };
  struct Words {
    Word word, open, close;
  };
  // Leading: whitespace and a prefix of the open tag so far (a_ its length; b_ the word's KMP
  // state alongside). InBlock: a_ the close tag's KMP state. Armed: b_ the word's.
  enum class Phase : uint8_t { Leading, InBlock, Armed, Fired };
  bool step(uint8_t byte);  // true when the word completed with this byte

  std::shared_ptr<const Words> words_;
  Phase phase_;
  size_t a_ = 0, b_ = 0;
};

}  // namespace strata::grammar
