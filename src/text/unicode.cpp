#include "text/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/bytestream.h>
#include <unicode/uchar.h>

#include <cstring>
#include <vector>

#include "text/utf8.h"
#include "util/error.h"

namespace strata {
namespace {

const icu::Normalizer2& nfc_instance() {
  static const icu::Normalizer2* const instance = [] {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status) || nfc == nullptr) {
      fail("ICU: cannot load the NFC normalizer data: {}", u_errorName(status));
    }
    return nfc;
  }();
  return *instance;
}

bool is_ascii(std::string_view text) {
  size_t pos = 0;
  const size_t n = text.size();
  for (; pos + 8 <= n; pos += 8) {
    uint64_t word;
    std::memcpy(&word, text.data() + pos, 8);
    if (word & 0x8080808080808080ull) return false;
  }
  for (; pos < n; ++pos) {
    if (static_cast<unsigned char>(text[pos]) >= 0x80) return false;
  }
  return true;
}

}  // namespace

uint8_t codepoint_flags_slow(char32_t cp) {
  const UChar32 c = static_cast<UChar32>(cp);
  const uint32_t category_mask = U_MASK(u_charType(c));
  uint8_t flags = 0;
  if (category_mask & U_GC_L_MASK) flags |= kCpLetter;
  if (category_mask & U_GC_N_MASK) flags |= kCpNumber;
  if (category_mask & U_GC_M_MASK) flags |= kCpMark;
  if (u_isUWhiteSpace(c)) flags |= kCpWhitespace;
  if (cp == '\r' || cp == '\n') flags |= kCpCrLf;
  return flags;
}

namespace detail {
const uint8_t* bmp_flag_table() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(0x10000);
    for (char32_t cp = 0; cp < 0x10000; ++cp) t[cp] = codepoint_flags_slow(cp);
    return t;
  }();
  return table.data();
}
}  // namespace detail

bool is_nfc(std::string_view text) {
  if (is_ascii(text)) return true;
  UErrorCode status = U_ZERO_ERROR;
  const UBool yes = nfc_instance().isNormalizedUTF8(icu::StringPiece(text.data(),
                                                                     static_cast<int32_t>(text.size())),
                                                    status);
  if (U_FAILURE(status)) fail("ICU: NFC check failed: {}", u_errorName(status));
  return yes;
}

std::string nfc_normalize(std::string_view text) {
  if (is_nfc(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  icu::StringByteSink<std::string> sink(&out);
  UErrorCode status = U_ZERO_ERROR;
  nfc_instance().normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())),
                               sink, nullptr, status);
  if (U_FAILURE(status)) fail("ICU: NFC normalisation failed: {}", u_errorName(status));
  return out;
}

bool is_python_space(char32_t cp) {
  const UChar32 c = static_cast<UChar32>(cp);
  if (u_charType(c) == U_SPACE_SEPARATOR) return true;
  const UCharDirection dir = u_charDirection(c);
  return dir == U_WHITE_SPACE_NEUTRAL || dir == U_BLOCK_SEPARATOR || dir == U_SEGMENT_SEPARATOR;
}

std::string_view python_strip(std::string_view text) {
  // Walk code points from both ends; text is valid UTF-8 (rendered chat content is repaired first).
  size_t begin = 0;
  while (begin < text.size()) {
    char32_t cp = 0;
    const size_t len = utf8_decode_valid(text, begin, cp);
    if (!is_python_space(cp)) break;
    begin += len;
  }
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    char32_t cp = 0;
    utf8_decode_valid(text, start, cp);
    if (!is_python_space(cp)) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

}  // namespace strata
