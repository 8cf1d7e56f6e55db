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
// - Allocation: once the pool has seen as many tickets alive and jobs queued at once as it will
//   see, submit / promote / wait allocate nothing (issue 19 item 4: the streaming decode step is
//   allocation-free, tests/engine/zero_alloc_test.cpp). Jobs keep their captures inline (IoJob),
//   a ticket's memory (shared_ptr control block included) is recycled through a free list, and the
//   queues are vectors that keep their capacity. How many tickets are alive and how many jobs
//   queued at once depends on timing (a worker still holds a finished job's ticket for a moment; a
//   read-ahead ticket promoted while queued moves its jobs to the urgent queue), so "seen" is not
//   something a warm-up can promise: `reserve(tickets, jobs)` makes room for the bound up front
//   (the expert store reserves what its slots can have in flight), and within it nothing allocates.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>
#include <vector>

namespace strata {

// A job: a callable whose captures (trivially copyable, at most kCaptureBytes) are stored inline,
// so making, copying and queueing one never allocates (std::function heap-allocates captures
// over 16 bytes: every expert read's did).
class IoJob {
 public:
  static constexpr size_t kCaptureBytes = 48;
  IoJob() = default;
  template <class F>
  requires(!std::is_same_v<std::decay_t<F>, IoJob> && std::is_invocable_v<const F&>)
      IoJob(F fn) {  // NOLINT(google-explicit-constructor): lambdas convert like to std::function
    static_assert(sizeof(F) <= kCaptureBytes && alignof(F) <= alignof(std::max_align_t),
                  "IoJob: captures too large (capture pointers, not objects)");
    static_assert(std::is_trivially_copyable_v<F>, "IoJob: captures must be trivially copyable");
    ::new (static_cast<void*>(storage_)) F(fn);
    call_ = [](const void* f) { (*static_cast<const F*>(f))(); };
  }
  void operator()() const { call_(storage_); }
  explicit operator bool() const { return call_ != nullptr; }

 private:
  alignas(std::max_align_t) unsigned char storage_[kCaptureBytes] = {};
  void (*call_)(const void*) = nullptr;
};

class IoPool {
 public:
  enum class Priority { Urgent, ReadAhead };

  class Ticket {
   public:
    // Only the pool makes tickets (the key is its to give).
    class Key {
      friend class IoPool;
      Key() = default;
    };
    Ticket(Key, IoPool& pool, Priority priority) : pool_(pool), priority_(priority) {}
    bool done() const;  // every job ran (successfully or not)
    bool failed() const;
    Priority priority() const;

   private:
    friend class IoPool;
    IoPool& pool_;
    Priority priority_;
    int remaining_ = 0;  // guarded by pool_.mutex_
    std::exception_ptr error_;
  };
  using TicketPtr = std::shared_ptr<Ticket>;
  using Job = IoJob;

  IoPool(int n_threads, int n_urgent_only);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  TicketPtr submit(Priority priority, const Job* jobs, size_t n_jobs);
  TicketPtr submit(Priority priority, const std::vector<Job>& jobs) {
    return submit(priority, jobs.data(), jobs.size());
  }
  void promote(const TicketPtr& ticket);
  void wait(const TicketPtr& ticket);
  // Room for `tickets` tickets alive and `jobs` jobs queued in each queue at once: while a use
  // stays within both, submit / promote / wait allocate nothing. Only grows.
  void reserve(size_t tickets, size_t jobs);

  int n_threads() const { return int(threads_.size()); }

  // The memory of dead tickets, for the next ones (shared with every live ticket's control
  // block, so a ticket may outlive the pool). Thread-safe: a ticket dies on whichever thread
  // drops its last reference.
  class TicketBlocks;

 private:
  struct QueuedJob {
    TicketPtr ticket;
    Job fn;
  };
  // A FIFO over a vector that keeps its capacity (std::deque frees and allocates a node every
  // few jobs). Popped entries stay moved-from until the queue drains or must grow.
  class JobQueue {
   public:
    using iterator = std::vector<QueuedJob>::iterator;
    bool empty() const { return head_ == items_.size(); }
    iterator begin() { return items_.begin() + std::ptrdiff_t(head_); }
    iterator end() { return items_.end(); }
    void push_back(QueuedJob job);
    QueuedJob pop_front();
    void reserve(size_t n) { items_.reserve(n); }
    iterator erase(iterator it) { return items_.erase(it); }
    void clear() {
      items_.clear();
      head_ = 0;
    }

   private:
    std::vector<QueuedJob> items_;
    size_t head_ = 0;
  };
  void worker(bool urgent_only);
  void run(QueuedJob& job, std::unique_lock<std::mutex>& lock);

  std::shared_ptr<TicketBlocks> ticket_blocks_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;  // workers wait for jobs
  std::condition_variable done_cv_;  // waiters wait for tickets
  JobQueue urgent_, read_ahead_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata
