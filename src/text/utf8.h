// UTF-8 helpers for the text module: decode/encode code points and repair ill-formed byte strings.
//
// Contract
// - Repair follows the Unicode "substitution of maximal subparts" practice (the one Python's
//   bytes.decode(errors="replace") and Rust's String::from_utf8_lossy use): every maximal subpart
//   of an ill-formed sequence becomes one U+FFFD; well-formed input is returned unchanged.
// - `utf8_repair_prefix` is the streaming form: it consumes as much of its input as can be decided
//   now and reports how many bytes it left because they may still become a valid character.
// - Pure functions, no state; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// Appends the UTF-8 encoding of `cp` (must be a scalar value: <= 0x10FFFF, not a surrogate).
void append_utf8(std::string& out, char32_t cp);

// Length of the well-formed sequence starting at text[pos], or 0 when it is ill-formed or cut
// short. Sets `cp` on success.
size_t utf8_sequence_at(std::string_view text, size_t pos, char32_t& cp);

// Decodes the code point at text[pos] of text that is known to be well-formed and returns its
// length (1..4). Precondition: pos < text.size() and the text is valid UTF-8.
inline size_t utf8_decode_valid(std::string_view text, size_t pos, char32_t& cp) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  if (s[0] < 0x80) {
    cp = s[0];
    return 1;
  }
  if (s[0] < 0xE0) {
    cp = (char32_t(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    return 2;
  }
  if (s[0] < 0xF0) {
    cp = (char32_t(s[0] & 0x0F) << 12) | (char32_t(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return 3;
  }
  cp = (char32_t(s[0] & 0x07) << 18) | (char32_t(s[1] & 0x3F) << 12) | (char32_t(s[2] & 0x3F) << 6) |
       (s[3] & 0x3F);
  return 4;
}

// True when the whole string is well-formed UTF-8.
bool utf8_is_valid(std::string_view text);

// Well-formed copy of `text` (maximal subparts of ill-formed sequences -> U+FFFD).
std::string utf8_repair(std::string_view text);

// Streaming repair: appends to `out` the repaired form of the longest prefix of `text` that can be
// decided without more input, and returns the number of bytes consumed. The bytes not consumed
// (at most 3) are an incomplete but so-far valid sequence at the very end of `text`. With
// `at_end` true nothing is held back: an incomplete tail becomes U+FFFD.
size_t utf8_repair_prefix(std::string_view text, bool at_end, std::string& out);

}  // namespace strata
