// GgufWriter — builds a GGUF v3 file that ggml / llama.cpp read: metadata of every value type,
// tensor infos, tensor data padded with zeros to the alignment after every tensor (the last one
// included), offsets consecutive in declaration order (ggml's reader requires it).
//
// Usage
//   GgufWriter writer;
//   writer.add_string("general.architecture", "qwen4exp");
//   writer.add_u32("qwen4exp.block_count", 48);
//   writer.add_array_i32("qwen4exp.attention.compress_ratios", ratios);
//   writer.add_tensor("token_embd.weight", GgmlType::F16, {2560, 248320}, embd_bytes);  // copied
//   writer.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::Q4_K, {2560, 640, 512});   // streamed
//   writer.write_file("out.gguf", [&](const GgufTensorDecl& t, GgufTensorSink& sink) {
//     for (...) sink.write(chunk);  // exactly t.n_bytes in total, any number of calls
//   });
//
// Contract
// - Declare everything first, then `write_file` once. Tensors given without data are produced by
//   the callback, called once per such tensor in declaration order, so a converter holds one
//   tensor (or one chunk) in memory at a time.
// - The write is atomic (AtomicFile: temp file in the same directory, fsync, rename). If anything
//   fails — an I/O error, a callback that throws, a callback that writes too few or too many
//   bytes — the temp file is removed, nothing appears at the path, and the error propagates
//   (strata::Error naming the path and the errno text for I/O errors).
// - Bad declarations (empty or duplicate key, duplicate or too-long tensor name, n_dims outside
//   1..4, ne < 1 (ggml's reader divides by ne[1..3], so zero dimensions would crash llama.cpp), ne[0] not a multiple of the block size, a general.alignment that is not a
//   u32 power of two and multiple of 8, integer array values outside the element type) throw
//   strata::Error at the add_* call. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/ggml_type.h"

namespace strata {

class GgufOutput;  // internal: where write_file / write_memory send bytes

struct GgufTensorDecl {
  std::string name;
  GgmlType type = GgmlType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  uint64_t n_bytes = 0;
  uint64_t data_offset = 0;  // relative to the data section, as it will be stored
};

// Receives one tensor's bytes inside a write_file callback.
class GgufTensorSink {
 public:
  // Appends bytes to the current tensor; throws when the total would exceed its n_bytes.
  void write(std::span<const uint8_t> bytes);
  uint64_t bytes_written() const { return written_; }
  uint64_t bytes_expected() const { return expected_; }

 private:
  friend class GgufWriter;
  GgufTensorSink(GgufOutput& out, const GgufTensorDecl& tensor);
  GgufOutput& out_;
  const GgufTensorDecl& tensor_;
  uint64_t expected_ = 0;
  uint64_t written_ = 0;
};

class GgufWriter {
 public:
  using TensorProducer = std::function<void(const GgufTensorDecl& tensor, GgufTensorSink& sink)>;

  // A writer holding `source`'s metadata (same order) and tensor declarations (same order, no
  // data): write it with a producer that copies from source.tensor_data(), or edit it first.
  static GgufWriter from_file(const GgufFile& source);

  // Metadata, written in insertion order. Keys must be non-empty, < 64 KiB, and unique.
  void add(std::string key, GgufValue value);
  void add_u8(std::string key, uint8_t value);
  void add_i8(std::string key, int8_t value);
  void add_u16(std::string key, uint16_t value);
  void add_i16(std::string key, int16_t value);
  void add_u32(std::string key, uint32_t value);
  void add_i32(std::string key, int32_t value);
  void add_u64(std::string key, uint64_t value);
  void add_i64(std::string key, int64_t value);
  void add_f32(std::string key, float value);
  void add_f64(std::string key, double value);
  void add_bool(std::string key, bool value);
  void add_string(std::string key, std::string value);
  // Integer or bool arrays (element_type U8..I64 or BOOL; U64 values pass as their bits).
  void add_array(std::string key, GgufValueType element_type, std::span<const int64_t> values);
  // F32 or F64 arrays.
  void add_array(std::string key, GgufValueType element_type, std::span<const double> values);
  void add_array_i32(std::string key, std::span<const int32_t> values);
  void add_array_u32(std::string key, std::span<const uint32_t> values);
  void add_array_f32(std::string key, std::span<const float> values);
  void add_array_string(std::string key, std::span<const std::string> values);
  // Writes general.alignment (u32); same as add_u32("general.alignment", n). Default 32.
  void set_alignment(uint32_t alignment_bytes) { add_u32("general.alignment", alignment_bytes); }
  uint32_t alignment() const { return alignment_; }

  // Declares a tensor whose bytes the write_file callback will produce. ne = {ne0, ne1, ...}.
  // Returns the declaration (its data_offset is final once the alignment is no longer changed).
  GgufTensorDecl add_tensor(std::string name, GgmlType type, const std::vector<int64_t>& ne);
  // Declares a tensor and copies its bytes now (size must equal the tensor's n_bytes).
  GgufTensorDecl add_tensor(std::string name, GgmlType type, const std::vector<int64_t>& ne,
                            std::span<const uint8_t> data);
  const std::vector<GgufTensorDecl>& tensors() const { return tensors_; }

  // Header, KVs and tensor infos padded to the alignment: the file up to its data section.
  std::vector<uint8_t> serialize_metadata() const;
  // Writes the whole file atomically (see the contract above). `produce` may be empty when every
  // tensor was given its data at add_tensor.
  void write_file(const std::string& path, const TensorProducer& produce = nullptr) const;
  // The same bytes write_file would produce, in memory (tests, fuzzing, small files).
  std::vector<uint8_t> write_memory(const TensorProducer& produce = nullptr) const;

 private:
  void assign_offsets();
  void write_to(GgufOutput& out, const TensorProducer& produce) const;
  struct KeyValue {
    std::string key;
    GgufValue value;
  };
  std::vector<KeyValue> kvs_;
  std::set<std::string, std::less<>> key_names_;     // for the duplicate checks
  std::set<std::string, std::less<>> tensor_names_;
  std::vector<GgufTensorDecl> tensors_;
  std::vector<std::vector<uint8_t>> tensor_data_;  // parallel to tensors_
  std::vector<bool> has_data_;                      // parallel to tensors_
  uint32_t alignment_ = 32;
};

}  // namespace strata
