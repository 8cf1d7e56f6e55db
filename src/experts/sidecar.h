// Expert sidecar `<model>.gguf.experts` — every (layer, expert)'s gate, up and down matrices in
// one contiguous, 4 KiB-aligned record, so loading an expert is one O_DIRECT read instead of three
// far-apart pieces of the GGUF. Built by `strata pack`; read by the ExpertStore.
//
// File layout (little-endian; version 1)
//   [0, 4096)        header: magic "STRATAEX", version, the GGUF's size and identity
//                    (gguf_identity below), block count,
//                    expert count, checksum chunk size, offsets of the data and table, total file
//                    size, and an XXH3-64 of the header bytes before it.
//   [data_offset)    records, layer by layer, expert by expert; a layer's record of expert e starts
//                    at layer.offset + e·layer.record_bytes. Inside a record: gate, up, down, each
//                    starting at a 64-byte boundary; the record is zero-padded to 4 KiB.
//   [table_offset)   one layer entry per block index (present = 0 for blocks without routed
//                    experts), then one XXH3-64 per checksum chunk of every record
//                    ([layer][expert][chunk], chunks of `chunk_bytes`, the last one shorter), then
//                    an XXH3-64 of the table bytes before it. The table comes last so the packer
//                    writes the file in one sequential pass, checksumming records as they stream.
//
// Contract
// - `pack_sidecar` writes the file atomically (temp + fsync + rename): a crash leaves the old file
//   or none, never half of one. Progress is reported in bytes.
// - `Sidecar::open` checks, before anything is used: size, magic, version, both hashes, that the
//   table matches the GGUF's expert tensors (types, byte sizes), that it is bound to this GGUF
//   (size + tensor-table identity; a mismatch says the sidecar is stale and how to rebuild it),
//   and that every record lies inside the file. Errors name the sidecar path and the field.
// - Data corruption inside a record is caught when the record is read: `verify_chunk` compares a
//   chunk's bytes with its stored checksum (the I/O threads call it on every read).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/ggml_type.h"

namespace strata {

inline constexpr uint64_t kSidecarAlign = 4096;
inline constexpr uint32_t kSidecarVersion = 1;
inline constexpr uint32_t kSidecarChunkBytes = 256 * 1024;

// Where one block's experts live and how a record is laid out.
struct SidecarLayer {
  bool present = false;
  GgmlType gate_type = GgmlType::F32, up_type = GgmlType::F32, down_type = GgmlType::F32;
  uint64_t gate_bytes = 0, up_bytes = 0, down_bytes = 0;  // one expert's matrix each
  uint64_t up_offset = 0, down_offset = 0;                // inside a record (gate at 0)
  uint64_t record_bytes = 0;                              // multiple of kSidecarAlign
  uint64_t offset = 0;                                    // file offset of expert 0's record
  uint32_t chunks_per_record = 0;
  uint64_t checksum_index = 0;                            // index of expert 0's first checksum
};

// The sidecar layout a GGUF file calls for (also what `open` expects to find).
struct SidecarLayout {
  uint64_t gguf_size = 0;
  uint64_t gguf_identity = 0;
  uint32_t n_block = 0;   // block indices 0..n_block-1 (the MTP block included)
  uint32_t n_expert = 0;
  uint32_t chunk_bytes = kSidecarChunkBytes;
  std::vector<SidecarLayer> layers;  // [n_block]
  uint64_t table_offset = 0, table_bytes = 0, data_offset = 0, file_size = 0;
  uint64_t n_checksums = 0;

  static SidecarLayout for_gguf(const GgufFile& gguf);
  uint64_t record_offset(int layer, int expert) const {
    return layers[size_t(layer)].offset + uint64_t(expert) * layers[size_t(layer)].record_bytes;
  }
  uint64_t total_expert_bytes() const;  // Σ records (padding included)
  uint64_t largest_record() const;
};

// A block's routed-expert tensors (blk.N.ffn_{gate,up,down}_exps[.weight]); null when absent.
struct ExpertTensorInfos {
  const TensorInfo* gate = nullptr;
  const TensorInfo* up = nullptr;
  const TensorInfo* down = nullptr;
};
ExpertTensorInfos find_expert_tensors(const GgufFile& gguf, int block);

// What binds a sidecar (and profiles, usage files) to a model: XXH3-64 over the file size, every
// tensor's name, type, shape, offset and size, and the first and last 4 KiB of its data (read with
// pread; about two small reads per tensor, so opening stays fast for a 35 GB file).
uint64_t gguf_identity(const GgufFile& gguf);

// "<model>.experts"
std::string sidecar_path_for(const std::string& model_path);

using PackProgress = std::function<void(uint64_t bytes_done, uint64_t bytes_total)>;
void pack_sidecar(const GgufFile& gguf, const std::string& out_path,
                  const PackProgress& progress = nullptr);

class Sidecar {
 public:
  // Validates as described above; throws strata::Error naming `path` and the problem.
  static Sidecar open(const std::string& path, const GgufFile& gguf);

  const std::string& path() const { return path_; }
  const SidecarLayout& layout() const { return layout_; }
  // Checks `bytes` (chunk `chunk` of the record of (layer, expert)) against the stored checksum;
  // throws naming the sidecar, layer, expert and chunk when they differ.
  void verify_chunk(int layer, int expert, uint32_t chunk, std::span<const uint8_t> bytes) const;

 private:
  std::string path_;
  SidecarLayout layout_;
  std::vector<uint64_t> checksums_;
};

}  // namespace strata
