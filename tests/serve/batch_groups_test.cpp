// --batch-groups (serve/batch_groups.h): the auto rule on its edges (one thread, few slots, four
// rows a group, weights just below and above the last-level cache, an unknown cache, power-of-two
// and other thread counts), the sysfs reader on fixture trees, and the option's parser.
#include "serve/batch_groups.h"

#include <gtest/gtest.h>

#include <fstream>

#include "../common/temp_dir.h"
#include "util/error.h"

namespace strata::serve {
namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;
constexpr uint64_t kLlc = 300 * kMiB;  // the 16-core box the rule was measured on

TEST(ServeBatchGroups, SixteenThreadsOnACacheResidentModelGiveFourGroups) {
  // The default model (27 MB) on the 16-core box: 5.9× one stream with 4 groups, 5.4× with 8,
  // 2.4× with 1 (16 streams, --parallel 16).
  EXPECT_EQ(auto_batch_groups(16, 16, 27'455'392, kLlc), 4);
}

TEST(ServeBatchGroups, TwoThreadsOnACacheResidentModelGiveTwoGroups) {
  // On 2 cores 2 groups (one thread, 8 rows each) beat 1 by 1.23-1.32× (16 streams).
  EXPECT_EQ(auto_batch_groups(2, 16, 27'455'392, kLlc), 2);
  EXPECT_EQ(auto_batch_groups(2, 8, kMiB, kLlc), 2);
  EXPECT_EQ(auto_batch_groups(2, 7, kMiB, kLlc), 1);  // 7 / 4 rows → 1 group
}

TEST(ServeBatchGroups, GroupsKeepFourRowsEach) {
  EXPECT_EQ(auto_batch_groups(16, 32, kMiB, kLlc), 8);
  EXPECT_EQ(auto_batch_groups(16, 64, kMiB, kLlc), 16);
  EXPECT_EQ(auto_batch_groups(16, 256, kMiB, kLlc), 16);  // and one thread each at least
  EXPECT_EQ(auto_batch_groups(64, 256, kMiB, kLlc), 64);
  EXPECT_EQ(auto_batch_groups(16, 8, kMiB, kLlc), 2);
  EXPECT_EQ(auto_batch_groups(16, 4, kMiB, kLlc), 1);
}

TEST(ServeBatchGroups, ThreadCountsThatAreNoPowerOfTwoRoundDown) {
  EXPECT_EQ(auto_batch_groups(12, 64, kMiB, kLlc), 8);  // min(12, 16) = 12 → 8
  EXPECT_EQ(auto_batch_groups(6, 64, kMiB, kLlc), 4);   // 6 → 4
  EXPECT_EQ(auto_batch_groups(3, 64, kMiB, kLlc), 2);   // 3 → 2
  EXPECT_EQ(auto_batch_groups(16, 24, kMiB, kLlc), 4);  // 24 / 4 = 6 → 4
}

TEST(ServeBatchGroups, OneThreadGivesOneGroup) {
  EXPECT_EQ(auto_batch_groups(1, 16, kMiB, kLlc), 1);
  EXPECT_EQ(auto_batch_groups(0, 16, kMiB, kLlc), 1);  // below 1 counts as 1
}

TEST(ServeBatchGroups, GroupsNeverExceedTheSlots) {
  EXPECT_EQ(auto_batch_groups(16, 1, kMiB, kLlc), 1);
  EXPECT_EQ(auto_batch_groups(16, 2, kMiB, kLlc), 1);
  EXPECT_EQ(auto_batch_groups(16, 3, kMiB, kLlc), 1);
  EXPECT_EQ(auto_batch_groups(16, 0, kMiB, kLlc), 1);
}

TEST(ServeBatchGroups, WeightsAboveTheCacheGiveOneGroup) {
  EXPECT_EQ(auto_batch_groups(16, 16, kLlc, kLlc), 4);  // equal: still resident
  EXPECT_EQ(auto_batch_groups(16, 16, kLlc - 1, kLlc), 4);
  EXPECT_EQ(auto_batch_groups(16, 16, kLlc + 1, kLlc), 1);
  // The 11 GiB mid model: 2.7× with 1 group, 2.6× with 8.
  EXPECT_EQ(auto_batch_groups(16, 16, 11 * 1024 * kMiB, kLlc), 1);
}

TEST(ServeBatchGroups, AnUnknownCacheCountsAsSmall) {
  EXPECT_FALSE(weights_fit_cache(1, 0));
  EXPECT_FALSE(weights_fit_cache(0, 0));
  EXPECT_EQ(auto_batch_groups(16, 16, kMiB, 0), 1);
  EXPECT_EQ(auto_batch_groups(16, 16, 0, 0), 1);
}

TEST(ServeBatchGroups, ChoiceKeepsAGivenNumberAndSaysWhyForAuto) {
  BatchGroupsInputs inputs{16, 16, 27'455'392, kLlc, false};
  EXPECT_EQ(choose_batch_groups(3, inputs).groups, 3);
  EXPECT_EQ(choose_batch_groups(3, inputs).reason, "given");

  BatchGroupsChoice fits = choose_batch_groups(std::nullopt, inputs);
  EXPECT_EQ(fits.groups, 4);
  EXPECT_NE(fits.reason.find("auto: model 26.2 MiB fits in the 300 MiB last-level cache"),
            std::string::npos)
      << fits.reason;
  EXPECT_NE(fits.reason.find("--parallel 16 rows, 4 a group at least, on 16 threads"),
            std::string::npos)
      << fits.reason;

  inputs.model_file_bytes = kLlc + 1;
  const BatchGroupsChoice exceeds = choose_batch_groups(std::nullopt, inputs);
  EXPECT_EQ(exceeds.groups, 1);
  EXPECT_NE(exceeds.reason.find("exceeds"), std::string::npos) << exceeds.reason;
  EXPECT_NE(exceeds.reason.find("weight reads"), std::string::npos) << exceeds.reason;

  inputs.model_file_bytes = kMiB;
  inputs.expert_store = true;  // groups are refused with a store: auto must not pick them
  EXPECT_EQ(choose_batch_groups(std::nullopt, inputs).groups, 1);
  EXPECT_NE(choose_batch_groups(std::nullopt, inputs).reason.find("RAM-budget store"),
            std::string::npos);

  inputs.expert_store = false;
  inputs.parallel = 1;  // groups are refused with one slot too
  EXPECT_EQ(choose_batch_groups(std::nullopt, inputs).groups, 1);

  inputs.parallel = 16;
  inputs.llc_bytes = 0;
  const BatchGroupsChoice unknown = choose_batch_groups(std::nullopt, inputs);
  EXPECT_EQ(unknown.groups, 1);
  EXPECT_NE(unknown.reason.find("not exposed"), std::string::npos) << unknown.reason;
}

TEST(ServeBatchGroups, ACacheKnownFromCpuidSaysSoAndPicksGroups) {
  // The 2-vCPU build VM: no sysfs cache, CPUID leaf 0x80000006 reports 1016 x 512 KiB.
  BatchGroupsInputs inputs{2, 16, 27'455'392, amd_l3_bytes_from_edx(1016u << 18), false, "CPUID"};
  EXPECT_EQ(inputs.llc_bytes, 508 * kMiB);
  const BatchGroupsChoice choice = choose_batch_groups(std::nullopt, inputs);
  EXPECT_EQ(choice.groups, 2);  // 2 groups measured 1.2-1.3x over 1 there (docs/serve.md)
  EXPECT_NE(choice.reason.find("fits in the 508 MiB last-level cache (CPUID: sysfs exposes none)"),
            std::string::npos)
      << choice.reason;
  inputs.llc_origin = "sysfs";
  EXPECT_EQ(choose_batch_groups(std::nullopt, inputs).reason.find("CPUID"), std::string::npos);
}

TEST(ServeBatchGroups, AmdL3IsTheTopFourteenBitsOfEdxIn512KiBUnits) {
  EXPECT_EQ(amd_l3_bytes_from_edx(0), 0u);
  EXPECT_EQ(amd_l3_bytes_from_edx((64u << 18) | 0x3ffffu), 32 * kMiB);  // low bits: ways, lines
  EXPECT_EQ(amd_l3_bytes_from_edx(0xffffffffu), uint64_t(0x3fff) * 512 * 1024);
}

TEST(ServeBatchGroups, TheLastLevelCacheNamesWhereItCameFrom) {
  const LastLevelCache llc = last_level_cache();
  if (llc.bytes == 0) {
    EXPECT_EQ(llc.origin, "");
  } else {
    EXPECT_TRUE(llc.origin == "sysfs" || llc.origin == "CPUID") << llc.origin;
  }
  if (llc_bytes() > 0) {
    EXPECT_EQ(llc.origin, "sysfs");
  }
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text << "\n";
}

void add_cache(const std::filesystem::path& dir, int index, int level, const std::string& type,
               const std::string& size) {
  const std::filesystem::path entry = dir / ("index" + std::to_string(index));
  std::filesystem::create_directories(entry);
  write(entry / "level", std::to_string(level));
  write(entry / "type", type);
  write(entry / "size", size);
}

TEST(ServeBatchGroups, LlcIsTheLevelThreeCacheElseLevelTwo) {
  test_support::ScratchDir dir("llc");
  add_cache(dir.path(), 0, 1, "Data", "48K");
  add_cache(dir.path(), 1, 1, "Instruction", "32K");
  add_cache(dir.path(), 2, 2, "Unified", "2048K");
  EXPECT_EQ(llc_bytes(dir.path()), 2048 * 1024u);  // no level 3: level 2
  add_cache(dir.path(), 3, 3, "Unified", "307200K");
  EXPECT_EQ(llc_bytes(dir.path()), 300 * kMiB);
  add_cache(dir.path(), 4, 3, "Unified", "32M");  // the largest of one level
  EXPECT_EQ(llc_bytes(dir.path()), 300 * kMiB);
}

TEST(ServeBatchGroups, LlcIsUnknownWithoutReadableSizes) {
  test_support::ScratchDir dir("llc");
  EXPECT_EQ(llc_bytes(dir.path()), 0u);                 // no index* entries (a VM)
  EXPECT_EQ(llc_bytes(dir.path() / "missing"), 0u);     // no cache folder at all
  add_cache(dir.path(), 0, 1, "Data", "48K");           // level 1 only
  add_cache(dir.path(), 1, 3, "Unified", "lots");       // malformed size
  add_cache(dir.path(), 2, 2, "Instruction", "1024K");  // not a data cache
  EXPECT_EQ(llc_bytes(dir.path()), 0u);
}

TEST(ServeBatchGroups, ParseAcceptsAutoAndNumbersFromOneTo256) {
  EXPECT_EQ(parse_batch_groups("auto"), std::nullopt);
  EXPECT_EQ(parse_batch_groups("1"), 1);
  EXPECT_EQ(parse_batch_groups("8"), 8);
  EXPECT_EQ(parse_batch_groups("256"), 256);
  for (const char* bad : {"0", "-1", "-8", "257", "", "four", "4x", "AUTO", " 4"}) {
    try {
      parse_batch_groups(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("--batch-groups: expected auto or a number of groups from 1 to 256, "
                            "found '{}'",
                            bad));
    }
  }
}

}  // namespace
}  // namespace strata::serve
