// Cost of grammar-constrained sampling per decode step on the default model's vocabulary
// (docs/serve.md "Structured output" has the numbers and the command):
// - BM_MaskWalk/<state>: one uncached mask, the trie walk over every token at a state (a fresh
//   constraint each iteration, fed the prefix's tokens first, which costs little next to it);
// - BM_MaskWalkLarge/<state>: the same on a synthetic vocabulary of Qwen's size (151,936);
// - BM_GenerationStep/<schema>: allowed + mask + accept per token along a realistic reply, with
//   the cache as generation uses it: the mean per-step cost the server pays;
// - BM_LazyFreeText/<vocabulary>: a lazy grammar (tool_choice "auto") over free text that ends
//   half way into the trigger word: every new trigger state costs one pass over the tokens that
//   hold the word's last byte, the other steps a lookup of the banned ids.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "text/tokenizer.h"

namespace {

using namespace strata;
using namespace strata::grammar;

struct Fixture {
  Tokenizer tokenizer;
  TokenVocabulary vocabulary;
  Grammar object_schema, any_object;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    auto file = GgufFile::open(STRATA_DEFAULT_MODEL);
    Tokenizer tokenizer = Tokenizer::from_gguf(*file);
    std::vector<int32_t> stops;
    if (tokenizer.eos_id()) stops.push_back(*tokenizer.eos_id());
    TokenVocabulary vocabulary =
        TokenVocabulary::from_tokenizer(tokenizer, stops, size_t(tokenizer.n_tokens()));
    Grammar object_schema = compile_json_schema(nlohmann::ordered_json::parse(R"({
      "type": "object", "properties": {
        "name": {"type": "string"}, "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "size": {"type": "object", "properties": {"w": {"type": "integer"}, "h": {"type": "number"}},
                 "required": ["w", "h"]}},
      "required": ["name", "color", "tags", "size"], "additionalProperties": false})"));
    return Fixture{std::move(tokenizer), std::move(vocabulary), std::move(object_schema),
                   json_object_grammar()};
  }();
  return f;
}

// Qwen's vocabulary size, made of the default vocabulary plus concatenations of two of its
// tokens (a fixed pseudo-random choice): as many tokens, and longer ones, as the real models walk.
const TokenVocabulary& large_vocabulary() {
  static const TokenVocabulary v = [] {
    const Fixture& f = fixture();
    std::vector<std::string> bytes;
    for (int32_t id = 0; id < f.tokenizer.n_tokens(); ++id) bytes.push_back(f.vocabulary.bytes(id));
    const size_t base = bytes.size();
    uint64_t seed = 12345;
    auto next = [&] {
      return size_t((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33);
    };
    while (bytes.size() < 151936) {
      const std::string& a = bytes[next() % base];
      const std::string& b = bytes[next() % base];
      bytes.push_back(a.empty() || b.empty() ? std::string() : a + b);
    }
    std::vector<int32_t> stops = f.vocabulary.stop_ids();
    return TokenVocabulary(std::move(bytes), std::move(stops), 151936);
  }();
  return v;
}

const std::string kReply =
    R"({"name": "A small grey cat called Tom", "color": "green", "tags": ["pets", "animals", )"
    R"("caf\u00e9 lover"], "size": {"w": 42, "h": -0.5e+10}})";

// The mask after `prefix` (the constraint built and walked anew each iteration: no cache).
void mask_walk(benchmark::State& state, const TokenVocabulary& vocabulary, const char* prefix) {
  const Fixture& f = fixture();
  const std::vector<int32_t> tokens = f.tokenizer.encode(prefix, {.parse_special = false});
  size_t allowed = 0;
  for (auto _ : state) {
    GrammarConstraint constraint(f.object_schema, vocabulary);
    for (int32_t id : tokens) constraint.accept(id);
    const std::vector<uint64_t>& bits = constraint.allowed();
    allowed = 0;
    for (uint64_t word : bits) allowed += size_t(__builtin_popcountll(word));
    benchmark::DoNotOptimize(bits.data());
  }
  state.counters["allowed_tokens"] = double(allowed);
  state.counters["vocab"] = double(vocabulary.n_vocab());
}
void BM_MaskWalk(benchmark::State& state, const char* prefix) { mask_walk(state, fixture().vocabulary, prefix); }
void BM_MaskWalkLarge(benchmark::State& state, const char* prefix) { mask_walk(state, large_vocabulary(), prefix); }
BENCHMARK_CAPTURE(BM_MaskWalkLarge, in_string, R"({"name": "A small)")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MaskWalkLarge, after_value, R"({"name": "A")")->Unit(benchmark::kMicrosecond);

BENCHMARK_CAPTURE(BM_MaskWalk, start, "")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MaskWalk, in_string, R"({"name": "A small)")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MaskWalk, after_value, R"({"name": "A")")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MaskWalk, in_number,
                  R"({"name": "A", "color": "red", "tags": [], "size": {"w": 4)")
    ->Unit(benchmark::kMicrosecond);

void BM_GenerationStep(benchmark::State& state, bool schema) {
  const Fixture& f = fixture();
  const Grammar& grammar = schema ? f.object_schema : f.any_object;
  const std::vector<int32_t> tokens = f.tokenizer.encode(kReply, {.parse_special = false});
  std::vector<float> logits(f.vocabulary.n_vocab(), 0.0f);
  uint64_t steps = 0, hits = 0, masks = 0;
  for (auto _ : state) {
    GrammarConstraint constraint(grammar, f.vocabulary);
    for (int32_t id : tokens) {
      constraint.mask(logits);
      constraint.accept(id);
    }
    if (!constraint.valid() || !constraint.complete()) state.SkipWithError("reply rejected");
    steps += tokens.size();
    hits += constraint.stats().cache_hits;
    masks += constraint.stats().masks;
  }
  state.SetItemsProcessed(int64_t(steps));  // items/s = steps/s; 1e6 / that = µs per step
  state.counters["cache_hit_rate"] = masks ? double(hits) / double(masks) : 0.0;
  state.counters["steps"] = double(tokens.size());
}
BENCHMARK_CAPTURE(BM_GenerationStep, schema, true)->Unit(benchmark::kMillisecond);

void BM_LazyFreeText(benchmark::State& state, bool large) {
  const Fixture& f = fixture();
  const TokenVocabulary& vocabulary = large ? large_vocabulary() : f.vocabulary;
  const std::vector<int32_t> tokens = f.tokenizer.encode(
      "Sure, let me look up the weather in Paris for the next three days. <tool_c",
      {.parse_special = false});
  std::vector<float> logits(vocabulary.n_vocab(), 0.0f);
  uint64_t steps = 0;
  size_t banned = 0;
  for (auto _ : state) {
    GrammarConstraint constraint(f.any_object, vocabulary, LazyTrigger{.word = "<tool_call>"});
    for (int32_t id : tokens) {
      constraint.mask(logits);
      constraint.accept(id);
    }
    if (constraint.triggered() || !constraint.valid()) state.SkipWithError("fired early");
    const std::vector<uint64_t>& bits = constraint.allowed();
    banned = 0;
    for (size_t id = 0; id < vocabulary.n_vocab(); ++id)
      banned += !((bits[id >> 6] >> (id & 63)) & 1);
    steps += tokens.size();
  }
  state.SetItemsProcessed(int64_t(steps));
  state.counters["steps"] = double(tokens.size());
  state.counters["banned_at_end"] = double(banned);
}
BENCHMARK_CAPTURE(BM_LazyFreeText, default_vocabulary, false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_LazyFreeText, qwen_size, true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GenerationStep, json_object, false)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
