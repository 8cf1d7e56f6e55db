// `strata chat` with piped input on the embedded default model (thinking on, its default): a reply
// cut off while thinking shows the indicator and why it ended instead of an empty line, each reply
// is followed by its tokens and tok/s on stderr, and /help lists the commands.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

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

// --json-schema: every reply (two turns: the second one resumes after the first reply) is one
// value of the schema, and it ends there (the template renders without thinking).
TEST(CliChat, JsonSchemaRepliesAreValuesOfTheSchema) {
  const std::string schema_path =
      (std::filesystem::temp_directory_path() / ("strata-chat-schema-" + std::to_string(getpid())))
          .string();
  std::ofstream(schema_path, std::ios::binary)
      << R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},)"
         R"("age":{"type":"integer","minimum":0,"maximum":120},"pet":{"enum":["cat","dog"]}},)"
         R"("required":["name","age","pet"],"additionalProperties":false})";
  for (const std::string sampling : {"--temp 0", "--temp 0.9 --seed 3"}) {
    SCOPED_TRACE(sampling);
    const CommandResult chat = run_strata(
        "chat --max-reply 200 -t 1 --no-speed --json-schema " + schema_path + " " + sampling,
        input_file("Describe a person\nAnother one\n/quit\n"));
    ASSERT_EQ(chat.exit_code, 0) << chat.err;
    EXPECT_EQ(chat.out.find("[thinking"), std::string::npos) << chat.out;
    // "> REPLY\n" per turn after the banner line; a value may hold newlines (its whitespace),
    // never "\n> " (not JSON outside a string, and a string holds no raw newline).
    std::vector<nlohmann::json> replies;
    size_t at = chat.out.find("\n> ");
    while (at != std::string::npos && replies.size() < 2) {
      const size_t next = chat.out.find("\n> ", at + 3);
      ASSERT_NE(next, std::string::npos) << chat.out;
      replies.push_back(nlohmann::json::parse(chat.out.substr(at + 3, next - at - 3)));
      at = next;
    }
    ASSERT_EQ(replies.size(), 2u) << chat.out;
    for (const nlohmann::json& value : replies) {
      ASSERT_TRUE(value.is_object()) << value;
      EXPECT_EQ(value.size(), 3u) << value;
      EXPECT_TRUE(value["name"].is_string()) << value;
      EXPECT_TRUE(value["age"].is_number_integer() && value["age"] >= 0 && value["age"] <= 120)
          << value;
      EXPECT_TRUE(value["pet"] == "cat" || value["pet"] == "dog") << value;
    }
  }
  const CommandResult refused =
      run_strata("chat -t 1 --json-schema /nonexistent/schema.json", input_file("hi\n/quit\n"));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("/nonexistent/schema.json: cannot open"), std::string::npos)
      << refused.err;
  std::filesystem::remove(schema_path);
}

}  // namespace
}  // namespace strata::cli::test
