// Writer atomicity (no partial file at the target on any failure) and declaration validation.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <stdexcept>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "gguf_test_util.h"
#include "util/error.h"

namespace strata {
namespace {

using test::ScratchDir;

template <typename F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no strata::Error thrown)";
}

GgufWriter two_tensor_writer() {
  GgufWriter writer;
  writer.add_string("general.architecture", "w");
  writer.add_tensor("one", GgmlType::F32, {1024});
  writer.add_tensor("two", GgmlType::F32, {1024});
  return writer;
}

TEST(GgufWriterAtomicity, MissingDirectoryFailsNamingPathAndErrno) {
  const std::string path = "/nonexistent-strata-dir/out.gguf";
  const std::string msg = error_of([&] { two_tensor_writer().write_file(path, nullptr); });
  EXPECT_EQ(msg.rfind(path + ": cannot create temp file", 0), 0u) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

TEST(GgufWriterAtomicity, ProducerThrowingMidwayLeavesNoFile) {
  ScratchDir dir("throw");
  const std::string path = dir.file("out.gguf");
  EXPECT_THROW(two_tensor_writer().write_file(path,
                                              [](const GgufTensorDecl& t, GgufTensorSink& sink) {
                                                sink.write(std::vector<uint8_t>(t.n_bytes / 2, 1));
                                                if (t.name == "two") throw std::runtime_error("disk on fire");
                                                sink.write(std::vector<uint8_t>(t.n_bytes / 2, 1));
                                              }),
               std::runtime_error);
  EXPECT_TRUE(dir.list().empty()) << dir.list().front();
}

TEST(GgufWriterAtomicity, ShortOrLongProducerIsAnErrorAndLeavesNoFile) {
  ScratchDir dir("short");
  const std::string path = dir.file("out.gguf");
  std::string msg = error_of([&] {
    two_tensor_writer().write_file(path, [](const GgufTensorDecl& t, GgufTensorSink& sink) {
      sink.write(std::vector<uint8_t>(t.n_bytes - 4, 0));
    });
  });
  EXPECT_EQ(msg, path + ": tensor 'one': producer wrote 4092 bytes, expected 4096");
  EXPECT_TRUE(dir.list().empty());
  msg = error_of([&] {
    two_tensor_writer().write_file(path, [](const GgufTensorDecl& t, GgufTensorSink& sink) {
      sink.write(std::vector<uint8_t>(t.n_bytes + 1, 0));
    });
  });
  EXPECT_EQ(msg, path + ": tensor 'one': producer wrote 4097 bytes, more than its size of 4096 bytes");
  EXPECT_TRUE(dir.list().empty());
  msg = error_of([&] { two_tensor_writer().write_file(path); });
  EXPECT_EQ(msg, path + ": tensor 'one': no data given and no producer callback");
  EXPECT_TRUE(dir.list().empty());
}

TEST(GgufWriterAtomicity, FailedRewriteKeepsThePreviousFile) {
  ScratchDir dir("keep");
  const std::string path = dir.file("model.gguf");
  test::write_bytes(path, {'o', 'l', 'd'});
  EXPECT_THROW(two_tensor_writer().write_file(path, [](const GgufTensorDecl&, GgufTensorSink&) {
    throw Error("producer failed");
  }), Error);
  EXPECT_EQ(test::read_bytes(path), (std::vector<uint8_t>{'o', 'l', 'd'}));
  EXPECT_EQ(dir.list(), std::vector<std::string>{"model.gguf"});
  // A successful write replaces it.
  two_tensor_writer().write_file(path, [](const GgufTensorDecl& t, GgufTensorSink& sink) {
    sink.write(std::vector<uint8_t>(t.n_bytes, 0));
  });
  EXPECT_EQ(GgufFile::open(path)->tensors().size(), 2u);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"model.gguf"});
}

// A real I/O error from write(2): the file-size limit makes writes fail with EFBIG, like a full
// disk would with ENOSPC. Runs in a child so the limit does not affect the test process.
TEST(GgufWriterAtomicity, WriteErrorIsReportedWithErrnoAndTempIsRemoved) {
  ScratchDir dir("efbig");
  const std::string path = dir.file("big.gguf");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{64 * 1024, 64 * 1024};
    setrlimit(RLIMIT_FSIZE, &limit);
    GgufWriter writer;
    writer.add_tensor("big", GgmlType::F32, {1 << 20});  // 4 MiB
    int code = 10;
    try {
      writer.write_file(path, [](const GgufTensorDecl& t, GgufTensorSink& sink) {
        sink.write(std::vector<uint8_t>(t.n_bytes, 7));
      });
    } catch (const Error& e) {
      const std::string msg = e.what();
      code = msg.rfind(path + ": write failed on " + path + ".tmp.", 0) == 0 &&
                     msg.find("File too large") != std::string::npos
                 ? 0
                 : 11;
    } catch (...) {
      code = 12;
    }
    if (code == 0 && !dir.list().empty()) code = 13;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: no error, 11: wrong message, 12: wrong type, 13: leftovers";
  EXPECT_TRUE(dir.list().empty());
}

