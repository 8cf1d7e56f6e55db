#include "engine/state_cache.h"

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

StateCache::StateCache(uint64_t max_bytes) : max_bytes_(max_bytes) {
  stats_.max_bytes = max_bytes;
}

StateCache::~StateCache() = default;

int64_t StateCache::resume(Session& session, std::span<const int32_t> prompt,
                           spec::SpecDecoder* spec) {
  std::vector<spec::DraftSource> live;
  if (spec) live = spec->drafter_sources();
  const bool may_truncate = !spec && session.can_truncate();
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
      if (common == entry.tokens().size())
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
    session.reset();
    if (spec) spec->reset();
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
