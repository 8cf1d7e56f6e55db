// Lazy grammars (grammar/lazy_trigger.h, GrammarConstraint with a trigger: tool_choice "auto")
// on a Qwen vocabulary: the text module's fixture (tests/data/tokenizer, a byte-level BPE with
// Qwen's added tokens: <think>, </think>, <tool_call>, </tool_call> user-defined, <|im_end|>
// control). Before the word, the mask is checked against a brute-force reference over every
// token (the reply's text plus the token: does it open a call outside the leading think block,
// and does the grammar reject what follows the word in that token); after it, the grammar alone.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../text/text_fixtures.h"
#include "grammar/grammar.h"
#include "grammar/lazy_trigger.h"
#include "grammar/token_mask.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace strata::grammar {
namespace {

using B = GrammarBuilder;

bool bit(const std::vector<uint64_t>& bits, size_t id) {
  return (bits[id >> 6] >> (id & 63)) & 1;
}

// What a lazy tool-call grammar looks like after "<tool_call>": "\n", a small JSON call, the
// close tag.
Grammar call_grammar() {
  B builder;
  const uint32_t digits = builder.repeat("digits", {B::range('0', '9')}, 1, 3);
  const uint32_t root = builder.add(
      "root", {{B::literal("\n{\"n\": "), B::rule(digits), B::literal("}\n</tool_call>")}});
  return builder.finish(root);
}

const Tokenizer& qwen_tokenizer() {
  static const Tokenizer tokenizer(test::fixture_spec());
  return tokenizer;
}

int32_t token(const std::string& text) {
  return qwen_tokenizer().find_token(text).value();
}

// Where the answer starts in `text` (ThinkFilter's rule), or npos while in the think block.
size_t answer_start(const std::string& text, const LazyTrigger& trigger) {
  size_t block = std::string::npos;
  if (trigger.starts_in_block) {
    block = 0;
  } else {
    const size_t first = text.find_first_not_of(" \n\t\r");
    if (first != std::string::npos &&
        text.compare(first, trigger.block_open.size(), trigger.block_open) == 0)
      block = first + trigger.block_open.size();
  }
  if (block == std::string::npos) return 0;
  const size_t close = text.find(trigger.block_close, block);
  return close == std::string::npos ? std::string::npos : close + trigger.block_close.size();
}

// The reference: after `prefix` (which has not opened a call), `bytes` may come unless they open
// one and go on with bytes the grammar cannot start with.
bool allowed_by_reference(const std::string& prefix, const std::string& bytes,
                          const LazyTrigger& trigger, const Grammar& grammar) {
  const std::string text = prefix + bytes;
  const size_t start = answer_start(text, trigger);
  if (start == std::string::npos) return true;
  const size_t word = text.find(trigger.word, start);
  if (word == std::string::npos) return true;
  EXPECT_GT(word + trigger.word.size(), prefix.size()) << "the prefix opened a call already";
  Matcher matcher(grammar);
  return matcher.accept(std::string_view(text).substr(word + trigger.word.size()));
}

TEST(LazyGrammar, BeforeTheWordMasksOnlyTokensThatWouldOpenABrokenCall) {
  const Tokenizer& tokenizer = qwen_tokenizer();
  const int32_t im_end = token("<|im_end|>");
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, {im_end}, size_t(tokenizer.n_tokens()) + 5);
  const Grammar grammar = call_grammar();
  size_t banned_seen = 0;
  for (const bool starts_in_block : {false, true}) {
    const LazyTrigger trigger{.word = "<tool_call>", .starts_in_block = starts_in_block};
    for (const std::string prefix :
         {"", "Sure", "Let me check <", "I call <tool", "x <tool_c", " <th", "<think>",
          "<think>\nplan: <tool_call> then\n</think>\n\n<tool_", "\n\n<thi", "done.\n</think>\n\n",
          "done.\n</think>\n\n<tool_call", "a </think> b <tool_ca"}) {
      GrammarConstraint constraint(grammar, vocabulary, trigger);
      std::string written;
      for (int32_t id : tokenizer.encode(prefix)) {
        ASSERT_TRUE(bit(constraint.allowed(), size_t(id))) << prefix << ": token " << id;
        constraint.accept(id);
        written += vocabulary.has_bytes(id) ? vocabulary.bytes(id) : "";
      }
      ASSERT_EQ(written, prefix);
      ASSERT_FALSE(constraint.triggered()) << prefix;
      EXPECT_FALSE(constraint.finished());
      const std::vector<uint64_t> bits = constraint.allowed();
      for (size_t id = 0; id < vocabulary.n_vocab(); ++id) {
        // Tokens without bytes (control, stops, ids past the tokenizer) are free text too.
        const bool expected =
            !vocabulary.has_bytes(int32_t(id)) ||
            allowed_by_reference(prefix, vocabulary.bytes(int32_t(id)), trigger, grammar);
        ASSERT_EQ(bit(bits, id), expected)
            << "after '" << test::escaped(prefix) << "' (starts_in_block " << starts_in_block
            << "): token " << id << " '" << test::escaped(vocabulary.bytes(int32_t(id))) << "'";
        banned_seen += !expected;
      }
      // mask() sets exactly the banned ones to -inf and leaves the rest as they were.
      std::vector<float> logits(vocabulary.n_vocab(), 0.5f);
      constraint.mask(logits);
      for (size_t id = 0; id < logits.size(); ++id)
        ASSERT_EQ(logits[id] == 0.5f, bit(bits, id)) << prefix << ": token " << id;
    }
  }
  // The states where a word is half written ban the tokens that finish it and go on wrongly
  // (">." after "<tool_call"): the reference must have found some, or the check is empty.
  EXPECT_GT(banned_seen, 0u);
}

