// The CUDA backend. Contract in cuda_backend.h.
#include "compute/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "compute/backend_registry.h"
#include "compute/cpu/matmul.h"
#include "compute/cuda/attention.h"
#include "compute/cuda/deltanet.h"
#include "compute/cuda/expert_tier.h"
#include "compute/cuda/hyper_connection.h"
#include "compute/cuda/matmul.h"
#include "compute/cuda/ops.h"
#include "compute/cuda/runtime.h"
#include "compute/cuda/window_graph.h"
#include "compute/cuda/window_ops.h"
#include "experts/expert_source.h"
#include "layers/attention.h"
#include "layers/gated_deltanet.h"
#include "layers/hyper_connection.h"
#include "layers/moe.h"
#include "layers/ple.h"
#include "model/hparams.h"
#include "quant/quant.h"
#include "util/error.h"

namespace strata::compute::cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kScratchChunk = size_t(64) << 20;

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Per-op device scratch: a bump allocator over chunks that are kept for the next op (so a warm
// window allocates nothing). Reset at the start of every op; ops on one stream run in order, so
// reusing the memory of the previous op is safe.
class DeviceArena {
 public:
  // before_alloc runs before a new chunk is allocated (the backend pauses its graph capture).
  explicit DeviceArena(std::function<void()> before_alloc) : before_alloc_(std::move(before_alloc)) {}
  void reset() {
    chunk_ = 0;
    offset_ = 0;
  }
  void* take(size_t bytes) {
    bytes = align_up(std::max<size_t>(bytes, 1), kAlign);
    while (chunk_ < chunks_.size() && offset_ + bytes > chunks_[chunk_].bytes()) {
      ++chunk_;
      offset_ = 0;
    }
    if (chunk_ == chunks_.size()) {
      if (before_alloc_) before_alloc_();
      chunks_.emplace_back(std::max(bytes, kScratchChunk));
    }
    void* p = static_cast<uint8_t*>(chunks_[chunk_].data()) + offset_;
    offset_ += bytes;
    return p;
  }
  float* floats(int64_t n) { return static_cast<float*>(take(size_t(n) * sizeof(float))); }
  int32_t* ints(int64_t n) { return static_cast<int32_t*>(take(size_t(n) * sizeof(int32_t))); }

 private:
  std::function<void()> before_alloc_;
  std::vector<DeviceBuffer> chunks_;
  size_t chunk_ = 0, offset_ = 0;
};

// Window graphs are on unless STRATA_CUDA_GRAPH=0 (the eager path, for comparison and debugging).
bool graphs_enabled() {
  const char* v = std::getenv("STRATA_CUDA_GRAPH");
  return !(v && std::strcmp(v, "0") == 0);
}

// Grows `buffer` to at least `bytes`, keeping its first `keep` bytes.
void grow(DeviceBuffer& buffer, size_t bytes, size_t keep, cudaStream_t stream) {
  if (buffer.bytes() >= bytes) return;
  DeviceBuffer bigger(std::max(bytes, buffer.bytes() * 2));
  STRATA_CUDA_CHECK(cudaMemsetAsync(bigger.data(), 0, bigger.bytes(), stream));
  if (keep > 0)
    STRATA_CUDA_CHECK(cudaMemcpyAsync(bigger.data(), buffer.data(), keep, cudaMemcpyDeviceToDevice, stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  buffer = std::move(bigger);
}

DeviceBuffer zeros(size_t bytes, cudaStream_t stream) {
  DeviceBuffer b(bytes);
  STRATA_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, b.bytes(), stream));
  return b;
}

void copy_d2d(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

// Every expert of one layer, slots of [gate | up | down] in expert-id order.
struct LayerExperts {
  DeviceBuffer arena, smap;
  ExpertArenaView view;
  ExpertMatrixShape gate, up, down;
};

// A model's weights on the device, shared by every CudaBackend of that model (one per sequence)
// through compute::BackendShared, so a new sequence never uploads them again. Entries are keyed by
// the host address of the view (the GGUF mapping, stable for the model's life) and never change
// once made; `mutex` guards the maps (node-based: references stay valid).
struct DeviceWeights {
  std::mutex mutex;
  std::unordered_map<const void*, DeviceBuffer> buffers;
  std::unordered_map<int, LayerExperts> experts;
  // Under a GPU budget (BackendShared::gpu_tier): the tiered arena instead of `experts`; decided
  // at the first MoE layer of the model's first window.
  bool tier_decided = false;
  std::unique_ptr<GpuExpertTier> tier;
};

struct DeltaNetMirror {
  DeviceBuffer conv, ssm;  // [K-1][conv_dim], [nv][dk][dv]
  // The last recorded window: the state before it and its inputs, for rollback.
  DeviceBuffer ssm_before, conv_before, conv_inputs, q, k, v, beta, decay;
  int64_t log_capacity = 0, log_rows = 0;
};

struct KvMirror {
  DeviceBuffer k, v, index_raw, block_keys;
  int64_t capacity = 0;     // tokens
  int64_t blocks_done = 0;  // QSA block keys computed
  int64_t first_in_window = -1;
};

struct PleMirror {
  DeviceBuffer history, next, before, normed;  // [(K-1)·dilation][S·H] x 3, [rows][S·H]
  int64_t normed_capacity = 0, log_rows = 0;
  bool recorded = false;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(BackendShared& shared)
      : graph_(stream_.get(), graphs_enabled()), scratch_([this] { graph_.pause(false); }),
        staging_{PinnedStaging([this] { graph_.pause(false); }), PinnedStaging([this] { graph_.pause(false); })} {
    if (!usable_device()) fail("cuda backend: no usable CUDA device ({})", describe_device());
    for (cudaEvent_t& e : staging_done_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    std::lock_guard lock(shared.mutex);
    std::shared_ptr<void>& entry = shared.by_backend["cuda"];
    if (!entry) entry = std::make_shared<DeviceWeights>();
    weights_ = std::static_pointer_cast<DeviceWeights>(entry);
    tier_options_ = shared.gpu_tier;
  }
  ~CudaBackend() override {
    // Pending work must finish before the buffers it uses go away.
    try {
      graph_.finish_window();
    } catch (...) {
      graph_.abandon();
    }
    cudaStreamSynchronize(stream_.get());
    if (weights_->tier) try {
        weights_->tier->settle();
      } catch (...) {
      }
    for (cudaEvent_t e : staging_done_)
      if (e) cudaEventDestroy(e);
    if (const char* v = std::getenv("STRATA_CUDA_GRAPH_STATS"); v && std::strcmp(v, "1") == 0) {
      const WindowGraphStats& g = graph_.stats();
      const double w = double(std::max<int64_t>(g.windows, 1));
      std::fprintf(stderr,
                   "cuda backend graphs: %lld windows (%lld replayed, %lld recordings kept, dropped %lld times), %.2f "
                   "segments launched and "
                   "%.0f nodes captured per window, %lld instantiations, %lld updates; host per window: capture %.1f "
                   "us, instantiate/update %.1f us, launch %.1f us\n",
                   (long long)g.windows, (long long)g.replays, (long long)g.records, (long long)g.forgotten,
                   double(g.segments) / w,
                   double(g.nodes) / w, (long long)g.instantiations, (long long)g.updates, g.capture_s / w * 1e6,
                   g.update_s / w * 1e6, g.launch_s / w * 1e6);
    }
    if (graph_.profiling()) std::fputs(graph_.profile_table().c_str(), stderr);
  }

  std::string_view name() const override { return "cuda"; }
  const WindowGraphStats& graph_stats() const { return graph_.stats(); }
  GpuTierInfo tier_info() const {
    GpuTierInfo info;
    std::lock_guard lock(weights_->mutex);
    const GpuExpertTier* tier = weights_->tier.get();
    if (!tier) return info;
    info.tiered = true;
    info.slots_per_layer = tier->slots_per_layer();
    info.transient_slots = tier->transient_slots();
    info.arena_bytes = tier->arena_bytes();
    info.stats = tier->stats();
    return info;
  }

  Tensor alloc(DType type, int64_t max_rows, int64_t width) override {
    if (max_rows < 1 || width < 1)
      fail("cuda backend: alloc: expected max_rows >= 1 and width >= 1, found {} x {}", max_rows, width);
    uint32_t id;
    if (!free_ids_.empty()) {
      id = free_ids_.back();
      free_ids_.pop_back();
    } else {
      id = uint32_t(buffers_.size());
      buffers_.emplace_back();
    }
    EagerScope eager(*this);
    buffers_[id] = zeros(size_t(max_rows * width) * 4, s());
    return Tensor{id, type, max_rows, width};
  }

  void release(Tensor t) override {
    if (!t.valid() || t.id >= buffers_.size()) return;
    EagerScope eager(*this);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(s()));
    buffers_[t.id] = DeviceBuffer();
    free_ids_.push_back(t.id);
  }

  void read(Tensor t, int64_t first_row, int64_t n_rows, float* out) override {
    const float* data = tensor_data(t, first_row + n_rows, "read");
    graph_.pause(true);  // the window so far runs (replay: its next recorded segment)
    STRATA_CUDA_CHECK(cudaMemcpyAsync(out, data + first_row * t.width, size_t(n_rows * t.width) * 4,
                                      cudaMemcpyDeviceToHost, s()));
    if (GpuExpertTier* tier = weights_->tier.get()) {
      // A window whose handshake never completes is a bug: say where both sides stand.
      const auto start = std::chrono::steady_clock::now();
      cudaError_t status;
      while ((status = cudaStreamQuery(s())) == cudaErrorNotReady) {
        if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60))
          fail("cuda backend: a window has not finished after 60 s; gpu expert tier: {}", tier->describe_state());
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      STRATA_CUDA_CHECK(status);
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(s()));
    // The window's handshakes are all served once its work is done; a failed one throws here.
    if (weights_->tier) weights_->tier->settle();
  }

  void write(Tensor t, int64_t first_row, int64_t n_rows, const float* in) override {
    sign(Op::Write, t, first_row, n_rows);
    float* data = replaying() ? tensor_data(t, first_row + n_rows, "write") : rows(t, first_row + n_rows, "write");
    upload(data + first_row * t.width, in, size_t(n_rows * t.width) * 4);
  }

  void begin_window(ThreadPool&) override {
    // What an earlier window left captured (a window without a read) is launched first.
    graph_.begin_window();
    // Staging alternates between two buffers: this window reuses the one of the window before
    // the previous one, once the work enqueued up to the end of that window is done (normally
    // long since). The previous window may still run (prefill chunks have no read), so host
    // launches keep overlapping GPU work.
    STRATA_CUDA_CHECK(cudaEventRecord(staging_done_[current_staging_], s()));
    current_staging_ ^= 1;
    STRATA_CUDA_CHECK(cudaEventSynchronize(staging_done_[current_staging_]));
    staging_[current_staging_].reset();
    recorded_deltanet_.clear();
    for (auto& [layer, kv] : kv_) kv.first_in_window = -1;
    ple_.recorded = false;
  }

  // Replayable: the launches depend only on the key — KV capacity for the window and the states
  // seen before (first windows allocate). QSA block keys and token selection run on the device
  // from the window's first position; which QSA layers select (their last row over budget) is
  // part of the key, as their launch sequence differs.
  void describe_window(const HParams& hp, const WindowShape& shape) override {
    if (!graph_.enabled()) return;
    hp_ = &hp;
    const int64_t end = shape.n_past + shape.n_rows;
    bool replayable = !kv_.empty() || !deltanet_.empty();
    int qsa_selecting = 0;
    for (int l = 0; l < hp.n_layer && replayable; ++l) {
      const LayerKind kind = hp.layer_kinds.empty() ? LayerKind::Attention : hp.layer_kinds[size_t(l)];
      if (kind == LayerKind::GatedDeltaNet) {
        auto it = deltanet_.find(l);
        replayable = it != deltanet_.end() && (!shape.record || it->second.log_capacity >= shape.n_rows);
        continue;
      }
      auto it = kv_.find(l);
      if (it == kv_.end() || it->second.capacity < end) {
        replayable = false;
        break;
      }
      // QSA layers switch to device-side selection once the window's last row is over budget:
      // another launch sequence, so another key.
      const int ratio = hp.compress_ratios.empty() ? 0 : hp.compress_ratios[size_t(l)];
      if (ratio > 0 && end / ratio > hp.indexer_top_k / ratio) ++qsa_selecting;
    }
    if (hp.has_ple() && shape.record && ple_.normed_capacity < shape.n_rows) replayable = false;
    WindowKey key;
    key.rows = shape.n_rows;
    key.record = shape.record;
    key.logit_rows = shape.logit_rows;
    key.tokens_bound = attention_bound(end);
    key.staging = current_staging_;
    key.qsa_selecting = qsa_selecting;
    graph_.plan(key, replayable);
  }

  void embed(const WeightMatrix& table, std::span<const int32_t> tokens, Tensor out) override {
    const int64_t n_rows = int64_t(tokens.size());
    graph_.set_rows(n_rows);
    sign(Op::Embed, out, n_rows, reinterpret_cast<uintptr_t>(table.data));
    float* y = replaying() ? tensor_data(out, n_rows, "embed", table.n_in) : rows(out, n_rows, "embed", table.n_in);
    mark("embed");
    // Dequantized on the host (n_rows rows), then uploaded: the table can be the largest tensor
    // of a small model and is read a few rows per window.
    host_floats_.resize(size_t(n_rows * table.n_in));
    for (int64_t t = 0; t < n_rows; ++t)
      quant::dequantize_row(table.type, table.row(tokens[size_t(t)]), host_floats_.data() + t * table.n_in,
                            table.n_in);
    upload(y, host_floats_.data(), host_floats_.size() * 4);
  }

  void repeat(Tensor x, int n_copies, Tensor out, int64_t n_rows) override {
    sign(Op::Repeat, x, out, n_copies, n_rows);
    if (replaying()) return;
    const float* src = rows(x, n_rows, "repeat");
    float* dst = rows(out, n_rows, "repeat", x.width * n_copies);
    mark("repeat");
    if (n_rows == 0) return;
    for (int c = 0; c < n_copies; ++c)
      STRATA_CUDA_CHECK(cudaMemcpy2DAsync(dst + c * x.width, size_t(out.width) * 4, src, size_t(x.width) * 4,
                                          size_t(x.width) * 4, size_t(n_rows), cudaMemcpyDeviceToDevice, s()));
  }

  void rms_norm(Tensor x, std::span<const float> weight, float eps, Tensor out, int64_t n_rows) override {
    const int64_t width = int64_t(weight.size());
    sign(Op::RmsNorm, x, out, n_rows, reinterpret_cast<uintptr_t>(weight.data()));
    if (replaying()) return;
    const float* src = rows(x, n_rows, "rms_norm", width);
    float* dst = rows(out, n_rows, "rms_norm", width);
    mark("rms_norm");
    rms_norm_rows(src, vec(weight), n_rows, width, eps, dst, s());
  }

  void add(Tensor acc, Tensor y, int64_t n_rows) override {
    sign(Op::Add, acc, y, n_rows);
    if (replaying()) return;
    float* a = rows(acc, n_rows, "add");
    const float* b = rows(y, n_rows, "add", acc.width);
    mark("add");
    add_rows(a, b, n_rows * acc.width, s());
  }

  void matmul(const WeightMatrix& w, Tensor x, int64_t first_row, int64_t n_rows, Tensor y) override {
    sign(Op::Matmul, x, y, first_row, n_rows, reinterpret_cast<uintptr_t>(w.data));
    if (replaying()) return;
    const float* src = rows(x, first_row + n_rows, "matmul", w.n_in);
    float* dst = rows(y, n_rows, "matmul", w.n_out);
    mark("matmul (head)");
    scratch_.reset();
    mm(w, src + first_row * w.n_in, n_rows, dst);
  }

  void argmax(Tensor x, int64_t n_rows, Tensor ids) override {
    sign(Op::Argmax, x, ids, n_rows);
    if (replaying()) return;
    const float* src = rows(x, n_rows, "argmax");
    float* dst = rows(ids, n_rows, "argmax", 1);
    mark("argmax");
    argmax_rows(src, n_rows, x.width, reinterpret_cast<int32_t*>(dst), s());
  }

  void hyper_connection_in(const HyperConnectionWeights& w, int n_streams, float eps, Tensor X, Tensor x,
                           Tensor inject, int64_t n_rows) override {
    sign(Op::HcIn, X, x, inject, n_streams, n_rows, reinterpret_cast<uintptr_t>(w.down.data));
    if (replaying()) return;
    const float* Xd = rows(X, n_rows, "hyper_connection_in");
    const int64_t n_embd = X.width / n_streams, width = X.width, rank = w.down.n_out;
    float* xd = rows(x, n_rows, "hyper_connection_in", n_embd);
    float* inj = inject.valid() ? rows(inject, n_rows, "hyper_connection_in", n_streams) : nullptr;
    mark("hc_in.norm");
    const float inv_streams = 1.0f / float(n_streams);
    scratch_.reset();
    float* normed = scratch_.floats(n_rows * width);
    rms_norm_grouped_rows(Xd, vec(w.norm), n_rows, n_streams, n_embd, eps, normed, s());
    float* mix = scratch_.floats(n_rows * rank);
    const bool inject_here = w.has_inject() && inj;
    mark("hc_in.down+inject");
    if (inject_here)
      mm_shared(normed, n_rows, {{&w.down, mix}, {&w.inject, inj}});
    else
      mm(w.down, normed, n_rows, mix);
    float* gates = scratch_.floats(n_rows * width);
    mark("hc_in.up");
    mm_prologue(w.up, ActivationPrologue::ScaledSilu, mix, nullptr, inv_streams, n_rows, gates);
    mark("hc_in.combine");
    hc_combine(gates, normed, n_rows, n_streams, n_embd, inv_streams, xd, s(), inject_here ? inj : nullptr);
  }

  void hyper_connection_out(int n_streams, Tensor y, Tensor inject, Tensor X, int64_t n_rows) override {
    sign(Op::HcOut, y, inject, X, n_streams, n_rows);
    if (replaying()) return;
    float* Xd = rows(X, n_rows, "hyper_connection_out");
    const int64_t n_embd = X.width / n_streams;
    const float* yd = rows(y, n_rows, "hyper_connection_out", n_embd);
    const float* inj = rows(inject, n_rows, "hyper_connection_out", n_streams);
    mark("hc_out");
    hc_out(yd, inj, n_rows, n_streams, n_embd, Xd, s());
  }

  void gated_deltanet(const HParams& hp, const GatedDeltaNetWeights& w, GatedDeltaNetState&, int layer, Tensor x,
                      Tensor y, int64_t n_rows, bool record_window) override;
  void attention(const HParams& hp, const AttentionWeights& w, KvCache& cache, int layer, Tensor x, Tensor y,
                 int64_t n_rows) override;
  void ple(const HParams& hp, const PleWeights& w, PleState& state, PleRowReader& reader, Tensor X, int64_t n_rows,
           bool record_window) override;
  void moe(const HParams& hp, const MoeWeights& w, ExpertSource& experts, int layer, Tensor x, Tensor y,
           int64_t n_rows, const MoeWeights* next_router) override;
  bool rollback_window(int64_t keep_rows) override;

 private:
  cudaStream_t s() const { return stream_.get(); }
  void mark(const char* label) { graph_.mark(label); }
  bool replaying() const { return graph_.replaying(); }

  // The op's host arguments, mixed into the window's signature (window_graph.h: replay checks
  // them against the recorded window's).
  enum class Op : uint64_t { Write = 1, Embed, Repeat, RmsNorm, Add, Matmul, Argmax, HcIn, HcOut, DeltaNet, Attention,
                             Ple, Moe };
  static uint64_t word(Tensor t) { return uint64_t(t.id) << 32 | uint64_t(uint32_t(t.width)); }
  static uint64_t word(int64_t v) { return uint64_t(v); }
  static uint64_t word(int v) { return uint64_t(int64_t(v)); }
  static uint64_t word(bool v) { return v ? 1 : 0; }
  static uint64_t word(uintptr_t v) { return uint64_t(v); }
  template <class... Args>
  void sign(Op op, Args... args) {
    if (!graph_.enabled()) return;
    graph_.sign(uint64_t(op));
    (graph_.sign(word(args)), ...);
  }
  // The attention kernels' shared-memory bound for a window ending at `end` tokens: rounded up
  // so that windows of a 1024-token range launch identically (and replay one recording).
  static int64_t attention_bound(int64_t end) { return (end + 1023) / 1024 * 1024; }

  // An op's tensor: its device rows, after starting a capture segment if none is running.
  float* rows(Tensor t, int64_t n_rows, const char* op, int64_t width = -1) {
    if (replaying()) fail("cuda backend: {}: launched inside a replayed window (a bug: ops return before)", op);
    graph_.ensure_capturing();
    return tensor_data(t, n_rows, op, width);
  }
  float* tensor_data(Tensor t, int64_t n_rows, const char* op, int64_t width = -1) {
    if (!t.valid() || t.id >= buffers_.size() || !buffers_[t.id].data())
      fail("cuda backend: {}: invalid tensor handle", op);
    if (n_rows < 0 || n_rows > t.max_rows)
      fail("cuda backend: {}: {} rows asked of a tensor of {} rows", op, n_rows, t.max_rows);
    if (width >= 0 && width != t.width)
      fail("cuda backend: {}: expected a tensor of width {}, found {}", op, width, t.width);
    return buffers_[t.id].as<float>();
  }

  // Host → device through the window's pinned staging: the source may be reused at once, and
  // a captured copy reads the staged bytes when its graph runs.
  // In replay only the staging happens: the recorded copy reads the same pinned address.
  void upload(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    const void* staged = staging_[current_staging_].stage(src, bytes);
    if (!replaying()) STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, s()));
  }

  // Runs its scope outside graph capture (allocations, frees, synchronisation): the segment
  // captured so far is launched first, and capture resumes at the next op.
  struct EagerScope {
    explicit EagerScope(CudaBackend& b) { b.graph_.pause(false); }
  };
  int32_t* upload_ints(const std::vector<int32_t>& values) {
    int32_t* d = replaying() ? nullptr : scratch_.ints(int64_t(values.size()));
    upload(d, values.data(), values.size() * 4);
    return d;
  }

  // The device copy of a weight view (uploaded the first time it is seen).
  DeviceMatrix matrix(const WeightMatrix& w) {
    if (!w.data) fail("cuda backend: a weight matrix {} x {} has no data", w.n_out, w.n_in);
    const void* device = upload_once(w.data, size_t(w.n_out) * w.row_stride_bytes);
    return DeviceMatrix{w.type, w.n_in, w.n_out, device, w.row_stride_bytes};
  }
  const float* vec(std::span<const float> v) {
    if (v.empty()) return nullptr;
    return static_cast<const float*>(upload_once(v.data(), v.size_bytes()));
  }
  // The device copy of `bytes` host bytes at `host` (a longer view of the same start replaces it;
  // nothing else is ever replaced, so device pointers handed out stay valid).
  const void* upload_once(const void* host, size_t bytes) {
    std::lock_guard lock(weights_->mutex);
    auto it = weights_->buffers.find(host);
    if (it == weights_->buffers.end() || it->second.bytes() < bytes) {
      EagerScope eager(*this);
      if (it != weights_->buffers.end()) STRATA_CUDA_CHECK(cudaDeviceSynchronize());
      DeviceBuffer b(bytes);
      b.upload(host, bytes);
      it = weights_->buffers.insert_or_assign(host, std::move(b)).first;
    }
    return it->second.data();
  }

  // y = W·x for n_rows rows (activation scratch from the op arena).
  void mm(const WeightMatrix& w, const float* x, int64_t n_rows, float* y) { mm_shared(x, n_rows, {{&w, y}}); }
  // y = W·f(a, b) with the elementwise step f run inside the activation quantizer (matmul.h
  // quantize_activations_fused): one launch fewer, the same bits.
  void mm_prologue(const WeightMatrix& w, ActivationPrologue prologue, const float* a, const float* b, float scale,
                   int64_t n_rows, float* y) {
    if (n_rows == 0) return;
    const DeviceMatrix dm = matrix(w);
    const ActivationLayout layout = activation_layout(w.type, w.n_in, n_rows);
    void* act = scratch_.take(layout.total_bytes);
    quantize_activations_fused(layout, prologue, a, b, scale, act, s());
    matmul_quantized(dm, layout, act, n_rows, y, s());
  }
  // y_i = W_i·x for matrices that read the same input: x is quantized once per activation format
  // (the same bits each matmul would make alone), saving a launch per extra matrix.
  void mm_shared(const float* x, int64_t n_rows, std::initializer_list<std::pair<const WeightMatrix*, float*>> outputs) {
    if (n_rows == 0) return;
    struct Prepared {
      GgmlType format;
      int64_t n_in;
      const void* act;
    };
    Prepared prepared[8];
    int n_prepared = 0;
    for (const auto& [w, y] : outputs) {
      const DeviceMatrix dm = matrix(*w);
      const ActivationLayout layout = activation_layout(w->type, w->n_in, n_rows);
      const void* act = nullptr;
      for (int i = 0; i < n_prepared; ++i)
        if (prepared[i].format == layout.format && prepared[i].n_in == layout.n_in) act = prepared[i].act;
      if (!act) {
        act = prepare_activations(layout, x, scratch_.take(layout.total_bytes), s());
        if (n_prepared < 8) prepared[n_prepared++] = {layout.format, layout.n_in, act};
      }
      matmul_quantized(dm, layout, act, n_rows, y, s());
    }
  }

  const int32_t* positions(int64_t first, int64_t n, int64_t step = 1) {
    host_ints_.resize(size_t(n));
    for (int64_t t = 0; t < n; ++t) host_ints_[size_t(t)] = int32_t((first + t) * step);
    return upload_ints(host_ints_);
  }

  LayerExperts& layer_experts(const HParams& hp, ExpertSource& source, int layer);
  // The tiered arena when BackendShared::gpu_tier asks for a budget below every expert (made at
  // the first call), else nullptr (every expert resident: layer_experts).
  GpuExpertTier* expert_tier(const HParams& hp, int64_t max_rows);
  GpuTierOptions tier_options_;
  KvMirror& kv_mirror(const HParams& hp, const AttentionWeights& w, int layer, int64_t n_tokens);

  Stream stream_;
  WindowGraph graph_;  // captures each window's launches (window_graph.h)
  std::vector<DeviceBuffer> buffers_;
  std::vector<uint32_t> free_ids_;
  DeviceArena scratch_;
  PinnedStaging staging_[2];  // alternating per window (begin_window)
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  int current_staging_ = 0;
  std::shared_ptr<DeviceWeights> weights_;
  std::unordered_map<int, DeltaNetMirror> deltanet_;
  std::unordered_map<int, KvMirror> kv_;
  PleMirror ple_;
  const HParams* hp_ = nullptr;  // the model's, for rollback
  std::vector<int> recorded_deltanet_;
  // Expert launch tables: pair i = (row i / k, its j-th expert); row_of_pair[i] = i / k, identity[i] = i.
  DeviceBuffer row_of_pair_, identity_, ones_;
  int64_t pair_capacity_ = 0;
  int pair_k_ = 0;
  std::vector<float> host_floats_;
  std::vector<int32_t> host_ints_;
};

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet

void CudaBackend::gated_deltanet(const HParams& hp, const GatedDeltaNetWeights& w, GatedDeltaNetState&, int layer,
                                 Tensor x, Tensor y, int64_t n_rows, bool record_window) {
  sign(Op::DeltaNet, x, y, layer, n_rows, record_window);
  hp_ = &hp;
  if (replaying()) {  // the recorded graphs run the kernels; keep the rollback bookkeeping
    if (record_window) {
      deltanet_.at(layer).log_rows = n_rows;
      recorded_deltanet_.push_back(layer);
    }
    return;
  }
  const float* xd = rows(x, n_rows, "gated_deltanet");
  float* yd = rows(y, n_rows, "gated_deltanet", x.width);
  scratch_.reset();
  const int nk = hp.ssm_n_k_heads, nv = hp.ssm_n_v_heads;
  const int dk = hp.ssm_head_k_dim(), dv = hp.ssm_head_v_dim(), kernel = hp.ssm_conv_kernel;
  const int64_t key_dim = hp.ssm_key_dim(), value_dim = hp.ssm_value_dim(), conv_dim = hp.ssm_conv_dim();
  const size_t conv_bytes = size_t((kernel - 1) * conv_dim) * 4, ssm_bytes = size_t(nv) * dk * dv * 4;
  DeltaNetMirror& m = deltanet_[layer];
  if (!m.ssm.data()) {
    EagerScope eager(*this);
    m.conv = zeros(conv_bytes, s());
    m.ssm = zeros(ssm_bytes, s());
  }

  mark("dn.projections");
  float* mixed = scratch_.floats(n_rows * conv_dim);
  float* z = scratch_.floats(n_rows * value_dim);
  float* beta_raw = scratch_.floats(n_rows * nv);
  float* alpha_raw = scratch_.floats(n_rows * nv);
  if (w.fused_beta_alpha()) {
    float* ba = scratch_.floats(n_rows * 2 * nv);
    mm_shared(xd, n_rows, {{&w.qkv, mixed}, {&w.z, z}, {&w.beta_alpha, ba}});
    split_beta_alpha(ba, n_rows, nk, nv / nk, beta_raw, alpha_raw, s());
  } else {
    mm_shared(xd, n_rows, {{&w.qkv, mixed}, {&w.z, z}, {&w.beta, beta_raw}, {&w.alpha, alpha_raw}});
  }

  float *q, *k, *v, *beta, *decay;
  if (record_window) {
    if (m.log_capacity < n_rows) {
      EagerScope eager(*this);
      m.log_capacity = n_rows;
      m.ssm_before = DeviceBuffer(ssm_bytes);
      m.conv_before = DeviceBuffer(std::max<size_t>(conv_bytes, 4));
      m.conv_inputs = DeviceBuffer(size_t(n_rows * conv_dim) * 4);
      m.q = DeviceBuffer(size_t(n_rows * key_dim) * 4);
      m.k = DeviceBuffer(size_t(n_rows * key_dim) * 4);
      m.v = DeviceBuffer(size_t(n_rows * value_dim) * 4);
      m.beta = DeviceBuffer(size_t(n_rows * nv) * 4);
      m.decay = DeviceBuffer(size_t(n_rows * nv) * 4);
    }
    copy_d2d(m.ssm_before.data(), m.ssm.data(), ssm_bytes, s());
    copy_d2d(m.conv_before.data(), m.conv.data(), conv_bytes, s());
    copy_d2d(m.conv_inputs.data(), mixed, size_t(n_rows * conv_dim) * 4, s());
    m.log_rows = n_rows;
    recorded_deltanet_.push_back(layer);
    q = m.q.as<float>(), k = m.k.as<float>(), v = m.v.as<float>();
    beta = m.beta.as<float>(), decay = m.decay.as<float>();
  } else {
    q = scratch_.floats(n_rows * key_dim), k = scratch_.floats(n_rows * key_dim);
    v = scratch_.floats(n_rows * value_dim);
    beta = scratch_.floats(n_rows * nv), decay = scratch_.floats(n_rows * nv);
  }
  mark("dn.conv+prepare");
  float* conv_out = scratch_.floats(n_rows * conv_dim);
  deltanet_conv_silu(mixed, n_rows, conv_dim, vec(w.conv), kernel, m.conv.as<float>(), conv_out, s());
  deltanet_prepare(conv_out, beta_raw, alpha_raw, vec(w.a), vec(w.dt_bias), n_rows, nk, nv, dk, dv, q, k, v, beta,
                   decay, s());
  float* core = scratch_.floats(n_rows * value_dim);
  mark("dn.recurrent");
  delta_rule_recurrent(q, k, v, beta, decay, n_rows, nk, nv, dk, dv, hp.ssm_v_heads_tiled, m.ssm.as<float>(), core,
                       s());
  mark("dn.norm+gate+out");
  rms_norm_rows(core, vec(w.norm), n_rows * nv, dv, hp.rms_eps, core, s());
  gate_rows(core, z, n_rows * value_dim, hp.ssm_gate_sigmoid, s());
  mm(w.out, core, n_rows, yd);
}

