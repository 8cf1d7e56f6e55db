// The `grammar` request field (llama-server's GBNF text): compiled on both endpoints, cached by
// its text, "" and null meaning none; 400s naming the field with the line and column of a syntax
// error, for a non-string, and together with a json response_format or offered tools; refused on
// /v1/messages; the plan renders chat without thinking and refuses logprobs with it.
#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "serve/request.h"
#include "test_limits.h"

namespace strata::serve {
namespace {

RequestLimits limits() { return test_support::test_limits("m"); }

const std::string kMessages = R"("messages":[{"role":"user","content":"hi"}])";
const std::string kYesNo = R"("root ::= (\"yes\" | \"no\") \", \" [0-9]{3}")";

bool accepts(const grammar::Grammar& g, std::string_view text) {
  grammar::Matcher matcher(g);
  return matcher.accept(text) && matcher.accepting();
}

ParseResult parse(const std::string& body, Endpoint endpoint = Endpoint::ChatCompletions,
                  GrammarCache* cache = nullptr) {
  return parse_generation_request(body, endpoint, limits(), cache);
}

ApiError error_of(const std::string& body, Endpoint endpoint = Endpoint::ChatCompletions) {
  ParseResult result = parse(body, endpoint);
  if (const ApiError* error = std::get_if<ApiError>(&result)) return *error;
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

TEST(GrammarField, CompiledOnBothEndpoints) {
  for (const auto& [endpoint, body] :
       {std::pair{Endpoint::ChatCompletions, "{" + kMessages + ",\"grammar\":" + kYesNo + "}"},
        std::pair{Endpoint::Completions, R"({"prompt":"p","grammar":)" + kYesNo + "}"}}) {
    ParseResult result = parse(body, endpoint);
    ASSERT_TRUE(std::holds_alternative<GenerationRequest>(result)) << body;
    const GenerationRequest& request = std::get<GenerationRequest>(result);
    ASSERT_NE(request.grammar, nullptr);
    EXPECT_EQ(request.response_format.grammar, nullptr);
    EXPECT_TRUE(accepts(*request.grammar, "yes, 042"));
    EXPECT_FALSE(accepts(*request.grammar, "maybe, 042"));
  }
  // "" and null are no grammar (llama-server's web page sends "").
  for (const char* none : {R"("")", "null"}) {
    ParseResult result = parse("{" + kMessages + ",\"grammar\":" + none + "}");
    ASSERT_TRUE(std::holds_alternative<GenerationRequest>(result)) << none;
    EXPECT_EQ(std::get<GenerationRequest>(result).grammar, nullptr);
  }
  // A text response_format and tool_choice "none" leave the reply free for the grammar.
  ParseResult text =
      parse("{" + kMessages + R"(,"response_format":{"type":"text"},"grammar":)" + kYesNo +
            R"(,"tools":[{"type":"function","function":{"name":"f"}}],)"
            R"("tool_choice":"none"})");
  ASSERT_TRUE(std::holds_alternative<GenerationRequest>(text));
  EXPECT_NE(std::get<GenerationRequest>(text).grammar, nullptr);
}

TEST(GrammarField, ErrorsNameTheFieldAndTheLine) {
  struct Case {
    std::string body;
    std::string in_message;
  };
  const std::vector<Case> cases = {
      {"{" + kMessages + R"(,"grammar":"root ::= \"a\"\nb ::= c"})",
       "grammar: line 2, column 7: undefined rule 'c'"},
      {"{" + kMessages + R"(,"grammar":"main ::= \"a\""})",
       "grammar: line 1, column 1: no rule named 'root'"},
      {"{" + kMessages + R"(,"grammar":"root ::= \"a"})",
       "grammar: line 1, column 10: unterminated string"},
      {"{" + kMessages + R"(,"grammar":42})", "grammar: expected GBNF text (a string), found 42"},
      {"{" + kMessages + R"(,"response_format":{"type":"json_object"},"grammar":)" + kYesNo + "}",
       "grammar: cannot be combined with a response_format of type json_object"},
      {"{" + kMessages +
           R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{}}},"grammar":)" +
           kYesNo + "}",
       "grammar: cannot be combined with a response_format of type json_schema"},
      {"{" + kMessages + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"grammar":)" +
           kYesNo + "}",
       "grammar: cannot be combined with tools"},
  };
  for (const Case& c : cases) {
    const ApiError error = error_of(c.body);
    EXPECT_EQ(error.status, 400) << c.body;
    EXPECT_EQ(error.param, "grammar") << c.body;
    EXPECT_NE(error.message.find(c.in_message), std::string::npos) << error.message;
  }
  ParseResult messages = parse_anthropic_messages_request(
      R"({"max_tokens":5,"messages":[{"role":"user","content":"hi"}],"grammar":"root ::= \"a\""})",
      limits());
  ASSERT_TRUE(std::holds_alternative<ApiError>(messages));
  EXPECT_EQ(std::get<ApiError>(messages).param, "grammar");
}

// Keyed by the text: the same grammar again is the same object; a refused one is not kept.
TEST(GrammarField, CachedByItsText) {
  GrammarCache cache(4);
  auto grammar_of = [&](const std::string& gbnf) {
    ParseResult result =
        parse("{" + kMessages + ",\"grammar\":" + gbnf + "}", Endpoint::ChatCompletions, &cache);
    return std::holds_alternative<GenerationRequest>(result)
               ? std::get<GenerationRequest>(result).grammar
               : nullptr;
  };
  const auto first = grammar_of(kYesNo);
  const auto again = grammar_of(kYesNo);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first.get(), again.get());
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(grammar_of(R"("root ::= x")"), nullptr);
  EXPECT_EQ(grammar_of(R"("root ::= x")"), nullptr);
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_EQ(cache.stats().misses, 3u);
}

}  // namespace
}  // namespace strata::serve
