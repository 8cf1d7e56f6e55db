// WindowRunner (engine/window.h): what happens around a window on the host. On the committed
// transformers fixtures of every architecture (qwen4exp with PLE and an MTP head, qwen3next,
// qwen3moe):
// - positions: n_past advances by the window's rows; the logit rows asked for come back
//   ([rows][n_vocab]; none clears the vector);
// - bad windows (empty, a token outside the vocabulary) are refused before anything runs: the
//   state is left as it was, and the next window gives the bits it gives in a fresh state;
// - the speculative window log: rollback(k) after a recorded window gives bitwise the state of
//   having fed only its first k rows (the next window's logits and n_past), consumes the log, and
//   refuses keep_rows outside [0, rows] and a window that was not recorded.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../common/fixture_models.h"
#include "../common/token_rows.h"
#include "compute/cpu/thread_pool.h"
#include "engine/window.h"
#include "model/model.h"
#include "util/error.h"

namespace strata {
namespace {

using Tokens = std::vector<int32_t>;

using test_support::same_bits;
using test_support::random_tokens;

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

class Window : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model = Model::load(test_support::fixture_model_gguf(GetParam()));
    n_vocab = model->hparams().n_vocab;
  }
  std::unique_ptr<Model> model;
  int64_t n_vocab = 0;
  compute::ThreadPool pool{2};
};

TEST_P(Window, AdvancesPositionsAndReturnsTheRowsAskedFor) {
  const WindowRunner runner(*model);
  ModelState state = model->new_state(64);
  const Tokens prompt = random_tokens(n_vocab, 7, 1);
  std::vector<float> logits(3, 1.0f);
  runner.run(pool, state, std::span(prompt).first(3), LogitRows::None, logits);
  EXPECT_EQ(state.n_past, 3);
  EXPECT_TRUE(logits.empty());
  runner.run(pool, state, std::span(prompt).subspan(3, 3), LogitRows::All, logits);
  EXPECT_EQ(state.n_past, 6);
  ASSERT_EQ(logits.size(), size_t(3 * n_vocab));
  const std::vector<float> last_of_all(logits.end() - n_vocab, logits.end());
  // The last row of that window, computed alone after the same 5 tokens: bitwise the same
  // (window identity), through LogitRows::Last.
  ModelState other = model->new_state(64);
  runner.run(pool, other, std::span(prompt).first(5), LogitRows::None, logits);
  runner.run(pool, other, std::span(prompt).subspan(5, 1), LogitRows::Last, logits);
  EXPECT_EQ(other.n_past, 6);
  EXPECT_TRUE(same_bits(logits, last_of_all));
}

TEST_P(Window, BadWindowsAreRefusedBeforeAnythingRuns) {
  const WindowRunner runner(*model);
  ModelState state = model->new_state(64);
  const Tokens prompt = random_tokens(n_vocab, 4, 2);
  std::vector<float> logits;
  runner.run(pool, state, std::span(prompt).first(2), LogitRows::None, logits);
  EXPECT_NE(
      error_of([&] { runner.run(pool, state, {}, LogitRows::Last, logits); }).find("empty window"),
      std::string::npos);
  const Tokens bad = {prompt[2], int32_t(n_vocab)};
  EXPECT_NE(error_of([&] {
              runner.run(pool, state, bad, LogitRows::Last, logits);
            }).find(std::to_string(n_vocab)),
            std::string::npos);
  const Tokens negative = {-1};
  EXPECT_NE(error_of([&] { runner.run(pool, state, negative, LogitRows::Last, logits); }),
            "no error");
  EXPECT_EQ(state.n_past, 2);
  runner.run(pool, state, std::span(prompt).subspan(2), LogitRows::Last, logits);

  ModelState fresh = model->new_state(64);
  std::vector<float> want;
  runner.run(pool, fresh, prompt, LogitRows::Last, want);
  EXPECT_TRUE(same_bits(logits, want));
}

TEST_P(Window, RollbackKeepsTheFirstRowsBitwise) {
  const WindowRunner runner(*model);
  const Tokens prompt = random_tokens(n_vocab, 5, 3);
  const Tokens verify = random_tokens(n_vocab, 4, 4);
  const Tokens next = random_tokens(n_vocab, 1, 5);
  std::vector<float> logits;
  for (int keep = 0; keep <= int(verify.size()); ++keep) {
    SCOPED_TRACE("keep " + std::to_string(keep));
    ModelState state = model->new_state(64);
    runner.run(pool, state, prompt, LogitRows::None, logits);
    state.record_windows = true;
    runner.run(pool, state, verify, LogitRows::All, logits);
    state.record_windows = false;
    runner.rollback(pool, state, keep);
    EXPECT_EQ(state.n_past, int64_t(prompt.size()) + keep);
    EXPECT_NE(
        error_of([&] { runner.rollback(pool, state, 0); }).find("not run with record_windows"),
        std::string::npos)
        << "the log is consumed";
    std::vector<float> got;
    runner.run(pool, state, next, LogitRows::Last, got);

    ModelState plain = model->new_state(64);
    Tokens fed = prompt;
    fed.insert(fed.end(), verify.begin(), verify.begin() + keep);
    runner.run(pool, plain, fed, LogitRows::None, logits);
    std::vector<float> want;
    runner.run(pool, plain, next, LogitRows::Last, want);
    EXPECT_TRUE(same_bits(got, want));
  }

  ModelState state = model->new_state(64);
  EXPECT_NE(error_of([&] { runner.rollback(pool, state, 0); }).find("not run with record_windows"),
            std::string::npos);
  state.record_windows = true;
  runner.run(pool, state, verify, LogitRows::All, logits);
  EXPECT_NE(error_of([&] {
              runner.rollback(pool, state, 5);
            }).find("cannot keep 5 rows of a 4-row window"),
            std::string::npos);
  EXPECT_NE(error_of([&] { runner.rollback(pool, state, -1); }), "no error");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Window, ::testing::Values("qwen4exp", "qwen3next", "qwen3moe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata
