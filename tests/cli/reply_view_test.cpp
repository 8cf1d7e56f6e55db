// ReplyView (src/cli/reply_view.h): what `strata chat` prints for a reply, fed the deltas a
// ThinkFilter makes of real reply text, one chunk per token.
#include "cli/reply_view.h"

#include <gtest/gtest.h>

#include <sstream>
#include <vector>

namespace strata::cli {
namespace {

std::string view(const std::vector<std::string>& tokens, bool show_thinking, bool color,
                 const std::string& cut_short = "", bool prompt_opens_thinking = true) {
  std::ostringstream out;
  ThinkFilter filter(show_thinking ? ThinkFilter::Mode::Show : ThinkFilter::Mode::Hide,
                     prompt_opens_thinking);
  ReplyView reply(out, show_thinking, color);
  for (const std::string& token : tokens) reply.show(filter.push(token));
  reply.show(filter.finish(), false);
  reply.finish(cut_short);
  return out.str();
}

const std::vector<std::string> kThinkThenAnswer = {"Let",      " me",  " think", ".\n",
                                                   "</think>", "\n\n", "Hello",  "!"};

TEST(ReplyView, HiddenThinkingShowsAnIndicatorWithItsTokens) {
  EXPECT_EQ(view(kThinkThenAnswer, false, false), "[thinking… 6 tokens]\nHello!\n");
  EXPECT_EQ(view(kThinkThenAnswer, false, true),
            "\033[2m[thinking…\033[0m\033[2m 6 tokens]\033[0m\nHello!\n");
}

TEST(ReplyView, AReplyCutOffWhileThinkingSaysSo) {
  const std::string out =
      view({"Let", " me", " think"}, false, false, "reply limit: --max-reply 3");
  EXPECT_EQ(out.rfind("[thinking… 3 tokens, no answer yet: the reply ended while the model was "
                      "thinking (--show-thinking shows the thinking, --no-thinking asks for none)]",
                      0),
            0u)
      << out;
  EXPECT_NE(out.find(" [reply limit: --max-reply 3]\n"), std::string::npos) << out;
}

TEST(ReplyView, ShownThinkingIsDimmedOnATerminalAndVerbatimElsewhere) {
  EXPECT_EQ(view(kThinkThenAnswer, true, false), "Let me think.\n</think>\n\nHello!\n");
  const std::string colored = view(kThinkThenAnswer, true, true);
  EXPECT_EQ(colored.rfind("\033[2mLet\033[0m", 0), 0u) << colored;
  EXPECT_NE(colored.find("Hello!"), std::string::npos) << colored;
  EXPECT_EQ(colored.find("\033[2mHello"), std::string::npos) << colored;
}

TEST(ReplyView, NoThinkingNoIndicatorAndAnEmptyReplyIsNamed) {
  EXPECT_EQ(view({"Hi", " there"}, false, false, "", false), "Hi there\n");
  EXPECT_EQ(view({}, false, false, "", false), "[empty reply]\n");
  EXPECT_EQ(view({"Hi"}, false, false, "stopped", false), "Hi [stopped]\n");
}

}  // namespace
}  // namespace strata::cli
