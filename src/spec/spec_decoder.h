// SpecDecoder — the generation loop with speculative decoding: drafters propose, SpecGate picks
// the depth, one verify window of 1 + k rows runs through the normal forward, acceptance keeps a
// prefix, and the session rolls back the rest (Session::keep_rows).
//
// Contract
// - Greedy sampling: the emitted tokens equal plain greedy decoding (sample, emit, decode) token
//   for token, for every drafter, depth and gate setting (window identity + exact rollback).
// - Sampled: every emitted token is distributed as plain sampling's (spec/acceptance.h); the
//   sequence for a given seed differs from plain sampling's, since the generator is drawn from
//   differently.
// - With no drafter (or the gate declining every window) it is the plain loop: decode per token.
// - `generate` emits at most max_tokens tokens and stops before `stop_token` (not emitted), like
//   the plain loop in `strata run`. Not thread-safe; one per session.
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

namespace strata::spec {

enum class SpecMode { Off, Mtp, Suffix, Both };
SpecMode parse_spec_mode(const std::string& text);  // off | mtp | suffix | both

struct SpecOptions {
  SpecMode mode = SpecMode::Off;
  SpecGateConfig gate;  // gate.max_depth = --draft-max
};

class SpecDecoder {
 public:
  // Builds the drafters the mode asks for (MTP needs model.has_mtp()).
  SpecDecoder(Session& session, Sampler& sampler, const SpecOptions& options,
              compute::ThreadPool& pool, ExpertSource* experts = nullptr);
  // Tests: an extra drafter of their own.
  void add_drafter(std::unique_ptr<Drafter> drafter);

  // Prefills through the session, letting the drafters see every window.
  const std::vector<float>& prefill(std::span<const int32_t> prompt, int chunk_rows,
                                    const Session::ProgressFn& progress = nullptr);
  // The session committed n_rows rows outside `prefill` (e.g. Session::forward_all).
  void committed(int64_t n_rows);

  // Generates from `first_logits` (the last prompt row's logits); returns the tokens emitted.
  using EmitFn = std::function<void(int32_t token)>;
  int generate(std::span<const float> first_logits, int max_tokens,
               std::optional<int32_t> stop_token, const EmitFn& emit);

  const SpecGate& gate() const { return gate_; }
  std::string summary() const { return gate_.summary(); }

 private:
  // One decode cycle after `next` was emitted: feeds it (plus drafts); appends accepted drafts
  // to `accepted` and returns the following token.
  int32_t step(int32_t next, int max_drafts, std::vector<int32_t>& accepted);

  Session& session_;
  Sampler& sampler_;
  SpecOptions options_;
  SpecGate gate_;
  std::vector<std::unique_ptr<Drafter>> drafters_;
  std::vector<float> window_logits_;
};

}  // namespace strata::spec
