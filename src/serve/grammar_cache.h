// GrammarCache — compiled grammars by the text they were compiled from, so a schema sent again is
// not compiled again: a response_format's JSON text, or a request's tools with the tool_choice
// and parallel_tool_calls they were compiled for (serve/response_format.h,
// serve/tool_call_grammar.h). A bounded LRU of immutable grammars (shared_ptr<const Grammar>:
// an evicted one lives on in the requests that hold it).
//
// The key is the exact text (a schema with its keys in another order is another key: property
// order is part of what the grammar generates). Compile errors are not cached (the request gets
// its 400 each time). Two requests that miss on the same key at once may both compile; the
// first to finish is kept and the other's result is used by its own request only.
//
// Thread safety: every method from any thread (the HTTP threads parse and plan concurrently);
// `compile` runs outside the lock.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>

#include "grammar/grammar.h"
#include "serve/api_error.h"
#include "util/function_ref.h"

namespace strata::serve {

using GrammarResult = std::variant<std::shared_ptr<const grammar::Grammar>, ApiError>;

class GrammarCache {
 public:
  // 64 entries: a server's clients send a handful of schemas and tool sets again and again; a
  // grammar is a few KiB to a few hundred KiB (its elements), so 64 stay small.
  static constexpr size_t kDefaultMaxEntries = 64;
  explicit GrammarCache(size_t max_entries = kDefaultMaxEntries);

  // The grammar cached under `key`, or what `compile` gives (kept when it is a grammar).
  GrammarResult get_or_compile(const std::string& key, FunctionRef<GrammarResult()> compile);

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;  // compiles
    uint64_t evictions = 0;
    size_t entries = 0;
    size_t max_entries = 0;
  };
  Stats stats() const;

 private:
  using Order = std::list<std::string>;  // keys, most recently used first
  struct Entry {
    std::shared_ptr<const grammar::Grammar> grammar;
    Order::iterator position;
  };
  const size_t max_entries_;
  mutable std::mutex mutex_;  // guards everything below
  Order order_;
  std::unordered_map<std::string, Entry> entries_;
  Stats stats_;
};

// `cache` may be null (no caching): then `compile` runs.
inline GrammarResult cached_grammar(GrammarCache* cache, const std::string& key,
                                    FunctionRef<GrammarResult()> compile) {
  return cache ? cache->get_or_compile(key, compile) : compile();
}

}  // namespace strata::serve
