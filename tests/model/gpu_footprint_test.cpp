// A model's GPU footprint (model/gpu_footprint.h), which the CUDA backend checks against its
// device before the first upload. The dense bytes are held to an independent count over the
// file's tensors by name — everything but the routed experts (*_exps), the PLE table, the MTP
// block (blk.<n_layer>.*) and an untied token_embd — on synthetic files of every architecture,
// with and without an MTP head, untied and tied (output dropped: the head is the embedding, which
// the backend then uploads). Synth writes norms and vectors as F32, so the file's bytes are the
// f32 bytes the backend uploads. The working terms follow the dimensions (states for
// kGpuFirstKvTokens tokens, a 64-row window's tensors); Model::load puts the footprint on the
// model's BackendShared.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "../common/temp_dir.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/gpu_footprint.h"
#include "model/model.h"
#include "synth/synth.h"

namespace strata {
namespace {

using test_support::ScratchDir;

std::string write_synth(const ScratchDir& dir, const std::string& shape, bool mtp) {
  SynthOptions options;
  options.hparams = synth_shape(shape);
  if (mtp) {
    options.hparams.n_nextn = 1;
    if (options.hparams.arch == Arch::Qwen4Exp) options.hparams.compress_ratios.push_back(0);
  }
  options.seed = 3;
  const std::string path = dir.file(shape + (mtp ? "-mtp" : "") + ".gguf");
  write_synthetic_model(options, path);
  return path;
}

// `source` without output.weight: a tied head.
std::string write_tied(const std::string& source_path, const std::string& path) {
  const auto source = GgufFile::open(source_path);
  GgufWriter writer;
  for (const std::string& key : source->keys()) writer.add(key, *source->find(key));
  for (const TensorInfo& t : source->tensors()) {
    if (t.name == "output.weight") continue;
    writer.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                      std::span<const uint8_t>(source->tensor_data(t), t.n_bytes));
  }
  writer.write_file(path);
  return path;
}

uint64_t dense_by_name(const GgufFile& file, int n_layer) {
  const bool tied = file.find_tensor("output.weight") == nullptr;
  const std::string mtp_block = "blk." + std::to_string(n_layer) + ".";
  uint64_t bytes = 0;
  for (const TensorInfo& t : file.tensors()) {
    if (t.name.find("_exps") != std::string::npos || t.name.rfind("per_layer_token_embd", 0) == 0)
      continue;
    if (t.name.rfind(mtp_block, 0) == 0) continue;
    if (t.name.rfind("token_embd", 0) == 0 && !tied) continue;
    bytes += t.n_bytes;
  }
  return bytes;
}

TEST(GpuFootprint, DenseBytesAreTheTrunkTensorsTheBackendUploads) {
  ScratchDir dir("gpu-footprint");
  for (const char* shape : {"tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen4exp"})
    for (const bool mtp : {false, true}) {
      if (mtp && std::string(shape) == "tiny-qwen3moe")
        continue;  // no MTP head in that architecture
      const std::string untied = write_synth(dir, shape, mtp);
      const std::string tied =
          write_tied(untied, dir.file(std::string(shape) + (mtp ? "-mtp" : "") + "-tied.gguf"));
      for (const std::string& path : {untied, tied}) {
        const auto model = Model::load(path);
        const compute::GpuModelFootprint& f = model->backend_shared().gpu_footprint;
        const uint64_t expected = dense_by_name(model->file(), model->hparams().n_layer);
        EXPECT_EQ(f.dense_weight_bytes, expected) << path;
        EXPECT_TRUE(f.known()) << path;
        EXPECT_EQ(f.n_expert, model->hparams().n_expert) << path;
        EXPECT_EQ(f.n_expert_used, model->hparams().n_expert_used) << path;
        EXPECT_EQ(f.expert_layers.size(), size_t(model->hparams().n_layer)) << path;
        // The tied head adds the embedding table to what the backend holds.
        if (path == tied) {
          const auto untied_model = Model::load(untied);
          const TensorInfo* embd = model->file().find_tensor("token_embd.weight");
          const TensorInfo* head = untied_model->file().find_tensor("output.weight");
          ASSERT_TRUE(embd && head);
          EXPECT_EQ(f.dense_weight_bytes,
                    untied_model->backend_shared().gpu_footprint.dense_weight_bytes -
                        head->n_bytes + embd->n_bytes)
              << path;
        }
      }
    }
}

TEST(GpuFootprint, WorkingTermsFollowTheDimensions) {
  ScratchDir dir("gpu-footprint");
  // tiny-qwen3moe: attention layers only (KV), no PLE, no DeltaNet.
  const auto moe = Model::load(write_synth(dir, "tiny-qwen3moe", false));
  const HParams& hp = moe->hparams();
  const compute::GpuModelFootprint& f = moe->backend_shared().gpu_footprint;
  EXPECT_EQ(f.state_bytes,
            uint64_t(hp.n_layer) * 2 * uint64_t(compute::kGpuFirstKvTokens * hp.kv_dim()) * 4);
  // x, y, hidden, residual, normed of H and the logits.
  EXPECT_EQ(f.window_bytes,
            uint64_t(compute::kGpuFirstWindowRows * (5 * hp.n_embd + hp.n_vocab)) * 4);
  EXPECT_EQ(f.working_bytes(), f.scratch_bytes() + f.window_bytes + f.state_bytes);
  EXPECT_EQ(f.scratch_bytes(), uint64_t(128) << 20);

  // tiny-qwen3next: DeltaNet layers hold their conv and recurrent states twice.
  const auto next = Model::load(write_synth(dir, "tiny-qwen3next", false));
  const HParams& nh = next->hparams();
  uint64_t expected = 0;
  for (int l = 0; l < nh.n_layer; ++l) {
    if (nh.layer_kinds[size_t(l)] == LayerKind::GatedDeltaNet)
      expected += 2 *
                  (uint64_t(nh.ssm_conv_kernel - 1) * uint64_t(nh.ssm_conv_dim()) +
                   uint64_t(nh.ssm_n_v_heads) * uint64_t(nh.ssm_head_k_dim()) *
                       uint64_t(nh.ssm_head_v_dim())) *
                  4;
    else
      expected += 2 * uint64_t(compute::kGpuFirstKvTokens * nh.kv_dim()) * 4;
  }
  EXPECT_EQ(next->backend_shared().gpu_footprint.state_bytes, expected);
}

}  // namespace
}  // namespace strata
