// qwen4exp (Qwen3.8-Flash-Next): S hyper-connection streams; layers 3:1 Gated DeltaNet (sigmoid
// gate, tiled V heads in GGUF order) : QSA sparse attention; every layer a MoE with a shared
// expert; an n-gram PLE embedding added before one GDN layer's mixer; a final HC mixer (no norm)
// and an untied head. Reference: shared/reference/qwen4exp.md §4–§12.
#include <fmt/format.h>

#include "compute/cpu/ops.h"
#include "model/model.h"
#include "model/spec_builder.h"
#include "util/error.h"

namespace strata {
namespace {

std::string blk(int layer, const char* name) { return fmt::format("blk.{}.{}", layer, name); }

class Qwen4Exp final : public Model {
 public:
  Qwen4Exp(std::unique_ptr<GgufFile> file, HParams hp, TensorTable& tensors)
      : Model(std::move(file), std::move(hp), tensors) {
    output_hc_ = load_hc(tensors, "output_hc");
    for (int l = 0; l < hp_.n_layer; ++l) {
      LayerWeights& lw = layers_[size_t(l)];
      lw.kind = hp_.layer_kinds[size_t(l)];
      lw.hc_attn = load_hc(tensors, blk(l, "hc_attn"));
      lw.hc_ffn = load_hc(tensors, blk(l, "hc_ffn"));
      if (lw.kind == LayerKind::GatedDeltaNet) {
        load_deltanet(tensors, l, lw);
      } else {
        load_attention(tensors, l, /*gated=*/true, lw);
        load_indexer(tensors, l, lw.attention);
      }
      load_moe(tensors, l, lw);
    }
    if (hp_.has_ple()) load_ple(tensors);
    if (hp_.n_nextn > 0) load_mtp(tensors);
  }

  bool has_mtp() const override { return hp_.n_nextn > 0; }

  void mtp_forward(compute::ThreadPool& pool, MtpState& mtp, const float* hidden,
                   std::span<const int32_t> tokens, std::vector<float>& logits,
                   std::vector<float>* residual_out, ExpertSource* experts) const override {
    if (!has_mtp()) Model::mtp_forward(pool, mtp, hidden, tokens, logits, residual_out, experts);
    check_tokens(tokens);
    const int S = hp_.hc_count;
    const int64_t width = S * hp_.n_embd, n = int64_t(tokens.size());
    const int l = hp_.n_layer;
    const LayerWeights& lw = layers_[size_t(l)];
    const float eps = hp_.rms_eps;
    compute::Backend& be = begin_mtp_window(pool, mtp, n, S);
    const MtpTensors& t = mtp.tensors;
    const compute::Tensor X = compute::with_width(t.X, width);  // eh_proj's [n·S][H] as streams
    // Inputs of eh_proj per (entry, stream): [N1p(embed(tok)) | N1p(h) of that stream], where the
    // hidden norm is one RMS over all S·H values (vLLM's convention, see docs/fixtures.md).
    be.write(t.hidden, 0, n, hidden);
    be.embed(token_embd_, tokens, t.embedded);
    be.rms_norm(t.embedded, mtp_enorm_, eps, t.embedded, n);
    be.rms_norm(t.hidden, mtp_hnorm_, eps, t.normed, n);
    be.pair_rows(t.embedded, t.normed, S, t.inputs, n);
    be.matmul(mtp_eh_proj_, t.inputs, 0, n * S, t.X);

    be.hyper_connection_in(lw.hc_attn, S, eps, X, t.x, t.inject, n);
    be.attention(dims_.attention, lw.attention, mtp.kv, l, t.x, t.y, n);
    be.hyper_connection_out(S, t.y, t.inject, X, n);
    be.hyper_connection_in(lw.hc_ffn, S, eps, X, t.x, t.inject, n);
    be.moe(dims_.moe, lw.moe, experts ? *experts : *mapped_experts_, l, t.x, t.y, n, nullptr);
    be.hyper_connection_out(S, t.y, t.inject, X, n);

    be.hyper_connection_in(mtp_hc_head_, S, eps, X, t.x, compute::Tensor{}, n);
    be.matmul(output_, t.x, 0, n, t.logits);
    logits.resize(static_cast<size_t>(n * hp_.n_vocab));
    be.read(t.logits, 0, n, logits.data());
    if (residual_out) {
      residual_out->resize(static_cast<size_t>(n * width));
      be.read(X, 0, n, residual_out->data());
    }
  }

