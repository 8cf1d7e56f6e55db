// MtpDrafter — drafts with the model's MTP (nextn) head, chained.
//
// The head's cache entry t is what it computed for trunk position t, from the trunk residual of
// position t and the token at t+1. The token after the last committed row is only known once it
// is sampled, so committed rows wait in `pending_` (their residuals copied, S·H floats each) until
// the next `propose`, which feeds them in one head window (so prefill costs one head window per
// chunk-sized batch, not per token) and takes draft 1 from the last row's logits (greedy). Drafts
// 2..K chain the head on its own output residual and the previous draft, one head row each; those
// entries are provisional and are dropped (KV truncate) at the start of the next propose, before
// the committed rows overwrite them with trunk data. Confidence = the head's softmax probability
// of the draft. Needs a model with has_mtp(). Not thread-safe.
#pragma once

#include "compute/cpu/thread_pool.h"
#include "experts/expert_source.h"
#include "spec/drafter.h"

namespace strata::spec {

class MtpDrafter final : public Drafter {
 public:
  // reserve_entries: the head's KV cache is reserved for that many entries (the session's
  // reserved tokens), so drafting does not grow it.
  MtpDrafter(const Model& model, compute::ThreadPool& pool, ExpertSource* experts = nullptr,
             int64_t reserve_entries = 0);
  DraftSource source() const override { return DraftSource::Mtp; }
  void on_commit(const Session& session, int64_t n_rows) override;
  Draft propose(const Session& session, int32_t next, int max_tokens,
                const KeepGoingFn& keep_going) override;
  void propose_into(const Session& session, int32_t next, int max_tokens,
                    const KeepGoingFn& keep_going, Draft& draft) override;
  double seconds_per_draft() const override { return chain_step_s_; }
  // The head's cache, the committed count, the pending residual rows and the timing (the
  // head's window scratch starts empty).
  std::unique_ptr<Drafter> clone() const override;
  uint64_t state_bytes() const override;

 private:
  void truncate_head(int64_t n_entries);
  const Model& model_;
  compute::ThreadPool& pool_;
  ExpertSource* experts_;
  MtpState head_;
  int64_t committed_ = 0;       // head entries holding trunk data (positions 0..committed_-1)
  std::vector<float> pending_;  // [n][S·H] residuals of committed trunk rows not yet in the head
  int64_t pending_first_ = 0;   // trunk position of pending_'s first row
  std::vector<float> logits_, residual_out_, chained_;
  std::vector<int32_t> following_;  // propose's tokens after the pending rows
  double chain_step_s_ = 0.0;   // running mean of one chained head row
  int chain_steps_ = 0;
};

}  // namespace strata::spec
