#include "experts/expert_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "experts/gguf_reader.h"
#include "experts/sidecar_reader.h"
#include "experts/usage_history.h"
#include "gguf/mapping_advice.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata {

ReadOptions ExpertStore::read_options(const ExpertStoreOptions& options) {
  return ReadOptions{options.direct_io, options.io_uring, options.split_bytes};
}

ExpertStore::ExpertStore(ExpertLayout layout, Sidecar sidecar, const ExpertStoreOptions& options)
    : ExpertStore(std::move(layout),
                  std::make_unique<SidecarReader>(std::move(sidecar), read_options(options)),
                  options) {}

ExpertStore::ExpertStore(ExpertLayout layout, const GgufFile& gguf,
                         const ExpertStoreOptions& options)
    : ExpertStore(std::move(layout),
                  std::make_unique<GgufExpertReader>(gguf, read_options(options)), options) {}

ExpertStore::ExpertStore(ExpertLayout expert_layout, std::unique_ptr<ExpertReader> reader,
                         const ExpertStoreOptions& options)
    : reader_(std::move(reader)), options_(options), residency_({}, 1, 0) {
  const SidecarLayout& layout = reader_->layout();
  if (options_.io_threads < 1) fail("expert store: --io-threads must be >= 1, got {}", options_.io_threads);
  layout_.resize(layout.n_block);
  std::vector<uint64_t> slot_bytes(layout.n_block, 0);
  uint64_t slot_sum = 0;
  for (uint32_t b = 0; b < layout.n_block; ++b) {
    const SidecarLayer& sl = layout.layers[b];
    if (!sl.present) continue;
    if (b >= expert_layout.size() || !expert_layout[b].present)
      fail("{}: block {} has routed experts the model does not use", reader_->path(), b);
    const compute::ExpertLayerLayout& l = layout_[b] = expert_layout[b];
    if (l.gate.bytes() != sl.gate_bytes || l.up.bytes() != sl.up_bytes ||
        l.down.bytes() != sl.down_bytes)
      fail("{}: block {}: record sizes differ from the model's expert tensors", reader_->path(), b);
    slot_bytes[b] = reader_->slot_bytes(int(b));
    slot_sum += slot_bytes[b];
  }
  const int n_expert = int(layout.n_expert);
  if (options_.slots_per_layer > 0) {
    slots_per_layer_ = std::min(options_.slots_per_layer, n_expert);
  } else {
    slots_per_layer_ = int(std::clamp<uint64_t>(options_.budget_bytes / std::max<uint64_t>(slot_sum, 1), 1,
                                                uint64_t(n_expert)));
  }
  all_resident_ = slots_per_layer_ == n_expert;
  const int n_stream = options_.stream_slots > 0 ? options_.stream_slots : std::max(4, options_.io_threads);

  std::vector<int> per_layer(layout.n_block, 0);
  for (uint32_t b = 0; b < layout.n_block; ++b)
    if (layout_[b].present) per_layer[b] = slots_per_layer_;
  // Transient slots are counted by the residency without a limit (n_expert: a whole union); the
  // arena has n_stream of them, and misses beyond that wait for one to be recycled (wait()).
  residency_ = SlotResidency(per_layer, n_expert, n_expert);
  arena_ = std::make_unique<ExpertArena>(slot_bytes, slots_per_layer_, n_stream);
  reads_ = std::make_unique<ExpertReads>(*reader_, per_layer, n_stream, options_.io_threads,
                                         options_.urgent_only_threads);
  prompt_heat_.resize(layout.n_block);
  for (uint32_t b = 0; b < layout.n_block; ++b)
    if (layout_[b].present) prompt_heat_[b].assign(size_t(n_expert), 0);
  // A layer's union is at most n_expert experts: the per-layer lists never grow while decoding.
  for (auto* list : {&ready_, &waiting_, &deferred_}) list->reserve(size_t(n_expert));
  missing_.reserve(size_t(n_expert));
  delivered_.reserve(size_t(n_expert));
  handed_transients_.reserve(size_t(n_stream));
  loads_.reserve(size_t(n_expert));
  free_transient_.reserve(size_t(n_stream));
}

