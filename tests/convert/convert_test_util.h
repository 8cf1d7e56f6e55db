// Test helpers for src/convert: a scratch directory and a minimal safetensors writer, so tests can
// build valid and deliberately broken checkpoints byte by byte.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/ggml_type.h"

namespace strata::convert::testing {

// A fresh directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct TestTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // little-endian raw bytes
};

TestTensor f32_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& values);
TestTensor i64_tensor(std::string name, std::vector<int64_t> shape, const std::vector<int64_t>& values);
TestTensor u16_tensor(std::string name, std::string dtype, std::vector<int64_t> shape,
                      const std::vector<uint16_t>& values);
// Deterministic pseudo-random values in [-1, 1) from `seed`.
std::vector<float> random_values(size_t n, uint64_t seed);

// A complete safetensors file: 8-byte length, JSON header (tensors in the given order, data
// packed back to back), data.
std::vector<uint8_t> build_safetensors(const std::vector<TestTensor>& tensors);
// A file with a hand-written header followed by `data_bytes` zero bytes.
std::vector<uint8_t> build_raw(const std::string& header_json, size_t data_bytes);

// A converted tensor's values as f32 (dequantized when stored quantized), in ggml order.
std::vector<float> gguf_tensor_f32(const GgufFile& file, const std::string& name);
// Converts `hf_dir` with `strata::convert` into `out` (no progress bar).
void convert_dir(const std::string& hf_dir, const std::string& out, GgmlType type = GgmlType::F32,
                 std::optional<GgmlType> expert_type = std::nullopt, bool include_mtp = true);

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);
void write_text(const std::string& path, const std::string& text);
std::string read_text(const std::string& path);

}  // namespace strata::convert::testing
