// HeapPolicy's trim thread (serve/heap_policy.h): the trim runs on its own thread, never on the
// caller's; after_generation does not wait for it; at most one trim per interval; the destructor
// joins at once. The trim is injected (a function that records or blocks), and every wait has a
// bound far above what the 2-core box needs when loaded: no assertion depends on a short timing.
#include "serve/heap_policy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::serve {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

template <typename Pred>
bool eventually(Pred pred, std::chrono::seconds timeout = 30s) {
  const auto deadline = SteadyClock::now() + timeout;
  while (!pred()) {
    if (SteadyClock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// A trim that records who ran it and when, and can be held until the test releases it.
struct RecordingTrim {
  std::mutex mutex;  // guards everything below
  std::condition_variable changed;
  std::vector<std::thread::id> threads;
  std::vector<SteadyClock::time_point> starts;
  size_t finished = 0;
  bool hold_first = false;  // the first trim waits for release (at most 60 s)
  bool released = false;

  void operator()() {
    std::unique_lock lock(mutex);
    threads.push_back(std::this_thread::get_id());
    starts.push_back(SteadyClock::now());
    changed.notify_all();
    if (hold_first && threads.size() == 1) changed.wait_for(lock, 60s, [&] { return released; });
    ++finished;
  }
  size_t started_count() {
    std::lock_guard lock(mutex);
    return threads.size();
  }
  size_t finished_count() {
    std::lock_guard lock(mutex);
    return finished;
  }
  void release() {
    std::lock_guard lock(mutex);
    released = true;
    changed.notify_all();
  }
};

// The slot thread only asks: the trim runs on the policy's thread, and while it runs (held here
// until the test releases it, standing in for the ~32 ms malloc_trim of the 64-stream load test),
// after_generation returns. A call that waited for the trim would return only once it ended (at
// 60 s).
TEST(ServeHeap, TrimRunsOnItsOwnThreadAndNeverBlocksTheCaller) {
  RecordingTrim trim;
  trim.hold_first = true;
  HeapPolicy heap([&] { trim(); }, 10ms);
  heap.after_generation();
  ASSERT_TRUE(eventually([&] { return trim.started_count() == 1; }));
  const auto calls_start = SteadyClock::now();
  for (int i = 0; i < 100; ++i) heap.after_generation();
  const auto calls_s = std::chrono::duration<double>(SteadyClock::now() - calls_start).count();
  EXPECT_EQ(trim.finished_count(), 0u) << "after_generation waited for the trim";
  EXPECT_LT(calls_s, 10.0);           // 100 calls; the held trim would take 60 s
  EXPECT_EQ(heap.stats().trims, 0u);  // counted when it ends
  trim.release();
  // The 100 calls during the trim ask for one more, once the 10 ms have passed: two in all.
  ASSERT_TRUE(eventually([&] { return heap.stats().trims == 2; }));
  EXPECT_EQ(heap.stats().checks, 101u);
  EXPECT_GE(heap.stats().trim_seconds, 0.0);
  std::lock_guard lock(trim.mutex);
  ASSERT_EQ(trim.threads.size(), 2u);
  EXPECT_NE(trim.threads[0], std::this_thread::get_id());
  EXPECT_EQ(trim.threads[1], trim.threads[0]);  // one trim thread, owned by the policy
}

// However many generations end, trims start at least one interval apart (a loaded machine only
// spreads them further), and generations that keep ending keep them coming.
TEST(ServeHeap, TrimsAtMostOncePerInterval) {
  constexpr auto kInterval = 100ms;
  RecordingTrim trim;
  HeapPolicy heap([&] { trim(); }, kInterval);
  const auto deadline = SteadyClock::now() + 60s;
  while (trim.started_count() < 4 && SteadyClock::now() < deadline) {
    heap.after_generation();
    std::this_thread::sleep_for(1ms);
  }
  std::lock_guard lock(trim.mutex);
  ASSERT_GE(trim.starts.size(), 4u);
  for (size_t i = 1; i < trim.starts.size(); ++i)
    EXPECT_GE(trim.starts[i] - trim.starts[i - 1], kInterval) << "trims " << i - 1 << ", " << i;
}

// Many generations in one (long) interval: one trim, and the check count says how many asked.
TEST(ServeHeap, ManyGenerationsInOneIntervalTrimOnce) {
  RecordingTrim trim;
  HeapPolicy heap([&] { trim(); }, 1h);
  for (int i = 0; i < 200; ++i) heap.after_generation();
  ASSERT_TRUE(eventually([&] { return heap.stats().trims == 1; }));
  std::this_thread::sleep_for(200ms);  // room for a wrong second trim
  EXPECT_EQ(heap.stats().trims, 1u);
  EXPECT_EQ(trim.started_count(), 1u);
  EXPECT_EQ(heap.stats().checks, 200u);
}

// The destructor stops the thread at once, also while it waits out the interval with a trim
// asked for (that one is dropped: the process is leaving), and when no trim was ever asked.
TEST(ServeHeap, DestructorJoinsPromptly) {
  RecordingTrim trim;
  auto heap = std::make_unique<HeapPolicy>([&] { trim(); }, 1h);
  heap->after_generation();
  ASSERT_TRUE(eventually([&] { return heap->stats().trims == 1; }));
  heap->after_generation();  // waits for the hour
  auto start = SteadyClock::now();
  heap.reset();
  EXPECT_LT(SteadyClock::now() - start, 10s);
  EXPECT_EQ(trim.started_count(), 1u);

  start = SteadyClock::now();
  heap = std::make_unique<HeapPolicy>([&] { trim(); }, 1h);
  heap.reset();
  EXPECT_LT(SteadyClock::now() - start, 10s);
  EXPECT_EQ(trim.started_count(), 1u);
}

// During a trim, the destructor waits for it to end and returns then.
TEST(ServeHeap, DestructorWaitsForARunningTrim) {
  RecordingTrim trim;
  trim.hold_first = true;
  auto heap = std::make_unique<HeapPolicy>([&] { trim(); }, 1h);
  heap->after_generation();
  ASSERT_TRUE(eventually([&] { return trim.started_count() == 1; }));
  std::thread releaser([&] {
    std::this_thread::sleep_for(100ms);
    trim.release();
  });
  heap.reset();
  EXPECT_EQ(trim.finished_count(), 1u);
  releaser.join();
}

// The real policy (malloc_trim) trims too, off the caller's thread.
TEST(ServeHeap, DefaultPolicyTrims) {
  HeapPolicy heap;
  heap.after_generation();
  EXPECT_TRUE(eventually([&] { return heap.stats().trims == 1; }));
  EXPECT_EQ(heap.stats().checks, 1u);
}

}  // namespace
}  // namespace strata::serve
