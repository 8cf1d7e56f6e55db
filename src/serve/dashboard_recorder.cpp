#include "serve/dashboard_recorder.h"

#include <cmath>
#include <string_view>

#include "experts/expert_store.h"
#include "experts/sidecar.h"
#include "model/model.h"

namespace strata::serve {
namespace {

using SteadyClock = std::chrono::steady_clock;

double ms_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

const char* spec_mode_name(spec::SpecMode mode) {
  switch (mode) {
    case spec::SpecMode::Off:
      return "off";
    case spec::SpecMode::Mtp:
      return "mtp";
    case spec::SpecMode::Suffix:
      return "suffix";
    case spec::SpecMode::Both:
      return "both";
  }
  return "off";
}

std::shared_ptr<DashboardStatic> describe(const ServedModel& served, const spec::SpecOptions& spec,
                                          bool profile) {
  auto f = std::make_shared<DashboardStatic>();
  const Model& model = *served.model;
  const HParams& hp = model.hparams();
  f->model_id = served.id;
  f->model_path = model.file().path();
  f->arch = arch_name(hp.arch);
  f->n_layer = hp.n_layer;
  f->n_nextn = hp.n_nextn;
  f->n_expert = hp.n_expert;
  f->n_expert_used = hp.n_expert_used;
  f->n_embd = hp.n_embd;
  f->n_vocab = hp.n_vocab;
  f->n_ctx = served.n_ctx;
  f->n_ff_exp = hp.n_ff_exp;
  f->n_ff_shexp = hp.n_ff_shexp;
  f->file_bytes = model.file().file_size();
  f->heat_decay_per_row = kHeatDecayPerRow;
  f->profile = profile;
  f->spec_mode = spec_mode_name(spec.mode);

  // Where each block's experts are: the store's sidecar, else the layout the GGUF calls for
  // (a model without routed experts has none: an empty map).
  std::optional<SidecarLayout> layout;
  if (const ExpertStore* store = served.expert_store) {
    layout = store->layout();
  } else {
    try {
      layout = SidecarLayout::for_gguf(model.file());
    } catch (const std::exception&) {
    }
  }
  uint64_t expert_tensor_bytes = 0;
  if (layout) {
    f->n_expert = int(layout->n_expert);
    f->expert_bytes = layout->total_expert_bytes();
    for (size_t b = 0; b < layout->layers.size(); ++b) {
      const SidecarLayer& l = layout->layers[b];
      DashboardStatic::Block block;
      block.present = l.present;
      block.mtp = int(b) >= hp.n_layer;
      block.record_bytes = l.record_bytes;
      f->blocks.push_back(block);
      if (l.present)
        expert_tensor_bytes += (l.gate_bytes + l.up_bytes + l.down_bytes) * layout->n_expert;
    }
  }
  f->dense_bytes = f->file_bytes > expert_tensor_bytes ? f->file_bytes - expert_tensor_bytes : 0;
  if (const ExpertStore* store = served.expert_store) {
    f->store = true;
    f->ram_arena_bytes = store->arena_bytes();
    f->slots_per_layer = store->slots_per_layer();
    // The file experts stream from: the sidecar, or the GGUF itself (its expert tensors).
    f->sidecar_path = store->reader().path();
    f->sidecar_bytes = std::string_view(store->reader().kind()) == "sidecar" ? store->layout().file_size
                                                                             : expert_tensor_bytes;
    f->direct_io = store->direct_io();
    f->io_uring = store->io_uring();
    f->read_ahead = store->read_ahead_enabled();
  }
  return f;
}

}  // namespace

// Passes everything to `inner`; counts heat, rows and bytes on the way (see the header).
class DashboardRecorder::Monitor final : public ExpertSource {
 public:
  Monitor(ExpertSource& inner, const ExpertStore* store, const DashboardStatic& fixed)
      : inner_(inner), store_(store), fixed_(fixed), n_expert_(size_t(fixed.n_expert)) {
    heat_.assign(fixed.blocks.size() * n_expert_, 0.0f);
    for (size_t b = 0; b < fixed.blocks.size(); ++b) {
      if (fixed.blocks[b].present && !fixed.blocks[b].mtp) {
        first_block_ = int(b);
        break;
      }
    }
  }

