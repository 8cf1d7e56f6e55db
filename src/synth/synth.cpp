#include "synth/synth.h"

#include <cmath>
#include <cstring>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>

#include "convert/hf_config.h"
#include "convert/tokenizer_hf.h"
#include "gguf/gguf_writer.h"
#include "model/tensor_specs.h"
#include "quant/quant.h"
#include "synth/block_pool.h"
#include "synth/chunk_pipeline.h"
#include "synth/routing_shape.h"
#include "synth/synth_random.h"
#include "util/error.h"

namespace strata {
namespace {

using synth_detail::BlockPool;
using synth_detail::kGridCodeDraws;
using synth_detail::name_hash;
using synth_detail::Random;
using synth_detail::random_iq2xs_block;
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

// How a tensor's floats are drawn, one normal() each: the distribution of its role.
enum class ValueDraw {
  Norm,    // 1 + N(0, 0.1²)
  Decay,   // ssm_a: −exp(N(0, 0.5²))
  Vector,  // taps, biases: N(0, 0.5²)
  Unit,    // PLE table: N(0, 1)
  Matrix,  // N(0, scale²)
};

ValueDraw value_draw(const TensorSpec& spec) {
  const bool is_ssm_a =
      spec.name.size() >= 5 && spec.name.compare(spec.name.size() - 5, 5, "ssm_a") == 0;
  switch (spec.role) {
    case TensorRole::Norm:
      return ValueDraw::Norm;
    case TensorRole::Vector:
      return is_ssm_a ? ValueDraw::Decay : ValueDraw::Vector;
    case TensorRole::PleTable:
      return ValueDraw::Unit;
    default:
      return ValueDraw::Matrix;
  }
}

// One row of floats; the loop per kind keeps the per-value work to the draw itself (the
// matrices' loop is most of synth's time with the default codes).
void draw_row(ValueDraw draw, float matrix_scale, Random& rng, std::span<float> values) {
  switch (draw) {
    case ValueDraw::Norm:
      for (float& v : values) v = 1.0f + 0.1f * rng.normal();
      break;
    case ValueDraw::Decay:
      for (float& v : values) v = -std::exp(0.5f * rng.normal());
      break;
    case ValueDraw::Vector:
      for (float& v : values) v = 0.5f * rng.normal();
      break;
    case ValueDraw::Unit:
      for (float& v : values) v = rng.normal();
      break;
    case ValueDraw::Matrix:
      for (float& v : values) v = matrix_scale * rng.normal();
      break;
  }
}

// Where a tensor's rows come from.
enum class RowSource {
  Floats,     // random floats (draw_row), shaped, then quantize_row
  GridCodes,  // IQ2_XS random grid codes (random_iq2xs_block); shaped rows can only be Zero
  Pool,       // blocks drawn from a BlockPool; shaped rows can only be Zero
};

// One tensor's recipe. Row r's values start at a fixed position of the tensor's stream
// (first_draw), which is what makes any row block computable on its own.
struct TensorPlan {
  const TensorSpec* spec = nullptr;
  GgmlType type = GgmlType::F32;
  const TensorShaping* shaping = nullptr;  // may be null
  RowSource source = RowSource::Floats;
  const BlockPool* pool = nullptr;  // RowSource::Pool only
  int64_t row = 0, n_rows = 0;
  size_t row_bytes = 0;
  ValueDraw draw = ValueDraw::Matrix;
  float scale = 1.0f;  // matrix_scale of draw_row
  uint64_t seed = 0;
};

// A block of consecutive rows of one tensor, produced by one worker.
struct Job {
  size_t tensor = 0;
  int64_t first_row = 0, n_rows = 0;
  uint64_t first_draw = 0;  // stream position of first_row
};

// About 4 MiB per job: large enough that the per-job overhead vanishes, small enough that
// 2·threads jobs in flight stay a few hundred MiB at 16 threads.
constexpr size_t kJobBytes = size_t(4) << 20;

// Appends the jobs of one tensor. Streams: a float row takes 4·row values (normal() draws four),
// a pool row draws_per_row values; a grid-code row 10 per block but none when the shaping zeroes
// it (as earlier single-threaded builds drew them, which keeps those files byte-identical), so
// for shaped grid-code tensors the rows before each job are counted here.
void plan_jobs(const TensorPlan& t, size_t index, size_t job_bytes, std::vector<Job>& jobs) {
  const int64_t rows_per_job =
      std::max<int64_t>(1, int64_t(job_bytes / std::max<size_t>(t.row_bytes, 1)));
  const uint64_t grid_draws_per_row = kGridCodeDraws * uint64_t(t.row / 256);
  uint64_t grid_draw = 0;
  std::vector<float> scratch;
  if (t.source == RowSource::GridCodes && t.shaping) scratch.resize(size_t(t.row));
  for (int64_t r0 = 0; r0 < t.n_rows; r0 += rows_per_job) {
    Job job{index, r0, std::min(rows_per_job, t.n_rows - r0), 0};
    switch (t.source) {
      case RowSource::Floats:
        job.first_draw = 4 * uint64_t(t.row) * uint64_t(r0);
        break;
      case RowSource::Pool:
        job.first_draw = BlockPool::draws_per_row(t.type, t.row) * uint64_t(r0);
        break;
      case RowSource::GridCodes:
        job.first_draw = grid_draw;
        for (int64_t r = r0; r < r0 + job.n_rows; ++r)
          if (!t.shaping || t.shaping->shape_row(r, scratch) != TensorShaping::Row::Zero)
            grid_draw += grid_draws_per_row;
        break;
    }
    jobs.push_back(job);
  }
}

// Fills `out` with the job's rows. Reads only immutable state: runs on any worker thread.
void produce_job(const TensorPlan& t, const Job& job, std::vector<uint8_t>& out) {
  out.resize(size_t(job.n_rows) * t.row_bytes);
  Random rng(t.seed);
  rng.skip(job.first_draw);
  std::vector<float> values(t.source == RowSource::Floats || t.shaping ? size_t(t.row) : 0);
  for (int64_t r = 0; r < job.n_rows; ++r) {
    const int64_t row = job.first_row + r;
    uint8_t* dst = out.data() + size_t(r) * t.row_bytes;
    switch (t.source) {
      case RowSource::GridCodes:
        if (t.shaping && t.shaping->shape_row(row, values) == TensorShaping::Row::Zero) {
          std::memset(dst, 0, t.row_bytes);
          break;
        }
        for (int64_t b = 0; b < t.row / 256; ++b) random_iq2xs_block(rng, dst + b * 74);
        break;
      case RowSource::Pool:
        if (t.shaping && t.shaping->shape_row(row, values) == TensorShaping::Row::Zero) {
          std::memset(dst, 0, t.row_bytes);
          rng.skip(BlockPool::draws_per_row(t.type, t.row));
          break;
        }
        t.pool->fill_row(rng, dst, t.row);
        break;
      case RowSource::Floats:
        draw_row(t.draw, t.scale, rng, values);
        if (t.shaping) t.shaping->shape_row(row, values);
        quant::quantize_row(t.type, values.data(), dst, t.row);
        break;
    }
  }
}

// Where the rows of a tensor of `type` come from under `codes`; `shaped` when some row needs
// exact values (those are always quantized from floats).
RowSource row_source(SynthCodes codes, GgmlType type, bool shaped) {
  const bool block_type = type_traits(type).block_elems > 1;
  if (!block_type || shaped) return RowSource::Floats;
  switch (codes) {
    case SynthCodes::Auto:
      if (type == GgmlType::IQ2_XS) return RowSource::GridCodes;
      return type == GgmlType::IQ4_NL ? RowSource::Pool : RowSource::Floats;
    case SynthCodes::Pool:
      return type == GgmlType::IQ2_XS ? RowSource::GridCodes : RowSource::Pool;
    case SynthCodes::Quantize:
      return RowSource::Floats;
  }
  return RowSource::Floats;
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

void resize_synth_shape(HParams& hp, int n_layer, int n_expert) {
  if (n_layer > 0) {
    hp.n_layer = n_layer;
    hp.layer_kinds.resize(size_t(hp.n_layer), hp.layer_kinds.back());
    if (!hp.compress_ratios.empty()) hp.compress_ratios.resize(size_t(hp.n_layer), 0);
    for (int i = 0; i < hp.n_layer && hp.arch != Arch::Qwen3Moe; ++i) {
      const bool attention = (i + 1) % 4 == 0;
      hp.layer_kinds[size_t(i)] = attention ? (hp.arch == Arch::Qwen4Exp ? LayerKind::SparseAttention
                                                                         : LayerKind::GatedAttention)
                                            : LayerKind::GatedDeltaNet;
      if (!hp.compress_ratios.empty()) hp.compress_ratios[size_t(i)] = attention ? 4 : 0;
    }
  }
  if (n_expert > 0) {
    hp.n_expert = n_expert;
    if (hp.n_expert_used > hp.n_expert) hp.n_expert_used = hp.n_expert;
  }
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
  std::vector<std::unique_ptr<TensorShaping>> shapings;
  std::vector<TensorPlan> plans;
  uint64_t total_bytes = 0;
  for (const TensorSpec& spec : specs) {
    if (!spec.synthesized) continue;  // refused layouts, and optional tensors synth leaves out
    shapings.push_back(shaper ? shaper->plan(spec) : nullptr);
    TensorPlan t;
    t.spec = &spec;
    t.shaping = shapings.back().get();
    t.type = tensor_type(options, spec);
    const bool shaped = t.shaping && t.shaping->has_shaped_rows();
    // Shaped rows need exact values, which IQ2_XS codes (random or quantized without an
    // importance matrix) do not give.
    if (t.type == GgmlType::IQ2_XS && shaped) t.type = storable_type(GgmlType::Q8_0, spec.ne[0]);
    t.source = row_source(options.codes, t.type, shaped);
    t.row = spec.ne[0];
    t.n_rows = spec.n_elements() / t.row;
    t.row_bytes = row_bytes(t.type, t.row);
    // Weight scale: 1/sqrt(n_in) keeps activations O(1) through random layers.
    t.scale = 1.0f / std::sqrt(float(t.row));
    t.draw = value_draw(spec);
    t.seed = options.seed ^ name_hash(spec.name);
    total_bytes += writer.add_tensor(spec.name, t.type, spec.ne).n_bytes;
    plans.push_back(t);
  }
  const int n_threads = options.n_threads > 0
                            ? options.n_threads
                            : int(std::max(1u, std::thread::hardware_concurrency()));
  // One pool per (type, value scale), sized to the blocks drawn from it; PLE table rows are drawn
  // at scale 1.
  std::map<std::pair<GgmlType, float>, uint64_t> pool_blocks;
  for (TensorPlan& t : plans) {
    if (t.source != RowSource::Pool) continue;
    if (t.draw == ValueDraw::Unit) t.scale = 1.0f;
    pool_blocks[{t.type, t.scale}] +=
        uint64_t(t.n_rows) * uint64_t(t.row / type_traits(t.type).block_elems);
  }
  std::map<std::pair<GgmlType, float>, std::unique_ptr<BlockPool>> pools;
  for (const auto& [key, blocks] : pool_blocks)
    pools[key] = std::make_unique<BlockPool>(key.first, key.second, options.seed,
                                             BlockPool::size_for(blocks), n_threads);
  for (TensorPlan& t : plans)
    if (t.source == RowSource::Pool) t.pool = pools.at({t.type, t.scale}).get();
  std::vector<Job> jobs;
  for (size_t i = 0; i < plans.size(); ++i)
    plan_jobs(plans[i], i, options.job_bytes > 0 ? options.job_bytes : kJobBytes, jobs);
  ChunkPipeline pipeline(jobs.size(), n_threads, [&](size_t j, std::vector<uint8_t>& out) {
    produce_job(plans[jobs[j].tensor], jobs[j], out);
  });
  uint64_t done = 0;
  size_t index = 0, next_job = 0;
  writer.write_file(path, [&](const GgufTensorDecl&, GgufTensorSink& sink) {
    for (; next_job < jobs.size() && jobs[next_job].tensor == index; ++next_job) {
      const std::span<const uint8_t> bytes = pipeline.next();
      sink.write(bytes);
      done += bytes.size();
      if (progress) progress(done, total_bytes);
    }
    ++index;
  });
}

}  // namespace strata
