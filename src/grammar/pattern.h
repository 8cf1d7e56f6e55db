// Pattern → grammar rule: the JSON-schema compiler's `pattern` (with minLength / maxLength) as
// the text between a JSON string's quotes (grammar/json_schema.h).
//
// The pattern (grammar/regex.h: ECMA-262 syntax, the regular subset) becomes a Thompson NFA,
// then a DFA by the subset construction, then one rule per DFA state: each alternative a
// character set spelled as JSON and a tail call to the next state, plus "" where the state
// accepts. So the matcher keeps a single stack of constant depth however long the string, and
// a state from which no accepting state is reachable is removed: every prefix the grammar allows
// can still be completed.
//
// Semantics are JSON Schema's: a pattern is not anchored, the string must contain a match
// (ECMA-262 RegExp.prototype.test; `^` and `$` anchor at the ends of the string, not of lines).
// minLength / maxLength (code points) are run alongside (a DFA state is a pair of NFA set and
// length so far), so both hold at once. Characters are code points, matched on the decoded
// string: each is spelled one way, itself in UTF-8 except `"` `\` and the controls, which take
// the short escapes \" \\ \b \f \n \r \t, else \u00XX (either hex case). Other valid spellings
// (\u0041 for A, \/) are not generated: the grammar is a subset of the valid instances, like
// the rest of the compiler's.
//
// Refused with PatternError (message without the keyword's path; the caller adds it): what
// parse_regex refuses, a pattern (with its bounds) that no string matches, and one whose
// automaton passes kMaxPatternNfaStates, kMaxPatternDfaStates or kMaxPatternWork steps of the
// construction (a bounded repetition of a wide class after an unanchored start is exponential:
// ".*a.{20}" needs 2^20 states), so a hostile schema costs bounded time and memory.
//
// Pure; thread-safe (the builder is the caller's).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/regex.h"

namespace strata::grammar {

inline constexpr size_t kMaxPatternNfaStates = 20000;
// A DFA state costs a rule of ~4 alternatives per distinct successor (~20 grammar elements, each
// with its 32-byte first set): 10,000 states stay within a few MiB of grammar.
inline constexpr size_t kMaxPatternDfaStates = 10000;
// Steps of the subset construction (closure visits, successor lists, key sorts and lookups).
// Measured (Release, the shared 2-core box at load 3-5): unanchored a{10000} reaches the limit
// in ~0.1 s, the most a hostile pattern costs; a.{12}$ (8,200 states, near the state limit) takes
// ~0.07 s; unanchored .{1000} compiles, unanchored a{2000} does not.
inline constexpr size_t kMaxPatternWork = 10'000'000;

// The rule for the content of a JSON string (without its quotes) whose decoded text contains a
// match of `pattern` and is min_length..max_length code points long (max_length < 0: no upper
// bound). Rules are named after `name`. Throws PatternError.
uint32_t add_pattern_rule(GrammarBuilder& builder, std::string_view pattern, int64_t min_length,
                          int64_t max_length, const std::string& name);

}  // namespace strata::grammar
