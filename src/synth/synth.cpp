#include "synth/synth.h"

#include <cmath>
#include <cstring>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "convert/hf_config.h"
#include "convert/tokenizer_hf.h"
#include "gguf/gguf_writer.h"
#include "model/tensor_specs.h"
#include "quant/quant.h"
#include "synth/routing_shape.h"
#include "synth/synth_random.h"
#include "util/error.h"
#include "util/fp16.h"

namespace strata {
namespace {

using synth_detail::name_hash;
using synth_detail::Random;
using synth_detail::splitmix64;

bool is_prime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

GgmlType tensor_type(const SynthOptions& options, const TensorSpec& spec) {
  switch (spec.role) {
    case TensorRole::Router:
    case TensorRole::Norm:
    case TensorRole::Vector:
      return GgmlType::F32;
    case TensorRole::Expert:
      return storable_type(options.expert_type, spec.ne[0]);
    case TensorRole::PleTable:
    case TensorRole::Embedding:
    case TensorRole::Output:
    case TensorRole::Matrix:
      return storable_type(options.dense_type, spec.ne[0]);
  }
  return GgmlType::F32;
}

float sample_value(const TensorSpec& spec, Random& rng, float matrix_scale) {
  const bool is_ssm_a = spec.name.size() >= 5 && spec.name.compare(spec.name.size() - 5, 5, "ssm_a") == 0;
  switch (spec.role) {
    case TensorRole::Norm: return 1.0f + 0.1f * rng.normal();
    case TensorRole::Vector: return is_ssm_a ? -std::exp(0.5f * rng.normal()) : 0.5f * rng.normal();
    case TensorRole::PleTable: return rng.normal();
    default: return matrix_scale * rng.normal();
  }
}

// A random but valid IQ2_XS block: small f16 scale, random grid/sign codes and sub-scales.
void random_iq2xs_block(Random& rng, uint8_t* block) {
  const uint16_t d = f32_to_f16(0.002f + 0.004f * rng.uniform());
  std::memcpy(block, &d, 2);
  for (int i = 0; i < 64; i += 8) {
    const uint64_t bits = rng.next();
    std::memcpy(block + 2 + i, &bits, 8);
  }
  const uint64_t scales = rng.next();
  std::memcpy(block + 66, &scales, 8);
}

// Writes one tensor; `shaping` (routing shapes, may be null) rewrites some rows after the draw.
// A random-code IQ2_XS tensor can only take Zero rows from it (an all-zero block: scale 0).
void produce_tensor(const SynthOptions& options, const TensorSpec& spec, GgmlType type,
                    const TensorShaping* shaping, GgufTensorSink& sink,
                    const std::function<void(uint64_t)>& advanced) {
  Random rng(options.seed ^ name_hash(spec.name));
  const int64_t row = spec.ne[0];
  const int64_t n_rows = spec.n_elements() / row;
  const size_t row_size = row_bytes(type, row);
  // Weight scale: 1/sqrt(n_in) keeps activations O(1) through random layers.
  const float matrix_scale = 1.0f / std::sqrt(float(row));
  const int64_t rows_per_chunk = std::max<int64_t>(1, int64_t((8u << 20) / std::max<size_t>(row_size, 1)));
  std::vector<uint8_t> chunk;
  std::vector<float> values(static_cast<size_t>(row));
  for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
    const int64_t n = std::min(rows_per_chunk, n_rows - r0);
    chunk.resize(static_cast<size_t>(n) * row_size);
    for (int64_t r = 0; r < n; ++r) {
      uint8_t* dst = chunk.data() + size_t(r) * row_size;
      if (type == GgmlType::IQ2_XS) {
        if (shaping && shaping->shape_row(r0 + r, values) == TensorShaping::Row::Zero) {
          std::memset(dst, 0, row_size);
          continue;
        }
        for (int64_t b = 0; b < row / 256; ++b) random_iq2xs_block(rng, dst + b * 74);
        continue;
      }
      for (float& v : values) v = sample_value(spec, rng, matrix_scale);
      if (shaping) shaping->shape_row(r0 + r, values);
      quant::quantize_row(type, values.data(), dst, row);
    }
    sink.write(chunk);
    advanced(chunk.size());
  }
}

HParams tiny_base() {
  HParams hp;
  hp.n_vocab = 512;
  hp.n_embd = 64;
  hp.n_layer = 4;
  hp.n_ctx_train = 4096;
  hp.rms_eps = 1e-6f;
  hp.n_head = 4;
  hp.n_head_kv = 2;
  hp.head_dim = 32;
  hp.n_rot = 8;
  hp.rope_theta = 10000000.0f;
  hp.n_expert = 32;
  hp.n_expert_used = 4;
  hp.n_ff_exp = 32;
  hp.n_ff_shexp = 32;
  hp.ssm_conv_kernel = 4;
  hp.ssm_d_state = 16;
  hp.ssm_n_k_heads = 2;
  hp.ssm_n_v_heads = 6;
  return hp;
}

void hybrid_pattern(HParams& hp, LayerKind attention) {
  hp.layer_kinds.assign(static_cast<size_t>(hp.n_layer), LayerKind::GatedDeltaNet);
  for (int i = 3; i < hp.n_layer; i += 4) hp.layer_kinds[size_t(i)] = attention;
}

void qwen4exp_extras(HParams& hp, uint64_t ple_vocab_base) {
  hp.arch = Arch::Qwen4Exp;
  hp.ssm_v_heads_tiled = true;
  hp.ssm_gate_sigmoid = true;
  hybrid_pattern(hp, LayerKind::SparseAttention);
  hp.compress_ratios.assign(static_cast<size_t>(hp.n_layer), 0);
  for (int i = 0; i < hp.n_layer; ++i)
    if (hp.layer_kinds[size_t(i)] == LayerKind::SparseAttention) hp.compress_ratios[size_t(i)] = 4;
  hp.ple_layers = {1};
  hp.ple_ngram_size = 3;
  hp.ple_heads_per_ngram = 8;
  hp.ple_conv_kernel = 4;
  hp.ple_row_width = hp.n_embd / hp.ple_n_heads();
  hp.ple_eos_token = 2;
  fill_ple_constants(hp, ple_vocab_base, 1234);
}

}  // namespace

