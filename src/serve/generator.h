// Generator — runs one Job on the engine: a fresh Session, prefill in chunks, then sample and
// decode token by token. Text leaves through a StreamingDecoder (whole UTF-8 characters only),
// a StopMatcher (stop strings cut the text and end the generation) and, for chat, a ThinkFilter
// that routes a leading <think> block to reasoning_content. Control tokens print nothing.
//
// Ends: the end-of-sequence or end-of-turn token ("stop", unless ignore_eos), a stop string
// ("stop"), max_tokens or a full context ("length"), or Job::cancel_requested (checked before each
// prefill chunk and each token), which ends the job promptly with outcome.cancelled.
// Reports each generation to ServeMetrics (tokens, times, time to first token).
//
// Runs on the scheduler's worker thread only (it drives the shared compute::ThreadPool).
#pragma once

#include "compute/cpu/thread_pool.h"
#include "serve/metrics.h"
#include "serve/plan.h"
#include "serve/scheduler.h"

namespace strata::serve {

class Generator {
 public:
  Generator(const ServedModel& served, compute::ThreadPool& pool, ServeMetrics& metrics);
  void run(Job& job);

 private:
  const ServedModel& served_;
  compute::ThreadPool& pool_;
  ServeMetrics& metrics_;
};

}  // namespace strata::serve
