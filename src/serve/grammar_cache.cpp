#include "serve/grammar_cache.h"

#include "util/error.h"

namespace strata::serve {

GrammarCache::GrammarCache(size_t max_entries) : max_entries_(max_entries) {
  if (max_entries < 1) fail("grammar cache: expected at least 1 entry, found {}", max_entries);
  stats_.max_entries = max_entries;
}

GrammarResult GrammarCache::get_or_compile(const std::string& key,
                                           FunctionRef<GrammarResult()> compile) {
  {
    std::lock_guard lock(mutex_);
    if (const auto found = entries_.find(key); found != entries_.end()) {
      order_.splice(order_.begin(), order_, found->second.position);
      ++stats_.hits;
      return found->second.grammar;
    }
    ++stats_.misses;
  }
  GrammarResult result = compile();
  const auto* grammar = std::get_if<std::shared_ptr<const grammar::Grammar>>(&result);
  if (!grammar) return result;
  std::lock_guard lock(mutex_);
  if (entries_.count(key)) return result;  // another request compiled it meanwhile
  order_.push_front(key);
  entries_.emplace(key, Entry{*grammar, order_.begin()});
  while (entries_.size() > max_entries_) {
    entries_.erase(order_.back());
    order_.pop_back();
    ++stats_.evictions;
  }
  stats_.entries = entries_.size();
  return result;
}

GrammarCache::Stats GrammarCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace strata::serve
