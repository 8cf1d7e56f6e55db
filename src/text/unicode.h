// Unicode properties the tokenizer needs, from ICU (no hand-written tables).
//
// Contract
// - `codepoint_flags(cp)` gives the regex classes the pre-tokenizer uses: \p{L}, \p{N}, \p{M}
//   (General_Category L*, N*, M*), \s (the White_Space property, which is what Oniguruma's and
//   llama.cpp's \s mean) and the two exact characters \r \n. The Basic Multilingual Plane is served
//   from a 64 KiB table built from ICU on first use (thread-safe static init); other planes ask ICU.
// - `nfc_normalize` returns the NFC form (ICU Normalizer2); ASCII-only input is returned unchanged
//   without calling ICU. Input must be valid UTF-8 (repair it first: text/utf8.h).
// - `is_python_space` is Python's str.isspace (Zs, or bidi class WS/B/S), which is what Jinja's
//   `trim` strips; the chat template uses it to render exactly what transformers renders.
// - All functions are thread-safe. ICU failures (never expected for valid input) throw strata::Error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

enum CodepointFlag : uint8_t {
  kCpLetter = 1 << 0,      // \p{L}
  kCpNumber = 1 << 1,      // \p{N}
  kCpMark = 1 << 2,        // \p{M}
  kCpWhitespace = 1 << 3,  // \s (White_Space)
  kCpCrLf = 1 << 4,        // '\r' or '\n'
};

uint8_t codepoint_flags_slow(char32_t cp);  // ICU lookup, any plane

namespace detail {
const uint8_t* bmp_flag_table();  // 65536 entries
}

inline uint8_t codepoint_flags(char32_t cp) {
  static const uint8_t* const table = detail::bmp_flag_table();
  return cp < 0x10000 ? table[cp] : codepoint_flags_slow(cp);
}

// True when NFC(text) == text (quick check, may call ICU). `text` must be valid UTF-8.
bool is_nfc(std::string_view text);
// NFC form of valid UTF-8 `text`.
std::string nfc_normalize(std::string_view text);

bool is_python_space(char32_t cp);
// Python's str.strip() with no argument (also Jinja's `trim` filter).
std::string_view python_strip(std::string_view text);

}  // namespace strata
