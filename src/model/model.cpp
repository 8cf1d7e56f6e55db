#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>

#include "backends/cpu_backend.h"
#include "compute/cpu/ops.h"
#include "model/gpu_footprint.h"
#include "model/tensor_specs.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/phase_timer.h"

namespace strata {
namespace {

std::string blk(int layer, const char* name) { return fmt::format("blk.{}.{}", layer, name); }

// Experts straight from the read-only mapping (everything "resident" as far as the OS allows).
class MappedExpertSource final : public ExpertSource {
 public:
  // Constructed with the model, before the architecture fills `layers`: they are read at call time.
  MappedExpertSource(const std::vector<LayerWeights>& layers, const GgufFile& file) : layers_(layers), file_(file) {}
  // The whole file mapping, valid as long as the model: it holds every expert, and a GPU tier that
  // registers it must register all of it, because CUDA refuses a cudaMemcpy whose host buffer
  // straddles the edge of a registered range (a dense tensor uploaded from the pages next to the
  // experts' span failed with cudaErrorInvalidValue).
  std::vector<HostRegion> host_regions() const override {
    if (!file_.mapped_data() || file_.file_size() == 0) return {};
    return {HostRegion{file_.mapped_data(), size_t(file_.file_size())}};
  }
  bool pointers_stay_valid() const override { return true; }
  // Everything is resident: the first wait delivers the whole union, the next one nothing.
  void publish(int layer, std::span<const int32_t> experts) override {
    const LayerWeights& l = layers_[size_t(layer)];
    delivered_.clear();
    for (size_t i = 0; i < experts.size(); ++i) {
      const int32_t e = experts[i];
      delivered_.push_back(DeliveredExpert{
          int(i),
          ExpertMatrices{l.gate_exps.expert(e), l.up_exps.expert(e), l.down_exps.expert(e)}});
    }
    pending_ = true;
  }
  std::span<const DeliveredExpert> wait() override {
    if (!pending_) return {};
    pending_ = false;
    return delivered_;
  }

