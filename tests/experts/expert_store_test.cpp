// The expert hierarchy on the CPU: sidecar format and validation, and the ExpertStore's promise
// that placement never changes a token (every budget, read-ahead on/off, I/O thread counts, O_DIRECT
// on/off, reading the sidecar or the GGUF itself) while residency stays a pure function of the
// tokens. Models: the three transformers
// fixtures (tests/data/models, f32) and a synthetic qwen4exp with Q4_K experts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "../common/fixture_models.h"
#include "../common/temp_dir.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "experts/expert_store.h"
#include "experts/profile.h"
#include "experts/sidecar.h"
#include "model/model.h"
#include "synth/synth.h"
#include "util/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// A scratch directory per test (tests/common/temp_dir.h).
class TempDir : public test_support::ScratchDir {
 public:
  TempDir() : ScratchDir("experts") {}
};

std::string fixture_gguf(const std::string& arch) {
  return test_support::fixture_model_gguf(arch);
}

std::string synth_q4k(const TempDir& dir, uint64_t seed = 7) {
  SynthOptions options;
  options.hparams = synth_shape("tiny-qwen4exp");
  options.dense_type = GgmlType::Q8_0;
  options.expert_type = GgmlType::Q4_K;
  options.seed = seed;
  const std::string path = dir.file(fmt::format("synth-{}.gguf", seed));
  write_synthetic_model(options, path);
  return path;
}

std::string expect_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no strata::Error thrown";
  return "";
}

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // every step's logits, concatenated
  std::vector<float> mtp;     // qwen4exp: MTP draft logits of the prompt
};

// Greedy: a prompt prefilled in windows of `window` rows, then `n` single-token steps. Window
// identity: the logits do not depend on `window`.
GreedyRun greedy(const Model& model, ExpertSource* source, int n, int threads = 2, int window = 3) {
  compute::ThreadPool pool(threads);
  Session session(model, pool, source);
  const std::vector<int32_t> prompt = {1, 17, 5, 42, 9, 3, 11};
  GreedyRun run;
  session.prefill(prompt, window);
  if (model.has_mtp()) {
    std::vector<float> draft;
    ModelState& state = session.state();
    model.mtp_forward(pool, state.mtp, state.residuals.data(), std::span<const int32_t>(prompt).last(1),
                      draft, nullptr, source);
    run.mtp = draft;
  }
  for (int i = 0; i < n; ++i) {
    const std::vector<float>& logits = session.logits();
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    run.tokens.push_back(next);
    session.decode(next);
  }
  return run;
}

// Every (layer, expert)'s slot: the residency state, to compare runs.
std::vector<uint32_t> residency(const ExpertStore& store, const Model& model) {
  std::vector<uint32_t> map;
  const SidecarLayout& layout = store.layout();
  for (uint32_t b = 0; b < layout.n_block; ++b)
    if (layout.layers[b].present)
      for (int e = 0; e < model.hparams().n_expert; ++e) map.push_back(store.slot_of(int(b), e));
  return map;
}

