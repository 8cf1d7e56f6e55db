// response_format parsing: the three types, llama-server's json_object + schema, and the 400s
// that name the JSON path of what is wrong (a malformed field, a schema keyword not honoured).
#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "serve/request.h"
#include "test_limits.h"

namespace strata::serve {
namespace {

RequestLimits limits() { return test_support::test_limits("m"); }

std::string chat_with(const std::string& format) {
  return R"({"messages":[{"role":"user","content":"hi"}],"response_format":)" + format + "}";
}

bool accepts(const grammar::Grammar& g, std::string_view text) {
  grammar::Matcher matcher(g);
  return matcher.accept(text) && matcher.accepting();
}

GenerationRequest parse_ok(const std::string& body, Endpoint endpoint = Endpoint::ChatCompletions) {
  ParseResult result = parse_generation_request(body, endpoint, limits());
  if (const ApiError* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << error->message;
    return {};
  }
  return std::get<GenerationRequest>(result);
}

ApiError parse_error(const std::string& body) {
  ParseResult result = parse_generation_request(body, Endpoint::ChatCompletions, limits());
  if (const ApiError* error = std::get_if<ApiError>(&result)) return *error;
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

TEST(ResponseFormat, Types) {
  EXPECT_EQ(parse_ok(chat_with(R"({"type":"text"})")).response_format.grammar, nullptr);
  const GenerationRequest object = parse_ok(chat_with(R"({"type":"json_object"})"));
  ASSERT_NE(object.response_format.grammar, nullptr);
  EXPECT_EQ(object.response_format.type, ResponseFormat::Type::JsonObject);
  EXPECT_TRUE(accepts(*object.response_format.grammar, R"({"any":[1,"thing"]})"));
  EXPECT_FALSE(accepts(*object.response_format.grammar, "[1]"));

  const GenerationRequest schema = parse_ok(
      chat_with(R"({"type":"json_schema","json_schema":{"name":"pt","strict":true,"schema":)"
                R"({"type":"object","properties":{"y":{"type":"integer"},"x":{"type":"integer"}},)"
                R"("required":["y","x"],"additionalProperties":false}}})"));
  ASSERT_NE(schema.response_format.grammar, nullptr);
  EXPECT_EQ(schema.response_format.name, "pt");
  // Properties in the order the request wrote them (not sorted).
  EXPECT_TRUE(accepts(*schema.response_format.grammar, R"({"y":1,"x":2})"));
  EXPECT_FALSE(accepts(*schema.response_format.grammar, R"({"x":2,"y":1})"));

  const GenerationRequest llama = parse_ok(
      R"({"prompt":"p","response_format":{"type":"json_object","schema":{"type":"array"}}})",
      Endpoint::Completions);
  ASSERT_NE(llama.response_format.grammar, nullptr);
  EXPECT_TRUE(accepts(*llama.response_format.grammar, "[true]"));
  EXPECT_FALSE(accepts(*llama.response_format.grammar, "{}"));
}

TEST(ResponseFormat, MalformedNamesThePath) {
  struct Case {
    std::string format, param, in_message;
  };
  const std::vector<Case> cases = {
      {R"("json")", "response_format", "expected an object"},
      {R"({})", "response_format.type", "nothing"},
      {R"({"type":"yaml"})", "response_format.type", "\"yaml\""},
      {R"({"type":"json_schema"})", "response_format.json_schema", "expected an object"},
      {R"({"type":"json_schema","json_schema":{"name":3,"schema":{}}})",
       "response_format.json_schema.name", "expected a string"},
      {R"({"type":"json_schema","json_schema":{"strict":"yes","schema":{}}})",
       "response_format.json_schema.strict", "true or false"},
      {R"j({"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"^(?=a)"}}})j",
       "response_format.json_schema.schema.pattern", "lookahead (?= at offset 1"},
      {R"({"type":"json_schema","json_schema":{"schema":{"type":"object","properties":)"
       R"({"tags":{"type":"array","items":{"type":"strin"}}}}}})",
       "response_format.json_schema.schema.properties.tags.items.type", "\"strin\""},
      {R"({"type":"json_schema","json_schema":{"schema":{"$ref":"#/$defs/nope"}}})",
       "response_format.json_schema.schema.$ref", "no location"},
      {R"({"type":"json_schema","json_schema":{"schema":false}})",
       "response_format.json_schema.schema", "accepts no value"},
      {R"({"type":"json_object","schema":{"minProperties":1}})",
       "response_format.schema.minProperties", "not supported"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.format);
    const ApiError error = parse_error(chat_with(c.format));
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, c.param);
    EXPECT_EQ(error.message.rfind(c.param + ": ", 0), 0u) << error.message;
    EXPECT_NE(error.message.find(c.in_message), std::string::npos) << error.message;
  }
}

