// `strata profile -m MODEL -f TEXT -o PROFILE` — runs a calibration text through the model and
// writes how often each (layer, expert) was routed to: the ranking `--fill` loads at startup.
#include <fmt/format.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "experts/profile.h"
#include "experts/sidecar.h"
#include "engine/session.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::cli {
namespace {

struct ProfileOptions {
  ModelOptions model;
  std::string text_file;
  std::string text;
  std::string output;
  int max_tokens = 4096;
  int chunk_rows = kCpuPrefillRows;  // the CPU's (profile runs there)
};

void profile(const ProfileOptions& o) {
  const std::string path = resolve_model_path(o.model);
  const auto model = Model::load(path);
  if (!model->file().has("tokenizer.ggml.tokens")) fail("{}: the file has no tokenizer", path);
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  std::string text = o.text;
  if (!o.text_file.empty()) {
    std::ifstream in(o.text_file, std::ios::binary);
    if (!in) fail("{}: cannot open the calibration text", o.text_file);
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  if (text.empty()) fail("profile: give a calibration text with -f FILE or -p TEXT");
  std::vector<int32_t> tokens = tokenizer.encode(text);
  const int64_t limit = std::min<int64_t>(o.max_tokens, model->hparams().n_ctx_train > 0 ? model->hparams().n_ctx_train : INT64_MAX);
  if (int64_t(tokens.size()) > limit) tokens.resize(size_t(limit));
  if (tokens.empty()) fail("profile: the text encodes to no tokens");

  const HParams& hp = model->hparams();
  ExpertProfile result;
  result.model_identity = gguf_identity(model->file());
  ProfilingSource source(model->mapped_experts(), result, int(model->layers().size()), hp.n_expert);
  compute::ThreadPool pool(resolve_threads(o.model));
  Session session(*model, pool, &source);
  ProgressBar bar("profile", tokens.size(), 0);
  int64_t reported = 0;
  session.prefill(tokens, o.chunk_rows, [&](int64_t done, int64_t) {
    bar.advance(uint64_t(done - reported), 0);
    reported = done;
  });
  bar.finish();
  const std::string out = o.output.empty() ? path + ".profile" : o.output;
  result.save(out);
  fmt::print("{}: routing of {} tokens over {} layers x {} experts\n", out, result.tokens, hp.n_layer, hp.n_expert);
}

}  // namespace

void register_profile(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  CLI::App* cmd = app.add_subcommand("profile", "Count expert routing over a calibration text (for --fill)");
  add_model_options(*cmd, o->model, /*with_backend=*/false);
  auto* file = cmd->add_option("-f,--file", o->text_file, "calibration text file");
  cmd->add_option("-p,--prompt", o->text, "calibration text")->excludes(file);
  cmd->add_option("-o,--output", o->output, "profile path (default: MODEL.profile)");
  cmd->add_option("--max-tokens", o->max_tokens, "tokens of the text to use at most")->check(CLI::Range(1, 1 << 24));
  add_chunk_option(*cmd, o->chunk_rows);
  cmd->callback([o] { profile(*o); });
}

}  // namespace strata::cli