void fill_ple_constants(HParams& hp, uint64_t vocab_base, uint64_t seed) {
  const int n_heads = hp.ple_n_heads();
  hp.ple_head_vocab_sizes.clear();
  hp.ple_head_offsets.clear();
  uint64_t candidate = vocab_base, offset = 0;
  for (int h = 0; h < n_heads; ++h) {
    while (!is_prime(candidate)) ++candidate;
    hp.ple_head_vocab_sizes.push_back(candidate);
    hp.ple_head_offsets.push_back(offset);
    offset += candidate;
    ++candidate;
  }
  const uint64_t half = (uint64_t(INT64_MAX) / uint64_t(hp.n_vocab)) / 2;
  const uint64_t base = seed;  // + 10007 · (index of this PLE layer) = 0
  hp.ple_multipliers.clear();
  for (int i = 0; i < hp.ple_ngram_size; ++i)
    hp.ple_multipliers.push_back(2 * (splitmix64(base + 0x9E3779B97F4A7C15ull * uint64_t(i + 1)) % half) + 1);
}

std::vector<std::string> synth_shape_names() {
  return {"tiny-qwen4exp", "tiny-qwen3next", "tiny-qwen3moe", "mid-qwen4exp", "qwen3.8-flash-next"};
}

HParams synth_shape(std::string_view name) {
  if (name == "tiny-qwen3moe") {
    HParams hp = tiny_base();
    hp.arch = Arch::Qwen3Moe;
    hp.n_ff_shexp = 0;
    hp.n_rot = hp.head_dim;
    hp.layer_kinds.assign(static_cast<size_t>(hp.n_layer), LayerKind::Attention);
    return hp;
  }
  if (name == "tiny-qwen3next") {
    HParams hp = tiny_base();
    hp.arch = Arch::Qwen3Next;
    hybrid_pattern(hp, LayerKind::GatedAttention);
    return hp;
  }
  if (name == "tiny-qwen4exp") {
    HParams hp = tiny_base();
    hp.hc_count = 4;
    hp.hc_low_rank = 16;
    hp.indexer_n_head = 2;
    hp.indexer_head_dim = 16;
    hp.indexer_top_k = 8;
    qwen4exp_extras(hp, 1000);
    return hp;
  }
  if (name == "mid-qwen4exp" || name == "qwen3.8-flash-next") {
    const bool full = name == "qwen3.8-flash-next";
    HParams hp;
    hp.n_vocab = full ? 248320 : 32768;
    hp.n_embd = full ? 2560 : 1024;
    hp.n_layer = full ? 48 : 12;
    hp.n_ctx_train = 262144;
    hp.n_head = full ? 24 : 8;
    hp.n_head_kv = 2;
    hp.head_dim = 256;
    hp.n_rot = 64;
    hp.rope_theta = 1e7f;
    hp.n_expert = full ? 512 : 128;
    hp.n_expert_used = full ? 10 : 8;
    hp.n_ff_exp = full ? 640 : 512;
    hp.n_ff_shexp = hp.n_ff_exp;
    hp.ssm_conv_kernel = 4;
    hp.ssm_d_state = 128;
    hp.ssm_n_k_heads = full ? 16 : 4;
    hp.ssm_n_v_heads = full ? 48 : 12;
    hp.hc_count = 4;
    hp.hc_low_rank = full ? 320 : 128;
    hp.indexer_n_head = 4;
    hp.indexer_head_dim = 128;
    hp.indexer_top_k = 2048;
    qwen4exp_extras(hp, full ? 200000 : 20000);
    return hp;
  }
  std::string known;
  for (const std::string& n : synth_shape_names()) known += fmt::format("{}{}", known.empty() ? "" : ", ", n);
  fail("synth: unknown shape '{}' (known: {})", name, known);
}

