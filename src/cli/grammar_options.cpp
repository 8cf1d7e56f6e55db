#include "cli/grammar_options.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace strata::cli {

void add_grammar_options(CLI::App& cmd, GrammarCliOptions& options, const std::string& what) {
  auto* json_schema =
      cmd.add_option("--json-schema", options.json_schema_file,
                     "constrain " + what + " to a value of the JSON schema in FILE");
  auto* json =
      cmd.add_flag("--json", options.json_object, "constrain " + what + " to a JSON object")
          ->excludes(json_schema);
  cmd.add_option("--grammar", options.gbnf_file,
                 "constrain " + what + " to the GBNF grammar in FILE (llama.cpp's format)")
      ->excludes(json_schema)
      ->excludes(json);
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path, std::strerror(errno));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

std::optional<grammar::Grammar> output_grammar(const GrammarCliOptions& options) {
  if (options.json_object) return grammar::json_object_grammar();
  if (!options.gbnf_file.empty()) {
    const std::string text = read_file(options.gbnf_file);
    try {
      return grammar::parse_gbnf(text);
    } catch (const grammar::GbnfError& error) {
      fail("{}:{}", options.gbnf_file, error.what());
    }
  }
  if (options.json_schema_file.empty()) return std::nullopt;
  const std::string& path = options.json_schema_file;
  const std::string text = read_file(path);
  const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
  if (schema.is_discarded()) fail("{}: not valid JSON (expected a JSON schema)", path);
  try {
    return grammar::compile_json_schema(schema);
  } catch (const grammar::SchemaError& error) {
    fail("{}: {}", path, error.what());
  }
}

grammar::TokenVocabulary output_vocabulary(const Tokenizer* tokenizer, std::vector<int32_t> stops,
                                           int64_t n_vocab, const std::string& model_path) {
  if (!tokenizer)
    fail("{}: --json / --json-schema / --grammar need the file's tokenizer", model_path);
  return grammar::TokenVocabulary::from_tokenizer(*tokenizer, std::move(stops), size_t(n_vocab));
}

}  // namespace strata::cli
