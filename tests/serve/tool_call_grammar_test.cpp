// The forced tool calls' grammar (serve/tool_call_grammar.h) in both formats: it accepts the
// calls the templates render (text/tool_format.h render_tool_calls) for every parameter type,
// what ToolCallParser then reads back as the same arguments; it rejects broken calls, unknown
// names, missing required parameters, wrong types and extra calls; schemas it cannot honour are
// refused with the keyword's path.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/matcher.h"
#include "serve/tool_call_grammar.h"
#include "serve/tool_calls.h"
#include "text/chat_template.h"

namespace strata::serve {
namespace {

using ojson = nlohmann::ordered_json;

// Every parameter type; `days` and `city` required.
const std::string kWeather = R"({"type": "function", "function": {"name": "get_weather",
  "strict": true, "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "description": "a city"},
    "days": {"type": "integer"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "metric": {"type": "boolean"},
    "ratio": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
    "limit": {"type": ["integer", "null"]}},
  "required": ["city", "days"], "additionalProperties": false}}})";
const std::string kPing = R"({"type": "function", "function": {"name": "ping"}})";

std::shared_ptr<const grammar::Grammar> compile(ToolCallFormat format,
                                                const std::vector<std::string>& tools,
                                                std::optional<std::string_view> forced,
                                                bool parallel) {
  auto result = compile_tool_call_grammar(format, tools, forced, parallel);
  if (const ApiError* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << error->param << ": " << error->message;
    return nullptr;
  }
  return std::get<std::shared_ptr<const grammar::Grammar>>(result);
}

// Whether the grammar takes `rendered` (the template's text from <tool_call>) after `prefix`.
bool takes(const grammar::Grammar& grammar, const std::string& rendered,
           const std::string& prefix) {
  if (rendered.rfind(prefix, 0) != 0) return false;
  grammar::Matcher matcher(grammar);
  return matcher.accept(std::string_view(rendered).substr(prefix.size())) && matcher.accepting();
}

const std::vector<ChatToolCall> kCalls = {
    {"get_weather", R"({"city": "Paris", "days": 3})"},
    {"get_weather",
     R"({"city": "New\nYork </b> é", "days": -12, "unit": "celsius", "metric": true,)"
     R"( "ratio": 0.25, "tags": ["a", "b c"], "where": {"lat": 48.85}, "limit": null})"},
    {"get_weather", R"({"city": "", "days": 0, "limit": 7})"},
    {"ping", "{}"},
};

class ToolCallGrammarBoth : public testing::TestWithParam<ToolCallFormat> {};

TEST_P(ToolCallGrammarBoth, AcceptsTheTemplatesCallsAndTheParserReadsThemBack) {
  const ToolCallFormat format = GetParam();
  const auto grammar = compile(format, {kWeather, kPing}, std::nullopt, false);
  ASSERT_TRUE(grammar);
  const std::string prefix = tool_call_prefix(format, std::nullopt);
  for (const ChatToolCall& call : kCalls) {
    const std::string rendered = render_tool_calls(format, std::span(&call, 1), "");
    EXPECT_TRUE(takes(*grammar, rendered, prefix)) << rendered;
    // What the grammar lets through is a call to the parser, with these arguments.
    ToolCallParser parser(format, std::vector<std::string>{kWeather, kPing}, prefix);
    std::vector<ReplyPart> reply;
    join_pieces(reply, parser.push(rendered.substr(prefix.size())));
    join_pieces(reply, parser.finish());
    ASSERT_EQ(reply.size(), 1u) << rendered;
    ASSERT_TRUE(reply[0].call) << rendered;
    EXPECT_EQ(reply[0].call->name, call.name);
    EXPECT_EQ(ojson::parse(reply[0].call->arguments), ojson::parse(call.arguments));
  }
}

