// qwen3next (Qwen3-Next-80B-A3B): 3 Gated DeltaNet layers (silu output gate, grouped V heads)
// then 1 gated full-attention layer, repeated; every layer a MoE with a sigmoid-gated shared
// expert; pre-norm residual with (1+w) norms, stored with the +1 folded in by the converter.
// Optional MTP head (blk.<L>: one full-attention + MoE block and nextn.{eh_proj, enorm, hnorm,
// shared_head_norm}) as llama.cpp loads it; the math follows vLLM's Qwen3NextMultiTokenPredictor.
// Reference: shared/reference/qwen3next-qwen3moe.md Part A (§6 for the MTP head).
#include <fmt/format.h>

#include "compute/cpu/ops.h"
#include "model/model.h"
#include "model/spec_builder.h"
#include "util/error.h"

namespace strata {
namespace {

class Qwen3Next final : public Model {
 public:
  Qwen3Next(std::unique_ptr<GgufFile> file, HParams hp, TensorTable& tensors)
      : Model(std::move(file), std::move(hp), tensors) {
    output_norm_ = tensors.floats("output_norm");
    for (int l = 0; l < hp_.n_layer; ++l) {
      LayerWeights& lw = layers_[size_t(l)];
      lw.kind = hp_.layer_kinds[size_t(l)];
      lw.attn_norm = tensors.floats(fmt::format("blk.{}.attn_norm", l));
      lw.ffn_norm = tensors.floats(fmt::format("blk.{}.post_attention_norm", l));
      if (lw.kind == LayerKind::GatedDeltaNet)
        load_deltanet(tensors, l, lw);
      else
        load_attention(tensors, l, /*gated=*/true, lw);
      load_moe(tensors, l, lw);
    }
    if (hp_.n_nextn > 0) load_mtp(tensors);
  }

  bool has_mtp() const override { return hp_.n_nextn > 0; }

  // x = eh_proj·[N1p(embed(tok); enorm) | N1p(h; hnorm)]; x = pre-norm attention + MoE block(x);
  // out = N1p(x; shared_head_norm); logits = output·out. Entry t runs at the head's position t.
  void mtp_forward(compute::ThreadPool& pool, MtpState& mtp, const float* hidden,
                   std::span<const int32_t> tokens, std::vector<float>& logits,
                   std::vector<float>* residual_out, ExpertSource* experts) const override {
    if (!has_mtp()) Model::mtp_forward(pool, mtp, hidden, tokens, logits, residual_out, experts);
    check_tokens(tokens);
    const int64_t H = hp_.n_embd, n = int64_t(tokens.size());
    const int l = hp_.n_layer;
    const LayerWeights& lw = layers_[size_t(l)];
    const float eps = hp_.rms_eps;
    compute::Backend& be = begin_mtp_window(pool, mtp, n, 1);
    const MtpTensors& t = mtp.tensors;
    const compute::Tensor& residual = t.X;  // [n][H] with one stream
    be.write(t.hidden, 0, n, hidden);
    be.embed(token_embd_, tokens, t.embedded);
    be.rms_norm(t.embedded, mtp_enorm_, eps, t.embedded, n);
    be.rms_norm(t.hidden, mtp_hnorm_, eps, t.normed, n);
    be.pair_rows(t.embedded, t.normed, 1, t.inputs, n);
    be.matmul(mtp_eh_proj_, t.inputs, 0, n, residual);
    // One pre-norm layer, the trunk's sequence of ops (run_prenorm_layers) on the head's cache.
    be.rms_norm(residual, lw.attn_norm, eps, t.x, n);
    be.attention(dims_.attention, lw.attention, mtp.kv, l, t.x, t.y, n);
    be.add(residual, t.y, n);
    be.rms_norm(residual, lw.ffn_norm, eps, t.x, n);
    be.moe(dims_.moe, lw.moe, experts ? *experts : *mapped_experts_, l, t.x, t.y, n, nullptr);
    be.add(residual, t.y, n);
    be.rms_norm(residual, mtp_shared_head_norm_, eps, t.x, n);
    be.matmul(output_, t.x, 0, n, t.logits);
    logits.resize(static_cast<size_t>(n * hp_.n_vocab));
    be.read(t.logits, 0, n, logits.data());
    if (residual_out) {
      residual_out->resize(static_cast<size_t>(n * H));
      be.read(t.x, 0, n, residual_out->data());
    }
  }

