// Tools through a real `strata serve` on the default model (random weights, the Qwen3.5 chat
// format): the prompt holds exactly what the chat template renders for the tools, tool_choice
// "none" leaves them out and a forced choice opens the call; tool calls and tool results sent
// back as history are rendered; a forced call (tool_choice "required" or named), drawn under the
// tools' grammar, is a real multi-token call whose arguments valijson accepts, whole and streamed
// alike, for several seeds; a schema the grammar cannot honour is a 400; tool_choice auto and
// requests without tools reply as before. Parsing is tested on the templates' own text in
// tool_calls_test.cpp, the grammar in tool_call_grammar_test.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "schema_errors.h"
#include "serve_process.h"
#include "text/chat_template.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;

const std::string kChat = "/v1/chat/completions";

const json kTools = json::parse(
    R"([{"type":"function","function":{"name":"get_weather","description":"Weather in a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])");

ChatTemplate served_template(const ServeProcess& server) {
  const HttpReply props = get(server, "/props");
  EXPECT_EQ(props.status, 200);
  const std::string format = props.json()["strata"]["chat_format"];
  EXPECT_EQ(format, "qwen3.5");  // the default model's; the expectations below use its template
  return ChatTemplate(ChatFormat::Qwen35);
}

size_t token_count(const ServeProcess& server, const std::string& text) {
  const HttpReply reply = post(server, "/tokenize", json{{"content", text}}.dump());
  EXPECT_EQ(reply.status, 200) << reply.body;
  return reply.json()["tokens"].size();
}

json chat(const ServeProcess& server, const json& body) {
  const HttpReply reply = post(server, kChat, body.dump());
  EXPECT_EQ(reply.status, 200) << reply.body;
  return reply.json();
}

std::vector<std::string> tool_texts() {
  std::vector<std::string> out;
  for (const json& tool : kTools) out.push_back(tool.dump());
  return out;
}

TEST(ServeTools, ThePromptHoldsTheTemplatesToolSection) {
  ServeProcess server;
  const ChatTemplate tmpl = served_template(server);
  const std::vector<ChatMessage> messages = {{"user", "Weather in Paris?", {}, {}}};
  const json base = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                     {"tools", kTools},
                     {"max_tokens", 1},
                     {"temperature", 0}};
  ChatRenderOptions with_tools;
  with_tools.tools = tool_texts();
  const json automatic = chat(server, base);
  EXPECT_EQ(automatic["usage"]["prompt_tokens"].get<size_t>(),
            token_count(server, tmpl.render(messages, with_tools)));
  json none = base;
  none["tool_choice"] = "none";
  EXPECT_EQ(chat(server, none)["usage"]["prompt_tokens"].get<size_t>(),
            token_count(server, tmpl.render(messages)));
  // Named: thinking off and the assistant turn opened with the call.
  json named = base;
  named["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  ChatRenderOptions forced = with_tools;
  forced.enable_thinking = false;
  EXPECT_EQ(chat(server, named)["usage"]["prompt_tokens"].get<size_t>(),
            token_count(server, tmpl.render(messages, forced) +
                                    tool_call_prefix(ToolCallFormat::Xml, "get_weather")));
  json required = base;
  required["tool_choice"] = "required";
  EXPECT_EQ(chat(server, required)["usage"]["prompt_tokens"].get<size_t>(),
            token_count(server, tmpl.render(messages, forced) +
                                    tool_call_prefix(ToolCallFormat::Xml, std::nullopt)));
}

