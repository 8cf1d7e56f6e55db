// `strata synth` output: the same bytes at every thread count and row-block size, the same bytes
// as builds before threading for the configurations those could write, and pooled blocks that
// load, decode at the intended scale and run.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../common/temp_dir.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "synth/chunk_pipeline.h"
#include "synth/synth.h"

namespace strata {
namespace {

class TempDir : public test_support::ScratchDir {
 public:
  TempDir() : ScratchDir("synth-threads") {}
};

uint64_t file_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : bytes) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h ^ bytes.size();
}

uint64_t synth_hash(const SynthOptions& options) {
  TempDir dir;
  const std::string path = dir.file("model.gguf");
  write_synthetic_model(options, path);
  return file_hash(path);
}

// tiny-qwen3moe widened so its expert rows (256) are IQ2_XS random grid codes, not the IQ4_NL
// fallback of the narrower tiny shapes.
SynthOptions wide_qwen3moe() {
  SynthOptions options;
  options.hparams = synth_shape("tiny-qwen3moe");
  options.hparams.n_embd = 256;
  options.hparams.n_ff_exp = 256;
  options.hparams.n_expert = 8;
  options.dense_type = GgmlType::Q4_K;
  options.expert_type = GgmlType::IQ2_XS;
  options.seed = 5;
  return options;
}

struct Case {
  std::string name;
  SynthOptions options;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  {
    SynthOptions o;  // Q8_0 dense; IQ2_XS experts fall back to pooled IQ4_NL (rows of 32, 64)
    o.hparams = synth_shape("tiny-qwen4exp");
    o.dense_type = GgmlType::Q8_0;
    o.expert_type = GgmlType::IQ2_XS;
    out.push_back({"qwen4exp q8_0 + iq2_xs→iq4_nl", o});
  }
  out.push_back({"qwen3moe q4_k + iq2_xs grid codes", wide_qwen3moe()});
  {
    SynthOptions o = wide_qwen3moe();  // shaped: zeroed rows of grid-code down projections
    o.routing.skew = 1.0;
    out.push_back({"qwen3moe skewed", o});
  }
  {
    SynthOptions o;
    o.hparams = synth_shape("tiny-qwen4exp");
    o.hparams.n_expert = 64;
    o.dense_type = GgmlType::Q4_K;
    o.expert_type = GgmlType::Q6_K;
    o.routing.skew = 1.0;
    o.routing.correlation = 0.9;
    o.codes = SynthCodes::Pool;
    out.push_back({"qwen4exp pooled, skewed + correlated", o});
  }
  return out;
}

TEST(Synth, SameBytesAtEveryThreadCountAndRowBlockSize) {
  for (const Case& c : cases()) {
    SynthOptions options = c.options;
    options.n_threads = 1;
    const uint64_t reference = synth_hash(options);
    for (int threads : {1, 2, 3}) {
      for (size_t job_bytes : {size_t(0), size_t(1000)}) {  // default ≈4 MiB, or a few rows
        if (threads == 1 && job_bytes == 0) continue;
        options.n_threads = threads;
        options.job_bytes = job_bytes;
        EXPECT_EQ(synth_hash(options), reference)
            << c.name << ": " << threads << " threads, job_bytes " << job_bytes;
      }
    }
  }
}

