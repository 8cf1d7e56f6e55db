// Writer -> reader round trips (every KV type, several tensor types and shapes, alignments),
// the exact bytes of a hand-computed file, and the typed getters' conversions and errors.
#include <gtest/gtest.h>

#include <numeric>

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

uint64_t pad(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

TEST(GgufWriter, WritesHandComputedBytesForSmallestFile) {
  ScratchDir dir("handbytes");
  GgufWriter writer;
  writer.add_u32("a", 7);
  const float data[2] = {1.0f, 2.0f};
  writer.add_tensor("t", GgmlType::F32, {2},
                    std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data), sizeof(data)));
  writer.write_file(dir.file("small.gguf"));

  std::vector<uint8_t> expected = {'G', 'G', 'U', 'F', 3, 0, 0, 0,  // magic, version 3
                                   1, 0, 0, 0, 0, 0, 0, 0,          // tensor_count
                                   1, 0, 0, 0, 0, 0, 0, 0,          // kv_count
                                   1, 0, 0, 0, 0, 0, 0, 0, 'a',     // key "a"
                                   4, 0, 0, 0, 7, 0, 0, 0,          // u32 7
                                   1, 0, 0, 0, 0, 0, 0, 0, 't',     // tensor "t"
                                   1, 0, 0, 0,                      // n_dims
                                   2, 0, 0, 0, 0, 0, 0, 0,          // ne[0]
                                   0, 0, 0, 0,                      // f32
                                   0, 0, 0, 0, 0, 0, 0, 0};         // offset 0
  ASSERT_EQ(expected.size(), 74u);
  expected.resize(96, 0);  // pad to 32
  for (uint8_t b : {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40}) expected.push_back(b);
  expected.resize(128, 0);  // padding after the last tensor too (ggml convention)
  EXPECT_EQ(test::read_bytes(dir.file("small.gguf")), expected);

  const auto file = GgufFile::open(dir.file("small.gguf"));
  EXPECT_EQ(file->data_section_offset(), 96u);
  EXPECT_EQ(file->tensor("t").file_offset, 96u);
  EXPECT_EQ(file->get<uint32_t>("a"), 7u);
  float read_back[2];
  std::memcpy(read_back, file->tensor_data(file->tensor("t")), 8);
  EXPECT_EQ(read_back[0], 1.0f);
  EXPECT_EQ(read_back[1], 2.0f);
}

