// `strata chat` with piped input on the embedded default model (thinking on, its default): a reply
// cut off while thinking shows the indicator and why it ended instead of an empty line, each reply
// is followed by its tokens and tok/s on stderr, and /help lists the commands.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli_process.h"

namespace strata::cli::test {
namespace {

std::string input_file(const std::string& text) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("strata-chat-in-" + std::to_string(getpid())))
          .string();
  std::ofstream(path, std::ios::binary) << text;
  std::string redirect = "<";
  redirect += path;
  return redirect;
}

TEST(CliChat, ThinkingIndicatorSpeedLineAndHelp) {
  const CommandResult chat = run_strata("chat --temp 0 --max-reply 8 -t 1",
                                        input_file("/help\nHello there\n/stat\n/quit\n"));
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_NE(chat.out.find("/help lists the commands"), std::string::npos) << chat.out;
  for (const char* command : {"/help", "/stats", "/reset", "/quit"})
    EXPECT_NE(chat.out.find("  " + std::string(command) + " "), std::string::npos) << chat.out;
  EXPECT_NE(chat.out.find("> [thinking… 8 tokens, no answer yet: the reply ended while the model "
                          "was thinking"),
            std::string::npos)
      << chat.out;
  EXPECT_NE(chat.out.find("[reply limit: --max-reply 8]"), std::string::npos) << chat.out;
  EXPECT_NE(chat.out.find("unknown command /stat (/help lists the commands)"), std::string::npos)
      << chat.out;
  EXPECT_EQ(chat.out.find("\033["), std::string::npos) << "no colour codes into a pipe";
  EXPECT_NE(chat.err.find("[8 tokens in "), std::string::npos) << chat.err;
  EXPECT_NE(chat.err.find(" tok/s; prompt "), std::string::npos) << chat.err;

  const CommandResult quiet =
      run_strata("chat --temp 0 --max-reply 4 -t 1 --no-speed --no-thinking",
                 input_file("Hello there\n/quit\n"));
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("tok/s"), std::string::npos) << quiet.err;
  EXPECT_EQ(quiet.out.find("[thinking"), std::string::npos) << quiet.out;
}

}  // namespace
}  // namespace strata::cli::test
