// `strata serve --parallel N` end to end (curl against the binary with the embedded default
// model): concurrent requests — completions and chat, different prompts and lengths, greedy and
// seeded, a stop string, logit_bias and penalties, some streamed — each answer exactly what a
// --parallel 1 server answers (text, finish_reason, usage; streams the same text), while they
// join and leave the batched decode steps (staggered starts, lengths 3 to 64) and one client
// hangs up mid-stream (its generation is cancelled, the others are unaffected); the queue's 429
// counts the running slots; bad --parallel values and refused combinations fail at start.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <future>
#include <thread>

#include "serve_process.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

const std::string kChat = "/v1/chat/completions";
const std::string kCompletions = "/v1/completions";
const std::string kEndless = R"({"prompt":"x","max_tokens":4000,"ignore_eos":true,"stream":true})";

template <typename Pred>
bool eventually(Pred pred, double timeout_s = 20) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

struct Request {
  const std::string* path;
  std::string body;
  bool stream = false;
  int start_ms = 0;  // sent this long after the first (joins while others decode)
};

std::vector<Request> requests() {
  const std::string chat =
      R"({"messages":[{"role":"user","content":"Say it again: the cat sat on the mat."}],)";
  return {
      {&kCompletions, R"({"prompt":"And God said","max_tokens":64,"temperature":0})", false, 0},
      {&kCompletions,
       R"({"prompt":"In the beginning","max_tokens":40,"temperature":0.9,"top_p":0.95,"seed":7})",
       true, 0},
      {&kCompletions, R"({"prompt":"And it came to pass","max_tokens":3,"temperature":0})", false,
       0},
      {&kChat, chat + R"("max_tokens":48,"temperature":0.7,"seed":3})", true, 150},
      {&kChat,
       chat +
           R"("max_tokens":32,"temperature":0,"chat_template_kwargs":{"enable_thinking":false}})",
       false, 300},
      {&kCompletions,
       R"({"prompt":"The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures","max_tokens":50,"temperature":0.8,"seed":11,"frequency_penalty":0.5,"presence_penalty":0.3,"logit_bias":{"11":-100}})",
       true, 450},
      {&kCompletions,
       R"({"prompt":"And God said","max_tokens":60,"temperature":1.0,"seed":5,"stop":["\n\n"]})",
       false, 600},
  };
}

std::string with_stream(const Request& r) {
  return r.stream ? r.body.substr(0, r.body.size() - 1) + R"(,"stream":true})" : r.body;
}

