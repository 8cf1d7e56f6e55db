// Grammar — a context-free grammar over bytes, the compiled form of a JSON schema
// (grammar/json_schema.h) that the matcher (grammar/matcher.h) runs.
//
// Why our own: Debian 12 packages no library for grammar-constrained decoding (no llguidance,
// XGrammar, outlines-core; `apt-cache search` finds only validators such as libvalijson-dev,
// which the tests use to check outputs). This is the llama.cpp GBNF model reduced to bytes:
// a rule is a list of alternatives, an alternative a sequence of elements, an element either a
// set of bytes (one byte of input) or a reference to a rule. UTF-8 is spelled out as byte
// sequences by the compiler, so the matcher never decodes characters and a token that ends in
// the middle of a character is handled like any other prefix.
//
// Layout: every alternative is stored in `elements` as its elements followed by an End marker;
// a rule lists the offsets of its alternatives. A position (an index into `elements`) is what the
// matcher's stacks hold. Immutable once built; shared between requests (shared_ptr<const>).
//
// Contract: a grammar the JSON-schema compiler returns has no left recursion (it checks with
// find_left_recursion and refuses such schemas), so expanding a position always terminates.
// GrammarBuilder::text_until makes none either (every alternative starts with a byte).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::grammar {

// 256 bits: which byte values an element accepts.
struct ByteSet {
  std::array<uint64_t, 4> words{};
  bool has(uint8_t byte) const { return (words[byte >> 6] >> (byte & 63)) & 1; }
  void add(uint8_t byte) { words[byte >> 6] |= uint64_t(1) << (byte & 63); }
  // Adds `other`; true when that changed this set.
  bool merge(const ByteSet& other) {
    bool changed = false;
    for (size_t i = 0; i < 4; ++i) {
      const uint64_t merged = words[i] | other.words[i];
      changed |= merged != words[i];
      words[i] = merged;
    }
    return changed;
  }
  bool empty() const { return (words[0] | words[1] | words[2] | words[3]) == 0; }
  void add_range(uint8_t first, uint8_t last) {
    for (int b = first; b <= last; ++b) add(uint8_t(b));
  }
  void remove(uint8_t byte) { words[byte >> 6] &= ~(uint64_t(1) << (byte & 63)); }
  bool operator==(const ByteSet&) const = default;
};

struct Element {
  enum class Kind : uint8_t { End, Bytes, Rule };
  Kind kind = Kind::End;
  uint32_t value = 0;  // Bytes: index into Grammar::byte_sets; Rule: rule id
};

struct Grammar {
  std::vector<Element> elements;
  std::vector<ByteSet> byte_sets;
  std::vector<std::vector<uint32_t>> rules;  // rule id -> offsets of its alternatives
  std::vector<std::string> rule_names;       // for debugging and to_text
  uint32_t root = 0;
  // Per position, filled by GrammarBuilder::finish (the matcher's pruning): the bytes the
  // suffix from that position to its End can start with, and whether it can match nothing.
  std::vector<ByteSet> first;
  std::vector<uint8_t> nullable;

  // GBNF-like rendering ("name ::= [\x22] string-chars [\x22] | ..."), for tests and debugging.
  std::string to_text() const;
  // A rule that can reach itself without consuming a byte (left recursion, which expansion
  // could not finish), or -1 when there is none.
  int64_t find_left_recursion() const;
};

// Builds a Grammar rule by rule. Rules may be declared before they are defined (recursion).
class GrammarBuilder {
 public:
  // One item of an alternative: a byte set, a literal byte string, or a rule.
  struct Item {
    enum class Kind : uint8_t { Bytes, Literal, Rule } kind;
    ByteSet bytes;
    std::string literal;
    uint32_t rule = 0;
  };
  using Sequence = std::vector<Item>;

  static Item bytes(const ByteSet& set) { return {Item::Kind::Bytes, set, {}, 0}; }
  static Item byte(uint8_t b) {
    ByteSet set;
    set.add(b);
    return bytes(set);
  }
  static Item range(uint8_t first, uint8_t last) {
    ByteSet set;
    set.add_range(first, last);
    return bytes(set);
  }
  static Item literal(std::string_view text) {
    return {Item::Kind::Literal, {}, std::string(text), 0};
  }
  static Item rule(uint32_t id) { return {Item::Kind::Rule, {}, {}, id}; }

  // A new rule without alternatives yet.
  uint32_t declare(std::string name);
  // Sets the alternatives of a declared rule (once).
  void define(uint32_t rule, const std::vector<Sequence>& alternatives);
  uint32_t add(std::string name, const std::vector<Sequence>& alternatives) {
    const uint32_t id = declare(std::move(name));
    define(id, alternatives);
    return id;
  }
  // item{min,max} (max < 0: unbounded), as rules: min copies, then nested optionals (or a
  // right-recursive star, which the matcher runs in constant stack depth).
  uint32_t repeat(std::string name, const Sequence& item, int64_t min, int64_t max);
  // `item (separator item)*` with the same bounds on the number of items (min >= 1).
  uint32_t separated(std::string name, const Sequence& item, const Sequence& separator, int64_t min,
                     int64_t max);
  // Free text ended by `terminator` (included): well-formed UTF-8 without control characters
  // other than tab, newline and carriage return, ending at the first occurrence of `terminator`,
  // and in which no string of `forbidden` occurs except inside that terminator (the XML tool-call
  // format's raw values: up to "\n</parameter>", with no "</parameter>" or "</tool_call>" that
  // a parser would take for the end). An Aho-Corasick automaton over the strings, one rule per
  // state, each alternative a byte set and a tail call: constant stack depth however long the
  // text. REQUIRES: all strings ASCII and non-empty.
  uint32_t text_until(std::string name, std::string_view terminator,
                      const std::vector<std::string>& forbidden);
  // One UTF-8 character per form, as its first byte's set and the rest: `ascii` (bytes < 0x80)
  // and every well-formed multi-byte sequence (Unicode 15 Table 3-7: no overlongs, surrogates,
  // nothing above U+10FFFF).
  static std::vector<std::pair<ByteSet, Sequence>> utf8_char_forms(const ByteSet& ascii);
  // Appends the UTF-8 encodings of the code points lo..hi (surrogates left out) as sequences of
  // byte ranges: each sequence covers code points of one encoded length, and every byte position
  // of it is a contiguous range (the split of RE2 and Rust's regex-syntax utf8 module).
  // REQUIRES: hi <= 0x10FFFF.
  static void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Sequence>& out);

  size_t n_elements() const { return grammar_.elements.size(); }
  size_t n_rules() const { return grammar_.rules.size(); }
  // The grammar with `root` as its start rule; the builder is left empty.
  Grammar finish(uint32_t root);

 private:
  uint32_t byte_set_index(const ByteSet& set);
  Grammar grammar_;
  std::vector<bool> defined_;
};

}  // namespace strata::grammar
