// The pure parts of the server: the OpenAI response shapes, stop strings, the scheduler's queue
// bound, order and cancellation, and the Prometheus text.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "serve/access_control.h"
#include "serve/heap_policy.h"
#include "serve/metrics.h"
#include "serve/openai_format.h"
#include "serve/scheduler.h"
#include "serve/stop_matcher.h"

namespace strata::serve {
namespace {

using namespace std::chrono_literals;

CompletionIdentity chat_identity() {
  return {Endpoint::ChatCompletions, "chatcmpl-abc", 1700000000, "m"};
}

TEST(ServeFormat, ChatChunksHaveOpenAiShapeAndKeyOrder) {
  EXPECT_EQ(
      dump_json(chat_role_chunk(chat_identity(), false)),
      R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",)"
      R"("system_fingerprint":"fp_strata","choices":[{"index":0,"delta":{"role":"assistant","content":"",)"
      R"("refusal":null},"logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(
      sse_event(delta_chunk(chat_identity(), {"Hi", ""}, true)),
      "data: "
      R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",)"
      R"("system_fingerprint":"fp_strata","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,)"
      R"("finish_reason":null}],"usage":null})"
      "\n\n");
  EXPECT_EQ(dump_json(finish_chunk(chat_identity(), FinishReason::Length, false)["choices"][0]),
            R"({"index":0,"delta":{},"logprobs":null,"finish_reason":"length"})");
  EXPECT_EQ(
      dump_json(usage_chunk(chat_identity(), {5, 3, 2, 1})),
      R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",)"
      R"("system_fingerprint":"fp_strata","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,)"
      R"("total_tokens":8,"prompt_tokens_details":{"cached_tokens":2},)"
      R"("completion_tokens_details":{"reasoning_tokens":1}}})");
  EXPECT_EQ(dump_json(delta_chunk(chat_identity(), {"", "think"}, false)["choices"][0]["delta"]),
            R"({"reasoning_content":"think"})");
}

TEST(ServeFormat, WholeCompletions) {
  const Json chat = completion_json(chat_identity(), {"Hello", "hmm"}, FinishReason::Stop, {4, 2});
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(
      dump_json(chat["choices"][0]),
      R"({"index":0,"message":{"role":"assistant","content":"Hello","refusal":null,"reasoning_content":"hmm"},)"
      R"("logprobs":null,"finish_reason":"stop"})");
  EXPECT_EQ(chat["usage"]["total_tokens"], 6);
  const CompletionIdentity text{Endpoint::Completions, "cmpl-x", 1, "m"};
  const Json completion = completion_json(text, {"abc", ""}, FinishReason::Length, {1, 3});
  EXPECT_EQ(completion["object"], "text_completion");
  EXPECT_EQ(dump_json(completion["choices"][0]),
            R"({"text":"abc","index":0,"logprobs":null,"finish_reason":"length"})");
  EXPECT_EQ(dump_json(delta_chunk(text, {"t", ""}, false)["choices"][0]),
            R"({"text":"t","index":0,"logprobs":null,"finish_reason":null})");
}

TEST(ServeFormat, ToolCallsWholeAndStreamed) {
  // Streamed: the first delta of a call has id, type and name, the next ones argument text.
  TextDelta head;
  head.tool_calls = {{0, "call_1", "get_weather", ""}};
  EXPECT_EQ(dump_json(delta_chunk(chat_identity(), head, false)["choices"][0]["delta"]),
            R"({"tool_calls":[{"index":0,"id":"call_1","type":"function","function":)"
            R"({"name":"get_weather","arguments":""}}]})");
  TextDelta fragment;
  fragment.choice = 1;
  fragment.tool_calls = {{0, "", "", R"({"city":"P"})"}};
  EXPECT_EQ(
      dump_json(delta_chunk(chat_identity(), fragment, false)["choices"][0]),
      R"({"index":1,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"P\"}"}}]},)"
      R"("logprobs":null,"finish_reason":null})");
  EXPECT_EQ(
      dump_json(finish_chunk(chat_identity(), FinishReason::ToolCalls, false, 1)["choices"][0]),
      R"({"index":1,"delta":{},"logprobs":null,"finish_reason":"tool_calls"})");
  // Whole: message.tool_calls, content null when nothing but whitespace came besides.
  ChoiceResult choice;
  choice.text.content = "\n";
  choice.text.tool_calls = {{0, "call_1", "get_weather", R"({"city":"P"})"}};
  choice.finish = FinishReason::ToolCalls;
  const Json whole = completion_json(chat_identity(), std::span(&choice, 1), {4, 2}, false);
  EXPECT_EQ(
      dump_json(whole["choices"][0]),
      R"({"index":0,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":)"
      R"([{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":)"
      R"("{\"city\":\"P\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"})");
}

