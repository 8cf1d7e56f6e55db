// The generation loop (decode/generate.h) against a hand-written sample/emit/decode loop on every
// fixture: the same tokens plainly and speculatively (drafts that always stand, drafts that never
// do, the MTP head), and the rules of its contract — stop tokens, a stop string that spans two
// tokens, cancellation inside a stream and before it, the token limit, what the session has fed
// on return, and the order of the callbacks.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../common/fixture_models.h"
#include "compute/cpu/thread_pool.h"
#include "decode/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"
#include "serve/stop_matcher.h"
#include "spec/spec_decoder.h"

namespace strata {
namespace {

constexpr int kTokens = 16;

std::vector<std::string> model_paths() {
  std::vector<std::string> paths;
  for (const char* arch : {"qwen3moe", "qwen3next", "qwen4exp"})
    paths.push_back(test_support::fixture_model_gguf(arch));
  return paths;
}

std::vector<int32_t> prompt_for(const Model& model) {
  const int vocab = int(model.hparams().n_vocab);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 7; ++i) prompt.push_back(int32_t((i * 37 + 11) % vocab));
  return prompt;
}

SamplerConfig sampled() {
  SamplerConfig config;
  config.temperature = 0.9f;
  config.top_k = 40;
  config.seed = 11;
  return config;
}

// What the hand-written loop made: each token and the logits row it was drawn from.
struct Reference {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

Reference hand_loop(const Model& model, compute::ThreadPool& pool, const SamplerConfig& sampling,
                    int n) {
  Session session(model, pool);
  Sampler sampler(sampling);
  session.prefill(prompt_for(model));
  Reference out;
  for (int i = 0; i < n; ++i) {
    out.logits.push_back(session.logits());
    out.tokens.push_back(sampler.sample(session.logits(), session.tokens()));
    if (i + 1 < n) session.decode(out.tokens.back());
  }
  return out;
}

// Proposes the reference's continuation: every draft stands, so stops, halts, cancellation and
// the limit land inside verify windows.
class ReferenceDrafter final : public spec::Drafter {
 public:
  ReferenceDrafter(std::vector<int32_t> reference, size_t prompt_size, int32_t vocab)
      : reference_(std::move(reference)), prompt_size_(prompt_size), vocab_(vocab) {}
  spec::DraftSource source() const override { return spec::DraftSource::Suffix; }
  void on_commit(const Session&, int64_t) override {}
  spec::Draft propose(const Session& session, int32_t, int max_tokens,
                      const KeepGoingFn&) override {
    spec::Draft draft;
    const size_t g = session.tokens().size() - prompt_size_;  // `next` is reference_[g]
    for (int j = 1; j <= max_tokens && g + size_t(j) < reference_.size(); ++j) {
      const int32_t right = reference_[g + size_t(j)];
      draft.tokens.push_back(right_ ? right : (right + 1) % vocab_);
      draft.confidence.push_back(1.0f);
    }
    return draft;
  }
  void always_wrong() { right_ = false; }

 private:
  std::vector<int32_t> reference_;
  size_t prompt_size_;
  int32_t vocab_;
  bool right_ = true;
};

enum class Mode { Plain, RightDrafts, WrongDrafts, Mtp };
const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::Plain:
      return "plain";
    case Mode::RightDrafts:
      return "drafts that stand";
    case Mode::WrongDrafts:
      return "drafts that fail";
    case Mode::Mtp:
      return "mtp";
  }
  return "?";
}
std::vector<Mode> modes(const Model& model) {
  std::vector<Mode> out = {Mode::Plain, Mode::RightDrafts, Mode::WrongDrafts};
  if (model.has_mtp()) out.push_back(Mode::Mtp);
  return out;
}

