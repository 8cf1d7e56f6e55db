#include "decode/generate.h"

#include <algorithm>
#include <chrono>
#include <climits>

namespace strata {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Points the decoder's window observer at the callbacks for as long as the loop runs (the
// callbacks live only that long). The observer is a std::function holding one pointer, stored
// inline: setting it allocates nothing.
class WindowForwarding {
 public:
  WindowForwarding(spec::SpecDecoder* decoder, GenerationCallbacks& callbacks) : decoder_(decoder) {
    if (decoder_)
      decoder_->on_window([c = &callbacks](const spec::WindowReport& w) { c->on_window(w); });
  }
  ~WindowForwarding() {
    if (decoder_) decoder_->on_window(nullptr);
  }
  WindowForwarding(const WindowForwarding&) = delete;
  WindowForwarding& operator=(const WindowForwarding&) = delete;

 private:
  spec::SpecDecoder* decoder_;
};

// A plain step: feeds `token` through the callbacks and reports the window.
void plain_step(Session& session, GenerationCallbacks& callbacks, int32_t token, int64_t index) {
  const auto start = std::chrono::steady_clock::now();
  callbacks.decode(session, token);
  callbacks.on_window({.first_token = index, .token = token, .seconds = seconds_since(start)});
}

}  // namespace

const char* generation_end_name(GenerationEnd end) {
  switch (end) {
    case GenerationEnd::StopToken:
      return "stop token";
    case GenerationEnd::Halted:
      return "halted";
    case GenerationEnd::Length:
      return "length";
    case GenerationEnd::ContextFull:
      return "context full";
    case GenerationEnd::Cancelled:
      return "cancelled";
  }
  return "?";
}

GenerationResult generate(Session& session, Sampler& sampler, std::span<const float> first_logits,
                          const GenerationOptions& options, GenerationCallbacks& callbacks) {
  GenerationResult result;
  if (options.max_tokens <= 0) return result;
  if (callbacks.cancel_requested()) {
    result.end = GenerationEnd::Cancelled;
    return result;
  }
  spec::SpecDecoder* const speculative = options.speculative;
  const WindowForwarding forwarding(speculative, callbacks);

  // Drafts that stand inside a verify window come out through `emit_draft`, under the same rules
  // as the loop's own tokens; `halt` says why one ended the window.
  GenerationEnd halt = GenerationEnd::Halted;
  int32_t last = 0;      // the last token handed out
  bool last_fed = true;  // whether the session has fed it
  auto is_stop = [&](int32_t token) { return callbacks.is_stop_token(token); };
  auto emit_draft = [&](int32_t token) {
    ++result.generated;
    last = token;  // a verify window keeps the rows of the drafts it hands out: fed
    if (!callbacks.on_token(token, {})) {
      halt = GenerationEnd::Halted;
      return false;
    }
    if (result.generated < options.max_tokens && callbacks.cancel_requested()) {
      halt = GenerationEnd::Cancelled;
      return false;
    }
    return true;
  };

  std::span<const float> logits = first_logits;  // the row the next token is drawn from
  bool have_drawn = false;                       // a verify window already drew the next token:
  int32_t drawn = 0;                             // this one
  while (true) {
    // A chat turn feeds every token it hands out: draw one only when it can be fed.
    if (options.feed_last && session.context_left() < 1) {
      result.end = GenerationEnd::ContextFull;
      break;
    }
    const int32_t next = have_drawn ? drawn : sampler.sample(logits, session.tokens());
    have_drawn = false;
    if (callbacks.is_stop_token(next)) {
      result.end = GenerationEnd::StopToken;
      break;
    }
    ++result.generated;
    last = next;
    last_fed = false;
    if (!callbacks.on_token(next, logits)) {
      result.end = GenerationEnd::Halted;
      break;
    }
    if (result.generated >= options.max_tokens) {
      result.end = GenerationEnd::Length;
      break;
    }
    if (session.context_left() < 1) {
      result.end = GenerationEnd::ContextFull;
      break;
    }
    if (callbacks.cancel_requested()) {
      result.end = GenerationEnd::Cancelled;
      break;
    }
    const int64_t index = result.generated - 1;
    if (speculative) {
      // A window of k drafts hands out up to k + 1 tokens (the drafts that stand, then the one
      // that follows them): keep k + 1 within the limit and k + 1 rows within the context.
      const int64_t room =
          std::min<int64_t>(options.max_tokens - result.generated, session.context_left()) - 1;
      const std::optional<int32_t> following = speculative->step(
          next, index, int(std::clamp<int64_t>(room, 0, INT32_MAX)), is_stop, emit_draft);
      last_fed = true;
      if (!following) {
        result.end = halt;
        break;
      }
      have_drawn = true;
      drawn = *following;
    } else {
      plain_step(session, callbacks, next, index);
      last_fed = true;
    }
    logits = session.logits();
  }
  if (options.feed_last && !last_fed) {
    if (speculative)
      speculative->feed(last, result.generated - 1);  // the drafters see it too
    else
      plain_step(session, callbacks, last, result.generated - 1);
  }
  return result;
}

namespace {

class EmitEveryToken final : public GenerationCallbacks {
 public:
  EmitEveryToken(std::optional<int32_t> stop_token, FunctionRef<void(int32_t)> emit)
      : stop_token_(stop_token), emit_(emit) {}
  bool is_stop_token(int32_t token) override { return stop_token_ && token == *stop_token_; }
  bool on_token(int32_t token, std::span<const float>) override {
    emit_(token);
    return true;
  }

 private:
  std::optional<int32_t> stop_token_;
  FunctionRef<void(int32_t)> emit_;
};

}  // namespace

GenerationResult generate(Session& session, Sampler& sampler, std::span<const float> first_logits,
                          int64_t max_tokens, std::optional<int32_t> stop_token,
                          FunctionRef<void(int32_t)> emit, spec::SpecDecoder* speculative) {
  EmitEveryToken callbacks(stop_token, emit);
  return generate(session, sampler, first_logits,
                  {.max_tokens = max_tokens, .speculative = speculative}, callbacks);
}

}  // namespace strata
