#include "compute/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "util/error.h"

namespace strata::compute {
namespace {

// Both wake paths: workers that poll between jobs (default) and workers that sleep at once (0).
constexpr int kSpinSettings[] = {ThreadPool::kDefaultWorkerSpinMicros, 0};

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int spin_us : kSpinSettings)
  for (int n_threads : {1, 2, 3, 4}) {
    ThreadPool pool(n_threads, spin_us);
    EXPECT_EQ(pool.size(), n_threads);
    for (int64_t n_tasks : {1, 2, 3, 7, 64, 1000, 100003}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n_tasks));
      std::atomic<bool> bad_range{false};
      pool.parallel_for(n_tasks, [&](int64_t begin, int64_t end, int thread_index) {
        if (begin < 0 || end > n_tasks || begin >= end || thread_index < 0 ||
            thread_index >= n_threads) {
          bad_range = true;
          return;
        }
        for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
      });
      EXPECT_FALSE(bad_range) << "threads " << n_threads << " tasks " << n_tasks;
      for (int64_t i = 0; i < n_tasks; ++i) {
        ASSERT_EQ(hits[size_t(i)].load(), 1) << "index " << i << " threads " << n_threads;
      }
    }
  }
}

TEST(ThreadPool, ZeroTasksCallsNothing) {
  ThreadPool pool(3);
  int calls = 0;
  pool.parallel_for(0, [&](int64_t, int64_t, int) { ++calls; });
  pool.parallel_for(-5, [&](int64_t, int64_t, int) { ++calls; });
  EXPECT_EQ(calls, 0);
}

// Waits (bounded) until `flag` holds; false on timeout so a broken pool fails instead of hanging.
template <typename Predicate>
bool wait_until(Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return true;
}

TEST(ThreadPool, EveryThreadTakesPartAndCallerIsThreadZero) {
  ThreadPool pool(3, 0);  // sleeping workers: each must be woken
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> mismatch{false};
  std::atomic<bool> timed_out{false};
  std::vector<std::atomic<int>> arrived(3);
  std::atomic<int> n_arrived{0};
  // 3 threads x ~4 chunks: each thread's first chunk waits until all three threads are inside the
  // job, so the job can only finish if every worker woke up and took work.
  pool.parallel_for(64, [&](int64_t, int64_t, int thread_index) {
    const bool on_caller = std::this_thread::get_id() == caller;
    if (on_caller != (thread_index == 0)) mismatch = true;
    if (pool.current_thread_index() != thread_index) mismatch = true;
    if (arrived[size_t(thread_index)].fetch_add(1) == 0) {
      n_arrived.fetch_add(1);
      if (!wait_until([&] { return n_arrived.load() == 3; })) timed_out = true;
    }
  });
  EXPECT_FALSE(mismatch);
  EXPECT_FALSE(timed_out);
  EXPECT_EQ(pool.current_thread_index(), 0);
}

TEST(ThreadPool, ExceptionFromAnyThreadIsRethrownInCaller) {
  ThreadPool pool(3);
  for (int throwing_index = 0; throwing_index < 3; ++throwing_index) {
    std::atomic<bool> thrown{false};
    bool caught = false;
    try {
      pool.parallel_for(300, [&](int64_t, int64_t, int thread_index) {
        if (thread_index == throwing_index) {
          thrown = true;
          throw std::runtime_error("task failed");
        }
        // Hold the other threads until the throwing one has had a chunk.
        wait_until([&] { return thrown.load(); });
      });
    } catch (const std::runtime_error& error) {
      caught = std::string(error.what()) == "task failed";
    }
    EXPECT_TRUE(caught) << "throwing thread " << throwing_index;
  }
  // The pool still works after failures.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(1000, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

TEST(ThreadPool, ExceptionStopsHandingOutChunks) {
  ThreadPool pool(2);
  std::atomic<int64_t> tasks_run{0};
  EXPECT_THROW(pool.parallel_for(1'000'000,
                                 [&](int64_t begin, int64_t end, int) {
                                   tasks_run += end - begin;
                                   throw Error("stop");
                                 }),
               Error);
  // At most one chunk per thread ran (each threw at once): far fewer than all tasks.
  EXPECT_LT(tasks_run.load(), 1'000'000);
}

TEST(ThreadPool, ManyRapidJobs) {
  for (int spin_us : kSpinSettings) {
  ThreadPool pool(3, spin_us);
  int64_t expected = 0;
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 20000; ++job) {
    const int64_t n_tasks = 1 + job % 9;
    expected += n_tasks;
    pool.parallel_for(n_tasks, [&](int64_t begin, int64_t end, int) { total += end - begin; });
    // Every job must be complete when parallel_for returns.
    ASSERT_EQ(total.load(), expected) << "job " << job << " spin " << spin_us;
  }
  }
}

