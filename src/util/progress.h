// ProgressBar — one self-overwriting status line for long jobs on a terminal stream:
//   "convert [########........] 120/843 tensors  1.21/4.02 GiB  312 MiB/s  ETA 9s"
//
// Contract
// - Draws only when enabled; by default it is enabled when the stream is a terminal, so output
//   piped into a file or a test log stays clean. Redraws are rate-limited (100 ms) so a hot loop
//   can call `advance` freely.
// - Progress is measured in items (e.g. tensors) and bytes; the rate and ETA use bytes when a byte
//   total is known, items otherwise.
// - `finish` draws the final state and ends the line (once). The destructor calls it.
// - Not thread-safe: one thread owns and advances a ProgressBar.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace strata {

class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total_items, uint64_t total_bytes, std::FILE* out = stderr);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }
  // Adds finished items and bytes.
  void advance(uint64_t items, uint64_t bytes);
  void finish();

  // The status line for a state (no carriage return or newline). Pure; used by tests.
  static std::string format_line(std::string_view label, uint64_t done_items, uint64_t total_items,
                                 uint64_t done_bytes, uint64_t total_bytes, double elapsed_seconds,
                                 std::string_view item_name = "tensors");

 private:
  void draw(bool final_line);
  std::string label_;
  uint64_t total_items_, total_bytes_;
  uint64_t done_items_ = 0, done_bytes_ = 0;
  std::FILE* out_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "512 B", "3.0 KiB", "1.21 GiB"
std::string format_bytes(uint64_t bytes);
// "42s", "3m05s", "1h02m"
std::string format_duration(double seconds);

}  // namespace strata
