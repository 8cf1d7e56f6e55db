// generate — the one generation loop of `strata run`, `strata chat` and `strata serve`: draw a
// token, decide whether it ends the generation, hand it to the caller, feed it, repeat; plainly
// (one decode window per token) or speculatively (a spec::SpecDecoder's verify windows).
// It lives in decode/, above spec/ (which builds on engine/'s Session and Sampler), so that
// engine/ and spec/ do not include each other (docs/architecture.md, "Layout").
//
// Contract
// - Owns nothing. The caller owns the Session (already prefilled), the Sampler, the optional
//   SpecDecoder over that session and sampler, and the callbacks; `generate` runs on the caller's
//   thread, calls every callback on it, and returns when the generation ended (it never keeps a
//   reference to anything it was given).
// - The first token is drawn from `first_logits` (the last prompt row's logits), every later one
//   from the logits of the window that fed its predecessor, with session.tokens() as the history.
// - Order: cancel_requested() once before the first draw, then per token: draw → is_stop_token →
//   on_token → the length, context and cancel checks → feed (plain: callbacks.decode; speculative:
//   SpecDecoder::step, which feeds it with drafts and may hand out more tokens). So:
//   - a stop token (EOS, end of turn: is_stop_token true) ends the generation before it: it is
//     neither handed out nor fed (GenerationEnd::StopToken);
//   - on_token returning false ends it after that token (a stop string completed, a grammar value
//     is done: GenerationEnd::Halted). Stop strings are text, so they live in the caller's text
//     pipeline (serve/stop_matcher.h): it holds back text that may begin one, and the token whose
//     text completes it, possibly the second or third of the string, answers false; that token
//     counts as generated, the matcher drops the string and what follows;
//   - `max_tokens` tokens handed out end it (Length); max_tokens <= 0 hands out none;
//   - a context with no room to feed the token just handed out ends it (ContextFull). With
//     feed_last, where every token handed out must be fed, the check comes before the draw
//     instead: a token is only drawn when it can be fed;
//   - cancel_requested() true ends it (Cancelled): before the first draw and after every token
//     handed out, also between the tokens of one verify window.
// - On return the session has fed every token handed out except, possibly, the last (never one
//   after it: a verify window's rows past a stop are rolled back). With `feed_last` the loop
//   feeds that last one too, so the session ends where a chat turn must leave it (every token of
//   the reply fed, the stop token not).
// - on_token gets each token once, in order, with the logits row it was drawn from; a token that
//   stood as a draft inside a verify window gets an empty row (its window's rows are not exposed).
//   on_window gets every window the loop ran after it ran (a plain step: rows 1, drafted 0; a
//   verify window: its shape), after the on_token calls of the tokens it emitted.
// - `decode` feeds one token as a plain step of the plain loop (default: session.decode; the
//   speculative loop's windows go through the decoder). `strata serve --parallel` overrides it to
//   put the row into the coming batched step (serve/decode_batcher.h); the override must leave
//   the session exactly as session.decode would.
// - Speculative decoding (`speculative` set): each step after a token is SpecDecoder::step, which
//   feeds it plus the drafts the gate picks and hands out those that stand; the tokens equal the
//   plain loop's token for token (SpecDecoder's contract), and so do the ends above: the same
//   callbacks see the same tokens in the same order. While the loop runs it takes the decoder's
//   on_window observer (forwarding to callbacks.on_window) and clears it on return.
// - Allocation: nothing of its own; a warm plain or MTP step allocates nothing
//   (tests/engine/zero_alloc_test.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "engine/sampler.h"
#include "engine/session.h"
#include "spec/spec_decoder.h"
#include "util/function_ref.h"

namespace strata {

// How a generation ended (see the contract for each).
enum class GenerationEnd { StopToken, Halted, Length, ContextFull, Cancelled };
const char* generation_end_name(GenerationEnd end);

struct GenerationResult {
  int64_t generated = 0;  // tokens handed to on_token
  GenerationEnd end = GenerationEnd::Length;
};

// What the caller decides and hears during a generation. All on the generating thread.
class GenerationCallbacks {
 public:
  // True: `token` ends the generation before it (the end-of-sequence or end-of-turn token).
  virtual bool is_stop_token(int32_t token) = 0;
  // The next token of the output and the logits row it was drawn from (empty for a draft that
  // stood in a verify window). False: the generation ends after this token.
  virtual bool on_token(int32_t token, std::span<const float> logits) = 0;
  // Polled before each draw (see the contract); true ends the generation.
  virtual bool cancel_requested() { return false; }
  // After every window the loop ran (telemetry, the dashboard).
  virtual void on_window(const spec::WindowReport& /*window*/) {}
  // Feeds one token as a plain step; must leave the session as session.decode(token) would.
  virtual void decode(Session& session, int32_t token) { session.decode(token); }

 protected:
  ~GenerationCallbacks() = default;
};

struct GenerationOptions {
  int64_t max_tokens = 0;
  bool feed_last = false;                    // feed the last token handed out (a chat turn)
  spec::SpecDecoder* speculative = nullptr;  // over the same session and sampler; null: plain
};

GenerationResult generate(Session& session, Sampler& sampler, std::span<const float> first_logits,
                          const GenerationOptions& options, GenerationCallbacks& callbacks);

// The simplest use: every token to `emit`, ending at `stop_token` (when set) or max_tokens.
GenerationResult generate(Session& session, Sampler& sampler, std::span<const float> first_logits,
                          int64_t max_tokens, std::optional<int32_t> stop_token,
                          FunctionRef<void(int32_t)> emit,
                          spec::SpecDecoder* speculative = nullptr);

}  // namespace strata
