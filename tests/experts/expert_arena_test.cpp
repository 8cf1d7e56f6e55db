// ExpertArena: its background pre-fault (MADV_POPULATE_WRITE) must never change bytes already
// written into a slot, and the arena must stop and join the thread when destroyed mid-way.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "experts/expert_arena.h"

namespace strata {
namespace {

TEST(ExpertArena, BackgroundPrefaultNeverChangesWrittenBytes) {
  const std::vector<uint64_t> slot_bytes = {uint64_t{1} << 20, 0, uint64_t{1} << 20};
  for (int round = 0; round < 3; ++round) {
    ExpertArena arena(slot_bytes, 96, 4);  // ~196 MiB: several pre-fault chunks
    // Written while the pre-fault thread may be populating the same pages.
    for (uint32_t s = 0; s < 96; s += 7) std::memset(arena.slot(2, s), 0x5a + int(s), 1 << 20);
    std::memset(arena.transient(3), 0x33, 1 << 20);
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * round));
    for (uint32_t s = 0; s < 96; s += 7) {
      const uint8_t* p = arena.slot(2, s);
      ASSERT_EQ(p[0], uint8_t(0x5a + s));
      ASSERT_EQ(p[(1 << 20) - 1], uint8_t(0x5a + s));
      ASSERT_EQ(p[12345], uint8_t(0x5a + s));
    }
    EXPECT_EQ(arena.transient(3)[777], 0x33);
    EXPECT_EQ(arena.slot(0, 5)[100], 0);  // untouched memory reads as zero
  }  // destroyed while the thread may still run: it stops and joins before the unmap
}

}  // namespace
}  // namespace strata
