// Model — a loaded architecture: hyper-parameters, weight views into the GGUF mapping, and the
// layer sequence of a window of T tokens (T = 1 decode, 1+k speculative verify, chunk prefill).
// The Model describes; engine/window.h's WindowRunner runs a window through it (token checks,
// the speculative window log, the backend's window, positions, the head and the read-back).
//
// Contract
// - `Model::load` opens the GGUF, reads the hyper-parameters, checks the file against the
//   architecture's tensor table (model/tensor_specs.h: presence, shape, type; errors name the
//   file, tensor, expected and found) and picks the architecture class, which takes its weights
//   from that same table.
// - `run_layers` describes a window as ops on the state's compute::Backend (compute/backend.h);
//   it never returns data to the host. A row's result is bitwise identical whether it is
//   computed alone or inside a window of T rows (window identity; tested), so speculative verify
//   can be exact.
// - Routed experts are fetched through the ExpertSource passed in (default: the file mapping).
// - A Model is immutable after load; one window runs at a time per ModelState. The thread pool
//   is the caller's.
// - Allocation: a ModelState carries its backend (whose buffers and scratch are reused), the PLE
//   reader and its buffers, and `new_state(n_ctx)` reserves the KV caches for n_ctx tokens, so
//   once a window shape has run, running it again allocates nothing
//   (tests/engine/zero_alloc_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend_registry.h"
#include "compute/backend.h"
#include "compute/cpu/thread_pool.h"
#include "compute/cpu/workspace.h"
#include "experts/expert_source.h"
#include "gguf/gguf.h"
#include "layers/attention.h"
#include "layers/gated_deltanet.h"
#include "layers/hyper_connection.h"
#include "layers/moe.h"
#include "layers/ple.h"
#include "model/hparams.h"
#include "model/tensor_loader.h"
#include "model/tensor_table.h"

namespace strata {

// The MTP head's activations on its backend, sized for the most entries run at once so far.
struct MtpTensors {
  const compute::Backend* owner = nullptr;
  int64_t max_rows = 0;
  compute::Tensor hidden, normed;  // the trunk rows in, and normed [W] (W = S·H, or H)
  compute::Tensor embedded;        // [H]
  compute::Tensor inputs;          // [max_rows·S][2H]: eh_proj's inputs per (entry, stream)
  compute::Tensor X;               // [max_rows·S][H]: eh_proj's output, seen as [max_rows][W]
  compute::Tensor x, y, inject;    // block in/out [H], [S]
  compute::Tensor logits;          // [n_vocab]
};

// The MTP (nextn) head's own state: entry t of `kv` holds what the head computed for trunk
// position t. The head runs through `backend` (compute/backend.h) like the trunk: the first draft
// puts a CPU backend here unless one was set (a test's recording backend). The trunk's backend
// may be another one (CUDA): the head reads the trunk rows the window runner read back.
struct MtpState {
  KvCache kv;
  std::unique_ptr<compute::Backend> backend;
  MtpTensors tensors;
};

// A window's activations: buffers of the state's backend, sized for the largest window so far
// (allocated by the first window of that size, then reused).
struct WindowTensors {
  const compute::Backend* owner = nullptr;
  int64_t max_rows = 0;
  compute::Tensor X, x, y, inject;  // qwen4exp streams [S·H], block in/out [H], [S]
  compute::Tensor residual, normed;  // pre-norm archs [H]
  compute::Tensor hidden, logits;    // final hidden [H], head output [n_vocab]
};

// The window tensors a model allocates (Model::ensure_tensors) and their widths, in allocation
// order: x, y, hidden, logits, then X and inject (qwen4exp) or residual and normed.
struct WindowTensorWidth {
  compute::Tensor WindowTensors::*tensor;
  int64_t width;
};
std::vector<WindowTensorWidth> window_tensor_widths(const HParams& hp);

// Everything a sequence carries between windows.
struct ModelState {
  int64_t n_past = 0;
  std::vector<GatedDeltaNetState> deltanet;  // [n_layer]; used by GDN layers
  std::vector<KvCache> kv;                   // [n_layer]; used by attention layers
  PleState ple;
  // The MTP head's input for every row of the last window (models with an MTP head only):
  // qwen4exp the multi-stream residual before the final mixer ([n_rows][S·H]), qwen3next the
  // trunk output after output_norm ([n_rows][H]).
  std::vector<float> residuals;
  MtpState mtp;
  // The backend that runs this sequence's windows (new_state: the CPU backend; a test may put
  // another one here before the first window) and the window's tensors on it.
  std::unique_ptr<compute::Backend> backend;
  WindowTensors tensors;
  std::unique_ptr<PleRowReader> ple_reader;  // models with PLE
  std::vector<uint64_t> ple_rows;
  // Speculative verify: while set, every window keeps what `WindowRunner::rollback` needs to undo
  // the window's last rows (KV needs nothing; DeltaNet/conv and PLE keep a log, see their
  // headers). Off by default, and when off the forward is unchanged.
  bool record_windows = false;
  struct WindowLog {
    bool valid = false;
    int64_t n_past_before = 0;
    std::vector<int32_t> tokens;
  } window_log;
};

// One sequence's rows in a window of several (WindowRunner::run_batch): window rows
// [first_row, first_row + tokens.size()) carry `tokens`, fed to `state`.
struct WindowSegment {
  ModelState* state = nullptr;
  std::span<const int32_t> tokens;
  int64_t first_row = 0;
};

// What a window of several sequences runs on besides their states (WindowRunner::run_batch): its
// own CPU backend, the window's tensors (all rows) and one sequence's tensors (the token mixers
// run per sequence on those), reused by every batched window (sized for the largest so far).
// One per caller; not shared between threads.
struct BatchWindow {
  std::unique_ptr<compute::Backend> backend;
  WindowTensors tensors;
  WindowTensors segment;
  std::vector<int32_t> tokens;
  std::vector<WindowSegment> segments;
  std::vector<compute::RowSegment> rows;       // segments' rows, for the backend's batched mixers
  std::vector<GatedDeltaNetState*> deltanets;  // one layer's states, in segment order
  std::vector<KvCache*> caches;
  std::vector<PleState*> ples;                 // the PLE layer's states and row readers
  std::vector<PleRowReader*> ple_readers;
};

// Deep copy of what a sequence carries between windows, for the conversation state cache
// (decode/state_cache.h): n_past, every layer's KV cache (k, v, QSA index keys and block keys),
// Gated DeltaNet conv and recurrent states, the PLE n-gram context and conv history, `residuals`
// (the MTP drafter's input rows of the last window) and the MTP head's cache (mtp.kv).
// Not copied, on purpose: the backend, its window tensors and every Workspace (scratch); the PLE
// reader and its row ids (scratch of one window); the speculative window logs (DeltaNet, PLE,
// state.window_log): a log is consumed by the keep_rows right after its verify window, and a
// copy is only ever taken between windows, so `to`'s logs are marked invalid. Assigning into an
// existing state reuses its buffers (no allocation when they have the capacity). Host structs
// only: a backend that keeps states in its own memory (CUDA) is not supported, and the caller
// must refuse it (Session::snapshot does).
void copy_sequence_state(const ModelState& from, ModelState& to);
// The bytes copy_sequence_state's data occupies in `state` (buffer capacities).
uint64_t sequence_state_bytes(const ModelState& state);

enum class LogitRows { None, Last, All };

struct LayerWeights {
  LayerKind kind = LayerKind::Attention;
  std::vector<float> attn_norm, ffn_norm;         // pre-norm archs
  HyperConnectionWeights hc_attn, hc_ffn;         // qwen4exp
  GatedDeltaNetWeights deltanet;
  AttentionWeights attention;
  MoeWeights moe;
  ExpertTensor gate_exps, up_exps, down_exps;
};

class Model {
 public:
  static std::unique_ptr<Model> load(const std::string& path);
  virtual ~Model() = default;

