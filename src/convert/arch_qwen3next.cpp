// Qwen3-Next (Qwen3NextForCausalLM) → GGUF arch "qwen3next", as llama.cpp's Qwen3NextModel writes it
// (reference qwen3next-qwen3moe.md Part A §7): (1+w) norms folded (every "*norm.weight" except
// linear_attn.norm), A_log → −exp(A_log), conv1d squeezed, in_proj_qkvz regrouped into attn_qkv +
// attn_gate, in_proj_ba kept grouped as ssm_ba. No V-head reorder (that is qwen4exp/Qwen3.5 only).
// The HF MTP head (`mtp.*`, one full-attention + MoE block) becomes the trailing block blk.<L>, as
// llama.cpp's converter writes it since its Qwen3-Next MTP support: mtp.layers.0.* under the trunk
// names, mtp.fc → nextn.eh_proj (unchanged: embedding half first), pre_fc_norm_embedding →
// nextn.enorm, pre_fc_norm_hidden → nextn.hnorm, mtp.norm → nextn.shared_head_norm, all norms with
// the +1 folded; block_count = L + 1 and nextn_predict_layers = 1. `--no-mtp` leaves it out.
#include <algorithm>
#include <cmath>
#include <string>

#include "convert/arch.h"
#include "convert/transforms.h"
#include "util/error.h"

namespace strata::convert {

void add_output_head(ConversionContext& ctx, int64_t vocab, int64_t hidden) {
  if (ctx.has("lm_head.weight")) {
    ctx.add_matrix("output.weight", "lm_head.weight", vocab, hidden);
  } else if (!ctx.config.boolean_or("tie_word_embeddings", false)) {
    fail("{}: missing tensor lm_head.weight (tie_word_embeddings is false)", ctx.checkpoint.directory());
  }
}

void add_gdn_metadata(ConversionContext& ctx, const std::vector<bool>& is_linear, int64_t mtp_blocks) {
  const HfConfig& c = ctx.config;
  GgufWriter& w = ctx.writer;
  w.add_u32(ctx.key("ssm.conv_kernel"), static_cast<uint32_t>(c.integer("linear_conv_kernel_dim")));
  w.add_u32(ctx.key("ssm.state_size"), static_cast<uint32_t>(c.integer("linear_key_head_dim")));
  w.add_u32(ctx.key("ssm.group_count"), static_cast<uint32_t>(c.integer("linear_num_key_heads")));
  w.add_u32(ctx.key("ssm.time_step_rank"), static_cast<uint32_t>(c.integer("linear_num_value_heads")));
  w.add_u32(ctx.key("ssm.inner_size"),
            static_cast<uint32_t>(c.integer("linear_value_head_dim") * c.integer("linear_num_value_heads")));
  // llama.cpp writes hparams.get("full_attention_interval", 4), which silently mis-describes a
  // non-default `layer_types`; we derive the interval from the pattern and, when the pattern has
  // none, also write the explicit per-layer list llama.cpp gives precedence to.
  const auto interval = full_attention_interval(is_linear);
  w.add_u32(ctx.key("full_attention_interval"),
            static_cast<uint32_t>(interval.value_or(c.optional_integer("full_attention_interval").value_or(4))));
  if (!interval) {
    std::vector<int64_t> flags(is_linear.begin(), is_linear.end());
    flags.resize(flags.size() + size_t(mtp_blocks), 0);  // MTP blocks attend; one flag per block
    w.add_array(ctx.key("attention.recurrent_layers"), GgufValueType::BOOL, flags);
  }
  const int64_t head_dim = c.optional_integer("head_dim").value_or(c.integer("hidden_size") / c.integer("num_attention_heads"));
  const double partial = c.rope_value("partial_rotary_factor").value_or(0.25);
  w.add_u32(ctx.key("rope.dimension_count"), static_cast<uint32_t>(static_cast<double>(head_dim) * partial));
}

namespace {

// Number of MTP layers in the checkpoint: Qwen3-Next's config.json has no mtp_num_hidden_layers, so
// (like llama.cpp) count the mtp.layers.N blocks; a config that does name a count must agree.
int64_t count_mtp_layers(const ConversionContext& ctx) {
  int64_t count = 0;
  for (const std::string& name : ctx.checkpoint.names()) {
    if (name.rfind("mtp.layers.", 0) != 0) continue;
    const size_t end = name.find('.', 11);
    const std::string index = name.substr(11, end == std::string::npos ? std::string::npos : end - 11);
    if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos)
      fail("{}: tensor {}: expected mtp.layers.<N>.*", ctx.checkpoint.directory(), name);
    count = std::max<int64_t>(count, std::stoll(index) + 1);
  }
  if (const auto stated = ctx.config.optional_integer("mtp_num_hidden_layers"); stated && *stated != count)
    fail("{}: field mtp_num_hidden_layers: {} MTP layers, but the checkpoint has {}", ctx.config.origin(), *stated,
         count);
  if (count > 1) fail("{}: {} MTP layers: only 1 is supported", ctx.checkpoint.directory(), count);
  if (count == 1 && !ctx.has("mtp.fc.weight"))
    fail("{}: missing tensor mtp.fc.weight (the checkpoint has mtp.layers.0)", ctx.checkpoint.directory());
  return count;
}

}  // namespace