 protected:
  void run_layers(const WindowRun& run, ExpertSource& experts) const override {
    run_prenorm_layers(run, experts);
    if (has_mtp())  // the head consumes the trunk output after output_norm
      for (const WindowSegment& s : run.segments) {
        const int64_t n = int64_t(s.tokens.size());
        s.state->residuals.resize(static_cast<size_t>(n * hp_.n_embd));
        run.be.read(run.t.hidden, s.first_row, n, s.state->residuals.data());
      }
  }

 private:
  void load_mtp(TensorTable& tensors) {
    if (hp_.n_nextn != 1)
      fail("{}: qwen3next.nextn_predict_layers = {}: only 1 MTP layer is supported", file_->path(),
           hp_.n_nextn);
    const int l = hp_.n_layer;
    layers_.resize(size_t(l + 1));
    LayerWeights& lw = layers_[size_t(l)];
    lw.kind = LayerKind::GatedAttention;
    lw.attn_norm = tensors.floats(fmt::format("blk.{}.attn_norm", l));
    lw.ffn_norm = tensors.floats(fmt::format("blk.{}.post_attention_norm", l));
    load_attention(tensors, l, /*gated=*/true, lw);
    load_moe(tensors, l, lw);
    mtp_eh_proj_ = tensors.matrix(fmt::format("blk.{}.nextn.eh_proj", l));
    mtp_enorm_ = tensors.floats(fmt::format("blk.{}.nextn.enorm", l));
    mtp_hnorm_ = tensors.floats(fmt::format("blk.{}.nextn.hnorm", l));
    // llama.cpp falls back to output_norm when a file has no shared_head_norm.
    const std::string head_norm = fmt::format("blk.{}.nextn.shared_head_norm", l);
    mtp_shared_head_norm_ = tensors.present(head_norm) ? tensors.floats(head_norm) : output_norm_;
  }

  compute::WeightMatrix mtp_eh_proj_;
  std::vector<float> mtp_enorm_, mtp_hnorm_, mtp_shared_head_norm_;
};

}  // namespace

std::vector<TensorSpec> qwen3next_tensor_specs(const HParams& hp) {
  std::vector<TensorSpec> specs;
  SpecBuilder b(specs);
  const int64_t H = hp.n_embd;
  b.global("token_embd", {H, hp.n_vocab}, TensorRole::Embedding);
  b.global("output_norm", {H}, TensorRole::Norm);
  b.global("output", {H, hp.n_vocab}, TensorRole::Output, Presence::Optional);  // tied: token_embd
  for (int l = 0; l < hp.n_layer; ++l) {
    b.layer(l, "attn_norm", {H}, TensorRole::Norm);
    if (hp.layer_kinds[size_t(l)] == LayerKind::GatedDeltaNet) {
      b.refused_layer(l, "ssm_in",
                      "the legacy fused qkvz layout is not supported; re-convert with a current "
                      "converter (split attn_qkv + attn_gate)");
      add_deltanet_specs(b, hp, l, /*fused_beta_alpha=*/true);
    } else {
      add_attention_specs(b, hp, l, /*gated=*/true);
    }
    b.layer(l, "post_attention_norm", {H}, TensorRole::Norm);
    add_moe_specs(b, hp, l);
  }
  if (hp.n_nextn > 0) {
    const int l = hp.n_layer;
    b.layer(l, "attn_norm", {H}, TensorRole::Norm);
    add_attention_specs(b, hp, l, /*gated=*/true);
    b.layer(l, "post_attention_norm", {H}, TensorRole::Norm);
    add_moe_specs(b, hp, l);
    b.layer(l, "nextn.eh_proj", {2 * H, H}, TensorRole::Matrix);
    b.layer(l, "nextn.enorm", {H}, TensorRole::Norm);
    b.layer(l, "nextn.hnorm", {H}, TensorRole::Norm);
    // Written by strata convert (from mtp.norm); synth leaves it out, so its files run the
    // fallback (output_norm, as llama.cpp does).
    TensorSpec& head_norm =
        b.layer(l, "nextn.shared_head_norm", {H}, TensorRole::Norm, Presence::Optional);
    head_norm.synthesized = false;
    for (const char* name : {"nextn.embed_tokens", "nextn.shared_head_head"})
      b.refused_layer(l, name,
                      "a separate MTP embedding/head is not supported (the head shares token_embd "
                      "and output)");
  }
  return specs;
}

std::unique_ptr<Model> make_qwen3next(std::unique_ptr<GgufFile> file, HParams hp,
                                      TensorTable& tensors) {
  return std::make_unique<Qwen3Next>(std::move(file), std::move(hp), tensors);
}

}  // namespace strata
