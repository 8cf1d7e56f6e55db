// Batched windows (WindowRunner::run_batch, Session::decode_together): one window carrying the rows
// of several sequences gives each sequence bitwise the logits and state it gets alone. On the
// committed fixtures of every architecture (qwen4exp with PLE and an MTP head, qwen3next,
// qwen3moe) and the embedded default model:
// - continuous batching: sequences with different prompt lengths (under and over the 64-row
//   prefill window, so chunked DeltaNet states too) decode together while others join (prefill
//   alone between steps) and leave; every step's logits equal a session decoding alone;
// - multi-row segments: one window of several prefill chunks of different lengths (1 to 40 rows,
//   both DeltaNet forms) equals each chunk fed alone, logits and the following decode step;
// - batched prefill: a joining sequence's prefill windows inside other sequences' decode steps;
// - decode steps of 2-17 sequences on 1-4 threads (the row slices and the per-product split);
// - bad input is refused with an error naming the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/fixture_models.h"
#include "../common/token_rows.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "engine/window.h"
#include "model/model.h"
#include "util/error.h"

namespace strata {
namespace {

using Tokens = std::vector<int32_t>;

int32_t argmax(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

using test_support::random_tokens;
using test_support::same_bits;

std::string model_path(const std::string& name) {
  if (name == "default") return std::string(STRATA_SOURCE_DIR) + "/models/strata-default.gguf";
  return test_support::fixture_model_gguf(name);
}

class BatchDecode : public ::testing::TestWithParam<std::string> {};

// A sequence decoded greedily alone (the reference) and its twin in the batch.
struct Pair {
  std::unique_ptr<Session> alone, batched;
  Tokens prompt;
  int join_step = 0, leave_step = 0;
};

TEST_P(BatchDecode, ContinuousBatchingEqualsDecodingAlone) {
  const auto model = Model::load(model_path(GetParam()));
  compute::ThreadPool pool(2);
  const int64_t n_vocab = model->hparams().n_vocab;
  // Prompt lengths under and over one 64-row prefill window; joins and leaves between steps.
  const std::vector<size_t> lengths = {3, 70, 17, 1, 40};
  const std::vector<int> joins = {0, 0, 2, 3, 5}, leaves = {9, 6, 9, 7, 9};
  std::vector<Pair> pairs(lengths.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    pairs[i].prompt = random_tokens(n_vocab, lengths[i], 100 + uint32_t(i));
    pairs[i].join_step = joins[i];
    pairs[i].leave_step = leaves[i];
    pairs[i].alone = std::make_unique<Session>(*model, pool);
    pairs[i].batched = std::make_unique<Session>(*model, pool);
  }
  BatchWindow batch;
  size_t max_together = 0;
  for (int step = 0; step < 9; ++step) {
    std::vector<Session*> sessions;
    Tokens next;
    for (Pair& p : pairs) {
      if (step < p.join_step || step >= p.leave_step) continue;
      if (step == p.join_step) {
        p.alone->prefill(p.prompt);
        p.batched->prefill(p.prompt);
        ASSERT_TRUE(same_bits(p.alone->logits(), p.batched->logits()));
      }
      const int32_t token = argmax(p.alone->logits());
      p.alone->decode(token);
      sessions.push_back(p.batched.get());
      next.push_back(token);
    }
    max_together = std::max(max_together, sessions.size());
    Session::decode_together(sessions, next, batch);
    for (Pair& p : pairs) {
      if (step < p.join_step || step >= p.leave_step) continue;
      ASSERT_TRUE(same_bits(p.alone->logits(), p.batched->logits()))
          << "sequence of " << p.prompt.size() << " prompt tokens, step " << step;
      ASSERT_EQ(p.alone->n_past(), p.batched->n_past());
      ASSERT_EQ(p.alone->tokens(), p.batched->tokens());
      ASSERT_EQ(p.alone->state().residuals, p.batched->state().residuals);
    }
  }
  EXPECT_EQ(max_together, 5u);
}

TEST_P(BatchDecode, MultiRowSegmentsEqualFeedingEachAlone) {
  const auto model = Model::load(model_path(GetParam()));
  compute::ThreadPool pool(2);
  const int64_t n_vocab = model->hparams().n_vocab;
  // Chunk lengths on both sides of DeltaNet's 32-row switch to the chunked form; each sequence
  // has a different history first.
  const std::vector<size_t> history = {5, 0, 12, 33}, chunk = {1, 40, 7, 33};
  std::vector<ModelState> alone, batched;
  std::vector<Tokens> chunks;
  std::vector<float> ignored;
  for (size_t i = 0; i < chunk.size(); ++i) {
    alone.push_back(model->new_state(256));
    batched.push_back(model->new_state(256));
    if (history[i] > 0) {
      const Tokens h = random_tokens(n_vocab, history[i], 7 + uint32_t(i));
      WindowRunner(*model).run(pool, alone.back(), h, LogitRows::None, ignored);
      WindowRunner(*model).run(pool, batched.back(), h, LogitRows::None, ignored);
    }
    chunks.push_back(random_tokens(n_vocab, chunk[i], 50 + uint32_t(i)));
  }
  std::vector<std::vector<float>> want(chunk.size()), got(chunk.size());
  std::vector<ModelState*> states;
  std::vector<std::span<const int32_t>> rows;
  std::vector<std::vector<float>*> outs;
  for (size_t i = 0; i < chunk.size(); ++i) {
    WindowRunner(*model).run(pool, alone[i], chunks[i], LogitRows::Last, want[i]);
    states.push_back(&batched[i]);
    rows.emplace_back(chunks[i]);
    outs.push_back(&got[i]);
  }
  BatchWindow batch;
  WindowRunner(*model).run_batch(pool, batch, states, rows, outs);
  for (size_t i = 0; i < chunk.size(); ++i) {
    ASSERT_TRUE(same_bits(want[i], got[i])) << "segment " << i << " of " << chunk[i] << " rows";
    ASSERT_EQ(alone[i].n_past, batched[i].n_past);
    // The states are the same too: the next token gives the same logits.
    const int32_t token[1] = {argmax(want[i])};
    WindowRunner(*model).run(pool, alone[i], token, LogitRows::Last, want[i]);
    WindowRunner(*model).run(pool, batched[i], token, LogitRows::Last, got[i]);
    ASSERT_TRUE(same_bits(want[i], got[i])) << "after segment " << i;
  }
}

// serve --parallel's batched prefill (Session::set_prefill_runner, feed_together): each prefill
// window of a joining sequence (prompts of 70 rows = windows of 64 + 6, and 20) runs inside a
// decode step of two other sequences; the joiners' logits, tokens and states equal a plain
// prefill, the decoders' every step equals decoding alone, and so does a step of all four.
TEST_P(BatchDecode, PrefillWindowsInsideDecodeStepsEqualPrefillAlone) {
  const auto model = Model::load(model_path(GetParam()));
  compute::ThreadPool pool(2);
  const int64_t n_vocab = model->hparams().n_vocab;
  std::vector<Pair> decoders(2), joiners(2);
  const std::vector<size_t> decoder_prompts = {5, 9}, joiner_prompts = {70, 20};
  for (size_t i = 0; i < 2; ++i) {
    for (Pair* p : {&decoders[i], &joiners[i]}) {
      p->alone = std::make_unique<Session>(*model, pool);
      p->batched = std::make_unique<Session>(*model, pool);
    }
    decoders[i].prompt = random_tokens(n_vocab, decoder_prompts[i], 300 + uint32_t(i));
    joiners[i].prompt = random_tokens(n_vocab, joiner_prompts[i], 400 + uint32_t(i));
    decoders[i].alone->prefill(decoders[i].prompt);
    decoders[i].batched->prefill(decoders[i].prompt);
  }
  BatchWindow batch;
  int windows = 0;
  const Session::PrefillRunner ride_in_a_step = [&](Session& joiner,
                                                    std::span<const int32_t> window) {
    std::vector<Session*> sessions;
    Tokens next;
    for (Pair& d : decoders) {
      next.push_back(argmax(d.alone->logits()));
      d.alone->decode(next.back());
      sessions.push_back(d.batched.get());
    }
    std::vector<std::span<const int32_t>> rows = {std::span<const int32_t>(&next[0], 1),
                                                  std::span<const int32_t>(&next[1], 1), window};
    sessions.push_back(&joiner);
    Session::feed_together(sessions, rows, batch);
    ++windows;
    for (Pair& d : decoders) {
      ASSERT_TRUE(same_bits(d.alone->logits(), d.batched->logits())) << "window " << windows;
      ASSERT_EQ(d.alone->tokens(), d.batched->tokens());
    }
  };
  for (Pair& j : joiners) {
    j.batched->set_prefill_runner(ride_in_a_step);
    j.alone->prefill(j.prompt);
    j.batched->prefill(j.prompt);
    ASSERT_TRUE(same_bits(j.alone->logits(), j.batched->logits()))
        << "prompt of " << j.prompt.size() << " tokens";
    ASSERT_EQ(j.alone->tokens(), j.batched->tokens());
    ASSERT_EQ(j.alone->n_past(), j.batched->n_past());
    ASSERT_EQ(j.alone->state().residuals, j.batched->state().residuals);
  }
  EXPECT_EQ(windows, 3);
  std::vector<Session*> all;
  Tokens next;
  for (std::vector<Pair>* group : {&decoders, &joiners})
    for (Pair& p : *group) {
      next.push_back(argmax(p.alone->logits()));
      p.alone->decode(next.back());
      all.push_back(p.batched.get());
    }
  Session::decode_together(all, next, batch);
  for (std::vector<Pair>* group : {&decoders, &joiners})
    for (Pair& p : *group) ASSERT_TRUE(same_bits(p.alone->logits(), p.batched->logits()));
}

// strata serve --batch-groups: a step cut into two windows of consecutive sequences that run at
// the same time on two threads, each with its own pool, window buffers and view of the mapping's
// experts (Model::new_mapped_experts), gives every sequence bitwise what it gets alone, over
// decode steps with a prompt window riding in one group; so the windows share nothing mutable.
TEST_P(BatchDecode, GroupsRunSideBySideOnTheirOwnPoolsEqualDecodingAlone) {
  const auto model = Model::load(model_path(GetParam()));
  compute::ThreadPool shared_pool(2);
  const int64_t n_vocab = model->hparams().n_vocab;
  constexpr size_t kSequences = 5;
  std::vector<Pair> pairs(kSequences);
  for (size_t i = 0; i < kSequences; ++i) {
    pairs[i].alone = std::make_unique<Session>(*model, shared_pool);
    pairs[i].batched = std::make_unique<Session>(*model, shared_pool);
    pairs[i].prompt = random_tokens(n_vocab, 2 + 7 * i, 500 + uint32_t(i));
    pairs[i].alone->prefill(pairs[i].prompt);
    if (i + 1 < kSequences) pairs[i].batched->prefill(pairs[i].prompt);
  }
  struct Group {
    compute::ThreadPool pool;
    std::unique_ptr<ExpertSource> experts;
    BatchWindow window;
    std::vector<Session*> sessions;
    std::vector<std::span<const int32_t>> rows;
    explicit Group(int threads, const Model& m) : pool(threads), experts(m.new_mapped_experts()) {}
  };
  Group first(1, *model), second(2, *model);
  for (int step = 0; step < 6; ++step) {
    Tokens next(kSequences);
    for (Group* g : {&first, &second}) g->sessions.clear(), g->rows.clear();
    for (size_t i = 0; i < kSequences; ++i) {
      Group& g = i < 2 ? first : second;
      g.sessions.push_back(pairs[i].batched.get());
      if (i + 1 == kSequences && step == 0) {
        g.rows.push_back(pairs[i].prompt);  // its prompt rides in the first step
        continue;
      }
      next[i] = argmax(pairs[i].alone->logits());
      pairs[i].alone->decode(next[i]);
      g.rows.push_back(std::span<const int32_t>(&next[i], 1));
    }
    for (Group* g : {&first, &second}) Session::check_together(g->sessions, g->rows);
    std::thread beside([&] {
      Session::feed_together(second.sessions, second.rows, second.window, second.experts.get(),
                             &second.pool);
    });
    Session::feed_together(first.sessions, first.rows, first.window, first.experts.get(),
                           &first.pool);
    beside.join();
    for (size_t i = 0; i < kSequences; ++i) {
      ASSERT_TRUE(same_bits(pairs[i].alone->logits(), pairs[i].batched->logits()))
          << "sequence " << i << ", step " << step;
      ASSERT_EQ(pairs[i].alone->tokens(), pairs[i].batched->tokens());
    }
  }
}

// Decode steps of 2-17 sequences on pools of 1-4 threads: the row slices (compute/cpu/row_slices.h:
// hyper-connections, DeltaNet, attention, MoE, each thread taking whole sequences of its slice) and
// the per-product split give each sequence, over two steps, the logits it gets alone on one thread.
// Every sequence has its own random history (1-7 tokens) and random next tokens.
TEST_P(BatchDecode, RowSlicesOfEveryThreadCountAndStepSizeEqualDecodingAlone) {
  const auto model = Model::load(model_path(GetParam()));
  const int64_t n_vocab = model->hparams().n_vocab;
  constexpr size_t kMaxSequences = 17, kSteps = 2;
  std::vector<Tokens> prompts, steps;
  std::vector<std::vector<std::vector<float>>> want(kMaxSequences);
  compute::ThreadPool one(1);
  std::vector<float> ignored;
  for (size_t i = 0; i < kMaxSequences; ++i) {
    prompts.push_back(random_tokens(n_vocab, 1 + i % 7, 300 + uint32_t(i)));
    steps.push_back(random_tokens(n_vocab, kSteps, 500 + uint32_t(i)));
    ModelState alone = model->new_state(64);
    WindowRunner(*model).run(one, alone, prompts[i], LogitRows::None, ignored);
    for (size_t step = 0; step < kSteps; ++step) {
      want[i].emplace_back();
      WindowRunner(*model).run(one, alone, std::span(&steps[i][step], 1), LogitRows::Last,
                               want[i].back());
    }
  }
  for (int threads : {1, 2, 3, 4}) {
    compute::ThreadPool pool(threads);
    for (size_t n_seq : {2, 4, 5, 8, 9, 16, 17}) {
      std::vector<ModelState> states;
      for (size_t i = 0; i < n_seq; ++i) {
        states.push_back(model->new_state(64));
        WindowRunner(*model).run(pool, states.back(), prompts[i], LogitRows::None, ignored);
      }
      BatchWindow batch;
      for (size_t step = 0; step < kSteps; ++step) {
        std::vector<ModelState*> pointers;
        std::vector<std::span<const int32_t>> rows;
        std::vector<std::vector<float>> got(n_seq);
        std::vector<std::vector<float>*> outs;
        for (size_t i = 0; i < n_seq; ++i) {
          pointers.push_back(&states[i]);
          rows.emplace_back(&steps[i][step], 1);
          outs.push_back(&got[i]);
        }
        WindowRunner(*model).run_batch(pool, batch, pointers, rows, outs);
        for (size_t i = 0; i < n_seq; ++i)
          ASSERT_TRUE(same_bits(want[i][step], got[i]))
              << threads << " threads, " << n_seq << " sequences, sequence " << i << ", step "
              << step;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchDecode,
                         ::testing::Values("qwen4exp", "qwen3next", "qwen3moe", "default"));

TEST(BatchDecodeErrors, RefusesSharedStatesRecordingAndEmptyRows) {
  const auto model = Model::load(test_support::fixture_model_gguf("qwen3moe"));
  compute::ThreadPool pool(1);
  ModelState a = model->new_state(64), b = model->new_state(64);
  const Tokens one = {1};
  std::vector<float> la, lb;
  BatchWindow batch;
  auto run = [&](std::vector<ModelState*> states, std::vector<std::span<const int32_t>> rows) {
    std::vector<std::vector<float>*> outs(states.size(), &la);
    if (outs.size() > 1) outs[1] = &lb;
    WindowRunner(*model).run_batch(pool, batch, states, rows, outs);
  };
  auto message = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { run({&a, &a}, {one, one}); }).find("share a state"), std::string::npos);
  EXPECT_NE(message([&] { run({&a, &b}, {one, {}}); }).find("has no tokens"), std::string::npos);
  b.record_windows = true;
  EXPECT_NE(message([&] {
              run({&a, &b}, {one, one});
            }).find("records its windows"),
            std::string::npos);
  b.record_windows = false;
  EXPECT_NE(message([&] { run({}, {}); }).find("no sequences"), std::string::npos);
  const Tokens bad = {int32_t(model->hparams().n_vocab)};
  EXPECT_NE(message([&] {
              run({&a, &b}, {one, bad});
            }).find("outside the vocabulary"),
            std::string::npos);
  EXPECT_EQ(a.n_past, 0);  // nothing ran
}

}  // namespace
}  // namespace strata
