// `strata run` — generate from a prompt (text or token ids), streaming tokens as they come.
#include <fmt/format.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/expert_options.h"
#include "cli/grammar_options.h"
#include "cli/model_options.h"
#include "cli/spec_options.h"
#include "compute/cpu/thread_pool.h"
#include "decode/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "grammar/grammar.h"
#include "grammar/token_mask.h"
#include "model/model.h"
#include "spec/spec_decoder.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/phase_timer.h"
#include "util/progress.h"

namespace strata::cli {
namespace {

// One --profile line: the wall time of `total_ms` split into the phases (each divided by `steps`).
void print_profile(const std::string& what, const PhaseTimes& times, double total_ms, int steps) {
  total_ms /= steps;
  double accounted = 0;
  std::string line = fmt::format("strata: profile {}: {:.3f} ms =", what, total_ms);
  for (size_t p = 0; p < times.ms.size(); ++p) {
    const double ms = times.ms[p] / steps;
    accounted += ms;
    line += fmt::format(" {} {:.3f} ms ({:.0f}%) +", phase_name(Phase(p)), ms, 100 * ms / total_ms);
  }
  line += fmt::format(" other {:.3f} ms", total_ms - accounted);
  fmt::print(stderr, "{}\n", line);
  // The same time by part (util/phase_timer.h), the parts that took any.
  line = fmt::format("strata: profile {} by part:", what);
  accounted = 0;
  for (size_t p = 0; p < times.part_ms.size(); ++p) {
    const double ms = times.part_ms[p] / steps;
    accounted += ms;
    if (ms > 0)
      line += fmt::format(" {} {:.3f} ms ({:.0f}%),", part_name(Part(p)), ms, 100 * ms / total_ms);
  }
  line += fmt::format(" other {:.3f} ms", total_ms - accounted);
  fmt::print(stderr, "{}\n", line);
}

constexpr const char* kDemoPrompt = "Once upon a time";

struct RunOptions {
  ModelOptions model;
  ExpertOptions experts;
  std::string telemetry_out;  // one JSON line per decode step (per window with --spec)
  bool profile = false;       // split decode time into phases
  std::string prompt;
  bool prompt_given = false;  // -p was on the command line (possibly "")
  std::string prompt_file;    // -f FILE ("-" = stdin)
  std::string token_ids;
  int n_predict = 64;
  int chunk_rows = 0;  // 0: default_prefill_rows of the backend
  bool print_ids = false;
  bool ignore_eos = false;
  std::string logits_out;  // prompt logits, every position, [T, vocab] f32 LE
  std::string ids_out;     // generated ids, one per line
  SpecCliOptions spec;
  GrammarCliOptions grammar;  // --json-schema FILE / --json / --grammar FILE
};

void write_binary(const std::string& path, const void* data, size_t bytes) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
  const size_t written = std::fwrite(data, 1, bytes, file);
  const bool closed = std::fclose(file) == 0;
  if (written != bytes || !closed) fail("{}: write failed: {}", path, std::strerror(errno));
}

// Peak resident set of this process so far, in MiB.
double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;
}

// Weight bytes one decode step streams: every dense tensor except the embedding table (one row)
// and the PLE table (a few rows), plus the routed experts a token uses (k per layer).
double weight_bytes_per_token(const Model& model) {
  const HParams& hp = model.hparams();
  double bytes = 0;
  for (const TensorInfo& t : model.file().tensors()) {
    const bool experts = t.name.find("_exps") != std::string::npos;
    const bool table =
        t.name.rfind("token_embd", 0) == 0 || t.name.rfind("per_layer_token_embd", 0) == 0;
    const bool nextn =
        t.name.rfind("blk." + std::to_string(hp.n_layer) + ".", 0) == 0 && hp.n_nextn > 0;
    if (table || nextn) continue;
    bytes += experts ? double(t.n_bytes) * hp.n_expert_used / hp.n_expert : double(t.n_bytes);
  }
  return bytes;
}

std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find_first_of(", ", pos);
    const std::string part =
        text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (!part.empty()) {
      size_t used = 0;
      long long value = 0;
      try {
        value = std::stoll(part, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != part.size() || value < 0 || value > INT32_MAX)
        fail("--tokens: expected comma-separated non-negative token ids, found '{}'", part);
      ids.push_back(int32_t(value));
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  if (ids.empty()) fail("--tokens: no token ids given");
  return ids;
}

// One --telemetry line; `extra` (",\"k\":v..." or "") adds the speculative window's shape.
void print_telemetry(std::FILE* file, int64_t token, int32_t id, double ms,
                     const ExpertStoreStats& d, const std::string& extra = "") {
  fmt::print(file,
             "{{\"token\":{},\"id\":{},\"ms\":{:.3f},\"hits\":{},\"misses\":{},\"bytes_read\":{},"
             "\"read_ahead_issued\":{},\"read_ahead_used\":{},\"io_wait_ms\":{:.3f}{}}}\n",
             token, id, ms, d.hits, d.misses, d.bytes_read, d.read_ahead_issued, d.read_ahead_used,
             d.io_wait_ms, extra);
}

// The whole of `file` (stdin included), or an error naming `source`.
std::string read_all(std::FILE* file, const std::string& source) {
  std::string text;
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  if (std::ferror(file)) fail("{}: cannot read the prompt: {}", source, std::strerror(errno));
  return text;
}

// The prompt text and where it came from, in llama-cli's order: -p TEXT, -f FILE, else stdin when
// it is not a terminal (a pipe or a file), else the demo prompt (said on stderr). Like llama-cli's
// -f, one trailing newline of a file or of stdin is dropped (`echo hi | strata run` prompts "hi").
// An empty prompt is an error, as in llama-cli for models that add no BOS token (strata's
// tokenizers add none): there is nothing to condition the first token on.
std::string resolve_prompt_text(const RunOptions& options) {
  std::string text, source;
  if (options.prompt_given) {
    text = options.prompt;
    source = "-p";
  } else if (!options.prompt_file.empty() && options.prompt_file != "-") {
    source = "-f " + options.prompt_file;
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(
        std::fopen(options.prompt_file.c_str(), "rb"), &std::fclose);
    if (!file) fail("{}: cannot open the prompt file: {}", source, std::strerror(errno));
    text = read_all(file.get(), source);
  } else if (!options.prompt_file.empty() || !isatty(STDIN_FILENO)) {
    source = "stdin";
    text = read_all(stdin, source);
  } else {
    fmt::print(stderr, "strata: no prompt given (-p TEXT, -f FILE or stdin); using \"{}\"\n",
               kDemoPrompt);
    return kDemoPrompt;
  }
  if (source != "-p" && !text.empty() && text.back() == '\n') {
    text.pop_back();
    if (!text.empty() && text.back() == '\r') text.pop_back();
  }
  if (text.empty())
    fail(
        "{}: the prompt is empty; give the text with -p TEXT, -f FILE or on stdin (the model "
        "adds no beginning-of-sequence token, so there is nothing to generate from)",
        source);
  return text;
}

// A rate with three significant digits where it matters: 1234 / 123 / 12.3 / 1.23 / 0.123 tok/s
// (a model larger than RAM decodes at ~1 tok/s, where one decimal hides the differences).
std::string format_rate(double per_second) {
  const int decimals = per_second >= 100 ? 0 : per_second >= 10 ? 1 : per_second >= 1 ? 2 : 3;
  return fmt::format("{:.{}f}", per_second, decimals);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What `strata run` does with the loop's tokens (decode/generate.h): streams them to stdout (text
// through the streaming decoder, or ids printed at the end), ends before the stop token, ends
// after a token that completes the --json (--grammar) value, and writes one --telemetry line per
// window: a plain step as before, a speculative window with its shape ("token" is the index of the
// window's first token, so consecutive lines differ by "kept" and the kept rows add up to the
// tokens fed).
class RunTokens final : public GenerationCallbacks {
 public:
  std::optional<int32_t> eos;                       // the stop token, if any
  StreamingDecoder* decoder = nullptr;              // text out; null: ids
  grammar::GrammarConstraint* delivered = nullptr;  // follows the emitted tokens (--json)
  std::FILE* telemetry = nullptr;
  const ExpertStore* store = nullptr;
  bool speculative = false;
  ExpertStoreStats window_before;  // the store's counters after the previous window
  std::vector<int32_t> ids;        // every token emitted
  std::vector<int32_t> out_ids;    // those printed as ids at the end (no decoder)

  bool is_stop_token(int32_t token) override { return eos && token == *eos; }
  bool on_token(int32_t token, std::span<const float>) override {
    ids.push_back(token);
    if (decoder) {
      std::fputs(decoder->push(token).c_str(), stdout);
      std::fflush(stdout);
    } else {
      out_ids.push_back(token);
    }
    if (!delivered) return true;
    // Judged on the tokens emitted so far: a verify window samples (and so advances the
    // sampler's constraint) before its tokens are emitted.
    delivered->accept(token);
    return !delivered->finished();
  }
  void on_window(const spec::WindowReport& w) override {
    if (!telemetry) return;
    const ExpertStoreStats now = store ? store->stats() : ExpertStoreStats{};
    const ExpertStoreStats d = now - window_before;
    window_before = now;
    print_telemetry(telemetry, w.first_token, w.token, w.seconds * 1e3, d,
                    speculative
                        ? fmt::format(",\"rows\":{},\"drafted\":{},\"accepted\":{},\"kept\":{}",
                                      w.rows, w.drafted, w.accepted, w.kept)
                        : std::string());
  }
};

void run(const RunOptions& options) {
  const std::string path = resolve_model_path(options.model);
  const auto model = Model::load(path);
  const HParams& hp = model->hparams();
  std::optional<Tokenizer> tokenizer;
  if (model->file().has("tokenizer.ggml.tokens"))
    tokenizer.emplace(Tokenizer::from_gguf(model->file()));

  std::vector<int32_t> prompt;
  if (!options.token_ids.empty()) {
    prompt = parse_token_ids(options.token_ids);
  } else {
    if (!tokenizer) fail("{}: the file has no tokenizer; give the prompt as --tokens IDS", path);
    prompt = tokenizer->encode(resolve_prompt_text(options));
    if (prompt.empty()) fail("the prompt encodes to no tokens");
  }
  for (int32_t id : prompt)
    if (id >= hp.n_vocab)
      fail("--tokens: token id {} is outside the vocabulary (0..{})", id, hp.n_vocab - 1);

  compute::ThreadPool pool(resolve_threads(options.model));
  const std::unique_ptr<ExpertStore> store = open_expert_store(*model, path, options.experts);
  const std::unique_ptr<TracingSource> tracer =
      open_routing_trace(*model, store.get(), options.experts);
  ExpertSource* experts = tracer ? static_cast<ExpertSource*>(tracer.get()) : store.get();
  const std::string backend = resolve_backend(options.model, store != nullptr && !wants_gpu_tier(options.experts));
  check_gpu_tier_backend(options.experts, backend);
  place_resident_weights(*model, store.get(), backend, options.experts);
  Session session(*model, pool, experts, backend, options.model.ctx);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> telemetry(nullptr, &std::fclose);
  if (!options.telemetry_out.empty()) {
    telemetry.reset(std::fopen(options.telemetry_out.c_str(), "w"));
    if (!telemetry)
      fail("{}: cannot open for writing: {}", options.telemetry_out, std::strerror(errno));
  }
  Sampler sampler(options.model.sampling);
  // --json / --json-schema / --grammar: every token drawn under the grammar (grammar/token_mask.h);
  // the output ends once the value is complete.
  const std::optional<grammar::Grammar> grammar = output_grammar(options.grammar);
  std::optional<grammar::TokenVocabulary> vocabulary;
  std::optional<grammar::GrammarConstraint> constraint, delivered;  // drawn / emitted so far
  if (grammar) {
    std::vector<int32_t> stops;
    if (tokenizer && tokenizer->eos_id()) stops.push_back(*tokenizer->eos_id());
    vocabulary.emplace(
        output_vocabulary(tokenizer ? &*tokenizer : nullptr, std::move(stops), hp.n_vocab, path));
    constraint.emplace(*grammar, *vocabulary);
    sampler.set_constraint(&*constraint);
    delivered.emplace(*grammar, *vocabulary);
  }
  std::optional<spec::SpecDecoder> speculative;
  if (const spec::SpecOptions spec_options = resolve_spec_options(options.spec);
      spec_options.mode != spec::SpecMode::Off)
    speculative.emplace(session, sampler, spec_options, pool,
                        experts);  // the MTP head's windows are traced too
  fmt::print(stderr, "strata: {} ({}), {} layers, {} experts top-{}, {} threads, backend {}\n", path,
             arch_name(hp.arch), hp.n_layer, hp.n_expert, hp.n_expert_used, pool.size(), backend);
  if (options.profile) fmt::print(stderr, "strata: thread pool: {}\n", pool.describe_inline_rule());

  PhaseTimes prompt_phase_times;
  if (options.profile) active_phase_times() = &prompt_phase_times;
  const auto prefill_start = std::chrono::steady_clock::now();
  begin_prompt(store.get(), session.state().backend.get());
  if (!options.logits_out.empty()) {
    // All-row logits need one window over the whole prompt.
    const std::vector<float>& all = session.forward_all(prompt);
    write_binary(options.logits_out, all.data(), all.size() * sizeof(float));
    if (speculative) speculative->committed(int64_t(prompt.size()));
  } else {
    const int chunk_rows = options.chunk_rows > 0 ? options.chunk_rows : default_prefill_rows(backend);
    ProgressBar bar("prefill", uint64_t(prompt.size()), 0);
    bar.set_enabled(bar.enabled() && prompt.size() > size_t(chunk_rows));
    int64_t reported = 0;
    const auto on_progress = [&](int64_t done, int64_t) {
      bar.advance(uint64_t(done - reported), 0);
      reported = done;
    };
    if (speculative)
      speculative->prefill(prompt, chunk_rows, on_progress);
    else
      session.prefill(prompt, chunk_rows, on_progress);
  }
  const double prefill_s = seconds_since(prefill_start);
  active_phase_times() = nullptr;
  if (const int changes = end_prompt(store.get(), session.state().backend.get(), options.experts); changes > 0)
    fmt::print(stderr, "strata: prompt-hot pins: {} per layer ({} pinned)\n",
               std::min(options.experts.pin_hot, store->slots_per_layer() / 2), changes);
  const ExpertStoreStats prefill_stats = store ? store->stats() : ExpertStoreStats{};
  PhaseTimes phase_times;
  if (options.profile) active_phase_times() = &phase_times;

  std::optional<StreamingDecoder> decoder;
  if (tokenizer && !options.print_ids) decoder.emplace(*tokenizer);
  if (decoder) {
    std::fputs(tokenizer->decode(prompt).c_str(), stdout);
    std::fflush(stdout);
  }
  const std::optional<int32_t> eos = tokenizer ? tokenizer->eos_id() : std::nullopt;
  RunTokens output;
  // Under a grammar the end-of-sequence token ends the value whatever --ignore-eos says.
  output.eos = options.ignore_eos && !constraint ? std::nullopt : eos;
  output.decoder = decoder ? &*decoder : nullptr;
  output.delivered = delivered ? &*delivered : nullptr;
  output.telemetry = telemetry.get();
  output.store = store.get();
  output.speculative = speculative.has_value();
  output.window_before = store ? store->stats() : ExpertStoreStats{};
  const auto decode_start = std::chrono::steady_clock::now();
  const uint64_t jobs_before = pool.jobs_run(), inline_before = pool.jobs_inline();
  std::vector<float> last_logits;  // --logits-out: the session holds every row's logits
  if (!options.logits_out.empty()) {
    const std::vector<float>& all = session.logits();
    last_logits.assign(all.end() - hp.n_vocab, all.end());
  }
  const GenerationResult result = generate(
      session, sampler, last_logits.empty() ? session.logits() : last_logits,
      {.max_tokens = options.n_predict, .speculative = speculative ? &*speculative : nullptr},
      output);
  const int generated = int(result.generated);
  const std::vector<int32_t>& ids = output.ids;
  const std::vector<int32_t>& out_ids = output.out_ids;
  if (decoder) std::fputs((decoder->finish() + "\n").c_str(), stdout);
  if (!out_ids.empty() || options.print_ids) {
    std::string line;
    for (int32_t id : out_ids) line += fmt::format("{}{}", line.empty() ? "" : ",", id);
    std::puts(line.c_str());
  }
  const double decode_s = seconds_since(decode_start);
  if (result.end == GenerationEnd::ContextFull)
    fmt::print(stderr,
               "strata: the context is full ({} tokens): generation ended after {} tokens\n",
               session.n_past(), generated);
  if (!options.ids_out.empty()) {
    std::string text;
    for (int32_t id : ids) text += std::to_string(id) + "\n";
    write_binary(options.ids_out, text.data(), text.size());
  }
  const double decode_tps = double(generated) / std::max(decode_s, 1e-9);
  fmt::print(stderr,
             "strata: prompt {} tokens in {:.2f} s ({} tok/s); generated {} tokens in {:.2f} s "
             "({} tok/s, {:.2f} GB/s of weights); peak RSS {:.0f} MiB\n",
             prompt.size(), prefill_s, format_rate(double(prompt.size()) / std::max(prefill_s, 1e-9)),
             generated, decode_s, format_rate(decode_tps),
             weight_bytes_per_token(*model) * decode_tps / 1e9, peak_rss_mib());
  if (speculative) fmt::print(stderr, "strata: {}\n", speculative->summary());
  if (store) {
    fmt::print(stderr, "strata: prefill {}\n",
               format_expert_stats(prefill_stats, double(prompt.size())));
    fmt::print(stderr, "strata: decode {}\n",
               format_expert_stats(store->stats() - prefill_stats, std::max(generated - 1, 1)));
  }
  if (const std::string moce = format_moce_stats(store.get(), double(prompt.size()) + generated);
      !moce.empty())
    fmt::print(stderr, "strata: {} (prompt and decode)\n", moce);
  if (const std::string gpu = format_gpu_tier_stats(*session.state().backend, double(prompt.size()) + generated);
      !gpu.empty())
    fmt::print(stderr, "strata: {} (prompt and decode)\n", gpu);
  save_usage(store.get(), options.experts);
  if (options.profile) {
    active_phase_times() = nullptr;
    print_profile(fmt::format("of the prompt ({} tokens, whole)", prompt.size()), prompt_phase_times,
                  prefill_s * 1e3, 1);
    print_profile("per decoded token", phase_times, decode_s * 1e3, std::max(generated - 1, 1));
    const double steps = std::max(generated - 1, 1);
    fmt::print(stderr,
               "strata: profile per decoded token: {:.1f} pool hand-outs, {:.1f} run on the caller "
               "by the inline rule\n",
               double(pool.jobs_run() - jobs_before) / steps,
               double(pool.jobs_inline() - inline_before) / steps);
  }
}

}  // namespace

void register_run(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt");
  add_model_options(*cmd, options->model);
  add_sampling_options(*cmd, options->model.sampling);
  add_expert_options(*cmd, options->experts);
  cmd->add_flag("--profile", options->profile, "split the prompt's time and the decode time per token into their parts");
  cmd->add_option(
      "--telemetry", options->telemetry_out,
      "write one JSON line of expert/I/O counters per decode step (per verify window with --spec)");
  auto* prompt = cmd->add_option("-p,--prompt", options->prompt,
                                 "prompt text (default: stdin when it is not a terminal)");
  auto* prompt_file =
      cmd->add_option("-f,--file", options->prompt_file, "read the prompt from FILE (- = stdin)")
          ->excludes(prompt);
  cmd->add_option("--tokens", options->token_ids, "prompt as comma-separated token ids")
      ->excludes(prompt)
      ->excludes(prompt_file);
  cmd->add_option("-n,--n-predict", options->n_predict, "tokens to generate")
      ->check(CLI::Range(0, 1 << 20));
  add_chunk_option(*cmd, options->chunk_rows);
  cmd->add_flag("--print-ids", options->print_ids, "print generated token ids instead of text");
  cmd->add_option("--logits-out", options->logits_out,
                  "write the prompt's fp32 logits, every position ([T, vocab], little-endian)");
  cmd->add_option("--ids-out", options->ids_out, "write the generated token ids, one per line");
  add_spec_options(*cmd, options->spec);
  cmd->add_flag("--ignore-eos", options->ignore_eos,
                "keep generating past the end-of-sequence token");
  add_grammar_options(*cmd, options->grammar, "the output");
  cmd->callback([options, cmd] {
    options->prompt_given = cmd->count("--prompt") > 0;
    run(*options);
  });
}

}  // namespace strata::cli
