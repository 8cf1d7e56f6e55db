#include "grammar/gbnf.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "grammar/json_schema.h"  // kMaxRepeat, kMaxGrammarElements
#include "text/utf8.h"

namespace strata::grammar {

GbnfError::GbnfError(size_t line, size_t column, std::string detail)
    : Error(fmt::format("{}:{}: {}", line, column, detail)),
      line_(line),
      column_(column),
      detail_(std::move(detail)) {}

namespace {

using Item = GrammarBuilder::Item;
using Sequence = GrammarBuilder::Sequence;
using CodeRange = std::pair<uint32_t, uint32_t>;  // inclusive

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

bool is_continuation(uint8_t byte) {
  return (byte & 0xC0) == 0x80;
}

// The length of the well-formed UTF-8 character at text[at] (Unicode Table 3-7), 0 if none.
size_t utf8_length(std::string_view text, size_t at) {
  char32_t cp = 0;
  return utf8_sequence_at(text, at, cp);
}

std::string encode_utf8(uint32_t cp) {
  std::string out;
  append_utf8(out, char32_t(cp));
  return out;
}

// What a generated rule came from, for the left-recursion message.
struct RuleInfo {
  std::string name;
  size_t first_use = std::string_view::npos;   // offset of the first reference
  size_t defined_at = std::string_view::npos;  // offset of the definition (or the construct)
  bool defined = false;
  std::string construct;  // empty for a named rule; else "the group", "the repetition `*`", ...
  std::string parent;     // generated: the named rule it is part of
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}
  Grammar parse();

 private:
  bool eof() const { return at_ >= text_.size(); }
  bool at_char(char c) const { return !eof() && text_[at_] == c; }
  [[noreturn]] void fail_at(size_t offset, const std::string& detail) const;
  std::string found() const;  // the text at at_, for "found ..." in messages
  std::pair<size_t, size_t> line_column(size_t offset) const;  // 1-based, columns in characters
  std::string position(size_t offset) const;                   // "LINE:COLUMN"

  bool skip_space();   // blanks, comments, line breaks; whether a line break was crossed
  void skip_blanks();  // spaces and tabs only
  std::string_view read_name();
  bool rule_starts_here() const;  // `name ::=` at at_
  uint32_t rule_id(std::string_view name, size_t offset);
  uint32_t generated_rule(size_t offset, std::string construct);
  void record_generated(size_t offset, const std::string& construct);

  std::vector<Sequence> alternatives(int depth);
  Sequence sequence(int depth);
  Item string_literal();
  Item char_class();
  Item any_char();
  Item group(int depth);
  void postfix(Sequence& items, std::optional<size_t> last);
  uint32_t escape();
  int64_t bound();
  Item code_points(std::vector<CodeRange> ranges, size_t offset, const std::string& construct);

  std::string_view text_;
  size_t at_ = 0;
  GrammarBuilder builder_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::vector<RuleInfo> rules_;                     // by rule id, generated ones included
  std::string current_rule_;                        // the named rule being parsed
  size_t generated_count_ = 0;                      // rules generated within it, for their names
  std::vector<size_t> open_groups_;                 // offsets of the '(' being parsed
  std::map<std::vector<CodeRange>, Item> classes_;  // character classes compiled so far
};

std::pair<size_t, size_t> Parser::line_column(size_t offset) const {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text_.size(); ++i) {
    if (text_[i] == '\n') {
      ++line;
      column = 1;
    } else if (!is_continuation(uint8_t(text_[i]))) {
      ++column;
    }
  }
  return {line, column};
}

std::string Parser::position(size_t offset) const {
  const auto [line, column] = line_column(offset);
  return fmt::format("{}:{}", line, column);
}

void Parser::fail_at(size_t offset, const std::string& detail) const {
  const auto [line, column] = line_column(offset);
  throw GbnfError(line, column, detail);
}

std::string Parser::found() const {
  if (eof()) return "the end of the grammar";
  const char c = text_[at_];
  if (c == '\n' || c == '\r') return "the end of the line";
  if (uint8_t(c) < 0x20 || c == 0x7F) return fmt::format("the byte 0x{:02X}", uint8_t(c));
  const size_t n = std::max<size_t>(utf8_length(text_, at_), 1);
  return fmt::format("'{}'", text_.substr(at_, n));
}