// One generation: a session prefilled with the prompt, its sampler and, unless plain, a decoder
// at a fixed depth of 3 (the gate would follow wall times).
struct GenerationRun {
  GenerationRun(const Model& model, compute::ThreadPool& pool, const SamplerConfig& sampling,
                Mode mode, const std::vector<int32_t>& reference)
      : session(model, pool), sampler(sampling), prompt(prompt_for(model)) {
    if (mode != Mode::Plain) {
      spec::SpecOptions options;
      options.mode = mode == Mode::Mtp ? spec::SpecMode::Mtp : spec::SpecMode::Off;
      options.gate.enabled = false;
      options.gate.max_depth = 3;
      decoder = std::make_unique<spec::SpecDecoder>(session, sampler, options, pool);
      if (mode != Mode::Mtp) {
        auto drafter = std::make_unique<ReferenceDrafter>(reference, prompt.size(),
                                                          int32_t(model.hparams().n_vocab));
        if (mode == Mode::WrongDrafts) drafter->always_wrong();
        decoder->add_drafter(std::move(drafter));
      }
      decoder->prefill(prompt, 64);
    } else {
      session.prefill(prompt);
    }
  }
  GenerationResult generate(GenerationCallbacks& callbacks, int64_t max_tokens,
                            bool feed_last = false) {
    return strata::generate(
        session, sampler, session.logits(),
        {.max_tokens = max_tokens, .feed_last = feed_last, .speculative = decoder.get()},
        callbacks);
  }
  // The tokens fed after the prompt.
  std::vector<int32_t> fed() const {
    return {session.tokens().begin() + ptrdiff_t(prompt.size()), session.tokens().end()};
  }
  Session session;
  Sampler sampler;
  std::vector<int32_t> prompt;
  std::unique_ptr<spec::SpecDecoder> decoder;
};

// Records everything the loop says, in order; the rules are set per test.
class Recorder final : public GenerationCallbacks {
 public:
  std::vector<int32_t> stop_tokens;
  std::function<bool(int32_t)> keep_going;  // on_token's answer (default: true)
  int cancel_at = -1;                       // cancel once this many tokens are out

  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::vector<spec::WindowReport> windows;
  std::vector<std::string> events;  // "token i" and "window first+kept", in call order
  int decodes = 0;

  bool is_stop_token(int32_t token) override {
    return std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end();
  }
  bool on_token(int32_t token, std::span<const float> row) override {
    events.push_back("token " + std::to_string(tokens.size()));
    tokens.push_back(token);
    logits.emplace_back(row.begin(), row.end());
    return !keep_going || keep_going(token);
  }
  bool cancel_requested() override { return cancel_at >= 0 && int(tokens.size()) >= cancel_at; }
  void on_window(const spec::WindowReport& window) override {
    events.push_back("window " + std::to_string(window.first_token) + "+" +
                     std::to_string(window.kept));
    windows.push_back(window);
  }
  void decode(Session& session, int32_t token) override {
    ++decodes;
    session.decode(token);
  }
};

std::vector<int32_t> first(const std::vector<int32_t>& tokens, size_t n) {
  return {tokens.begin(), tokens.begin() + ptrdiff_t(std::min(n, tokens.size()))};
}

// On return the session holds every token handed out, except possibly the last, and nothing more.
void expect_fed_all_but_possibly_the_last(const GenerationRun& run,
                                          const std::vector<int32_t>& out) {
  const std::vector<int32_t> fed = run.fed();
  EXPECT_TRUE(fed == out || (!out.empty() && fed == first(out, out.size() - 1)))
      << fed.size() << " fed after " << out.size() << " tokens out";
}