TEST(Sidecar, RecordsHoldTheGgufExpertBytesVerbatim) {
  TempDir dir;
  const auto gguf = GgufFile::open(synth_q4k(dir));
  const std::string path = dir.file("m.experts");
  pack_sidecar(*gguf, path);
  const Sidecar sidecar = Sidecar::open(path, *gguf);
  const SidecarLayout& layout = sidecar.layout();
  EXPECT_EQ(fs::file_size(path), layout.file_size);
  std::ifstream in(path, std::ios::binary);
  int checked = 0;
  for (uint32_t b = 0; b < layout.n_block; ++b) {
    const SidecarLayer& l = layout.layers[b];
    if (!l.present) continue;
    EXPECT_EQ(l.record_bytes % 4096, 0u);
    EXPECT_EQ(l.offset % 4096, 0u);
    const char* names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    const uint64_t offsets[3] = {0, l.up_offset, l.down_offset};
    for (uint32_t e = 0; e < layout.n_expert; e += 7) {
      std::vector<char> record(l.record_bytes);
      in.seekg(std::streamoff(layout.record_offset(int(b), int(e))));
      in.read(record.data(), std::streamsize(record.size()));
      for (int m = 0; m < 3; ++m) {
        const TensorInfo& t = gguf->tensor(fmt::format("blk.{}.{}.weight", b, names[m]));
        const uint64_t bytes = t.n_bytes / layout.n_expert;
        EXPECT_EQ(std::memcmp(record.data() + offsets[m], gguf->tensor_data(t) + e * bytes, bytes), 0)
            << "block " << b << " expert " << e << " " << names[m];
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(Sidecar, OpenRefusesDamagedOrForeignFiles) {
  TempDir dir;
  const std::string model_path = synth_q4k(dir, 7);
  const auto gguf = GgufFile::open(model_path);
  const std::string good = dir.file("good.experts");
  pack_sidecar(*gguf, good);
  const uint64_t size = fs::file_size(good);
  auto variant = [&](const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string path = dir.file(name);
    fs::copy_file(good, path, fs::copy_options::overwrite_existing);
    damage(path);
    return expect_error([&] { Sidecar::open(path, *gguf); });
  };
  auto flip = [](const std::string& path, uint64_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(offset));
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x40);
    f.seekp(std::streamoff(offset));
    f.write(&c, 1);
  };
  EXPECT_NE(variant("trunc", [&](const std::string& p) { fs::resize_file(p, size - 4096); }).find("truncated"),
            std::string::npos);
  EXPECT_NE(variant("tiny", [&](const std::string& p) { fs::resize_file(p, 100); }).find("too small"),
            std::string::npos);
  EXPECT_NE(variant("magic", [&](const std::string& p) { flip(p, 0); }).find("not an expert sidecar"),
            std::string::npos);
  EXPECT_NE(variant("header", [&](const std::string& p) { flip(p, 48); }).find("header is corrupt"),
            std::string::npos);
  EXPECT_NE(variant("table", [&](const std::string& p) { flip(p, size - 16); }).find("table checksum"),
            std::string::npos);
  // Same shapes, other weights: the sidecar is stale for this model.
  const auto other = GgufFile::open(synth_q4k(dir, 8));
  const std::string message = expect_error([&] { Sidecar::open(good, *other); });
  EXPECT_NE(message.find("stale"), std::string::npos) << message;
  EXPECT_NE(message.find("strata pack"), std::string::npos) << message;
  EXPECT_NE(expect_error([&] { Sidecar::open(dir.file("absent.experts"), *gguf); }).find("cannot open"),
            std::string::npos);
}

TEST(ExpertStore, CorruptRecordIsCaughtWhenRead) {
  TempDir dir;
  const std::string model_path = synth_q4k(dir);
  const auto model = Model::load(model_path);
  const std::string path = dir.file("m.experts");
  pack_sidecar(model->file(), path);
  Sidecar sidecar = Sidecar::open(path, model->file());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(sidecar.layout().record_offset(0, 0) + 100));
    f.put('\x7f');
    f.seekp(std::streamoff(sidecar.layout().record_offset(0, 0) + 101));
    f.put('\x01');
  }
  ExpertStoreOptions options;
  options.slots_per_layer = 32;  // every expert gets read once
  options.direct_io = false;
  ExpertStore store(*model, Sidecar::open(path, model->file()), options);
  const std::vector<int32_t> all = [&] {
    std::vector<int32_t> ids(32);
    for (int i = 0; i < 32; ++i) ids[size_t(i)] = i;
    return ids;
  }();
  store.publish(0, all);
  const std::string message = expect_error([&] {
    while (!store.wait().empty()) {
    }
  });
  EXPECT_NE(message.find("layer 0 expert 0"), std::string::npos) << message;
  EXPECT_NE(message.find("checksum"), std::string::npos) << message;
  EXPECT_EQ(store.slot_of(0, 0), ExpertStore::kMiss) << "a failed read must not stay resident";
}

