#include "engine/session.h"

#include <algorithm>
#include <cstdint>

#include "compute/backend_registry.h"
#include "util/error.h"

namespace strata {

namespace {

int64_t tokens_to_reserve(const HParams& hp) {
  return hp.n_ctx_train > 0 ? std::min(hp.n_ctx_train, Session::kMaxReservedTokens)
                            : Session::kMaxReservedTokens;
}

}  // namespace

Session::Session(const Model& model, compute::ThreadPool& pool, ExpertSource* experts,
                 std::string backend)
    : model_(model),
      pool_(pool),
      experts_(experts),
      backend_(std::move(backend)),
      reserved_tokens_(tokens_to_reserve(model.hparams())),
      state_(model.new_state(reserved_tokens_, compute::make_backend(backend_, model.backend_shared()))) {
  tokens_.reserve(size_t(reserved_tokens_));
}

void Session::check_context(size_t more) const {
  const int64_t limit = model_.hparams().n_ctx_train;
  if (limit > 0 && state_.n_past + int64_t(more) > limit)
    fail("context full: {} tokens so far + {} new exceed the model's context length {}",
         state_.n_past, more, limit);
}

int64_t Session::context_left() const {
  const int64_t limit = model_.hparams().n_ctx_train;
  return limit > 0 ? std::max<int64_t>(limit - state_.n_past, 0) : INT64_MAX;
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
    model_.forward(pool_, state_, tokens.subspan(begin, n), last ? LogitRows::Last : LogitRows::None,
                   logits_, experts_);
    tokens_.insert(tokens_.end(), tokens.begin() + ptrdiff_t(begin),
                   tokens.begin() + ptrdiff_t(begin + n));
    if (progress) progress(int64_t(begin + n), int64_t(total));
  }
  return logits_;
}

const std::vector<float>& Session::decode(int32_t token) {
  check_context(1);
  const int32_t one[1] = {token};
  model_.forward(pool_, state_, one, LogitRows::Last, logits_, experts_);
  tokens_.push_back(token);
  return logits_;
}

const std::vector<float>& Session::forward_all(std::span<const int32_t> tokens) {
  check_context(tokens.size());
  model_.forward(pool_, state_, tokens, LogitRows::All, logits_, experts_);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return logits_;
}

const std::vector<float>& Session::verify(std::span<const int32_t> tokens) {
  check_context(tokens.size());
  state_.record_windows = true;
  try {
    model_.forward(pool_, state_, tokens, LogitRows::All, logits_, experts_);
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
  model_.rollback(pool_, state_, n_rows);
  tokens_.resize(tokens_.size() - size_t(window - n_rows));
  const size_t vocab = size_t(model_.hparams().n_vocab);
  logits_.erase(logits_.begin(), logits_.begin() + ptrdiff_t(size_t(n_rows - 1) * vocab));
  logits_.resize(vocab);
}

void Session::reset() {
  state_ = ModelState{};  // the old backend's device memory goes first
  state_ = model_.new_state(reserved_tokens_, compute::make_backend(backend_, model_.backend_shared()));
  tokens_.clear();
  logits_.clear();
}

}  // namespace strata
