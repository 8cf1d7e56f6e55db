#include "serve/batch_groups.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <fstream>
#include <system_error>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "util/error.h"
#include "util/progress.h"

namespace strata::serve {
namespace {

// The first line of a sysfs attribute, "" when it cannot be read.
std::string read_line(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// A sysfs cache size: decimal digits and an optional K, M or G (binary units); 0 if malformed.
uint64_t parse_cache_size(std::string_view text) {
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data()) return 0;
  const std::string_view suffix(end, text.data() + text.size() - end);
  if (suffix.empty()) return value;
  if (suffix == "K") return value << 10;
  if (suffix == "M") return value << 20;
  if (suffix == "G") return value << 30;
  return 0;
}

}  // namespace

bool weights_fit_cache(uint64_t step_bytes, uint64_t llc_bytes) {
  return llc_bytes > 0 && step_bytes <= llc_bytes;
}

int auto_batch_groups(int threads, int parallel, uint64_t step_bytes, uint64_t llc_bytes) {
  if (!weights_fit_cache(step_bytes, llc_bytes)) return 1;
  // At least 1 and at most parallel / 4 (≤ parallel), so no clamp is needed after rounding down.
  const int most = std::min(std::max(1, threads), std::max(1, parallel / kRowsPerGroup));
  return int(std::bit_floor(unsigned(most)));
}

uint64_t llc_bytes(const std::filesystem::path& cache_dir) {
  uint64_t by_level[4] = {};  // the largest cache of levels 2 and 3
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(cache_dir, error)) {
    if (!entry.path().filename().string().starts_with("index")) continue;
    const std::string level = read_line(entry.path() / "level");
    if (level != "2" && level != "3") continue;
    if (read_line(entry.path() / "type") == "Instruction") continue;
    uint64_t& largest = by_level[level[0] - '0'];
    largest = std::max(largest, parse_cache_size(read_line(entry.path() / "size")));
  }
  return by_level[3] > 0 ? by_level[3] : by_level[2];
}

uint64_t amd_l3_bytes_from_edx(uint32_t edx) {
  return uint64_t(edx >> 18) * 512 * 1024;
}

uint64_t cpuid_llc_bytes() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  uint64_t largest_l3 = 0;
  // Leaf 4, subleaf by subleaf until the null type: ways · partitions · line size · sets.
  if (__get_cpuid_max(0, nullptr) >= 4)
    for (unsigned sub = 0; sub < 16 && __get_cpuid_count(4, sub, &a, &b, &c, &d); ++sub) {
      const unsigned type = a & 31, level = (a >> 5) & 7;
      if (type == 0) break;
      if (level != 3 || type == 2) continue;  // type 2: instruction cache
      const uint64_t bytes = uint64_t((b >> 22) + 1) * (((b >> 12) & 0x3ff) + 1) *
                             ((b & 0xfff) + 1) * (uint64_t(c) + 1);
      largest_l3 = std::max(largest_l3, bytes);
    }
  if (largest_l3 > 0) return largest_l3;
  // unsigned: clang's <cpuid.h> returns the highest leaf as int, g++'s as unsigned.
  if (unsigned(__get_cpuid_max(0x80000000, nullptr)) >= 0x80000006u &&
      __get_cpuid(0x80000006, &a, &b, &c, &d))
    return amd_l3_bytes_from_edx(d);
#endif
  return 0;
}

LastLevelCache last_level_cache() {
  if (const uint64_t bytes = llc_bytes(); bytes > 0) return {bytes, "sysfs"};
  if (const uint64_t bytes = cpuid_llc_bytes(); bytes > 0) return {bytes, "CPUID"};
  return {};
}

std::optional<int> parse_batch_groups(std::string_view text) {
  if (text == "auto") return std::nullopt;
  int groups = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), groups);
  if (error != std::errc() || end != text.data() + text.size() || groups < 1 ||
      groups > kMaxBatchGroups)
    fail("--batch-groups: expected auto or a number of groups from 1 to {}, found '{}'",
         kMaxBatchGroups, text);
  return groups;
}

BatchGroupsChoice choose_batch_groups(std::optional<int> given, const BatchGroupsInputs& inputs) {
  if (given) return {*given, "given"};
  if (inputs.parallel <= 1) return {1, "auto: --parallel 1 has no batched steps"};
  if (inputs.expert_store)
    return {1, "auto: experts from a RAM-budget store, and groups read the file mapping"};
  if (inputs.llc_bytes == 0)
    return {1, "auto: the last-level cache size is not exposed (sysfs, CPUID), taken as small"};
  const bool fit = weights_fit_cache(inputs.model_file_bytes, inputs.llc_bytes);
  const std::string sizes =
      fmt::format("model {} {} the {} last-level cache{}", format_bytes(inputs.model_file_bytes),
                  fit ? "fits in" : "exceeds", format_bytes(inputs.llc_bytes),
                  inputs.llc_origin == "CPUID" ? " (CPUID: sysfs exposes none)" : "");
  if (!fit) return {1, fmt::format("auto: {}, a step is weight reads", sizes)};
  return {
      auto_batch_groups(inputs.threads, inputs.parallel, inputs.model_file_bytes, inputs.llc_bytes),
      fmt::format("auto: {}, a step is compute: --parallel {} rows, {} a group at least, on {} "
                  "threads, one a group at least",
                  sizes, inputs.parallel, kRowsPerGroup, inputs.threads)};
}

}  // namespace strata::serve
