#include "spec/spec_decoder.h"

#include <chrono>

#include "spec/acceptance.h"
#include "spec/mtp_drafter.h"
#include "spec/suffix_drafter.h"
#include "util/error.h"

namespace strata::spec {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

SpecMode parse_spec_mode(const std::string& text) {
  if (text == "off") return SpecMode::Off;
  if (text == "mtp") return SpecMode::Mtp;
  if (text == "suffix") return SpecMode::Suffix;
  if (text == "both") return SpecMode::Both;
  fail("--spec: expected off, mtp, suffix or both, found '{}'", text);
}

SpecDecoder::SpecDecoder(Session& session, Sampler& sampler, const SpecOptions& options,
                         compute::ThreadPool& pool, ExpertSource* experts)
    : session_(session), sampler_(sampler), options_(options), gate_(options.gate) {
  if (options.mode == SpecMode::Mtp || options.mode == SpecMode::Both)
    drafters_.push_back(std::make_unique<MtpDrafter>(session.model(), pool, experts));
  if (options.mode == SpecMode::Suffix || options.mode == SpecMode::Both)
    drafters_.push_back(std::make_unique<SuffixDrafter>());
}

void SpecDecoder::add_drafter(std::unique_ptr<Drafter> drafter) {
  drafters_.push_back(std::move(drafter));
}

const std::vector<float>& SpecDecoder::prefill(std::span<const int32_t> prompt, int chunk_rows,
                                               const Session::ProgressFn& progress) {
  int64_t reported = 0;
  return session_.prefill(prompt, chunk_rows, [&](int64_t done, int64_t total) {
    committed(done - reported);
    reported = done;
    if (progress) progress(done, total);
  });
}

void SpecDecoder::committed(int64_t n_rows) {
  for (auto& drafter : drafters_) drafter->on_commit(session_, n_rows);
}

int SpecDecoder::generate(std::span<const float> first_logits, int max_tokens,
                          std::optional<int32_t> stop_token, const EmitFn& emit) {
  if (max_tokens <= 0) return 0;
  int generated = 0;
  int32_t next = sampler_.sample(first_logits, session_.tokens());
  std::vector<int32_t> accepted;
  while (true) {
    if (stop_token && next == *stop_token) break;
    emit(next);
    if (++generated >= max_tokens) break;
    // A window of k drafts emits up to k + 1 tokens (the drafts that stand, then one more).
    const int64_t room = std::min<int64_t>(max_tokens - generated, session_.context_left()) - 1;
    accepted.clear();
    const int32_t following = step(next, int(std::max<int64_t>(room, 0)), accepted);
    bool stopped = false;
    for (int32_t token : accepted) {
      if (stop_token && token == *stop_token) {
        stopped = true;
        break;
      }
      emit(token);
      ++generated;
    }
    if (stopped) break;
    next = following;
  }
  return generated;
}

int32_t SpecDecoder::step(int32_t next, int max_drafts, std::vector<int32_t>& accepted) {
  const int depth_cap = std::min(max_drafts, gate_.config().max_depth);
  // Proposals: every drafter that is worth asking; the one the gate values most wins.
  Draft best;
  std::vector<double> best_a;
  double best_score = -1;
  double best_draft_s = 0;
  if (depth_cap > 0) {
    for (auto& drafter : drafters_) {
      const double draft_s = drafter->seconds_per_draft();
      if (!gate_.worth_drafting(drafter->source(), draft_s)) continue;
      // Chained drafters stop once one more draft could no longer raise the window's value,
      // even if it stood as likely as the last one did.
      auto keep_going = [&](const Draft& so_far) {
        if (!gate_.config().enabled) return true;
        std::vector<double> a = gate_.acceptance(so_far);
        const int k = int(a.size());
        a.push_back(a.back());
        return gate_.value(a, k + 1, draft_s) > std::max(1.0, gate_.value(a, k, draft_s));
      };
      Draft draft = drafter->propose(session_, next, depth_cap, keep_going);
      if (draft.tokens.empty()) continue;
      if (int(draft.tokens.size()) > depth_cap) {
        draft.tokens.resize(size_t(depth_cap));
        draft.confidence.resize(size_t(depth_cap));
      }
      std::vector<double> a = gate_.acceptance(draft);
      double score = 0;
      if (gate_.config().enabled) {
        gate_.best_depth(a, draft_s, &score);
      } else {  // fixed depth: the proposal expected to emit the most tokens
        double run = 1;
        score = 1;
        for (double aj : a) score += run *= aj;
        score += 1e-6 * double(draft.tokens.size());
      }
      if (score > best_score) {
        best_score = score;
        best = std::move(draft);
        best_a = std::move(a);
        best_draft_s = draft_s;
      }
    }
  }
  const int k = best.tokens.empty() ? 0 : gate_.pick_depth(best_a, int(best.tokens.size()), best_draft_s);

  const auto start = std::chrono::steady_clock::now();
  if (k == 0) {
    session_.decode(next);
    gate_.record_window(1, seconds_since(start));
    committed(1);
    return sampler_.sample(session_.logits(), session_.tokens());
  }
  std::vector<int32_t> window = {next};
  window.insert(window.end(), best.tokens.begin(), best.tokens.begin() + k);
  const std::vector<float>& logits = session_.verify(window);
  const std::vector<int32_t>& tokens = session_.tokens();
  const size_t vocab = size_t(session_.model().hparams().n_vocab);
  const size_t n_before = tokens.size() - window.size();
  auto row = [&](int j) { return std::span<const float>(logits).subspan(size_t(j) * vocab, vocab); };
  auto history = [&](int j) { return std::span<const int32_t>(tokens).first(n_before + size_t(j) + 1); };
  int n_accepted = 0;
  std::optional<int32_t> following;
  for (int j = 0; j < k && !following; ++j) {
    const int32_t draft = window[size_t(j) + 1];
    if (sampler_.greedy()) {
      const int32_t target = sampler_.sample(row(j), history(j));
      if (target == draft)
        ++n_accepted;
      else
        following = target;
    } else {
      const TokenDistribution target = sampler_.distribution(row(j), history(j));
      const TokenDistribution point{{draft}, {1.0f}};
      const double u_accept = sampler_.uniform(), u_residual = sampler_.uniform();
      following = rejection_step(target, point, draft, u_accept, u_residual);
      if (!following) ++n_accepted;
    }
  }
  if (!following) following = sampler_.sample(row(k), history(k));
  accepted.assign(window.begin() + 1, window.begin() + 1 + n_accepted);
  session_.keep_rows(n_accepted + 1);
  gate_.record_window(k + 1, seconds_since(start));
  gate_.record_verify(best, k, n_accepted);
  committed(n_accepted + 1);
  return *following;
}

}  // namespace strata::spec
