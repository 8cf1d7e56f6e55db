// OpenAI's sampling controls and log-probabilities through a real `strata serve` (curl against the
// binary with the embedded default model): logit_bias bans and forces tokens, the frequency and
// presence penalties shift exactly the logits OpenAI's rule names, logprobs are consistent (≤ 0,
// sorted, greedy's token on top, streamed equal to whole), n > 1 gives reproducible seeded
// choices, and --spec answers all of these exactly as the plain server. The model's weights are
// random: the tests check mechanics, never content.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "serve_process.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;

const std::string kChat = "/v1/chat/completions";
const std::string kCompletions = "/v1/completions";

// A piece of /tokenize's with_pieces answer (a string, or the bytes of a partial character).
std::string piece_bytes(const json& piece) {
  if (piece.is_string()) return piece.get<std::string>();
  std::string out;
  for (const json& byte : piece) out += char(byte.get<int>());
  return out;
}

// The ids and bytes of `text`'s tokens.
std::vector<std::pair<int, std::string>> tokenize(const ServeProcess& server,
                                                  const std::string& text) {
  const HttpReply reply =
      post(server, "/tokenize", json{{"content", text}, {"with_pieces", true}}.dump());
  EXPECT_EQ(reply.status, 200) << reply.body;
  std::vector<std::pair<int, std::string>> out;
  const json answer = reply.json();  // not a temporary in the range-for: it would dangle
  for (const json& token : answer["tokens"])
    out.emplace_back(token["id"].get<int>(), piece_bytes(token["piece"]));
  return out;
}

// A chat logprobs entry's bytes.
std::string entry_bytes(const json& entry) {
  std::string out;
  for (const json& byte : entry["bytes"]) out += char(byte.get<int>());
  return out;
}

json whole(const ServeProcess& server, const std::string& path, const json& body) {
  const HttpReply reply = post(server, path, body.dump());
  EXPECT_EQ(reply.status, 200) << reply.body;
  return reply.json();
}

std::vector<json> stream(const ServeProcess& server, const std::string& path, json body) {
  body["stream"] = true;
  const HttpReply reply = post(server, path, body.dump());
  EXPECT_EQ(reply.status, 200) << reply.body;
  std::vector<json> chunks;
  const std::vector<std::string> events = sse_data(reply.body);
  EXPECT_FALSE(events.empty());
  if (events.empty()) return chunks;
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) chunks.push_back(json::parse(events[i]));
  return chunks;
}

json chat_body(const std::string& content, int max_tokens) {
  return json{{"messages", json::array({json{{"role", "user"}, {"content", content}}})},
              {"max_tokens", max_tokens},
              {"ignore_eos", true},
              {"temperature", 0},
              {"chat_template_kwargs", {{"enable_thinking", false}}}};
}

