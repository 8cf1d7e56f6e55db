// Parity with llama.cpp: a GGUF written by `strata convert` (f32) loads in llama.cpp — the prebuilt
// CPU libllama of node-llama-cpp@3.21.1, driven by tools/llama_cpp/dump_logprobs.mjs — and
// llama.cpp's next-token distribution of every prompt position agrees with strata's forward on the
// same file. docs/llama-cpp-parity.md has the commands and the measured numbers.
//
// What is compared: log-softmax rows (node-llama-cpp exposes no raw logits, only the softmax of
// them; see the script's header). A log-softmax row is the logit row minus one constant, so
// |Δ log p| ≤ 2·max|Δ logit| and a real forward difference cannot hide in it.
//
// Fixtures: the tiny random checkpoints of tests/data/models (docs/fixtures.md). They carry no
// tokenizer, and llama.cpp refuses a GGUF without one, so each test copies hf/ to a temp dir and
// adds a byte-level BPE stub vocabulary of exactly vocab_size tokens (byte_bpe_stub.h) before
// converting. The committed fixtures are never modified.
//
// qwen4exp: llama.cpp departs from transformers — the reference, which strata matches to 1e-5
// (tests/model/forward_fixture_test.cpp) — once QSA starts dropping blocks. With the fixture's
// indexer budget of 8 tokens (2 blocks of 4) both select every visible token while a query sees at
// most budget + 3 = 11 tokens (positions 0..10); from a query that sees budget + 4 tokens on
// (position 11 on), transformers keeps the top blocks plus the 0–3 tail tokens while llama.cpp
// keeps a per-token top-(budget+3) of cells, and the two diverge (measured 1e-2..1.5e-1; the
// same with llama.cpp fed token by token, so it is not a batching effect). So for qwen4exp only
// positions 0..budget+2 are asserted; later ones are printed, not asserted.
// Also for qwen4exp: the file is converted without the MTP head (strata convert --no-mtp), because
// this llama.cpp build has no qwen4exp MTP graph and refuses a file carrying it.
//
// Skips (GTEST_SKIP, with the reason) when node or tools/llama_cpp/node_modules is absent: run
// scripts/install-llama-cpp-peer.sh to install node-llama-cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../common/f32_file.h"
#include "byte_bpe_stub.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/thread_pool.h"
#include "convert/convert.h"
#include "engine/window.h"
#include "gguf/gguf.h"
#include "llama_cpp_driver.h"
#include "model/model.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using test_support::read_f32_file;
using testing_llama_cpp::log_softmax_rows;
using testing_llama_cpp::read_text;

// Tolerance on |Δ log p| per vocabulary entry. Measured worst case (docs/llama-cpp-parity.md):
// 2.1e-6 qwen3moe, 5.3e-6 qwen3next, 1.4e-5 qwen4exp (positions 0..10), and transformers vs
// llama.cpp is the same size, so it is f32 summation-order noise of llama.cpp against both:
// ggml's blocked f32 dot products, its chunked GDN and its own softmax vs strata's kernels.
// Transformers' own prefill-vs-decode disagreement on these models reaches 1.0e-5
// (docs/fixtures.md), so 1e-4 (the bound of the transformers gate, forward_fixture_test.cpp) leaves
// ~7× headroom over the worst measurement, while a real defect (a wrong norm weight, RoPE pairing,
// expert, head or conv order, a dropped transform in convert) moves these logits by 1e-2..1 (logit
// spread ≈ 1): qwen4exp's own QSA divergence shows up as 1e-2..1.5e-1.
constexpr double kTolerance = 1e-4;

std::string fixture_dir(const std::string& arch) {
  return std::string(STRATA_TEST_DATA_DIR) + "/models/" + arch;
}

// Why the llama.cpp side cannot run here, or "" when it can.
std::string llama_cpp_unavailable_reason() {
  const std::string reason = testing_llama_cpp::node_llama_cpp_unavailable_reason();
  if (!reason.empty()) return reason;
  if (!fs::is_directory(fs::path(STRATA_LLAMA_CPP_TOOL_DIR) /
                        "node_modules/@node-llama-cpp/linux-x64/bins")) {
    return "node-llama-cpp's prebuilt CPU binary (@node-llama-cpp/linux-x64) is missing; this "
           "test only uses the prebuilt libllama (never a source build)";
  }
  return "";
}

