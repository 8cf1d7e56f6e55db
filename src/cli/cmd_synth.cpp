// `strata synth` — write a GGUF of any supported architecture and shape with random weights.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "synth/synth.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::cli {
namespace {

struct SynthCommandOptions {
  std::string shape = "tiny-qwen4exp";
  std::string type = "f32";
  std::string expert_type;
  uint64_t seed = 1;
  int layers = 0;
  int experts = 0;
  std::string output;
  std::string tokenizer_dir;
  double routing_skew = 0.0;
  double routing_correlation = 0.0;
  std::string codes = "auto";
  int threads = 0;
};

GgmlType parse_type(const std::string& name, const char* flag) {
  const auto type = type_from_name(name);
  if (!type || !type_traits(*type).has_kernels || !quant::has_quantizer(*type))
    fail("{}: expected one of f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q2_k, iq2_xs, found '{}'",
         flag, name);
  return *type;
}

}  // namespace

void register_synth(CLI::App& app) {
  auto o = std::make_shared<SynthCommandOptions>();
  CLI::App* cmd = app.add_subcommand("synth", "Write a GGUF with random weights of a given shape");
  std::string shapes;
  for (const std::string& name : synth_shape_names()) shapes += fmt::format("{}{}", shapes.empty() ? "" : ", ", name);
  cmd->add_option("--shape", o->shape, "shape: " + shapes);
  cmd->add_option("--type", o->type, "dense weight type");
  cmd->add_option("--expert-type", o->expert_type, "routed expert type (default: --type)");
  cmd->add_option("--seed", o->seed, "random seed");
  cmd->add_option("--layers", o->layers, "override the layer count")->check(CLI::Range(1, 1024));
  cmd->add_option("--experts", o->experts, "override the expert count")->check(CLI::Range(1, 65536));
  cmd->add_option("--tokenizer", o->tokenizer_dir,
                  "HF tokenizer dir (tokenizer.json): embed it and size the vocabulary to it");
  cmd->add_option("--routing-skew", o->routing_skew,
                  "Zipf exponent of expert popularity per layer (0 = uniform, as random routers)");
  cmd->add_option("--routing-correlation", o->routing_correlation,
                  "correlation of consecutive tokens' router logits, in [0, 1) (0 = independent; "
                  "needs a Gated DeltaNet layer 0: qwen3next, qwen4exp shapes)");
  cmd->add_option("--codes", o->codes,
                  "how block-type rows are made: auto (IQ2_XS random grid codes, IQ4_NL blocks "
                  "drawn from a pool of quantized blocks, other types quantized from floats), "
                  "pool (every block type from a pool: fastest), quantize (every type from its "
                  "floats, IQ2_XS included: slow)")
      ->check(CLI::IsMember({"auto", "pool", "quantize"}));
  cmd->add_option("--threads", o->threads,
                  "threads generating data (default: all cores); the file does not depend on it")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("output", o->output, "output GGUF path")->required();
  cmd->callback([o] {
    SynthOptions options;
    options.hparams = synth_shape(o->shape);
    HParams& hp = options.hparams;
    resize_synth_shape(hp, o->layers, o->experts);
    options.dense_type = parse_type(o->type, "--type");
    options.expert_type = o->expert_type.empty() ? options.dense_type
                                                 : parse_type(o->expert_type, "--expert-type");
    options.seed = o->seed;
    options.routing.skew = o->routing_skew;
    options.routing.correlation = o->routing_correlation;
    if (!o->tokenizer_dir.empty()) {
      options.tokenizer_dir = o->tokenizer_dir;
      hp.n_vocab = hf_tokenizer_vocab_size(o->tokenizer_dir);
    }
    options.codes = o->codes == "pool"       ? SynthCodes::Pool
                    : o->codes == "quantize" ? SynthCodes::Quantize
                                             : SynthCodes::Auto;
    options.n_threads = o->threads;
    std::unique_ptr<ProgressBar> bar;  // made at the first report, when the total is known
    uint64_t reported = 0;
    const auto start = std::chrono::steady_clock::now();
    write_synthetic_model(options, o->output, [&](uint64_t done, uint64_t total) {
      if (!bar) bar = std::make_unique<ProgressBar>("synth", 0, total);
      bar->advance(0, done - reported);
      reported = done;
    });
    if (bar) bar->finish();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string routing =
        options.routing.enabled()
            ? fmt::format(", routing skew {} correlation {}", o->routing_skew, o->routing_correlation)
            : std::string();
    fmt::print(stderr,
               "strata synth: wrote {} ({}, {} layers, {} experts, {:.2f} GiB{}) in {:.1f} s "
               "({:.0f} MiB/s)\n",
               o->output, o->shape, hp.n_layer, hp.n_expert, double(reported) / (1 << 30), routing,
               seconds, double(reported) / (1 << 20) / std::max(seconds, 1e-9));
  });
}

}  // namespace strata::cli
