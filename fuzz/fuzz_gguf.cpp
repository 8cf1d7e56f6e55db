// libFuzzer target for the GGUF parser (see docs/fuzzing.md).
//
// Parses the input through the same code path as GgufFile::open (a byte span), then exercises
// what a consumer does with an accepted file: every getter on every key, every byte of every
// tensor (ASan flags any out-of-bounds view), and a write -> parse -> write fixed point: the
// writer must accept whatever the parser accepted and produce a file that parses to identical
// bytes again. Only strata::Error may escape the parser; any other exception, crash, leak or UB
// is a finding.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "util/error.h"

namespace {

template <typename T> void try_get(const strata::GgufFile& file, const std::string& key) {
  try {
    (void)file.get<T>(key);
  } catch (const strata::Error&) {
  }
}

std::vector<uint8_t> rewrite(const strata::GgufFile& file) {
  const strata::GgufWriter writer = strata::GgufWriter::from_file(file);
  return writer.write_memory([&](const strata::GgufTensorDecl& t, strata::GgufTensorSink& sink) {
    sink.write(std::span<const uint8_t>(file.tensor_data(file.tensor(t.name)), t.n_bytes));
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<strata::GgufFile> file;
  try {
    file = strata::GgufFile::open_from_memory(std::span<const uint8_t>(data, size), "fuzz.gguf");
  } catch (const strata::Error&) {
    return 0;
  }
  for (const std::string& key : file->keys()) {
    const strata::GgufValue* value = file->find(key);
    if (value == nullptr) __builtin_trap();
    (void)strata::gguf_value_to_string(*value);
    try_get<uint8_t>(*file, key);
    try_get<int32_t>(*file, key);
    try_get<uint64_t>(*file, key);
    try_get<int64_t>(*file, key);
    try_get<float>(*file, key);
    try_get<double>(*file, key);
    try_get<bool>(*file, key);
    try_get<std::string>(*file, key);
    try_get<std::vector<int32_t>>(*file, key);
    try_get<std::vector<uint32_t>>(*file, key);
    try_get<std::vector<float>>(*file, key);
    try_get<std::vector<std::string>>(*file, key);
  }
  uint64_t checksum = 0;
  for (const strata::TensorInfo& t : file->tensors()) {
    if (file->find_tensor(t.name) != &t) __builtin_trap();
    if (t.file_offset + t.n_bytes > file->file_size()) __builtin_trap();
    const uint8_t* bytes = file->tensor_data(t);
    for (uint64_t i = 0; i < t.n_bytes; ++i) checksum += bytes[i];
    if (t.n_bytes > 0) checksum += t.row_bytes();
  }
  // The writer must accept every parsed file, and writing is a fixed point after one round.
  // Exception: zero-size dimensions are legal to read but the writer refuses them (they crash
  // ggml's reader), so such files skip this check.
  for (const strata::TensorInfo& t : file->tensors()) {
    if (t.n_elements() == 0) return 0;
  }
  const std::vector<uint8_t> once = rewrite(*file);
  const auto reparsed = strata::GgufFile::open_from_memory(once, "fuzz-rewritten.gguf");
  if (reparsed->keys() != file->keys() || reparsed->tensors().size() != file->tensors().size()) __builtin_trap();
  if (rewrite(*reparsed) != once) __builtin_trap();
  asm volatile("" : : "r"(checksum));  // keeps the tensor reads from being optimised away
  return 0;
}