TEST(Generate, PlainAndSpeculativeGiveTheHandWrittenLoopsTokensAndLogits) {
  compute::ThreadPool pool(2);
  for (const std::string& path : model_paths()) {
    const auto model = Model::load(path);
    for (const SamplerConfig& sampling : {SamplerConfig{}, sampled()}) {
      const Reference reference = hand_loop(*model, pool, sampling, kTokens);
      for (Mode mode : modes(*model)) {
        SCOPED_TRACE(path + " " + mode_name(mode) + (sampling.temperature > 0 ? " sampled" : ""));
        GenerationRun run(*model, pool, sampling, mode, reference.tokens);
        Recorder recorder;
        const GenerationResult result = run.generate(recorder, kTokens);
        EXPECT_EQ(result.end, GenerationEnd::Length);
        EXPECT_EQ(result.generated, kTokens);
        EXPECT_EQ(recorder.tokens, reference.tokens);
        // Every token but the last was fed (the last one is never needed).
        EXPECT_EQ(run.fed(), first(reference.tokens, kTokens - 1));
        // The row each token was drawn from, bit for bit; drafts that stood come without one.
        int drafts_out = 0;
        for (size_t i = 0; i < recorder.logits.size(); ++i) {
          if (recorder.logits[i].empty()) {
            ++drafts_out;
            continue;
          }
          EXPECT_TRUE(recorder.logits[i] == reference.logits[i]) << "token " << i;
        }
        if (mode == Mode::Plain || mode == Mode::WrongDrafts) {
          EXPECT_EQ(drafts_out, 0);
        }
        if (mode == Mode::RightDrafts) {
          EXPECT_GT(drafts_out, kTokens / 2);
        }
      }
    }
  }
}

TEST(Generate, StopTokenEndsBeforeItAndIsNeverFed) {
  compute::ThreadPool pool(2);
  for (const std::string& path : model_paths()) {
    const auto model = Model::load(path);
    const Reference reference = hand_loop(*model, pool, sampled(), kTokens);
    // A token that first appears mid-stream (drafts that stand carry it inside a window).
    size_t stop_at = 0;
    for (size_t i = 4; i < reference.tokens.size() && stop_at == 0; ++i)
      if (std::find(reference.tokens.begin(), reference.tokens.begin() + ptrdiff_t(i),
                    reference.tokens[i]) == reference.tokens.begin() + ptrdiff_t(i))
        stop_at = i;
    ASSERT_GT(stop_at, 0u) << path << ": no token first appears after the 4th";
    const int32_t stop = reference.tokens[stop_at];
    for (Mode mode : modes(*model)) {
      for (bool feed_last : {false, true}) {
        SCOPED_TRACE(path + " " + mode_name(mode) + (feed_last ? " feed_last" : ""));
        GenerationRun run(*model, pool, sampled(), mode, reference.tokens);
        Recorder recorder;
        recorder.stop_tokens = {stop};
        const GenerationResult result = run.generate(recorder, kTokens, feed_last);
        EXPECT_EQ(result.end, GenerationEnd::StopToken);
        EXPECT_EQ(result.generated, int64_t(stop_at));
        EXPECT_EQ(recorder.tokens, first(reference.tokens, stop_at));
        // Every token before the stop was fed (it was drawn from the last one's logits), the
        // stop token not: rows a verify window had past it are rolled back.
        EXPECT_EQ(run.fed(), first(reference.tokens, stop_at));
      }
    }
  }
}

// Two characters per token, so a two-character stop string can span two tokens.
std::string text_of(int32_t token) {
  return {char('a' + token % 26), char('A' + (token / 26) % 26)};
}

TEST(Generate, StopStringSplitAcrossTokensEndsAfterTheTokenThatCompletesIt) {
  compute::ThreadPool pool(2);
  for (const std::string& path : model_paths()) {
    const auto model = Model::load(path);
    const Reference reference = hand_loop(*model, pool, sampled(), kTokens);
    // The stop string: the second character of token 5's text and the first of token 6's.
    const std::string stop =
        text_of(reference.tokens[5]).substr(1) + text_of(reference.tokens[6]).substr(0, 1);
    std::string whole;
    for (int32_t t : reference.tokens) whole += text_of(t);
    const size_t at = whole.find(stop);
    ASSERT_NE(at, std::string::npos);
    ASSERT_EQ(at % 2, 1u) << "the first occurrence lies inside one token's text";
    const size_t halt_after = (at + 1) / 2;  // the token whose text completes it
    for (Mode mode : modes(*model)) {
      for (bool feed_last : {false, true}) {
        SCOPED_TRACE(path + " " + mode_name(mode) + (feed_last ? " feed_last" : ""));
        GenerationRun run(*model, pool, sampled(), mode, reference.tokens);
        serve::StopMatcher matcher({stop});
        std::string shown;
        Recorder recorder;
        recorder.keep_going = [&](int32_t token) {
          shown += matcher.push(text_of(token));
          return !matcher.stopped();
        };
        const GenerationResult result = run.generate(recorder, kTokens, feed_last);
        EXPECT_EQ(result.end, GenerationEnd::Halted);
        EXPECT_EQ(recorder.tokens, first(reference.tokens, halt_after + 1));
        EXPECT_EQ(shown, whole.substr(0, at));  // the text before the stop string
        if (feed_last) {
          EXPECT_EQ(run.fed(), recorder.tokens);
        } else {
          expect_fed_all_but_possibly_the_last(run, recorder.tokens);
        }
      }
    }
  }
}

