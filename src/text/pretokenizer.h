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

// Reusable buffers for `pre_tokenize` (one per thread / call site).
struct PreTokenizerScratch {
  std::vector<char32_t> codepoints;
  std::vector<uint8_t> flags;
  std::vector<uint32_t> offsets;  // byte offset of each code point, plus one past the end
};

// Appends the pieces of `text` to `pieces` (views into `text`).
void pre_tokenize(std::string_view text, PreTokenizerKind kind, PreTokenizerScratch& scratch,
                  std::vector<std::string_view>& pieces);

}  // namespace strata