TEST(LazyGrammar, TheWordStartsTheGrammarAndTheCallEndsIt) {
  const Tokenizer& tokenizer = qwen_tokenizer();
  const int32_t im_end = token("<|im_end|>");
  const int32_t open = token("<tool_call>"), close = token("</tool_call>");
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, {im_end}, size_t(tokenizer.n_tokens()));
  const Grammar grammar = call_grammar();
  GrammarConstraint constraint(grammar, vocabulary, LazyTrigger{.word = "<tool_call>"});
  for (int32_t id : tokenizer.encode("Let me look that up.\n")) constraint.accept(id);
  EXPECT_TRUE(bit(constraint.allowed(), size_t(im_end)));  // may end without a call
  EXPECT_TRUE(bit(constraint.allowed(), size_t(open)));
  constraint.accept(open);  // Qwen's one user-defined token for the word
  ASSERT_TRUE(constraint.triggered());
  EXPECT_FALSE(constraint.complete());
  // Now the grammar alone: exactly the tokens it accepts from its start, no stop.
  const std::vector<uint64_t> bits = constraint.allowed();
  size_t n_allowed = 0;
  for (size_t id = 0; id < vocabulary.n_vocab(); ++id) {
    Matcher reference(grammar);
    const bool expected =
        vocabulary.has_bytes(int32_t(id)) && reference.accept(vocabulary.bytes(int32_t(id)));
    ASSERT_EQ(bit(bits, id), expected) << "token " << id;
    n_allowed += expected;
  }
  EXPECT_GT(n_allowed, 0u);
  for (int32_t id : tokenizer.encode("\n{\"n\": 42}\n")) {
    ASSERT_TRUE(bit(constraint.allowed(), size_t(id))) << id;
    constraint.accept(id);
  }
  EXPECT_TRUE(bit(constraint.allowed(), size_t(close)));  // the close tag as its one token
  EXPECT_FALSE(bit(constraint.allowed(), size_t(open)));
  constraint.accept(close);
  EXPECT_TRUE(constraint.complete());
  EXPECT_TRUE(constraint.finished());  // nothing can follow this grammar's call
  EXPECT_TRUE(bit(constraint.allowed(), size_t(im_end)));
  EXPECT_TRUE(constraint.valid());
}