// What a reply says, without its per-response parts (id, created, cached prompt tokens).
json essence(const HttpReply& reply, const Request& r) {
  EXPECT_EQ(reply.status, 200) << reply.body;
  const bool chat = r.path == &kChat;
  if (!r.stream) {
    json j = reply.json();
    j["usage"].erase("prompt_tokens_details");
    return {{"choice", j["choices"][0]}, {"usage", j["usage"]}};
  }
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

// Returns the server's strata_batch_group_windows_total at the end.
double expect_concurrent_requests_answer_as_the_single_slot_server(std::vector<std::string> args) {
  const std::vector<Request> all = requests();
  std::vector<json> expected;
  {
    ServeProcess plain;
    for (const Request& r : all)
      expected.push_back(essence(post(plain, *r.path, with_stream(r)), r));
  }
  args.insert(args.end(), {"--parallel", "4", "--max-queue", "16"});
  ServeProcess server(args);
  // A client that hangs up mid-stream: its slot leaves the batch, the others go on.
  auto cut = std::async(std::launch::async, [&] {
    return post(server, kCompletions, kEndless, {"--max-time", "1.5"});
  });
  std::vector<std::future<HttpReply>> replies;
  const auto t0 = Clock::now();
  for (const Request& r : all)
    replies.push_back(std::async(std::launch::async, [&server, &r, t0] {
      std::this_thread::sleep_until(t0 + std::chrono::milliseconds(r.start_ms));
      return post(server, *r.path, with_stream(r));
    }));
  for (size_t i = 0; i < all.size(); ++i)
    EXPECT_EQ(essence(replies[i].get(), all[i]), expected[i])
        << "request " << i << ": " << all[i].body;
  EXPECT_EQ(cut.get().curl_exit, 28);  // curl's "operation timed out": it hung up
  EXPECT_TRUE(eventually([&] {
    return metric_now(server, R"(strata_generations_total{finish_reason="cancelled"})") == 1;
  }));
  // The decode steps really were shared, by up to 4 slots. How many rows met in one step at most
  // depends on when the clients' requests arrived (4 when the three first ones and the endless
  // one overlap; on a loaded machine a short one may be done before the last joins), so the
  // bound is "shared, never more than the slots".
  EXPECT_EQ(metric_now(server, "strata_slots"), 4);
  EXPECT_GT(metric_now(server, "strata_batch_steps_total"), 0);
  EXPECT_GE(metric_now(server, "strata_batch_max_rows"), 2);
  EXPECT_LE(metric_now(server, "strata_batch_max_rows"), 4);
  EXPECT_GT(metric_now(server, "strata_batch_rows_total"),
            metric_now(server, "strata_batch_steps_total"));
  // The prompts went through the batched windows too.
  EXPECT_GT(metric_now(server, "strata_batch_prefill_windows_total"), 0);
  EXPECT_GT(metric_now(server, "strata_batch_prefill_rows_total"),
            metric_now(server, "strata_batch_prefill_windows_total"));
  EXPECT_EQ(get(server, "/props").json()["total_slots"], 4);
  const double group_windows = metric_now(server, "strata_batch_group_windows_total");
  EXPECT_EQ(server.terminate(15), 0);
  return group_windows;
}

// One window a step (given: the default, auto, may pick groups on a many-core box).
TEST(ServeParallel, ConcurrentRequestsAnswerAsTheSingleSlotServer) {
  EXPECT_EQ(expect_concurrent_requests_answer_as_the_single_slot_server({"--batch-groups", "1"}),
            0);
}

// --batch-groups 2: the steps are cut into two windows run side by side (2 threads each here, so
// the groups' own pools hand out work too); every reply is still the single-slot server's.
TEST(ServeParallel, BatchGroupsAnswerAsTheSingleSlotServer) {
  // Steps of two or more rows were cut in two (the first requests overlap from the start).
  EXPECT_GE(expect_concurrent_requests_answer_as_the_single_slot_server(
                {"--batch-groups", "2", "--threads", "4"}),
            2);
}

// --batch-groups auto (the default): decided once at start, logged on one line and reported by
// /props with its reason; how many depends on the box (serve/batch_groups.h), so this checks that
// the line, /props and the rule's bounds agree, and that a given number is reported as given.
TEST(ServeParallel, AutoBatchGroupsAreLoggedAndReported) {
  ServeProcess server({"--parallel", "4"});
  const json groups = get(server, "/props").json()["strata"]["batch_groups"];
  const int chosen = groups["groups"].get<int>();
  EXPECT_GE(chosen, 1);
  EXPECT_LE(chosen, 4);
  const std::string reason = groups["reason"].get<std::string>();
  EXPECT_EQ(reason.rfind("auto: ", 0), 0u) << reason;
  EXPECT_NE(server.process().stderr_text().find(
                fmt::format("strata serve: batch groups {} ({})\n", chosen, reason)),
            std::string::npos)
      << server.process().stderr_text();

  ServeProcess given({"--parallel", "4", "--batch-groups", "2"});
  const json reported = get(given, "/props").json()["strata"]["batch_groups"];
  EXPECT_EQ(reported, json({{"groups", 2}, {"reason", "given"}}));

  // Groups are refused with a RAM-budget store; auto picks 1 there on any box, so it starts.
  ServeProcess store({"--parallel", "2", "--slots-per-layer", "2"});
  const json with_store = get(store, "/props").json()["strata"]["batch_groups"];
  EXPECT_EQ(with_store["groups"], 1);
  EXPECT_NE(with_store["reason"].get<std::string>().find("RAM-budget store"), std::string::npos)
      << with_store.dump();
}

// n > 1 with --parallel: the choices of one request decode together, as rows of the same batched
// steps (3 rows on a 2-slot server with nothing else running), from one prefill of the prompt
// (without the state cache: the other choices copy choice 0's prompt state), and each choice is
// bitwise what it is alone: the same text, finish and log-probabilities as the single-slot
// server's, whose choices run one after the other, and as the n = 1 request with seed + i.
TEST(ServeParallel, ChoicesOfOneRequestDecodeTogether) {
  const json request =
      json::parse(R"({"prompt":"And God said","max_tokens":24,"temperature":0.9,"seed":21,"n":3,)"
                  R"("logprobs":2,"ignore_eos":true})");
  const json chat = json::parse(
      R"({"messages":[{"role":"user","content":"Name three colours."}],"max_tokens":20,)"
      R"("temperature":1.0,"seed":4,"n":2,"stream":true})");
  auto choices = [](const HttpReply& reply) {
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.json()["choices"];
  };
  // Streamed chat: each index's content, reasoning and finish.
  auto streamed = [](const HttpReply& reply) {
    EXPECT_EQ(reply.status, 200) << reply.body;
    json out = json::array({json::object(), json::object()});
    for (const std::string& event : sse_data(reply.body)) {
      if (event == "[DONE]") break;
      const json parsed = json::parse(event);  // the range-for's json must outlive the loop
      for (const json& c : parsed["choices"]) {
        json& one = out[c["index"].get<size_t>()];
        for (const char* key : {"content", "reasoning_content"})
          one[key] = one.value(key, "") + c["delta"].value(key, "");
        if (!c["finish_reason"].is_null()) one["finish"] = c["finish_reason"];
      }
    }
    return out;
  };
  json expected, expected_chat;
  std::vector<json> alone;
  {
    ServeProcess plain;
    expected = choices(post(plain, kCompletions, request.dump()));
    expected_chat = streamed(post(plain, kChat, chat.dump()));
    for (int i = 0; i < 3; ++i) {
      json one = request;
      one["n"] = 1;
      one["seed"] = 21 + i;
      alone.push_back(choices(post(plain, kCompletions, one.dump()))[0]);
    }
  }
  ASSERT_EQ(expected.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    json choice = alone[size_t(i)];
    choice["index"] = i;
    EXPECT_EQ(expected[size_t(i)], choice) << "choice " << i;
  }
  {
    // Three free slots: the three choices decode as rows of the same steps.
    ServeProcess wide({"--parallel", "3", "--cache-ram", "0"});
    EXPECT_EQ(choices(post(wide, kCompletions, request.dump())), expected);
    EXPECT_EQ(metric_now(wide, "strata_batch_max_rows"), 3);
  }
  // Two slots: the choices take slots as requests do (no thread beyond them), so a step carries
  // at most two rows; the third choice runs when a slot is free, with the same tokens.
  ServeProcess server({"--parallel", "2", "--cache-ram", "0"});
  const HttpReply together = post(server, kCompletions, request.dump());
  EXPECT_EQ(choices(together), expected);
  EXPECT_EQ(metric_now(server, "strata_batch_max_rows"), 2);
  // 3 choices x 24 tokens, the first of each sampled from the prompt's logits.
  EXPECT_EQ(metric_now(server, "strata_batch_rows_total"), 3 * 23);
  EXPECT_EQ(metric_now(server, "strata_batch_prefill_rows_total"),
            together.json()["usage"]["prompt_tokens"].get<double>());
  EXPECT_EQ(streamed(post(server, kChat, chat.dump())), expected_chat);
  EXPECT_EQ(server.terminate(15), 0);
}

TEST(ServeParallel, QueueBeyondTheSlotsAnswers429) {
  ServeProcess server({"--parallel", "2", "--max-queue", "1"});
  auto stream = [&] {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{"curl", "-s", "-N", "-H", "Content-Type: application/json",
                                 "--data-binary", kEndless, server.url(kCompletions)});
  };
  const auto first = stream();
  const auto second = stream();
  ASSERT_TRUE(eventually([&] { return metric_now(server, "strata_generations_running") == 2; }));
  const auto third = stream();  // waits: both slots are busy
  ASSERT_TRUE(eventually([&] { return metric_now(server, "strata_queue_depth") == 1; }));
  const HttpReply refused = post(server, kCompletions, R"({"prompt":"hi","max_tokens":2})");
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_NE(refused.body.find("--max-queue 1"), std::string::npos) << refused.body;
  first->signal(SIGKILL);  // a slot frees: the queued one runs
  EXPECT_TRUE(eventually([&] { return metric_now(server, "strata_queue_depth") == 0; }));
  EXPECT_EQ(metric_now(server, "strata_generations_running"), 2);
  second->signal(SIGKILL);
  third->signal(SIGKILL);
  EXPECT_TRUE(eventually([&] { return metric_now(server, "strata_generations_running") == 0; }));
  EXPECT_EQ(metric_now(server, R"(strata_generations_total{finish_reason="cancelled"})"), 3);
}