  const HParams& hparams() const { return hp_; }
  // The same as the blocks and the backends take them (layers/dims.h), built once at load.
  const ForwardDims& dims() const { return dims_; }
  const GgufFile& file() const { return *file_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  // The file's tensors the model took its weights from (each once, in load order): every
  // declared tensor the file holds, nothing else (tests/model/tensor_table_test.cpp).
  const std::vector<std::string>& loaded_tensors() const { return loaded_tensors_; }

  // A fresh sequence; the KV caches are reserved for n_ctx tokens (0: none reserved; they grow).
  // `backend` runs its windows (null: the CPU backend; backends/backend_registry.h makes others).
  // A backend that keeps states in its own memory (CUDA) gets host structs with no reservation.
  ModelState new_state(int64_t n_ctx = 0, std::unique_ptr<compute::Backend> backend = nullptr) const;
  // The MTP (nextn) draft head, where the file has one.
  virtual bool has_mtp() const { return false; }
  // Runs the head over n entries: `hidden` [n][W] (what ModelState::residuals holds for the trunk
  // rows, or the head's own output for a chained draft; W = S·H for qwen4exp, H for qwen3next) and
  // `tokens` [n] (the token that follows each entry's position). Appends n entries to mtp.kv and
  // writes the draft logits [n][n_vocab]; `residual_out` (if given) receives the head's output
  // [n][W], the `hidden` of a chained next step.
  virtual void mtp_forward(compute::ThreadPool& pool, MtpState& mtp, const float* hidden,
                           std::span<const int32_t> tokens, std::vector<float>& logits,
                           std::vector<float>* residual_out = nullptr,
                           ExpertSource* experts = nullptr) const;

  // The default expert source: views straight into the file mapping. Its publish/wait pair keeps
  // the published layer's views, so one window at a time uses it.
  ExpertSource& mapped_experts() const { return *mapped_experts_; }
  // Another source of the same views, for a window that runs beside the one using
  // mapped_experts() (strata serve --batch-groups). Lives no longer than the model.
  std::unique_ptr<ExpertSource> new_mapped_experts() const;
  // What the compute backends of this model's sequences share (a GPU's copy of the weights); lives
  // as long as the model. compute::make_backend(name, model.backend_shared()).
  compute::BackendShared& backend_shared() const { return *backend_shared_; }
  // The shapes of each trunk layer's routed experts, for a GPU expert tier
  // (compute/expert_tier.h: backend_shared().gpu_tier.layers).
  std::vector<compute::ExpertLayerLayout> expert_layouts() const;
  // The same for every block of layers() (the MTP block included): the layout an ExpertStore
  // takes (experts/expert_store.h).
  std::vector<compute::ExpertLayerLayout> block_expert_layouts() const;

  // ---- The layer sequence, as engine/window.h's WindowRunner runs it ----
  // One window as the architecture files see it: `be` (window begun), its tensors `t` (sized for
  // n_rows), every row's token, and the sequences whose rows it carries. With one segment the
  // token mixers run on `t` directly (the single-sequence forward, unchanged); with several, a
  // backend with batched mixers runs them over all rows (projections once, the rest per
  // sequence), any other gets each sequence's rows copied into `segment` (sized for the longest)
  // and back.
  struct WindowRun {
    compute::Backend& be;
    const WindowTensors& t;
    std::span<const int32_t> tokens;
    std::span<const WindowSegment> segments;
    BatchWindow* batch = nullptr;  // with several segments
    const WindowTensors* segment = nullptr;
    int64_t n_rows() const { return int64_t(tokens.size()); }
    bool batched() const { return segments.size() > 1; }
  };
  // Throws unless every token is in [0, n_vocab).
  void check_tokens(std::span<const int32_t> tokens) const;
  // (Re)allocates t on be for windows of n_rows (kept when it is already on be and large enough).
  void ensure_tensors(compute::Backend& be, WindowTensors& t, int64_t n_rows) const;
  // Starts the window's inputs that depend on its tokens only, before any layer runs (qwen4exp:
  // every sequence's PLE row reads, collected at the PLE layer). Default: none.
  virtual void start_window_inputs(const WindowRun& run) const;
  // Runs the layers of one window; leaves the final hidden rows [n_rows][H] in t.hidden.
  virtual void run_layers(const WindowRun& run, ExpertSource& experts) const = 0;
  // The output head, [n_vocab][H]: the runner applies it to the rows whose logits are asked for.
  const compute::WeightMatrix& output_head() const { return output_; }
  // The layer states' part of WindowRunner::rollback: KV caches truncated to n_keep tokens,
  // DeltaNet/conv and PLE states restored from their logs to the first keep_rows rows of the
  // last window (`kept`: those rows' tokens), or the backend's own states rolled back.
  void rollback_layers(compute::ThreadPool& pool, ModelState& state, int64_t keep_rows,
                       int64_t n_keep, std::span<const int32_t> kept) const;

 protected:
  // Loads token_embd and output from `tensors` (the checked table of *file).
  Model(std::unique_ptr<GgufFile> file, HParams hp, TensorTable& tensors);
  // Shared building blocks for the architecture files.
  void load_moe(TensorTable& tensors, int layer, LayerWeights& out) const;
  void load_attention(TensorTable& tensors, int layer, bool gated, LayerWeights& out) const;
  void load_deltanet(TensorTable& tensors, int layer, LayerWeights& out) const;
  // The MTP head's backend with its window begun and its tensors sized for n entries of W =
  // n_streams·H trunk values each (MtpState).
  compute::Backend& begin_mtp_window(compute::ThreadPool& pool, MtpState& mtp, int64_t n,
                                     int n_streams) const;
  // The router of the trunk layer after `layer` (read-ahead hint), or nullptr for the last one.
  const MoeWeights* next_router(int layer) const;
  // Layer `layer`'s token mixer over the window: y = mixer(x), each sequence on its own state.
  void mixer_forward(const WindowRun& run, int layer, compute::Tensor x, compute::Tensor y) const;
  // The classic pre-norm residual stack (qwen3moe, qwen3next) on the backend:
  //   h += mixer(norm(h)); h += moe(norm(h)); hidden = norm_out(h)
  void run_prenorm_layers(const WindowRun& run, ExpertSource& experts) const;

  std::unique_ptr<GgufFile> file_;
  HParams hp_;
  ForwardDims dims_;  // forward_dims(hp_): what layers/ and the backends are given
  std::vector<LayerWeights> layers_;
  compute::WeightMatrix token_embd_;
  compute::WeightMatrix output_;
  std::vector<float> output_norm_;  // pre-norm archs
  std::unique_ptr<ExpertSource> mapped_experts_;
  std::vector<std::string> loaded_tensors_;
  std::unique_ptr<compute::BackendShared> backend_shared_ = std::make_unique<compute::BackendShared>();
};

std::unique_ptr<Model> make_qwen4exp(std::unique_ptr<GgufFile> file, HParams hp,
                                     TensorTable& tensors);
std::unique_ptr<Model> make_qwen3next(std::unique_ptr<GgufFile> file, HParams hp,
                                      TensorTable& tensors);
std::unique_ptr<Model> make_qwen3moe(std::unique_ptr<GgufFile> file, HParams hp,
                                     TensorTable& tensors);

}  // namespace strata