// The handshake (experts/expert_source.h): after publish, the first wait delivers every hit in
// one batch; later waits deliver the misses as their reads land (with two transient slots, the
// misses beyond them wait for the batch before to be done); each expert exactly once, as the
// bytes the GGUF holds; then nothing, until the next publish. Read-ahead guesses are published
// for the next layer and become that layer's hits.
TEST(ExpertStore, DeliversTheHitsFirstThenEveryMissOnceAsTheirReadsLand) {
  TempDir dir;
  const auto model = Model::load(synth_q4k(dir));
  int layer = -1;
  for (size_t l = 0; l < model->layers().size() && layer < 0; ++l)
    if (model->layers()[l].gate_exps.mapped) layer = int(l);
  ASSERT_GE(layer, 0);
  const int n_expert = model->hparams().n_expert;
  ASSERT_GE(n_expert, 16);
  for (const int io_threads : {1, 3}) {
    SCOPED_TRACE(fmt::format("{} I/O threads", io_threads));
    ExpertStoreOptions options;
    options.slots_per_layer = 4;
    options.stream_slots = 2;
    options.io_threads = io_threads;
    options.direct_io = false;
    ExpertStore store(*model, options);
    const LayerWeights& w = model->layers()[size_t(layer)];
    auto expect_bytes = [&](int32_t e, const ExpertMatrices& m) {
      const std::pair<const compute::WeightMatrix*, compute::WeightMatrix> parts[] = {
          {&m.gate, w.gate_exps.expert(e)},
          {&m.up, w.up_exps.expert(e)},
          {&m.down, w.down_exps.expert(e)}};
      for (const auto& [got, want] : parts)
        ASSERT_EQ(std::memcmp(got->data, want.data, size_t(want.n_out) * want.row_stride_bytes), 0)
            << "expert " << e;
    };
    // Four misses into the four cache slots.
    const std::vector<int32_t> first = {0, 1, 2, 3};
    store.publish(layer, first);
    std::vector<int> seen(first.size(), 0);
    for (auto batch = store.wait(); !batch.empty(); batch = store.wait())
      for (const DeliveredExpert& d : batch) {
        ++seen[size_t(d.index)];
        expect_bytes(first[size_t(d.index)], d.matrices);
      }
    EXPECT_EQ(seen, std::vector<int>(first.size(), 1));
    // The four hits and eight misses: the cache slots are the window's own, so the misses stream
    // through the two transient slots.
    std::vector<int32_t> second = {0, 1, 2, 3};
    for (int32_t e = 5; e < 13; ++e) second.push_back(e);
    store.publish(layer, second);
    std::span<const DeliveredExpert> batch = store.wait();
    std::vector<int> count(second.size(), 0);
    for (const DeliveredExpert& d : batch) ++count[size_t(d.index)];
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(count[size_t(i)], 1) << "hit " << i << " in the first batch";
    size_t batches = 0;
    for (; !batch.empty(); batch = store.wait(), ++batches) {
      int misses = 0;
      for (const DeliveredExpert& d : batch) {
        if (batches > 0) ++count[size_t(d.index)];
        misses += d.index >= 4;
        expect_bytes(second[size_t(d.index)], d.matrices);
      }
      EXPECT_LE(misses, 2) << "batch " << batches << ": more misses than transient slots";
    }
    EXPECT_EQ(count, std::vector<int>(second.size(), 1));
    EXPECT_GE(batches, 4u) << "eight misses through two transient slots take several batches";
    EXPECT_TRUE(store.wait().empty()) << "a drained layer delivers nothing more";
  }
}

