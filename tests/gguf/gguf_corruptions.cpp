// Broken variants of the every-type sample, one corrupted field each. Shared by the parser tests
// (each must fail with a message naming the field) and the fuzz seed corpus.
#include <limits>

#include "gguf_test_util.h"

namespace strata::test {
namespace {

std::vector<uint8_t> every_type_sample_bytes() {
  GgufWriter writer;
  build_every_type_sample(writer);
  ScratchDir dir("sample");
  writer.write_file(dir.file("sample.gguf"));
  return read_bytes(dir.file("sample.gguf"));
}

}  // namespace

std::vector<Corruption> corruptions_of_every_type_sample() {
  const std::vector<uint8_t> valid = every_type_sample_bytes();
  const GgufLayout layout = walk_layout(valid);
  const auto parsed = GgufFile::open_from_memory(valid, "sample");
  const TensorInfo& last = parsed->tensors().back();
  std::vector<Corruption> out;
  auto add = [&](std::string name, std::string fragment, auto&& edit) {
    Corruption c{std::move(name), valid, std::move(fragment)};
    edit(c.bytes);
    out.push_back(std::move(c));
  };
  using Bytes = std::vector<uint8_t>;
  constexpr uint64_t kHuge = uint64_t{1} << 62;

  add("magic", "header magic: expected 'GGUF'", [](Bytes& b) { b[3] = 'X'; });
  add("version1", "header version: expected 2 or 3, found 1", [](Bytes& b) { poke<uint32_t>(b, 4, 1); });
  add("version4", "header version: expected 2 or 3, found 4", [](Bytes& b) { poke<uint32_t>(b, 4, 4); });
  add("version0", "header version: expected 2 or 3, found 0", [](Bytes& b) { poke<uint32_t>(b, 4, 0); });
  add("byteswapped", "byte-swapped", [](Bytes& b) { poke<uint32_t>(b, 4, 0x03000000); });
  add("tensor_count", "header tensor_count", [](Bytes& b) { poke<uint64_t>(b, 8, uint64_t{1} << 40); });
  add("kv_count", "header kv_count", [&](Bytes& b) { poke<uint64_t>(b, 16, kHuge); });
  add("kv_count_off_by_one", "tensor #0 name", [&](Bytes& b) { poke<uint64_t>(b, 16, layout.kvs.size() + 1); });
  add("key_length", "key #1: string length", [&](Bytes& b) { poke<uint64_t>(b, layout.kvs[1].key_length_at, kHuge); });
  add("empty_key", "key #1: expected a non-empty key", [&](Bytes& b) { poke<uint64_t>(b, layout.kvs[1].key_length_at, 0); });
  add("value_string_length", "key 'general.architecture' value: string length 100000 at offset 64 runs past the end",
      [&](Bytes& b) { poke<uint64_t>(b, layout.kv("general.architecture").value_at, 100000); });
  add("value_string_huge", "key 'sample.string' value: string length",
      [&](Bytes& b) { poke<uint64_t>(b, layout.kv("sample.string").value_at, kHuge); });
  add("array_count_huge", "key 'sample.arr_u32': array count",
      [&](Bytes& b) { poke<uint64_t>(b, layout.kv("sample.arr_u32").value_at + 4, kHuge); });
  add("array_count_past_eof", "key 'sample.arr_u32': array of 1000000 u32 elements needs at least",
      [&](Bytes& b) { poke<uint64_t>(b, layout.kv("sample.arr_u32").value_at + 4, 1000000); });
  add("string_array_count", "key 'sample.arr_string': array of",
      [&](Bytes& b) { poke<uint64_t>(b, layout.kv("sample.arr_string").value_at + 4, 1u << 24); });
  add("value_type", "key 'sample.u8' value type: expected a GGUF value type id 0..12, found 99",
      [&](Bytes& b) { poke<uint32_t>(b, layout.kv("sample.u8").type_at, 99); });
  add("array_element_type", "key 'sample.arr_u8' array element type",
      [&](Bytes& b) { poke<uint32_t>(b, layout.kv("sample.arr_u8").value_at, 13); });
  add("nested_array", "key 'sample.arr_u8': nested arrays are not supported",
      [&](Bytes& b) { poke<uint32_t>(b, layout.kv("sample.arr_u8").value_at, 9); });
  add("bool_value", "key 'sample.bool' value: bool must be 0 or 1, found 2",
      [&](Bytes& b) { b[layout.kv("sample.bool").value_at] = 2; });
  add("bool_array_element", "key 'sample.arr_bool' element 1: bool must be 0 or 1, found 5",
      [&](Bytes& b) { b[layout.kv("sample.arr_bool").value_at + 12 + 1] = 5; });
  add("duplicate_key", "key 'sample.u8' (#", [&](Bytes& b) {
    b[layout.kv("sample.i8").key_length_at + 8 + 7] = 'u';  // "sample.i8" -> "sample.u8"
  });
  add("alignment_value", "key 'general.alignment': expected a power of two, multiple of 8",
      [&](Bytes& b) { poke<uint32_t>(b, layout.kv("general.alignment").value_at, 48); });
  add("alignment_small", "key 'general.alignment': expected a power of two, multiple of 8",
      [&](Bytes& b) { poke<uint32_t>(b, layout.kv("general.alignment").value_at, 4); });
  add("alignment_zero", "key 'general.alignment'",
      [&](Bytes& b) { poke<uint32_t>(b, layout.kv("general.alignment").value_at, 0); });
  add("alignment_type", "key 'general.alignment': expected type u32, found i32",
      [&](Bytes& b) { poke<uint32_t>(b, layout.kv("general.alignment").type_at, 5); });
  add("tensor_name_length", "tensor #0 name: string length 64 exceeds the maximum of 63",
      [&](Bytes& b) { poke<uint64_t>(b, layout.tensors[0].name_length_at, 64); });
  add("tensor_name_nul", "tensor #0 name: tensor name contains a NUL byte",
      [&](Bytes& b) { b[layout.tensors[0].name_length_at + 8 + 1] = 0; });
  add("duplicate_tensor", "tensor 'a.f32': duplicate tensor name", [&](Bytes& b) {
    const uint64_t at = layout.tensor("b.f16").name_length_at + 8;
    b[at] = 'a'; b[at + 2] = 'f'; b[at + 3] = '3'; b[at + 4] = '2';  // "b.f16" -> "a.f32"
  });
  add("n_dims_5", "tensor 'a.f32': n_dims: expected 1..4, found 5",
      [&](Bytes& b) { poke<uint32_t>(b, layout.tensor("a.f32").n_dims_at, 5); });
  add("n_dims_0", "tensor 'a.f32': n_dims: expected 1..4, found 0",
      [&](Bytes& b) { poke<uint32_t>(b, layout.tensor("a.f32").n_dims_at, 0); });
  add("ne_negative", "tensor 'a.f32': ne[0]: expected a value in 0..2^63-1",
      [&](Bytes& b) { poke<uint64_t>(b, layout.tensor("a.f32").ne_at[0], std::numeric_limits<uint64_t>::max()); });
  add("ne_overflow", "tensor 'c_exps.q8_0': ne[2] = 4294967296: the element count overflows int64", [&](Bytes& b) {
    poke<uint64_t>(b, layout.tensor("c_exps.q8_0").ne_at[0], uint64_t{1} << 32);
    poke<uint64_t>(b, layout.tensor("c_exps.q8_0").ne_at[2], uint64_t{1} << 32);
  });
  add("ne_bytes_overflow", "tensor 'a.f32': size in bytes", [&](Bytes& b) {
    poke<uint64_t>(b, layout.tensor("a.f32").ne_at[0], uint64_t{1} << 62);
  });
  add("ne0_block", "tensor 'c_exps.q8_0': ne[0] = 33 is not a multiple of the q8_0 block size 32",
      [&](Bytes& b) { poke<uint64_t>(b, layout.tensor("c_exps.q8_0").ne_at[0], 33); });
  add("type_id", "tensor 'a.f32': unknown ggml type id 77",
      [&](Bytes& b) { poke<uint32_t>(b, layout.tensor("a.f32").type_at, 77); });
  add("type_id_removed", "tensor 'a.f32': unknown ggml type id 4",
      [&](Bytes& b) { poke<uint32_t>(b, layout.tensor("a.f32").type_at, 4); });
  add("offset_unaligned", "tensor 'b.f16': offset 33 is not a multiple of the alignment 32",
      [&](Bytes& b) { poke<uint64_t>(b, layout.tensor("b.f16").offset_at, 33); });
  add("offset_gap", "tensor 'b.f16': offset: expected 32", [&](Bytes& b) {
    poke<uint64_t>(b, layout.tensor("b.f16").offset_at, 64);
  });
  add("offset_overlap", "tensor 'b.f16': offset: expected 32 (tensor data must be consecutive", [&](Bytes& b) {
    poke<uint64_t>(b, layout.tensor("b.f16").offset_at, 0);
  });
  add("past_eof", "tensor 'c_exps.q8_0': data [", [&](Bytes& b) {
    poke<uint64_t>(b, layout.tensor("c_exps.q8_0").ne_at[2], 100);
  });
  add("truncated_data", "tensor 'c_exps.q8_0': data [", [&](Bytes& b) {
    b.resize(last.file_offset + last.n_bytes - 1);
  });
  add("truncated_infos", "(truncated?)", [&](Bytes& b) { b.resize(layout.infos_end - 3); });
  add("truncated_padding", "data section: starts at offset", [&](Bytes& b) { b.resize(layout.infos_end + 1); });
  add("empty_file", "header magic: file is 0 bytes", [](Bytes& b) { b.clear(); });
  add("header_only", "header kv_count: needs 8 bytes", [](Bytes& b) { b.resize(18); });
  return out;
}

}  // namespace strata::test

