#include "text/pretokenizer.h"

#include <cstdint>

#include "text/unicode.h"
#include "text/utf8.h"

namespace strata {
namespace {

char32_t ascii_lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

}  // namespace

std::string_view pre_tokenizer_name(PreTokenizerKind kind) {
  return kind == PreTokenizerKind::Qwen35 ? "qwen35" : "qwen2";
}

PreTokenizerCursor::PreTokenizerCursor(std::string_view text, PreTokenizerKind kind)
    : text_(text),
      word_class_(kind == PreTokenizerKind::Qwen35 ? (kCpLetter | kCpMark) : kCpLetter),
      not_other_(static_cast<uint8_t>(word_class_ | kCpNumber | kCpWhitespace)) {}

PreTokenizerCursor::Char PreTokenizerCursor::char_at(size_t pos) const {
  const auto byte = static_cast<unsigned char>(text_[pos]);
  if (byte < 0x80) return {byte, codepoint_flags(byte), 1};
  char32_t cp = 0;
  const size_t length = utf8_decode_valid(text_, pos, cp);
  return {cp, codepoint_flags(cp), static_cast<uint8_t>(length)};
}

bool PreTokenizerCursor::next(std::string_view& piece) {
  const size_t n = text_.size();
  const size_t start = pos_;
  if (start >= n) return false;
  const auto emit = [&](size_t end) {
    piece = text_.substr(start, end - start);
    pos_ = end;
    return true;
  };
  const auto is_word = [&](const Char& c) { return (c.flags & word_class_) != 0; };
  const auto is_other = [&](const Char& c) { return (c.flags & not_other_) == 0; };
  const Char c = char_at(start);
  const size_t after_c = start + c.length;

  // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d). Oniguruma's case-insensitive matching uses Unicode case
  //    folding, so U+017F LONG S (UTF-8 C5 BF, folds to 's') matches 's' too: tokenizers 0.23.2
  //    splits "'ſa" into "'ſ" + "a". No other character folds to one of these letters.
  if (c.cp == '\'' && after_c < n) {
    const char32_t c1 = ascii_lower(static_cast<unsigned char>(text_[after_c]));
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return emit(after_c + 1);
    if (text_.substr(after_c, 2) == "\xC5\xBF") return emit(after_c + 2);
    if (after_c + 1 < n) {
      const char32_t c2 = ascii_lower(static_cast<unsigned char>(text_[after_c + 1]));
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
        return emit(after_c + 2);
      }
    }
  }
  // 2. [^\r\n\p{L}\p{N}]?\p{L}+   (qwen35: [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+)
  //    The optional prefix is greedy: taken when this char is in it and a word char follows.
  {
    size_t run = start;
    if (is_word(c)) {
      run = after_c;
    } else if ((c.flags & (kCpCrLf | kCpLetter | kCpNumber)) == 0 && after_c < n) {
      const Char d = char_at(after_c);
      if (is_word(d)) run = after_c + d.length;
    }
    if (run != start) {
      while (run < n) {
        const Char d = char_at(run);
        if (!is_word(d)) break;
        run += d.length;
      }
      return emit(run);
    }
  }
  // 3. \p{N}: one code point.
  if (c.flags & kCpNumber) return emit(after_c);
  // 4. ' ?[^\s\p{L}\p{N}]+[\r\n]*'   (qwen35 also excludes \p{M})
  {
    size_t run = start;
    if (is_other(c)) {
      run = after_c;
    } else if (c.cp == ' ' && after_c < n) {
      const Char d = char_at(after_c);
      if (is_other(d)) run = after_c + d.length;
    }
    if (run != start) {
      while (run < n) {
        const Char d = char_at(run);
        if (!is_other(d)) break;
        run += d.length;
      }
      while (run < n && (text_[run] == '\r' || text_[run] == '\n')) ++run;
      return emit(run);
    }
  }
  // Only whitespace remains here (everything else matched above). Scan the run [start, run_end),
  // remembering where its last character and its last line break are.
  size_t run_end = after_c;
  size_t last_char = start;
  size_t after_last_crlf = (c.flags & kCpCrLf) ? after_c : 0;
  while (run_end < n) {
    const Char d = char_at(run_end);
    if (!(d.flags & kCpWhitespace)) break;
    last_char = run_end;
    run_end += d.length;
    if (d.flags & kCpCrLf) after_last_crlf = run_end;
  }
  // 5. \s*[\r\n]+ : \s* backtracks to the last line break of the run; [\r\n]+ takes it (the
  //    character after it is not a line break, by the choice of "last").
  if (after_last_crlf != 0) return emit(after_last_crlf);
  // 6. \s+(?!\S) : the whole run at the end of the text, else the run minus its last character
  //    (which is followed by non-space), provided that leaves at least one character.
  if (run_end == n) return emit(run_end);
  if (last_char != start) return emit(last_char);
  // 7. \s+ : a single whitespace character followed by non-space.
  return emit(run_end);
}

void pre_tokenize(std::string_view text, PreTokenizerKind kind, std::vector<std::string_view>& pieces) {
  PreTokenizerCursor cursor(text, kind);
  std::string_view piece;
  while (cursor.next(piece)) pieces.push_back(piece);
}

}  // namespace strata
