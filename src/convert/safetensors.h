// safetensors — a validated, read-only view of one `.safetensors` file.
//
// Format: u64 little-endian header length N, N bytes of JSON, then the raw tensor data. The JSON is
// an object mapping tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the first byte after the header) plus an optional "__metadata__" string→string map.
//
// Contract
// - `parse_safetensors_header` validates everything before returning: N within the file and at most
//   kMaxSafetensorsHeaderBytes, UTF-8 JSON that is an object, no duplicate names, no unknown fields,
//   a known dtype (an unknown one is named), non-negative shape dims whose element count × dtype
//   size equals end − begin without overflow, begin ≤ end ≤ data section size, and no two tensors'
//   byte ranges overlapping. Any violation throws strata::Error naming `origin`, the tensor and the
//   field, with expected vs found. It never reads outside `file_prefix`. Safe to fuzz.
// - The parser accepts every safetensors dtype so it can check sizes; *conversion* accepts only
//   F32/F16/BF16 weights (and I64 for integer constants) and names any other dtype when asked for it
//   (see `read_f32` / `read_i64` in checkpoint.h).
// - `SafetensorsFile::open` maps the file read-only (MAP_PRIVATE) and keeps it mapped for its
//   lifetime; it is immutable after open and safe to share across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::convert {

// The official implementation refuses headers above 100 MB; so do we.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

enum class SafetensorsDtype {
  BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2,
};
std::string_view dtype_name(SafetensorsDtype dtype);
size_t dtype_bytes(SafetensorsDtype dtype);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::F32;
  std::vector<int64_t> shape;  // PyTorch order: [out, in] for a Linear weight
  uint64_t data_begin = 0;     // relative to the data section
  uint64_t data_end = 0;
  int64_t n_elements() const;
  uint64_t n_bytes() const { return data_end - data_begin; }
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t data_section_offset = 0;  // 8 + N: where tensor data starts in the file
};

// Parses the header at the start of a file of `file_size` bytes. `file_prefix` holds the first
// bytes of the file (at least 8 + N of them are needed; fewer throws). `origin` names the file in
// errors.
SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> file_prefix, uint64_t file_size,
                                           std::string_view origin);

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<SafetensorsTensor>& tensors() const { return header_.tensors; }
  const SafetensorsTensor* find(std::string_view name) const;
  // The tensor's raw little-endian bytes inside the mapping.
  std::span<const uint8_t> bytes(const SafetensorsTensor& tensor) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace strata::convert
