// Tools through a real `strata serve` on the default model (random weights, the Qwen3.5 chat
// format): the prompt holds exactly what the chat template renders for the tools, tool_choice
// "none" leaves them out and a forced choice opens the call; tool calls and tool results sent
// back as history are rendered; the random model's unfinished forced call comes back as content,
// streamed and whole, and is not announced as a call in the stream. Parsing of well-formed calls is
// tested on the templates' own text in tool_calls_test.cpp (a random model cannot be made to write
// one).
#include <fmt/format.h>
#include <gtest/gtest.h>

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

TEST(ServeTools, AnUnfinishedForcedCallComesBackAsContent) {
  ServeProcess server;
  json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
               {"tools", kTools},
               {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
               {"max_tokens", 24},
               {"temperature", 0}};
  const json whole = chat(server, body);
  const json& choice = whole["choices"][0];
  const std::string prefix = tool_call_prefix(ToolCallFormat::Xml, "get_weather");
  if (choice["message"].contains("tool_calls")) {  // the random model closed the call after all
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_TRUE(
        json::parse(choice["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>())
            .is_object());
  } else {
    // Malformed or unfinished: the block as written, the forced prefix included.
    const std::string content = choice["message"]["content"];
    EXPECT_EQ(content.rfind(prefix, 0), 0u) << content;
    EXPECT_NE(choice["finish_reason"], "tool_calls");
  }
  // Streamed: the same content and finish_reason, and a call (if the model made one) in
  // fragments: its first delta has index, id, type and name, the next ones arguments that join
  // to the whole response's. The random model does not finish the call it was started in, and
  // that malformed block must not be announced as a call before it breaks
  // (tool_calls_test.cpp checks the fragments on the templates' own calls).
  body["stream"] = true;
  const HttpReply streamed = post(server, kChat, body.dump());
  ASSERT_EQ(streamed.status, 200);
  std::string content, arguments;
  int argument_fragments = 0;
  json finish, header;
  for (const std::string& event : sse_data(streamed.body)) {
    if (event == "[DONE]") break;
    const json c = json::parse(event)["choices"][0];
    content += c["delta"].value("content", "");
    for (const json& call : c["delta"].value("tool_calls", json::array())) {
      EXPECT_EQ(call["index"], 0);
      if (call.contains("id")) {
        EXPECT_TRUE(header.is_null()) << "a second call header";
        header = call;
        EXPECT_EQ(call["type"], "function");
        EXPECT_EQ(call["function"]["arguments"], "");
      } else {
        ++argument_fragments;
        arguments += call["function"]["arguments"].get<std::string>();
      }
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(finish, choice["finish_reason"]);
  if (!choice["message"].contains("tool_calls")) {
    EXPECT_EQ(content, choice["message"]["content"].get<std::string>());
    EXPECT_TRUE(header.is_null()) << header.dump();
  } else {
    const json& call = choice["message"]["tool_calls"][0];
    EXPECT_EQ(header["function"]["name"], call["function"]["name"]);
    EXPECT_EQ(arguments, call["function"]["arguments"].get<std::string>());
    if (arguments.size() > 8) {
      EXPECT_GT(argument_fragments, 1);
    }
  }
}

}  // namespace
}  // namespace strata::serve::test
