#include "experts/expert_store.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "experts/gguf_reader.h"
#include "experts/sidecar_reader.h"
#include "experts/usage_history.h"
#include "route/moce.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata {
namespace {

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

ExpertStoreStats ExpertStoreStats::operator-(const ExpertStoreStats& o) const {
  ExpertStoreStats d;
  d.layer_visits = layer_visits - o.layer_visits;
  d.needed = needed - o.needed;
  d.hits = hits - o.hits;
  d.misses = misses - o.misses;
  d.read_ahead_issued = read_ahead_issued - o.read_ahead_issued;
  d.read_ahead_used = read_ahead_used - o.read_ahead_used;
  d.bytes_read = bytes_read - o.bytes_read;
  d.miss_bytes = miss_bytes - o.miss_bytes;
  d.pin_changes = pin_changes - o.pin_changes;
  d.io_wait_ms = io_wait_ms - o.io_wait_ms;
  return d;
}

ReadOptions ExpertStore::read_options(const ExpertStoreOptions& options) {
  return ReadOptions{options.direct_io, options.io_uring, options.split_bytes};
}

ExpertStore::ExpertStore(const Model& model, Sidecar sidecar, const ExpertStoreOptions& options)
    : ExpertStore(model, std::make_unique<SidecarReader>(std::move(sidecar), read_options(options)), options) {}

ExpertStore::ExpertStore(const Model& model, const ExpertStoreOptions& options)
    : ExpertStore(model, std::make_unique<GgufExpertReader>(model.file(), read_options(options)), options) {}

ExpertStore::ExpertStore(const Model& model, std::unique_ptr<ExpertReader> reader, const ExpertStoreOptions& options)
    : reader_(std::move(reader)), options_(options) {
  const SidecarLayout& layout = reader_->layout();
  const auto& model_layers = model.layers();
  if (options_.io_threads < 1) fail("expert store: --io-threads must be >= 1, got {}", options_.io_threads);
  layers_.resize(layout.n_block);
  uint64_t slot_sum = 0, largest_slot = 0;
  for (uint32_t b = 0; b < layout.n_block; ++b) {
    const SidecarLayer& sl = layout.layers[b];
    if (!sl.present) continue;
    if (b >= model_layers.size() || model_layers[b].gate_exps.n_expert != layout.n_expert)
      fail("{}: block {} has routed experts the model does not use", reader_->path(), b);
    Layer& l = layers_[b];
    l.present = true;
    l.gate = &model_layers[b].gate_exps;
    l.up = &model_layers[b].up_exps;
    l.down = &model_layers[b].down_exps;
    if (l.gate->expert_bytes != sl.gate_bytes || l.up->expert_bytes != sl.up_bytes ||
        l.down->expert_bytes != sl.down_bytes)
      fail("{}: block {}: record sizes differ from the model's expert tensors", reader_->path(), b);
    slot_sum += reader_->slot_bytes(int(b));
    largest_slot = std::max(largest_slot, reader_->slot_bytes(int(b)));
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

  arena_bytes_ = slot_sum * uint64_t(slots_per_layer_) + uint64_t(n_stream) * largest_slot;
  arena_ = mmap(nullptr, arena_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (arena_ == MAP_FAILED) {
    arena_ = nullptr;
    fail("expert store: cannot reserve {} for the expert arena: {}", format_bytes(arena_bytes_),
         std::strerror(errno));
  }
  // Expert matrices are read in ~0.3-1.5 MB pieces scattered over the arena: with 4 KiB pages
  // every piece costs hundreds of TLB misses (a nested page walk each under a hypervisor).
  // Transparent huge pages where the system allows them (a hint: failure changes nothing).
  madvise(arena_, arena_bytes_, MADV_HUGEPAGE);
  auto* cursor = static_cast<uint8_t*>(arena_);
  for (uint32_t b = 0; b < layout.n_block; ++b) {
    Layer& l = layers_[b];
    if (!l.present) continue;
    l.smap.assign(size_t(n_expert), kMiss);
    prompt_heat_.resize(layout.n_block);
    prompt_heat_[b].assign(size_t(n_expert), 0);
    l.kept.assign(size_t(n_expert), 0);
    l.slots.resize(size_t(slots_per_layer_));
    total_slots_ += uint64_t(slots_per_layer_);
    for (Slot& s : l.slots) {
      s.data = cursor;
      cursor += reader_->slot_bytes(int(b));
    }
  }
  for (int i = 0; i < n_stream; ++i) {
    transient_slots_.push_back(cursor);
    cursor += largest_slot;
    free_transient_.push_back(n_stream - 1 - i);  // handed out lowest index first
  }
  io_ = std::make_unique<IoPool>(options_.io_threads, options_.urgent_only_threads);
  // A layer's union is at most n_expert experts: the per-layer lists never grow while decoding.
  for (auto* list : {&ready_, &waiting_, &deferred_}) list->reserve(size_t(n_expert));
  missing_.reserve(size_t(n_expert));
}

ExpertStore::~ExpertStore() {
  io_.reset();  // cancels queued reads and joins the threads before the arena goes away
  if (arena_) munmap(arena_, arena_bytes_);
}

ExpertStoreStats ExpertStore::stats() const {
  ExpertStoreStats s = stats_;
  s.bytes_read = reader_->bytes_read() - bytes_read_base_;
  return s;
}

void ExpertStore::reset_stats() {
  stats_ = ExpertStoreStats{};
  bytes_read_base_ = reader_->bytes_read();
}

ExpertStore::Layer& ExpertStore::layer_at(int layer) {
  if (layer < 0 || size_t(layer) >= layers_.size() || !layers_[size_t(layer)].present)
    fail("{}: no routed experts for block {}", reader_->path(), layer);
  return layers_[size_t(layer)];
}

uint32_t ExpertStore::slot_of(int layer, int expert) const {
  const Layer& l = layers_.at(size_t(layer));
  return l.present ? l.smap.at(size_t(expert)) : kMiss;
}

bool ExpertStore::pinned(int layer, int expert) const {
  const uint32_t slot = slot_of(layer, expert);
  return slot != kMiss && (layers_[size_t(layer)].slots[slot].pinned || layers_[size_t(layer)].slots[slot].hot);
}

// The least recently used slot that is not pinned and does not hold an expert marked with the
// current stamp (the window's union, or this prediction's targets). Empty slots first; ties go
// to the lower slot index, so the choice depends only on the history of calls.
int ExpertStore::evict_victim(Layer& layer) const {
  int best = -1;
  for (size_t i = 0; i < layer.slots.size(); ++i) {
    const Slot& s = layer.slots[i];
    if (s.pinned || s.hot || (s.expert >= 0 && layer.kept[size_t(s.expert)] == stamp_)) continue;
    if (best < 0 || s.last_use < layer.slots[size_t(best)].last_use) best = int(i);
  }
  return best;
}

void ExpertStore::settle(Slot& slot) {
  if (!slot.load) return;
  const auto start = std::chrono::steady_clock::now();
  try {
    io_->wait(slot.load);
  } catch (const Error&) {
    // The slot is being reused; whoever needed the failed read has already seen the error.
  }
  stats_.io_wait_ms += ms_since(start);
  slot.load.reset();
}

void ExpertStore::assign(Layer& layer, int slot_index, int32_t expert) {
  Slot& s = layer.slots[size_t(slot_index)];
  settle(s);
  if (s.expert >= 0) layer.smap[size_t(s.expert)] = kMiss;
  else ++filled_slots_;
  s.expert = expert;
  s.read_ahead_unused = false;
  s.hot = false;
  s.last_use = clock_;
  layer.smap[size_t(expert)] = uint32_t(slot_index);
}

IoPool::TicketPtr ExpertStore::start_read(int layer, int32_t expert, uint8_t* dest,
                                          IoPool::Priority priority) {
  jobs_.clear();  // keeps its capacity: a read allocates nothing once warm
  reader_->read_jobs(layer, expert, dest, jobs_);
  return io_->submit(priority, jobs_);
}

uint32_t ExpertStore::make_resident(Layer& layer, int layer_index, int32_t expert, IoPool::Priority priority) {
  if (layer.smap[size_t(expert)] != kMiss) return layer.smap[size_t(expert)];
  const int victim = evict_victim(layer);
  if (victim < 0) return kMiss;
  assign(layer, victim, expert);
  Slot& s = layer.slots[size_t(victim)];
  s.load = start_read(layer_index, expert, s.data, priority);
  return uint32_t(victim);
}

ExpertMatrices ExpertStore::matrices(const Layer& layer, const uint8_t* data, int32_t expert) const {
  const ExpertPlacement at = reader_->place(int(&layer - layers_.data()), expert);
  auto view = [](const ExpertTensor& t, const uint8_t* p) {
    return compute::WeightMatrix::dense(t.type, t.n_in, t.n_out, p);
  };
  return ExpertMatrices{view(*layer.gate, data + at.gate), view(*layer.up, data + at.up),
                        view(*layer.down, data + at.down)};
}

void ExpertStore::begin_layer(int layer_index, std::span<const int32_t> experts) {
  // Whatever an interrupted earlier layer left in flight is finished before its slots are reused.
  for (Pending& p : waiting_)
    if (p.load) {
      try {
        io_->wait(p.load);
      } catch (const Error&) {
      }
    }
  ready_.clear();
  waiting_.clear();
  deferred_.clear();
  handed_transient_ = -1;
  free_transient_.clear();
  for (int i = int(transient_slots_.size()) - 1; i >= 0; --i) free_transient_.push_back(i);

  Layer& layer = layer_at(layer_index);
  current_layer_ = layer_index;
  ++clock_;
  ++stamp_;
  ++stats_.layer_visits;
  stats_.needed += experts.size();
  for (int32_t e : experts) {
    if (e < 0 || uint32_t(e) >= reader_->layout().n_expert)
      fail("expert store: layer {} expert id {} out of range", layer_index, e);
    layer.kept[size_t(e)] = stamp_;
  }

  // Hits: touched, handed out first (those still loading wait behind the ready ones).
  missing_.clear();
  for (size_t i = 0; i < experts.size(); ++i) {
    const uint32_t slot_index = layer.smap[size_t(experts[i])];
    if (slot_index == kMiss) {
      missing_.push_back(int(i));
      continue;
    }
    Slot& s = layer.slots[slot_index];
    ++stats_.hits;
    s.last_use = clock_;
    if (s.read_ahead_unused) {
      ++stats_.read_ahead_used;
      s.read_ahead_unused = false;
    }
    Pending p{int(i), experts[i], s.data, -1, s.load};
    if (s.load && (!s.load->done() || s.load->failed())) {
      io_->promote(s.load);
      waiting_.push_back(std::move(p));
    } else {
      ready_.push_back(std::move(p));
    }
  }
  // Predictions for this visit that it did not need are spent.
  for (Slot& s : layer.slots) s.read_ahead_unused = false;

  // Misses, in ascending id: a cache slot when one can be evicted, else a transient slot.
  for (int i : missing_) {
    const int32_t e = experts[size_t(i)];
    ++stats_.misses;
    stats_.miss_bytes += reader_->read_bytes(layer_index, e);
    const int victim = evict_victim(layer);
    if (victim >= 0) {
      assign(layer, victim, e);
      Slot& s = layer.slots[size_t(victim)];
      s.load = start_read(layer_index, e, s.data, IoPool::Priority::Urgent);
      waiting_.push_back(Pending{i, e, s.data, -1, s.load});
    } else if (!free_transient_.empty()) {
      const int t = free_transient_.back();
      free_transient_.pop_back();
      uint8_t* data = transient_slots_[size_t(t)];
      waiting_.push_back(Pending{i, e, data, t, start_read(layer_index, e, data, IoPool::Priority::Urgent)});
    } else {
      deferred_.push_back(Pending{i, e, nullptr, -1, nullptr});
    }
  }
}

void ExpertStore::release_transient() {
  if (handed_transient_ < 0) return;
  const int t = handed_transient_;
  handed_transient_ = -1;
  if (deferred_.empty()) {
    free_transient_.push_back(t);
    return;
  }
  Pending p = std::move(deferred_.front());
  deferred_.erase(deferred_.begin());
  p.data = transient_slots_[size_t(t)];
  p.transient = t;
  p.load = start_read(current_layer_, p.expert, p.data, IoPool::Priority::Urgent);
  waiting_.push_back(std::move(p));
}

bool ExpertStore::next(int& index, ExpertMatrices& out) {
  if (current_layer_ < 0) return false;
  release_transient();
  Layer& layer = layers_[size_t(current_layer_)];
  Pending p;
  if (!ready_.empty()) {
    p = std::move(ready_.front());
    ready_.erase(ready_.begin());
  } else if (!waiting_.empty()) {
    // The first finished read, else wait for the oldest one.
    size_t pick = 0;
    for (size_t i = 0; i < waiting_.size(); ++i)
      if (waiting_[i].load->done()) {
        pick = i;
        break;
      }
    p = std::move(waiting_[pick]);
    waiting_.erase(waiting_.begin() + ptrdiff_t(pick));
    const auto start = std::chrono::steady_clock::now();
    try {
      io_->wait(p.load);
    } catch (const Error&) {
      stats_.io_wait_ms += ms_since(start);
      // Never leave a slot that failed to load marked resident.
      const uint32_t slot_index = layer.smap[size_t(p.expert)];
      if (p.transient < 0 && slot_index != kMiss) {
        layer.slots[slot_index].expert = -1;
        layer.slots[slot_index].load.reset();
        --filled_slots_;
        layer.smap[size_t(p.expert)] = kMiss;
      }
      current_layer_ = -1;
      throw;
    }
    stats_.io_wait_ms += ms_since(start);
  } else {
    current_layer_ = -1;
    return false;
  }
  if (p.transient >= 0) handed_transient_ = p.transient;
  index = p.index;
  out = matrices(layer, p.data, p.expert);
  return true;
}

void ExpertStore::predict(int layer_index, std::span<const int32_t> experts) {
  if (!options_.read_ahead || layer_index < 0 || size_t(layer_index) >= layers_.size() ||
      !layers_[size_t(layer_index)].present)
    return;
  Layer& layer = layers_[size_t(layer_index)];
  // At most half the layer's slots go to guesses, so a wrong guess cannot flush the whole cache.
  const size_t cap = std::min(experts.size(), std::max<size_t>(1, layer.slots.size() / 2));
  ++clock_;
  ++stamp_;
  for (size_t i = 0; i < cap; ++i) layer.kept[size_t(experts[i])] = stamp_;
  for (size_t i = 0; i < cap; ++i) {
    const int32_t e = experts[i];
    const uint32_t slot_index = layer.smap[size_t(e)];
    if (slot_index != kMiss) {
      layer.slots[slot_index].last_use = clock_;
      continue;
    }
    const int victim = evict_victim(layer);
    if (victim < 0) break;
    assign(layer, victim, e);
    Slot& s = layer.slots[size_t(victim)];
    s.read_ahead_unused = true;
    s.load = start_read(layer_index, e, s.data, IoPool::Priority::ReadAhead);
    ++stats_.read_ahead_issued;
  }
}

void ExpertStore::fill(const std::vector<std::vector<int32_t>>& ranking, int n_pinned) {
  struct Load {
    IoPool::TicketPtr ticket;
    uint64_t bytes;
  };
  std::vector<Load> loads;
  uint64_t total = 0;
  ++clock_;
  for (size_t b = 0; b < layers_.size() && b < ranking.size(); ++b) {
    Layer& layer = layers_[b];
    if (!layer.present) continue;
    ++stamp_;
    const size_t n = std::min(ranking[b].size(), layer.slots.size());
    for (size_t i = 0; i < n; ++i) layer.kept[size_t(ranking[b][i])] = stamp_;
    for (size_t i = 0; i < n; ++i) {
      const int32_t e = ranking[b][i];
      if (e < 0 || uint32_t(e) >= reader_->layout().n_expert)
        fail("expert store: fill: layer {} expert id {} out of range", b, e);
      const bool was_resident = layer.smap[size_t(e)] != kMiss;
      const uint32_t slot_index = make_resident(layer, int(b), e, IoPool::Priority::Urgent);
      if (slot_index == kMiss) break;
      if (!was_resident) {
        const uint64_t bytes = reader_->read_bytes(int(b), e);
        loads.push_back(Load{layer.slots[slot_index].load, bytes});
        total += bytes;
      }
      layer.slots[slot_index].pinned = int(i) < n_pinned;
    }
  }
  ProgressBar bar("fill", loads.size(), total);
  for (const Load& load : loads) {
    io_->wait(load.ticket);
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
  std::vector<int32_t> out;
  for (const Slot& s : layers_.at(size_t(layer)).slots)
    if (s.hot && s.expert >= 0) out.push_back(s.expert);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> ExpertStore::lru_order(int layer) const {
  const Layer& l = layers_.at(size_t(layer));
  std::vector<const Slot*> filled;
  for (const Slot& s : l.slots)
    if (s.expert >= 0) filled.push_back(&s);
  std::stable_sort(filled.begin(), filled.end(), [](const Slot* a, const Slot* b) { return a->last_use > b->last_use; });
  std::vector<int32_t> out;
  for (const Slot* s : filled) out.push_back(s->expert);
  return out;
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
  for (size_t b = 0; b < layers_.size(); ++b)
    if (layers_[b].present) history_->set_lru(int(b), lru_order(int(b)));
  history_->save(history_path_);
  history_saved_tokens_ = history_->tokens();
}

void ExpertStore::set_moce(std::unique_ptr<MocePolicy> policy) { moce_ = std::move(policy); }

int ExpertStore::pin_prompt_hot(const HotPinOptions& o) {
  int changes = 0;
  const int n_expert = int(reader_->layout().n_expert);
  const bool use_history = history_ && history_->tokens() >= o.min_history_tokens;
  const double alpha = use_history ? std::clamp(o.alpha, 0.0, 1.0) : 0.0;
  std::vector<double> score(static_cast<size_t>(n_expert));
  ++clock_;
  for (size_t b = 0; b < layers_.size(); ++b) {
    Layer& layer = layers_[b];
    if (!layer.present) continue;
    const auto& heat = prompt_heat_[b];
    const double heat_sum = double(std::accumulate(heat.begin(), heat.end(), uint64_t{0}));
    std::fill(score.begin(), score.end(), 0.0);
    if (heat_sum > 0)
      for (int e = 0; e < n_expert; ++e) score[size_t(e)] = (1.0 - alpha) * double(heat[size_t(e)]) / heat_sum;
    if (use_history && int(b) < history_->n_block()) {
      const auto h = history_->heat(int(b));
      const double sum = std::accumulate(h.begin(), h.end(), 0.0);
      if (sum > 0)
        for (int e = 0; e < n_expert; ++e) score[size_t(e)] += alpha * double(h[size_t(e)]) / sum;
    }
    // Profile-pinned experts are pinned already: not candidates.
    for (const Slot& s : layer.slots)
      if (s.pinned && s.expert >= 0) score[size_t(s.expert)] = 0.0;
    const int n_hot = std::min(o.n_hot, int(layer.slots.size()) / 2);
    const std::vector<int32_t> current = hot_pins(int(b));
    const int max_swaps = current.empty() ? n_hot : o.max_swaps;
    const std::vector<int32_t> wanted = choose_hot_pins(current, score, n_hot, max_swaps, o.hysteresis);
    for (Slot& s : layer.slots)
      if (s.hot && !std::binary_search(wanted.begin(), wanted.end(), s.expert)) {
        s.hot = false;
        ++changes;
      }
    ++stamp_;
    for (int32_t e : wanted) layer.kept[size_t(e)] = stamp_;
    for (int32_t e : wanted) {
      const uint32_t slot_index = make_resident(layer, int(b), e, IoPool::Priority::ReadAhead);
      if (slot_index == kMiss) break;
      Slot& s = layer.slots[slot_index];
      if (!s.hot) ++changes;
      s.hot = true;
      s.last_use = clock_;
    }
  }
  stats_.pin_changes += uint64_t(changes);
  return changes;
}

}  // namespace strata