 private:
  const std::vector<LayerWeights>& layers_;
  const GgufFile& file_;
  std::vector<DeliveredExpert> delivered_;  // the published union's, reused
  bool pending_ = false;                    // published and not yet delivered
};

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path) {
  auto file = GgufFile::open(path);
  HParams hp = load_hparams(*file);
  const TensorInfo* embd = TensorLoader(*file).find("token_embd");
  if (!embd) fail("{}: missing tensor token_embd.weight", path);
  hp.n_vocab = embd->ne[1];
  // The whole file is checked against the table up front, so a broken file fails at load with
  // one clear line rather than midway through building weights or a forward.
  TensorTable tensors(*file, tensor_specs(hp));
  tensors.check();
  std::unique_ptr<Model> model;
  switch (hp.arch) {
    case Arch::Qwen4Exp: model = make_qwen4exp(std::move(file), std::move(hp), tensors); break;
    case Arch::Qwen3Next: model = make_qwen3next(std::move(file), std::move(hp), tensors); break;
    case Arch::Qwen3Moe: model = make_qwen3moe(std::move(file), std::move(hp), tensors); break;
  }
  if (!model) fail("{}: unsupported architecture", path);
  model->loaded_tensors_ = tensors.loaded();
  // What a GPU backend checks against its device before the model's first upload.
  model->backend_shared_->gpu_footprint =
      gpu_footprint(model->hp_, model->dims_, *model->file_, model->expert_layouts());
  return model;
}

std::vector<compute::ExpertLayerLayout> Model::block_expert_layouts() const {
  std::vector<compute::ExpertLayerLayout> out(layers_.size());
  auto matrix = [](const ExpertTensor& t) {
    return compute::ExpertMatrixLayout{t.type, t.n_in, t.n_out, t.expert(0).row_stride_bytes};
  };
  for (size_t l = 0; l < out.size(); ++l) {
    const LayerWeights& w = layers_[l];
    if (w.gate_exps.n_expert == 0) continue;
    out[l] = {true, matrix(w.gate_exps), matrix(w.up_exps), matrix(w.down_exps)};
  }
  return out;
}

std::vector<compute::ExpertLayerLayout> Model::expert_layouts() const {
  std::vector<compute::ExpertLayerLayout> out = block_expert_layouts();
  out.resize(static_cast<size_t>(hp_.n_layer));  // the trunk's layers only
  return out;
}

Model::Model(std::unique_ptr<GgufFile> file, HParams hp, TensorTable& tensors)
    : file_(std::move(file)), hp_(std::move(hp)), dims_(forward_dims(hp_)) {
  token_embd_ = tensors.matrix("token_embd");
  // Untied models carry `output`; tied ones reuse the embedding (llama.cpp does the same).
  output_ = tensors.present("output") ? tensors.matrix("output") : token_embd_;
  layers_.resize(static_cast<size_t>(hp_.n_layer));
  mapped_experts_ = std::make_unique<MappedExpertSource>(layers_, *file_);
}

const MoeWeights* Model::next_router(int layer) const {
  return layer + 1 < hp_.n_layer ? &layers_[size_t(layer + 1)].moe : nullptr;
}

std::unique_ptr<ExpertSource> Model::new_mapped_experts() const {
  return std::make_unique<MappedExpertSource>(layers_, *file_);
}

ModelState Model::new_state(int64_t n_ctx, std::unique_ptr<compute::Backend> backend) const {
  ModelState state;
  if (!backend) backend = std::make_unique<compute::CpuBackend>();
  // The host KV caches are the CPU backend's storage; other backends keep their own.
  if (backend->name() != "cpu") n_ctx = 0;
  state.backend = std::move(backend);
  state.deltanet.resize(static_cast<size_t>(hp_.n_layer));
  state.kv.resize(static_cast<size_t>(hp_.n_layer));
  for (int l = 0; l < hp_.n_layer; ++l) {
    if (hp_.layer_kinds[size_t(l)] == LayerKind::GatedDeltaNet)
      state.deltanet[size_t(l)].reset(dims_.deltanet);
    else if (n_ctx > 0)
      state.kv[size_t(l)].reserve(n_ctx, hp_.kv_dim(), hp_.indexer_head_dim,
                                  layers_[size_t(l)].attention.compress_ratio);
  }
  if (hp_.has_ple()) {
    state.ple.reset(dims_.ple);
    state.ple_reader = std::make_unique<PleRowReader>();
  }
  return state;
}

void Model::load_moe(TensorTable& tensors, int l, LayerWeights& out) const {
  out.moe.router = tensors.matrix(blk(l, "ffn_gate_inp"));
  out.gate_exps = tensors.experts(blk(l, "ffn_gate_exps"));
  out.up_exps = tensors.experts(blk(l, "ffn_up_exps"));
  out.down_exps = tensors.experts(blk(l, "ffn_down_exps"));
  if (tensors.declares(blk(l, "ffn_gate_shexp"))) {  // the table declares it when n_ff_shexp > 0
    out.moe.shared_gate = tensors.matrix(blk(l, "ffn_gate_shexp"));
    out.moe.shared_up = tensors.matrix(blk(l, "ffn_up_shexp"));
    out.moe.shared_down = tensors.matrix(blk(l, "ffn_down_shexp"));
    out.moe.shared_gate_inp = tensors.floats(blk(l, "ffn_gate_inp_shexp"));
  }
}

void Model::load_attention(TensorTable& tensors, int l, bool gated, LayerWeights& out) const {
  AttentionWeights& a = out.attention;
  a.gated = gated;
  a.q = tensors.matrix(blk(l, "attn_q"));
  a.k = tensors.matrix(blk(l, "attn_k"));
  a.v = tensors.matrix(blk(l, "attn_v"));
  a.o = tensors.matrix(blk(l, "attn_output"));
  a.q_norm = tensors.floats(blk(l, "attn_q_norm"));
  a.k_norm = tensors.floats(blk(l, "attn_k_norm"));
}

void Model::load_deltanet(TensorTable& tensors, int l, LayerWeights& out) const {
  GatedDeltaNetWeights& g = out.deltanet;
  g.qkv = tensors.matrix(blk(l, "attn_qkv"));
  g.z = tensors.matrix(blk(l, "attn_gate"));
  if (tensors.declares(blk(l, "ssm_ba"))) {  // qwen3next: fused [beta | alpha] per K group
    g.beta_alpha = tensors.matrix(blk(l, "ssm_ba"));
  } else {
    g.beta = tensors.matrix(blk(l, "ssm_beta"));
    g.alpha = tensors.matrix(blk(l, "ssm_alpha"));
  }
  g.conv = tensors.floats(blk(l, "ssm_conv1d"));
  g.dt_bias = tensors.floats(blk(l, "ssm_dt.bias"));
  g.a = tensors.floats(blk(l, "ssm_a"));
  g.norm = tensors.floats(blk(l, "ssm_norm"));
  g.out = tensors.matrix(blk(l, "ssm_out"));
}

void Model::check_tokens(std::span<const int32_t> tokens) const {
  for (const int32_t token : tokens)
    if (token < 0 || token >= hp_.n_vocab)
      fail("{}: token id {} is outside the vocabulary (0..{})", file_->path(), token,
           hp_.n_vocab - 1);
}

void Model::mixer_forward(const WindowRun& run, int l, compute::Tensor x, compute::Tensor y) const {
  const LayerWeights& lw = layers_[size_t(l)];
  auto mix = [&](ModelState& state, compute::Tensor in, compute::Tensor out, int64_t n_rows) {
    if (lw.kind == LayerKind::GatedDeltaNet)
      run.be.gated_deltanet(dims_.deltanet, lw.deltanet, state.deltanet[size_t(l)], l, in, out,
                            n_rows, state.record_windows);
    else
      run.be.attention(dims_.attention, lw.attention, state.kv[size_t(l)], l, in, out, n_rows);
  };
  if (!run.batched()) return mix(*run.segments[0].state, x, y, run.n_rows());
  if (run.be.batched_mixers()) {
    BatchWindow& b = *run.batch;
    if (lw.kind == LayerKind::GatedDeltaNet) {
      b.deltanets.clear();
      for (const WindowSegment& s : run.segments)
        b.deltanets.push_back(&s.state->deltanet[size_t(l)]);
      run.be.gated_deltanet_rows(dims_.deltanet, lw.deltanet, b.deltanets, b.rows, l, x, y,
                                 run.n_rows());
    } else {
      b.caches.clear();
      for (const WindowSegment& s : run.segments) b.caches.push_back(&s.state->kv[size_t(l)]);
      run.be.attention_rows(dims_.attention, lw.attention, b.caches, b.rows, l, x, y, run.n_rows());
    }
    return;
  }
  // Each sequence's rows through its own state, exactly the rows (and so the bits) it would
  // feed alone: a mixer op works on rows [0, n) of its tensors.
  const WindowTensors& seg = *run.segment;
  for (const WindowSegment& s : run.segments) {
    const int64_t n = int64_t(s.tokens.size());
    run.be.copy_rows(x, s.first_row, seg.x, 0, n);
    mix(*s.state, seg.x, seg.y, n);
    run.be.copy_rows(seg.y, 0, y, s.first_row, n);
  }
}

void Model::run_prenorm_layers(const WindowRun& run, ExpertSource& experts) const {
  const int64_t n_rows = run.n_rows();
  const float eps = hp_.rms_eps;
  const WindowTensors& t = run.t;
  compute::Backend& be = run.be;
  be.embed(token_embd_, run.tokens, t.residual);
  for (int l = 0; l < hp_.n_layer; ++l) {
    const LayerWeights& lw = layers_[size_t(l)];
    be.rms_norm(t.residual, lw.attn_norm, eps, t.normed, n_rows);
    mixer_forward(run, l, t.normed, t.y);
    be.add(t.residual, t.y, n_rows);
    be.rms_norm(t.residual, lw.ffn_norm, eps, t.normed, n_rows);
    be.moe(dims_.moe, lw.moe, experts, l, t.normed, t.y, n_rows, next_router(l));
    be.add(t.residual, t.y, n_rows);
  }
  be.rms_norm(t.residual, output_norm_, eps, t.hidden, n_rows);
}

void Model::ensure_tensors(compute::Backend& be, WindowTensors& t, int64_t n_rows) const {
  if (t.owner == &be && t.max_rows >= n_rows) return;
  if (t.owner == &be)
    for (compute::Tensor* tensor : {&t.X, &t.x, &t.y, &t.inject, &t.residual, &t.normed, &t.hidden,
                                    &t.logits})
      if (tensor->valid()) be.release(*tensor);
  t = WindowTensors{};
  t.owner = &be;
  t.max_rows = n_rows;
  for (const WindowTensorWidth& w : window_tensor_widths(hp_))
    t.*w.tensor = be.alloc(compute::DType::F32, n_rows, w.width);
}

std::vector<WindowTensorWidth> window_tensor_widths(const HParams& hp) {
  const int64_t H = hp.n_embd;
  std::vector<WindowTensorWidth> widths = {{&WindowTensors::x, H},
                                           {&WindowTensors::y, H},
                                           {&WindowTensors::hidden, H},
                                           {&WindowTensors::logits, hp.n_vocab}};
  if (hp.arch == Arch::Qwen4Exp) {
    widths.push_back({&WindowTensors::X, int64_t(hp.hc_count) * H});
    widths.push_back({&WindowTensors::inject, hp.hc_count});
  } else {
    widths.push_back({&WindowTensors::residual, H});
    widths.push_back({&WindowTensors::normed, H});
  }
  return widths;
}

compute::Backend& Model::begin_mtp_window(compute::ThreadPool& pool, MtpState& mtp, int64_t n,
                                         int n_streams) const {
  if (!mtp.backend) mtp.backend = std::make_unique<compute::CpuBackend>();
  compute::Backend& be = *mtp.backend;
  be.begin_window(pool);
  MtpTensors& t = mtp.tensors;
  if (t.owner == &be && t.max_rows >= n) return be;
  if (t.owner == &be)
    for (compute::Tensor* tensor : {&t.hidden, &t.normed, &t.embedded, &t.inputs, &t.X, &t.x, &t.y,
                                    &t.inject, &t.logits})
      if (tensor->valid()) be.release(*tensor);
  t = MtpTensors{};
  t.owner = &be;
  t.max_rows = n;
  const int64_t H = hp_.n_embd, S = n_streams;
  auto f32 = [&](int64_t rows, int64_t width) { return be.alloc(compute::DType::F32, rows, width); };
  t.hidden = f32(n, S * H);
  t.normed = f32(n, S * H);
  t.embedded = f32(n, H);
  t.inputs = f32(n * S, 2 * H);
  t.X = f32(n * S, H);
  t.x = f32(n, H);
  t.y = f32(n, H);
  t.inject = f32(n, S);
  t.logits = f32(n, hp_.n_vocab);
  return be;
}

void Model::mtp_forward(compute::ThreadPool&, MtpState&, const float*, std::span<const int32_t>,
                        std::vector<float>&, std::vector<float>*, ExpertSource*) const {
  fail("{}: this model has no MTP (nextn) head", file_->path());
}

void Model::start_window_inputs(const WindowRun&) const {}

void Model::rollback_layers(compute::ThreadPool& pool, ModelState& state, int64_t keep_rows,
                            int64_t n_keep, std::span<const int32_t> kept) const {
  if (state.backend->rollback_window(keep_rows)) {
    // The backend rolled its own states back; the host structs carry bookkeeping only.
    for (KvCache& cache : state.kv) cache.n_tokens = std::min(cache.n_tokens, n_keep);
    if (hp_.has_ple()) ple_rollback_context(dims_.ple, state.ple, kept);
  } else {
    for (int l = 0; l < hp_.n_layer; ++l) {
      const LayerWeights& lw = layers_[size_t(l)];
      if (lw.kind == LayerKind::GatedDeltaNet)
        gated_deltanet_rollback(pool, dims_.deltanet, state.deltanet[size_t(l)], keep_rows);
      else
        state.kv[size_t(l)].truncate(n_keep, hp_.kv_dim(), hp_.indexer_head_dim,
                                     lw.attention.compress_ratio);
    }
    if (hp_.has_ple()) ple_rollback(dims_.ple, state.ple, kept);
  }
}

}  // namespace strata