// More threads than the machine's cores (workers late, preempted between counting themselves
// into a job and checking it is open): every job's tasks run exactly once, all before its
// parallel_for returns, and never again after (a worker still holding an old job would add to
// that job's counts later; each job's closure captures its own row).
TEST(ThreadPool, JobsRunExactlyOnceAndNeverAfterTheyReturn) {
  for (int spin_us : kSpinSettings) {
    ThreadPool pool(8, spin_us);
    constexpr int kJobs = 3000, kTasks = 24;
    std::vector<std::atomic<int>> hits(size_t(kJobs) * kTasks);
    for (int job = 0; job < kJobs; ++job) {
      std::atomic<int>* row = hits.data() + size_t(job) * kTasks;
      const int64_t n_tasks = 1 + job % kTasks;
      pool.parallel_for(n_tasks, [row](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) row[i].fetch_add(1, std::memory_order_relaxed);
      });
      for (int64_t i = 0; i < n_tasks; ++i)
        ASSERT_EQ(row[i].load(), 1) << "job " << job << " task " << i << " spin " << spin_us;
    }
    for (size_t i = 0; i < hits.size(); ++i)
      ASSERT_EQ(hits[i].load(), (int64_t(i % kTasks) < 1 + int64_t(i / kTasks) % kTasks) ? 1 : 0)
          << "job " << i / kTasks << " task " << i % kTasks << " ran after its call returned";
  }
}

TEST(ThreadPool, NestedCallRunsInlineOnSameThread) {
  ThreadPool pool(3);
  std::atomic<bool> wrong{false};
  std::vector<std::atomic<int>> inner_hits(64 * 10);
  pool.parallel_for(64, [&](int64_t begin, int64_t end, int outer_index) {
    for (int64_t outer = begin; outer < end; ++outer) {
      const std::thread::id outer_thread = std::this_thread::get_id();
      pool.parallel_for(10, [&](int64_t inner_begin, int64_t inner_end, int inner_index) {
        if (std::this_thread::get_id() != outer_thread || inner_index != outer_index ||
            inner_begin != 0 || inner_end != 10) {
          wrong = true;
        }
        for (int64_t i = inner_begin; i < inner_end; ++i) {
          inner_hits[size_t(outer * 10 + i)].fetch_add(1);
        }
      });
    }
  });
  EXPECT_FALSE(wrong);
  for (auto& hit : inner_hits) ASSERT_EQ(hit.load(), 1);
}

TEST(ThreadPool, ConcurrentOutsideCallersAreSerialised) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int job = 0; job < 2000; ++job) {
      pool.parallel_for(8, [&](int64_t begin, int64_t end, int) { total += end - begin; });
    }
  };
  std::thread a(caller);
  std::thread b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 2000 * 8);
}

