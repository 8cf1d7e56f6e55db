// The request parser (serve/request.h): valid requests become the right struct; every kind of bad
// input becomes an ApiError with the right status, the field named in `param` and in the message.
#include "serve/request.h"
#include "test_limits.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace strata::serve {
namespace {

RequestLimits limits() { return test_support::test_limits("strata-default"); }

GenerationRequest accept(std::string_view body, Endpoint endpoint = Endpoint::ChatCompletions) {
  ParseResult result = parse_generation_request(body, endpoint, limits());
  if (const ApiError* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << "rejected: " << error->message << "\nbody: " << body;
    return {};
  }
  return std::get<GenerationRequest>(result);
}

ApiError reject(std::string_view body, Endpoint endpoint = Endpoint::ChatCompletions) {
  ParseResult result = parse_generation_request(body, endpoint, limits());
  if (std::holds_alternative<GenerationRequest>(result)) {
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  return std::get<ApiError>(result);
}

constexpr const char* kUser = R"("messages":[{"role":"user","content":"hi"}])";

std::string chat(std::string_view extra) {
  return fmt::format("{{{}{}{}}}", kUser, extra.empty() ? "" : ",", extra);
}

TEST(ServeRequest, ChatWithEveryHonouredField) {
  const GenerationRequest r = accept(
      R"({"model":"strata-default","messages":[{"role":"system","content":"be brief"},
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
          {"role":"assistant","content":null,"reasoning_content":"hmm"},{"role":"developer","content":"d"}],
          "max_tokens":12,"temperature":0.5,"top_p":0.9,"seed":-1,"n":1,"stop":["x","yz"],
          "stream":true,"stream_options":{"include_usage":true},"top_k":40,"min_p":0.05,
          "repeat_penalty":1.1,"ignore_eos":true,"chat_template_kwargs":{"enable_thinking":false},
          "user":"u","frequency_penalty":0,"logprobs":false,"tools":[],"response_format":{"type":"text"}})");
  EXPECT_EQ(r.endpoint, Endpoint::ChatCompletions);
  EXPECT_EQ(r.model, "strata-default");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.messages[2].reasoning_content, "hmm");
  EXPECT_EQ(r.messages[3].role, "system");
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.seed, UINT64_MAX);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(*r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(*r.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.enable_thinking, false);
}

TEST(ServeRequest, MinimalChatUsesDefaults) {
  const GenerationRequest r = accept(chat(""));
  EXPECT_EQ(r.model, "strata-default");  // no "model": the served one
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.sampling.temperature);
  EXPECT_FALSE(r.sampling.seed);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.enable_thinking);
}

TEST(ServeRequest, NullMeansUnset) {
  const GenerationRequest r =
      accept(chat(R"("max_tokens":null,"stop":null,"seed":null,"temperature":null)"));
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.sampling.seed);
  EXPECT_TRUE(r.stop.empty());
}

TEST(ServeRequest, MaxCompletionTokensIsTheNewerName) {
  EXPECT_EQ(accept(chat(R"("max_completion_tokens":7)")).max_tokens, 7);
}