bool Parser::skip_space() {
  bool line_break = false;
  while (!eof()) {
    const char c = text_[at_];
    if (c == ' ' || c == '\t' || c == '\r') {
      ++at_;
    } else if (c == '\n') {
      line_break = true;
      ++at_;
    } else if (c == '#') {
      while (!eof() && text_[at_] != '\n') ++at_;
    } else {
      break;
    }
  }
  return line_break;
}

void Parser::skip_blanks() {
  while (!eof() && (text_[at_] == ' ' || text_[at_] == '\t')) ++at_;
}

std::string_view Parser::read_name() {
  const size_t start = at_;
  while (!eof() && is_name_char(text_[at_])) ++at_;
  return text_.substr(start, at_ - start);
}

bool Parser::rule_starts_here() const {
  size_t i = at_;
  while (i < text_.size() && is_name_char(text_[i])) ++i;
  if (i == at_) return false;
  while (i < text_.size() && (text_[i] == ' ' || text_[i] == '\t')) ++i;
  return text_.substr(i, 3) == "::=";
}

uint32_t Parser::rule_id(std::string_view name, size_t offset) {
  const auto [it, inserted] = by_name_.try_emplace(std::string(name), 0);
  if (inserted) {
    it->second = builder_.declare(std::string(name));
    rules_.resize(builder_.n_rules());
    rules_[it->second].name = std::string(name);
    rules_[it->second].first_use = offset;
  }
  return it->second;
}

void Parser::record_generated(size_t offset, const std::string& construct) {
  for (size_t r = rules_.size(); r < builder_.n_rules(); ++r)
    rules_.push_back(
        {.defined_at = offset, .defined = true, .construct = construct, .parent = current_rule_});
}

uint32_t Parser::generated_rule(size_t offset, std::string construct) {
  const uint32_t id = builder_.declare(fmt::format("{}-{}", current_rule_, ++generated_count_));
  record_generated(offset, construct);
  return id;
}

Grammar Parser::parse() {
  for (size_t at = 0; at < text_.size();) {
    const size_t n = utf8_length(text_, at);
    if (n == 0) fail_at(at, fmt::format("invalid UTF-8 (byte 0x{:02X})", uint8_t(text_[at])));
    at += n;
  }
  for (;;) {
    skip_space();
    if (eof()) break;
    const size_t start = at_;
    if (!is_name_char(text_[at_]))
      fail_at(at_, fmt::format("expected a rule (name ::= ...), found {}", found()));
    const std::string name(read_name());
    skip_blanks();
    if (text_.substr(at_, 3) != "::=")
      fail_at(at_, fmt::format("expected '::=' after the rule name '{}', found {}", name, found()));
    at_ += 3;
    const uint32_t id = rule_id(name, start);
    if (rules_[id].defined)
      fail_at(start, fmt::format("rule '{}' is defined twice (first at {})", name,
                                 position(rules_[id].defined_at)));
    rules_[id].defined = true;
    rules_[id].defined_at = start;
    current_rule_ = name;
    generated_count_ = 0;
    const std::vector<Sequence> alternatives = this->alternatives(0);
    builder_.define(id, alternatives);
    if (builder_.n_elements() > kMaxGrammarElements)
      fail_at(start, fmt::format("the grammar is too large: more than {} elements by the end of "
                                 "rule '{}'",
                                 kMaxGrammarElements, name));
  }
  // Undefined rules, the first one used reported.
  const RuleInfo* undefined = nullptr;
  for (const RuleInfo& rule : rules_)
    if (!rule.defined && (!undefined || rule.first_use < undefined->first_use)) undefined = &rule;
  if (undefined)
    fail_at(undefined->first_use,
            fmt::format("undefined rule '{}' (no '{} ::= ...' in the grammar)", undefined->name,
                        undefined->name));
  const auto root = by_name_.find("root");
  if (root == by_name_.end())
    fail_at(0, "no rule named 'root': the grammar starts at 'root ::= ...'");
  Grammar grammar = builder_.finish(root->second);
  if (const int64_t cycle = grammar.find_left_recursion(); cycle >= 0) {
    const RuleInfo& rule = rules_[size_t(cycle)];
    const std::string what = rule.construct.empty()
                                 ? fmt::format("rule '{}'", rule.name)
                                 : fmt::format("{} in rule '{}'", rule.construct, rule.parent);
    fail_at(rule.defined_at,
            fmt::format("{} can reach itself without reading any input (left recursion, or a "
                        "repetition of something that can match nothing), which the matcher "
                        "cannot run; write it with a repetition, e.g. list ::= item (\",\" item)*",
                        what));
  }
  // Generated names ("root-1-star") made unique against the named rules.
  std::unordered_set<std::string> taken;
  for (const auto& [name, id] : by_name_) taken.insert(name);
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (rules_[r].construct.empty()) continue;
    std::string& name = grammar.rule_names[r];
    while (!taken.insert(name).second) name += "_";
  }
  return grammar;
}

