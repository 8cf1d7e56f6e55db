#include "convert/plan.h"

#include <algorithm>

#include "convert/transforms.h"
#include "util/error.h"

namespace strata::convert {

ConversionContext::ConversionContext(const HfCheckpoint& checkpoint_in, const HfConfig& config_in,
                                     GgufWriter& writer_in, std::string arch_in)
    : checkpoint(checkpoint_in), config(config_in), writer(writer_in), arch(std::move(arch_in)) {}

const SafetensorsTensor& ConversionContext::use(const std::string& hf_name,
                                                const std::vector<int64_t>& shape) {
  const SafetensorsTensor& tensor = checkpoint.expect_shape(hf_name, shape);
  used_.insert(hf_name);
  return tensor;
}

std::vector<std::string> ConversionContext::unused_tensors() const {
  std::vector<std::string> out;
  for (const std::string& name : checkpoint.names()) {
    if (!used_.contains(name)) out.push_back(name);
  }
  return out;
}

void ConversionContext::add(std::string gguf_name, std::vector<int64_t> ne, RowProducer produce) {
  tensors_.push_back({std::move(gguf_name), std::move(ne), std::move(produce)});
}

void ConversionContext::add_whole(std::string gguf_name, const std::string& hf_name,
                                  const std::vector<int64_t>& hf_shape, std::vector<int64_t> ne,
                                  Transform transform) {
  const SafetensorsTensor& tensor = use(hf_name, hf_shape);
  const HfCheckpoint* source = &checkpoint;
  if (!transform) {
    // A plain copy streams in chunks of whole rows (~16 MiB of f32): token_embd and output of the
    // real models are 2.5 GB each in f32.
    const int64_t row = ne[0], n = tensor.n_elements();
    add(std::move(gguf_name), std::move(ne), [source, hf_name, row, n](const RowSink& sink) {
      const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 22) / row) * row;
      std::vector<float> values;
      for (int64_t first = 0; first < n; first += chunk) {
        values.resize(static_cast<size_t>(std::min(chunk, n - first)));
        source->read_f32(hf_name, first, values);
        sink(values);
      }
    });
    return;
  }
  add(std::move(gguf_name), std::move(ne),
      [source, hf_name, transform = std::move(transform)](const RowSink& sink) {
        std::vector<float> values = source->read_f32(hf_name);
        transform(values);
        sink(values);
      });
}

void ConversionContext::add_matrix(std::string gguf_name, const std::string& hf_name, int64_t out,
                                   int64_t in, Transform transform) {
  add_whole(std::move(gguf_name), hf_name, {out, in}, {in, out}, std::move(transform));
}

void ConversionContext::add_vector(std::string gguf_name, const std::string& hf_name, int64_t n,
                                   bool plus_one, Transform transform) {
  add_whole(std::move(gguf_name), hf_name, {n}, {n},
            [plus_one, transform = std::move(transform)](std::vector<float>& values) {
              if (transform) transform(values);
              if (plus_one) add_one(values);
            });
}

std::string block_name(int64_t block, std::string_view suffix) {
  return fmt::format("blk.{}.{}", block, suffix);
}

namespace {

// Emits, for every expert e, `rows_per_expert` rows read from `hf_name` starting at element
// e·expert_stride + offset (fused layout), or the whole per-expert tensor (per-expert layout).
RowProducer fused_expert_rows(const HfCheckpoint* source, std::string hf_name, int64_t n_experts,
                              int64_t expert_stride, int64_t offset, int64_t n_values) {
  return [=](const RowSink& sink) {
    std::vector<float> buffer(static_cast<size_t>(n_values));
    for (int64_t e = 0; e < n_experts; ++e) {
      source->read_f32(hf_name, e * expert_stride + offset, buffer);
      sink(buffer);
    }
  };
}

RowProducer per_expert_rows(const HfCheckpoint* source, std::vector<std::string> names) {
  return [source, names = std::move(names)](const RowSink& sink) {
    for (const std::string& name : names) sink(source->read_f32(name));
  };
}

// The fused tensor's name if the checkpoint has it, with or without ".weight".
std::optional<std::string> fused_name(const ConversionContext& ctx, const std::string& base) {
  if (ctx.has(base)) return base;
  if (ctx.has(base + ".weight")) return base + ".weight";
  return std::nullopt;
}

}  // namespace