TEST(ServeRequest, CompletionPromptForms) {
  EXPECT_EQ(accept(R"({"prompt":"Once"})", Endpoint::Completions).prompt_text, "Once");
  EXPECT_EQ(accept(R"({"prompt":["Once"]})", Endpoint::Completions).prompt_text, "Once");
  const GenerationRequest ids = accept(R"({"prompt":[1,2,999]})", Endpoint::Completions);
  EXPECT_TRUE(ids.prompt_is_tokens);
  EXPECT_EQ(ids.prompt_tokens, (std::vector<int32_t>{1, 2, 999}));
  EXPECT_EQ(accept(R"({"prompt":[[5,6]]})", Endpoint::Completions).prompt_tokens,
            (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(accept(R"({"prompt":"a","stop":"\n"})", Endpoint::Completions).stop,
            (std::vector<std::string>{"\n"}));
}

struct BadCase {
  const char* what;
  std::string body;
  Endpoint endpoint;
  int status;
  const char* param;       // expected error.param ("" = none)
  const char* in_message;  // a piece the message must contain
};

TEST(ServeRequest, BadInputNamesTheField) {
  const Endpoint C = Endpoint::ChatCompletions, P = Endpoint::Completions;
  const BadCase cases[] = {
      {"empty body", "", C, 400, "", "empty"},
      {"not JSON", "{nope", C, 400, "", "not valid JSON"},
      {"trailing comma", R"({"messages":[{"role":"user","content":"x"},]})", C, 400, "messages[1]",
       "not valid JSON"},
      {"array body", "[1,2]", C, 400, "", "JSON object"},
      {"invalid UTF-8", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\"}]}", C, 400,
       "messages[0].content", "not valid UTF-8"},
      {"overlong UTF-8", "{\"prompt\":\"\xc0\xaf\"}", P, 400, "prompt", "not valid UTF-8"},
      {"lone surrogate escape", R"({"prompt":"\ud800"})", P, 400, "prompt", "not valid JSON"},
      {"too deep", std::string(40, '[') + std::string(40, ']'), C, 400, "", "nested deeper"},
      {"unknown model", chat(R"("model":"gpt-4")"), C, 404, "model", "gpt-4"},
      {"model wrong type", chat(R"("model":7)"), C, 400, "model", "expected a string"},
      {"no messages", R"({"model":"strata-default"})", C, 400, "messages", "required"},
      {"empty messages", R"({"messages":[]})", C, 400, "messages", "non-empty"},
      {"messages not array", R"({"messages":"hi"})", C, 400, "messages", "found \"hi\""},
      {"message not object", R"({"messages":[3]})", C, 400, "messages[0]", "message object"},
      {"no role", R"({"messages":[{"content":"x"}]})", C, 400, "messages[0].role", "required"},
      {"bad role", R"({"messages":[{"role":"wizard","content":"x"}]})", C, 400, "messages[0].role",
       "wizard"},
      {"content number", R"({"messages":[{"role":"user","content":5}]})", C, 400,
       "messages[0].content", "found 5"},
      {"user content null", R"({"messages":[{"role":"user","content":null}]})", C, 400,
       "messages[0].content", "required"},
      {"image part",
       R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})", C, 400,
       "messages[0].content[0].type", "only \"text\""},
      {"tool call without function",
       R"({"messages":[{"role":"assistant","content":"","tool_calls":[{}]}]})", C, 400,
       "messages[0].tool_calls[0].function", "required"},
      {"tool call arguments not JSON",
       R"({"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{x"}}]}]})",
       C, 400, "messages[0].tool_calls[0].function.arguments", "JSON object"},
      {"tool call bad name",
       R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"a b","arguments":"{}"}}]}]})",
       C, 400, "messages[0].tool_calls[0].function.name", "letters, digits"},
      {"user tool calls", R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", C, 400,
       "messages[0].tool_calls", "only assistant"},
      {"tool_call_id on user", R"({"messages":[{"role":"user","content":"x","tool_call_id":"c"}]})",
       C, 400, "messages[0].tool_call_id", "only tool messages"},
      {"max_tokens string", chat(R"("max_tokens":"10")"), C, 400, "max_tokens",
       "expected an integer"},
      {"max_tokens float", chat(R"("max_tokens":1.5)"), C, 400, "max_tokens",
       "expected an integer"},
      {"negative max_tokens", chat(R"("max_tokens":-5)"), C, 400, "max_tokens", "-5"},
      {"zero max_tokens", chat(R"("max_tokens":0)"), C, 400, "max_tokens", ">= 1"},
      {"huge max_tokens", chat(R"("max_tokens":1000000)"), C, 400, "max_tokens", "context length"},
      {"u64 max_tokens", chat(R"("max_tokens":18446744073709551615)"), C, 400, "max_tokens",
       "context length"},
      {"beyond u64 max_tokens", chat(R"("max_tokens":1e30)"), C, 400, "max_tokens",
       "expected an integer"},
      {"temperature string", chat(R"("temperature":"hot")"), C, 400, "temperature", "\"hot\""},
      {"temperature too high", chat(R"("temperature":3)"), C, 400, "temperature",
       "between 0 and 2"},
      {"top_p above 1", chat(R"("top_p":1.5)"), C, 400, "top_p", "between 0 and 1"},
      {"seed float", chat(R"("seed":1.5)"), C, 400, "seed", "integer"},
      {"n=17", chat(R"("n":17)"), C, 400, "n", "at most 16"},
      {"n=0", chat(R"("n":0)"), C, 400, "n", "between 1 and"},
      {"stream string", chat(R"("stream":"yes")"), C, 400, "stream", "true or false"},
      {"stream_options without stream", chat(R"("stream_options":{"include_usage":true})"), C, 400,
       "stream_options", "stream is true"},
      {"include_usage number", chat(R"("stream":true,"stream_options":{"include_usage":1})"), C,
       400, "stream_options.include_usage", "true or false"},
      {"stop empty", chat(R"("stop":"")"), C, 400, "stop", "non-empty"},
      {"stop number", chat(R"("stop":[1])"), C, 400, "stop[0]", "expected a string"},
      {"five stops", chat(R"("stop":["a","b","c","d","e"])"), C, 400, "stop", "at most 4"},
      {"tool without function", chat(R"("tools":[{"type":"function"}])"), C, 400,
       "tools[0].function", "required"},
      {"tools object", chat(R"("tools":{})"), C, 400, "tools", "expected an array"},
      {"tool type", chat(R"("tools":[{"type":"retrieval"}])"), C, 400, "tools[0].type",
       "\"function\""},
      {"tool name with tag", chat(R"("tools":[{"type":"function","function":{"name":"f>"}}])"), C,
       400, "tools[0].function.name", "letters, digits"},
      {"duplicate tools",
       chat(
           R"("tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}])"),
       C, 400, "tools[1].function.name", "two tools"},
      {"tool parameters string",
       chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":"x"}}])"), C, 400,
       "tools[0].function.parameters", "schema object"},
      {"tool strict not a boolean",
       chat(R"("tools":[{"type":"function","function":{"name":"f","strict":"yes"}}])"), C, 400,
       "tools[0].function.strict", "true or false"},
      {"required without tools", chat(R"("tool_choice":"required")"), C, 400, "tool_choice",
       "needs tools"},
      {"tool_choice word",
       chat(R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"any")"), C, 400,
       "tool_choice", "\"required\""},
      {"tool_choice unknown function",
       chat(
           R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}})"),
       C, 400, "tool_choice.function.name", "not one of"},
      {"completion tools", R"({"prompt":"a","tools":[{"type":"function"}]})", P, 400, "tools",
       "chat/completions"},
      {"logprobs number", chat(R"("logprobs":1)"), C, 400, "logprobs", "true or false"},
      {"top_logprobs without logprobs", chat(R"("top_logprobs":3)"), C, 400, "top_logprobs",
       "requires \"logprobs\": true"},
      {"top_logprobs 21", chat(R"("logprobs":true,"top_logprobs":21)"), C, 400, "top_logprobs",
       "between 0 and 20"},
      {"completion logprobs bool", R"({"prompt":"a","logprobs":true})", P, 400, "logprobs",
       "expected an integer between 0 and 20"},
      {"completion logprobs 21", R"({"prompt":"a","logprobs":21})", P, 400, "logprobs",
       "between 0 and 20"},
      {"presence penalty 3", chat(R"("presence_penalty":3)"), C, 400, "presence_penalty",
       "between -2 and 2"},
      {"frequency penalty string", chat(R"("frequency_penalty":"x")"), C, 400, "frequency_penalty",
       "between -2 and 2"},
      {"logit_bias array", chat(R"("logit_bias":[1])"), C, 400, "logit_bias", "expected an object"},
      {"logit_bias id out of vocab", chat(R"("logit_bias":{"1000":1})"), C, 400, "logit_bias.1000",
       "vocabulary [0, 1000)"},
      {"logit_bias word key", chat(R"("logit_bias":{"hello":1})"), C, 400, "logit_bias.hello",
       "token id"},
      {"logit_bias negative key", chat(R"("logit_bias":{"-1":1})"), C, 400, "logit_bias.-1",
       "token id"},
      {"logit_bias leading zero", chat(R"("logit_bias":{"07":1})"), C, 400, "logit_bias.07",
       "token id"},
      {"logit_bias huge key", chat(R"("logit_bias":{"99999999999999999999":1})"), C, 400,
       "logit_bias.99999999999999999999", "token id"},
      {"logit_bias value 101", chat(R"("logit_bias":{"5":101})"), C, 400, "logit_bias.5",
       "between -100 and 100"},
      {"logit_bias value string", R"({"prompt":"a","logit_bias":{"5":"1"}})", P, 400,
       "logit_bias.5", "between -100 and 100"},
      {"response_format type", chat(R"("response_format":{"type":"xml"})"), C, 400,
       "response_format.type", "\"json_schema\""},
      {"unsupported schema keyword",
       chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"p","schema":)"
            R"({"type":"object","properties":{"age":{"type":"number","minimum":0}}}}})"),
       C, 400, "response_format.json_schema.schema.properties.age.minimum", "not supported"},
      {"no prompt", R"({"max_tokens":3})", P, 400, "prompt", "required"},
      {"prompt number", R"({"prompt":5})", P, 400, "prompt", "found 5"},
      {"empty prompt array", R"({"prompt":[]})", P, 400, "prompt", "non-empty"},
      {"two prompts", R"({"prompt":["a","b"]})", P, 400, "prompt", "only one prompt"},
      {"token out of range", R"({"prompt":[1,1000]})", P, 400, "prompt[1]",
       "outside the vocabulary"},
      {"negative token", R"({"prompt":[-1]})", P, 400, "prompt[0]", "outside the vocabulary"},
      {"echo", R"({"prompt":"a","echo":true})", P, 400, "echo", "not supported"},
      {"best_of", R"({"prompt":"a","best_of":3})", P, 400, "best_of", "best_of=1"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    const ApiError error = reject(c.body, c.endpoint);
    EXPECT_EQ(error.status, c.status);
    EXPECT_EQ(error.param, c.param);
    EXPECT_NE(error.message.find(c.in_message), std::string::npos) << error.message;
    if (*c.param) {
      EXPECT_NE(error.message.find(c.param), std::string::npos) << error.message;
    }
    EXPECT_EQ(error.type, "invalid_request_error");
  }
}

