// The token mask against a brute-force reference on the default model's vocabulary: at states
// inside and between JSON values, a token is allowed iff running its bytes through a fresh copy
// of the matcher succeeds; stop tokens iff the value is complete.
#include <gtest/gtest.h>

#include <string>

#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace strata::grammar {
namespace {

const Tokenizer& default_tokenizer() {
  static const Tokenizer tokenizer = [] {
    auto file = GgufFile::open(STRATA_DEFAULT_MODEL);
    return Tokenizer::from_gguf(*file);
  }();
  return tokenizer;
}

bool bit(const std::vector<uint64_t>& bits, size_t id) {
  return (bits[id >> 6] >> (id & 63)) & 1;
}

// Feeds `prefix` byte by byte through tokens of one byte each... the constraint only takes
// tokens, so the prefix is encoded with the tokenizer and must be accepted token by token.
void check_against_reference(const Grammar& grammar, const TokenVocabulary& vocabulary,
                             const std::string& prefix) {
  GrammarConstraint constraint(grammar, vocabulary);
  const Tokenizer& tokenizer = default_tokenizer();
  for (int32_t id : tokenizer.encode(prefix, {.parse_special = false})) {
    ASSERT_TRUE(bit(constraint.allowed(), size_t(id))) << prefix << ": token " << id;
    constraint.accept(id);
    ASSERT_TRUE(constraint.valid());
  }
  const std::vector<uint64_t> bits = constraint.allowed();
  Matcher reference(grammar);
  ASSERT_TRUE(reference.accept(prefix));
  const MatcherState at = reference.state();
  size_t n_allowed = 0;
  for (size_t id = 0; id < vocabulary.n_vocab(); ++id) {
    bool expected;
    if (vocabulary.is_stop(int32_t(id))) {
      expected = reference.accepting(at);
    } else if (!vocabulary.has_bytes(int32_t(id))) {
      expected = false;
    } else {
      reference.set_state(at);
      expected = reference.accept(vocabulary.bytes(int32_t(id)));
    }
    ASSERT_EQ(bit(bits, id), expected)
        << "after " << prefix << ": token " << id << " " << tokenizer.token_text(int32_t(id));
    n_allowed += expected;
  }
  EXPECT_GT(n_allowed, 0u) << prefix;
}

TEST(TokenMask, MatchesBruteForceOnTheDefaultVocabulary) {
  const Tokenizer& tokenizer = default_tokenizer();
  std::vector<int32_t> stops;
  if (tokenizer.eos_id()) stops.push_back(*tokenizer.eos_id());
  if (auto end = tokenizer.find_token("<|im_end|>")) stops.push_back(*end);
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, stops, size_t(tokenizer.n_tokens()) + 7);
  const Grammar grammar = compile_json_schema(nlohmann::ordered_json::parse(R"({
    "type": "object", "properties": {
      "name": {"type": "string", "maxLength": 8},
      "kind": {"enum": ["cat", "dog"]},
      "n": {"type": "number"}},
    "required": ["name", "kind"], "additionalProperties": false})"));
  for (const char* prefix :
       {"", "{", "{\"na", "{\"name\":\"ab", "{\"name\":\"caf\xC3\xA9",
        "{\"name\":\"x\",\"kind\":\"", "{\"name\":\"x\",\"kind\":\"dog\"",
        "{\"name\":\"x\",\"kind\":\"dog\",\"n\":-1.5", "{\"name\":\"x\",\"kind\":\"dog\"}"})
    check_against_reference(grammar, vocabulary, prefix);
}

TEST(TokenMask, StopsOnlyWhenCompleteAndMasksLogits) {
  const Tokenizer& tokenizer = default_tokenizer();
  ASSERT_TRUE(tokenizer.eos_id());
  const int32_t eos = *tokenizer.eos_id();
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, {eos}, size_t(tokenizer.n_tokens()));
  const Grammar grammar =
      compile_json_schema(nlohmann::ordered_json::parse(R"({"type": "integer"})"));
  GrammarConstraint constraint(grammar, vocabulary);
  EXPECT_FALSE(bit(constraint.allowed(), size_t(eos)));
  std::vector<float> logits(vocabulary.n_vocab(), 1.0f);
  constraint.mask(logits);
  const int32_t seven = tokenizer.encode("7")[0];
  const int32_t letter = tokenizer.encode("a")[0];
  EXPECT_EQ(logits[size_t(seven)], 1.0f);
  EXPECT_EQ(logits[size_t(letter)], -std::numeric_limits<float>::infinity());
  constraint.accept(seven);
  EXPECT_TRUE(constraint.complete());
  EXPECT_FALSE(constraint.finished());  // more digits may follow
  EXPECT_TRUE(bit(constraint.allowed(), size_t(eos)));
  constraint.accept(eos);
  EXPECT_TRUE(constraint.finished());
  EXPECT_TRUE(constraint.valid());
}