TEST(Generate, CancellationMidStreamEndsAfterTheTokenItFollows) {
  compute::ThreadPool pool(2);
  for (const std::string& path : model_paths()) {
    const auto model = Model::load(path);
    const Reference reference = hand_loop(*model, pool, sampled(), kTokens);
    for (Mode mode : modes(*model)) {
      // Windows of drafts that stand hand out tokens 2-4, 6-8, ...: 3 and 7 land inside one.
      for (int cancel_at : {1, 3, 5, 7}) {
        SCOPED_TRACE(path + " " + mode_name(mode) + " cancel at " + std::to_string(cancel_at));
        GenerationRun run(*model, pool, sampled(), mode, reference.tokens);
        Recorder recorder;
        recorder.cancel_at = cancel_at;
        const GenerationResult result = run.generate(recorder, kTokens, /*feed_last=*/true);
        EXPECT_EQ(result.end, GenerationEnd::Cancelled);
        EXPECT_EQ(result.generated, cancel_at);
        EXPECT_EQ(recorder.tokens, first(reference.tokens, size_t(cancel_at)));
        EXPECT_EQ(run.fed(), recorder.tokens);  // feed_last: the chat turn's state
      }
    }
  }
}

TEST(Generate, CancellationBeforeTheFirstTokenDrawsNothing) {
  compute::ThreadPool pool(2);
  for (const std::string& path : model_paths()) {
    const auto model = Model::load(path);
    const Reference reference = hand_loop(*model, pool, sampled(), kTokens);
    for (Mode mode : modes(*model)) {
      SCOPED_TRACE(path + " " + mode_name(mode));
      GenerationRun run(*model, pool, sampled(), mode, reference.tokens);
      Recorder cancelled;
      cancelled.cancel_at = 0;
      const GenerationResult result = run.generate(cancelled, kTokens, /*feed_last=*/true);
      EXPECT_EQ(result.end, GenerationEnd::Cancelled);
      EXPECT_EQ(result.generated, 0);
      EXPECT_TRUE(cancelled.tokens.empty());
      EXPECT_TRUE(run.fed().empty());
      // No draw was spent: a generation after it gives the reference from its first token.
      Recorder again;
      run.generate(again, kTokens);
      EXPECT_EQ(again.tokens, reference.tokens);
    }
  }
}

TEST(Generate, MaxTokensBoundsTheOutputAndWhatIsFed) {
  compute::ThreadPool pool(2);
  for (const std::string& path : model_paths()) {
    const auto model = Model::load(path);
    const Reference reference = hand_loop(*model, pool, SamplerConfig{}, kTokens);
    for (Mode mode : modes(*model)) {
      for (int max_tokens : {0, 1, 2, 7, kTokens}) {
        for (bool feed_last : {false, true}) {
          SCOPED_TRACE(path + " " + mode_name(mode) + " max " + std::to_string(max_tokens) +
                       (feed_last ? " feed_last" : ""));
          GenerationRun run(*model, pool, SamplerConfig{}, mode, reference.tokens);
          Recorder recorder;
          const GenerationResult result = run.generate(recorder, max_tokens, feed_last);
          EXPECT_EQ(result.end, GenerationEnd::Length);
          EXPECT_EQ(result.generated, max_tokens);
          EXPECT_EQ(recorder.tokens, first(reference.tokens, size_t(max_tokens)));
          const size_t fed = feed_last ? size_t(max_tokens) : size_t(std::max(max_tokens - 1, 0));
          EXPECT_EQ(run.fed(), first(reference.tokens, fed));
        }
      }
    }
  }
}

