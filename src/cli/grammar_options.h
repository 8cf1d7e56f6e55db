// --json-schema FILE / --json / --grammar FILE: grammar-constrained output for `strata run` and
// `strata chat`, the same machinery as `strata serve`'s response_format and `grammar` fields
// (grammar/json_schema.h compiles the schema, grammar/gbnf.h parses GBNF, grammar/token_mask.h
// masks each draw). One definition of the options, the schema file's
// reading and the vocabulary, shared by both commands.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_mask.h"

namespace strata {
class Tokenizer;
}

namespace strata::cli {

struct GrammarCliOptions {
  std::string json_schema_file;  // --json-schema: the output is a value of this schema
  bool json_object = false;      // --json: the output is a JSON object
  std::string gbnf_file;         // --grammar: the output is a sentence of this GBNF grammar
};

// Adds --json-schema FILE, --json and --grammar FILE (mutually exclusive); `what` names the output
// ("the output", "each reply") in the help.
void add_grammar_options(CLI::App& cmd, GrammarCliOptions& options, const std::string& what);

// The grammar the options ask for, or nullopt. Errors name the file and the keyword
// ("schema.json: properties.age.minimum: ...") or the line and column ("g.gbnf:3:14: ...").
std::optional<grammar::Grammar> output_grammar(const GrammarCliOptions& options);

// The model's tokens as the mask sees them, with `stops` (eos, end of turn) as the tokens that
// end a complete value. `model_path` names the file when it has no tokenizer.
grammar::TokenVocabulary output_vocabulary(const Tokenizer* tokenizer, std::vector<int32_t> stops,
                                           int64_t n_vocab, const std::string& model_path);

}  // namespace strata::cli
