// Anthropic's tool use on /v1/messages through a real `strata serve` on the default model: a
// call forced by tool_choice {"type": "tool"} is the call /v1/chat/completions gives for the same
// request (same seed: same tokens), a tool_use block whose input valijson accepts; its stream of
// events (tool_use content_block_start, input_json_delta fragments, blocks numbered in order)
// puts back together into the whole reply; the call and its tool_result sent back as history
// give the prompt the OpenAI body with the same conversation gives; errors are Anthropic-shaped
// and name the body's own fields. The translation itself: anthropic_request_test.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "schema_errors.h"
#include "serve_process.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;

// Short calls for the random model: an enum and a bounded integer, each a few tokens.
const json kWeatherTool = json::parse(R"({"name":"get_weather","description":"Weather in a city",
    "input_schema":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Tokyo","Lima"]},
    "days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],
    "additionalProperties":false}})");

// Chat bodies keep their keys in the order written: the template renders a tool as sent, and
// an Anthropic tool is translated to {"type", "function": {"name", "description", "parameters"}}.
using OrderedJson = nlohmann::ordered_json;

OrderedJson ordered(const json& value) {
  return OrderedJson::parse(value.dump());
}

// The same tool as an OpenAI client sends it to /v1/chat/completions.
OrderedJson openai_tool(const json& tool) {
  return OrderedJson{{"type", "function"},
                     {"function",
                      {{"name", tool["name"].get<std::string>()},
                       {"description", tool["description"].get<std::string>()},
                       {"parameters", ordered(tool["input_schema"])}}}};
}

json post_text(const ServeProcess& server, const std::string& path, const std::string& body) {
  const HttpReply reply = post(server, path, body);
  EXPECT_EQ(reply.status, 200) << reply.body;
  return reply.json();
}

json post_json(const ServeProcess& server, const std::string& path, const json& body) {
  return post_text(server, path, body.dump());
}

json post_chat(const ServeProcess& server, const OrderedJson& body) {
  return post_text(server, "/v1/chat/completions", body.dump());
}

// A streamed message put back together from its events, as the SDKs' stream accumulators do:
// blocks opened in order and numbered 0, 1, … whatever their type, each delta appended to the
// open block (a tool_use block's input_json_delta fragments parsed as JSON at its stop), then
// message_delta's stop_reason and output_tokens. An event out of place is a test failure.
json reassemble(const std::vector<std::pair<std::string, json>>& events) {
  json message;
  json content = json::array();
  std::string partial_json;
  bool open = false;
  for (const auto& [name, data] : events) {
    EXPECT_EQ(data["type"], name);
    if (name == "message_start") {
      message = data["message"];
    } else if (name == "content_block_start") {
      EXPECT_FALSE(open) << data;
      EXPECT_EQ(data["index"], content.size()) << data;
      content.push_back(data["content_block"]);
      partial_json.clear();
      open = true;
    } else if (name == "content_block_delta") {
      EXPECT_TRUE(open) << data;
      EXPECT_EQ(data["index"], content.size() - 1) << data;
      json& block = content.back();
      const json& delta = data["delta"];
      if (delta["type"] == "text_delta" && block["type"] == "text") {
        block["text"] = block["text"].get<std::string>() + delta["text"].get<std::string>();
      } else if (delta["type"] == "thinking_delta" && block["type"] == "thinking") {
        block["thinking"] =
            block["thinking"].get<std::string>() + delta["thinking"].get<std::string>();
      } else if (delta["type"] == "input_json_delta" && block["type"] == "tool_use") {
        partial_json += delta["partial_json"].get<std::string>();
      } else {
        ADD_FAILURE() << "a " << delta["type"] << " in a " << block["type"] << " block";
      }
    } else if (name == "content_block_stop") {
      EXPECT_TRUE(open) << data;
      EXPECT_EQ(data["index"], content.size() - 1) << data;
      if (content.back()["type"] == "tool_use") content.back()["input"] = json::parse(partial_json);
      open = false;
    } else if (name == "message_delta") {
      message["stop_reason"] = data["delta"]["stop_reason"];
      message["stop_sequence"] = data["delta"]["stop_sequence"];
      message["usage"]["output_tokens"] = data["usage"]["output_tokens"];
    } else {
      EXPECT_EQ(name, "message_stop");
    }
  }
  EXPECT_FALSE(open);
  message["content"] = std::move(content);
  return message;
}

