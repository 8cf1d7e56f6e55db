// The low-bit IQ tables included from ggml: structural invariants and pinned checksums that catch
// transcription damage (a dropped, duplicated or mistyped entry).
//
// The checksums are FNV-1a 64 over each table's little-endian bytes, computed once (by a separate
// script over the transcription, which was also checked against ggml's quantizer tables
// kgrid_2bit_256 for IQ2_XXS) and pinned here.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>

#include "quant/iq_lowbit_tables.h"

namespace strata::quant {
namespace {

template <typename T, int N>
uint64_t fnv1a(const T (&table)[N]) {
  uint64_t hash = 0xcbf29ce484222325u;
  for (int i = 0; i < N; ++i) {
    for (size_t byte = 0; byte < sizeof(T); ++byte) {
      hash ^= static_cast<uint8_t>(static_cast<uint64_t>(table[i]) >> (8 * byte));
      hash *= 0x100000001b3u;
    }
  }
  return hash;
}

template <typename T, int N>
std::set<int> byte_values(const T (&table)[N]) {
  std::set<int> values;
  for (int i = 0; i < N; ++i) {
    for (size_t byte = 0; byte < sizeof(T); ++byte) {
      values.insert(static_cast<uint8_t>(static_cast<uint64_t>(table[i]) >> (8 * byte)));
    }
  }
  return values;
}

template <typename T, int N>
void expect_strictly_ascending(const T (&table)[N], const char* name) {
  for (int i = 1; i < N; ++i) EXPECT_LT(table[i - 1], table[i]) << name << " entry " << i;
}

TEST(IqLowbitTables, ChecksumsArePinned) {
  EXPECT_EQ(fnv1a(kIq2xxsGrid), 0xbb4ee025b5ac6e8eu);
  EXPECT_EQ(fnv1a(kIq2sGrid), 0x123edd38a3b62b90u);
  EXPECT_EQ(fnv1a(kIq3xxsGrid), 0xdfa5dc83d6a155d5u);
  EXPECT_EQ(fnv1a(kIq3sGrid), 0xfa37020c25b44829u);
  EXPECT_EQ(fnv1a(kIq1sGrid), 0x6703ed863501ae2eu);
}

TEST(IqLowbitTables, GridBytesAreLatticeLevels) {
  EXPECT_EQ(byte_values(kIq2xxsGrid), (std::set<int>{8, 25, 43}));
  EXPECT_EQ(byte_values(kIq2sGrid), (std::set<int>{8, 25, 43}));
  EXPECT_EQ(byte_values(kIq3xxsGrid), (std::set<int>{4, 12, 20, 28, 36, 44, 52, 62}));
  EXPECT_EQ(byte_values(kIq3sGrid), (std::set<int>{1, 3, 5, 7, 9, 11, 13, 15}));
  EXPECT_EQ(byte_values(kIq1sGrid), (std::set<int>{0x00, 0x01, 0xff}));  // 0, +1, −1
}

TEST(IqLowbitTables, GridsAreStrictlyAscending) {
  // ggml lists the kept lattice points in ascending order (strict: no duplicates).
  expect_strictly_ascending(kIq2xxsGrid, "iq2xxs");
  expect_strictly_ascending(kIq2sGrid, "iq2s");
  expect_strictly_ascending(kIq3xxsGrid, "iq3xxs");
  expect_strictly_ascending(kIq3sGrid, "iq3s");
  EXPECT_EQ(kIq2xxsGrid[0], 0x0808080808080808u);
  EXPECT_EQ(kIq2xxsGrid[255], 0x2b2b2b1908081908u);
  EXPECT_EQ(kIq2sGrid[1023], 0x2b2b2b2b2b2b2b2bu);
  EXPECT_EQ(kIq3xxsGrid[255], 0x3e341c04u);
  EXPECT_EQ(kIq3sGrid[511], 0x0f0f0101u);
}

// iq1s_grid is ordered as base-3 numbers, element 7 most significant, digits −1 < 0 < +1 (as
// unsigned u64 it is not ordered, since −1 is 0xff).
TEST(IqLowbitTables, Iq1sGridIsAscendingInBase3) {
  auto base3 = [](uint64_t entry) {
    int64_t key = 0;
    for (int j = 7; j >= 0; --j) key = key * 3 + (static_cast<int8_t>(entry >> (8 * j)) + 1);
    return key;
  };
  for (int i = 1; i < kIq1sGridSize; ++i) {
    EXPECT_LT(base3(kIq1sGrid[i - 1]), base3(kIq1sGrid[i])) << "entry " << i;
  }
  EXPECT_EQ(kIq1sGrid[0], 0xffffffffffffffffu);
  EXPECT_EQ(kIq1sGrid[2047], 0x0101010101010101u);
}

// ggml's GPU copy of iq1s_grid (iq1s_grid_gpu, u32) packs element j as value + 1 (0..2) in bits
// 8·(j%4) + 4·(j/4). Its first entries, transcribed separately, must match the CPU table.
TEST(IqLowbitTables, Iq1sGridMatchesGgmlGpuCopy) {
  static const uint32_t kGpuHead[] = {
      0x00000000, 0x00000002, 0x00000101, 0x00000200, 0x00000202, 0x00010001, 0x00010101,
      0x00020000, 0x00020002, 0x00020200, 0x00020202, 0x01000101, 0x01010001, 0x01010100,
      0x01010102, 0x01020101, 0x02000000, 0x02000002, 0x02000200, 0x02000202, 0x02010101,
      0x02020000, 0x02020002, 0x02020200, 0x02020202, 0x00000110, 0x00000111, 0x00010011,
      0x00010110, 0x00010112, 0x00010211, 0x00010212, 0x00020111, 0x01000011, 0x01000112,
      0x01000211, 0x01010012, 0x01010111, 0x01010212, 0x01020011, 0x01020110, 0x01020112,
      0x01020210, 0x02000111, 0x02010011, 0x02010110, 0x02010112, 0x02020111, 0x00000020,
      0x00000022, 0x00000220, 0x00000222, 0x00010121, 0x00020020, 0x00020022, 0x00020220,
      0x00020222, 0x01000121, 0x01010021, 0x01010221, 0x01020120, 0x01020221, 0x02000020,
      0x02000022, 0x02000220, 0x02000222, 0x02010021, 0x02010121, 0x02010221, 0x02020020,
      0x02020022, 0x02020220, 0x02020222, 0x00011001, 0x00011100, 0x00011102, 0x00021101,
      0x01001001, 0x01001201, 0x01011101, 0x01011202, 0x01021100, 0x01021101, 0x02011001,
      0x02011201, 0x02021101, 0x00001011, 0x00001110, 0x00001111, 0x00001112, 0x00011111,
      0x00011210, 0x00011212, 0x00021211, 0x01001010, 0x01001111, 0x01001212, 0x01011010,
      0x01011011, 0x01011110, 0x01011111, 0x01011112, 0x01011211, 0x01021010, 0x01021012,
      0x01021111, 0x01021210, 0x01021212, 0x02001011, 0x02011011, 0x02011111, 0x02011210,
      0x02011212, 0x02021011, 0x02021110, 0x02021111, 0x02021112, 0x02021211, 0x00011120,
      0x00011221, 0x01001021, 0x01001120, 0x01011020, 0x01011022, 0x01011121, 0x01011220,
      0x01021020, 0x01021021, 0x01021122, 0x01021221, 0x02001121, 0x02011021, 0x02011120,
      0x02011221, 0x00002000, 0x00002002, 0x00002200, 0x00002202, 0x00012101, 0x00022000,
      0x00022002, 0x00022200, 0x00022202, 0x01002101, 0x01012001, 0x01012102, 0x01022101,
      0x02002000, 0x02002002, 0x02002200, 0x02002202, 0x02012101,
  };
  for (size_t i = 0; i < std::size(kGpuHead); ++i) {
    uint32_t packed = 0;
    for (int j = 0; j < 8; ++j) {
      const int value = static_cast<int8_t>(kIq1sGrid[i] >> (8 * j)) + 1;
      packed |= uint32_t(value) << (8 * (j % 4) + 4 * (j / 4));
    }
    EXPECT_EQ(packed, kGpuHead[i]) << "entry " << i;
  }
}

}  // namespace
}  // namespace strata::quant
