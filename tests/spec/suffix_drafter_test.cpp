#include <gtest/gtest.h>

#include "spec/suffix_drafter.h"

namespace strata::spec {
namespace {

TEST(SuffixDrafter, ProposesWhatFollowedTheMostRecentLongestMatch) {
  SuffixDrafter drafter(4, 2);
  //                       0  1  2  3  4  5  6  7  8  9 10 11 12
  const std::vector<int32_t> seq = {5, 6, 7, 8, 1, 5, 6, 7, 9, 3, 4, 6, 7};
  // Suffix "6 7" occurs at 1 and 6 (and "4 6 7" nowhere earlier): most recent is 6 → 9 3 4 6.
  const Draft d = drafter.propose_from(seq, 4);
  EXPECT_EQ(d.source, DraftSource::Suffix);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{9, 3, 4, 6}));
  ASSERT_EQ(d.confidence.size(), 4u);
  // Two occurrences, one followed by 9: (1 + 1) / (2 + 2).
  EXPECT_FLOAT_EQ(d.confidence[0], 0.5f);
  // Then only the occurrence that agreed: (1 + 1) / (1 + 2).
  EXPECT_FLOAT_EQ(d.confidence[1], 2.0f / 3.0f);
}

TEST(SuffixDrafter, PrefersLongerMatches) {
  SuffixDrafter drafter(4, 2);
  const std::vector<int32_t> seq = {1, 2, 3, 10, 9, 2, 3, 11, 1, 2, 3};
  // "1 2 3" (at 0) beats the more recent "2 3" (at 5).
  EXPECT_EQ(drafter.propose_from(seq, 2).tokens, (std::vector<int32_t>{10, 9}));
}

TEST(SuffixDrafter, NothingWithoutAMatch) {
  SuffixDrafter drafter(4, 2);
  EXPECT_TRUE(drafter.propose_from(std::vector<int32_t>{1, 2, 3, 4, 5}, 3).tokens.empty());
  EXPECT_TRUE(drafter.propose_from(std::vector<int32_t>{7}, 3).tokens.empty());
  EXPECT_TRUE(drafter.propose_from(std::vector<int32_t>{1, 2, 1, 2}, 0).tokens.empty());
}

}  // namespace
}  // namespace strata::spec
