// qwen3next (Qwen3-Next-80B-A3B): 3 Gated DeltaNet layers (silu output gate, grouped V heads)
// then 1 gated full-attention layer, repeated; every layer a MoE with a sigmoid-gated shared
// expert; pre-norm residual with (1+w) norms, stored with the +1 folded in by the converter.
// Reference: shared/reference/qwen3next-qwen3moe.md Part A.
#include <fmt/format.h>

#include "model/model.h"
#include "model/spec_builder.h"
#include "util/error.h"

namespace strata {
namespace {

class Qwen3Next final : public Model {
 public:
  Qwen3Next(std::unique_ptr<GgufFile> file, HParams hp) : Model(std::move(file), std::move(hp)) {
    const TensorLoader loader(*file_);
    output_norm_ = loader.floats("output_norm", hp_.n_embd);
    for (int l = 0; l < hp_.n_layer; ++l) {
      LayerWeights& lw = layers_[size_t(l)];
      lw.kind = hp_.layer_kinds[size_t(l)];
      lw.attn_norm = loader.floats(fmt::format("blk.{}.attn_norm", l), hp_.n_embd);
      lw.ffn_norm = loader.floats(fmt::format("blk.{}.post_attention_norm", l), hp_.n_embd);
      if (lw.kind == LayerKind::GatedDeltaNet) {
        if (loader.has(fmt::format("blk.{}.ssm_in", l)))
          fail("{}: blk.{}.ssm_in: the legacy fused qkvz layout is not supported; re-convert "
               "with a current converter (split attn_qkv + attn_gate)",
               file_->path(), l);
        load_deltanet(loader, l, lw);
      } else {
        load_attention(loader, l, /*gated=*/true, lw);
      }
      load_moe(loader, l, lw);
    }
  }

 protected:
  void run_layers(compute::ThreadPool& pool, ModelState& state, std::span<const int32_t> tokens,
                  ExpertSource& experts, std::vector<float>& hidden) const override {
    run_prenorm_layers(pool, state, tokens, experts, hidden);
  }
};

}  // namespace

std::vector<TensorSpec> qwen3next_tensor_specs(const HParams& hp) {
  std::vector<TensorSpec> specs;
  SpecBuilder b(specs);
  const int64_t H = hp.n_embd;
  b.global("token_embd", {H, hp.n_vocab}, TensorRole::Embedding);
  b.global("output_norm", {H}, TensorRole::Norm);
  b.global("output", {H, hp.n_vocab}, TensorRole::Output);
  for (int l = 0; l < hp.n_layer; ++l) {
    b.layer(l, "attn_norm", {H}, TensorRole::Norm);
    if (hp.layer_kinds[size_t(l)] == LayerKind::GatedDeltaNet)
      add_deltanet_specs(b, hp, l, /*fused_beta_alpha=*/true);
    else
      add_attention_specs(b, hp, l, /*gated=*/true);
    b.layer(l, "post_attention_norm", {H}, TensorRole::Norm);
    add_moe_specs(b, hp, l);
  }
  return specs;
}

std::unique_ptr<Model> make_qwen3next(std::unique_ptr<GgufFile> file, HParams hp) {
  return std::make_unique<Qwen3Next>(std::move(file), std::move(hp));
}

}  // namespace strata
