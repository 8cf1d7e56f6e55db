// Model hyper-parameters read from GGUF metadata with llama.cpp's key names.
//
// One struct covers the three architectures; fields an architecture does not use stay at their
// defaults. `load_hparams` validates what the forward relies on (divisibility, ranges, array
// lengths) and throws strata::Error naming the file and key on any violation, so the forward can
// trust every field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/dims.h"

namespace strata {

class GgufFile;

enum class Arch { Qwen4Exp, Qwen3Next, Qwen3Moe };
const char* arch_name(Arch arch);  // the GGUF spelling: "qwen4exp", ...

struct HParams {
  Arch arch = Arch::Qwen3Moe;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;       // H
  int n_layer = 0;          // trunk layers (block_count minus nextn layers)
  int n_nextn = 0;          // MTP layers stored after the trunk (blk.<n_layer>...)
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-6f;
  std::vector<LayerKind> layer_kinds;  // size n_layer (layers/dims.h)

  // Attention.
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_rot = 0;            // rotary dims (partial NeoX); rest pass through
  float rope_theta = 10000.0f;

  // MoE.
  int n_expert = 0;
  int n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_ff_shexp = 0;   // 0 = no shared expert

  // Gated DeltaNet.
  int ssm_conv_kernel = 0;
  int ssm_d_state = 0;      // dk: key head dim, also the rows of each V head's state
  int ssm_d_value = 0;      // dv: value head dim (ssm.inner_size / time_step_rank); 0 = dk
  int ssm_n_k_heads = 0;    // nk (group_count)
  int ssm_n_v_heads = 0;    // nv (time_step_rank)
  bool ssm_v_heads_tiled = false;  // qwen4exp GGUF: V head p uses K head p % nk; else p / (nv/nk)
  bool ssm_gate_sigmoid = false;   // qwen4exp: sigmoid output gate; qwen3next: silu

  // Hyper-connections (qwen4exp).
  int hc_count = 1;         // S streams; 1 = plain residual
  int hc_low_rank = 0;

  // QSA indexer (qwen4exp).
  int indexer_n_head = 0;
  int indexer_head_dim = 0;
  int indexer_top_k = 0;    // token budget
  std::vector<int> compress_ratios;  // per block (trunk + nextn)

  // PLE n-gram embedding (qwen4exp).
  std::vector<int> ple_layers;        // 0-based
  int ple_ngram_size = 0;
  int ple_heads_per_ngram = 0;
  int ple_conv_kernel = 0;
  int64_t ple_row_width = 0;          // embedding_length_per_layer_input
  std::vector<uint64_t> ple_head_vocab_sizes;
  std::vector<uint64_t> ple_head_offsets;
  std::vector<uint64_t> ple_multipliers;
  int64_t ple_eos_token = -1;

  int64_t kv_dim() const { return int64_t(n_head_kv) * head_dim; }
  int ple_n_heads() const { return (ple_ngram_size - 1) * ple_heads_per_ngram; }
  bool has_ple() const { return !ple_layers.empty(); }
  // Any Gated DeltaNet layer: a recurrent state that cannot be rewound, and prefill windows whose
  // rounding depends on where they start (decode/state_cache.h).
  bool has_deltanet() const {
    for (const LayerKind kind : layer_kinds)
      if (kind == LayerKind::GatedDeltaNet) return true;
    return false;
  }
  int ple_layer() const { return ple_layers.empty() ? -1 : ple_layers[0]; }
  // dk and dv may differ (transformers accepts linear_key_head_dim != linear_value_head_dim);
  // each V head's recurrent state is [dk][dv].
  int ssm_head_k_dim() const { return ssm_d_state; }
  int ssm_head_v_dim() const { return ssm_d_value > 0 ? ssm_d_value : ssm_d_state; }
  int64_t ssm_key_dim() const { return int64_t(ssm_n_k_heads) * ssm_head_k_dim(); }
  int64_t ssm_value_dim() const { return int64_t(ssm_n_v_heads) * ssm_head_v_dim(); }
  int64_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
};

class GgufWriter;

// Reads and validates the hyper-parameters of `file` (arch from general.architecture).
// n_vocab is not metadata: Model::load takes it from token_embd.
HParams load_hparams(const GgufFile& file);
// Writes general.architecture and the "<arch>." keys load_hparams reads, with llama.cpp's types.
void write_hparams(GgufWriter& writer, const HParams& hp);
// The blocks' dimensions and the layer sequence (layers/dims.h), as layers/ and the backends take
// them: Model keeps the result (Model::dims()); tests build them from hand-made HParams.
ForwardDims forward_dims(const HParams& hp);

}  // namespace strata
