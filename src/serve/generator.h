// Generator — runs one Job on the engine: a fresh Session, prefill in chunks, then the generation
// loop (decode/generate.h: plain or speculative, the same stop rules and cancellation either way).
// Text leaves through a StreamingDecoder (whole UTF-8 characters only), a StopMatcher (stop strings
// cut the text and end the generation) and, for chat, a ThinkFilter that routes a leading <think>
// block to reasoning_content. Control tokens print nothing.
//
// Ends: the end-of-sequence or end-of-turn token ("stop", unless ignore_eos), a stop string
// ("stop"), max_tokens or a full context ("length"), or Job::cancel_requested (checked before each
// prefill chunk and each token, and between the tokens of a verify window), which ends the job
// promptly with outcome.cancelled.
// Reports each generation to ServeMetrics (tokens, times, time to first token).
//
// Speculative decoding (ServerOptions::spec, `strata serve --spec`): each request gets a
// SpecDecoder over its session, and the text, stops, limits and cancellation work as on the plain
// path, token for token the same output (greedy, or sampled with the same seed). One SpecGate
// lives as long as the Generator, so its timings, calibration and forced plain steps (T(1)
// refresh) carry across requests; with `log_spec`, one stderr line per request gives its windows
// and drafts, and `spec_summary` the gate's line (`strata serve` prints it at exit).
//
// Choices (GenerationPlan::n_choices): choice i samples with seed + i; the deltas carry the
// choice's index and the outcome every choice's finish reason and the summed token counts. With
// one slot they are generated one after the other, each from a fresh session (the state cache
// gives the later ones the prompt). With parallel slots they are generated together on the
// scheduler's slots: choice 0 prefills on the job's worker, then each other choice starts from a
// copy of that prompt state (Session::snapshot / restore: the same bits as prefilling it) on a
// worker that is free (`lend`: Scheduler::lend, taken before queued requests), and all decode
// as rows of the same batched steps; the choices no free worker took run on the job's worker
// after choice 0. No thread beyond the N slots: a step carries at most N rows, choices
// included, and an n = 3 request on 2 free slots decodes two choices together, then the third.
// Bitwise what each choice gives alone. Each choice is one generation in
// ServeMetrics and the dashboard; the time to first token is choice 0's.
//
// Log-probabilities (GenerationPlan::logprobs): every generated token's entry travels with the
// delta its text came out in (an entry may come with no text, while a stop string or a partial
// character holds it back): Sampler::logprobs of the logits it was sampled from, i.e. after
// logit_bias, the penalties and temperature, before top-k/top-p/min-p. Such requests decode
// plainly even with --spec (same tokens; the verify windows do not expose each row's logits).
//
// Conversation state cache (decode/state_cache.h, `--cache-ram`): the session resumes from the
// longest cached snapshot that prefixes the prompt and prefills only the rest; the number of
// reused tokens is reported as usage.cached_tokens. Snapshots are saved after the prompt's
// prefill (once the first token is out, before anything is fed after the prompt, so it costs
// the first token nothing) and when the generation ends.
//
// Prefill windows: up to 512 rows on the CPU with one slot (engine/prefill_window.h), 64 with
// parallel slots (a joining slot's prompt window rides in the batched decode step) and on CUDA;
// the cache cuts them at multiples of 64, which gives the bits of 64-row windows.
//
// Structured output (GenerationPlan::grammar): the sampler draws under a GrammarConstraint
// (grammar/token_mask.h) built over the vocabulary's byte strings (once per Generator, on the
// first such request); the end-of-sequence / end-of-turn tokens are only allowed once the value
// is complete (whatever ignore_eos says), and the generation ends with "stop" as soon as nothing
// else can follow. With speculative decoding the same sampler judges every verify row in order
// (spec/spec_decoder.h), so a draft the grammar forbids never stands and the tokens are those of
// plain constrained decoding. The masks a request's walks compute are kept for the later requests
// with the same grammar object (the grammar cache hands the same one out for the same schema:
// serve/grammar_cache.h): grammar::SharedMasks, for the 8 grammars used last, at most 256 masks
// each (n_vocab / 8 bytes a mask: 39 MiB at most on a 151,936-token vocabulary, 1.5 MiB on the
// default model's 6,144), so a schema sent again skips the walks of the states seen before.
//
// Dashboard: every window fetches its experts through a DashboardRecorder, which publishes
// snapshots of the engine (heat, residency, counters, this generation's progress) to the hub
// (serve/dashboard.h); with `profile` the forward's phases are timed for it.
//
// Parallel slots (`parallel` > 1, `strata serve --parallel N`): `run` is called on N scheduler
// workers at once, one generation each, exactly the code above; their decode steps meet in a
// DecodeBatcher (serve/decode_batcher.h), one batched window per step for every slot in the decode
// phase, bitwise the tokens each gets alone. Every window (prefill windows and batched steps) and
// every dashboard call runs under one FairMutex (the engine lock), because they share the thread
// pool, the expert source and the recorder; sampling, stop strings, text and the state cache's
// copies run on the slot's own thread outside it. Refused at construction: speculative decoding
// (its verify windows and the shared SpecGate are per sequence) and a backend other than cpu.
// The dashboard's `generation` card then shows the latest generation that started.
//
// Runs on the scheduler's worker threads only (they drive the shared compute::ThreadPool), a
// job's choices on the workers that took its lent tasks;
// the constructor runs before those threads start; `spec_summary` may be called once they have
// stopped.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "compute/cpu/thread_pool.h"
#include "decode/state_cache.h"
#include "grammar/token_mask.h"
#include "serve/dashboard.h"
#include "serve/dashboard_recorder.h"
#include "serve/decode_batcher.h"
#include "serve/metrics.h"
#include "serve/plan.h"
#include "serve/scheduler.h"
#include "spec/spec_decoder.h"

