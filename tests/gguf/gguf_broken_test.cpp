// Broken inputs: every one-field corruption of a valid file, truncation at random offsets, and
// the strata binary's behaviour on broken files (exit code 1, exactly one line on stderr).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <random>

#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "util/error.h"

namespace strata {
namespace {

using test::ScratchDir;

std::string open_error(const std::string& path) {
  try {
    GgufFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(opened without error)";
}

TEST(GgufParser, RefusesEveryCorruptionNamingFileAndField) {
  ScratchDir dir("corrupt");
  const auto corruptions = test::corruptions_of_every_type_sample();
  ASSERT_GE(corruptions.size(), 40u);
  for (const test::Corruption& c : corruptions) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file("broken-" + c.name + ".gguf");
    test::write_bytes(path, c.bytes);
    const std::string msg = open_error(path);
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;  // starts with the file name
    EXPECT_NE(msg.find(c.expected_fragment), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    // The in-memory path runs the same parser and reports the same error.
    try {
      GgufFile::open_from_memory(c.bytes, path);
      ADD_FAILURE() << "open_from_memory accepted " << c.name;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), msg);
    }
  }
}

TEST(GgufParser, TruncationAtRandomOffsetsFailsCleanly) {
  ScratchDir dir("truncate");
  const std::string full_path = dir.file("full.gguf");
  test::write_tiny_qwen4exp(full_path);
  const std::vector<uint8_t> full = test::read_bytes(full_path);
  const auto parsed = GgufFile::open(full_path);
  const TensorInfo& last = parsed->tensors().back();
  // Cutting only the last tensor's trailing padding leaves a valid file, so cut before its end.
  const uint64_t data_end = last.file_offset + last.n_bytes;
  std::mt19937_64 rng(20240607);
  // After "<path>: " comes the field: a header field, a key, a tensor or the data section.
  auto names_a_field = [](const std::string& rest) {
    for (const char* field : {"header magic", "header version", "header tensor_count", "header kv_count", "key ",
                              "tensor ", "data section"}) {
      if (rest.rfind(field, 0) == 0) return true;
    }
    return false;
  };
  for (int i = 0; i < 10; ++i) {
    const uint64_t cut = rng() % data_end;
    SCOPED_TRACE("cut at " + std::to_string(cut));
    const std::string path = dir.file("cut-" + std::to_string(cut) + ".gguf");
    test::write_bytes(path, std::vector<uint8_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut)));
    const std::string msg = open_error(path);
    ASSERT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    EXPECT_TRUE(names_a_field(msg.substr(path.size() + 2))) << msg;
  }
}

struct CommandResult {
  int exit_code = -1;
  std::string stdout_text;
  std::string stderr_text;
};

CommandResult run_strata(const ScratchDir& dir, const std::string& args) {
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const std::string command = std::string(STRATA_BINARY) + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(command.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const auto o = test::read_bytes(out), e = test::read_bytes(err);
  result.stdout_text.assign(o.begin(), o.end());
  result.stderr_text.assign(e.begin(), e.end());
  return result;
}

TEST(StrataCli, InspectOnBrokenFilesExitsOneWithOneErrorLine) {
  ScratchDir dir("cli");
  for (const test::Corruption& c : test::corruptions_of_every_type_sample()) {
    if (c.name != "type_id" && c.name != "truncated_data" && c.name != "nested_array" && c.name != "magic") continue;
    SCOPED_TRACE(c.name);
    const std::string path = dir.file("bad-" + c.name + ".gguf");
    test::write_bytes(path, c.bytes);
    const CommandResult r = run_strata(dir, "inspect " + path);
    EXPECT_EQ(r.exit_code, 1);
    ASSERT_FALSE(r.stderr_text.empty());
    EXPECT_EQ(r.stderr_text.find('\n'), r.stderr_text.size() - 1) << r.stderr_text;  // exactly one line
    EXPECT_NE(r.stderr_text.find(path), std::string::npos) << r.stderr_text;
    EXPECT_NE(r.stderr_text.find(c.expected_fragment), std::string::npos) << r.stderr_text;
  }
  const CommandResult missing = run_strata(dir, "inspect " + dir.file("does-not-exist.gguf"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.stderr_text, "strata: " + dir.file("does-not-exist.gguf") +
                                     ": cannot open: No such file or directory\n");
}

TEST(StrataCli, InspectDescribesTheReadmeFixture) {
  ScratchDir dir("cli-ok");
  const std::string fixture = std::string(STRATA_TEST_DATA_DIR) + "/gguf/tiny-qwen4exp.gguf";
  const CommandResult r = run_strata(dir, "inspect --tensors " + fixture);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(r.stderr_text.empty()) << r.stderr_text;
  const auto f = GgufFile::open(fixture);
  for (const std::string& fragment :
       {std::string("architecture    qwen4exp"), std::string("expert_count"), std::string("routed experts"),
        std::string("vocab size     64"), std::string("q8_0"), std::string("q4_0"),
        fmt::format("{} tensors", f->tensors().size()), std::string("blk.1.ffn_down_exps.weight"),
        std::string("eos            2 '<|im_end|>'")}) {
    EXPECT_NE(r.stdout_text.find(fragment), std::string::npos) << fragment << "\n" << r.stdout_text;
  }
  // Routed-expert bytes are the sum over *_exps tensors, computed here independently.
  uint64_t expert_bytes = 0, total = 0;
  for (const TensorInfo& t : f->tensors()) {
    total += t.n_bytes;
    if (t.name.find("_exps") != std::string::npos) expert_bytes += t.n_bytes;
  }
  EXPECT_NE(r.stdout_text.find(fmt::format("{:.2f}%", 100.0 * double(expert_bytes) / double(total))),
            std::string::npos) << r.stdout_text;
}

}  // namespace
}  // namespace strata