// Copies the fixture checkpoint `arch`/hf into `work_dir`/hf, adds the stub vocabulary and converts
// it (f32) to `gguf_path`. Returns what the stub holds.
testing_llama_cpp::ByteBpeStubSummary convert_fixture_with_stub_vocab(const std::string& arch,
                                                                      const fs::path& work_dir,
                                                                      const std::string& gguf_path,
                                                                      bool include_mtp) {
  fs::remove_all(work_dir);
  fs::create_directories(work_dir / "hf");
  for (const auto& entry : fs::directory_iterator(fixture_dir(arch) + "/hf")) {
    fs::copy_file(entry.path(), work_dir / "hf" / entry.path().filename());
  }
  const nlohmann::json config = nlohmann::json::parse(read_text(work_dir / "hf/config.json"));
  const auto summary = testing_llama_cpp::write_byte_bpe_stub((work_dir / "hf").string(),
                                                              config["vocab_size"].get<int64_t>());
  convert::ConvertOptions options;
  options.hf_dir = (work_dir / "hf").string();
  options.out_path = gguf_path;
  options.type = GgmlType::F32;
  options.include_mtp = include_mtp;
  options.show_progress = false;
  EXPECT_TRUE(convert::convert_hf_to_gguf(options).has_tokenizer) << arch;
  return summary;
}

struct RowComparison {
  double max_abs_diff = 0;
  bool same_argmax = false;
  double top2_margin = 0;  // of row a: how decided its argmax is
};

template <typename A, typename B>
RowComparison compare_row(const A* a, const B* b, size_t n) {
  RowComparison result;
  for (size_t v = 0; v < n; ++v)
    result.max_abs_diff = std::max(result.max_abs_diff, std::fabs(double(a[v]) - double(b[v])));
  const size_t best = size_t(std::max_element(a, a + n) - a);
  result.same_argmax = best == size_t(std::max_element(b, b + n) - b);
  double second = -INFINITY;
  for (size_t v = 0; v < n; ++v) {
    if (v != best) second = std::max(second, double(a[v]));
  }
  result.top2_margin = double(a[best]) - second;
  return result;
}

class LlamaCppParity : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string reason = llama_cpp_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << "llama.cpp parity not run: " << reason;
    const std::string arch = GetParam();
    work_dir =
        fs::temp_directory_path() / ("strata-llama-cpp-" + arch + "-" + std::to_string(getpid()));
    gguf_path = (work_dir / "model-f32.gguf").string();
    // llama.cpp v0.4.0 has no qwen4exp MTP graph and creates none of the 32 blk.<L>.* head
    // tensors, so a file with the head fails its tensor count check ("done_getting_tensors: wrong
    // number of tensors; expected 145, got 113"); the trunk is what is compared: leave it out.
    convert_fixture_with_stub_vocab(arch, work_dir, gguf_path, /*include_mtp=*/arch != "qwen4exp");
    ASSERT_FALSE(HasFailure()) << "strata convert did not write a tokenizer section";
    manifest = nlohmann::json::parse(read_text(fixture_dir(arch) + "/ref/manifest.json"));
  }
  void TearDown() override {
    if (!work_dir.empty()) fs::remove_all(work_dir);
  }

  std::vector<std::vector<float>> llama_cpp_logprobs(
      const std::vector<std::vector<int32_t>>& prompts, size_t n_vocab) {
    return testing_llama_cpp::llama_cpp_logprobs(work_dir, gguf_path, prompts, n_vocab, GetParam(),
                                                 /*print_summary=*/true);
  }

  fs::path work_dir;
  std::string gguf_path;
  nlohmann::json manifest;
  compute::ThreadPool pool{2};
};

