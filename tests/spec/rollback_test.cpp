// State rollback: after a verify window of which only the first m rows are kept, the session is
// bitwise the session that was only ever fed those m rows — every state (KV, DeltaNet recurrent
// and conv, PLE history and n-gram context, residuals) and the next logits.
#include <gtest/gtest.h>

#include <cstring>

#include "../common/token_rows.h"
#include "spec_test_util.h"
#include "util/error.h"

namespace strata {
namespace {

using spec_test::fixture_path;

using test_support::same_bits;

void expect_same_state(const ModelState& a, const ModelState& b, const std::string& label) {
  EXPECT_EQ(a.n_past, b.n_past) << label;
  ASSERT_EQ(a.kv.size(), b.kv.size());
  for (size_t l = 0; l < a.kv.size(); ++l) {
    EXPECT_EQ(a.kv[l].n_tokens, b.kv[l].n_tokens) << label << " layer " << l;
    EXPECT_TRUE(same_bits(a.kv[l].k, b.kv[l].k)) << label << " kv.k layer " << l;
    EXPECT_TRUE(same_bits(a.kv[l].v, b.kv[l].v)) << label << " kv.v layer " << l;
    EXPECT_TRUE(same_bits(a.kv[l].index_k_raw, b.kv[l].index_k_raw)) << label << " layer " << l;
    EXPECT_TRUE(same_bits(a.kv[l].block_keys, b.kv[l].block_keys)) << label << " layer " << l;
    EXPECT_TRUE(same_bits(a.deltanet[l].ssm, b.deltanet[l].ssm)) << label << " ssm layer " << l;
    EXPECT_TRUE(same_bits(a.deltanet[l].conv, b.deltanet[l].conv)) << label << " conv layer " << l;
  }
  EXPECT_TRUE(same_bits(a.ple.conv_history, b.ple.conv_history)) << label << " PLE history";
  EXPECT_EQ(a.ple.context.prev[0], b.ple.context.prev[0]) << label;
  EXPECT_EQ(a.ple.context.prev[1], b.ple.context.prev[1]) << label;
}

class Rollback : public testing::TestWithParam<std::string> {};

TEST_P(Rollback, KeptRowsLeaveTheStateOfAPlainRun) {
  const auto model = Model::load(fixture_path(GetParam()));
  compute::ThreadPool pool(2);
  const std::vector<int32_t> prompt = {3, 17, 5, 42, 9, 11, 8, 30, 4};
  const std::vector<int32_t> window = {7, 21, 7, 99, 13};
  const int32_t after = 64;
  for (int64_t keep = 1; keep <= int64_t(window.size()); ++keep) {
    const std::string label = GetParam() + " keep " + std::to_string(keep);
    Session spec(*model, pool), plain(*model, pool);
    spec.prefill(prompt, 4);
    plain.prefill(prompt, 4);
    // Two verify windows in a row: rollback must also compose with a previous one.
    spec.verify(std::vector<int32_t>{window[0], window[1]});
    spec.keep_rows(1);
    plain.decode(window[0]);
    spec.verify(std::vector<int32_t>(window.begin() + 1, window.end()));
    ASSERT_LE(keep, int64_t(window.size()) - 1 + 1);
    const int64_t keep_second = std::min<int64_t>(keep, int64_t(window.size()) - 1);
    spec.keep_rows(keep_second);
    for (int64_t i = 1; i <= keep_second; ++i) plain.decode(window[size_t(i)]);
    EXPECT_TRUE(same_bits(spec.logits(), plain.logits())) << label << ": kept row's logits";
    EXPECT_EQ(spec.tokens(), plain.tokens()) << label;
    expect_same_state(spec.state(), plain.state(), label);
    if (!spec.state().residuals.empty()) {
      const size_t width = spec.state().residuals.size() / size_t(keep_second);
      const std::vector<float> last(spec.state().residuals.end() - ptrdiff_t(width),
                                    spec.state().residuals.end());
      EXPECT_TRUE(same_bits(last, plain.state().residuals)) << label << ": last residual";
    }
    // The next step's logits, bitwise.
    EXPECT_TRUE(same_bits(spec.decode(after), plain.decode(after))) << label << ": next logits";
    expect_same_state(spec.state(), plain.state(), label + " after the next step");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Rollback, testing::Values("qwen3moe", "qwen3next", "qwen4exp"));

TEST(Rollback, RefusesWindowsThatWereNotRecorded) {
  const auto model = Model::load(fixture_path("qwen4exp"));
  compute::ThreadPool pool(2);
  Session session(*model, pool);
  session.prefill(std::vector<int32_t>{1, 2, 3}, 8);
  EXPECT_THROW(session.keep_rows(1), Error);
  session.verify(std::vector<int32_t>{4, 5});
  EXPECT_THROW(session.keep_rows(3), Error);
  EXPECT_THROW(session.keep_rows(0), Error);
}

}  // namespace
}  // namespace strata
