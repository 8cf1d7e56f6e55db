// Row slices: a window of a few rows per thread (the batched decode steps of `serve --parallel`)
// run as one slice of consecutive rows per thread through a whole stage of the layer, one
// hand-out per stage instead of one per product or loop.
//
// Why: on the 2-vCPU build VM a cache line moves between the two vCPUs in ~470 ns (round trip), so
// a stage split per product (tiles by output) or per loop makes every row's data travel between
// the cores several times a layer; the transfers, not the arithmetic, set the time of a 16-row
// step's small stages (docs/serve.md, "Row slices"). Slice i is always rows [n·i/T, n·(i+1)/T) and
// task i of the hand-out (the caller takes task 0 and a polling worker task 1 first), so stages
// that slice the same way keep each row's data on one core from stage to stage.
//
// Contract
// - takes_row_slices(pool, n_rows): whether a window goes by slices (2+ threads, at least 2 rows
//   per thread, at most 32 rows: prompt windows keep the split per product, which tiles better).
// - for_each_row_slice(pool, n_rows, fn) calls fn(begin, end, thread_index) once for every
//   slice, as tasks of one parallel_for_each_task. Pool calls inside fn run inline on the slice's
//   thread (the pool's nested rule), with that thread's scratch slot (matmul's default); per-thread
//   workspaces go by thread_index. Rows never mix in any op sliced this way, so every row gets the
//   bits it gets in any other split or alone.
// - fn opens a ScopedPart (util/phase_timer.h: one window thread records) only where
//   thread_index == 0, the window thread: the parts then time the caller's slice, which runs
//   beside the others (or time the whole hand-out on the caller instead).
// - segments_starting_in(segments, begin, end): the segments (a batched window's sequences, in
//   row order, anything with first_row) whose first row lies in [begin, end), as [first, last):
//   per-sequence stages slice whole sequences, the same slices as the rows' when every sequence
//   has one row (decode steps).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "compute/cpu/thread_pool.h"

namespace strata::compute {

inline constexpr int64_t kRowSlicesMinRowsPerThread = 2;
inline constexpr int64_t kRowSlicesMaxRows = 32;

inline bool takes_row_slices(const ThreadPool& pool, int64_t n_rows) {
  const int threads = pool.size();
  return threads > 1 && n_rows >= kRowSlicesMinRowsPerThread * threads &&
         n_rows <= kRowSlicesMaxRows;
}

// Slice i of n_rows rows cut into `slices`: rows [row_slice_begin(i), row_slice_begin(i + 1)).
inline int64_t row_slice_begin(int64_t n_rows, int slices, int64_t i) {
  return n_rows * i / slices;
}

template <class Fn>
void for_each_row_slice(ThreadPool& pool, int64_t n_rows, Fn&& fn) {
  const int slices = pool.size();
  pool.parallel_for_each_task(slices, [&](int64_t slice, int64_t, int thread_index) {
    fn(row_slice_begin(n_rows, slices, slice), row_slice_begin(n_rows, slices, slice + 1),
       thread_index);
  });
}

template <class Segment>
std::pair<size_t, size_t> segments_starting_in(std::span<const Segment> segments, int64_t begin,
                                               int64_t end) {
  auto starting_at = [&](int64_t row) {
    return size_t(std::lower_bound(segments.begin(), segments.end(), row,
                                   [](const Segment& s, int64_t r) { return s.first_row < r; }) -
                  segments.begin());
  };
  return {starting_at(begin), starting_at(end)};
}

// Whether the segments cover rows [0, n_rows) in order, each after the one before.
template <class Segment>
bool segments_in_row_order(std::span<const Segment> segments, int64_t n_rows) {
  int64_t next = 0;
  for (const Segment& s : segments) {
    if (s.first_row != next) return false;
    next += s.n_rows;
  }
  return next == n_rows;
}

// The batched-step form the token mixers and PLE share: a window takes sequence slices when it
// takes row slices and its segments (two or more) cover its rows in order. Then
// for_each_sequence_slice calls fn(s_first, s_last, first_row, n_rows, thread_index) once per
// slice that holds the start of a segment: the segments [s_first, s_last) and the rows they span.
template <class Segment>
bool takes_sequence_slices(const ThreadPool& pool, std::span<const Segment> segments, int64_t n_rows) {
  return segments.size() > 1 && takes_row_slices(pool, n_rows) && segments_in_row_order(segments, n_rows);
}

template <class Segment, class Fn>
void for_each_sequence_slice(ThreadPool& pool, std::span<const Segment> segments, int64_t n_rows, Fn&& fn) {
  for_each_row_slice(pool, n_rows, [&](int64_t begin, int64_t end, int thread) {
    const auto [s_first, s_last] = segments_starting_in(segments, begin, end);
    if (s_first == s_last) return;
    const int64_t first = segments[s_first].first_row;
    fn(s_first, s_last, first, segments[s_last - 1].first_row + segments[s_last - 1].n_rows - first, thread);
  });
}

}  // namespace strata::compute
