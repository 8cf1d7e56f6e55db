#include "model/hparams.h"

#include <cmath>
#include <string>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "util/error.h"

namespace strata {
namespace {

// Reads "<arch>.<name>" metadata with the file's context in every error.
class MetaReader {
 public:
  MetaReader(const GgufFile& file, std::string prefix) : file_(file), prefix_(std::move(prefix)) {}

  template <typename T>
  T required(const std::string& name) const {
    const std::string key = prefix_ + name;
    if (!file_.has(key)) fail("{}: missing metadata key '{}'", file_.path(), key);
    return file_.get<T>(key);
  }
  template <typename T>
  T optional(const std::string& name, T fallback) const {
    return file_.get_or<T>(prefix_ + name, fallback);
  }
  bool has(const std::string& name) const { return file_.has(prefix_ + name); }
  std::vector<int64_t> ints(const std::string& name) const {
    return required<std::vector<int64_t>>(name);
  }
  // Per-layer flags: llama.cpp's converter writes them as a BOOL array; integer arrays are taken too.
  std::vector<int64_t> flags(const std::string& name) const {
    const GgufValue* value = file_.find(prefix_ + name);
    if (value) {
      if (const auto* array = std::get_if<GgufArray>(&value->value);
          array && array->element_type == GgufValueType::BOOL)
        return array->ints;
    }
    return ints(name);
  }
  [[noreturn]] void bad(const std::string& name, const std::string& expected,
                        const std::string& found) const {
    fail("{}: metadata key '{}{}': expected {}, found {}", file_.path(), prefix_, name, expected,
         found);
  }
  void positive(const std::string& name, int64_t value) const {
    if (value <= 0) bad(name, "a positive value", std::to_string(value));
  }

