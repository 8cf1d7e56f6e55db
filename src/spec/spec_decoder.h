// SpecDecoder — the windows of speculative decoding: drafters propose, SpecGate picks the depth,
// one verify window of 1 + k rows runs through the normal forward, acceptance keeps a prefix, and
// the session rolls back the rest (Session::keep_rows).
//
// Contract
// - The emitted tokens equal plain decoding's (sample, emit, decode) token for token, for every
//   drafter, depth and gate setting (window identity + exact rollback), greedy and sampled alike:
//   each row of a verify window is sampled with the sampler, in order, exactly as a plain step
//   would sample it (same logits bits, same history, the sampler's next draw), and a draft stands
//   iff it equals that token. The drafts are point masses, so this is the rejection rule of
//   spec/acceptance.h coupled to the plain draw: a draft stands with probability p(d), and on a
//   rejection the token is distributed as p without d. Same seed → same tokens as plain sampling,
//   whatever the gate picks (its picks follow wall times).
// - With no drafter (or the gate declining every window) each step is a plain decode.
// - The generation loop around the windows is decode/generate.h's `generate` (plain and
//   speculative alike: stop tokens, stop strings, limits, cancellation); this class runs the
//   windows: `step` feeds a token plus drafts, hands out the drafts that stand (up to a stop token
//   or a halt) and returns the following token; `feed` feeds one token as a plain step.
// - The gate may be shared by several decoders used one after the other (a server's requests), so
//   its measurements and its forced plain steps span them. Not thread-safe; one per session.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/session.h"
#include "spec/drafter.h"
#include "spec/spec_gate.h"
#include "util/function_ref.h"

namespace strata::spec {

enum class SpecMode { Off, Mtp, Suffix, Both };
SpecMode parse_spec_mode(const std::string& text);  // off | mtp | suffix | both

struct SpecOptions {
  SpecMode mode = SpecMode::Off;
  SpecGateConfig gate;  // gate.max_depth = --draft-max
};

// One window of the decode loop, for telemetry: a plain step (rows 1, drafted 0) or a verify.
struct WindowReport {
  int64_t first_token = 0;  // index among the tokens generated so far of the fed token
  int32_t token = 0;        // that token (the window's first row)
  int rows = 1;             // 1 + drafted
  int drafted = 0;
  int accepted = 0;  // drafts that stood (judged by the target)
  int kept = 1;      // rows the session kept: 1 + the accepted drafts emitted (fewer after a stop)
  double seconds = 0;  // verify + rollback wall time (SpecGate's T(rows) sample)
};

class SpecDecoder {
 public:
  // Builds the drafters the mode asks for (MTP needs model.has_mtp()). With `shared_gate`, the
  // decoder uses that gate (which must outlive it) instead of its own.
  SpecDecoder(Session& session, Sampler& sampler, const SpecOptions& options,
              compute::ThreadPool& pool, ExpertSource* experts = nullptr,
              SpecGate* shared_gate = nullptr);
  // Tests: an extra drafter of their own.
  void add_drafter(std::unique_ptr<Drafter> drafter);
  // After Session::reset: fresh drafters (the MTP head's cache follows the session's rows); the
  // gate keeps its measurements. Drafters added with add_drafter are dropped.
  void reset();

  // Prefills through the session, letting the drafters see every window.
  const std::vector<float>& prefill(std::span<const int32_t> prompt, int chunk_rows,
                                    const Session::ProgressFn& progress = nullptr);
  // The session committed n_rows rows outside `prefill` (e.g. Session::forward_all).
  void committed(int64_t n_rows);

  // One decode cycle after `next` (generated token number `index`, already handed out): feeds it
  // plus up to `max_drafts` drafts the gate picks in one window, hands the drafts that stand to
  // `emit` in order (stopping before one `is_stop` accepts, or after one `emit` returns false
  // for), keeps those rows (the session then holds `next` and every token emitted) and returns
  // the token that follows them: drawn from the last kept row, or the stop token; nullopt when
  // `emit` halted. The caller keeps max_drafts below both its token limit and the context left.
  using TokenFn = FunctionRef<bool(int32_t token)>;
  std::optional<int32_t> step(int32_t next, int64_t index, int max_drafts, TokenFn is_stop,
                              TokenFn emit);
  // Feeds one token as a plain step (the last token the loop handed out, when the caller keeps
  // the session going, as `strata chat` does between turns); `index` is its number among the
  // generated tokens, for the window report.
  void feed(int32_t token, int64_t index = 0);

  // Called after every window of step and feed.
  using WindowFn = std::function<void(const WindowReport&)>;
  void on_window(WindowFn observer) { on_window_ = std::move(observer); }

  // Deep copies of the drafters' states (conversation state cache), or nullopt when one of them
  // cannot be copied (Drafter::clone). restore_drafters replaces the drafters with copies of
  // `saved`, which must come from a decoder of the same options over a session now restored to
  // the snapshot taken with them.
  std::optional<std::vector<std::unique_ptr<Drafter>>> copy_drafters() const;
  void restore_drafters(const std::vector<std::unique_ptr<Drafter>>& saved);
  // The kinds of the drafters, in order.
  std::vector<DraftSource> drafter_sources() const;

  const SpecGate& gate() const { return *gate_; }
  std::string summary() const { return gate_->summary(); }

 private:
  void build_drafters();
  void report(const WindowReport& window) {
    if (on_window_) on_window_(window);
  }

  Session& session_;
  Sampler& sampler_;
  SpecOptions options_;
  compute::ThreadPool& pool_;
  ExpertSource* experts_;
  std::unique_ptr<SpecGate> own_gate_;
  SpecGate* gate_;
  std::vector<std::unique_ptr<Drafter>> drafters_;
  WindowFn on_window_;
  // step's working buffers, reused from window to window (a warm MTP step allocates nothing).
  Draft best_, draft_;
  std::vector<double> best_a_, a_, keep_going_a_;
  std::vector<int32_t> window_;
};

}  // namespace strata::spec