  void observe_routing(int layer, const Routing& routing) override {
    if (size_t(layer) < fixed_.blocks.size()) {
      float* heat = &heat_[size_t(layer) * n_expert_];
      const float decay = float(std::pow(kHeatDecayPerRow, double(routing.n_rows())));
      for (size_t e = 0; e < n_expert_; ++e) heat[e] *= decay;
      for (const int32_t e : routing.experts)
        if (e >= 0 && size_t(e) < n_expert_) heat[e] += 1.0f;
      if (layer == first_block_) rows_routed_ += uint64_t(routing.n_rows());
    }
    inner_.observe_routing(layer, routing);
  }
  void publish(int layer, std::span<const int32_t> experts) override {
    if (size_t(layer) < fixed_.blocks.size()) {
      const uint64_t record = fixed_.blocks[size_t(layer)].record_bytes;
      uint64_t resident = 0;
      for (const int32_t e : experts) resident += !store_ || store_->resident(layer, e);
      ram_hit_count_ += resident;
      ram_hit_bytes_ += resident * record;
      bytes_computed_ += uint64_t(experts.size()) * record;
    }
    inner_.publish(layer, experts);
  }
  std::span<const DeliveredExpert> wait() override { return inner_.wait(); }
  bool wants_guess() const override { return inner_.wants_guess(); }
  void publish_guess(int layer, std::span<const int32_t> experts) override {
    inner_.publish_guess(layer, experts);
  }
  MocePolicy* moce() override { return inner_.moce(); }
  bool resident(int layer, int32_t expert) const override { return inner_.resident(layer, expert); }
  std::vector<HostRegion> host_regions() const override { return inner_.host_regions(); }
  bool pointers_stay_valid() const override { return inner_.pointers_stay_valid(); }

  void fill(DashboardSnapshot& s) const {
    s.heat = heat_;
    s.residency.assign(heat_.size(), kResidencyNone);
    for (size_t b = 0; b < fixed_.blocks.size(); ++b) {
      if (!fixed_.blocks[b].present) continue;
      for (size_t e = 0; e < n_expert_; ++e) {
        char code = kResidencyMapped;
        if (store_) {
          if (store_->slot_of(int(b), int(e)) == ExpertStore::kMiss)
            code = kResidencySsd;
          else
            code = store_->pinned(int(b), int(e)) ? kResidencyPinned : kResidencyRam;
        }
        s.residency[b * n_expert_ + e] = code;
      }
    }
    s.rows_routed = rows_routed_;
    s.expert_bytes_computed = bytes_computed_;
    s.ram_hit_count = ram_hit_count_;
    s.ram_hit_bytes = ram_hit_bytes_;
  }

