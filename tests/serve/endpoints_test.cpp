// llama-server's utility endpoints (/tokenize, /detokenize, /props), CORS (--cors-origin) and the
// API key (--api-key, --api-key-file) through the real binary and curl.
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
  EXPECT_EQ(strata["experts"]["source"], "mapped");
  EXPECT_GT(strata["experts"]["n_expert"].get<int>(), 0);
}

TEST(ServeEndpoints, CorsOriginsPreflightAndHeaders) {
  ServeProcess server({"--cors-origin", "http://a.example", "--cors-origin", "http://b.example:3000"});
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
  expect_error(curl("OPTIONS", closed.url("/v1/models"), std::nullopt,
                    {"-H", "Origin: http://a.example"}),
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

}  // namespace
}  // namespace strata::serve::test
