#include "experts/io_pool.h"

#include <algorithm>

#include "util/error.h"

namespace strata {

bool IoPool::Ticket::done() const {
  std::lock_guard lock(pool_.mutex_);
  return remaining_ == 0;
}

bool IoPool::Ticket::failed() const {
  std::lock_guard lock(pool_.mutex_);
  return error_ != nullptr;
}

IoPool::Priority IoPool::Ticket::priority() const {
  std::lock_guard lock(pool_.mutex_);
  return priority_;
}

IoPool::IoPool(int n_threads, int n_urgent_only) {
  if (n_threads < 1) fail("I/O pool: need at least one thread, got {}", n_threads);
  n_urgent_only = std::clamp(n_urgent_only, 0, n_threads - 1);
  threads_.reserve(size_t(n_threads));
  for (int i = 0; i < n_threads; ++i)
    threads_.emplace_back([this, urgent_only = i < n_urgent_only] { worker(urgent_only); });
}

IoPool::~IoPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    const auto cancelled = std::make_exception_ptr(Error("I/O pool shut down before the read ran"));
    for (auto* queue : {&urgent_, &read_ahead_}) {
      for (QueuedJob& job : *queue) {
        if (!job.ticket->error_) job.ticket->error_ = cancelled;
        --job.ticket->remaining_;
      }
      queue->clear();
    }
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

IoPool::TicketPtr IoPool::submit(Priority priority, std::vector<Job> jobs) {
  TicketPtr ticket(new Ticket(*this, priority));
  {
    std::lock_guard lock(mutex_);
    ticket->remaining_ = int(jobs.size());
    auto& queue = priority == Priority::Urgent ? urgent_ : read_ahead_;
    for (Job& fn : jobs) queue.push_back(QueuedJob{ticket, std::move(fn)});
  }
  // One urgent job: any worker may take it, so one wake-up is enough. A read-ahead job wakes
  // everyone: a single wake-up may land on an urgent-only thread, which goes back to sleep and
  // leaves the job queued until some later submission (no one waits on read-ahead tickets).
  if (jobs.size() == 1 && priority == Priority::Urgent)
    work_cv_.notify_one();
  else
    work_cv_.notify_all();
  return ticket;
}

void IoPool::promote(const TicketPtr& ticket) {
  bool moved = false;
  {
    std::lock_guard lock(mutex_);
    if (ticket->priority_ == Priority::Urgent) return;
    ticket->priority_ = Priority::Urgent;
    for (auto it = read_ahead_.begin(); it != read_ahead_.end();) {
      if (it->ticket == ticket) {
        urgent_.push_back(std::move(*it));
        it = read_ahead_.erase(it);
        moved = true;
      } else {
        ++it;
      }
    }
  }
  if (moved) work_cv_.notify_all();  // urgent-only workers may now take them
}

// Runs one job with the lock released; records its error; wakes waiters when the ticket is done.
void IoPool::run(QueuedJob& job, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  std::exception_ptr error;
  try {
    job.fn();
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  if (error && !job.ticket->error_) job.ticket->error_ = error;
  if (--job.ticket->remaining_ == 0) done_cv_.notify_all();
}

void IoPool::worker(bool urgent_only) {
  std::unique_lock lock(mutex_);
  while (true) {
    work_cv_.wait(lock, [&] {
      return stopping_ || !urgent_.empty() || (!urgent_only && !read_ahead_.empty());
    });
    if (stopping_) return;
    auto& queue = !urgent_.empty() ? urgent_ : read_ahead_;
    QueuedJob job = std::move(queue.front());
    queue.pop_front();
    run(job, lock);
  }
}

void IoPool::wait(const TicketPtr& ticket) {
  std::unique_lock lock(mutex_);
  while (ticket->remaining_ > 0) {
    // Help: run this ticket's queued jobs here rather than sleep while they wait for a worker.
    auto find_own = [&](std::deque<QueuedJob>& queue) {
      return std::find_if(queue.begin(), queue.end(),
                          [&](const QueuedJob& j) { return j.ticket == ticket; });
    };
    auto it = find_own(urgent_);
    std::deque<QueuedJob>* queue = &urgent_;
    if (it == urgent_.end()) {
      it = find_own(read_ahead_);
      queue = &read_ahead_;
    }
    if (it != queue->end()) {
      QueuedJob job = std::move(*it);
      queue->erase(it);
      run(job, lock);
      continue;
    }
    done_cv_.wait(lock);
  }
  if (ticket->error_) std::rethrow_exception(ticket->error_);
}

}  // namespace strata
