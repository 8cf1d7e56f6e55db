// The tokenizer against Hugging Face `tokenizers` 0.23.2: a byte-level BPE trained with the Qwen2
// pipeline by tools/make_tokenizer_fixtures.py (vocab 3000 + 7 added tokens). Every fixture string
// must encode to exactly the reference ids, for the qwen2 and the qwen35 split; decode must match
// the reference decoder (including U+FFFD for ill-formed bytes) and round-trip.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <thread>

#include "text/tokenizer.h"
#include "text/unicode.h"
#include "text/utf8.h"
#include "text_fixtures.h"

namespace strata {
namespace {

const Tokenizer& qwen2_tokenizer() {
  static const Tokenizer tokenizer(test::fixture_spec(PreTokenizerKind::Qwen2));
  return tokenizer;
}
const Tokenizer& qwen35_tokenizer() {
  static const Tokenizer tokenizer(test::fixture_spec(PreTokenizerKind::Qwen35));
  return tokenizer;
}
const nlohmann::json& encode_cases() {
  static const nlohmann::json cases = test::load_json("encode_cases.json").at("cases");
  return cases;
}

std::string describe(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += fmt::format("{}[{}] ", id, test::escaped(tok.token_text(id)));
  return out;
}

void expect_fixture_ids(const Tokenizer& tok, const char* key) {
  int mismatches = 0, total = 0;
  for (const auto& c : encode_cases()) {
    const std::string text = c.at("text").get<std::string>();
    const auto expected = c.at(key).get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    ++total;
    if (got != expected) {
      ++mismatches;
      ADD_FAILURE() << key << " mismatch for \"" << test::escaped(text) << "\" (" << c.at("group") << ")\n"
                    << "  expected: " << describe(tok, expected) << "\n  got:      " << describe(tok, got);
    }
  }
  EXPECT_EQ(total, 597);  // as generated: 197 hard strings, 200 corpus lines, 200 random mixes
  EXPECT_EQ(mismatches, 0);
}

TEST(TokenizerFixtures, EncodeMatchesTokenizersWithQwen2Split) { expect_fixture_ids(qwen2_tokenizer(), "ids"); }

TEST(TokenizerFixtures, EncodeMatchesTokenizersWithQwen35Split) {
  expect_fixture_ids(qwen35_tokenizer(), "ids_qwen35");
}

TEST(TokenizerFixtures, NfcMatchesTokenizersNormalizer) {
  for (const auto& c : encode_cases()) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(nfc_normalize(text), c.at("nfc").get<std::string>()) << test::escaped(text);
  }
}

TEST(TokenizerFixtures, DecodeRoundTripsToNfcAndMatchesReferenceDecoder) {
  const Tokenizer& tok = qwen2_tokenizer();
  for (const auto& c : encode_cases()) {
    const std::string text = c.at("text").get<std::string>();
    const std::string decoded = tok.decode(tok.encode(text));
    EXPECT_EQ(decoded, c.at("nfc").get<std::string>()) << test::escaped(text);
    EXPECT_EQ(decoded, c.at("decoded").get<std::string>()) << test::escaped(text);
  }
}

TEST(TokenizerFixtures, DecodeOfArbitraryIdsMatchesReferenceDecoder) {
  const Tokenizer& tok = qwen2_tokenizer();
  const nlohmann::json cases = test::load_json("decode_cases.json").at("cases");
  ASSERT_GT(cases.size(), 300u);
  int with_replacement = 0;
  for (const auto& c : cases) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    const std::string expected = c.at("text").get<std::string>();
    EXPECT_EQ(tok.decode(ids), expected) << describe(tok, ids);
    if (expected.find(kReplacementUtf8) != std::string::npos) ++with_replacement;
  }
  EXPECT_GT(with_replacement, 100);  // the fixture does exercise ill-formed byte sequences
}

TEST(TokenizerFixtures, StreamingDecoderEmitsWholeCharactersAndEqualsDecode) {
  const Tokenizer& tok = qwen2_tokenizer();
  const nlohmann::json decode_cases = test::load_json("decode_cases.json").at("cases");
  std::vector<std::vector<int32_t>> sequences;
  for (const auto& c : encode_cases()) sequences.push_back(tok.encode(c.at("text").get<std::string>()));
  for (const auto& c : decode_cases) sequences.push_back(c.at("ids").get<std::vector<int32_t>>());
  int held_back = 0;
  for (const auto& ids : sequences) {
    StreamingDecoder stream(tok);
    std::string text;
    for (int32_t id : ids) {
      const std::string piece = stream.push(id);
      ASSERT_TRUE(utf8_is_valid(piece));
      if (stream.pending_bytes() > 0) ++held_back;
      text += piece;
    }
    text += stream.finish();
    ASSERT_EQ(text, tok.decode(ids)) << describe(tok, ids);
  }
  EXPECT_GT(held_back, 50);  // characters split across tokens did occur
}

