// IoPool: urgent work first, reserved threads, promotion, the waiter helping, errors and shutdown.
// Also built with ThreadSanitizer (io_pool_tsan_test) so races in the queues show up.
#include "experts/io_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "util/error.h"

namespace strata {
namespace {

using namespace std::chrono_literals;
using Priority = IoPool::Priority;

// A gate the test opens to let blocked jobs finish.
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard lock(m);
      open = true;
    }
    cv.notify_all();
  }
};

TEST(IoPool, EveryJobOfATicketRunsOnceAndWaitReturnsAfterAll) {
  IoPool pool(4, 1);
  std::atomic<int> runs[64] = {};
  std::vector<IoPool::Job> jobs;
  for (int i = 0; i < 64; ++i) jobs.push_back([&, i] { runs[i].fetch_add(1); });
  const auto ticket = pool.submit(Priority::Urgent, std::move(jobs));
  pool.wait(ticket);
  EXPECT_TRUE(ticket->done());
  EXPECT_FALSE(ticket->failed());
  for (auto& r : runs) EXPECT_EQ(r.load(), 1);
}

TEST(IoPool, UrgentJobsOvertakeQueuedReadAhead) {
  IoPool pool(1, 0);  // one worker: the order it takes jobs in is observable
  Gate gate;
  std::mutex order_mutex;
  std::vector<char> order;
  auto note = [&](char c) {
    std::lock_guard lock(order_mutex);
    order.push_back(c);
  };
  const auto blocker = pool.submit(Priority::ReadAhead, {[&] { gate.wait(); }});
  while (blocker->done()) {
  }
  std::this_thread::sleep_for(20ms);  // the worker is now inside the blocker
  const auto ra = pool.submit(Priority::ReadAhead, {[&] { note('r'); }, [&] { note('r'); }});
  const auto urgent = pool.submit(Priority::Urgent, {[&] { note('u'); }});
  gate.release();
  pool.wait(blocker);
  // Waiting on the read-ahead ticket may run its jobs here; wait for urgent first so the worker's
  // choice is what we observe.
  while (!urgent->done()) std::this_thread::sleep_for(1ms);
  pool.wait(ra);
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], 'u');
}

TEST(IoPool, ReservedThreadsNeverTakeReadAheadButTakePromotedWork) {
  IoPool pool(2, 1);  // thread 0 urgent-only, thread 1 both
  Gate gate;
  const auto busy = pool.submit(Priority::ReadAhead, {[&] { gate.wait(); }});
  std::this_thread::sleep_for(20ms);  // the shared worker is blocked
  std::atomic<bool> ran{false};
  const auto ra = pool.submit(Priority::ReadAhead, {[&] { ran = true; }});
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(ran.load()) << "the urgent-only thread took a read-ahead job";
  pool.promote(ra);
  for (int i = 0; i < 2000 && !ran.load(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(ran.load()) << "a promoted job must reach the urgent-only thread";
  EXPECT_EQ(ra->priority(), Priority::Urgent);
  gate.release();
  pool.wait(busy);
  pool.wait(ra);
}

// A one-job read-ahead ticket must reach a worker that may take it even when the wake-up lands on
// an urgent-only thread (which goes back to sleep): nobody waits on these tickets, so a lost
// wake-up would leave the read queued until some later submission.
TEST(IoPool, SingleReadAheadJobRunsWithoutAWaiter) {
  for (int round = 0; round < 200; ++round) {
    IoPool pool(4, 3);                 // three urgent-only threads, one shared
    std::this_thread::sleep_for(1ms);  // let every thread reach its wait
    std::atomic<bool> ran{false};
    const auto ticket = pool.submit(Priority::ReadAhead, {[&] { ran = true; }});
    for (int i = 0; i < 2000 && !ran.load(); ++i) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(ran.load()) << "round " << round << ": the read-ahead job was never picked up";
    pool.wait(ticket);
  }
}

TEST(IoPool, WaiterRunsItsOwnQueuedJobs) {
  IoPool pool(1, 0);
  Gate gate;
  const auto busy = pool.submit(Priority::Urgent, {[&] { gate.wait(); }});
  std::this_thread::sleep_for(20ms);
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id ran_on;
  const auto mine = pool.submit(Priority::Urgent, {[&] { ran_on = std::this_thread::get_id(); }});
  pool.wait(mine);  // the only worker is blocked: the waiter must run the job itself
  EXPECT_EQ(ran_on, me);
  gate.release();
  pool.wait(busy);
}

TEST(IoPool, FirstErrorIsRethrownToEveryWaiter) {
  IoPool pool(3, 1);
  std::atomic<int> ran{0};
  const auto ticket = pool.submit(Priority::Urgent, {[&] { ++ran; },
                                                     [&] {
                                                       ++ran;
                                                       throw Error("disk on fire");
                                                     },
                                                     [&] { ++ran; }});
  EXPECT_THROW(pool.wait(ticket), Error);
  EXPECT_EQ(ran.load(), 3) << "the other jobs of the ticket still run";
  EXPECT_TRUE(ticket->failed());
  try {
    pool.wait(ticket);
    FAIL() << "second wait must rethrow";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "disk on fire");
  }
}

TEST(IoPool, DestructionCancelsQueuedJobsAndJoins) {
  IoPool::TicketPtr queued;
  std::atomic<int> ran{0};
  Gate gate;
  std::thread opener;
  {
    IoPool pool(1, 0);
    const auto busy = pool.submit(Priority::Urgent, {[&] { gate.wait(); }});
    std::this_thread::sleep_for(20ms);
    queued = pool.submit(Priority::ReadAhead, {[&] { ++ran; }, [&] { ++ran; }});
    // Opens the gate only after the destructor below has cancelled the queue and started joining.
    opener = std::thread([&] {
      std::this_thread::sleep_for(100ms);
      gate.release();
    });
  }
  opener.join();
  EXPECT_TRUE(queued->failed());
  EXPECT_EQ(ran.load(), 0);
}

TEST(IoPool, ManyTicketsFromManyThreads) {
  IoPool pool(4, 1);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&, c] {
      for (int round = 0; round < 200; ++round) {
        std::vector<IoPool::Job> jobs;
        for (int j = 0; j < 5; ++j) jobs.push_back([&] { sum.fetch_add(1); });
        const auto t =
            pool.submit(round % 3 == 0 ? Priority::ReadAhead : Priority::Urgent, std::move(jobs));
        if (round % 5 == 0) pool.promote(t);
        pool.wait(t);
      }
      (void)c;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(sum.load(), 4 * 200 * 5);
}

TEST(IoPool, RejectsZeroThreads) {
  EXPECT_THROW(IoPool(0, 0), Error);
}

}  // namespace
}  // namespace strata
