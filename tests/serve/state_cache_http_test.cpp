// The conversation state cache through `strata serve` (curl against the binary with the embedded
// default model): a multi-turn chat reports usage.prompt_tokens_details.cached_tokens (0 on the
// first turn, then all but less than one prefill window (and the generation prompt) of the
// previous turn's prompt, in whole and streamed responses)
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

constexpr int64_t kWindow = 64;           // serve's prefill window
constexpr int64_t kGenerationPrompt = 16;  // "<|im_start|>assistant\n<think>\n\n</think>\n\n" and so on

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
      // The default model has DeltaNet layers: the cache resumes only at 64-token prefill-window
      // boundaries (decode/state_cache.h), the last one inside an earlier prompt that still
      // prefixes this one. The previous prompt's tail that the next one renders differently (the
      // generation prompt's empty think block) is at most a few tokens.
      EXPECT_EQ(cached_tokens(a) % 64, 0);
      EXPECT_LT(cached_tokens(a), prompt_tokens);
      if (turn == 0 && !thinking) {
        EXPECT_EQ(cached_tokens(a), 0);
      }
      if (previous_prompt > kWindow + kGenerationPrompt) {
        EXPECT_GE(cached_tokens(a) + kWindow + kGenerationPrompt, previous_prompt);
      }
      previous_prompt = prompt_tokens;
      json reply = a["choices"][0]["message"];
      messages.push_back({{"role", "assistant"}, {"content", reply["content"]}});
    }
    // The conversation once more, streamed: all but its tail comes from the cache, and the final
    // usage chunk says so.
    const HttpReply streamed = post(cached_server, kChat, chat_body(messages, thinking, true).dump());
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    const std::vector<std::string> events = sse_data(streamed.body);
    ASSERT_GE(events.size(), 2u);
    const json usage_chunk = json::parse(events[events.size() - 2]);
    ASSERT_TRUE(usage_chunk["usage"].is_object()) << usage_chunk.dump();
    EXPECT_EQ(cached_tokens(usage_chunk) % 64, 0);
    EXPECT_GE(cached_tokens(usage_chunk) + kWindow + kGenerationPrompt, previous_prompt);
    EXPECT_GT(cached_tokens(usage_chunk), 0);
  }
  // /props reports the cache: entries within the bound, the hits and tokens counted.
  const json cache = get(cached_server, "/props").json()["strata"]["state_cache"];
  EXPECT_EQ(cache["max_bytes"], uint64_t(512) << 20);
  EXPECT_GT(cache["entries"].get<uint64_t>(), 0u);
  EXPECT_GT(cache["bytes"].get<uint64_t>(), 0u);
  EXPECT_LE(cache["bytes"].get<uint64_t>(), uint64_t(512) << 20);
  EXPECT_GT(cache["hits"].get<uint64_t>(), 0u);
  EXPECT_GT(cache["cached_tokens"].get<uint64_t>(), 0u);
  const json off = get(plain_server, "/props").json()["strata"]["state_cache"];
  EXPECT_EQ(off["max_bytes"], 0);
  EXPECT_EQ(off["entries"], 0);
}

TEST(ServeStateCache, RepeatedCompletionPromptIsCachedWhole) {
  ServeProcess server;  // the default --cache-ram
  std::string text;
  for (int i = 0; i < 8; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  const std::string body =
      fmt::format(R"({{"prompt":{},"max_tokens":16,"temperature":0}})", json(text).dump());
  const json first = post(server, kCompletions, body).json();
  const json second = post(server, kCompletions, body).json();
  const int64_t prompt_tokens = first["usage"]["prompt_tokens"].get<int64_t>();
  ASSERT_GT(prompt_tokens, kWindow);
  EXPECT_EQ(cached_tokens(first), 0);
  EXPECT_EQ(cached_tokens(second), prompt_tokens);  // the whole prompt, with its logits
  EXPECT_EQ(first["choices"][0]["text"], second["choices"][0]["text"]);
  // A longer prompt that starts with the first one: resumed at the first prompt's last window
  // boundary, with the same text as a server without the cache.
  const std::string longer =
      fmt::format(R"({{"prompt":{},"max_tokens":8,"temperature":0}})",
                  json(text + first["choices"][0]["text"].get<std::string>() + " Then").dump());
  const json third = post(server, kCompletions, longer).json();
  EXPECT_EQ(cached_tokens(third), (prompt_tokens - 1) / kWindow * kWindow);
  ServeProcess plain({"--cache-ram", "0"});
  const json reference = post(plain, kCompletions, longer).json();
  EXPECT_EQ(third["choices"][0]["text"], reference["choices"][0]["text"]);
  EXPECT_EQ(cached_tokens(reference), 0);
}

// One slot prefills in windows of up to 512 rows on the CPU (session 47; --chunk), which must give
// the tokens of the 64-row windows it ran before: a prompt of four windows and a partial one, then
// a longer one that resumes from the first one's last 64-row boundary in the cache.
TEST(ServeStateCache, LongPrefillWindowsGiveTheRepliesOfSixtyFourRowWindows) {
  ServeProcess long_windows;  // the default --chunk and --cache-ram
  ServeProcess short_windows({"--chunk", "64", "--cache-ram", "0"});
  std::string text;
  for (int i = 0; i < 24; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  for (const std::string& prompt : {text, text + "Once more, then."}) {
    const std::string body =
        fmt::format(R"({{"prompt":{},"max_tokens":16,"temperature":0}})", json(prompt).dump());
    const json got = post(long_windows, kCompletions, body).json();
    const json want = post(short_windows, kCompletions, body).json();
    const int64_t prompt_tokens = want["usage"]["prompt_tokens"].get<int64_t>();
    SCOPED_TRACE(std::to_string(prompt_tokens) + " prompt tokens");
    EXPECT_GT(prompt_tokens, 4 * kWindow);
    EXPECT_NE(prompt_tokens % kWindow, 0);
    EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
    if (prompt != text) {
      EXPECT_GT(cached_tokens(got), 0);
    }
  }
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
