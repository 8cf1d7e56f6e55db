// The IQ2_XS tables copied from ggml: structural invariants that catch transcription damage.
#include <gtest/gtest.h>

#include <bit>
#include <set>

#include "quant/iq2xs_tables.h"

namespace strata::quant {
namespace {

TEST(Iq2xsTables, GridBytesAreLatticeLevels) {
  for (int i = 0; i < kIq2xsGridSize; ++i) {
    for (int j = 0; j < 8; ++j) {
      const auto byte = static_cast<uint8_t>(kIq2xsGrid[i] >> (8 * j));
      EXPECT_TRUE(byte == 8 || byte == 25 || byte == 43) << "entry " << i << " byte " << j;
    }
  }
}

TEST(Iq2xsTables, GridIsStrictlyAscending) {
  // ggml lists the 512 kept lattice points in ascending order, so a dropped, duplicated or
  // mistyped entry almost always breaks the order.
  for (int i = 1; i < kIq2xsGridSize; ++i) {
    EXPECT_LT(kIq2xsGrid[i - 1], kIq2xsGrid[i]) << "entry " << i;
  }
  EXPECT_EQ(kIq2xsGrid[0], 0x0808080808080808u);
  EXPECT_EQ(kIq2xsGrid[1], 0x080808080808082bu);
  EXPECT_EQ(kIq2xsGrid[511], 0x2b2b2b2b2b2b2b2bu);
}

TEST(Iq2xsTables, SignsFollowParityRule) {
  for (int s = 0; s < kIq2xsSignsSize; ++s) {
    const int expected = s | ((std::popcount(static_cast<unsigned>(s)) & 1) << 7);
    EXPECT_EQ(kIq2xsSigns[s], expected) << "entry " << s;
    EXPECT_EQ(std::popcount(static_cast<unsigned>(kIq2xsSigns[s])) % 2, 0);
  }
}

}  // namespace
}  // namespace strata::quant
