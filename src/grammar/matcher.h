// Matcher — runs a Grammar (grammar/grammar.h) over bytes, one at a time, as a set of pushdown
// stacks (llama.cpp's grammar stacks, over bytes instead of code points, expanded lazily).
//
// A state is the set of stacks the input so far leaves alive. A stack lists grammar positions,
// top last; each position is the rest of an alternative still to match. Advancing by a byte
// expands the top only as far as that byte needs: a rule reference descends into the
// alternatives whose first-byte set (Grammar::first) holds the byte or that can match nothing,
// a byte set consumes it, and ends of alternatives are popped. So a state keeps one stack per
// live parse, not one per possible next character (a string character has nine UTF-8 forms),
// and stacks are deduped. A reference that ends an alternative is a tail call (its parent's
// finished position is not pushed), so the unbounded repetitions of the JSON grammar (string
// characters, array items) run in constant depth and come back to the same state: the token
// mask's cache (grammar/token_mask.h) relies on that.
//
// An empty stack, or one whose positions can all match nothing (Grammar::nullable), means the
// input so far is a complete sentence (`accepting`).
//
// States are flat vectors ([n, pos_1 .. pos_n] per stack), cheap to copy, hash and compare.
// Bounds: a stack deeper than kMaxStackDepth or a state with more than kMaxStacks stacks is cut
// (the extra stacks are dropped): the matcher then accepts less, never more.
// Not thread-safe; one per sequence. The Grammar must outlive it.
#pragma once

#include <cstdint>
#include <deque>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace strata::grammar {

using MatcherState = std::vector<uint32_t>;

class Matcher {
 public:
  static constexpr size_t kMaxStackDepth = 4096;
  static constexpr size_t kMaxStacks = 1024;

  explicit Matcher(const Grammar& grammar);  // grammar from GrammarBuilder::finish

  // `out` = `in` advanced by `byte`; false (and `out` empty) when no stack accepts the byte.
  // `in` and `out` must be different objects.
  bool advance(const MatcherState& in, uint8_t byte, MatcherState& out);
  bool accepting(const MatcherState& state) const;
  // Whether some stack can take more input (the sentence can go on).
  bool can_continue(const MatcherState& state) const;

  const MatcherState& initial() const { return initial_; }

  // The current state, for the convenience calls below.
  const MatcherState& state() const { return state_; }
  void reset() { state_ = initial_; }
  void set_state(const MatcherState& state) { state_ = state; }
  // Advances the current state by every byte; false (state unchanged) if one is rejected.
  bool accept(std::string_view bytes);
  bool accepting() const { return accepting(state_); }
  bool can_continue() const { return can_continue(state_); }

 private:
  // Consumes `byte` from `stack` (expanding its top as needed) and adds the results to `out`.
  void consume(std::vector<uint32_t>& stack, uint8_t byte, size_t depth, MatcherState& out);
  void add_stack(const std::vector<uint32_t>& stack, MatcherState& out) const;
  std::vector<uint32_t>& scratch(size_t depth);

  const Grammar& grammar_;
  MatcherState initial_;
  MatcherState state_;
  MatcherState step_;
  std::deque<std::vector<uint32_t>>
      scratch_;  // one stack per expansion depth, reused (stable refs)
};

}  // namespace strata::grammar