TEST(GgufRoundTrip, EveryValueTypeReadsBackExactly) {
  ScratchDir dir("everytype");
  GgufWriter writer;
  test::build_every_type_sample(writer);
  writer.write_file(dir.file("s.gguf"));
  const auto f = GgufFile::open(dir.file("s.gguf"));

  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->architecture(), "sample");
  EXPECT_EQ(f->get<uint8_t>("sample.u8"), 200);
  EXPECT_EQ(f->get<int8_t>("sample.i8"), -100);
  EXPECT_EQ(f->get<uint16_t>("sample.u16"), 60000);
  EXPECT_EQ(f->get<int16_t>("sample.i16"), -30000);
  EXPECT_EQ(f->get<uint32_t>("sample.u32"), 4000000000u);
  EXPECT_EQ(f->get<int32_t>("sample.i32"), -2000000000);
  EXPECT_EQ(f->get<uint64_t>("sample.u64"), 18000000000000000000ull);
  EXPECT_EQ(f->get<int64_t>("sample.i64"), -9000000000000000000ll);
  EXPECT_EQ(f->get<float>("sample.f32"), 0.15625f);
  EXPECT_EQ(f->get<double>("sample.f64"), -2.5e300);
  EXPECT_TRUE(f->get<bool>("sample.bool"));
  EXPECT_EQ(f->get<std::string>("sample.string"), "héllo\nworld");
  EXPECT_EQ(f->get<std::vector<int64_t>>("sample.arr_u8"), (std::vector<int64_t>{0, 255, 7}));
  EXPECT_EQ(f->get<std::vector<int64_t>>("sample.arr_i8"), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(f->get<std::vector<uint32_t>>("sample.arr_u16"), (std::vector<uint32_t>{65535}));
  EXPECT_EQ(f->get<std::vector<int32_t>>("sample.arr_i16"), (std::vector<int32_t>{-32768, 32767}));
  EXPECT_EQ(f->get<std::vector<uint32_t>>("sample.arr_u32"), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(f->get<std::vector<int32_t>>("sample.arr_i32"), (std::vector<int32_t>{-5, 5}));
  EXPECT_EQ(f->get<std::vector<int64_t>>("sample.arr_i64"), (std::vector<int64_t>{INT64_MIN, INT64_MAX}));
  const GgufArray& u64 = f->get_array("sample.arr_u64");
  EXPECT_EQ(u64.element_type, GgufValueType::U64);
  ASSERT_EQ(u64.ints.size(), 1u);
  EXPECT_EQ(static_cast<uint64_t>(u64.ints[0]), UINT64_MAX);
  const GgufArray& bools = f->get_array("sample.arr_bool");
  EXPECT_EQ(bools.element_type, GgufValueType::BOOL);
  EXPECT_EQ(bools.ints, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(f->get<std::vector<float>>("sample.arr_f32"), (std::vector<float>{0.5f, -1.25f}));
  EXPECT_EQ(f->get<std::vector<double>>("sample.arr_f64"), (std::vector<double>{1e-300, 3.0}));
  EXPECT_EQ(f->get<std::vector<std::string>>("sample.arr_string"), (std::vector<std::string>{"", "a", "bc"}));
  EXPECT_EQ(f->get_array("sample.arr_empty").size(), 0u);
  EXPECT_EQ(f->get_array("sample.arr_empty").element_type, GgufValueType::U32);
  // Keys come back in insertion order.
  ASSERT_EQ(f->keys().size(), 27u);
  EXPECT_EQ(f->keys()[0], "general.architecture");
  EXPECT_EQ(f->keys()[1], "general.alignment");
  EXPECT_EQ(f->keys().back(), "sample.arr_empty");
}

struct TensorCase {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  uint64_t expected_bytes;  // hand-computed from the block table
  size_t expected_row_bytes;
};

class GgufTensorRoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufTensorRoundTrip, ShapesTypesOffsetsAndDataSurvive) {
  const uint32_t alignment = GetParam();
  const std::vector<TensorCase> cases = {
      {"f32.vec", GgmlType::F32, {7}, 28, 28},
      {"f16.mat", GgmlType::F16, {3, 5}, 30, 6},
      {"blk.0.ffn_gate_exps.weight", GgmlType::Q8_0, {64, 3, 4}, 34 * 2 * 3 * 4, 68},
      {"bf16.4d", GgmlType::BF16, {2, 3, 1, 2}, 24, 4},
      {"q4k", GgmlType::Q4_K, {512, 2}, 144 * 4, 288},
      {"iq2xs", GgmlType::IQ2_XS, {256, 1}, 74, 74},
      {"q4_0", GgmlType::Q4_0, {32, 3}, 54, 18},
  };
  ScratchDir dir("tensors");
  GgufWriter writer;
  writer.add_string("general.architecture", "t");
  writer.set_alignment(alignment);
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < cases.size(); ++i) {
    data.emplace_back(cases[i].expected_bytes);
    for (size_t j = 0; j < data[i].size(); ++j) data[i][j] = static_cast<uint8_t>(j * 31 + i * 7 + 1);
    writer.add_tensor(cases[i].name, cases[i].type, cases[i].ne, data[i]);
  }
  writer.write_file(dir.file("t.gguf"));
  const auto f = GgufFile::open(dir.file("t.gguf"));
  const std::vector<uint8_t> raw = test::read_bytes(dir.file("t.gguf"));

  EXPECT_EQ(f->alignment(), alignment);
  EXPECT_EQ(f->data_section_offset() % alignment, 0u);
  ASSERT_EQ(f->tensors().size(), cases.size());
  uint64_t expected_offset = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const TensorInfo& t = f->tensors()[i];
    EXPECT_EQ(&f->tensor(cases[i].name), &t);
    EXPECT_EQ(t.type, cases[i].type);
    EXPECT_EQ(t.n_dims, static_cast<int>(cases[i].ne.size()));
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(t.ne[d], d < t.n_dims ? cases[i].ne[size_t(d)] : 1);
    }
    EXPECT_EQ(t.n_bytes, cases[i].expected_bytes);
    EXPECT_EQ(t.row_bytes(), cases[i].expected_row_bytes);
    EXPECT_EQ(t.data_offset, expected_offset);
    EXPECT_EQ(t.file_offset, f->data_section_offset() + expected_offset);
    EXPECT_EQ(0, std::memcmp(f->tensor_data(t), data[i].data(), data[i].size()));
    // Zero padding up to the next aligned offset.
    for (uint64_t b = t.file_offset + t.n_bytes; b < t.file_offset + pad(t.n_bytes, alignment); ++b) {
      ASSERT_EQ(raw[b], 0) << "padding byte at " << b;
    }
    expected_offset += pad(t.n_bytes, alignment);
  }
  EXPECT_EQ(f->file_size(), f->data_section_offset() + expected_offset);
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufTensorRoundTrip, ::testing::Values(32u, 64u, 4096u));

