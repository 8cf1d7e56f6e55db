// Synthetic models the CUDA end-to-end tests share (backend_test, lockstep_test).
#pragma once

#include <string>

#include "synth/synth.h"

namespace strata::test_support {

// The mid shape's widths (head dim 256, 64 rotary dims, 128-wide DeltaNet heads, 1024-wide
// residual, 32k vocabulary) cut to 4 layers (3 DeltaNet + 1 QSA, as `strata synth --layers 4`)
// and 32 experts, Q8_0 dense and IQ2_XS experts: the types of the 48-layer benchmark file.
inline void write_mid_qwen4exp_4_layers(const std::string& path) {
  SynthOptions options;
  options.hparams = synth_shape("mid-qwen4exp");
  HParams& hp = options.hparams;
  hp.n_layer = 4;
  hp.layer_kinds.assign(4, LayerKind::GatedDeltaNet);
  hp.layer_kinds[3] = LayerKind::SparseAttention;
  hp.compress_ratios.assign(4, 0);
  hp.compress_ratios[3] = 4;
  hp.n_expert = 32;
  options.dense_type = GgmlType::Q8_0;
  options.expert_type = GgmlType::IQ2_XS;
  options.seed = 7;
  write_synthetic_model(options, path);
}

}  // namespace strata::test_support
