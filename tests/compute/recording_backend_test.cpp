// The forward goes only through the Backend interface (issue 19): a pass-through backend that
// records every op and forwards it to the CPU backend runs every fixture — the three
// architectures' transformers fixtures, the unseen shapes (dk != dv, compress ratio 0) and the
// embedded default model — through prefill, decode and a speculative verify + rollback, and must
// give bitwise the CPU backend's logits. The op log also shows the forward's shape (one moe per
// layer and window, one ple per window, ...). The MTP draft head (qwen4exp, qwen3next) goes
// through its own backend the same way.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/fixture_convert.h"
#include "../common/fixture_models.h"
#include "../common/temp_dir.h"
#include "backends/cpu_backend.h"
#include "compute/backend.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/thread_pool.h"
#include "engine/window.h"
#include "model/model.h"

namespace strata {
namespace {

using compute::Backend;
using compute::Tensor;

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::vector<std::string> log;
  std::map<std::string, int> count;

  std::string_view name() const override { return "recording"; }
  Tensor alloc(compute::DType type, int64_t max_rows, int64_t width) override {
    note("alloc");
    return inner_->alloc(type, max_rows, width);
  }
  void release(Tensor t) override {
    note("release");
    inner_->release(t);
  }
  void read(Tensor t, int64_t first_row, int64_t n_rows, float* out) override {
    note("read");
    inner_->read(t, first_row, n_rows, out);
  }
  void write(Tensor t, int64_t first_row, int64_t n_rows, const float* in) override {
    note("write");
    inner_->write(t, first_row, n_rows, in);
  }
  void begin_window(compute::ThreadPool& pool) override {
    note("begin_window");
    inner_->begin_window(pool);
  }
  void embed(const compute::WeightMatrix& table, std::span<const int32_t> tokens,
             Tensor out) override {
    note("embed");
    inner_->embed(table, tokens, out);
  }
  void repeat(Tensor x, int n, Tensor out, int64_t n_rows) override {
    note("repeat");
    inner_->repeat(x, n, out, n_rows);
  }
  void pair_rows(Tensor a, Tensor b, int n_streams, Tensor out, int64_t n_rows) override {
    note("pair_rows");
    inner_->pair_rows(a, b, n_streams, out, n_rows);
  }
  void rms_norm(Tensor x, std::span<const float> w, float eps, Tensor out,
                int64_t n_rows) override {
    note("rms_norm");
    inner_->rms_norm(x, w, eps, out, n_rows);
  }
  void add(Tensor acc, Tensor y, int64_t n_rows) override {
    note("add");
    inner_->add(acc, y, n_rows);
  }
  void matmul(const compute::WeightMatrix& w, Tensor x, int64_t first_row, int64_t n_rows,
              Tensor y) override {
    note("matmul");
    inner_->matmul(w, x, first_row, n_rows, y);
  }
  void argmax(Tensor x, int64_t n_rows, Tensor ids) override {
    note("argmax");
    inner_->argmax(x, n_rows, ids);
  }
  void hyper_connection_in(const HyperConnectionWeights& w, int s, float eps, Tensor X, Tensor x,
                           Tensor inject, int64_t n_rows) override {
    note("hyper_connection_in");
    inner_->hyper_connection_in(w, s, eps, X, x, inject, n_rows);
  }
  void hyper_connection_out(int s, Tensor y, Tensor inject, Tensor X, int64_t n_rows) override {
    note("hyper_connection_out");
    inner_->hyper_connection_out(s, y, inject, X, n_rows);
  }
  void gated_deltanet(const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                      GatedDeltaNetState& st, int layer, Tensor x, Tensor y, int64_t n_rows,
                      bool record) override {
    note("gated_deltanet");
    inner_->gated_deltanet(dims, w, st, layer, x, y, n_rows, record);
  }
  void attention(const AttentionDims& dims, const AttentionWeights& w, KvCache& cache, int layer,
                 Tensor x, Tensor y, int64_t n_rows) override {
    note("attention");
    inner_->attention(dims, w, cache, layer, x, y, n_rows);
  }
  void ple(const PleDims& dims, const PleWeights& w, PleState& st, PleRowReader& rows, Tensor X,
           int64_t n_rows, bool record) override {
    note("ple");
    inner_->ple(dims, w, st, rows, X, n_rows, record);
  }
  void moe(const MoeDims& dims, const MoeWeights& w, ExpertSource& experts, int layer, Tensor x,
           Tensor y, int64_t n_rows, const MoeWeights* next) override {
    note("moe");
    inner_->moe(dims, w, experts, layer, x, y, n_rows, next);
  }