void add_moe(ConversionContext& ctx, int64_t block, const std::string& mlp, const MoeShape& shape) {
  const int64_t E = shape.n_experts, I = shape.expert_ff, H = shape.hidden;
  ctx.add_matrix(block_name(block, "ffn_gate_inp.weight"), mlp + "gate.weight", E, H);

  const HfCheckpoint* source = &ctx.checkpoint;
  const auto gate_up = fused_name(ctx, mlp + "experts.gate_up_proj");
  if (gate_up) {
    const auto down = fused_name(ctx, mlp + "experts.down_proj");
    if (!down) fail("{}: missing tensor {}experts.down_proj (the experts are fused)", ctx.checkpoint.directory(), mlp);
    ctx.use(*gate_up, {E, 2 * I, H});
    ctx.use(*down, {E, H, I});
    ctx.add(block_name(block, "ffn_gate_exps.weight"), {H, I, E},
            fused_expert_rows(source, *gate_up, E, 2 * I * H, 0, I * H));
    ctx.add(block_name(block, "ffn_up_exps.weight"), {H, I, E},
            fused_expert_rows(source, *gate_up, E, 2 * I * H, I * H, I * H));
    ctx.add(block_name(block, "ffn_down_exps.weight"), {I, H, E},
            fused_expert_rows(source, *down, E, H * I, 0, H * I));
  } else {
    std::vector<std::string> gates, ups, downs;
    for (int64_t e = 0; e < E; ++e) {
      const std::string expert = fmt::format("{}experts.{}.", mlp, e);
      gates.push_back(expert + "gate_proj.weight");
      ups.push_back(expert + "up_proj.weight");
      downs.push_back(expert + "down_proj.weight");
      ctx.use(gates.back(), {I, H});
      ctx.use(ups.back(), {I, H});
      ctx.use(downs.back(), {H, I});
    }
    ctx.add(block_name(block, "ffn_gate_exps.weight"), {H, I, E}, per_expert_rows(source, gates));
    ctx.add(block_name(block, "ffn_up_exps.weight"), {H, I, E}, per_expert_rows(source, ups));
    ctx.add(block_name(block, "ffn_down_exps.weight"), {I, H, E}, per_expert_rows(source, downs));
  }

  if (shape.shared_ff) {
    const int64_t S = *shape.shared_ff;
    // [1, H] stays 2-D ({H, 1}): llama.cpp's converter no longer squeezes tensors.
    ctx.add_matrix(block_name(block, "ffn_gate_inp_shexp.weight"), mlp + "shared_expert_gate.weight", 1, H);
    ctx.add_matrix(block_name(block, "ffn_gate_shexp.weight"), mlp + "shared_expert.gate_proj.weight", S, H);
    ctx.add_matrix(block_name(block, "ffn_up_shexp.weight"), mlp + "shared_expert.up_proj.weight", S, H);
    ctx.add_matrix(block_name(block, "ffn_down_shexp.weight"), mlp + "shared_expert.down_proj.weight", H, S);
  }
}

void add_attention(ConversionContext& ctx, int64_t block, const std::string& attn, int64_t hidden,
                   int64_t q_rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                   bool norm_plus_one) {
  ctx.add_matrix(block_name(block, "attn_q.weight"), attn + "q_proj.weight", q_rows, hidden);
  ctx.add_matrix(block_name(block, "attn_k.weight"), attn + "k_proj.weight", n_kv_heads * head_dim, hidden);
  ctx.add_matrix(block_name(block, "attn_v.weight"), attn + "v_proj.weight", n_kv_heads * head_dim, hidden);
  ctx.add_matrix(block_name(block, "attn_output.weight"), attn + "o_proj.weight", hidden, n_heads * head_dim);
  ctx.add_vector(block_name(block, "attn_q_norm.weight"), attn + "q_norm.weight", head_dim, norm_plus_one);
  ctx.add_vector(block_name(block, "attn_k_norm.weight"), attn + "k_norm.weight", head_dim, norm_plus_one);
}

