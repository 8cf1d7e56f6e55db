// `strata serve` end to end, driven with curl (and a raw socket where a client must misbehave):
// the OpenAI response and stream formats, sampling controls, errors, metrics, the queue bound,
// client disconnects, slow clients and SIGTERM. Each test starts its own server on a free port
// with the embedded default model.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "serve_process.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

const std::string kChat = "/v1/chat/completions";
const std::string kCompletions = "/v1/completions";

// A generation far longer than any test waits for (cancelled by each test).
const std::string kEndless = R"({"prompt":"x","max_tokens":4000,"ignore_eos":true,"stream":true})";

// Polls until pred() or `timeout_s`; returns pred().
template <typename Pred>
bool eventually(Pred pred, double timeout_s = 20) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

json health(const ServeProcess& server) {
  return get(server, "/health").json();
}

bool running(const ServeProcess& server) {
  return health(server).value("generation_running", false);
}
int queue_depth(const ServeProcess& server) {
  return health(server).value("queue_depth", -1);
}

// Whether the counter `series` reaches `expected` (0 while the series is absent), polled; a count
// above `expected` still fails (counters never go down). For counts of what was just replied to:
// the server may count after the client has its reply (below).
bool counter_reaches(const ServeProcess& server, const std::string& series, double expected) {
  double seen = 0;
  const bool reached = eventually([&] {
    seen = metric(get(server, "/metrics").body, series).value_or(0);
    return seen >= expected;
  });
  EXPECT_EQ(seen, expected) << series;
  return reached && seen == expected;
}

// Whether the access log's count of `path`'s responses with `status` reaches `expected`.
// httplib counts a response (its logger) only after writing the last byte, and curl returns as
// soon as it has that byte, so a test that reads /metrics right after a reply can get there before
// the server thread does: on a loaded 2-core machine it did (ServeHttp.SlowClientDoesNotStallOthers
// saw the series missing). Counts of replies just received are therefore polled.
bool responses_counted(const ServeProcess& server, const std::string& path, int status,
                       double expected) {
  return counter_reaches(
      server, fmt::format(R"(strata_http_requests_total{{path="{}",status="{}"}})", path, status),
      expected);
}

std::unique_ptr<ChildProcess> background_curl(const ServeProcess& server, const std::string& path,
                                              const std::string& body) {
  return std::make_unique<ChildProcess>(
      std::vector<std::string>{"curl", "-s", "-i", "-N", "-H", "Content-Type: application/json",
                               "--data-binary", body, server.url(path)});
}

// The JSON chunks of a stream; checks the framing: every event is `data: <json>`, [DONE] last.
std::vector<json> stream_chunks(const HttpReply& reply) {
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.header("Content-Type"), "text/event-stream");
  const std::vector<std::string> events = sse_data(reply.body);
  EXPECT_FALSE(events.empty());
  if (events.empty()) return {};
  EXPECT_EQ(events.back(), "[DONE]") << reply.body;
  std::vector<json> chunks;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    chunks.push_back(json::parse(events[i], nullptr, false));
    EXPECT_FALSE(chunks.back().is_discarded()) << events[i];
  }
  return chunks;
}

void expect_error(const HttpReply& reply, int status, const std::string& param,
                  const std::string& in_message = "") {
  EXPECT_EQ(reply.status, status) << reply.body;
  EXPECT_EQ(reply.header("Content-Type"), "application/json");
  const json body = reply.json();
  ASSERT_TRUE(body.contains("error")) << reply.body;
  const json& error = body["error"];
  EXPECT_TRUE(error["message"].is_string());
  EXPECT_TRUE(error["type"].is_string());
  if (param.empty()) {
    EXPECT_TRUE(error["param"].is_null()) << reply.body;
  } else {
    EXPECT_EQ(error["param"], param) << reply.body;
    EXPECT_NE(error["message"].get<std::string>().find(param), std::string::npos) << reply.body;
  }
  if (!in_message.empty()) {
    EXPECT_NE(error["message"].get<std::string>().find(in_message), std::string::npos)
        << reply.body;
  }
}

TEST(ServeHttp, HealthModelsAndUnknownRoutes) {
  ServeProcess server;
  const HttpReply h = get(server, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.json()["status"], "ok");
  const json models = get(server, "/v1/models").json();
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "strata-default");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(get(server, "/v1/models/strata-default").json()["id"], "strata-default");
  const HttpReply missing = get(server, "/v1/models/gpt-4");
  expect_error(missing, 404, "model", "gpt-4");
  EXPECT_EQ(missing.json()["error"]["code"], "model_not_found");
  expect_error(get(server, "/nope"), 404, "", "/nope");
  expect_error(get(server, kChat), 404, "");
}

