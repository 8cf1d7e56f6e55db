// The committed seeds of one fuzz target (fuzz/fuzz_<STRATA_FUZZ_TARGET>.cpp, linked in) replayed
// through the target itself, so the regular suite checks its invariants on them: a violation
// traps and fails the test. A crash the fuzzer finds is committed to tests/data/fuzz/<target>/
// with the fix, and stays checked on every build, fuzzer or not.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

TEST(FuzzSeeds, CommittedSeedsHoldTheInvariants) {
  const std::filesystem::path dir =
      std::filesystem::path(STRATA_TEST_DATA_DIR) / "fuzz" / STRATA_FUZZ_TARGET;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(entry.path().string());
    EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
              0);
    ++n;
  }
  EXPECT_GE(n, 5) << "seeds in " << dir;
}