 private:
  const GgufFile& file_;
  std::string prefix_;
};

Arch parse_arch(const GgufFile& file) {
  const std::string arch = file.architecture();
  if (arch == "qwen4exp") return Arch::Qwen4Exp;
  if (arch == "qwen3next") return Arch::Qwen3Next;
  if (arch == "qwen3moe") return Arch::Qwen3Moe;
  fail("{}: general.architecture: expected one of qwen4exp, qwen3next, qwen3moe, found '{}'",
       file.path(), arch);
}

void load_attention(const MetaReader& meta, HParams& hp) {
  hp.n_head = meta.required<int>("attention.head_count");
  hp.n_head_kv = meta.required<int>("attention.head_count_kv");
  hp.head_dim = meta.optional<int>("attention.key_length", int(hp.n_embd / std::max(hp.n_head, 1)));
  const int value_length = meta.optional<int>("attention.value_length", hp.head_dim);
  meta.positive("attention.head_count", hp.n_head);
  meta.positive("attention.head_count_kv", hp.n_head_kv);
  meta.positive("attention.key_length", hp.head_dim);
  if (value_length != hp.head_dim)
    meta.bad("attention.value_length", fmt::format("= key_length ({})", hp.head_dim),
             std::to_string(value_length));
  if (hp.n_head % hp.n_head_kv != 0)
    meta.bad("attention.head_count", fmt::format("a multiple of head_count_kv ({})", hp.n_head_kv),
             std::to_string(hp.n_head));
  hp.n_rot = meta.optional<int>("rope.dimension_count", hp.head_dim);
  if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0)
    meta.bad("rope.dimension_count", fmt::format("an even value in [2, {}]", hp.head_dim),
             std::to_string(hp.n_rot));
  hp.rope_theta = meta.optional<float>("rope.freq_base", 10000.0f);
  if (!(hp.rope_theta > 0)) meta.bad("rope.freq_base", "> 0", std::to_string(hp.rope_theta));
}

void load_moe(const MetaReader& meta, HParams& hp) {
  hp.n_expert = meta.required<int>("expert_count");
  hp.n_expert_used = meta.required<int>("expert_used_count");
  hp.n_ff_exp = meta.required<int64_t>("expert_feed_forward_length");
  meta.positive("expert_count", hp.n_expert);
  if (hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert)
    meta.bad("expert_used_count", fmt::format("in [1, {}]", hp.n_expert),
             std::to_string(hp.n_expert_used));
  meta.positive("expert_feed_forward_length", hp.n_ff_exp);
  hp.n_ff_shexp = meta.optional<int64_t>("expert_shared_feed_forward_length", 0);
}

void load_ssm(const MetaReader& meta, HParams& hp) {
  hp.ssm_conv_kernel = meta.required<int>("ssm.conv_kernel");
  hp.ssm_d_state = meta.required<int>("ssm.state_size");
  hp.ssm_n_k_heads = meta.required<int>("ssm.group_count");
  hp.ssm_n_v_heads = meta.required<int>("ssm.time_step_rank");
  meta.positive("ssm.conv_kernel", hp.ssm_conv_kernel);
  meta.positive("ssm.state_size", hp.ssm_d_state);
  meta.positive("ssm.group_count", hp.ssm_n_k_heads);
  meta.positive("ssm.time_step_rank", hp.ssm_n_v_heads);
  if (hp.ssm_n_v_heads % hp.ssm_n_k_heads != 0)
    meta.bad("ssm.time_step_rank", fmt::format("a multiple of ssm.group_count ({})", hp.ssm_n_k_heads),
             std::to_string(hp.ssm_n_v_heads));
  // The value head dim is inner_size / time_step_rank (llama.cpp's converter writes inner_size =
  // nv·dv and state_size = dk); absent, dv = dk.
  const int64_t inner = meta.optional<int64_t>("ssm.inner_size", hp.ssm_value_dim());
  if (inner <= 0 || inner % hp.ssm_n_v_heads != 0)
    meta.bad("ssm.inner_size",
             fmt::format("a positive multiple of ssm.time_step_rank ({})", hp.ssm_n_v_heads),
             std::to_string(inner));
  hp.ssm_d_value = int(inner / hp.ssm_n_v_heads);
}

// Hybrid layer pattern: an explicit per-layer recurrent flag array wins over the interval.
void load_hybrid_pattern(const MetaReader& meta, HParams& hp, LayerKind attention_kind) {
  hp.layer_kinds.assign(hp.n_layer, LayerKind::GatedDeltaNet);
  if (meta.has("attention.recurrent_layers")) {
    const std::vector<int64_t> recurrent = meta.flags("attention.recurrent_layers");
    if (recurrent.size() < size_t(hp.n_layer))
      meta.bad("attention.recurrent_layers", fmt::format("{} entries", hp.n_layer),
               std::to_string(recurrent.size()));
    for (int i = 0; i < hp.n_layer; ++i)
      if (!recurrent[i]) hp.layer_kinds[i] = attention_kind;
    return;
  }
  const int interval = meta.optional<int>("full_attention_interval", 4);
  meta.positive("full_attention_interval", interval);
  for (int i = 0; i < hp.n_layer; ++i)
    if ((i + 1) % interval == 0) hp.layer_kinds[i] = attention_kind;
}

std::vector<uint64_t> to_u64(const std::vector<int64_t>& values) {
  return std::vector<uint64_t>(values.begin(), values.end());
}

void load_qwen4exp_extras(const MetaReader& meta, HParams& hp) {
  hp.hc_count = meta.required<int>("hyper_connection.count");
  hp.hc_low_rank = meta.required<int>("hyper_connection.low_rank");
  if (hp.hc_count < 2) meta.bad("hyper_connection.count", ">= 2", std::to_string(hp.hc_count));
  meta.positive("hyper_connection.low_rank", hp.hc_low_rank);

  hp.indexer_n_head = meta.required<int>("attention.indexer.head_count");
  hp.indexer_head_dim = meta.required<int>("attention.indexer.key_length");
  hp.indexer_top_k = meta.required<int>("attention.indexer.top_k");
  meta.positive("attention.indexer.head_count", hp.indexer_n_head);
  meta.positive("attention.indexer.top_k", hp.indexer_top_k);
  if (hp.indexer_head_dim < hp.n_rot)
    meta.bad("attention.indexer.key_length", fmt::format(">= rope.dimension_count ({})", hp.n_rot),
             std::to_string(hp.indexer_head_dim));
  for (int64_t ratio : meta.ints("attention.compress_ratios")) hp.compress_ratios.push_back(int(ratio));
  if (hp.compress_ratios.size() < size_t(hp.n_layer + hp.n_nextn))
    meta.bad("attention.compress_ratios", fmt::format("{} entries", hp.n_layer + hp.n_nextn),
             std::to_string(hp.compress_ratios.size()));
  // Ratio 0 means dense attention, as llama.cpp reads it (src/models/qwen4exp.cpp: "no ratio
  // means dense"): its converter writes 0 on GDN blocks, on the MTP blocks, and on QSA blocks
  // whose config.json layer type is not "full_attention" (transformers 5.17 checkpoints say
  // "qwen_sparse_attention"). A QSA block with ratio 0 runs gated attention over every visible
  // token, its indexer tensors loaded but unused. The MTP block runs as QSA with the trunk's
  // ratio (vLLM's behaviour), see Qwen4Exp::mtp_compress_ratio.
  for (int i = 0; i < hp.n_layer + hp.n_nextn; ++i) {
    const int ratio = hp.compress_ratios[i];
    if (ratio < 0 || (ratio > 0 && hp.indexer_top_k % ratio != 0))
      meta.bad("attention.compress_ratios",
               fmt::format("0 (dense) or a positive divisor of indexer.top_k ({}) at block {}",
                           hp.indexer_top_k, i),
               std::to_string(ratio));
  }

  if (!meta.has("ple.layers")) return;
  for (int64_t layer : meta.ints("ple.layers")) hp.ple_layers.push_back(int(layer));
  if (hp.ple_layers.size() != 1)
    meta.bad("ple.layers", "exactly one layer", std::to_string(hp.ple_layers.size()) + " layers");
  if (hp.ple_layers[0] < 0 || hp.ple_layers[0] >= hp.n_layer ||
      hp.layer_kinds[hp.ple_layers[0]] != LayerKind::GatedDeltaNet)
    meta.bad("ple.layers", "the index of a Gated DeltaNet layer", std::to_string(hp.ple_layers[0]));
  hp.ple_ngram_size = meta.required<int>("ple.ngram_size");
  hp.ple_heads_per_ngram = meta.required<int>("ple.heads_per_ngram");
  hp.ple_conv_kernel = meta.required<int>("ple.conv_kernel");
  hp.ple_row_width = meta.required<int64_t>("embedding_length_per_layer_input");
  hp.ple_eos_token = meta.required<int64_t>("ple.eos_token_id");
  if (hp.ple_ngram_size != 3) meta.bad("ple.ngram_size", "3", std::to_string(hp.ple_ngram_size));
  meta.positive("ple.heads_per_ngram", hp.ple_heads_per_ngram);
  meta.positive("ple.conv_kernel", hp.ple_conv_kernel);
  hp.ple_head_vocab_sizes = to_u64(meta.ints("ple.head_vocab_sizes"));
  hp.ple_head_offsets = to_u64(meta.ints("ple.head_offsets"));
  hp.ple_multipliers = to_u64(meta.ints("ple.layer_multipliers"));
  const size_t n_heads = size_t(hp.ple_n_heads());
  if (hp.ple_head_vocab_sizes.size() != n_heads)
    meta.bad("ple.head_vocab_sizes", fmt::format("{} entries", n_heads),
             std::to_string(hp.ple_head_vocab_sizes.size()));
  if (hp.ple_head_offsets.size() != n_heads)
    meta.bad("ple.head_offsets", fmt::format("{} entries", n_heads),
             std::to_string(hp.ple_head_offsets.size()));
  if (hp.ple_multipliers.size() != size_t(hp.ple_ngram_size))
    meta.bad("ple.layer_multipliers", fmt::format("{} entries", hp.ple_ngram_size),
             std::to_string(hp.ple_multipliers.size()));
  for (uint64_t q : hp.ple_head_vocab_sizes)
    if (q == 0) meta.bad("ple.head_vocab_sizes", "non-zero sizes", "0");
  if (hp.ple_row_width * hp.ple_n_heads() != hp.n_embd)
    meta.bad("embedding_length_per_layer_input",
             fmt::format("embedding_length / {} heads = {}", hp.ple_n_heads(),
                         hp.n_embd / hp.ple_n_heads()),
             std::to_string(hp.ple_row_width));
}

}  // namespace