  // PLE rows depend only on the tokens: every sequence's reads are issued before any layer runs.
  void start_window_inputs(const WindowRun& run) const override {
    if (!hp_.has_ple()) return;
    for (const WindowSegment& s : run.segments) {
      ple_row_ids(dims_.ple, s.state->ple.context, s.tokens, s.state->ple_rows);
      s.state->ple_reader->start(dims_.ple, ple_, s.state->ple_rows);
    }
  }

  void run_layers(const WindowRun& run, ExpertSource& experts) const override {
    const int S = hp_.hc_count;
    const int64_t width = S * hp_.n_embd, n_rows = run.n_rows();
    const float eps = hp_.rms_eps;
    compute::Backend& be = run.be;

    const WindowTensors& t = run.t;
    be.embed(token_embd_, run.tokens, t.x);
    be.repeat(t.x, S, t.X, n_rows);
    // Each block's X += inject·y goes with the next mixer's input (hyper_connection_out_in: one
    // pass per row on the CPU's row slices), except before the PLE layer, which reads X first, and
    // after the last block. Backends see the same op order as two calls (the default).
    bool out_pending = false;  // t.y and t.inject hold a block output not yet added to X
    auto mix_in = [&](const HyperConnectionWeights& w, compute::Tensor x, compute::Tensor inject) {
      if (out_pending)
        be.hyper_connection_out_in(S, t.y, t.inject, t.X, w, eps, x, inject, n_rows);
      else
        be.hyper_connection_in(w, S, eps, t.X, x, inject, n_rows);
      out_pending = false;
    };
    for (int l = 0; l < hp_.n_layer; ++l) {
      const LayerWeights& lw = layers_[size_t(l)];
      if (l == hp_.ple_layer()) {
        if (out_pending) be.hyper_connection_out(S, t.y, t.inject, t.X, n_rows);
        out_pending = false;
        ple_forward_rows(run);
      }
      mix_in(lw.hc_attn, t.x, t.inject);
      mixer_forward(run, l, t.x, t.y);
      out_pending = true;

      mix_in(lw.hc_ffn, t.x, t.inject);
      be.moe(dims_.moe, lw.moe, experts, l, t.x, t.y, n_rows, next_router(l));
      out_pending = true;
    }
    // The residuals (the last block's X) are read before the final mixer, as they always were.
    if (out_pending) be.hyper_connection_out(S, t.y, t.inject, t.X, n_rows);
    for (const WindowSegment& s : run.segments) {
      const int64_t n = int64_t(s.tokens.size());
      s.state->residuals.resize(static_cast<size_t>(n * width));
      be.read(t.X, s.first_row, n, s.state->residuals.data());
    }
    be.hyper_connection_in(output_hc_, S, eps, t.X, t.hidden, compute::Tensor{}, n_rows);
  }

 private:
  // The PLE layer: X += ple(X), each sequence with its own n-gram context and conv history (a
  // token mixer, like attention: batched windows copy a sequence's rows out and back).
  // A batched window on a backend with batched mixers runs the row-wise part once (ple_rows).
  // The contexts move on after the layer (row ids were taken in start_window_inputs; `ple` reads a
  // context only to log it, each state its own).
  void ple_forward_rows(const WindowRun& run) const {
    compute::Backend& be = run.be;
    if (run.batched() && be.batched_mixers()) {
      BatchWindow& b = *run.batch;
      b.ples.clear();
      b.ple_readers.clear();
      for (const WindowSegment& s : run.segments) {
        b.ples.push_back(&s.state->ple);
        b.ple_readers.push_back(s.state->ple_reader.get());
      }
      be.ple_rows(dims_.ple, ple_, b.ples, b.ple_readers, b.rows, run.t.X, run.n_rows());
    } else {
      for (const WindowSegment& s : run.segments) {
        ModelState& state = *s.state;
        const int64_t n = int64_t(s.tokens.size());
        if (!run.batched()) {
          be.ple(dims_.ple, ple_, state.ple, *state.ple_reader, run.t.X, n, state.record_windows);
        } else {
          be.copy_rows(run.t.X, s.first_row, run.segment->X, 0, n);
          be.ple(dims_.ple, ple_, state.ple, *state.ple_reader, run.segment->X, n, state.record_windows);
          be.copy_rows(run.segment->X, 0, run.t.X, s.first_row, n);
        }
      }
    }
    for (const WindowSegment& s : run.segments)
      s.state->ple.context = ple_advance(dims_.ple, s.state->ple.context, s.tokens);
  }