TEST(ServeFormat, LogprobsShapes) {
  const std::vector<LogprobEntry> entries = {{"Hi", -0.5, {{"Hi", -0.5}, {"Ho", -1.25}}},
                                             {"\xE2", -2.0, {}}};
  EXPECT_EQ(dump_json(logprobs_json(Endpoint::ChatCompletions, entries, 0)),
            R"({"content":[{"token":"Hi","logprob":-0.5,"bytes":[72,105],"top_logprobs":)"
            R"([{"token":"Hi","logprob":-0.5,"bytes":[72,105]},{"token":"Ho","logprob":-1.25,)"
            R"("bytes":[72,111]}]},{"token":"�","logprob":-2.0,"bytes":[226],"top_logprobs":[]}],)"
            R"("refusal":null})");
  EXPECT_EQ(dump_json(logprobs_json(Endpoint::Completions, entries, 7)),
            R"({"tokens":["Hi","�"],"token_logprobs":[-0.5,-2.0],"top_logprobs":)"
            R"([{"Hi":-0.5,"Ho":-1.25},{}],"text_offset":[7,9]})");
}

TEST(ServeFormat, ErrorsAndIds) {
  ApiError error = invalid_field("max_tokens", "expected {}", 1);
  EXPECT_EQ(
      dump_json(error_json(error)),
      R"({"error":{"message":"max_tokens: expected 1","type":"invalid_request_error","param":"max_tokens",)"
      R"("code":null}})");
  const std::string a = new_completion_id(Endpoint::ChatCompletions),
                    b = new_completion_id(Endpoint::ChatCompletions);
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 9u + 24u);
  EXPECT_NE(a, b);
  EXPECT_EQ(new_completion_id(Endpoint::Completions).rfind("cmpl-", 0), 0u);
}