const char* arch_name(Arch arch) {
  switch (arch) {
    case Arch::Qwen4Exp: return "qwen4exp";
    case Arch::Qwen3Next: return "qwen3next";
    case Arch::Qwen3Moe: return "qwen3moe";
  }
  return "?";
}

HParams load_hparams(const GgufFile& file) {
  HParams hp;
  hp.arch = parse_arch(file);
  const MetaReader meta(file, std::string(arch_name(hp.arch)) + ".");
  hp.n_embd = meta.required<int64_t>("embedding_length");
  meta.positive("embedding_length", hp.n_embd);
  const int block_count = meta.required<int>("block_count");
  hp.n_nextn = meta.optional<int>("nextn_predict_layers", 0);
  if (hp.n_nextn < 0 || hp.n_nextn >= block_count)
    meta.bad("nextn_predict_layers", fmt::format("in [0, block_count={})", block_count),
             std::to_string(hp.n_nextn));
  hp.n_layer = block_count - hp.n_nextn;
  hp.n_ctx_train = meta.optional<int64_t>("context_length", 4096);
  hp.rms_eps = meta.optional<float>("attention.layer_norm_rms_epsilon", 1e-6f);
  load_attention(meta, hp);
  load_moe(meta, hp);

  switch (hp.arch) {
    case Arch::Qwen3Moe:
      hp.layer_kinds.assign(hp.n_layer, LayerKind::Attention);
      break;
    case Arch::Qwen3Next:
      load_ssm(meta, hp);
      hp.ssm_v_heads_tiled = false;
      hp.ssm_gate_sigmoid = false;
      load_hybrid_pattern(meta, hp, LayerKind::GatedAttention);
      break;
    case Arch::Qwen4Exp:
      load_ssm(meta, hp);
      hp.ssm_v_heads_tiled = true;
      hp.ssm_gate_sigmoid = true;
      load_hybrid_pattern(meta, hp, LayerKind::SparseAttention);
      load_qwen4exp_extras(meta, hp);
      break;
  }
  return hp;
}

