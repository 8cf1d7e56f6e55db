// GGUF container: a validated, read-only, memory-mapped view of a GGUF v2/v3 file.
//
// Contract
// - `GgufFile::open` maps the file and validates every header, KV and tensor-info field against
//   the file size before anything is exposed: no read past the end, no overflow in offset × size,
//   alignment honoured, duplicate keys / tensor names refused, unknown ggml type ids named in the
//   error, tensor data inside the file. Any violation throws strata::Error naming the file, the
//   field and what was expected vs found. A returned GgufFile is therefore safe to use blindly.
// - Metadata is typed: `get<uint32_t>("qwen4exp.block_count")` throws naming the key, its actual
//   type and the file when the key is missing or of another type. Integer getters accept any
//   integer KV type whose value fits the requested type (writers disagree on u32 vs u64).
// - Tensor data is reached through `tensor_data` (a pointer into the read-only mapping) or by
//   pread at `TensorInfo::file_offset` (the expert store does this, so experts are never in the
//   working set just because the file is mapped).
// - `GgufFile::open_from_memory` runs the same parser over a copy of a byte buffer (tests, fuzzing).
// - Layout rules beyond the spec, matching ggml's reader so that what llama.cpp refuses is refused
//   here too (one exception: ne = 0 is accepted, as the spec allows; ggml's reader divides by
//   ne[1..3], so GgufWriter refuses zero dimensions instead): tensor data offsets must be consecutive in tensor-info order (offset_i =
//   Σ_{j<i} pad(n_bytes_j)), which also rules out overlaps; general.alignment must be a u32 power of
//   two, a multiple of 8 and ≤ 1 MiB; strings ≤ 64 MiB and arrays ≤ 64 Mi elements. Only
//   offset + n_bytes must lie inside the file (the last tensor's trailing padding may be absent).
// - Immutable after open; safe to share across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "quant/ggml_type.h"

namespace strata {

enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view gguf_value_type_name(GgufValueType type);

// One metadata value. Arrays are homogeneous and never nested (ggml refuses nested arrays).
struct GgufArray {
  GgufValueType element_type = GgufValueType::U8;
  // Exactly one of these is filled, matching element_type (bool/ints widened, floats to double).
  std::vector<int64_t> ints;  // U8..I32, U64 (as bits), I64, BOOL
  std::vector<double> floats;
  std::vector<std::string> strings;
  size_t size() const;
  bool operator==(const GgufArray&) const = default;
};
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> value;
  bool operator==(const GgufValue&) const = default;
};
// "u32", "string", "array<i32>[12]": for error messages and `strata inspect`.
std::string gguf_value_type_description(const GgufValue& value);
// A short human-readable rendering; arrays show their first `max_array_elements` items and length.
std::string gguf_value_to_string(const GgufValue& value, size_t max_array_elements = 8);

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] varies fastest (PyTorch [out, in] -> ne = {in, out})
  uint64_t data_offset = 0;      // relative to the data section, as stored
  uint64_t file_offset = 0;      // absolute offset in the file
  uint64_t n_bytes = 0;
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const;      // bytes of one ne[0]-row
};

class GgufFile {
 public:
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses a copy of `bytes`; `name` stands in for the path in error messages. fd() is -1.
  static std::unique_ptr<GgufFile> open_from_memory(std::span<const uint8_t> bytes,
                                                    const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return file_size_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_section_offset() const { return data_offset_; }

  // Metadata.
  bool has(std::string_view key) const;
  const GgufValue* find(std::string_view key) const;
  const std::vector<std::string>& keys() const { return key_order_; }  // file order
  // T: uint8_t..uint64_t, int8_t..int64_t, float, double, bool, std::string,
  //    std::vector<int64_t>, std::vector<float>, std::vector<std::string>, and also
  //    std::vector<int32_t>, std::vector<uint32_t>, std::vector<double> (see extern templates below).
  // Floats accept F32 or F64; integer arrays accept any integer element type whose values fit.
  template <typename T> T get(std::string_view key) const;
  // The array stored under `key`; throws naming key, actual type and file when absent or not an array.
  const GgufArray& get_array(std::string_view key) const;
  template <typename T> T get_or(std::string_view key, T fallback) const {
    return has(key) ? get<T>(key) : fallback;
  }
  std::string architecture() const { return get<std::string>("general.architecture"); }

  // Tensors, in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Throws naming the file and tensor when absent.
  const TensorInfo& tensor(std::string_view name) const;
  const uint8_t* tensor_data(const TensorInfo& info) const { return base_ + info.file_offset; }
  // The whole file as mapped (or held in memory): every tensor_data pointer lies inside it.
  const uint8_t* mapped_data() const { return base_; }
  // The raw fd (read-only) for pread-based access; valid while the GgufFile lives.
  int fd() const { return fd_; }
  // madvise on the page-aligned span of the mapping covering [offset, offset + length) (no-op for
  // in-memory files). With experts streamed, DensePrefetch (gguf/mapping_advice.h) sets MADV_RANDOM
  // on the expert ranges only, so faults there never read neighbouring bytes ahead, and reads the
  // dense ranges in ahead of the first token.
  void advise(uint64_t offset, uint64_t length, int advice) const;

  // Replaces the pages of [offset, offset + length) (widened to whole pages) with an anonymous copy
  // of the same bytes, at the same addresses, in memory that may use transparent huge pages; see
  // gguf/resident_weights.h, the only caller. Returns the bytes copied (0: nothing changed: an
  // in-memory file, or a system call refused, in which case the range stays mapped from the file).
  // Not thread-safe: no other thread may read the range while it runs.
  uint64_t copy_in_place(uint64_t offset, uint64_t length) const;

 private:
  GgufFile() = default;
  friend class GgufParser;
  const GgufValue& require(std::string_view key) const;  // throws when the key is missing
  std::vector<uint8_t> owned_bytes_;  // backing store for open_from_memory
  size_t mapped_bytes_ = 0;           // length of the mmap (0: nothing mapped)
  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t file_size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::string> key_order_;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// The supported get<T> types (defined in gguf_file.cpp); any other T fails to link.
extern template uint8_t GgufFile::get<uint8_t>(std::string_view) const;
extern template uint16_t GgufFile::get<uint16_t>(std::string_view) const;
extern template uint32_t GgufFile::get<uint32_t>(std::string_view) const;
extern template uint64_t GgufFile::get<uint64_t>(std::string_view) const;
extern template int8_t GgufFile::get<int8_t>(std::string_view) const;
extern template int16_t GgufFile::get<int16_t>(std::string_view) const;
extern template int32_t GgufFile::get<int32_t>(std::string_view) const;
extern template int64_t GgufFile::get<int64_t>(std::string_view) const;
extern template float GgufFile::get<float>(std::string_view) const;
extern template double GgufFile::get<double>(std::string_view) const;
extern template bool GgufFile::get<bool>(std::string_view) const;
extern template std::string GgufFile::get<std::string>(std::string_view) const;
extern template std::vector<int64_t> GgufFile::get<std::vector<int64_t>>(std::string_view) const;
extern template std::vector<int32_t> GgufFile::get<std::vector<int32_t>>(std::string_view) const;
extern template std::vector<uint32_t> GgufFile::get<std::vector<uint32_t>>(std::string_view) const;
extern template std::vector<float> GgufFile::get<std::vector<float>>(std::string_view) const;
extern template std::vector<double> GgufFile::get<std::vector<double>>(std::string_view) const;
extern template std::vector<std::string> GgufFile::get<std::vector<std::string>>(
    std::string_view) const;

}  // namespace strata