std::vector<Sequence> Parser::alternatives(int depth) {
  std::vector<Sequence> out;
  out.push_back(sequence(depth));
  while (at_char('|')) {
    ++at_;
    out.push_back(sequence(depth));
  }
  return out;
}

Sequence Parser::sequence(int depth) {
  Sequence items;
  std::optional<size_t> last;  // the element a postfix applies to
  for (;;) {
    const bool line_break = skip_space();
    if (eof() || at_char('|')) break;
    const size_t start = at_;
    const char c = text_[at_];
    if (c == ')') {
      if (depth == 0) fail_at(at_, "unmatched ')': no group is open here");
      break;
    }
    if (is_name_char(c)) {
      if (rule_starts_here()) {
        const std::string_view name = read_name();
        if (depth > 0)
          fail_at(start, fmt::format("expected ')' to close the group opened at {}, found the "
                                     "next rule '{}'",
                                     position(open_groups_.back()), name));
        if (!line_break)
          fail_at(start, fmt::format("expected a line break before the next rule '{}'", name));
        at_ = start;
        break;
      }
      items.push_back(GrammarBuilder::rule(rule_id(read_name(), start)));
      last = items.size() - 1;
      continue;
    }
    switch (c) {
      case '"':
        items.push_back(string_literal());
        break;
      case '[':
        items.push_back(char_class());
        break;
      case '.':
        ++at_;
        items.push_back(any_char());
        break;
      case '(':
        items.push_back(group(depth));
        break;
      case '*':
      case '+':
      case '?':
      case '{':
        postfix(items, last);
        continue;
      default:
        fail_at(at_, fmt::format("expected a string, a character class, a rule name, '.', '(', "
                                 "'|' or a repetition, found {}",
                                 found()));
    }
    last = items.size() - 1;
  }
  return items;
}

Item Parser::string_literal() {
  const size_t start = at_++;
  std::string bytes;
  for (;;) {
    if (eof() || text_[at_] == '\n' || text_[at_] == '\r')
      fail_at(start, fmt::format("unterminated string: expected a closing '\"', found {} (write "
                                 "a line break as \\n)",
                                 found()));
    const char c = text_[at_];
    if (c == '"') {
      ++at_;
      break;
    }
    if (c == '\\') {
      bytes += encode_utf8(escape());
    } else {
      bytes.push_back(c);
      ++at_;
    }
  }
  return GrammarBuilder::literal(bytes);
}

