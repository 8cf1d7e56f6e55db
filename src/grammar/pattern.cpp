#include "grammar/pattern.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <utility>
#include <vector>

namespace strata::grammar {
namespace {

using B = GrammarBuilder;
using Sequence = B::Sequence;

struct NfaState {
  enum class Kind : uint8_t { Split, Chars, LineStart, LineEnd, Match };
  Kind kind = Kind::Split;
  uint32_t chars = 0;          // Chars: index into Nfa::classes
  std::vector<uint32_t> next;  // Split: any number; Chars, LineStart, LineEnd: one
};

// A Thompson NFA of the search for the pattern: any characters, then the pattern, ending in
// `match`. Built back to front: each node is compiled with the state that follows it.
struct Nfa {
  explicit Nfa(const RegexNode& root) {
    match = add({NfaState::Kind::Match, 0, {}});
    const uint32_t pattern = build(root, match);
    // Unanchored: anything may come before the match. `^` still anchors, as its edge is taken
    // only before the first character (SubsetConstruction::closure).
    const uint32_t loop = add({});
    const uint32_t any = add({NfaState::Kind::Chars, class_index({{0, kMaxCodePoint}}), {loop}});
    states[loop].next = {any, pattern};
    start = loop;
  }

  std::vector<NfaState> states;
  std::vector<CharSet> classes;
  uint32_t start = 0, match = 0;

 private:
  uint32_t add(NfaState state) {
    if (states.size() >= kMaxPatternNfaStates)
      throw PatternError(
          fmt::format("the pattern expands to more than {} automaton states "
                      "(counted repetitions multiply: (a{{100}}){{300}} is "
                      "30,000)",
                      kMaxPatternNfaStates));
    states.push_back(std::move(state));
    return uint32_t(states.size() - 1);
  }

  uint32_t class_index(const CharSet& set) {
    const auto [it, inserted] = class_ids_.try_emplace(set, uint32_t(classes.size()));
    if (inserted) classes.push_back(set);
    return it->second;
  }

  uint32_t build(const RegexNode& node, uint32_t next) {
    using Kind = RegexNode::Kind;
    switch (node.kind) {
      case Kind::Empty:
        return next;
      case Kind::Chars:
        return add({NfaState::Kind::Chars, class_index(node.chars), {next}});
      case Kind::LineStart:
        return add({NfaState::Kind::LineStart, 0, {next}});
      case Kind::LineEnd:
        return add({NfaState::Kind::LineEnd, 0, {next}});
      case Kind::Concat:
        for (auto it = node.children.rbegin(); it != node.children.rend(); ++it)
          next = build(*it, next);
        return next;
      case Kind::Alternate: {
        NfaState split;
        for (const RegexNode& child : node.children) split.next.push_back(build(child, next));
        return add(std::move(split));
      }
      case Kind::Repeat: {
        const RegexNode& item = node.children[0];
        uint32_t tail = next;
        if (node.max < 0) {
          const uint32_t loop = add({});
          const uint32_t body = build(item, loop);
          states[loop].next = {body, next};
          tail = loop;
        } else {
          // item{0,k}: (item (item ...)?)?, each optional copy a split to the item or past.
          for (int64_t k = node.min; k < node.max; ++k) {
            const uint32_t body = build(item, tail);
            tail = add({NfaState::Kind::Split, 0, {body, next}});
          }
        }
        for (int64_t k = 0; k < node.min; ++k) tail = build(item, tail);
        return tail;
      }
    }
    return next;
  }

  std::map<CharSet, uint32_t> class_ids_;
};

// The partition of the code points (surrogates left out) into the largest ranges that no class
// of the NFA splits: the DFA's alphabet.
struct Atoms {
  explicit Atoms(const std::vector<CharSet>& classes) {
    std::vector<uint32_t> cuts = {0, 0xD800, 0xE000, kMaxCodePoint + 1};
    for (const CharSet& set : classes)
      for (const auto& [lo, hi] : set) {
        cuts.push_back(lo);
        cuts.push_back(hi + 1);
      }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i)
      if (cuts[i] < 0xD800 || cuts[i] > 0xDFFF) ranges.push_back({cuts[i], cuts[i + 1] - 1});
    for (const CharSet& set : classes) {
      std::vector<uint32_t>& atoms = of_class.emplace_back();
      for (uint32_t a = 0; a < ranges.size(); ++a) {
        const uint32_t cp = ranges[a].first;  // an atom lies wholly inside a class or outside
        const auto it = std::upper_bound(set.begin(), set.end(), CodeRange{cp, kMaxCodePoint});
        if (it != set.begin() && std::prev(it)->second >= cp) atoms.push_back(a);
      }
    }
  }
  std::vector<CodeRange> ranges;
  std::vector<std::vector<uint32_t>> of_class;
};

struct DfaState {
  std::vector<uint32_t> nfa;  // its Chars, LineEnd and Match states, sorted
  int64_t length = 0;         // characters so far, up to the cap (SubsetConstruction::run)
  bool accepting = false;
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> edges;  // target, its atoms
};

// The states from which one of `targets` is reachable (targets included), given each state's
// predecessors `into`: a flood fill backwards. Used for the NFA (states that can still match)
// and the DFA (states that can still accept).
std::vector<bool> reaching(const std::vector<std::vector<uint32_t>>& into, std::vector<uint32_t> targets) {
  std::vector<bool> marked(into.size(), false);
  for (uint32_t t : targets) marked[t] = true;
  while (!targets.empty()) {
    const uint32_t s = targets.back();
    targets.pop_back();
    for (uint32_t before : into[s])
      if (!marked[before]) {
        marked[before] = true;
        targets.push_back(before);
      }
  }
  return marked;
}

class SubsetConstruction {
 public:
  SubsetConstruction(const Nfa& nfa, const Atoms& atoms, int64_t min_length, int64_t max_length)
      : nfa_(nfa),
        atoms_(atoms),
        min_length_(min_length),
        max_length_(max_length),
        seen_(nfa.states.size(), 0) {
    // live_: the states from which `match` is reachable without `^`, i.e. after a character.
    std::vector<std::vector<uint32_t>> into(nfa.states.size());
    for (uint32_t s = 0; s < nfa.states.size(); ++s)
      if (nfa.states[s].kind != NfaState::Kind::LineStart)
        for (uint32_t next : nfa.states[s].next) into[next].push_back(s);
    live_ = reaching(into, {nfa.match});
  }

  // The DFA; state 0 is the start. The length is counted up to max_length, or up to min_length
  // when there is no maximum (beyond it the count no longer matters), so the pair stays finite.
  std::vector<DfaState> run() {
    const int64_t cap = max_length_ >= 0 ? max_length_ : min_length_;
    std::vector<DfaState> states(1);
    states[0].nfa = absorb(closure({nfa_.start}, true, false));
    std::map<std::pair<std::vector<uint32_t>, int64_t>, uint32_t> index;  // all but the start
    std::vector<std::vector<uint32_t>> successors(atoms_.ranges.size());
    for (size_t i = 0; i < states.size(); ++i) {
      const std::vector<uint32_t> from = states[i].nfa;  // `states` grows below
      const int64_t length = states[i].length;
      charge(from.size());
      const std::vector<uint32_t> at_end = closure(from, i == 0, true);
      states[i].accepting =
          length >= min_length_ && std::binary_search(at_end.begin(), at_end.end(), nfa_.match);
      if (max_length_ >= 0 && length >= max_length_) continue;
      for (std::vector<uint32_t>& list : successors) list.clear();
      for (uint32_t s : from) {
        const NfaState& state = nfa_.states[s];
        if (state.kind == NfaState::Kind::Match) {  // matched: any character keeps it so
          for (std::vector<uint32_t>& list : successors) list.push_back(s);
          charge(successors.size());
        } else if (state.kind == NfaState::Kind::Chars) {
          for (uint32_t a : atoms_.of_class[state.chars]) successors[a].push_back(state.next[0]);
          charge(atoms_.of_class[state.chars].size());
        }
      }
      std::map<std::vector<uint32_t>, std::vector<uint32_t>> groups;  // successors -> atoms
      for (uint32_t a = 0; a < successors.size(); ++a) {
        std::vector<uint32_t>& list = successors[a];
        if (list.empty()) continue;
        std::sort(list.begin(), list.end());
        list.erase(std::unique(list.begin(), list.end()), list.end());
        groups[list].push_back(a);
        charge(list.size());
      }
      const int64_t next_length = std::min(length + 1, cap);
      for (auto& [seeds, atoms] : groups) {
        std::vector<uint32_t> next = closure(seeds, false, false);
        std::erase_if(next, [&](uint32_t s) { return !live_[s]; });
        if (next.empty()) continue;
        next = absorb(std::move(next));
        // Sorting it, and comparing it with the keys of the map (log2 of 10,000 states; keys
        // share long prefixes in a long counted repetition).
        charge(next.size() * 4);
        const auto [it, inserted] = index.try_emplace({next, next_length}, uint32_t(states.size()));
        if (inserted) {
          if (states.size() >= kMaxPatternDfaStates)
            throw PatternError(fmt::format(
                "the pattern{} needs more than {} automaton states (each character of a counted "
                "repetition is one, and an unanchored start or a wide class before the "
                "repetition multiplies them: anchor it with ^ and $, or lower the bounds)",
                min_length_ > 0 || max_length_ >= 0 ? " with minLength / maxLength" : "",
                kMaxPatternDfaStates));
          states.push_back({std::move(next), next_length, false, {}});
        }
        states[i].edges.push_back({it->second, std::move(atoms)});
      }
    }
    return states;
  }