TEST(ServeRequest, OpenAiSamplingRulesAndLogprobs) {
  GenerationRequest r = accept(chat(
      R"("logit_bias":{"7":-100,"3":2.5,"0":100},"frequency_penalty":-2,"presence_penalty":0.5,)"
      R"("n":16,"logprobs":true,"top_logprobs":20)"));
  using Bias = std::vector<std::pair<int32_t, float>>;
  EXPECT_EQ(r.sampling.logit_bias, (Bias{{0, 100.0f}, {3, 2.5f}, {7, -100.0f}}));
  EXPECT_FLOAT_EQ(*r.sampling.frequency_penalty, -2.0f);
  EXPECT_FLOAT_EQ(*r.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(r.n, 16);
  EXPECT_EQ(r.logprobs, 20);
  r = accept(chat(R"("logprobs":true)"));
  EXPECT_EQ(r.logprobs, 0);
  r = accept(chat(R"("logprobs":false,"top_logprobs":null,"logit_bias":{})"));
  EXPECT_FALSE(r.logprobs);
  EXPECT_TRUE(r.sampling.logit_bias.empty());
  EXPECT_EQ(r.n, 1);
  r = accept(R"({"prompt":"a","logprobs":5,"logit_bias":{"999":-1}})", Endpoint::Completions);
  EXPECT_EQ(r.logprobs, 5);
  EXPECT_EQ(r.sampling.logit_bias, (Bias{{999, -1.0f}}));
  // The Messages API has one reply and no log-probabilities; logit_bias passes through.
  const RequestLimits l = limits();
  for (const char* extra : {R"("n":2)", R"("logprobs":true)"}) {
    const ParseResult messages = parse_anthropic_messages_request(
        fmt::format(R"({{"max_tokens":5,"messages":[{{"role":"user","content":"x"}}],{}}})", extra),
        l);
    ASSERT_TRUE(std::holds_alternative<ApiError>(messages)) << extra;
  }
  const ParseResult biased = parse_anthropic_messages_request(
      R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":1}})", l);
  ASSERT_TRUE(std::holds_alternative<GenerationRequest>(biased));
  EXPECT_EQ(std::get<GenerationRequest>(biased).sampling.logit_bias.size(), 1u);
}

TEST(ServeRequest, ToolsToolChoiceAndToolMessages) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"get_weather","description":"d",)"
      R"("parameters":{"type":"object","properties":{"z":{},"a":{}}}}},)"
      R"({"type":"function","function":{"name":"search"}}])";
  GenerationRequest r = accept(R"({"messages":[{"role":"user","content":"x"},)"
                               R"({"role":"assistant","content":null,"tool_calls":[)"
                               R"({"id":"call_1","type":"function","function":{"name":"search",)"
                               R"("arguments":"{\"q\": 1}"}},)"
                               R"({"function":{"name":"get_weather","arguments":{"city":"P"}}}]},)"
                               R"({"role":"tool","tool_call_id":"call_1","content":"ok"}],)" +
                               tools + R"(,"parallel_tool_calls":false})");
  ASSERT_EQ(r.tools.size(), 2u);
  // Key order as sent (the template renders the tool as the client wrote it).
  EXPECT_EQ(r.tools[0],
            R"({"type":"function","function":{"name":"get_weather","description":"d","parameters":)"
            R"({"type":"object","properties":{"z":{},"a":{}}}}})");
  EXPECT_EQ(r.tool_choice, ToolChoice::Auto);
  EXPECT_FALSE(r.parallel_tool_calls);
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "");
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "search");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"q": 1})");  // the string as sent
  EXPECT_EQ(r.messages[1].tool_calls[1].arguments, R"({"city":"P"})");
  EXPECT_EQ(r.messages[2].role, "tool");

  r = accept(chat(tools + R"(,"tool_choice":"required")"));
  EXPECT_EQ(r.tool_choice, ToolChoice::Required);
  r = accept(chat(tools + R"(,"tool_choice":{"type":"function","function":{"name":"search"}})"));
  EXPECT_EQ(r.tool_choice, ToolChoice::Function);
  EXPECT_EQ(r.tool_choice_function, "search");
  r = accept(chat(tools + R"(,"tool_choice":"none")"));
  EXPECT_EQ(r.tool_choice, ToolChoice::None);
  r = accept(chat(R"("tools":[],"tool_choice":"none")"));
  EXPECT_EQ(r.tool_choice, ToolChoice::None);
  EXPECT_TRUE(r.tools.empty());
}

