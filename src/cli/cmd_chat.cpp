// `strata chat` — a terminal conversation with the model.
//
// Each turn renders the whole conversation with the model's chat template and feeds only the
// tokens the session has not seen: the conversation state cache (decode/state_cache.h,
// --cache-ram) resumes from the longest snapshot that prefixes the prompt, with the same tokens
// as a full re-prefill (on hybrid models it re-prefills less than one 64-token window of the last
// prompt, the reply and the new message). Prompts prefill in windows of up to 512 rows on the CPU
// (engine/prefill_window.h), cut at multiples of 64: the bits of 64-row windows, so the cache
// still resumes at every multiple of 64. With --cache-ram 0 (or on a model without DeltaNet
// layers, where windows do not change bits) the live session is reused when the new prompt
// extends it; otherwise the session restarts. Replies stream as they are made;
// thinking is hidden behind a "[thinking… 143 tokens]" indicator unless --show-thinking
// (cli/reply_view.h). After each reply one line on stderr gives its tokens and tok/s (--no-speed
// turns it off). Ctrl-C stops the current reply and returns to the prompt; Ctrl-D or /quit exits.
// /reset starts over, /stats prints speed and context figures, /help lists the commands. With
// --spec, replies go through the SpecDecoder (the same tokens as without, greedy or sampled with
// the same seed); its drafters follow the session across turns and its gate lives as long as the
// chat, whose line it prints at exit (and in /stats).
// --json-schema FILE / --json / --grammar FILE (cli/grammar_options.h): every reply is one JSON
// value of the schema (or one sentence of the GBNF grammar), drawn under the grammar as `strata
// serve`'s response_format is (a fresh constraint per turn; the reply ends once the value is
// complete, or at the end-of-turn token, which is allowed only then); the template renders without
// thinking, as the server does for response_format.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/expert_options.h"
#include "cli/grammar_options.h"
#include "cli/model_options.h"
#include "cli/reply_view.h"
#include "cli/spec_options.h"
#include "compute/cpu/thread_pool.h"
#include "decode/generate.h"
#include "decode/state_cache.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"
#include "spec/spec_decoder.h"
#include "text/chat_template.h"
#include "text/think_filter.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/function_ref.h"

namespace strata::cli {
namespace {

std::atomic<bool> g_interrupted{false};
std::atomic<bool> g_generating{false};

void on_sigint(int) {
  if (g_generating.load()) {
    g_interrupted.store(true);
  } else {
    const char message[] = "\n(Ctrl-D or /quit exits)\n> ";
    [[maybe_unused]] const ssize_t n = write(STDOUT_FILENO, message, sizeof(message) - 1);
  }
}

struct ChatOptions {
  ModelOptions model;
  ExpertOptions experts;
  SpecCliOptions spec;
  GrammarCliOptions grammar;  // --json-schema FILE / --json / --grammar FILE
  std::string cache_ram;
  int chunk_rows = 0;  // --chunk; 0: default_prefill_rows of the backend
  std::string system_prompt;
  int max_reply_tokens = 512;
  bool show_thinking = false;
  bool no_thinking = false;
  bool ignore_eos = false;
  bool speed_line = true;  // tokens and tok/s after each reply
};

constexpr const char* kHelp =
    "commands:\n"
    "  /help   this list\n"
    "  /stats  context used, last turn's prompt and reply speed, expert cache figures\n"
    "  /reset  forget the conversation (the system prompt stays)\n"
    "  /quit   exit (also /exit, Ctrl-D)\n"
    "Ctrl-C stops the reply being written. Anything else is sent to the model.\n";

struct TurnStats {
  size_t prompt_tokens = 0;
  double prefill_s = 0;
  size_t reply_tokens = 0;
  double reply_s = 0;
  ExpertStoreStats experts;
};

// A reply's tokens for the generation loop (decode/generate.h): `ends_reply` says which token
// ends it, `show_token` puts each one on the terminal, and Ctrl-C (the SIGINT handler's flag)
// cancels it.
class ReplyTokens final : public GenerationCallbacks {
 public:
  // `delivered` (--json-schema): follows the shown tokens; the reply ends once it is finished.
  ReplyTokens(FunctionRef<bool(int32_t)> ends_reply, FunctionRef<void(int32_t)> show_token,
              grammar::GrammarConstraint* delivered)
      : ends_reply_(ends_reply), show_token_(show_token), delivered_(delivered) {}
  bool is_stop_token(int32_t token) override { return ends_reply_(token); }
  bool on_token(int32_t token, std::span<const float>) override {
    show_token_(token);
    if (!delivered_) return true;
    // Judged on the tokens shown so far: a verify window samples (and so advances the sampler's
    // constraint) before its tokens are shown.
    delivered_->accept(token);
    return !delivered_->finished();
  }
  bool cancel_requested() override { return g_interrupted.load(); }

