// llama-server's utility endpoints (/tokenize, /detokenize, /props), Anthropic's /v1/messages,
// CORS (--cors-origin) and the API key (--api-key, --api-key-file) through the real binary and
// curl.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "serve_process.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;

void expect_error(const HttpReply& reply, int status, const std::string& param,
                  const std::string& in_message) {
  EXPECT_EQ(reply.status, status) << reply.body;
  const json body = reply.json();
  ASSERT_TRUE(body.contains("error")) << reply.body;
  EXPECT_EQ(body["error"]["param"], param.empty() ? json(nullptr) : json(param)) << reply.body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find(in_message), std::string::npos)
      << reply.body;
}

TEST(ServeEndpoints, TokenizeAndDetokenizeRoundTrip) {
  ServeProcess server;
  const std::string text = "Hello wörld <|im_start|>";
  const json plain = post(server, "/tokenize", json{{"content", text}}.dump()).json();
  ASSERT_TRUE(plain["tokens"].is_array()) << plain.dump();
  ASSERT_GT(plain["tokens"].size(), 3u);
  for (const json& id : plain["tokens"]) EXPECT_TRUE(id.is_number_integer()) << plain.dump();
  const HttpReply back = post(server, "/detokenize", json{{"tokens", plain["tokens"]}}.dump());
  ASSERT_EQ(back.status, 200) << back.body;
  EXPECT_EQ(back.json()["content"], text);

  // Pieces: their bytes concatenate to the text; "ö" is split into single bytes here, which
  // llama-server reports as byte lists; the control token is one piece.
  const json pieces =
      post(server, "/tokenize", json{{"content", text}, {"with_pieces", true}}.dump()).json();
  ASSERT_EQ(pieces["tokens"].size(), plain["tokens"].size());
  std::string joined;
  bool saw_bytes = false, saw_control = false;
  for (size_t i = 0; i < pieces["tokens"].size(); ++i) {
    const json& token = pieces["tokens"][i];
    EXPECT_EQ(token["id"], plain["tokens"][i]);
    if (token["piece"].is_string()) {
      joined += token["piece"].get<std::string>();
      saw_control |= token["piece"] == "<|im_start|>";
    } else {
      saw_bytes = true;
      for (const json& byte : token["piece"]) joined += char(byte.get<int>());
    }
  }
  EXPECT_EQ(joined, text);
  EXPECT_TRUE(saw_bytes) << pieces.dump();
  EXPECT_TRUE(saw_control) << pieces.dump();
  // parse_special false: the control token's text is ordinary text, several tokens.
  const json literal =
      post(server, "/tokenize", json{{"content", "<|im_start|>"}, {"parse_special", false}}.dump())
          .json();
  EXPECT_GT(literal["tokens"].size(), 1u) << literal.dump();

  expect_error(post(server, "/tokenize", "{}"), 400, "content", "missing");
  expect_error(post(server, "/tokenize", R"({"content":5})"), 400, "content", "string");
  expect_error(post(server, "/detokenize", R"({"tokens":[1,"x"]})"), 400, "tokens[1]", "\"x\"");
  expect_error(post(server, "/detokenize", R"({"tokens":[99999999]})"), 400, "tokens[0]",
               "between 0 and");
  expect_error(post(server, "/detokenize", R"({"tokens":[1]} [2])"), 400, "",
               "unexpected data after the JSON object");
}

TEST(ServeEndpoints, PropsReportContextModelAndBudgets) {
  ServeProcess server({"--seed", "5", "--max-queue", "7", "--timeout", "9"});
  const HttpReply reply = get(server, "/props");
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json props = reply.json();
  const json& settings = props["default_generation_settings"];
  EXPECT_EQ(settings["n_ctx"], 4096);
  EXPECT_EQ(settings["is_processing"], false);
  EXPECT_EQ(settings["params"]["temperature"], 0.8);  // serve's default, as written
  EXPECT_EQ(settings["params"]["top_p"], 0.95);
  EXPECT_EQ(settings["params"]["seed"], 5);
  EXPECT_EQ(props["total_slots"], 1);
  EXPECT_TRUE(props["model_path"].get<std::string>().ends_with("strata-default.gguf"));
  EXPECT_EQ(props["build_info"].get<std::string>().rfind("strata ", 0), 0u) << props.dump();
  EXPECT_EQ(props["modalities"]["vision"], false);
  const json& strata = props["strata"];
  EXPECT_EQ(strata["model"], "strata-default");
  EXPECT_EQ(strata["max_queue"], 7);
  EXPECT_EQ(strata["max_connections"], 7 + 16);
  EXPECT_EQ(strata["timeout_s"], 9);
  EXPECT_EQ(strata["speculative"], "off");
  EXPECT_EQ(strata["batch_groups"]["groups"], 1);  // auto with one slot
  EXPECT_EQ(strata["batch_groups"]["reason"], "auto: --parallel 1 has no batched steps");
  EXPECT_EQ(strata["experts"]["source"], "mapped");
  EXPECT_GT(strata["experts"]["n_expert"].get<int>(), 0);
}

// --ctx: every request's session holds exactly that many tokens; /props reports it and a request
// that would not fit is a 400 naming it (not the model's 4096).
TEST(ServeEndpoints, CtxSetsTheContextOfEveryRequest) {
  ServeProcess server({"--ctx", "24"});
  const HttpReply props = get(server, "/props");
  ASSERT_EQ(props.status, 200) << props.body;
  EXPECT_EQ(props.json()["default_generation_settings"]["n_ctx"], 24);
  const HttpReply too_long =
      post(server, "/v1/completions", R"({"prompt":"And God said","max_tokens":22})");
  EXPECT_EQ(too_long.status, 400) << too_long.body;
  EXPECT_NE(too_long.body.find("exceed the context of 24 tokens"), std::string::npos)
      << too_long.body;
  // Without max_tokens the reply runs to the end of the context: finish_reason "length".
  const HttpReply to_the_end = post(
      server, "/v1/completions", R"({"prompt":"And God said","temperature":0,"ignore_eos":true})");
  ASSERT_EQ(to_the_end.status, 200) << to_the_end.body;
  const json reply = to_the_end.json();
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(
      reply["usage"]["prompt_tokens"].get<int>() + reply["usage"]["completion_tokens"].get<int>(),
      24);
  EXPECT_EQ(server.terminate(15), 0);
}

