// read_exact: io_uring (pieces in flight together) and pread give the same bytes; errors carry
// errno and the offset; a read past the end is an end-of-file error, not a short buffer.
#include "experts/block_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

namespace strata {
namespace {

class BlockReader : public testing::TestWithParam<ReadBackend> {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() / ("strata-block-reader-" + std::to_string(getpid()));
    bytes_.resize(1 << 20);
    std::mt19937 rng(5);
    for (auto& b : bytes_) b = uint8_t(rng());
    FILE* f = std::fopen(path_.c_str(), "wb");
    ASSERT_TRUE(f);
    ASSERT_EQ(std::fwrite(bytes_.data(), 1, bytes_.size(), f), bytes_.size());
    std::fclose(f);
    fd_ = ::open(path_.c_str(), O_RDONLY);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    ::close(fd_);
    std::filesystem::remove(path_);
  }
  std::filesystem::path path_;
  std::vector<uint8_t> bytes_;
  int fd_ = -1;
};

TEST_P(BlockReader, ReadsExactlyTheRangeInAnyPieceSize) {
  for (uint64_t piece : {4096u, 65536u, 1u << 20}) {
    for (auto [offset, length] : {std::pair<uint64_t, uint64_t>{0, 1 << 20}, {12288, 300000}, {4096 * 7, 4096 * 70 + 17}}) {
      std::vector<uint8_t> out(length, 0);
      read_exact(GetParam(), fd_, offset, length, out.data(), piece);
      EXPECT_TRUE(std::equal(out.begin(), out.end(), bytes_.begin() + ptrdiff_t(offset)))
          << "piece " << piece << " offset " << offset << " length " << length;
    }
  }
}

TEST_P(BlockReader, PastTheEndIsAnEndOfFileError) {
  std::vector<uint8_t> out(200000);
  try {
    read_exact(GetParam(), fd_, (1 << 20) - 100000, out.size(), out.data(), 4096);
    FAIL() << "no error";
  } catch (const ReadError& e) {
    EXPECT_EQ(e.error_number, 0);
    EXPECT_NE(std::string(e.what()).find("end of file"), std::string::npos);
  }
}

TEST_P(BlockReader, BadDescriptorCarriesErrno) {
  std::vector<uint8_t> out(100000);
  try {
    read_exact(GetParam(), -1, 0, out.size(), out.data(), 4096);
    FAIL() << "no error";
  } catch (const ReadError& e) {
    EXPECT_EQ(e.error_number, EBADF);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BlockReader, testing::Values(ReadBackend::Pread, ReadBackend::IoUring),
                         [](const auto& info) { return info.param == ReadBackend::Pread ? "pread" : "io_uring"; });

}  // namespace
}  // namespace strata
