// Small helper the architecture files use to write their tensor tables compactly: names get the
// "blk.<l>." prefix and the ".weight" suffix llama.cpp's converter appends (pass a name that
// already ends in ".bias", or use `layer_bare`, to keep it as is, e.g. "ssm_a"). Each call
// returns the new entry so a caller can adjust it (e.g. `.synthesized = false`) on the spot.
// The blocks shared by the architectures (MoE, attention, Gated DeltaNet) are declared here once.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

#include "model/tensor_specs.h"

namespace strata {

class SpecBuilder {
 public:
  explicit SpecBuilder(std::vector<TensorSpec>& out) : out_(out) {}
  TensorSpec& global(const std::string& name, std::vector<int64_t> ne, TensorRole role,
                     Presence presence = Presence::Required) {
    return add(with_suffix(name), std::move(ne), role, presence);
  }
  TensorSpec& layer(int l, const std::string& name, std::vector<int64_t> ne, TensorRole role,
                    Presence presence = Presence::Required) {
    return add(with_suffix(fmt::format("blk.{}.{}", l, name)), std::move(ne), role, presence);
  }
  TensorSpec& layer_bare(int l, const std::string& name, std::vector<int64_t> ne, TensorRole role) {
    return add(fmt::format("blk.{}.{}", l, name), std::move(ne), role, Presence::Required);
  }
  // A tensor of layer l whose presence means a layout strata does not run.
  void refused_layer(int l, const std::string& name, std::string reason) {
    TensorSpec& spec = add(with_suffix(fmt::format("blk.{}.{}", l, name)), {}, TensorRole::Matrix,
                           Presence::Refused);
    spec.synthesized = false;
    spec.refusal = std::move(reason);
  }

 private:
  TensorSpec& add(std::string name, std::vector<int64_t> ne, TensorRole role, Presence presence) {
    out_.push_back({std::move(name), std::move(ne), role, presence});
    return out_.back();
  }
  static std::string with_suffix(const std::string& name) {
    const bool has_suffix = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    return has_suffix ? name : name + ".weight";
  }
  std::vector<TensorSpec>& out_;
};

// Tensors shared by the architectures, emitted in llama.cpp's per-layer order.
inline void add_moe_specs(SpecBuilder& b, const HParams& hp, int l) {
  const int64_t H = hp.n_embd;
  b.layer(l, "ffn_gate_inp", {H, hp.n_expert}, TensorRole::Router);
  b.layer(l, "ffn_gate_exps", {H, hp.n_ff_exp, hp.n_expert}, TensorRole::Expert);
  b.layer(l, "ffn_up_exps", {H, hp.n_ff_exp, hp.n_expert}, TensorRole::Expert);
  b.layer(l, "ffn_down_exps", {hp.n_ff_exp, H, hp.n_expert}, TensorRole::Expert);
  if (hp.n_ff_shexp > 0) {
    b.layer(l, "ffn_gate_inp_shexp", {H}, TensorRole::Vector);
    b.layer(l, "ffn_gate_shexp", {H, hp.n_ff_shexp}, TensorRole::Matrix);
    b.layer(l, "ffn_up_shexp", {H, hp.n_ff_shexp}, TensorRole::Matrix);
    b.layer(l, "ffn_down_shexp", {hp.n_ff_shexp, H}, TensorRole::Matrix);
  }
}

// The per-head q/k norms are required: llama.cpp's loader requires them for qwen3moe and
// qwen3next (create_tensor flags 0), and both references list them (qwen3next-qwen3moe.md §7 and
// Part B, qwen4exp.md §12).
inline void add_attention_specs(SpecBuilder& b, const HParams& hp, int l, bool gated) {
  const int64_t H = hp.n_embd, q_dim = int64_t(hp.n_head) * hp.head_dim;
  b.layer(l, "attn_q", {H, gated ? 2 * q_dim : q_dim}, TensorRole::Matrix);
  b.layer(l, "attn_k", {H, hp.kv_dim()}, TensorRole::Matrix);
  b.layer(l, "attn_v", {H, hp.kv_dim()}, TensorRole::Matrix);
  b.layer(l, "attn_output", {q_dim, H}, TensorRole::Matrix);
  b.layer(l, "attn_q_norm", {hp.head_dim}, TensorRole::Norm);
  b.layer(l, "attn_k_norm", {hp.head_dim}, TensorRole::Norm);
}

inline void add_deltanet_specs(SpecBuilder& b, const HParams& hp, int l, bool fused_beta_alpha) {
  const int64_t H = hp.n_embd;
  const int64_t nv = hp.ssm_n_v_heads;
  b.layer(l, "attn_qkv", {H, hp.ssm_conv_dim()}, TensorRole::Matrix);
  b.layer(l, "attn_gate", {H, hp.ssm_value_dim()}, TensorRole::Matrix);
  if (fused_beta_alpha) {
    b.layer(l, "ssm_ba", {H, 2 * nv}, TensorRole::Matrix);
  } else {
    b.layer(l, "ssm_beta", {H, nv}, TensorRole::Matrix);
    b.layer(l, "ssm_alpha", {H, nv}, TensorRole::Matrix);
  }
  b.layer(l, "ssm_conv1d", {hp.ssm_conv_kernel, hp.ssm_conv_dim()}, TensorRole::Vector);
  b.layer(l, "ssm_dt.bias", {nv}, TensorRole::Vector);
  b.layer_bare(l, "ssm_a", {nv}, TensorRole::Vector);
  b.layer(l, "ssm_norm", {hp.ssm_head_v_dim()}, TensorRole::Norm);
  b.layer(l, "ssm_out", {hp.ssm_value_dim(), H}, TensorRole::Matrix);
}

}  // namespace strata
