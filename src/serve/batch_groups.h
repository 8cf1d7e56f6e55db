// How many windows `strata serve --parallel N` cuts a batched decode step into (`--batch-groups`,
// DecodeBatcher's BatchGroups, serve/decode_batcher.h), decided once at server start.
//
// `--batch-groups auto` (the default) applies one rule to what is known at start:
//   W   = the bytes of weights decode steps read: taken as the model file's size, an upper bound
//         that is close for batched steps (16 rows of the default model touch 23.9 of a layer's 64
//         experts per step, and the next steps other ones, so what must stay cached is most of the
//         file, not one token's dense part and active experts);
//   LLC = the last-level cache (sysfs: level 3, else level 2; not exposed there: CPUID's L3;
//         neither → 0, taken as small);
//   T   = the compute threads (--threads).
//   P   = --parallel, the most rows a step has.
//   W ≤ LLC: the weights stay in cache, so a step is compute and its rows share little memory
//            traffic, while one window split over many threads is all hand-outs (34 µs each at 16
//            threads): as many groups as keep kRowsPerGroup rows and one thread in each, i.e.
//            G = min(T, P / kRowsPerGroup) rounded down to a power of two, within [1, P].
//   W > LLC: a step is weight reads, and each group would read the dense weights and its experts
//            again: G = 1.
// Measured (docs/serve.md, "Batch groups", 16 streams at --parallel 16): on the 16-core Xeon with
// 300 MiB L3, the 27 MB default model 2.4× one stream with 1 group, 3.6× with 2, 5.9× with 4,
// 5.4× with 8 (the rule picks 4: 4 rows and 4 threads a group); on 2 cores 2648 and 2925 tok/s
// with 2 groups against 2151 and 2212 with 1 (the rule picks 2: 8 rows and 1 thread a group);
// an 11 GiB model with uniform routing 2.7× with 1 group, 2.6× with 8 (the rule picks 1). Until
// session 41 the rule was T/2 (two threads a group), which picked 8 there and 1 on 2 cores. With
// a RAM-budget expert store auto is 1: groups read the experts from the file mapping (their
// residency state is one).
//
// Everything here is a pure function but `llc_bytes` (sysfs), `cpuid_llc_bytes` and
// `last_level_cache`. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace strata::serve {

// The most groups --batch-groups accepts.
inline constexpr int kMaxBatchGroups = 256;
// The auto rule's fewest rows a group (of --parallel's): fewer and a group's window is mostly
// per-window overhead (measured: 4 rows a group beat 2 on 16 cores).
inline constexpr int kRowsPerGroup = 4;

// Whether a step's weights stay cache-resident: step_bytes ≤ llc_bytes, an unknown (0) LLC
// counting as too small.
bool weights_fit_cache(uint64_t step_bytes, uint64_t llc_bytes);

// The auto rule above. threads or parallel below 1 count as 1; llc_bytes 0 = unknown. Returns a
// value in [1, max(1, parallel)].
int auto_batch_groups(int threads, int parallel, uint64_t step_bytes, uint64_t llc_bytes);

// The last-level cache of CPU 0 in bytes, from `cache_dir`/index*/{level,size,type} (sizes as the
// kernel writes them, "32768K"; instruction caches skipped): the largest level-3 cache, else the
// largest level-2 one; 0 when neither can be read (e.g. a VM that exposes no cache sizes).
uint64_t llc_bytes(const std::filesystem::path& cache_dir = "/sys/devices/system/cpu/cpu0/cache");

// Where sysfs exposes no cache (this 2-vCPU VM), the CPU's own answer: CPUID leaf 4 (Intel's
// deterministic cache parameters, the largest level-3 data or unified cache) or AMD's extended
// leaf 0x80000006 (EDX bits 31-18: the L3 in 512 KiB units). 0 off x86 or when neither says.
// A hypervisor may report the host's L3 rather than the share its vCPUs see (this VM: 508 MiB),
// so it answers "does a 26 MiB model fit", not how much of a larger one would.
uint64_t cpuid_llc_bytes();
// Leaf 0x80000006's EDX as cpuid_llc_bytes reads it (pure, for the tests).
uint64_t amd_l3_bytes_from_edx(uint32_t edx);

// The LLC the auto rule uses: sysfs's (llc_bytes), else CPUID's; `origin` says which ("sysfs",
// "CPUID", or "" when neither is known: bytes 0).
struct LastLevelCache {
  uint64_t bytes = 0;
  std::string_view origin;
};
LastLevelCache last_level_cache();

// `--batch-groups` as given: "auto" → nullopt, else a number of groups in [1, kMaxBatchGroups].
// Throws strata::Error naming the option, what it expects and what it found.
std::optional<int> parse_batch_groups(std::string_view text);

// What the server knows at start.
struct BatchGroupsInputs {
  int threads = 1;
  int parallel = 1;
  uint64_t model_file_bytes = 0;  // W
  uint64_t llc_bytes = 0;         // 0 = unknown
  bool expert_store = false;      // experts from a RAM-budget store (groups refused)
  std::string_view llc_origin;    // where llc_bytes came from ("sysfs", "CPUID"), for the reason
};

struct BatchGroupsChoice {
  int groups = 1;
  // For the startup line and /props: "given", or "auto: " and why, e.g. "auto: model 26.2 MiB
  // fits in the 300 MiB last-level cache, a step is compute: --parallel 16 rows, 4 a group ...".
  std::string reason;
};

// `given` (a number from parse_batch_groups) is kept as it is (the server checks it against
// --parallel and the store); nullopt applies the auto rule to `inputs`.
BatchGroupsChoice choose_batch_groups(std::optional<int> given, const BatchGroupsInputs& inputs);

}  // namespace strata::serve
