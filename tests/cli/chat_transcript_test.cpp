// `strata chat` with piped input on the embedded default model (thinking on, its default): a reply
// cut off while thinking shows the indicator and why it ended instead of an empty line, each reply
// is followed by its tokens and tok/s on stderr, and /help lists the commands; later turns resume
// from the conversation state cache with the replies of a full re-prefill.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
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

// The prompt tokens each turn prefilled, from the speed lines on stderr
// ("[24 tokens in 0.78 s, 30.8 tok/s; prompt 37 tokens, 412.0 tok/s]").
std::vector<int> prefilled_per_turn(const std::string& err) {
  static const std::regex line(R"(tok/s; prompt (\d+) tokens,)");
  std::vector<int> out;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator();
       ++it)
    out.push_back(std::stoi((*it)[1]));
  return out;
}

// Issue 17: `strata chat` re-prefilled the whole history every turn (the template drops earlier
// turns' thinking, so the prompt never extends the session). With the state cache (on by
// default) a turn resumes from the last 64-row window boundary of the previous prompt: it
// prefills less, by a whole number of windows, and its replies are those of `--cache-ram 0`,
// which re-prefills everything (the thinking is shown, so the replies' every token is compared).
TEST(CliChat, LaterTurnsResumeFromTheStateCacheWithTheSameReplies) {
  // Messages long enough that each prompt passes a window boundary (64 tokens).
  const std::string turns =
      "In the beginning God created the heaven and the earth. And the earth was without form, "
      "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the "
      "face of the waters. Tell me what happened next.\n"
      "And God said, Let there be light: and there was light. And God saw the light, that it was "
      "good: and God divided the light from the darkness. What came after that?\n"
      "And God called the light Day, and the darkness he called Night. And the evening and the "
      "morning were the first day. Go on.\n/quit\n";
  const std::string chat = "chat --temp 0 --max-reply 24 -t 1 --show-thinking ";
  const CommandResult cached = run_strata(chat, input_file(turns));
  const CommandResult full = run_strata(chat + "--cache-ram 0", input_file(turns));
  // The 64-row windows chat ran before session 47 (now 512 on the CPU, cut at multiples of 64):
  // the same replies.
  const CommandResult short_windows = run_strata(chat + "--chunk 64", input_file(turns));
  ASSERT_EQ(cached.exit_code, 0) << cached.err;
  ASSERT_EQ(full.exit_code, 0) << full.err;
  ASSERT_EQ(short_windows.exit_code, 0) << short_windows.err;
  const size_t first_reply = full.out.find("\n> ");
  ASSERT_NE(first_reply, std::string::npos) << full.out;
  EXPECT_EQ(cached.out.substr(cached.out.find("\n> ")), full.out.substr(first_reply));
  EXPECT_EQ(short_windows.out.substr(short_windows.out.find("\n> ")), full.out.substr(first_reply));
  const std::vector<int> resumed = prefilled_per_turn(cached.err);
  const std::vector<int> whole = prefilled_per_turn(full.err);
  ASSERT_EQ(resumed.size(), 3u) << cached.err;
  ASSERT_EQ(whole.size(), 3u) << full.err;
  EXPECT_EQ(resumed[0], whole[0]);
  EXPECT_GT(whole[0], 64);
  for (size_t turn = 1; turn < 3; ++turn) {
    SCOPED_TRACE(turn + 1);
    EXPECT_GT(whole[turn], whole[turn - 1]);  // the whole history each time
    EXPECT_LT(resumed[turn], whole[turn]);
    EXPECT_EQ((whole[turn] - resumed[turn]) % 64, 0);
    // Resumed at the last window boundary inside the previous prompt that still prefixes this
    // one: at most a window of it again, plus the tail this prompt renders differently (the
    // generation prompt: the history drops the reply's thinking), a few tokens.
    const int cached = whole[turn] - resumed[turn];
    EXPECT_GE(cached + 64 + 16, whole[turn - 1]);
    EXPECT_LE(cached, whole[turn - 1]);
  }
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
