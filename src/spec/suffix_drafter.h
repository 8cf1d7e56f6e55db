// SuffixDrafter — prompt lookup over the session's own tokens.
//
// Finds the longest suffix of (tokens + next), from `max_ngram` down to `min_ngram` tokens, that
// also occurs earlier, takes its most recent occurrence and proposes the tokens that followed it.
// Confidence of draft j: among all earlier occurrences of the suffix that also agree with drafts
// 1..j-1, the share followed by draft j, smoothed as (agree + 1) / (seen + 2). Costs one scan of
// the history per call (O(n_tokens · max_ngram)); no model work. Not thread-safe.
// Allocation: propose_into (SpecDecoder's call) searches in member scratch sized once for the
// session's reserved tokens (Session::reserved_tokens) and drafts into the caller's reused Draft,
// so steady suffix speculative decoding allocates nothing (tests/engine/zero_alloc_test.cpp).
#pragma once

#include <span>
#include <vector>

#include "spec/drafter.h"

namespace strata::spec {

class SuffixDrafter final : public Drafter {
 public:
  explicit SuffixDrafter(int max_ngram = 4, int min_ngram = 2);
  DraftSource source() const override { return DraftSource::Suffix; }
  void on_commit(const Session&, int64_t) override {}
  Draft propose(const Session& session, int32_t next, int max_tokens,
                const KeepGoingFn& keep_going) override;
  void propose_into(const Session& session, int32_t next, int max_tokens,
                    const KeepGoingFn& keep_going, Draft& out) override;
  std::unique_ptr<Drafter> clone() const override {
    // No state but its settings: the copy starts with empty scratch (state_bytes() stays 0).
    return std::make_unique<SuffixDrafter>(max_ngram_, min_ngram_);
  }
  // The same over a plain token sequence (the last token plays `next`); for tests and tools.
  Draft propose_from(std::span<const int32_t> sequence, int max_tokens) const;

 private:
  // The search of the class comment over `seq` into `draft` (cleared first); `starts` and `still`
  // are the occurrence lists' scratch.
  void search(std::span<const int32_t> seq, int max_tokens, Draft& draft,
              std::vector<int64_t>& starts, std::vector<int64_t>& still) const;

  int max_ngram_, min_ngram_;
  std::vector<int32_t> scratch_;         // tokens + next
  std::vector<int64_t> starts_, still_;  // search()'s scratch for propose_into
};

}  // namespace strata::spec