uint32_t Parser::escape() {
  const size_t start = at_++;
  if (eof()) fail_at(start, "unterminated escape: '\\' at the end of the grammar");
  const char c = text_[at_++];
  size_t digits = 0;
  switch (c) {
    case 'n':
      return '\n';
    case 't':
      return '\t';
    case 'r':
      return '\r';
    case '\\':
    case '"':
    case '[':
    case ']':
      return uint8_t(c);
    case 'x':
      digits = 2;
      break;
    case 'u':
      digits = 4;
      break;
    case 'U':
      digits = 8;
      break;
    default: {
      const std::string shown =
          uint8_t(c) >= 0x80 ? std::string(text_.substr(at_ - 1, utf8_length(text_, at_ - 1)))
          : uint8_t(c) >= 0x20 && c != 0x7F ? std::string(1, c)
                                            : fmt::format("x{:02X}", uint8_t(c));
      fail_at(start, fmt::format("bad escape '\\{}': expected \\n, \\t, \\r, \\\\, \\\", \\[, "
                                 "\\], \\xHH, \\uHHHH or \\UHHHHHHHH",
                                 shown));
    }
  }
  uint64_t value = 0;
  for (size_t i = 0; i < digits; ++i) {
    const char h = eof() ? '\0' : text_[at_];
    int v = -1;
    if (h >= '0' && h <= '9') v = h - '0';
    if (h >= 'a' && h <= 'f') v = h - 'a' + 10;
    if (h >= 'A' && h <= 'F') v = h - 'A' + 10;
    if (v < 0)
      fail_at(start,
              fmt::format("bad escape: '\\{}' takes {} hex digits, found {}", c, digits, found()));
    value = value * 16 + uint64_t(v);
    ++at_;
  }
  if (value > kMaxCodePoint)
    fail_at(start, fmt::format("bad escape: U+{:X} is above U+10FFFF, the last code point", value));
  if (value >= 0xD800 && value <= 0xDFFF)
    fail_at(start, fmt::format("bad escape: U+{:X} is a surrogate, not a character", value));
  return uint32_t(value);
}