// ---------------------------------------------------------------------------------------------
// Attention (plain, gated, QSA)

KvMirror& CudaBackend::kv_mirror(const HParams& hp, const AttentionWeights& w, int layer, int64_t n_tokens) {
  KvMirror& kv = kv_[layer];
  if (kv.capacity >= n_tokens) return kv;
  EagerScope eager(*this);
  const int64_t kv_dim = hp.kv_dim(), di = hp.indexer_head_dim;
  const int64_t capacity = std::max<int64_t>({n_tokens, 2 * kv.capacity, 256});
  const size_t keep_tokens = size_t(kv.capacity);
  grow(kv.k, size_t(capacity * kv_dim) * 4, keep_tokens * kv_dim * 4, s());
  grow(kv.v, size_t(capacity * kv_dim) * 4, keep_tokens * kv_dim * 4, s());
  if (w.sparse()) {
    grow(kv.index_raw, size_t(capacity * di) * 4, keep_tokens * di * 4, s());
    grow(kv.block_keys, size_t(capacity / w.compress_ratio + 1) * di * 4,
         size_t(kv.blocks_done * di) * 4, s());
  }
  kv.capacity = capacity;
  return kv;
}

void CudaBackend::attention(const HParams& hp, const AttentionWeights& w, KvCache& cache, int layer, Tensor x,
                            Tensor y, int64_t n_rows) {
  sign(Op::Attention, x, y, layer, n_rows);
  hp_ = &hp;
  const int64_t first = cache.n_tokens;
  if (replaying()) {
    // describe_window checked capacity, blocks and budget; stage the inputs in the recorded
    // order (the window's first position, then its positions).
    KvMirror& kv = kv_.at(layer);
    if (kv.first_in_window < 0) kv.first_in_window = first;
    upload_ints({int32_t(first)});
    positions(first, n_rows);
    if (w.sparse()) kv.blocks_done = (first + n_rows) / w.compress_ratio;
    cache.n_tokens += n_rows;
    return;
  }
  const float* xd = rows(x, n_rows, "attention");
  float* yd = rows(y, n_rows, "attention", x.width);
  scratch_.reset();
  const int hd = hp.head_dim, n_head = hp.n_head, n_head_kv = hp.n_head_kv;
  const int64_t q_row = int64_t(n_head) * hd * (w.gated ? 2 : 1), kv_dim = hp.kv_dim();
  if (first + n_rows > kMaxAttentionTokens)
    fail("cuda backend: attention: {} tokens exceed the CUDA attention's limit of {} for now", first + n_rows,
         kMaxAttentionTokens);
  KvMirror& kv = kv_mirror(hp, w, layer, first + n_rows);
  if (kv.first_in_window < 0) kv.first_in_window = first;

  mark("attn.projections");
  float* q = scratch_.floats(n_rows * q_row);
  float* k = scratch_.floats(n_rows * kv_dim);
  float* v = scratch_.floats(n_rows * kv_dim);
  mm_shared(xd, n_rows, {{&w.q, q}, {&w.k, k}, {&w.v, v}});
  mark("attn.norm+rope+append");
  // The window's first position as a device word, so a replayed graph appends and attends at
  // this window's n_past (the kernels read it when they run).
  const int32_t* first_device = upload_ints({int32_t(first)});
  const int32_t* pos = positions(first, n_rows);
  const int q_stride = w.gated ? 2 * hd : hd;
  if (!w.q_norm.empty()) rms_norm_strided(q, vec(w.q_norm), n_rows * n_head, hd, q_stride, hp.rms_eps, q, s());
  rope_neox_strided(q, n_rows, q_row, n_head, q_stride, hd, hp.n_rot, pos, hp.rope_theta, s());
  if (!w.k_norm.empty()) rms_norm_strided(k, vec(w.k_norm), n_rows * n_head_kv, hd, hd, hp.rms_eps, k, s());
  rope_neox_rows(k, n_rows, n_head_kv, hd, hp.n_rot, pos, hp.rope_theta, s());
  append_rows_at(k, n_rows, kv_dim, first_device, kv.k.as<float>(), s());
  append_rows_at(v, n_rows, kv_dim, first_device, kv.v.as<float>(), s());

  const int32_t* token_lists = nullptr;
  const int32_t* token_counts = nullptr;
  int max_tokens = 0;
  if (w.sparse()) {
    mark("attn.qsa");
    const int di = hp.indexer_head_dim, n_idx = hp.indexer_n_head, ratio = w.compress_ratio;
    float* index_q = scratch_.floats(n_rows * n_idx * di);
    float* raw = scratch_.floats(n_rows * di);
    mm_shared(xd, n_rows, {{&w.index_q, index_q}, {&w.index_k, raw}});
    rms_norm_strided(index_q, vec(w.index_q_norm), n_rows * n_idx, di, di, hp.rms_eps, index_q, s());
    rope_neox_rows(index_q, n_rows, n_idx, di, hp.n_rot, pos, hp.rope_theta, s());
    append_rows_at(raw, n_rows, di, first_device, kv.index_raw.as<float>(), s());
    // Blocks completed by this window: κ_b = RoPE_{ratio·b}(N1p(mean of the block's raw keys)),
    // found on the device from the window's first position (blocks before it are done).
    if (kv.blocks_done != first / ratio)
      fail("cuda backend: attention layer {}: QSA block keys cover {} blocks at position {}, expected {}", layer,
           kv.blocks_done, first, first / ratio);
    qsa_block_keys_at(kv.index_raw.as<float>(), first_device, n_rows, ratio, di, vec(w.index_k_norm), hp.rms_eps,
                      hp.n_rot, hp.rope_theta, kv.block_keys.as<float>(), s());
    const int64_t total_blocks = (first + n_rows) / ratio;
    kv.blocks_done = total_blocks;
    // The last row has the most blocks: when it is within budget, every row attends densely.
    // Otherwise the device scores the blocks and selects each row's tokens: launch shapes
    // depend only on the window's attention bound, so a replayed window selects for any n_past.
    const int64_t budget_blocks = hp.indexer_top_k / ratio;
    if (total_blocks > budget_blocks) {
      const int64_t max_blocks = attention_bound(first + n_rows) / ratio;
      max_tokens = int((budget_blocks + 1) * ratio - 1);
      float* scores = scratch_.floats(n_rows * max_blocks);
      int32_t* lists = scratch_.ints(n_rows * max_tokens);
      int32_t* counts = scratch_.ints(n_rows);
      const float scale = 1.0f / std::sqrt(float(di));
      qsa_block_scores_at(index_q, n_rows, n_idx, di, kv.block_keys.as<float>(), first_device, ratio, max_blocks,
                          scale, scores, s());
      qsa_select_tokens(scores, n_rows, max_blocks, first_device, ratio, budget_blocks, max_tokens, lists, counts,
                        s());
      token_lists = lists;
      token_counts = counts;
    }
  }

  mark("attn.core");
  float* attn = scratch_.floats(n_rows * n_head * hd);
  const AttentionShape shape{n_head, n_head_kv, hd, w.gated, q_row, kv_dim};
  attention_rows_at(shape, q, n_rows, kv.k.as<float>(), kv.v.as<float>(), first_device, attention_bound(first + n_rows),
                    token_lists, token_counts, max_tokens, attn, s());
  mark("attn.out");
  mm(w.o, attn, n_rows, yd);
  cache.n_tokens += n_rows;
}