TEST(ServeRequest, UnknownModelIsModelNotFound) {
  const ApiError error = reject(chat(R"("model":"other")"));
  EXPECT_EQ(error.code, "model_not_found");
  EXPECT_NE(error.message.find("strata-default"), std::string::npos);
}

TEST(ServeRequest, MalformedJsonReportsWhere) {
  const ApiError error = reject(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":tru})");
  EXPECT_NE(error.message.find("max_tokens"), std::string::npos) << error.message;
  EXPECT_NE(error.message.find("column"), std::string::npos) << error.message;
}

TEST(ServeRequest, TrailingDataAfterTheBodyIsNamed) {
  // Two JSON values back to back: the message must say what is wrong and where, never end in an
  // empty explanation ("request body is not valid JSON: ").
  for (const std::string& body :
       {std::string(R"({"a":1} {"b":2})"), chat("") + " x", chat("") + "}"}) {
    SCOPED_TRACE(body);
    const ApiError error = reject(body);
    EXPECT_EQ(error.status, 400);
    EXPECT_NE(error.message.find("after the JSON object"), std::string::npos) << error.message;
    EXPECT_NE(error.message.find("end of input"), std::string::npos) << error.message;
    EXPECT_NE(error.message.find("column"), std::string::npos) << error.message;
  }
}

