// The conversion plan: what an architecture mapping produces, and the shared helpers the three
// mappings (arch_qwen3moe.cpp, arch_qwen3next.cpp, arch_qwen4exp.cpp) build it with. Internal to
// src/convert; the public entry point is convert.h.
//
// A mapping writes its metadata straight into the GgufWriter and appends PlannedTensors, each with a
// producer that streams the tensor's f32 values as whole rows (so an expert stack or the 51 B-weight
// PLE table never has to be in memory at once). Every HF tensor a mapping reads goes through
// `use`, which checks its shape and records it; after planning, `unused_tensors` lists whatever the
// checkpoint holds that no mapping consumed, and conversion refuses to silently drop it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "convert/checkpoint.h"
#include "convert/hf_config.h"
#include "gguf/gguf_writer.h"

namespace strata::convert {

// Receives a multiple of ne0 floats: whole rows of the tensor being produced, in file order.
using RowSink = std::function<void(std::span<const float> rows)>;
using RowProducer = std::function<void(const RowSink& sink)>;
using Transform = std::function<void(std::vector<float>& values)>;

struct PlannedTensor {
  std::string name;        // GGUF name, e.g. "blk.3.ffn_up_exps.weight"
  std::vector<int64_t> ne;  // ggml order, ne0 first
  RowProducer produce;
};

class ConversionContext {
 public:
  ConversionContext(const HfCheckpoint& checkpoint, const HfConfig& config, GgufWriter& writer,
                    std::string arch);

  const HfCheckpoint& checkpoint;
  const HfConfig& config;
  GgufWriter& writer;
  const std::string arch;  // GGUF architecture name, the metadata key prefix

  std::string key(std::string_view suffix) const { return arch + "." + std::string(suffix); }
  // Checks the HF tensor's shape (PyTorch order) and marks it consumed.
  const SafetensorsTensor& use(const std::string& hf_name, const std::vector<int64_t>& shape);
  // Marks a tensor consumed without producing output (e.g. an MTP head left out on request).
  void skip(const std::string& hf_name) { used_.insert(hf_name); }
  bool has(const std::string& hf_name) const { return checkpoint.has(hf_name); }
  // Checkpoint tensors not consumed by the plan, sorted.
  std::vector<std::string> unused_tensors() const;

  void add(std::string gguf_name, std::vector<int64_t> ne, RowProducer produce);
  // An HF matrix [out, in] → ggml {in, out}, optionally transformed (row-major [out, in] values).
  void add_matrix(std::string gguf_name, const std::string& hf_name, int64_t out, int64_t in,
                  Transform transform = nullptr);
  // An HF vector [n] → {n}; `plus_one` folds a (1+w) norm.
  void add_vector(std::string gguf_name, const std::string& hf_name, int64_t n, bool plus_one = false,
                  Transform transform = nullptr);
  // A whole tensor of any shape, emitted as {ne...} after `transform`.
  void add_whole(std::string gguf_name, const std::string& hf_name,
                 const std::vector<int64_t>& hf_shape, std::vector<int64_t> ne,
                 Transform transform = nullptr);

  std::vector<PlannedTensor>& tensors() { return tensors_; }

 private:
  std::vector<PlannedTensor> tensors_;
  std::set<std::string> used_;
};

// "blk.3.attn_q.weight"
std::string block_name(int64_t block, std::string_view suffix);

// Sizes of a routed-expert block: E experts of intermediate size I on hidden size H.
struct MoeShape {
  int64_t n_experts = 0;
  int64_t expert_ff = 0;
  int64_t hidden = 0;
  std::optional<int64_t> shared_ff;  // shared expert (+ its sigmoid gate) when present
};

// Router, routed experts (per-expert `experts.<e>.{gate,up,down}_proj.weight` or fused
// `experts.gate_up_proj` [E, 2I, H] + `experts.down_proj` [E, H, I], with or without ".weight"),
// stacked into ffn_{gate,up,down}_exps, and the shared expert. `mlp` is the HF prefix ending in
// "mlp.".
void add_moe(ConversionContext& ctx, int64_t block, const std::string& mlp, const MoeShape& shape);

// Gated or plain attention projections + per-head q/k norms. `q_rows` is the q_proj output size
// (2·heads·head_dim for the gated Qwen-Next/qwen4exp attention). `norm_plus_one` folds (1+w).
void add_attention(ConversionContext& ctx, int64_t block, const std::string& attn, int64_t hidden,
                   int64_t q_rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                   bool norm_plus_one);

// The keys llama.cpp's TextModel writes for every arch: block/context/embedding/ff lengths, head
// counts, rope base, rms eps, expert counts, key/value length. `rope_sections` (qwen4exp) go
// between the head counts and the rope base, as in llama.cpp's files.
void add_common_metadata(ConversionContext& ctx, int64_t block_count,
                         const std::vector<int32_t>& rope_sections = {});

// "model." for *ForCausalLM checkpoints, "model.language_model." for the multimodal ones.
std::string text_model_prefix(const HfCheckpoint& checkpoint);

// The layer pattern: true where layer i is linear attention (GDN). From `layer_types` when present
// (anything but "linear_attention" is attention), else from full_attention_interval (default 4).
std::vector<bool> linear_layer_pattern(const HfConfig& config, int64_t n_layers);
// The interval implied by the pattern (every interval-th layer attention), or nullopt.
std::optional<int64_t> full_attention_interval(const std::vector<bool>& is_linear);

}  // namespace strata::convert