TEST_P(ToolCallGrammarBoth, RejectsBrokenCalls) {
  const ToolCallFormat format = GetParam();
  const auto grammar = compile(format, {kWeather, kPing}, std::nullopt, false);
  ASSERT_TRUE(grammar);
  const std::string prefix = tool_call_prefix(format, std::nullopt);
  auto rendered = [&](const std::string& name, const std::string& arguments) {
    const ChatToolCall call{name, arguments};
    return render_tool_calls(format, std::span(&call, 1), "");
  };
  const std::string good = rendered("get_weather", R"({"city": "Paris", "days": 3})");
  ASSERT_TRUE(takes(*grammar, good, prefix));
  EXPECT_FALSE(takes(*grammar, rendered("get_time", R"({"city": "Paris", "days": 3})"), prefix));
  EXPECT_FALSE(takes(*grammar, rendered("get_weather", R"({"city": "Paris"})"), prefix));
  EXPECT_FALSE(takes(*grammar, rendered("get_weather", R"({"days": 3})"), prefix));
  EXPECT_FALSE(
      takes(*grammar, rendered("get_weather", R"({"city": "Paris", "days": "three"})"), prefix));
  EXPECT_FALSE(
      takes(*grammar, rendered("get_weather", R"({"city": "Paris", "days": 3.5})"), prefix));
  EXPECT_FALSE(takes(
      *grammar, rendered("get_weather", R"({"city": "P", "days": 3, "unit": "kelvin"})"), prefix));
  EXPECT_FALSE(
      takes(*grammar, rendered("get_weather", R"({"city": "P", "days": 3, "metric": 1})"), prefix));
  EXPECT_FALSE(
      takes(*grammar, rendered("get_weather", R"({"city": "P", "days": 3, "tags": "a"})"), prefix));
  EXPECT_FALSE(
      takes(*grammar, rendered("get_weather", R"({"city": "P", "days": 3, "where": {}})"), prefix));
  EXPECT_FALSE(
      takes(*grammar, rendered("get_weather", R"({"city": "P", "days": 3, "other": 1})"), prefix));
  // Properties in another order than the schema's are outside the grammar (its subset).
  EXPECT_FALSE(takes(*grammar, rendered("get_weather", R"({"days": 3, "city": "Paris"})"), prefix));
  // Cut short, text after the call, a second call without parallel_tool_calls.
  EXPECT_FALSE(takes(*grammar, good.substr(0, good.size() - 1), prefix));
  EXPECT_FALSE(takes(*grammar, good + "\nDone.", prefix));
  EXPECT_FALSE(takes(*grammar, good + "\n" + good, prefix));
  if (format == ToolCallFormat::Xml) {
    // A raw string that holds what the parser would take for its end.
    EXPECT_FALSE(takes(
        *grammar, rendered("get_weather", R"({"city": "a</parameter>b", "days": 3})"), prefix));
    EXPECT_FALSE(takes(*grammar, rendered("get_weather", R"({"city": "a</tool_call>", "days": 3})"),
                       prefix));
  } else {
    EXPECT_FALSE(takes(*grammar, "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", prefix));
  }
}

TEST_P(ToolCallGrammarBoth, ParallelCallsAndTheEndOfTheTurn) {
  const ToolCallFormat format = GetParam();
  const std::string prefix = tool_call_prefix(format, std::nullopt);
  const std::string two = render_tool_calls(format, std::span(kCalls).subspan(2, 2), "");
  const std::string one = render_tool_calls(format, std::span(kCalls).subspan(0, 1), "");
  const auto single = compile(format, {kWeather, kPing}, std::nullopt, false);
  const auto parallel = compile(format, {kWeather, kPing}, std::nullopt, true);
  ASSERT_TRUE(single && parallel);
  EXPECT_FALSE(takes(*single, two, prefix));
  EXPECT_TRUE(takes(*parallel, two, prefix));
  EXPECT_TRUE(takes(*parallel, one, prefix));
  // After a call: the end without parallel calls; with them, the end or another call.
  grammar::Matcher matcher(*single);
  ASSERT_TRUE(matcher.accept(std::string_view(one).substr(prefix.size())));
  EXPECT_TRUE(matcher.accepting());
  EXPECT_FALSE(matcher.can_continue());
  grammar::Matcher more(*parallel);
  ASSERT_TRUE(more.accept(std::string_view(one).substr(prefix.size())));
  EXPECT_TRUE(more.accepting());
  EXPECT_TRUE(more.can_continue());
}

TEST_P(ToolCallGrammarBoth, ANamedFunctionContinuesItsPrefixAndOnlyIt) {
  const ToolCallFormat format = GetParam();
  const auto grammar = compile(format, {kWeather, kPing}, "get_weather", true);
  ASSERT_TRUE(grammar);
  const std::string prefix = tool_call_prefix(format, "get_weather");
  const std::string weather = render_tool_calls(format, std::span(kCalls).subspan(1, 1), "");
  const std::string ping = render_tool_calls(format, std::span(kCalls).subspan(3, 1), "");
  EXPECT_TRUE(takes(*grammar, weather, prefix));
  EXPECT_TRUE(takes(*grammar, weather + "\n" + weather, prefix));
  EXPECT_FALSE(takes(*grammar, weather + "\n" + ping, prefix));
  EXPECT_FALSE(takes(*grammar, ping, tool_call_prefix(format, "ping")));
}