int64_t hf_tokenizer_vocab_size(const std::string& tokenizer_dir) {
  const std::string path = tokenizer_dir + "/tokenizer.json";
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  int64_t max_id = -1;
  if (json.contains("model") && json["model"].contains("vocab"))
    for (const auto& [token, id] : json["model"]["vocab"].items()) max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  if (json.contains("added_tokens"))
    for (const auto& added : json["added_tokens"]) max_id = std::max<int64_t>(max_id, added.value("id", int64_t{-1}));
  if (max_id < 0) fail("{}: field model.vocab: expected a non-empty vocabulary", path);
  return max_id + 1;
}

void write_synthetic_model(const SynthOptions& options, const std::string& path,
                           const SynthProgress& progress) {
  const HParams& hp = options.hparams;
  if (hp.n_vocab <= 0) fail("synth: n_vocab must be positive");
  std::unique_ptr<RoutingShaper> shaper;
  if (options.routing.enabled())
    shaper = std::make_unique<RoutingShaper>(hp, options.routing, options.seed);
  GgufWriter writer;
  write_hparams(writer, hp);
  writer.add_u32("general.quantization_version", 2);
  writer.add_string("general.name", fmt::format("strata synthetic {}", arch_name(hp.arch)));
  if (shaper) {
    writer.add_f32("strata.synth.routing_skew", float(options.routing.skew));
    writer.add_f32("strata.synth.routing_correlation", float(options.routing.correlation));
  }
  if (!options.tokenizer_dir.empty()) {
    const convert::HfConfig config(nlohmann::json::object(), options.tokenizer_dir);
    convert::add_hf_tokenizer(options.tokenizer_dir, config, hp.n_vocab, "qwen2", writer);
  }
  const std::vector<TensorSpec> specs = tensor_specs(hp);
  std::vector<GgmlType> types;
  std::vector<std::unique_ptr<TensorShaping>> shapings;
  uint64_t total_bytes = 0;
  for (const TensorSpec& spec : specs) {
    shapings.push_back(shaper ? shaper->plan(spec) : nullptr);
    GgmlType type = tensor_type(options, spec);
    // Shaped rows need real values: IQ2_XS has no quantizer from floats here.
    if (type == GgmlType::IQ2_XS && shapings.back() && shapings.back()->has_shaped_rows())
      type = storable_type(GgmlType::Q8_0, spec.ne[0]);
    types.push_back(type);
    total_bytes += writer.add_tensor(spec.name, types.back(), spec.ne).n_bytes;
  }
  uint64_t done = 0;
  size_t index = 0;
  writer.write_file(path, [&](const GgufTensorDecl&, GgufTensorSink& sink) {
    const TensorSpec& spec = specs[index];
    produce_tensor(options, spec, types[index], shapings[index].get(), sink, [&](uint64_t bytes) {
      done += bytes;
      if (progress) progress(done, total_bytes);
    });
    ++index;
  });
}

}  // namespace strata