TEST(ThreadPool, DestructionWhileIdle) {
  for (int round = 0; round < 200; ++round) {
    ThreadPool pool(1 + round % 4);
    if (round % 2 == 0) {
      std::atomic<int> hits{0};
      pool.parallel_for(16, [&](int64_t begin, int64_t end, int) { hits += int(end - begin); });
      ASSERT_EQ(hits.load(), 16);
    }
    if (round % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }  // each destructor must join promptly (the test times out otherwise)
}

TEST(ThreadPool, DestructionRightAfterAJobWhileWorkersPoll) {
  for (int round = 0; round < 50; ++round) {
    std::atomic<int> hits{0};
    {
      ThreadPool pool(3);
      pool.parallel_for(8, [&](int64_t begin, int64_t end, int) { hits += int(end - begin); });
    }  // destroyed while its workers are still polling for the next job
    ASSERT_EQ(hits.load(), 8);
  }
}

// parallel_for_each_task hands out one task at a time: fn(i, i + 1, thread) exactly once for
// every i, each thread's tasks in increasing i, on every path (inline for one thread or one task,
// the job otherwise, both wake settings).
TEST(ThreadPool, EachTaskRunsExactlyOnceOnItsOwn) {
  for (int spin_us : kSpinSettings) {
    for (int n_threads : {1, 2, 3, 4}) {
      ThreadPool pool(n_threads, spin_us);
      for (int64_t n_tasks : {1, 2, 3, 5, 8, 64, 1001}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n_tasks));
        std::vector<std::atomic<int64_t>> last_of_thread(static_cast<size_t>(n_threads));
        for (auto& last : last_of_thread) last = -1;
        std::atomic<bool> bad{false};
        pool.parallel_for_each_task(n_tasks, [&](int64_t begin, int64_t end, int thread_index) {
          if (begin < 0 || end != begin + 1 || end > n_tasks || thread_index < 0 ||
              thread_index >= n_threads || pool.current_thread_index() != thread_index) {
            bad = true;
            return;
          }
          // Only this thread writes its slot: a smaller index than its previous one means the
          // hand-out went backwards.
          if (last_of_thread[size_t(thread_index)].exchange(begin) >= begin) bad = true;
          hits[size_t(begin)].fetch_add(1);
        });
        EXPECT_FALSE(bad) << "threads " << n_threads << " tasks " << n_tasks;
        for (int64_t i = 0; i < n_tasks; ++i) {
          ASSERT_EQ(hits[size_t(i)].load(), 1)
              << "task " << i << " threads " << n_threads << " tasks " << n_tasks;
        }
      }
    }
  }
}

TEST(ThreadPool, EachTaskWithNoTasksCallsNothing) {
  for (int n_threads : {1, 3}) {
    ThreadPool pool(n_threads);
    int calls = 0;
    pool.parallel_for_each_task(0, [&](int64_t, int64_t, int) { ++calls; });
    pool.parallel_for_each_task(-3, [&](int64_t, int64_t, int) { ++calls; });
    EXPECT_EQ(calls, 0);
  }
}

// With several threads the tasks really are spread: a task that waits until another thread has
// started one can only finish if a second thread took a task of its own.
TEST(ThreadPool, EachTaskSpreadsOverThreads) {
  ThreadPool pool(2, 0);
  std::atomic<int> started{0};
  std::atomic<bool> timed_out{false};
  std::atomic<int> threads_seen_mask{0};
  pool.parallel_for_each_task(2, [&](int64_t, int64_t, int thread_index) {
    threads_seen_mask.fetch_or(1 << thread_index);
    started.fetch_add(1);
    if (!wait_until([&] { return started.load() == 2; })) timed_out = true;
  });
  EXPECT_FALSE(timed_out);
  EXPECT_EQ(threads_seen_mask.load(), 3);
}

// Exceptions propagate as from parallel_for, on the inline paths (one thread, one task) and from
// any thread of a job; the pool keeps working afterwards.
TEST(ThreadPool, EachTaskRethrowsInCaller) {
  for (int n_threads : {1, 2, 3}) {
    ThreadPool pool(n_threads);
    for (int64_t n_tasks : {1, 2, 7, 200}) {
      for (int64_t throwing_task : {int64_t(0), n_tasks - 1}) {
        std::atomic<int64_t> ran{0};
        EXPECT_THROW(pool.parallel_for_each_task(n_tasks,
                                                 [&](int64_t begin, int64_t, int) {
                                                   ran.fetch_add(1);
                                                   if (begin == throwing_task) throw Error("task");
                                                 }),
                     Error)
            << "threads " << n_threads << " tasks " << n_tasks << " throwing " << throwing_task;
        EXPECT_LE(ran.load(), n_tasks);
      }
    }
    std::atomic<int64_t> sum{0};
    pool.parallel_for_each_task(100, [&](int64_t begin, int64_t, int) { sum += begin; });
    EXPECT_EQ(sum.load(), 99 * 100 / 2);
  }
}