TEST(GgufWriterValidation, RefusesBadDeclarations) {
  GgufWriter w;
  w.add_u32("k", 1);
  EXPECT_EQ(error_of([&] { w.add_u32("k", 2); }), "gguf writer: key 'k' added twice");
  EXPECT_EQ(error_of([&] { w.add_u32("", 2); }), "gguf writer: empty metadata key");
  EXPECT_EQ(error_of([&] { w.add_u64("general.alignment", 64); }),
            "gguf writer: key 'general.alignment': expected type u32, found u64");
  EXPECT_EQ(error_of([&] { w.set_alignment(48); }),
            "gguf writer: key 'general.alignment': expected a power of two, multiple of 8, at most 1048576, found 48");
  EXPECT_NE(error_of([&] { w.set_alignment(4); }).find("found 4"), std::string::npos);
  EXPECT_EQ(error_of([&] { w.add_array("arr", GgufValueType::U8, std::vector<int64_t>{1, 300}); }),
            "gguf writer: key 'arr': element 1 = 300 does not fit in u8");
  EXPECT_EQ(error_of([&] { w.add_array("arr", GgufValueType::BOOL, std::vector<int64_t>{2}); }),
            "gguf writer: key 'arr': element 0 = 2 does not fit in bool");
  EXPECT_EQ(error_of([&] { w.add_array("farr", GgufValueType::F32, std::vector<double>{1.0, 1e300}); }),
            "gguf writer: key 'farr': element 1 = 1e+300 does not fit in f32");
  GgufValue huge_f32;
  huge_f32.type = GgufValueType::F32;
  huge_f32.value = -1e39;
  EXPECT_EQ(error_of([&] { w.add("f", huge_f32); }), "gguf writer: key 'f': value does not fit in f32");
  GgufValue nested;
  nested.type = GgufValueType::ARRAY;
  GgufArray inner;
  inner.element_type = GgufValueType::ARRAY;
  nested.value = inner;
  EXPECT_EQ(error_of([&] { w.add("nested", nested); }),
            "gguf writer: key 'nested': nested arrays are not allowed (ggml refuses them)");
  GgufValue mismatched;
  mismatched.type = GgufValueType::U8;
  mismatched.value = uint64_t{256};
  EXPECT_EQ(error_of([&] { w.add("u8", mismatched); }), "gguf writer: key 'u8': value does not fit in u8");

  w.add_tensor("t", GgmlType::F32, {4});
  EXPECT_EQ(error_of([&] { w.add_tensor("t", GgmlType::F32, {4}); }), "gguf writer: tensor 't' added twice");
  EXPECT_NE(error_of([&] { w.add_tensor(std::string(64, 'n'), GgmlType::F32, {4}); }).find("expected 1..63"),
            std::string::npos);
  w.add_tensor(std::string(63, 'n'), GgmlType::F32, {4});  // 63 bytes is the longest allowed
  EXPECT_EQ(error_of([&] { w.add_tensor("q", GgmlType::Q8_0, {33}); }),
            "gguf writer: tensor 'q': ne[0] = 33 is not a multiple of the q8_0 block size 32");
  EXPECT_EQ(error_of([&] { w.add_tensor("d", GgmlType::F32, {1, 1, 1, 1, 1}); }),
            "gguf writer: tensor 'd': n_dims must be 1..4, found 5");
  EXPECT_EQ(error_of([&] { w.add_tensor("neg", GgmlType::F32, {-1}); }),
            "gguf writer: tensor 'neg': ne[0] = -1, expected >= 1");
  EXPECT_EQ(error_of([&] { w.add_tensor("zero", GgmlType::F32, {4, 0}); }),
            "gguf writer: tensor 'zero': ne[1] = 0, expected >= 1");
  EXPECT_EQ(error_of([&] { w.add_tensor("sz", GgmlType::F32, {4}, std::vector<uint8_t>(15)); }),
            "gguf writer: tensor 'sz': 15 data bytes given, expected 16");
  EXPECT_EQ(w.tensors().size(), 2u);  // refused declarations left nothing behind
}

TEST(GgufWriterValidation, ChangingAlignmentRecomputesOffsets) {
  GgufWriter w;
  w.add_tensor("a", GgmlType::F32, {10});  // 40 bytes
  w.add_tensor("b", GgmlType::F32, {10});
  EXPECT_EQ(w.tensors()[1].data_offset, 64u);
  w.set_alignment(128);
  EXPECT_EQ(w.alignment(), 128u);
  EXPECT_EQ(w.tensors()[1].data_offset, 128u);
}

}  // namespace
}  // namespace strata
