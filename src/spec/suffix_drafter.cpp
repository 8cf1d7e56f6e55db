#include "spec/suffix_drafter.h"

#include <algorithm>

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
                             const KeepGoingFn&) {
  scratch_.assign(session.tokens().begin(), session.tokens().end());
  scratch_.push_back(next);
  return propose_from(scratch_, max_tokens);
}

Draft SuffixDrafter::propose_from(std::span<const int32_t> seq, int max_tokens) const {
  Draft draft;
  draft.source = DraftSource::Suffix;
  const int64_t L = int64_t(seq.size());
  if (max_tokens <= 0) return draft;
  for (int n = std::min<int64_t>(max_ngram_, L - 1); n >= min_ngram_; --n) {
    const std::span<const int32_t> suffix = seq.subspan(size_t(L - n));
    // Every earlier occurrence (start i, i + n < L so something follows), most recent first.
    std::vector<int64_t> starts;
    for (int64_t i = L - n - 1; i >= 0; --i)
      if (std::equal(suffix.begin(), suffix.end(), seq.begin() + i)) starts.push_back(i);
    if (starts.empty()) continue;
    const int64_t best = starts.front() + n;  // the continuation of the most recent occurrence
    for (int64_t j = 0; j < max_tokens && best + j < L; ++j) {
      const int32_t token = seq[size_t(best + j)];
      int seen = 0, agree = 0;
      std::vector<int64_t> still;  // occurrences agreeing with drafts 1..j
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
      starts = std::move(still);
    }
    break;
  }
  return draft;
}

}  // namespace strata::spec
