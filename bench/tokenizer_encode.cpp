// Tokenizer throughput on the fixture corpus (tests/data/tokenizer/corpus.txt, 407 KB of English
// prose, Python source, CJK/Cyrillic/Arabic/... translations and emoji) with the fixture vocabulary
// (3000 merges-trained tokens + 7 added). Reports bytes/s of input text.
//   ./build/bench/bench_tokenizer_encode --benchmark_min_time=2
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "text/pretokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

std::string data_path(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "tests/data/tokenizer" / name).string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

strata::TokenizerSpec fixture_spec() {
  const auto vocab = nlohmann::json::parse(read_file(data_path("gguf_vocab.json")));
  strata::TokenizerSpec spec;
  spec.tokens = vocab.at("tokens").get<std::vector<std::string>>();
  spec.token_types = vocab.at("token_type").get<std::vector<int32_t>>();
  spec.merges = vocab.at("merges").get<std::vector<std::string>>();
  return spec;
}

const std::string& corpus() {
  static const std::string text = read_file(data_path("corpus.txt"));
  return text;
}

void BM_EncodeCorpusWarmCache(benchmark::State& state) {
  const strata::Tokenizer tok(fixture_spec());
  size_t n_tokens = tok.encode(corpus()).size();
  for (auto _ : state) {
    auto ids = tok.encode(corpus());
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(corpus().size()));
  state.counters["tokens"] = double(n_tokens);
}
BENCHMARK(BM_EncodeCorpusWarmCache)->Unit(benchmark::kMillisecond);

void BM_EncodeCorpusColdCache(benchmark::State& state) {
  const strata::TokenizerSpec spec = fixture_spec();
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = std::make_unique<strata::Tokenizer>(spec);  // empty cache
    state.ResumeTiming();
    auto ids = tok->encode(corpus());
    benchmark::DoNotOptimize(ids.data());
    state.PauseTiming();
    tok.reset();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(corpus().size()));
}
BENCHMARK(BM_EncodeCorpusColdCache)->Unit(benchmark::kMillisecond);

void BM_NfcAndPreTokenize(benchmark::State& state) {
  std::vector<std::string_view> pieces;
  for (auto _ : state) {
    const std::string nfc = strata::nfc_normalize(corpus());
    pieces.clear();
    strata::pre_tokenize(nfc, strata::PreTokenizerKind::Qwen2, pieces);
    benchmark::DoNotOptimize(pieces.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(corpus().size()));
}
BENCHMARK(BM_NfcAndPreTokenize)->Unit(benchmark::kMillisecond);

void BM_StreamingDecode(benchmark::State& state) {
  const strata::Tokenizer tok(fixture_spec());
  const auto ids = tok.encode(corpus());
  for (auto _ : state) {
    strata::StreamingDecoder stream(tok);
    size_t bytes = 0;
    for (int32_t id : ids) bytes += stream.push(id).size();
    bytes += stream.finish().size();
    benchmark::DoNotOptimize(bytes);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(corpus().size()));
}
BENCHMARK(BM_StreamingDecode)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
