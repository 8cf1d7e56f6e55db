#include "experts/sidecar.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

#include "util/atomic_file.h"
#include "util/error.h"

namespace strata {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'E', 'X'};
constexpr uint64_t kHeaderBytes = kSidecarAlign;
constexpr uint64_t kLayerEntryBytes = 64;
constexpr uint64_t kIdentitySampleBytes = 4096;

uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Little-endian field writer/reader over a byte buffer.
class Fields {
 public:
  explicit Fields(std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  void put(uint64_t value, int width) {
    for (int i = 0; i < width; ++i) bytes_.push_back(uint8_t(value >> (8 * i)));
  }
  void put_bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) bytes_.push_back(p[i]);  // (insert trips GCC 12's -Wstringop-overflow)
  }

 private:
  std::vector<uint8_t>& bytes_;
};

class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, const std::string& path, const char* what)
      : bytes_(bytes), path_(path), what_(what) {}
  uint64_t get(int width) {
    if (pos_ + size_t(width) > bytes_.size()) fail("{}: {} ends early", path_, what_);
    uint64_t value = 0;
    for (int i = 0; i < width; ++i) value |= uint64_t(bytes_[pos_ + size_t(i)]) << (8 * i);
    pos_ += size_t(width);
    return value;
  }
  size_t pos() const { return pos_; }
  void seek(size_t pos) { pos_ = pos; }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& path_;
  const char* what_;
  size_t pos_ = 0;
};

// Block index of "blk.N.<suffix>", or -1.
int block_of(std::string_view name, std::string_view suffix) {
  if (!name.starts_with("blk.")) return -1;
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos || name.substr(dot + 1) != suffix) return -1;
  int block = -1;
  const auto [end, ec] = std::from_chars(name.data() + 4, name.data() + dot, block);
  return ec == std::errc() && end == name.data() + dot ? block : -1;
}


std::vector<uint8_t> header_bytes(const SidecarLayout& layout) {
  std::vector<uint8_t> bytes;
  Fields f(bytes);
  f.put_bytes(kMagic, sizeof kMagic);
  f.put(kSidecarVersion, 4);
  f.put(kHeaderBytes, 4);
  f.put(layout.gguf_size, 8);
  f.put(layout.gguf_identity, 8);
  f.put(layout.n_block, 4);
  f.put(layout.n_expert, 4);
  f.put(layout.chunk_bytes, 4);
  f.put(0, 4);
  f.put(layout.data_offset, 8);
  f.put(layout.table_offset, 8);
  f.put(layout.table_bytes, 8);
  f.put(layout.file_size, 8);
  f.put(XXH3_64bits(bytes.data(), bytes.size()), 8);
  bytes.resize(kHeaderBytes, 0);
  return bytes;
}

// The table minus the checksums and the trailing hash.
std::vector<uint8_t> layer_entries(const SidecarLayout& layout) {
  std::vector<uint8_t> bytes;
  Fields f(bytes);
  for (const SidecarLayer& l : layout.layers) {
    const size_t start = bytes.size();
    f.put(l.present ? 1 : 0, 4);
    f.put(uint32_t(l.gate_type), 4);
    f.put(uint32_t(l.up_type), 4);
    f.put(uint32_t(l.down_type), 4);
    f.put(l.gate_bytes, 8);
    f.put(l.up_bytes, 8);
    f.put(l.down_bytes, 8);
    f.put(l.record_bytes, 8);
    f.put(l.offset, 8);
    bytes.resize(start + kLayerEntryBytes, 0);
  }
  return bytes;
}

}  // namespace

ExpertTensorInfos find_expert_tensors(const GgufFile& gguf, int block) {
  auto find = [&](const char* name) {
    const std::string base = fmt::format("blk.{}.{}", block, name);
    if (const TensorInfo* t = gguf.find_tensor(base + ".weight")) return t;
    return gguf.find_tensor(base);
  };
  return ExpertTensorInfos{find("ffn_gate_exps"), find("ffn_up_exps"), find("ffn_down_exps")};
}

