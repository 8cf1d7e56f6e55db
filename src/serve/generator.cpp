#include "serve/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "decode/generate.h"
#include "engine/prefill_window.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "experts/expert_store.h"
#include "model/model.h"
#include "serve/stop_matcher.h"
#include "serve/tool_calls.h"
#include "text/think_filter.h"
#include "util/error.h"
#include "util/function_ref.h"

namespace strata::serve {
namespace {

// The longest prefill window (cancellation is checked between windows). One slot: the backend's
// (engine/prefill_window.h: 512 rows on the CPU, cut at multiples of 64 by the state cache, so
// the bits of 64-row windows). Parallel slots: 64, because a joining slot's prompt window rides
// in the batched decode step (DecodeBatcher::prefill), and a 512-row window would hold every
// other slot's next token for as long as it runs.
// --chunk (served.prefill_rows) overrides it.
int prefill_rows(const ServedModel& served, int parallel) {
  if (served.prefill_rows > 0) return served.prefill_rows;
  return parallel > 1 ? kPrefillAlignRows : default_prefill_rows(served.backend);
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The generation loop's callbacks (decode/generate.h) as lambdas of run_choice, which share its
// locals (the text pipeline, the recorder, the job).
class ChoiceCallbacks final : public GenerationCallbacks {
 public:
  ChoiceCallbacks(FunctionRef<bool(int32_t)> is_stop,
                  FunctionRef<bool(int32_t, std::span<const float>)> on_token,
                  FunctionRef<bool()> cancel, FunctionRef<void(const spec::WindowReport&)> window,
                  FunctionRef<void(Session&, int32_t)> decode)
      : is_stop_(is_stop), on_token_(on_token), cancel_(cancel), window_(window), decode_(decode) {}
  bool is_stop_token(int32_t token) override { return is_stop_(token); }
  bool on_token(int32_t token, std::span<const float> logits) override {
    return on_token_(token, logits);
  }
  bool cancel_requested() override { return cancel_(); }
  void on_window(const spec::WindowReport& window) override { window_(window); }
  void decode(Session& session, int32_t token) override { decode_(session, token); }

 private:
  FunctionRef<bool(int32_t)> is_stop_;
  FunctionRef<bool(int32_t, std::span<const float>)> on_token_;
  FunctionRef<bool()> cancel_;
  FunctionRef<void(const spec::WindowReport&)> window_;
  FunctionRef<void(Session&, int32_t)> decode_;
};

}  // namespace

Generator::Generator(const ServedModel& served, compute::ThreadPool& pool, ServeMetrics& metrics,
                     DashboardHub& dashboard, const spec::SpecOptions& spec, bool log_spec,
                     bool profile, uint64_t cache_ram_bytes, int parallel, int batch_groups)
    : served_(served),
      pool_(pool),
      metrics_(metrics),
      spec_(spec),
      log_spec_(log_spec),
      spec_gate_(spec.mode == spec::SpecMode::Off ? nullptr
                                                  : std::make_unique<spec::SpecGate>(spec.gate)),
      recorder_(served, dashboard, spec, profile),
      cache_(served.backend == "cpu" ? cache_ram_bytes : 0, kPrefillAlignRows,
             prefill_rows(served, parallel)),
      parallel_(parallel) {
  if (parallel < 1) fail("--parallel: expected at least 1 slot, found {}", parallel);
  if (parallel > 1 && spec.mode != spec::SpecMode::Off)
    fail(
        "--parallel {} with --spec: speculative decoding runs one sequence at a time (its verify "
        "windows and the shared SpecGate are per sequence); use --parallel 1 or --spec off",
        parallel);
  if (parallel > 1 && served.backend != "cpu")
    fail(
        "--parallel {} needs the cpu backend (batched windows run the sequences' states as host "
        "structs), found --backend {}; use --backend cpu or --parallel 1",
        parallel, served.backend);
  if (batch_groups > 1 && parallel == 1)
    fail(
        "--batch-groups {} cuts the batched steps of --parallel slots; with --parallel 1 there are "
        "none",
        batch_groups);
  if (batch_groups > 1 && served.expert_store)
    fail(
        "--batch-groups {}: the groups read their experts from the file mapping side by side, and "
        "a RAM-budget expert store keeps one residency state; use --batch-groups 1 with it",
        batch_groups);
  if (parallel > 1)
    batcher_ = std::make_unique<DecodeBatcher>(
        engine_lock_, BatchGroups{batch_groups, pool.size(), served.model});
  // At start, not as a 500 on every request.
  if ((spec.mode == spec::SpecMode::Mtp || spec.mode == spec::SpecMode::Both) &&
      !served.model->has_mtp())
    fail(
        "{}: --spec mtp/both needs an MTP (nextn) head, and this model has none; use --spec suffix",
        served.model->file().path());
}

std::string Generator::spec_summary() const {
  return spec_gate_ ? spec_gate_->summary() : std::string();
}

const grammar::TokenVocabulary& Generator::vocabulary() {
  std::lock_guard lock(vocabulary_mutex_);
  if (!vocabulary_) {
    std::vector<int32_t> stops;
    if (served_.tokenizer->eos_id()) stops.push_back(*served_.tokenizer->eos_id());
    if (served_.end_of_turn) stops.push_back(*served_.end_of_turn);
    vocabulary_ =
        std::make_unique<grammar::TokenVocabulary>(grammar::TokenVocabulary::from_tokenizer(
            *served_.tokenizer, std::move(stops), size_t(served_.model->hparams().n_vocab)));
  }
  return *vocabulary_;
}

std::shared_ptr<grammar::SharedMasks> Generator::shared_masks(
    const std::shared_ptr<const grammar::Grammar>& grammar) {
  // 8 grammars, 256 masks each: Generator's class comment has the bytes.
  constexpr size_t kGrammars = 8, kMasksPerGrammar = 256;
  std::lock_guard lock(masks_mutex_);
  for (auto it = shared_masks_.begin(); it != shared_masks_.end(); ++it)
    if (it->grammar == grammar) {
      shared_masks_.splice(shared_masks_.begin(), shared_masks_, it);
      return it->masks;
    }
  shared_masks_.push_front({grammar, std::make_shared<grammar::SharedMasks>(kMasksPerGrammar)});
  if (shared_masks_.size() > kGrammars) shared_masks_.pop_back();  // in use: lives on meanwhile
  return shared_masks_.front().masks;
}

Generator::SharedMaskStats Generator::shared_mask_stats() const {
  std::lock_guard lock(masks_mutex_);
  SharedMaskStats stats;
  stats.grammars = shared_masks_.size();
  for (const GrammarMasks& kept : shared_masks_) {
    stats.masks += kept.masks->size();
    stats.hits += kept.masks->hits();
  }
  return stats;
}

// Choice 0's prompt state, handed to the other choices of its job (parallel slots): published
// once, after choice 0's prefill, or empty when choice 0 stopped before its prompt was in.
// Any thread.
class PromptShare {
 public:
  void publish(std::shared_ptr<const SessionSnapshot> prompt) {
    std::lock_guard lock(mutex_);
    if (published_) return;
    published_ = true;
    prompt_ = std::move(prompt);
    ready_.notify_all();
  }
  std::shared_ptr<const SessionSnapshot> wait() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return published_; });
    return prompt_;
  }

 private:
  std::mutex mutex_;  // guards everything below
  std::condition_variable ready_;
  bool published_ = false;
  std::shared_ptr<const SessionSnapshot> prompt_;
};