ExpertStore::~ExpertStore() {
  reads_.reset();  // cancels queued reads and joins the threads before the arena goes away
}

ExpertStoreStats ExpertStore::stats() const {
  ExpertStoreStats s;
  s.set_residency(residency_.stats());
  s.bytes_read = reader_->bytes_read() - bytes_read_base_;
  s.miss_bytes = miss_bytes_;
  s.pin_changes = pin_changes_;
  s.io_wait_ms = reads_->wait_ms() - io_wait_base_ms_;
  return s;
}

void ExpertStore::reset_stats() {
  residency_.reset_stats();
  miss_bytes_ = pin_changes_ = 0;
  bytes_read_base_ = reader_->bytes_read();
  io_wait_base_ms_ = reads_->wait_ms();
}

uint32_t ExpertStore::slot_of(int layer, int expert) const {
  if (!layout_.at(size_t(layer)).present) return kMiss;
  if (expert < 0 || expert >= residency_.n_expert())
    fail("expert store: slot_of: expert id {} out of range", expert);
  return residency_.slot_of(layer, expert);
}

bool ExpertStore::pinned(int layer, int expert) const {
  return slot_of(layer, expert) != kMiss &&
         (residency_.pinned(layer, expert) || residency_.hot(layer, expert));
}

void ExpertStore::load_slots(int layer, IoPool::Priority priority) {
  for (const SlotResidency::Load& load : loads_)
    reads_->load_slot(layer, load.slot, load.expert, arena_->slot(layer, load.slot), priority);
}

ExpertMatrices ExpertStore::matrices(int layer_index, const uint8_t* data, int32_t expert) const {
  const compute::ExpertLayerLayout& layer = layout_[size_t(layer_index)];
  const ExpertPlacement at = reader_->place(layer_index, expert);
  auto view = [](const compute::ExpertMatrixLayout& m, const uint8_t* p) {
    return compute::WeightMatrix::dense(m.type, m.n_in, m.n_out, p);
  };
  return ExpertMatrices{view(layer.gate, data + at.gate), view(layer.up, data + at.up),
                        view(layer.down, data + at.down)};
}

void ExpertStore::publish(int layer_index, std::span<const int32_t> experts) {
  // Whatever an interrupted earlier layer left in flight is finished before its slots are reused.
  for (Pending& p : waiting_)
    if (p.load) {
      try {
        reads_->pool().wait(p.load);
      } catch (const Error&) {
      }
    }
  ready_.clear();
  waiting_.clear();
  deferred_.clear();
  delivered_.clear();
  handed_transients_.clear();
  free_transient_.clear();
  for (int i = arena_->n_transient() - 1; i >= 0; --i) free_transient_.push_back(i);

  if (!residency_.has_experts(layer_index))
    fail("{}: no routed experts for block {}", reader_->path(), layer_index);
  current_layer_ = layer_index;
  residency_.resolve(layer_index, experts, loads_);

  // Hits (the experts resolve did not load): delivered first, those still loading with the misses.
  // loads_ lists the misses in ascending id, a subsequence of `experts`.
  missing_.clear();
  size_t next_load = 0;
  for (size_t i = 0; i < experts.size(); ++i) {
    if (next_load < loads_.size() && loads_[next_load].expert == experts[i]) {
      missing_.push_back(int(i));
      ++next_load;
      continue;
    }
    const uint32_t slot = residency_.slot_of(layer_index, experts[i]);
    const IoPool::TicketPtr& load = reads_->slot_read(layer_index, slot);
    Pending p{int(i), experts[i], arena_->slot(layer_index, slot), -1, load};
    if (load && (!load->done() || load->failed())) {
      reads_->promote(load);
      waiting_.push_back(std::move(p));
    } else {
      ready_.push_back(std::move(p));
    }
  }

  // Misses, in ascending id: a cache slot when one could be evicted, else a transient slot.
  for (size_t m = 0; m < loads_.size(); ++m) {
    const SlotResidency::Load& load = loads_[m];
    const int i = missing_[m];
    miss_bytes_ += reader_->read_bytes(layer_index, load.expert);
    if (!load.transient) {
      uint8_t* data = arena_->slot(layer_index, load.slot);
      reads_->load_slot(layer_index, load.slot, load.expert, data, IoPool::Priority::Urgent);
      waiting_.push_back(
          Pending{i, load.expert, data, -1, reads_->slot_read(layer_index, load.slot)});
    } else if (!free_transient_.empty()) {
      const int t = free_transient_.back();
      free_transient_.pop_back();
      uint8_t* data = arena_->transient(t);
      waiting_.push_back(
          Pending{i, load.expert, data, t,
                  reads_->start(layer_index, load.expert, data, IoPool::Priority::Urgent)});
    } else {
      deferred_.push_back(Pending{i, load.expert, nullptr, -1, nullptr});
    }
  }
}