uint64_t gguf_identity(const GgufFile& gguf) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  const uint64_t file_size = gguf.file_size();
  XXH3_64bits_update(state, &file_size, sizeof file_size);
  std::vector<uint8_t> sample(kIdentitySampleBytes);
  for (const TensorInfo& t : gguf.tensors()) {
    XXH3_64bits_update(state, t.name.data(), t.name.size());
    const uint64_t fields[7] = {uint64_t(t.type), uint64_t(t.ne[0]), uint64_t(t.ne[1]),
                                uint64_t(t.ne[2]), uint64_t(t.ne[3]), t.file_offset, t.n_bytes};
    XXH3_64bits_update(state, fields, sizeof fields);
    // The first and last bytes of every tensor's data, so a re-converted or re-quantized model of
    // the same shape is told apart. pread, not the mapping: hashing must not fault in pages.
    const uint64_t n = std::min<uint64_t>(t.n_bytes, kIdentitySampleBytes);
    for (const uint64_t offset : {t.file_offset, t.file_offset + t.n_bytes - n}) {
      if (n == 0) break;
      if (gguf.fd() < 0) {
        XXH3_64bits_update(state, gguf.tensor_data(t) + (offset - t.file_offset), n);
        continue;
      }
      uint64_t done = 0;
      while (done < n) {
        const ssize_t got = pread(gguf.fd(), sample.data() + done, n - done, off_t(offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) fail("{}: reading tensor {} to identify the model: {}", gguf.path(), t.name,
                           got < 0 ? std::strerror(errno) : "file ends early");
        done += uint64_t(got);
      }
      XXH3_64bits_update(state, sample.data(), n);
    }
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

std::string sidecar_path_for(const std::string& model_path) { return model_path + ".experts"; }

SidecarLayout SidecarLayout::for_gguf(const GgufFile& gguf) {
  SidecarLayout layout;
  layout.gguf_size = gguf.file_size();
  layout.gguf_identity = strata::gguf_identity(gguf);
  int n_block = 0;
  for (const TensorInfo& t : gguf.tensors()) {
    const int b = std::max(block_of(t.name, "ffn_gate_exps.weight"), block_of(t.name, "ffn_gate_exps"));
    n_block = std::max(n_block, b + 1);
  }
  if (n_block == 0) fail("{}: no routed-expert tensors (blk.N.ffn_gate_exps); nothing to pack", gguf.path());
  layout.n_block = uint32_t(n_block);
  layout.layers.resize(size_t(n_block));
  uint64_t offset = kHeaderBytes;
  layout.data_offset = offset;
  for (int b = 0; b < n_block; ++b) {
    const auto [gate, up, down] = find_expert_tensors(gguf, b);
    if (!gate && !up && !down) continue;
    if (!gate || !up || !down)
      fail("{}: block {} has only some of ffn_gate_exps/ffn_up_exps/ffn_down_exps", gguf.path(), b);
    const int64_t n_expert = gate->ne[2];
    if (up->ne[2] != n_expert || down->ne[2] != n_expert || n_expert < 1)
      fail("{}: block {}: expert counts of gate/up/down differ ({}, {}, {})", gguf.path(), b,
           gate->ne[2], up->ne[2], down->ne[2]);
    if (layout.n_expert == 0) layout.n_expert = uint32_t(n_expert);
    if (int64_t(layout.n_expert) != n_expert)
      fail("{}: block {} has {} experts, earlier blocks {}", gguf.path(), b, n_expert, layout.n_expert);
    SidecarLayer& l = layout.layers[size_t(b)];
    l.present = true;
    l.gate_type = gate->type;
    l.up_type = up->type;
    l.down_type = down->type;
    l.gate_bytes = gate->n_bytes / uint64_t(n_expert);
    l.up_bytes = up->n_bytes / uint64_t(n_expert);
    l.down_bytes = down->n_bytes / uint64_t(n_expert);
    l.up_offset = align_up(l.gate_bytes, 64);
    l.down_offset = align_up(l.up_offset + l.up_bytes, 64);
    l.record_bytes = align_up(l.down_offset + l.down_bytes, kSidecarAlign);
    l.offset = offset;
    l.chunks_per_record = uint32_t((l.record_bytes + layout.chunk_bytes - 1) / layout.chunk_bytes);
    l.checksum_index = layout.n_checksums;
    layout.n_checksums += uint64_t(n_expert) * l.chunks_per_record;
    offset += uint64_t(n_expert) * l.record_bytes;
  }
  layout.table_offset = offset;
  layout.table_bytes = uint64_t(n_block) * kLayerEntryBytes + layout.n_checksums * 8 + 8;
  layout.file_size = layout.table_offset + layout.table_bytes;
  return layout;
}

uint64_t SidecarLayout::total_expert_bytes() const {
  uint64_t total = 0;
  for (const SidecarLayer& l : layers)
    if (l.present) total += uint64_t(n_expert) * l.record_bytes;
  return total;
}

uint64_t SidecarLayout::largest_record() const {
  uint64_t largest = 0;
  for (const SidecarLayer& l : layers) largest = std::max(largest, l.record_bytes);
  return largest;
}

void pack_sidecar(const GgufFile& gguf, const std::string& out_path, const PackProgress& progress) {
  if (gguf.fd() < 0) fail("{}: pack needs a file on disk", gguf.path());
  const SidecarLayout layout = SidecarLayout::for_gguf(gguf);
  AtomicFile out(out_path, size_t(8) << 20);
  out.write(header_bytes(layout));

  std::vector<uint64_t> checksums;
  checksums.reserve(layout.n_checksums);
  std::vector<uint8_t> record;
  const uint64_t total = layout.total_expert_bytes();
  uint64_t done = 0;
  auto read_exact = [&](const TensorInfo& t, uint64_t expert_bytes, int e, uint8_t* dest) {
    uint64_t offset = t.file_offset + uint64_t(e) * expert_bytes, left = expert_bytes;
    while (left > 0) {
      const ssize_t n = pread(gguf.fd(), dest, left, off_t(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        fail("{}: reading tensor {} at offset {}: {}", gguf.path(), t.name, offset,
             n < 0 ? std::strerror(errno) : "unexpected end of file");
      dest += n;
      offset += uint64_t(n);
      left -= uint64_t(n);
    }
  };
  for (uint32_t b = 0; b < layout.n_block; ++b) {
    const SidecarLayer& l = layout.layers[b];
    if (!l.present) continue;
    const ExpertTensorInfos tensors = find_expert_tensors(gguf, int(b));
    const TensorInfo &gate = *tensors.gate, &up = *tensors.up, &down = *tensors.down;
    for (uint32_t e = 0; e < layout.n_expert; ++e) {
      record.assign(l.record_bytes, 0);
      read_exact(gate, l.gate_bytes, int(e), record.data());
      read_exact(up, l.up_bytes, int(e), record.data() + l.up_offset);
      read_exact(down, l.down_bytes, int(e), record.data() + l.down_offset);
      for (uint64_t c = 0; c < l.record_bytes; c += layout.chunk_bytes)
        checksums.push_back(
            XXH3_64bits(record.data() + c, std::min<uint64_t>(layout.chunk_bytes, l.record_bytes - c)));
      out.write(record);
      done += l.record_bytes;
      if (progress) progress(done, total);
    }
  }
  std::vector<uint8_t> table = layer_entries(layout);
  Fields f(table);
  for (uint64_t c : checksums) f.put(c, 8);
  f.put(XXH3_64bits(table.data(), table.size()), 8);
  out.write(table);
  out.commit();
}

Sidecar Sidecar::open(const std::string& path, const GgufFile& gguf) {
  const SidecarLayout expected = SidecarLayout::for_gguf(gguf);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open expert sidecar: {}", path, std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  const uint64_t size = uint64_t(st.st_size);
  auto read_at = [&](uint64_t offset, uint64_t n, const char* what) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n));
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got = pread(fd, bytes.data() + done, n - done, off_t(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail("{}: reading the {}: {}", path, what, got < 0 ? std::strerror(errno) : "file ends early");
      done += uint64_t(got);
    }
    return bytes;
  };
  const std::string rebuild = fmt::format("rebuild it with `strata pack {}`", gguf.path());
  if (size < kHeaderBytes)
    fail("{}: {} bytes, too small for an expert sidecar header ({} bytes); {}", path, size,
         kHeaderBytes, rebuild);
  const std::vector<uint8_t> header = read_at(0, kHeaderBytes, "header");
  if (std::memcmp(header.data(), kMagic, sizeof kMagic) != 0)
    fail("{}: not an expert sidecar (magic is not STRATAEX)", path);
  Reader r(header, path, "header");
  r.seek(sizeof kMagic);
  const uint64_t version = r.get(4);
  if (version != kSidecarVersion)
    fail("{}: sidecar format version {}, this strata reads version {}; {}", path, version,
         kSidecarVersion, rebuild);
  const std::vector<uint8_t> got_header = header_bytes(expected);
  // Compare field by field so the message says what differs.
  r.seek(16);
  const uint64_t gguf_size = r.get(8), identity = r.get(8);
  if (gguf_size != expected.gguf_size || identity != expected.gguf_identity)
    fail("{}: stale: it was packed from a different model file (size {} vs {}, identity "
         "{:016x} vs {:016x}); {}",
         path, gguf_size, expected.gguf_size, identity, expected.gguf_identity, rebuild);
  if (!std::equal(header.begin(), header.end(), got_header.begin()))
    fail("{}: header is corrupt (fields or header checksum differ from what {} calls for); {}", path,
         gguf.path(), rebuild);
  if (size != expected.file_size)
    fail("{}: size is {} bytes, expected {} (truncated or extended); {}", path, size,
         expected.file_size, rebuild);
  const std::vector<uint8_t> table = read_at(expected.table_offset, expected.table_bytes, "table");
  const std::vector<uint8_t> entries = layer_entries(expected);
  const size_t hashed = table.size() - 8;
  Reader tr(table, path, "table");
  tr.seek(hashed);
  if (tr.get(8) != XXH3_64bits(table.data(), hashed))
    fail("{}: table checksum mismatch (the file is corrupt); {}", path, rebuild);
  if (!std::equal(entries.begin(), entries.end(), table.begin()))
    fail("{}: layer table does not match the model's expert tensors; {}", path, rebuild);

  Sidecar sidecar;
  sidecar.path_ = path;
  sidecar.layout_ = expected;
  sidecar.checksums_.resize(static_cast<size_t>(expected.n_checksums));
  tr.seek(entries.size());
  for (uint64_t& c : sidecar.checksums_) c = tr.get(8);
  return sidecar;
}

void Sidecar::verify_chunk(int layer, int expert, uint32_t chunk, std::span<const uint8_t> bytes) const {
  const SidecarLayer& l = layout_.layers[size_t(layer)];
  const uint64_t index = l.checksum_index + uint64_t(expert) * l.chunks_per_record + chunk;
  if (XXH3_64bits(bytes.data(), bytes.size()) != checksums_[size_t(index)])
    fail("{}: layer {} expert {}: bytes {}..{} of its record fail their checksum (the sidecar is "
         "corrupt; rebuild it with `strata pack`)",
         path_, layer, expert, uint64_t(chunk) * layout_.chunk_bytes,
         uint64_t(chunk) * layout_.chunk_bytes + bytes.size());
}

}  // namespace strata