 private:
  void note(const char* op) {
    log.emplace_back(op);
    ++count[op];
  }
  std::unique_ptr<Backend> inner_;
};

std::vector<std::vector<int32_t>> fixture_prompts(const std::string& arch, int vocab) {
  std::vector<std::vector<int32_t>> prompts;
  if (!arch.empty()) {
    std::ifstream file(std::string(STRATA_TEST_DATA_DIR) + "/models/" + arch +
                       "/ref/manifest.json");
    const nlohmann::json manifest = nlohmann::json::parse(file);
    for (const auto& p : manifest["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
  } else {
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(int32_t((i * 53 + 7) % vocab));
    prompts.push_back(ids);
  }
  return prompts;
}

// Logits of: the prompt's prefill (all rows, in windows of 5), 6 greedy decode steps, a 3-row
// verify window kept to 2 rows and one more decode step.
std::vector<float> run(const Model& model, compute::ThreadPool& pool, ModelState& state,
                       const std::vector<int32_t>& prompt) {
  std::vector<float> all, logits;
  for (size_t begin = 0; begin < prompt.size(); begin += 5) {
    const size_t n = std::min<size_t>(5, prompt.size() - begin);
    WindowRunner(model).run(pool, state, std::span(prompt).subspan(begin, n), LogitRows::All, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  const int64_t vocab = model.hparams().n_vocab;
  auto last_argmax = [&] {
    return int32_t(compute::argmax(logits.data() + logits.size() - size_t(vocab), vocab));
  };
  int32_t token = last_argmax();
  for (int i = 0; i < 6; ++i) {
    const int32_t one[1] = {token};
    WindowRunner(model).run(pool, state, one, LogitRows::Last, logits);
    all.insert(all.end(), logits.begin(), logits.end());
    token = last_argmax();
  }
  const int32_t window[3] = {token, int32_t((token + 1) % vocab), int32_t((token + 2) % vocab)};
  state.record_windows = true;
  WindowRunner(model).run(pool, state, window, LogitRows::All, logits);
  state.record_windows = false;
  all.insert(all.end(), logits.begin(), logits.end());
  WindowRunner(model).rollback(pool, state, 2);
  const int32_t next[1] = {int32_t((token + 5) % vocab)};
  WindowRunner(model).run(pool, state, next, LogitRows::Last, logits);
  all.insert(all.end(), logits.begin(), logits.end());
  return all;
}

TEST(RecordingBackend, EveryFixtureGivesTheCpuBackendsLogitsBitwise) {
  struct Case {
    std::string arch, path;
  };
  std::vector<Case> cases;
  for (const char* arch : {"qwen3moe", "qwen3next", "qwen4exp"})
    cases.push_back({arch, test_support::fixture_model_gguf(arch)});
  cases.push_back({"", std::string(STRATA_TEST_DATA_DIR) + "/../../models/strata-default.gguf"});
  // The unseen shapes (key head dim != value head dim, and the dense-budget QSA model as
  // converted and in llama.cpp's compress-ratio-0 form), converted here.
  const test_support::ScratchDir scratch("recording");
  for (const std::string arch : {"qwen4exp_dkdv", "qwen3next_dkdv", "qwen4exp_dense"}) {
    const std::string path = scratch.file(arch + ".gguf");
    test_support::convert_fixture(arch, path);
    cases.push_back({arch, path});
  }
  const std::string ratio0 = scratch.file("qwen4exp_dense-ratio0.gguf");
  test_support::convert_fixture("qwen4exp_dense", ratio0);
  test_support::zero_compress_ratios(ratio0);
  cases.push_back({"qwen4exp_dense", ratio0});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    auto model = Model::load(c.path);
    compute::ThreadPool pool(2);
    for (const std::vector<int32_t>& prompt : fixture_prompts(c.arch, int(model->hparams().n_vocab))) {
      ModelState plain = model->new_state();
      const std::vector<float> want = run(*model, pool, plain, prompt);

      ModelState recorded = model->new_state();
      auto recording = std::make_unique<RecordingBackend>(std::make_unique<compute::CpuBackend>());
      RecordingBackend* log = recording.get();
      recorded.backend = std::move(recording);
      const std::vector<float> got = run(*model, pool, recorded, prompt);

      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "logits through the recording backend differ from the CPU backend's";
      const size_t n_windows = (prompt.size() + 4) / 5 + 6 + 1 + 1;
      const HParams& hp = model->hparams();
      EXPECT_EQ(log->count["begin_window"], int(n_windows));
      EXPECT_EQ(log->count["moe"], int(n_windows) * hp.n_layer);
      EXPECT_EQ(log->count["embed"], int(n_windows));
      EXPECT_EQ(log->count["ple"], hp.has_ple() ? int(n_windows) : 0);
      int n_gdn = 0;
      for (LayerKind kind : hp.layer_kinds) n_gdn += kind == LayerKind::GatedDeltaNet;
      EXPECT_EQ(log->count["gated_deltanet"], int(n_windows) * n_gdn);
      EXPECT_EQ(log->count["attention"], int(n_windows) * (hp.n_layer - n_gdn));
      EXPECT_GE(log->count["read"], int(n_windows));
    }
  }
}

// A backend without batched mixers (batched_mixers() false, copy_rows by host staging: the
// defaults of compute/backend.h, as the CUDA backend has them) still runs a batched window
// exactly: each sequence's rows are copied out for its mixers and back.
TEST(RecordingBackend, BatchedWindowThroughTheCopyPathEqualsEachSequenceAlone) {
  for (const char* arch : {"qwen3moe", "qwen3next", "qwen4exp"}) {
    SCOPED_TRACE(arch);
    auto model = Model::load(test_support::fixture_model_gguf(arch));
    compute::ThreadPool pool(2);
    const int vocab = int(model->hparams().n_vocab);
    const std::vector<std::vector<int32_t>> rows = {
        {3 % vocab}, {5 % vocab, 9 % vocab, 1}, {7 % vocab, 2, 4 % vocab}};
    std::vector<ModelState> alone, batched;
    std::vector<std::vector<float>> want(rows.size()), got(rows.size());
    std::vector<ModelState*> states;
    std::vector<std::span<const int32_t>> tokens;
    std::vector<std::vector<float>*> outs;
    for (size_t i = 0; i < rows.size(); ++i) {
      alone.push_back(model->new_state(64));
      batched.push_back(model->new_state(64));
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      WindowRunner(*model).run(pool, alone[i], rows[i], LogitRows::Last, want[i]);
      states.push_back(&batched[i]);
      tokens.emplace_back(rows[i]);
      outs.push_back(&got[i]);
    }
    BatchWindow batch;
    auto recording = std::make_unique<RecordingBackend>(std::make_unique<compute::CpuBackend>());
    RecordingBackend* log = recording.get();
    batch.backend = std::move(recording);
    WindowRunner(*model).run_batch(pool, batch, states, tokens, outs);
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0)
          << "sequence " << i;
    const HParams& hp = model->hparams();
    EXPECT_EQ(log->count["moe"], hp.n_layer);  // the row-wise ops once for the window
    EXPECT_EQ(log->count["gated_deltanet"] + log->count["attention"], 3 * hp.n_layer);
    EXPECT_GT(log->count["write"], 0);  // the default copy_rows staged through the host
  }
}

// The MTP head's drafts through a recording backend: the same draft logits and head outputs,
// bitwise, as on the CPU backend, for a first draft over every prompt row and two chained ones.
TEST(RecordingBackend, MtpHeadGivesTheCpuBackendsDraftsBitwise) {
  for (const char* arch : {"qwen4exp", "qwen3next"}) {
    SCOPED_TRACE(arch);
    auto model = Model::load(test_support::fixture_model_gguf(arch));
    ASSERT_TRUE(model->has_mtp());
    compute::ThreadPool pool(2);
    const HParams& hp = model->hparams();
    const size_t width = size_t(hp.hc_count * hp.n_embd);
    const std::vector<int32_t> prompt = fixture_prompts(arch, int(hp.n_vocab)).front();
    ModelState trunk = model->new_state();
    std::vector<float> logits;
    WindowRunner(*model).run(pool, trunk, prompt, LogitRows::None, logits);
    std::vector<int32_t> following(prompt.begin() + 1, prompt.end());
    following.push_back(prompt.front());

    auto drafts = [&](MtpState& head) {
      std::vector<float> all, out, step;
      model->mtp_forward(pool, head, trunk.residuals.data(), following, step, &out);
      all = step;
      all.insert(all.end(), out.begin(), out.end());
      for (int i = 0; i < 2; ++i) {
        const std::vector<float> last(out.end() - ptrdiff_t(width), out.end());
        const int32_t token[1] = {
            int32_t(compute::argmax(step.data() + step.size() - size_t(hp.n_vocab), hp.n_vocab))};
        model->mtp_forward(pool, head, last.data(), token, step, &out);
        all.insert(all.end(), step.begin(), step.end());
        all.insert(all.end(), out.begin(), out.end());
      }
      return all;
    };
    MtpState plain;
    const std::vector<float> want = drafts(plain);
    MtpState recorded;
    auto recording = std::make_unique<RecordingBackend>(std::make_unique<compute::CpuBackend>());
    RecordingBackend* log = recording.get();
    recorded.backend = std::move(recording);
    const std::vector<float> got = drafts(recorded);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "drafts through the recording backend differ from the CPU backend's";
    EXPECT_EQ(log->count["begin_window"], 3);
    EXPECT_EQ(log->count["pair_rows"], 3);
    EXPECT_EQ(log->count["attention"], 3);
    EXPECT_EQ(log->count["moe"], 3);
    EXPECT_EQ(log->count["matmul"], 6);  // eh_proj and the output head
    EXPECT_EQ(plain.kv.n_tokens, int64_t(prompt.size()) + 2);
  }
}

}  // namespace
}  // namespace strata
