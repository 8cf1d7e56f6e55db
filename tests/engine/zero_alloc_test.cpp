// Zero heap allocations per decode step after warm-up (issue 19, "state allocated once"): this
// binary replaces the global operator new/delete AND the C allocator (malloc, calloc, realloc,
// aligned_alloc, posix_memalign, memalign; forwarded to glibc's __libc_* entry points) with
// counting versions, and runs steady decode on every architecture's fixture and on the embedded
// default model, asserting that no thread — the window's, the pool's workers, the PLE reader, the
// expert store's I/O threads — allocates during the measured steps:
//   - plain greedy decode (mapped experts), and sampled decode (temperature, top-k, top-p,
//     repetition penalty) through a Sampler;
//   - speculative verify + rollback windows, and speculative decoding through SpecDecoder with
//     the MTP head and with the suffix drafter;
//   - streaming: an ExpertStore with one cache slot per layer (misses every step, reads on the
//     I/O pool) from the GGUF with io_uring and with pread, and from a packed sidecar.
// STRATA_ALLOC_TRACE=1 prints a backtrace of every counted allocation (resolve with addr2line);
// STRATA_ALLOC_STEPS=1 the allocations per emitted token of the speculative runs.
#include <gtest/gtest.h>

#include <execinfo.h>
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "../common/fixture_models.h"
#include "../common/temp_dir.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/thread_pool.h"
#include "decode/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "experts/block_reader.h"
#include "experts/expert_store.h"
#include "experts/io_pool.h"
#include "experts/sidecar.h"
#include "model/model.h"
#include "spec/spec_decoder.h"
#include "util/error.h"

// The replacements below pair malloc/aligned_alloc with free on purpose.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

// Under AddressSanitizer, which owns malloc and free (replacing them crashes at start-up), this
// binary counts operator new only, on ASan's allocator (as it did before the C allocator was
// counted); release builds replace both and allocate through glibc's __libc_* entry points.
#if defined(__SANITIZE_ADDRESS__)
#define STRATA_ZERO_ALLOC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STRATA_ZERO_ALLOC_ASAN 1
#endif
#endif

extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t n, size_t size);
void* __libc_realloc(void* p, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void __libc_free(void* p);
}