// tool_choice "auto": the grammar starts right after the "<tool_call>" the model wrote, so it
// leads with the "\n" the forced prefix holds, then the same calls.
TEST_P(ToolCallGrammarBoth, TheAutoGrammarLeadsWithTheNewlineAfterTheOpenTag) {
  const ToolCallFormat format = GetParam();
  auto result = compile_tool_call_grammar(format, std::vector<std::string>{kWeather, kPing},
                                          std::nullopt, true, "\n");
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const grammar::Grammar>>(result));
  const auto& lazy = *std::get<std::shared_ptr<const grammar::Grammar>>(result);
  const auto forced = compile(format, {kWeather, kPing}, std::nullopt, true);
  ASSERT_TRUE(forced);
  const std::string one = render_tool_calls(format, std::span(kCalls).subspan(1, 1), "");
  const std::string two = render_tool_calls(format, std::span(kCalls).subspan(2, 2), "");
  for (const std::string& calls : {one, two}) {
    EXPECT_TRUE(takes(lazy, calls, std::string(kToolCallOpen))) << calls;
    EXPECT_FALSE(takes(*forced, calls, std::string(kToolCallOpen))) << calls;  // needs the "\n"
    EXPECT_FALSE(takes(lazy, calls, tool_call_prefix(format, std::nullopt))) << calls;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ToolCallGrammarBoth,
                         testing::Values(ToolCallFormat::Hermes, ToolCallFormat::Xml),
                         [](const auto& info) {
                           return info.param == ToolCallFormat::Hermes ? "Hermes" : "Xml";
                         });

// The 400's param for `parameters` in `format` ("" when it compiles).
std::string refusal(ToolCallFormat format, const std::string& parameters) {
  const std::string tool =
      R"({"type": "function", "function": {"name": "f", "parameters": )" + parameters + "}}";
  auto result =
      compile_tool_call_grammar(format, std::vector<std::string>{kPing, tool}, std::nullopt, false);
  const ApiError* error = std::get_if<ApiError>(&result);
  if (!error) return "";
  EXPECT_EQ(error->status, 400);
  EXPECT_NE(error->message.find(error->param), std::string::npos) << error->message;
  return error->param;
}

TEST(ToolCallGrammar, RefusesWhatItCannotHonourNamingTheField) {
  for (const ToolCallFormat format : {ToolCallFormat::Hermes, ToolCallFormat::Xml}) {
    EXPECT_EQ(refusal(format, R"({"type": "object", "properties": {"a": {"type": "string",)"
                              R"j( "pattern": "^(?=x)"}}})j"),
              "tools[1].function.parameters.properties.a.pattern");
    EXPECT_EQ(refusal(format, R"({"type": "object", "properties": {"n": {"type": "number",)"
                              R"( "minimum": 0}}})"),
              "tools[1].function.parameters.properties.n.minimum");
    // An integer's bounds are honoured (grammar/json_schema.h).
    EXPECT_EQ(refusal(format, R"({"type": "object", "properties": {"n": {"type": "integer",)"
                              R"( "minimum": 0, "maximum": 9}}})"),
              "");
    EXPECT_EQ(refusal(format, R"({"type": "array"})"), "tools[1].function.parameters.type");
    EXPECT_EQ(refusal(format, R"({"anyOf": [{"type": "object"}]})"),
              "tools[1].function.parameters");
    EXPECT_EQ(refusal(format, R"({"type": "object", "properties": {"a": {"type": "string"}}})"),
              "");
    EXPECT_EQ(refusal(format, "{}"), "");
  }
  // Raw text in the XML format: no length bounds, no untyped constraints, declared names only.
  const ToolCallFormat xml = ToolCallFormat::Xml;
  EXPECT_EQ(refusal(xml, R"({"type": "object", "properties": {"a": {"type": "string",)"
                         R"( "maxLength": 4}}})"),
            "tools[1].function.parameters.properties.a.maxLength");
  EXPECT_EQ(refusal(xml, R"({"type": "object", "properties": {"a": {"enum": [1, 2]}}})"),
            "tools[1].function.parameters.properties.a.enum[0]");
  EXPECT_EQ(
      refusal(xml, R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"}]}}})"),
      "tools[1].function.parameters.properties.a.anyOf");
  EXPECT_EQ(refusal(xml, R"({"type": "object", "properties": {}, "required": ["a"]})"),
            "tools[1].function.parameters.required[0]");
  EXPECT_EQ(refusal(xml, R"({"type": "object", "properties": {"a>b": {"type": "integer"}}})"),
            "tools[1].function.parameters.properties.a>b");
  EXPECT_EQ(refusal(xml, R"({"type": "object", "properties": {"a": {"enum": ["x", "y"]}}})"), "");
  EXPECT_EQ(refusal(xml, R"({"type": "object", "properties": {"a": {"type": "string",)"
                         R"( "pattern": "^x"}}})"),
            "tools[1].function.parameters.properties.a.pattern");
  // The Hermes arguments are JSON: the compiler's string bounds and patterns apply.
  EXPECT_EQ(
      refusal(ToolCallFormat::Hermes,
              R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}}})"),
      "");
  EXPECT_EQ(
      refusal(ToolCallFormat::Hermes,
              R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}})"),
      "");
}

}  // namespace
}  // namespace strata::serve
