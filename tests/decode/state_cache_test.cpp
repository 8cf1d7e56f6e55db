// The conversation state cache (decode/state_cache.h) on the committed fixtures of every
// architecture (qwen4exp with PLE and an MTP head, qwen3next, qwen3moe): a multi-turn
// conversation run the way `strata serve` runs it (resume from the cache, prefill the rest, save
// after the prefill and after the reply) gives the same tokens as re-prefilling every turn's
// whole prompt in a fresh session — plain greedy, sampled with a seed, and through the
// SpecDecoder — including a prompt that diverges inside the last reply, which must resume from
// the earlier after-prefill snapshot (or, on the pure-attention model, truncate the KV to the
// common prefix). With prefill windows under 32 rows the first logits of every turn are bitwise
// equal too, and so they are with the long windows chat and serve run on the CPU (up to 512
// rows, ends at multiples of 64) against 64-row windows. Plus: LRU eviction under a small byte
// bound, byte accounting, and the deep copy (a restored session is independent of the entry it came
// from).
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "../common/fixture_models.h"
#include "compute/cpu/thread_pool.h"
#include "decode/generate.h"
#include "decode/state_cache.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"
#include "spec/spec_decoder.h"

namespace strata {
namespace {

using Tokens = std::vector<int32_t>;

struct TurnResult {
  Tokens reply;
  std::vector<float> first_logits;  // the last prompt row's logits
  int64_t cached = 0;
  int64_t fed = 0;  // tokens the session held at the end (the after-reply snapshot's length)
};

struct RunConfig {
  SamplerConfig sampling;
  int chunk_rows = 16;           // the reference's windows and the cache's unit (window_rows)
  int prefill_rows = 0;          // the cache's longest window (0: chunk_rows)
  int first_message_tokens = 0;  // > 0: a first message this long instead of the short one
  spec::SpecMode spec = spec::SpecMode::Off;
};

// Generates n tokens from the session's logits the way serve's plain loop does (sample, emit,
// feed all but the last), or through a SpecDecoder.
Tokens generate(Session& session, Sampler& sampler, spec::SpecDecoder* speculative, int n) {
  Tokens out;
  if (speculative) {
    strata::generate(
        session, sampler, session.logits(), n, std::nullopt, [&](int32_t t) { out.push_back(t); },
        speculative);
    return out;
  }
  for (int i = 0; i < n; ++i) {
    const int32_t next = sampler.sample(session.logits(), session.tokens());
    out.push_back(next);
    if (i + 1 < n) session.decode(next);
  }
  return out;
}

spec::SpecOptions spec_options(spec::SpecMode mode) {
  spec::SpecOptions options;
  options.mode = mode;
  options.gate.max_depth = 3;
  return options;
}

// Without the cache: a fresh session, the whole prompt.
TurnResult reference_turn(const Model& model, compute::ThreadPool& pool, const Tokens& prompt,
                          int n, const RunConfig& config) {
  Session session(model, pool);
  Sampler sampler(config.sampling);
  std::optional<spec::SpecDecoder> speculative;
  if (config.spec != spec::SpecMode::Off)
    speculative.emplace(session, sampler, spec_options(config.spec), pool);
  if (speculative)
    speculative->prefill(prompt, config.chunk_rows);
  else
    session.prefill(prompt, config.chunk_rows);
  TurnResult result;
  result.first_logits = session.logits();
  result.reply = generate(session, sampler, speculative ? &*speculative : nullptr, n);
  return result;
}

// The turn separator's first token plays the chat template's end-of-turn token.
constexpr int32_t kEndOfTurn = 7;

// With the cache, as serve/generator.cpp does it.
TurnResult cached_turn(const Model& model, compute::ThreadPool& pool, StateCache& cache,
                       const Tokens& prompt, int n, const RunConfig& config) {
  Session session(model, pool);
  Sampler sampler(config.sampling);
  std::optional<spec::SpecDecoder> speculative;
  if (config.spec != spec::SpecMode::Off)
    speculative.emplace(session, sampler, spec_options(config.spec), pool);
  spec::SpecDecoder* spec = speculative ? &*speculative : nullptr;
  TurnResult result;
  result.cached = cache.prefill(session, prompt, kEndOfTurn, spec);
  EXPECT_EQ(session.tokens(), prompt);
  cache.save(session, spec);
  result.first_logits = session.logits();
  result.reply = generate(session, sampler, spec, n);
  cache.save_generated(session, spec);
  result.fed = int64_t(session.tokens().size());
  return result;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Tokens concat(const Tokens& a, const Tokens& b) {
  Tokens out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Six turns: each prompt is the previous prompt + its reply + a turn separator + a new "user"
// message; turn 5 instead diverges inside turn 4's reply (a regenerated answer), turn 6
// continues from turn 4's full history again.
void expect_conversation_exact(const std::string& arch, const RunConfig& config,
                               bool logits_bitwise) {
  SCOPED_TRACE(arch + " chunk " + std::to_string(config.chunk_rows) + " spec " +
               std::to_string(int(config.spec)) + " temperature " +
               std::to_string(config.sampling.temperature));
  const auto model = Model::load(test_support::fixture_model_gguf(arch));
  if (config.spec == spec::SpecMode::Mtp && !model->has_mtp()) GTEST_SKIP() << "no MTP head";
  compute::ThreadPool pool(2);
  StateCache cache(uint64_t(1) << 30, config.chunk_rows,
                   config.prefill_rows > 0 ? config.prefill_rows : config.chunk_rows);
  const bool invariant = model->hparams().arch == Arch::Qwen3Moe;
  const size_t w = size_t(config.chunk_rows);
  std::vector<Tokens> aligned;  // window-exact models: the in-prompt snapshots the policy keeps
  const Tokens separator = {kEndOfTurn, 1, 3};
  std::vector<Tokens> user = {
      {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
       33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48},
      {5, 9, 5, 9, 60, 61, 62},
      {100, 7, 250, 7, 100, 7, 250, 3, 17, 5, 42, 9, 3, 17, 5, 1, 2, 3, 4, 1, 2, 3, 4},
      {44, 45},
      {90, 91, 92, 93, 94},
      {2, 4, 6, 8, 10, 12, 14, 16, 18},
  };
  if (config.first_message_tokens > 0) {
    user[0].clear();
    for (int i = 0; i < config.first_message_tokens; ++i)
      user[0].push_back((i * 37 + 11) % 241 + 9);
  }
  const int n = 12;
  Tokens history;  // the previous turn's prompt + its whole reply
  int64_t history_fed = 0, turn4_fed = 0;
  Tokens turn4_prompt, turn4_history;
  for (size_t turn = 0; turn < user.size(); ++turn) {
    Tokens prompt;
    if (turn == 4) {
      // Diverges after 5 tokens of turn 4's reply.
      prompt = concat(Tokens(turn4_history.begin(),
                             turn4_history.begin() + ptrdiff_t(turn4_prompt.size() + 5)),
                      concat({201}, user[turn]));
    } else if (turn == 5) {
      prompt = concat(concat(turn4_history, separator), user[turn]);
    } else {
      prompt = concat(history.empty() ? history : concat(history, separator), user[turn]);
    }
    SCOPED_TRACE("turn " + std::to_string(turn + 1) + ", prompt " +
                 std::to_string(prompt.size()) + " tokens");
    const TurnResult want = reference_turn(*model, pool, prompt, n, config);
    const TurnResult got = cached_turn(*model, pool, cache, prompt, n, config);
    EXPECT_EQ(got.reply, want.reply);
    if (logits_bitwise) {
      EXPECT_TRUE(bitwise_equal(got.first_logits, want.first_logits));
    }
    if (config.prefill_rows > 0) {
      // Without the cache the prompt goes in windows of prefill_rows from 0 (the last one
      // shorter, any length): the bits of chunk_rows windows still.
      RunConfig long_windows = config;
      long_windows.chunk_rows = config.prefill_rows;
      const TurnResult plain = reference_turn(*model, pool, prompt, n, long_windows);
      EXPECT_EQ(plain.reply, want.reply) << "without the cache, windows of " << config.prefill_rows;
      EXPECT_TRUE(bitwise_equal(plain.first_logits, want.first_logits))
          << "without the cache, windows of " << config.prefill_rows;
    }
    const Tokens turn_history = concat(prompt, got.reply);
    if (turn == 0) {
      EXPECT_EQ(got.cached, 0);
    } else if (!invariant) {
      // Window-exact: the longest in-prompt snapshot (a multiple of the window) prefixing it.
      size_t expected = 0;
      for (const Tokens& entry : aligned)
        if (entry.size() <= prompt.size() && std::equal(entry.begin(), entry.end(), prompt.begin()))
          expected = std::max(expected, entry.size());
      EXPECT_EQ(got.cached, int64_t(expected));
      EXPECT_EQ(got.cached % int64_t(w), 0);
      // Constant work per turn: less than a window of the previous prompt is fed again.
      const size_t previous = turn == 4 || turn == 5 ? turn4_prompt.size() : history.size() - n;
      EXPECT_GE(got.cached + int64_t(w), int64_t(previous)) << "previous prompt " << previous;
    } else if (turn == 4) {
      // Window-invariant: the KV is cut at the divergence (turn 4's prompt + the 5 reply tokens
      // that agree), except with speculative decoding, where turn 4's after-prefill snapshot is
      // the longest prefix.
      const int64_t expected = config.spec == spec::SpecMode::Off
                                   ? int64_t(turn4_prompt.size() + 5)
                                   : int64_t(turn4_prompt.size());
      EXPECT_EQ(got.cached, expected);
    } else {
      // The previous turn's after-reply snapshot (the plain loop feeds all but the last reply
      // token; the speculative one may feed it too).
      EXPECT_EQ(got.cached, turn == 5 ? turn4_fed : history_fed);
      EXPECT_GE(got.cached, int64_t(history.size()) - 1);
    }
    if (!invariant && prompt.size() > w) aligned.push_back(Tokens(prompt.begin(), prompt.begin() + ptrdiff_t((prompt.size() - 1) / w * w)));
    if (turn == 3) {
      turn4_prompt = prompt;
      turn4_history = turn_history;
      turn4_fed = got.fed;
    }
    if (turn != 4) {
      history = turn_history;
      history_fed = got.fed;
    }
  }
  const StateCacheStats stats = cache.stats();
  EXPECT_EQ(stats.hits + stats.misses, 6u);
  if (invariant) {
    EXPECT_EQ(stats.hits, 5u);
  }
  EXPECT_GE(stats.hits, 3u);
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_GT(stats.bytes, 0u);
}

class StateCacheFixture : public testing::TestWithParam<std::string> {};

TEST_P(StateCacheFixture, GreedyConversationSameTokensAndBitsWithSmallWindows) {
  expect_conversation_exact(GetParam(), {.chunk_rows = 16}, /*logits_bitwise=*/true);
}

TEST_P(StateCacheFixture, GreedyConversationSameTokensAndBitsWithServeWindows) {
  // 64-row prefill windows (serve's): Gated DeltaNet runs its chunked form, whose rounding depends
  // on where a window starts; the window-exact policy keeps every row in the windows a full
  // re-prefill would use, so the bits are still the same.
  expect_conversation_exact(GetParam(), {.chunk_rows = 64}, /*logits_bitwise=*/true);
}

TEST_P(StateCacheFixture, GreedyConversationSameTokensAndBitsWithLongWindows) {
  // chat and serve on the CPU: windows of up to 512 rows, cut at multiples of 64 (the cache's
  // snapshots), against 64-row windows from 0 (what they ran before): the same bits. A first
  // message of 300 tokens puts four units in the first window and gives the prompts trailing
  // partial chunks of every kind (over and under 32 rows).
  expect_conversation_exact(GetParam(), {.chunk_rows = 64, .prefill_rows = 512,
                                         .first_message_tokens = 300},
                            /*logits_bitwise=*/true);
}

TEST_P(StateCacheFixture, SpeculativeConversationSameTokensWithLongWindows) {
  const auto model = Model::load(test_support::fixture_model_gguf(GetParam()));
  RunConfig config{.chunk_rows = 64, .prefill_rows = 512, .first_message_tokens = 300};
  config.spec = model->has_mtp() ? spec::SpecMode::Both : spec::SpecMode::Suffix;
  expect_conversation_exact(GetParam(), config, /*logits_bitwise=*/true);
}

TEST_P(StateCacheFixture, SampledConversationSameTokens) {
  RunConfig config;
  config.sampling.temperature = 0.9f;
  config.sampling.top_p = 0.95f;
  config.sampling.seed = 7;
  expect_conversation_exact(GetParam(), config, /*logits_bitwise=*/true);
}

TEST_P(StateCacheFixture, SpeculativeConversationSameTokens) {
  // Both drafters where the model has an MTP head (its head cache and pending rows are part of
  // the snapshot), else the suffix drafter.
  const auto model = Model::load(test_support::fixture_model_gguf(GetParam()));
  RunConfig config;
  config.spec = model->has_mtp() ? spec::SpecMode::Both : spec::SpecMode::Suffix;
  expect_conversation_exact(GetParam(), config, /*logits_bitwise=*/true);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, StateCacheFixture,
                         testing::Values("qwen4exp", "qwen3next", "qwen3moe"));

TEST(StateCache, QwenFourExpFixtureHasPleAndMtp) {
  // The exactness tests above are only as good as the state they copy: the qwen4exp fixture must
  // exercise PLE and the MTP head.
  const auto model = Model::load(test_support::fixture_model_gguf("qwen4exp"));
  EXPECT_TRUE(model->hparams().has_ple());
  EXPECT_TRUE(model->has_mtp());
}

TEST(StateCache, RestoredSessionIsADeepCopy) {
  const auto model = Model::load(test_support::fixture_model_gguf("qwen4exp"));
  compute::ThreadPool pool(2);
  StateCache cache(uint64_t(1) << 30, /*window_rows=*/8);  // the prompt is one window
  const Tokens prompt = {3, 17, 5, 42, 9, 3, 17, 5};
  Session a(*model, pool);
  a.prefill(prompt, 16);
  cache.save(a);
  const std::vector<float> logits = a.logits();
  // Two sessions resumed from one entry, each fed something else, then a third: the entry must
  // not have changed.
  for (int32_t token : {11, 99}) {
    Session b(*model, pool);
    ASSERT_EQ(cache.resume(b, prompt), int64_t(prompt.size()));
    EXPECT_TRUE(bitwise_equal(b.logits(), logits));
    b.decode(token);
  }
  Session c(*model, pool);
  ASSERT_EQ(cache.resume(c, concat(prompt, {11})), int64_t(prompt.size()));
  c.decode(11);
  a.decode(11);
  EXPECT_TRUE(bitwise_equal(c.logits(), a.logits()));
}

TEST(StateCache, EvictsLeastRecentlyUsedUnderTheByteBound) {
  const auto model = Model::load(test_support::fixture_model_gguf("qwen3next"));
  compute::ThreadPool pool(2);
  auto session_for = [&](const Tokens& tokens) {
    auto s = std::make_unique<Session>(*model, pool);
    s->prefill(tokens, 16);
    return s;
  };
  const Tokens p1 = {1, 2, 3, 4}, p2 = {5, 6, 7, 8}, p3 = {9, 10, 11, 12}, p4 = {13, 14, 15, 16};
  uint64_t one_entry = 0;
  {
    StateCache probe(uint64_t(1) << 30);
    probe.save(*session_for(p1));
    one_entry = probe.stats().bytes;
  }
  ASSERT_GT(one_entry, 0u);
  // The snapshot holds every DeltaNet state: at least the recurrent matrices' bytes.
  const HParams& hp = model->hparams();
  uint64_t deltanet_bytes = 0;
  for (int l = 0; l < hp.n_layer; ++l)
    if (hp.layer_kinds[size_t(l)] == LayerKind::GatedDeltaNet)
      deltanet_bytes += uint64_t(hp.ssm_n_v_heads) * hp.ssm_head_k_dim() * hp.ssm_head_v_dim() * 4;
  EXPECT_GE(one_entry, deltanet_bytes);

  StateCache cache(one_entry * 2 + one_entry / 2, /*window_rows=*/4);  // room for two entries
  cache.save(*session_for(p1));
  cache.save(*session_for(p2));
  EXPECT_EQ(cache.stats().entries, 2u);
  Session s(*model, pool);
  EXPECT_EQ(cache.resume(s, concat(p1, {1})), 4);  // p1 becomes the most recent
  cache.save(*session_for(p3));                    // evicts p2, the least recently used
  StateCacheStats stats = cache.stats();
  EXPECT_EQ(stats.entries, 2u);
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_LE(stats.bytes, stats.max_bytes);
  EXPECT_EQ(cache.resume(s, concat(p2, {1})), 0);
  EXPECT_EQ(s.n_past(), 0);  // a miss leaves a fresh session
  EXPECT_EQ(cache.resume(s, concat(p1, {1})), 4);
  EXPECT_EQ(cache.resume(s, concat(p3, {1})), 4);
  cache.save(*session_for(p4));  // evicts p1 (p3 was used last)
  EXPECT_EQ(cache.resume(s, concat(p1, {1})), 0);
  EXPECT_EQ(cache.resume(s, concat(p4, {1})), 4);
  // Saving the same tokens again replaces the entry rather than adding one.
  cache.save(*session_for(p4));
  EXPECT_EQ(cache.stats().entries, 2u);
  // An entry larger than the whole bound is not kept, and evicts nothing.
  StateCache tiny(one_entry / 2);
  tiny.save(*session_for(p1));
  EXPECT_EQ(tiny.stats().entries, 0u);
  EXPECT_EQ(tiny.stats().bytes, 0u);
  // Disabled.
  StateCache off(0);
  off.save(*session_for(p1));
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.resume(s, concat(p1, {1})), 0);
}

TEST(StateCache, LongestPrefixWins) {
  const auto model = Model::load(test_support::fixture_model_gguf("qwen4exp"));
  compute::ThreadPool pool(2);
  StateCache cache(uint64_t(1) << 30, /*window_rows=*/2);  // snapshots every 2 tokens
  const Tokens base = {1, 2, 3, 4, 5, 6};
  Session s(*model, pool);
  s.prefill(Tokens(base.begin(), base.begin() + 2), 16);
  cache.save(s);
  s.prefill(Tokens(base.begin() + 2, base.begin() + 4), 16);
  cache.save(s);
  s.prefill(Tokens(base.begin() + 4, base.end()), 16);
  cache.save(s);
  Session t(*model, pool);
  EXPECT_EQ(cache.resume(t, concat(base, {9})), 6);
  EXPECT_EQ(cache.resume(t, Tokens{1, 2, 3, 4, 9}), 4);
  EXPECT_EQ(cache.resume(t, Tokens{1, 2, 9}), 2);
  EXPECT_EQ(cache.resume(t, Tokens{1, 9}), 0);  // a hybrid cannot cut a snapshot
  EXPECT_EQ(cache.resume(t, Tokens{1, 2, 3, 4, 5}), 4);  // 6 does not prefix it
  EXPECT_EQ(cache.resume(t, base), 6);    // the whole prompt, with its logits
  EXPECT_TRUE(bitwise_equal(t.logits(), s.logits()));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(StateCache, TurnBoundaryIsAfterTheLastEndOfTurnInsideThePrompt) {
  const std::vector<int32_t> prompt = {1, 2, 9, 3, 4, 9, 5, 6};
  EXPECT_EQ(StateCache::turn_boundary(prompt, 9), 6u);
  EXPECT_EQ(StateCache::turn_boundary(prompt, 7), 0u);             // no end-of-turn token
  EXPECT_EQ(StateCache::turn_boundary(prompt, std::nullopt), 0u);  // the vocabulary has none
  EXPECT_EQ(StateCache::turn_boundary(std::vector<int32_t>{1, 9}, 9), 0u);  // nothing after it
}

}  // namespace
}  // namespace strata
