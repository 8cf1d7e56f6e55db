// Workspace — the per-window scratch vectors of the CPU forward, reused from window to window so
// that a steady decode step allocates nothing.
//
// Contract
// - `floats(n)`, `ints(n)`, `ids(n)` hand out a vector of exactly n zeros (what a local
//   `std::vector<T> v(n)` gives), taken from a pool of vectors kept between calls: once a window
//   shape has run, running it again allocates nothing (the vectors keep their capacity).
// - A vector stays valid and is not handed out again until the `Frame` that was innermost when it
//   was handed out ends; then the next request of the same type reuses it. Open a Frame at the
//   top of every function that takes vectors, so nested calls reuse the same slots in the same
//   order every window (the order, not the sizes, decides which vector a call gets).
// - A caller may `swap` a handed-out vector with one it owns (e.g. move a window's buffer into a
//   rollback log): the workspace then keeps the other buffer for the next window.
// - `for_thread(i)` is a separate Workspace for the pool's thread i, for scratch inside
//   parallel_for tasks; create them with `reserve_threads(pool.size())` before the parallel_for.
// - Not thread-safe: one owner thread (the window's thread) per Workspace; thread i owns
//   for_thread(i) inside a task.
// - A vector's storage of >= 4 MiB is advised for transparent huge pages when it grows (a hint;
//   see grow()), before anything touches it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace strata::compute {

// madvise(MADV_HUGEPAGE) on the 2 MiB-aligned part of [data, data + bytes) when bytes >= 4 MiB;
// a hint (the kernel's transparent huge pages in "madvise" mode honour it), failures ignored.
void advise_huge_pages(void* data, size_t bytes);

class Workspace {
 public:
  std::vector<float>& floats(size_t n) { return take(floats_, n); }
  // As floats(n), but the contents are unspecified (left from earlier use; only elements beyond
  // the vector's previous size are zeroed): for buffers the caller overwrites completely before
  // reading, e.g. matmul outputs, where zeroing megabytes per window is wasted work.
  std::vector<float>& scratch_floats(size_t n) { return take_unzeroed(floats_, n); }
  std::vector<int64_t>& ints(size_t n) { return take(ints_, n); }
  std::vector<int32_t>& ids(size_t n) { return take(ids_, n); }

  // Restores the hand-out positions on destruction (RAII scope for nested calls).
  class Frame {
   public:
    explicit Frame(Workspace& ws)
        : ws_(ws), floats_(ws.floats_.next), ints_(ws.ints_.next), ids_(ws.ids_.next) {}
    ~Frame() {
      ws_.floats_.next = floats_;
      ws_.ints_.next = ints_;
      ws_.ids_.next = ids_;
    }
    Frame(const Frame&) = delete;
    Frame& operator=(const Frame&) = delete;

   private:
    Workspace& ws_;
    size_t floats_, ints_, ids_;
  };

  void reserve_threads(int n_threads) {
    while (int(threads_.size()) < n_threads) threads_.push_back(std::make_unique<Workspace>());
  }
  Workspace& for_thread(int thread_index) { return *threads_[size_t(thread_index)]; }

 private:
  template <class T>
  struct Pool {
    // unique_ptr: growing `slots` must not move the vectors callers hold references to.
    std::vector<std::unique_ptr<std::vector<T>>> slots;
    size_t next = 0;
  };
  // Amortised growth to at least n elements. A fresh allocation of megabytes is new anonymous
  // memory that the first window faults in page by page; with 4 KiB pages those faults were
  // ~7 % of a 512-token prompt's samples on the 2-vCPU VM of docs/bench-cpu-prompt.md (the
  // hypervisor makes each fault expensive), so large storage asks for 2 MiB pages before the
  // zeroing below touches it.
  template <class T>
  static void grow(std::vector<T>& v, size_t n) {
    if (n <= v.capacity()) return;
    v.reserve(std::max(n, 2 * v.capacity()));
    advise_huge_pages(v.data(), v.capacity() * sizeof(T));
  }
  template <class T>
  static std::vector<T>& take(Pool<T>& pool, size_t n) {
    if (pool.next == pool.slots.size()) pool.slots.push_back(std::make_unique<std::vector<T>>());
    std::vector<T>& v = *pool.slots[pool.next++];
    grow(v, n);
    v.assign(n, T{});
    return v;
  }
  template <class T>
  static std::vector<T>& take_unzeroed(Pool<T>& pool, size_t n) {
    if (pool.next == pool.slots.size()) pool.slots.push_back(std::make_unique<std::vector<T>>());
    std::vector<T>& v = *pool.slots[pool.next++];
    grow(v, n);
    v.resize(n);
    return v;
  }

  Pool<float> floats_;
  Pool<int64_t> ints_;
  Pool<int32_t> ids_;
  std::vector<std::unique_ptr<Workspace>> threads_;
};

}  // namespace strata::compute
