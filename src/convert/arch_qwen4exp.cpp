// qwen4exp (Qwen4ExpForCausalLM / Qwen4ExpForConditionalGeneration text path) → GGUF arch
// "qwen4exp", following llama.cpp's conversion/qwen4exp.py (reference qwen4exp.md §12):
// - (1+w) folded into hc norms, q/k norms, indexer q/k layernorms, PLE norms and the MTP norms;
//   linear_attn.norm stays plain;
// - GDN V heads reordered grouped → tiled in attn_qkv (V rows), attn_gate, ssm_beta, ssm_alpha,
//   ssm_conv1d (V channels), ssm_dt, ssm_a and ssm_out (V columns); A_log → −exp(A_log);
// - index_qk_proj split into indexer.q_proj / indexer.k_proj;
// - the PLE n-gram shards row-concatenated into per_layer_token_embd and the int64 hash constants
//   copied verbatim into u64 KV arrays;
// - the MTP head exported as the trailing block blk.<L> (nextn.eh_proj = [fc_embedding | fc_hidden]).
#include <algorithm>
#include <cmath>
#include <optional>

#include "convert/arch.h"
#include "convert/transforms.h"
#include "util/error.h"

namespace strata::convert {
namespace {

struct Shape {
  int64_t H, L, V, n_heads, n_kv, head_dim;
  int64_t nk, nv, dk, dv, conv_kernel;
  int64_t streams, low_rank;
  int64_t idx_heads, idx_dim;
  MoeShape moe;
};

// `gguf` is the full name prefix: "blk.3.hc_attn_", "output_hc_", "blk.4.nextn.hc_head_".
void add_hyper_connection(ConversionContext& ctx, const std::string& hf, const std::string& gguf, const Shape& s,
                          bool with_inject) {
  const int64_t width = s.streams * s.H;
  ctx.add_vector(gguf + "norm.weight", hf + "hc_norm.weight", width, true);
  ctx.add_matrix(gguf + "down.weight", hf + "input_mix_weight_down.weight", s.low_rank, width);
  ctx.add_matrix(gguf + "up.weight", hf + "input_mix_weight_up.weight", width, s.low_rank);
  if (with_inject) ctx.add_matrix(gguf + "inject.weight", hf + "block_inject_weight.weight", s.streams, width);
}

void add_gdn(ConversionContext& ctx, int64_t block, const std::string& la, const Shape& s) {
  const int64_t key_dim = s.nk * s.dk, value_dim = s.nv * s.dv, conv_dim = 2 * key_dim + value_dim;
  const std::vector<int64_t> heads = v_heads_grouped_to_tiled(s.nk, s.nv / s.nk);
  const std::vector<int64_t> v_rows = expand_block_permutation(heads, s.dv);

  std::vector<int64_t> qkv_rows(static_cast<size_t>(2 * key_dim));
  for (int64_t j = 0; j < 2 * key_dim; ++j) qkv_rows[j] = j;  // q and k rows stay in place
  for (int64_t row : v_rows) qkv_rows.push_back(2 * key_dim + row);
  const int64_t H = s.H;
  const auto rows_of = [](std::vector<int64_t> rows, int64_t cols) -> Transform {
    return [rows = std::move(rows), cols](std::vector<float>& values) { values = gather_rows(values, cols, rows); };
  };

  ctx.add_matrix(block_name(block, "attn_qkv.weight"), la + "in_proj_qkv.weight", conv_dim, H, rows_of(qkv_rows, H));
  ctx.add_matrix(block_name(block, "attn_gate.weight"), la + "in_proj_z.weight", value_dim, H, rows_of(v_rows, H));
  ctx.add_matrix(block_name(block, "ssm_beta.weight"), la + "in_proj_b.weight", s.nv, H, rows_of(heads, H));
  ctx.add_matrix(block_name(block, "ssm_alpha.weight"), la + "in_proj_a.weight", s.nv, H, rows_of(heads, H));
  // conv1d [C, 1, K] squeezed to [C, K]: each channel is a row of K taps; V channels reordered.
  ctx.add_whole(block_name(block, "ssm_conv1d.weight"), la + "conv1d.weight", {conv_dim, 1, s.conv_kernel},
                {s.conv_kernel, conv_dim}, rows_of(qkv_rows, s.conv_kernel));
  ctx.add_vector(block_name(block, "ssm_dt.bias"), la + "dt_bias", s.nv, false, rows_of(heads, 1));
  ctx.add_vector(block_name(block, "ssm_a"), la + "A_log", s.nv, false, [heads](std::vector<float>& v) {
    v = gather_rows(v, 1, heads);
    negate_exp(v);
  });
  ctx.add_vector(block_name(block, "ssm_norm.weight"), la + "norm.weight", s.dv);  // plain w: no +1
  ctx.add_matrix(block_name(block, "ssm_out.weight"), la + "out_proj.weight", H, value_dim,
                 [v_rows, value_dim](std::vector<float>& values) { gather_columns(values, value_dim, v_rows); });
}

void add_qsa(ConversionContext& ctx, int64_t block, const std::string& attn, const Shape& s) {
  add_attention(ctx, block, attn, s.H, 2 * s.n_heads * s.head_dim, s.n_heads, s.n_kv, s.head_dim,
                /*norm_plus_one=*/true);
  const std::string ix = attn + "indexer.";
  const std::string qk = ix + "index_qk_proj.weight";
  ctx.use(qk, {(s.idx_heads + 1) * s.idx_dim, s.H});
  const HfCheckpoint* source = &ctx.checkpoint;
  const int64_t q_values = s.idx_heads * s.idx_dim * s.H, k_values = s.idx_dim * s.H;
  ctx.add(block_name(block, "indexer.q_proj.weight"), {s.H, s.idx_heads * s.idx_dim},
          [source, qk, q_values](const RowSink& sink) {
            std::vector<float> rows(static_cast<size_t>(q_values));
            source->read_f32(qk, 0, rows);
            sink(rows);
          });
  ctx.add(block_name(block, "indexer.k_proj.weight"), {s.H, s.idx_dim},
          [source, qk, q_values, k_values](const RowSink& sink) {
            std::vector<float> rows(static_cast<size_t>(k_values));
            source->read_f32(qk, q_values, rows);
            sink(rows);
          });
  ctx.add_vector(block_name(block, "indexer.q_norm.weight"), ix + "q_layernorm.weight", s.idx_dim, true);
  ctx.add_vector(block_name(block, "indexer.k_norm.weight"), ix + "k_layernorm.weight", s.idx_dim, true);
}

// The QSA + MoE block body shared by trunk QSA layers and the MTP block.
void add_qsa_block(ConversionContext& ctx, int64_t block, const std::string& layer, const Shape& s) {
  add_hyper_connection(ctx, layer + "attn_hyper_connection.", block_name(block, "hc_attn_"), s, true);
  add_qsa(ctx, block, layer + "self_attn.", s);
  add_hyper_connection(ctx, layer + "mlp_hyper_connection.", block_name(block, "hc_ffn_"), s, true);
  add_moe(ctx, block, layer + "mlp.", s.moe);
}

// The n-gram table: shards `<ple>ple_embedding.ngram_embedding.shard_<k>.weight`, k = 0..n-1, or
// one unsharded `ngram_embedding.weight`. Returns the row width.
int64_t add_ple_table(ConversionContext& ctx, const std::string& emb) {
  const std::string shard_prefix = emb + "ngram_embedding.shard_";
  std::vector<std::string> shards;
  while (ctx.has(fmt::format("{}{}.weight", shard_prefix, shards.size()))) {
    shards.push_back(fmt::format("{}{}.weight", shard_prefix, shards.size()));
  }
  for (const std::string& name : ctx.checkpoint.names()) {
    if (name.rfind(shard_prefix, 0) == 0 && std::find(shards.begin(), shards.end(), name) == shards.end()) {
      fail("{}: PLE shard {} is out of sequence: found shards 0..{} only", ctx.checkpoint.directory(), name,
           static_cast<int64_t>(shards.size()) - 1);
    }
  }
  if (shards.empty()) shards.push_back(emb + "ngram_embedding.weight");
  if (const auto parts = ctx.config.optional_integer("split_ngram_parts");
      parts && shards.size() > 1 && static_cast<int64_t>(shards.size()) != *parts) {
    fail("{}: found {} PLE shards, config split_ngram_parts says {}", ctx.checkpoint.directory(), shards.size(), *parts);
  }
  const int64_t row_dim = ctx.checkpoint.tensor(shards[0]).shape.back();
  int64_t rows = 0;
  std::vector<int64_t> shard_rows;
  for (const std::string& name : shards) {
    const SafetensorsTensor& t = ctx.checkpoint.tensor(name);
    if (t.shape.size() != 2 || t.shape[1] != row_dim) {
      fail("{}: tensor {}: expected shape [rows, {}], found {}", ctx.checkpoint.directory(), name, row_dim,
           shape_to_string(t.shape));
    }
    ctx.use(name, t.shape);
    shard_rows.push_back(t.shape[0]);
    rows += t.shape[0];
  }
  const HfCheckpoint* source = &ctx.checkpoint;
  ctx.add("per_layer_token_embd.weight", {row_dim, rows}, [source, shards, shard_rows, row_dim](const RowSink& sink) {
    constexpr int64_t kRowsPerChunk = 1 << 16;  // bounded memory for the 320 M-row real table
    std::vector<float> chunk;
    for (size_t k = 0; k < shards.size(); ++k) {
      for (int64_t row = 0; row < shard_rows[k]; row += kRowsPerChunk) {
        const int64_t n = std::min(kRowsPerChunk, shard_rows[k] - row);
        chunk.resize(static_cast<size_t>(n * row_dim));
        source->read_f32(shards[k], row * row_dim, chunk);
        sink(chunk);
      }
    }
  });
  return row_dim;
}

void add_ple_layer(ConversionContext& ctx, int64_t block, const std::string& ple, const Shape& s, int64_t ple_dim) {
  const int64_t width = s.streams * s.H;
  const int64_t kernel = ctx.config.optional_integer("ple_conv_kernel_size").value_or(4);
  ctx.add_matrix(block_name(block, "ple_key.weight"), ple + "key_proj.weight", width, ple_dim);
  ctx.add_matrix(block_name(block, "ple_value.weight"), ple + "value_proj.weight", s.H, ple_dim);
  ctx.add_vector(block_name(block, "ple_norm_key.weight"), ple + "norm_key.weight", width, true);
  ctx.add_vector(block_name(block, "ple_norm_query.weight"), ple + "norm_query.weight", width, true);
  ctx.add_vector(block_name(block, "ple_norm_conv.weight"), ple + "norm_conv.weight", width, true);
  ctx.add_whole(block_name(block, "ple_conv1d.weight"), ple + "conv1d.weight", {width, 1, kernel}, {kernel, width});
}

// Writes the PLE KV block and the table; the int64 constants go to KV verbatim (never via float).
void add_ple(ConversionContext& ctx, const std::vector<int64_t>& ple_layers, const std::string& m, const Shape& s) {
  const HfConfig& c = ctx.config;
  if (ple_layers.size() != 1) {
    fail("{}: field ple_layer_ids: {} PLE layers, only one is supported (as in llama.cpp)", c.origin(), ple_layers.size());
  }
  const int64_t layer = ple_layers[0] - 1;  // 1-based in HF
  if (layer < 0 || layer >= s.L) fail("{}: field ple_layer_ids: {} outside [1, {}]", c.origin(), ple_layers[0], s.L);
  const std::string ple = fmt::format("{}layers.{}.ple.", m, layer);
  const std::string emb = ple + "ple_embedding.";
  const auto eos = c.token_id("eos_token_id");
  if (!eos) fail("{}: missing field eos_token_id: the PLE n-gram hash resets on it", c.origin());

  GgufWriter& w = ctx.writer;
  const std::vector<int32_t> layers{static_cast<int32_t>(layer)};
  w.add_array_i32(ctx.key("ple.layers"), layers);
  w.add_u32(ctx.key("ple.ngram_size"), static_cast<uint32_t>(c.optional_integer("ngram_size").value_or(3)));
  w.add_u32(ctx.key("ple.heads_per_ngram"), static_cast<uint32_t>(c.optional_integer("heads_per_ngram").value_or(8)));
  w.add_u32(ctx.key("ple.conv_kernel"), static_cast<uint32_t>(c.optional_integer("ple_conv_kernel_size").value_or(4)));
  w.add_u32(ctx.key("ple.eos_token_id"), static_cast<uint32_t>(*eos));
  if (const auto image = c.optional_integer("image_token_id")) {
    w.add_u32(ctx.key("ple.image_token_id"), static_cast<uint32_t>(*image));
  }
  const int64_t row_dim = add_ple_table(ctx, emb);
  w.add_u32(ctx.key("embedding_length_per_layer_input"), static_cast<uint32_t>(row_dim));
  const std::pair<const char*, const char*> constants[] = {
      {"layer_multipliers", "ple.layer_multipliers"},
      {"ngram_heads_offsets", "ple.head_offsets"},
      {"ngram_heads_vocab_sizes", "ple.head_vocab_sizes"},
  };
  for (const auto& [hf, key] : constants) {
    const std::string name = emb + hf;
    ctx.use(name, ctx.checkpoint.tensor(name).shape);
    w.add_array(ctx.key(key), GgufValueType::U64, ctx.checkpoint.read_i64(name));
  }
  const int64_t ple_dim = c.optional_integer("ple_embed_dim").value_or(s.H);
  add_ple_layer(ctx, layer, ple, s, ple_dim);
}

// "mtp.", "model.mtp." or "model.language_model.mtp.": wherever the checkpoint keeps the head.
std::optional<std::string> mtp_prefix(const ConversionContext& ctx) {
  for (const char* prefix : {"mtp.", "model.mtp.", "model.language_model.mtp."}) {
    if (ctx.has(std::string(prefix) + "fc_embedding.weight")) return std::string(prefix);
  }
  return std::nullopt;
}

void add_mtp(ConversionContext& ctx, int64_t block, const std::string& mtp, const Shape& s) {
  const int64_t width = s.streams * s.H;
  add_qsa_block(ctx, block, mtp + "layers.0.", s);
  const std::string fe = mtp + "fc_embedding.weight", fh = mtp + "fc_hidden.weight";
  ctx.use(fe, {s.H, s.H});
  ctx.use(fh, {s.H, s.H});
  const HfCheckpoint* source = &ctx.checkpoint;
  const int64_t H = s.H;
  // eh_proj = cat([fc_embedding, fc_hidden], dim=1): row o is [fe[o, :] | fh[o, :]], embedding first.
  ctx.add(block_name(block, "nextn.eh_proj.weight"), {2 * H, H}, [source, fe, fh, H](const RowSink& sink) {
    const std::vector<float> e = source->read_f32(fe), h = source->read_f32(fh);
    std::vector<float> rows(static_cast<size_t>(2 * H * H));
    for (int64_t o = 0; o < H; ++o) {
      std::copy_n(e.begin() + o * H, H, rows.begin() + o * 2 * H);
      std::copy_n(h.begin() + o * H, H, rows.begin() + o * 2 * H + H);
    }
    sink(rows);
  });
  ctx.add_vector(block_name(block, "nextn.enorm.weight"), mtp + "pre_fc_norm_embedding.weight", s.H, true);
  ctx.add_vector(block_name(block, "nextn.hnorm.weight"), mtp + "pre_fc_norm_hidden.weight", width, true);
  add_hyper_connection(ctx, mtp + "hyper_connection_mixer.", block_name(block, "nextn.hc_head_"), s, false);
  // vLLM drops an inject weight on the head's mixer; it has no use there.
  if (ctx.has(mtp + "hyper_connection_mixer.block_inject_weight.weight")) {
    ctx.skip(mtp + "hyper_connection_mixer.block_inject_weight.weight");
  }
}

}  // namespace

void plan_qwen4exp(ConversionContext& ctx, const ArchOptions& options) {
  const HfConfig& c = ctx.config;
  Shape s{};
  s.H = c.integer("hidden_size");
  s.L = c.integer("num_hidden_layers");
  s.V = c.integer("vocab_size");
  s.n_heads = c.integer("num_attention_heads");
  s.n_kv = c.integer("num_key_value_heads");
  s.head_dim = c.optional_integer("head_dim").value_or(s.H / s.n_heads);
  s.nk = c.integer("linear_num_key_heads");
  s.nv = c.integer("linear_num_value_heads");
  s.dk = c.integer("linear_key_head_dim");
  s.dv = c.integer("linear_value_head_dim");
  s.conv_kernel = c.integer("linear_conv_kernel_dim");
  s.streams = c.integer("hc_count");
  s.low_rank = c.integer("hc_lowrank");
  s.idx_heads = c.integer("indexer_n_heads");
  s.idx_dim = c.integer("indexer_head_dim");
  s.moe = {c.integer_any({"num_local_experts", "num_experts"}), c.integer("moe_intermediate_size"), s.H,
           c.integer("shared_expert_intermediate_size")};
  if (s.nk <= 0 || s.nv % s.nk != 0) {
    fail("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", c.origin(), s.nv, s.nk);
  }
  if (s.streams <= 1) fail("{}: field hc_count: expected > 1, found {}", c.origin(), s.streams);
  if (c.optional_integer("indexer_kv_heads").value_or(1) != 1) {
    fail("{}: field indexer_kv_heads: expected 1, found {}", c.origin(), c.integer("indexer_kv_heads"));
  }
  const int64_t ratio = c.integer("indexer_compress_ratio");

  const std::string m = text_model_prefix(ctx.checkpoint);
  const auto mtp = mtp_prefix(ctx);
  const int64_t mtp_layers = c.optional_integer("mtp_num_hidden_layers").value_or(mtp ? 1 : 0);
  if (mtp_layers > 1) fail("{}: field mtp_num_hidden_layers: {} MTP layers, only 1 is supported", c.origin(), mtp_layers);
  if (mtp_layers == 1 && !mtp) fail("{}: missing tensor mtp.fc_embedding.weight (config has an MTP head)", ctx.checkpoint.directory());
  const bool export_mtp = mtp && options.include_mtp;
  const int64_t block_count = s.L + (export_mtp ? 1 : 0);

  const std::vector<bool> is_linear = linear_layer_pattern(c, s.L);
  std::vector<int32_t> sections;
  for (int64_t v : c.rope_integer_list("mrope_section")) sections.push_back(static_cast<int32_t>(v));
  if (sections.empty()) sections = {11, 11, 10};  // the transformers default, as llama.cpp's mixin writes
  sections.resize(std::max<size_t>(4, sections.size()), 0);

  add_common_metadata(ctx, block_count, sections);
  add_gdn_metadata(ctx, is_linear, export_mtp ? 1 : 0);
  GgufWriter& w = ctx.writer;
  w.add_u32(ctx.key("hyper_connection.count"), static_cast<uint32_t>(s.streams));
  w.add_u32(ctx.key("hyper_connection.low_rank"), static_cast<uint32_t>(s.low_rank));
  w.add_u32(ctx.key("attention.indexer.head_count"), static_cast<uint32_t>(s.idx_heads));
  w.add_u32(ctx.key("attention.indexer.key_length"), static_cast<uint32_t>(s.idx_dim));
  w.add_u32(ctx.key("attention.indexer.top_k"), static_cast<uint32_t>(c.integer("indexer_budget")));
  // Every non-linear layer is QSA whatever config.json calls it ("full_attention" in the release,
  // "qwen_sparse_attention" from transformers 5.17); the MTP block attends densely (ratio 0).
  std::vector<int32_t> ratios(static_cast<size_t>(block_count), 0);
  for (int64_t i = 0; i < s.L; ++i) ratios[i] = is_linear[i] ? 0 : static_cast<int32_t>(ratio);
  w.add_array_i32(ctx.key("attention.compress_ratios"), ratios);
  const std::vector<int64_t> ple_layers = c.integer_list("ple_layer_ids");
  if (!ple_layers.empty()) add_ple(ctx, ple_layers, m, s);
  if (export_mtp) w.add_u32(ctx.key("nextn_predict_layers"), 1);

  ctx.add_matrix("token_embd.weight", m + "embed_tokens.weight", s.V, s.H);
  for (int64_t i = 0; i < s.L; ++i) {
    const std::string layer = fmt::format("{}layers.{}.", m, i);
    if (is_linear[i]) {
      add_hyper_connection(ctx, layer + "attn_hyper_connection.", block_name(i, "hc_attn_"), s, true);
      add_gdn(ctx, i, layer + "linear_attn.", s);
      add_hyper_connection(ctx, layer + "mlp_hyper_connection.", block_name(i, "hc_ffn_"), s, true);
      add_moe(ctx, i, layer + "mlp.", s.moe);
    } else {
      add_qsa_block(ctx, i, layer, s);
    }
  }
  add_hyper_connection(ctx, m + "hyper_connection_mixer.", "output_hc_", s, false);
  add_output_head(ctx, s.V, s.H);
  if (export_mtp) {
    add_mtp(ctx, s.L, *mtp, s);
  } else if (mtp) {
    for (const std::string& name : ctx.checkpoint.names()) {
      if (name.rfind(*mtp, 0) == 0) ctx.skip(name);
    }
  }
  for (const std::string& name : ctx.checkpoint.names()) {
    if (name.rfind("model.visual.", 0) == 0) ctx.skip(name);  // the vision tower is not converted
  }
}

}  // namespace strata::convert
