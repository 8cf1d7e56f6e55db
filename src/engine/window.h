// WindowRunner — one window of tokens through a model, and everything around it on the host.
//
// A Model describes an architecture: hyper-parameters, weights, the layer sequence
// (Model::run_layers). The runner runs it. For each window it
//   1. checks the tokens against the vocabulary (Model::check_tokens);
//   2. keeps the speculative window log when the state records windows (what `rollback` needs);
//   3. begins the window on the state's backend and describes its shape (rows, n_past, which
//      logit rows), so a backend that replays captured windows knows which one this is;
//   4. sizes the window's tensors (the largest window so far; reused after that);
//   5. starts the inputs that depend on the tokens only (Model::start_window_inputs: the PLE
//      rows' reads), before any layer runs, so they overlap the layers before the PLE layer;
//   6. launches the layers, advances n_past by the window's rows;
//   7. runs the head over the rows asked for and reads back their logits: the only data that
//      comes back to the host (and, for the MTP head, the state's residual rows).
// Context-length checks are the Session's (engine/session.h): it knows the whole sequence.
//
// Contract
// - `run` advances `state` by tokens.size() positions and writes the logits of the rows asked
//   for ([rows][n_vocab]). A row's logits are bitwise identical whether it runs alone or inside
//   a window of T rows (window identity), so speculative verify is exact.
// - `run_batch`: one window carrying the rows of several sequences (`strata serve --parallel`):
//   sequence s feeds tokens[s] to *states[s] and receives the logits of its last row in
//   *logits[s] ([n_vocab]). Row-wise work runs once over all rows (the dense weights and the
//   union of the sequences' experts are read once); the token mixers run per sequence on its
//   own state. Each sequence's logits and state are bitwise what `run` alone gives.
//   REQUIRES: distinct states, each with tokens, none recording windows, all on the CPU backend.
// - `rollback(state, keep_rows)`: the state becomes what it would be had only the first keep_rows
//   rows of the last window been fed (bitwise). The window must have run with
//   state.record_windows set; the log is consumed.
// - Routed experts come from the ExpertSource passed in (null: the model's file mapping).
// - Threads: the caller's; the pool is used inside the calls only. One window at a time per state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "compute/cpu/thread_pool.h"
#include "experts/expert_source.h"
#include "model/model.h"

namespace strata {

class WindowRunner {
 public:
  explicit WindowRunner(const Model& model) : model_(model) {}

  void run(compute::ThreadPool& pool, ModelState& state, std::span<const int32_t> tokens,
           LogitRows rows, std::vector<float>& logits, ExpertSource* experts = nullptr) const;

  void run_batch(compute::ThreadPool& pool, BatchWindow& batch, std::span<ModelState* const> states,
                 std::span<const std::span<const int32_t>> tokens,
                 std::span<std::vector<float>* const> logits,
                 ExpertSource* experts = nullptr) const;

  void rollback(compute::ThreadPool& pool, ModelState& state, int64_t keep_rows) const;

  const Model& model() const { return model_; }

 private:
  const Model& model_;
};

}  // namespace strata
