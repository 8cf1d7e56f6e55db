#include "serve/decode_batcher.h"

#include <algorithm>
#include <optional>

#include "util/error.h"
#include "util/phase_timer.h"

namespace strata::serve {

DecodeBatcher::DecodeBatcher(FairMutex& engine, const BatchGroups& groups) : engine_(engine) {
  if (groups.groups < 1) fail("--batch-groups: expected at least 1 group, found {}", groups.groups);
  if (groups.groups == 1) return;
  if (!groups.model)
    fail("decode batcher: {} groups need the model whose mapping they read", groups.groups);
  const int threads_per_group = std::max(1, groups.threads / groups.groups);
  for (int g = 0; g < groups.groups; ++g) {
    auto group = std::make_unique<Group>();
    group->pool = std::make_unique<compute::ThreadPool>(threads_per_group);
    group->experts = groups.model->new_mapped_experts();
    groups_.push_back(std::move(group));
  }
  group_runner_ = std::make_unique<compute::ThreadPool>(groups.groups);
}

DecodeBatcher::~DecodeBatcher() = default;

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
  size_t group_windows = 0;  // windows of this step if it was cut into groups
  lock.unlock();
  try {
    step_spans_.clear();
    size_t at = 0;
    for (const size_t n : step_counts_) {
      step_spans_.push_back(std::span<const int32_t>(step_tokens_).subspan(at, n));
      at += n;
    }
    std::lock_guard engine(engine_);
    counter_.layers = counter_.experts = 0;
    for (const std::unique_ptr<Group>& group : groups_)
      group->counter.layers = group->counter.experts = 0;
    if (groups_.size() > 1 && step_sessions_.size() > 1) {
      group_windows = run_groups();
    } else {
      counter_.inner = &step_sessions_.front()->expert_source();
      Session::feed_together(step_sessions_, step_spans_, window_, &counter_);
    }
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
  for (const std::unique_ptr<Group>& group : groups_) {
    // A step cut in groups counts each group's layers: the experts a layer-step read are the
    // union within each group.
    stats_.layer_steps += group->counter.layers;
    stats_.expert_union += group->counter.experts;
  }
  stats_.group_windows += group_windows;
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

size_t DecodeBatcher::run_groups() {
  Session::check_together(step_sessions_, step_spans_);
  // Consecutive sequences, about total / n rows a group, at least one sequence each.
  const size_t n = std::min(groups_.size(), step_sessions_.size());
  size_t total = 0;
  for (const size_t count : step_counts_) total += count;
  size_t next = 0, rows_so_far = 0;
  for (size_t g = 0; g < n; ++g) {
    Group& group = *groups_[g];
    group.sessions.clear();
    group.spans.clear();
    const size_t rows_by_end = total * (g + 1) / n;
    const size_t sessions_left_after = n - g - 1;
    while (next < step_sessions_.size() - sessions_left_after &&
           (group.sessions.empty() || rows_so_far < rows_by_end)) {
      group.sessions.push_back(step_sessions_[next]);
      group.spans.push_back(step_spans_[next]);
      rows_so_far += step_counts_[next];
      ++next;
    }
  }
  group_runner_->parallel_for_each_task(
      int64_t(n), [&](int64_t begin, int64_t end, int thread_index) {
        // The step's own thread (index 0) records the forward's phases for the dashboard; the
        // others would add to the same times from a second thread.
        std::optional<PhaseTimingOff> timing_off;
        if (thread_index != 0) timing_off.emplace();
        for (int64_t g = begin; g < end; ++g) {
          Group& group = *groups_[size_t(g)];
          group.counter.inner = group.experts.get();
          group.counter.observer = &group.sessions.front()->expert_source();
          group.counter.observer_mutex = &observer_mutex_;
          Session::feed_together(group.sessions, group.spans, group.window, &group.counter,
                                 group.pool.get());
        }
      });
  return n;
}

BatchStats DecodeBatcher::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace strata::serve