TEST(Generate, PlainCallbacksComeTokenThenItsWindow) {
  compute::ThreadPool pool(2);
  const auto model = Model::load(test_support::fixture_model_gguf("qwen3next"));
  const Reference reference = hand_loop(*model, pool, SamplerConfig{}, 5);
  for (bool feed_last : {false, true}) {
    SCOPED_TRACE(feed_last ? "feed_last" : "");
    GenerationRun run(*model, pool, SamplerConfig{}, Mode::Plain, reference.tokens);
    Recorder recorder;
    run.generate(recorder, 5, feed_last);
    std::vector<std::string> expected;
    for (int i = 0; i < 5; ++i) {
      expected.push_back("token " + std::to_string(i));
      if (i < 4 || feed_last) expected.push_back("window " + std::to_string(i) + "+1");
    }
    EXPECT_EQ(recorder.events, expected);
    // Every plain step went through the callbacks' decode (serve --parallel's batcher hook).
    EXPECT_EQ(recorder.decodes, feed_last ? 5 : 4);
    for (const spec::WindowReport& w : recorder.windows) {
      EXPECT_EQ(w.token, reference.tokens[size_t(w.first_token)]);
      EXPECT_EQ(w.rows, 1);
      EXPECT_EQ(w.drafted, 0);
    }
  }
}

TEST(Generate, SpeculativeWindowsComeAfterTheirTokensAndAccountForEveryFedRow) {
  compute::ThreadPool pool(2);
  for (const std::string& path : model_paths()) {
    const auto model = Model::load(path);
    const Reference reference = hand_loop(*model, pool, SamplerConfig{}, kTokens);
    for (Mode mode : modes(*model)) {
      if (mode == Mode::Plain) continue;
      SCOPED_TRACE(path + " " + mode_name(mode));
      GenerationRun run(*model, pool, SamplerConfig{}, mode, reference.tokens);
      Recorder recorder;
      run.generate(recorder, kTokens, /*feed_last=*/true);
      ASSERT_EQ(recorder.tokens, reference.tokens);
      // Windows follow one another: each starts at the token after the last one kept, and a
      // window is reported only once every token it kept was handed out.
      int64_t next_first = 0;
      size_t event = 0;
      for (const spec::WindowReport& w : recorder.windows) {
        EXPECT_EQ(w.first_token, next_first);
        EXPECT_EQ(w.token, reference.tokens[size_t(w.first_token)]);
        EXPECT_EQ(w.rows, 1 + w.drafted);
        next_first += w.kept;
        const std::string name =
            "window " + std::to_string(w.first_token) + "+" + std::to_string(w.kept);
        while (event < recorder.events.size() && recorder.events[event] != name) ++event;
        ASSERT_LT(event, recorder.events.size()) << name;
        const std::string last_kept = "token " + std::to_string(next_first - 1);
        EXPECT_NE(std::find(recorder.events.begin(), recorder.events.begin() + ptrdiff_t(event),
                            last_kept),
                  recorder.events.begin() + ptrdiff_t(event))
            << name << " came before " << last_kept;
      }
      EXPECT_EQ(next_first, kTokens);  // the kept rows are exactly the tokens fed
      EXPECT_EQ(run.fed(), reference.tokens);
      EXPECT_EQ(recorder.decodes, 0);  // the decoder feeds its own windows
      if (mode == Mode::RightDrafts) {
        EXPECT_TRUE(std::any_of(recorder.windows.begin(), recorder.windows.end(),
                                [](const spec::WindowReport& w) { return w.kept > 1; }));
      }
    }
  }
}

}  // namespace
}  // namespace strata
