// IoPool — the threads that read experts for the ExpertStore, urgent work first.
//
// Contract
// - Work is submitted as a ticket: a group of jobs (closures, typically one pread of a chunk of
//   an expert record each) that complete together. A ticket is Urgent (a miss the current layer
//   waits for) or ReadAhead (a prediction). Workers always take urgent jobs before read-ahead
//   ones; `n_urgent_only` of the threads never take read-ahead jobs at all, so a miss never
//   queues behind speculative reads. Jobs of one ticket run in parallel on whichever threads are
//   free (that is how a large miss is split across threads).
// - `promote` turns a read-ahead ticket urgent: its jobs still queued move to the urgent queue.
// - `wait` blocks until every job of the ticket has run. While jobs of that ticket are still
//   queued, the waiting thread runs them itself instead of sleeping. If a job threw, `wait`
//   rethrows the first error (the ticket is then `failed`); later waits rethrow it again.
// - Destruction cancels queued jobs (their tickets fail with "cancelled"), lets running jobs
//   finish and joins the threads.
// - Thread-safe: any thread may submit, promote and wait.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class IoPool {
 public:
  enum class Priority { Urgent, ReadAhead };

  class Ticket {
   public:
    bool done() const;  // every job ran (successfully or not)
    bool failed() const;
    Priority priority() const;

   private:
    friend class IoPool;
    explicit Ticket(IoPool& pool, Priority priority) : pool_(pool), priority_(priority) {}
    IoPool& pool_;
    Priority priority_;
    int remaining_ = 0;  // guarded by pool_.mutex_
    std::exception_ptr error_;
  };
  using TicketPtr = std::shared_ptr<Ticket>;
  using Job = std::function<void()>;

  IoPool(int n_threads, int n_urgent_only);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  TicketPtr submit(Priority priority, std::vector<Job> jobs);
  void promote(const TicketPtr& ticket);
  void wait(const TicketPtr& ticket);

  int n_threads() const { return int(threads_.size()); }

 private:
  struct QueuedJob {
    TicketPtr ticket;
    Job fn;
  };
  void worker(bool urgent_only);
  void run(QueuedJob& job, std::unique_lock<std::mutex>& lock);

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;  // workers wait for jobs
  std::condition_variable done_cv_;  // waiters wait for tickets
  std::deque<QueuedJob> urgent_, read_ahead_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata
