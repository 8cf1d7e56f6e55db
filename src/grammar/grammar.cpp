#include "grammar/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <stdexcept>

#include "text/utf8.h"

namespace strata::grammar {
namespace {

std::string render_byte_set(const ByteSet& set) {
  auto show = [](std::string& out, int b) {
    if (b >= 0x21 && b < 0x7F && b != ']' && b != '\\' && b != '-') {
      out.push_back(char(b));
    } else {
      out.append(fmt::format("\\x{:02X}", b));
    }
  };
  std::string out(1, '[');
  for (int b = 0; b < 256;) {
    if (!set.has(uint8_t(b))) {
      ++b;
      continue;
    }
    int last = b;
    while (last + 1 < 256 && set.has(uint8_t(last + 1))) ++last;
    show(out, b);
    if (last > b) {
      out.push_back('-');
      show(out, last);
    }
    b = last + 1;
  }
  out.push_back(']');
  return out;
}

}  // namespace

std::string Grammar::to_text() const {
  std::string out;
  for (size_t r = 0; r < rules.size(); ++r) {
    out += fmt::format("{} ::=", rule_names[r]);
    for (size_t a = 0; a < rules[r].size(); ++a) {
      if (a > 0) out += " |";
      uint32_t pos = rules[r][a];
      if (elements[pos].kind == Element::Kind::End) out += " \"\"";
      for (; elements[pos].kind != Element::Kind::End; ++pos) {
        const Element& e = elements[pos];
        out += " ";
        out += e.kind == Element::Kind::Rule ? rule_names[e.value]
                                             : render_byte_set(byte_sets[e.value]);
      }
    }
    out += "\n";
  }
  return out;
}

int64_t Grammar::find_left_recursion() const {
  // Nullable rules: some alternative can match nothing (GrammarBuilder::finish computed it).
  std::vector<bool> nullable_rule(rules.size(), false);
  for (size_t r = 0; r < rules.size(); ++r)
    for (uint32_t pos : rules[r]) nullable_rule[r] = nullable_rule[r] || nullable[pos];
  // Left edges: r -> s when s can come first in an alternative of r.
  std::vector<std::vector<uint32_t>> left(rules.size());
  for (size_t r = 0; r < rules.size(); ++r)
    for (uint32_t pos : rules[r])
      for (; elements[pos].kind == Element::Kind::Rule; ++pos) {
        left[r].push_back(elements[pos].value);
        if (!nullable_rule[elements[pos].value]) break;
      }
  // Iterative DFS for a cycle (schemas can make thousands of rules: no recursion).
  enum : uint8_t { kNew, kOpen, kDone };
  std::vector<uint8_t> color(rules.size(), kNew);
  std::vector<std::pair<uint32_t, size_t>> path;
  for (size_t start = 0; start < rules.size(); ++start) {
    if (color[start] != kNew) continue;
    path.push_back({uint32_t(start), 0});
    color[start] = kOpen;
    while (!path.empty()) {
      auto& [rule, next] = path.back();
      if (next == left[rule].size()) {
        color[rule] = kDone;
        path.pop_back();
        continue;
      }
      const uint32_t target = left[rule][next++];
      if (color[target] == kOpen) return target;
      if (color[target] == kNew) {
        color[target] = kOpen;
        path.push_back({target, 0});
      }
    }
  }
  return -1;
}

uint32_t GrammarBuilder::declare(std::string name) {
  grammar_.rules.emplace_back();
  grammar_.rule_names.push_back(std::move(name));
  defined_.push_back(false);
  return uint32_t(grammar_.rules.size() - 1);
}

uint32_t GrammarBuilder::byte_set_index(const ByteSet& set) {
  // Few distinct sets exist (JSON's classes); a linear search keeps them shared.
  for (size_t i = 0; i < grammar_.byte_sets.size(); ++i)
    if (grammar_.byte_sets[i] == set) return uint32_t(i);
  grammar_.byte_sets.push_back(set);
  return uint32_t(grammar_.byte_sets.size() - 1);
}

void GrammarBuilder::define(uint32_t rule, const std::vector<Sequence>& alternatives) {
  if (rule >= defined_.size() || defined_[rule])
    throw std::logic_error("GrammarBuilder::define: rule undeclared or defined twice");
  defined_[rule] = true;
  for (const Sequence& sequence : alternatives) {
    grammar_.rules[rule].push_back(uint32_t(grammar_.elements.size()));
    for (const Item& item : sequence) {
      switch (item.kind) {
        case Item::Kind::Bytes:
          grammar_.elements.push_back({Element::Kind::Bytes, byte_set_index(item.bytes)});
          break;
        case Item::Kind::Literal:
          for (char c : item.literal) {
            ByteSet set;
            set.add(uint8_t(c));
            grammar_.elements.push_back({Element::Kind::Bytes, byte_set_index(set)});
          }
          break;
        case Item::Kind::Rule:
          grammar_.elements.push_back({Element::Kind::Rule, item.rule});
          break;
      }
    }
    grammar_.elements.push_back({Element::Kind::End, 0});
  }
}

uint32_t GrammarBuilder::repeat(std::string name, const Sequence& item, int64_t min, int64_t max) {
  Sequence head;
  for (int64_t i = 0; i < min; ++i) head.insert(head.end(), item.begin(), item.end());
  if (max < 0) {
    // star ::= item star | ""  (right recursion: the matcher's tail call keeps the stack flat)
    const uint32_t star = declare(name + "-star");
    Sequence again = item;
    again.push_back(rule(star));
    define(star, {again, {}});
    head.push_back(rule(star));
  } else if (max > min) {
    // opt_k ::= item opt_{k-1} | ""  for k = 1 .. max - min
    uint32_t previous = 0;
    for (int64_t k = 1; k <= max - min; ++k) {
      const uint32_t opt = declare(fmt::format("{}-opt{}", name, k));
      Sequence more = item;
      if (k > 1) more.push_back(rule(previous));
      define(opt, {more, {}});
      previous = opt;
    }
    head.push_back(rule(previous));
  }
  return add(std::move(name), {head});
}

uint32_t GrammarBuilder::separated(std::string name, const Sequence& item,
                                   const Sequence& separator, int64_t min, int64_t max) {
  Sequence more = separator;
  more.insert(more.end(), item.begin(), item.end());
  const uint32_t rest =
      repeat(name + "-rest", more, std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
  Sequence first = item;
  first.push_back(rule(rest));
  return add(std::move(name), {first});
}

std::vector<std::pair<ByteSet, GrammarBuilder::Sequence>> GrammarBuilder::utf8_char_forms(
    const ByteSet& ascii) {
  auto bytes = [](uint8_t a, uint8_t b) {
    ByteSet set;
    set.add_range(a, b);
    return set;
  };
  const Item tail = range(0x80, 0xBF);
  return {{ascii, {}},
          {bytes(0xC2, 0xDF), {tail}},
          {bytes(0xE0, 0xE0), {range(0xA0, 0xBF), tail}},
          {bytes(0xE1, 0xEC), {tail, tail}},
          {bytes(0xED, 0xED), {range(0x80, 0x9F), tail}},
          {bytes(0xEE, 0xEF), {tail, tail}},
          {bytes(0xF0, 0xF0), {range(0x90, 0xBF), tail, tail}},
          {bytes(0xF1, 0xF3), {tail, tail, tail}},
          {bytes(0xF4, 0xF4), {range(0x80, 0x8F), tail, tail}}};
}

void GrammarBuilder::utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Sequence>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= max && max < hi) {
      utf8_sequences(lo, max, out);
      utf8_sequences(max + 1, hi, out);
      return;
    }
  if (hi >= 0x80) {
    for (uint32_t i = 1; i < 4; ++i) {
      const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
      if ((lo & ~m) == (hi & ~m)) continue;
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string first, last;
  append_utf8(first, char32_t(lo));
  append_utf8(last, char32_t(hi));
  Sequence sequence;
  for (size_t i = 0; i < first.size(); ++i)
    sequence.push_back(range(uint8_t(first[i]), uint8_t(last[i])));
  out.push_back(std::move(sequence));
}

uint32_t GrammarBuilder::text_until(std::string name, std::string_view terminator,
                                    const std::vector<std::string>& forbidden) {
  std::vector<std::string_view> patterns = {terminator};
  patterns.insert(patterns.end(), forbidden.begin(), forbidden.end());
  for (std::string_view pattern : patterns)
    if (pattern.empty() ||
        std::any_of(pattern.begin(), pattern.end(), [](char c) { return uint8_t(c) >= 0x80; }))
      throw std::logic_error("GrammarBuilder::text_until: strings must be ASCII and non-empty");
  // The trie of the strings; `ends` of a node: the terminator ends there (1) or a forbidden
  // string does (2), through its suffix links; the terminator wins (a forbidden string that is a
  // suffix of it, "</parameter>" of "\n</parameter>", is its end, not a violation).
  struct Node {
    std::array<int32_t, 128> next;
    int32_t link = 0;
    uint8_t ends = 0;
  };
  std::vector<Node> nodes(1);
  nodes[0].next.fill(-1);
  for (size_t p = 0; p < patterns.size(); ++p) {
    size_t at = 0;
    for (char c : patterns[p]) {
      if (nodes[at].next[size_t(c)] < 0) {
        nodes[at].next[size_t(c)] = int32_t(nodes.size());
        nodes.push_back({});
        nodes.back().next.fill(-1);
      }
      at = size_t(nodes[at].next[size_t(c)]);
    }
    const uint8_t end = p == 0 ? 1 : 2;
    if (nodes[at].ends == 0 || end < nodes[at].ends) nodes[at].ends = end;
  }
  // Breadth first: suffix links, inherited ends, and the full transition table (goto + fail).
  std::vector<size_t> order = {0};
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t u = order[i];
    for (size_t c = 0; c < 128; ++c) {
      const int32_t v = nodes[u].next[c];
      if (v < 0) {
        nodes[u].next[c] = u == 0 ? 0 : nodes[size_t(nodes[u].link)].next[c];
        continue;
      }
      const int32_t link = u == 0 ? 0 : nodes[size_t(nodes[u].link)].next[c];
      nodes[size_t(v)].link = link;
      const uint8_t inherited = nodes[size_t(link)].ends;
      if (inherited != 0 && (nodes[size_t(v)].ends == 0 || inherited < nodes[size_t(v)].ends))
        nodes[size_t(v)].ends = inherited;
      order.push_back(size_t(v));
    }
  }
  ByteSet text_ascii;
  text_ascii.add_range(0x20, 0x7E);
  text_ascii.add('\t');
  text_ascii.add('\n');
  text_ascii.add('\r');
  const std::vector<std::pair<ByteSet, Sequence>> forms = utf8_char_forms(ByteSet());
  std::vector<uint32_t> rules(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) rules[i] = declare(fmt::format("{}-s{}", name, i));
  for (size_t i = 0; i < nodes.size(); ++i) {
    // Bytes grouped by the state they lead to; the terminator's end closes the text.
    std::vector<ByteSet> to(nodes.size());
    ByteSet done;
    for (int c = 0; c < 128; ++c) {
      if (!text_ascii.has(uint8_t(c))) continue;
      const size_t target = size_t(nodes[i].next[size_t(c)]);
      if (nodes[target].ends == 1) {
        done.add(uint8_t(c));
      } else if (nodes[target].ends == 0) {
        to[target].add(uint8_t(c));
      }
    }
    std::vector<Sequence> alternatives;
    if (!done.empty()) alternatives.push_back({bytes(done)});
    for (size_t target = 0; target < nodes.size(); ++target)
      if (!to[target].empty()) alternatives.push_back({bytes(to[target]), rule(rules[target])});
    // A multi-byte character matches no (ASCII) string: back to the root.
    for (size_t f = 1; f < forms.size(); ++f) {
      Sequence form = {bytes(forms[f].first)};
      form.insert(form.end(), forms[f].second.begin(), forms[f].second.end());
      form.push_back(rule(rules[0]));
      alternatives.push_back(std::move(form));
    }
    define(rules[i], alternatives);
  }
  return add(std::move(name), {{rule(rules[0])}});
}

Grammar GrammarBuilder::finish(uint32_t root) {
  for (size_t r = 0; r < defined_.size(); ++r)
    if (!defined_[r])
      throw std::logic_error("GrammarBuilder::finish: rule " + grammar_.rule_names[r] +
                             " declared but never defined");
  grammar_.root = root;
  // first / nullable of every suffix, to a fixpoint (rules refer to each other, recursively).
  // A worklist of alternatives, each walked from its end backwards; when a rule's sets grow, the
  // alternatives that refer to it are walked again. Seeded in the order the alternatives were
  // defined: the builder defines a rule after the rules it uses (repeat chains of 10,000 rules),
  // so that settles all but recursion at once; a GBNF grammar's rules come in any order (a
  // chain written top-down would otherwise cost a pass over every alternative per rule).
  const std::vector<Element>& elements = grammar_.elements;
  std::vector<ByteSet>& first = grammar_.first;
  std::vector<uint8_t>& nullable = grammar_.nullable;
  first.assign(elements.size(), ByteSet());
  nullable.assign(elements.size(), 0);
  std::vector<std::pair<uint32_t, uint32_t>> alternatives;  // (start, rule)
  for (size_t r = 0; r < grammar_.rules.size(); ++r)
    for (uint32_t start : grammar_.rules[r]) alternatives.push_back({start, uint32_t(r)});
  std::sort(alternatives.begin(), alternatives.end());
  std::vector<std::vector<uint32_t>> users(grammar_.rules.size());  // rule -> alternatives
  for (size_t a = 0; a < alternatives.size(); ++a)
    for (uint32_t p = alternatives[a].first; elements[p].kind != Element::Kind::End; ++p)
      if (elements[p].kind == Element::Kind::Rule &&
          (users[elements[p].value].empty() || users[elements[p].value].back() != a))
        users[elements[p].value].push_back(uint32_t(a));
  std::vector<ByteSet> rule_first(grammar_.rules.size());
  std::vector<uint8_t> rule_nullable(grammar_.rules.size(), 0);
  std::deque<uint32_t> pending(alternatives.size());
  for (size_t a = 0; a < alternatives.size(); ++a) pending[a] = uint32_t(a);
  std::vector<uint8_t> queued(alternatives.size(), 1);
  while (!pending.empty()) {
    const uint32_t a = pending.front();
    pending.pop_front();
    queued[a] = 0;
    const auto [start, rule] = alternatives[a];
    uint32_t end = start;
    while (elements[end].kind != Element::Kind::End) ++end;
    nullable[end] = 1;
    for (uint32_t p = end; p-- > start;) {
      const Element& e = elements[p];
      ByteSet set;
      bool can_skip = false;
      if (e.kind == Element::Kind::Bytes) {
        set = grammar_.byte_sets[e.value];
      } else {
        set = rule_first[e.value];
        can_skip = rule_nullable[e.value];
      }
      if (can_skip) set.merge(first[p + 1]);
      first[p].merge(set);
      if (can_skip && nullable[p + 1]) nullable[p] = 1;
    }
    bool changed = rule_first[rule].merge(first[start]);
    if (nullable[start] && !rule_nullable[rule]) rule_nullable[rule] = changed = true;
    if (changed)
      for (uint32_t user : users[rule])
        if (!queued[user]) {
          queued[user] = 1;
          pending.push_back(user);
        }
  }
  Grammar out = std::move(grammar_);
  grammar_ = Grammar();
  defined_.clear();
  return out;
}

}  // namespace strata::grammar