// Hashes of files written by strata before synth was threaded (commit 74315d1, one thread),
// for options that build could write: the default codes keep those bytes, at any thread count.
TEST(Synth, SameBytesAsSingleThreadedBuilds) {
  std::vector<std::pair<SynthOptions, uint64_t>> expected;
  {
    SynthOptions o;
    o.hparams = synth_shape("tiny-qwen4exp");
    o.dense_type = GgmlType::Q8_0;
    o.expert_type = GgmlType::Q4_K;
    expected.emplace_back(o, 0x6da4c88dacf7e6a9ull);
  }
  expected.emplace_back(wide_qwen3moe(), 0xb22a657ab5357e02ull);
  {
    SynthOptions o = wide_qwen3moe();
    o.routing.skew = 1.0;
    expected.emplace_back(o, 0xdb9a0a5e1efa4b21ull);
  }
  {
    SynthOptions o;
    o.hparams = synth_shape("tiny-qwen4exp");
    o.hparams.n_expert = 64;
    o.routing.skew = 1.0;
    o.routing.correlation = 0.9;
    o.seed = 3;
    expected.emplace_back(o, 0x6c1ea503f5aa9d8aull);
  }
  {
    SynthOptions o;
    o.hparams = synth_shape("tiny-qwen3next");
    o.dense_type = GgmlType::Q6_K;
    o.expert_type = GgmlType::Q2_K;
    o.seed = 9;
    expected.emplace_back(o, 0x396eefd485ab12a7ull);
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    SynthOptions options = expected[i].first;
    for (int threads : {1, 2}) {
      options.n_threads = threads;
      EXPECT_EQ(synth_hash(options), expected[i].second)
          << "case " << i << ", " << threads << " threads";
    }
  }
}

TEST(Synth, PooledBlocksDecodeAtTheMatrixScale) {
  TempDir dir;
  SynthOptions options;
  options.hparams = synth_shape("tiny-qwen4exp");
  options.dense_type = GgmlType::Q4_K;
  options.expert_type = GgmlType::IQ4_NL;
  options.codes = SynthCodes::Pool;
  options.n_threads = 2;
  const std::string path = dir.file("pooled.gguf");
  write_synthetic_model(options, path);
  const auto file = GgufFile::open(path);
  // Pooled IQ4_NL experts, and pooled dense Q4_K and Q5_0 (the fallback of 64-wide rows).
  const std::pair<const char*, GgmlType> tensors[] = {
      {"blk.0.ffn_up_exps.weight", GgmlType::IQ4_NL},
      {"blk.0.ffn_down_exps.weight", GgmlType::IQ4_NL},
      {"blk.0.hc_attn_down.weight", GgmlType::Q4_K},
      {"blk.0.attn_qkv.weight", GgmlType::Q5_0},
  };
  for (const auto& [name, type] : tensors) {
    const TensorInfo* info = file->find_tensor(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->type, type) << name;
    std::vector<float> values(size_t(info->n_elements()));
    quant::dequantize_row(info->type, file->tensor_data(*info), values.data(), info->n_elements());
    double sum_squares = 0.0;
    for (float v : values) sum_squares += double(v) * v;
    const double rms = std::sqrt(sum_squares / double(values.size()));
    const double intended = 1.0 / std::sqrt(double(info->ne[0]));
    EXPECT_NEAR(rms / intended, 1.0, 0.1) << name;
  }
  // The model runs: finite logits.
  const auto model = Model::load(path);
  compute::ThreadPool pool(2);
  Session session(*model, pool);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 12; ++i) tokens.push_back(int32_t((i * 37 + 11) % 512));
  const std::vector<float> logits = session.prefill(tokens, 64);
  ASSERT_FALSE(logits.empty());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST(ChunkPipeline, ReturnsJobsInOrderAndRethrowsAtTheFailingJob) {
  for (int threads : {1, 2, 4}) {
    std::atomic<int> calls{0};
    ChunkPipeline pipeline(50, threads, [&](size_t job, std::vector<uint8_t>& out) {
      ++calls;
      if (job == 37) throw std::runtime_error("job 37");
      out.assign(job % 7 + 1, uint8_t(job));
    });
    for (size_t job = 0; job < 37; ++job) {
      const std::span<const uint8_t> bytes = pipeline.next();
      ASSERT_EQ(bytes.size(), job % 7 + 1) << threads;
      for (uint8_t b : bytes) ASSERT_EQ(b, uint8_t(job)) << threads;
    }
    EXPECT_THROW(pipeline.next(), std::runtime_error) << threads;
    EXPECT_LE(calls.load(), 50);
  }
}

}  // namespace
}  // namespace strata
