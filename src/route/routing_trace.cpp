#include "route/routing_trace.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "experts/sidecar.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/fp16.h"

namespace strata {

static_assert(std::endian::native == std::endian::little, "the trace format is little-endian");

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'T', 'R', 'A', 'C', 'E'};
constexpr uint32_t tag(const char (&s)[5]) {
  return uint32_t(uint8_t(s[0])) | uint32_t(uint8_t(s[1])) << 8 | uint32_t(uint8_t(s[2])) << 16 |
         uint32_t(uint8_t(s[3])) << 24;
}
constexpr uint32_t kWindowTag = tag("WNDW");
constexpr uint32_t kEndTag = tag("TEND");
constexpr size_t kTrailerBytes = 4 + 8 + 8 + 8;  // tag, n_windows, n_records, xxh3
constexpr uint8_t kHasPrediction = 1;

template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

// Reads fields of a trace in order; every failure names the file, where it is and the field.
class Cursor {
 public:
  Cursor(const std::string& path, std::span<const uint8_t> bytes) : path_(path), bytes_(bytes) {}

  void set_where(std::string where) { where_ = std::move(where); }
  size_t pos() const { return pos_; }
  size_t left() const { return bytes_.size() - pos_; }

  void need(uint64_t n, const char* field) const {
    if (n > left())
      fail("{}: {}field '{}': needs {} bytes at offset {}, the file ends after {} (truncated)",
           path_, where_, field, n, pos_, left());
  }
  template <typename T>
  T read(const char* field) {
    need(sizeof(T), field);
    field_at_ = pos_;
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  // `count` u16 values; each must be < `limit` when limit > 0.
  void read_u16s(const char* field, uint64_t count, uint32_t limit, std::vector<uint16_t>& out) {
    need(count * 2, field);
    const size_t at = out.size();
    out.resize(at + size_t(count));
    std::memcpy(out.data() + at, bytes_.data() + pos_, size_t(count) * 2);
    for (size_t i = at; limit > 0 && i < out.size(); ++i)
      if (out[i] >= limit)
        fail("{}: {}field '{}': expected expert ids below n_expert {}, found {} at offset {}",
             path_, where_, field, limit, out[i], pos_ + (i - at) * 2);
    pos_ += size_t(count) * 2;
  }
  // A bad value in the field read last.
  [[noreturn]] void bad(const char* field, const std::string& expected_found) const {
    fail("{}: {}field '{}': {} (offset {})", path_, where_, field, expected_found, field_at_);
  }

 private:
  const std::string& path_;
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0, field_at_ = 0;
  std::string where_;
};

// Bytes as text, non-printable ones escaped: for "expected X, found Y" messages.
std::string printable(std::span<const uint8_t> bytes) {
  std::string s;
  for (uint8_t c : bytes)
    s += (c >= 0x20 && c < 0x7f) ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c);
  return s;
}
std::string tag_text(uint32_t value) {
  uint8_t b[4];
  std::memcpy(b, &value, 4);
  return printable(b);
}

RoutingTraceHeader read_header(Cursor& in) {
  in.set_where("header: ");
  const uint64_t magic_bits = in.read<uint64_t>("magic");
  uint8_t magic[8];
  std::memcpy(magic, &magic_bits, 8);
  if (std::memcmp(magic, kMagic, 8) != 0)
    in.bad("magic", fmt::format("expected \"STRTRACE\", found \"{}\" (not a strata routing trace)",
                                printable(magic)));
  const uint32_t version = in.read<uint32_t>("version");
  if (version != RoutingTraceHeader::kVersion)
    in.bad("version", fmt::format("expected {} (what this strata reads), found {}",
                                  RoutingTraceHeader::kVersion, version));
  RoutingTraceHeader h;
  h.model_identity = in.read<uint64_t>("model_identity");
  h.n_block = in.read<uint32_t>("n_block");
  if (h.n_block < 1 || h.n_block > 65536)
    in.bad("n_block", fmt::format("expected 1..65536, found {}", h.n_block));
  h.n_expert = in.read<uint32_t>("n_expert");
  if (h.n_expert < 1 || h.n_expert > 65536)
    in.bad("n_expert", fmt::format("expected 1..65536, found {}", h.n_expert));
  h.k = in.read<uint32_t>("k");
  if (h.k < 1 || h.k > h.n_expert)
    in.bad("k", fmt::format("expected 1..n_expert ({}), found {}", h.n_expert, h.k));
  in.need(uint64_t(h.n_block) * 8, "record_bytes");
  h.record_bytes.resize(h.n_block);
  for (uint64_t& b : h.record_bytes) b = in.read<uint64_t>("record_bytes");
  if (std::all_of(h.record_bytes.begin(), h.record_bytes.end(), [](uint64_t b) { return b == 0; }))
    in.bad("record_bytes", "expected at least one block with routed experts, found none");
  return h;
}

