// Pre-tokenizer: hand-computed splits (each derived from the regex's alternatives by hand), the
// regex's own splits recorded by Hugging Face `tokenizers` (Oniguruma) in encode_cases.json, and
// coverage invariants.
#include <gtest/gtest.h>

#include <random>

#include "text/pretokenizer.h"
#include "text/unicode.h"
#include "text/utf8.h"
#include "text_fixtures.h"

namespace strata {
namespace {

std::vector<std::string> split(std::string_view text, PreTokenizerKind kind = PreTokenizerKind::Qwen2) {
  std::vector<std::string_view> pieces;
  pre_tokenize(text, kind, pieces);
  return {pieces.begin(), pieces.end()};
}

using V = std::vector<std::string>;

TEST(PreTokenizer, HandComputedQwen2Splits) {
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split("   leading"), (V{"  ", " leading"}));         // \s+(?!\S) leaves one space
  EXPECT_EQ(split("trailing   "), (V{"trailing", "   "}));        // run at the end: all of it
  EXPECT_EQ(split("a  \n  b"), (V{"a", "  \n", " ", " b"}));      // \s*[\r\n]+, then \s+(?!\S)
  EXPECT_EQ(split("year 2024!"), (V{"year", " ", "2", "0", "2", "4", "!"}));  // \p{N} one at a time
  EXPECT_EQ(split("I'M don't"), (V{"I", "'M", " don", "'t"}));   // contractions, any case
  EXPECT_EQ(split("x'LL'd"), (V{"x", "'LL", "'d"}));
  EXPECT_EQ(split("'sa"), (V{"'s", "a"}));                       // first alternative wins
  EXPECT_EQ(split(" 's"), (V{" '", "s"}));                       // ' ?[^\s\p{L}\p{N}]+
  EXPECT_EQ(split("a, b;\r\n"), (V{"a", ",", " b", ";\r\n"}));    // punctuation takes trailing CR/LF
  EXPECT_EQ(split("x\r\n\r\ny"), (V{"x", "\r\n\r\n", "y"}));
  EXPECT_EQ(split("\tfoo"), (V{"\tfoo"}));                       // any non-CR/LF prefix before letters
  EXPECT_EQ(split("\nfoo"), (V{"\n", "foo"}));
  EXPECT_EQ(split("a\xC2\xA0" "b"), (V{"a", "\xC2\xA0" "b"}));   // U+00A0 is \s and a valid prefix
  EXPECT_EQ(split("\xF0\x9F\x98\x80" "abc"), (V{"\xF0\x9F\x98\x80" "abc"}));  // emoji prefix
  EXPECT_EQ(split(""), V{});
}

TEST(PreTokenizer, LongSFoldsToSInContractions) {
  // Splits printed by tokenizers 0.23.2 (Oniguruma) on the H200 box: (?i:'s) also matches U+017F.
  EXPECT_EQ(split("'\xC5\xBF" "a"), (V{"'\xC5\xBF", "a"}));
  EXPECT_EQ(split("'\xC5\xBF" "T"), (V{"'\xC5\xBF", "T"}));
  EXPECT_EQ(split("x'\xC5\xBF\xC5\xBF"), (V{"x", "'\xC5\xBF", "\xC5\xBF"}));
  EXPECT_EQ(split("'\xE2\x84\xAA" "la"), (V{"'\xE2\x84\xAA" "la"}));  // Kelvin sign folds to k: no contraction
  EXPECT_EQ(split("'LLx"), (V{"'LL", "x"}));
}

TEST(PreTokenizer, CombiningMarksSplitWordsInQwen2ButNotQwen35) {
  // नमस्ते: न म स (letters) ् (Mn) त (letter) े (Mc)
  const std::string word = "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";
  EXPECT_EQ(split(word, PreTokenizerKind::Qwen2),
            (V{"\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8", "\xE0\xA5\x8D\xE0\xA4\xA4", "\xE0\xA5\x87"}));
  EXPECT_EQ(split(word, PreTokenizerKind::Qwen35), (V{word}));
}

TEST(PreTokenizer, MatchesRegexSplitsRecordedByTokenizers) {
  const nlohmann::json fixture = test::load_json("encode_cases.json");
  int checked = 0;
  for (const auto& c : fixture.at("cases")) {
    if (!c.contains("pieces_qwen2")) continue;
    const std::string nfc = c.at("nfc").get<std::string>();
    EXPECT_EQ(split(nfc, PreTokenizerKind::Qwen2), c.at("pieces_qwen2").get<V>())
        << "qwen2 text: " << test::escaped(nfc);
    EXPECT_EQ(split(nfc, PreTokenizerKind::Qwen35), c.at("pieces_qwen35").get<V>())
        << "qwen35 text: " << test::escaped(nfc);
    ++checked;
  }
  EXPECT_EQ(checked, 197);  // every hard string carries its pieces
}

TEST(PreTokenizer, PiecesAreNonEmptyAndCoverRandomText) {
  std::mt19937 rng(77);
  const char32_t pool[] = {U'a', U'Z', U' ', U'\n', U'\r', U'\t', U'\'', U's', U'1', U'.', U'\u00a0',
                           U'\u3000', U'\u0301', U'\u4e2d', U'\U0001F600', U'\u0663', U'!', U'\u2028'};
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) append_utf8(text, pool[rng() % std::size(pool)]);
    for (auto kind : {PreTokenizerKind::Qwen2, PreTokenizerKind::Qwen35}) {
      std::string joined;
      for (const auto& piece : split(text, kind)) {
        ASSERT_FALSE(piece.empty());
        joined += piece;
      }
      ASSERT_EQ(joined, text);
    }
  }
}

}  // namespace
}  // namespace strata