void plan_qwen3next(ConversionContext& ctx, const ArchOptions& options) {
  const HfConfig& c = ctx.config;
  const int64_t H = c.integer("hidden_size");
  const int64_t L = c.integer("num_hidden_layers");
  const int64_t V = c.integer("vocab_size");
  const int64_t n_heads = c.integer("num_attention_heads");
  const int64_t n_kv = c.integer("num_key_value_heads");
  const int64_t head_dim = c.optional_integer("head_dim").value_or(H / n_heads);
  const int64_t nk = c.integer("linear_num_key_heads"), nv = c.integer("linear_num_value_heads");
  const int64_t dk = c.integer("linear_key_head_dim"), dv = c.integer("linear_value_head_dim");
  const int64_t conv_kernel = c.integer("linear_conv_kernel_dim");
  if (nk <= 0 || nv % nk != 0) fail("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", c.origin(), nv, nk);
  const int64_t r = nv / nk;
  const int64_t conv_dim = 2 * nk * dk + nv * dv;
  if (!c.integer_list("mlp_only_layers").empty() || c.optional_integer("decoder_sparse_step").value_or(1) != 1) {
    fail("{}: dense MLP layers are not supported: qwen3next requires every layer to be MoE", c.origin());
  }
  const MoeShape moe{c.integer_any({"num_local_experts", "num_experts"}), c.integer("moe_intermediate_size"), H,
                     c.integer("shared_expert_intermediate_size")};
  const std::vector<bool> is_linear = linear_layer_pattern(c, L);
  const bool has_mtp = count_mtp_layers(ctx) == 1;
  const bool export_mtp = has_mtp && options.include_mtp;

  add_common_metadata(ctx, L + (export_mtp ? 1 : 0));
  add_gdn_metadata(ctx, is_linear, export_mtp ? 1 : 0);
  if (export_mtp) ctx.writer.add_u32(ctx.key("nextn_predict_layers"), 1);

  const std::string m = text_model_prefix(ctx.checkpoint);
  const QkvzRows qkvz = qwen3next_qkvz_rows(nk, dk, r, dv);
  ctx.add_matrix("token_embd.weight", m + "embed_tokens.weight", V, H);
  for (int64_t i = 0; i < L; ++i) {
    const std::string layer = fmt::format("{}layers.{}.", m, i);
    ctx.add_vector(block_name(i, "attn_norm.weight"), layer + "input_layernorm.weight", H, true);
    if (is_linear[i]) {
      const std::string la = layer + "linear_attn.";
      const std::string qkvz_name = la + "in_proj_qkvz.weight";
      ctx.use(qkvz_name, {2 * nk * dk + 2 * nv * dv, H});
      const HfCheckpoint* source = &ctx.checkpoint;
      ctx.add(block_name(i, "attn_qkv.weight"), {H, conv_dim}, [source, qkvz_name, qkvz, H](const RowSink& sink) {
        sink(gather_rows(source->read_f32(qkvz_name), H, qkvz.qkv));
      });
      ctx.add(block_name(i, "attn_gate.weight"), {H, nv * dv}, [source, qkvz_name, qkvz, H](const RowSink& sink) {
        sink(gather_rows(source->read_f32(qkvz_name), H, qkvz.z));
      });
      ctx.add_matrix(block_name(i, "ssm_ba.weight"), la + "in_proj_ba.weight", 2 * nv, H);
      ctx.add_whole(block_name(i, "ssm_conv1d.weight"), la + "conv1d.weight", {conv_dim, 1, conv_kernel},
                    {conv_kernel, conv_dim});
      ctx.add_vector(block_name(i, "ssm_dt.bias"), la + "dt_bias", nv);
      ctx.add_vector(block_name(i, "ssm_a"), la + "A_log", nv, false,
                     [](std::vector<float>& v) { negate_exp(v); });
      ctx.add_vector(block_name(i, "ssm_norm.weight"), la + "norm.weight", dv);  // plain w: no +1
      ctx.add_matrix(block_name(i, "ssm_out.weight"), la + "out_proj.weight", H, nv * dv);
    } else {
      add_attention(ctx, i, layer + "self_attn.", H, 2 * n_heads * head_dim, n_heads, n_kv, head_dim,
                    /*norm_plus_one=*/true);
    }
    ctx.add_vector(block_name(i, "post_attention_norm.weight"), layer + "post_attention_layernorm.weight", H, true);
    add_moe(ctx, i, layer + "mlp.", moe);
  }
  ctx.add_vector("output_norm.weight", m + "norm.weight", H, true);
  add_output_head(ctx, V, H);
  if (export_mtp) {
    const std::string layer = "mtp.layers.0.";
    ctx.add_vector(block_name(L, "attn_norm.weight"), layer + "input_layernorm.weight", H, true);
    add_attention(ctx, L, layer + "self_attn.", H, 2 * n_heads * head_dim, n_heads, n_kv, head_dim,
                  /*norm_plus_one=*/true);
    ctx.add_vector(block_name(L, "post_attention_norm.weight"), layer + "post_attention_layernorm.weight", H, true);
    add_moe(ctx, L, layer + "mlp.", moe);
    ctx.add_matrix(block_name(L, "nextn.eh_proj.weight"), "mtp.fc.weight", H, 2 * H);
    ctx.add_vector(block_name(L, "nextn.enorm.weight"), "mtp.pre_fc_norm_embedding.weight", H, true);
    ctx.add_vector(block_name(L, "nextn.hnorm.weight"), "mtp.pre_fc_norm_hidden.weight", H, true);
    ctx.add_vector(block_name(L, "nextn.shared_head_norm.weight"), "mtp.norm.weight", H, true);
  } else {
    for (const std::string& name : ctx.checkpoint.names()) {
      if (name.rfind("mtp.", 0) == 0) ctx.skip(name);  // --no-mtp
    }
  }
}

}  // namespace strata::convert
