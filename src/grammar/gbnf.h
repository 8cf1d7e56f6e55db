// GBNF text → Grammar: the parser behind `strata run --grammar FILE`, `strata chat --grammar FILE`
// and the serve request field `grammar` (llama-server's name and format; docs/serve.md
// "Structured output").
//
// The format is llama.cpp's GBNF (grammars/README.md there):
//   root   ::= answer ", " [0-9]{3}          # a rule: name ::= alternatives
//   answer ::= "yes" | "no"                  # alternatives, each a sequence
//   item   ::= ( [a-z]+ "." ? )* [^\n]?  .   # groups, * + ?, classes, negated classes, any char
//   rep    ::= "ab"{2} "c"{1,} "d"{0,3}      # counted repetition {m} {m,} {m,n}
// - Names: letters, digits, '-' and '_'. Rules may be used before they are defined. The start
//   rule is `root`.
// - Strings "..." and classes [...] take the escapes \n \t \r \\ \" \[ \] \xHH \uHHHH
//   \UHHHHHHHH, each a code point (as in llama.cpp: "\xE9" is é, two bytes in UTF-8); other
//   characters stand for themselves. A class holds characters and ranges a-z; [^...] is every
//   character not listed; `.` is any character. A raw line break inside a string or a class is
//   an error (write \n).
// - `#` starts a comment to the end of the line. A rule may span lines: it ends where the next
//   line starts another rule (`name ::=`) or at the end of the text. (llama.cpp ends a rule at
//   a line break outside parentheses: the layouts it reads read the same here. It also takes a
//   raw line break inside a string as a character and a rule defined twice as its last
//   definition; both are errors here.)
// - A postfix (* + ? {..}) applies to the element before it (a whole string, class, name, `.` or
//   group); postfixes may be stacked.
//
// Characters are code points; the grammar the parser returns spells each as its UTF-8 bytes
// (grammar/grammar.h: the matcher never decodes). `.` and negated classes match well-formed
// UTF-8 only (no surrogates, overlongs or code points above U+10FFFF).
//
// Refused with GbnfError (line and column of the fault, 1-based, columns in characters): bad
// syntax (saying what was expected and what was found), an unterminated string, class or group,
// a bad escape or code point, an empty class [], a range that ends before it starts, repetition
// bounds with max < min or above kMaxRepeat, a rule defined twice, an undefined rule (at its
// first use), no `root` rule, invalid UTF-8, groups nested deeper than kMaxGbnfNesting, a
// grammar above kMaxGrammarElements, and left recursion (a rule that can reach itself without
// reading a byte — `expr ::= expr "+" term`, or a repetition of something that can match
// nothing — which the matcher cannot run: write it as repetition, `expr ::= term ("+" term)*`).
//
// Pure; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "util/error.h"

namespace strata::grammar {

// what() is "LINE:COLUMN: DETAIL" (a file name in front gives the compiler-style location).
class GbnfError : public Error {
 public:
  GbnfError(size_t line, size_t column, std::string detail);
  size_t line() const { return line_; }
  size_t column() const { return column_; }
  const std::string& detail() const { return detail_; }

 private:
  size_t line_;
  size_t column_;
  std::string detail_;
};

// Groups ( ... ) nested deeper than this are refused (the parser recurses per level).
inline constexpr int kMaxGbnfNesting = 128;

// Throws GbnfError.
Grammar parse_gbnf(std::string_view text);

}  // namespace strata::grammar
