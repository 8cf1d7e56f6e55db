// `strata run --ctx N` on the embedded default model: the context holds exactly N tokens (the
// generation ends there, saying so, and the tokens before are those of a run without --ctx); a
// prompt longer than the context, 0 and more than the model's context length are clear errors.
#include <gtest/gtest.h>

#include "cli_process.h"

namespace strata::cli::test {
namespace {

const std::string kRun = "run --temp 0 -t 1 --ignore-eos -p 'And God said'";

TEST(CliRunContext, GenerationEndsAtTheContextLength) {
  const CommandResult bounded = run_strata(kRun + " -n 100 --ctx 16", "</dev/null");
  ASSERT_EQ(bounded.exit_code, 0) << bounded.err;
  EXPECT_NE(bounded.err.find("the context is full (16 tokens)"), std::string::npos) << bounded.err;
  // Up to there the text is the unbounded run's.
  const CommandResult free_run = run_strata(kRun + " -n 40", "</dev/null");
  ASSERT_EQ(free_run.exit_code, 0) << free_run.err;
  ASSERT_FALSE(bounded.out.empty());
  const std::string bounded_text = bounded.out.substr(0, bounded.out.find_last_not_of('\n') + 1);
  EXPECT_EQ(free_run.out.rfind(bounded_text, 0), 0u)
      << "bounded: " << bounded.out << "\nfree: " << free_run.out;
}

TEST(CliRunContext, BadContextLengthsAreRefused) {
  const CommandResult zero = run_strata(kRun + " -n 4 --ctx 0", "</dev/null");
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.err.find("--ctx"), std::string::npos) << zero.err;
  const CommandResult huge = run_strata(kRun + " -n 4 --ctx 100000", "</dev/null");
  EXPECT_EQ(huge.exit_code, 1);
  EXPECT_NE(
      huge.err.find("context length (--ctx) 100000 is more than the model's context length 4096"),
      std::string::npos)
      << huge.err;
  const CommandResult short_context = run_strata(kRun + " -n 4 --ctx 2", "</dev/null");
  EXPECT_EQ(short_context.exit_code, 1);
  EXPECT_NE(short_context.err.find("exceed the context length 2"), std::string::npos)
      << short_context.err;
}

}  // namespace
}  // namespace strata::cli::test