 private:
  FunctionRef<bool(int32_t)> ends_reply_;
  FunctionRef<void(int32_t)> show_token_;
  grammar::GrammarConstraint* delivered_;
};

class ChatLoop {
 public:
  ChatLoop(const ChatOptions& options, const Model& model, const Tokenizer& tokenizer,
           compute::ThreadPool& pool, ExpertStore* store, ExpertSource* tracer)
      : options_(options),
        tokenizer_(tokenizer),
        chat_template_(ChatTemplate::from_gguf(model.file())),
        store_(store),
        session_(
            model, pool, tracer ? tracer : store,
            resolve_backend(options.model, store != nullptr && !wants_gpu_tier(options.experts)),
            options.model.ctx),
        sampler_(options.model.sampling),
        cache_(session_.backend() == "cpu" ? resolve_cache_ram(options.cache_ram) : 0,
               kPrefillAlignRows,
               options.chunk_rows > 0 ? options.chunk_rows
                                      : default_prefill_rows(session_.backend())),
        grammar_(output_grammar(options.grammar)) {
    check_gpu_tier_backend(options.experts, session_.backend());
    place_resident_weights(model, store, session_.backend(), options.experts);
    // A --json-schema / --grammar reply is the value alone: no thinking block before it.
    render_.enable_thinking = !options.no_thinking && !grammar_;
    end_of_turn_ = tokenizer.find_token(ChatTemplate::kEndOfTurn);
    if (grammar_) {
      std::vector<int32_t> stops;
      if (tokenizer.eos_id()) stops.push_back(*tokenizer.eos_id());
      if (end_of_turn_) stops.push_back(*end_of_turn_);
      vocabulary_.emplace(output_vocabulary(&tokenizer, std::move(stops), model.hparams().n_vocab,
                                            model.file().path()));
    }
    if (const spec::SpecOptions spec = resolve_spec_options(options.spec);
        spec.mode != spec::SpecMode::Off)
      speculative_.emplace(session_, sampler_, spec, pool, tracer ? tracer : store);
    reset();
  }

  void reset() {
    reset_session();
    messages_.clear();
    if (!options_.system_prompt.empty())
      messages_.push_back({"system", options_.system_prompt, {}});
  }

  void stats() {
    fmt::print(
        "context {} tokens of {}; last turn: prompt {} tokens in {:.2f} s ({:.1f} tok/s), "
        "reply {} tokens in {:.2f} s ({:.1f} tok/s)\n",
        session_.n_past(), session_.context_length(), last_.prompt_tokens, last_.prefill_s,
        double(last_.prompt_tokens) / std::max(last_.prefill_s, 1e-9), last_.reply_tokens,
        last_.reply_s, double(last_.reply_tokens) / std::max(last_.reply_s, 1e-9));
    if (store_)
      fmt::print(
          "last reply {}\n",
          format_expert_stats(last_.experts, double(std::max<size_t>(last_.reply_tokens, 1))));
    if (const std::string moce = format_moce_stats(store_, double(session_.n_past()));
        !moce.empty())
      fmt::print("since start {}\n", moce);
    if (speculative_) fmt::print("since start {}\n", speculative_->summary());
  }

  // The speculative decoder's line ("spec: T(1) ..."), or "" without --spec.
  std::string spec_summary() const { return speculative_ ? speculative_->summary() : ""; }