 private:
  ExpertSource& inner_;
  const ExpertStore* store_;
  const DashboardStatic& fixed_;
  const size_t n_expert_;
  int first_block_ = -1;
  std::vector<float> heat_;  // [block][expert]
  uint64_t rows_routed_ = 0, bytes_computed_ = 0, ram_hit_count_ = 0, ram_hit_bytes_ = 0;
};

DashboardRecorder::DashboardRecorder(const ServedModel& served, DashboardHub& hub,
                                     const spec::SpecOptions& spec, bool profile)
    : served_(served), hub_(hub), profile_(profile) {
  std::shared_ptr<DashboardStatic> fixed = describe(served, spec, profile);
  if (served.expert_store && served.expert_store->moce())
    fixed->moce_lambda = served.expert_store->moce()->options.lambda;
  fixed_ = fixed;
  ExpertSource& inner = served.expert_store ? static_cast<ExpertSource&>(*served.expert_store)
                                            : served.model->mapped_experts();
  monitor_ = std::make_unique<Monitor>(inner, served.expert_store, *fixed_);
  if (spec.mode != spec::SpecMode::Off) {
    spec_.emplace();
    spec_->depth_counts.assign(size_t(spec.gate.max_depth) + 1, 0);
  }
  publish(true);
}

DashboardRecorder::~DashboardRecorder() {
  if (active_phase_times() == &phases_) active_phase_times() = nullptr;
}

ExpertSource* DashboardRecorder::source() {
  return monitor_.get();
}

void DashboardRecorder::begin_generation(int64_t prompt_tokens, double queue_wait_s) {
  generation_ = DashboardGeneration{};
  generation_.id = ++generations_started_;
  generation_.running = true;
  generation_.prompt_tokens = prompt_tokens;
  generation_.queue_wait_ms = queue_wait_s * 1e3;
  generation_started_ = decode_started_ = SteadyClock::now();
  // On from the first running generation to the last: with --parallel they overlap, and a
  // batched window counts once, whichever slot's thread runs it (all under the engine lock).
  ++generations_running_;
  if (profile_) active_phase_times() = &phases_;
  publish(true);
}

void DashboardRecorder::prefill_progress() {
  publish(false);
}

void DashboardRecorder::prefilled(double prefill_s) {
  generation_.prefill_ms = prefill_s * 1e3;
  decode_started_ = SteadyClock::now();
  publish(false);
}

void DashboardRecorder::first_token(double ttft_s) {
  generation_.ttft_ms = ttft_s * 1e3;
}

void DashboardRecorder::token() {
  ++generation_.completion_tokens;
  publish(false);
}

void DashboardRecorder::window(const spec::WindowReport& report) {
  if (!spec_) return;
  ++spec_->windows;
  if (report.drafted > 0) ++spec_->verifies;
  spec_->drafted += uint64_t(report.drafted);
  spec_->accepted += uint64_t(report.accepted);
  spec_->last_depth = report.drafted;
  if (size_t(report.drafted) >= spec_->depth_counts.size())
    spec_->depth_counts.resize(size_t(report.drafted) + 1, 0);
  ++spec_->depth_counts[size_t(report.drafted)];
}

void DashboardRecorder::end_generation(std::string_view finish_reason, const spec::SpecGate* gate) {
  const SteadyClock::time_point now = SteadyClock::now();
  generation_.running = false;
  generation_.finish_reason = std::string(finish_reason);
  generation_.decode_ms = ms_between(decode_started_, now);
  busy_ms_done_ += ms_between(generation_started_, now);
  if (spec_ && gate) {
    spec_->forced_plain = gate->forced_plain();
    spec_->declined = gate->declined();
  }
  if (generations_running_ > 0) --generations_running_;
  if (generations_running_ == 0 && active_phase_times() == &phases_) active_phase_times() = nullptr;
  publish(true);
}

void DashboardRecorder::publish(bool force) {
  const SteadyClock::time_point now = SteadyClock::now();
  if (!force && now - last_publish_ < kPublishInterval) return;
  last_publish_ = now;
  auto s = std::make_shared<DashboardSnapshot>();
  s->fixed = fixed_;
  monitor_->fill(*s);
  s->phases = phases_;
  s->generation = generation_;
  s->busy_ms = busy_ms_done_;
  if (generation_.running) {
    s->busy_ms += ms_between(generation_started_, now);
    if (generation_.ttft_ms >= 0) s->generation.decode_ms = ms_between(decode_started_, now);
  }
  if (const ExpertStore* store = served_.expert_store) {
    s->experts = store->stats();
    if (const MocePolicy* policy = served_.expert_store->moce()) s->moce = policy->stats;
  }
  s->spec = spec_;
  hub_.publish(std::move(s));
}

}  // namespace strata::serve
