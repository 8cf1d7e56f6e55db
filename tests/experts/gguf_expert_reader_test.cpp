// GgufExpertReader: every expert's three slices land in its slot exactly as they lie in the GGUF,
// whatever their alignment — slices straddling 4 KiB boundaries, slices reaching into the file's
// last partial 4 KiB block, slices lying wholly inside it — with O_DIRECT on/off, io_uring/pread;
// a filesystem refusing O_DIRECT falls back with one warning; a file truncated after open is an
// error naming the file and the tensor.
#include "experts/gguf_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "../common/temp_dir.h"
#include "gguf/gguf_writer.h"
#include "util/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr int kExperts = 9;

// Two blocks of F32 experts: block 0 of 5200-byte slices (they straddle 4 KiB boundaries), block 1
// of 128-byte slices placed last, with a filler tensor first sized so the file ends 2000 bytes
// into a 4 KiB block: blk.1's down tensor then lies inside the last partial block and its up
// tensor straddles where O_DIRECT reads must stop.
void write_experts_gguf(const std::string& path) {
  auto write = [&](int64_t filler_floats) {
    GgufWriter writer;
    writer.add_string("general.architecture", "test");
    std::mt19937 rng(11);
    auto tensor = [&](const std::string& name, std::vector<int64_t> ne) {
      int64_t n = 1;
      for (int64_t d : ne) n *= d;
      std::vector<uint8_t> bytes(size_t(n) * 4);
      for (auto& b : bytes) b = uint8_t(rng());
      writer.add_tensor(name, GgmlType::F32, ne, bytes);
    };
    tensor("filler", {filler_floats});
    tensor("blk.0.ffn_gate_exps.weight", {100, 13, kExperts});
    tensor("blk.0.ffn_up_exps.weight", {100, 13, kExperts});
    tensor("blk.0.ffn_down_exps.weight", {13, 100, kExperts});
    tensor("blk.1.ffn_gate_exps.weight", {8, 4, kExperts});
    tensor("blk.1.ffn_up_exps.weight", {8, 4, kExperts});
    tensor("blk.1.ffn_down_exps.weight", {4, 8, kExperts});
    writer.write_file(path);
  };
  write(8);
  const uint64_t size = fs::file_size(path);
  const uint64_t shift =
      (2000 + 4096 - size % 4096) % 4096 / 32 * 32;  // keeps the 32-byte alignment
  write(8 + int64_t(shift / 4));
}

// A page-aligned buffer (O_DIRECT needs aligned destinations), like an arena slot.
struct AlignedSlot {
  explicit AlignedSlot(uint64_t n) : bytes(n) {
    data = static_cast<uint8_t*>(
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~AlignedSlot() { munmap(data, bytes); }
  uint64_t bytes;
  uint8_t* data;
};

void run_jobs(GgufExpertReader& reader, int block, int32_t expert, uint8_t* slot) {
  std::vector<IoPool::Job> jobs;
  reader.read_jobs(block, expert, slot, jobs);
  for (auto& job : jobs) job();
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no strata::Error thrown";
  return "";
}

// Reads every expert of every block and compares its three matrices with the mapping's bytes.
void expect_every_expert_verbatim(const GgufFile& gguf, GgufExpertReader& reader,
                                  const std::string& label) {
  for (int b = 0; b < 2; ++b) {
    const ExpertTensorInfos t = find_expert_tensors(gguf, b);
    const TensorInfo* tensors[3] = {t.gate, t.up, t.down};
    const uint64_t slot_bytes = reader.slot_bytes(b);
    ASSERT_EQ(slot_bytes % 4096, 0u);
    AlignedSlot slot(slot_bytes);
    for (int32_t e = 0; e < kExperts; ++e) {
      std::memset(slot.data, 0xAB, slot_bytes);
      run_jobs(reader, b, e, slot.data);
      const ExpertPlacement at = reader.place(b, e);
      const uint64_t offsets[3] = {at.gate, at.up, at.down};
      for (int m = 0; m < 3; ++m) {
        const uint64_t n = tensors[m]->n_bytes / kExperts;
        ASSERT_LE(offsets[m] + n, slot_bytes);
        const uint8_t* want = gguf.tensor_data(*tensors[m]) + uint64_t(e) * n;
        EXPECT_EQ(std::memcmp(slot.data + offsets[m], want, n), 0)
            << label << ": block " << b << " expert " << e << " " << tensors[m]->name;
        // Same alignment as in the mapping, so kernels see what the mapped path gives them.
        EXPECT_EQ(offsets[m] % 4096, (tensors[m]->file_offset + uint64_t(e) * n) % 4096);
      }
    }
  }
}

TEST(GgufExpertReader, EverySliceVerbatimWithAnyAlignmentAndBackend) {
  test_support::ScratchDir dir("gguf-reader");
  const std::string path = dir.file("experts.gguf");
  write_experts_gguf(path);
  const auto gguf = GgufFile::open(path);
  ASSERT_GT(gguf->file_size() % 4096, 1024u) << "the fixture must end well inside a 4 KiB block";
  const uint64_t direct_end = gguf->file_size() / 4096 * 4096;
  const TensorInfo& up1 = gguf->tensor("blk.1.ffn_up_exps.weight");
  const TensorInfo& down1 = gguf->tensor("blk.1.ffn_down_exps.weight");
  ASSERT_LT(up1.file_offset, direct_end);
  ASSERT_GT(up1.file_offset + up1.n_bytes, direct_end)
      << "blk.1 up must straddle the last full block";
  ASSERT_GE(down1.file_offset, direct_end) << "blk.1 down must lie in the last partial block";

  for (bool direct : {true, false})
    for (bool uring : {true, false}) {
      GgufExpertReader reader(*gguf, ReadOptions{direct, uring});
      const std::string label = fmt::format("direct {} uring {}", direct, uring);
      EXPECT_EQ(reader.direct_io(), direct) << label << " (/tmp is expected to allow O_DIRECT)";
      EXPECT_EQ(reader.io_uring(), uring && io_uring_available()) << label;
      expect_every_expert_verbatim(*gguf, reader, label);
      // What was requested: slices exactly when buffered; aligned spans (never past the end) when
      // direct.
      uint64_t expected = 0, payload = 0;
      for (int b = 0; b < 2; ++b)
        for (int32_t e = 0; e < kExperts; ++e) expected += reader.read_bytes(b, e);
      for (const char* n : {"gate", "up", "down"})
        for (int b = 0; b < 2; ++b)
          payload += gguf->tensor(fmt::format("blk.{}.ffn_{}_exps.weight", b, n)).n_bytes;
      EXPECT_EQ(reader.bytes_read(), expected) << label;
      if (direct)
        EXPECT_GT(expected, payload) << label;
      else
        EXPECT_EQ(expected, payload) << label;
    }
}

int open_refusing_direct(const char* path, int flags) {
  if (flags & O_DIRECT) {
    errno = EINVAL;
    return -1;
  }
  return ::open(path, flags);
}

// Linux >= 6.6 lets tmpfs do O_DIRECT, so the refusal is simulated at open; the refusal on a read
// (EINVAL) is what several I/O threads report at once.
TEST(ReadFile, RefusedODirectFallsBackWithOneWarning) {
  test_support::ScratchDir dir("gguf-reader");
  const std::string path = dir.file("experts.gguf");
  write_experts_gguf(path);
  testing::internal::CaptureStderr();
  {
    ReadFile file(path, true, open_refusing_direct);
    EXPECT_FALSE(file.direct());
    EXPECT_FALSE(file.refuse_direct("EINVAL")) << "never direct: a failed read is a real error";
  }
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find(path + ": O_DIRECT refused at open"), std::string::npos) << log;
  EXPECT_EQ(log.find("O_DIRECT refused"), log.rfind("O_DIRECT refused")) << "said once: " << log;

  testing::internal::CaptureStderr();
  {
    ReadFile file(path, true);
    ASSERT_TRUE(file.direct()) << "/tmp is expected to allow O_DIRECT";
    std::vector<std::thread> threads;
    std::atomic<int> retries{0};
    for (int i = 0; i < 4; ++i)
      threads.emplace_back([&] { retries += file.refuse_direct("Invalid argument"); });
    for (auto& t : threads) t.join();
    EXPECT_EQ(retries.load(), 4) << "every thread whose direct read failed retries buffered";
    EXPECT_FALSE(file.direct());
  }
  log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("O_DIRECT reads refused"), std::string::npos) << log;
  EXPECT_EQ(log.find("O_DIRECT reads refused"), log.rfind("O_DIRECT reads refused"))
      << "said once: " << log;
}

TEST(GgufExpertReader, FileTruncatedAfterOpenNamesFileAndTensor) {
  test_support::ScratchDir dir("gguf-reader");
  const std::string path = dir.file("experts.gguf");
  for (bool direct : {true, false})
    for (bool uring : {true, false}) {
      write_experts_gguf(path);
      const auto gguf = GgufFile::open(path);
      const TensorInfo& down0 = gguf->tensor("blk.0.ffn_down_exps.weight");
      GgufExpertReader reader(*gguf, ReadOptions{direct, uring});
      AlignedSlot slot(reader.slot_bytes(0));
      // Cut the file in the middle of expert 4's down slice (nothing reads the mapping there).
      fs::resize_file(path, down0.file_offset + 4 * (down0.n_bytes / kExperts) + 100);
      const std::string label = fmt::format("direct {} uring {}", direct, uring);
      testing::internal::CaptureStderr();
      run_jobs(reader, 0, 2, slot.data);  // before the cut: fine
      const std::string message = error_of([&] { run_jobs(reader, 0, 4, slot.data); });
      const std::string log = testing::internal::GetCapturedStderr();
      EXPECT_NE(message.find(path), std::string::npos) << label << ": " << message;
      EXPECT_NE(message.find("blk.0.ffn_down_exps"), std::string::npos) << label << ": " << message;
      EXPECT_NE(message.find("layer 0 expert 4"), std::string::npos) << label << ": " << message;
      EXPECT_NE(message.find("ends early"), std::string::npos) << label << ": " << message;
      EXPECT_EQ(reader.direct_io(), direct) << label << ": truncation is not a refused O_DIRECT";
      EXPECT_EQ(log.find("refused"), std::string::npos) << label << ": " << log;
    }
}

TEST(GgufExpertReader, RefusesAnInMemoryGguf) {
  test_support::ScratchDir dir("gguf-reader");
  const std::string path = dir.file("experts.gguf");
  write_experts_gguf(path);
  std::vector<uint8_t> bytes(fs::file_size(path));
  FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
  const auto gguf = GgufFile::open_from_memory(bytes, "memory.gguf");
  EXPECT_NE(
      error_of([&] { GgufExpertReader reader(*gguf, ReadOptions{}); }).find("needs a file on disk"),
      std::string::npos);
}

}  // namespace
}  // namespace strata
