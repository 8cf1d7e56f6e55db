// strata synth — GGUF files of any supported architecture and shape with random weights.
//
// Used for scale and streaming work (a full-shape Qwen3.8-Flash-Next with IQ2_XS experts is
// ≈35 GB) and for tests that need a model of a given arch without a checkpoint. The tensor list
// comes from the architecture's own spec (model/tensor_specs.h), metadata from write_hparams, so
// a synthetic file loads exactly like a converted one. Values are deterministic in the seed:
//   matrices N(0, 1/n_in), norms 1 + N(0, 0.1²), ssm_a −exp(N(0, 0.5²)), taps/biases N(0, 0.5²),
//   PLE table N(0, 1). 1-D tensors and routers stay F32; rows a requested block type does not
//   divide fall back via storable_type. How block-type rows are made is SynthCodes below (by
//   default IQ2_XS blocks are random grid/sign codes with small scales, IQ4_NL blocks are drawn
//   from a pool of quantized blocks, synth/block_pool.h, and the other types are quantized from
//   the floats). Data is generated in row blocks of ≈4 MiB on `n_threads` threads and written in
//   order, so memory stays small for any size and the bytes do not depend on the thread count.
// Optional routing shapes (Zipf-skewed, temporally correlated expert routing, for cache
// experiments) rewrite a few weights: synth/routing_shape.h, docs/synth.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/hparams.h"
#include "quant/ggml_type.h"
#include "synth/routing_shape.h"

namespace strata {

// How rows of block types are made (1-D tensors, routers and F32/F16/BF16 tensors always come
// from floats, and so do tensors with shaped rows, which need exact values).
enum class SynthCodes {
  // IQ2_XS: random grid/sign codes; IQ4_NL: pooled blocks (its quantizer's scale search is what
  // made the full flagship shape take over an hour); every other type: quantized floats, the
  // same bytes as earlier builds.
  Auto,
  // Every block type from a pool of quantized blocks (IQ2_XS keeps its random grid codes): the
  // fastest, bounded by memory and disk.
  Pool,
  // Every block type quantized from its floats, IQ2_XS included (its quantizer is slow).
  Quantize,
};

struct SynthOptions {
  HParams hparams;                        // n_vocab included
  GgmlType dense_type = GgmlType::F32;    // matrices, embedding, head
  GgmlType expert_type = GgmlType::F32;   // *_exps
  uint64_t seed = 1;
  // A Hugging Face tokenizer directory (tokenizer.json [+ tokenizer_config.json]) whose vocabulary
  // is written as the file's tokenizer section; hparams.n_vocab must equal its size
  // (hf_tokenizer_vocab_size).
  std::string tokenizer_dir;
  // Skewed / temporally correlated routing (synth/routing_shape.h); off by default, which keeps
  // the file byte-identical to one written without it.
  RoutingShape routing;
  SynthCodes codes = SynthCodes::Auto;
  // Threads that generate data (0: all cores). The file's bytes do not depend on it.
  int n_threads = 1;
  // Bytes per row block, the unit of work (0: about 4 MiB); tests use small ones to check that
  // the bytes do not depend on it either.
  size_t job_bytes = 0;
};

// Number of ids in DIR/tokenizer.json (the model vocabulary plus added tokens).
int64_t hf_tokenizer_vocab_size(const std::string& tokenizer_dir);

// Named shapes: "tiny-qwen4exp", "tiny-qwen3next", "tiny-qwen3moe" (test size, KBs),
// "mid-qwen4exp" (a few GB at Q4_K), "qwen3.8-flash-next" (the full flagship shape; its PLE
// table is cut to 3.2M rows so the file fits a workstation disk — the real one is 320M rows).
HParams synth_shape(std::string_view name);
// Changes a shape's layer count (the hybrid pattern: every 4th layer attention — QSA with
// compress ratio 4 on qwen4exp — the rest Gated DeltaNet; qwen3moe: all attention) and expert
// count (top-k capped at it); 0 keeps a count. Used by `strata synth --layers/--experts` and the
// benches that write their own files.
void resize_synth_shape(HParams& hp, int n_layer, int n_expert);
std::vector<std::string> synth_shape_names();

// PLE constants as the reference derives them (qwen4exp.md §9): per-head prime vocab sizes above
// `vocab_base`, their offsets, and the splitmix64 hash multipliers. Fills hp.ple_*.
void fill_ple_constants(HParams& hp, uint64_t vocab_base, uint64_t seed);

// Called on the calling thread after every written row block.
using SynthProgress = std::function<void(uint64_t bytes_done, uint64_t bytes_total)>;
void write_synthetic_model(const SynthOptions& options, const std::string& path,
                           const SynthProgress& progress = nullptr);

}  // namespace strata
