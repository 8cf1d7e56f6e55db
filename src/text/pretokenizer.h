// Pre-tokenizer: splits normalised text into the pieces that BPE then encodes one by one.
//
// The `qwen2` split is the regex (leftmost-first alternation, as Oniguruma / Hugging Face
// `tokenizers` Split(..., behavior="isolated") apply it)
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*
//   |\s*[\r\n]+|\s+(?!\S)|\s+
// and `qwen35` is the same with combining marks joining letters:
//   ...|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|...
// Both are implemented as a hand-written scanner that is equivalent to the regex (each branch is
// commented with the alternative it implements); it is an order of magnitude faster than a regex
// engine. Classes come from ICU (text/unicode.h).
//
// Contract: input is valid UTF-8; the pieces are non-empty, contiguous, in order and cover the
// whole input. Thread-safe (the scratch buffers belong to the caller).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace strata {

enum class PreTokenizerKind { Qwen2, Qwen35 };

// "qwen2" / "qwen35".
std::string_view pre_tokenizer_name(PreTokenizerKind kind);

// Yields the pieces of `text` one at a time, without allocating (views into `text`).
class PreTokenizerCursor {
 public:
  PreTokenizerCursor(std::string_view text, PreTokenizerKind kind);
  // Sets `piece` to the next piece and returns true, or returns false at the end.
  bool next(std::string_view& piece);

 private:
  struct Char {
    char32_t cp;
    uint8_t flags;
    uint8_t length;  // bytes
  };
  Char char_at(size_t pos) const;  // pos < text_.size()
  std::string_view text_;
  size_t pos_ = 0;
  uint8_t word_class_;  // letters (qwen35: letters and marks)
  uint8_t not_other_;   // classes excluded from the "other" run of alternative 4
};

// Appends all pieces of `text` to `pieces`.
void pre_tokenize(std::string_view text, PreTokenizerKind kind, std::vector<std::string_view>& pieces);

}  // namespace strata