Item Parser::char_class() {
  const size_t start = at_++;
  const bool negated = at_char('^');
  if (negated) ++at_;
  std::vector<CodeRange> ranges;
  auto one = [&]() -> uint32_t {
    if (eof() || text_[at_] == '\n' || text_[at_] == '\r')
      fail_at(start, fmt::format("unterminated character class: expected ']', found {} (write a "
                                 "line break as \\n)",
                                 found()));
    if (text_[at_] == '\\') return escape();
    char32_t cp = 0;
    at_ += utf8_sequence_at(text_, at_, cp);  // the text is valid UTF-8 (checked first)
    return uint32_t(cp);
  };
  for (;;) {
    if (at_char(']')) {
      ++at_;
      break;
    }
    const size_t range_start = at_;
    const uint32_t lo = one();
    uint32_t hi = lo;
    if (at_char('-') && at_ + 1 < text_.size() && text_[at_ + 1] != ']') {
      ++at_;
      hi = one();
      if (hi < lo)
        fail_at(range_start, fmt::format("bad range in a character class: U+{:04X} to U+{:04X} "
                                         "ends before it starts",
                                         lo, hi));
    }
    ranges.push_back({lo, hi});
  }
  if (ranges.empty() && !negated)
    fail_at(start, "empty character class '[]': it matches nothing (write [^] for any character)");
  std::sort(ranges.begin(), ranges.end());
  std::vector<CodeRange> merged;
  for (const CodeRange& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  if (negated) {
    std::vector<CodeRange> complement;
    uint32_t next = 0;
    for (const CodeRange& r : merged) {
      if (r.first > next) complement.push_back({next, r.first - 1});
      next = r.second + 1;
    }
    if (next <= kMaxCodePoint) complement.push_back({next, kMaxCodePoint});
    merged = std::move(complement);
  }
  return code_points(std::move(merged), start, "the character class");
}

Item Parser::any_char() {
  return code_points({{0, kMaxCodePoint}}, at_ - 1, "'.'");
}

// The characters of `ranges` (sorted, disjoint) as one byte set when all are one byte long, else
// a rule: the one-byte ones as one alternative, each multi-byte sequence as another.
Item Parser::code_points(std::vector<CodeRange> ranges, size_t offset,
                         const std::string& construct) {
  if (const auto known = classes_.find(ranges); known != classes_.end()) return known->second;
  std::vector<Sequence> sequences;
  for (const CodeRange& r : ranges) GrammarBuilder::utf8_sequences(r.first, r.second, sequences);
  ByteSet single;
  std::vector<Sequence> alternatives;
  for (Sequence& s : sequences) {
    if (s.size() == 1)
      single.merge(s[0].bytes);
    else
      alternatives.push_back(std::move(s));
  }
  if (single.empty() && alternatives.empty())
    fail_at(offset, fmt::format("{} matches no character", construct));
  Item item = GrammarBuilder::bytes(single);
  if (!alternatives.empty()) {
    if (!single.empty()) alternatives.insert(alternatives.begin(), {GrammarBuilder::bytes(single)});
    const uint32_t id = generated_rule(offset, construct);
    builder_.define(id, alternatives);
    item = GrammarBuilder::rule(id);
  }
  classes_.emplace(std::move(ranges), item);
  return item;
}

Item Parser::group(int depth) {
  const size_t start = at_++;
  if (depth + 1 > kMaxGbnfNesting)
    fail_at(start, fmt::format("groups nested deeper than {} levels", kMaxGbnfNesting));
  open_groups_.push_back(start);
  const std::vector<Sequence> inner = alternatives(depth + 1);
  if (!at_char(')'))
    fail_at(start, fmt::format("unterminated group: expected ')' to close the '(' here, found {}",
                               found()));
  ++at_;
  open_groups_.pop_back();
  const uint32_t id = generated_rule(start, "the group");
  builder_.define(id, inner);
  return GrammarBuilder::rule(id);
}

int64_t Parser::bound() {
  const size_t start = at_;
  int64_t value = 0;
  while (!eof() && text_[at_] >= '0' && text_[at_] <= '9') {
    value = value * 10 + (text_[at_] - '0');
    if (value > kMaxRepeat)
      fail_at(start, fmt::format("bad repetition bound: at most {}", kMaxRepeat));
    ++at_;
  }
  return value;
}

void Parser::postfix(Sequence& items, std::optional<size_t> last) {
  const size_t start = at_;
  const char op = text_[at_++];
  if (!last)
    fail_at(start, fmt::format("'{}' must follow an element (a string, a class, a rule name, '.' "
                               "or a group)",
                               op));
  int64_t min = 0, max = -1;
  std::string spelled(1, op);
  if (op == '+') min = 1;
  if (op == '?') max = 1;
  if (op == '{') {
    skip_blanks();
    if (eof() || text_[at_] < '0' || text_[at_] > '9')
      fail_at(at_, fmt::format("bad repetition: expected a number after '{{' ({{m}}, {{m,}} or "
                               "{{m,n}}), found {}",
                               found()));
    min = max = bound();
    skip_blanks();
    if (at_char(',')) {
      ++at_;
      skip_blanks();
      max = -1;
      if (!eof() && text_[at_] >= '0' && text_[at_] <= '9') max = bound();
      skip_blanks();
    }
    if (!at_char('}'))
      fail_at(at_, fmt::format("bad repetition: expected '}}' or ',' ({{m}}, {{m,}} or {{m,n}}), "
                               "found {}",
                               found()));
    ++at_;
    spelled = std::string(text_.substr(start, at_ - start));
    if (max >= 0 && max < min)
      fail_at(start,
              fmt::format("bad repetition bounds {}: the maximum is below the minimum", spelled));
  }
  // The copies the builder writes (grammar/grammar.h repeat): refuse before building them.
  const Item& item = items[*last];
  const size_t item_elements = item.kind == Item::Kind::Literal ? item.literal.size() + 1 : 1;
  const size_t copies = size_t(min) + size_t(max < 0 ? 1 : max - min);
  if (builder_.n_elements() + (item_elements + 3) * copies > kMaxGrammarElements)
    fail_at(start, fmt::format("the repetition {} makes the grammar too large (more than {} "
                               "elements)",
                               spelled, kMaxGrammarElements));
  const uint32_t id =
      builder_.repeat(fmt::format("{}-{}", current_rule_, ++generated_count_), {item}, min, max);
  record_generated(start, fmt::format("the repetition '{}'", spelled));
  items[*last] = GrammarBuilder::rule(id);
}

}  // namespace

Grammar parse_gbnf(std::string_view text) {
  return Parser(text).parse();
}

}  // namespace strata::grammar