// From inside a task of the same pool: inline on the calling thread, task by task, in order.
TEST(ThreadPool, EachTaskNestedRunsInlineInOrder) {
  ThreadPool pool(3);
  std::atomic<bool> wrong{false};
  std::vector<std::atomic<int>> inner_hits(16 * 5);
  pool.parallel_for(16, [&](int64_t begin, int64_t end, int outer_index) {
    for (int64_t outer = begin; outer < end; ++outer) {
      const std::thread::id outer_thread = std::this_thread::get_id();
      int64_t expected_next = 0;
      pool.parallel_for_each_task(5, [&](int64_t inner_begin, int64_t inner_end, int inner_index) {
        if (std::this_thread::get_id() != outer_thread || inner_index != outer_index ||
            inner_begin != expected_next || inner_end != inner_begin + 1) {
          wrong = true;
        }
        expected_next = inner_end;
        inner_hits[size_t(outer * 5 + inner_begin)].fetch_add(1);
      });
      if (expected_next != 5) wrong = true;
    }
  });
  EXPECT_FALSE(wrong);
  for (auto& hit : inner_hits) ASSERT_EQ(hit.load(), 1);
}

// run_phases: every task of every phase exactly once, with its phase's own numbers, and no task
// of a phase starts before every task of the phases before it has finished (each task checks
// that the earlier phases' counts are complete when it starts). Thread counts past this
// machine's cores too (the waits must end when threads are preempted), both wake settings, and
// on one thread / one task / the inline rule the whole chain in order on the caller.
TEST(ThreadPool, PhasesRunInOrderEveryTaskOnce) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1}, {1, 1}, {2, 1}, {5, 1, 17, 3}, {1, 64, 1, 64}, {40, 40, 40, 40, 40, 40, 40, 40}};
  for (int spin_us : kSpinSettings)
    for (int n_threads : {1, 2, 3, 4, 7, 16})
      for (const std::vector<int64_t>& shape : shapes) {
        ThreadPool pool(n_threads, spin_us, ThreadPool::kInlineNever);
        std::vector<std::vector<std::atomic<int>>> hits;
        for (int64_t n : shape) hits.emplace_back(static_cast<size_t>(n));
        std::vector<std::atomic<int64_t>> finished(shape.size());
        std::atomic<bool> bad{false};
        std::vector<std::function<void(int64_t, int64_t, int)>> runs;
        for (size_t p = 0; p < shape.size(); ++p)
          runs.emplace_back([&, p](int64_t begin, int64_t end, int thread_index) {
            if (begin < 0 || end > shape[p] || begin >= end || thread_index < 0 ||
                thread_index >= n_threads || pool.current_thread_index() != thread_index)
              bad = true;
            for (size_t q = 0; q < p; ++q)
              if (finished[q].load() != shape[q]) bad = true;
            for (int64_t i = begin; i < end; ++i) hits[p][size_t(i)].fetch_add(1);
            finished[p].fetch_add(end - begin);
          });
        std::vector<ThreadPool::Phase> phases;
        for (size_t p = 0; p < shape.size(); ++p) phases.push_back({shape[p], runs[p]});
        const uint64_t jobs = pool.jobs_run();
        pool.run_phases(phases);
        const bool one_task = shape.size() == 1 && shape[0] == 1;
        EXPECT_EQ(pool.jobs_run(), jobs + (n_threads > 1 && !one_task ? 1 : 0))
            << "one hand-out for the chain";
        EXPECT_FALSE(bad) << n_threads << " threads, " << shape.size() << " phases";
        for (size_t p = 0; p < shape.size(); ++p)
          for (int64_t i = 0; i < shape[p]; ++i)
            ASSERT_EQ(hits[p][size_t(i)].load(), 1)
                << "phase " << p << " task " << i << ", " << n_threads << " threads";
      }
}

