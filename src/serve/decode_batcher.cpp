#include "serve/decode_batcher.h"

#include <algorithm>

#include "util/error.h"

namespace strata::serve {

void DecodeBatcher::join() {
  std::lock_guard lock(mutex_);
  ++members_;
}

void DecodeBatcher::leave() {
  {
    std::lock_guard lock(mutex_);
    if (members_ == 0) fail("decode batcher: leave without join");
    --members_;
  }
  // The others may all be waiting for this slot's row: one of them runs the step now.
  changed_.notify_all();
}

void DecodeBatcher::decode(Session& session, int32_t token) {
  const int32_t one[1] = {token};
  feed(session, one, true);
}

void DecodeBatcher::prefill(Session& session, std::span<const int32_t> window) {
  if (window.empty()) fail("decode batcher: empty prefill window");
  feed(session, window, false);
}

void DecodeBatcher::feed(Session& session, std::span<const int32_t> tokens, bool member) {
  std::unique_lock lock(mutex_);
  // Rows added while a step runs belong to the one after it.
  const uint64_t step = running_ ? completed_ + 1 : completed_;
  sessions_.push_back(&session);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  counts_.push_back(tokens.size());
  decoding_.push_back(member);
  member_rows_ += member ? 1 : 0;
  while (completed_ <= step) {
    if (step_ready())
      run_step(lock);
    else
      changed_.wait(lock);
  }
  if (failed_step_ == step) std::rethrow_exception(failure_);
}

void DecodeBatcher::run_step(std::unique_lock<std::mutex>& lock) {
  running_ = true;
  step_sessions_.swap(sessions_);
  step_tokens_.swap(tokens_);
  step_counts_.swap(counts_);
  step_decoding_.swap(decoding_);
  sessions_.clear();
  tokens_.clear();
  counts_.clear();
  decoding_.clear();
  member_rows_ = 0;
  const uint64_t step = completed_;
  std::exception_ptr error;
  lock.unlock();
  try {
    step_spans_.clear();
    size_t at = 0;
    for (const size_t n : step_counts_) {
      step_spans_.push_back(std::span<const int32_t>(step_tokens_).subspan(at, n));
      at += n;
    }
    std::lock_guard engine(engine_);
    counter_.inner = &step_sessions_.front()->expert_source();
    counter_.layers = counter_.experts = 0;
    Session::feed_together(step_sessions_, step_spans_, window_, &counter_);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  if (error) {
    failed_step_ = step;
    failure_ = error;
  }
  ++stats_.steps;
  stats_.layer_steps += counter_.layers;
  stats_.expert_union += counter_.experts;
  uint64_t decode_rows = 0;
  for (size_t i = 0; i < step_sessions_.size(); ++i) {
    if (step_decoding_[i]) {
      ++decode_rows;
    } else {
      ++stats_.prefill_windows;
      stats_.prefill_rows += step_counts_[i];
    }
  }
  stats_.rows += decode_rows;
  stats_.max_rows = std::max<uint64_t>(stats_.max_rows, decode_rows);
  ++completed_;
  running_ = false;
  changed_.notify_all();
}

BatchStats DecodeBatcher::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace strata::serve
