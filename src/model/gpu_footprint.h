// A model's GPU footprint — what the CUDA backend will upload and allocate for it besides its
// routed experts (compute/gpu_memory_plan.h GpuModelFootprint), worked out at load from the
// tensor table and the dimensions, so that the backend can check at start, before any upload, that
// the model fits the device (check_gpu_fit). Model::load sets it on the model's BackendShared.
//
// Contract
// - gpu_dense_weight_bytes: the trunk tensors the file holds, by role (model/tensor_specs.h):
//   Matrix, Router and Output at their file bytes (uploaded as stored), Norm and Vector at 4 bytes
//   an element (the loader's f32 copy is what is uploaded); the Embedding only when no Output is
//   present (a tied head uploads the table for the output matmul; otherwise the backend
//   dequantizes embedding rows on the host); never Expert stacks, the PleTable (read by rows) or
//   a tensor of a block at or past n_layer (the MTP head runs on the host's CPU backend).
// - gpu_footprint: those bytes, the window tensors of a kGpuFirstWindowRows-row window (the
//   widths Model::ensure_tensors allocates: window_tensor_widths) and the layer states the CUDA
//   backend allocates for its first windows (compute/cuda/cuda_backend.cpp): per Gated DeltaNet
//   layer its conv state [(K-1)][conv_dim] and recurrent state [nv][dk][dv] in f32, twice (the
//   snapshot a speculative verify window keeps); per attention layer K and V of
//   kGpuFirstKvTokens tokens [kv_dim] in f32, and for a QSA layer its index keys [di] per token
//   and block keys [di] per compress-ratio block; the PLE conv history [(K-1)·ngram][S·H] three
//   times (history, next, before).
#pragma once

#include <cstdint>
#include <vector>

#include "compute/gpu_memory_plan.h"
#include "gguf/gguf.h"
#include "layers/dims.h"
#include "model/hparams.h"
#include "model/tensor_specs.h"

namespace strata {

uint64_t gpu_dense_weight_bytes(const std::vector<TensorSpec>& specs, const GgufFile& file,
                                int n_layer);

compute::GpuModelFootprint gpu_footprint(const HParams& hp, const ForwardDims& dims,
                                         const GgufFile& file,
                                         std::vector<compute::ExpertLayerLayout> expert_layers);

}  // namespace strata