void write_hparams(GgufWriter& writer, const HParams& hp) {
  const std::string p = std::string(arch_name(hp.arch)) + ".";
  writer.add_string("general.architecture", arch_name(hp.arch));
  writer.add_u32(p + "context_length", uint32_t(hp.n_ctx_train));
  writer.add_u32(p + "embedding_length", uint32_t(hp.n_embd));
  writer.add_u32(p + "block_count", uint32_t(hp.n_layer + hp.n_nextn));
  writer.add_u32(p + "attention.head_count", uint32_t(hp.n_head));
  writer.add_u32(p + "attention.head_count_kv", uint32_t(hp.n_head_kv));
  writer.add_u32(p + "attention.key_length", uint32_t(hp.head_dim));
  writer.add_u32(p + "attention.value_length", uint32_t(hp.head_dim));
  writer.add_f32(p + "attention.layer_norm_rms_epsilon", hp.rms_eps);
  writer.add_f32(p + "rope.freq_base", hp.rope_theta);
  writer.add_u32(p + "rope.dimension_count", uint32_t(hp.n_rot));
  writer.add_u32(p + "expert_count", uint32_t(hp.n_expert));
  writer.add_u32(p + "expert_used_count", uint32_t(hp.n_expert_used));
  writer.add_u32(p + "expert_feed_forward_length", uint32_t(hp.n_ff_exp));
  if (hp.n_ff_shexp > 0)
    writer.add_u32(p + "expert_shared_feed_forward_length", uint32_t(hp.n_ff_shexp));
  if (hp.n_nextn > 0) writer.add_u32(p + "nextn_predict_layers", uint32_t(hp.n_nextn));
  if (hp.arch == Arch::Qwen3Moe) return;

  writer.add_u32(p + "ssm.conv_kernel", uint32_t(hp.ssm_conv_kernel));
  writer.add_u32(p + "ssm.state_size", uint32_t(hp.ssm_d_state));
  writer.add_u32(p + "ssm.group_count", uint32_t(hp.ssm_n_k_heads));
  writer.add_u32(p + "ssm.time_step_rank", uint32_t(hp.ssm_n_v_heads));
  writer.add_u32(p + "ssm.inner_size", uint32_t(hp.ssm_value_dim()));
  // A regular "every 4th layer is attention" pattern is written as the interval, anything else
  // as the explicit per-layer flags (which load_hparams prefers).
  int interval = 0;
  for (int i = 0; i < hp.n_layer && interval == 0; ++i)
    if (hp.layer_kinds[size_t(i)] != LayerKind::GatedDeltaNet) interval = i + 1;
  bool regular = interval > 0;
  for (int i = 0; i < hp.n_layer && regular; ++i)
    regular = (hp.layer_kinds[size_t(i)] != LayerKind::GatedDeltaNet) == ((i + 1) % interval == 0);
  if (regular) {
    writer.add_u32(p + "full_attention_interval", uint32_t(interval));
  } else {
    std::vector<int64_t> recurrent;
    for (LayerKind kind : hp.layer_kinds) recurrent.push_back(kind == LayerKind::GatedDeltaNet);
    recurrent.resize(size_t(hp.n_layer + hp.n_nextn), 0);  // MTP blocks attend (llama.cpp reads all)
    writer.add_array(p + "attention.recurrent_layers", GgufValueType::BOOL, recurrent);
  }
  if (hp.arch == Arch::Qwen3Next) return;

  // mRoPE sections (t, h, w, 0) as the converter writes them: strata treats text positions as plain
  // RoPE (all three sections get the same position), but llama.cpp's loader requires the key.
  const int32_t half = hp.n_rot / 2, third = (half + 2) / 3;
  const std::vector<int32_t> sections = {third, third, half - 2 * third, 0};
  writer.add_array_i32(p + "rope.dimension_sections", sections);
  writer.add_u32(p + "hyper_connection.count", uint32_t(hp.hc_count));
  writer.add_u32(p + "hyper_connection.low_rank", uint32_t(hp.hc_low_rank));
  writer.add_u32(p + "attention.indexer.head_count", uint32_t(hp.indexer_n_head));
  writer.add_u32(p + "attention.indexer.key_length", uint32_t(hp.indexer_head_dim));
  writer.add_u32(p + "attention.indexer.top_k", uint32_t(hp.indexer_top_k));
  writer.add_array_i32(p + "attention.compress_ratios", hp.compress_ratios);
  if (!hp.has_ple()) return;
  writer.add_array_i32(p + "ple.layers", hp.ple_layers);
  writer.add_u32(p + "ple.ngram_size", uint32_t(hp.ple_ngram_size));
  writer.add_u32(p + "ple.heads_per_ngram", uint32_t(hp.ple_heads_per_ngram));
  writer.add_u32(p + "ple.conv_kernel", uint32_t(hp.ple_conv_kernel));
  writer.add_u32(p + "embedding_length_per_layer_input", uint32_t(hp.ple_row_width));
  writer.add_u32(p + "ple.eos_token_id", uint32_t(hp.ple_eos_token));
  auto u64_array = [&](const std::string& key, const std::vector<uint64_t>& values) {
    const std::vector<int64_t> bits(values.begin(), values.end());
    writer.add_array(p + key, GgufValueType::U64, bits);
  };
  u64_array("ple.head_vocab_sizes", hp.ple_head_vocab_sizes);
  u64_array("ple.head_offsets", hp.ple_head_offsets);
  u64_array("ple.layer_multipliers", hp.ple_multipliers);
}