TEST(ServeHttp, CompletionStreamEqualsWholeResponse) {
  ServeProcess server;
  const std::string body = R"({"prompt":"And God said","max_tokens":24,"temperature":0)";
  const HttpReply whole = post(server, kCompletions, body + "}");
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(whole.header("Content-Type"), "application/json");
  const json r = whole.json();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "strata-default");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 24);
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(r["usage"]["total_tokens"].get<int>(),
            r["usage"]["prompt_tokens"].get<int>() + r["usage"]["completion_tokens"].get<int>());
  const std::string text = r["choices"][0]["text"];
  EXPECT_FALSE(text.empty());

  const std::vector<json> chunks = stream_chunks(post(
      server, kCompletions, body + R"(,"stream":true,"stream_options":{"include_usage":true}})"));
  ASSERT_GE(chunks.size(), 3u);
  std::string streamed;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    const json& c = chunks[i];
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_EQ(c["id"], chunks[0]["id"]);
    EXPECT_TRUE(c.contains("usage") && c["usage"].is_null()) << c.dump();
    ASSERT_EQ(c["choices"].size(), 1u);
    streamed += c["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(c["choices"][0]["finish_reason"],
              i + 2 == chunks.size() ? json("length") : json(nullptr));
  }
  EXPECT_EQ(streamed, text);
  const json& usage_chunk = chunks.back();
  EXPECT_TRUE(usage_chunk["choices"].empty());
  // The stream's prompt is the first request's, so the conversation state cache holds all of it.
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  json usage = r["usage"];
  usage["prompt_tokens_details"]["cached_tokens"] = usage["prompt_tokens"];
  EXPECT_EQ(usage_chunk["usage"], usage);
}

TEST(ServeHttp, ChatStreamHasOpenAiChunksAndMatchesWholeResponse) {
  ServeProcess server;
  for (const bool thinking : {false, true}) {
    SCOPED_TRACE(thinking ? "thinking" : "no thinking");
    const std::string body = fmt::format(
        R"({{"model":"strata-default","messages":[{{"role":"user","content":"Hello"}}],"max_tokens":16,)"
        R"("temperature":0,"chat_template_kwargs":{{"enable_thinking":{}}})",
        thinking);
    const HttpReply whole = post(server, kChat, body + "}");
    ASSERT_EQ(whole.status, 200) << whole.body;
    const json r = whole.json();
    EXPECT_EQ(r["object"], "chat.completion");
    EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    const json& message = r["choices"][0]["message"];
    EXPECT_EQ(message["role"], "assistant");
    EXPECT_TRUE(message["content"].is_string());
    const std::string finish = r["choices"][0]["finish_reason"];
    EXPECT_TRUE(finish == "stop" || finish == "length") << finish;

    const std::vector<json> chunks =
        stream_chunks(post(server, kChat, body + R"(,"stream":true})"));
    ASSERT_GE(chunks.size(), 2u);
    EXPECT_EQ(chunks[0]["choices"][0]["delta"],
              json::parse(R"({"role":"assistant","content":"","refusal":null})"));
    std::string content, reasoning;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const json& c = chunks[i];
      EXPECT_EQ(c["object"], "chat.completion.chunk");
      EXPECT_EQ(c["id"], chunks[0]["id"]);
      EXPECT_FALSE(c.contains("usage"));  // only with stream_options.include_usage
      const json& choice = c["choices"][0];
      EXPECT_EQ(choice["index"], 0);
      EXPECT_TRUE(choice["logprobs"].is_null());
      const json& delta = choice["delta"];
      if (i > 0 && i + 1 < chunks.size()) {
        EXPECT_TRUE(delta.contains("content") || delta.contains("reasoning_content")) << c.dump();
        EXPECT_TRUE(choice["finish_reason"].is_null());
      }
      content += delta.value("content", "");
      reasoning += delta.value("reasoning_content", "");
    }
    EXPECT_EQ(chunks.back()["choices"][0]["delta"], json::object());
    EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], finish);
    // get<>: `std::string == json` is ambiguous in C++20 with g++ 13 (nlohmann/json#4165).
    EXPECT_EQ(content, message["content"].get<std::string>());
    EXPECT_EQ(reasoning, message.value("reasoning_content", ""));
    if (!thinking) {
      EXPECT_TRUE(reasoning.empty());
    }
    // usage.completion_tokens_details.reasoning_tokens: none without thinking; with it, every
    // token of this reply, which never leaves its think block (the random default model does not
    // close it in 16 tokens, and a grammar, which could force the tag, refuses thinking).
    const int64_t reasoning_tokens = r["usage"]["completion_tokens_details"]["reasoning_tokens"];
    if (!thinking) {
      EXPECT_EQ(reasoning_tokens, 0);
    } else {
      EXPECT_TRUE(message["content"].get<std::string>().empty()) << message.dump();
      EXPECT_FALSE(message.value("reasoning_content", "").empty());
      EXPECT_EQ(reasoning_tokens, r["usage"]["completion_tokens"].get<int64_t>());
    }
  }
}