// ---------------------------------------------------------------------------------------------
// PLE

void CudaBackend::ple(const HParams& hp, const PleWeights& w, PleState& state, PleRowReader& reader, Tensor X,
                      int64_t n_rows, bool record_window) {
  sign(Op::Ple, X, n_rows, record_window);
  hp_ = &hp;
  PleWindowLog& log = state.window_log;
  log.valid = false;
  if (record_window) {
    ple_.log_rows = n_rows;
    ple_.recorded = true;
    log.valid = true;
    log.context_before = state.context;
    log.n_rows = n_rows;
  }
  if (replaying()) {  // stage this window's rows where the recorded copy reads them
    const std::vector<float>& embeddings = reader.collect();
    upload(nullptr, embeddings.data(), embeddings.size() * 4);
    return;
  }
  float* Xd = rows(X, n_rows, "ple");
  mark("ple");
  scratch_.reset();
  const int S = hp.hc_count, kernel = hp.ple_conv_kernel, dilation = hp.ple_ngram_size;
  const int64_t H = hp.n_embd, width = S * H, history_steps = int64_t(kernel - 1) * dilation;
  const size_t history_bytes = size_t(std::max<int64_t>(history_steps, 1) * width) * 4;
  if (!ple_.history.data()) {
    EagerScope eager(*this);
    ple_.history = zeros(history_bytes, s());
    ple_.next = zeros(history_bytes, s());
    ple_.before = zeros(history_bytes, s());
  }
  const std::vector<float>& embeddings = reader.collect();
  const int64_t e_width = int64_t(embeddings.size()) / std::max<int64_t>(n_rows, 1);
  float* E = scratch_.floats(n_rows * e_width);
  upload(E, embeddings.data(), embeddings.size() * 4);

  float* keys = scratch_.floats(n_rows * width);
  float* values = scratch_.floats(n_rows * H);
  mm(w.key, E, n_rows, keys);
  mm(w.value, E, n_rows, values);
  rms_norm_grouped_rows(keys, vec(w.norm_key), n_rows, S, H, hp.rms_eps, keys, s());
  float* query = scratch_.floats(n_rows * width);
  rms_norm_grouped_rows(Xd, vec(w.norm_query), n_rows, S, H, hp.rms_eps, query, s());
  float* gated = scratch_.floats(n_rows * width);
  ple_gate(keys, query, values, n_rows, S, H, gated, s());
  float* normed;
  if (record_window) {
    if (ple_.normed_capacity < n_rows) {
      EagerScope eager(*this);
      ple_.normed = DeviceBuffer(size_t(n_rows * width) * 4);
      ple_.normed_capacity = n_rows;
    }
    normed = ple_.normed.as<float>();
  } else {
    normed = scratch_.floats(n_rows * width);
  }
  rms_norm_grouped_rows(gated, vec(w.norm_conv), n_rows, S, H, hp.rms_eps, normed, s());
  ple_conv(normed, ple_.history.as<float>(), vec(w.conv), gated, n_rows, width, kernel, dilation, Xd, s());
  history_tail(ple_.history.as<float>(), normed, n_rows, history_steps, width, ple_.next.as<float>(), s());
  // Copied, not swapped, so the buffers a recorded graph names stay the same from window to
  // window: the log keeps the history from before the window, then the new one takes its place.
  if (record_window) copy_d2d(ple_.before.data(), ple_.history.data(), history_bytes, s());
  copy_d2d(ple_.history.data(), ple_.next.data(), history_bytes, s());
}

