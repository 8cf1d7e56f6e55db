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
// Why snapshots, and where: a recurrent state (DeltaNet, conv, PLE history) cannot be rewound,
// so a hybrid model can only resume where a snapshot was taken; and the tokens must be the same
// as without the cache, bit for bit. Prefill windows of 32 rows or more run Gated DeltaNet in its
// chunked form, whose rounding depends on where the window starts (engine/session.h), so a state
// is only exact if every row of it went through the windows a full re-prefill would use: windows
// of `window_rows` starting at position 0. When window_rows is a multiple of 64, windows of any
// multiple of it give the same bits on the CPU (engine/prefill_window.h), so `prefill` runs
// windows of up to `prefill_rows` that start and end at multiples of window_rows (but for the
// prompt's end). Hence two policies (`prefill` applies them):
// - Window-exact models (any Gated DeltaNet layer: qwen4exp, qwen3next): snapshots only at
//   multiples of window_rows inside a prompt's prefill (the last one before its end: the turn
//   boundary rounded down to a window), plus the whole prompt after its prefill (reused only by
//   a prompt equal to it, whose logits it holds). A follow-up turn resumes at the previous
//   prompt's last window boundary and re-prefills less than one window of it, the reply and the
//   new message: constant work per turn instead of the whole history. After-generation states
//   are not kept (decoded rows went through 1-row windows, which a re-prefill would not use).
// - Window-invariant models (no DeltaNet: qwen3moe; every window gives the same bits): a snapshot
//   at the last end-of-turn token inside the prompt (`turn_boundary`), after the prefill and
//   after the generation (`save_generated`); a follow-up turn usually extends the last one. They
//   can also truncate: `resume` takes the entry with the longest common prefix and cuts its KV
//   caches there (the KV rows of a position do not depend on later ones). Not with speculative
//   decoding (the MTP drafter's state is not rewound).
// Either way a prompt that diverges falls back to the longest snapshot that still prefixes it.
//
// Bound: the sum of entries' bytes (SessionSnapshot::bytes + drafter state bytes: the buffers
// they hold) never exceeds `max_bytes`; inserting evicts the least recently used entries (a
// resume counts as a use). An entry larger than the bound is not kept. max_bytes 0 disables
// the cache (save keeps nothing, resume finds nothing).
//
// Thread safety: every method may be called from any thread. A mutex guards the entry list;
// entries are immutable once inserted and shared (shared_ptr), so the copy into a session runs
// outside the lock and an eviction meanwhile cannot free what is being copied.
//
// In decode/ with the generation loop, above spec/: an entry copies the SpecDecoder's drafters.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "engine/prefill_window.h"
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

  // window_rows: the unit where snapshots may be taken and resumed from (serve and chat: 64,
  // engine/prefill_window.h kPrefillAlignRows). prefill_rows: the longest window `prefill` runs,
  // rounded down to a multiple of window_rows (at least window_rows); window_rows itself unless
  // window_rows is a multiple of kPrefillAlignRows (only then does a window of several units
  // give the bits of its units one by one).
  explicit StateCache(uint64_t max_bytes, int window_rows = kPrefillAlignRows,
                      int prefill_rows = kPrefillAlignRows);
  ~StateCache();
  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;

  bool enabled() const { return max_bytes_ > 0; }
  int window_rows() const { return window_rows_; }
  int prefill_rows() const { return prefill_rows_; }
  // Whether `session`'s model gives the same bits whatever the windows (no Gated DeltaNet layer).
  static bool window_invariant(const Session& session);

  // The whole prompt step of a request: resume (below), then prefill the rest (through `spec`
  // when given) in windows of up to prefill_rows, cut where the policy's in-prompt snapshot is
  // saved (for a 1000-token prompt on a window-exact model: [0, 512), [512, 960), the snapshot
  // at 960, [960, 1000)).
  // `keep_going` is asked before each window (false: stop, e.g. a cancelled request; the prompt
  // is then left partly fed and nothing more is saved); `after_window` after each. Returns the
  // number of tokens resumed from the cache. Disabled: a plain prefill from a reset session.
  using KeepGoingFn = std::function<bool()>;
  using AfterWindowFn = std::function<void()>;
  int64_t prefill(Session& session, std::span<const int32_t> prompt,
                  std::optional<int32_t> end_of_turn, spec::SpecDecoder* spec = nullptr,
                  const KeepGoingFn& keep_going = nullptr,
                  const AfterWindowFn& after_window = nullptr);
  // After the generation: keeps the sequence where the policy allows (window-invariant models).
  void save_generated(const Session& session, const spec::SpecDecoder* spec = nullptr);

  // Puts `session` in the state of the best entry for `prompt` and returns how many of the
  // prompt's tokens it already holds (the caller feeds prompt[result:]). The best entry is the
  // longest one whose tokens are a prefix of the prompt and, for a window-exact model, whose
  // length is a multiple of window_rows (or the whole prompt: then the session's logits are the
  // last prompt row's and nothing needs feeding); for a session that
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

  // The index just after the last `end_of_turn` token of the prompt (0 when there is none, or
  // when it is the prompt's last token): where a caller splits the prefill to save a snapshot.
  static size_t turn_boundary(std::span<const int32_t> prompt, std::optional<int32_t> end_of_turn);

  StateCacheStats stats() const;
  void clear();

 private:
  struct Entry;
  using EntryPtr = std::shared_ptr<const Entry>;
  void evict_for(uint64_t bytes);  // REQUIRES: mutex_ held

  const uint64_t max_bytes_;
  const int window_rows_;
  const int prefill_rows_;
  mutable std::mutex mutex_;  // guards everything below
  std::list<EntryPtr> lru_;   // most recently used first
  StateCacheStats stats_;
};

}  // namespace strata