// `message` with its ids (random per reply) replaced by their prefixes, after checking them.
json without_ids(json message) {
  EXPECT_EQ(message["id"].get<std::string>().rfind("msg_", 0), 0u) << message;
  message["id"] = "msg_";
  for (json& block : message["content"]) {
    if (block["type"] != "tool_use") continue;
    const std::string id = block["id"];
    EXPECT_EQ(id.rfind("toolu_", 0), 0u) << id;
    EXPECT_GT(id.size(), 6u) << id;
    block["id"] = "toolu_";
  }
  return message;
}

json forced_call_request(uint64_t seed) {
  return json{{"max_tokens", 200},
              {"temperature", 0.9},
              {"seed", seed},
              {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
              {"tools", {kWeatherTool}},
              // One call: the grammar ends the reply after it (more could run into max_tokens).
              {"tool_choice",
               {{"type", "tool"}, {"name", "get_weather"}, {"disable_parallel_tool_use", true}}}};
}

TEST(ServeAnthropicTools, AForcedToolUseIsTheChatCallWholeAndStreamed) {
  ServeProcess server;
  for (const uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    json request = forced_call_request(seed);
    const json whole = post_json(server, "/v1/messages", request);
    EXPECT_EQ(whole["stop_reason"], "tool_use") << whole;
    EXPECT_TRUE(whole["stop_sequence"].is_null());
    // The call and nothing else: no text was written around it.
    ASSERT_EQ(whole["content"].size(), 1u) << whole;
    const json& call = whole["content"][0];
    EXPECT_EQ(call["type"], "tool_use");
    EXPECT_EQ(call["name"], "get_weather");
    ASSERT_TRUE(call["input"].is_object()) << call;
    EXPECT_EQ(schema_errors(kWeatherTool["input_schema"], call["input"].dump()), "");

    // The OpenAI request with the same conversation, tool and choice: the same tokens.
    const json chat = post_chat(
        server, {{"max_tokens", 200},
                 {"temperature", 0.9},
                 {"seed", seed},
                 {"messages", ordered(request["messages"])},
                 {"tools", {openai_tool(kWeatherTool)}},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                 {"parallel_tool_calls", false}});
    const json& chat_call = chat["choices"][0]["message"]["tool_calls"][0]["function"];
    EXPECT_EQ(chat_call["name"], call["name"]);
    EXPECT_EQ(json::parse(chat_call["arguments"].get<std::string>()), call["input"]);
    EXPECT_EQ(chat["usage"]["prompt_tokens"], whole["usage"]["input_tokens"]);
    EXPECT_EQ(chat["usage"]["completion_tokens"], whole["usage"]["output_tokens"]);

    request["stream"] = true;
    const HttpReply streamed = post(server, "/v1/messages", request.dump());
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    EXPECT_EQ(streamed.header("Content-Type"), "text/event-stream");
    const auto events = anthropic_events(streamed.body);
    // The tool_use block opens with an empty input; its arguments come as fragments.
    int fragments = 0;
    for (const auto& [name, data] : events) {
      if (name == "content_block_start" && data["content_block"]["type"] == "tool_use") {
        EXPECT_EQ(data["content_block"]["input"], json::object()) << data;
      }
      fragments += name == "content_block_delta";
    }
    EXPECT_GE(fragments, 1);
    EXPECT_EQ(without_ids(reassemble(events)), without_ids(whole));
  }
}

// The call and its tool_result sent back as history: the prompt of the OpenAI body with the same
// conversation, and the same greedy reply (tool_choice auto, thinking on), whole and streamed.
TEST(ServeAnthropicTools, ToolResultsRoundTripAsTheChatHistory) {
  ServeProcess server;
  const json first = post_json(server, "/v1/messages", forced_call_request(1));
  ASSERT_EQ(first["content"].size(), 1u) << first;
  const json& call = first["content"][0];
  const json messages = {{{"role", "user"}, {"content", "Weather in Paris?"}},
                         {{"role", "assistant"}, {"content", first["content"]}},
                         {{"role", "user"},
                          {"content",
                           {{{"type", "tool_result"},
                             {"tool_use_id", call["id"]},
                             {"content", {{{"type", "text"}, {"text", "21 C, sunny"}}}}},
                            {{"type", "text"}, {"text", "And tomorrow?"}}}}}};
  json request = {{"max_tokens", 6},
                  {"temperature", 0},
                  {"messages", messages},
                  {"tools", {kWeatherTool}},
                  {"thinking", {{"type", "enabled"}}}};
  const json reply = post_json(server, "/v1/messages", request);
  // What an OpenAI client sends for the same conversation.
  const json chat_messages = {
      {{"role", "user"}, {"content", "Weather in Paris?"}},
      {{"role", "assistant"},
       {"content", ""},
       {"tool_calls",
        {{{"id", call["id"]},
          {"type", "function"},
          {"function", {{"name", call["name"]}, {"arguments", call["input"].dump()}}}}}}},
      {{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "21 C, sunny"}},
      {{"role", "user"}, {"content", "And tomorrow?"}}};
  const json chat = post_chat(server, {{"max_tokens", 6},
                                       {"temperature", 0},
                                       {"messages", ordered(chat_messages)},
                                       {"tools", {openai_tool(kWeatherTool)}},
                                       {"chat_template_kwargs", {{"enable_thinking", true}}}});
  EXPECT_EQ(reply["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_GT(reply["usage"]["input_tokens"], first["usage"]["input_tokens"]);
  // Greedy: the same reply, block by block.
  const json& chat_message = chat["choices"][0]["message"];
  std::string thinking, text;
  for (const json& block : reply["content"]) {
    if (block["type"] == "thinking") thinking += block["thinking"].get<std::string>();
    if (block["type"] == "text") text += block["text"].get<std::string>();
  }
  EXPECT_EQ(thinking, chat_message.value("reasoning_content", ""));
  EXPECT_EQ(text, chat_message["content"].is_null() ? std::string()
                                                    : chat_message["content"].get<std::string>());

  request["stream"] = true;
  const HttpReply streamed = post(server, "/v1/messages", request.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(without_ids(reassemble(anthropic_events(streamed.body))), without_ids(reply));

  // An error reported back: the model reads it as such, so the prompt differs.
  json failed = request;
  failed["stream"] = false;
  failed["messages"][2]["content"][0]["is_error"] = true;
  EXPECT_GT(post_json(server, "/v1/messages", failed)["usage"]["input_tokens"],
            reply["usage"]["input_tokens"]);
}

// 400s in Anthropic's error shape, naming the body's own fields, also for what only the plan
// finds (a schema the forced call's grammar cannot honour).
TEST(ServeAnthropicTools, ToolErrorsNameTheAnthropicField) {
  ServeProcess server;
  auto expect_refused = [&](const json& body, const std::string& param) {
    const HttpReply reply = post(server, "/v1/messages", body.dump());
    EXPECT_EQ(reply.status, 400) << reply.body;
    const json error = reply.json();
    EXPECT_EQ(error["type"], "error") << reply.body;
    EXPECT_EQ(error["error"]["type"], "invalid_request_error") << reply.body;
    EXPECT_EQ(error["error"]["message"].get<std::string>().rfind(param + ": ", 0), 0u)
        << reply.body;
  };
  json schema_refused = forced_call_request(1);
  schema_refused["tool_choice"] = {{"type", "any"}};
  schema_refused["tools"][0]["input_schema"]["properties"]["city"] = {{"type", "string"},
                                                                      {"maxLength", 20}};
  expect_refused(schema_refused, "tools[0].input_schema.properties.city.maxLength");

  json unknown_tool = forced_call_request(1);
  unknown_tool["tool_choice"]["name"] = "get_time";
  expect_refused(unknown_tool, "tool_choice.name");

  json unanswered = forced_call_request(1);
  unanswered["messages"] = {
      {{"role", "user"}, {"content", "Weather?"}},
      {{"role", "assistant"}, {"content", "Let me see."}},
      {{"role", "user"},
       {"content", {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "21"}}}}}};
  expect_refused(unanswered, "messages[2].content[0].tool_use_id");
}

}  // namespace
}  // namespace strata::serve::test