TEST(LazyGrammar, TheWordInTheThinkBlockDoesNotFireAfterItDoes) {
  const Tokenizer& tokenizer = qwen_tokenizer();
  const int32_t im_end = token("<|im_end|>");
  const int32_t open = token("<tool_call>");
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, {im_end}, size_t(tokenizer.n_tokens()));
  const Grammar grammar = call_grammar();
  for (const bool starts_in_block : {false, true}) {
    GrammarConstraint constraint(
        grammar, vocabulary,
        LazyTrigger{.word = "<tool_call>", .starts_in_block = starts_in_block});
    const std::string thinking = starts_in_block ? "maybe <tool_call> now\n</think>\n\n"
                                                 : "\n<think>\nmaybe <tool_call> now\n</think>\n\n";
    for (int32_t id : tokenizer.encode(thinking)) constraint.accept(id);
    EXPECT_FALSE(constraint.triggered()) << starts_in_block;
    constraint.accept(open);
    EXPECT_TRUE(constraint.triggered()) << starts_in_block;
  }
  // Not at the start: a later <think> is answer text, and the word after it opens the call.
  GrammarConstraint late(grammar, vocabulary, LazyTrigger{.word = "<tool_call>"});
  for (int32_t id : tokenizer.encode("ok <think> ")) late.accept(id);
  late.accept(open);
  EXPECT_TRUE(late.triggered());
}

// The word spelled in pieces, completed inside a token that carries more bytes: those are the
// grammar's first bytes (allowed when it takes them, banned when not).
TEST(LazyGrammar, AWordEndingInsideATokenStartsTheGrammarWithTheRest) {
  TokenizerSpec spec;
  char32_t shifted = 0x100;  // GPT-2's byte table, as in token_mask_test.cpp
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    std::string text;
    append_utf8(text, printable ? char32_t(b) : shifted++);
    spec.tokens.push_back(text);
  }
  const std::string newline = spec.tokens['\n'];
  const int32_t piece = int32_t(spec.tokens.size());
  spec.tokens.push_back("<tool");
  const int32_t good = int32_t(spec.tokens.size());
  spec.tokens.push_back("_call>" + newline);
  const int32_t bad = int32_t(spec.tokens.size());
  spec.tokens.push_back("_call>x");
  const Tokenizer tokenizer(spec);
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, {}, size_t(tokenizer.n_tokens()));
  ASSERT_EQ(vocabulary.bytes(good), "_call>\n");
  const Grammar grammar = call_grammar();
  GrammarConstraint constraint(grammar, vocabulary, LazyTrigger{.word = "<tool_call>"});
  EXPECT_TRUE(bit(constraint.allowed(), size_t(bad)));  // no word yet: "_call>x" is text
  constraint.accept(piece);
  EXPECT_TRUE(bit(constraint.allowed(), size_t(good)));
  EXPECT_FALSE(bit(constraint.allowed(), size_t(bad)));
  constraint.accept(good);
  ASSERT_TRUE(constraint.triggered());
  EXPECT_TRUE(constraint.valid());
  EXPECT_TRUE(bit(constraint.allowed(), size_t('{')));  // the "\n" is already in
  EXPECT_FALSE(bit(constraint.allowed(), size_t('\n')));
}

// ignore_eos: a stop drawn before the word is free text; the grammar still starts at the word.
TEST(LazyGrammar, AStopBeforeTheWordDoesNotFinishIt) {
  const Tokenizer& tokenizer = qwen_tokenizer();
  const int32_t im_end = token("<|im_end|>");
  const TokenVocabulary vocabulary =
      TokenVocabulary::from_tokenizer(tokenizer, {im_end}, size_t(tokenizer.n_tokens()));
  const Grammar grammar = call_grammar();
  GrammarConstraint constraint(grammar, vocabulary, LazyTrigger{.word = "<tool_call>"});
  constraint.accept(im_end);
  EXPECT_FALSE(constraint.finished());
  constraint.accept(token("<tool_call>"));
  EXPECT_TRUE(constraint.triggered());
  EXPECT_FALSE(bit(constraint.allowed(), size_t(im_end)));
  EXPECT_TRUE(constraint.valid());
}

}  // namespace
}  // namespace strata::grammar
