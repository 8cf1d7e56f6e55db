// Resident weights (gguf/resident_weights.h): which pages are copied, and that the copy keeps every
// byte at its address while the pages stop being file pages.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "tensor_table.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "gguf/resident_weights.h"

namespace strata {
namespace {

using test_support::kPage;
using test_support::tensor;

TEST(ResidentWeights, PlanCopiesDenseTensorsAndResidentExpertsButNeverThePerLayerEmbedding) {
  const std::vector<TensorInfo> tensors = {
      tensor("token_embd.weight", 0, 10000),                  // dense, [0, 12288)
      tensor("blk.0.ffn_up_exps.weight", 10000, 30000),       // experts, [8192, 40960)
      tensor("blk.0.attn_q.weight", 40000, 1000),             // dense, [36864, 45056)
      tensor("per_layer_token_embd.weight", 41000, 50000),    // never, [40960, 94208)
      tensor("output.weight", 91000, 9000),                   // dense, [90112, 100000)
  };
  EXPECT_EQ(plan_resident_weights(tensors, 100000, kPage, /*experts_resident=*/false),
            (std::vector<ByteRange>{{0, 12288}, {36864, 45056 - 36864}, {90112, 100000 - 90112}}));
  // With the experts: their pages join the dense ones around them.
  EXPECT_EQ(plan_resident_weights(tensors, 100000, kPage, /*experts_resident=*/true),
            (std::vector<ByteRange>{{0, 45056}, {90112, 100000 - 90112}}));
}

// Which file backs the page at `address` in /proc/self/maps ("" for anonymous memory).
std::string backing_of(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string span, perms, offset, device, inode, path;
    fields >> span >> perms >> offset >> device >> inode;
    std::getline(fields >> std::ws, path);
    const size_t dash = span.find('-');
    const uintptr_t begin = std::stoull(span.substr(0, dash), nullptr, 16);
    const uintptr_t end = std::stoull(span.substr(dash + 1), nullptr, 16);
    if (begin <= at && at < end) return path;
  }
  ADD_FAILURE() << "address not mapped";
  return "?";
}

class ResidentCopy : public ::testing::Test {
 protected:
  // A GGUF of random bytes: a dense tensor, an expert tensor and the per-layer embedding, of odd
  // sizes, the file ending mid-page.
  void SetUp() override {
    path_ = dir_.file("w.gguf");
    GgufWriter writer;
    writer.add_string("general.architecture", "test");
    std::mt19937 rng(7);
    const auto random_bytes = [&](size_t n) {
      std::vector<uint8_t> bytes(n);
      for (uint8_t& b : bytes) b = uint8_t(rng());
      return bytes;
    };
    writer.add_tensor("a.weight", GgmlType::F32, {1000, 37}, random_bytes(1000 * 37 * 4));
    writer.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::F32, {4096, 50}, random_bytes(4096 * 50 * 4));
    writer.add_tensor("per_layer_token_embd.weight", GgmlType::F32, {333, 20}, random_bytes(333 * 20 * 4));
    writer.write_file(path_);
    file_ = GgufFile::open(path_);
    original_.assign(file_->mapped_data(), file_->mapped_data() + file_->file_size());
    ASSERT_NE(file_->file_size() % kPage, 0u) << "the test wants a partial last page";
  }
  void expect_every_byte_unchanged() const {
    ASSERT_EQ(std::memcmp(file_->mapped_data(), original_.data(), original_.size()), 0);
  }

  test_support::ScratchDir dir_{"resident"};
  std::string path_;
  std::unique_ptr<GgufFile> file_;
  std::vector<uint8_t> original_;
};

