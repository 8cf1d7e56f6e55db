// A model's GPU footprint. Contract in gpu_footprint.h.
#include "model/gpu_footprint.h"

#include <algorithm>
#include <charconv>
#include <string_view>

#include "model/model.h"

namespace strata {
namespace {

// The block index of "blk.<N>.…", or -1 for a global tensor.
int block_of(std::string_view name) {
  constexpr std::string_view prefix = "blk.";
  if (name.substr(0, prefix.size()) != prefix) return -1;
  int block = -1;
  const char* first = name.data() + prefix.size();
  const auto [end, ec] = std::from_chars(first, name.data() + name.size(), block);
  return ec == std::errc() && end != first ? block : -1;
}

}  // namespace

uint64_t gpu_dense_weight_bytes(const std::vector<TensorSpec>& specs, const GgufFile& file,
                                int n_layer) {
  const bool tied_head = std::none_of(specs.begin(), specs.end(), [&](const TensorSpec& s) {
    return s.role == TensorRole::Output && file.find_tensor(s.name) != nullptr;
  });
  uint64_t bytes = 0;
  for (const TensorSpec& spec : specs) {
    if (spec.presence == Presence::Refused) continue;
    const TensorInfo* info = file.find_tensor(spec.name);
    if (!info || block_of(spec.name) >= n_layer) continue;
    switch (spec.role) {
      case TensorRole::Expert:
      case TensorRole::PleTable:
        break;
      case TensorRole::Embedding:
        if (tied_head) bytes += info->n_bytes;
        break;
      case TensorRole::Output:
      case TensorRole::Matrix:
      case TensorRole::Router:
        bytes += info->n_bytes;
        break;
      case TensorRole::Norm:
      case TensorRole::Vector:
        bytes += uint64_t(info->n_elements()) * 4;
        break;
    }
  }
  return bytes;
}

compute::GpuModelFootprint gpu_footprint(const HParams& hp, const ForwardDims& dims,
                                         const GgufFile& file,
                                         std::vector<compute::ExpertLayerLayout> expert_layers) {
  compute::GpuModelFootprint f;
  f.dense_weight_bytes = gpu_dense_weight_bytes(tensor_specs(hp), file, hp.n_layer);
  f.n_expert = hp.n_expert;
  f.n_expert_used = hp.n_expert_used;
  f.expert_layers = std::move(expert_layers);
  int64_t floats_per_row = 0;
  for (const WindowTensorWidth& w : window_tensor_widths(hp)) floats_per_row += w.width;
  f.window_bytes = uint64_t(compute::kGpuFirstWindowRows * floats_per_row) * 4;
  const int64_t tokens = compute::kGpuFirstKvTokens;
  uint64_t state = 0;
  for (int l = 0; l < dims.n_layer; ++l) {
    const LayerKind kind =
        dims.layer_kinds.empty() ? LayerKind::Attention : dims.layer_kinds[size_t(l)];
    if (kind == LayerKind::GatedDeltaNet) {
      const DeltaNetDims& d = dims.deltanet;
      const uint64_t conv = uint64_t(d.conv_kernel - 1) * uint64_t(d.conv_dim()) * 4;
      const uint64_t ssm =
          uint64_t(d.n_v_heads) * uint64_t(d.head_k_dim) * uint64_t(d.head_v_dim) * 4;
      state += 2 * (conv + ssm);
      continue;
    }
    state += 2 * uint64_t(tokens * dims.attention.kv_dim()) * 4;
    const int ratio = dims.compress_ratios.empty() ? 0 : dims.compress_ratios[size_t(l)];
    if (ratio > 0) {
      const int64_t di = dims.attention.indexer_head_dim;
      state += uint64_t(tokens * di) * 4 + uint64_t((tokens / ratio + 1) * di) * 4;
    }
  }
  if (dims.has_ple()) {
    const PleDims& p = dims.ple;
    const int64_t steps = std::max<int64_t>(int64_t(p.conv_kernel - 1) * p.ngram_size, 1);
    state += 3 * uint64_t(steps * p.n_streams * p.n_embd) * 4;
  }
  f.state_bytes = state;
  return f;
}

}  // namespace strata