// The choices of one job with parallel slots (Generator::run): which are claimed, their
// outcomes and errors, choice 0's prompt state. Shared with the tasks lent to the scheduler,
// which may start after the job ended (they then find nothing to claim and touch nothing else).
struct Generator::ChoiceGroup {
  explicit ChoiceGroup(Job& job_, size_t n) : job(job_), n_choices(n), outcomes(n), errors(n) {}
  // The next unclaimed choice (1, 2, ...), or none left. Counts against n_choices, never
  // outcomes.size(): run() moves the outcomes out when the job ends, and a lent task that starts
  // after that must find nothing to claim (it claimed choice n and wrote past the end: a crash
  // under load, seen by ServeParallel.ChoicesOnOtherSlotsCountAsBusySlots).
  std::optional<size_t> claim() {
    std::lock_guard lock(mutex);
    if (next == n_choices) return std::nullopt;
    ++running;
    return next++;
  }
  void done() {
    std::lock_guard lock(mutex);
    --running;
    finished.notify_all();
  }
  // Once nothing is left to claim: returns when every claimed choice has ended.
  void wait_claimed() {
    std::unique_lock lock(mutex);
    finished.wait(lock, [&] { return running == 0; });
  }

  Job& job;  // valid while a choice is claimed and running (run waits for them)
  const size_t n_choices;
  PromptShare share;
  std::vector<GenerationOutcome> outcomes;  // by choice; each written by its runner
  std::vector<std::exception_ptr> errors;   // likewise
  std::mutex mutex;                         // guards next, running
  std::condition_variable finished;
  size_t next = 1;
  size_t running = 0;
};

