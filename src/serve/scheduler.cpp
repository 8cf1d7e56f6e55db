#include "serve/scheduler.h"

#include <algorithm>
#include <exception>

#include "util/error.h"

namespace strata::serve {

Job::Job(GenerationPlan plan, Clock::time_point received_at)
    : plan_(std::move(plan)), received_at_(received_at) {}

void Job::mark_running() {
  std::lock_guard lock(mutex_);
  if (state_ == JobState::Queued) state_ = JobState::Running;
  changed_.notify_all();
}

void Job::emit(TextDelta delta) {
  if (delta.content.empty() && delta.reasoning.empty() && delta.logprobs.empty() &&
      delta.tool_calls.empty())
    return;
  std::lock_guard lock(mutex_);
  pending_.push_back(std::move(delta));
  changed_.notify_all();
}

void Job::finish(const GenerationOutcome& outcome) {
  std::lock_guard lock(mutex_);
  if (state_ == JobState::Finished) return;
  state_ = JobState::Finished;
  outcome_ = outcome;
  changed_.notify_all();
}

void Job::fail(ApiError error) {
  std::lock_guard lock(mutex_);
  if (state_ == JobState::Finished) return;
  state_ = JobState::Finished;
  error_ = std::move(error);
  changed_.notify_all();
}

void Job::request_cancel(CancelReason reason) {
  CancelReason expected = CancelReason::None;
  cancel_.compare_exchange_strong(expected, reason);
}

JobState Job::state() const {
  std::lock_guard lock(mutex_);
  return state_;
}

JobState Job::wait_started(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return state_ != JobState::Queued; });
  return state_;
}

Job::Update Job::wait_update(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout,
                    [&] { return !pending_.empty() || state_ == JobState::Finished; });
  Update update;
  update.state = state_;
  update.deltas.swap(pending_);
  if (state_ == JobState::Finished) {
    update.outcome = outcome_;
    update.error = error_;
  }
  return update;
}

Scheduler::Scheduler(size_t max_queue, Runner runner, size_t slots,
                     std::function<void()> after_work)
    : max_queue_(max_queue),
      slots_(slots),
      runner_(std::move(runner)),
      after_work_(std::move(after_work)) {
  if (slots < 1) fail("scheduler: expected at least 1 slot, found {}", slots);
  for (size_t i = 0; i < slots; ++i) workers_.emplace_back([this] { work(); });
}

Scheduler::~Scheduler() {
  shutdown(std::chrono::milliseconds(0));
}

Scheduler::Admission Scheduler::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return Admission::ShuttingDown;
    // Waiting = the queued jobs no free worker takes at once: a worker that runs a job, or a lent
    // part of one (another choice of an n > 1 request), is not free, so queued + busy workers
    // may reach max_queue + slots.
    if (queue_.size() + busy_workers_ >= max_queue_ + slots_) return Admission::QueueFull;
    queue_.push_back(job);
  }
  wake_.notify_one();
  return Admission::Accepted;
}

void Scheduler::cancel(const std::shared_ptr<Job>& job, CancelReason reason) {
  job->request_cancel(reason);
  bool removed = false;
  {
    std::lock_guard lock(mutex_);
    const auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) {
      queue_.erase(it);
      removed = true;
    }
  }
  if (removed) {
    ApiError error;
    error.status = reason == CancelReason::Shutdown ? 503 : 499;
    error.type = "server_error";
    error.message = "the request was cancelled before it started";
    job->fail(std::move(error));
  }
}

size_t Scheduler::queue_depth() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

bool Scheduler::busy() const {
  std::lock_guard lock(mutex_);
  return !running_.empty();
}

size_t Scheduler::running_count() const {
  std::lock_guard lock(mutex_);
  return running_.size();
}

size_t Scheduler::busy_slots() const {
  std::lock_guard lock(mutex_);
  return busy_workers_;
}

void Scheduler::lend(LentTask task) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;  // dropped: the lender does the part itself
    lent_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void Scheduler::work() {
  while (true) {
    std::shared_ptr<Job> job;
    LentTask task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return !queue_.empty() || !lent_.empty() || stopping_; });
      if (!lent_.empty() && !stopping_) {
        task = std::move(lent_.front());
        lent_.pop_front();
      } else if (queue_.empty()) {
        return;  // stopping
      } else {
        job = std::move(queue_.front());
        queue_.pop_front();
        running_.push_back(job);
      }
      ++busy_workers_;
    }
    if (task) {
      const bool worked = task();  // its exceptions are the lender's business: it catches them
      task = nullptr;  // what it holds (the lender's state) is released before the next wait
      if (worked && after_work_) after_work_();
      std::lock_guard lock(mutex_);
      --busy_workers_;
      continue;
    }
    job->mark_running();
    try {
      runner_(*job);
    } catch (const std::exception& e) {
      ApiError error;
      error.status = 500;
      error.type = "server_error";
      error.message = fmt::format("generation failed: {}", e.what());
      job->fail(std::move(error));
    }
    if (job->state() != JobState::Finished) {
      ApiError error;
      error.status = 500;
      error.type = "server_error";
      error.message = "generation ended without a result";
      job->fail(std::move(error));
    }
    if (after_work_) after_work_();
    {
      std::lock_guard lock(mutex_);
      running_.erase(std::find(running_.begin(), running_.end(), job));
      --busy_workers_;
    }
    idle_.notify_all();
  }
}

void Scheduler::cancel_running() {
  std::lock_guard lock(mutex_);
  for (const auto& job : running_) job->request_cancel(CancelReason::Shutdown);
}

void Scheduler::shutdown(std::chrono::milliseconds grace) {
  std::deque<std::shared_ptr<Job>> waiting;
  {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    waiting.swap(queue_);
    lent_.clear();  // optional help: their lenders do the parts themselves
  }
  wake_.notify_all();
  for (const auto& job : waiting) {
    job->request_cancel(CancelReason::Shutdown);
    ApiError error;
    error.status = 503;
    error.type = "server_error";
    error.code = "server_shutting_down";
    error.message = "the server is shutting down; the request was not started";
    job->fail(std::move(error));
  }
  {
    std::unique_lock lock(mutex_);
    if (!idle_.wait_for(lock, grace, [&] { return running_.empty(); }))
      for (const auto& job : running_) job->request_cancel(CancelReason::Shutdown);
  }
  std::lock_guard join_lock(join_mutex_);
  for (std::thread& worker : workers_)
    if (worker.joinable()) worker.join();
}

}  // namespace strata::serve