uint64_t xxh3(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Header

RoutingTraceHeader RoutingTraceHeader::for_model(const GgufFile& gguf, int k) {
  const SidecarLayout layout = SidecarLayout::for_gguf(gguf);
  RoutingTraceHeader h;
  h.model_identity = layout.gguf_identity;
  h.n_block = layout.n_block;
  h.n_expert = layout.n_expert;
  h.k = uint32_t(k);
  for (const SidecarLayer& l : layout.layers)
    h.record_bytes.push_back(l.present ? l.record_bytes : 0);
  return h;
}

uint64_t RoutingTraceHeader::expert_bytes() const {
  uint64_t sum = 0;
  for (uint64_t b : record_bytes) sum += b * n_expert;
  return sum;
}

// ---------------------------------------------------------------------------------------------
// Reader

uint64_t RoutingTrace::tokens(bool decode_only) const {
  int lowest = INT32_MAX;
  for (const LayerRecord& r : records) lowest = std::min(lowest, int(r.layer));
  uint64_t n = 0;
  for (const Window& w : windows)
    if (w.n_records > 0 && records[w.first_record].layer == lowest &&
        (!decode_only || w.n_rows == 1))
      n += w.n_rows;
  return n;
}

RoutingTrace RoutingTrace::load(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("{}: cannot open routing trace: {}", path, ec.message());
  std::vector<uint8_t> bytes(size);
  std::ifstream file(path, std::ios::binary);
  if (!file || !file.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(size)))
    fail("{}: cannot read routing trace ({} bytes)", path, size);

  RoutingTrace t;
  t.path = path;
  Cursor in(path, bytes);
  t.header = read_header(in);
  const RoutingTraceHeader& h = t.header;

  // A file that ends in an end record is checked whole first, so damage anywhere is reported as
  // damage (and not as whatever field it happens to hit).
  bool checked = false;
  if (bytes.size() >= in.pos() + kTrailerBytes) {
    const size_t at = bytes.size() - kTrailerBytes;
    uint32_t end_tag;
    uint64_t stored;
    std::memcpy(&end_tag, bytes.data() + at, 4);
    std::memcpy(&stored, bytes.data() + at + 20, 8);
    if (end_tag == kEndTag) {
      const uint64_t computed = xxh3(std::span(bytes).first(at));
      if (computed != stored)
        fail(
            "{}: end record: field 'xxh3': expected {:016x} (stored), computed {:016x} over the {} "
            "bytes before "
            "it: the file is corrupt",
            path, stored, computed, at);
      checked = true;
    }
  }

  while (true) {
    in.set_where(fmt::format("window {}: ", t.windows.size()));
    if (in.left() == 0)
      fail(
          "{}: truncated after window {} (offset {}): no end record; the run that wrote it did not "
          "finish",
          path, t.windows.size(), in.pos());
    const size_t tag_at = in.pos();
    const uint32_t window_tag = in.read<uint32_t>("tag");
    if (window_tag == kEndTag) {
      in.set_where("end record: ");
      const uint64_t n_windows = in.read<uint64_t>("n_windows");
      const uint64_t n_records = in.read<uint64_t>("n_records");
      const uint64_t stored = in.read<uint64_t>("xxh3");
      if (n_windows != t.windows.size())
        in.bad("n_windows", fmt::format("expected {} (the windows in the file), found {}",
                                        t.windows.size(), n_windows));
      if (n_records != t.records.size())
        in.bad("n_records", fmt::format("expected {} (the layer records in the file), found {}",
                                        t.records.size(), n_records));
      if (!checked && xxh3(std::span(bytes).first(tag_at)) != stored)
        in.bad("xxh3", "the checksum does not match the bytes before it: the file is corrupt");
      if (in.left() != 0)
        fail("{}: {} bytes after the end record (offset {}); expected the file to end there", path,
             in.left(), in.pos());
      break;
    }
    if (window_tag != kWindowTag)
      in.bad("tag",
             fmt::format("expected \"WNDW\" or \"TEND\", found \"{}\"", tag_text(window_tag)));
    Window w;
    w.n_rows = in.read<uint32_t>("n_rows");
    if (w.n_rows == 0) in.bad("n_rows", "expected at least 1 row, found 0");
    w.n_records = in.read<uint16_t>("n_records");
    if (w.n_records == 0) in.bad("n_records", "expected at least 1 layer record, found 0");
    w.first_record = uint32_t(t.records.size());
    const uint64_t entries = uint64_t(w.n_rows) * h.k;
    int previous = -1;
    for (uint32_t r = 0; r < w.n_records; ++r) {
      in.set_where(fmt::format("window {}, layer record {}: ", t.windows.size(), r));
      LayerRecord rec;
      rec.layer = in.read<uint16_t>("layer");
      if (rec.layer >= h.n_block || h.record_bytes[rec.layer] == 0)
        in.bad("layer",
               fmt::format("expected a block with routed experts (below n_block {}), found {}",
                           h.n_block, rec.layer));
      if (int(rec.layer) <= previous)
        in.bad("layer", fmt::format("expected a block above the previous record's {}, found {}",
                                    previous, rec.layer));
      previous = rec.layer;
      const uint8_t flags = in.read<uint8_t>("flags");
      if (flags & ~kHasPrediction) in.bad("flags", fmt::format("expected 0 or 1, found {}", flags));
      in.need(entries * 4, "ids/weights");
      rec.routing_offset = t.ids.size();
      in.read_u16s("ids", entries, h.n_expert, t.ids);
      in.read_u16s("weights", entries, 0, t.weights_f16);
      if (flags & kHasPrediction) {
        rec.predict_layer = in.read<uint16_t>("predict_layer");
        rec.predict_size = in.read<uint32_t>("n_predicted");
        if (rec.predict_size > h.n_expert)
          in.bad("n_predicted", fmt::format("expected at most n_expert ({}), found {}", h.n_expert,
                                            rec.predict_size));
        rec.predict_offset = t.predicted.size();
        in.read_u16s("predicted", rec.predict_size, h.n_expert, t.predicted);
      }
      // The union publish got: the sorted unique routed ids.
      rec.union_offset = t.union_ids.size();
      t.union_ids.resize(size_t(rec.union_offset + entries));
      std::copy(t.ids.begin() + ptrdiff_t(rec.routing_offset), t.ids.end(),
                t.union_ids.begin() + ptrdiff_t(rec.union_offset));
      std::sort(t.union_ids.begin() + ptrdiff_t(rec.union_offset), t.union_ids.end());
      t.union_ids.erase(
          std::unique(t.union_ids.begin() + ptrdiff_t(rec.union_offset), t.union_ids.end()),
          t.union_ids.end());
      rec.union_size = uint32_t(t.union_ids.size() - rec.union_offset);
      t.records.push_back(rec);
    }
    t.windows.push_back(w);
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Writer

struct RoutingTraceWriter::HashState {
  XXH3_state_t* state = XXH3_createState();
  HashState() {
    if (!state) throw std::bad_alloc();
    XXH3_64bits_reset(state);
  }
  ~HashState() { XXH3_freeState(state); }
};

RoutingTraceWriter::RoutingTraceWriter(const std::string& path, RoutingTraceHeader header)
    : path_(path), header_(std::move(header)) {
  if (header_.n_expert < 1 || header_.n_expert > 65536)
    fail("{}: a routing trace stores expert ids as u16; this model has {} experts", path,
         header_.n_expert);
  if (header_.n_block < 1 || header_.n_block > 65536 ||
      header_.record_bytes.size() != header_.n_block)
    fail(
        "{}: routing trace header: expected 1..65536 blocks with a record size each, found {} "
        "blocks and {} sizes",
        path, header_.n_block, header_.record_bytes.size());
  file_ = std::make_unique<AtomicFile>(path);
  hash_ = std::make_unique<HashState>();
  std::vector<uint8_t> out(std::begin(kMagic), std::end(kMagic));
  put(out, RoutingTraceHeader::kVersion);
  put(out, header_.model_identity);
  put(out, header_.n_block);
  put(out, header_.n_expert);
  put(out, header_.k);
  for (uint64_t b : header_.record_bytes) put(out, b);
  write(out);
}

RoutingTraceWriter::~RoutingTraceWriter() = default;

void RoutingTraceWriter::write(std::span<const uint8_t> bytes) {
  XXH3_64bits_update(hash_->state, bytes.data(), bytes.size());
  file_->write(bytes);
}

void RoutingTraceWriter::flush_window() {
  if (window_.empty()) return;
  std::memcpy(window_.data() + 8, &window_records_, 2);  // n_records, known now
  write(window_);
  ++n_windows_;
  window_.clear();
}

void RoutingTraceWriter::add_layer(int layer, const Routing& routing) {
  if (finished_) fail("{}: routing trace already finished", path_);
  if (layer < 0 || uint32_t(layer) >= header_.n_block || header_.record_bytes[size_t(layer)] == 0)
    fail("{}: routing trace: block {} has no routed experts in this model", path_, layer);
  if (uint32_t(routing.k) != header_.k)
    fail("{}: routing trace: block {}: expected k = {}, found {}", path_, layer, header_.k,
         routing.k);
  const int64_t n_rows = routing.n_rows();
  if (n_rows < 1 || n_rows > INT32_MAX)
    fail("{}: routing trace: block {}: {} rows", path_, layer, n_rows);
  if (window_.empty() || layer <= last_layer_ || n_rows != window_rows_ ||
      window_records_ == UINT16_MAX) {
    flush_window();
    put(window_, kWindowTag);
    put(window_, uint32_t(n_rows));
    put(window_, uint16_t(0));
    window_rows_ = n_rows;
    window_records_ = 0;
  }
  last_layer_ = layer;
  ++window_records_;
  ++n_records_;
  put(window_, uint16_t(layer));
  last_flags_at_ = window_.size();
  put(window_, uint8_t(0));
  last_has_prediction_ = false;
  for (int32_t e : routing.experts) {
    if (e < 0 || uint32_t(e) >= header_.n_expert)
      fail("{}: routing trace: block {}: expert id {} out of range", path_, layer, e);
    put(window_, uint16_t(e));
  }
  for (float w : routing.weights) put(window_, f32_to_f16(w));
}

void RoutingTraceWriter::add_prediction(int target_layer, std::span<const int32_t> experts) {
  if (window_.empty() || last_has_prediction_)
    fail("{}: routing trace: a prediction must follow its layer's routing, once", path_);
  if (target_layer < 0 || target_layer > UINT16_MAX)
    fail("{}: routing trace: prediction for block {} out of range", path_, target_layer);
  if (experts.size() > header_.n_expert)
    fail("{}: routing trace: prediction of {} experts (n_expert {})", path_, experts.size(),
         header_.n_expert);
  window_[last_flags_at_] = kHasPrediction;
  last_has_prediction_ = true;
  put(window_, uint16_t(target_layer));
  put(window_, uint32_t(experts.size()));
  for (int32_t e : experts) {
    if (e < 0 || uint32_t(e) >= header_.n_expert)
      fail("{}: routing trace: prediction for block {}: expert id {} out of range", path_,
           target_layer, e);
    put(window_, uint16_t(e));
  }
}

void RoutingTraceWriter::finish() {
  if (finished_) return;
  finished_ = true;
  flush_window();
  const uint64_t checksum = XXH3_64bits_digest(hash_->state);
  std::vector<uint8_t> out;
  put(out, kEndTag);
  put(out, n_windows_);
  put(out, n_records_);
  put(out, checksum);
  file_->write(out);
  file_->commit();
}

// ---------------------------------------------------------------------------------------------
// TracingSource

TracingSource::TracingSource(ExpertSource& inner, const std::string& path,
                             RoutingTraceHeader header)
    : inner_(inner), writer_(path, std::move(header)) {}

TracingSource::~TracingSource() {
  try {
    writer_.finish();
  } catch (const Error& e) {
    fmt::print(stderr, "strata: warning: routing trace {} not written: {}\n", writer_.path(),
               e.what());
  }
}

void TracingSource::observe_routing(int layer, const Routing& routing) {
  routed_layer_ = layer;
  routing_ = routing;
  inner_.observe_routing(layer, routing);
}

void TracingSource::publish(int layer, std::span<const int32_t> experts) {
  if (layer != routed_layer_)
    fail(
        "routing trace: publish({}) without that layer's routing (the trace stores the "
        "routing, not the union)",
        layer);
  routed_layer_ = -1;
  union_.assign(routing_.experts.begin(), routing_.experts.end());
  std::sort(union_.begin(), union_.end());
  union_.erase(std::unique(union_.begin(), union_.end()), union_.end());
  if (!std::equal(union_.begin(), union_.end(), experts.begin(), experts.end()))
    fail("routing trace: block {}: publish's experts are not the union of the routing", layer);
  writer_.add_layer(layer, routing_);
  inner_.publish(layer, experts);
}

void TracingSource::publish_guess(int layer, std::span<const int32_t> experts) {
  writer_.add_prediction(layer, experts);
  if (inner_.wants_guess()) inner_.publish_guess(layer, experts);
}

}  // namespace strata