  void turn(const std::string& user_text) {
    messages_.push_back({"user", user_text, {}});
    const std::vector<int32_t> prompt =
        tokenizer_.encode(chat_template_.render(messages_, render_));
    // Without the cache (or on a window-invariant model, where it is exact) the live session is
    // reused when the new prompt extends what it has seen; otherwise the cache resumes (below).
    const std::vector<int32_t>& seen = session_.tokens();
    const bool extends =
        (!cache_.enabled() || StateCache::window_invariant(session_)) &&
        seen.size() < prompt.size() && std::equal(seen.begin(), seen.end(), prompt.begin());
    const size_t reused = extends ? seen.size() : 0;
    if (!extends && !seen.empty()) reset_session();  // the cache has what can be reused
    const std::span<const int32_t> fresh = std::span(prompt).subspan(reused);
    if (int64_t(fresh.size()) >= session_.context_left()) {
      // Leaves the REPL usable: the turn is dropped, the user decides what to do.
      messages_.pop_back();
      fmt::print(
          "[context full: the conversation needs {} more tokens, {} left; /reset starts over]\n",
          fresh.size(), session_.context_left());
      return;
    }

    last_ = TurnStats{};
    // From here a Ctrl-C stops this turn: one during the prompt's prefill cancels the reply before
    // its first token (the generation loop polls the flag before its first draw); it used to count
    // as a Ctrl-C at the prompt and let the whole reply run.
    g_interrupted.store(false);
    g_generating.store(true);
    const auto start = std::chrono::steady_clock::now();
    begin_prompt(store_, session_.state().backend.get());
    spec::SpecDecoder* spec = speculative_ ? &*speculative_ : nullptr;
    if (extends) {
      if (spec)
        spec->prefill(fresh, cache_.prefill_rows());
      else
        session_.prefill(fresh, cache_.prefill_rows());
      last_.prompt_tokens = fresh.size();
    } else {
      const int64_t cached = cache_.prefill(session_, prompt, end_of_turn_, spec);
      last_.prompt_tokens = prompt.size() - size_t(cached);
    }
    end_prompt(store_, session_.state().backend.get(), options_.experts);
    cache_.save(session_, spec);  // the whole prompt (replaces an equal entry)
    last_.prefill_s = seconds_since(start);

    StreamingDecoder decoder(tokenizer_);
    ThinkFilter filter(options_.show_thinking ? ThinkFilter::Mode::Show : ThinkFilter::Mode::Hide,
                       chat_template_.prompt_opens_thinking(render_));
    ReplyView view(std::cout, options_.show_thinking, isatty(STDOUT_FILENO));
    std::string answer, thinking;
    auto show = [&](const ThinkFilter::ReplyDelta& delta, bool one_token = true) {
      view.show(delta, one_token);
      answer += delta.answer;
      thinking += delta.thinking;
    };
    const auto reply_start = std::chrono::steady_clock::now();
    const ExpertStoreStats experts_before = store_ ? store_->stats() : ExpertStoreStats{};
    // --json-schema: this reply's constraint (drawn) and its copy that follows the shown tokens.
    std::optional<grammar::GrammarConstraint> constraint, delivered;
    if (grammar_) {
      constraint.emplace(*grammar_, *vocabulary_);
      delivered.emplace(*grammar_, *vocabulary_);
    }
    sampler_.set_constraint(constraint ? &*constraint : nullptr);
    auto ends_reply = [&](int32_t token) {  // under a grammar the stops end the value
      return (!options_.ignore_eos || grammar_) &&
             (token == end_of_turn_ || token == tokenizer_.eos_id());
    };
    auto show_token = [&](int32_t token) {
      show(filter.push(decoder.push(token)));
      ++last_.reply_tokens;
    };
    ReplyTokens reply_tokens(ends_reply, show_token, delivered ? &*delivered : nullptr);
    // feed_last: the next turn's prompt must find the session holding the whole reply.
    const GenerationResult result =
        generate(session_, sampler_, session_.logits(),
                 {.max_tokens = options_.max_reply_tokens, .feed_last = true, .speculative = spec},
                 reply_tokens);
    sampler_.set_constraint(nullptr);  // `constraint` ends with this turn
    std::string stop_note;
    if (result.end == GenerationEnd::Cancelled) stop_note = kStopped;
    if (result.end == GenerationEnd::ContextFull) stop_note = kContextFull;
    g_generating.store(false);
    show(filter.push(decoder.finish()), false);
    show(filter.finish(), false);
    last_.reply_s = seconds_since(reply_start);
    if (store_) last_.experts = store_->stats() - experts_before;
    if (stop_note.empty() && last_.reply_tokens >= size_t(options_.max_reply_tokens))
      stop_note = fmt::format("reply limit: --max-reply {}", options_.max_reply_tokens);
    if (last_.reply_tokens > 0) cache_.save_generated(session_, spec);
    view.finish(stop_note);
    if (options_.speed_line) print_speed_line();
    ChatMessage reply{"assistant", answer, {}};
    if (!thinking.empty()) reply.reasoning_content = thinking;
    messages_.push_back(std::move(reply));
  }

 private:
  static constexpr const char* kStopped = "stopped";
  static constexpr const char* kContextFull = "context full: /reset starts over";