// Under the inline rule, nested in a task, and on one thread: each phase as one call
// run(0, n_tasks, thread) on the calling thread, in phase order, with no hand-out.
TEST(ThreadPool, PhasesInlineRunInOrderOnTheCaller) {
  ThreadPool always(3, ThreadPool::kDefaultWorkerSpinMicros, ThreadPool::kInlineAlways);
  ThreadPool one(1);
  for (ThreadPool* pool : {&always, &one}) {
    std::vector<std::pair<int64_t, int64_t>> calls;
    const std::thread::id caller = std::this_thread::get_id();
    bool off_caller = false;
    const auto record = [&](int64_t begin, int64_t end, int thread_index) {
      if (std::this_thread::get_id() != caller || thread_index != 0) off_caller = true;
      calls.emplace_back(begin, end);
    };
    const ThreadPool::Phase phases[] = {{3, record}, {1, record}, {5, record}};
    const uint64_t jobs = pool->jobs_run();
    pool->run_phases(phases, 0.0);
    EXPECT_EQ(pool->jobs_run(), jobs);
    EXPECT_FALSE(off_caller);
    EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {0, 1}, {0, 5}}));
  }
  ThreadPool pool(3, ThreadPool::kDefaultWorkerSpinMicros, ThreadPool::kInlineNever);
  std::atomic<bool> wrong{false};
  pool.parallel_for(12, [&](int64_t begin, int64_t end, int outer_index) {
    for (int64_t outer = begin; outer < end; ++outer) {
      int step = 0;
      const auto first = [&](int64_t b, int64_t e, int index) {
        if (step != 0 || b != 0 || e != 4 || index != outer_index) wrong = true;
        step = 1;
      };
      const auto second = [&](int64_t b, int64_t e, int index) {
        if (step != 1 || b != 0 || e != 2 || index != outer_index) wrong = true;
        step = 2;
      };
      const ThreadPool::Phase phases[] = {{4, first}, {2, second}};
      pool.run_phases(phases);
      if (step != 2) wrong = true;
    }
  });
  EXPECT_FALSE(wrong);
}

// A task that throws stops the chain: the exception reaches the caller, no task of a later phase
// runs (those already waiting give up), and the pool works afterwards. Bad phase lists throw.
TEST(ThreadPool, PhasesRethrowAndStopTheChain) {
  for (int n_threads : {1, 2, 3, 7}) {
    ThreadPool pool(n_threads, ThreadPool::kDefaultWorkerSpinMicros, ThreadPool::kInlineNever);
    for (int64_t throwing : {int64_t(0), int64_t(5), int64_t(15)}) {
      std::atomic<int> later{0};
      const auto first = [&](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i)
          if (i == throwing) throw Error("task");
      };
      const auto second = [&](int64_t, int64_t, int) { later.fetch_add(1); };
      const ThreadPool::Phase phases[] = {{16, first}, {32, second}};
      EXPECT_THROW(pool.run_phases(phases), Error) << n_threads << " threads";
      EXPECT_EQ(later.load(), 0) << n_threads << " threads, task " << throwing;
    }
    std::atomic<int64_t> sum{0};
    const auto add = [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) sum += i;
    };
    const ThreadPool::Phase phases[] = {{10, add}, {10, add}};
    pool.run_phases(phases);
    EXPECT_EQ(sum.load(), 2 * 45);
    const auto none = [](int64_t, int64_t, int) {};
    const ThreadPool::Phase empty_phase[] = {{3, none}, {0, none}};
    EXPECT_THROW(pool.run_phases(empty_phase), Error);
    const std::vector<ThreadPool::Phase> too_many(ThreadPool::kMaxPhases + 1, {1, none});
    EXPECT_THROW(pool.run_phases(too_many), Error);
  }
}

TEST(ThreadPool, RejectsZeroThreads) {
  EXPECT_THROW(ThreadPool(0), Error);
  EXPECT_THROW(ThreadPool(-1), Error);
  EXPECT_THROW(ThreadPool(2, -1), Error);
  EXPECT_THROW(ThreadPool(2, 0, -5.0), Error);  // neither >= 0 nor kMeasureInlineWork
}