namespace {

std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_allocations{0};

thread_local bool t_tracing = false;

void count_allocation() {
  if (!g_counting.load(std::memory_order_relaxed)) return;
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

void* counted_alloc(std::size_t size, std::size_t alignment) {
  count_allocation();
  if (size == 0) size = 1;
#ifdef STRATA_ZERO_ALLOC_ASAN
  if (alignment <= alignof(std::max_align_t)) return std::malloc(size);
  return std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
#else
  if (alignment <= alignof(std::max_align_t)) return __libc_malloc(size);
  return __libc_memalign(alignment, size);
#endif
}

void release(void* p) {
#ifdef STRATA_ZERO_ALLOC_ASAN
  std::free(p);
#else
  __libc_free(p);
#endif
}

}  // namespace

// The C allocator (libraries, and anything that bypasses operator new): release builds only (see
// STRATA_ZERO_ALLOC_ASAN above).
#ifndef STRATA_ZERO_ALLOC_ASAN
extern "C" {
void* malloc(size_t size) {
  count_allocation();
  return __libc_malloc(size);
}
void* calloc(size_t n, size_t size) {
  count_allocation();
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t size) {
  count_allocation();
  return __libc_realloc(p, size);
}
void* aligned_alloc(size_t alignment, size_t size) {
  count_allocation();
  return __libc_memalign(alignment, size);
}
void* memalign(size_t alignment, size_t size) {
  count_allocation();
  return __libc_memalign(alignment, size);
}
int posix_memalign(void** out, size_t alignment, size_t size) {
  count_allocation();
  void* p = __libc_memalign(alignment, size);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) {
  __libc_free(p);
}
}
#endif

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
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return counted_alloc(size, 0);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return counted_alloc(size, 0);
}
void* operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted_alloc(size, std::size_t(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted_alloc(size, std::size_t(alignment));
}
void operator delete(void* p) noexcept {
  release(p);
}
void operator delete[](void* p) noexcept {
  release(p);
}
void operator delete(void* p, std::size_t) noexcept {
  release(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  release(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  release(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  release(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  release(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  release(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  release(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  release(p);
}
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  release(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  release(p);
}

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

TEST(ZeroAlloc, CountingMallocSeesAllocations) {
#ifdef STRATA_ZERO_ALLOC_ASAN
  GTEST_SKIP()
      << "AddressSanitizer owns malloc: this build counts operator new only (the release build "
         "counts malloc and runs this check)";
#endif
  const uint64_t n = allocations_during([] {
    void* p = std::malloc(100);
    asm volatile("" : : "g"(p) : "memory");
    std::free(p);
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

// --ctx: a session sized for its whole context at start decodes to the last token of it without
// one heap allocation (nothing grows: KV caches, recurrent states, PLE history, token list), and
// the token past it is refused before any state changes.
TEST(ZeroAlloc, ASessionSizedForItsContextAllocatesNothingToItsEnd) {
  for (const std::string& path : model_paths()) {
    SCOPED_TRACE(path);
    auto model = Model::load(path);
    compute::ThreadPool pool(2);
    constexpr int64_t kContext = 48;
    Session session(*model, pool, nullptr, "cpu", kContext);
    EXPECT_EQ(session.reserved_tokens(), kContext);
    EXPECT_EQ(session.context_length(), kContext);
    const int vocab = int(model->hparams().n_vocab);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 7; ++i) prompt.push_back(int32_t((i * 37 + 11) % vocab));
    int32_t token = greedy(session.prefill(prompt));
    for (int i = 0; i < 3; ++i) token = greedy(session.decode(token));  // warm-up
    const int64_t steps = session.context_left();
    EXPECT_EQ(steps, kContext - 10);
    const uint64_t n = allocations_during([&] {
      for (int64_t i = 0; i < steps; ++i) token = greedy(session.decode(token));
    });
    EXPECT_EQ(n, 0u) << "heap allocations in the last " << steps << " tokens of the context";
    EXPECT_EQ(session.n_past(), kContext);
    EXPECT_THROW(session.decode(token), Error);
    EXPECT_EQ(session.n_past(), kContext);
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

TEST(ZeroAlloc, SteadySampledDecodeAllocatesNothing) {
  // The sampler's working vectors (penalised logits, candidate order, probabilities) are reused.
  SamplerConfig config;
  config.temperature = 0.8f;
  config.top_k = 40;
  config.top_p = 0.95f;
  config.min_p = 0.01f;
  config.repetition_penalty = 1.1f;
  config.seed = 7;
  for (const std::string& path : model_paths()) {
    SCOPED_TRACE(path);
    auto model = Model::load(path);
    compute::ThreadPool pool(2);
    Session session(*model, pool);
    Sampler sampler(config);
    const int vocab = int(model->hparams().n_vocab);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 7; ++i) prompt.push_back(int32_t((i * 31 + 3) % vocab));
    int32_t token = sampler.sample(session.prefill(prompt), session.tokens());
    auto step = [&] { token = sampler.sample(session.decode(token), session.tokens()); };
    for (int i = 0; i < 3; ++i) step();  // warm-up
    const uint64_t n = allocations_during([&] {
      for (int i = 0; i < 8; ++i) step();
    });
    EXPECT_EQ(n, 0u) << "heap allocations in 8 steady sampled decode steps";
  }
}

// Streaming experts: one cache slot per layer, so nearly every routed expert is a miss read by
// the I/O pool (and read-ahead guesses are issued and promoted) in every measured step.
struct StreamingCase {
  const char* name;
  bool sidecar;
  bool io_uring;
};

void expect_streaming_decode_allocates_nothing(const StreamingCase& c) {
  for (const std::string& path : model_paths()) {
    SCOPED_TRACE(std::string(c.name) + " " + path);
    auto model = Model::load(path);
    test_support::ScratchDir dir("zero-alloc");
    ExpertStoreOptions options;
    options.slots_per_layer = 1;
    options.io_threads = 2;
    options.io_uring = c.io_uring;
    std::unique_ptr<ExpertStore> store;
    if (c.sidecar) {
      const std::string sidecar = dir.file("model.experts");
      pack_sidecar(model->file(), sidecar);
      store = std::make_unique<ExpertStore>(*model, Sidecar::open(sidecar, model->file()), options);
    } else {
      store = std::make_unique<ExpertStore>(*model, options);
    }
    compute::ThreadPool pool(2);
    Session session(*model, pool, store.get());
    const int vocab = int(model->hparams().n_vocab);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 7; ++i) prompt.push_back(int32_t((i * 37 + 11) % vocab));
    int32_t token = greedy(session.prefill(prompt));
    for (int i = 0; i < 4; ++i) token = greedy(session.decode(token));  // warm-up
    const ExpertStoreStats before = store->stats();
    const uint64_t n = allocations_during([&] {
      for (int i = 0; i < 8; ++i) token = greedy(session.decode(token));
    });
    const ExpertStoreStats during = store->stats() - before;
    EXPECT_GT(during.misses, 0u) << "the measured steps must read experts";
    EXPECT_EQ(n, 0u) << "heap allocations in 8 steady streaming decode steps (" << during.misses
                     << " misses, " << during.read_ahead_issued << " read-ahead reads)";
  }
}

// Which threads read through io_uring during a decode step depends on timing: a miss's jobs run
// on whichever I/O worker is free, or on the waiting decode thread itself when none has taken them
// yet (IoPool::wait). So a thread's FIRST io_uring read must allocate nothing either: it set up
// the thread's ring, and registering a thread_local destructor for it (glibc's
// __cxa_thread_atexit_impl) callocs. That made the streaming io_uring case below fail now and
// then on a loaded machine: the decode thread helped with a read for the first time inside the
// measured steps.
TEST(ZeroAlloc, FirstIoUringReadOnAThreadAllocatesNothing) {
  if (!io_uring_available()) GTEST_SKIP() << "io_uring is not available here";
  test_support::ScratchDir dir("zero-alloc-ring");
  const std::string path = dir.file("data");
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::vector<char> bytes(8192, 'x');
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> dest(8192, 0);
  // Two pieces: one piece is read with a plain pread, two go through the ring.
  const ReadPiece pieces[2] = {{fd, 0, 4096, dest.data()}, {fd, 4096, 4096, dest.data() + 4096}};
  std::atomic<bool> go{false}, done{false};
  std::thread reader([&] {
    while (!go.load()) std::this_thread::yield();
    read_pieces(ReadBackend::IoUring, pieces);
    done = true;
  });
  const uint64_t n = allocations_during([&] {
    go = true;
    while (!done.load()) std::this_thread::yield();
  });
  reader.join();
  ::close(fd);
  EXPECT_EQ(dest[0], 'x');
  EXPECT_EQ(dest[8191], 'x');
  EXPECT_EQ(n, 0u) << "heap allocations in a thread's first io_uring read";
}

// The I/O pool's worst timing, made deterministic: every worker is busy, so read-ahead tickets
// pile up in the queue; they are then promoted (their jobs move to the urgent queue) and waited
// for on this thread, while more tickets are made as older ones die. Within IoPool::reserve's
// bound nothing may allocate, however the reads interleave. Without the reserve, the first such
// pile-up inside steady decode grew a queue or the ticket free list: that made
// SteadyStreamingDecodeFromSidecarAllocatesNothing fail now and then on CI.
TEST(ZeroAlloc, IoPoolWithinItsReserveAllocatesNothing) {
  constexpr int kThreads = 2;
  constexpr size_t kTickets = 12, kJobsPerTicket = 3;
  IoPool pool(kThreads, 1);
  pool.reserve(kTickets + kThreads + 1, (kTickets + kThreads + 1) * kJobsPerTicket);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  const IoPool::Job block_worker[] = {[&release] {
    while (!release.load()) std::this_thread::yield();
  }};
  const IoPool::Job count[kJobsPerTicket] = {
      [&ran] { ran.fetch_add(1); }, [&ran] { ran.fetch_add(1); }, [&ran] { ran.fetch_add(1); }};
  std::vector<IoPool::TicketPtr> tickets;
  tickets.reserve(kTickets);
  const uint64_t n = allocations_during([&] {
    for (int round = 0; round < 3; ++round) {
      release = false;
      // Occupy both workers, then queue read-ahead tickets behind them.
      const IoPool::TicketPtr busy[kThreads] = {
          pool.submit(IoPool::Priority::Urgent, block_worker, 1),
          pool.submit(IoPool::Priority::Urgent, block_worker, 1)};
      while (tickets.size() < kTickets - kThreads)
        tickets.push_back(pool.submit(IoPool::Priority::ReadAhead, count, kJobsPerTicket));
      for (const IoPool::TicketPtr& t : tickets) pool.promote(t);  // queued jobs change queues
      pool.wait(tickets.front());  // this thread runs that ticket's queued jobs itself
      release = true;
      for (const IoPool::TicketPtr& t : busy) pool.wait(t);
      for (const IoPool::TicketPtr& t : tickets) pool.wait(t);
      tickets.clear();
    }
  });
  EXPECT_EQ(ran.load(), int(3 * (kTickets - kThreads) * kJobsPerTicket));
  EXPECT_EQ(n, 0u) << "heap allocations by the I/O pool within its reserve";
}

TEST(ZeroAlloc, SteadyStreamingDecodeFromGgufWithIoUringAllocatesNothing) {
  expect_streaming_decode_allocates_nothing({"gguf io_uring", false, true});
}

TEST(ZeroAlloc, SteadyStreamingDecodeFromGgufWithPreadAllocatesNothing) {
  expect_streaming_decode_allocates_nothing({"gguf pread", false, false});
}

TEST(ZeroAlloc, SteadyStreamingDecodeFromSidecarAllocatesNothing) {
  expect_streaming_decode_allocates_nothing({"sidecar", true, true});
}

// Allocations between the n_warm-th and the n_tokens-th token a greedy speculative run emits
// through SpecDecoder (drafts, verify windows, rollback; with `mode` Mtp the head's own forward).
uint64_t steady_speculative_allocations(const Model& model, spec::SpecMode mode,
                                        const std::vector<int32_t>& prompt, int n_warm,
                                        int n_tokens) {
  compute::ThreadPool pool(2);
  Session session(model, pool);
  Sampler sampler(SamplerConfig{});
  spec::SpecOptions options;
  options.mode = mode;
  options.gate.enabled = false;  // fixed depth: every window drafts (the gate follows wall times)
  options.gate.max_depth = 3;
  spec::SpecDecoder decoder(session, sampler, options, pool);
  const std::vector<float> first = decoder.prefill(prompt, 64);
  std::vector<uint64_t> at_emit(size_t(n_tokens), 0);
  int emitted = 0;
  auto emit = [&](int32_t) {
    if (emitted < n_tokens) at_emit[size_t(emitted)] = g_allocations.load();
    ++emitted;
  };
  g_counting = true;
  generate(session, sampler, first, n_tokens, std::nullopt, emit, &decoder);
  g_counting = false;
  EXPECT_EQ(emitted, n_tokens);
  if (std::getenv("STRATA_ALLOC_STEPS"))
    for (int i = 1; i < n_tokens; ++i)
      std::fprintf(stderr, "token %d: %llu\n", i,
                   (unsigned long long)(at_emit[size_t(i)] - at_emit[size_t(i - 1)]));
  return at_emit[size_t(n_tokens - 1)] - at_emit[size_t(n_warm - 1)];
}

TEST(ZeroAlloc, SteadyMtpSpeculativeDecodeAllocatesNothing) {
  int models_with_mtp = 0;
  for (const std::string& path : model_paths()) {
    SCOPED_TRACE(path);
    auto model = Model::load(path);
    if (!model->has_mtp()) continue;
    ++models_with_mtp;
    const int vocab = int(model->hparams().n_vocab);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 7; ++i) prompt.push_back(int32_t((i * 37 + 11) % vocab));
    EXPECT_EQ(steady_speculative_allocations(*model, spec::SpecMode::Mtp, prompt, 6, 24), 0u)
        << "heap allocations in steady MTP speculative decoding";
  }
  EXPECT_GT(models_with_mtp, 0) << "no model with an MTP head";
}

// The suffix drafter (prompt lookup) on a prompt that repeats, so that it drafts from the first
// step: its search scratch and the drafts are reused, whatever the history's length (it used to
// allocate a Draft and its occurrence lists per proposal: 1 to 80 allocations per model between
// tokens 24 and 64). Its drafts vary in length, so verify windows of 2 to 4 rows come in no fixed
// order, and the rollback log's buffers (which trade places with spares every recorded window)
// reach the largest window's size only after some windows: on these models the last warm-up
// allocation is at token 20 (STRATA_ALLOC_STEPS=1 prints the count per token), so the first 24
// tokens are warm-up.
TEST(ZeroAlloc, SteadySuffixSpeculativeDecodeAllocatesNothing) {
  for (const std::string& path : model_paths()) {
    SCOPED_TRACE(path);
    auto model = Model::load(path);
    const int vocab = int(model->hparams().n_vocab);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 20; ++i) prompt.push_back(int32_t((i % 5 * 37 + 11) % vocab));
    EXPECT_EQ(steady_speculative_allocations(*model, spec::SpecMode::Suffix, prompt, 24, 64), 0u)
        << "heap allocations in steady suffix speculative decoding";
  }
}

// The generation loop itself (decode/generate.h) around plain steps, greedy and sampled: its
// callbacks, checks and window reports add nothing to a warm step. Allocations between the 6th
// and the last token it hands out.
TEST(ZeroAlloc, SteadyDecodeThroughTheGenerationLoopAllocatesNothing) {
  SamplerConfig sampled;
  sampled.temperature = 0.8f;
  sampled.top_k = 40;
  sampled.seed = 3;
  for (const std::string& path : model_paths()) {
    auto model = Model::load(path);
    for (const SamplerConfig& config : {SamplerConfig{}, sampled}) {
      SCOPED_TRACE(path + (config.temperature > 0 ? " sampled" : " greedy"));
      compute::ThreadPool pool(2);
      Session session(*model, pool);
      Sampler sampler(config);
      const int vocab = int(model->hparams().n_vocab);
      std::vector<int32_t> prompt;
      for (int i = 0; i < 7; ++i) prompt.push_back(int32_t((i * 41 + 13) % vocab));
      session.prefill(prompt);
      constexpr int kTokens = 24, kWarm = 6;
      uint64_t at_emit[kTokens] = {};
      int emitted = 0;
      auto emit = [&](int32_t) {
        if (emitted < kTokens) at_emit[emitted] = g_allocations.load();
        ++emitted;
      };
      g_counting = true;
      generate(session, sampler, session.logits(), kTokens, std::nullopt, emit);
      g_counting = false;
      ASSERT_EQ(emitted, kTokens);
      EXPECT_EQ(at_emit[kTokens - 1] - at_emit[kWarm - 1], 0u)
          << "heap allocations from token " << kWarm << " to token " << kTokens
          << " of the generation loop";
    }
  }
}

}  // namespace
}  // namespace strata
