#include "convert/checkpoint.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "util/error.h"
#include "util/fp16.h"

namespace strata::convert {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read", path.string());
  std::stringstream text;
  text << in.rdbuf();
  const json parsed = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) fail("{}: not valid JSON", path.string());
  return parsed;
}

}  // namespace

std::string shape_to_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::unique_ptr<HfCheckpoint> HfCheckpoint::open(const std::string& directory) {
  const fs::path dir(directory);
  std::unique_ptr<HfCheckpoint> checkpoint(new HfCheckpoint());
  checkpoint->directory_ = directory;

  const fs::path index_path = dir / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor → shard file name
  std::vector<std::string> shard_names;
  if (fs::is_regular_file(index_path)) {
    const json index = read_json_file(index_path);
    const auto map_it = index.is_object() ? index.find("weight_map") : index.end();
    if (map_it == index.end() || !map_it->is_object()) {
      fail("{}: expected an object \"weight_map\" of tensor name -> file", index_path.string());
    }
    std::set<std::string> unique_shards;
    for (const auto& [name, file] : map_it->items()) {
      if (!file.is_string()) fail("{}: weight_map.{}: expected a file name", index_path.string(), name);
      const std::string shard = file.get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
        fail("{}: weight_map.{}: \"{}\" is not a file name in the directory", index_path.string(),
             name, shard);
      }
      weight_map[name] = shard;
      unique_shards.insert(shard);
    }
    shard_names.assign(unique_shards.begin(), unique_shards.end());
  } else {
    std::error_code error;
    for (const auto& item : fs::directory_iterator(dir, error)) {
      const std::string name = item.path().filename().string();
      if (item.is_regular_file() && name.rfind("model", 0) == 0 && name.size() > 12 &&
          name.ends_with(".safetensors")) {
        shard_names.push_back(name);
      }
    }
    if (error) fail("{}: cannot list the directory: {}", directory, error.message());
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) {
      fail("{}: no model*.safetensors files and no model.safetensors.index.json", directory);
    }
  }

  for (const std::string& shard : shard_names) {
    const fs::path path = dir / shard;
    if (!fs::is_regular_file(path)) {
      fail("{}: the index names shard {}, which does not exist", directory, shard);
    }
    checkpoint->files_.push_back(SafetensorsFile::open(path.string()));
    const SafetensorsFile& file = *checkpoint->files_.back();
    for (const SafetensorsTensor& tensor : file.tensors()) {
      if (!weight_map.empty()) {
        const auto it = weight_map.find(tensor.name);
        if (it == weight_map.end() || it->second != shard) {
          fail("{}: tensor {} is in {} but the index maps it to {}", directory, tensor.name, shard,
               it == weight_map.end() ? std::string("nothing") : it->second);
        }
      }
      const auto [_, inserted] = checkpoint->entries_.emplace(tensor.name, Entry{&file, &tensor});
      if (!inserted) fail("{}: tensor {} appears in two shards (second: {})", directory, tensor.name, shard);
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (!checkpoint->has(name)) {
      fail("{}: the index maps tensor {} to {}, which does not contain it", directory, name, shard);
    }
  }
  return checkpoint;
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, _] : entries_) out.push_back(name);
  return out;
}

const HfCheckpoint::Entry& HfCheckpoint::entry(std::string_view name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) fail("{}: missing tensor {}", directory_, name);
  return it->second;
}

const SafetensorsTensor& HfCheckpoint::tensor(std::string_view name) const {
  return *entry(name).tensor;
}

const SafetensorsTensor& HfCheckpoint::expect_shape(std::string_view name,
                                                    const std::vector<int64_t>& shape) const {
  const SafetensorsTensor& found = tensor(name);
  if (found.shape != shape) {
    fail("{}: tensor {}: expected shape {}, found {}", directory_, name, shape_to_string(shape),
         shape_to_string(found.shape));
  }
  return found;
}

void HfCheckpoint::read_f32(std::string_view name, int64_t first, std::span<float> out) const {
  const Entry& e = entry(name);
  const SafetensorsTensor& t = *e.tensor;
  const int64_t count = static_cast<int64_t>(out.size());
  if (first < 0 || first > t.n_elements() || count > t.n_elements() - first) {
    fail("{}: tensor {}: read of elements [{}, {}) outside its {} elements", directory_, name, first,
         first + count, t.n_elements());
  }
  const uint8_t* src = e.file->bytes(t).data();
  switch (t.dtype) {
    case SafetensorsDtype::F32:
      std::memcpy(out.data(), src + first * 4, out.size() * 4);
      return;
    case SafetensorsDtype::F16:
    case SafetensorsDtype::BF16: {
      const uint8_t* p = src + first * 2;
      const bool is_f16 = t.dtype == SafetensorsDtype::F16;
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t bits = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
        out[i] = is_f16 ? f16_to_f32(bits) : bf16_to_f32(bits);
      }
      return;
    }
    default:
      fail("{}: tensor {}: dtype {} is not supported for weights (expected F32, F16 or BF16)",
           directory_, name, dtype_name(t.dtype));
  }
}

std::vector<float> HfCheckpoint::read_f32(std::string_view name) const {
  std::vector<float> out(static_cast<size_t>(tensor(name).n_elements()));
  read_f32(name, 0, out);
  return out;
}

std::vector<int64_t> HfCheckpoint::read_i64(std::string_view name) const {
  const Entry& e = entry(name);
  if (e.tensor->dtype != SafetensorsDtype::I64) {
    fail("{}: tensor {}: expected dtype I64, found {}", directory_, name, dtype_name(e.tensor->dtype));
  }
  std::vector<int64_t> out(static_cast<size_t>(e.tensor->n_elements()));
  std::memcpy(out.data(), e.file->bytes(*e.tensor).data(), out.size() * 8);
  return out;
}

}  // namespace strata::convert