// ---------------------------------------------------------------------------------------------
// MoE

LayerExperts& CudaBackend::layer_experts(const HParams& hp, ExpertSource& source, int layer) {
  std::lock_guard lock(weights_->mutex);
  auto it = weights_->experts.find(layer);
  if (it != weights_->experts.end()) return it->second;
  EagerScope eager(*this);
  const int n_expert = hp.n_expert;
  std::vector<int32_t> all(static_cast<size_t>(n_expert));
  std::iota(all.begin(), all.end(), 0);
  source.begin_layer(layer, all);
  LayerExperts le;
  std::vector<char> seen(static_cast<size_t>(n_expert), 0);
  int index = -1, handed = 0;
  ExpertMatrices m;
  size_t gate_bytes = 0, up_bytes = 0, down_bytes = 0;
  while (source.next(index, m)) {
    if (index < 0 || index >= n_expert || seen[size_t(index)])
      fail("cuda backend: layer {}: the expert source handed out index {} (of {}) twice or out of range", layer,
           index, n_expert);
    seen[size_t(index)] = 1;
    if (handed == 0) {
      gate_bytes = size_t(m.gate.n_out) * m.gate.row_stride_bytes;
      up_bytes = size_t(m.up.n_out) * m.up.row_stride_bytes;
      down_bytes = size_t(m.down.n_out) * m.down.row_stride_bytes;
      const size_t up_offset = align_up(gate_bytes, 16), down_offset = up_offset + align_up(up_bytes, 16);
      const size_t slot = align_up(down_offset + down_bytes, 256);
      le.gate = {m.gate.type, m.gate.n_in, m.gate.n_out, 0, m.gate.row_stride_bytes};
      le.up = {m.up.type, m.up.n_in, m.up.n_out, up_offset, m.up.row_stride_bytes};
      le.down = {m.down.type, m.down.n_in, m.down.n_out, down_offset, m.down.row_stride_bytes};
      le.arena = DeviceBuffer(slot * size_t(n_expert));
      le.view.slot_bytes = slot;
    }
    uint8_t* dst = le.arena.as<uint8_t>() + size_t(index) * le.view.slot_bytes;
    STRATA_CUDA_CHECK(cudaMemcpy(dst, m.gate.data, gate_bytes, cudaMemcpyHostToDevice));
    STRATA_CUDA_CHECK(cudaMemcpy(dst + le.up.matrix_offset, m.up.data, up_bytes, cudaMemcpyHostToDevice));
    STRATA_CUDA_CHECK(cudaMemcpy(dst + le.down.matrix_offset, m.down.data, down_bytes, cudaMemcpyHostToDevice));
    ++handed;
  }
  // The copies above are on the legacy stream and may return before their DMA ends (see
  // DeviceBuffer::upload); this backend's stream is non-blocking: wait for them.
  STRATA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  if (handed != n_expert)
    fail("cuda backend: layer {}: the expert source handed out {} of {} experts", layer, handed, n_expert);
  std::vector<uint32_t> identity(static_cast<size_t>(n_expert));
  std::iota(identity.begin(), identity.end(), 0u);
  le.smap = DeviceBuffer(identity.size() * 4);
  le.smap.upload(identity.data(), identity.size() * 4);
  le.view.base = le.arena.as<uint8_t>();
  le.view.smap = le.smap.as<uint32_t>();
  le.view.n_expert = n_expert;
  return weights_->experts.emplace(layer, std::move(le)).first->second;
}