TEST(ServeSampling, LogitBiasBansAndForcesTokens) {
  ServeProcess server;
  json body = chat_body("Tell me about cats.", 24);
  body["logprobs"] = true;
  const json plain = whole(server, kChat, body);
  const json& entries = plain["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(entries.size(), 24u) << plain.dump();
  // Ban every token the greedy reply was made of (each found by tokenizing its bytes alone): none
  // of them may appear again, greedy or sampled. (Tokens are told apart by their bytes, which are
  // unique in the vocabulary.)
  std::set<std::string> banned;
  json bias = json::object();
  for (const json& entry : entries) {
    const std::string bytes = entry_bytes(entry);
    const auto tokens = tokenize(server, bytes);
    if (tokens.size() == 1 && tokens[0].second == bytes) {
      bias[std::to_string(tokens[0].first)] = -100;
      banned.insert(bytes);
    }
  }
  ASSERT_GE(banned.size(), 5u) << plain.dump();
  for (const double temperature : {0.0, 1.0}) {
    SCOPED_TRACE(temperature);
    json banning = body;
    banning["logit_bias"] = bias;
    banning["temperature"] = temperature;
    banning["seed"] = 5;
    const json r = whole(server, kChat, banning);
    const json& got = r["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(got.size(), 24u);
    for (const json& entry : got) EXPECT_FALSE(banned.count(entry_bytes(entry))) << entry.dump();
  }
  // +100 on one token: greedy emits it every time, with probability ~1 (completions this time).
  const auto [forced_id, forced_bytes] = tokenize(server, " cat").front();
  const json forced = whole(server, kCompletions,
                            json{{"prompt", "Once upon a time"},
                                 {"max_tokens", 8},
                                 {"ignore_eos", true},
                                 {"temperature", 0},
                                 {"logprobs", 1},
                                 {"logit_bias", {{std::to_string(forced_id), 100}}}});
  std::string expected;
  for (int i = 0; i < 8; ++i) expected += forced_bytes;
  EXPECT_EQ(forced["choices"][0]["text"], expected);
  const json& lp = forced["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), 8u);
  for (const json& value : lp["token_logprobs"]) EXPECT_GT(value.get<double>(), -1e-6);
}

TEST(ServeSampling, PenaltiesLowerExactlyTheGeneratedTokensLogits) {
  ServeProcess server;
  // Two greedy steps with the 20 most likely tokens. The first token is the same with and
  // without penalties (nothing generated yet), so at step 2 both runs have the same history and
  // differ only by the penalties on that token; a +10 bias on it keeps it among the 20.
  json body = chat_body("Name an animal.", 2);
  body["logprobs"] = true;
  body["top_logprobs"] = 20;
  const std::string forced_bytes =
      entry_bytes(whole(server, kChat, body)["choices"][0]["logprobs"]["content"][0]);
  const auto forced = tokenize(server, forced_bytes);
  ASSERT_EQ(forced.size(), 1u);
  body["logit_bias"] = {{std::to_string(forced[0].first), 10}};
  const json plain = whole(server, kChat, body);
  body["frequency_penalty"] = 0.5;
  body["presence_penalty"] = 1.0;
  const json penalised = whole(server, kChat, body);
  const json& a = plain["choices"][0]["logprobs"]["content"];
  const json& b = penalised["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  ASSERT_EQ(entry_bytes(a[0]), forced_bytes);
  ASSERT_EQ(a[0], b[0]);  // nothing generated yet: the penalties change nothing
  // Step 2: log p_b(t) - log p_a(t) is one constant (the normaliser) for every t but `forced`,
  // whose logit lost 1·0.5 + 1.0 = 1.5 more.
  std::map<std::string, double> first;
  for (const json& alt : a[1]["top_logprobs"]) first[entry_bytes(alt)] = alt["logprob"];
  std::optional<double> shift;
  bool saw_forced = false;
  for (const json& alt : b[1]["top_logprobs"]) {
    const auto it = first.find(entry_bytes(alt));
    if (it == first.end()) continue;
    const double delta = alt["logprob"].get<double>() - it->second;
    if (it->first == forced_bytes) {
      saw_forced = true;
      continue;
    }
    if (!shift) shift = delta;
    EXPECT_NEAR(delta, *shift, 1e-4) << it->first;
  }
  ASSERT_TRUE(shift);
  ASSERT_TRUE(saw_forced) << "the +10 token should stay among the 20 most likely";
  for (const json& alt : b[1]["top_logprobs"]) {
    if (entry_bytes(alt) == forced_bytes) {
      EXPECT_NEAR(alt["logprob"].get<double>() - first[forced_bytes], *shift - 1.5, 1e-4);
    }
  }
}

// Chat entries: logprob ≤ 0, top lists sorted and of the asked length, and for greedy the chosen
// token on top with the same log-probability.
void expect_consistent(const json& entries, size_t n_top, bool greedy) {
  for (const json& entry : entries) {
    const double logprob = entry["logprob"];
    EXPECT_LE(logprob, 0.0);
    EXPECT_EQ(entry["token"].get<std::string>().empty(), entry["bytes"].empty());
    const json& top = entry["top_logprobs"];
    ASSERT_EQ(top.size(), n_top);
    for (size_t i = 0; i < top.size(); ++i) {
      EXPECT_LE(top[i]["logprob"].get<double>(), 0.0);
      if (i > 0) {
        EXPECT_LE(top[i]["logprob"].get<double>(), top[i - 1]["logprob"].get<double>());
      }
      if (top[i]["bytes"] == entry["bytes"]) {
        EXPECT_DOUBLE_EQ(top[i]["logprob"].get<double>(), logprob);
      }
    }
    if (n_top > 0) {
      EXPECT_LE(logprob, top[0]["logprob"].get<double>() + 1e-12);
      if (greedy) {
        EXPECT_EQ(top[0]["bytes"], entry["bytes"]);
      }
    }
  }
}

TEST(ServeSampling, ChatLogprobsWholeAndStreamed) {
  ServeProcess server;
  for (const double temperature : {0.0, 0.8}) {
    SCOPED_TRACE(temperature);
    json body = chat_body("Hello there", 12);
    body["temperature"] = temperature;
    body["seed"] = 11;
    body["logprobs"] = true;
    body["top_logprobs"] = 5;
    const json r = whole(server, kChat, body);
    const json& choice = r["choices"][0];
    const json& entries = choice["logprobs"]["content"];
    EXPECT_EQ(entries.size(), r["usage"]["completion_tokens"].get<size_t>());
    expect_consistent(entries, 5, temperature == 0.0);
    std::string bytes;
    for (const json& entry : entries) bytes += entry_bytes(entry);
    const std::string shown = choice["message"]["content"].get<std::string>() +
                              choice["message"].value("reasoning_content", "");
    EXPECT_GE(bytes.size(), shown.size());  // control tokens have bytes but print nothing

    json streamed_entries = json::array();
    std::string content;
    for (const json& chunk : stream(server, kChat, body)) {
      const json& c = chunk["choices"][0];
      content += c["delta"].value("content", "");
      if (!c["logprobs"].is_null())
        for (const json& entry : c["logprobs"]["content"]) streamed_entries.push_back(entry);
    }
    EXPECT_EQ(streamed_entries, entries);
    EXPECT_EQ(content, choice["message"]["content"].get<std::string>());
  }
  // Without logprobs the field stays null; logprobs without top_logprobs gives empty lists.
  const json none = whole(server, kChat, chat_body("Hi", 3));
  EXPECT_TRUE(none["choices"][0]["logprobs"].is_null());
  json bare = chat_body("Hi", 3);
  bare["logprobs"] = true;
  expect_consistent(whole(server, kChat, bare)["choices"][0]["logprobs"]["content"], 0, true);
}

TEST(ServeSampling, CompletionLogprobsLegacyShape) {
  ServeProcess server;
  const json body = {{"prompt", "The quick brown fox"},
                     {"max_tokens", 10},
                     {"ignore_eos", true},
                     {"temperature", 0},
                     {"logprobs", 3}};
  const json r = whole(server, kCompletions, body);
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 10u) << r.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), 10u);
  ASSERT_EQ(lp["top_logprobs"].size(), 10u);
  ASSERT_EQ(lp["text_offset"].size(), 10u);
  int64_t offset = 0;
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(lp["text_offset"][i], offset);
    offset += int64_t(lp["tokens"][i].get<std::string>().size());
    const json& top = lp["top_logprobs"][i];
    EXPECT_LE(top.size(), 3u);
    EXPECT_GE(top.size(), 1u);
    // Greedy: the chosen token is the most likely one.
    double best = -INFINITY;
    for (const auto& [token, value] : top.items()) best = std::max(best, value.get<double>());
    EXPECT_DOUBLE_EQ(lp["token_logprobs"][i].get<double>(), best);
    EXPECT_DOUBLE_EQ(top[lp["tokens"][i].get<std::string>()].get<double>(), best);
  }
  // Streamed: the same entries, text_offset continuing across chunks.
  json tokens = json::array(), offsets = json::array();
  for (const json& chunk : stream(server, kCompletions, body)) {
    const json& c = chunk["choices"][0];
    if (c["logprobs"].is_null()) continue;
    for (const json& t : c["logprobs"]["tokens"]) tokens.push_back(t);
    for (const json& o : c["logprobs"]["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(offsets, lp["text_offset"]);
}

TEST(ServeSampling, SeveralChoicesAreSeededAndIndexed) {
  ServeProcess server;
  json body = {{"prompt", "In the beginning"},
               {"max_tokens", 12},
               {"temperature", 1.0},
               {"seed", 99},
               {"n", 3}};
  const json r = whole(server, kCompletions, body);
  ASSERT_EQ(r["choices"].size(), 3u) << r.dump();
  int64_t tokens = 0;
  std::set<std::string> texts;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    texts.insert(r["choices"][i]["text"].get<std::string>());
    // Choice i samples with seed + i: it equals the n = 1 request with that seed.
    json single = body;
    single["n"] = 1;
    single["seed"] = 99 + int(i);
    const json alone = whole(server, kCompletions, single);
    EXPECT_EQ(alone["choices"][0]["text"], r["choices"][i]["text"]);
    EXPECT_EQ(alone["choices"][0]["finish_reason"], r["choices"][i]["finish_reason"]);
    tokens += alone["usage"]["completion_tokens"].get<int64_t>();
  }
  EXPECT_GT(texts.size(), 1u) << "three samples at temperature 1 should not all agree";
  EXPECT_EQ(r["usage"]["completion_tokens"], tokens);
  EXPECT_EQ(whole(server, kCompletions, body)["choices"], r["choices"]);  // reproducible

  // Streamed chat: every chunk names its choice; each choice's text equals the whole answer's.
  json chat = chat_body("Pick a colour", 8);
  chat["temperature"] = 0.9;
  chat["seed"] = 4;
  chat["n"] = 2;
  chat["stream_options"] = {{"include_usage", true}};
  json chat_whole = chat;
  chat_whole.erase("stream_options");
  const json w = whole(server, kChat, chat_whole);
  ASSERT_EQ(w["choices"].size(), 2u);
  std::vector<std::string> content(2);
  std::vector<json> finish(2);
  std::vector<int> roles(2, 0);
  json usage;
  for (const json& chunk : stream(server, kChat, chat)) {
    if (chunk["choices"].empty()) {
      usage = chunk["usage"];
      continue;
    }
    const json& c = chunk["choices"][0];
    const size_t index = c["index"].get<size_t>();
    ASSERT_LT(index, 2u);
    if (c["delta"].contains("role")) ++roles[index];
    content[index] += c["delta"].value("content", "");
    if (!c["finish_reason"].is_null()) finish[index] = c["finish_reason"];
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(roles[i], 1);
    EXPECT_EQ(content[i], w["choices"][i]["message"]["content"].get<std::string>());
    EXPECT_EQ(finish[i], w["choices"][i]["finish_reason"]);
  }
  EXPECT_EQ(usage["completion_tokens"], w["usage"]["completion_tokens"]);
  EXPECT_EQ(w["usage"]["completion_tokens"], 16);  // ignore_eos: 8 per choice

  const HttpReply too_many =
      post(server, kChat, json{{"messages", chat["messages"]}, {"n", 17}}.dump());
  EXPECT_EQ(too_many.status, 400);
  EXPECT_EQ(too_many.json()["error"]["param"], "n");
}

// The requests --spec must answer exactly as the plain server.
std::vector<std::pair<std::string, json>> rule_requests() {
  json biased = chat_body("Say it again: the cat sat on the mat.", 32);
  biased["logit_bias"] = {{"11", -100}, {"13", 3}, {"264", 5}};
  json penalised = biased;
  penalised["temperature"] = 0.8;
  penalised["seed"] = 17;
  penalised["frequency_penalty"] = 1.5;
  penalised["presence_penalty"] = -0.5;
  penalised["repeat_penalty"] = 1.2;
  json greedy_penalised = {{"prompt", "the cat sat on the mat, the cat sat on the"},
                           {"max_tokens", 32},
                           {"temperature", 0},
                           {"frequency_penalty", 0.7},
                           {"presence_penalty", 0.3}};
  json with_logprobs = greedy_penalised;
  with_logprobs["logprobs"] = 2;
  json choices = penalised;
  choices["n"] = 2;
  return {{kChat, biased},
          {kChat, penalised},
          {kCompletions, greedy_penalised},
          {kCompletions, with_logprobs},
          {kChat, choices}};
}

json comparable(json r) {
  r.erase("id");
  r.erase("created");
  r["usage"].erase("prompt_tokens_details");
  return r;
}

TEST(ServeSampling, SpecDecodingAnswersTheRulesAsThePlainServer) {
  std::vector<json> reference;
  {
    ServeProcess plain({"-t", "1"});
    for (const auto& [path, body] : rule_requests())
      reference.push_back(comparable(whole(plain, path, body)));
  }
  for (const char* mode : {"both", "suffix"}) {
    SCOPED_TRACE(mode);
    ServeProcess server({"-t", "1", "--spec", mode, "--draft-max", "3", "--spec-gate", "off"});
    const auto requests = rule_requests();
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(comparable(whole(server, requests[i].first, requests[i].second)), reference[i])
          << "request " << i << ": " << requests[i].second.dump();
    }
  }
}

}  // namespace
}  // namespace strata::serve::test