void Generator::run_claimed(ChoiceGroup& group, size_t choice) {
  try {
    const std::shared_ptr<const SessionSnapshot> prompt = group.share.wait();
    if (!prompt) {
      group.outcomes[choice].cancelled = true;
    } else {
      group.outcomes[choice] = run_choice(group.job, int(choice), prompt.get(), nullptr);
    }
  } catch (...) {
    group.errors[choice] = std::current_exception();
  }
  group.done();
}

void Generator::run(Job& job, const std::function<void(Scheduler::LentTask)>& lend) {
  const GenerationPlan& plan = job.plan();
  const size_t n_choices = size_t(plan.n_choices);
  std::vector<GenerationOutcome> outcomes;
  if (batcher_ && n_choices > 1) {
    // Together, on the scheduler's slots: choice 0 prefills on this worker; the others start
    // from a copy of its prompt state, each on a worker that is free (lent tasks, before queued
    // requests), and all decode as rows of the same batched steps. What no free worker took,
    // this one runs after choice 0. So --parallel N bounds the rows of a step, choices included.
    auto group = std::make_shared<ChoiceGroup>(job, n_choices);
    if (lend)
      for (size_t i = 1; i < n_choices; ++i)
        lend([this, group] {
          // Nothing to claim (the job's worker ran the choice, or the job ended): no generation
          // here, so no heap check follows (Scheduler's after_work).
          const std::optional<size_t> choice = group->claim();
          if (choice) run_claimed(*group, *choice);
          return choice.has_value();
        });
    try {
      group->outcomes[0] = run_choice(job, 0, nullptr, &group->share);
    } catch (...) {
      group->errors[0] = std::current_exception();
    }
    group->share.publish(nullptr);  // releases the others if choice 0 ended before its prompt
    while (const std::optional<size_t> choice = group->claim()) run_claimed(*group, *choice);
    group->wait_claimed();
    for (const std::exception_ptr& error : group->errors)
      if (error) std::rethrow_exception(error);
    outcomes = std::move(group->outcomes);
  } else {
    for (size_t choice = 0; choice < n_choices; ++choice) {
      outcomes.push_back(run_choice(job, int(choice), nullptr, nullptr));
      if (outcomes.back().cancelled) break;
    }
  }
  GenerationOutcome outcome;
  outcome.usage.prompt_tokens = int64_t(plan.prompt.size());
  outcome.finish = outcomes[0].finish;
  outcome.stop_sequence = outcomes[0].stop_sequence;
  outcome.usage.cached_tokens = outcomes[0].usage.cached_tokens;
  for (const GenerationOutcome& one : outcomes) {
    outcome.choice_finish.push_back(one.finish);
    outcome.usage.completion_tokens += one.usage.completion_tokens;
    outcome.usage.reasoning_tokens += one.usage.reasoning_tokens;
    outcome.prefill_s += one.prefill_s;
    outcome.decode_s += one.decode_s;
    outcome.cancelled = outcome.cancelled || one.cancelled;
  }
  job.finish(outcome);
}