TEST(ServeRequest, TokenizerBodiesHaveLlamaServerDefaults) {
  const auto tokenize = parse_tokenize_request(R"({"content":"hi"})", limits());
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(tokenize));
  const TokenizeRequest& t = std::get<TokenizeRequest>(tokenize);
  EXPECT_EQ(t.content, "hi");
  EXPECT_FALSE(t.add_special);
  EXPECT_TRUE(t.parse_special);
  EXPECT_FALSE(t.with_pieces);
  const auto detokenize = parse_detokenize_request(R"({"tokens":[0,5,999]})", limits());
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(detokenize));
  EXPECT_EQ(std::get<DetokenizeRequest>(detokenize).tokens, (std::vector<int32_t>{0, 5, 999}));

  const struct {
    std::string body, param, in_message;
    bool tokenize;
  } bad[] = {
      {R"({"content":null})", "content", "missing", true},
      {R"({"content":"x","with_pieces":1})", "with_pieces", "true or false", true},
      {R"({"tokens":"1,2"})", "tokens", "array", false},
      {R"({"tokens":[1000]})", "tokens[0]", "between 0 and 999", false},
      {R"({"tokens":[-1]})", "tokens[0]", "-1", false},
      {R"({"tokens":[1.5]})", "tokens[0]", "1.5", false},
      {R"({"tokens":[18446744073709551615]})", "tokens[0]", "between", false},
      {"[1]", "", "expected a JSON object", false},
  };
  for (const auto& c : bad) {
    SCOPED_TRACE(c.body);
    const ApiError error = c.tokenize
                               ? std::get<ApiError>(parse_tokenize_request(c.body, limits()))
                               : std::get<ApiError>(parse_detokenize_request(c.body, limits()));
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, c.param);
    EXPECT_NE(error.message.find(c.in_message), std::string::npos) << error.message;
  }
}

