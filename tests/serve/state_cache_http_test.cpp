// The conversation state cache through `strata serve` (curl against the binary with the embedded
// default model): a multi-turn chat reports usage.prompt_tokens_details.cached_tokens (0 on the
// first turn, at least the previous turn's prompt afterwards, in whole and streamed responses)
// and gives the same replies as a server started with --cache-ram 0 (which reports 0 always);
// a repeated completion prompt is cached whole; a bad --cache-ram fails at start naming the flag.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve_process.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;

const std::string kChat = "/v1/chat/completions";
const std::string kCompletions = "/v1/completions";

int64_t cached_tokens(const json& response) {
  return response["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
}

json chat_body(const json& messages, bool thinking, bool stream = false) {
  json body = {{"messages", messages},
               {"max_tokens", 24},
               {"temperature", 0},
               {"chat_template_kwargs", {{"enable_thinking", thinking}}}};
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return body;
}

TEST(ServeStateCache, MultiTurnChatReportsCachedTokensAndSameReplies) {
  ServeProcess cached_server({"--cache-ram", "512M"});
  ServeProcess plain_server({"--cache-ram", "0"});
  const std::vector<std::string> user = {
      "Tell me about the sea.", "And the mountains?", "Which do you prefer, and why?",
      "Say it in one word."};
  for (const bool thinking : {false, true}) {
    SCOPED_TRACE(thinking ? "thinking" : "no thinking");
    json messages = json::array({{{"role", "system"}, {"content", "You are terse."}}});
    int64_t previous_prompt = 0;
    for (size_t turn = 0; turn < user.size(); ++turn) {
      SCOPED_TRACE("turn " + std::to_string(turn + 1));
      messages.push_back({{"role", "user"}, {"content", user[turn]}});
      const std::string body = chat_body(messages, thinking).dump();
      const HttpReply with = post(cached_server, kChat, body);
      const HttpReply without = post(plain_server, kChat, body);
      ASSERT_EQ(with.status, 200) << with.body;
      ASSERT_EQ(without.status, 200) << without.body;
      const json a = with.json(), b = without.json();
      EXPECT_EQ(a["choices"][0]["message"], b["choices"][0]["message"]);
      EXPECT_EQ(a["choices"][0]["finish_reason"], b["choices"][0]["finish_reason"]);
      EXPECT_EQ(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
      EXPECT_EQ(a["usage"]["completion_tokens"], b["usage"]["completion_tokens"]);
      EXPECT_EQ(cached_tokens(b), 0);
      const int64_t prompt_tokens = a["usage"]["prompt_tokens"].get<int64_t>();
      if (turn == 0 && !thinking) {
        EXPECT_EQ(cached_tokens(a), 0);
      } else {
        // At least the previous turn's prompt (its after-prefill snapshot); without thinking the
        // reply is rendered back as generated, so the after-reply snapshot matches too.
        EXPECT_GE(cached_tokens(a), previous_prompt);
        EXPECT_LT(cached_tokens(a), prompt_tokens);
        if (!thinking && turn > 0) {
          EXPECT_GT(cached_tokens(a), previous_prompt + 1) << "the reply was not reused";
        }
      }
      previous_prompt = prompt_tokens;
      json reply = a["choices"][0]["message"];
      messages.push_back({{"role", "assistant"}, {"content", reply["content"]}});
    }
    // The same conversation once more, streamed: the whole prompt up to the last user message
    // comes from the cache, and the final usage chunk says so.
    const HttpReply streamed = post(cached_server, kChat, chat_body(messages, thinking, true).dump());
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    const std::vector<std::string> events = sse_data(streamed.body);
    ASSERT_GE(events.size(), 2u);
    const json usage_chunk = json::parse(events[events.size() - 2]);
    ASSERT_TRUE(usage_chunk["usage"].is_object()) << usage_chunk.dump();
    EXPECT_GE(cached_tokens(usage_chunk), previous_prompt);
  }
}

TEST(ServeStateCache, RepeatedCompletionPromptIsCachedWhole) {
  ServeProcess server;  // the default --cache-ram
  const std::string body =
      R"({"prompt":"The quick brown fox jumps over the lazy dog.","max_tokens":16,"temperature":0})";
  const json first = post(server, kCompletions, body).json();
  const json second = post(server, kCompletions, body).json();
  EXPECT_EQ(cached_tokens(first), 0);
  EXPECT_EQ(cached_tokens(second), second["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(first["choices"][0]["text"], second["choices"][0]["text"]);
  // A longer prompt that starts with the first one's prompt and reply.
  const std::string longer = fmt::format(
      R"({{"prompt":{},"max_tokens":8,"temperature":0}})",
      json("The quick brown fox jumps over the lazy dog." +
           first["choices"][0]["text"].get<std::string>() + " Then")
          .dump());
  const json third = post(server, kCompletions, longer).json();
  EXPECT_GE(cached_tokens(third), first["usage"]["prompt_tokens"].get<int64_t>());
}

TEST(ServeStateCache, BadCacheRamFailsAtStartNamingTheFlag) {
  for (const std::string value : {"12Q", "lots", "2GG"}) {
    ChildProcess serve({STRATA_BINARY, "serve", "--port", "0", "--cache-ram", value});
    const std::optional<int> code = serve.wait(60);
    ASSERT_TRUE(code.has_value()) << value;
    EXPECT_NE(*code, 0) << value;
    const std::string err = serve.stderr_text();
    EXPECT_NE(err.find("--cache-ram"), std::string::npos) << err;
    EXPECT_NE(err.find("expected a size like"), std::string::npos) << err;
    EXPECT_NE(err.find(value), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace strata::serve::test