GenerationOutcome Generator::run_choice(Job& job, int choice, const SessionSnapshot* prompt_state,
                                        PromptShare* share) {
  const GenerationPlan& plan = job.plan();
  const Clock::time_point started = Clock::now();
  ServeMetrics::Generation report;
  report.queue_wait_s = seconds_between(job.received_at(), started);
  report.prompt_tokens = int64_t(plan.prompt.size());
  GenerationOutcome outcome;
  outcome.usage.prompt_tokens = report.prompt_tokens;
  record([&] { recorder_.begin_generation(report.prompt_tokens, report.queue_wait_s); });
  try {
    ExpertSource* experts = recorder_.source();
    Session session(*served_.model, pool_, experts, served_.backend, served_.n_ctx);
    if (batcher_) {
      session.set_window_lock(&engine_lock_);
      // The prompt's windows ride in the batched steps too (DecodeBatcher::prefill).
      session.set_prefill_runner(
          [this](Session& s, std::span<const int32_t> window) { batcher_->prefill(s, window); });
    }
    SamplerConfig sampling = plan.sampling;
    sampling.seed += uint64_t(choice);  // GenerationPlan::n_choices: choice i's seed
    Sampler sampler(sampling);
    std::shared_ptr<grammar::SharedMasks> masks;  // outlives `constraint`, which uses it
    std::optional<grammar::GrammarConstraint> constraint, delivered;
    if (plan.grammar) {
      const grammar::TokenVocabulary& tokens = vocabulary();
      masks = shared_masks(plan.grammar);
      constraint.emplace(*plan.grammar, tokens, plan.grammar_trigger, masks.get());
      sampler.set_constraint(&*constraint);
      delivered.emplace(*plan.grammar, tokens, plan.grammar_trigger);
    }
    // The value is complete and nothing can follow it: the generation ends there ("stop"). Judged
    // on the tokens delivered so far (`delivered` follows them), not on the sampler's constraint:
    // a verify window samples its rows, and so advances that one, before its tokens are delivered.
    auto value_done = [&] { return delivered && delivered->finished(); };
    StreamingDecoder decoder(*served_.tokenizer, DecodeOptions{.render_control = false});
    StopMatcher stops(plan.stop);
    std::optional<ThinkFilter> think;
    if (plan.split_thinking) think.emplace(ThinkFilter::Mode::Hide, plan.starts_in_thinking);
    // Tool calls (GenerationPlan::parse_tool_calls): the answer, after the think filter, goes
    // through the parser; a call leaves as a delta with its index, id and name, then deltas with
    // fragments of its arguments (one for a whole response; streamed: as they are written).
    std::optional<ToolCallParser> tool_parser;
    if (plan.parse_tool_calls)
      tool_parser.emplace(plan.tool_format, plan.tools, plan.tool_prefix, plan.stream_tool_calls);
    int calls_emitted = 0;
    bool dropping_call = false;  // parallel_tool_calls false: a call after the first
    auto emit_pieces = [&](std::vector<ReplyPiece> pieces) {
      for (ReplyPiece& piece : pieces) {
        switch (piece.kind) {
          case ReplyPiece::Kind::Content:
            job.emit({std::move(piece.text), {}, choice, {}, {}});
            break;
          case ReplyPiece::Kind::CallStart: {
            dropping_call = !plan.parallel_tool_calls && calls_emitted > 0;
            if (dropping_call) break;
            ToolCallDelta start{calls_emitted++, new_random_id("call_"), std::move(piece.text), {}};
            job.emit({{}, {}, choice, {}, {std::move(start)}});
            break;
          }
          case ReplyPiece::Kind::Arguments:
            if (dropping_call) break;
            job.emit({{}, {}, choice, {}, {{calls_emitted - 1, {}, {}, std::move(piece.text)}}});
            break;
        }
      }
    };
    auto emit_answer = [&](std::string answer, std::string reasoning,
                           std::vector<LogprobEntry> logprobs) {
      TextDelta head;
      head.choice = choice;
      head.reasoning = std::move(reasoning);
      head.logprobs = std::move(logprobs);
      if (!tool_parser) {
        head.content = std::move(answer);
        job.emit(std::move(head));
        return;
      }
      std::vector<ReplyPiece> pieces =
          answer.empty() ? std::vector<ReplyPiece>() : tool_parser->push(answer);
      job.emit(std::move(head));
      emit_pieces(std::move(pieces));
    };
    auto deliver = [&](const std::string& text, std::vector<LogprobEntry> logprobs = {}) {
      if (text.empty() && logprobs.empty()) return;
      if (!think) return emit_answer(text, {}, std::move(logprobs));
      ThinkFilter::ReplyDelta split = think->push(text);
      emit_answer(std::move(split.answer), std::move(split.thinking), std::move(logprobs));
    };
    // The chosen token's entry and the alternatives (Sampler::logprobs says of what).
    std::vector<TokenLogprob> top;
    auto logprob_entry = [&](int32_t token, std::span<const float> logits) {
      std::vector<LogprobEntry> entries;
      if (!plan.logprobs) return entries;
      const TokenLogprob chosen =
          sampler.logprobs(logits, session.tokens(), token, *plan.logprobs, top);
      LogprobEntry& entry = entries.emplace_back();
      entry.bytes = served_.tokenizer->token_bytes(token);
      entry.logprob = chosen.logprob;
      for (const TokenLogprob& alt : top)
        entry.top.push_back({served_.tokenizer->token_bytes(alt.id), alt.logprob});
      return entries;
    };

    // Log-probabilities need each token's logits, which the verify windows do not hand out: such
    // requests decode plainly (the same tokens, by SpecDecoder's contract).
    std::optional<spec::SpecDecoder> speculative;
    if (spec_gate_ && !plan.logprobs)
      speculative.emplace(session, sampler, spec_, pool_, experts, spec_gate_.get());
    // Resume from the conversation state cache and prefill the rest (decode/state_cache.h:
    // windows aligned to 64 rows from position 0, as without the cache, so the bits are the same);
    // cancellation is checked between windows.
    const std::span<const int32_t> full_prompt(plan.prompt);
    int64_t cached = 0;
    if (prompt_state) {
      session.restore(*prompt_state);  // choice 0 prefilled the prompt (and saved it)
    } else {
      cached = cache_.prefill(
          session, full_prompt, served_.end_of_turn, speculative ? &*speculative : nullptr,
          [&] { return !job.cancel_requested(); },
          [&] { record([&] { recorder_.prefill_progress(); }); });
    }
    outcome.usage.cached_tokens = cached;
    // The turn boundaries the cache keeps (Generator contract): the prompt, once its first token
    // is out and before anything more is fed, and the sequence at the end.
    const bool prefill_complete = int64_t(session.tokens().size()) == int64_t(full_prompt.size());
    if (share)
      share->publish(prefill_complete ? std::make_shared<const SessionSnapshot>(session.snapshot())
                                      : nullptr);
    bool prompt_saved =
        !prefill_complete || cached == int64_t(full_prompt.size()) || prompt_state != nullptr;
    auto save_prompt = [&] {
      if (prompt_saved) return;
      prompt_saved = true;
      cache_.save(session, speculative ? &*speculative : nullptr);
    };
    const Clock::time_point prefilled = Clock::now();
    outcome.prefill_s = seconds_between(started, prefilled);
    record([&] { recorder_.prefilled(outcome.prefill_s); });
    auto first_token = [&] {
      const double ttft_s = seconds_between(job.received_at(), Clock::now());
      metrics_.observe_time_to_first_token(ttft_s);
      record([&] { recorder_.first_token(ttft_s); });
    };

    const std::optional<int32_t> eos = served_.tokenizer->eos_id();
    auto ends_generation = [&](int32_t token) {
      // Under a grammar the stops end the value (ignore_eos or not); a lazy one's free text
      // before its trigger keeps ignore_eos.
      return (!plan.ignore_eos || (delivered && delivered->triggered())) &&
             (token == eos || token == served_.end_of_turn);
    };
    int64_t generated = 0, reasoning_tokens = 0;
    auto on_token = [&](int32_t token, std::span<const float> logits) {
      ++generated;
      // Inside the think block when the token arrives (its text may still be held back by the
      // decoder or the filter): a reasoning token, the closing tag's included.
      if (think && think->in_thinking()) ++reasoning_tokens;
      if (generated == 1 && choice == 0) first_token();
      record([&] { recorder_.token(); });
      if (delivered) delivered->accept(token);
      deliver(stops.push(decoder.push(token)), logprob_entry(token, logits));
      if (generated == 1) save_prompt();  // nothing fed after the prompt yet
      return !stops.stopped() && !value_done();
    };
    // With parallel slots this generation's decode steps are rows of the batched windows from
    // its first decode on; it leaves the batch as soon as its last token is out.
    DecodeBatcher::Membership batched;
    auto decode = [&](Session& s, int32_t token) {
      if (!batcher_) return void(s.decode(token));
      batched.join(*batcher_);
      batcher_->decode(s, token);
    };
    auto on_window = [&](const spec::WindowReport& w) {
      if (speculative) recorder_.window(w);
    };
    auto cancelled = [&] { return job.cancel_requested(); };
    // FunctionRefs: every lambda above outlives `callbacks`.
    ChoiceCallbacks callbacks(ends_generation, on_token, cancelled, on_window, decode);
    const uint64_t proposed_before = spec_gate_ ? spec_gate_->drafts_proposed() : 0;
    const uint64_t accepted_before = spec_gate_ ? spec_gate_->drafts_accepted() : 0;
    const uint64_t verifies_before = spec_gate_ ? spec_gate_->verifies() : 0;
    const GenerationResult result = generate(
        session, sampler, session.logits(),
        {.max_tokens = plan.max_new_tokens, .speculative = speculative ? &*speculative : nullptr},
        callbacks);
    if (result.generated == 0 && result.end == GenerationEnd::StopToken && choice == 0)
      first_token();  // the first token drawn was the end
    switch (result.end) {
      case GenerationEnd::StopToken:
      case GenerationEnd::Halted:  // a stop string or a complete value
        outcome.finish = FinishReason::Stop;
        outcome.stop_sequence = stops.matched();
        break;
      case GenerationEnd::Cancelled:
        outcome.cancelled = true;
        break;
      case GenerationEnd::Length:
      case GenerationEnd::ContextFull:
        outcome.finish = FinishReason::Length;
        break;
    }
    if (speculative && log_spec_)
      fmt::print(stderr,
                 "strata serve: spec: {} tokens, {} verifies, drafts proposed {} accepted {}\n",
                 generated, spec_gate_->verifies() - verifies_before,
                 spec_gate_->drafts_proposed() - proposed_before,
                 spec_gate_->drafts_accepted() - accepted_before);
    batched.leave();
    if (prefill_complete && !prompt_saved)
      save_prompt();  // the generation fed nothing after the prompt
    else if (prefill_complete && session.tokens().size() > full_prompt.size())
      cache_.save_generated(session, speculative ? &*speculative : nullptr);
    if (!stops.stopped() && !outcome.cancelled) {
      deliver(stops.push(decoder.finish()));
      deliver(stops.finish());
    }
    if (think) {
      ThinkFilter::ReplyDelta rest = think->finish();
      emit_answer(std::move(rest.answer), std::move(rest.thinking), {});
    }
    if (tool_parser) {
      emit_pieces(tool_parser->finish());
      if (calls_emitted > 0 && outcome.finish == FinishReason::Stop)
        outcome.finish = FinishReason::ToolCalls;
    }
    const Clock::time_point ended = Clock::now();
    outcome.decode_s = seconds_between(prefilled, ended);
    outcome.usage.completion_tokens = generated;
    outcome.usage.reasoning_tokens = reasoning_tokens;
    report.finish_reason = outcome.cancelled ? "cancelled" : finish_reason_name(outcome.finish);
    report.completion_tokens = generated;
    report.prefill_s = outcome.prefill_s;
    report.decode_s = outcome.decode_s;
    report.total_s = seconds_between(job.received_at(), ended);
    metrics_.record_generation(report);
    record([&] { recorder_.end_generation(report.finish_reason, spec_gate_.get()); });
    return outcome;
  } catch (...) {
    report.finish_reason = "error";
    report.total_s = seconds_between(job.received_at(), Clock::now());
    metrics_.record_generation(report);
    record([&] { recorder_.end_generation(report.finish_reason, spec_gate_.get()); });
    throw;
  }
}

}  // namespace strata::serve