TEST(ResponseFormat, NotOnTheMessagesApi) {
  ParseResult result = parse_anthropic_messages_request(
      R"({"max_tokens":5,"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})",
      limits());
  ASSERT_TRUE(std::holds_alternative<ApiError>(result));
  EXPECT_EQ(std::get<ApiError>(result).param, "response_format");
}

}  // namespace
}  // namespace strata::serve

namespace strata::serve {
namespace {

// The server's grammar cache (serve/grammar_cache.h): a schema sent again gets the grammar
// compiled the first time (the same object), another key order is another schema, a refused
// schema is compiled (and refused) every time, and the least recently used entry goes first.
TEST(GrammarCache, ASchemaSentAgainIsNotCompiledAgain) {
  GrammarCache cache(2);
  auto format_of = [&](const std::string& body) {
    ParseResult result =
        parse_generation_request(chat_with(body), Endpoint::ChatCompletions, limits(), &cache);
    EXPECT_TRUE(std::holds_alternative<GenerationRequest>(result)) << body;
    return std::holds_alternative<GenerationRequest>(result)
               ? std::get<GenerationRequest>(result).response_format.grammar
               : nullptr;
  };
  const std::string a =
      R"({"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":)"
      R"({"x":{"type":"integer"},"y":{"type":"string"}},"required":["x","y"]}}})";
  const std::string a_reordered =
      R"({"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":)"
      R"({"y":{"type":"string"},"x":{"type":"integer"}},"required":["x","y"]}}})";
  const auto first = format_of(a);
  const auto again = format_of(a);
  ASSERT_TRUE(first);
  EXPECT_EQ(first.get(), again.get());
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_TRUE(accepts(*again, R"({"x":1,"y":"z"})"));
  const auto reordered = format_of(a_reordered);  // properties are generated in their order
  EXPECT_NE(reordered.get(), first.get());
  EXPECT_TRUE(accepts(*reordered, R"({"y":"z","x":1})"));
  EXPECT_FALSE(accepts(*reordered, R"({"x":1,"y":"z"})"));
  // Refused schemas are not kept.
  const std::string refused =
      R"({"type":"json_object","schema":{"type":"string","pattern":"\\1"}})";
  for (int i = 0; i < 2; ++i) {
    ParseResult result =
        parse_generation_request(chat_with(refused), Endpoint::ChatCompletions, limits(), &cache);
    ASSERT_TRUE(std::holds_alternative<ApiError>(result));
    EXPECT_EQ(std::get<ApiError>(result).param, "response_format.schema.pattern");
  }
  EXPECT_EQ(cache.stats().entries, 2u);
  // LRU: `a` was used before `a_reordered`; a third schema evicts it.
  const auto plain = format_of(R"({"type":"json_object"})");
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_EQ(format_of(a_reordered).get(), reordered.get());
  EXPECT_NE(format_of(a).get(), first.get());  // compiled again
  EXPECT_EQ(cache.stats().entries, 2u);
}

}  // namespace
}  // namespace strata::serve
