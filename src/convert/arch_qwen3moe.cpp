// Qwen3-MoE (Qwen3MoeForCausalLM) → GGUF arch "qwen3moe", as llama.cpp's Qwen3MoeModel writes it
// (reference qwen3next-qwen3moe.md Part B). No value transforms: plain RMSNorm weights, no +1.
#include "convert/arch.h"
#include "util/error.h"

namespace strata::convert {

void plan_qwen3moe(ConversionContext& ctx) {
  const HfConfig& c = ctx.config;
  const int64_t H = c.integer("hidden_size");
  const int64_t L = c.integer("num_hidden_layers");
  const int64_t V = c.integer("vocab_size");
  const int64_t n_heads = c.integer("num_attention_heads");
  const int64_t n_kv = c.optional_integer("num_key_value_heads").value_or(n_heads);
  const int64_t head_dim = c.optional_integer("head_dim").value_or(H / n_heads);
  const int64_t sparse_step = c.optional_integer("decoder_sparse_step").value_or(1);
  if (!c.integer_list("mlp_only_layers").empty() || sparse_step != 1) {
    fail("{}: dense MLP layers (mlp_only_layers / decoder_sparse_step {}) are not supported: "
         "qwen3moe requires every layer to be MoE", c.origin(), sparse_step);
  }
  const MoeShape moe{c.integer_any({"num_local_experts", "num_experts"}), c.integer("moe_intermediate_size"), H, std::nullopt};

  add_common_metadata(ctx, L);

  const std::string m = text_model_prefix(ctx.checkpoint);
  ctx.add_matrix("token_embd.weight", m + "embed_tokens.weight", V, H);
  for (int64_t i = 0; i < L; ++i) {
    const std::string layer = fmt::format("{}layers.{}.", m, i);
    ctx.add_vector(block_name(i, "attn_norm.weight"), layer + "input_layernorm.weight", H);
    add_attention(ctx, i, layer + "self_attn.", H, n_heads * head_dim, n_heads, n_kv, head_dim,
                  /*norm_plus_one=*/false);
    ctx.add_vector(block_name(i, "ffn_norm.weight"), layer + "post_attention_layernorm.weight", H);
    add_moe(ctx, i, layer + "mlp.", moe);
  }
  ctx.add_vector("output_norm.weight", m + "norm.weight", H);
  add_output_head(ctx, V, H);
}

}  // namespace strata::convert
