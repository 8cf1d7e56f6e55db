// libFuzzer target for the safetensors header parser (see docs/fuzzing.md).
//
// Parses the input as a whole safetensors file (header + data in one byte span), then checks what
// the converter relies on for an accepted header: every tensor's byte range lies inside the input
// (touching its first and last byte lets ASan flag any out-of-bounds view), shape × dtype size
// equals the range, and ranges do not overlap. Only strata::Error may escape the parser; any other
// exception, crash, leak or UB is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "convert/safetensors.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::convert;
  SafetensorsHeader header;
  try {
    header = parse_safetensors_header(std::span<const uint8_t>(data, size), size, "fuzz.safetensors");
  } catch (const strata::Error&) {
    return 0;
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  volatile uint8_t sink = 0;
  for (const SafetensorsTensor& t : header.tensors) {
    const uint64_t begin = header.data_section_offset + t.data_begin;
    const uint64_t end = header.data_section_offset + t.data_end;
    if (end > size || begin > end) std::abort();
    if (static_cast<uint64_t>(t.n_elements()) * dtype_bytes(t.dtype) != t.n_bytes()) std::abort();
    if (end > begin) sink = sink ^ data[begin] ^ data[end - 1];
    ranges.emplace_back(begin, end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) std::abort();
  }
  (void)sink;
  return 0;
}