 private:
  // The states reachable from `stack` without reading a character, kept where they matter to
  // the DFA: Chars (what comes next), LineEnd (the string may end here), Match. `^` is crossed
  // only at the start, `$` only at the end.
  std::vector<uint32_t> closure(std::vector<uint32_t> stack, bool at_start, bool at_end) {
    ++stamp_;
    std::vector<uint32_t> out;
    while (!stack.empty()) {
      const uint32_t s = stack.back();
      stack.pop_back();
      if (seen_[s] == stamp_) continue;
      seen_[s] = stamp_;
      charge(1);
      const NfaState& state = nfa_.states[s];
      switch (state.kind) {
        case NfaState::Kind::Split:
          stack.insert(stack.end(), state.next.begin(), state.next.end());
          break;
        case NfaState::Kind::LineStart:
          if (at_start) stack.push_back(state.next[0]);
          break;
        case NfaState::Kind::LineEnd:
          out.push_back(s);
          if (at_end) stack.push_back(state.next[0]);
          break;
        case NfaState::Kind::Chars:
        case NfaState::Kind::Match:
          out.push_back(s);
          break;
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // Once the pattern has matched, whatever follows is accepted: the other states do not matter
  // (and merging such sets keeps the DFA small).
  std::vector<uint32_t> absorb(std::vector<uint32_t> set) const {
    if (std::binary_search(set.begin(), set.end(), nfa_.match)) return {nfa_.match};
    return set;
  }

  void charge(size_t steps) {
    work_ += steps;
    if (work_ > kMaxPatternWork)
      throw PatternError(
          fmt::format("the pattern is too complex to compile (more than {} "
                      "steps building its automaton)",
                      kMaxPatternWork));
  }

  const Nfa& nfa_;
  const Atoms& atoms_;
  const int64_t min_length_, max_length_;
  std::vector<uint32_t> seen_;
  uint32_t stamp_ = 0;
  std::vector<bool> live_;
  size_t work_ = 0;
};

// The letter of c's two-character JSON escape (\n for a line feed ...), 0 if it has none.
char short_escape(char c) {
  switch (c) {
    case '"':
      return '"';
    case '\\':
      return '\\';
    case '\b':
      return 'b';
    case '\f':
      return 'f';
    case '\n':
      return 'n';
    case '\r':
      return 'r';
    case '\t':
      return 't';
    default:
      return 0;
  }
}

// Spells sets of characters as JSON string text: plain ASCII as itself, `"` `\` and controls
// escaped, the rest as UTF-8. Shares the escape and UTF-8 rules between states.
class Speller {
 public:
  Speller(B& builder, std::string name) : builder_(builder), name_(std::move(name)) {}

  // Adds to `out` the alternatives "one character of `set`, then `then`".
  void alternatives(const CharSet& set, uint32_t then, std::vector<Sequence>& out) {
    ByteSet plain, escaped;
    CharSet wide;
    for (const auto& [lo, hi] : set) {
      for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) {
        if (c < 0x20 || c == '"' || c == '\\')
          escaped.add(uint8_t(c));
        else
          plain.add(uint8_t(c));
      }
      if (hi >= 0x80) wide.push_back({std::max<uint32_t>(lo, 0x80), hi});
    }
    if (!plain.empty()) out.push_back({B::bytes(plain), B::rule(then)});
    if (!escaped.empty()) out.push_back({B::byte('\\'), B::rule(escape(escaped)), B::rule(then)});
    if (!wide.empty()) out.push_back({B::rule(utf8(wide)), B::rule(then)});
  }

 private:
  // The text after the backslash of an escape of one of `chars` (ASCII, each needing one).
  uint32_t escape(const ByteSet& chars) {
    if (const auto it = escapes_.find(chars.words); it != escapes_.end()) return it->second;
    ByteSet letters;
    ByteSet last_digit[2];  // \u000X, \u001X
    for (int c = 0; c < 0x80; ++c) {
      if (!chars.has(uint8_t(c))) continue;
      if (const char letter = short_escape(char(c))) {
        letters.add(uint8_t(letter));
        continue;
      }
      const int digit = c & 15;
      last_digit[c >> 4].add(uint8_t(digit < 10 ? '0' + digit : 'a' + digit - 10));
      if (digit >= 10) last_digit[c >> 4].add(uint8_t('A' + digit - 10));
    }
    std::vector<Sequence> alternatives;
    if (!letters.empty()) alternatives.push_back({B::bytes(letters)});
    if (!last_digit[0].empty())
      alternatives.push_back({B::literal("u000"), B::bytes(last_digit[0])});
    if (!last_digit[1].empty())
      alternatives.push_back({B::literal("u001"), B::bytes(last_digit[1])});
    const uint32_t rule = builder_.add(name_ + "-escape", alternatives);
    escapes_.emplace(chars.words, rule);
    return rule;
  }

  uint32_t utf8(const CharSet& set) {
    if (const auto it = utf8_.find(set); it != utf8_.end()) return it->second;
    std::vector<Sequence> alternatives;
    for (const auto& [lo, hi] : set) B::utf8_sequences(lo, hi, alternatives);
    const uint32_t rule = builder_.add(name_ + "-utf8", alternatives);
    utf8_.emplace(set, rule);
    return rule;
  }

  B& builder_;
  std::string name_;
  std::map<std::array<uint64_t, 4>, uint32_t> escapes_;
  std::map<CharSet, uint32_t> utf8_;
};

}  // namespace

uint32_t add_pattern_rule(GrammarBuilder& builder, std::string_view pattern, int64_t min_length,
                          int64_t max_length, const std::string& name) {
  const Nfa nfa(parse_regex(pattern));
  const Atoms atoms(nfa.classes);
  const std::vector<DfaState> dfa = SubsetConstruction(nfa, atoms, min_length, max_length).run();
  // Keep the states from which an accepting one is reachable: the matcher must never let a
  // model into a string it cannot finish.
  std::vector<std::vector<uint32_t>> into(dfa.size());
  std::vector<uint32_t> accepting;
  for (uint32_t i = 0; i < dfa.size(); ++i) {
    for (const auto& [target, atom_list] : dfa[i].edges) into[target].push_back(i);
    if (dfa[i].accepting) accepting.push_back(i);
  }
  const std::vector<bool> live = reaching(into, accepting);
  if (!live[0]) {
    if (max_length >= 0)
      throw PatternError(
          fmt::format("no string of {} to {} characters (minLength / maxLength) "
                      "matches the pattern",
                      min_length, max_length));
    if (min_length > 0)
      throw PatternError(fmt::format(
          "no string of at least {} characters (minLength) matches the pattern", min_length));
    throw PatternError("no string matches the pattern");
  }
  std::vector<uint32_t> rules(dfa.size(), 0);
  for (uint32_t i = 0; i < dfa.size(); ++i)
    if (live[i]) rules[i] = builder.declare(fmt::format("{}-s{}", name, i));
  Speller speller(builder, name);
  for (uint32_t i = 0; i < dfa.size(); ++i) {
    if (!live[i]) continue;
    std::map<uint32_t, CharSet> by_target;  // two groups of successors can close to one state
    for (const auto& [target, atom_list] : dfa[i].edges) {
      if (!live[target]) continue;
      CharSet& set = by_target[target];
      for (uint32_t a : atom_list) set.push_back(atoms.ranges[a]);
    }
    std::vector<Sequence> alternatives;
    for (auto& [target, set] : by_target)
      speller.alternatives(normalized(std::move(set)), rules[target], alternatives);
    if (dfa[i].accepting) alternatives.push_back({});
    builder.define(rules[i], alternatives);
  }
  return rules[0];
}

}  // namespace strata::grammar
