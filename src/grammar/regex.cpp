#include "grammar/regex.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "text/utf8.h"

namespace strata::grammar {

CharSet normalized(CharSet set) {
  std::sort(set.begin(), set.end());
  CharSet merged;
  for (const CodeRange& r : set) {
    if (!merged.empty() && r.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  return merged;
}

CharSet complement(const CharSet& set) {
  CharSet out;
  uint32_t next = 0;
  for (const CodeRange& r : set) {
    if (r.first > next) out.push_back({next, r.first - 1});
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

namespace {

using Node = RegexNode;

// ECMA-262's \d, \w and \s (WhiteSpace and LineTerminator).
const CharSet kDigits = {{'0', '9'}};
const CharSet kWordChars = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CharSet kSpaces = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                         {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                         {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
// `.`: anything but a line terminator.
const CharSet kDot = {{0, 0x09}, {0x0B, 0x0C}, {0x0E, 0x2027}, {0x202A, kMaxCodePoint}};

Node chars(CharSet set) {
  Node node;
  node.kind = Node::Kind::Chars;
  node.chars = std::move(set);
  return node;
}

int hex_value(uint32_t c) {
  if (c >= '0' && c <= '9') return int(c - '0');
  if (c >= 'a' && c <= 'f') return int(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return int(c - 'A' + 10);
  return -1;
}

bool is_ascii_alnum(uint32_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

class Parser {
 public:
  explicit Parser(std::string_view pattern) {
    for (size_t at = 0; at < pattern.size();) {
      char32_t cp = 0;
      const size_t n = utf8_sequence_at(pattern, at, cp);
      if (n == 0) throw PatternError(fmt::format("invalid UTF-8 at byte {} of the pattern", at));
      text_.push_back(uint32_t(cp));
      at += n;
    }
  }

  Node parse() {
    Node node = disjunction(0);
    if (at_ < text_.size())  // only a ')' stops a disjunction early
      fail(at_, "unbalanced ')': no '(' opens it");
    return node;
  }

 private:
  // An escape, or a character of a class: its characters, and whether it was a class escape
  // (\d ...), which cannot end a range.
  struct ClassAtom {
    CharSet set;
    bool is_class = false;
  };

  [[noreturn]] void fail(size_t offset, const std::string& what) const {
    throw PatternError(fmt::format("{} (at offset {} of the pattern)", what, offset));
  }
  [[noreturn]] void unsupported(size_t offset, const std::string& what) const {
    throw PatternError(
        fmt::format("{} at offset {} of the pattern is not supported (the "
                    "supported subset: docs/serve.md, Structured output)",
                    what, offset));
  }
  bool at(uint32_t c) const { return at_ < text_.size() && text_[at_] == c; }

  Node disjunction(int depth) {
    std::vector<Node> options = {alternative(depth)};
    while (at('|')) {
      ++at_;
      options.push_back(alternative(depth));
    }
    if (options.size() == 1) return std::move(options[0]);
    Node node;
    node.kind = Node::Kind::Alternate;
    node.children = std::move(options);
    return node;
  }

  Node alternative(int depth) {
    Node node;
    node.kind = Node::Kind::Concat;
    while (at_ < text_.size() && !at('|') && !at(')')) {
      const bool assertion = at('^') || at('$');
      Node term = atom(depth);
      int64_t min = 0, max = 0;
      const size_t quantifier_at = at_;
      if (quantifier(min, max)) {
        if (assertion) fail(quantifier_at, "nothing to repeat: a quantifier after ^ or $");
        if (at('?')) ++at_;  // lazy: the same language
        const size_t again_at = at_;
        int64_t again_min = 0, again_max = 0;
        if (quantifier(again_min, again_max))
          fail(again_at, "nothing to repeat: a quantifier after a quantifier");
        Node repeat;
        repeat.kind = Node::Kind::Repeat;
        repeat.min = min;
        repeat.max = max;
        repeat.children.push_back(std::move(term));
        term = std::move(repeat);
      }
      node.children.push_back(std::move(term));
    }
    if (node.children.size() == 1) return std::move(node.children[0]);
    if (node.children.empty()) node.kind = Node::Kind::Empty;
    return node;
  }

  // Reads * + ? {n} {n,} {n,m} at at_ into min, max (max < 0: unbounded); false (nothing read)
  // when there is none, a `{` that opens no quantifier included.
  bool quantifier(int64_t& min, int64_t& max) {
    if (at_ >= text_.size()) return false;
    const uint32_t c = text_[at_];
    if (c == '*' || c == '+' || c == '?') {
      ++at_;
      min = c == '+' ? 1 : 0;
      max = c == '?' ? 1 : -1;
      return true;
    }
    if (c != '{') return false;
    size_t at = at_ + 1;
    auto number = [&](int64_t& value) {
      const size_t first = at;
      value = 0;
      for (; at < text_.size() && text_[at] >= '0' && text_[at] <= '9'; ++at)
        value = std::min<int64_t>(value * 10 + int64_t(text_[at] - '0'), 1'000'000'000);
      return at > first;
    };
    if (!number(min)) {
      // Python reads {,n} as {0,n}, ECMA-262 as the text "{,n}": refused rather than guessed.
      if (at < text_.size() && text_[at] == ',') {
        ++at;
        int64_t bound = 0;
        if (number(bound) && at < text_.size() && text_[at] == '}')
          fail(at_,
               fmt::format("{{,{}}} is no quantifier in ECMA-262 (write {{0,{}}})", bound, bound));
      }
      return false;
    }
    max = min;
    if (at < text_.size() && text_[at] == ',') {
      ++at;
      if (!number(max)) max = -1;
    }
    if (at >= text_.size() || text_[at] != '}') return false;
    const size_t start = at_;
    at_ = at + 1;
    std::string written;  // as typed: braces, digits, a comma
    for (size_t i = start; i < at_; ++i) written.push_back(char(text_[i]));
    if (max >= 0 && max < min) fail(start, fmt::format("{}: the bounds are out of order", written));
    if (std::max(min, max) > kMaxPatternRepeat)
      fail(start, fmt::format("{}: a repetition bound above {} is not supported (each unit of "
                              "a bound is a copy in the automaton)",
                              written, kMaxPatternRepeat));
    return true;
  }

  Node atom(int depth) {
    const size_t start = at_;
    const uint32_t c = text_[at_++];
    switch (c) {
      case '^':
      case '$': {
        Node node;
        node.kind = c == '^' ? Node::Kind::LineStart : Node::Kind::LineEnd;
        return node;
      }
      case '.':
        return chars(kDot);
      case '[':
        return chars(char_class(start));
      case '(':
        return group(start, depth);
      case '\\': {
        ClassAtom escaped = escape(start, false);
        return chars(std::move(escaped.set));
      }
      case '*':
      case '+':
      case '?':
        fail(start, fmt::format("nothing to repeat: '{}' follows no character or group", char(c)));
      case '{': {
        --at_;
        int64_t min = 0, max = 0;
        if (quantifier(min, max))
          fail(start, "nothing to repeat: '{' follows no character or group");
        ++at_;
        return chars({{c, c}});
      }
      default:
        return chars({{c, c}});
    }
  }

  Node group(size_t start, int depth) {
    if (depth + 1 > kMaxPatternNesting)
      fail(start, fmt::format("groups nested deeper than {} levels", kMaxPatternNesting));
    if (at('?')) {
      const uint32_t kind = at_ + 1 < text_.size() ? text_[at_ + 1] : 0;
      const uint32_t after = at_ + 2 < text_.size() ? text_[at_ + 2] : 0;
      if (kind == '=') unsupported(start, "lookahead (?=");
      if (kind == '!') unsupported(start, "negative lookahead (?!");
      if (kind == '<' && after == '=') unsupported(start, "lookbehind (?<=");
      if (kind == '<' && after == '!') unsupported(start, "negative lookbehind (?<!");
      if (kind == ':') {
        at_ += 2;
      } else if (kind == '<') {  // a named group: the name does not change the language
        at_ += 2;
        while (at_ < text_.size() && text_[at_] != '>') ++at_;
        if (at_ >= text_.size()) fail(start, "unterminated group name: expected '>'");
        ++at_;
      } else {
        unsupported(start, "the group form \"(?" +
                               (kind ? std::string(1, char(kind < 0x80 ? kind : '?')) : "") +
                               "\" (inline flags are not ECMA-262)");
      }
    }
    Node inner = disjunction(depth + 1);
    if (!at(')')) fail(start, "unterminated group: no ')' closes this '('");
    ++at_;
    return inner;
  }

  CharSet char_class(size_t start) {
    const bool negated = at('^');
    if (negated) ++at_;
    CharSet set;
    auto one = [&]() -> ClassAtom {
      const size_t atom_start = at_;
      const uint32_t c = text_[at_++];
      if (c == '\\') return escape(atom_start, true);
      return {{{c, c}}, false};
    };
    for (;;) {
      if (at_ >= text_.size()) fail(start, "unterminated character class: no ']' closes this '['");
      if (at(']')) {
        ++at_;
        break;
      }
      const size_t range_start = at_;
      ClassAtom first = one();
      if (at('-') && at_ + 1 < text_.size() && text_[at_ + 1] != ']') {
        ++at_;
        ClassAtom last = one();
        if (first.is_class || last.is_class)
          fail(range_start,
               "a range in a class cannot start or end with a class escape (\\d, "
               "\\w, \\s ...): write '-' first or last to mean the character");
        const uint32_t lo = first.set[0].first, hi = last.set[0].first;
        if (hi < lo)
          fail(range_start, fmt::format("character range U+{:04X}-U+{:04X} ends before it "
                                        "starts",
                                        lo, hi));
        set.push_back({lo, hi});
      } else {
        set.insert(set.end(), first.set.begin(), first.set.end());
      }
    }
    set = normalized(std::move(set));
    return negated ? complement(set) : set;
  }

  // The escape whose backslash is at `start` (at_ is past it).
  ClassAtom escape(size_t start, bool in_class) {
    if (at_ >= text_.size()) fail(start, "the pattern ends with a lone backslash");
    const uint32_t c = text_[at_++];
    auto single = [](uint32_t cp) { return ClassAtom{{{cp, cp}}, false}; };
    switch (c) {
      case 'd':
        return {kDigits, true};
      case 'D':
        return {complement(kDigits), true};
      case 'w':
        return {kWordChars, true};
      case 'W':
        return {complement(kWordChars), true};
      case 's':
        return {kSpaces, true};
      case 'S':
        return {complement(kSpaces), true};
      case 'b':
        if (in_class) return single(0x08);
        unsupported(start, "the word boundary \\b");
      case 'B':
        unsupported(start, "the word boundary \\B");
      case 'p':
      case 'P':
        unsupported(start, fmt::format("the Unicode property escape \\{}{{...}}", char(c)));
      case 'k':
        unsupported(start, "the named backreference \\k<...>");
      case 't':
        return single('\t');
      case 'n':
        return single('\n');
      case 'v':
        return single('\v');
      case 'f':
        return single('\f');
      case 'r':
        return single('\r');
      case '0':
        if (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9')
          unsupported(start, "the octal escape \\0" + std::string(1, char(text_[at_])));
        return single(0);
      case 'c':
        if (at_ < text_.size() && text_[at_] < 0x80 && std::isalpha(int(text_[at_])))
          return single(text_[at_++] % 32);
        fail(start, "\\c must be followed by a letter (a control character)");
      case 'x': {
        const int hi = at_ < text_.size() ? hex_value(text_[at_]) : -1;
        const int lo = at_ + 1 < text_.size() ? hex_value(text_[at_ + 1]) : -1;
        if (hi < 0 || lo < 0) fail(start, "\\x must be followed by two hex digits");
        at_ += 2;
        return single(uint32_t(hi * 16 + lo));
      }
      case 'u':
        return single(unicode_escape(start));
      default:
        break;
    }
    if (c >= '1' && c <= '9') unsupported(start, fmt::format("the backreference \\{}", char(c)));
    if (is_ascii_alnum(c))
      fail(start, fmt::format("unknown escape \\{} (ECMA-262 defines none; write the letter "
                              "without a backslash)",
                              char(c)));
    return single(c);  // \. \- \/ \" ...: the character itself
  }

  // \uHHHH (a high surrogate followed by \uLOW is one character) or \u{H...}, after the 'u'.
  uint32_t unicode_escape(size_t start) {
    auto four = [&](size_t at, uint32_t& value) {
      value = 0;
      for (size_t i = 0; i < 4; ++i) {
        const int digit = at + i < text_.size() ? hex_value(text_[at + i]) : -1;
        if (digit < 0) return false;
        value = value * 16 + uint32_t(digit);
      }
      return true;
    };
    uint32_t value = 0;
    if (at('{')) {
      ++at_;
      const size_t first = at_;
      for (; at_ < text_.size() && hex_value(text_[at_]) >= 0; ++at_)
        value = std::min<uint32_t>(value * 16 + uint32_t(hex_value(text_[at_])), 0x110000);
      if (at_ == first || !at('}')) fail(start, "\\u{ must hold hex digits and end with '}'");
      ++at_;
      if (value > kMaxCodePoint) fail(start, "\\u{...} is above U+10FFFF, the last code point");
      return value;
    }
    if (!four(at_, value)) fail(start, "\\u must be followed by four hex digits (or {...})");
    at_ += 4;
    uint32_t low = 0;
    if (value >= 0xD800 && value <= 0xDBFF && at_ + 1 < text_.size() && text_[at_] == '\\' &&
        text_[at_ + 1] == 'u' && four(at_ + 2, low) && low >= 0xDC00 && low <= 0xDFFF) {
      at_ += 6;
      return 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00);
    }
    return value;  // a lone surrogate: no string can hold it (the compiler finds no match)
  }

  std::vector<uint32_t> text_;
  size_t at_ = 0;
};

}  // namespace

RegexNode parse_regex(std::string_view pattern) {
  return Parser(pattern).parse();
}

}  // namespace strata::grammar