// An n=3 request on two slots holds both (its second choice runs on the other one): /health and
// /metrics say so, the queue counts that slot (--max-queue 1: one request waits, the next is a
// 429), and the heap policy runs after the choices on the other slot as after whole requests.
TEST(ServeParallel, ChoicesOnOtherSlotsCountAsBusySlots) {
  ServeProcess server({"--parallel", "2", "--max-queue", "1", "--cache-ram", "0"});
  const std::string three = kEndless.substr(0, kEndless.size() - 1) + R"(,"n":3})";
  auto stream = [&](const std::string& body) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{"curl", "-s", "-N", "-H", "Content-Type: application/json",
                                 "--data-binary", body, server.url(kCompletions)});
  };
  const auto choices = stream(three);
  ASSERT_TRUE(eventually([&] { return metric_now(server, "strata_slots_busy") == 2; }));
  EXPECT_EQ(metric_now(server, "strata_generations_running"), 1);
  const json health = get(server, "/health").json();
  EXPECT_EQ(health["slots_processing"], 2) << health;
  EXPECT_EQ(health["slots_idle"], 0) << health;
  const auto waiting = stream(kEndless);  // no slot is free: it waits
  ASSERT_TRUE(eventually([&] { return metric_now(server, "strata_queue_depth") == 1; }));
  const HttpReply refused = post(server, kCompletions, R"({"prompt":"hi","max_tokens":2})");
  EXPECT_EQ(refused.status, 429) << refused.body;
  choices->signal(SIGKILL);  // its slots free: the waiting request runs
  EXPECT_TRUE(eventually([&] {
    return metric_now(server, "strata_queue_depth") == 0 &&
           metric_now(server, "strata_generations_running") == 1;
  }));
  waiting->signal(SIGKILL);
  EXPECT_TRUE(eventually([&] { return metric_now(server, "strata_slots_busy") == 0; }));
  // The two requests ran, and the n=3 one lent two choices: the first ran choice 1 on the other
  // slot (a check after it); the second waited for a free slot, and whether it found choice 2
  // left (a check) or the job's worker had run it (none) is a race between the two cancelled
  // choices. So three or four checks (LentChoiceThatFindsNothingCountsNoHeapCheck: the case
  // without the race).
  // The second lent choice may still wait in the scheduler's list when the slots first read
  // idle, and count its check after: wait for three, then until the count holds still for 0.5 s.
  EXPECT_TRUE(eventually([&] { return metric_now(server, "strata_heap_trim_checks_total") >= 3; }));
  double before = metric_now(server, "strata_heap_trim_checks_total");
  for (int settle = 0; settle < 40; ++settle) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const double now = metric_now(server, "strata_heap_trim_checks_total");
    if (now == before && metric_now(server, "strata_slots_busy") == 0) break;
    before = now;
  }
  EXPECT_GE(before, 3);
  EXPECT_LE(before, 4);
  const HttpReply short_three =
      post(server, kCompletions, R"({"prompt":"x","max_tokens":3,"ignore_eos":true,"n":3})");
  EXPECT_EQ(short_three.status, 200) << short_three.body;
  // The request and its choice 1 on the other slot; choice 2 as above.
  EXPECT_TRUE(eventually(
      [&] { return metric_now(server, "strata_heap_trim_checks_total") >= before + 2; }, 5));
  EXPECT_TRUE(eventually([&] { return get(server, "/health").json()["slots_idle"] == 2; }));
  EXPECT_LE(metric_now(server, "strata_heap_trim_checks_total"), before + 3);
}