TEST(GgufRoundTrip, StreamedProducerWritesChunksInDeclarationOrder) {
  ScratchDir dir("stream");
  GgufWriter writer;
  writer.add_tensor("first", GgmlType::F32, {100});
  writer.add_tensor("second", GgmlType::F16, {33, 3});
  std::vector<std::string> order;
  writer.write_file(dir.file("s.gguf"), [&](const GgufTensorDecl& t, GgufTensorSink& sink) {
    order.push_back(t.name);
    EXPECT_EQ(sink.bytes_expected(), t.n_bytes);
    for (uint64_t at = 0; at < t.n_bytes; at += 64) {
      std::vector<uint8_t> chunk(std::min<uint64_t>(64, t.n_bytes - at));
      for (size_t j = 0; j < chunk.size(); ++j) chunk[j] = static_cast<uint8_t>((at + j) ^ t.n_bytes);
      sink.write(chunk);
    }
  });
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second"}));
  const auto f = GgufFile::open(dir.file("s.gguf"));
  for (const TensorInfo& t : f->tensors()) {
    const uint8_t* p = f->tensor_data(t);
    for (uint64_t j = 0; j < t.n_bytes; ++j) ASSERT_EQ(p[j], static_cast<uint8_t>(j ^ t.n_bytes));
  }
  EXPECT_EQ(f->tensor("second").n_bytes, 33u * 3 * 2);
}

TEST(GgufRoundTrip, FileWithoutTensors) {
  ScratchDir dir("notensors");
  GgufWriter writer;
  writer.add_string("general.architecture", "x");
  writer.write_file(dir.file("n.gguf"));
  const auto f = GgufFile::open(dir.file("n.gguf"));
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->architecture(), "x");
  // 24 header + 8+20 key + 4 type + 8+1 value = 65, padded to 96 by the writer.
  EXPECT_EQ(f->file_size(), 96u);
  EXPECT_EQ(f->data_section_offset(), 65u);  // ggml: no padding before an empty data section
}

TEST(GgufReader, AcceptsZeroSizeDimensions) {
  // The spec allows ne = 0 (the writer refuses it for ggml's sake); a reader must cope.
  GgufWriter writer;
  writer.add_tensor("first", GgmlType::F32, {8});
  writer.add_tensor("last", GgmlType::F16, {4, 3});
  std::vector<uint8_t> bytes = writer.write_memory([](const GgufTensorDecl& t, GgufTensorSink& sink) {
    sink.write(std::vector<uint8_t>(t.n_bytes, 1));
  });
  test::poke<uint64_t>(bytes, test::walk_layout(bytes).tensor("last").ne_at[1], 0);
  const auto f = GgufFile::open_from_memory(bytes, "zero.gguf");
  EXPECT_EQ(f->tensor("last").n_bytes, 0u);
  EXPECT_EQ(f->tensor("last").n_elements(), 0);
  EXPECT_EQ(f->tensor("last").row_bytes(), 8u);
}

