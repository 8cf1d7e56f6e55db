// Session — one sequence being generated: the model state (KV caches, DeltaNet/conv states, PLE
// history), the tokens so far, and the prefill/decode entry points.
//
// Contract
// - `prefill` feeds tokens in windows of at most `chunk_rows` rows and returns the logits of
//   the last token. Windows under 32 rows give bitwise the same results whatever their size;
//   longer ones run Gated DeltaNet in its chunked form, equal up to fp32 rounding (~1e-6). On
//   the CPU a window gives bitwise the results of 64-row windows cut from its start (the
//   chunked form per 64-row chunk: layers/gated_deltanet.h), so every chunk_rows that is a
//   multiple of 64 gives the bits of 64 (prefill_window.h).
// - `decode(token)` feeds one token and returns its logits.
// - `reset` returns to an empty sequence without reallocating the model.
// - Context length: `n_ctx` tokens when given (> 0; at most the model's context length), else
//   the model's (`context_length()`, 0 = the file names none: unlimited). Feeding past it throws
//   "context full" before any state changes.
// - Allocation: the KV caches and the token list are reserved at construction for
//   `reserved_tokens()`, and the window scratch lives in the state, so a steady decode step
//   allocates nothing (tests/engine/zero_alloc_test.cpp). With `n_ctx` given that is the whole
//   context: nothing grows, ever (strata run/chat/serve --ctx). Without it, the model's context
//   length, at most kMaxReservedTokens (reserving is virtual memory only, but a 262k-token
//   reservation of a large model's KV is more than some machines allow); past that the caches
//   grow.
// - `backend` names the compute backend of the sequence (backends/backend_registry.h: "cpu",
//   "cuda"; already resolved, not "auto"); reset() makes a fresh one of the same kind.
// - `snapshot` / `restore`: a deep copy of the sequence (model/model.h: copy_sequence_state, plus
//   the tokens and the last row's logits) and back; after restore the session continues exactly
//   as the one snapshotted would (same bits). CPU backend only (the states must be host structs).
//   `truncate` drops tokens from the end where that is exact (pure attention: KV caches only).
// - Not thread-safe; the thread pool is shared with the caller and used inside calls only.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "compute/cpu/thread_pool.h"
#include "model/model.h"
#include "util/fair_mutex.h"

namespace strata {

// A deep copy of a Session's sequence (Session::snapshot). `state` has no backend and no scratch:
// it is data only, never run.
struct SessionSnapshot {
  ModelState state;
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // the last fed row's logits (empty before the first window)
  uint64_t bytes() const;
};

// The context length of a Session asked for `requested` tokens (0 = the model's): `requested`,
// else hp.n_ctx_train (0 = unlimited). Throws when `requested` is negative or above the model's.
int64_t session_context_length(const HParams& hp, int64_t requested);

class Session {
 public:
  // Throws when `n_ctx` is negative or above the model's context length.
  Session(const Model& model, compute::ThreadPool& pool, ExpertSource* experts = nullptr,
          std::string backend = "cpu", int64_t n_ctx = 0);

  static constexpr int64_t kMaxReservedTokens = 32768;
  int64_t reserved_tokens() const { return reserved_tokens_; }
  int64_t context_length() const { return context_length_; }  // 0 = unlimited

  using ProgressFn = std::function<void(int64_t done, int64_t total)>;
  const std::vector<float>& prefill(std::span<const int32_t> tokens, int chunk_rows = 64,
                                    const ProgressFn& progress = nullptr);
  const std::vector<float>& decode(int32_t token);
  // One decode step of several sessions in one window (WindowRunner::run_batch, continuous
  // batching): sessions[i] is fed tokens[i], and each one's state and logits() are bitwise what
  // sessions[i]->decode(tokens[i]) alone would give. The dense weights and the union of the
  // sessions' experts are read once for the step. REQUIRES: distinct sessions of one model, one
  // thread pool and one expert source, on the cpu backend; `batch` is the caller's (reused).
  // Throws (before any state changed) when a session's context is full.
  // `experts` (optional) replaces the sessions' expert source for this step (e.g. a counting
  // wrapper around it).
  static void decode_together(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                              BatchWindow& batch, ExpertSource* experts = nullptr);
  // decode_together with any number of tokens per session (a prefill window rides in the same
  // window as other sessions' decode rows): sessions[i] is fed tokens[i] (non-empty), and its
  // state, tokens() and logits() (its last row's) are bitwise what feeding them alone in one
  // window gives (prefill's windows, decode). Same requirements as decode_together.
  // `pool` (optional) runs the window instead of the sessions' shared pool: a caller that runs
  // several groups of sessions side by side gives each group a pool of its own (the results do
  // not depend on the pool: bitwise the same at every thread count).
  static void feed_together(std::span<Session* const> sessions,
                            std::span<const std::span<const int32_t>> tokens, BatchWindow& batch,
                            ExpertSource* experts = nullptr, compute::ThreadPool* pool = nullptr);
  // The checks feed_together makes before it changes anything (same model, pool and expert
  // source; room in each context): a caller that splits one step into several feed_together
  // calls runs them first, so that a full context fails the whole step before any group ran.
  static void check_together(std::span<Session* const> sessions,
                             std::span<const std::span<const int32_t>> tokens);
  // prefill hands each of its windows to `runner` instead of running it alone (strata serve
  // --parallel: the DecodeBatcher puts it into the coming batched step). The runner must feed
  // exactly that window to this session (feed_together), tokens() included. Empty: alone.
  using PrefillRunner = std::function<void(Session& session, std::span<const int32_t> window)>;
  void set_prefill_runner(PrefillRunner runner) { prefill_runner_ = std::move(runner); }
  // The expert source the windows fetch through (the model's mapping when null).
  ExpertSource& expert_source() const { return experts_ ? *experts_ : model_.mapped_experts(); }
  // Runs a window and returns the logits of every row ([n][n_vocab]).
  const std::vector<float>& forward_all(std::span<const int32_t> tokens);
  // Speculative verify: like forward_all (logits of every row), and remembers what `keep_rows`
  // needs to drop the window's last rows. Windows must have fewer than 32 rows.
  const std::vector<float>& verify(std::span<const int32_t> tokens);
  // Keeps the first n_rows (>= 1) rows of the last verify window: state, tokens and n_past are as
  // if only they had been fed, and logits() becomes the last kept row's logits.
  void keep_rows(int64_t n_rows);

  void reset();

  // Every window this session runs (prefill, decode, forward_all, verify) holds `lock` while it
  // runs; null (the default): none. `strata serve --parallel` shares one lock among its slots,
  // whose windows use the same thread pool and expert source (decode_together's caller holds
  // it itself).
  void set_window_lock(FairMutex* lock) { window_lock_ = lock; }

  // Throws when the backend keeps its states in its own memory (not "cpu").
  SessionSnapshot snapshot() const;
  // Makes this session the snapshotted one (its buffers are reused). Same model required.
  void restore(const SessionSnapshot& snapshot);
  // Whether truncate is exact here: no Gated DeltaNet layer and no PLE (a recurrent
  // state cannot be rewound; KV caches can).
  bool can_truncate() const;
  // Keeps the first n_tokens (<= n_past). logits() is empty afterwards: feed at least one token
  // before sampling. Requires can_truncate().
  void truncate(int64_t n_tokens);

  int64_t n_past() const { return state_.n_past; }
  // Tokens that still fit in the context (INT64_MAX when it is unlimited).
  int64_t context_left() const;
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<float>& logits() const { return logits_; }
  const Model& model() const { return model_; }
  const std::string& backend() const { return backend_; }
  ModelState& state() { return state_; }
  const ModelState& state() const { return state_; }

 private:
  void check_context(size_t more) const;
  // WindowRunner::run under window_lock_ (when set).
  void run_window(std::span<const int32_t> tokens, LogitRows rows);
  const Model& model_;
  compute::ThreadPool& pool_;
  ExpertSource* experts_;
  std::string backend_;
  int64_t context_length_;
  int64_t reserved_tokens_;
  ModelState state_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
  FairMutex* window_lock_ = nullptr;
  PrefillRunner prefill_runner_;
};

}  // namespace strata