namespace strata::test {

void write_fuzz_seeds(const std::string& dir) {
  {
    GgufWriter writer;
    writer.add_string("general.architecture", "minimal");
    writer.write_file(dir + "/valid_minimal.gguf");
  }
  {
    GgufWriter writer;
    build_every_type_sample(writer);
    writer.write_file(dir + "/valid_every_type.gguf");
  }
  {
    // Alignment 64, a zero-size tensor, a 4-D tensor, a K-quant and a 256-block IQ type.
    GgufWriter writer;
    writer.add_string("general.architecture", "edge");
    writer.set_alignment(64);
    writer.add_u32("general.quantization_version", 2);
    writer.add_tensor("four_d", GgmlType::BF16, {2, 1, 3, 2}, std::vector<uint8_t>(24, 0x3f));
    writer.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::Q4_K, {256, 1, 2}, std::vector<uint8_t>(288, 0x11));
    writer.add_tensor("iq", GgmlType::IQ2_XS, {256}, std::vector<uint8_t>(74, 0x22));
    writer.add_tensor("empty", GgmlType::F32, {32, 1}, std::vector<uint8_t>(128, 0));
    std::vector<uint8_t> bytes = writer.write_memory();
    poke<uint64_t>(bytes, walk_layout(bytes).tensor("empty").ne_at[1], 0);  // zero-size, still valid
    write_bytes(dir + "/valid_edge_cases.gguf", bytes);
  }
  for (const Corruption& c : corruptions_of_every_type_sample()) {
    write_bytes(dir + "/broken_" + c.name + ".gguf", c.bytes);
  }
}

}  // namespace strata::test