  // "[24 tokens in 0.78 s, 30.8 tok/s; prompt 37 tokens, 412.0 tok/s]" on stderr, dim on a
  // terminal: the figures people look at after a reply, without asking /stats.
  void print_speed_line() const {
    const std::string line = fmt::format(
        "[{} tokens in {:.2f} s, {:.1f} tok/s; prompt {} tokens, {:.1f} tok/s]", last_.reply_tokens,
        last_.reply_s, double(last_.reply_tokens) / std::max(last_.reply_s, 1e-9),
        last_.prompt_tokens, double(last_.prompt_tokens) / std::max(last_.prefill_s, 1e-9));
    const bool color = isatty(STDERR_FILENO);
    fmt::print(stderr, "{}{}{}\n", color ? "\033[2m" : "", line, color ? "\033[0m" : "");
  }

  void reset_session() {
    session_.reset();
    if (speculative_) speculative_->reset();
  }

  static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  const ChatOptions& options_;
  const Tokenizer& tokenizer_;
  ChatTemplate chat_template_;
  ExpertStore* store_;
  ChatRenderOptions render_;
  Session session_;
  Sampler sampler_;
  std::optional<int32_t> end_of_turn_;
  std::vector<ChatMessage> messages_;
  TurnStats last_;
  StateCache cache_;
  std::optional<spec::SpecDecoder> speculative_;  // after session_ and sampler_, which it uses
  const std::optional<grammar::Grammar> grammar_;       // --json-schema / --json / --grammar
  std::optional<grammar::TokenVocabulary> vocabulary_;  // with grammar_
};

void run_chat(const ChatOptions& options) {
  const std::string path = resolve_model_path(options.model);
  const auto model = Model::load(path);
  if (!model->file().has("tokenizer.ggml.tokens"))
    fail("{}: the file has no tokenizer (tokenizer.ggml.*); chat needs one", path);
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  compute::ThreadPool pool(resolve_threads(options.model));
  const std::unique_ptr<ExpertStore> store = open_expert_store(*model, path, options.experts);
  const std::unique_ptr<TracingSource> tracer =
      open_routing_trace(*model, store.get(), options.experts);
  ChatLoop chat(options, *model, tokenizer, pool, store.get(), tracer.get());

  struct sigaction action {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a Ctrl-C at the prompt must not end getline
  sigaction(SIGINT, &action, nullptr);

  const bool interactive = isatty(STDIN_FILENO);
  fmt::print("strata chat: {} ({}). /help lists the commands; Ctrl-C stops a reply.\n", path,
             arch_name(model->hparams().arch));
  std::string line;
  while (true) {
    save_usage(store.get(), options.experts, /*only_if_due=*/true);  // idle: the user is typing
    std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      chat.reset();
      std::cout << "(conversation cleared)\n";
      continue;
    }
    if (line == "/stats") {
      chat.stats();
      continue;
    }
    if (line == "/help" || line == "/?") {
      std::cout << kHelp;
      continue;
    }
    if (line[0] == '/') {
      std::cout << "unknown command " << line << " (/help lists the commands)\n";
      continue;
    }
    chat.turn(line);
  }
  save_usage(store.get(), options.experts);
  if (interactive) std::cout << "\n";
  if (const std::string spec = chat.spec_summary(); !spec.empty())
    fmt::print(stderr, "strata: {}\n", spec);
}

}  // namespace

void register_chat(CLI::App& app) {
  auto options = std::make_shared<ChatOptions>();
  CLI::App* cmd = app.add_subcommand("chat", "Talk to the model in the terminal");
  add_model_options(*cmd, options->model);
  options->model.sampling.temperature = 0.7f;
  options->model.sampling.top_p = 0.9f;
  add_sampling_options(*cmd, options->model.sampling);
  add_expert_options(*cmd, options->experts);
  add_spec_options(*cmd, options->spec);
  add_cache_ram_option(*cmd, options->cache_ram);
  add_cached_chunk_option(*cmd, options->chunk_rows, /*serve=*/false);
  add_grammar_options(*cmd, options->grammar, "each reply");
  cmd->add_option("--system", options->system_prompt, "system prompt");
  cmd->add_option("--max-reply", options->max_reply_tokens, "tokens per reply at most")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--show-thinking", options->show_thinking, "print the <think> part of replies");
  cmd->add_flag("--no-thinking", options->no_thinking,
                "ask the model not to think (when the template supports it)");
  cmd->add_flag("--ignore-eos", options->ignore_eos,
                "keep replying past the end-of-turn token (only --max-reply or Ctrl-C stop it)");
  cmd->add_flag("!--no-speed", options->speed_line,
                "no tokens and tok/s line on stderr after each reply");
  cmd->callback([options] {
    resolve_cache_ram(options->cache_ram);  // a bad value fails before the model loads
    run_chat(*options);
  });
}

}  // namespace strata::cli
