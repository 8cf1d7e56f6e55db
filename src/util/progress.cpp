#include "util/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace strata {

std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  const int decimals = value < 10 ? 2 : value < 100 ? 1 : 0;
  return fmt::format("{:.{}f} {}", value, decimals, kUnits[unit]);
}

std::string format_duration(double seconds) {
  const auto total = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (total < 60) return fmt::format("{}s", total);
  if (total < 3600) return fmt::format("{}m{:02}s", total / 60, total % 60);
  return fmt::format("{}h{:02}m", total / 3600, (total % 3600) / 60);
}

std::string ProgressBar::format_line(std::string_view label, uint64_t done_items, uint64_t total_items,
                                     uint64_t done_bytes, uint64_t total_bytes, double elapsed_seconds,
                                     std::string_view item_name) {
  constexpr int kBarWidth = 20;
  const bool by_bytes = total_bytes > 0;
  const double fraction =
      by_bytes ? static_cast<double>(done_bytes) / static_cast<double>(total_bytes)
               : (total_items > 0 ? static_cast<double>(done_items) / static_cast<double>(total_items) : 1.0);
  const int filled = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * kBarWidth);
  std::string line = fmt::format("{} [{}{}] {}/{} {}", label, std::string(filled, '#'),
                                 std::string(kBarWidth - filled, '.'), done_items, total_items, item_name);
  if (by_bytes) line += fmt::format("  {}/{}", format_bytes(done_bytes), format_bytes(total_bytes));
  if (elapsed_seconds > 0 && fraction > 0) {
    if (by_bytes) {
      line += fmt::format("  {}/s", format_bytes(static_cast<uint64_t>(static_cast<double>(done_bytes) / elapsed_seconds)));
    }
    if (fraction < 1.0) {
      line += fmt::format("  ETA {}", format_duration(elapsed_seconds * (1.0 - fraction) / fraction));
    } else {
      line += fmt::format("  in {}", format_duration(elapsed_seconds));
    }
  }
  return line;
}

ProgressBar::ProgressBar(std::string label, uint64_t total_items, uint64_t total_bytes, std::FILE* out)
    : label_(std::move(label)),
      total_items_(total_items),
      total_bytes_(total_bytes),
      out_(out),
      enabled_(out != nullptr && ::isatty(::fileno(out)) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(uint64_t items, uint64_t bytes) {
  done_items_ += items;
  done_bytes_ += bytes;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ >= std::chrono::milliseconds(100)) {
    last_draw_ = now;
    draw(false);
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) draw(true);
}

void ProgressBar::draw(bool final_line) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string line =
      format_line(label_, done_items_, total_items_, done_bytes_, total_bytes_, elapsed);
  // "\r" + clear-to-end-of-line keeps a shorter line from leaving stale characters behind.
  std::fprintf(out_, "\r%s\x1b[K%s", line.c_str(), final_line ? "\n" : "");
  std::fflush(out_);
}

}  // namespace strata
