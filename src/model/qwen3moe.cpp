// qwen3moe (Qwen3-30B-A3B family): pre-norm GQA attention with per-head q/k RMS norms and full
// NeoX RoPE, every layer a routed MoE without shared expert, final RMS norm, untied head.
// Norm weights are plain (HF Qwen3MoeRMSNorm multiplies by w; no +1 anywhere).
// Reference: shared/reference/qwen3next-qwen3moe.md Part B.
#include <fmt/format.h>

#include "model/model.h"
#include "model/spec_builder.h"

namespace strata {
namespace {

class Qwen3Moe final : public Model {
 public:
  Qwen3Moe(std::unique_ptr<GgufFile> file, HParams hp, TensorTable& tensors)
      : Model(std::move(file), std::move(hp), tensors) {
    output_norm_ = tensors.floats("output_norm");
    for (int l = 0; l < hp_.n_layer; ++l) {
      LayerWeights& lw = layers_[size_t(l)];
      lw.kind = LayerKind::Attention;
      lw.attn_norm = tensors.floats(fmt::format("blk.{}.attn_norm", l));
      lw.ffn_norm = tensors.floats(fmt::format("blk.{}.ffn_norm", l));
      load_attention(tensors, l, /*gated=*/false, lw);
      load_moe(tensors, l, lw);
    }
  }

 protected:
  void run_layers(const WindowRun& run, ExpertSource& experts) const override {
    run_prenorm_layers(run, experts);
  }
};

}  // namespace

std::vector<TensorSpec> qwen3moe_tensor_specs(const HParams& hp) {
  std::vector<TensorSpec> specs;
  SpecBuilder b(specs);
  const int64_t H = hp.n_embd;
  b.global("token_embd", {H, hp.n_vocab}, TensorRole::Embedding);
  b.global("output_norm", {H}, TensorRole::Norm);
  b.global("output", {H, hp.n_vocab}, TensorRole::Output, Presence::Optional);  // tied: token_embd
  for (int l = 0; l < hp.n_layer; ++l) {
    b.layer(l, "attn_norm", {H}, TensorRole::Norm);
    add_attention_specs(b, hp, l, /*gated=*/false);
    b.layer(l, "ffn_norm", {H}, TensorRole::Norm);
    add_moe_specs(b, hp, l);
  }
  return specs;
}

std::unique_ptr<Model> make_qwen3moe(std::unique_ptr<GgufFile> file, HParams hp,
                                     TensorTable& tensors) {
  return std::make_unique<Qwen3Moe>(std::move(file), std::move(hp), tensors);
}

}  // namespace strata