ForwardDims forward_dims(const HParams& hp) {
  ForwardDims dims;
  dims.n_layer = hp.n_layer;
  dims.layer_kinds = hp.layer_kinds;
  dims.compress_ratios = hp.compress_ratios;
  dims.ple_layer = hp.ple_layer();

  AttentionDims& a = dims.attention;
  a.n_head = hp.n_head;
  a.n_head_kv = hp.n_head_kv;
  a.head_dim = hp.head_dim;
  a.n_rot = hp.n_rot;
  a.rope_theta = hp.rope_theta;
  a.rms_eps = hp.rms_eps;
  a.indexer_n_head = hp.indexer_n_head;
  a.indexer_head_dim = hp.indexer_head_dim;
  a.indexer_top_k = hp.indexer_top_k;

  DeltaNetDims& d = dims.deltanet;
  d.conv_kernel = hp.ssm_conv_kernel;
  d.n_k_heads = hp.ssm_n_k_heads;
  d.n_v_heads = hp.ssm_n_v_heads;
  d.head_k_dim = hp.ssm_head_k_dim();
  d.head_v_dim = hp.ssm_head_v_dim();
  d.v_heads_tiled = hp.ssm_v_heads_tiled;
  d.gate_sigmoid = hp.ssm_gate_sigmoid;
  d.rms_eps = hp.rms_eps;

  MoeDims& m = dims.moe;
  m.n_embd = hp.n_embd;
  m.n_expert = hp.n_expert;
  m.n_expert_used = hp.n_expert_used;

  PleDims& p = dims.ple;
  p.n_embd = hp.n_embd;
  p.n_streams = hp.hc_count;
  p.ngram_size = hp.ple_ngram_size;
  p.heads_per_ngram = hp.ple_heads_per_ngram;
  p.conv_kernel = hp.ple_conv_kernel;
  p.row_width = hp.ple_row_width;
  p.head_vocab_sizes = hp.ple_head_vocab_sizes;
  p.head_offsets = hp.ple_head_offsets;
  p.multipliers = hp.ple_multipliers;
  p.eos_token = hp.ple_eos_token;
  p.rms_eps = hp.rms_eps;
  return dims;
}

}  // namespace strata
