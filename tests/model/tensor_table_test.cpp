// The tensor table (model/tensor_specs.h, model/tensor_table.h) is the one declaration of each
// architecture's tensors. These tests hold the loader to it:
// - agreement: on synthetic files of every architecture (with and without MTP heads, tied and
//   untied, with an optional tensor present), on the committed fixtures, on what `strata convert`
//   writes for every fixture checkpoint and on the default model, the model loads every declared
//   tensor the file holds, each once, and nothing else, and the file holds nothing undeclared;
// - malformed files: an optional tensor present with the wrong shape, a required one missing (the
//   q/k norms, which the loader once treated as optional), a refused layout, a short PLE table,
//   each named with the file, the tensor, expected and found;
// - misuse inside strata (an undeclared name, the wrong accessor for a role) is an error too.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "../common/fixture_models.h"
#include "../common/temp_dir.h"
#include "convert/convert.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/tensor_specs.h"
#include "model/tensor_table.h"
#include "synth/synth.h"
#include "util/error.h"

namespace strata {
namespace {

using test_support::ScratchDir;

// A synth shape name, optionally with "+mtp": the shape with a random MTP head in llama.cpp's
// layout (the trailing block; qwen4exp's head attends densely, ratio 0).
HParams shape(const std::string& name) {
  const std::string suffix = "+mtp";
  const bool mtp = name.ends_with(suffix);
  HParams hp = synth_shape(mtp ? name.substr(0, name.size() - suffix.size()) : name);
  if (mtp) {
    hp.n_nextn = 1;
    if (hp.arch == Arch::Qwen4Exp) hp.compress_ratios.push_back(0);
  }
  return hp;
}

std::string write_synth(const ScratchDir& dir, const std::string& name) {
  SynthOptions options;
  options.hparams = shape(name);
  options.seed = 5;
  const std::string path = dir.file(name + ".gguf");
  write_synthetic_model(options, path);
  return path;
}

// Rewrites `source` into `path` without the tensors in `drop` and with the tensors in `put`
// (replaced or added, F32 zeros of the given ggml shape); everything else is copied.
void write_edited(const std::string& source_path, const std::string& path,
                  const std::set<std::string>& drop,
                  const std::map<std::string, std::vector<int64_t>>& put) {
  const auto source = GgufFile::open(source_path);
  GgufWriter writer;
  for (const std::string& key : source->keys()) writer.add(key, *source->find(key));
  std::map<std::string, std::vector<uint8_t>> zeros;
  auto add_zeros = [&](const std::string& name, const std::vector<int64_t>& ne) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    zeros[name].assign(size_t(n) * sizeof(float), 0);
    writer.add_tensor(name, GgmlType::F32, ne, zeros[name]);
  };
  for (const TensorInfo& t : source->tensors()) {
    if (drop.count(t.name)) continue;
    if (auto it = put.find(t.name); it != put.end()) {
      add_zeros(t.name, it->second);
      continue;
    }
    writer.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                      std::span<const uint8_t>(source->tensor_data(t), t.n_bytes));
  }
  for (const auto& [name, ne] : put)
    if (!source->find_tensor(name)) add_zeros(name, ne);
  writer.write_file(path);
}