TEST(ExpertStore, FileTruncatedAfterOpenIsAClearError) {
  TempDir dir;
  const auto model = Model::load(synth_q4k(dir));
  const std::string path = dir.file("m.experts");
  pack_sidecar(model->file(), path);
  ExpertStoreOptions options;
  options.slots_per_layer = 2;
  ExpertStore store(*model, Sidecar::open(path, model->file()), options);
  fs::resize_file(path, 8192);
  const std::string message = expect_error([&] { greedy(*model, &store, 2); });
  EXPECT_NE(message.find("ends early"), std::string::npos) << message;
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

// Without a sidecar the store reads the GGUF itself; a GGUF cut short after open is an error naming
// the file and the tensor (driven through publish/wait: the forward would touch the mapping).
TEST(ExpertStore, GgufTruncatedAfterOpenNamesFileAndTensor) {
  TempDir dir;
  const std::string model_path = synth_q4k(dir);
  const auto model = Model::load(model_path);
  const ExpertTensorInfos last = find_expert_tensors(model->file(), int(model->layers().size()) - 1);
  const TensorInfo* cut_in = last.down ? last.down : find_expert_tensors(model->file(), 0).down;
  ASSERT_NE(cut_in, nullptr);
  const int block = std::stoi(cut_in->name.substr(4));
  for (const bool direct : {true, false}) {
    ExpertStoreOptions options;
    options.slots_per_layer = 2;
    options.direct_io = direct;
    ExpertStore store(*model, options);
    fs::resize_file(model_path, cut_in->file_offset + cut_in->n_bytes / 2);
    std::vector<int32_t> all(size_t(model->hparams().n_expert));
    std::iota(all.begin(), all.end(), 0);
    store.publish(block, all);
    const std::string message = expect_error([&] {
      while (!store.wait().empty()) {
      }
    });
    EXPECT_NE(message.find(model_path), std::string::npos) << message;
    EXPECT_NE(message.find(cut_in->name), std::string::npos) << message;
    EXPECT_NE(message.find("ends early"), std::string::npos) << message;
    fs::resize_file(model_path, model->file().file_size());  // whole again (zeros: not read)
  }
}

struct Setting {
  int slots;  // 0 = all resident
  bool read_ahead;
  int io_threads;
  bool direct_io;
  bool io_uring = true;
};

class Invariance : public testing::TestWithParam<std::string> {};

TEST_P(Invariance, SameTokensAndBitwiseLogitsForEveryPlacement) {
  TempDir dir;
  const std::string model_path = GetParam() == "synth-q4k" ? synth_q4k(dir) : fixture_gguf(GetParam());
  const auto model = Model::load(model_path);
  const std::string path = dir.file("m.experts");
  pack_sidecar(model->file(), path);
  const GreedyRun reference = greedy(*model, nullptr, 12);
  const int n_expert = model->hparams().n_expert;
  const Setting settings[] = {
      {1, true, 1, true},        {1, false, 8, true, false}, {2, true, 8, true},
      {2, false, 1, false},      {8, true, 1, true, false},  {8, true, 8, false},
      {8, false, 8, true},       {0, true, 1, true},         {0, false, 8, false, false},
  };
  for (const Setting& s : settings) {
    ExpertStoreOptions options;
    options.slots_per_layer = s.slots > 0 ? s.slots : n_expert;
    options.read_ahead = s.read_ahead;
    options.io_threads = s.io_threads;
    options.urgent_only_threads = s.io_threads > 1 ? 1 : 0;
    options.direct_io = s.direct_io;
    options.io_uring = s.io_uring;
    options.split_bytes = s.io_uring ? 1 << 20 : 4096;  // pread: spread every record over threads
    // The same setting reading from the sidecar and straight from the GGUF: both must give the
    // mapped source's bits, and the same residency and counters (the source changes timing only).
    std::vector<uint32_t> sidecar_residency;
    ExpertStoreStats sidecar_stats;
    for (const bool from_gguf : {false, true}) {
      ExpertStore store = from_gguf ? ExpertStore(*model, options)
                                    : ExpertStore(*model, Sidecar::open(path, model->file()), options);
      const GreedyRun run = greedy(*model, &store, 12);
      const std::string label =
          fmt::format("{}: slots {} read-ahead {} io {} direct {} uring {}", store.reader().kind(),
                      options.slots_per_layer, s.read_ahead, s.io_threads, s.direct_io, s.io_uring);
      EXPECT_EQ(run.tokens, reference.tokens) << label;
      ASSERT_EQ(run.logits.size(), reference.logits.size()) << label;
      EXPECT_EQ(std::memcmp(run.logits.data(), reference.logits.data(), run.logits.size() * sizeof(float)), 0)
          << label << ": logits differ";
      EXPECT_EQ(run.mtp, reference.mtp) << label << ": MTP draft logits differ";
      const ExpertStoreStats stats = store.stats();
      EXPECT_EQ(stats.hits + stats.misses, stats.needed) << label;
      if (!from_gguf) {
        sidecar_residency = residency(store, *model);
        sidecar_stats = stats;
      } else {
        EXPECT_EQ(residency(store, *model), sidecar_residency) << label;
        EXPECT_EQ(stats.hits, sidecar_stats.hits) << label;
        EXPECT_EQ(stats.misses, sidecar_stats.misses) << label;
        EXPECT_EQ(stats.read_ahead_issued, sidecar_stats.read_ahead_issued) << label;
        EXPECT_EQ(stats.read_ahead_used, sidecar_stats.read_ahead_used) << label;
      }
      if (s.slots == 0) {
        // All resident: read-ahead stops once every expert has been loaded.
        std::vector<std::vector<int32_t>> everything(model->layers().size());
        for (auto& ids : everything)
          for (int e = 0; e < n_expert; ++e) ids.push_back(e);
        store.fill(everything, 0);
        EXPECT_FALSE(store.wants_guess()) << label;
      }
      if (s.slots == 1) {
        EXPECT_GT(stats.misses, 0u) << label;
      }
    }
    // The whole prompt in one window of 7 rows: the MoE layer then runs each delivered batch's
    // experts side by side on the pool (3-row windows run them one after the other).
    ExpertStore store(*model, Sidecar::open(path, model->file()), options);
    const GreedyRun run = greedy(*model, &store, 12, 2, 7);
    EXPECT_EQ(run.tokens, reference.tokens) << "one prefill window, slots " << s.slots;
    ASSERT_EQ(run.logits.size(), reference.logits.size());
    EXPECT_EQ(
        std::memcmp(run.logits.data(), reference.logits.data(), run.logits.size() * sizeof(float)),
        0)
        << "one prefill window, slots " << s.slots << ": logits differ";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Invariance,
                         testing::Values("qwen3moe", "qwen3next", "qwen4exp", "synth-q4k"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Residency depends on the tokens only: I/O threads, splitting and O_DIRECT change timing, never
// which experts end up where, nor the counters.
TEST(ExpertStore, ResidencyIsAFunctionOfTheTokensOnly) {
  TempDir dir;
  const auto model = Model::load(fixture_gguf("qwen4exp"));
  const std::string path = dir.file("m.experts");
  pack_sidecar(model->file(), path);
  std::vector<uint32_t> first;
  ExpertStoreStats first_stats;
  for (int io : {1, 3, 8}) {
    ExpertStoreOptions options;
    options.slots_per_layer = 3;
    options.io_threads = io;
    options.split_bytes = io == 3 ? 4096 : 1 << 20;
    options.direct_io = io != 8;
    ExpertStore store(*model, Sidecar::open(path, model->file()), options);
    greedy(*model, &store, 10, io == 3 ? 1 : 2);
    const ExpertStoreStats stats = store.stats();
    if (first.empty()) {
      first = residency(store, *model);
      first_stats = stats;
      EXPECT_GT(stats.read_ahead_issued, 0u);
      continue;
    }
    EXPECT_EQ(residency(store, *model), first) << "io threads " << io;
    EXPECT_EQ(stats.hits, first_stats.hits);
    EXPECT_EQ(stats.misses, first_stats.misses);
    EXPECT_EQ(stats.read_ahead_issued, first_stats.read_ahead_issued);
    EXPECT_EQ(stats.read_ahead_used, first_stats.read_ahead_used);
    EXPECT_EQ(stats.bytes_read, first_stats.bytes_read);
  }
}

TEST(ExpertStore, BudgetBuysWholeSlotsAndFillPinsTheProfileTop) {
  TempDir dir;
  const auto model = Model::load(synth_q4k(dir));
  const std::string path = dir.file("m.experts");
  pack_sidecar(model->file(), path);
  const SidecarLayout layout = Sidecar::open(path, model->file()).layout();
  uint64_t per_slot = 0;  // one slot in every layer
  for (const SidecarLayer& l : layout.layers) per_slot += l.present ? l.record_bytes : 0;

  ExpertStoreOptions options;
  options.budget_bytes = per_slot * 5 + per_slot / 2;
  options.stream_slots = 4;
  ExpertStore store(*model, Sidecar::open(path, model->file()), options);
  EXPECT_EQ(store.slots_per_layer(), 5);
  EXPECT_EQ(store.arena_bytes(), per_slot * 5 + 4 * layout.largest_record());

  // A profile from the model's own routing; the top 2 per layer get pinned.
  ExpertProfile profile;
  ProfilingSource profiling(model->mapped_experts(), profile, int(model->layers().size()),
                            model->hparams().n_expert);
  const GreedyRun reference = greedy(*model, &profiling, 6);
  EXPECT_EQ(profile.tokens, 7u + 6u);
  const auto ranking = profile.ranking();
  store.fill(ranking, 2);
  for (uint32_t b = 0; b < layout.n_block; ++b) {
    if (!layout.layers[b].present) continue;
    for (int i = 0; i < 5; ++i) EXPECT_NE(store.slot_of(int(b), ranking[b][size_t(i)]), ExpertStore::kMiss);
    EXPECT_TRUE(store.pinned(int(b), ranking[b][0]));
    EXPECT_TRUE(store.pinned(int(b), ranking[b][1]));
    EXPECT_FALSE(store.pinned(int(b), ranking[b][2]));
  }
  const GreedyRun run = greedy(*model, &store, 6);
  EXPECT_EQ(run.tokens, reference.tokens);
  for (uint32_t b = 0; b < layout.n_block; ++b)
    if (layout.layers[b].present) {
      EXPECT_NE(store.slot_of(int(b), ranking[b][0]), ExpertStore::kMiss) << "pinned experts are never evicted";
      EXPECT_NE(store.slot_of(int(b), ranking[b][1]), ExpertStore::kMiss);
    }

  // Profiles round-trip and are bound to their model.
  profile.model_identity = layout.gguf_identity;
  profile.save(dir.file("p.json"));
  EXPECT_EQ(ExpertProfile::load(dir.file("p.json"), layout.gguf_identity).counts, profile.counts);
  EXPECT_NE(expect_error([&] { ExpertProfile::load(dir.file("p.json"), layout.gguf_identity + 1); })
                .find("another model"),
            std::string::npos);
}

}  // namespace
}  // namespace strata