GpuExpertTier* CudaBackend::expert_tier(const HParams& hp, int64_t max_rows) {
  std::lock_guard lock(weights_->mutex);
  if (weights_->tier_decided) return weights_->tier.get();
  weights_->tier_decided = true;
  if (!tier_options_.tiered()) return nullptr;
  if (tier_options_.layers.empty())
    fail("cuda backend: a GPU expert budget was set without the model's expert layouts (BackendShared::gpu_tier)");
  // A budget that buys a slot for every expert is the all-resident arena: no handshake.
  if (tier_options_.slots_per_layer >= hp.n_expert ||
      (tier_options_.slots_per_layer == 0 && tier_options_.budget_bytes >= tier_options_.all_expert_bytes(hp.n_expert)))
    return nullptr;
  EagerScope eager(*this);
  // Sized for windows of up to 256 rows or the session's largest, whichever is more, so later
  // sequences with other window sizes fit.
  weights_->tier = std::make_unique<GpuExpertTier>(tier_options_, hp.n_expert, hp.n_expert_used,
                                                   std::max<int64_t>(max_rows, 256));
  return weights_->tier.get();
}

void CudaBackend::moe(const HParams& hp, const MoeWeights& w, ExpertSource& experts, int layer, Tensor x, Tensor y,
                      int64_t n_rows, const MoeWeights* next_router) {
  sign(Op::Moe, x, y, layer, n_rows, next_router != nullptr);
  // Every window, replayed or not, has this layer's handshake on the GPU: the tier's host thread
  // must expect it before the window's work is launched.
  GpuExpertTier* tier = weights_->tier_decided ? weights_->tier.get() : nullptr;
  if (!weights_->tier_decided && !replaying()) tier = expert_tier(hp, x.max_rows);
  if (tier) tier->expect(experts);
  if (replaying()) return;
  const float* xd = rows(x, n_rows, "moe");
  float* yd = rows(y, n_rows, "moe", x.width);
  const int k = hp.n_expert_used, n_expert = hp.n_expert;
  const int64_t H = hp.n_embd, pairs = n_rows * k;
  const LayerExperts* all = tier ? nullptr : &layer_experts(hp, experts, layer);
  scratch_.reset();
  if (pair_capacity_ < pairs || pair_k_ != k) {
    EagerScope eager(*this);
    // Launch tables for up to `pairs` (row, expert) entries: entry i reads row i / k (gate, up)
    // or row i (down, whose inputs are the pairs themselves), one row per entry.
    const int64_t capacity = std::max<int64_t>(pairs, 64 * k);
    std::vector<int32_t> row_of_pair(static_cast<size_t>(capacity)), identity(static_cast<size_t>(capacity)),
        ones(static_cast<size_t>(capacity), 1);
    for (int64_t i = 0; i < capacity; ++i) {
      row_of_pair[size_t(i)] = int32_t(i / k);
      identity[size_t(i)] = int32_t(i);
    }
    row_of_pair_ = DeviceBuffer(size_t(capacity) * 4);
    identity_ = DeviceBuffer(size_t(capacity) * 4);
    ones_ = DeviceBuffer(size_t(capacity) * 4);
    row_of_pair_.upload(row_of_pair.data(), size_t(capacity) * 4);
    identity_.upload(identity.data(), size_t(capacity) * 4);
    ones_.upload(ones.data(), size_t(capacity) * 4);
    pair_capacity_ = capacity;
    pair_k_ = k;
  }
  mark("moe.router.mm");
  float* logits = scratch_.floats(n_rows * n_expert);
  mm(w.router, xd, n_rows, logits);
  int32_t* ids = scratch_.ints(pairs);
  float* weights = scratch_.floats(pairs);
  mark("moe.router.top_k");
  route_top_k(logits, n_rows, n_expert, k, ids, weights, s());

  if (tier) {
    // The handshake: publish the ids (and the next layer's guess), run the shared expert while
    // the host tier brings the misses, wait for them.
    int32_t* guess_ids = nullptr;
    float* guess_weights = nullptr;
    if (tier->read_ahead() && next_router) {
      mark("moe.tier.guess");
      float* guess_logits = scratch_.floats(n_rows * n_expert);
      mm(next_router->router, xd, n_rows, guess_logits);
      guess_ids = scratch_.ints(pairs);
      guess_weights = scratch_.floats(pairs);
      route_top_k(guess_logits, n_rows, n_expert, k, guess_ids, guess_weights, s());
    }
    mark("moe.tier.publish");
    tier->publish(layer, ids, pairs, guess_ids, guess_weights, pairs, s());
  }
  float* shared = nullptr;
  float* gate_logit = nullptr;
  if (w.has_shared()) {
    mark("moe.shared");
    const int64_t n_sh = w.shared_gate.n_out;
    float* sg = scratch_.floats(n_rows * n_sh);
    float* su = scratch_.floats(n_rows * n_sh);
    mm_shared(xd, n_rows, {{&w.shared_gate, sg}, {&w.shared_up, su}});
    shared = scratch_.floats(n_rows * H);
    mm_prologue(w.shared_down, ActivationPrologue::SiluMul, sg, su, 0.0f, n_rows, shared);
    gate_logit = scratch_.floats(n_rows);
    mm(WeightMatrix::dense(GgmlType::F32, H, 1, w.shared_gate_inp.data()), xd, n_rows, gate_logit);
  }
  if (tier) {
    mark("moe.tier.wait");
    tier->wait(layer, s());
  }
  const ExpertArenaView view = tier ? tier->view(layer) : all->view;
  const ExpertMatrixShape& gate = tier ? tier->layer(layer).gate : all->gate;
  const ExpertMatrixShape& up = tier ? tier->layer(layer).up : all->up;
  const ExpertMatrixShape& down = tier ? tier->layer(layer).down : all->down;

  mark("moe.experts.gate_up");
  const int64_t n_ff = gate.n_out;
  const ActivationLayout in_gate = activation_layout(gate.type, H, n_rows);
  void* act_gate = scratch_.take(in_gate.total_bytes);
  quantize_activations(in_gate, xd, act_gate, s());
  ActivationLayout in_up = in_gate;
  void* act_up = act_gate;
  if (up.type != gate.type) {
    in_up = activation_layout(up.type, H, n_rows);
    act_up = scratch_.take(in_up.total_bytes);
    quantize_activations(in_up, xd, act_up, s());
  }
  float* g = scratch_.floats(pairs * n_ff);
  float* u = scratch_.floats(pairs * n_ff);
  const int32_t* by_pair = row_of_pair_.as<int32_t>();
  const int32_t* ones = ones_.as<int32_t>();
  expert_matmul_quantized(view, 0, gate, ids, int(pairs), by_pair, ones, 1, in_gate, act_gate, g, s());
  expert_matmul_quantized(view, 0, up, ids, int(pairs), by_pair, ones, 1, in_up, act_up, u, s());
  mark("moe.experts.down");
  const ActivationLayout in_down = activation_layout(down.type, n_ff, pairs);
  void* act_down = scratch_.take(in_down.total_bytes);
  quantize_activations_fused(in_down, ActivationPrologue::SiluMul, g, u, 0.0f, act_down, s());
  float* out = scratch_.floats(pairs * H);
  expert_matmul_quantized(view, 0, down, ids, int(pairs), identity_.as<int32_t>(), ones, 1, in_down, act_down, out,
                          s());
  mark("moe.combine");
  moe_combine(out, weights, n_rows, k, H, shared, gate_logit, yd, s());
}