namespace strata::serve {

class PromptShare;

class Generator {
 public:
  Generator(const ServedModel& served, compute::ThreadPool& pool, ServeMetrics& metrics,
            DashboardHub& dashboard, const spec::SpecOptions& spec = {}, bool log_spec = false,
            bool profile = true, uint64_t cache_ram_bytes = StateCache::kDefaultMaxBytes,
            int parallel = 1, int batch_groups = 1);
  // `lend`: hands a task to a free scheduler worker (Scheduler::lend); empty: the job's worker
  // runs every choice itself. A lent task returns whether it ran a choice.
  void run(Job& job, const std::function<void(Scheduler::LentTask)>& lend = {});
  // "spec: T(1) ..." over every request so far, or "" without speculative decoding.
  std::string spec_summary() const;
  const StateCache& state_cache() const { return cache_; }
  int parallel() const { return parallel_; }
  // The batched decode steps so far (all zero with parallel 1). Any thread.
  BatchStats batch_stats() const { return batcher_ ? batcher_->stats() : BatchStats{}; }
  // The token masks kept across requests (grammar::SharedMasks, class comment).
  struct SharedMaskStats {
    size_t grammars = 0;  // grammars with masks kept
    size_t masks = 0;     // masks kept over all of them
    uint64_t hits = 0;    // masks a constraint took instead of walking the vocabulary
  };
  SharedMaskStats shared_mask_stats() const;  // any thread

 private:
  // One choice of the job: emits its deltas and returns its outcome (finish, tokens, times).
  // `prompt_state`: start from this copy of the prompt's state instead of prefilling; `share`:
  // publish the prompt's state there once prefilled (choices run together, below).
  GenerationOutcome run_choice(Job& job, int choice, const SessionSnapshot* prompt_state,
                               PromptShare* share);
  struct ChoiceGroup;
  // Runs a claimed choice (> 0) of `group` from choice 0's prompt state, keeping its outcome or
  // error there.
  void run_claimed(ChoiceGroup& group, size_t choice);
  // Runs f under the engine lock when slots run in parallel (the recorder is the engine's).
  template <class F>
  void record(F&& f) {
    if (!batcher_) return f();
    std::lock_guard lock(engine_lock_);
    f();
  }
  const grammar::TokenVocabulary& vocabulary();
  // The masks kept for `grammar` (see the class comment). Any thread.
  std::shared_ptr<grammar::SharedMasks> shared_masks(
      const std::shared_ptr<const grammar::Grammar>& grammar);

  const ServedModel& served_;
  compute::ThreadPool& pool_;
  ServeMetrics& metrics_;
  const spec::SpecOptions spec_;
  const bool log_spec_;
  std::unique_ptr<spec::SpecGate> spec_gate_;  // null with --spec off
  DashboardRecorder recorder_;
  StateCache cache_;
  std::mutex vocabulary_mutex_;  // guards vocabulary_ (built once, then read only)
  std::unique_ptr<grammar::TokenVocabulary> vocabulary_;  // built by the first constrained job
  struct GrammarMasks {
    std::shared_ptr<const grammar::Grammar> grammar;  // keeps the key's address its own
    std::shared_ptr<grammar::SharedMasks> masks;
  };
  mutable std::mutex masks_mutex_;        // guards shared_masks_
  std::list<GrammarMasks> shared_masks_;  // most recently used first
  const int parallel_;
  FairMutex engine_lock_;                   // with parallel > 1: every window and recorder call
  std::unique_ptr<DecodeBatcher> batcher_;  // null with parallel 1
};

}  // namespace strata::serve
