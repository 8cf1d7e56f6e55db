// Block dimensions — the sizes each shared block of src/layers/ runs with, and the layer sequence
// a backend plans a window by: the blocks' own view of the model's hyper-parameters.
//
// Contract
// - model/ builds them once from HParams (model/hparams.h: forward_dims), right after the
//   hyper-parameters are validated, and keeps them as long as the model (Model::dims()); the
//   blocks, compute/backend.h and the backends take these structs, never HParams, so neither
//   layers/ nor compute/ includes model/ (docs/architecture.md, "Layout").
// - Plain values, no validation here: load_hparams already checked what the blocks rely on
//   (divisibility, ranges, array lengths). A field a model does not use keeps its default.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

// The token mixer (and so the state) of one trunk layer.
enum class LayerKind {
  GatedDeltaNet,    // linear attention (qwen4exp, qwen3next)
  GatedAttention,   // full attention with an output gate (qwen3next)
  SparseAttention,  // QSA: gated attention over indexer-selected 4-token blocks (qwen4exp)
  Attention,        // plain GQA attention (qwen3moe)
};

// Causal attention (layers/attention.h): GQA heads, the per-head q/k RMS norm, partial NeoX RoPE
// and the QSA indexer.
struct AttentionDims {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_rot = 0;  // rotary dims (partial NeoX); the rest pass through
  float rope_theta = 10000.0f;
  float rms_eps = 1e-6f;
  // QSA indexer (qwen4exp).
  int indexer_n_head = 0;
  int indexer_head_dim = 0;
  int indexer_top_k = 0;  // token budget
  int64_t kv_dim() const { return int64_t(n_head_kv) * head_dim; }
};

// Gated DeltaNet (layers/gated_deltanet.h). q and k heads have head_k_dim (dk), v heads
// head_v_dim (dv); dk ≠ dv is allowed, each V head's recurrent state is [dk][dv].
struct DeltaNetDims {
  int conv_kernel = 0;         // K
  int n_k_heads = 0;           // nk
  int n_v_heads = 0;           // nv
  int head_k_dim = 0;          // dk
  int head_v_dim = 0;          // dv
  bool v_heads_tiled = false;  // qwen4exp GGUF: V head p uses K head p % nk; else p / (nv/nk)
  bool gate_sigmoid = false;   // qwen4exp: sigmoid output gate; qwen3next: silu
  float rms_eps = 1e-6f;       // the gated output norm
  int64_t key_dim() const { return int64_t(n_k_heads) * head_k_dim; }
  int64_t value_dim() const { return int64_t(n_v_heads) * head_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// The routed MoE layer (layers/moe.h).
struct MoeDims {
  int64_t n_embd = 0;  // H
  int n_expert = 0;
  int n_expert_used = 0;  // top-k
};

// The PLE n-gram embedding (layers/ple.h) on S hyper-connection streams of H.
struct PleDims {
  int64_t n_embd = 0;  // H
  int n_streams = 1;   // S
  int ngram_size = 0;
  int heads_per_ngram = 0;
  int conv_kernel = 0;
  int64_t row_width = 0;  // a table row's values (embedding_length_per_layer_input)
  std::vector<uint64_t> head_vocab_sizes;
  std::vector<uint64_t> head_offsets;
  std::vector<uint64_t> multipliers;
  int64_t eos_token = -1;
  float rms_eps = 1e-6f;
  int n_heads() const { return (ngram_size - 1) * heads_per_ngram; }
};

// What a backend knows of a model's forward before a window runs (compute/backend.h
// describe_window): the trunk's layer sequence and every block's dimensions.
struct ForwardDims {
  int n_layer = 0;                     // trunk layers
  std::vector<LayerKind> layer_kinds;  // [n_layer]
  std::vector<int> compress_ratios;    // [block] (trunk + MTP): QSA block sizes; empty: no QSA
  int ple_layer = -1;                  // the PLE layer; -1: none
  AttentionDims attention;
  DeltaNetDims deltanet;
  MoeDims moe;
  PleDims ple;
  bool has_ple() const { return ple_layer >= 0; }
};

}  // namespace strata