TEST(GgufReader, AcceptsVersion2) {
  GgufWriter writer;
  test::build_every_type_sample(writer);
  ScratchDir dir("v2");
  writer.write_file(dir.file("a.gguf"));
  std::vector<uint8_t> bytes = test::read_bytes(dir.file("a.gguf"));
  test::poke<uint32_t>(bytes, 4, 2);
  const auto f = GgufFile::open_from_memory(bytes, "v2.gguf");
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->fd(), -1);
}

TEST(GgufRoundTrip, RewritingAParsedFileReproducesItByteForByte) {
  const std::string fixture = std::string(STRATA_TEST_DATA_DIR) + "/gguf/tiny-qwen4exp.gguf";
  const auto source = GgufFile::open(fixture);
  const GgufWriter copy = GgufWriter::from_file(*source);
  const std::vector<uint8_t> rewritten = copy.write_memory([&](const GgufTensorDecl& t, GgufTensorSink& sink) {
    sink.write(std::span<const uint8_t>(source->tensor_data(source->tensor(t.name)), t.n_bytes));
  });
  EXPECT_TRUE(rewritten == test::read_bytes(fixture));
  // And the memory image parses to the same structure.
  const auto again = GgufFile::open_from_memory(rewritten, "rewritten");
  EXPECT_EQ(again->keys(), source->keys());
  for (const std::string& key : source->keys()) EXPECT_EQ(*again->find(key), *source->find(key)) << key;
  ASSERT_EQ(again->tensors().size(), source->tensors().size());
  for (size_t i = 0; i < again->tensors().size(); ++i) {
    EXPECT_EQ(again->tensors()[i].name, source->tensors()[i].name);
    EXPECT_EQ(again->tensors()[i].file_offset, source->tensors()[i].file_offset);
  }
}

class GgufGetters : public ::testing::Test {
 protected:
  void SetUp() override {
    GgufWriter writer;
    test::build_every_type_sample(writer);
    writer.add_u64("count.u64", 5);
    writer.write_file(dir_.file("g.gguf"));
    file_ = GgufFile::open(dir_.file("g.gguf"));
  }
  ScratchDir dir_{"getters"};
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GgufGetters, IntegerGettersAcceptAnyIntegerTypeWhoseValueFits) {
  EXPECT_EQ(file_->get<uint32_t>("count.u64"), 5u);
  EXPECT_EQ(file_->get<int8_t>("count.u64"), 5);
  EXPECT_EQ(file_->get<int64_t>("sample.i8"), -100);
  EXPECT_EQ(file_->get<int16_t>("sample.i8"), -100);
  EXPECT_EQ(file_->get<int64_t>("sample.u32"), 4000000000ll);
  EXPECT_EQ(file_->get<uint64_t>("sample.u8"), 200u);
  EXPECT_EQ(file_->get<double>("sample.f32"), 0.15625);
  EXPECT_EQ(file_->get<double>("sample.f64"), -2.5e300);
  EXPECT_EQ(file_->get_or<uint32_t>("absent.key", 42u), 42u);
  EXPECT_EQ(file_->get_or<uint32_t>("count.u64", 42u), 5u);
  EXPECT_TRUE(file_->has("sample.bool"));
  EXPECT_FALSE(file_->has("sample.nope"));
  EXPECT_EQ(file_->find("sample.nope"), nullptr);
}

TEST_F(GgufGetters, MissingKeyNamesKeyAndFile) {
  const std::string msg = error_of([&] { file_->get<uint32_t>("qwen4exp.block_count"); });
  EXPECT_NE(msg.find(dir_.file("g.gguf")), std::string::npos) << msg;
  EXPECT_NE(msg.find("key 'qwen4exp.block_count': missing"), std::string::npos) << msg;
}