// The inline rule: an estimated hand-out under inline_work_ns runs every task on the caller as
// thread 0 and wakes no worker; at or above it, or without an estimate, it is handed out.
TEST(ThreadPool, InlineRuleRunsSmallHandOutsOnTheCaller) {
  for (int spin_us : kSpinSettings) {
    ThreadPool pool(3, spin_us, 10'000);
    EXPECT_EQ(pool.inline_work_ns(), 10'000);
    EXPECT_EQ(pool.inline_work_origin(), ThreadPool::InlineWorkOrigin::kConstructor);
    const std::thread::id caller = std::this_thread::get_id();
    std::atomic<bool> off_caller{false};
    std::vector<std::atomic<int>> hits(64);
    const auto task = [&](int64_t begin, int64_t end, int thread_index) {
      if (std::this_thread::get_id() != caller || thread_index != 0 ||
          pool.current_thread_index() != 0)
        off_caller = true;
      for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
    };
    const uint64_t jobs = pool.jobs_run(), inline_jobs = pool.jobs_inline();
    pool.parallel_for(64, 9'999.0, task);
    EXPECT_FALSE(off_caller);
    EXPECT_EQ(pool.jobs_run(), jobs) << "no hand-out to the workers";
    EXPECT_EQ(pool.jobs_inline(), inline_jobs + 1);
    for (auto& hit : hits) ASSERT_EQ(hit.exchange(0), 1);

    // At the threshold: handed out, and (the tasks wait for each other) every thread takes part.
    std::vector<std::atomic<int>> arrived(3);
    std::atomic<int> n_arrived{0};
    std::atomic<bool> timed_out{false};
    pool.parallel_for(64, 10'000.0, [&](int64_t begin, int64_t end, int thread_index) {
      if (arrived[size_t(thread_index)].fetch_add(1) == 0) {
        n_arrived.fetch_add(1);
        if (!wait_until([&] { return n_arrived.load() == 3; })) timed_out = true;
      }
      for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
    });
    EXPECT_FALSE(timed_out);
    EXPECT_EQ(pool.jobs_run(), jobs + 1);
    EXPECT_EQ(pool.jobs_inline(), inline_jobs + 1);
    for (auto& hit : hits) ASSERT_EQ(hit.exchange(0), 1);
    pool.parallel_for(64, [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
    });
    EXPECT_EQ(pool.jobs_run(), jobs + 2) << "no estimate: handed out";
    for (auto& hit : hits) ASSERT_EQ(hit.exchange(0), 1);
  }
}

TEST(ThreadPool, InlineRuleOffAndAlways) {
  ThreadPool never(2, ThreadPool::kDefaultWorkerSpinMicros, ThreadPool::kInlineNever);
  never.parallel_for(8, 0.0, [](int64_t, int64_t, int) {});
  EXPECT_EQ(never.jobs_run(), 1u);
  EXPECT_EQ(never.jobs_inline(), 0u);
  ThreadPool always(2, ThreadPool::kDefaultWorkerSpinMicros, ThreadPool::kInlineAlways);
  always.parallel_for(8, 1e12, [](int64_t, int64_t, int) {});
  EXPECT_EQ(always.jobs_run(), 0u);
  EXPECT_EQ(always.jobs_inline(), 1u);
  // A one-thread pool has nothing to hand out: no rule, nothing counted.
  ThreadPool one(1, ThreadPool::kDefaultWorkerSpinMicros, 5'000);
  EXPECT_EQ(one.inline_work_ns(), 0);
  EXPECT_EQ(one.inline_work_origin(), ThreadPool::InlineWorkOrigin::kOneThread);
  int calls = 0;
  one.parallel_for(8, 1.0, [&](int64_t begin, int64_t end, int) { calls += int(end - begin); });
  EXPECT_EQ(calls, 8);
  EXPECT_EQ(one.jobs_run() + one.jobs_inline(), 0u);
}

// Nested calls inside a task the rule ran inline stay inline on that thread; an exception from
// an inline run reaches the caller and leaves the pool usable.
TEST(ThreadPool, InlineRuleNestsAndRethrows) {
  ThreadPool pool(3, ThreadPool::kDefaultWorkerSpinMicros, ThreadPool::kInlineAlways);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> wrong{false};
  std::atomic<int> inner{0};
  pool.parallel_for(4, 1.0, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i)
      pool.parallel_for(5, [&](int64_t b, int64_t e, int index) {
        if (std::this_thread::get_id() != caller || index != 0) wrong = true;
        inner += int(e - b);
      });
  });
  EXPECT_FALSE(wrong);
  EXPECT_EQ(inner.load(), 20);
  EXPECT_EQ(pool.jobs_run(), 0u);
  EXPECT_THROW(pool.parallel_for(4, 1.0, [](int64_t, int64_t, int) { throw Error("stop"); }),
               Error);
  std::atomic<int> after{0};
  pool.parallel_for(100, [&](int64_t begin, int64_t end, int) { after += int(end - begin); });
  EXPECT_EQ(after.load(), 100);
}

// Each of `bad` as the value of `variable` makes ThreadPool's constructor throw strata::Error
// naming the variable; unsets it afterwards.
void expect_pool_refuses(const char* variable, std::initializer_list<const char*> bad) {
  for (const char* value : bad) {
    ASSERT_EQ(setenv(variable, value, 1), 0);
    try {
      ThreadPool pool(2);
      ADD_FAILURE() << variable << ": accepted '" << value << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(variable), std::string::npos) << e.what();
    }
  }
  ASSERT_EQ(unsetenv(variable), 0);
}