TEST(ServeTools, ToolCallsAndResultsAreRenderedAsHistory) {
  ServeProcess server;
  const ChatTemplate tmpl = served_template(server);
  const json body = {{"messages", json::parse(R"([{"role":"user","content":"Weather in Paris?"},
          {"role":"assistant","content":null,"tool_calls":[{"id":"call_a","type":"function",
           "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
          {"role":"tool","tool_call_id":"call_a","content":"{\"temp\": 21}"}])")},
                     {"tools", kTools},
                     {"max_tokens", 2},
                     {"temperature", 0}};
  const std::vector<ChatMessage> messages = {
      {"user", "Weather in Paris?", {}, {}},
      {"assistant", "", {}, {{"get_weather", R"({"city": "Paris"})"}}},
      {"tool", R"({"temp": 21})", {}, {}}};
  ChatRenderOptions options;
  options.tools = tool_texts();
  const std::string prompt = tmpl.render(messages, options);
  ASSERT_NE(prompt.find("<function=get_weather>\n<parameter=city>\nParis\n</parameter>"),
            std::string::npos)
      << prompt;
  EXPECT_EQ(chat(server, body)["usage"]["prompt_tokens"].get<size_t>(),
            token_count(server, prompt));
  // The XML format needs the arguments to be an object.
  json bad = body;
  bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = "[1, 2]";
  const HttpReply rejected = post(server, kChat, bad.dump());
  EXPECT_EQ(rejected.status, 400) << rejected.body;
  EXPECT_EQ(rejected.json()["error"]["param"], "messages[1].tool_calls[0].function.arguments");
}

// Forced calls are drawn under the tools' grammar (serve/tool_call_grammar.h): every enum,
// integer and boolean here is a handful of tokens, so the random model finishes its call.
const json kStrictTools = json::parse(
    R"([{"type":"function","function":{"name":"get_weather","strict":true,"parameters":)"
    R"({"type":"object","properties":{"city":{"type":"string","enum":["Paris","Tokyo","Lima"]},)"
    R"("days":{"type":"integer"},"metric":{"type":"boolean"}},"required":["city","days"],)"
    R"("additionalProperties":false}}},)"
    R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object",)"
    R"("properties":{"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"]}}}])");

const json& parameters_of(const std::string& name) {
  for (const json& tool : kStrictTools)
    if (tool["function"]["name"] == name) return tool["function"]["parameters"];
  throw std::runtime_error("no tool " + name);
}

struct StreamedCall {
  std::string name, arguments;
};

// The calls of a streamed reply, joined from their deltas, and its content and finish_reason.
std::vector<StreamedCall> streamed_calls(const HttpReply& reply, std::string& content,
                                         json& finish) {
  std::vector<StreamedCall> calls;
  for (const std::string& event : sse_data(reply.body)) {
    if (event == "[DONE]") break;
    const json c = json::parse(event)["choices"][0];
    content += c["delta"].value("content", "");
    for (const json& call : c["delta"].value("tool_calls", json::array())) {
      const size_t index = call["index"];
      if (call.contains("id")) {
        EXPECT_EQ(index, calls.size());
        EXPECT_EQ(call["type"], "function");
        calls.push_back({call["function"]["name"], call["function"]["arguments"]});
      } else {
        EXPECT_EQ(index + 1, calls.size());
        calls.back().arguments += call["function"]["arguments"].get<std::string>();
      }
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  return calls;
}

// `body` sent again streamed: one call, the same name and arguments as the whole reply's, finish
// reason tool_calls; returns the streamed content.
std::string expect_the_call_streamed(const ServeProcess& server, json body, const std::string& name,
                                     const std::string& arguments) {
  body["stream"] = true;
  const HttpReply streamed = post(server, kChat, body.dump());
  EXPECT_EQ(streamed.status, 200);
  std::string content;
  json finish;
  const std::vector<StreamedCall> calls = streamed_calls(streamed, content, finish);
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(calls.size(), 1u);
  if (!calls.empty()) {
    EXPECT_EQ(calls[0].name, name);
    EXPECT_EQ(calls[0].arguments, arguments);
  }
  return content;
}

TEST(ServeTools, AForcedCallIsAWellFormedCallThatFitsTheSchema) {
  ServeProcess server;
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  int calls_checked = 0;
  for (const json& choice : {json("required"), named}) {
    for (const uint64_t seed : {1, 2, 3, 4, 5}) {
      SCOPED_TRACE(fmt::format("tool_choice {} seed {}", choice.dump(), seed));
      json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                   {"tools", kStrictTools},
                   {"tool_choice", choice},
                   {"parallel_tool_calls", false},
                   {"max_tokens", 200},
                   {"temperature", 0.9},
                   {"seed", seed}};
      const json whole = chat(server, body);
      const json& reply = whole["choices"][0];
      EXPECT_EQ(reply["finish_reason"], "tool_calls") << reply.dump();
      EXPECT_TRUE(reply["message"]["content"].is_null()) << reply.dump();
      ASSERT_EQ(reply["message"]["tool_calls"].size(), 1u) << reply.dump();
      const json& call = reply["message"]["tool_calls"][0]["function"];
      const std::string name = call["name"];
      if (choice == named) {
        EXPECT_EQ(name, "get_weather");
      }
      const std::string arguments = call["arguments"];
      EXPECT_EQ(schema_errors(parameters_of(name), arguments), "");
      // A real call: the model wrote it token by token after the prompt's "<tool_call>\n".
      EXPECT_GT(whole["usage"]["completion_tokens"].get<int>(), 8);
      ++calls_checked;

      EXPECT_EQ(expect_the_call_streamed(server, body, name, arguments), "");
    }
  }
  EXPECT_EQ(calls_checked, 10);
  // The tools' grammar was compiled once per tool_choice (serve/grammar_cache.h), then reused.
  const json cache = get(server, "/props").json()["strata"]["grammar_cache"];
  EXPECT_EQ(cache["misses"], 2) << cache;
  EXPECT_EQ(cache["hits"], 18) << cache;
}

TEST(ServeTools, ParallelForcedCallsEachFitTheirSchema) {
  ServeProcess server;
  int calls = 0;
  for (const uint64_t seed : {11, 12, 13}) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    const json body = {{"messages", {{{"role", "user"}, {"content", "Weather and time?"}}}},
                       {"tools", kStrictTools},
                       {"tool_choice", "required"},
                       {"max_tokens", 160},
                       {"temperature", 0.9},
                       {"seed", seed}};
    const json reply = chat(server, body)["choices"][0];
    // The end of the turn is the model's choice after each call; max_tokens may cut the next.
    const std::string finish = reply["finish_reason"];
    EXPECT_TRUE(finish == "tool_calls" || finish == "length") << reply.dump();
    ASSERT_TRUE(reply["message"].contains("tool_calls")) << reply.dump();
    for (const json& call : reply["message"]["tool_calls"]) {
      EXPECT_EQ(
          schema_errors(parameters_of(call["function"]["name"]), call["function"]["arguments"]),
          "");
      ++calls;
    }
  }
  EXPECT_GE(calls, 3);
}

TEST(ServeTools, AForcedCallRefusesASchemaItCannotHonour) {
  ServeProcess server;
  json tools = kStrictTools;
  tools[0]["function"]["parameters"]["properties"]["city"] = {{"type", "string"},
                                                              {"maxLength", 20}};
  json body = {{"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
               {"tools", tools},
               {"tool_choice", "required"},
               {"max_tokens", 4}};
  const HttpReply refused = post(server, kChat, body.dump());
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.json()["error"]["param"],
            "tools[0].function.parameters.properties.city.maxLength")
      << refused.body;
  body["tool_choice"] = "auto";  // not constrained: accepted as before
  EXPECT_EQ(post(server, kChat, body.dump()).status, 200);
  body["tools"][0]["function"]["strict"] = "yes";
  const HttpReply bad_strict = post(server, kChat, body.dump());
  EXPECT_EQ(bad_strict.status, 400);
  EXPECT_EQ(bad_strict.json()["error"]["param"], "tools[0].function.strict");
}

// tool_choice auto (strict tools included) and requests without tools draw the same tokens as
// before the grammar existed: the replies below were recorded with the server of commit 8caddb8
// (strata serve on the default model, these bodies).
TEST(ServeTools, AutoAndNoToolsRepliesAreUnchanged) {
  ServeProcess server;
  // Key order matters (the template renders each tool as sent): an order-keeping body.
  nlohmann::ordered_json body = nlohmann::ordered_json::parse(
      R"({"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function",)"
      R"("function":{"name":"get_weather","strict":true,"parameters":{"type":"object","properties":)"
      R"({"city":{"type":"string","enum":["Paris","Tokyo"]},"days":{"type":"integer"}},)"
      R"("required":["city","days"]}}}],"tool_choice":"auto","max_tokens":24,"temperature":0.8,)"
      R"("seed":7})");
  auto reply = [&] {
    const HttpReply answer = post(server, kChat, body.dump());
    EXPECT_EQ(answer.status, 200) << answer.body;
    return answer.json()["choices"][0];
  };
  const json thinking = reply();
  EXPECT_EQ(thinking["message"]["reasoning_content"],
            "<whatic> I'm guided by this plugin, of course, It gets trivial for");
  EXPECT_EQ(thinking["message"]["content"], "");
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  const json answer = reply();
  EXPECT_EQ(answer["message"]["content"],
            "< angle - :-)\n* _Unfortunately we can want to hand-compare on the application,");
  EXPECT_EQ(answer["finish_reason"], "length");
  body.erase("tools");
  body.erase("tool_choice");
  EXPECT_EQ(reply()["message"]["content"],
            "If you like to check for a lack of historical Slice on the will like\nmore you");
}

// A random-weight model with a real Qwen vocabulary: the text module's fixture tokenizer
// (tests/data/tokenizer, <tool_call> one user-defined token), `strata synth` in `shape`'s
// architecture (tiny-qwen3moe: the Qwen3 template, Hermes calls; tiny-qwen4exp: Qwen3.5, XML).
class QwenVocabularyModel {
 public:
  explicit QwenVocabularyModel(const std::string& shape)
      : path_((std::filesystem::temp_directory_path() /
               fmt::format("strata-tools-{}-{}.gguf", shape, getpid()))
                  .string()) {
    ChildProcess synth({STRATA_BINARY, "synth", "--shape", shape, "--tokenizer",
                        std::string(STRATA_TEST_DATA_DIR) + "/tokenizer", path_});
    EXPECT_EQ(synth.wait(120), 0) << synth.stderr_text();
  }
  ~QwenVocabularyModel() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Short calls for a random model: an enum and a bounded integer.
const json kShortTools = json::parse(
    R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string","enum":["Paris","Tokyo","Lima"]},)"
    R"("days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],)"
    R"("additionalProperties":false}}}])");

// tool_choice "auto" once the model opens a call (GenerationPlan::grammar_trigger): the random
// model never writes <tool_call> by itself, so logit_bias pushes that one token (+100); from the
// byte after it the calls' grammar holds the reply, which is then one well-formed call whose
// arguments valijson accepts (a random model left free would write noise after the tag), whole
// and streamed alike, greedy and sampled, in both formats. The same bias inside the think block
// (the Qwen3.5 prompt opens one) is thinking text: nothing is constrained there.
TEST(ServeTools, AutoConstrainsACallOnceTheModelOpensIt) {
  for (const std::string shape : {"tiny-qwen3moe", "tiny-qwen4exp"}) {
    SCOPED_TRACE(shape);
    const QwenVocabularyModel model(shape);
    ServeProcess server({"-m", model.path()});
    const HttpReply open = post(server, "/tokenize", json{{"content", "<tool_call>"}}.dump());
    ASSERT_EQ(open.status, 200) << open.body;
    ASSERT_EQ(open.json()["tokens"].size(), 1u) << open.body;  // the user-defined token
    const std::string open_id = std::to_string(open.json()["tokens"][0].get<int>());
    for (const uint64_t seed : {0, 1, 2}) {
      SCOPED_TRACE(fmt::format("seed {}", seed));
      json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                   {"tools", kShortTools},
                   {"tool_choice", "auto"},
                   {"parallel_tool_calls", false},
                   {"logit_bias", {{open_id, 100}}},
                   {"chat_template_kwargs", {{"enable_thinking", false}}},
                   {"max_tokens", 300},
                   {"temperature", seed == 0 ? 0.0 : 0.9},
                   {"seed", seed}};
      const json whole = chat(server, body);
      const json& reply = whole["choices"][0];
      EXPECT_EQ(reply["finish_reason"], "tool_calls") << reply.dump();
      ASSERT_EQ(reply["message"]["tool_calls"].size(), 1u) << reply.dump();
      const json& call = reply["message"]["tool_calls"][0]["function"];
      const std::string name = call["name"];
      EXPECT_EQ(name, "get_weather");
      const std::string arguments = call["arguments"];
      EXPECT_EQ(schema_errors(kShortTools[0]["function"]["parameters"], arguments), "");

      expect_the_call_streamed(server, body, name, arguments);
    }
    if (shape == "tiny-qwen4exp") {
      json thinking = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                       {"tools", kShortTools},
                       {"logit_bias", {{open_id, 100}}},
                       {"max_tokens", 6},
                       {"temperature", 0}};
      const json reply = chat(server, thinking)["choices"][0];
      EXPECT_EQ(reply["finish_reason"], "length") << reply.dump();
      EXPECT_EQ(reply["message"]["reasoning_content"],
                "<tool_call><tool_call><tool_call><tool_call><tool_call><tool_call>")
          << reply.dump();
      EXPECT_FALSE(reply["message"].contains("tool_calls")) << reply.dump();
    }
  }
}

}  // namespace
}  // namespace strata::serve::test
