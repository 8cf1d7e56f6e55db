// Anthropic's tools on /v1/messages (serve/request.h, parse_anthropic_messages_request): tools,
// tool_choice, tool_use and tool_result blocks become the chat request the OpenAI body with the
// same conversation gives (compared field by field), keys in the order sent; every malformed
// field is an ApiError naming it by the Anthropic body's own path.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve/request.h"
#include "test_limits.h"

namespace strata::serve {
namespace {

RequestLimits limits() {
  return test_support::test_limits("strata-default");
}

GenerationRequest accept_anthropic(std::string_view body) {
  ParseResult result = parse_anthropic_messages_request(body, limits());
  if (const ApiError* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << "rejected: " << error->message << "\nbody: " << body;
    return {};
  }
  return std::get<GenerationRequest>(result);
}

GenerationRequest accept_openai(std::string_view body) {
  ParseResult result = parse_generation_request(body, Endpoint::ChatCompletions, limits());
  if (const ApiError* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << "rejected: " << error->message << "\nbody: " << body;
    return {};
  }
  return std::get<GenerationRequest>(result);
}

// A /v1/messages body with `fields` after max_tokens ("messages" among them).
std::string messages_body(std::string_view fields) {
  return fmt::format(R"({{"max_tokens":8,{}}})", fields);
}

constexpr const char* kUserTurn = R"("messages":[{"role":"user","content":"Weather?"}])";

// Two tools: one with a description and a schema whose keys are not in sorted order, one bare.
constexpr const char* kAnthropicTools =
    R"("tools":[{"name":"get_weather","description":"d","input_schema":{"type":"object",)"
    R"("properties":{"z":{},"a":{}}}},{"type":"custom","name":"search","input_schema":{}}])";
constexpr const char* kOpenAiTools =
    R"("tools":[{"type":"function","function":{"name":"get_weather","description":"d",)"
    R"("parameters":{"type":"object","properties":{"z":{},"a":{}}}}},)"
    R"({"type":"function","function":{"name":"search","parameters":{}}}])";

void expect_same_messages(const GenerationRequest& a, const GenerationRequest& b) {
  ASSERT_EQ(a.messages.size(), b.messages.size());
  for (size_t i = 0; i < a.messages.size(); ++i) {
    SCOPED_TRACE(fmt::format("message {}", i));
    const ChatMessage &x = a.messages[i], &y = b.messages[i];
    EXPECT_EQ(x.role, y.role);
    EXPECT_EQ(x.content, y.content);
    EXPECT_EQ(x.reasoning_content, y.reasoning_content);
    ASSERT_EQ(x.tool_calls.size(), y.tool_calls.size());
    for (size_t k = 0; k < x.tool_calls.size(); ++k) {
      EXPECT_EQ(x.tool_calls[k].name, y.tool_calls[k].name);
      EXPECT_EQ(x.tool_calls[k].arguments, y.tool_calls[k].arguments);
    }
  }
}

TEST(AnthropicRequest, ToolsBecomeFunctionToolsWithTheirKeysInOrder) {
  const GenerationRequest anthropic =
      accept_anthropic(messages_body(fmt::format("{},{}", kUserTurn, kAnthropicTools)));
  const GenerationRequest openai = accept_openai(fmt::format("{{{},{}}}", kUserTurn, kOpenAiTools));
  ASSERT_EQ(anthropic.tools.size(), 2u);
  // What the template renders: the OpenAI text of the same tools, byte for byte.
  EXPECT_EQ(anthropic.tools, openai.tools);
  EXPECT_EQ(anthropic.tools[0],
            R"({"type":"function","function":{"name":"get_weather","description":"d",)"
            R"("parameters":{"type":"object","properties":{"z":{},"a":{}}}}})");
  EXPECT_EQ(anthropic.tool_choice, ToolChoice::Auto);
  EXPECT_TRUE(anthropic.parallel_tool_calls);
}

TEST(AnthropicRequest, ToolChoiceTakesEachOfItsTypes) {
  const struct {
    std::string choice;
    ToolChoice expected;
    std::string function;
    bool parallel;
  } cases[] = {
      {R"({"type":"auto"})", ToolChoice::Auto, "", true},
      {R"({"type":"any"})", ToolChoice::Required, "", true},
      {R"({"type":"tool","name":"search"})", ToolChoice::Function, "search", true},
      {R"({"type":"none"})", ToolChoice::None, "", true},
      {R"({"type":"any","disable_parallel_tool_use":true})", ToolChoice::Required, "", false},
      {R"({"type":"tool","name":"get_weather","disable_parallel_tool_use":false})",
       ToolChoice::Function, "get_weather", true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.choice);
    const GenerationRequest r = accept_anthropic(messages_body(
        fmt::format(R"({},{},"tool_choice":{})", kUserTurn, kAnthropicTools, c.choice)));
    EXPECT_EQ(r.tool_choice, c.expected);
    EXPECT_EQ(r.tool_choice_function, c.function);
    EXPECT_EQ(r.parallel_tool_calls, c.parallel);
    EXPECT_EQ(r.tools.size(), 2u);
  }
  // No tools: nothing offered, and "none" needs none.
  EXPECT_EQ(accept_anthropic(messages_body(kUserTurn)).tool_choice, ToolChoice::None);
  EXPECT_EQ(accept_anthropic(messages_body(fmt::format(
                                 R"({},"tools":[],"tool_choice":{{"type":"none"}})", kUserTurn)))
                .tool_choice,
            ToolChoice::None);
}

// Every block kind in one conversation, against the OpenAI body a client would send for it.
TEST(AnthropicRequest, ToolUseAndToolResultBlocksBecomeToolCallsAndToolMessages) {
  const GenerationRequest anthropic = accept_anthropic(messages_body(
      std::string(
          R"("system":"Be brief.","messages":[)"
          R"({"role":"user","content":[{"type":"text","text":"Weather"},{"type":"text","text":"?"}]},)"
          R"({"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":""},)"
          R"({"type":"text","text":"Let me look."},)"
          R"({"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"z":1,"a":[2]}},)"
          R"({"type":"tool_use","id":"toolu_2","name":"search","input":{}}]},)"
          R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"21 C"},)"
          R"({"type":"tool_result","tool_use_id":"toolu_2","is_error":true,)"
          R"("content":[{"type":"text","text":"time"},{"type":"text","text":"out"}]},)"
          R"({"type":"text","text":"Thanks"},{"type":"text","text":" again"}]},)"
          R"({"role":"assistant","content":[{"type":"tool_use","id":"toolu_3","name":"search","input":{"q":"x"}}]},)"
          R"({"role":"user","content":[{"type":"text","text":"first"},)"
          R"({"type":"tool_result","tool_use_id":"toolu_3","is_error":false},{"type":"text","text":"then"}]},)"
          R"({"role":"assistant","content":"ok"},{"role":"user","content":[]}],)") +
      kAnthropicTools));
  const GenerationRequest openai = accept_openai(
      std::string(
          R"({"messages":[{"role":"system","content":"Be brief."},)"
          R"({"role":"user","content":"Weather?"},)"
          R"({"role":"assistant","content":"Let me look.","reasoning_content":"hm","tool_calls":[)"
          R"({"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"z\":1,\"a\":[2]}"}},)"
          R"({"id":"toolu_2","type":"function","function":{"name":"search","arguments":"{}"}}]},)"
          R"({"role":"tool","tool_call_id":"toolu_1","content":"21 C"},)"
          R"({"role":"tool","tool_call_id":"toolu_2","content":"Error: timeout"},)"
          R"({"role":"user","content":"Thanks again"},)"
          R"({"role":"assistant","content":"","tool_calls":[)"
          R"({"id":"toolu_3","type":"function","function":{"name":"search","arguments":"{\"q\":\"x\"}"}}]},)"
          R"({"role":"user","content":"first"},{"role":"tool","tool_call_id":"toolu_3","content":""},)"
          R"({"role":"user","content":"then"},)"
          R"({"role":"assistant","content":"ok"},{"role":"user","content":""}],)") +
      kOpenAiTools + "}");
  ASSERT_EQ(anthropic.messages.size(), 12u);
  expect_same_messages(anthropic, openai);
  // The input's keys as sent ("z" before "a"), not sorted.
  EXPECT_EQ(anthropic.messages[2].tool_calls[0].arguments, R"({"z":1,"a":[2]})");
  EXPECT_EQ(anthropic.messages[4].content, "Error: timeout");
  EXPECT_EQ(anthropic.tools, openai.tools);
}

