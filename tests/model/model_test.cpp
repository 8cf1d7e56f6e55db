// Forward-pass invariants on synthetic models of every architecture:
// - window identity: every row's logits are bitwise equal whether the tokens go one at a time,
//   all in one window, or in uneven chunks (what exact speculative decoding relies on);
// - thread count does not change any bit;
// - the loader rejects a file whose tensor shapes disagree with its metadata, naming both.
// Exactness against HF transformers lives in forward_fixture_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "compute/cpu/matmul.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "engine/window.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/tensor_specs.h"
#include "synth/synth.h"
#include "util/error.h"

namespace strata {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "-" + std::to_string(getpid()) + ".gguf"))
      .string();
}

// A named synth shape; "<shape>-dkdv" is that shape with a value head dim 8 wider than its key
// head dim (transformers accepts linear_value_head_dim != linear_key_head_dim).
HParams test_shape(const std::string& name) {
  const std::string suffix = "-dkdv";
  const bool dkdv = name.size() > suffix.size() && name.ends_with(suffix);
  HParams hp = synth_shape(dkdv ? name.substr(0, name.size() - suffix.size()) : name);
  if (dkdv) hp.ssm_d_value = hp.ssm_d_state + 8;
  return hp;
}

struct SynthFile {
  explicit SynthFile(const std::string& shape, GgmlType dense = GgmlType::F32,
                     GgmlType experts = GgmlType::F32) {
    path = temp_path("strata-" + shape);
    SynthOptions options;
    options.hparams = test_shape(shape);
    options.dense_type = dense;
    options.expert_type = experts;
    options.seed = 7;
    write_synthetic_model(options, path);
  }
  ~SynthFile() { std::remove(path.c_str()); }
  std::string path;
};

std::vector<int32_t> prompt_tokens(int n, int vocab) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) tokens.push_back(int32_t((i * 37 + 11) % vocab));
  tokens[size_t(n / 2)] = 2;  // the synthetic PLE eos, to exercise the n-gram reset
  return tokens;
}

// Logits of every position, computed with the given window sizes (cycled), into `state`.
std::vector<float> all_logits(const Model& model, compute::ThreadPool& pool, ModelState& state,
                              const std::vector<int32_t>& tokens, std::vector<int> windows) {
  std::vector<float> out, logits;
  size_t pos = 0, w = 0;
  while (pos < tokens.size()) {
    const size_t n = std::min(tokens.size() - pos, size_t(windows[w++ % windows.size()]));
    WindowRunner(model).run(pool, state, std::span(tokens).subspan(pos, n), LogitRows::All, logits);
    out.insert(out.end(), logits.begin(), logits.end());
    pos += n;
  }
  return out;
}
std::vector<float> all_logits(const Model& model, compute::ThreadPool& pool,
                              const std::vector<int32_t>& tokens, std::vector<int> windows) {
  ModelState state = model.new_state();
  return all_logits(model, pool, state, tokens, std::move(windows));
}

// The sequence state two ways of feeding the same tokens leave: every DeltaNet conv and
// recurrent state, KV cache, PLE history (bitwise).
void expect_same_state(const ModelState& got, const ModelState& want) {
  EXPECT_EQ(got.n_past, want.n_past);
  ASSERT_EQ(got.deltanet.size(), want.deltanet.size());
  for (size_t l = 0; l < got.deltanet.size(); ++l) {
    EXPECT_EQ(got.deltanet[l].ssm, want.deltanet[l].ssm) << "layer " << l << " recurrent state";
    EXPECT_EQ(got.deltanet[l].conv, want.deltanet[l].conv) << "layer " << l << " conv state";
  }
  ASSERT_EQ(got.kv.size(), want.kv.size());
  for (size_t l = 0; l < got.kv.size(); ++l) {
    EXPECT_EQ(got.kv[l].k, want.kv[l].k) << "layer " << l << " keys";
    EXPECT_EQ(got.kv[l].v, want.kv[l].v) << "layer " << l << " values";
    EXPECT_EQ(got.kv[l].block_keys, want.kv[l].block_keys) << "layer " << l << " block keys";
  }
  EXPECT_EQ(got.ple.conv_history, want.ple.conv_history);
}

class ForwardInvariance : public testing::TestWithParam<std::string> {};

