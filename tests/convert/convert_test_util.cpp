#include "convert_test_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "convert/convert.h"
#include "quant/quant.h"

namespace strata::convert::testing {

TempDir::TempDir() {
  static int counter = 0;
  path_ = std::filesystem::temp_directory_path() /
          fmt::format("strata-convert-test-{}-{}", ::getpid(), counter++);
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

TestTensor f32_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& values) {
  TestTensor t{std::move(name), "F32", std::move(shape), std::vector<uint8_t>(values.size() * 4)};
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

TestTensor i64_tensor(std::string name, std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  TestTensor t{std::move(name), "I64", std::move(shape), std::vector<uint8_t>(values.size() * 8)};
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

TestTensor u16_tensor(std::string name, std::string dtype, std::vector<int64_t> shape,
                      const std::vector<uint16_t>& values) {
  TestTensor t{std::move(name), std::move(dtype), std::move(shape), std::vector<uint8_t>(values.size() * 2)};
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

std::vector<uint8_t> build_raw(const std::string& header_json, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header_json.size() + data_bytes, 0);
  uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header_json.data(), header_json.size());
  return out;
}

std::vector<uint8_t> build_safetensors(const std::vector<TestTensor>& tensors) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t offset = 0;
  for (const TestTensor& t : tensors) {
    header += fmt::format(",\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", t.name, t.dtype,
                          fmt::join(t.shape, ","), offset, offset + t.data.size());
    offset += t.data.size();
  }
  header += "}";
  std::vector<uint8_t> out = build_raw(header, offset);
  size_t at = 8 + header.size();
  for (const TestTensor& t : tensors) {
    std::memcpy(out.data() + at, t.data.data(), t.data.size());
    at += t.data.size();
  }
  return out;
}

std::vector<float> gguf_tensor_f32(const GgufFile& file, const std::string& name) {
  const TensorInfo& info = file.tensor(name);
  std::vector<float> out(static_cast<size_t>(info.n_elements()));
  const uint8_t* data = file.tensor_data(info);
  const size_t row_stride = info.row_bytes();
  for (int64_t row = 0; row < info.n_elements() / info.ne[0]; ++row) {
    quant::dequantize_row(info.type, data + row * row_stride, out.data() + row * info.ne[0], info.ne[0]);
  }
  return out;
}

void convert_dir(const std::string& hf_dir, const std::string& out, GgmlType type,
                 std::optional<GgmlType> expert_type, bool include_mtp) {
  ConvertOptions options;
  options.hf_dir = hf_dir;
  options.out_path = out;
  options.type = type;
  options.expert_type = expert_type;
  options.include_mtp = include_mtp;
  options.show_progress = false;
  convert_hf_to_gguf(options);
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace strata::convert::testing