TEST(ServeFormat, InvalidUtf8NeverBreaksTheJson) {
  EXPECT_EQ(dump_json(Json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

std::string feed(StopMatcher& matcher, std::string_view text, size_t piece) {
  std::string out;
  for (size_t i = 0; i < text.size() && !matcher.stopped(); i += piece)
    out += matcher.push(text.substr(i, piece));
  return out + matcher.finish();
}

TEST(ServeStop, CutsAtTheEarliestStopForAnyChunking) {
  const std::string text = "Hello, world. The end is near. END";
  for (size_t piece = 1; piece <= text.size(); ++piece) {
    SCOPED_TRACE(piece);
    StopMatcher none({});
    EXPECT_EQ(feed(none, text, piece), text);
    StopMatcher matcher({"end", "near", "xyz"});
    EXPECT_EQ(feed(matcher, text, piece), "Hello, world. The ");
    EXPECT_TRUE(matcher.stopped());
    EXPECT_EQ(matcher.matched(), "end");
    StopMatcher absent({"ENDX"});
    EXPECT_EQ(feed(absent, text, piece), text);  // the held-back "END" comes out at finish
    EXPECT_FALSE(absent.stopped());
    EXPECT_EQ(absent.matched(), "");
  }
}

TEST(ServeStop, TheStopThatCompletesFirstWins) {
  // "bc" is complete one byte before "abcd" is: token by token the generation stops there.
  for (size_t piece = 1; piece <= 5; ++piece) {
    SCOPED_TRACE(piece);
    StopMatcher matcher({"abcd", "bc"});
    EXPECT_EQ(feed(matcher, "xabcd", piece), "xa");
    EXPECT_EQ(matcher.matched(), "bc");
    StopMatcher same_end({"cd", "bcd"});  // both complete at the same byte: the longer one
    EXPECT_EQ(feed(same_end, "xabcd", piece), "xa");
    EXPECT_EQ(same_end.matched(), "bcd");
  }
}

TEST(ServeStop, HoldsBackOnlyWhatCouldStartAStop) {
  StopMatcher matcher({"abc"});
  EXPECT_EQ(matcher.push("xxab"), "xx");
  EXPECT_EQ(matcher.push("d"), "abd");
  EXPECT_EQ(matcher.push("a"), "");
  EXPECT_EQ(matcher.push("bc tail"), "");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.push("more"), "");
}

GenerationPlan tiny_plan() {
  GenerationPlan plan;
  plan.prompt = {1};
  plan.max_new_tokens = 1;
  return plan;
}

TEST(ServeScheduler, RunsInOrderAndBoundsTheQueue) {
  std::atomic<bool> release{false};
  std::vector<int> order;
  std::mutex order_mutex;
  Scheduler scheduler(2, [&](Job& job) {
    while (!release && !job.cancel_requested()) std::this_thread::sleep_for(1ms);
    std::lock_guard lock(order_mutex);
    order.push_back(int(job.plan().max_new_tokens));
    job.finish({});
  });
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 1; i <= 3; ++i) {
    GenerationPlan plan = tiny_plan();
    plan.max_new_tokens = i;
    jobs.push_back(std::make_shared<Job>(plan, Clock::now()));
    ASSERT_EQ(scheduler.submit(jobs.back()), Scheduler::Admission::Accepted) << i;
    if (i == 1) {
      ASSERT_EQ(jobs[0]->wait_started(5s), JobState::Running);
    }
  }
  // One running + two waiting = --max-queue 2 is full.
  EXPECT_EQ(scheduler.queue_depth(), 2u);
  EXPECT_EQ(scheduler.submit(std::make_shared<Job>(tiny_plan(), Clock::now())),
            Scheduler::Admission::QueueFull);
  release = true;
  for (auto& job : jobs) EXPECT_EQ(job->wait_update(5s).state, JobState::Finished);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(ServeScheduler, MaxQueueZeroStillRunsOneAtATime) {
  Scheduler scheduler(0, [](Job& job) {
    while (!job.cancel_requested()) std::this_thread::sleep_for(1ms);
    job.finish({});
  });
  auto first = std::make_shared<Job>(tiny_plan(), Clock::now());
  ASSERT_EQ(scheduler.submit(first), Scheduler::Admission::Accepted);
  ASSERT_EQ(first->wait_started(5s), JobState::Running);
  EXPECT_EQ(scheduler.submit(std::make_shared<Job>(tiny_plan(), Clock::now())),
            Scheduler::Admission::QueueFull);
  scheduler.cancel(first, CancelReason::ClientGone);
  EXPECT_EQ(first->wait_update(5s).state, JobState::Finished);
}

TEST(ServeScheduler, CancelRemovesAWaitingJobAtOnce) {
  std::atomic<bool> release{false};
  Scheduler scheduler(4, [&](Job& job) {
    while (!release) std::this_thread::sleep_for(1ms);
    job.finish({});
  });
  auto running = std::make_shared<Job>(tiny_plan(), Clock::now());
  auto waiting = std::make_shared<Job>(tiny_plan(), Clock::now());
  scheduler.submit(running);
  scheduler.submit(waiting);
  ASSERT_EQ(running->wait_started(5s), JobState::Running);
  scheduler.cancel(waiting, CancelReason::ClientGone);
  EXPECT_EQ(scheduler.queue_depth(), 0u);
  const Job::Update update = waiting->wait_update(0ms);
  EXPECT_EQ(update.state, JobState::Finished);
  EXPECT_TRUE(update.error);
  release = true;
}

TEST(ServeScheduler, ShutdownFailsWaitingJobsAndCancelsTheRunningOneAfterGrace) {
  Scheduler scheduler(4, [](Job& job) {
    job.emit({"partial", ""});
    while (!job.cancel_requested()) std::this_thread::sleep_for(1ms);
    GenerationOutcome outcome;
    outcome.cancelled = true;
    job.finish(outcome);
  });
  auto running = std::make_shared<Job>(tiny_plan(), Clock::now());
  auto waiting = std::make_shared<Job>(tiny_plan(), Clock::now());
  scheduler.submit(running);
  scheduler.submit(waiting);
  ASSERT_EQ(running->wait_started(5s), JobState::Running);
  const auto start = Clock::now();
  scheduler.shutdown(100ms);
  EXPECT_GE(Clock::now() - start, 100ms);
  const Job::Update w = waiting->wait_update(0ms);
  ASSERT_TRUE(w.error);
  EXPECT_EQ(w.error->status, 503);
  const Job::Update r = running->wait_update(0ms);
  ASSERT_TRUE(r.outcome);
  EXPECT_TRUE(r.outcome->cancelled);
  EXPECT_EQ(running->cancel_reason(), CancelReason::Shutdown);
  ASSERT_EQ(r.deltas.size(), 1u);
  EXPECT_EQ(r.deltas[0].content, "partial");
  EXPECT_EQ(scheduler.submit(std::make_shared<Job>(tiny_plan(), Clock::now())),
            Scheduler::Admission::ShuttingDown);
}

// A job that lends a part of its work to the other slot (an n > 1 request's choices) holds both
// slots: the queue admits max_queue waiting jobs behind the busy slots, not behind the running
// jobs (it admitted one more before), and busy_slots says 2 while running_count says 1.
// after_work runs after the job and after the lent task, each on its own worker.
TEST(ServeScheduler, LentTasksHoldSlotsAndAreFollowedByAfterWork) {
  std::atomic<bool> release{false}, lent_running{false};
  std::atomic<int> after_work{0}, after_work_before_job_ended{0};
  std::unique_ptr<Scheduler> scheduler;
  scheduler = std::make_unique<Scheduler>(
      1,
      [&](Job& job) {
        if (job.plan().max_new_tokens == 1) {
          scheduler->lend([&] {
            lent_running = true;
            while (!release) std::this_thread::sleep_for(1ms);
            return true;
          });
          while (!release) std::this_thread::sleep_for(1ms);
          // The lent task's after_work follows it on the other worker, before this job ends.
          for (int i = 0; i < 5000 && after_work == 0; ++i) std::this_thread::sleep_for(1ms);
          after_work_before_job_ended = after_work.load();
        }
        job.finish({});
      },
      2, [&] { ++after_work; });
  auto lender = std::make_shared<Job>(tiny_plan(), Clock::now());
  ASSERT_EQ(scheduler->submit(lender), Scheduler::Admission::Accepted);
  for (int i = 0; i < 5000 && !lent_running; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(lent_running);
  EXPECT_EQ(scheduler->running_count(), 1u);
  EXPECT_EQ(scheduler->busy_slots(), 2u);
  GenerationPlan plan = tiny_plan();
  plan.max_new_tokens = 2;
  auto waiting = std::make_shared<Job>(plan, Clock::now());
  EXPECT_EQ(scheduler->submit(waiting), Scheduler::Admission::Accepted);  // --max-queue 1
  EXPECT_EQ(scheduler->submit(std::make_shared<Job>(plan, Clock::now())),
            Scheduler::Admission::QueueFull);
  release = true;
  EXPECT_EQ(lender->wait_update(5s).state, JobState::Finished);
  EXPECT_EQ(waiting->wait_update(5s).state, JobState::Finished);
  // At least the lent task's (the waiting job may have run after it on that worker, also before).
  EXPECT_GE(after_work_before_job_ended, 1);
  for (int i = 0; i < 5000 && after_work < 3; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(after_work, 3);  // two jobs and the lent task
  // A worker frees its slot after its after_work returns (Scheduler::work), so the count of
  // after_work can reach 3 a moment before the last slot is free: polled (CI's fresh clone read 1).
  for (int i = 0; i < 5000 && scheduler->busy_slots() != 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(scheduler->busy_slots(), 0u);
  scheduler->shutdown(0ms);
}

// A lent task that did nothing (it returns false: an n > 1 request's choice that the job's own
// worker ran already) ran no generation, so no after_work follows it; one that worked is followed.
TEST(ServeScheduler, AfterWorkFollowsOnlyLentTasksThatWorked) {
  std::atomic<int> after_work{0}, lent_ran{0};
  std::unique_ptr<Scheduler> scheduler;
  scheduler = std::make_unique<Scheduler>(
      1,
      [&](Job& job) {
        // One slot: both tasks run on it after this job, before any queued job.
        scheduler->lend([&] {
          ++lent_ran;
          return false;
        });
        scheduler->lend([&] {
          ++lent_ran;
          return true;
        });
        job.finish({});
      },
      1, [&] { ++after_work; });
  auto job = std::make_shared<Job>(tiny_plan(), Clock::now());
  ASSERT_EQ(scheduler->submit(job), Scheduler::Admission::Accepted);
  EXPECT_EQ(job->wait_update(30s).state, JobState::Finished);
  // busy_slots drops after a task's after_work: once both ran and the slot is free, all are in.
  for (int i = 0; i < 30000 && !(lent_ran == 2 && scheduler->busy_slots() == 0); ++i)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(lent_ran, 2);
  EXPECT_EQ(scheduler->busy_slots(), 0u);
  EXPECT_EQ(after_work, 2);  // the job and the task that worked
  scheduler->shutdown(0ms);
}

TEST(ServeScheduler, RunnerExceptionBecomesA500) {
  Scheduler scheduler(1, [](Job&) { throw std::runtime_error("boom"); });
  auto job = std::make_shared<Job>(tiny_plan(), Clock::now());
  scheduler.submit(job);
  const Job::Update update = job->wait_update(5s);
  ASSERT_TRUE(update.error);
  EXPECT_EQ(update.error->status, 500);
  EXPECT_NE(update.error->message.find("boom"), std::string::npos);
}

// A line of the text format: "# HELP name text", "# TYPE name kind" or "name[{k="v",...}] value".
// (No std::regex: g++ 12 warns inside <regex> under ASan.)
bool prometheus_line_ok(const std::string& line) {
  auto is_name = [](std::string_view s) {
    return !s.empty() &&
           s.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string_view::npos;
  };
  if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
    const size_t space = line.find(' ', 7);
    return space != std::string::npos && is_name(std::string_view(line).substr(7, space - 7)) &&
           space + 1 < line.size();
  }
  const size_t space = line.rfind(' ');
  if (space == std::string::npos) return false;
  const std::string value = line.substr(space + 1);
  char* parsed_end = nullptr;
  std::strtod(value.c_str(), &parsed_end);
  if (value.empty() || *parsed_end != '\0') return false;
  std::string_view series = std::string_view(line).substr(0, space);
  const size_t brace = series.find('{');
  if (brace == std::string_view::npos) return is_name(series);
  if (series.back() != '}' || !is_name(series.substr(0, brace))) return false;
  // labels: k="v" pairs separated by commas
  std::string_view labels = series.substr(brace + 1, series.size() - brace - 2);
  while (!labels.empty()) {
    const size_t eq = labels.find("=\"");
    if (eq == std::string_view::npos || !is_name(labels.substr(0, eq))) return false;
    const size_t close = labels.find('"', eq + 2);
    if (close == std::string_view::npos) return false;
    labels.remove_prefix(close + 1);
    if (!labels.empty()) {
      if (labels[0] != ',') return false;
      labels.remove_prefix(1);
    }
  }
  return true;
}

TEST(ServeMetrics, PrometheusTextIsWellFormed) {
  ServeMetrics metrics;
  metrics.count_response("/v1/completions", 200);
  metrics.count_response("/v1/completions", 429);
  metrics.observe_time_to_first_token(0.03);
  metrics.observe_time_to_first_token(7);
  metrics.record_generation({"stop", 10, 5, 0.01, 0.02, 0.1, 0.2});
  const std::string text = metrics.render({3, 64, true});
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    ASSERT_NE(end, std::string::npos) << "no final newline";
    const std::string line = text.substr(start, end - start);
    EXPECT_TRUE(prometheus_line_ok(line)) << line;
    start = end + 1;
  }
  for (const char* expected :
       {"strata_http_requests_total{path=\"/v1/completions\",status=\"429\"} 1\n",
        "strata_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n",
        "strata_time_to_first_token_seconds_bucket{le=\"10\"} 2\n",
        "strata_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n",
        "strata_time_to_first_token_seconds_count 2\n", "strata_queue_depth 3\n",
        "strata_queue_capacity 64\n", "strata_generation_running 1\n",
        "strata_generations_total{finish_reason=\"stop\"} 1\n", "strata_prompt_tokens_total 10\n",
        "strata_completion_tokens_total 5\n", "strata_decode_tokens_per_second 40\n"})
    EXPECT_NE(text.find(expected), std::string::npos) << expected;
}

// The heap gauges that tell allocator growth from a leak (docs/serve.md "Load test"), and the
// trims after generations (their thread and interval: heap_policy_test.cpp).
TEST(ServeHeap, GaugesShowTheTrims) {
  ServeMetrics metrics;
  HeapPolicy heap([] {}, 1h);
  for (int i = 0; i < 200; ++i) heap.after_generation();  // well within one interval
  for (int i = 0; i < 30000 && heap.stats().trims == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(heap.stats().trims, 1u);
  EXPECT_GE(heap.stats().trim_seconds, 0.0);
  LiveGauges live;
  live.heap_trims = heap.stats();
  const std::string text = metrics.render(live);
  auto value = [&](const std::string& series) {
    const size_t at = text.find("\n" + series + " ");
    EXPECT_NE(at, std::string::npos) << series;
    return at == std::string::npos ? -1.0 : std::atof(text.c_str() + at + series.size() + 2);
  };
  EXPECT_EQ(value("strata_heap_trims_total"), 1);
  EXPECT_EQ(value("strata_heap_trim_checks_total"), 200);
#if defined(__SANITIZE_ADDRESS__)
#define STRATA_UNITS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STRATA_UNITS_ASAN 1
#endif
#endif
#ifdef STRATA_UNITS_ASAN
  // AddressSanitizer owns malloc: glibc's mallinfo2 sees none of its memory and reports 0.
  EXPECT_GE(value("strata_heap_in_use_bytes{kind=\"arena\"}"), 0);
#else
  EXPECT_GT(value("strata_heap_in_use_bytes{kind=\"arena\"}"), 0);
#endif
  EXPECT_GE(value("strata_heap_in_use_bytes{kind=\"mmap\"}"), 0);
  EXPECT_GE(value("strata_heap_free_bytes"), 0);
  EXPECT_GT(value("process_resident_memory_bytes"), 1 << 20);
}

TEST(ServeAccess, ApiKeysMatchExactlyAndOriginsAsListed) {
  const std::vector<std::string> keys = {"alpha-key", "beta"};
  EXPECT_TRUE(api_key_matches("alpha-key", keys));
  EXPECT_TRUE(api_key_matches("beta", keys));
  for (const char* wrong : {"", "alpha", "alpha-keyy", "Alpha-key", "bet", "betaa", "alpha-kex"})
    EXPECT_FALSE(api_key_matches(wrong, keys)) << wrong;
  EXPECT_FALSE(api_key_matches("", {}));

  const std::vector<std::string> origins = {"http://a.example", "https://b.example:8443"};
  EXPECT_EQ(allowed_origin("http://a.example", origins), "http://a.example");
  EXPECT_EQ(allowed_origin("https://b.example:8443", origins), "https://b.example:8443");
  EXPECT_EQ(allowed_origin("https://a.example", origins), std::nullopt);
  EXPECT_EQ(allowed_origin("http://a.example.evil", origins), std::nullopt);
  EXPECT_EQ(allowed_origin("", origins), std::nullopt);
  EXPECT_EQ(allowed_origin("http://anything", {"*"}), "*");
  EXPECT_EQ(allowed_origin("http://a.example", {}), std::nullopt);
}

}  // namespace
}  // namespace strata::serve
