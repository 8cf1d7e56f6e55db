// `strata serve --spec` end to end, through the real HTTP path (curl against the binary with the
// embedded default model): for every drafter, several depths and the gate on and off, each
// request's JSON answer (text or message, finish_reason, usage) equals the plain server's, greedy
// and sampled with a seed, with a stop string and a max_tokens limit; its stream carries the same
// text and finish_reason; a client that hangs up cancels a speculative generation; and the
// server prints the spec line at exit.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "serve_process.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;

const std::string kChat = "/v1/chat/completions";
const std::string kCompletions = "/v1/completions";

struct Request {
  const std::string* path;
  std::string body;  // without the closing brace, so ",\"stream\":true" can follow
};

std::vector<Request> requests(const std::string& stop) {
  const std::string chat_messages =
      R"({"messages":[{"role":"user","content":"Say it again: the cat sat on the mat."}],)";
  return {
      {&kCompletions, R"({"prompt":"And God said","max_tokens":48,"temperature":0)"},
      {&kCompletions,
       fmt::format(R"({{"prompt":"And God said","max_tokens":48,"temperature":0,"stop":[{}])",
                   json(stop).dump())},
      {&kCompletions, R"({"prompt":"And God said","max_tokens":5,"temperature":0)"},
      {&kCompletions,
       R"({"prompt":"In the beginning","max_tokens":40,"temperature":0.9,"top_p":0.95,"seed":7)"},
      {&kChat, chat_messages + R"("max_tokens":40,"temperature":0)"},
      {&kChat, chat_messages + R"("max_tokens":40,"temperature":0.7,"seed":3)"},
      {&kChat,
       chat_messages +
           R"("max_tokens":40,"temperature":0,"chat_template_kwargs":{"enable_thinking":false})"},
  };
}

// The answer without its per-response parts (id, created, and the prompt tokens the state cache
// held, which depend on the requests before: the plain server answered one more).
json answer(const HttpReply& reply) {
  EXPECT_EQ(reply.status, 200) << reply.body;
  json r = reply.json();
  r["usage"].erase("prompt_tokens_details");
  return {{"choice", r["choices"][0]}, {"usage", r["usage"]}};
}

// What a stream carried: the concatenated text (content and reasoning) and the finish_reason.
json streamed(const HttpReply& reply, bool chat) {
  EXPECT_EQ(reply.status, 200) << reply.body;
  std::string content, reasoning;
  json finish;
  for (const std::string& event : sse_data(reply.body)) {
    if (event == "[DONE]") break;
    const json c = json::parse(event);
    if (c["choices"].empty()) continue;
    const json& choice = c["choices"][0];
    if (chat) {
      content += choice["delta"].value("content", "");
      reasoning += choice["delta"].value("reasoning_content", "");
    } else {
      content += choice["text"].get<std::string>();
    }
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  return {{"content", content}, {"reasoning", reasoning}, {"finish", finish}};
}

json expected_stream(const json& whole, bool chat) {
  const json& choice = whole["choice"];
  if (!chat)
    return {{"content", choice["text"]}, {"reasoning", ""}, {"finish", choice["finish_reason"]}};
  return {{"content", choice["message"]["content"]},
          {"reasoning", choice["message"].value("reasoning_content", "")},
          {"finish", choice["finish_reason"]}};
}

TEST(ServeSpec, AnswersAndStreamsEqualThePlainServers) {
  std::vector<json> reference;
  std::string stop;
  {
    ServeProcess plain({"-t", "1"});
    // A stop string the greedy continuation reaches (so the spec path must cut there too).
    const std::string text =
        answer(post(plain, kCompletions, requests("")[0].body + "}"))["choice"]["text"];
    ASSERT_GT(text.size(), 24u) << text;
    stop = text.substr(16, 4);
    for (const Request& r : requests(stop))
      reference.push_back(answer(post(plain, *r.path, r.body + "}")));
    EXPECT_EQ(reference[1]["choice"]["finish_reason"], "stop") << reference[1].dump();
    EXPECT_EQ(reference[2]["choice"]["finish_reason"], "length");
    EXPECT_EQ(reference[2]["usage"]["completion_tokens"], 5);
  }
  const std::vector<std::vector<std::string>> configs = {
      {"--spec", "mtp", "--draft-max", "3"},
      {"--spec", "suffix", "--draft-max", "2", "--spec-gate", "off"},
      {"--spec", "both", "--draft-max", "4"},
      {"--spec", "both", "--draft-max", "1", "--spec-gate", "off"},
      {"--spec", "mtp", "--draft-max", "3", "--spec-gate", "off"},
  };
  for (const std::vector<std::string>& config : configs) {
    std::string label;
    for (const std::string& arg : config) label += arg + " ";
    SCOPED_TRACE(label);
    std::vector<std::string> args = {"-t", "1"};
    args.insert(args.end(), config.begin(), config.end());
    ServeProcess server(args);
    const std::vector<Request> all = requests(stop);
    for (size_t i = 0; i < all.size(); ++i) {
      const Request& r = all[i];
      const bool chat = r.path == &kChat;
      const json whole = answer(post(server, *r.path, r.body + "}"));
      EXPECT_EQ(whole, reference[i]) << "request " << i << ": " << r.body;
      const json stream = streamed(post(server, *r.path, r.body + R"(,"stream":true})"), chat);
      EXPECT_EQ(stream, expected_stream(reference[i], chat)) << "request " << i << " streamed";
    }
    ASSERT_EQ(server.terminate(60).value_or(-1), 0);
    const std::string err = server.process().stderr_text();
    // "strata serve: spec: ... drafts proposed P accepted A ..." (no std::regex: g++ 12 under ASan
    // warns inside <regex> and warnings are errors).
    const size_t line = err.find("strata serve: spec: ");
    ASSERT_NE(line, std::string::npos) << err;
    const size_t at = err.find("drafts proposed ", line);
    ASSERT_NE(at, std::string::npos) << err;
    unsigned long long proposed = 0, accepted = 0;
    ASSERT_EQ(std::sscanf(err.c_str() + at, "drafts proposed %llu accepted %llu", &proposed, &accepted), 2)
        << err;
    EXPECT_LE(accepted, proposed);
    if (config[1] == "mtp" && config.back() == "off") {  // fixed depth: drafts every window
      EXPECT_GT(accepted, 0u) << "no MTP draft stood: " << err;
    }
  }
}

TEST(ServeSpec, ClientDisconnectCancelsASpeculativeGeneration) {
  ServeProcess server({"--spec", "both", "--draft-max", "3"});
  const HttpReply cut = post(server, kCompletions,
                             R"({"prompt":"x","max_tokens":4000,"ignore_eos":true,"stream":true})",
                             {"--max-time", "1"});
  EXPECT_EQ(cut.curl_exit, 28);  // the client hung up mid-stream
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (metric_now(server, R"(strata_generations_total{finish_reason="cancelled"})") != 1 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(metric_now(server, R"(strata_generations_total{finish_reason="cancelled"})"), 1);
  EXPECT_LT(metric_now(server, "strata_completion_tokens_total"), 4000);
  // The server still answers, and the same way as before.
  const HttpReply after =
      post(server, kCompletions, R"({"prompt":"And God said","max_tokens":8,"temperature":0})");
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.json()["usage"]["completion_tokens"], 8);
}

}  // namespace
}  // namespace strata::serve::test