TEST(TokenMask, CachesMasksOfRecurringStates) {
  const Tokenizer& tokenizer = default_tokenizer();
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, {}, size_t(tokenizer.n_tokens()));
  const Grammar grammar = json_object_grammar();
  GrammarConstraint constraint(grammar, vocabulary);
  for (int32_t id :
       tokenizer.encode("{\"key\":\"some words in a string value", {.parse_special = false})) {
    ASSERT_TRUE(bit(constraint.allowed(), size_t(id)));
    constraint.accept(id);
  }
  // Inside the string every word boundary is the same state: most masks come from the cache.
  EXPECT_GE(constraint.stats().cache_hits, 4u);
  EXPECT_TRUE(constraint.valid());
}

// SharedMasks: a second constraint of the same grammar (a request that sends the schema again)
// takes the masks the first one computed, and they are the masks it would compute itself.
TEST(TokenMask, SharedMasksGiveALaterConstraintTheSameMasksWithoutWalking) {
  const Tokenizer& tokenizer = default_tokenizer();
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, {}, size_t(tokenizer.n_tokens()));
  const Grammar grammar = json_object_grammar();
  const std::vector<int32_t> reply =
      tokenizer.encode("{\"key\":\"some words\", \"n\": [1, 2]}", {.parse_special = false});
  // The reply through a constraint on the shared masks and a fresh one, the same mask at every step.
  auto walk = [&](GrammarConstraint& with_shared, GrammarConstraint& fresh) {
    for (int32_t id : reply) {
      ASSERT_EQ(with_shared.allowed(), fresh.allowed());
      with_shared.accept(id);
      fresh.accept(id);
    }
  };
  SharedMasks shared(256);
  GrammarConstraint first(grammar, vocabulary, std::nullopt, &shared);
  GrammarConstraint alone(grammar, vocabulary);
  ASSERT_NO_FATAL_FAILURE(walk(first, alone));
  EXPECT_EQ(first.stats().shared_hits, 0u);
  const size_t kept = shared.size();
  EXPECT_GT(kept, 4u);
  GrammarConstraint second(grammar, vocabulary, std::nullopt, &shared);
  GrammarConstraint fresh(grammar, vocabulary);
  ASSERT_NO_FATAL_FAILURE(walk(second, fresh));
  EXPECT_EQ(second.stats().shared_hits, kept);  // every state the reply visits: no walk
  EXPECT_LT(second.stats().matcher_steps, fresh.stats().matcher_steps);
  EXPECT_EQ(shared.hits(), kept);
  // The bound: a table of 2 keeps the first two masks only.
  SharedMasks small(2);
  GrammarConstraint bounded(grammar, vocabulary, std::nullopt, &small);
  for (int32_t id : reply) {
    bounded.allowed();
    bounded.accept(id);
  }
  EXPECT_EQ(small.size(), 2u);
}

// A vocabulary with Qwen's added tokens as llama.cpp's converter types them: <|im_end|> CONTROL,
// <tool_call> / </tool_call> USER_DEFINED. Under a grammar that spells "</tool_call>", the
// user-defined token is allowed as its text (the model's own token for it); the control token
// only as a stop id.
TEST(TokenMask, UserDefinedTokensCountAsTheirTextControlTokensDoNot) {
  TokenizerSpec spec;
  // All 256 bytes as byte-level BPE spells them (GPT-2's table: printable bytes stand for
  // themselves, the rest take code points from U+0100 on), as Qwen's vocabulary has them.
  char32_t shifted = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    std::string text;
    append_utf8(text, printable ? char32_t(b) : shifted++);
    spec.tokens.push_back(text);
  }
  const int32_t im_end = int32_t(spec.tokens.size());
  spec.tokens.push_back("<|im_end|>");
  const int32_t open = int32_t(spec.tokens.size());
  spec.tokens.push_back("<tool_call>");
  const int32_t close = int32_t(spec.tokens.size());
  spec.tokens.push_back("</tool_call>");
  spec.token_types.assign(spec.tokens.size(), int32_t(TokenType::Normal));
  spec.token_types[size_t(im_end)] = int32_t(TokenType::Control);
  spec.token_types[size_t(open)] = int32_t(TokenType::UserDefined);
  spec.token_types[size_t(close)] = int32_t(TokenType::UserDefined);
  const Tokenizer tokenizer(spec);
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, {im_end}, size_t(tokenizer.n_tokens()));
  EXPECT_EQ(vocabulary.bytes(close), "</tool_call>");
  EXPECT_EQ(vocabulary.bytes(open), "<tool_call>");
  EXPECT_FALSE(vocabulary.has_bytes(im_end));

  GrammarBuilder builder;
  const uint32_t root = builder.add("root", {{GrammarBuilder::literal("x</tool_call>")}});
  const Grammar grammar = builder.finish(root);
  GrammarConstraint constraint(grammar, vocabulary);
  constraint.accept(tokenizer.find_token("x").value());
  EXPECT_TRUE(bit(constraint.allowed(), size_t(close)));    // the whole closing tag in one token
  EXPECT_FALSE(bit(constraint.allowed(), size_t(open)));    // not what the grammar spells
  EXPECT_FALSE(bit(constraint.allowed(), size_t(im_end)));  // not complete yet
  constraint.accept(close);
  EXPECT_TRUE(bit(constraint.allowed(), size_t(im_end)));  // complete: the stop may come
}

}  // namespace
}  // namespace strata::grammar