TEST(ServeHttp, SeedMakesSamplingReproducible) {
  ServeProcess server;
  auto sample = [&](int seed) {
    const HttpReply reply = post(
        server, kCompletions,
        fmt::format(
            R"({{"prompt":"In the beginning","max_tokens":16,"temperature":1.0,"top_p":1,"seed":{}}})",
            seed));
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.json()["choices"][0]["text"].get<std::string>();
  };
  const std::string first = sample(1234);
  EXPECT_EQ(sample(1234), first);
  EXPECT_TRUE(sample(1) != first || sample(2) != first || sample(3) != first);
}

TEST(ServeHttp, StopStringsEndTheReply) {
  ServeProcess server;
  const std::string base = R"({"prompt":"And God said","max_tokens":40,"temperature":0)";
  const json full = post(server, kCompletions, base + "}").json();
  const std::string text = full["choices"][0]["text"];
  ASSERT_GT(text.size(), 40u) << text;
  const std::string stop = text.substr(text.size() / 2, 3);
  const std::string expected = text.substr(0, text.find(stop));
  json with_stop = json::parse(base + "}");
  with_stop["stop"] = {stop,
                       "never-there"};  // the stop string comes from the model: let json escape it
  const std::string request = with_stop.dump();
  const json stopped = post(server, kCompletions, request).json();
  EXPECT_EQ(stopped["choices"][0]["text"], expected);
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(stopped["usage"]["completion_tokens"].get<int>(), 40);

  json stream_request = json::parse(request);
  stream_request["stream"] = true;
  const std::vector<json> chunks = stream_chunks(post(server, kCompletions, stream_request.dump()));
  std::string streamed;
  for (const json& c : chunks) streamed += c["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "stop");
}

TEST(ServeHttp, ContextLimits) {
  ServeProcess server;
  json ids = json::array();
  for (int i = 0; i < 4096; ++i) ids.push_back(100 + i % 50);
  const HttpReply too_long = post(server, kCompletions, json{{"prompt", ids}}.dump());
  expect_error(too_long, 400, "prompt", "4096");
  EXPECT_EQ(too_long.json()["error"]["code"], "context_length_exceeded");
  ids.erase(ids.begin() + 4000, ids.end());
  const HttpReply no_room =
      post(server, kCompletions, json{{"prompt", ids}, {"max_tokens", 200}}.dump());
  expect_error(no_room, 400, "max_tokens", "at most 96 tokens");
}

TEST(ServeHttp, BadInputGetsOpenAiJsonErrors) {
  ServeProcess server({"--max-body", "65536"});
  const std::string user = R"("messages":[{"role":"user","content":"hi"}])";
  struct Case {
    const std::string* path;
    std::string body;
    int status;
    std::string param;
    std::string in_message;
  };
  const Case cases[] = {
      {&kChat, "{\"messages\": [", 400, "messages[0]", "not valid JSON"},
      {&kChat, R"({"a":1} {"b":2})", 400, "", "unexpected data after the JSON object"},
      {&kChat, "{" + user + R"(,"max_tokens":"ten"})", 400, "max_tokens", "\"ten\""},
      {&kChat, "{" + user + R"(,"temperature":[1]})", 400, "temperature", "array"},
      {&kChat, R"({"messages":"hi"})", 400, "messages", ""},
      {&kChat, "{" + user + R"(,"model":"gpt-4o"})", 404, "model", "gpt-4o"},
      {&kChat, "{" + user + R"(,"max_tokens":-1})", 400, "max_tokens", "-1"},
      {&kChat, "{" + user + R"(,"max_tokens":99999999})", 400, "max_tokens", "context"},
      {&kChat, R"({"messages":[]})", 400, "messages", "empty"},
      {&kChat, "{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}", 400,
       "messages[0].content", "UTF-8"},
      {&kChat, "{" + user + R"(,"n":17})", 400, "n", "at most 16"},
      {&kCompletions, R"({"prompt":""})", 400, "prompt", "no tokens"},
      {&kCompletions, R"({"prompt":"x","stop":[1]})", 400, "stop[0]", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    expect_error(post(server, *c.path, c.body), c.status, c.param, c.in_message);
  }
  // Oversized: 413 with a JSON body, by Content-Length and by chunked upload.
  const std::string huge = R"({"prompt":")" + std::string(70000, 'a') + "\"}";
  const HttpReply too_big = post(server, kCompletions, huge);
  expect_error(too_big, 413, "", "65536");
  EXPECT_EQ(too_big.json()["error"]["code"], "request_too_large");
  expect_error(post(server, kCompletions, huge, {"-H", "Transfer-Encoding: chunked"}), 413, "",
               "65536");
  // The server is unharmed.
  EXPECT_EQ(post(server, kCompletions, R"({"prompt":"x","max_tokens":2})").status, 200);
}

TEST(ServeHttp, FormEncodedBodyAbove8KiBIsReadAsJson) {
  // curl -d without -H sends application/x-www-form-urlencoded; httplib would refuse such a body
  // above 8 KiB if it parsed it as a form.
  ServeProcess server;
  const std::string body = R"({"prompt":"hello","max_tokens":2)" + std::string(10000, ' ') + "}";
  const HttpReply reply =
      curl("POST", server.url(kCompletions), std::nullopt, {"--data-binary", body});
  EXPECT_EQ(reply.status, 200) << reply.body;
}

TEST(ServeHttp, MetricsArePrometheusTextWithTtftAndQueue) {
  ServeProcess server;
  ASSERT_EQ(post(server, kCompletions, R"({"prompt":"x","max_tokens":4})").status, 200);
  ASSERT_TRUE(responses_counted(server, kCompletions, 200, 1));
  const HttpReply reply = get(server, "/metrics");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.header("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(metric(reply.body, "strata_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(metric(reply.body, "strata_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 1);
  EXPECT_EQ(metric(reply.body, "strata_queue_depth"), 0);
  EXPECT_EQ(metric(reply.body, "strata_completion_tokens_total"), 4);
  EXPECT_EQ(
      metric(reply.body, R"(strata_http_requests_total{path="/v1/completions",status="200"})"), 1);
  EXPECT_EQ(metric(reply.body, R"(strata_generations_total{finish_reason="length"})"), 1);
  EXPECT_GT(metric(reply.body, "strata_decode_tokens_per_second").value_or(0), 0);
  EXPECT_NE(reply.body.find("# TYPE strata_time_to_first_token_seconds histogram"),
            std::string::npos);
}

TEST(ServeHttp, ClientDisconnectCancelsTheGeneration) {
  ServeProcess server;
  const HttpReply cut = post(server, kCompletions, kEndless, {"--max-time", "1"});
  EXPECT_EQ(cut.curl_exit, 28);  // curl's "operation timed out": the client hung up mid-stream
  EXPECT_TRUE(eventually(
      [&] {
        return metric_now(server, R"(strata_generations_total{finish_reason="cancelled"})") == 1;
      },
      5));
  EXPECT_FALSE(running(server));
  EXPECT_LT(metric_now(server, "strata_completion_tokens_total"), 4000);
}

TEST(ServeHttp, QueuedClientDisconnectLeavesTheQueue) {
  ServeProcess server;
  const auto long_stream = background_curl(server, kCompletions, kEndless);
  ASSERT_TRUE(eventually([&] { return running(server); }));
  // Queued behind the endless stream; the client gives up after 1 s.
  const HttpReply gave_up =
      post(server, kCompletions, R"({"prompt":"y","max_tokens":5})", {"--max-time", "1"});
  EXPECT_EQ(gave_up.curl_exit, 28);
  EXPECT_TRUE(eventually([&] { return queue_depth(server) == 0; }, 2));
  EXPECT_TRUE(running(server));  // the first one is unaffected
  long_stream->signal(SIGKILL);
  EXPECT_TRUE(eventually([&] { return !running(server); }, 5));
  EXPECT_EQ(metric_now(server, R"(strata_generations_total{finish_reason="cancelled"})"), 1);
  EXPECT_EQ(metric_now(server, "strata_queue_wait_seconds_count"), 1);  // the queued one never ran
}

TEST(ServeHttp, FullQueueAnswers429) {
  ServeProcess server({"--max-queue", "1"});
  const auto first = background_curl(server, kCompletions, kEndless);
  ASSERT_TRUE(eventually([&] { return running(server); }));
  const auto second = background_curl(server, kCompletions, kEndless);
  ASSERT_TRUE(eventually([&] { return queue_depth(server) == 1; }));
  const HttpReply refused = post(server, kChat, R"({"messages":[{"role":"user","content":"hi"}]})");
  expect_error(refused, 429, "", "--max-queue 1");
  EXPECT_EQ(refused.json()["error"]["code"], "queue_full");
  EXPECT_EQ(refused.header("Retry-After"), "1");
  EXPECT_TRUE(responses_counted(server, kChat, 429, 1));
  first->signal(SIGKILL);
  second->signal(SIGKILL);
  EXPECT_TRUE(eventually([&] { return !running(server) && queue_depth(server) == 0; }, 5));
  EXPECT_EQ(post(server, kCompletions, R"({"prompt":"x","max_tokens":2})").status, 200);
}

TEST(ServeHttp, SlowClientDoesNotStallOthers) {
  ServeProcess server({"--timeout", "120", "--send-buffer", "16384"});
  // A client that sends a streaming request and reads nothing: with its small receive buffer and
  // the server's small send buffer the kernel holds ~40 KB of the ~180 KB stream, then the
  // server's writes to it block.
  RawClient slow(
      server.port(),
      http_post_request(kCompletions,
                        R"({"prompt":"x","max_tokens":800,"ignore_eos":true,"stream":true})"));
  ASSERT_TRUE(eventually([&] { return running(server); }));
  const HttpReply other = post(server, kCompletions,
                               R"({"prompt":"y","max_tokens":8,"ignore_eos":true})",
                               {"--max-time", "100"});
  ASSERT_EQ(other.status, 200) << other.body;
  EXPECT_EQ(other.json()["choices"][0]["finish_reason"], "length") << other.body;
  // Both generations end while the slow client still reads nothing: the slow one's deltas wait in
  // its job, its response is not written (the access log counts a response once it is written).
  // Polled, not read once: CI saw the count at 1 right after the other reply (once in many runs,
  // not reproduced on a loaded 2-core box), so the order in which the two generations are counted
  // is not what this test pins; that the slow one finishes without its client reading is.
  EXPECT_TRUE(
      counter_reaches(server, R"(strata_generations_total{finish_reason="length"})", 2));
  EXPECT_TRUE(responses_counted(server, kCompletions, 200, 1));
  const std::string received = slow.read_until("data: [DONE]", 60);
  EXPECT_NE(received.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(received.find(R"("finish_reason":"length")"), std::string::npos);
  EXPECT_TRUE(responses_counted(server, kCompletions, 200, 2));
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(ServeHttp, TrickledHeadersAreCutOffAtTheTimeout) {
  // One header byte per second never trips a per-recv timeout of 3 s; the deadline covers the
  // whole request, so the connection ends after 3 s with a 408.
  ServeProcess server({"--timeout", "3"});
  const Clock::time_point start = Clock::now();
  RawClient slow(server.port(), "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  const std::string header = "X-Slow: " + std::string(30, 'a');
  std::string received;
  for (size_t i = 0; i < header.size() && !slow.peer_closed(); ++i) {
    if (!slow.send_more(header.substr(i, 1))) break;
    received = slow.read_until("\r\n\r\n", 1.0);
  }
  received = slow.read_until("request_timeout", 2);
  const double closed_after = seconds_since(start);
  EXPECT_NE(received.find("HTTP/1.1 408"), std::string::npos) << received;
  EXPECT_NE(received.find("request_timeout"), std::string::npos) << received;
  EXPECT_GT(closed_after, 2.5);
  EXPECT_LT(closed_after, 5.5);
  EXPECT_EQ(get(server, "/health").status, 200);  // the server is unharmed
}

TEST(ServeHttp, HalfSentBodyIsAnswered408AtTheTimeout) {
  ServeProcess server({"--timeout", "2"});
  const std::string body = R"({"prompt":"x","max_tokens":2})";
  const std::string request = http_post_request(kCompletions, body);
  const Clock::time_point start = Clock::now();
  RawClient half(server.port(), request.substr(0, request.size() - body.size() / 2));
  const std::string received = half.read_until("never sent by the server", 10);
  const double closed_after = seconds_since(start);
  EXPECT_TRUE(half.peer_closed());
  EXPECT_GT(closed_after, 1.5);
  EXPECT_LT(closed_after, 3.5);  // not the 2 s timeout plus httplib's 5 s keep-alive wait
  EXPECT_NE(received.find("HTTP/1.1 408"), std::string::npos) << received;
  EXPECT_NE(received.find("within 2 s (--timeout)"), std::string::npos) << received;
  EXPECT_NE(received.find("Connection: close"), std::string::npos) << received;
  EXPECT_EQ(
      metric_now(server, R"(strata_http_requests_total{path="/v1/completions",status="408"})"), 1);
}

TEST(ServeHttp, ConnectionsOverTheLimitAreRefusedWith503) {
  ServeProcess server({"--max-connections", "2", "--timeout", "60"});
  // Two clients that never finish their requests hold both connections.
  std::vector<std::unique_ptr<RawClient>> holders;
  for (int i = 0; i < 2; ++i)
    holders.push_back(std::make_unique<RawClient>(server.port(), "GET /health HTTP/1.1\r\n"));
  HttpReply refused;
  EXPECT_TRUE(eventually([&] { return (refused = get(server, "/health")).status == 503; }, 5));
  expect_error(refused, 503, "", "--max-connections");
  EXPECT_EQ(refused.json()["error"]["code"], "too_many_connections");
  EXPECT_EQ(refused.header("Retry-After"), "1");
  EXPECT_EQ(refused.header("Connection"), "close");
  // A held connection closes: a new client is served again.
  holders[0]->close();
  EXPECT_TRUE(eventually([&] { return get(server, "/health").status == 200; }, 5));
  EXPECT_GE(metric_now(server, R"(strata_http_requests_total{path="other",status="503"})"), 1);
}

TEST(ServeHttp, SigtermFinishesTheRunningStreamFailsQueuedAndExitsZero) {
  ServeProcess server({"--shutdown-grace", "120"});
  const auto streaming = background_curl(
      server, kCompletions, R"({"prompt":"x","max_tokens":300,"ignore_eos":true,"stream":true})");
  ASSERT_TRUE(eventually([&] { return running(server); }));
  const auto queued = background_curl(server, kCompletions, R"({"prompt":"y","max_tokens":5})");
  ASSERT_TRUE(eventually([&] { return queue_depth(server) == 1; }));
  EXPECT_EQ(server.terminate(120), 0) << server.process().stderr_text();
  ASSERT_TRUE(streaming->wait(10));
  const std::string out = streaming->stdout_text();
  EXPECT_NE(out.find(R"("finish_reason":"length")"), std::string::npos) << out.substr(0, 500);
  EXPECT_NE(out.find("data: [DONE]"), std::string::npos);
  ASSERT_TRUE(queued->wait(10));
  const std::string refused = queued->stdout_text();
  EXPECT_NE(refused.find("HTTP/1.1 503"), std::string::npos) << refused;
  EXPECT_NE(refused.find("server_shutting_down"), std::string::npos) << refused;
}

TEST(ServeHttp, SigtermAfterGraceCancelsWithAnErrorEvent) {
  ServeProcess server({"--shutdown-grace", "0.2"});
  const auto streaming = background_curl(server, kCompletions, kEndless);
  ASSERT_TRUE(eventually([&] { return running(server); }));
  EXPECT_EQ(server.terminate(30), 0) << server.process().stderr_text();
  ASSERT_TRUE(streaming->wait(10));
  const std::string out = streaming->stdout_text();
  const std::vector<std::string> events = sse_data(out.substr(out.find("\r\n\r\n") + 4));
  ASSERT_FALSE(events.empty());
  const json last = json::parse(events.back(), nullptr, false);
  EXPECT_EQ(last["error"]["code"], "server_shutting_down") << events.back();
  EXPECT_EQ(out.find("[DONE]"), std::string::npos);
}

}  // namespace
}  // namespace strata::serve::test
