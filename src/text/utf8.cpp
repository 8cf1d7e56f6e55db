#include "text/utf8.h"

#include <cstring>

namespace strata {
namespace {

// Bounds of the second byte for a lead byte (Unicode Table 3-7); other continuation bytes are
// always 80..BF. Returns the sequence length, 0 for a byte that cannot start a sequence.
size_t lead_info(unsigned char lead, unsigned char& second_lo, unsigned char& second_hi) {
  second_lo = 0x80;
  second_hi = 0xBF;
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;  // continuation byte or overlong 2-byte lead
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) {
    if (lead == 0xE0) second_lo = 0xA0;  // no overlongs
    if (lead == 0xED) second_hi = 0x9F;  // no surrogates
    return 3;
  }
  if (lead < 0xF5) {
    if (lead == 0xF0) second_lo = 0x90;  // no overlongs
    if (lead == 0xF4) second_hi = 0x8F;  // nothing above U+10FFFF
    return 4;
  }
  return 0;
}

// Length of the valid (maybe incomplete) prefix of the sequence at `pos`: how many bytes fit the
// table before it breaks or the input ends. Sets `needed` to the full length.
size_t matched_prefix(const unsigned char* s, size_t avail, size_t& needed) {
  unsigned char lo, hi;
  needed = lead_info(s[0], lo, hi);
  if (needed == 0) return 0;
  size_t k = 1;
  while (k < needed && k < avail) {
    const unsigned char b = s[k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    ++k;
  }
  return k;
}

}  // namespace

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_sequence_at(std::string_view text, size_t pos, char32_t& cp) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  size_t needed = 0;
  const size_t k = matched_prefix(s, text.size() - pos, needed);
  if (needed == 0 || k != needed) return 0;
  utf8_decode_valid(text, pos, cp);
  return needed;
}

bool utf8_is_valid(std::string_view text) {
  size_t pos = 0;
  const size_t n = text.size();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  while (pos < n) {
    // ASCII fast path, eight bytes at a time.
    while (pos + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, s + pos, 8);
      if (word & 0x8080808080808080ull) break;
      pos += 8;
    }
    if (pos >= n) break;
    if (s[pos] < 0x80) {
      ++pos;
      continue;
    }
    size_t needed = 0;
    const size_t k = matched_prefix(s + pos, n - pos, needed);
    if (needed == 0 || k != needed) return false;
    pos += needed;
  }
  return true;
}

size_t utf8_repair_prefix(std::string_view text, bool at_end, std::string& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  size_t run_start = 0;  // start of a run of bytes to copy verbatim
  while (pos < n) {
    if (s[pos] < 0x80) {
      ++pos;
      continue;
    }
    size_t needed = 0;
    const size_t k = matched_prefix(s + pos, n - pos, needed);
    if (needed != 0 && k == needed) {
      pos += needed;
      continue;
    }
    if (needed != 0 && pos + k == n && !at_end) break;  // may still complete: hold back
    out.append(text.data() + run_start, pos - run_start);
    out.append(kReplacementUtf8);
    pos += (k == 0 ? 1 : k);  // one U+FFFD per maximal subpart
    run_start = pos;
  }
  out.append(text.data() + run_start, pos - run_start);
  return pos;
}

std::string utf8_repair(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  utf8_repair_prefix(text, /*at_end=*/true, out);
  return out;
}

}  // namespace strata