// Random valid UTF-8, including 4-byte characters, combining marks and added-token texts.
std::string random_text(std::mt19937& rng) {
  static const std::pair<char32_t, char32_t> ranges[] = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0x24F}, {0x300, 0x36F}, {0x391, 0x3C9}, {0x400, 0x4FF},
      {0x590, 0x5FF}, {0x600, 0x6FF}, {0x900, 0x97F}, {0xE00, 0xE7F}, {0x1100, 0x11FF}, {0x2000, 0x206F},
      {0x3000, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xFF00, 0xFFEF}, {0x1F300, 0x1FAFF},
      {0x20000, 0x2A6DF}, {0xE0000, 0xE007F}, {0x10000, 0x10FFFD}};
  static const char* added[] = {"<|im_start|>", "<|im_end|>", "<think>", "</tool_call>", "<|endoftext|>"};
  std::string text;
  const int n = static_cast<int>(rng() % 40);
  for (int i = 0; i < n; ++i) {
    if (rng() % 50 == 0) {
      text += added[rng() % std::size(added)];
      continue;
    }
    const auto& [lo, hi] = ranges[rng() % std::size(ranges)];
    char32_t cp = lo + static_cast<char32_t>(rng() % (hi - lo + 1));
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    append_utf8(text, cp);
  }
  return text;
}

TEST(TokenizerProperty, RandomUtf8DecodesBackToItsNfc) {
  std::mt19937 rng(20240613);
  for (const Tokenizer* tok : {&qwen2_tokenizer(), &qwen35_tokenizer()}) {
    for (int trial = 0; trial < 3000; ++trial) {
      const std::string text = random_text(rng);
      ASSERT_EQ(tok->decode(tok->encode(text)), nfc_normalize(text)) << test::escaped(text);
    }
  }
}

TEST(TokenizerProperty, IllFormedInputIsRepairedBeforeEncoding) {
  const Tokenizer& tok = qwen2_tokenizer();
  const std::string bad = "ok\xC3(\xF0\x9F\x98";
  EXPECT_EQ(tok.decode(tok.encode(bad)), utf8_repair(bad));
  EXPECT_EQ(tok.encode(bad), tok.encode(utf8_repair(bad)));
}

TEST(TokenizerProperty, CacheAndThreadsDoNotChangeResults) {
  const Tokenizer fresh(test::fixture_spec());
  std::vector<std::string> texts;
  for (const auto& c : encode_cases()) texts.push_back(c.at("text").get<std::string>());
  std::vector<std::vector<int32_t>> first;
  for (const auto& t : texts) first.push_back(fresh.encode(t));  // fills the cache
  std::vector<std::thread> threads;
  std::vector<int> failures(2, 0);
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < texts.size(); ++i) {
        if (fresh.encode(texts[i]) != first[i]) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures[0] + failures[1], 0);
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(first[i], encode_cases()[i].at("ids").get<std::vector<int32_t>>());
  }
}

TEST(TokenizerFixtures, ParseSpecialFalseLeavesControlTokensAsText) {
  const Tokenizer& tok = qwen2_tokenizer();
  const int32_t im_end = *tok.find_token("<|im_end|>");
  const int32_t think = *tok.find_token("<think>");
  EXPECT_EQ(tok.token_type(im_end), TokenType::Control);
  EXPECT_EQ(tok.token_type(think), TokenType::UserDefined);
  const std::string text = "a<|im_end|><think>b";
  const auto parsed = tok.encode(text);
  const auto literal = tok.encode(text, EncodeOptions{.parse_special = false});
  EXPECT_NE(std::find(parsed.begin(), parsed.end(), im_end), parsed.end());
  EXPECT_EQ(std::find(literal.begin(), literal.end(), im_end), literal.end());
  EXPECT_NE(std::find(literal.begin(), literal.end(), think), literal.end());  // USER_DEFINED: always
  EXPECT_EQ(tok.decode(literal), text);
  EXPECT_EQ(tok.decode(parsed, DecodeOptions{.render_control = false}), "a<think>b");
}

}  // namespace
}  // namespace strata
