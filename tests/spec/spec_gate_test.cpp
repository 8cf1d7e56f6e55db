#include <gtest/gtest.h>

#include "spec/spec_gate.h"

namespace strata::spec {
namespace {

Draft draft_of(int n, float confidence, DraftSource source = DraftSource::Mtp) {
  Draft d;
  d.source = source;
  d.tokens.assign(size_t(n), 1);
  d.confidence.assign(size_t(n), confidence);
  return d;
}

// Feeds the gate windows costing T(n) = t1·(1 + (n−1)·rho) and verifies of the given acceptance.
void train(SpecGate& gate, double rho, double acceptance, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    gate.record_window(1, 0.01);
    for (int n = 2; n <= 5; ++n) gate.record_window(n, 0.01 * (1 + (n - 1) * rho));
    const Draft d = draft_of(4, 0.5f);
    // Accept the first `a` drafts with frequency `acceptance` per position.
    int a = 0;
    while (a < 4 && (i * 7 + a * 3) % 100 < int(acceptance * 100)) ++a;
    gate.record_verify(d, 4, a);
  }
  gate.record_window(1, 0.01);
}

TEST(SpecGate, DraftsDeepWhenAcceptanceIsHighAndRowsAreCheap) {
  SpecGateConfig config;
  config.max_depth = 4;
  config.probe_every = 1000;
  SpecGate gate(config);
  train(gate, 0.05, 0.95, 40);
  const Draft d = draft_of(4, 0.5f);
  EXPECT_EQ(gate.pick_depth(gate.acceptance(d), 4, 0.0), 4);
}

TEST(SpecGate, DeclinesWhenAcceptanceIsLowAndRowsAreExpensive) {
  SpecGateConfig config;
  config.max_depth = 4;
  config.probe_every = 1000;
  config.probe_every_new = 1000;
  SpecGate gate(config);
  train(gate, 0.9, 0.1, 40);
  const Draft d = draft_of(4, 0.5f);
  EXPECT_EQ(gate.pick_depth(gate.acceptance(d), 4, 0.0), 0);
  EXPECT_FALSE(gate.worth_drafting(DraftSource::Mtp, 0.0));
}

TEST(SpecGate, TheDrafterConfidenceMovesThePick) {
  SpecGateConfig config;
  config.max_depth = 4;
  config.probe_every = 1000;
  SpecGate gate(config);
  train(gate, 0.4, 0.6, 40);
  // Same history; a confident proposal goes deeper than a doubtful one.
  const int confident = gate.pick_depth(gate.acceptance(draft_of(4, 0.95f)), 4, 0.0);
  const int doubtful = gate.pick_depth(gate.acceptance(draft_of(4, 0.05f)), 4, 0.0);
  EXPECT_GT(confident, doubtful);
}

TEST(SpecGate, ForcesAPlainStepAfterALongDraftedRun) {
  SpecGateConfig config;
  config.max_depth = 2;
  config.refresh = 5;
  SpecGate gate(config);
  train(gate, 0.05, 0.95, 10);
  for (int i = 0; i < 5; ++i) gate.record_window(3, 0.011);
  EXPECT_EQ(gate.pick_depth(gate.acceptance(draft_of(2, 0.9f)), 2, 0.0), 0);
  gate.record_window(1, 0.01);
  EXPECT_GT(gate.pick_depth(gate.acceptance(draft_of(2, 0.9f)), 2, 0.0), 0);
}

TEST(SpecGate, ForcedPlainStepsAreAskedForAndCounted) {
  SpecGateConfig config;
  config.max_depth = 2;
  config.refresh = 3;
  SpecGate gate(config);
  train(gate, 0.05, 0.95, 10);
  for (int i = 0; i < 2; ++i) gate.record_window(3, 0.011);
  EXPECT_FALSE(gate.force_plain());
  gate.record_window(3, 0.011);
  EXPECT_TRUE(gate.force_plain());
  EXPECT_EQ(gate.forced_plain(), 1u);
  EXPECT_NE(gate.summary().find("(1 forced plain)"), std::string::npos) << gate.summary();
  gate.record_window(1, 0.01);  // the plain step
  EXPECT_FALSE(gate.force_plain());
  SpecGateConfig off = config;
  off.enabled = false;
  SpecGate fixed(off);
  for (int i = 0; i < 10; ++i) fixed.record_window(3, 0.011);
  EXPECT_FALSE(fixed.force_plain());
}

TEST(SpecGate, OffMeansFixedDepth) {
  SpecGateConfig config;
  config.enabled = false;
  config.max_depth = 3;
  SpecGate gate(config);
  train(gate, 0.9, 0.0, 10);
  EXPECT_EQ(gate.pick_depth(gate.acceptance(draft_of(5, 0.01f)), 5, 0.0), 3);
  EXPECT_EQ(gate.pick_depth(gate.acceptance(draft_of(2, 0.01f)), 2, 0.0), 2);
  EXPECT_TRUE(gate.worth_drafting(DraftSource::Suffix, 1.0));
}

TEST(SpecGate, SummaryNamesTheMeasurements) {
  SpecGate gate(SpecGateConfig{});
  train(gate, 0.2, 0.7, 5);
  const std::string s = gate.summary();
  EXPECT_NE(s.find("T(1) 10.00 ms"), std::string::npos) << s;
  EXPECT_NE(s.find("2:1.20"), std::string::npos) << s;
  EXPECT_NE(s.find("mtp accepted by position"), std::string::npos) << s;
  EXPECT_NE(s.find("drafts proposed 20"), std::string::npos) << s;
}

}  // namespace
}  // namespace strata::spec
