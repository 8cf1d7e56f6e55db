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
  std::unique_lock lock(mutex_);
  // Rows added while a step runs belong to the one after it.
  const uint64_t step = running_ ? completed_ + 1 : completed_;
  sessions_.push_back(&session);
  tokens_.push_back(token);
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
  sessions_.clear();
  tokens_.clear();
  const uint64_t step = completed_;
  std::exception_ptr error;
  lock.unlock();
  try {
    std::lock_guard engine(engine_);
    counter_.inner = &step_sessions_.front()->expert_source();
    counter_.layers = counter_.experts = 0;
    Session::decode_together(step_sessions_, step_tokens_, window_, &counter_);
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
  stats_.rows += step_sessions_.size();
  stats_.max_rows = std::max<uint64_t>(stats_.max_rows, step_sessions_.size());
  ++completed_;
  running_ = false;
  changed_.notify_all();
}

BatchStats DecodeBatcher::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace strata::serve
