#include "spec/mtp_drafter.h"

#include <chrono>
#include <cmath>

#include "compute/cpu/ops.h"
#include "util/error.h"

namespace strata::spec {
namespace {

// The draft (argmax) and its softmax probability.
std::pair<int32_t, float> top1(const float* logits, int64_t n) {
  const int64_t best = compute::argmax(logits, n);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += std::exp(double(logits[i]) - double(logits[best]));
  return {int32_t(best), float(1.0 / total)};
}

}  // namespace

MtpDrafter::MtpDrafter(const Model& model, compute::ThreadPool& pool, ExpertSource* experts,
                       int64_t reserve_entries)
    : model_(model), pool_(pool), experts_(experts) {
  if (!model.has_mtp())
    fail("{}: --spec mtp needs an MTP (nextn) head, and this model has none", model.file().path());
  if (reserve_entries > 0) {
    const HParams& hp = model_.hparams();
    const LayerWeights& head = model_.layers()[size_t(hp.n_layer)];
    head_.kv.reserve(reserve_entries, hp.kv_dim(), hp.indexer_head_dim,
                     head.attention.compress_ratio);
  }
}

void MtpDrafter::truncate_head(int64_t n_entries) {
  const HParams& hp = model_.hparams();
  const LayerWeights& head = model_.layers()[size_t(hp.n_layer)];
  head_.kv.truncate(n_entries, hp.kv_dim(), hp.indexer_head_dim, head.attention.compress_ratio);
}

std::unique_ptr<Drafter> MtpDrafter::clone() const {
  auto copy = std::make_unique<MtpDrafter>(model_, pool_, experts_);
  copy->head_.kv = head_.kv;
  copy->committed_ = committed_;
  copy->pending_ = pending_;
  copy->pending_first_ = pending_first_;
  copy->chained_ = chained_;
  copy->chain_step_s_ = chain_step_s_;
  copy->chain_steps_ = chain_steps_;
  return copy;
}

uint64_t MtpDrafter::state_bytes() const {
  const KvCache& kv = head_.kv;
  return sizeof(MtpDrafter) +
         sizeof(float) * uint64_t(kv.k.capacity() + kv.v.capacity() + kv.index_k_raw.capacity() +
                                  kv.block_keys.capacity() + pending_.capacity() +
                                  chained_.capacity());
}

void MtpDrafter::on_commit(const Session& session, int64_t n_rows) {
  const std::vector<float>& residuals = session.state().residuals;
  const size_t width = size_t(model_.hparams().hc_count * model_.hparams().n_embd);
  if (residuals.size() < size_t(n_rows) * width)
    fail("mtp drafter: {} committed rows but only {} residual rows", n_rows,
         residuals.size() / width);
  if (pending_.empty()) pending_first_ = session.n_past() - n_rows;
  pending_.insert(pending_.end(), residuals.end() - ptrdiff_t(size_t(n_rows) * width),
                  residuals.end());
}

Draft MtpDrafter::propose(const Session& session, int32_t next, int max_tokens,
                          const KeepGoingFn& keep_going) {
  Draft draft;
  propose_into(session, next, max_tokens, keep_going, draft);
  return draft;
}

void MtpDrafter::propose_into(const Session& session, int32_t next, int max_tokens,
                              const KeepGoingFn& keep_going, Draft& draft) {
  draft.source = DraftSource::Mtp;
  draft.tokens.clear();
  draft.confidence.clear();
  const HParams& hp = model_.hparams();
  const size_t width = size_t(hp.hc_count * hp.n_embd);
  const int64_t n_pending = int64_t(pending_.size() / width);
  if (max_tokens <= 0 || n_pending == 0) return;
  if (pending_first_ != committed_)
    fail("mtp drafter: head holds {} entries but the pending rows start at position {}",
         committed_, pending_first_);
  truncate_head(committed_);
  // Pending row at position p is followed by token p+1: from the session, or `next` for the last.
  const std::vector<int32_t>& tokens = session.tokens();
  following_.resize(static_cast<size_t>(n_pending));
  for (int64_t i = 0; i < n_pending; ++i) {
    const int64_t at = pending_first_ + i + 1;
    following_[size_t(i)] = at < int64_t(tokens.size()) ? tokens[size_t(at)] : next;
  }
  model_.mtp_forward(pool_, head_, pending_.data(), following_, logits_, &residual_out_,
                     experts_);
  committed_ += n_pending;
  pending_.clear();
  const int64_t vocab = hp.n_vocab;
  auto [token, p] = top1(logits_.data() + (n_pending - 1) * vocab, vocab);
  draft.tokens.push_back(token);
  draft.confidence.push_back(p);
  chained_.assign(residual_out_.end() - ptrdiff_t(width), residual_out_.end());
  while (int(draft.tokens.size()) < max_tokens && (!keep_going || keep_going(draft))) {
    const auto start = std::chrono::steady_clock::now();
    const int32_t previous[1] = {draft.tokens.back()};
    model_.mtp_forward(pool_, head_, chained_.data(), previous, logits_, &residual_out_, experts_);
    chained_ = residual_out_;
    std::tie(token, p) = top1(logits_.data(), vocab);
    draft.tokens.push_back(token);
    draft.confidence.push_back(p);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    chain_steps_ = std::min(chain_steps_ + 1, 16);
    chain_step_s_ += (s - chain_step_s_) / chain_steps_;
  }
}

}  // namespace strata::spec