TEST(ServeEndpoints, CorsOriginsPreflightAndHeaders) {
  ServeProcess server(
      {"--cors-origin", "http://a.example", "--cors-origin", "http://b.example:3000"});
  const HttpReply preflight =
      curl("OPTIONS", server.url("/v1/chat/completions"), std::nullopt,
           {"-H", "Origin: http://a.example", "-H", "Access-Control-Request-Method: POST", "-H",
            "Access-Control-Request-Headers: authorization, content-type"});
  EXPECT_EQ(preflight.status, 204) << preflight.headers;
  EXPECT_EQ(preflight.header("Access-Control-Allow-Origin"), "http://a.example");
  EXPECT_EQ(preflight.header("Access-Control-Allow-Methods"), "GET, POST, OPTIONS");
  EXPECT_EQ(preflight.header("Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_EQ(preflight.header("Vary"), "Origin");

  const HttpReply other = curl("OPTIONS", server.url("/v1/models"), std::nullopt,
                               {"-H", "Origin: http://evil.example"});
  expect_error(other, 403, "", "http://evil.example");
  EXPECT_EQ(other.header("Access-Control-Allow-Origin"), "");

  const HttpReply allowed =
      curl("GET", server.url("/v1/models"), std::nullopt, {"-H", "Origin: http://b.example:3000"});
  EXPECT_EQ(allowed.status, 200);
  EXPECT_EQ(allowed.header("Access-Control-Allow-Origin"), "http://b.example:3000");
  // Errors carry the header too, or a browser page could not read them.
  EXPECT_EQ(curl("GET", server.url("/nope"), std::nullopt, {"-H", "Origin: http://a.example"})
                .header("Access-Control-Allow-Origin"),
            "http://a.example");
  EXPECT_EQ(get(server, "/v1/models").header("Access-Control-Allow-Origin"), "");
  EXPECT_EQ(curl("GET", server.url("/v1/models"), std::nullopt, {"-H", "Origin: http://c.example"})
                .header("Access-Control-Allow-Origin"),
            "");

  ServeProcess closed;  // no --cors-origin: no CORS headers, preflights refused
  EXPECT_EQ(curl("GET", closed.url("/v1/models"), std::nullopt, {"-H", "Origin: http://a.example"})
                .header("Access-Control-Allow-Origin"),
            "");
  expect_error(
      curl("OPTIONS", closed.url("/v1/models"), std::nullopt, {"-H", "Origin: http://a.example"}),
      403, "", "--cors-origin");
}

TEST(ServeEndpoints, ApiKeyIsRequiredExceptForHealthAndThePage) {
  const std::string key_file =
      (std::filesystem::temp_directory_path() / ("strata-keys-" + std::to_string(getpid())))
          .string();
  std::ofstream(key_file) << "\n  second-key  \n";
  ServeProcess server({"--api-key", "first-key", "--api-key-file", key_file, "--cors-origin", "*"});
  std::filesystem::remove(key_file);
  const std::string body = R"({"prompt":"x","max_tokens":2})";

  const HttpReply none = post(server, "/v1/completions", body);
  expect_error(none, 401, "", "no API key given");
  EXPECT_EQ(none.json()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(none.header("WWW-Authenticate"), "Bearer");
  expect_error(post(server, "/v1/completions", body, {"-H", "Authorization: Bearer first-ke"}), 401,
               "", "not valid");
  expect_error(post(server, "/v1/completions", body, {"-H", "Authorization: Bearer first-keyy"}),
               401, "", "not valid");
  for (const char* route : {"/v1/models", "/metrics", "/props", "/api/dashboard"})
    EXPECT_EQ(get(server, route).status, 401) << route;

  EXPECT_EQ(post(server, "/v1/completions", body, {"-H", "Authorization: Bearer first-key"}).status,
            200);
  EXPECT_EQ(post(server, "/v1/completions", body, {"-H", "X-Api-Key: second-key"}).status, 200);
  EXPECT_EQ(curl("GET", server.url("/v1/models"), std::nullopt,
                 {"-H", "authorization: bearer second-key"})
                .status,
            200);
  EXPECT_EQ(get(server, "/health").status, 200);
  EXPECT_EQ(get(server, "/").status, 200);  // the page itself; its API calls need the key
  // A browser's preflight carries no key and must pass.
  EXPECT_EQ(curl("OPTIONS", server.url("/v1/completions"), std::nullopt,
                 {"-H", "Origin: http://a.example", "-H", "Access-Control-Request-Method: POST"})
                .status,
            204);
  // The refused body was not read: the connection is closed, and the server carries on.
  EXPECT_EQ(post(server, "/v1/completions", std::string(100000, ' ')).status, 401);
  EXPECT_EQ(get(server, "/health").status, 200);
}

TEST(ServeEndpoints, AnthropicMessagesWholeAndStreamed) {
  ServeProcess server;
  for (const bool thinking : {false, true}) {
    SCOPED_TRACE(thinking ? "thinking" : "no thinking");
    json request = {
        {"model", "strata-default"}, {"max_tokens", 12},
        {"system", "Be brief."},     {"messages", {{{"role", "user"}, {"content", "Hello"}}}},
        {"temperature", 0},          {"thinking", {{"type", thinking ? "enabled" : "disabled"}}}};
    const HttpReply whole = post(server, "/v1/messages", request.dump());
    ASSERT_EQ(whole.status, 200) << whole.body;
    const json message = whole.json();
    EXPECT_EQ(message["id"].get<std::string>().rfind("msg_", 0), 0u);
    EXPECT_EQ(message["type"], "message");
    EXPECT_EQ(message["role"], "assistant");
    EXPECT_EQ(message["model"], "strata-default");
    EXPECT_EQ(message["stop_reason"], "max_tokens");
    EXPECT_TRUE(message["stop_sequence"].is_null());
    EXPECT_EQ(message["usage"]["output_tokens"], 12);
    EXPECT_GT(message["usage"]["input_tokens"].get<int>(), 0);
    std::string text, reasoning;
    for (const json& block : message["content"]) {
      if (block["type"] == "thinking") reasoning += block["thinking"].get<std::string>();
      if (block["type"] == "text") text += block["text"].get<std::string>();
    }
    ASSERT_EQ(message["content"].back()["type"], "text");
    if (!thinking) {
      EXPECT_TRUE(reasoning.empty());
    }

    request["stream"] = true;
    const HttpReply streamed = post(server, "/v1/messages", request.dump());
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    EXPECT_EQ(streamed.header("Content-Type"), "text/event-stream");
    const auto events = anthropic_events(streamed.body);
    ASSERT_GE(events.size(), 5u);
    EXPECT_EQ(events.front().first, "message_start");
    EXPECT_EQ(events.front().second["message"]["usage"]["input_tokens"],
              message["usage"]["input_tokens"]);
    EXPECT_EQ(events.back().first, "message_stop");
    const json& last_delta = events[events.size() - 2].second;
    EXPECT_EQ(last_delta["type"], "message_delta");
    EXPECT_EQ(last_delta["delta"]["stop_reason"], "max_tokens");
    EXPECT_EQ(last_delta["usage"]["output_tokens"], 12);
    // Blocks open, take deltas of their kind and close in order, numbered from 0.
    std::string streamed_text, streamed_reasoning, open_kind;
    int index = -1;
    for (const auto& [name, data] : events) {
      EXPECT_EQ(data["type"], name);
      if (name == "content_block_start") {
        EXPECT_TRUE(open_kind.empty());
        EXPECT_EQ(data["index"], ++index);
        open_kind = data["content_block"]["type"];
      } else if (name == "content_block_delta") {
        EXPECT_EQ(data["index"], index);
        if (open_kind == "thinking")
          streamed_reasoning += data["delta"]["thinking"].get<std::string>();
        if (open_kind == "text") streamed_text += data["delta"]["text"].get<std::string>();
        EXPECT_EQ(data["delta"]["type"], open_kind + "_delta");
      } else if (name == "content_block_stop") {
        EXPECT_EQ(data["index"], index);
        open_kind.clear();
      }
    }
    EXPECT_EQ(streamed_text, text);
    EXPECT_EQ(streamed_reasoning, reasoning);
  }

  // Anthropic's error shape, with its type from the status.
  const HttpReply missing =
      post(server, "/v1/messages", R"({"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(missing.json()["type"], "error");
  EXPECT_EQ(missing.json()["error"]["type"], "invalid_request_error");
  EXPECT_NE(missing.json()["error"]["message"].get<std::string>().find("max_tokens: required"),
            std::string::npos);
  const HttpReply unknown =
      post(server, "/v1/messages",
           R"({"model":"claude-x","max_tokens":4,"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.json()["error"]["type"], "not_found_error");
}

// Anthropic's stop_reason "stop_sequence" names the stop sequence that ended the reply (it was
// "end_turn" with stop_sequence null, which a client cannot tell from the model ending its turn).
TEST(ServeEndpoints, AnthropicStopSequenceIsReportedByName) {
  ServeProcess server;
  json request = {{"model", "strata-default"},
                  {"max_tokens", 24},
                  {"messages", {{{"role", "user"}, {"content", "Tell me about the sea."}}}},
                  {"temperature", 0},
                  {"thinking", {{"type", "disabled"}}}};
  const HttpReply free = post(server, "/v1/messages", request.dump());
  ASSERT_EQ(free.status, 200) << free.body;
  const std::string text = free.json()["content"].back()["text"].get<std::string>();
  ASSERT_GE(text.size(), 8u) << text;
  // Three bytes from the middle of the greedy reply (ASCII, so no character is cut), and one that
  // never comes: the reply ends before the first occurrence of the three.
  size_t at = text.size() / 2;
  while (at + 3 < text.size() && (static_cast<unsigned char>(text[at]) >= 0x80 ||
                                  static_cast<unsigned char>(text[at + 1]) >= 0x80 ||
                                  static_cast<unsigned char>(text[at + 2]) >= 0x80))
    ++at;
  ASSERT_LE(at + 3, text.size()) << text;
  const std::string stop = text.substr(at, 3);
  request["stop_sequences"] = {"~never~", stop};
  const HttpReply whole = post(server, "/v1/messages", request.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json message = whole.json();
  EXPECT_EQ(message["content"].back()["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(message["stop_reason"], "stop_sequence") << message.dump();
  EXPECT_EQ(message["stop_sequence"], stop) << message.dump();

  request["stream"] = true;
  const HttpReply streamed = post(server, "/v1/messages", request.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  const auto events = anthropic_events(streamed.body);
  ASSERT_GE(events.size(), 3u);
  const json& last_delta = events[events.size() - 2].second;
  EXPECT_EQ(last_delta["delta"]["stop_reason"], "stop_sequence") << last_delta.dump();
  EXPECT_EQ(last_delta["delta"]["stop_sequence"], stop) << last_delta.dump();

  // A reply that ends without one keeps stop_sequence null.
  request["stream"] = false;
  request["stop_sequences"] = {"~never~"};
  const json unmatched = post(server, "/v1/messages", request.dump()).json();
  EXPECT_EQ(unmatched["stop_reason"], free.json()["stop_reason"]);
  EXPECT_NE(unmatched["stop_reason"], "stop_sequence");
  EXPECT_TRUE(unmatched["stop_sequence"].is_null());
}

// Issue 17: `/v1/embeddings` was a 404 "no route", which reads like a wrong base URL. strata
// computes no embeddings (the served model is a generative one and no pooling is defined for it):
// both paths clients use answer 501 naming the endpoint and why, as llama-server does when it was
// started without --embeddings, with the key checked first like every other route.
TEST(ServeEndpoints, EmbeddingsAreRefusedAsNotSupported) {
  ServeProcess server({"--api-key", "k"});
  const std::string body = R"({"model":"strata-default","input":"Hello"})";
  for (const char* path : {"/v1/embeddings", "/embeddings"}) {
    SCOPED_TRACE(path);
    const HttpReply reply = post(server, path, body, {"-H", "Authorization: Bearer k"});
    expect_error(reply, 501, "", "does not compute embeddings");
    EXPECT_EQ(reply.json()["error"]["type"], "not_supported_error") << reply.body;
    EXPECT_EQ(reply.json()["error"]["code"], "embeddings_not_supported") << reply.body;
    EXPECT_NE(reply.body.find(path), std::string::npos) << reply.body;
    EXPECT_EQ(post(server, path, body).status, 401);
  }
}

}  // namespace
}  // namespace strata::serve::test