// The transient slots of the last batch are free again (the caller is done with it): each goes
// to the oldest deferred miss, whose read starts now, or back to the free list.
void ExpertStore::release_transients() {
  for (const int t : handed_transients_) {
    if (deferred_.empty()) {
      free_transient_.push_back(t);
      continue;
    }
    Pending p = std::move(deferred_.front());
    deferred_.erase(deferred_.begin());
    p.data = arena_->transient(t);
    p.transient = t;
    p.load = reads_->start(current_layer_, p.expert, p.data, IoPool::Priority::Urgent);
    waiting_.push_back(std::move(p));
  }
  handed_transients_.clear();
}

void ExpertStore::deliver(const Pending& p) {
  if (p.transient >= 0) handed_transients_.push_back(p.transient);
  delivered_.push_back(DeliveredExpert{p.index, matrices(current_layer_, p.data, p.expert)});
}

std::span<const DeliveredExpert> ExpertStore::wait() {
  delivered_.clear();
  if (current_layer_ < 0) return {};
  release_transients();
  // The hits first, with whatever already landed; else block for the oldest read in flight.
  for (const Pending& p : ready_) deliver(p);
  ready_.clear();
  if (delivered_.empty() && !waiting_.empty()) {
    bool any_done = false;
    for (const Pending& p : waiting_) any_done = any_done || p.load->done();
    if (!any_done) settle(waiting_.front());
  }
  // Every read that finished (a finished ticket waits for nothing: wait only rethrows its error).
  size_t kept = 0;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (!waiting_[i].load->done()) {
      if (kept != i) waiting_[kept] = std::move(waiting_[i]);
      ++kept;
      continue;
    }
    settle(waiting_[i]);
    deliver(waiting_[i]);
  }
  waiting_.resize(kept);
  if (delivered_.empty()) {
    if (!deferred_.empty())
      fail("expert store: layer {}: {} misses wait for a transient slot that none will free",
           current_layer_, deferred_.size());
    current_layer_ = -1;
  }
  return delivered_;
}

// Waits for one expert's read; on a failure the slot is not left resident and the layer is over.
void ExpertStore::settle(const Pending& p) {
  try {
    reads_->wait(p.load);
  } catch (const Error&) {
    const uint32_t slot = residency_.slot_of(current_layer_, p.expert);
    if (p.transient < 0 && slot != kMiss) {
      reads_->forget(current_layer_, slot);
      residency_.drop(current_layer_, p.expert);
    }
    current_layer_ = -1;
    throw;
  }
}

void ExpertStore::publish_guess(int layer_index, std::span<const int32_t> experts) {
  if (!options_.read_ahead || !residency_.has_experts(layer_index)) return;
  // The residency caps the guesses at half the layer's slots and counts them as issued.
  residency_.predict(layer_index, experts, loads_);
  load_slots(layer_index, IoPool::Priority::ReadAhead);
}