TEST(AnthropicRequest, EveryMalformedToolFieldIsNamed) {
  // A conversation whose assistant turn (messages[1]) called get_weather as "toolu_1"; `answer`
  // is the content of the user turn after it (messages[2]).
  auto after_call = [](std::string_view answer) {
    return messages_body(fmt::format(
        R"("messages":[{{"role":"user","content":"Weather?"}},)"
        R"({{"role":"assistant","content":[{{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{{}}}}]}},)"
        R"({{"role":"user","content":{}}}],{})",
        answer, kAnthropicTools));
  };
  // `blocks` as the content of an assistant turn (messages[1]).
  auto assistant = [](std::string_view blocks) {
    return messages_body(fmt::format(
        R"("messages":[{{"role":"user","content":"x"}},{{"role":"assistant","content":{}}}])",
        blocks));
  };
  auto with_tools = [](std::string_view tools) {
    return messages_body(fmt::format(R"({},"tools":{})", kUserTurn, tools));
  };
  auto with_choice = [](std::string_view choice) {
    return messages_body(
        fmt::format(R"({},{},"tool_choice":{})", kUserTurn, kAnthropicTools, choice));
  };
  const struct {
    std::string body, param, in_message;
  } bad[] = {
      // tools
      {with_tools(R"({"name":"t"})"), "tools", "expected an array of tools, found object"},
      {with_tools(R"([7])"), "tools[0]", "expected a tool object"},
      {with_tools(R"([{"type":"web_search_20250305","name":"web_search"}])"), "tools[0].type",
       "only client tools"},
      {with_tools(R"([{"input_schema":{}}])"), "tools[0].name", "required"},
      {with_tools(R"([{"name":"a b","input_schema":{}}])"), "tools[0].name", "\"a b\""},
      {with_tools(R"([{"name":"t","input_schema":{}},{"name":"t","input_schema":{}}])"),
       "tools[1].name", "two tools are named \"t\""},
      {with_tools(R"([{"name":"t","description":5,"input_schema":{}}])"), "tools[0].description",
       "expected a string, found 5"},
      {with_tools(R"([{"name":"t"}])"), "tools[0].input_schema", "required"},
      {with_tools(R"([{"name":"t","input_schema":"object"}])"), "tools[0].input_schema",
       "expected a JSON schema object"},
      // tool_choice
      {with_choice(R"("auto")"), "tool_choice", "expected an object such as {\"type\": \"auto\"}"},
      {with_choice("{}"), "tool_choice.type", "required"},
      {with_choice(R"({"type":"required"})"), "tool_choice.type", "found \"required\""},
      {messages_body(fmt::format(R"({},"tool_choice":{{"type":"any"}})", kUserTurn)), "tool_choice",
       "needs tools"},
      {with_choice(R"({"type":"tool"})"), "tool_choice.name", "required"},
      {with_choice(R"({"type":"tool","name":"nope"})"), "tool_choice.name",
       "\"nope\" is not one of the request's tools"},
      {with_choice(R"({"type":"auto","disable_parallel_tool_use":"yes"})"),
       "tool_choice.disable_parallel_tool_use", "true or false"},
      // messages and their blocks
      {messages_body(R"("messages":[{"role":"system","content":"x"}])"), "messages[0].role",
       "\"user\" or \"assistant\""},
      {messages_body(R"("messages":[{"role":"user"}])"), "messages[0].content", "found nothing"},
      {messages_body(R"("messages":[{"role":"user","content":[7]}])"), "messages[0].content[0]",
       "expected a content block object"},
      {messages_body(R"("messages":[{"role":"user","content":[{"text":"x"}]}])"),
       "messages[0].content[0].type", "required"},
      {messages_body(R"("messages":[{"role":"user","content":[{"type":"image","source":{}}]}])"),
       "messages[0].content[0].type", "found \"image\""},
      {messages_body(R"("messages":[{"role":"user","content":[{"type":"text"}]}])"),
       "messages[0].content[0].text", "required"},
      {messages_body(
           R"("messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"t","input":{}}]}])"),
       "messages[0].content[0].type", "belongs in an \"assistant\" message"},
      {assistant(R"([{"type":"tool_result","tool_use_id":"a"}])"), "messages[1].content[0].type",
       "belongs in a \"user\" message"},
      {assistant(R"([{"type":"thinking"}])"), "messages[1].content[0].thinking", "required"},
      // tool_use
      {assistant(R"([{"type":"tool_use","name":"t","input":{}}])"), "messages[1].content[0].id",
       "required"},
      {assistant(R"([{"type":"tool_use","id":"","name":"t","input":{}}])"),
       "messages[1].content[0].id", "non-empty"},
      {assistant(R"([{"type":"tool_use","id":"a","name":"t","input":{}},)"
                 R"({"type":"tool_use","id":"a","name":"t","input":{}}])"),
       "messages[1].content[1].id", "two tool_use blocks"},
      {assistant(R"([{"type":"tool_use","id":"a","input":{}}])"), "messages[1].content[0].name",
       "required"},
      {assistant(R"([{"type":"tool_use","id":"a","name":"t"}])"), "messages[1].content[0].input",
       "found nothing"},
      {assistant(R"([{"type":"tool_use","id":"a","name":"t","input":[1]}])"),
       "messages[1].content[0].input", "JSON object, found array"},
      // tool_result
      {after_call(R"([{"type":"tool_result","content":"21"}])"),
       "messages[2].content[0].tool_use_id", "required"},
      {after_call(R"([{"type":"tool_result","tool_use_id":"toolu_9"}])"),
       "messages[2].content[0].tool_use_id", "its unanswered ids: \"toolu_1\""},
      {after_call(R"([{"type":"tool_result","tool_use_id":"toolu_1"},)"
                  R"({"type":"tool_result","tool_use_id":"toolu_1"}])"),
       "messages[2].content[1].tool_use_id", "no unanswered tool_use block"},
      {messages_body(
           R"("messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a"}]}])"),
       "messages[0].content[0].tool_use_id", "answers no tool_use block"},
      {after_call(R"([{"type":"tool_result","tool_use_id":"toolu_1","content":5}])"),
       "messages[2].content[0].content", "expected a string or an array of text blocks, found 5"},
      {after_call(
           R"([{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"image"}]}])"),
       "messages[2].content[0].content[0].type", "expected \"text\", found \"image\""},
      {after_call(R"([{"type":"tool_result","tool_use_id":"toolu_1","is_error":"yes"}])"),
       "messages[2].content[0].is_error", "true or false"},
  };
  for (const auto& c : bad) {
    SCOPED_TRACE(c.body);
    const ParseResult result = parse_anthropic_messages_request(c.body, limits());
    ASSERT_TRUE(std::holds_alternative<ApiError>(result));
    const ApiError& error = std::get<ApiError>(result);
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, c.param) << error.message;
    // The message reads on its own: it starts with the field, then says what was expected.
    EXPECT_EQ(error.message.rfind(c.param + ": ", 0), 0u) << error.message;
    EXPECT_NE(error.message.find(c.in_message), std::string::npos) << error.message;
  }
  // A tool_result answers the assistant message just before it, not an older one.
  const std::string stale = after_call(
      R"([{"type":"tool_result","tool_use_id":"toolu_1"}]},{"role":"assistant","content":"ok"},)"
      R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"}])");
  const ParseResult result = parse_anthropic_messages_request(stale, limits());
  ASSERT_TRUE(std::holds_alternative<ApiError>(result)) << stale;
  EXPECT_EQ(std::get<ApiError>(result).param, "messages[4].content[0].tool_use_id");
}

// Errors found after parsing (the tools' call grammar, serve/plan.h) name the Anthropic field.
TEST(AnthropicRequest, ChatToolPathsAreRenamedToTheBodysOwn) {
  ApiError schema = invalid_field("tools[1].function.parameters.properties.city.maxLength",
                                  "not supported in the XML tool format");
  name_anthropic_fields(schema);
  EXPECT_EQ(schema.param, "tools[1].input_schema.properties.city.maxLength");
  EXPECT_EQ(
      schema.message,
      "tools[1].input_schema.properties.city.maxLength: not supported in the XML tool format");
  ApiError name = invalid_field("tools[0].function.name", "x");
  name_anthropic_fields(name);
  EXPECT_EQ(name.param, "tools[0].name");
  ApiError other = invalid_field("messages", "the chat template rejects this conversation");
  name_anthropic_fields(other);
  EXPECT_EQ(other.param, "messages");
  EXPECT_EQ(other.message, "messages: the chat template rejects this conversation");
}

}  // namespace
}  // namespace strata::serve
