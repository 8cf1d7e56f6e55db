#include "spec/suffix_drafter.h"

#include <algorithm>
#include <utility>

#include "util/error.h"

namespace strata::spec {

const char* draft_source_name(DraftSource source) {
  return source == DraftSource::Mtp ? "mtp" : "suffix";
}

SuffixDrafter::SuffixDrafter(int max_ngram, int min_ngram)
    : max_ngram_(max_ngram), min_ngram_(min_ngram) {
  if (min_ngram < 1 || max_ngram < min_ngram)
    fail("suffix drafter: n-gram range must satisfy 1 <= min <= max, got {}..{}", min_ngram,
         max_ngram);
}

Draft SuffixDrafter::propose(const Session& session, int32_t next, int max_tokens,
                             const KeepGoingFn& keep_going) {
  Draft draft;
  propose_into(session, next, max_tokens, keep_going, draft);
  return draft;
}

void SuffixDrafter::propose_into(const Session& session, int32_t next, int max_tokens,
                                 const KeepGoingFn&, Draft& out) {
  // Sized for the session's whole reservation once, so that a growing history never reallocates
  // (assign() would reallocate to the exact size every time the history outgrew the last one).
  const size_t capacity =
      size_t(std::max<int64_t>(session.reserved_tokens(), int64_t(session.tokens().size()))) + 1;
  scratch_.reserve(capacity);
  starts_.reserve(capacity);
  still_.reserve(capacity);
  out.tokens.reserve(size_t(std::max(max_tokens, 0)));
  out.confidence.reserve(size_t(std::max(max_tokens, 0)));
  scratch_.assign(session.tokens().begin(), session.tokens().end());
  scratch_.push_back(next);
  search(scratch_, max_tokens, out, starts_, still_);
}

Draft SuffixDrafter::propose_from(std::span<const int32_t> seq, int max_tokens) const {
  Draft draft;
  std::vector<int64_t> starts, still;
  search(seq, max_tokens, draft, starts, still);
  return draft;
}

void SuffixDrafter::search(std::span<const int32_t> seq, int max_tokens, Draft& draft,
                           std::vector<int64_t>& starts, std::vector<int64_t>& still) const {
  draft.source = DraftSource::Suffix;
  draft.tokens.clear();
  draft.confidence.clear();
  const int64_t L = int64_t(seq.size());
  if (max_tokens <= 0) return;
  for (int n = int(std::min<int64_t>(max_ngram_, L - 1)); n >= min_ngram_; --n) {
    const std::span<const int32_t> suffix = seq.subspan(size_t(L - n));
    // Every earlier occurrence (start i, i + n < L so something follows), most recent first.
    starts.clear();
    for (int64_t i = L - n - 1; i >= 0; --i)
      if (std::equal(suffix.begin(), suffix.end(), seq.begin() + i)) starts.push_back(i);
    if (starts.empty()) continue;
    const int64_t best = starts.front() + n;  // the continuation of the most recent occurrence
    for (int64_t j = 0; j < max_tokens && best + j < L; ++j) {
      const int32_t token = seq[size_t(best + j)];
      int seen = 0, agree = 0;
      still.clear();  // occurrences agreeing with drafts 1..j
      for (int64_t s : starts) {
        const int64_t at = s + n + j;
        if (at >= L) continue;
        ++seen;
        if (seq[size_t(at)] == token) {
          ++agree;
          still.push_back(s);
        }
      }
      draft.tokens.push_back(token);
      draft.confidence.push_back(float(agree + 1) / float(seen + 2));
      std::swap(starts, still);
    }
    break;
  }
}

}  // namespace strata::spec