TEST_F(ResidentCopy, CopyInPlaceKeepsBytesAndAddressesAndLeavesTheFile) {
  const uint8_t* base = file_->mapped_data();
  const TensorInfo& experts = file_->tensor("blk.0.ffn_up_exps.weight");
  const uint8_t* inside = file_->tensor_data(experts) + experts.n_bytes / 2;
  EXPECT_EQ(backing_of(inside), path_);
  // An unaligned range inside the expert tensor: widened to its pages, which become anonymous.
  const uint64_t copied = file_->copy_in_place(experts.file_offset + 100, experts.n_bytes - 200);
  EXPECT_GE(copied, experts.n_bytes - 200);
  EXPECT_EQ(copied % kPage, 0u);
  EXPECT_EQ(file_->mapped_data(), base);
  EXPECT_EQ(backing_of(inside), "");
  EXPECT_EQ(backing_of(base), path_) << "the header's page was not asked for";
  expect_every_byte_unchanged();
  // The tail: the last partial page, the rest of that page stays zero as in the mapping.
  EXPECT_GT(file_->copy_in_place(file_->file_size() - 10, 10), 0u);
  EXPECT_EQ(backing_of(base + file_->file_size() - 1), "");
  expect_every_byte_unchanged();
  // Out of range or empty: nothing.
  EXPECT_EQ(file_->copy_in_place(file_->file_size() + kPage, 10), 0u);
  EXPECT_EQ(file_->copy_in_place(0, 0), 0u);
  // Copying a copy again is allowed and changes nothing.
  EXPECT_GT(file_->copy_in_place(0, file_->file_size()), 0u);
  expect_every_byte_unchanged();
  EXPECT_EQ(backing_of(base), "");
}

TEST_F(ResidentCopy, PlannedCopyOnThreadsReportsProgressAndSparesTheEmbedding) {
  const std::vector<ByteRange> ranges =
      plan_resident_weights(file_->tensors(), file_->file_size(), kPage, /*experts_resident=*/true);
  uint64_t total = 0;
  for (const ByteRange& r : ranges) total += r.length;
  std::mutex m;
  std::vector<uint64_t> reports;
  // Pieces of 2 pages, so the three threads share ~100 pieces.
  const uint64_t copied = copy_resident_weights(
      *file_, ranges, 3,
      [&](uint64_t done, uint64_t all) {
        const std::unique_lock lock(m, std::try_to_lock);  // the contract: one call at a time
        EXPECT_TRUE(lock.owns_lock());
        EXPECT_EQ(all, total);
        reports.push_back(done);
      },
      2 * kPage);
  EXPECT_EQ(copied, total);
  ASSERT_GT(reports.size(), 50u);
  EXPECT_EQ(reports.back(), total);
  for (size_t i = 1; i < reports.size(); ++i) EXPECT_LT(reports[i - 1], reports[i]);
  expect_every_byte_unchanged();
  const TensorInfo& a = file_->tensor("a.weight");
  const TensorInfo& ple = file_->tensor("per_layer_token_embd.weight");
  EXPECT_EQ(backing_of(file_->tensor_data(a)), "");
  // The embedding's pages that hold none of the experts' bytes stay file pages.
  const uint64_t first_own_page = (ple.file_offset + kPage - 1) / kPage * kPage;
  ASSERT_LE(first_own_page + kPage, ple.file_offset + ple.n_bytes);
  EXPECT_EQ(backing_of(file_->mapped_data() + first_own_page), path_);
}

TEST(ResidentWeights, InMemoryFilesCopyNothing) {
  GgufWriter writer;
  writer.add_string("general.architecture", "test");
  std::vector<uint8_t> data(64 * 4, 1);
  writer.add_tensor("a.weight", GgmlType::F32, {64}, data);
  const std::vector<uint8_t> bytes = writer.write_memory();
  const auto file = GgufFile::open_from_memory(bytes, "mem.gguf");
  EXPECT_EQ(file->copy_in_place(0, bytes.size()), 0u);
  const std::vector<ByteRange> all = {{0, bytes.size()}};
  EXPECT_EQ(copy_resident_weights(*file, all, 2), 0u);
}

}  // namespace
}  // namespace strata
