// HfCheckpoint — the tensors of a Hugging Face model directory, across all its safetensors shards.
//
// Layout accepted (as llama.cpp's converter does): `model.safetensors.index.json` with a
// "weight_map" of tensor name → shard file when present; otherwise every `model*.safetensors` file
// in the directory. Each shard is a validated, mmapped SafetensorsFile.
//
// Contract
// - `open` validates the index against the shards: every mapped tensor exists in the file the map
//   names, no shard holds a tensor the map does not list, no name appears in two shards. Errors
//   name the directory, the file and the tensor.
// - `tensor(name)` throws "DIR: missing tensor NAME" when absent; `expect_shape` throws with the
//   expected and found shapes.
// - Reads convert to f32 (F32 copied, F16/BF16 widened exactly); any other dtype is refused with
//   its name. `read_i64` reads I64 tensors (the PLE hash constants) exactly.
// - Immutable after open (reads only); safe to share across threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "convert/safetensors.h"

namespace strata::convert {

class HfCheckpoint {
 public:
  struct Entry {
    const SafetensorsFile* file = nullptr;
    const SafetensorsTensor* tensor = nullptr;
  };

  static std::unique_ptr<HfCheckpoint> open(const std::string& directory);

  const std::string& directory() const { return directory_; }
  bool has(std::string_view name) const { return entries_.find(name) != entries_.end(); }
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  const SafetensorsTensor& tensor(std::string_view name) const;
  // Throws "DIR: tensor NAME: expected shape [..], found [..]" on a mismatch.
  const SafetensorsTensor& expect_shape(std::string_view name, const std::vector<int64_t>& shape) const;

  std::vector<float> read_f32(std::string_view name) const;
  // Elements [first, first + out.size()) of the tensor in row-major order, as f32.
  void read_f32(std::string_view name, int64_t first, std::span<float> out) const;
  std::vector<int64_t> read_i64(std::string_view name) const;

 private:
  HfCheckpoint() = default;
  const Entry& entry(std::string_view name) const;
  std::string directory_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

// "[2560, 640, 512]"
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace strata::convert
