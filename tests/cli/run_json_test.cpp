// `strata run --json-schema FILE` / `--json` on the default model: after the echoed prompt the
// output is one JSON value of the schema (parsed and checked here), the same with --spec; a
// schema keyword that cannot be honoured fails naming the file and the keyword. The same for
// --grammar FILE (GBNF).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli_process.h"

namespace strata::cli::test {
namespace {

std::string schema_file(const std::string& name, const std::string& text) {
  const std::string path =
      (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()))).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// stdout less the echoed prompt "P:" and the final newline.
std::string generated(const CommandResult& result) {
  EXPECT_EQ(result.out.rfind("P:", 0), 0u) << result.out;
  std::string text = result.out.substr(2);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

TEST(CliRunJson, OutputIsAValueOfTheSchema) {
  const std::string schema = schema_file(
      "strata-schema.json",
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":10},)"
      R"("kind":{"enum":["a","b"]},"n":{"type":"integer"}},"required":["name","kind","n"],)"
      R"("additionalProperties":false})");
  for (const std::string sampling : {"--temp 0", "--temp 0.9 --seed 4"}) {
    SCOPED_TRACE(sampling);
    const std::string args = "run -p P: -n 300 -t 1 --json-schema " + schema + " " + sampling;
    const CommandResult plain = run_strata(args);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const nlohmann::json value = nlohmann::json::parse(generated(plain));
    ASSERT_TRUE(value.is_object());
    EXPECT_EQ(value.size(), 3u);
    EXPECT_TRUE(value["name"].is_string());
    EXPECT_LE(value["name"].get<std::string>().size(), 10u * 4);
    EXPECT_TRUE(value["kind"] == "a" || value["kind"] == "b") << value;
    EXPECT_TRUE(value["n"].is_number_integer()) << value;
    const CommandResult spec = run_strata(args + " --spec both");
    ASSERT_EQ(spec.exit_code, 0) << spec.err;
    EXPECT_EQ(spec.out, plain.out);
  }
  const CommandResult object = run_strata("run -p P: -n 400 -t 1 --temp 0 --json");
  ASSERT_EQ(object.exit_code, 0) << object.err;
  const std::string text = generated(object);
  EXPECT_EQ(text.rfind('{', 0), 0u) << text;
}

TEST(CliRunJson, RefusedKeywordNamesFileAndKeyword) {
  const std::string schema =
      schema_file("strata-bad-schema.json", R"({"type":"string","format":"email"})");
  const CommandResult result = run_strata("run -p P: -n 5 -t 1 --json-schema " + schema);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.err.find(schema + ": format: "), std::string::npos) << result.err;
}

// --grammar FILE (GBNF): the output is a sentence of the grammar, greedy and sampled, the same
// with --spec; `chat --grammar` replies are sentences too; a bad grammar names FILE:LINE:COLUMN.
TEST(CliRunGrammar, OutputIsASentenceOfTheGrammar) {
  const std::string gbnf = schema_file("strata-grammar.gbnf",
                                       "root ::= (\"yes\" | \"no\") \", \" [0-9]{3}  # a code\n");
  const std::regex sentence("(yes|no), [0-9]{3}");
  for (const std::string sampling : {"--temp 0", "--temp 0.9 --seed 4"}) {
    SCOPED_TRACE(sampling);
    const std::string args = "run -p P: -n 40 -t 1 --grammar " + gbnf + " " + sampling;
    const CommandResult plain = run_strata(args);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_TRUE(std::regex_match(generated(plain), sentence)) << plain.out;
    const CommandResult spec = run_strata(args + " --spec both");
    ASSERT_EQ(spec.exit_code, 0) << spec.err;
    EXPECT_EQ(spec.out, plain.out);
  }
  const std::string input = schema_file("strata-grammar-chat-in", "Answer\nAgain\n/quit\n");
  const CommandResult chat =
      run_strata("chat --max-reply 40 -t 1 --no-speed --temp 0 --grammar " + gbnf, "<" + input);
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  size_t replies = 0;
  for (size_t at = chat.out.find("\n> "); at != std::string::npos && replies < 2; ++replies) {
    const size_t end = chat.out.find('\n', at + 3);
    ASSERT_NE(end, std::string::npos) << chat.out;
    EXPECT_TRUE(std::regex_match(chat.out.substr(at + 3, end - at - 3), sentence)) << chat.out;
    at = chat.out.find("\n> ", end);
  }
  EXPECT_EQ(replies, 2u) << chat.out;

  const std::string bad = schema_file("strata-bad.gbnf", "root ::= answer\nanswer ::= \"yes\" | \"no\n");
  const CommandResult refused = run_strata("run -p P: -n 5 -t 1 --grammar " + bad);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find(bad + ":2:20: unterminated string"), std::string::npos)
      << refused.err;
  const CommandResult both = run_strata("run -p P: -n 5 -t 1 --json --grammar " + gbnf);
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
}

}  // namespace
}  // namespace strata::cli::test