  // A hyper-connection mixer: norm, down, up, and (block mixers, not the final ones) inject.
  HyperConnectionWeights load_hc(TensorTable& tensors, const std::string& prefix) const {
    HyperConnectionWeights hc;
    hc.norm = tensors.floats(prefix + "_norm");
    hc.down = tensors.matrix(prefix + "_down");
    hc.up = tensors.matrix(prefix + "_up");
    if (tensors.declares(prefix + "_inject")) hc.inject = tensors.matrix(prefix + "_inject");
    return hc;
  }

  void load_indexer(TensorTable& tensors, int l, AttentionWeights& a) const {
    a.index_q = tensors.matrix(blk(l, "indexer.q_proj"));
    a.index_k = tensors.matrix(blk(l, "indexer.k_proj"));
    a.index_q_norm = tensors.floats(blk(l, "indexer.q_norm"));
    a.index_k_norm = tensors.floats(blk(l, "indexer.k_norm"));
    a.compress_ratio = hp_.compress_ratios[size_t(l)];
  }

  void load_ple(TensorTable& tensors) {
    const int l = hp_.ple_layer();
    ple_.file = file_.get();
    ple_.table = tensors.table("per_layer_token_embd");
    ple_.key = tensors.matrix(blk(l, "ple_key"));
    ple_.value = tensors.matrix(blk(l, "ple_value"));
    ple_.norm_key = tensors.floats(blk(l, "ple_norm_key"));
    ple_.norm_query = tensors.floats(blk(l, "ple_norm_query"));
    ple_.norm_conv = tensors.floats(blk(l, "ple_norm_conv"));
    ple_.conv = tensors.floats(blk(l, "ple_conv1d"));
  }

  void load_mtp(TensorTable& tensors) {
    const int l = hp_.n_layer;
    layers_.resize(size_t(hp_.n_layer + 1));
    LayerWeights& lw = layers_[size_t(l)];
    lw.kind = LayerKind::SparseAttention;
    lw.hc_attn = load_hc(tensors, blk(l, "hc_attn"));
    lw.hc_ffn = load_hc(tensors, blk(l, "hc_ffn"));
    load_attention(tensors, l, /*gated=*/true, lw);
    load_indexer(tensors, l, lw.attention);
    lw.attention.compress_ratio = mtp_compress_ratio();
    load_moe(tensors, l, lw);
    mtp_eh_proj_ = tensors.matrix(blk(l, "nextn.eh_proj"));
    mtp_enorm_ = tensors.floats(blk(l, "nextn.enorm"));
    mtp_hnorm_ = tensors.floats(blk(l, "nextn.hnorm"));
    mtp_hc_head_ = load_hc(tensors, blk(l, "nextn.hc_head"));
  }

  // llama.cpp's files give the MTP block ratio 0 (it attends densely); like vLLM, strata runs
  // the head's attention as QSA with the trunk's block size. A trunk whose QSA blocks all carry
  // ratio 0 (dense, see load_qwen4exp_extras) has no block size to lend: the head is dense too.
  int mtp_compress_ratio() const {
    const int stored = hp_.compress_ratios[size_t(hp_.n_layer)];
    if (stored > 0) return stored;
    for (int l = 0; l < hp_.n_layer; ++l)
      if (hp_.layer_kinds[size_t(l)] == LayerKind::SparseAttention &&
          hp_.compress_ratios[size_t(l)] > 0)
        return hp_.compress_ratios[size_t(l)];
    return 0;
  }

