#include "decode/state_cache.h"

#include <algorithm>
#include <optional>

#include "spec/drafter.h"
#include "spec/spec_decoder.h"

namespace strata {

struct StateCache::Entry {
  SessionSnapshot session;
  bool has_drafters = false;  // saved with a SpecDecoder whose drafters could all be copied
  std::vector<std::unique_ptr<spec::Drafter>> drafters;
  uint64_t bytes = 0;
  const std::vector<int32_t>& tokens() const { return session.tokens; }
};

namespace {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  return size_t(std::mismatch(a.begin(), a.begin() + ptrdiff_t(n), b.begin()).first - a.begin());
}

// The entry's drafters are of the kinds (and order) the decoder runs.
bool drafters_match(const std::vector<std::unique_ptr<spec::Drafter>>& saved,
                    const std::vector<spec::DraftSource>& live) {
  if (saved.size() != live.size()) return false;
  for (size_t i = 0; i < saved.size(); ++i)
    if (saved[i]->source() != live[i]) return false;
  return true;
}

}  // namespace

StateCache::StateCache(uint64_t max_bytes, int window_rows, int prefill_rows)
    : max_bytes_(max_bytes),
      window_rows_(std::max(window_rows, 1)),
      prefill_rows_(window_rows_ % kPrefillAlignRows == 0
                        ? std::max(prefill_rows / window_rows_, 1) * window_rows_
                        : window_rows_) {
  stats_.max_bytes = max_bytes;
}

StateCache::~StateCache() = default;

int64_t StateCache::resume(Session& session, std::span<const int32_t> prompt,
                           spec::SpecDecoder* spec) {
  std::vector<spec::DraftSource> live;
  if (spec) live = spec->drafter_sources();
  const bool invariant = window_invariant(session);
  const bool may_truncate = invariant && !spec && session.can_truncate();
  EntryPtr best;
  size_t best_tokens = 0;
  {
    std::lock_guard lock(mutex_);
    auto best_it = lru_.end();
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      const Entry& entry = **it;
      if (spec && (!entry.has_drafters || !drafters_match(entry.drafters, live)))
        continue;
      const size_t common = common_prefix(entry.tokens(), prompt);
      size_t usable = 0;
      const size_t length = entry.tokens().size();
      if (common == length &&
          (invariant || length == prompt.size() || length % size_t(window_rows_) == 0))
        usable = common;  // a prefix of the prompt (or all of it): resume at its end
      else if (may_truncate)
        usable = std::min(common, prompt.size() - 1);  // leave a row to compute logits from
      if (usable > best_tokens) {
        best_tokens = usable;
        best_it = it;
      }
    }
    if (best_it != lru_.end()) {
      best = *best_it;
      lru_.splice(lru_.begin(), lru_, best_it);
      ++stats_.hits;
      stats_.cached_tokens += best_tokens;
    } else {
      ++stats_.misses;
    }
  }
  if (!best) {
    if (!session.tokens().empty()) {  // a fresh session stays as it is (reset rebuilds it)
      session.reset();
      if (spec) spec->reset();
    }
    return 0;
  }
  session.restore(best->session);
  if (best_tokens < best->tokens().size()) session.truncate(int64_t(best_tokens));
  if (spec) spec->restore_drafters(best->drafters);
  return int64_t(best_tokens);
}

void StateCache::save(const Session& session, const spec::SpecDecoder* spec) {
  if (!enabled() || session.tokens().empty()) return;
  auto entry = std::make_shared<Entry>();
  entry->session = session.snapshot();
  entry->bytes = sizeof(Entry) + entry->session.bytes();
  if (spec) {
    if (auto copies = spec->copy_drafters()) {
      entry->has_drafters = true;
      entry->drafters = std::move(*copies);
      for (const auto& d : entry->drafters) entry->bytes += d->state_bytes();
    }
  }
  if (entry->bytes > max_bytes_) return;
  std::lock_guard lock(mutex_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if ((*it)->tokens() == entry->tokens() && (*it)->has_drafters <= entry->has_drafters) {
      stats_.bytes -= (*it)->bytes;
      lru_.erase(it);
      break;
    }
  }
  evict_for(entry->bytes);
  stats_.bytes += entry->bytes;
  lru_.push_front(std::move(entry));
  stats_.entries = lru_.size();
}

void StateCache::evict_for(uint64_t bytes) {
  while (!lru_.empty() && stats_.bytes + bytes > max_bytes_) {
    stats_.bytes -= lru_.back()->bytes;
    lru_.pop_back();
    ++stats_.evictions;
  }
  stats_.entries = lru_.size();
}

size_t StateCache::turn_boundary(std::span<const int32_t> prompt,
                                 std::optional<int32_t> end_of_turn) {
  if (!end_of_turn) return 0;
  for (size_t i = prompt.size(); i-- > 0;)
    if (prompt[i] == *end_of_turn) return i + 1 < prompt.size() ? i + 1 : 0;
  return 0;
}

bool StateCache::window_invariant(const Session& session) {
  return !session.model().hparams().has_deltanet();
}

int64_t StateCache::prefill(Session& session, std::span<const int32_t> prompt,
                            std::optional<int32_t> end_of_turn, spec::SpecDecoder* spec,
                            const KeepGoingFn& keep_going, const AfterWindowFn& after_window) {
  int64_t cached = 0;
  if (enabled()) {
    cached = resume(session, prompt, spec);
  } else if (!session.tokens().empty()) {
    session.reset();
    if (spec) spec->reset();
  }
  // The in-prompt snapshot: window-exact models at the last window boundary before the end,
  // window-invariant ones after the last end-of-turn token.
  size_t pause = 0;
  if (enabled()) {
    const size_t w = size_t(window_rows_);
    pause = window_invariant(session) ? turn_boundary(prompt, end_of_turn)
                                      : (prompt.size() - 1) / w * w;
  }
  const size_t n = prompt.size();
  for (size_t at = size_t(cached); at < n;) {
    if (keep_going && !keep_going()) break;
    size_t rows = std::min(n - at, size_t(prefill_rows_));
    if (at < pause && at + rows > pause) rows = pause - at;
    const std::span<const int32_t> window = prompt.subspan(at, rows);
    if (spec)
      spec->prefill(window, prefill_rows_);
    else
      session.prefill(window, prefill_rows_);
    at += rows;
    if (at == pause) save(session, spec);
    if (after_window) after_window();
  }
  return cached;
}

void StateCache::save_generated(const Session& session, const spec::SpecDecoder* spec) {
  if (window_invariant(session)) save(session, spec);
}

StateCacheStats StateCache::stats() const {
  std::lock_guard lock(mutex_);
  StateCacheStats out = stats_;
  out.entries = lru_.size();
  return out;
}

void StateCache::clear() {
  std::lock_guard lock(mutex_);
  lru_.clear();
  stats_.bytes = 0;
  stats_.entries = 0;
}

}  // namespace strata