TEST_P(LlamaCppParity, ConvertedGgufLogitsAgreeWithLlamaCpp) {
  const std::string arch = GetParam();
  const std::unique_ptr<Model> model = Model::load(gguf_path);
  const HParams& hp = model->hparams();
  const size_t n_vocab = size_t(hp.n_vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& prompt : manifest["prompts"])
    prompts.push_back(prompt["ids"].get<std::vector<int32_t>>());
  const std::vector<std::vector<float>> llama = llama_cpp_logprobs(prompts, n_vocab);
  ASSERT_EQ(llama.size(), prompts.size());
  const bool verbose = std::getenv("STRATA_PARITY_VERBOSE") != nullptr;  // per-position lines

  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& ids = prompts[p];
    ModelState state = model->new_state();
    std::vector<float> logits;
    WindowRunner(*model).run(pool, state, ids, LogitRows::All, logits);
    const std::vector<double> ours = log_softmax_rows(logits.data(), ids.size(), n_vocab);
    const std::vector<float> hf_logits = read_f32_file(
        fmt::format("{}/ref/prefill_logits_p{}.bin", fixture_dir(arch), p), ids.size() * n_vocab);
    const std::vector<double> hf = log_softmax_rows(hf_logits.data(), ids.size(), n_vocab);

    // qwen4exp: only queries that see at most budget + 3 tokens (positions 0..budget+2), where
    // every block is selected by both engines (see the file comment).
    const size_t n_asserted =
        arch == "qwen4exp" ? std::min(ids.size(), size_t(hp.indexer_top_k) + 3) : ids.size();
    double worst_asserted = 0, worst_hf = 0, worst_beyond = 0, min_margin = INFINITY;
    size_t argmax_agree = 0, beyond_within_tolerance = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const RowComparison vs_ours =
          compare_row(ours.data() + t * n_vocab, llama[p].data() + t * n_vocab, n_vocab);
      const RowComparison vs_hf =
          compare_row(hf.data() + t * n_vocab, llama[p].data() + t * n_vocab, n_vocab);
      if (verbose) {
        std::printf(
            "  %s p%zu t%zu: strata-llama.cpp %.3g, transformers-llama.cpp %.3g, same argmax %d\n",
            arch.c_str(), p, t, vs_ours.max_abs_diff, vs_hf.max_abs_diff, int(vs_ours.same_argmax));
      }
      if (t >= n_asserted) {
        worst_beyond = std::max(worst_beyond, vs_ours.max_abs_diff);
        beyond_within_tolerance += vs_ours.max_abs_diff <= kTolerance;
        continue;
      }
      worst_asserted = std::max(worst_asserted, vs_ours.max_abs_diff);
      worst_hf = std::max(worst_hf, vs_hf.max_abs_diff);
      argmax_agree += vs_ours.same_argmax;
      min_margin = std::min(min_margin, vs_ours.top2_margin);
      EXPECT_LE(vs_ours.max_abs_diff, kTolerance) << arch << " prompt " << p << " position " << t;
      // Within the tolerance the top token can only flip when the top-2 margin is below
      // 2·tolerance.
      if (vs_ours.top2_margin > 2 * kTolerance) {
        EXPECT_TRUE(vs_ours.same_argmax) << arch << " prompt " << p << " position " << t;
      }
    }
    std::printf(
        "%s prompt %zu: positions 0..%zu of %zu: max |dlogprob| strata-llama.cpp %.3g, "
        "transformers-llama.cpp %.3g, argmax agree %zu/%zu (min top-2 margin %.3g)",
        arch.c_str(), p, n_asserted - 1, ids.size(), worst_asserted, worst_hf, argmax_agree,
        n_asserted, min_margin);
    if (n_asserted < ids.size()) {
      std::printf(
          "; positions %zu.. (QSA drops blocks, llama.cpp departs; not asserted): max %.3g, %zu of "
          "%zu within %.0e",
          n_asserted, worst_beyond, beyond_within_tolerance, ids.size() - n_asserted, kTolerance);
    }
    std::printf("\n");
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, LlamaCppParity,
                         testing::Values("qwen3moe", "qwen3next", "qwen4exp"));

// The stub vocabulary is what makes the converted file loadable; check it without llama.cpp:
// exactly vocab_size tokens, none of them the converter's "[PAD<id>]" filler, and ≥ 1 merge.
TEST(ByteBpeStub, ConvertWritesAFullVocabularyWithMerges) {
  for (const std::string arch : {"qwen3next", "qwen3moe"}) {
    const fs::path dir =
        fs::temp_directory_path() / ("strata-bpe-stub-" + arch + "-" + std::to_string(getpid()));
    const std::string gguf_path = (dir / "model.gguf").string();
    const auto summary =
        convert_fixture_with_stub_vocab(arch, dir, gguf_path, /*include_mtp=*/true);
    const int64_t vocab_size = summary.n_byte_tokens + summary.n_merges;
    EXPECT_EQ(vocab_size, arch == "qwen3next" ? 256 : 512);  // docs/fixtures.md
    EXPECT_GE(summary.n_merges, 1);
    const auto file = GgufFile::open(gguf_path);
    const auto tokens = file->get<std::vector<std::string>>("tokenizer.ggml.tokens");
    ASSERT_EQ(int64_t(tokens.size()), vocab_size) << arch;
    for (const std::string& token : tokens)
      EXPECT_FALSE(token.starts_with("[PAD")) << arch << ": " << token;
    EXPECT_EQ(tokens[0x0A], testing_llama_cpp::gpt2_byte_spelling(0x0A));  // "\n" → "Ċ" (U+010A)
    EXPECT_EQ(tokens[0x0A], "\xC4\x8A");
    EXPECT_EQ(tokens[0x20], "\xC4\xA0");  // " " → "Ġ" (U+0120)
    EXPECT_EQ(tokens[size_t(summary.n_byte_tokens)], "aa");
    const auto merges = file->get<std::vector<std::string>>("tokenizer.ggml.merges");
    ASSERT_EQ(int64_t(merges.size()), summary.n_merges) << arch;
    EXPECT_EQ(merges[0], "a a");
    EXPECT_EQ(file->get<std::string>("tokenizer.ggml.model"), "gpt2");
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace strata
