// The CUDA backend's class and its device-side state, shared by the files that define its ops:
// cuda_backend.cpp (buffers, window, the dense ops, the token mixers, PLE, rollback) and
// cuda_backend_moe.cpp (the MoE layer: the all-resident expert arena and the GPU expert tier).
// Internal to compute/cuda; the contract is in cuda_backend.h.
#pragma once


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
#include <optional>
#include <unordered_map>
#include <vector>

#include "backends/backend_registry.h"
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
#include "compute/gpu_memory_plan.h"
#include "experts/expert_source.h"
#include "layers/attention.h"
#include "layers/dims.h"
#include "layers/gated_deltanet.h"
#include "layers/hyper_connection.h"
#include "layers/moe.h"
#include "layers/ple.h"
#include "quant/quant.h"
#include "util/error.h"

#include "compute/cuda/cuda_backend.h"

namespace strata::compute::cuda::detail {

inline constexpr size_t kAlign = 256;
inline constexpr size_t kScratchChunk = kGpuScratchChunkBytes;  // gpu_memory_plan.h counts it

inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

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

// Before the model's first upload: its dense weights, the expert arena the session's budget makes
// and one sequence's working memory must fit in what the device has free
// (compute/gpu_memory_plan.h check_gpu_fit), else the message with the numbers. Not checked for a
// BackendShared without a model's footprint (a test's), or with STRATA_CUDA_FIT_CHECK=0 (the
// margin's terms are derived from the code, not measured on every device: the way out if one is
// ever wrong).
inline void check_device_fits(const BackendShared& shared) {
  if (!shared.gpu_footprint.known()) return;
  if (const char* v = std::getenv("STRATA_CUDA_FIT_CHECK"); v && std::strcmp(v, "0") == 0) return;
  size_t free_bytes = 0, total_bytes = 0;
  STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (check_gpu_fit("", free_bytes, shared.gpu_footprint, shared.gpu_tier).fits) return;
  // Named only when it does not fit (cudaGetDeviceProperties takes milliseconds on some drivers).
  const GpuFit fit =
      check_gpu_fit(describe_device(), free_bytes, shared.gpu_footprint, shared.gpu_tier);
  fail("cuda backend: {} (STRATA_CUDA_FIT_CHECK=0 skips this check)", fit.message);
}

// Window graphs are on unless STRATA_CUDA_GRAPH=0 (the eager path, for comparison and debugging).
inline bool graphs_enabled() {
  const char* v = std::getenv("STRATA_CUDA_GRAPH");
  return !(v && std::strcmp(v, "0") == 0);
}

// Prefill windows (>= 32 rows, not recorded) run Gated DeltaNet's chunked form only with
// STRATA_CUDA_CHUNKED_DELTANET=1, else the recurrent form like shorter windows. Off by default:
// the chunked kernel (deltanet.h) was written without a GPU and has not run on one yet; turn it
// on by default once tests/cuda/deltanet_test.cpp passes on the GPU and prefill is measured.
inline bool chunked_deltanet_enabled() {
  const char* v = std::getenv("STRATA_CUDA_CHUNKED_DELTANET");
  return v && std::strcmp(v, "1") == 0;
}

// Grows `buffer` to at least `bytes`, keeping its first `keep` bytes.
inline void grow(DeviceBuffer& buffer, size_t bytes, size_t keep, cudaStream_t stream) {
  if (buffer.bytes() >= bytes) return;
  DeviceBuffer bigger(std::max(bytes, buffer.bytes() * 2));
  STRATA_CUDA_CHECK(cudaMemsetAsync(bigger.data(), 0, bigger.bytes(), stream));
  if (keep > 0)
    STRATA_CUDA_CHECK(cudaMemcpyAsync(bigger.data(), buffer.data(), keep, cudaMemcpyDeviceToDevice, stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  buffer = std::move(bigger);
}

inline DeviceBuffer zeros(size_t bytes, cudaStream_t stream) {
  DeviceBuffer b(bytes);
  STRATA_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, b.bytes(), stream));
  return b;
}

inline void copy_d2d(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
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
        hc_scratch_([this] { graph_.pause(false); }),
        staging_{PinnedStaging([this] { graph_.pause(false); }), PinnedStaging([this] { graph_.pause(false); })} {
    if (!usable_device()) fail("cuda backend: no usable CUDA device ({})", describe_device());
    for (cudaEvent_t& e : staging_done_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&side_join_, cudaEventDisableTiming));
    std::lock_guard lock(shared.mutex);
    std::shared_ptr<void>& entry = shared.by_backend["cuda"];
    if (!entry) {
      // The model's first CUDA sequence: nothing of it is on the device yet.
      check_device_fits(shared);
      entry = std::make_shared<DeviceWeights>();
    }
    weights_ = std::static_pointer_cast<DeviceWeights>(entry);
    tier_options_ = shared.gpu_tier;
    // A capture cannot end with the tier's read-ahead branch still open.
    // A capture cannot end with a branch open either: the tier's read-ahead or the shared expert's.
    graph_.set_capture_boundary([this] {
      if (weights_->tier) weights_->tier->join(s());
      join_side();
    });
  }
  ~CudaBackend() override {
    // Pending work must finish before the buffers it uses go away.
    try {
      flush_deferred();
      graph_.finish_window();
    } catch (...) {
      graph_.abandon();
    }
    cudaStreamSynchronize(stream_.get());
    cudaStreamSynchronize(side_stream_.get());
    if (weights_->tier) try {
        weights_->tier->settle();
      } catch (...) {
      }
    for (cudaEvent_t e : staging_done_)
      if (e) cudaEventDestroy(e);
    cudaEventDestroy(side_fork_);
    cudaEventDestroy(side_join_);
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
      if (g.timed_replays > 0) {
        const double r = double(g.timed_replays);
        const double host_us =
            g.replay_host_before_s / double(std::max<int64_t>(g.replays_launched, 1)) * 1e6;
        std::fprintf(stderr,
                     "cuda backend replayed windows: host before the first launch %.1f us, GPU "
                     "from the first launch to the end %.1f us (per window, %lld timed)\n",
                     host_us, g.replay_gpu_s / r * 1e6, (long long)g.timed_replays);
      }
    }
    if (graph_.profiling()) std::fputs(graph_.profile_table().c_str(), stderr);
  }

  std::string_view name() const override { return "cuda"; }
  const WindowGraphStats& graph_stats() const { return graph_.stats(); }
  GpuExpertTier* expert_tier_if_any() const {
    std::lock_guard lock(weights_->mutex);
    return weights_->tier.get();
  }
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
    flush_deferred();
    EagerScope eager(*this);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(s()));
    buffers_[t.id] = DeviceBuffer();
    free_ids_.push_back(t.id);
  }

  void read(Tensor t, int64_t first_row, int64_t n_rows, float* out) override {
    flush_deferred();
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
    flush_deferred();  // (a window ends with a read, which flushed; this is for one that did not)
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
  void describe_window(const ForwardDims& hp, const WindowShape& shape) override {
    hp_ = &hp;
    if (!graph_.enabled()) return;
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
      if (ratio > 0 && end / ratio > hp.attention.indexer_top_k / ratio) ++qsa_selecting;
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
    // The previous block's deferred hc_out on this X, if any, becomes the first launch's prologue.
    std::optional<PendingHcOut> fold = take_if(pending_hc_out_, [&](const PendingHcOut& p) {
      return p.x_id == X.id && p.n_rows == n_rows && p.n_streams == n_streams;
    });
    float* Xd = rows(X, n_rows, "hyper_connection_in");
    const int64_t n_embd = X.width / n_streams, width = X.width, rank = w.down.n_out;
    float* xd = rows(x, n_rows, "hyper_connection_in", n_embd);
    float* inj = inject.valid() ? rows(inject, n_rows, "hyper_connection_in", n_streams) : nullptr;
    const float inv_streams = 1.0f / float(n_streams);
    const bool inject_here = w.has_inject() && inj;
    // Its own arena: a deferred MoE combine folded in here reads the MoE layer's scratch_.
    hc_scratch_.reset();
    float* normed = hc_scratch_.floats(n_rows * width);
    float* mix = hc_scratch_.floats(n_rows * rank);
    const ActivationLayout layout = activation_layout(w.down.type, w.down.n_in, n_rows);
    if (can_norm_quantize(layout, n_streams, n_embd)) {
      // One launch for [hc_out,] norm and the down matmul's quantizer; the inject matrix reads
      // the same activations when its format matches (as mm_shared would share them).
      mark(fold ? "hc_in.out+norm" : "hc_in.norm");
      void* act = hc_scratch_.take(layout.total_bytes);
      rms_norm_quantize_activations(layout, Xd, vec(w.norm), n_streams, n_embd, eps, normed, act, s(),
                                    fold ? fold->y : nullptr, fold ? fold->inject : nullptr,
                                    fold && fold->combine.k > 0 ? &fold->combine : nullptr);
      mark("hc_in.down+inject");
      const bool one_launch = inject_here && w.inject.type == w.down.type && w.inject.n_in == w.down.n_in;
      if (one_launch) {
        const DenseOutput both[] = {{matrix(w.down), mix}, {matrix(w.inject), inj}};
        matmul_quantized_many(both, layout, act, n_rows, s());
      } else {
        matmul_quantized(matrix(w.down), layout, act, n_rows, mix, s());
        if (inject_here) {
          const ActivationLayout inject_layout = activation_layout(w.inject.type, w.inject.n_in, n_rows);
          if (inject_layout.format == layout.format && inject_layout.n_in == layout.n_in)
            matmul_quantized(matrix(w.inject), layout, act, n_rows, inj, s());
          else
            mm(w.inject, normed, n_rows, inj);
        }
      }
    } else {
      if (fold) launch_hc_out(*fold);
      mark("hc_in.norm");
      rms_norm_grouped_rows(Xd, vec(w.norm), n_rows, n_streams, n_embd, eps, normed, s());
      mark("hc_in.down+inject");
      if (inject_here)
        mm_shared(normed, n_rows, {{&w.down, mix}, {&w.inject, inj}});
      else
        mm(w.down, normed, n_rows, mix);
    }
    float* gates = hc_scratch_.floats(n_rows * width);
    mark("hc_in.up");
    mm_prologue(w.up, ActivationPrologue::ScaledSilu, mix, nullptr, inv_streams, n_rows, gates);
    // The combine (and the injection weights) deferred: the op reading x next computes it in its
    // quantizer's launch (PendingHcCombine), else it is launched first (flush_deferred).
    pending_hc_combine_ =
        PendingHcCombine{x.id, n_rows, n_embd, HcCombineInputs{gates, normed, n_streams, inv_streams, xd, inject_here ? inj : nullptr}};
  }

  // X_s += inject_s·y. Deferred: the next op launches it, or the next hyper_connection_in on the
  // same X folds it into its first launch (one launch fewer per block; the same bits). A deferred
  // MoE combine into y (moe) travels with it: y is computed in that launch.
  void hyper_connection_out(int n_streams, Tensor y, Tensor inject, Tensor X, int64_t n_rows) override {
    sign(Op::HcOut, y, inject, X, n_streams, n_rows);
    if (replaying()) return;
    const int64_t n_embd = X.width / n_streams;
    // A deferred MoE combine into y comes along (y is then computed where it is read).
    const std::optional<PendingMoeCombine> combine = take_if(pending_combine_, [&](const PendingMoeCombine& p) {
      return p.y_id == y.id && p.n_rows == n_rows && p.n_embd == n_embd;
    });
    float* Xd = rows(X, n_rows, "hyper_connection_out");
    float* yd = rows(y, n_rows, "hyper_connection_out", n_embd);
    const float* inj = rows(inject, n_rows, "hyper_connection_out", n_streams);
    if (n_rows == 0) return;
    pending_hc_out_ = PendingHcOut{X.id, n_rows, n_streams, n_embd, Xd, yd, inj, combine ? combine->in : MoeCombineInputs{}};
  }

  void gated_deltanet(const DeltaNetDims& hp, const GatedDeltaNetWeights& w, GatedDeltaNetState&, int layer, Tensor x,
                      Tensor y, int64_t n_rows, bool record_window) override;
  void attention(const AttentionDims& hp, const AttentionWeights& w, KvCache& cache, int layer, Tensor x, Tensor y,
                 int64_t n_rows) override;
  void ple(const PleDims& hp, const PleWeights& w, PleState& state, PleRowReader& reader, Tensor X, int64_t n_rows,
           bool record_window) override;
  void moe(const MoeDims& hp, const MoeWeights& w, ExpertSource& experts, int layer, Tensor x, Tensor y,
           int64_t n_rows, const MoeWeights* next_router) override;
  bool rollback_window(int64_t keep_rows) override;

 private:
  cudaStream_t s() const { return stream_.get(); }

  // A side branch: work that does not depend on what the main stream does next (the shared
  // expert beside the routing, QSA's indexer beside the heads) runs on side_stream_, a parallel
  // branch of the window's graph. side_branch(fn) makes the side stream wait for everything
  // launched on s() so far and calls fn(side stream) to launch the branch's work; join_side()
  // makes s() wait for it (the op calls it where the results are needed; a capture boundary
  // calls it too). fn must take nothing from the scratch arena and upload nothing: an allocation
  // is a host sync point, a capture boundary, and a launch after it on the side stream would
  // escape the capture; that is checked (a bug, thrown). Bitwise: the same kernels on the same
  // inputs; only their overlap changes.
  template <class Fn>
  void side_branch(Fn&& launches) {
    if (side_open_) fail("cuda backend: a side branch was forked while the last one was still open");
    STRATA_CUDA_CHECK(cudaEventRecord(side_fork_, s()));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(side_stream_.get(), side_fork_, 0));
    side_open_ = side_issuing_ = true;
    launches(side_stream_.get());
    side_issuing_ = false;
  }
  void join_side() {
    if (side_issuing_)
      fail("cuda backend: a capture boundary (an allocation or upload) inside a side branch's launches: take the "
           "branch's scratch and weights before side_branch (a bug)");
    if (!side_open_) return;
    side_open_ = false;
    STRATA_CUDA_CHECK(cudaEventRecord(side_join_, side_stream_.get()));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(s(), side_join_, 0));
  }
  void mark(const char* label) { graph_.mark(label); }

  // A deferred step, taken out of `pending` when its consumer `matches` it (that consumer then
  // computes it in its own launch); else left for flush_deferred.
  template <class Pending, class Match>
  static std::optional<Pending> take_if(std::optional<Pending>& pending, Match matches) {
    std::optional<Pending> taken;
    if (pending && matches(*pending)) taken.swap(pending);
    return taken;
  }

  // A deferred hyper_connection_out (raw device pointers: tensors stay allocated until release,
  // which flushes first). Launched by the next op that touches any tensor (rows()), by read,
  // release, begin_window and rollback, or folded into the next hyper_connection_in on X.
  struct PendingHcOut {
    uint32_t x_id;
    int64_t n_rows;
    int n_streams;
    int64_t n_embd;
    float* X;
    float* y;
    const float* inject;
    MoeCombineInputs combine;  // k > 0: y is this combine's, computed (and stored) by the launch
  };
  std::optional<PendingHcOut> pending_hc_out_;
  void launch_hc_out(const PendingHcOut& p) {
    graph_.ensure_capturing();
    mark("hc_out");
    if (p.combine.k > 0) moe_combine_hc_out(p.combine, p.inject, p.n_rows, p.n_streams, p.n_embd, p.y, p.X, s());
    else hc_out(p.y, p.inject, p.n_rows, p.n_streams, p.n_embd, p.X, s());
  }
  // A deferred MoE combine (moe's last step): taken by hyper_connection_out on y, else launched by
  // the next op that touches any tensor, like the deferred hc_out. Its inputs are the MoE layer's
  // scratch_ (hyper_connection_in, which may fold it, takes its own from hc_scratch_).
  struct PendingMoeCombine {
    uint32_t y_id;
    int64_t n_rows;
    int64_t n_embd;
    float* y;
    MoeCombineInputs in;
  };
  std::optional<PendingMoeCombine> pending_combine_;
  // A deferred hc_combine (hyper_connection_in's last step): the next op that reads x takes it
  // (take_hc_combine, before its rows()) and computes x in the quantizer of its first matmul
  // (quantize_activations_combined: one launch fewer per block, the same bits); anything else
  // launches it first. Its inputs live in hc_scratch_, which only the next hyper_connection_in
  // resets (after flushing).
  struct PendingHcCombine {
    uint32_t x_id;
    int64_t n_rows;
    int64_t n_embd;
    HcCombineInputs in;
  };
  std::optional<PendingHcCombine> pending_hc_combine_;
  std::optional<PendingHcCombine> take_hc_combine(Tensor x, int64_t n_rows) {
    return take_if(pending_hc_combine_, [&](const PendingHcCombine& p) {
      return p.x_id == x.id && p.n_rows == n_rows && p.n_embd == x.width;
    });
  }
  void launch_hc_combine(const PendingHcCombine& p) {
    graph_.ensure_capturing();
    mark("hc_in.combine");
    hc_combine(p.in.gates, p.in.normed, p.n_rows, p.in.n_streams, p.n_embd, p.in.inv_streams, p.in.x, s(), p.in.inject);
  }
  // x's activations in `layout` for a matmul, with a taken hc_combine folded in where it can be
  // (a quantized layout); else the combine is launched first. `fold` is empty afterwards.
  const void* prepare_x(const ActivationLayout& layout, const float* x, void* scratch,
                        std::optional<PendingHcCombine>& fold, cudaStream_t stream) {
    if (fold && stream != s())  // a side branch forked before the combine would not see it
      fail("cuda backend: a deferred hc_combine taken into a side branch's matmul (a bug)");
    if (fold && layout.format != GgmlType::F32) {
      quantize_activations_combined(layout, fold->in, scratch, stream);
      fold.reset();
      return scratch;
    }
    if (fold) {
      launch_hc_combine(*fold);
      fold.reset();
    }
    return prepare_activations(layout, x, scratch, stream);
  }
  // Launches what is deferred, in program order (at most one is pending at a time: each deferring
  // op flushes on entry): the hc_combine, the MoE combine, the hc_out.
  void flush_deferred() {
    if (pending_hc_combine_) {
      const PendingHcCombine p = *pending_hc_combine_;
      pending_hc_combine_.reset();
      launch_hc_combine(p);
    }
    if (pending_combine_) {
      const PendingMoeCombine p = *pending_combine_;
      pending_combine_.reset();
      graph_.ensure_capturing();
      mark("moe.combine");
      moe_combine(p.in.expert_out, p.in.weights, p.n_rows, p.in.k, p.n_embd, p.in.shared, p.in.shared_gate_logit,
                  p.y, s());
    }
    if (!pending_hc_out_) return;
    const PendingHcOut p = *pending_hc_out_;
    pending_hc_out_.reset();
    launch_hc_out(p);
  }
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
    flush_deferred();
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
    if (can_quantize_in_block(w.type, w.n_in, n_rows)) {  // narrow rows: the matmul quantizes them itself
      matmul_in_block(dm, InBlockActivations{prologue, a, b, scale}, n_rows, y, s());
      return;
    }
    const ActivationLayout layout = activation_layout(w.type, w.n_in, n_rows);
    void* act = scratch_.take(layout.total_bytes);
    quantize_activations_fused(layout, prologue, a, b, scale, act, s());
    matmul_quantized(dm, layout, act, n_rows, y, s());
  }
  // y_i = W_i·x for matrices that read the same input: x is quantized once per activation format
  // (the same bits each matmul would make alone), and matrices of one type and width run in one
  // launch (matmul_quantized_many: one launch's latency instead of one per matrix).
  // With `fold` (a taken hc_combine of x), x is computed by the first quantizer launched.
  void mm_shared(const float* x, int64_t n_rows, std::initializer_list<std::pair<const WeightMatrix*, float*>> outputs,
                 cudaStream_t stream = nullptr, std::optional<PendingHcCombine>* fold = nullptr) {
    std::optional<PendingHcCombine> none;
    if (!fold) fold = &none;
    if (!stream) stream = s();
    if (n_rows == 0) {
      if (*fold) launch_hc_combine(**fold);
      fold->reset();
      return;
    }
    struct Group {
      GgmlType type;
      int64_t n_in;
      ActivationLayout layout;
      const void* act;
      DenseOutput out[kMaxDenseMatrices];
      int n;
    };
    Group groups[8];
    int n_groups = 0;
    for (const auto& [w, y] : outputs) {
      const ActivationLayout layout = activation_layout(w->type, w->n_in, n_rows);
      Group* group = nullptr;
      const void* act = nullptr;
      for (int i = 0; i < n_groups; ++i) {
        Group& g = groups[i];
        if (g.layout.format == layout.format && g.n_in == layout.n_in) act = g.act;
        if (g.type == w->type && g.n_in == w->n_in && g.n < kMaxDenseMatrices) group = &g;
      }
      if (!act) act = prepare_x(layout, x, scratch_.take(layout.total_bytes), *fold, stream);
      if (!group) {
        if (n_groups == 8) fail("cuda backend: more than 8 matrices share one input");
        group = &groups[n_groups++];
        *group = Group{w->type, w->n_in, layout, act, {}, 0};
      }
      group->out[group->n++] = DenseOutput{matrix(*w), y};
    }
    for (int i = 0; i < n_groups; ++i)
      matmul_quantized_many(std::span<const DenseOutput>(groups[i].out, size_t(groups[i].n)), groups[i].layout,
                            groups[i].act, n_rows, stream);
  }

  const int32_t* positions(int64_t first, int64_t n, int64_t step = 1) {
    host_ints_.resize(size_t(n));
    for (int64_t t = 0; t < n; ++t) host_ints_[size_t(t)] = int32_t((first + t) * step);
    return upload_ints(host_ints_);
  }

  LayerExperts& layer_experts(const MoeDims& hp, ExpertSource& source, int layer);
  // The tiered arena when BackendShared::gpu_tier asks for a budget below every expert (made at
  // the first call), else nullptr (every expert resident: layer_experts).
  GpuExpertTier* expert_tier(const MoeDims& hp, int64_t max_rows, ExpertSource& source);
  GpuTierOptions tier_options_;
  KvMirror& kv_mirror(const AttentionDims& hp, const AttentionWeights& w, int layer, int64_t n_tokens);

  Stream stream_;
  Stream side_stream_;  // side_branch / join_side
  cudaEvent_t side_fork_ = nullptr, side_join_ = nullptr;
  bool side_open_ = false, side_issuing_ = false;
  WindowGraph graph_;  // captures each window's launches (window_graph.h)
  std::vector<DeviceBuffer> buffers_;
  std::vector<uint32_t> free_ids_;
  // The two per-op scratch arenas (gpu_memory_plan.h kGpuScratchArenas counts them).
  DeviceArena scratch_;
  DeviceArena hc_scratch_;  // hyper_connection_in's (see PendingMoeCombine)
  // Gated DeltaNet's conv and prepare in one launch for short windows (gated_deltanet);
  // STRATA_CUDA_DN_FUSED=0: two launches, for comparison.
  const bool dn_conv_prepare_fused_ = [] {
    const char* v = std::getenv("STRATA_CUDA_DN_FUSED");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  PinnedStaging staging_[2];  // alternating per window (begin_window)
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  int current_staging_ = 0;
  std::shared_ptr<DeviceWeights> weights_;
  std::unordered_map<int, DeltaNetMirror> deltanet_;
  // Read once per backend, so a window's kernels depend on its shape only (recorded graphs).
  const bool chunked_deltanet_ = chunked_deltanet_enabled();
  std::unordered_map<int, KvMirror> kv_;
  PleMirror ple_;
  const ForwardDims* hp_ = nullptr;  // the model's (describe_window), for rollback
  std::vector<int> recorded_deltanet_;
  // Expert launch tables: pair i = (row i / k, its j-th expert); row_of_pair[i] = i / k, identity[i] = i.
  DeviceBuffer row_of_pair_, identity_, ones_;
  int64_t pair_capacity_ = 0;
  int pair_k_ = 0;
  std::vector<float> host_floats_;
  std::vector<int32_t> host_ints_;
};


}  // namespace strata::compute::cuda::detail
