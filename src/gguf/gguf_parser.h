// GgufParser — internal to src/gguf: validates a GGUF byte image and fills a GgufFile.
//
// The parser works over a byte span (an mmap of the file or a buffer in memory), so the file path
// and the fuzz target exercise exactly the same code. It never reads outside the span, never
// multiplies without an overflow check, and never reserves memory for a count before checking
// that the remaining bytes could hold that many items. Every failure throws strata::Error naming
// the file, the field and expected vs found. Not thread-safe; one parser per file, used once.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "gguf/gguf.h"

namespace strata {

class GgufParser {
 public:
  GgufParser(GgufFile& file, std::span<const uint8_t> bytes);
  void parse();

 private:
  void parse_header();
  void parse_kv(uint64_t index);
  GgufValue parse_array(const std::string& where);
  void check_alignment_key();
  void parse_tensor_info(uint64_t index);
  void place_tensor_data();

  [[noreturn]] void fail_at(std::string_view where, std::string_view what) const;
  uint64_t remaining() const { return size_ - pos_; }
  void need(uint64_t n_bytes, std::string_view where) const;
  template <typename T> T read(std::string_view where);
  std::string read_string(std::string_view where, uint64_t max_bytes);
  GgufValueType read_value_type(std::string_view where);

  GgufFile& file_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
};

}  // namespace strata
