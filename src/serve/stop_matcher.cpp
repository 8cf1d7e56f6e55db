#include "serve/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace strata::serve {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& stop) { return stop.empty(); });
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_ += text;
  if (stops_.empty()) return std::exchange(held_, {});
  // The stop string that completes first ends the text (as it would, token by token), the longest
  // of those that complete at the same place; its first occurrence is the one that ends first.
  size_t best_end = std::string::npos, best_start = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& stop : stops_) {
    const size_t start = held_.find(stop);
    if (start == std::string::npos) continue;
    const size_t end = start + stop.size();
    if (end < best_end || (end == best_end && start < best_start)) {
      best_end = end;
      best_start = start;
      best = &stop;
    }
  }
  if (best) {
    stopped_ = true;
    matched_ = *best;
    std::string out = held_.substr(0, best_start);
    held_.clear();
    return out;
  }
  // Keep the longest suffix of held_ that a stop string starts with; a match that completes later
  // must begin inside it (any earlier start would already be a full match or impossible).
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, held_.size());
    for (size_t n = longest; n > keep; --n) {
      if (std::string_view(held_).substr(held_.size() - n) == std::string_view(stop).substr(0, n)) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

}  // namespace strata::serve