// Without an argument the threshold comes from STRATA_INLINE_WORK_NS, else from the measured
// cost of a hand-out (>= 0, the threshold that cost times n/(n-1)); a bad value is an error that
// names the variable.
TEST(ThreadPool, InlineWorkFromTheEnvironmentOrMeasured) {
  ASSERT_EQ(unsetenv("STRATA_INLINE_WORK_NS"), 0);
  {
    ThreadPool measured(2);
    EXPECT_EQ(measured.inline_work_origin(), ThreadPool::InlineWorkOrigin::kMeasured);
    EXPECT_GE(measured.measured_handout_ns(), 0);
    EXPECT_TRUE(std::isfinite(measured.measured_handout_ns()));
    EXPECT_DOUBLE_EQ(measured.inline_work_ns(), measured.measured_handout_ns() * 2);
    EXPECT_EQ(measured.jobs_run(), 0u) << "the measurement's hand-outs are not counted";
    EXPECT_NE(measured.describe_inline_rule().find("measured"), std::string::npos);
    ThreadPool three(3);
    EXPECT_DOUBLE_EQ(three.inline_work_ns(), three.measured_handout_ns() * 3 / 2);
  }
  ASSERT_EQ(setenv("STRATA_INLINE_WORK_NS", "1234.5", 1), 0);
  {
    ThreadPool from_environment(2);
    EXPECT_EQ(from_environment.inline_work_ns(), 1234.5);
    EXPECT_EQ(from_environment.inline_work_origin(), ThreadPool::InlineWorkOrigin::kEnvironment);
    ThreadPool given(2, ThreadPool::kDefaultWorkerSpinMicros, 7.0);  // the argument wins
    EXPECT_EQ(given.inline_work_ns(), 7.0);
  }
  expect_pool_refuses("STRATA_INLINE_WORK_NS", {"abc", "-5", "12us", "", "nan", "inf"});
}

// Phase chains (ThreadPool::phase_chains) are off unless STRATA_PHASE_CHAINS=1; 0 and unset mean
// off; any other value is an error naming the variable; set_phase_chains overrides.
TEST(ThreadPool, PhaseChainsFromTheEnvironment) {
  ASSERT_EQ(unsetenv("STRATA_PHASE_CHAINS"), 0);
  {
    ThreadPool pool(2);
    EXPECT_FALSE(pool.phase_chains());
    pool.set_phase_chains(true);
    EXPECT_TRUE(pool.phase_chains());
  }
  ASSERT_EQ(setenv("STRATA_PHASE_CHAINS", "1", 1), 0);
  EXPECT_TRUE(ThreadPool(2).phase_chains());
  ASSERT_EQ(setenv("STRATA_PHASE_CHAINS", "0", 1), 0);
  EXPECT_FALSE(ThreadPool(2).phase_chains());
  expect_pool_refuses("STRATA_PHASE_CHAINS", {"yes", "2", "", "on"});
}

TEST(ScratchBuffer, GrowsAlignedAndIsReusedWhenLargeEnough) {
  ScratchBuffer scratch;
  EXPECT_EQ(scratch.capacity_bytes(), 0u);
  std::byte* first = scratch.reserve(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  EXPECT_GE(scratch.capacity_bytes(), 100u);
  EXPECT_EQ(scratch.reserve(50), first);  // smaller request: no reallocation
  std::byte* grown = scratch.reserve(10000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(grown) % 64, 0u);
  EXPECT_GE(scratch.capacity_bytes(), 10000u);
  grown[9999] = std::byte{1};  // writable to the end (ASan checks)
  EXPECT_EQ(scratch.reserve(10000), grown);
}

TEST(ThreadPool, ScratchSlotsAreDistinctPerThread) {
  ThreadPool pool(3);
  std::vector<ScratchBuffer*> slots;
  for (int i = 0; i < 3; ++i) slots.push_back(&pool.scratch(i));
  EXPECT_NE(slots[0], slots[1]);
  EXPECT_NE(slots[1], slots[2]);
  EXPECT_NE(slots[0], slots[2]);
}

}  // namespace
}  // namespace strata::compute
