#include "spec/spec_decoder.h"

#include <chrono>

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
                         compute::ThreadPool& pool, ExpertSource* experts, SpecGate* shared_gate)
    : session_(session),
      sampler_(sampler),
      options_(options),
      pool_(pool),
      experts_(experts),
      own_gate_(shared_gate ? nullptr : std::make_unique<SpecGate>(options.gate)),
      gate_(shared_gate ? shared_gate : own_gate_.get()) {
  build_drafters();
}

void SpecDecoder::build_drafters() {
  drafters_.clear();
  if (options_.mode == SpecMode::Mtp || options_.mode == SpecMode::Both)
    drafters_.push_back(std::make_unique<MtpDrafter>(session_.model(), pool_, experts_,
                                                     session_.reserved_tokens()));
  if (options_.mode == SpecMode::Suffix || options_.mode == SpecMode::Both)
    drafters_.push_back(std::make_unique<SuffixDrafter>());
}

void SpecDecoder::reset() {
  build_drafters();
}

std::optional<std::vector<std::unique_ptr<Drafter>>> SpecDecoder::copy_drafters() const {
  std::vector<std::unique_ptr<Drafter>> copies;
  for (const auto& drafter : drafters_) {
    std::unique_ptr<Drafter> copy = drafter->clone();
    if (!copy) return std::nullopt;
    copies.push_back(std::move(copy));
  }
  return copies;
}

void SpecDecoder::restore_drafters(const std::vector<std::unique_ptr<Drafter>>& saved) {
  if (saved.size() != drafters_.size())
    fail("spec decoder: {} saved drafters for {} drafters", saved.size(), drafters_.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i]->source() != drafters_[i]->source())
      fail("spec decoder: saved drafter {} is {}, expected {}", i,
           draft_source_name(saved[i]->source()), draft_source_name(drafters_[i]->source()));
    drafters_[i] = saved[i]->clone();
  }
}

std::vector<DraftSource> SpecDecoder::drafter_sources() const {
  std::vector<DraftSource> out;
  for (const auto& drafter : drafters_) out.push_back(drafter->source());
  return out;
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

void SpecDecoder::feed(int32_t token, int64_t index) {
  const auto start = std::chrono::steady_clock::now();
  session_.decode(token);
  const double seconds = seconds_since(start);
  gate_->record_window(1, seconds);
  committed(1);
  report({.first_token = index, .token = token, .seconds = seconds});
}

std::optional<int32_t> SpecDecoder::step(int32_t next, int64_t index, int max_drafts,
                                         TokenFn is_stop, TokenFn emit) {
  SpecGate& gate = *gate_;
  const int depth_cap = std::min(max_drafts, gate.config().max_depth);
  // Proposals: every drafter that is worth asking; the one the gate values most wins. A forced
  // plain step (T(1) refresh) asks no drafter.
  // The buffers are members, swapped rather than moved, so a warm step allocates nothing.
  Draft& best = best_;
  best.tokens.clear();
  best.confidence.clear();
  std::vector<double>& best_a = best_a_;
  best_a.clear();
  double best_score = -1;
  double best_draft_s = 0;
  if (depth_cap > 0 && !gate.force_plain()) {
    for (auto& drafter : drafters_) {
      const double draft_s = drafter->seconds_per_draft();
      if (!gate.worth_drafting(drafter->source(), draft_s)) continue;
      // Chained drafters stop once one more draft could no longer raise the window's value,
      // even if it stood as likely as the last one did. (One captured pointer: a KeepGoingFn of
      // it is stored inline, not on the heap.)
      struct KeepGoing {
        SpecGate& gate;
        double draft_s;
        std::vector<double>& a;
      } ctx{gate, draft_s, keep_going_a_};
      auto keep_going = [c = &ctx](const Draft& so_far) {
        if (!c->gate.config().enabled) return true;
        std::vector<double>& a = c->a;
        c->gate.acceptance(so_far, a);
        const int k = int(a.size());
        a.push_back(a.back());
        return c->gate.value(a, k + 1, c->draft_s) > std::max(1.0, c->gate.value(a, k, c->draft_s));
      };
      Draft& draft = draft_;
      drafter->propose_into(session_, next, depth_cap, keep_going, draft);
      if (draft.tokens.empty()) continue;
      if (int(draft.tokens.size()) > depth_cap) {
        draft.tokens.resize(size_t(depth_cap));
        draft.confidence.resize(size_t(depth_cap));
      }
      std::vector<double>& a = a_;
      gate.acceptance(draft, a);
      double score = 0;
      if (gate.config().enabled) {
        gate.best_depth(a, draft_s, &score);
      } else {  // fixed depth: the proposal expected to emit the most tokens
        double run = 1;
        score = 1;
        for (double aj : a) score += run *= aj;
        score += 1e-6 * double(draft.tokens.size());
      }
      if (score > best_score) {
        best_score = score;
        std::swap(best, draft);
        std::swap(best_a, a);
        best_draft_s = draft_s;
      }
    }
  }
  const int k =
      best.tokens.empty() ? 0 : gate.pick_depth(best_a, int(best.tokens.size()), best_draft_s);

  auto start = std::chrono::steady_clock::now();
  if (k == 0) {
    session_.decode(next);
    const double seconds = seconds_since(start);
    gate.record_window(1, seconds);
    committed(1);
    report({.first_token = index, .token = next, .seconds = seconds});
    return sampler_.sample(session_.logits(), session_.tokens());
  }
  std::vector<int32_t>& window = window_;
  window.assign(1, next);
  window.insert(window.end(), best.tokens.begin(), best.tokens.begin() + k);
  const std::vector<float>& logits = session_.verify(window);
  const std::vector<int32_t>& tokens = session_.tokens();
  const size_t vocab = size_t(session_.model().hparams().n_vocab);
  const size_t n_before = tokens.size() - window.size();
  auto row = [&](int j) {
    return std::span<const float>(logits).subspan(size_t(j) * vocab, vocab);
  };
  auto history = [&](int j) {
    return std::span<const int32_t>(tokens).first(n_before + size_t(j) + 1);
  };
  // Row j is sampled exactly as a plain step after the window's first j + 1 tokens would be (see
  // the header: the coupled form of the rejection rule for point-mass drafts).
  int n_accepted = 0;
  int32_t following = 0;
  for (int j = 0; j <= k; ++j) {
    following = sampler_.sample(row(j), history(j));
    if (j == k || following != window[size_t(j) + 1]) break;
    ++n_accepted;
  }
  double seconds = seconds_since(start);
  gate.record_verify(best, k, n_accepted);
  // A stop token among the drafts that stood ends the run there: it becomes the following token
  // and the rows after it go, so the session holds what plain decoding would have fed.
  int n_emit = n_accepted;
  for (int j = 0; j < n_accepted; ++j)
    if (is_stop(window[size_t(j) + 1])) {
      n_emit = j;
      following = window[size_t(j) + 1];
      break;
    }
  int emitted = 0;
  bool halted = false;
  while (emitted < n_emit && !halted) halted = !emit(window[size_t(++emitted)]);
  start = std::chrono::steady_clock::now();
  session_.keep_rows(1 + emitted);
  seconds += seconds_since(start);
  gate.record_window(k + 1, seconds);
  committed(1 + emitted);
  report({.first_token = index,
          .token = next,
          .rows = k + 1,
          .drafted = k,
          .accepted = n_accepted,
          .kept = 1 + emitted,
          .seconds = seconds});
  if (halted) return std::nullopt;
  return following;
}

}  // namespace strata::spec
