// FlushSubnormals — a scope in which the calling thread's f32/f64 arithmetic treats subnormal
// numbers (|x| < 2^-126 for f32, not zero) as zero.
//
// What it promises
// - On x86 (SSE's MXCSR): from construction to destruction, every SSE/AVX/AVX-512 operation of
//   THIS thread writes 0 (of the result's sign) where its result would be subnormal (FTZ) and
//   reads a subnormal operand as 0 (DAZ). Both are per-element rules, so a result is the same
//   bits whatever the vector width of the code computing it. glibc's exp/expf follow them too.
// - The destructor restores the thread's previous MXCSR exactly (nesting is fine; the pool's
//   workers go back to the mode they had, so nothing outside the scope changes).
// - Only the constructing thread: a scope does not reach the pool's workers. Code that must give
//   the same bits on every thread (ThreadPool tasks) opens its own scope inside each task.
// - Elsewhere (no MXCSR) a no-op: arithmetic keeps its subnormals.
// Why: an Intel core takes a microcode assist (~100+ cycles) for each operation with a
// subnormal operand or result; AMD Zen cores pay far less. Gated DeltaNet's chunked form
// multiplies by e^γ factors of a 64-row chunk that reach the subnormal range for heads with strong
// decay (layers/gated_deltanet.h), millions of times per 512-row window
// (docs/bench-cpu-scaling.md). Construct and destroy it on one thread (RAII on the stack).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define STRATA_HAS_MXCSR 1
#else
#define STRATA_HAS_MXCSR 0
#endif

namespace strata::compute {

class FlushSubnormals {
 public:
#if STRATA_HAS_MXCSR
  // MXCSR bit 15: flush to zero; bit 6: denormals are zero.
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  FlushSubnormals() noexcept : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero);
  }
  ~FlushSubnormals() { _mm_setcsr(saved_); }
#else
  FlushSubnormals() noexcept = default;
#endif
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
#if STRATA_HAS_MXCSR
  unsigned saved_;
#endif
};

}  // namespace strata::compute
