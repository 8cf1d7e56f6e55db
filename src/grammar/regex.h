// Regex — the parser of JSON Schema's `pattern` (ECMA-262 syntax) into a syntax tree, for the
// pattern compiler (grammar/pattern.h). Only the subset that describes a regular language of the
// string is accepted; the rest is refused, so that a pattern is never silently weakened.
//
// Accepted (characters are code points, as with ECMA-262's `u` flag):
// - literals; escapes \t \n \v \f \r \0 \cX \xHH \uHHHH (a surrogate pair \uD83D\uDE00 is one
//   character) \u{H..}; a backslash before any ASCII punctuation or non-ASCII character is that
//   character (\. \- \/ \" ...);
// - classes \d \w \s and their complements \D \W \S (ECMA-262's sets: \s includes U+00A0,
//   U+FEFF, the Unicode spaces); `.` (anything but \n \r U+2028 U+2029); [...] and [^...] with
//   ranges and the escapes above, [\b] (backspace), [] (nothing) and [^] (anything);
// - groups ( ), (?: ), (?<name> ); alternation |;
// - quantifiers * + ? {n} {n,} {n,m}, lazy or not (only the language matters); bounds up to
//   kMaxPatternRepeat; `{` that does not open a quantifier, and a lone `}` or `]`, are literals
//   (ECMA-262 Annex B);
// - ^ and $ anywhere (not multiline: the start and the end of the string).
// Refused with PatternError (saying what, and the offset in characters): backreferences (\1,
// \k<name>), lookahead and lookbehind ((?= (?! (?<= (?<!), word boundaries \b \B, Unicode
// property escapes \p{..} \P{..}, other (? forms (inline flags), escapes of letters or digits
// that ECMA-262 does not define, a quantifier with nothing to repeat, bounds above
// kMaxPatternRepeat or out of order, ranges that end before they start or use a class escape,
// unbalanced parentheses or brackets, groups nested deeper than kMaxPatternNesting, invalid
// UTF-8.
//
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "util/error.h"

namespace strata::grammar {

class PatternError : public Error {
 public:
  using Error::Error;
};

// The largest bound a quantifier may give ({n,m}): each unit of a bound is a copy of the
// repeated part in the automaton.
inline constexpr int64_t kMaxPatternRepeat = 1000;
inline constexpr int kMaxPatternNesting = 100;
inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Code points lo..hi, inclusive. A CharSet is sorted, disjoint and non-adjacent.
using CodeRange = std::pair<uint32_t, uint32_t>;
using CharSet = std::vector<CodeRange>;

// Sorts and merges overlapping and adjacent ranges.
CharSet normalized(CharSet set);
// Every code point 0..kMaxCodePoint not in `set` (a normalized set).
CharSet complement(const CharSet& set);

struct RegexNode {
  enum class Kind : uint8_t {
    Empty,      // matches the empty string
    Chars,      // one character of `chars`
    Concat,     // children in order
    Alternate,  // one of children
    Repeat,     // children[0], min..max times (max < 0: unbounded)
    LineStart,  // ^
    LineEnd,    // $
  };
  Kind kind = Kind::Empty;
  CharSet chars;
  std::vector<RegexNode> children;
  int64_t min = 0, max = 0;
};

// Throws PatternError.
RegexNode parse_regex(std::string_view pattern);

}  // namespace strata::grammar
