// UTF-8 repair: hand-computed cases from the Unicode "maximal subpart" practice (Unicode 15 §3.9,
// Table 3-8's examples) and the streaming/one-shot equivalence.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "text/utf8.h"

namespace strata {
namespace {

const std::string R(kReplacementUtf8);

TEST(Utf8Repair, WellFormedTextIsUnchanged) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";  // a é € 😀 z
  EXPECT_TRUE(utf8_is_valid(text));
  EXPECT_EQ(utf8_repair(text), text);
}

TEST(Utf8Repair, EachMaximalSubpartBecomesOneReplacement) {
  EXPECT_EQ(utf8_repair("\xC3"), R);                        // cut 2-byte sequence
  EXPECT_EQ(utf8_repair("\xE2\x82"), R);                    // cut 3-byte sequence: one subpart
  EXPECT_EQ(utf8_repair("\xF0\x9F\x98" "A"), R + "A");      // cut 4-byte sequence then ASCII
  EXPECT_EQ(utf8_repair("\xC0\xAF"), R + R);                // C0 never starts a sequence
  EXPECT_EQ(utf8_repair("\xE0\x80\x80"), R + R + R);        // overlong: E0 needs A0..BF next
  EXPECT_EQ(utf8_repair("\xED\xA0\x80"), R + R + R);        // surrogate: ED needs 80..9F next
  EXPECT_EQ(utf8_repair("\xF4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF
  EXPECT_EQ(utf8_repair("\x80\xBF"), R + R);                // stray continuation bytes
  EXPECT_EQ(utf8_repair("\xF5\xFF"), R + R);                // bytes that never occur
  // Unicode's Table 3-8 example: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64
  EXPECT_EQ(utf8_repair("a\xF1\x80\x80\xE1\x80\xC2" "b\x80" "c\x80\xBF" "d"),
            "a" + R + R + R + "b" + R + "c" + R + R + "d");
}

TEST(Utf8Repair, StreamingHoldsBackOnlyCompletablePrefixes) {
  std::string out;
  EXPECT_EQ(utf8_repair_prefix("a\xE2\x82", /*at_end=*/false, out), 1u);
  EXPECT_EQ(out, "a");
  out.clear();
  EXPECT_EQ(utf8_repair_prefix("a\xE2\x82", /*at_end=*/true, out), 3u);
  EXPECT_EQ(out, "a" + R);
  out.clear();
  // An ill-formed byte in the middle is decided at once; only the completable tail is held.
  EXPECT_EQ(utf8_repair_prefix("\xE2(\xF0\x9F", /*at_end=*/false, out), 2u);
  EXPECT_EQ(out, R + "(");
}

TEST(Utf8Repair, ChunkedStreamingEqualsOneShotOnRandomBytes) {
  std::mt19937 rng(1234);
  const unsigned char interesting[] = {0x41, 0x80, 0xBF, 0xC2, 0xC3, 0xE0, 0xE2, 0xED, 0xEF,
                                       0xF0, 0xF4, 0xF5, 0x9F, 0xA0, 0x8F, 0x90, 0xFF, 0x0A};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>(interesting[rng() % sizeof interesting]));
    std::string streamed, pending;
    for (char c : bytes) {  // one byte at a time: the hardest chunking
      pending.push_back(c);
      const size_t used = utf8_repair_prefix(pending, false, streamed);
      pending.erase(0, used);
      ASSERT_LE(pending.size(), 3u);
    }
    utf8_repair_prefix(pending, true, streamed);
    ASSERT_EQ(streamed, utf8_repair(bytes)) << "trial " << trial;
    ASSERT_TRUE(utf8_is_valid(streamed));
  }
}

TEST(Utf8, SequenceAtDecodesAndRejects) {
  char32_t cp = 0;
  EXPECT_EQ(utf8_sequence_at("\xF0\x9F\x98\x80", 0, cp), 4u);
  EXPECT_EQ(cp, U'\U0001F600');
  EXPECT_EQ(utf8_sequence_at("\xF0\x9F\x98", 0, cp), 0u);
  std::string encoded;
  append_utf8(encoded, U'\U0010FFFF');
  EXPECT_EQ(encoded, "\xF4\x8F\xBF\xBF");
}

}  // namespace
}  // namespace strata
