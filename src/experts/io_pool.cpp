#include "experts/io_pool.h"

#include <algorithm>

#include "util/error.h"

namespace strata {

// A free list of equal-sized blocks (allocate_shared's one allocation per ticket), threaded
// through the blocks themselves.
class IoPool::TicketBlocks {
 public:
  TicketBlocks() = default;
  TicketBlocks(const TicketBlocks&) = delete;
  TicketBlocks& operator=(const TicketBlocks&) = delete;
  ~TicketBlocks() {
    while (free_) {
      FreeBlock* next = free_->next;
      ::operator delete(static_cast<void*>(free_));
      free_ = next;
    }
  }
  void* take(size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      if (bytes == block_bytes_ && free_) {
        FreeBlock* block = free_;
        free_ = block->next;
        return block;
      }
    }
    return ::operator new(std::max(bytes, sizeof(FreeBlock)));
  }
  void give(void* p, size_t bytes) {
    std::lock_guard lock(mutex_);
    if (block_bytes_ == 0) block_bytes_ = bytes;
    if (bytes != block_bytes_ || bytes < sizeof(FreeBlock)) {
      ::operator delete(p);
      return;
    }
    auto* block = ::new (p) FreeBlock{free_};
    free_ = block;
  }

 private:
  struct FreeBlock {
    FreeBlock* next;
  };
  std::mutex mutex_;
  size_t block_bytes_ = 0;  // the one size allocate_shared asks for (set by the first give)
  FreeBlock* free_ = nullptr;
};

namespace {

template <class T>
struct TicketAllocator {
  using value_type = T;
  std::shared_ptr<IoPool::TicketBlocks> blocks;
  explicit TicketAllocator(std::shared_ptr<IoPool::TicketBlocks> b) : blocks(std::move(b)) {}
  template <class U>
  TicketAllocator(const TicketAllocator<U>& other) : blocks(other.blocks) {}  // NOLINT
  T* allocate(size_t n) { return static_cast<T*>(blocks->take(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { blocks->give(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const TicketAllocator<U>& other) const {
    return blocks == other.blocks;
  }
};

}  // namespace

void IoPool::JobQueue::push_back(QueuedJob job) {
  // Reuse the popped front before the vector would grow.
  if (head_ > 0 && items_.size() == items_.capacity()) {
    items_.erase(items_.begin(), items_.begin() + std::ptrdiff_t(head_));
    head_ = 0;
  }
  items_.push_back(std::move(job));
}

IoPool::QueuedJob IoPool::JobQueue::pop_front() {
  QueuedJob job = std::move(items_[head_++]);
  if (empty()) clear();
  return job;
}

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

IoPool::IoPool(int n_threads, int n_urgent_only)
    : ticket_blocks_(std::make_shared<TicketBlocks>()) {
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

IoPool::TicketPtr IoPool::submit(Priority priority, const Job* jobs, size_t n_jobs) {
  TicketPtr ticket = std::allocate_shared<Ticket>(TicketAllocator<Ticket>(ticket_blocks_),
                                                  Ticket::Key{}, *this, priority);
  {
    std::lock_guard lock(mutex_);
    ticket->remaining_ = int(n_jobs);
    auto& queue = priority == Priority::Urgent ? urgent_ : read_ahead_;
    for (size_t i = 0; i < n_jobs; ++i) queue.push_back(QueuedJob{ticket, jobs[i]});
  }
  // One urgent job: any worker may take it, so one wake-up is enough. A read-ahead job wakes
  // everyone: a single wake-up may land on an urgent-only thread, which goes back to sleep and
  // leaves the job queued until some later submission (no one waits on read-ahead tickets).
  if (n_jobs == 1 && priority == Priority::Urgent)
    work_cv_.notify_one();
  else
    work_cv_.notify_all();
  return ticket;
}

void IoPool::reserve(size_t tickets, size_t jobs) {
  {
    // Tickets made at once take the free blocks first and allocate the rest; dropped together,
    // every block lands on the free list for the tickets to come.
    std::vector<TicketPtr> warm;
    warm.reserve(tickets);
    for (size_t i = 0; i < tickets; ++i)
      warm.push_back(std::allocate_shared<Ticket>(TicketAllocator<Ticket>(ticket_blocks_),
                                                  Ticket::Key{}, *this, Priority::Urgent));
  }
  std::lock_guard lock(mutex_);
  urgent_.reserve(jobs);
  read_ahead_.reserve(jobs);
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
    QueuedJob job = queue.pop_front();
    run(job, lock);
  }
}

void IoPool::wait(const TicketPtr& ticket) {
  std::unique_lock lock(mutex_);
  while (ticket->remaining_ > 0) {
    // Help: run this ticket's queued jobs here rather than sleep while they wait for a worker.
    auto find_own = [&](JobQueue& queue) {
      return std::find_if(queue.begin(), queue.end(),
                          [&](const QueuedJob& j) { return j.ticket == ticket; });
    };
    auto it = find_own(urgent_);
    JobQueue* queue = &urgent_;
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
