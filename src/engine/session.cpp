#include "engine/session.h"

#include <algorithm>
#include <cstdint>

#include "backends/backend_registry.h"
#include "engine/window.h"
#include "util/error.h"

namespace strata {

namespace {}  // namespace

int64_t session_context_length(const HParams& hp, int64_t requested) {
  if (requested < 0) fail("context length (--ctx) must be >= 1, got {}", requested);
  if (requested > 0 && hp.n_ctx_train > 0 && requested > hp.n_ctx_train)
    fail("context length (--ctx) {} is more than the model's context length {}", requested,
         hp.n_ctx_train);
  return requested > 0 ? requested : hp.n_ctx_train;
}

namespace {

int64_t tokens_to_reserve(int64_t context_length, int64_t requested) {
  if (requested > 0) return requested;  // exactly what was asked for: nothing grows later
  return context_length > 0 ? std::min(context_length, Session::kMaxReservedTokens)
                            : Session::kMaxReservedTokens;
}

}  // namespace

Session::Session(const Model& model, compute::ThreadPool& pool, ExpertSource* experts,
                 std::string backend, int64_t n_ctx)
    : model_(model),
      pool_(pool),
      experts_(experts),
      backend_(std::move(backend)),
      context_length_(session_context_length(model.hparams(), n_ctx)),
      reserved_tokens_(tokens_to_reserve(context_length_, n_ctx)),
      state_(model.new_state(reserved_tokens_,
                             compute::make_backend(backend_, model.backend_shared()))) {
  tokens_.reserve(size_t(reserved_tokens_));
}

void Session::check_context(size_t more) const {
  const int64_t limit = context_length_;
  if (limit > 0 && state_.n_past + int64_t(more) > limit)
    fail("context full: {} tokens so far + {} new exceed the context length {}", state_.n_past,
         more, limit);
}

int64_t Session::context_left() const {
  const int64_t limit = context_length_;
  return limit > 0 ? std::max<int64_t>(limit - state_.n_past, 0) : INT64_MAX;
}

void Session::run_window(std::span<const int32_t> tokens, LogitRows rows) {
  if (!window_lock_) return WindowRunner(model_).run(pool_, state_, tokens, rows, logits_, experts_);
  std::lock_guard lock(*window_lock_);
  WindowRunner(model_).run(pool_, state_, tokens, rows, logits_, experts_);
}

const std::vector<float>& Session::prefill(std::span<const int32_t> tokens, int chunk_rows,
                                           const ProgressFn& progress) {
  if (tokens.empty()) fail("prefill: no tokens");
  if (chunk_rows < 1) fail("prefill: chunk size must be >= 1, got {}", chunk_rows);
  check_context(tokens.size());
  const size_t total = tokens.size();
  for (size_t begin = 0; begin < total; begin += size_t(chunk_rows)) {
    const size_t n = std::min(total - begin, size_t(chunk_rows));
    const bool last = begin + n == total;
    if (prefill_runner_) {
      // The runner feeds the window (tokens_ included); the last row's logits come back for
      // every window, not only the last (they are overwritten by the next one).
      const size_t before = tokens_.size();
      prefill_runner_(*this, tokens.subspan(begin, n));
      if (tokens_.size() != before + n)
        fail("prefill: the window runner fed {} of the window's {} tokens", tokens_.size() - before,
             n);
    } else {
      run_window(tokens.subspan(begin, n), last ? LogitRows::Last : LogitRows::None);
      tokens_.insert(tokens_.end(), tokens.begin() + ptrdiff_t(begin),
                     tokens.begin() + ptrdiff_t(begin + n));
    }
    if (progress) progress(int64_t(begin + n), int64_t(total));
  }
  return logits_;
}

const std::vector<float>& Session::decode(int32_t token) {
  check_context(1);
  const int32_t one[1] = {token};
  run_window(one, LogitRows::Last);
  tokens_.push_back(token);
  return logits_;
}

void Session::decode_together(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                              BatchWindow& batch, ExpertSource* experts) {
  if (sessions.empty()) return;
  if (tokens.size() != sessions.size())
    fail("decode_together: {} sessions and {} tokens", sessions.size(), tokens.size());
  std::vector<std::span<const int32_t>> rows;
  for (size_t i = 0; i < sessions.size(); ++i) rows.push_back(tokens.subspan(i, 1));
  feed_together(sessions, rows, batch, experts);
}

void Session::check_together(std::span<Session* const> sessions,
                             std::span<const std::span<const int32_t>> tokens) {
  if (tokens.size() != sessions.size())
    fail("feed_together: {} sessions and {} token lists", sessions.size(), tokens.size());
  if (sessions.empty()) return;
  const Session& first = *sessions[0];
  for (size_t i = 0; i < sessions.size(); ++i) {
    const Session& s = *sessions[i];
    if (&s.model_ != &first.model_ || &s.pool_ != &first.pool_ || s.experts_ != first.experts_)
      fail("feed_together: session {} has another model, thread pool or expert source", i);
    s.check_context(tokens[i].size());
  }
}

void Session::feed_together(std::span<Session* const> sessions,
                            std::span<const std::span<const int32_t>> tokens, BatchWindow& batch,
                            ExpertSource* experts, compute::ThreadPool* pool) {
  check_together(sessions, tokens);
  if (sessions.empty()) return;
  Session& first = *sessions[0];
  std::vector<ModelState*> states;
  std::vector<std::vector<float>*> logits;
  for (Session* s : sessions) {
    states.push_back(&s->state_);
    logits.push_back(&s->logits_);
  }
  WindowRunner(first.model_)
      .run_batch(pool ? *pool : first.pool_, batch, states, tokens, logits,
                 experts ? experts : first.experts_);
  for (size_t i = 0; i < sessions.size(); ++i)
    sessions[i]->tokens_.insert(sessions[i]->tokens_.end(), tokens[i].begin(), tokens[i].end());
}

const std::vector<float>& Session::forward_all(std::span<const int32_t> tokens) {
  check_context(tokens.size());
  run_window(tokens, LogitRows::All);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return logits_;
}

const std::vector<float>& Session::verify(std::span<const int32_t> tokens) {
  check_context(tokens.size());
  state_.record_windows = true;
  try {
    run_window(tokens, LogitRows::All);
  } catch (...) {
    state_.record_windows = false;
    throw;
  }
  state_.record_windows = false;
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return logits_;
}

void Session::keep_rows(int64_t n_rows) {
  const int64_t window = int64_t(state_.window_log.tokens.size());
  if (n_rows < 1 || n_rows > window)
    fail("keep_rows: cannot keep {} rows of a {}-row verify window", n_rows, window);
  WindowRunner(model_).rollback(pool_, state_, n_rows);
  tokens_.resize(tokens_.size() - size_t(window - n_rows));
  const size_t vocab = size_t(model_.hparams().n_vocab);
  logits_.erase(logits_.begin(), logits_.begin() + ptrdiff_t(size_t(n_rows - 1) * vocab));
  logits_.resize(vocab);
}

uint64_t SessionSnapshot::bytes() const {
  return sizeof(SessionSnapshot) + sequence_state_bytes(state) +
         uint64_t(tokens.capacity()) * sizeof(int32_t) + uint64_t(logits.capacity()) * sizeof(float);
}

SessionSnapshot Session::snapshot() const {
  if (backend_ != "cpu")
    fail("conversation state cache: the {} backend keeps its states in its own memory, which "
         "cannot be snapshotted yet; use --backend cpu or --cache-ram 0",
         backend_);
  SessionSnapshot out;
  copy_sequence_state(state_, out.state);
  out.tokens = tokens_;
  out.logits = logits_;
  return out;
}

void Session::restore(const SessionSnapshot& snapshot) {
  if (snapshot.state.kv.size() != state_.kv.size() ||
      snapshot.state.deltanet.size() != state_.deltanet.size())
    fail("session restore: the snapshot has {} layers, the model {}", snapshot.state.kv.size(),
         state_.kv.size());
  if (context_length_ > 0 && snapshot.state.n_past > context_length_)
    fail("session restore: the snapshot holds {} tokens, more than the context length {}",
         snapshot.state.n_past, context_length_);
  copy_sequence_state(snapshot.state, state_);
  tokens_ = snapshot.tokens;
  logits_ = snapshot.logits;
}

bool Session::can_truncate() const {
  const HParams& hp = model_.hparams();
  return !hp.has_ple() && !hp.has_deltanet() && backend_ == "cpu";
}

void Session::truncate(int64_t n_tokens) {
  if (!can_truncate()) fail("session truncate: this model's state cannot be rewound");
  if (n_tokens < 0 || n_tokens > state_.n_past)
    fail("session truncate: cannot keep {} of {} tokens", n_tokens, state_.n_past);
  const HParams& hp = model_.hparams();
  for (int l = 0; l < hp.n_layer; ++l)
    state_.kv[size_t(l)].truncate(n_tokens, hp.kv_dim(), hp.indexer_head_dim,
                                  model_.layers()[size_t(l)].attention.compress_ratio);
  state_.n_past = n_tokens;
  state_.residuals.clear();
  state_.window_log.valid = false;
  tokens_.resize(size_t(n_tokens));
  logits_.clear();
}

void Session::reset() {
  state_ = ModelState{};  // the old backend's device memory goes first
  state_ = model_.new_state(reserved_tokens_, compute::make_backend(backend_, model_.backend_shared()));
  tokens_.clear();
  logits_.clear();
}

}  // namespace strata