TEST_P(ForwardInvariance, WindowSizeAndThreadsDoNotChangeBits) {
  const SynthFile file(GetParam());
  const auto model = Model::load(file.path);
  const std::vector<int32_t> tokens = prompt_tokens(30, int(model->hparams().n_vocab));
  // The inline rule off: every hand-out of the tiny model really splits over the two threads.
  compute::ThreadPool one(1), two(2, compute::ThreadPool::kDefaultWorkerSpinMicros,
                                   compute::ThreadPool::kInlineNever);
  const std::vector<float> reference = all_logits(*model, one, tokens, {1});
  ASSERT_EQ(reference.size(), tokens.size() * size_t(model->hparams().n_vocab));
  for (float v : reference) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(all_logits(*model, two, tokens, {30}), reference) << "one window of 30";
  EXPECT_EQ(all_logits(*model, two, tokens, {3, 1, 7, 2}), reference) << "uneven chunks";
  EXPECT_EQ(all_logits(*model, one, tokens, {16}), reference) << "prefill-sized chunks";
}

// Windows of >= 32 rows attend through matrix products (layers/attention.cpp), shorter ones one
// dot per token; on an all-attention model a 40-row window must give every row the bits of
// 1-row windows, at 1 and 2 threads, also when the window starts past position 0.
TEST(ForwardInvariance, MatrixAttentionIsBitwiseTheOneRowPath) {
  const SynthFile file("tiny-qwen3moe");
  const auto model = Model::load(file.path);
  const std::vector<int32_t> tokens = prompt_tokens(75, int(model->hparams().n_vocab));
  compute::ThreadPool one(1), two(2, compute::ThreadPool::kDefaultWorkerSpinMicros,
                                   compute::ThreadPool::kInlineNever);
  const std::vector<float> reference = all_logits(*model, one, tokens, {1});
  EXPECT_EQ(all_logits(*model, two, tokens, {40, 35}), reference) << "windows of 40 and 35";
  EXPECT_EQ(all_logits(*model, one, tokens, {3, 33, 39}), reference) << "3, then 33 and 39";
}

TEST_P(ForwardInvariance, SessionDecodeMatchesPrefill) {
  const SynthFile file(GetParam());
  const auto model = Model::load(file.path);
  const std::vector<int32_t> tokens = prompt_tokens(20, int(model->hparams().n_vocab));
  compute::ThreadPool pool(2);
  Session whole(*model, pool);
  const std::vector<float> expected = whole.prefill(tokens, 64);
  Session stepwise(*model, pool);
  stepwise.prefill(std::span(tokens).first(13), 5);
  std::vector<float> last;
  for (size_t i = 13; i < tokens.size(); ++i) last = stepwise.decode(tokens[i]);
  EXPECT_EQ(last, expected);
  EXPECT_EQ(stepwise.n_past(), 20);
}

// Windows of >= 32 rows run Gated DeltaNet in its chunked form: equal to the recurrent form up
// to fp32 rounding, across a 64-row chunk boundary, and the state it leaves continues exactly
// like the recurrent one (decode after a chunked prefill).
TEST_P(ForwardInvariance, ChunkedPrefillAgreesWithRecurrent) {
  const SynthFile file(GetParam());
  const auto model = Model::load(file.path);
  const int64_t vocab = model->hparams().n_vocab;
  const std::vector<int32_t> tokens = prompt_tokens(80, int(vocab));
  compute::ThreadPool pool(2);
  const std::vector<float> recurrent = all_logits(*model, pool, tokens, {1});
  const std::vector<float> chunked = all_logits(*model, pool, tokens, {70, 10});
  ASSERT_EQ(recurrent.size(), chunked.size());
  float worst = 0, scale = 0;
  for (size_t i = 0; i < recurrent.size(); ++i) {
    worst = std::max(worst, std::fabs(recurrent[i] - chunked[i]));
    scale = std::max(scale, std::fabs(recurrent[i]));
  }
  EXPECT_LE(worst, 1e-5f * std::max(scale, 1.0f)) << "max |dlogit| " << worst;
  for (int64_t t = 0; t < int64_t(tokens.size()); ++t)
    EXPECT_EQ(compute::argmax(recurrent.data() + t * vocab, vocab),
              compute::argmax(chunked.data() + t * vocab, vocab))
        << "position " << t;
}