void add_common_metadata(ConversionContext& ctx, int64_t block_count,
                         const std::vector<int32_t>& rope_sections) {
  const HfConfig& c = ctx.config;
  GgufWriter& w = ctx.writer;
  w.add_u32(ctx.key("block_count"), static_cast<uint32_t>(block_count));
  if (auto n = c.optional_integer("max_position_embeddings")) w.add_u32(ctx.key("context_length"), static_cast<uint32_t>(*n));
  w.add_u32(ctx.key("embedding_length"), static_cast<uint32_t>(c.integer("hidden_size")));
  if (auto n = c.optional_integer("intermediate_size")) w.add_u32(ctx.key("feed_forward_length"), static_cast<uint32_t>(*n));
  w.add_u32(ctx.key("attention.head_count"), static_cast<uint32_t>(c.integer("num_attention_heads")));
  if (auto n = c.optional_integer("num_key_value_heads")) w.add_u32(ctx.key("attention.head_count_kv"), static_cast<uint32_t>(*n));
  if (!rope_sections.empty()) w.add_array_i32(ctx.key("rope.dimension_sections"), rope_sections);
  if (auto theta = c.rope_value("rope_theta")) w.add_f32(ctx.key("rope.freq_base"), static_cast<float>(*theta));
  if (auto eps = c.optional_number("rms_norm_eps")) w.add_f32(ctx.key("attention.layer_norm_rms_epsilon"), static_cast<float>(*eps));
  if (auto n = c.optional_integer_any({"num_local_experts", "num_experts"})) w.add_u32(ctx.key("expert_count"), static_cast<uint32_t>(*n));
  if (auto n = c.optional_integer("num_experts_per_tok")) w.add_u32(ctx.key("expert_used_count"), static_cast<uint32_t>(*n));
  if (auto n = c.optional_integer("head_dim")) {
    w.add_u32(ctx.key("attention.key_length"), static_cast<uint32_t>(*n));
    w.add_u32(ctx.key("attention.value_length"), static_cast<uint32_t>(*n));
  }
  if (auto n = c.optional_integer("moe_intermediate_size")) w.add_u32(ctx.key("expert_feed_forward_length"), static_cast<uint32_t>(*n));
  if (auto n = c.optional_integer("shared_expert_intermediate_size")) {
    w.add_u32(ctx.key("expert_shared_feed_forward_length"), static_cast<uint32_t>(*n));
  }
}

std::string text_model_prefix(const HfCheckpoint& checkpoint) {
  if (checkpoint.has("model.language_model.embed_tokens.weight")) return "model.language_model.";
  return "model.";
}

std::vector<bool> linear_layer_pattern(const HfConfig& config, int64_t n_layers) {
  std::vector<bool> is_linear(static_cast<size_t>(n_layers));
  const std::vector<std::string> types = config.string_list("layer_types");
  if (!types.empty()) {
    if (static_cast<int64_t>(types.size()) != n_layers) {
      fail("{}: field layer_types: expected {} entries (num_hidden_layers), found {}", config.origin(),
           n_layers, types.size());
    }
    for (int64_t i = 0; i < n_layers; ++i) is_linear[i] = types[i] == "linear_attention";
    return is_linear;
  }
  const int64_t interval = config.optional_integer("full_attention_interval").value_or(4);
  if (interval <= 0) fail("{}: field full_attention_interval: expected > 0, found {}", config.origin(), interval);
  for (int64_t i = 0; i < n_layers; ++i) is_linear[i] = (i + 1) % interval != 0;
  return is_linear;
}

std::optional<int64_t> full_attention_interval(const std::vector<bool>& is_linear) {
  const int64_t n = static_cast<int64_t>(is_linear.size());
  for (int64_t interval = 1; interval <= n; ++interval) {
    bool matches = true;
    for (int64_t i = 0; i < n && matches; ++i) matches = is_linear[i] == ((i + 1) % interval != 0);
    if (matches) return interval;
  }
  return std::nullopt;
}

}  // namespace strata::convert
