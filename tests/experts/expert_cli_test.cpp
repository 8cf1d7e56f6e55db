// The expert hierarchy through the `strata` binary: pack/--check, budgets with bounded peak RSS on
// a model whose experts are 10x the budget (from the sidecar and straight from the GGUF), same
// tokens as the mapped path, `bench experts` over both sources, and the messages for a missing or
// stale sidecar, a bad budget and profiles.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <cctype>
#include <nlohmann/json.hpp>

#include "experts/sidecar.h"
#include "gguf/gguf.h"
#include "synth/synth.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;
  std::string output;  // stdout + stderr
};

Result run(const std::string& args) {
  const std::string command = std::string(STRATA_BINARY) + " " + args + " 2>&1";
  Result result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Plain string scanning (std::regex trips g++ 12 warnings under ASan, and warnings are errors).
// The number right after `prefix`, or -1.
double number_after(const std::string& output, const std::string& prefix) {
  const size_t at = output.find(prefix);
  if (at == std::string::npos) return -1;
  size_t end = at + prefix.size();
  while (end < output.size() && (std::isdigit(static_cast<unsigned char>(output[end])) || output[end] == '.')) ++end;
  const std::string number = output.substr(at + prefix.size(), end - at - prefix.size());
  return number.empty() ? -1 : std::stod(number);
}

// The number right before `suffix`, or -1.
double number_before(const std::string& output, const std::string& suffix) {
  const size_t at = output.find(suffix);
  if (at == std::string::npos) return -1;
  size_t begin = at;
  while (begin > 0 && (std::isdigit(static_cast<unsigned char>(output[begin - 1])) || output[begin - 1] == '.')) --begin;
  return begin == at ? -1 : std::stod(output.substr(begin, at - begin));
}

double peak_rss_mib(const std::string& output) { return number_after(output, "peak RSS "); }

// A size as format_bytes writes it ("512 B", "3.0 KiB", "1.21 GiB") right after `prefix`, in MiB;
// -1 when absent.
double mib_after(const std::string& output, const std::string& prefix) {
  const double number = number_after(output, prefix);
  if (number < 0) return -1;
  const size_t unit_at = output.find(' ', output.find(prefix) + prefix.size()) + 1;
  const std::string unit = output.substr(unit_at, 3);
  const double scale = unit == "GiB" ? 1024.0 : unit == "MiB" ? 1.0 : unit == "KiB" ? 1.0 / 1024 : 1.0 / (1 << 20);
  return number * scale;
}

// The first line made only of comma-separated token ids (what --print-ids prints).
std::string last_line_of_ids(const std::string& output) {
  size_t begin = 0;
  while (begin < output.size()) {
    size_t end = output.find('\n', begin);
    if (end == std::string::npos) end = output.size();
    const std::string line = output.substr(begin, end - begin);
    const bool ids = !line.empty() && line.find(',') != std::string::npos &&
                     line.find_first_not_of("0123456789,") == std::string::npos;
    if (ids) return line;
    begin = end + 1;
  }
  return "";
}

class ExpertCli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("strata-expert-cli-{}", getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // qwen3moe, 4 layers x 64 experts of 3 x 256 x 512 Q8_0 (~108 MB of experts, ~2 MB dense).
  std::string streaming_model(const std::string& name, uint64_t seed) const {
    SynthOptions options;
    options.hparams = synth_shape("tiny-qwen3moe");
    options.hparams.n_embd = 256;
    options.hparams.n_ff_exp = 512;
    options.hparams.n_ff_shexp = 0;
    options.hparams.n_expert = 64;
    options.hparams.n_expert_used = 4;
    options.dense_type = GgmlType::Q8_0;
    options.expert_type = GgmlType::Q8_0;
    options.seed = seed;
    const std::string path = file(name);
    write_synthetic_model(options, path);
    return path;
  }

  fs::path dir_;
};

// The CPU copies the weights it reads every token into huge-page memory (gguf/resident_weights.h):
// all of them with the experts mapped, the dense ones with a store; --mapped-weights keeps the
// mapping. Same bytes, so the same ids and bitwise the same logits either way.
TEST_F(ExpertCli, ResidentWeightsKeepTheTokensAndLogits) {
  const std::string model = streaming_model("r.gguf", 5);
  const std::string args = fmt::format("run -m {} --tokens 1,2,3,4,5,6,7 -n 16 --temp 0 --print-ids -t 2", model);
  const Result mapped = run(args + " --mapped-experts --mapped-weights --logits-out " + file("mapped.f32"));
  ASSERT_EQ(mapped.status, 0) << mapped.output;
  EXPECT_EQ(mapped.output.find("weights in RAM"), std::string::npos) << mapped.output;
  const Result copied = run(args + " --mapped-experts --logits-out " + file("copied.f32"));
  ASSERT_EQ(copied.status, 0) << copied.output;
  const double file_mib = double(fs::file_size(model)) / (1 << 20);
  const double all_mib = mib_after(copied.output, "weights in RAM: ");
  EXPECT_GT(all_mib, 0.9 * file_mib) << copied.output;  // the experts are most of the file
  EXPECT_EQ(last_line_of_ids(copied.output), last_line_of_ids(mapped.output)) << copied.output;
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ASSERT_FALSE(bytes(file("mapped.f32")).empty());
  EXPECT_EQ(bytes(file("copied.f32")), bytes(file("mapped.f32"))) << "logits differ";
  // With a store the experts are streamed: only the dense tensors are copied.
  const Result streamed = run(args + " --slots-per-layer 2 --logits-out " + file("streamed.f32"));
  ASSERT_EQ(streamed.status, 0) << streamed.output;
  const double dense_mib = mib_after(streamed.output, "weights in RAM: ");
  EXPECT_GT(dense_mib, 0.0) << streamed.output;
  EXPECT_LT(dense_mib, 0.1 * file_mib) << streamed.output;
  EXPECT_EQ(last_line_of_ids(streamed.output), last_line_of_ids(mapped.output)) << streamed.output;
  EXPECT_EQ(bytes(file("streamed.f32")), bytes(file("mapped.f32"))) << "logits differ";
}

// --usage without a budget makes a store with a slot for every expert: it reads them all at start,
// so no token waits for a cold read (and the tokens are the mapping's).
TEST_F(ExpertCli, AStoreWithRoomForEveryExpertReadsThemAllAtStart) {
  const std::string model = streaming_model("w.gguf", 6);
  const std::string args = fmt::format("run -m {} --tokens 1,2,3,4,5,6,7 -n 16 --temp 0 --print-ids -t 2", model);
  const Result mapped = run(args + " --mapped-experts");
  ASSERT_EQ(mapped.status, 0) << mapped.output;
  const Result warm = run(args + " --usage " + file("w.usage"));
  ASSERT_EQ(warm.status, 0) << warm.output;
  EXPECT_NE(warm.output.find("64 slots/layer of 64"), std::string::npos) << warm.output;
  EXPECT_NE(warm.output.find("prefill experts: hit 100.0% ("), std::string::npos) << warm.output;
  EXPECT_NE(warm.output.find("decode experts: hit 100.0% ("), std::string::npos) << warm.output;
  EXPECT_EQ(last_line_of_ids(warm.output), last_line_of_ids(mapped.output)) << warm.output;
  // A budget the user set is still filled on demand.
  const Result cold = run(args + " --usage " + file("w2.usage") + " --slots-per-layer 64");
  ASSERT_EQ(cold.status, 0) << cold.output;
  EXPECT_EQ(cold.output.find("prefill experts: hit 100.0% ("), std::string::npos) << cold.output;
  EXPECT_EQ(last_line_of_ids(cold.output), last_line_of_ids(mapped.output)) << cold.output;
}

TEST_F(ExpertCli, BudgetBoundsPeakRssAndKeepsTheTokens) {
  const std::string model = streaming_model("m.gguf", 3);
  const std::string tokens = "--tokens 1,2,3,4,5 -n 24 --temp 0 --print-ids -t 2";

  const Result mapped = run(fmt::format("run -m {} {} --mapped-experts", model, tokens));
  ASSERT_EQ(mapped.status, 0) << mapped.output;
  EXPECT_FALSE(last_line_of_ids(mapped.output).empty()) << mapped.output;

  // No sidecar: a budget streams experts straight from the GGUF.
  const Result missing = run(fmt::format("run -m {} {} --ram-budget 10% --experts-from sidecar", model, tokens));
  EXPECT_EQ(missing.status, 1) << missing.output;
  EXPECT_NE(missing.output.find("is missing"), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find("strata pack"), std::string::npos) << missing.output;
  const Result from_gguf = run(fmt::format("run -m {} {} --ram-budget 10% --io-threads 2", model, tokens));
  ASSERT_EQ(from_gguf.status, 0) << from_gguf.output;
  EXPECT_NE(from_gguf.output.find("experts from " + model + " (gguf)"), std::string::npos) << from_gguf.output;
  EXPECT_EQ(last_line_of_ids(from_gguf.output), last_line_of_ids(mapped.output)) << from_gguf.output;
  EXPECT_FALSE(fs::exists(model + ".experts")) << "streaming from the GGUF writes no sidecar";

  const Result pack = run("pack " + model);
  ASSERT_EQ(pack.status, 0) << pack.output;
  const Result check = run("pack --check " + model);
  ASSERT_EQ(check.status, 0) << check.output;
  EXPECT_NE(check.output.find("OK"), std::string::npos) << check.output;

  const auto gguf = GgufFile::open(model);
  const SidecarLayout layout = SidecarLayout::for_gguf(*gguf);
  const double expert_mib = double(layout.total_expert_bytes()) / (1 << 20);
  const double dense_mib = double(gguf->file_size()) / (1 << 20) - expert_mib;

  const Result streamed =
      run(fmt::format("run -m {} {} --ram-budget 10% --io-threads 2 --experts-from sidecar", model, tokens));
  ASSERT_EQ(streamed.status, 0) << streamed.output;
  EXPECT_NE(streamed.output.find("experts from " + model + ".experts (sidecar)"), std::string::npos)
      << streamed.output;
  EXPECT_EQ(last_line_of_ids(streamed.output), last_line_of_ids(mapped.output)) << streamed.output;
  // auto reads the GGUF even with a sidecar there, and says the sidecar is unused.
  const Result automatic = run(fmt::format("run -m {} {} --ram-budget 10% --io-threads 2", model, tokens));
  ASSERT_EQ(automatic.status, 0) << automatic.output;
  EXPECT_NE(automatic.output.find("experts from " + model + " (gguf)"), std::string::npos) << automatic.output;
  EXPECT_NE(automatic.output.find(model + ".experts is not used"), std::string::npos) << automatic.output;
  EXPECT_EQ(last_line_of_ids(automatic.output), last_line_of_ids(mapped.output)) << automatic.output;

  // Peak RSS ≤ what a tiny model's run needs (binary, libraries, threads) + dense bytes + the
  // arena (10% of experts + transient slots) + 16 MiB for activations and allocator slack, for
  // both sources.
  const std::string tiny = file("tiny.gguf");
  ASSERT_EQ(run("synth --shape tiny-qwen3moe " + tiny).status, 0);
  const Result base = run(fmt::format("run -m {} {}", tiny, tokens));
  ASSERT_EQ(base.status, 0) << base.output;
  for (const Result* r : {&streamed, &from_gguf}) {
    const double arena_mib = number_before(r->output, " MiB arena");
    ASSERT_GT(arena_mib, 0) << r->output;
    const double bound = peak_rss_mib(base.output) + dense_mib + arena_mib + 16;
    const double peak = peak_rss_mib(r->output);
    EXPECT_GT(peak, 0) << r->output;
    EXPECT_LE(peak, bound) << r->output;
    EXPECT_LT(peak, peak_rss_mib(base.output) + expert_mib / 2) << "experts must not all be resident";
    EXPECT_NE(r->output.find("misses/token"), std::string::npos) << r->output;
  }
  RecordProperty("peak_rss_streamed_mib", std::to_string(peak_rss_mib(streamed.output)));
  RecordProperty("peak_rss_from_gguf_mib", std::to_string(peak_rss_mib(from_gguf.output)));
  RecordProperty("peak_rss_mapped_mib", std::to_string(peak_rss_mib(mapped.output)));
  RecordProperty("expert_mib", std::to_string(expert_mib));
}

// `bench experts` without a sidecar measures the GGUF; with both it interleaves them.
TEST_F(ExpertCli, BenchComparesSources) {
  const std::string model = streaming_model("b.gguf", 5);
  const std::string args = fmt::format("bench experts -m {} --budgets 25% -n 2 --prompt-tokens 2 --repeats 2 "
                                       "--disk-seconds 0.2 -t 1 --json {}", model, file("b.json"));
  const Result gguf_only = run(args);
  ASSERT_EQ(gguf_only.status, 0) << gguf_only.output;
  EXPECT_NE(gguf_only.output.find("gguf read bandwidth"), std::string::npos) << gguf_only.output;
  EXPECT_NE(gguf_only.output.find("| gguf |"), std::string::npos) << gguf_only.output;
  const Result both = run(args + " --sources gguf,sidecar --pack");
  ASSERT_EQ(both.status, 0) << both.output;
  EXPECT_NE(both.output.find("sidecar read bandwidth"), std::string::npos) << both.output;
  EXPECT_NE(both.output.find("| sidecar |"), std::string::npos) << both.output;
  EXPECT_NE(both.output.find("| gguf |"), std::string::npos) << both.output;
  // A share of the expert bytes is a share of each source's all-resident arena: the same slots
  // (a GGUF slot, holding the slices' aligned spans, is slightly larger than a sidecar record).
  std::ifstream json_file(file("b.json"));
  const nlohmann::json j = nlohmann::json::parse(json_file);
  ASSERT_EQ(j["budgets"].size(), 2u) << j.dump();
  std::map<std::string, int> slots;
  for (const auto& row : j["budgets"]) {
    slots[row["source"].get<std::string>()] = row["slots_per_layer"].get<int>();
    EXPECT_EQ(row["tok_s"].size(), 2u) << "two interleaved repeats per source";
  }
  EXPECT_EQ(slots["gguf"], 16) << "25% of 64 experts";
  EXPECT_EQ(slots["sidecar"], 16);
  EXPECT_GT(j["read_bandwidth_bytes_per_s"]["gguf"].get<double>(), 0);
  EXPECT_GT(j["read_bandwidth_bytes_per_s"]["sidecar"].get<double>(), 0);
  // `pack --help` states the measured result and how to measure on another disk.
  const Result help = run("pack --help");
  EXPECT_NE(help.output.find("The sidecar is optional"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("not faster"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("--sources gguf,sidecar"), std::string::npos) << help.output;
}

TEST_F(ExpertCli, StaleSidecarIsNamedAndPackRebuildsIt) {
  const std::string model = streaming_model("m.gguf", 3);
  ASSERT_EQ(run("pack " + model).status, 0);
  streaming_model("m.gguf", 4);  // same shapes, other weights
  const std::string tokens = "--tokens 1,2,3 -n 4 --temp 0 --print-ids -t 1";
  const Result stale = run(fmt::format("run -m {} {} --slots-per-layer 4 --experts-from sidecar", model, tokens));
  EXPECT_EQ(stale.status, 1) << stale.output;
  EXPECT_NE(stale.output.find("stale"), std::string::npos) << stale.output;
  EXPECT_NE(stale.output.find("--experts-from gguf"), std::string::npos) << stale.output;
  const Result from_gguf = run(fmt::format("run -m {} {} --slots-per-layer 4", model, tokens));
  EXPECT_EQ(from_gguf.status, 0) << "the GGUF needs no sidecar, stale or not: " << from_gguf.output;
  const Result rebuilt = run(fmt::format("run -m {} {} --slots-per-layer 4 --pack", model, tokens));
  EXPECT_EQ(rebuilt.status, 0) << rebuilt.output;
  EXPECT_NE(rebuilt.output.find("rebuilding"), std::string::npos) << rebuilt.output;
  const Result bad = run(fmt::format("run -m {} {} --ram-budget 12Q", model, tokens));
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("--ram-budget: expected a size"), std::string::npos) << bad.output;
}

TEST_F(ExpertCli, ProfileFillsAndPins) {
  const std::string model = file("t.gguf");
  const std::string tokenizer = std::string(STRATA_TEST_DATA_DIR) + "/tokenizer";
  ASSERT_EQ(run(fmt::format("synth --shape tiny-qwen4exp --tokenizer {} {}", tokenizer, model)).status, 0);
  const Result profile = run(fmt::format("profile -m {} -p \"the quick brown fox jumps over the lazy dog\" -o {}",
                                         model, file("t.profile")));
  ASSERT_EQ(profile.status, 0) << profile.output;
  EXPECT_NE(profile.output.find("routing of"), std::string::npos) << profile.output;
  const std::string args = fmt::format("run -m {} -p hello -n 8 --temp 0 --print-ids -t 1", model);
  const Result plain = run(args + " --mapped-experts");
  const Result filled = run(args + fmt::format(" --pack --slots-per-layer 4 --fill {} --pin 2", file("t.profile")));
  ASSERT_EQ(filled.status, 0) << filled.output;
  EXPECT_EQ(last_line_of_ids(filled.output), last_line_of_ids(plain.output)) << filled.output;
  const Result no_fill = run(args + " --slots-per-layer 4 --pin 2");
  EXPECT_EQ(no_fill.status, 1);
  EXPECT_NE(no_fill.output.find("--pin needs --fill"), std::string::npos) << no_fill.output;
}

TEST_F(ExpertCli, UsageHistoryHotPinsAndMoce) {
  const std::string model = file("u.gguf");
  const std::string tokenizer = std::string(STRATA_TEST_DATA_DIR) + "/tokenizer";
  ASSERT_EQ(run(fmt::format("synth --shape tiny-qwen4exp --tokenizer {} {}", tokenizer, model)).status, 0);
  const std::string args = fmt::format("run -m {} -p \"hello there\" -n 300 --ignore-eos --temp 0 --print-ids -t 1", model);
  const std::string plain = last_line_of_ids(run(args + " --mapped-experts").output);
  ASSERT_FALSE(plain.empty());

  // First run writes MODEL.usage; hot pins change no token.
  const Result first = run(args + " --pack --slots-per-layer 4 --usage auto --pin-hot 2");
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_EQ(last_line_of_ids(first.output), plain);
  EXPECT_NE(first.output.find("prompt-hot pins: 2 per layer"), std::string::npos) << first.output;
  ASSERT_TRUE(fs::exists(model + ".usage"));

  // Second run loads it (3 prompt + 299 decoded tokens >= 256: trusted), fills and pins from it; still the same tokens.
  const Result second = run(args + " --slots-per-layer 4 --usage auto --pin 1");
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("usage history " + model + ".usage: 302 tokens"), std::string::npos) << second.output;
  EXPECT_EQ(last_line_of_ids(second.output), plain);

  // A damaged file is ignored with a warning; a file of another model stops the run.
  fs::resize_file(model + ".usage", 30);
  const Result damaged = run(args + " --slots-per-layer 4 --usage auto");
  EXPECT_EQ(damaged.status, 0) << damaged.output;
  EXPECT_NE(damaged.output.find("usage history ignored"), std::string::npos) << damaged.output;
  const std::string other = file("other.gguf");
  ASSERT_EQ(run(fmt::format("synth --shape tiny-qwen4exp --seed 9 --tokenizer {} {}", tokenizer, other)).status, 0);
  const Result foreign = run(fmt::format("run -m {} -p hi -n 2 --pack --slots-per-layer 4 --usage {}.usage", other, model));
  EXPECT_EQ(foreign.status, 1) << foreign.output;
  EXPECT_NE(foreign.output.find("made for another model"), std::string::npos) << foreign.output;

  // MoCE: lambda 0 is the exact model; on, it reports its telemetry; it needs the store.
  const Result moce_off = run(args + " --slots-per-layer 2 --moce 0");
  EXPECT_EQ(last_line_of_ids(moce_off.output), plain);
  EXPECT_EQ(moce_off.output.find("moce:"), std::string::npos);
  const Result moce_on = run(args + " --slots-per-layer 2 --moce 4 --moce-max-rank 6");
  ASSERT_EQ(moce_on.status, 0) << moce_on.output;
  EXPECT_NE(moce_on.output.find("moce: "), std::string::npos) << moce_on.output;
  EXPECT_GT(number_after(moce_on.output, "agreement "), 0.0) << moce_on.output;
  const Result moce_mapped = run(args + " --mapped-experts --moce 1");
  EXPECT_EQ(moce_mapped.status, 1);
  EXPECT_NE(moce_mapped.output.find("need the expert store"), std::string::npos) << moce_mapped.output;
}

}  // namespace
}  // namespace strata