TEST_F(GgufGetters, WrongTypeNamesExpectedAndActualType) {
  const std::string path = dir_.file("g.gguf");
  auto expect_error = [&](auto&& call, const std::string& fragment) {
    const std::string msg = error_of(call);
    EXPECT_NE(msg.find(path + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  };
  expect_error([&] { file_->get<uint32_t>("sample.string"); },
               "key 'sample.string': expected an integer (u32), found string");
  expect_error([&] { file_->get<bool>("sample.u8"); }, "key 'sample.u8': expected bool, found u8");
  expect_error([&] { file_->get<std::string>("sample.u32"); }, "expected string, found u32");
  expect_error([&] { file_->get<float>("sample.i32"); }, "expected f32 or f64, found i32");
  expect_error([&] { file_->get<uint32_t>("sample.f32"); }, "found f32");
  expect_error([&] { file_->get<std::vector<int64_t>>("sample.arr_f32"); }, "found array<f32>[2]");
  expect_error([&] { file_->get<std::vector<std::string>>("sample.arr_u8"); },
               "expected array<string>, found array<u8>[3]");
  expect_error([&] { file_->get<std::vector<float>>("sample.u8"); }, "found u8");
  expect_error([&] { file_->get_array("sample.string"); }, "expected an array, found string");
  expect_error([&] { file_->tensor("no.such.tensor"); }, "tensor 'no.such.tensor': missing");
}

TEST_F(GgufGetters, ValueThatDoesNotFitIsAnError) {
  const std::string path = dir_.file("g.gguf");
  auto expect_error = [&](auto&& call, const std::string& fragment) {
    const std::string msg = error_of(call);
    EXPECT_NE(msg.find(path + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  };
  expect_error([&] { file_->get<uint8_t>("sample.u16"); }, "key 'sample.u16': value 60000 (u16) does not fit in u8");
  expect_error([&] { file_->get<int32_t>("sample.u32"); }, "value 4000000000 (u32) does not fit in i32");
  expect_error([&] { file_->get<uint32_t>("sample.i8"); }, "value -100 (i8) does not fit in u32");
  expect_error([&] { file_->get<int64_t>("sample.u64"); }, "does not fit in i64");
  expect_error([&] { file_->get<float>("sample.f64"); }, "value -2.5e+300 (f64) does not fit in f32");
  expect_error([&] { file_->get<std::vector<int64_t>>("sample.arr_u64"); },
               "element 0 (18446744073709551615) does not fit in i64");
  expect_error([&] { file_->get<std::vector<uint32_t>>("sample.arr_i32"); }, "element 0 (-5) does not fit in u32");
}

TEST(GgufReader, OpenErrorsNameThePath) {
  const std::string missing = "/nonexistent-strata-dir/model.gguf";
  const std::string msg = error_of([&] { GgufFile::open(missing); });
  EXPECT_EQ(msg, missing + ": cannot open: No such file or directory");
  ScratchDir dir("opendir");
  const std::string dir_msg = error_of([&] { GgufFile::open(dir.path().string()); });
  EXPECT_EQ(dir_msg, dir.path().string() + ": not a regular file");
}

TEST(GgufValue, ToStringSummarisesArrays) {
  GgufValue v;
  v.type = GgufValueType::ARRAY;
  GgufArray a;
  a.element_type = GgufValueType::I32;
  a.ints.resize(10);
  std::iota(a.ints.begin(), a.ints.end(), 1);
  v.value = a;
  EXPECT_EQ(gguf_value_to_string(v, 3), "[1, 2, 3, ...] (10 x i32)");
  EXPECT_EQ(gguf_value_type_description(v), "array<i32>[10]");
  GgufValue s;
  s.type = GgufValueType::STRING;
  s.value = std::string("a\nb'c");
  EXPECT_EQ(gguf_value_to_string(s), "'a\\nb\\'c'");
}

}  // namespace
}  // namespace strata