// The message Model::load throws for `path` (or a test failure if it loads).
std::string load_error(const std::string& path) {
  try {
    Model::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << path << " loaded; expected an error";
  return "";
}

// Every declared tensor the file holds is loaded exactly once, nothing undeclared is loaded, an
// absent declared tensor is Optional, a refused one is absent, and the file holds nothing the
// table does not declare.
void expect_agreement(const Model& model, const std::string& what) {
  const GgufFile& file = model.file();
  const std::vector<TensorSpec> specs = tensor_specs(model.hparams());
  std::map<std::string, const TensorSpec*> declared;
  for (const TensorSpec& spec : specs) declared[spec.name] = &spec;
  std::map<std::string, int> loaded;
  for (const std::string& name : model.loaded_tensors()) ++loaded[name];

  for (const auto& [name, count] : loaded) {
    EXPECT_EQ(count, 1) << what << ": " << name << " loaded " << count << " times";
    const auto it = declared.find(name);
    ASSERT_NE(it, declared.end()) << what << ": loaded " << name << ", which is not declared";
    EXPECT_NE(it->second->presence, Presence::Refused) << what << ": loaded refused " << name;
  }
  for (const TensorSpec& spec : specs) {
    const bool in_file = file.find_tensor(spec.name) != nullptr;
    if (spec.presence == Presence::Refused) {
      EXPECT_FALSE(in_file) << what << ": " << spec.name;
    } else if (in_file) {
      EXPECT_EQ(loaded.count(spec.name), 1u)
          << what << ": declared " << spec.name << " is in the file but was not loaded";
    } else {
      EXPECT_EQ(spec.presence, Presence::Optional)
          << what << ": required " << spec.name << " is absent, yet the model loaded";
      EXPECT_EQ(loaded.count(spec.name), 0u) << what << ": " << spec.name;
    }
  }
  for (const TensorInfo& t : file.tensors())
    EXPECT_EQ(declared.count(t.name), 1u)
        << what << ": the file's " << t.name << " is not declared";
}

class TableAgreement : public testing::TestWithParam<std::string> {};

TEST_P(TableAgreement, SynthFileLoadsEveryDeclaredTensorAndNothingElse) {
  const ScratchDir dir("table-agreement");
  const std::string path = write_synth(dir, GetParam());
  const auto model = Model::load(path);
  expect_agreement(*model, GetParam());
  // synth writes exactly the entries marked `synthesized`, in table order.
  std::vector<std::string> synthesized, written;
  for (const TensorSpec& spec : tensor_specs(model->hparams()))
    if (spec.synthesized) synthesized.push_back(spec.name);
  for (const TensorInfo& t : model->file().tensors()) written.push_back(t.name);
  EXPECT_EQ(written, synthesized);
}

INSTANTIATE_TEST_SUITE_P(Archs, TableAgreement,
                         testing::Values("tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen4exp",
                                         "tiny-qwen3next+mtp", "tiny-qwen4exp+mtp"));

TEST(TableAgreement, OptionalTensorsAreLoadedWhenPresentAndSkippedWhenAbsent) {
  const ScratchDir dir("table-optional");
  // Tied embeddings: no output.weight; the model loads and does not ask for it.
  const std::string moe = write_synth(dir, "tiny-qwen3moe");
  const std::string tied = dir.file("tied.gguf");
  write_edited(moe, tied, {"output.weight"}, {});
  const auto tied_model = Model::load(tied);
  expect_agreement(*tied_model, "tied qwen3moe");
  const auto& tied_loaded = tied_model->loaded_tensors();
  EXPECT_EQ(std::count(tied_loaded.begin(), tied_loaded.end(), "output.weight"), 0);

  // qwen3next's MTP head with nextn.shared_head_norm (as strata convert writes it): loaded.
  const std::string next = write_synth(dir, "tiny-qwen3next+mtp");
  const HParams hp = shape("tiny-qwen3next+mtp");
  const std::string head_norm = fmt::format("blk.{}.nextn.shared_head_norm.weight", hp.n_layer);
  const std::string with_norm = dir.file("with-head-norm.gguf");
  write_edited(next, with_norm, {}, {{head_norm, {hp.n_embd}}});
  const auto model = Model::load(with_norm);
  expect_agreement(*model, "qwen3next with shared_head_norm");
  const auto& loaded = model->loaded_tensors();
  EXPECT_EQ(std::count(loaded.begin(), loaded.end(), head_norm), 1);
}

// Real files: the committed transformers fixtures, what `strata convert` writes for each fixture
// checkpoint (so the converter's shapes agree with the table too), and the default model.
TEST(TableAgreement, FixturesConvertedFilesAndTheDefaultModel) {
  const ScratchDir dir("table-fixtures");
  std::vector<std::string> paths;
  for (const char* arch : {"qwen3moe", "qwen3next", "qwen4exp"})
    paths.push_back(test_support::fixture_model_gguf(arch));
  paths.push_back(std::string(STRATA_TEST_DATA_DIR) + "/../../models/strata-default.gguf");
  for (const char* arch :
       {"qwen3moe", "qwen3next", "qwen3next_dkdv", "qwen4exp", "qwen4exp_dense", "qwen4exp_dkdv"}) {
    const std::string hf = std::string(STRATA_TEST_DATA_DIR) + "/models/" + arch + "/hf";
    ASSERT_TRUE(std::filesystem::exists(hf)) << hf;
    convert::ConvertOptions options;
    options.hf_dir = hf;
    options.out_path = dir.file(std::string(arch) + ".gguf");
    options.type = GgmlType::F32;
    options.show_progress = false;
    convert::convert_hf_to_gguf(options);
    paths.push_back(options.out_path);
  }
  for (const std::string& path : paths) {
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    expect_agreement(*Model::load(path), path);
  }
}

TEST(TensorTableCheck, OptionalTensorWithTheWrongShapeIsNamed) {
  const ScratchDir dir("table-optional-shape");
  {
    const HParams hp = shape("tiny-qwen3moe");
    const std::string bad = dir.file("bad-output.gguf");
    write_edited(write_synth(dir, "tiny-qwen3moe"), bad, {},
                 {{"output.weight", {hp.n_embd, hp.n_vocab + 1}}});
    const std::string message = load_error(bad);
    EXPECT_NE(message.find(bad + ": tensor output.weight: expected shape " +
                           fmt::format("[{}, {}], found [{}, {}]", hp.n_embd, hp.n_vocab, hp.n_embd,
                                       hp.n_vocab + 1)),
              std::string::npos)
        << message;
  }
  {
    const HParams hp = shape("tiny-qwen3next+mtp");
    const std::string name = fmt::format("blk.{}.nextn.shared_head_norm.weight", hp.n_layer);
    const std::string bad = dir.file("bad-head-norm.gguf");
    write_edited(write_synth(dir, "tiny-qwen3next+mtp"), bad, {}, {{name, {hp.n_embd + 1}}});
    const std::string message = load_error(bad);
    EXPECT_NE(message.find(fmt::format("{}: tensor {}: expected shape [{}], found [{}]", bad, name,
                                       hp.n_embd, hp.n_embd + 1)),
              std::string::npos)
        << message;
  }
}

// attn_q_norm / attn_k_norm are required (llama.cpp requires them for qwen3moe and qwen3next);
// the loader used to skip the attention norms of a file without them.
TEST(TensorTableCheck, RequiredTensorMissingIsNamed) {
  const ScratchDir dir("table-required");
  struct Case {
    const char* shape;
    std::string drop;
  };
  const int attention_layer = 3;  // tiny-qwen3next: GDN, GDN, GDN, attention
  for (const Case& c :
       {Case{"tiny-qwen3moe", "blk.1.attn_q_norm.weight"},
        Case{"tiny-qwen3next", fmt::format("blk.{}.attn_k_norm.weight", attention_layer)},
        Case{"tiny-qwen4exp", "blk.1.ple_key.weight"}}) {
    const std::string bad = dir.file(std::string("missing-") + c.shape + ".gguf");
    write_edited(write_synth(dir, c.shape), bad, {c.drop}, {});
    const std::string message = load_error(bad);
    EXPECT_NE(message.find(bad + ": missing tensor " + c.drop), std::string::npos) << message;
  }
}

// A legacy qwen3next file (fused ssm_in instead of attn_qkv + attn_gate) gets the reason, not
// "missing tensor attn_qkv".
TEST(TensorTableCheck, RefusedLayoutIsNamedBeforeWhatItLacks) {
  const ScratchDir dir("table-refused");
  const HParams hp = shape("tiny-qwen3next");
  const std::string bad = dir.file("legacy.gguf");
  write_edited(write_synth(dir, "tiny-qwen3next"), bad,
               {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight"},
               {{"blk.0.ssm_in.weight", {hp.n_embd, hp.ssm_conv_dim() + hp.ssm_value_dim()}}});
  const std::string message = load_error(bad);
  EXPECT_NE(message.find(bad + ": tensor blk.0.ssm_in.weight: the legacy fused qkvz layout is not "
                               "supported; re-convert"),
            std::string::npos)
      << message;
}

TEST(TensorTableCheck, ShortPleTableIsNamed) {
  const ScratchDir dir("table-ple");
  const HParams hp = shape("tiny-qwen4exp");
  const int64_t rows = int64_t(hp.ple_head_offsets.back() + hp.ple_head_vocab_sizes.back());
  const std::string path = write_synth(dir, "tiny-qwen4exp");
  // More rows than the hash needs (the converter pads) load; fewer are named.
  const std::string padded = dir.file("padded.gguf");
  write_edited(path, padded, {}, {{"per_layer_token_embd.weight", {hp.ple_row_width, rows + 7}}});
  EXPECT_NO_THROW(Model::load(padded));
  const std::string bad = dir.file("short.gguf");
  write_edited(path, bad, {}, {{"per_layer_token_embd.weight", {hp.ple_row_width, rows - 1}}});
  const std::string message = load_error(bad);
  EXPECT_NE(message.find(fmt::format("{}: tensor per_layer_token_embd.weight: expected shape [{}, "
                                     "at least {}]",
                                     bad, hp.ple_row_width, rows)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(fmt::format("found [{}, {}]", hp.ple_row_width, rows - 1)),
            std::string::npos)
      << message;
}

TEST(TensorTable, UndeclaredNamesAndWrongAccessorsAreErrors) {
  const ScratchDir dir("table-misuse");
  const std::string tied = dir.file("tied.gguf");
  write_edited(write_synth(dir, "tiny-qwen3moe"), tied, {"output.weight"}, {});
  const auto file = GgufFile::open(tied);
  TensorTable table(*file, tensor_specs(shape("tiny-qwen3moe")));
  table.check();
  auto error = [](auto&& load) -> std::string {
    try {
      load();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error([&] {
              table.matrix("blk.0.attn_qq");
            }).find("tensor blk.0.attn_qq is not declared in the tensor table"),
            std::string::npos);
  EXPECT_NE(error([&] {
              table.floats("blk.0.attn_q");
            }).find("tensor blk.0.attn_q.weight is declared as a matrix but loaded as floats"),
            std::string::npos);
  EXPECT_FALSE(table.present("output"));
  EXPECT_TRUE(table.declares("output"));
  EXPECT_NE(error([&] { table.matrix("output"); }).find("missing tensor output.weight"),
            std::string::npos);
  // What was handed out is recorded, nothing else.
  EXPECT_TRUE(table.loaded().empty());
  const compute::WeightMatrix q = table.matrix("blk.0.attn_q");
  const HParams hp = shape("tiny-qwen3moe");
  EXPECT_EQ(q.n_in, hp.n_embd);
  EXPECT_EQ(q.n_out, int64_t(hp.n_head) * hp.head_dim);
  EXPECT_EQ(table.loaded(), std::vector<std::string>{"blk.0.attn_q.weight"});
}

}  // namespace
}  // namespace strata
