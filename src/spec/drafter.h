// Drafter — proposes tokens that may follow the sequence, for a speculative verify window.
//
// Contract
// - `propose(session, next, max_tokens, keep_going)` returns up to max_tokens draft tokens that
//   would follow session.tokens() + next (`next` is sampled but not yet fed to the trunk), each
//   with the drafter's own probability that it is right (`confidence`, in (0, 1]; SpecGate
//   calibrates it against measured acceptance). Drafts are deterministic (a point mass), so exact
//   rejection sampling treats q(draft) = 1.
// - `keep_going(drafts so far)` lets the caller stop a drafter whose every extra draft costs time
//   (the MTP head); free drafters may ignore it.
// - `on_commit(session, n_rows)`: the session has just committed n_rows new rows (a prefill
//   window, a plain step, or the kept rows of a verify window); their trunk residuals are the last
//   n_rows rows of session.state().residuals.
// - `clone()`: a deep copy of the drafter's state for the conversation state cache
//   (decode/state_cache.h), or nullptr for a drafter that cannot be copied (then sequences
//   decoded with it are not cached); `state_bytes()` what the copy holds.
// - Drafts never change tokens: the verify decides. Not thread-safe; one per sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/session.h"

namespace strata::spec {

enum class DraftSource : int { Mtp = 0, Suffix = 1 };
constexpr int kDraftSources = 2;
const char* draft_source_name(DraftSource source);

struct Draft {
  DraftSource source = DraftSource::Suffix;
  std::vector<int32_t> tokens;
  std::vector<float> confidence;  // [tokens.size()]
};

class Drafter {
 public:
  using KeepGoingFn = std::function<bool(const Draft& so_far)>;
  virtual ~Drafter() = default;
  virtual DraftSource source() const = 0;
  virtual void on_commit(const Session& session, int64_t n_rows) = 0;
  virtual Draft propose(const Session& session, int32_t next, int max_tokens,
                        const KeepGoingFn& keep_going) = 0;
  // propose into `out` (replacing what it held, its vectors reused). SpecDecoder calls this; a
  // drafter that overrides it can draft without allocating once warm (MtpDrafter). The default
  // calls propose.
  virtual void propose_into(const Session& session, int32_t next, int max_tokens,
                            const KeepGoingFn& keep_going, Draft& out) {
    out = propose(session, next, max_tokens, keep_going);
  }
  // Seconds one extra draft costs (0 for free drafters); SpecGate adds it to a window's cost.
  virtual double seconds_per_draft() const { return 0.0; }
  virtual std::unique_ptr<Drafter> clone() const { return nullptr; }
  virtual uint64_t state_bytes() const { return 0; }
};

}  // namespace strata::spec