// ---------------------------------------------------------------------------------------------
// Rollback

bool CudaBackend::rollback_window(int64_t keep_rows) {
  if (!hp_) return true;  // nothing ran yet
  const HParams& hp = *hp_;
  for (const int layer : recorded_deltanet_) {
    DeltaNetMirror& m = deltanet_.at(layer);
    if (keep_rows < 0 || keep_rows > m.log_rows)
      fail("cuda backend: rollback: cannot keep {} rows of a {}-row window", keep_rows, m.log_rows);
    if (keep_rows == m.log_rows) continue;
    const int nk = hp.ssm_n_k_heads, nv = hp.ssm_n_v_heads;
    const int dk = hp.ssm_head_k_dim(), dv = hp.ssm_head_v_dim();
    const int64_t conv_dim = hp.ssm_conv_dim();
    history_tail(m.conv_before.as<float>(), m.conv_inputs.as<float>(), keep_rows, hp.ssm_conv_kernel - 1, conv_dim,
                 m.conv.as<float>(), s());
    copy_d2d(m.ssm.data(), m.ssm_before.data(), size_t(nv) * dk * dv * 4, s());
    if (keep_rows > 0)
      delta_rule_recurrent(m.q.as<float>(), m.k.as<float>(), m.v.as<float>(), m.beta.as<float>(),
                           m.decay.as<float>(), keep_rows, nk, nv, dk, dv, hp.ssm_v_heads_tiled, m.ssm.as<float>(),
                           nullptr, s());
  }
  recorded_deltanet_.clear();
  for (auto& [layer, kv] : kv_) {
    if (kv.first_in_window < 0) continue;
    const int ratio = hp.compress_ratios.empty() ? 0 : hp.compress_ratios[size_t(layer)];
    if (ratio > 0) kv.blocks_done = std::min(kv.blocks_done, (kv.first_in_window + keep_rows) / ratio);
    kv.first_in_window = -1;
  }
  if (ple_.recorded && keep_rows < ple_.log_rows) {
    const int64_t width = int64_t(hp.hc_count) * hp.n_embd;
    const int64_t history_steps = int64_t(hp.ple_conv_kernel - 1) * hp.ple_ngram_size;
    history_tail(ple_.before.as<float>(), ple_.normed.as<float>(), keep_rows, history_steps, width,
                 ple_.history.as<float>(), s());
  }
  ple_.recorded = false;
  return true;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(BackendShared& shared) { return std::make_unique<CudaBackend>(shared); }

GpuTierInfo gpu_tier_info(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (!cuda) return {};
  return cuda->tier_info();
}

GraphCounters graph_counters(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (!cuda) return {};
  const WindowGraphStats& g = cuda->graph_stats();
  return GraphCounters{g.windows, g.replays, g.records, g.forgotten};
}

void register_cuda_backend() {
  register_backend(BackendEntry{"cuda", [] { return usable_device(); }, [] { return describe_device(); },
                                [](BackendShared& shared) { return make_cuda_backend(shared); }});
}

}  // namespace strata::compute::cuda
