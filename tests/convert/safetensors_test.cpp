// safetensors header parser and HfCheckpoint (shards, index, typed reads).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "convert/checkpoint.h"
#include "convert/safetensors.h"
#include "convert_test_util.h"
#include "util/error.h"

namespace strata::convert {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

std::string error_of(const std::vector<uint8_t>& bytes) {
  try {
    parse_safetensors_header(bytes, bytes.size(), "t.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Safetensors, ParsesTensorsMetadataAndOffsets) {
  const auto bytes = testing::build_safetensors({
      testing::f32_tensor("a.weight", {2, 3}, {1, 2, 3, 4, 5, 6}),
      testing::i64_tensor("b", {2}, {7, -8}),
      testing::u16_tensor("c", "BF16", {1}, {0x3FC0}),
  });
  const SafetensorsHeader header = parse_safetensors_header(bytes, bytes.size(), "t");
  ASSERT_EQ(header.tensors.size(), 3u);
  EXPECT_EQ(header.metadata.at("format"), "pt");
  EXPECT_EQ(header.tensors[0].name, "a.weight");
  EXPECT_EQ(header.tensors[0].dtype, SafetensorsDtype::F32);
  EXPECT_EQ(header.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(header.tensors[0].data_begin, 0u);
  EXPECT_EQ(header.tensors[0].data_end, 24u);
  EXPECT_EQ(header.tensors[1].dtype, SafetensorsDtype::I64);
  EXPECT_EQ(header.tensors[1].data_begin, 24u);
  EXPECT_EQ(header.tensors[2].dtype, SafetensorsDtype::BF16);
  EXPECT_EQ(header.tensors[2].n_elements(), 1);
  // Data starts right after the 8-byte length and the JSON.
  const uint64_t json_bytes = bytes.size() - 8 - 24 - 16 - 2;
  EXPECT_EQ(header.data_section_offset, 8 + json_bytes);
}

TEST(Safetensors, AcceptsScalarsAndEmptyTensors) {
  const auto bytes = testing::build_raw(
      R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"F16","shape":[0,5],"data_offsets":[4,4]}})", 4);
  const SafetensorsHeader header = parse_safetensors_header(bytes, bytes.size(), "t");
  ASSERT_EQ(header.tensors.size(), 2u);  // sorted by name
  EXPECT_EQ(header.tensors[0].name, "e");
  EXPECT_EQ(header.tensors[0].n_elements(), 0);
  EXPECT_EQ(header.tensors[1].n_elements(), 1);
}

struct BrokenCase {
  const char* what;
  std::vector<uint8_t> bytes;
  const char* expected;
};

TEST(Safetensors, RejectsBrokenHeadersNamingTheProblem) {
  const auto tensor = [](const std::string& body) { return std::string(R"({"w":)") + body + "}"; };
  const std::vector<BrokenCase> cases = {
      {"shorter than the length field", {1, 2, 3}, "at least the 8-byte header length"},
      {"length past the end", testing::build_raw("{}", 0), ""},  // patched below
      {"not JSON", testing::build_raw("{\"w\": ", 0), "not valid JSON"},
      {"JSON array", testing::build_raw("[1,2]", 0), "expected an object"},
      {"unknown dtype", testing::build_raw(tensor(R"({"dtype":"F128","shape":[1],"data_offsets":[0,16]})"), 16), "unknown dtype \"F128\""},
      {"shape x dtype != span", testing::build_raw(tensor(R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,12]})"), 12), "needs 16 bytes"},
      {"end past data", testing::build_raw(tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), 4), "past the data section"},
      {"begin after end", testing::build_raw(tensor(R"({"dtype":"F32","shape":[0],"data_offsets":[8,4]})"), 8), "begin is after end"},
      {"negative dim", testing::build_raw(tensor(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), 4), "non-negative integers"},
      {"fractional dim", testing::build_raw(tensor(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"), 4), "non-negative integers"},
      {"missing offsets", testing::build_raw(tensor(R"({"dtype":"F32","shape":[1]})"), 4), "data_offsets: expected [begin, end]"},
      {"unknown field", testing::build_raw(tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1})"), 4), "unknown field \"x\""},
      {"entry not an object", testing::build_raw(R"({"w":[1]})", 0), "expected an object with dtype"},
      {"overlap", testing::build_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "overlap"},
      {"duplicate", testing::build_raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "tensor a appears twice"},
      {"metadata value", testing::build_raw(R"({"__metadata__":{"k":1}})", 0), "__metadata__.k: expected a string"},
      {"deep nesting", testing::build_raw(R"({"w":{"dtype":"F32","shape":[[[[[1]]]]],"data_offsets":[0,4]}})", 4), "nests deeper"},
      {"empty name", testing::build_raw(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), "empty name"},
      {"element count overflow", testing::build_raw(tensor(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})"), 4), "too many"},
  };
  for (BrokenCase c : cases) {
    if (std::string(c.what) == "length past the end") {
      c.bytes[0] = 200;  // claims 200 header bytes, the file has 2
      c.expected = "exceeds the file";
    }
    EXPECT_THAT(error_of(c.bytes), HasSubstr(c.expected)) << c.what;
    EXPECT_THAT(error_of(c.bytes), HasSubstr("t.safetensors")) << c.what;
  }
}

TEST(Safetensors, RejectsHeaderLengthAboveTheLimitWithoutReadingIt) {
  std::vector<uint8_t> prefix(8, 0);
  const uint64_t claimed = kMaxSafetensorsHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(claimed >> (8 * i));
  try {
    parse_safetensors_header(prefix, claimed + 100, "big.safetensors");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("exceeds the limit"));
  }
}

TEST(Checkpoint, ReadsF32F16Bf16AsF32AndI64Exactly) {
  TempDir dir;
  // f16 0x3E00 = 1.5, 0xC000 = -2, 0x0001 = 2^-24 (subnormal); bf16 0x3FC0 = 1.5, 0xBF80 = -1.
  testing::write_bytes(dir.file("model.safetensors"),
                       testing::build_safetensors({
                           testing::f32_tensor("f", {2}, {0.25f, -3.0f}),
                           testing::u16_tensor("h", "F16", {3}, {0x3E00, 0xC000, 0x0001}),
                           testing::u16_tensor("b", "BF16", {2}, {0x3FC0, 0xBF80}),
                           testing::i64_tensor("i", {2}, {23703573157769, -5}),
                           testing::u16_tensor("x", "I16", {1}, {7}),
                       }));
  const auto ckpt = HfCheckpoint::open(dir.path().string());
  EXPECT_EQ(ckpt->read_f32("f"), (std::vector<float>{0.25f, -3.0f}));
  EXPECT_EQ(ckpt->read_f32("h"), (std::vector<float>{1.5f, -2.0f, 5.9604644775390625e-08f}));
  EXPECT_EQ(ckpt->read_f32("b"), (std::vector<float>{1.5f, -1.0f}));
  EXPECT_EQ(ckpt->read_i64("i"), (std::vector<int64_t>{23703573157769, -5}));
  std::vector<float> tail(1);
  ckpt->read_f32("h", 1, tail);
  EXPECT_EQ(tail[0], -2.0f);
  std::vector<float> two(2);
  EXPECT_THROW(ckpt->read_f32("h", 2, two), Error);
  try {
    ckpt->read_f32("x");
    FAIL() << "I16 weights must be refused";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor x: dtype I16 is not supported"));
  }
  EXPECT_THROW(ckpt->read_i64("f"), Error);
  try {
    ckpt->expect_shape("f", {3});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor f: expected shape [3], found [2]"));
  }
  try {
    ckpt->tensor("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing tensor nope"));
  }
}

TEST(Checkpoint, FollowsTheShardIndex) {
  TempDir dir;
  testing::write_bytes(dir.file("model-00001-of-00002.safetensors"),
                       testing::build_safetensors({testing::f32_tensor("a", {1}, {1.0f})}));
  testing::write_bytes(dir.file("model-00002-of-00002.safetensors"),
                       testing::build_safetensors({testing::f32_tensor("b", {2}, {2.0f, 3.0f})}));
  testing::write_text(dir.file("model.safetensors.index.json"),
                      R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  const auto ckpt = HfCheckpoint::open(dir.path().string());
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ckpt->read_f32("b"), (std::vector<float>{2.0f, 3.0f}));

  // The index must agree with the shards, both ways.
  testing::write_text(dir.file("model.safetensors.index.json"),
                      R"({"weight_map":{"a":"model-00002-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  EXPECT_THROW(HfCheckpoint::open(dir.path().string()), Error);
  testing::write_text(dir.file("model.safetensors.index.json"),
                      R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  try {
    HfCheckpoint::open(dir.path().string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("maps tensor c"));
  }
  testing::write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":"../etc/passwd"}})");
  EXPECT_THROW(HfCheckpoint::open(dir.path().string()), Error);
}

TEST(Checkpoint, RefusesADirectoryWithoutWeights) {
  TempDir dir;
  try {
    HfCheckpoint::open(dir.path().string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no model*.safetensors"));
  }
}

TEST(Safetensors, FuzzSeedsBehaveAsNamed) {
  // tests/data/fuzz/safetensors: valid_* parse, broken_* are refused.
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(STRATA_TEST_DATA_DIR) + "/fuzz/safetensors")) {
    const std::string name = entry.path().filename().string();
    const std::string bytes = testing::read_text(entry.path().string());
    const std::vector<uint8_t> data(bytes.begin(), bytes.end());
    if (name.rfind("valid_", 0) == 0) {
      EXPECT_NO_THROW(parse_safetensors_header(data, data.size(), name)) << name;
    } else {
      EXPECT_THROW(parse_safetensors_header(data, data.size(), name), Error) << name;
    }
    ++seen;
  }
  EXPECT_GE(seen, 6);
}

}  // namespace
}  // namespace strata::convert
