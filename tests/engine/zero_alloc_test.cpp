// Zero heap allocations per decode step after warm-up (issue 19, "state allocated once"): this
// binary replaces the global operator new/delete with counting versions and runs steady plain
// decode (and steady speculative verify + rollback windows) on every architecture's fixture and
// on the embedded default model, asserting that no thread — the window's, the pool's workers, the
// PLE reader — allocates during the measured steps. STRATA_ALLOC_TRACE=1 prints a backtrace of
// every counted allocation (resolve with addr2line) to find the culprit.
#include <gtest/gtest.h>

#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "../common/fixture_models.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "model/model.h"

// The replacements below pair malloc/aligned_alloc with free on purpose.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_allocations{0};

thread_local bool t_tracing = false;

void* counted_alloc(std::size_t size, std::size_t alignment) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (!t_tracing && std::getenv("STRATA_ALLOC_TRACE")) {
      t_tracing = true;
      void* frames[16];
      const int n = backtrace(frames, 16);
      backtrace_symbols_fd(frames, n, 2);
      (void)write(2, "----\n", 5);
      t_tracing = false;
    }
  }
  if (size == 0) size = 1;
  void* p = nullptr;
  if (alignment <= alignof(std::max_align_t)) {
    p = std::malloc(size);
  } else {
    const std::size_t rounded = (size + alignment - 1) / alignment * alignment;
    p = std::aligned_alloc(alignment, rounded);
  }
  return p;
}

}  // namespace

void* operator new(std::size_t size) {
  if (void* p = counted_alloc(size, 0)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  if (void* p = counted_alloc(size, 0)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, std::align_val_t alignment) {
  if (void* p = counted_alloc(size, std::size_t(alignment))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  if (void* p = counted_alloc(size, std::size_t(alignment))) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return counted_alloc(size, 0); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return counted_alloc(size, 0);
}
void* operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted_alloc(size, std::size_t(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted_alloc(size, std::size_t(alignment));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace strata {
namespace {

// Allocations made by `steps` while counting.
template <class Fn>
uint64_t allocations_during(Fn&& steps) {
  const uint64_t before = g_allocations.load();
  g_counting = true;
  steps();
  g_counting = false;
  return g_allocations.load() - before;
}

std::vector<std::string> model_paths() {
  std::vector<std::string> paths;
  for (const char* arch : {"qwen3moe", "qwen3next", "qwen4exp"})
    paths.push_back(test_support::fixture_model_gguf(arch));
  paths.push_back(std::string(STRATA_SOURCE_DIR) + "/models/strata-default.gguf");
  return paths;
}

int32_t greedy(const std::vector<float>& logits) {
  return int32_t(compute::argmax(logits.data(), int64_t(logits.size())));
}

TEST(ZeroAlloc, CountingOperatorNewSeesAllocations) {
  // The counter itself works (otherwise the tests below would pass vacuously).
  const uint64_t n = allocations_during([] {
    std::vector<int> v(100);
    asm volatile("" : : "g"(v.data()) : "memory");  // keep the allocation
  });
  EXPECT_EQ(n, 1u);
}

TEST(ZeroAlloc, SteadyPlainDecodeAllocatesNothing) {
  for (const std::string& path : model_paths()) {
    SCOPED_TRACE(path);
    auto model = Model::load(path);
    compute::ThreadPool pool(2);
    Session session(*model, pool);
    const int vocab = int(model->hparams().n_vocab);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 7; ++i) prompt.push_back(int32_t((i * 37 + 11) % vocab));
    int32_t token = greedy(session.prefill(prompt));
    for (int i = 0; i < 3; ++i) token = greedy(session.decode(token));  // warm-up
    const uint64_t n = allocations_during([&] {
      for (int i = 0; i < 8; ++i) token = greedy(session.decode(token));
    });
    EXPECT_EQ(n, 0u) << "heap allocations in 8 steady decode steps";
  }
}

TEST(ZeroAlloc, SteadySpeculativeWindowsAllocateNothing) {
  // verify a 3-row window, keep 2 rows (rollback of DeltaNet/conv, PLE and KV), repeat.
  for (const std::string& path : model_paths()) {
    SCOPED_TRACE(path);
    auto model = Model::load(path);
    compute::ThreadPool pool(2);
    Session session(*model, pool);
    const int vocab = int(model->hparams().n_vocab);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 7; ++i) prompt.push_back(int32_t((i * 29 + 5) % vocab));
    int32_t token = greedy(session.prefill(prompt));
    int32_t window[3];
    auto step = [&] {
      window[0] = token;
      window[1] = int32_t((token + 1) % vocab);
      window[2] = int32_t((token + 2) % vocab);
      session.verify(window);
      session.keep_rows(2);
      token = greedy(session.logits());
    };
    for (int i = 0; i < 3; ++i) step();  // warm-up
    const uint64_t n = allocations_during([&] {
      for (int i = 0; i < 6; ++i) step();
    });
    EXPECT_EQ(n, 0u) << "heap allocations in 6 steady verify + rollback windows";
  }
}

}  // namespace
}  // namespace strata
