// Routing traces — what the router decided, per window and MoE layer, recorded during a run so a
// cache policy can be simulated offline (route/cache_replay.h) without running the model again.
//
// What a trace holds (docs/routing-trace.md has the format byte by byte)
// - A header binding it to one model: the GGUF identity that profiles and sidecars use
//   (gguf_identity), the block count, expert count, top-k, and each block's sidecar record bytes
//   (so a replay can report bytes without the model).
// - Per window (one model forward: the layers it visits in increasing block order; a call for a
//   lower or equal block, or with another row count, starts the next window): n_rows, then per
//   layer the block index, each row's k expert ids and renormalised routing weights (fp16), and —
//   when the MoE layer made one — the read-ahead prediction it offered for the next layer, in the
//   order it was given. The union a layer hands to publish is the sorted, unique set of its
//   routed ids (the TracingSource checks that), so it is not stored twice.
// - A trailer with the window and layer-record counts and an XXH3-64 of every byte before it.
//
// Errors: `load` throws strata::Error naming the file, the field (with its window and layer
// record) and what was expected vs found, for truncated, corrupt or foreign files. The writer
// goes through AtomicFile: a run that dies leaves no trace file, never half of one.
// Not thread-safe: a TracingSource is used by the window's thread only, like every ExpertSource.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "experts/expert_source.h"

namespace strata {

class AtomicFile;
class GgufFile;

struct RoutingTraceHeader {
  static constexpr uint32_t kVersion = 1;

  uint64_t model_identity = 0;  // gguf_identity of the model's GGUF
  uint32_t n_block = 0;         // blocks 0..n_block-1 (the MTP block included)
  uint32_t n_expert = 0;        // at most 65536: ids are stored as u16
  uint32_t k = 0;               // experts per row (top-k)
  // [n_block]: one expert's sidecar record; 0 = no routed experts.
  std::vector<uint64_t> record_bytes;

  // The header of a trace of `gguf` (a model with routed experts), k = experts per token.
  static RoutingTraceHeader for_model(const GgufFile& gguf, int k);
  uint64_t expert_bytes() const;  // Σ record_bytes × n_expert: what a percentage budget is of
};

// A trace in memory, as `load` returns it. Layer records are flat; a window is a range of them.
struct RoutingTrace {
  struct Window {
    uint32_t n_rows = 0;        // 1: a decode step; more: a prefill (or speculative verify) window
    uint32_t first_record = 0;  // into `records`
    uint32_t n_records = 0;
  };
  struct LayerRecord {
    uint16_t layer = 0;
    int32_t predict_layer =
        -1;  // the block publish_guess() was called for, or -1 when it was not called
    uint64_t routing_offset = 0;  // into ids/weights: n_rows × k entries, row-major
    uint64_t union_offset = 0;    // into union_ids
    uint32_t union_size = 0;
    uint64_t predict_offset = 0;  // into predicted
    uint32_t predict_size = 0;
  };

  std::string path;
  RoutingTraceHeader header;
  std::vector<Window> windows;
  std::vector<LayerRecord> records;
  std::vector<uint16_t> ids;          // routed expert ids
  std::vector<uint16_t> weights_f16;  // their weights, IEEE binary16
  std::vector<uint16_t> union_ids;    // per record, the sorted unique ids (computed on load)
  std::vector<uint16_t> predicted;    // read-ahead predictions, most likely first

  // Tokens the trace covers: rows of the windows that visit the trace's lowest block (a window
  // holding only the MTP block, say, is a draft of tokens already counted). `decode_only`: 1-row
  // windows only.
  uint64_t tokens(bool decode_only = false) const;

  static RoutingTrace load(const std::string& path);
};

// Streams a trace to `path` (through AtomicFile: visible only after finish()). Windows are
// buffered whole and written when the next one starts.
class RoutingTraceWriter {
 public:
  RoutingTraceWriter(const std::string& path, RoutingTraceHeader header);
  ~RoutingTraceWriter();
  RoutingTraceWriter(const RoutingTraceWriter&) = delete;
  RoutingTraceWriter& operator=(const RoutingTraceWriter&) = delete;

  // The routing of `layer` in the current window (a new window when layer is not above the last
  // one or the row count differs).
  void add_layer(int layer, const Routing& routing);
  // The read-ahead prediction made during the last added layer, for block `target_layer`.
  void add_prediction(int target_layer, std::span<const int32_t> experts);
  // Writes the last window and the trailer and makes the file visible. Idempotent.
  void finish();
  bool finished() const { return finished_; }
  const std::string& path() const { return path_; }

 private:
  void flush_window();
  void write(std::span<const uint8_t> bytes);

  std::string path_;
  RoutingTraceHeader header_;
  std::unique_ptr<AtomicFile> file_;
  struct HashState;
  std::unique_ptr<HashState> hash_;
  std::vector<uint8_t> window_;  // the current window's bytes, header included
  int last_layer_ = -1;
  int64_t window_rows_ = -1;
  uint32_t window_records_ = 0;
  size_t last_flags_at_ = 0;  // where the last layer record's flags byte is in window_
  bool last_has_prediction_ = true;
  uint64_t n_windows_ = 0, n_records_ = 0;
  bool finished_ = false;
};

// An ExpertSource that passes everything to `inner` and records the routing and the read-ahead
// predictions into a trace. It asks for a prediction at every layer (wants_guess() is always
// true, so the MoE layer runs the next layer's router once more per layer even when `inner`
// does not read ahead: a trace then still lets a replay simulate read-ahead) and forwards a
// prediction to `inner` only when inner.wants_guess() says so at that moment, so `inner`
// sees exactly the calls it would see without the tracer. The trace is written when the source
// is destroyed (or at finish(); a failure there is reported on stderr by the destructor).
class TracingSource final : public ExpertSource {
 public:
  TracingSource(ExpertSource& inner, const std::string& path, RoutingTraceHeader header);
  ~TracingSource() override;

  void observe_routing(int layer, const Routing& routing) override;
  void publish(int layer, std::span<const int32_t> experts) override;
  std::span<const DeliveredExpert> wait() override { return inner_.wait(); }
  bool wants_guess() const override { return true; }
  void publish_guess(int layer, std::span<const int32_t> experts) override;
  MocePolicy* moce() override { return inner_.moce(); }
  bool resident(int layer, int32_t expert) const override { return inner_.resident(layer, expert); }
  std::vector<HostRegion> host_regions() const override { return inner_.host_regions(); }
  bool pointers_stay_valid() const override { return inner_.pointers_stay_valid(); }

  void finish() { writer_.finish(); }
  const std::string& path() const { return writer_.path(); }

 private:
  ExpertSource& inner_;
  RoutingTraceWriter writer_;
  int routed_layer_ = -1;  // the layer whose routing was observed last, until its publish
  Routing routing_;
  std::vector<int32_t> union_;
};

}  // namespace strata
