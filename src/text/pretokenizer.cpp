#include "text/pretokenizer.h"

#include <cstdint>

#include "text/unicode.h"
#include "text/utf8.h"

namespace strata {
namespace {

char32_t ascii_lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

// Alternative 1, (?i:'s|'t|'re|'ve|'m|'ll|'d), at cps[i] == '\''. Returns the match length in code
// points (0: no match). Case-insensitive for ASCII letters; Oniguruma's Unicode case folding would
// also let U+017F (long s) match 's', but a letter follows the apostrophe either way and alternative
// 2 then yields the same piece unless more letters follow (documented in docs/tokenizer.md).
size_t contraction_length(const char32_t* cps, size_t i, size_t n) {
  const auto at = [&](size_t k) -> char32_t { return i + k < n ? ascii_lower(cps[i + k]) : 0; };
  const char32_t c1 = at(1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  const char32_t c2 = at(2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

}  // namespace

std::string_view pre_tokenizer_name(PreTokenizerKind kind) {
  return kind == PreTokenizerKind::Qwen35 ? "qwen35" : "qwen2";
}

void pre_tokenize(std::string_view text, PreTokenizerKind kind, PreTokenizerScratch& scratch,
                  std::vector<std::string_view>& pieces) {
  auto& cps = scratch.codepoints;
  auto& flags = scratch.flags;
  auto& offsets = scratch.offsets;
  cps.clear();
  flags.clear();
  offsets.clear();
  for (size_t pos = 0; pos < text.size();) {
    char32_t cp = 0;
    const size_t len = utf8_decode_valid(text, pos, cp);
    cps.push_back(cp);
    flags.push_back(codepoint_flags(cp));
    offsets.push_back(static_cast<uint32_t>(pos));
    pos += len;
  }
  offsets.push_back(static_cast<uint32_t>(text.size()));
  const size_t n = cps.size();

  // The "letter run" class of alternative 2 and the "other" class of alternative 4.
  const uint8_t word_class = kind == PreTokenizerKind::Qwen35 ? (kCpLetter | kCpMark) : kCpLetter;
  const uint8_t not_other = word_class | kCpNumber | kCpWhitespace;
  const auto is_word = [&](size_t k) { return (flags[k] & word_class) != 0; };
  const auto is_other = [&](size_t k) { return (flags[k] & not_other) == 0; };
  const auto emit = [&](size_t from, size_t to) {
    pieces.push_back(text.substr(offsets[from], offsets[to] - offsets[from]));
  };

  size_t i = 0;
  while (i < n) {
    const char32_t c = cps[i];
    const uint8_t f = flags[i];

    // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (c == '\'') {
      if (const size_t len = contraction_length(cps.data(), i, n)) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    // 2. [^\r\n\p{L}\p{N}]?\p{L}+   (qwen35: [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+)
    //    The optional prefix is greedy: taken when this char is in it and a word char follows.
    {
      size_t j = i;
      if ((f & (kCpCrLf | kCpLetter | kCpNumber)) == 0 && i + 1 < n && is_word(i + 1)) {
        j = i + 1;
      }
      if (is_word(j)) {
        while (j < n && is_word(j)) ++j;
        emit(i, j);
        i = j;
        continue;
      }
    }
    // 3. \p{N}: one code point.
    if (f & kCpNumber) {
      emit(i, i + 1);
      ++i;
      continue;
    }
    // 4. ' ?[^\s\p{L}\p{N}]+[\r\n]*'   (qwen35 also excludes \p{M})
    {
      size_t j = i;
      if (c == ' ' && i + 1 < n && is_other(i + 1)) j = i + 1;
      if (is_other(j)) {
        while (j < n && is_other(j)) ++j;
        while (j < n && (flags[j] & kCpCrLf)) ++j;
        emit(i, j);
        i = j;
        continue;
      }
    }
    // Only whitespace remains here (everything else matched above). Let [i, run_end) be the run.
    size_t run_end = i;
    size_t last_crlf = n;  // index of the last \r or \n in the run
    while (run_end < n && (flags[run_end] & kCpWhitespace)) {
      if (flags[run_end] & kCpCrLf) last_crlf = run_end;
      ++run_end;
    }
    // 5. \s*[\r\n]+ : \s* backtracks to the last line break of the run; [\r\n]+ takes it (the
    //    character after it is not a line break, by the choice of "last").
    if (last_crlf != n) {
      emit(i, last_crlf + 1);
      i = last_crlf + 1;
      continue;
    }
    // 6. \s+(?!\S) : the whole run at the end of the text, else the run minus its last char (which
    //    is followed by non-space), provided that leaves at least one char.
    if (run_end == n) {
      emit(i, run_end);
      i = run_end;
      continue;
    }
    if (run_end - i >= 2) {
      emit(i, run_end - 1);
      i = run_end - 1;
      continue;
    }
    // 7. \s+ : a single whitespace char followed by non-space.
    emit(i, run_end);
    i = run_end;
  }
}

}  // namespace strata