  HyperConnectionWeights output_hc_;
  PleWeights ple_;
  compute::WeightMatrix mtp_eh_proj_;
  std::vector<float> mtp_enorm_, mtp_hnorm_;
  HyperConnectionWeights mtp_hc_head_;
};

}  // namespace

namespace {

void add_hc_specs(SpecBuilder& b, const HParams& hp, const std::string& prefix, int layer,
                  bool with_inject) {
  const int64_t width = hp.hc_count * hp.n_embd, rank = hp.hc_low_rank;
  auto add = [&](const std::string& suffix, std::vector<int64_t> ne, TensorRole role) {
    if (layer < 0)
      b.global(prefix + suffix, std::move(ne), role);
    else
      b.layer(layer, prefix + suffix, std::move(ne), role);
  };
  add("_norm", {width}, TensorRole::Norm);
  add("_down", {width, rank}, TensorRole::Matrix);
  add("_up", {rank, width}, TensorRole::Matrix);
  if (with_inject) add("_inject", {width, hp.hc_count}, TensorRole::Matrix);
}

// Gated attention plus the QSA indexer.
void add_qsa_specs(SpecBuilder& b, const HParams& hp, int l) {
  const int64_t di = hp.indexer_head_dim;
  add_attention_specs(b, hp, l, /*gated=*/true);
  b.layer(l, "indexer.q_proj", {hp.n_embd, hp.indexer_n_head * di}, TensorRole::Matrix);
  b.layer(l, "indexer.k_proj", {hp.n_embd, di}, TensorRole::Matrix);
  b.layer(l, "indexer.q_norm", {di}, TensorRole::Norm);
  b.layer(l, "indexer.k_norm", {di}, TensorRole::Norm);
}

}  // namespace

std::vector<TensorSpec> qwen4exp_tensor_specs(const HParams& hp) {
  std::vector<TensorSpec> specs;
  SpecBuilder b(specs);
  const int64_t H = hp.n_embd, width = hp.hc_count * hp.n_embd;
  b.global("token_embd", {H, hp.n_vocab}, TensorRole::Embedding);
  b.global("output", {H, hp.n_vocab}, TensorRole::Output, Presence::Optional);  // tied: token_embd
  add_hc_specs(b, hp, "output_hc", -1, false);
  if (hp.has_ple()) {
    const uint64_t rows = hp.ple_head_offsets.back() + hp.ple_head_vocab_sizes.back();
    b.global("per_layer_token_embd", {hp.ple_row_width, int64_t(rows)}, TensorRole::PleTable);
  }
  const int64_t ple_dim = hp.ple_row_width * hp.ple_n_heads();
  for (int l = 0; l < hp.n_layer; ++l) {
    add_hc_specs(b, hp, "hc_attn", l, true);
    add_hc_specs(b, hp, "hc_ffn", l, true);
    if (hp.layer_kinds[size_t(l)] == LayerKind::GatedDeltaNet) {
      add_deltanet_specs(b, hp, l, /*fused_beta_alpha=*/false);
    } else {
      add_qsa_specs(b, hp, l);
    }
    add_moe_specs(b, hp, l);
    if (l == hp.ple_layer()) {
      b.layer(l, "ple_key", {ple_dim, width}, TensorRole::Matrix);
      b.layer(l, "ple_value", {ple_dim, H}, TensorRole::Matrix);
      b.layer(l, "ple_norm_key", {width}, TensorRole::Norm);
      b.layer(l, "ple_norm_query", {width}, TensorRole::Norm);
      b.layer(l, "ple_norm_conv", {width}, TensorRole::Norm);
      b.layer(l, "ple_conv1d", {hp.ple_conv_kernel, width}, TensorRole::Vector);
    }
  }
  if (hp.n_nextn > 0) {
    const int l = hp.n_layer;
    add_hc_specs(b, hp, "hc_attn", l, true);
    add_hc_specs(b, hp, "hc_ffn", l, true);
    add_qsa_specs(b, hp, l);
    add_moe_specs(b, hp, l);
    b.layer(l, "nextn.eh_proj", {2 * H, H}, TensorRole::Matrix);
    b.layer(l, "nextn.enorm", {H}, TensorRole::Norm);
    b.layer(l, "nextn.hnorm", {width}, TensorRole::Norm);
    add_hc_specs(b, hp, "nextn.hc_head", l, false);
  }
  return specs;
}

std::unique_ptr<Model> make_qwen4exp(std::unique_ptr<GgufFile> file, HParams hp,
                                     TensorTable& tensors) {
  return std::make_unique<Qwen4Exp>(std::move(file), std::move(hp), tensors);
}

}  // namespace strata
