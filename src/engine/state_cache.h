// StateCache — the conversation state cache: finished sequences kept in RAM so that a new prompt
// continues from the longest cached prefix instead of re-prefilling the whole history.
//
// What an entry is: a token sequence and a deep copy of a Session at exactly that point
// (engine/session.h SessionSnapshot: n_past, every KV cache, Gated DeltaNet conv + recurrent
// states, PLE n-gram context and conv history, the MTP input residuals and the MTP head cache in
// ModelState, the tokens and the last row's logits), plus, when the sequence was decoded
// speculatively, copies of the SpecDecoder's drafters (the MTP drafter's own head cache and
// pending rows). The copy is model/model.h:copy_sequence_state, which names every field and
// says why the rest (backend, scratch, speculative window logs) is not copied.
//
// Why snapshots: a recurrent state (DeltaNet, conv, PLE history) cannot be rewound, so a hybrid
// model can only resume at a point where a snapshot was taken. Callers save at turn boundaries:
// after the prompt's prefill and after the generation ends. A follow-up turn usually extends the
// after-generation snapshot; a prompt that diverges inside the last reply (a regenerated answer,
// a template that drops the reply's <think> part) falls back to the after-prefill one, and so on.
// Pure-attention models (no DeltaNet layer, no PLE: qwen3moe) can also truncate: `resume` then
// takes the entry with the longest common prefix and cuts its KV caches there (exact: the KV
// rows of a position do not depend on later ones). Not with speculative decoding (the MTP
// drafter's state is not rewound); snapshots alone suffice there.
//
// Exactness: resuming gives the state a session would have after feeding the entry's tokens in
// the same windows. Prefilling the rest then gives bitwise the logits of a full re-prefill for
// attention-only models and whenever the windows stay under 32 rows; longer prefill windows run
// Gated DeltaNet in its chunked form, which is equal up to fp32 rounding (engine/session.h), so
// hybrid models' tokens agree except at near-ties (tests/engine/state_cache_test.cpp).
//
// Bound: the sum of entries' bytes (SessionSnapshot::bytes + drafter state bytes: the buffers
// they hold) never exceeds `max_bytes`; inserting evicts the least recently used entries (a
// resume counts as a use). An entry larger than the bound is not kept. max_bytes 0 disables
// the cache (save keeps nothing, resume finds nothing).
//
// Thread safety: every method may be called from any thread. A mutex guards the entry list;
// entries are immutable once inserted and shared (shared_ptr), so the copy into a session runs
// outside the lock and an eviction meanwhile cannot free what is being copied.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/session.h"

namespace strata::spec {
class SpecDecoder;
class Drafter;
}  // namespace strata::spec

namespace strata {

struct StateCacheStats {
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t max_bytes = 0;
  uint64_t hits = 0;       // resumes that reused at least one token
  uint64_t misses = 0;     // resumes that found nothing
  uint64_t evictions = 0;  // entries dropped for room
  uint64_t cached_tokens = 0;  // tokens reused over all resumes
};

class StateCache {
 public:
  // The default bound of `strata serve` and `strata chat` (--cache-ram).
  static constexpr uint64_t kDefaultMaxBytes = uint64_t(4) << 30;

  explicit StateCache(uint64_t max_bytes);
  ~StateCache();
  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;

  bool enabled() const { return max_bytes_ > 0; }

  // Puts `session` in the state of the best entry for `prompt` and returns how many of the
  // prompt's tokens it already holds (the caller feeds prompt[result:]). The best entry is the
  // longest one whose tokens are a prefix of the prompt (it may be the whole prompt: then the
  // session's logits are the last prompt row's and nothing needs feeding); for a session that
  // can_truncate (and no `spec`), any entry sharing a longer common prefix, cut to it and to at
  // most prompt.size() - 1 tokens. With `spec`, only entries saved with drafter copies of the
  // same kinds qualify, and the decoder's drafters are restored too. Returns 0 and resets the
  // session (and the decoder) when nothing qualifies.
  // REQUIRES: session (and spec's session) is this model's; no verify window pending.
  int64_t resume(Session& session, std::span<const int32_t> prompt,
                 spec::SpecDecoder* spec = nullptr);

  // Keeps a copy of `session` (and of spec's drafters, when given and copyable) keyed by its
  // tokens; an entry with the same tokens is replaced. Does nothing for an empty session, when
  // disabled, or when the copy would exceed the bound on its own.
  void save(const Session& session, const spec::SpecDecoder* spec = nullptr);

  StateCacheStats stats() const;
  void clear();

 private:
  struct Entry;
  using EntryPtr = std::shared_ptr<const Entry>;
  void evict_for(uint64_t bytes);  // REQUIRES: mutex_ held

  const uint64_t max_bytes_;
  mutable std::mutex mutex_;  // guards everything below
  std::list<EntryPtr> lru_;   // most recently used first
  StateCacheStats stats_;
};

}  // namespace strata