TEST(ServeRequest, AnthropicMessagesBecomeAChatRequest) {
  const ParseResult parsed = parse_anthropic_messages_request(
      R"({"model":"strata-default","max_tokens":9,"system":[{"type":"text","text":"be brief"}],
          "messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},
                      {"role":"user","content":[{"type":"text","text":"more"}]}],
          "stop_sequences":["END"],"temperature":0.5,"top_k":5,"stream":true,
          "thinking":{"type":"disabled"},"metadata":{"user_id":"u"}})",
      limits());
  ASSERT_TRUE(std::holds_alternative<GenerationRequest>(parsed))
      << std::get<ApiError>(parsed).message;
  const GenerationRequest& r = std::get<GenerationRequest>(parsed);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "be brief");
  EXPECT_EQ(r.messages[3].content, "more");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"END"}));
  EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.enable_thinking, false);

  const struct {
    std::string body, param, in_message;
  } bad[] = {
      {R"({"messages":[{"role":"user","content":"x"}]})", "max_tokens", "required"},
      {R"({"max_tokens":4,"messages":[]})", "messages", "empty"},
      {R"({"max_tokens":4,"system":5,"messages":[{"role":"user","content":"x"}]})", "system",
       "string"},
      // With `system` first, the messages keep their own indices in errors.
      {R"({"max_tokens":4,"system":"s","messages":[{"role":"user","content":"x"},{"role":"user","content":7}]})",
       "messages[1].content", "messages[1].content"},
      // A block of `system` is named by its own path, not the whole field.
      {R"({"max_tokens":4,"system":[{"type":"text","text":"s"},{"type":"image"}],"messages":[{"role":"user","content":"x"}]})",
       "system[1].type", "system[1].type: only \"text\""},
      {R"({"max_tokens":4,"system":[{"type":"text","text":7}],"messages":[{"role":"user","content":"x"}]})",
       "system[0].text", "system[0].text"},
      {R"({"max_tokens":4,"stop_sequences":["a",1],"messages":[{"role":"user","content":"x"}]})",
       "stop_sequences[1]", "string"},
      {R"({"max_tokens":4,"thinking":{"type":"maybe"},"messages":[{"role":"user","content":"x"}]})",
       "thinking.type", "\"maybe\""},
      // Tools are translated (anthropic_request_test.cpp); a malformed one is named as sent.
      {R"({"max_tokens":4,"tools":[{"name":"t"}],"messages":[{"role":"user","content":"x"}]})",
       "tools[0].input_schema", "required"},
  };
  for (const auto& c : bad) {
    SCOPED_TRACE(c.body);
    const ParseResult result = parse_anthropic_messages_request(c.body, limits());
    ASSERT_TRUE(std::holds_alternative<ApiError>(result));
    const ApiError& error = std::get<ApiError>(result);
    EXPECT_EQ(error.param, c.param) << error.message;
    EXPECT_NE(error.message.find(c.in_message), std::string::npos) << error.message;
  }
}

