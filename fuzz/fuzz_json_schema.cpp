// libFuzzer target for the structured-output grammar (src/grammar/): the JSON-schema compiler, the
// GBNF parser, the matcher and the token mask. Input: "SCHEMA\x1eINSTANCE", or "GBNF\x1dINSTANCE"
// (GBNF text: a \x1d before any \x1e), or no separator: the whole input is the instance, under the
// any-JSON-object grammar. Invariants (trap on violation):
// - parse_gbnf on any bytes throws nothing but GbnfError, whose what() is "LINE:COLUMN: DETAIL"
//   with a position inside the text; a grammar it returns has no left recursion, and when all
//   its byte sets are ASCII its rendering (to_text) parses back to a grammar that agrees on the
//   instance;
// - compile_json_schema on any JSON value throws nothing but SchemaError (whose message names
//   its path);
// - an instance the matcher accepts as complete under a schema's grammar is valid JSON (nlohmann
//   parses it);
// - the token mask over a small vocabulary cut from the instance (pieces of 1..4 bytes, plus a
//   stop token) equals the brute-force answer at every token boundary of the instance;
// - the same for a lazy constraint (grammar/lazy_trigger.h) over "say <go>" + the instance, cut
//   the same way: before the word every token but those that would complete it and go on with
//   bytes the grammar rejects, after it the grammar's mask from the bytes that followed the word.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"

namespace {

using namespace strata::grammar;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool bit(const std::vector<uint64_t>& bits, size_t id) {
  return (bits[id >> 6] >> (id & 63)) & 1;
}

void check_mask(const Grammar& grammar, std::string_view instance) {
  std::vector<std::string> pieces;
  std::vector<int32_t> tokens;  // the instance as a sequence of piece ids
  for (size_t at = 0; at < instance.size() && pieces.size() < 256;) {
    const size_t n = std::min<size_t>(1 + (uint8_t(instance[at]) & 3), instance.size() - at);
    tokens.push_back(int32_t(pieces.size()));
    pieces.emplace_back(instance.substr(at, n));
    at += n;
  }
  const int32_t stop = int32_t(pieces.size());
  pieces.emplace_back();
  const TokenVocabulary vocabulary(pieces, {stop}, pieces.size() + 3);
  GrammarConstraint constraint(grammar, vocabulary);
  Matcher reference(grammar);
  for (int32_t token : tokens) {
    const std::vector<uint64_t> bits = constraint.allowed();
    const MatcherState at = reference.state();
    for (size_t id = 0; id < vocabulary.n_vocab(); ++id) {
      bool expected = false;
      if (int32_t(id) == stop) {
        expected = reference.accepting(at);
      } else if (vocabulary.has_bytes(int32_t(id))) {
        reference.set_state(at);
        expected = reference.accept(vocabulary.bytes(int32_t(id)));
      }
      check(bit(bits, id) == expected);
    }
    reference.set_state(at);
    if (!bit(bits, size_t(token))) return;  // the instance leaves the grammar here
    constraint.accept(token);
    check(constraint.valid());
    check(reference.accept(vocabulary.bytes(token)));
  }
}

void check_lazy(const Grammar& grammar, std::string_view instance) {
  const std::string text = "say <go>" + std::string(instance);
  const std::string word = "<go>";
  std::vector<std::string> pieces;
  std::vector<int32_t> tokens;
  for (size_t at = 0; at < text.size() && pieces.size() < 256;) {
    const size_t n = std::min<size_t>(1 + (uint8_t(text[at]) & 3), text.size() - at);
    tokens.push_back(int32_t(pieces.size()));
    pieces.emplace_back(text.substr(at, n));
    at += n;
  }
  const TokenVocabulary vocabulary(pieces, {}, pieces.size());
  GrammarConstraint constraint(grammar, vocabulary, LazyTrigger{.word = word, .block_open = ""});
  std::string written;
  for (int32_t token : tokens) {
    const std::vector<uint64_t> bits = constraint.allowed();
    const size_t fired = written.find(word);
    for (size_t id = 0; id < vocabulary.n_vocab(); ++id) {
      const std::string candidate = written + vocabulary.bytes(int32_t(id));
      const size_t at = fired != std::string::npos ? fired : candidate.find(word);
      bool expected = true;
      if (at != std::string::npos) {
        Matcher reference(grammar);
        expected = reference.accept(std::string_view(candidate).substr(at + word.size()));
      }
      check(bit(bits, id) == expected);
    }
    if (!bit(bits, size_t(token))) return;  // the text leaves the grammar here
    constraint.accept(token);
    written += vocabulary.bytes(token);
    check(constraint.valid());
    check(constraint.triggered() == (written.find(word) != std::string::npos));
  }
}

bool matches(const Grammar& grammar, std::string_view text) {
  Matcher matcher(grammar);
  return matcher.accept(text) && matcher.accepting();
}

// The GBNF text's grammar, or nothing when the parser refuses it (checking how).
std::optional<Grammar> parse_checked(std::string_view text, std::string_view instance) {
  Grammar grammar;
  try {
    grammar = parse_gbnf(text);
  } catch (const GbnfError& error) {
    const size_t lines = size_t(std::count(text.begin(), text.end(), '\n')) + 1;
    check(error.line() >= 1 && error.line() <= lines && error.column() >= 1);
    check(!error.detail().empty());
    check(std::string_view(error.what()) == std::to_string(error.line()) + ":" +
                                                std::to_string(error.column()) + ": " +
                                                error.detail());
    return std::nullopt;
  }
  check(grammar.find_left_recursion() < 0);
  bool ascii = true;
  for (const ByteSet& set : grammar.byte_sets)
    for (int b = 0x80; b < 0x100 && ascii; ++b) ascii = !set.has(uint8_t(b));
  if (ascii) {
    const Grammar again = parse_gbnf(grammar.to_text());  // a GbnfError here escapes: a finding
    check(matches(again, instance) == matches(grammar, instance));
  }
  return grammar;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find('\x1e');
  const size_t gbnf_cut = input.find('\x1d');
  std::string_view instance = input;
  Grammar grammar;
  const bool from_gbnf = gbnf_cut != std::string_view::npos && gbnf_cut < cut;
  if (from_gbnf) {
    instance = input.substr(gbnf_cut + 1);
    std::optional<Grammar> parsed = parse_checked(input.substr(0, gbnf_cut), instance);
    if (!parsed) return 0;
    grammar = std::move(*parsed);
  } else if (cut == std::string_view::npos) {
    grammar = json_object_grammar();
  } else {
    instance = input.substr(cut + 1);
    const auto schema = nlohmann::ordered_json::parse(input.substr(0, cut), nullptr, false);
    if (schema.is_discarded()) return 0;
    try {
      grammar = compile_json_schema(schema);
    } catch (const SchemaError& error) {
      check(std::string_view(error.what()).find(error.path()) != std::string_view::npos);
      return 0;
    }
  }
  Matcher matcher(grammar);
  if (!from_gbnf && matcher.accept(instance) && matcher.accepting())
    check(!nlohmann::json::parse(instance, nullptr, false).is_discarded());
  check_mask(grammar, instance.substr(0, 512));
  check_lazy(grammar, instance.substr(0, 256));
  return 0;
}
