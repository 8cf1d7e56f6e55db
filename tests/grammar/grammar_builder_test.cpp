// GrammarBuilder::text_until, the XML tool-call format's raw values: free UTF-8 text ended by
// the first terminator, none of the forbidden strings inside, checked against a plain reference
// (find) on hand-picked and generated texts.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "grammar/grammar.h"
#include "grammar/matcher.h"

namespace strata::grammar {
namespace {

const std::string kEnd = "\n</parameter>";
const std::vector<std::string> kForbidden = {"</parameter>", "</tool_call>"};

Grammar text_grammar() {
  GrammarBuilder builder;
  const uint32_t text = builder.text_until("text", kEnd, kForbidden);
  Grammar grammar = builder.finish(text);
  EXPECT_EQ(grammar.find_left_recursion(), -1);
  return grammar;
}

bool matches(const Grammar& grammar, std::string_view text) {
  Matcher matcher(grammar);
  return matcher.accept(text) && matcher.accepting();
}

// The specification: `body` (valid UTF-8 without other controls than \t \n \r) + kEnd matches
// exactly when neither kEnd nor a forbidden string occurs in body + kEnd before its end.
bool reference(const std::string& body) {
  const std::string text = body + kEnd;
  if (text.find(kEnd) != body.size()) return false;
  for (const std::string& forbidden : kForbidden) {
    const size_t at = text.find(forbidden);
    if (at != std::string::npos && at + forbidden.size() != text.size())
      return false;  // only as the terminator's tail
  }
  return true;
}

TEST(GrammarTextUntil, AcceptsTextUpToTheFirstTerminator) {
  const Grammar grammar = text_grammar();
  for (const std::string body :
       {"", "Paris", "two\nlines", "\n", "\n\n", "ends with a newline\n", "tab\there",
        "é 日本 🙂", "</paramete", "<parameter=x>", "\n</paramete r>", "</function>",
        "a < b && c > d", "\n<", "\n</", "</tool_cal"}) {
    EXPECT_TRUE(reference(body)) << body;
    EXPECT_TRUE(matches(grammar, body + kEnd)) << body;
    // Nothing may follow the terminator, and the text alone is not finished.
    EXPECT_FALSE(matches(grammar, body + kEnd + "x")) << body;
    EXPECT_FALSE(matches(grammar, body)) << body;
  }
}

TEST(GrammarTextUntil, RefusesForbiddenStringsControlsAndBrokenUtf8) {
  const Grammar grammar = text_grammar();
  for (const std::string& body : std::vector<std::string>{
           "a</parameter>b", "</parameter>", "x</tool_call>", "\x01", std::string("nul\0x", 5),
           "\x7f", "\xC3", "\xC3(", "\xED\xA0\x80", "\xF5\x80\x80\x80", "\xC0\xAF"}) {
    EXPECT_FALSE(matches(grammar, body + kEnd)) << body;
  }
  // The terminator ends the text: more text and a second terminator do not match.
  EXPECT_FALSE(matches(grammar, "a" + kEnd + "b" + kEnd));
}

TEST(GrammarTextUntil, AgreesWithTheReferenceOnGeneratedTexts) {
  const Grammar grammar = text_grammar();
  // Texts of pieces of the strings, so near misses and hits are both frequent.
  const std::vector<std::string> pieces = {
      "\n", "</", "parameter", ">", "</parameter>", "</tool_call>", "tool_call",
      "<",  "x",  "\n</param", "é", "\n<"};
  std::mt19937 rng(17);
  int matched = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string body;
    const int length = int(rng() % 7);
    for (int k = 0; k < length; ++k) body += pieces[rng() % pieces.size()];
    const bool expected = reference(body);
    matched += expected;
    ASSERT_EQ(matches(grammar, body + kEnd), expected) << testing::PrintToString(body);
  }
  EXPECT_GT(matched, 100);  // both outcomes are exercised
  EXPECT_LT(matched, 3900);
}

TEST(GrammarTextUntil, RunsInConstantStackDepth) {
  const Grammar grammar = text_grammar();
  Matcher matcher(grammar);
  size_t widest = 0;
  for (int i = 0; i < 20000; ++i) {
    ASSERT_TRUE(matcher.accept(i % 100 == 99 ? "\n" : "x"));
    widest = std::max(widest, matcher.state().size());
  }
  EXPECT_LT(widest, 16u);  // one short stack, however long the text
  EXPECT_TRUE(matcher.accept(kEnd));
  EXPECT_TRUE(matcher.accepting());
  EXPECT_FALSE(matcher.can_continue());
}

}  // namespace
}  // namespace strata::grammar