void ExpertStore::fill(const std::vector<std::vector<int32_t>>& ranking, int n_pinned) {
  struct Load {
    IoPool::TicketPtr ticket;
    uint64_t bytes;
  };
  std::vector<Load> loads;
  uint64_t total = 0;
  for (size_t b = 0; b < layout_.size() && b < ranking.size(); ++b) {
    if (!layout_[b].present) continue;
    residency_.fill(int(b), ranking[b], n_pinned, loads_);
    load_slots(int(b), IoPool::Priority::Urgent);
    for (const SlotResidency::Load& load : loads_) {
      const uint64_t bytes = reader_->read_bytes(int(b), load.expert);
      loads.push_back(Load{reads_->slot_read(int(b), load.slot), bytes});
      total += bytes;
    }
  }
  ProgressBar bar("fill", loads.size(), total);
  for (const Load& load : loads) {
    reads_->pool().wait(load.ticket);
    bar.advance(1, load.bytes);
  }
  bar.finish();
}

}  // namespace strata

namespace strata {

void ExpertStore::observe_routing(int layer, const Routing& routing) {
  if (history_) history_->record(layer, routing);
  if (layer < 0 || size_t(layer) >= prompt_heat_.size() || prompt_heat_[size_t(layer)].empty()) return;
  auto& heat = prompt_heat_[size_t(layer)];
  for (int32_t e : routing.experts)
    if (e >= 0 && size_t(e) < heat.size()) ++heat[size_t(e)];
}

void ExpertStore::reset_prompt_heat() {
  for (auto& heat : prompt_heat_) std::fill(heat.begin(), heat.end(), 0);
}

std::vector<int32_t> ExpertStore::hot_pins(int layer) const {
  return layout_.at(size_t(layer)).present ? residency_.hot_pins(layer) : std::vector<int32_t>{};
}

std::vector<int32_t> ExpertStore::lru_order(int layer) const {
  return layout_.at(size_t(layer)).present ? residency_.lru_order(layer) : std::vector<int32_t>{};
}

void ExpertStore::attach_dense_prefetch(std::unique_ptr<DensePrefetch> prefetch) {
  dense_prefetch_ = std::move(prefetch);
}

void ExpertStore::attach_history(std::unique_ptr<UsageHistory> history, std::string path) {
  history_ = std::move(history);
  history_path_ = std::move(path);
  history_saved_tokens_ = history_ ? history_->tokens() : 0;
}

uint64_t ExpertStore::history_tokens_since_save() const {
  return history_ ? history_->tokens() - history_saved_tokens_ : 0;
}

void ExpertStore::save_history() {
  if (!history_) return;
  for (size_t b = 0; b < layout_.size(); ++b)
    if (layout_[b].present) history_->set_lru(int(b), lru_order(int(b)));
  history_->save(history_path_);
  history_saved_tokens_ = history_->tokens();
}

void ExpertStore::set_moce(std::shared_ptr<MocePolicy> policy) {
  moce_ = std::move(policy);
}

int ExpertStore::pin_prompt_hot(const HotPinOptions& o) {
  int changes = 0;
  std::vector<double> score;
  for (size_t b = 0; b < layout_.size(); ++b) {
    if (!layout_[b].present) continue;
    const int n_hot = std::min(o.n_hot, residency_.slots(int(b)) / 2);
    const std::vector<int32_t> current = residency_.hot_pins(int(b));
    const std::vector<int32_t> wanted =
        prompt_hot_pins(prompt_heat_[b], history_.get(), int(b), o, n_hot, current,
                        [&](int32_t e) { return residency_.pinned(int(b), e); }, score);
    changes += residency_.pin_hot(int(b), wanted, loads_);
    load_slots(int(b), IoPool::Priority::ReadAhead);
  }
  pin_changes_ += uint64_t(changes);
  return changes;
}

}  // namespace strata
