// torch's CPU top-k selection (the set of indices torch.topk returns on the CPU), written out as
// plain loops so that it also runs on a GPU thread.
//
// Why: QSA keeps the `budget` best blocks by score, and ReLU zeroes many scores, so ties at the
// budget boundary are common; which tied blocks torch keeps is decided by its algorithm, not by a
// rule such as "lowest index". torch (ATen's CPU topk) and the CPU backend (layers/attention.h
// torch_cpu_top_k_set) run libstdc++'s std::partial_sort when k·64 <= n and std::nth_element
// otherwise on the index array, comparing values only. This header performs the same
// comparisons and moves in the same order (introselect: median-of-three pivot, unguarded
// partition, a heap select once the depth limit runs out, insertion sort on ranges of <= 3;
// partial sort: heap select), so it yields the same set. The CUDA backend runs it on one thread
// when a row's scores tie across its budget boundary (compute/cuda/window_ops.h).
//
// Contract: torch_top_k_permute(idx, n, k, larger) permutes idx[0..n) (initially 0..n−1, as
// torch builds it) so that idx[0..k) is the selected set, exactly as torch_cpu_top_k_set's
// std:: calls leave it (order within the set may differ from a sorted one). `larger(a, b)` is
// the comparison on indices: value[a] > value[b]. Requires 1 <= k <= n.
// tests/compute/torch_top_k_test.cpp pits it against torch_cpu_top_k_set on tie-heavy inputs.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::torch_top_k {

template <class T>
STRATA_HOST_DEVICE inline void swap_values(T& a, T& b) {
  const T t = a;
  a = b;
  b = t;
}

// Sift `value` down from `hole` in the heap of len entries at a, then back up towards the hole's
// start. The heap is ordered by `larger` as std::make_heap orders by its comparison: no entry is
// `larger` than its children, so the top is the smallest value kept.
template <class Larger>
STRATA_HOST_DEVICE void adjust_heap(int32_t* a, int64_t hole, int64_t len, int32_t value, Larger larger) {
  const int64_t top = hole;
  int64_t child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (larger(a[child], a[child - 1])) --child;
    a[hole] = a[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    a[hole] = a[child - 1];
    hole = child - 1;
  }
  int64_t parent = (hole - 1) / 2;
  while (hole > top && larger(a[parent], value)) {
    a[hole] = a[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  a[hole] = value;
}

template <class Larger>
STRATA_HOST_DEVICE void make_heap(int32_t* a, int64_t len, Larger larger) {
  if (len < 2) return;
  for (int64_t parent = (len - 2) / 2;; --parent) {
    adjust_heap(a, parent, len, a[parent], larger);
    if (parent == 0) return;
  }
}

// After it, a[0..middle) holds the `middle` best of a[0..n) (heap order).
template <class Larger>
STRATA_HOST_DEVICE void heap_select(int32_t* a, int64_t middle, int64_t n, Larger larger) {
  make_heap(a, middle, larger);
  for (int64_t i = middle; i < n; ++i)
    if (larger(a[i], a[0])) {
      const int32_t value = a[i];
      a[i] = a[0];
      adjust_heap(a, 0, middle, value, larger);
    }
}

template <class Larger>
STRATA_HOST_DEVICE void insertion_sort(int32_t* a, int64_t n, Larger larger) {
  for (int64_t i = 1; i < n; ++i) {
    const int32_t value = a[i];
    if (larger(value, a[0])) {
      for (int64_t j = i; j > 0; --j) a[j] = a[j - 1];
      a[0] = value;
    } else {
      int64_t j = i;
      while (larger(value, a[j - 1])) {
        a[j] = a[j - 1];
        --j;
      }
      a[j] = value;
    }
  }
}

// The pivot (median of a[1], a[mid], a[n−1]) moves to a[0]; returns the partition point.
template <class Larger>
STRATA_HOST_DEVICE int64_t partition_around_median(int32_t* a, int64_t n, Larger larger) {
  const int64_t x = 1, y = n / 2, z = n - 1;
  int64_t median;
  if (larger(a[x], a[y])) {
    if (larger(a[y], a[z])) median = y;
    else if (larger(a[x], a[z])) median = z;
    else median = x;
  } else if (larger(a[x], a[z])) {
    median = x;
  } else if (larger(a[y], a[z])) {
    median = z;
  } else {
    median = y;
  }
  swap_values(a[0], a[median]);
  int64_t lo = 1, hi = n;
  while (true) {
    while (larger(a[lo], a[0])) ++lo;
    --hi;
    while (larger(a[0], a[hi])) --hi;
    if (!(lo < hi)) return lo;
    swap_values(a[lo], a[hi]);
    ++lo;
  }
}

template <class Larger>
STRATA_HOST_DEVICE void nth_element(int32_t* a, int64_t nth, int64_t n, Larger larger) {
  if (n == 0 || nth == n) return;
  int depth_limit = 0;
  for (int64_t m = n; m > 1; m >>= 1) depth_limit += 2;  // 2·floor(log2 n)
  int64_t first = 0, last = n;
  while (last - first > 3) {
    if (depth_limit == 0) {
      heap_select(a + first, nth + 1 - first, last - first, larger);
      swap_values(a[first], a[nth]);
      return;
    }
    --depth_limit;
    const int64_t cut = first + partition_around_median(a + first, last - first, larger);
    if (cut <= nth) first = cut;
    else last = cut;
  }
  insertion_sort(a + first, last - first, larger);
}

template <class Larger>
STRATA_HOST_DEVICE void torch_top_k_permute(int32_t* idx, int64_t n, int64_t k, Larger larger) {
  if (k * 64 <= n) heap_select(idx, k, n, larger);  // partial_sort's set; its sort_heap only reorders
  else nth_element(idx, k - 1, n, larger);
}

}  // namespace strata::torch_top_k
