// The tokenizer on small hand-built vocabularies: merge order by rank, leftmost on ties, byte
// fallback to <0xXX> tokens, added-token matching (leftmost, then longest), decode of each token
// type, and the construction errors (each naming the source and the field).
#include <gtest/gtest.h>

#include "text/tokenizer.h"
#include "text/utf8.h"
#include "util/error.h"

namespace strata {
namespace {

// GPT-2's byte -> code point table, written independently of the library (anchored below).
std::string byte_char(int b) {
  int shifted = 0x100;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    const int cp = printable ? x : shifted++;
    if (x == b) {
      std::string s;
      append_utf8(s, static_cast<char32_t>(cp));
      return s;
    }
  }
  return {};
}

TEST(ByteLevelTable, KnownAnchors) {
  EXPECT_EQ(byte_char(' '), "\xC4\xA0");   // Ġ U+0120
  EXPECT_EQ(byte_char('\n'), "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(byte_char(0x00), "\xC4\x80");  // Ā U+0100
  EXPECT_EQ(byte_char(0xAD), "\xC5\x83");  // Ń U+0143
  EXPECT_EQ(byte_char('a'), "a");
}

struct Vocab {
  TokenizerSpec spec;
  int32_t add(const std::string& text, TokenType type = TokenType::Normal) {
    spec.tokens.push_back(text);
    spec.token_types.push_back(static_cast<int32_t>(type));
    return static_cast<int32_t>(spec.tokens.size() - 1);
  }
};

// All 256 byte tokens (ids 0..255 = bytes), then `extra` normal tokens.
Vocab byte_vocab(const std::vector<std::string>& extra = {}, int skip_byte = -1) {
  Vocab v;
  v.spec.source = "hand.gguf";
  for (int b = 0; b < 256; ++b) v.add(b == skip_byte ? "<unused" + std::to_string(b) + ">" : byte_char(b));
  for (const auto& t : extra) v.add(t);
  return v;
}

TEST(Tokenizer, MergesApplyInRankOrder) {
  Vocab ab_first = byte_vocab({"ab", "bc", "abc"});
  ab_first.spec.merges = {"a b", "b c", "ab c"};
  const Tokenizer t1(ab_first.spec);
  EXPECT_EQ(t1.encode("abc"), (std::vector<int32_t>{258}));  // a+b (rank 0), then ab+c

  Vocab bc_first = byte_vocab({"ab", "bc", "abc"});
  bc_first.spec.merges = {"b c", "a b", "ab c"};  // b+c first; "a bc" is no merge
  const Tokenizer t2(bc_first.spec);
  EXPECT_EQ(t2.encode("abc"), (std::vector<int32_t>{'a', 257}));
}

TEST(Tokenizer, EqualRanksMergeLeftmostFirst) {
  Vocab v = byte_vocab({"aa"});
  v.spec.merges = {"a a"};
  const Tokenizer tok(v.spec);
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(tok.encode("aaaaa"), (std::vector<int32_t>{256, 256, 'a'}));
}

TEST(Tokenizer, SpaceIsMergedThroughItsByteLevelForm) {
  Vocab v = byte_vocab({byte_char(' ') + "a"});
  v.spec.merges = {byte_char(' ') + " a"};
  const Tokenizer tok(v.spec);
  EXPECT_EQ(tok.encode("a a"), (std::vector<int32_t>{'a', 256}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'a', 256}), "a a");
}

TEST(Tokenizer, ByteFallbackUsesByteTokens) {
  // Byte 0xE4 has no byte-level token, only <0xE4> (type BYTE); "你" = E4 BD A0.
  Vocab v = byte_vocab({}, 0xE4);
  const int32_t byte_e4 = v.add("<0xE4>", TokenType::Byte);
  const Tokenizer tok(v.spec);
  const auto ids = tok.encode("\xE4\xBD\xA0");
  EXPECT_EQ(ids, (std::vector<int32_t>{byte_e4, 0xBD, 0xA0}));
  EXPECT_EQ(tok.decode(ids), "\xE4\xBD\xA0");
  EXPECT_EQ(tok.token_bytes(byte_e4), "\xE4");
}

TEST(Tokenizer, AddedTokensMatchLeftmostThenLongest) {
  Vocab v = byte_vocab();
  const int32_t ab = v.add("<ab>", TokenType::UserDefined);
  const int32_t abc = v.add("<ab>c", TokenType::UserDefined);
  const int32_t bc = v.add("b>c!", TokenType::Control);
  const Tokenizer tok(v.spec);
  // At position 0 both "<ab>" and "<ab>c" match: the longer wins; "b>c!" starts later and loses.
  EXPECT_EQ(tok.encode("<ab>c!"), (std::vector<int32_t>{abc, '!'}));
  EXPECT_EQ(tok.encode("<ab>x"), (std::vector<int32_t>{ab, 'x'}));
  EXPECT_EQ(tok.encode("xb>c!"), (std::vector<int32_t>{'x', bc}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{abc, bc}), "<ab>cb>c!");
}

TEST(Tokenizer, EmptyInputGivesNoTokens) {
  const Tokenizer tok(byte_vocab().spec);
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(tok.decode(std::vector<int32_t>{}), "");
}

TEST(Tokenizer, DecodeRejectsOutOfRangeIds) {
  const Tokenizer tok(byte_vocab().spec);
  try {
    tok.decode(std::vector<int32_t>{1, 999});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 999"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hand.gguf"), std::string::npos) << e.what();
  }
  StreamingDecoder stream(tok);
  EXPECT_THROW(stream.push(-1), Error);
}

void expect_spec_error(const TokenizerSpec& spec, const std::vector<std::string>& fragments) {
  try {
    Tokenizer tok(spec);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, ConstructionErrorsNameSourceFieldAndValue) {
  Vocab missing_result = byte_vocab();
  missing_result.spec.merges = {"a b"};
  expect_spec_error(missing_result.spec, {"hand.gguf", "tokenizer.ggml.merges[0]", "merge result", "\"ab\""});

  Vocab malformed = byte_vocab({"ab"});
  malformed.spec.merges = {"ab"};
  expect_spec_error(malformed.spec, {"hand.gguf", "merges[0]", "expected \"left right\""});

  Vocab wrong_types = byte_vocab();
  wrong_types.spec.token_types.pop_back();
  expect_spec_error(wrong_types.spec, {"hand.gguf", "token_type", "expected 256", "found 255"});

  Vocab no_byte = byte_vocab({}, 0x41);
  expect_spec_error(no_byte.spec, {"hand.gguf", "byte 0x41", "<0x41>"});

  Vocab bad_eos = byte_vocab();
  bad_eos.spec.eos_id = 256;
  expect_spec_error(bad_eos.spec, {"hand.gguf", "eos_token_id", "found 256"});

  expect_spec_error(TokenizerSpec{.source = "empty.gguf"}, {"empty.gguf", "tokenizer.ggml.tokens"});
}

TEST(Tokenizer, PreTokenizerNamesAreParsedOrRejected) {
  EXPECT_EQ(Tokenizer::parse_pre_tokenizer("qwen2", "m.gguf"), PreTokenizerKind::Qwen2);
  EXPECT_EQ(Tokenizer::parse_pre_tokenizer("qwen35", "m.gguf"), PreTokenizerKind::Qwen35);
  try {
    Tokenizer::parse_pre_tokenizer("llama-bpe", "m.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("m.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer.ggml.pre"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama-bpe"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace strata