// `strata chat` and `strata serve` prefill in windows of up to 512 rows whose ends are multiples
// of 64 from position 0 (engine/prefill_window.h), and their state cache resumes at any multiple
// of 64: that is exact only if a window is bitwise the 64-row windows it can be cut into from its
// start, logits and state. Gated DeltaNet runs 64-row chunks from the window start, so what
// differs is a trailing partial chunk: a 64-row cut runs one of < 32 rows as a window of its own
// in the recurrent form, hence so must the long window (it used to run it chunked: 1 and 31 fail
// there). Also a long window that starts at 64, and decoding on after each (the states continue
// alike). Quantized weights: several rows share each routed expert (the grouped tile kernels).
TEST_P(ForwardInvariance, LongWindowIsBitwiseItsSixtyFourRowWindows) {
  for (const GgmlType type : {GgmlType::F32, GgmlType::Q8_0}) {
    const SynthFile file(GetParam(), type, type);
    const auto model = Model::load(file.path);
    compute::ThreadPool pool(2, compute::ThreadPool::kDefaultWorkerSpinMicros,
                             compute::ThreadPool::kInlineNever);
    for (const int tail : {0, 1, 31, 32, 63}) {
      SCOPED_TRACE(std::string(type_name(type)) + ", a trailing chunk of " + std::to_string(tail) +
                   " rows");
      const int n = 2 * 64 + tail;
      std::vector<int32_t> tokens = prompt_tokens(n + 3, int(model->hparams().n_vocab));
      const std::vector<int32_t> decoded(tokens.end() - 3, tokens.end());
      tokens.resize(size_t(n));
      ModelState cut = model->new_state(), cut_then_decode = model->new_state();
      const std::vector<float> want = all_logits(*model, pool, cut, tokens, {64});
      all_logits(*model, pool, cut_then_decode, tokens, {64});
      const std::vector<float> want_next = all_logits(*model, pool, cut_then_decode, decoded, {1});
      for (const std::vector<int>& windows : {std::vector<int>{n}, std::vector<int>{64, n - 64}}) {
        SCOPED_TRACE("the first window " + std::to_string(windows[0]) + " rows");
        ModelState state = model->new_state();
        EXPECT_EQ(all_logits(*model, pool, state, tokens, windows), want);
        expect_same_state(state, cut);
        EXPECT_EQ(all_logits(*model, pool, state, decoded, {1}), want_next) << "decode after";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ForwardInvariance,
                         testing::Values("tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen4exp",
                                         "tiny-qwen3next-dkdv", "tiny-qwen4exp-dkdv"));

// The file mapping's expert source names one host region, the whole file, holding every routed
// expert's bytes (the GPU expert tier registers it and reads experts in place; an empty answer
// made it stage every miss through a bounce buffer, ~8 GB/s of host memcpy on the handshake
// thread; a region of the experts' span alone broke dense uploads from the pages beside it).
TEST_P(ForwardInvariance, MappedExpertsNameTheRegionThatHoldsThem) {
  const SynthFile file(GetParam());
  const auto model = Model::load(file.path);
  ExpertSource& source = model->mapped_experts();
  ASSERT_TRUE(source.pointers_stay_valid());
  const auto regions = source.host_regions();
  ASSERT_EQ(regions.size(), 1u);
  const uint8_t* begin = regions[0].data;
  const uint8_t* end = begin + regions[0].bytes;
  EXPECT_EQ(regions[0].bytes, std::filesystem::file_size(file.path));
  const int n_expert = model->hparams().n_expert;
  std::vector<int32_t> all(static_cast<size_t>(n_expert));
  for (int e = 0; e < n_expert; ++e) all[size_t(e)] = e;
  int checked = 0;
  for (int layer = 0; layer < model->hparams().n_layer; ++layer) {
    if (!model->layers()[size_t(layer)].gate_exps.mapped) continue;
    source.publish(layer, all);
    for_each_delivered(source, [&](int index, const ExpertMatrices& m) {
      for (const compute::WeightMatrix* w : {&m.gate, &m.up, &m.down}) {
        const auto* p = static_cast<const uint8_t*>(w->data);
        EXPECT_GE(p, begin);
        EXPECT_LE(p + size_t(w->n_out) * w->row_stride_bytes, end) << "layer " << layer << " expert " << all[size_t(index)];
        ++checked;
      }
    });
  }
  EXPECT_GT(checked, 0);
}

TEST(ModelLoad, ValueHeadDimComesFromInnerSize) {
  const SynthFile file("tiny-qwen4exp-dkdv");
  const auto model = Model::load(file.path);
  const HParams& hp = model->hparams();
  EXPECT_EQ(hp.ssm_head_k_dim(), 16);
  EXPECT_EQ(hp.ssm_head_v_dim(), 24);
  EXPECT_EQ(hp.ssm_value_dim(), int64_t(hp.ssm_n_v_heads) * 24);
  EXPECT_EQ(hp.ssm_conv_dim(), 2 * int64_t(hp.ssm_n_k_heads) * 16 + int64_t(hp.ssm_n_v_heads) * 24);
}

// attention.compress_ratios: 0 at a QSA block is llama.cpp's "dense" (its converter writes it for
// transformers-5.17 configs) and loads; a ratio that does not divide the budget is named.
TEST(ModelLoad, CompressRatioZeroLoadsAndABadRatioIsNamed) {
  HParams hp = synth_shape("tiny-qwen4exp");
  auto hparams_with_ratio = [&](int ratio) {
    HParams edited = hp;
    for (size_t l = 0; l < edited.layer_kinds.size(); ++l)
      if (edited.layer_kinds[l] == LayerKind::SparseAttention) edited.compress_ratios[l] = ratio;
    GgufWriter writer;
    write_hparams(writer, edited);
    return load_hparams(*GgufFile::open_from_memory(writer.write_memory(), "ratio.gguf"));
  };
  const HParams dense = hparams_with_ratio(0);
  for (size_t l = 0; l < dense.layer_kinds.size(); ++l) EXPECT_EQ(dense.compress_ratios[l], 0);
  ASSERT_NE(hp.indexer_top_k % 3, 0);
  try {
    hparams_with_ratio(3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("ratio.gguf: metadata key 'qwen4exp.attention.compress_ratios'"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("0 (dense) or a positive divisor of indexer.top_k"), std::string::npos)
        << message;
  }
}

TEST(ModelLoad, InnerSizeNotAMultipleOfTheValueHeadsIsNamed) {
  const HParams hp = synth_shape("tiny-qwen3next");
  GgufWriter writer;
  write_hparams(writer, hp);
  const auto parsed = GgufFile::open_from_memory(writer.write_memory(), "meta.gguf");
  // The same metadata with an inner_size that no V head count divides.
  GgufWriter edited;
  for (const std::string& key : parsed->keys()) {
    if (key == "qwen3next.ssm.inner_size")
      edited.add_u32(key, uint32_t(hp.ssm_n_v_heads * hp.ssm_d_state + 1));
    else
      edited.add(key, *parsed->find(key));
  }
  EXPECT_EQ(load_hparams(*parsed).ssm_head_v_dim(), hp.ssm_d_state);
  try {
    load_hparams(*GgufFile::open_from_memory(edited.write_memory(), "bad-inner.gguf"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("bad-inner.gguf: metadata key 'qwen3next.ssm.inner_size'"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("a positive multiple of ssm.time_step_rank (" +
                           std::to_string(hp.ssm_n_v_heads) + ")"),
              std::string::npos)
        << message;
  }
}

TEST(ForwardInvariance, QuantizedModelsKeepWindowIdentity) {
  const SynthFile file("tiny-qwen4exp", GgmlType::Q8_0, GgmlType::Q8_0);
  const auto model = Model::load(file.path);
  const std::vector<int32_t> tokens = prompt_tokens(12, int(model->hparams().n_vocab));
  compute::ThreadPool pool(2);
  EXPECT_EQ(all_logits(*model, pool, tokens, {12}), all_logits(*model, pool, tokens, {1}));
}

// Quantized weights take the paths a decode step runs on several threads (F32 ones do not: their
// experts go one at a time): the routed experts of a few-row window grouped into one hand-out for
// every expert's gate and up and one for the downs, attention split over (row, head), the gated
// norm inside each DeltaNet head's task. Every thread count must give the one-thread bits, for
// decode rows, short windows and long ones (side-by-side experts, matrix attention, chunked
// DeltaNet, compared against one thread in the same windows). The pools' inline rule
// (compute/cpu/thread_pool.h) is off for the thread counts (the tiny models' hand-outs would
// otherwise mostly run on the caller), and on 3 threads also always on and measured: it only moves
// work to the caller, so the bits are the same. With it always on a decode row hands nothing out
// to the workers (every hand-out of a decode row carries a work estimate); with it off it does.
TEST_P(ForwardInvariance, QuantizedDecodeIsBitwiseAtEveryThreadCountAndInlineRule) {
  const SynthFile file(GetParam(), GgmlType::Q8_0, GgmlType::Q8_0);
  const auto model = Model::load(file.path);
  const std::vector<int32_t> tokens = prompt_tokens(40, int(model->hparams().n_vocab));
  compute::ThreadPool one(1);
  const std::vector<float> rows = all_logits(*model, one, tokens, {1});
  const std::vector<float> long_windows = all_logits(*model, one, tokens, {36, 4});
  constexpr double kNever = compute::ThreadPool::kInlineNever;
  for (const auto& [threads, inline_work_ns] : {std::pair{2, kNever},
                                                {3, kNever},
                                                {4, kNever},
                                                {7, kNever},
                                                {16, kNever},
                                                {3, compute::ThreadPool::kInlineAlways},
                                                {3, compute::ThreadPool::kMeasureInlineWork}}) {
    compute::ThreadPool pool(threads, compute::ThreadPool::kDefaultWorkerSpinMicros, inline_work_ns);
    for (const bool chains : {false, true}) {  // ThreadPool::phase_chains: the same bits either way
      pool.set_phase_chains(chains);
      EXPECT_EQ(all_logits(*model, pool, tokens, {1}), rows)
          << threads << " threads, inline rule " << inline_work_ns << ", chains " << chains << ", decode rows";
      EXPECT_EQ(all_logits(*model, pool, tokens, {3, 1, 2, 5}), rows)
          << threads << " threads, inline rule " << inline_work_ns << ", chains " << chains << ", short windows";
    }
    EXPECT_EQ(all_logits(*model, pool, tokens, {36, 4}), long_windows)
        << threads << " threads, inline rule " << inline_work_ns << ", a 36-row window";
  }
  for (double inline_work_ns : {kNever, compute::ThreadPool::kInlineAlways}) {
    compute::ThreadPool pool(2, compute::ThreadPool::kDefaultWorkerSpinMicros, inline_work_ns);
    Session session(*model, pool);
    session.prefill(std::span(tokens).first(8), 8);
    const uint64_t jobs = pool.jobs_run(), inline_jobs = pool.jobs_inline();
    for (size_t i = 8; i < 12; ++i) session.decode(tokens[i]);
    if (inline_work_ns == compute::ThreadPool::kInlineAlways) {
      EXPECT_EQ(pool.jobs_run(), jobs) << "a decode row handed work to the workers";
      EXPECT_GT(pool.jobs_inline(), inline_jobs);
    } else {
      EXPECT_GT(pool.jobs_run(), jobs);
      EXPECT_EQ(pool.jobs_inline(), inline_jobs);
    }
  }
}

TEST(ModelLoad, ShapeMismatchNamesTensorAndShapes) {
  // Metadata says 32-wide experts, tensors are written for 16.
  HParams meta = synth_shape("tiny-qwen3moe");
  HParams tensors = meta;
  tensors.n_ff_exp = 16;
  const std::string path = temp_path("strata-bad-shape");
  GgufWriter writer;
  write_hparams(writer, meta);
  for (const TensorSpec& spec : tensor_specs(tensors)) {
    std::vector<uint8_t> zeros(size_t(spec.n_elements()) * 4);
    writer.add_tensor(spec.name, GgmlType::F32, spec.ne, zeros);
  }
  writer.write_file(path);
  try {
    Model::load(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("blk.0.ffn_gate_exps.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("expected shape [64, 32, 32], found [64, 16, 32]"), std::string::npos)
        << message;
  }
  std::remove(path.c_str());
}

TEST(ModelLoad, WrongArchitectureIsNamed) {
  HParams hp = synth_shape("tiny-qwen3moe");
  const std::string path = temp_path("strata-bad-arch");
  GgufWriter writer;
  writer.add_string("general.architecture", "llama");
  writer.write_file(path);
  try {
    Model::load(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("found 'llama'"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace strata
