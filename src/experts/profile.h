// Expert profile — how often each (layer, expert) was routed to over a calibration text; ranks
// the experts a store loads (and pins) at startup. Written by `strata profile`.
//
// File: JSON {"format": "strata-expert-profile", "version": 1, "model_identity": "<16 hex>",
// "tokens": N, "counts": [[c(layer 0, expert 0), ...], ...]} with one row per block (empty rows
// for blocks without routed experts). Written atomically. `load` refuses a file made for another
// model (identity = gguf_identity of the GGUF) or one that is malformed, naming the file and field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experts/expert_source.h"

namespace strata {

struct ExpertProfile {
  uint64_t model_identity = 0;
  uint64_t tokens = 0;
  std::vector<std::vector<uint64_t>> counts;  // [block][expert]

  void record(int layer, const Routing& routing, int n_block, int n_expert);
  // Experts of each block, most routed first (ties: lower id).
  std::vector<std::vector<int32_t>> ranking() const;
  void save(const std::string& path) const;
  static ExpertProfile load(const std::string& path, uint64_t expected_identity);
};

// An ExpertSource that passes everything to `inner` and counts routing into a profile.
class ProfilingSource final : public ExpertSource {
 public:
  ProfilingSource(ExpertSource& inner, ExpertProfile& profile, int n_block, int n_expert)
      : inner_(inner), profile_(profile), n_block_(n_block), n_expert_(n_expert) {}
  void observe_routing(int layer, const Routing& routing) override {
    profile_.record(layer, routing, n_block_, n_expert_);
    inner_.observe_routing(layer, routing);
  }
  void publish(int layer, std::span<const int32_t> experts) override {
    inner_.publish(layer, experts);
  }
  std::span<const DeliveredExpert> wait() override { return inner_.wait(); }
  bool wants_guess() const override { return inner_.wants_guess(); }
  void publish_guess(int layer, std::span<const int32_t> experts) override {
    inner_.publish_guess(layer, experts);
  }
  MocePolicy* moce() override { return inner_.moce(); }
  bool resident(int layer, int32_t expert) const override { return inner_.resident(layer, expert); }

 private:
  ExpertSource& inner_;
  ExpertProfile& profile_;
  int n_block_, n_expert_;
};

}  // namespace strata