TEST(ServeRequest, UnknownFieldsAreIgnored) {
  EXPECT_EQ(accept(chat(R"("some_future_field":{"x":[1,2,3]})")).messages.size(), 1u);
}

TEST(ServeRequest, EveryPrefixOfAValidBodyIsHandled) {
  // Truncated bodies (a client cut off mid-send) are rejected cleanly, never accepted halfway.
  const std::string body = chat(R"("max_tokens":5,"stop":["a\u00e9"],"stream":true)");
  for (size_t n = 0; n < body.size(); ++n) {
    const ParseResult result = parse_generation_request(std::string_view(body).substr(0, n),
                                                        Endpoint::ChatCompletions, limits());
    ASSERT_TRUE(std::holds_alternative<ApiError>(result)) << n;
    EXPECT_EQ(std::get<ApiError>(result).status, 400);
  }
}

TEST(ServeRequest, CommittedFuzzSeedsBehaveAsNamed) {
  // tests/data/fuzz/serve_request: byte 0 picks the mode (fuzz/fuzz_serve_request.cpp: 0 chat,
  // 1 completions, 6 Anthropic's /v1/messages; the others are not request bodies); *_bad* bodies
  // are rejected, the others accepted.
  int checked = 0, anthropic = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(STRATA_TEST_DATA_DIR) +
                                                               "/fuzz/serve_request")) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    const std::string seed = bytes.str();
    if (seed.empty() || (seed[0] > 1 && seed[0] != 6)) continue;
    SCOPED_TRACE(entry.path().filename().string());
    const std::string_view body = std::string_view(seed).substr(1);
    const ParseResult result =
        seed[0] == 6
            ? parse_anthropic_messages_request(body, limits())
            : parse_generation_request(
                  body, seed[0] == 0 ? Endpoint::ChatCompletions : Endpoint::Completions, limits());
    const bool bad = entry.path().filename().string().find("_bad") != std::string::npos;
    EXPECT_EQ(std::holds_alternative<ApiError>(result), bad);
    ++checked;
    anthropic += seed[0] == 6;
  }
  EXPECT_GE(checked, 6);
  EXPECT_GE(anthropic, 3);
}

}  // namespace
}  // namespace strata::serve