// A lent choice that finds nothing left to claim ran no generation: no heap check follows it.
// One slot streams an endless request; an n=2 request on the other lends its second choice,
// which no slot is free to take, so its own worker runs both choices; the lent task starts on
// that slot once the request ended and finds nothing. Checks: one for the n=2 request, one for
// the endless one when it ends (there was a third, for the empty task, before).
TEST(ServeParallel, LentChoiceThatFindsNothingCountsNoHeapCheck) {
  ServeProcess server({"--parallel", "2", "--cache-ram", "0"});
  const auto checks = [&] { return metric_now(server, "strata_heap_trim_checks_total"); };
  ChildProcess endless({"curl", "-s", "-N", "-H", "Content-Type: application/json", "--data-binary",
                        kEndless, server.url(kCompletions)});
  ASSERT_TRUE(eventually([&] { return metric_now(server, "strata_slots_busy") == 1; }));
  EXPECT_EQ(checks(), 0);
  const HttpReply two =
      post(server, kCompletions, R"({"prompt":"x","max_tokens":3,"ignore_eos":true,"n":2})");
  ASSERT_EQ(two.status, 200) << two.body;
  EXPECT_EQ(json::parse(two.body)["choices"].size(), 2u) << two.body;
  ASSERT_FALSE(endless.wait(0).has_value()) << "the endless request ended: no slot was busy";
  endless.signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return metric_now(server, "strata_slots_busy") == 0; }));
  ASSERT_TRUE(eventually([&] { return checks() >= 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // room for a wrong third
  EXPECT_EQ(checks(), 2);
}

TEST(ServeParallel, BadValuesAndRefusedCombinationsFailAtStart) {
  auto start = [](std::vector<std::string> args) {
    std::vector<std::string> argv = {STRATA_BINARY, "serve", "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess p(argv);
    const std::optional<int> code = p.wait(30);
    EXPECT_TRUE(code.has_value());
    EXPECT_NE(code.value_or(0), 0);
    return p.stderr_text();
  };
  EXPECT_NE(start({"--parallel", "0"})
                .find("--parallel: expected a number of slots from 1 to 256, found 0"),
            std::string::npos);
  EXPECT_NE(start({"--parallel", "2", "--spec", "suffix"}).find("--parallel 2 with --spec"),
            std::string::npos);
  EXPECT_NE(start({"--parallel", "2", "--moce", "0.5"}).find("--parallel 2 with --moce"),
            std::string::npos);
  EXPECT_NE(start({"--batch-groups", "2"}).find("with --parallel 1 there are none"),
            std::string::npos);
  for (const char* bad : {"0", "-1", "many"})
    EXPECT_NE(start({"--parallel", "2", fmt::format("--batch-groups={}", bad)})
                  .find(fmt::format("--batch-groups: expected auto or a number of groups from 1 "
                                    "to 256, found '{}'",
                                    bad)),
              std::string::npos)
        << bad;
  EXPECT_NE(start({"--parallel", "2", "--batch-groups", "2", "--slots-per-layer", "2"})
                .find("a RAM-budget expert store keeps one residency state"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::serve::test
