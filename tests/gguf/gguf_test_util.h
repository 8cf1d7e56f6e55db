// Test helpers for the GGUF module: scratch directories, byte-level file access, a small
// independent walker that records where each field of a *valid* GGUF file sits (so tests can
// corrupt one field at a known offset), and the deterministic fixture generators.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace strata::test {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag);
  ~ScratchDir();
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }
  // Names of the regular files currently in the directory.
  std::vector<std::string> list() const;

 private:
  std::filesystem::path path_;
};

std::vector<uint8_t> read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

template <typename T> void poke(std::vector<uint8_t>& bytes, uint64_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// Byte offsets of the fields of a valid GGUF file, found by an independent walk.
struct KvLayout {
  std::string key;
  uint64_t key_length_at = 0;
  uint64_t type_at = 0;
  uint64_t value_at = 0;  // scalar value, or an array's element-type field
  GgufValueType type = GgufValueType::U8;
};
struct TensorLayout {
  std::string name;
  uint64_t name_length_at = 0;
  uint64_t n_dims_at = 0;
  uint64_t ne_at[4] = {};
  uint64_t type_at = 0;
  uint64_t offset_at = 0;
};
struct GgufLayout {
  std::vector<KvLayout> kvs;
  std::vector<TensorLayout> tensors;
  uint64_t infos_end = 0;
  const KvLayout& kv(const std::string& key) const;
  const TensorLayout& tensor(const std::string& name) const;
};
GgufLayout walk_layout(const std::vector<uint8_t>& bytes);

// The README fixture: arch qwen4exp, 2 layers, 8 experts, f32/f16/q8_0/q4_0 tensors (deterministic).
void build_tiny_qwen4exp(GgufWriter& writer);
void write_tiny_qwen4exp(const std::string& path);

// A small valid file with one KV of every value type and a few tensors (used by tests and seeds).
void build_every_type_sample(GgufWriter& writer);

// One way to break the every-type sample, and the fragment the error message must contain.
struct Corruption {
  std::string name;
  std::vector<uint8_t> bytes;
  std::string expected_fragment;
};
std::vector<Corruption> corruptions_of_every_type_sample();

// Writes the fuzz seed corpus (valid and broken files, each < 16 KB) into `dir`.
void write_fuzz_seeds(const std::string& dir);

}  // namespace strata::test
