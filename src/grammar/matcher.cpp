#include "grammar/matcher.h"

#include <algorithm>
#include <cstddef>

namespace strata::grammar {

Matcher::Matcher(const Grammar& grammar) : grammar_(grammar) {
  std::vector<uint32_t> start;
  for (uint32_t alternative : grammar_.rules[grammar_.root]) {
    start.assign(1, alternative);
    expand(start, 1, initial_);
  }
  state_ = initial_;
}

std::vector<uint32_t>& Matcher::scratch(size_t depth) {
  while (scratch_.size() <= depth) scratch_.emplace_back();
  return scratch_[depth];
}

void Matcher::add_stack(const std::vector<uint32_t>& stack, MatcherState& out) const {
  size_t count = 0;
  for (size_t i = 0; i < out.size(); i += out[i] + 1, ++count) {
    const size_t n = out[i];
    if (n == stack.size() && std::equal(stack.begin(), stack.end(), out.begin() + std::ptrdiff_t(i) + 1))
      return;
  }
  if (count >= kMaxStacks) return;
  out.push_back(uint32_t(stack.size()));
  out.insert(out.end(), stack.begin(), stack.end());
}

void Matcher::expand(std::vector<uint32_t>& stack, size_t depth, MatcherState& out) {
  while (true) {
    if (stack.empty()) {
      add_stack(stack, out);
      return;
    }
    if (stack.size() > kMaxStackDepth || depth > kMaxStackDepth) return;
    const uint32_t pos = stack.back();
    const Element& element = grammar_.elements[pos];
    if (element.kind == Element::Kind::End) {
      stack.pop_back();
      continue;
    }
    if (element.kind == Element::Kind::Bytes) {
      add_stack(stack, out);
      return;
    }
    // A rule: its continuation stays below (unless the reference ends its alternative: a tail
    // call), each alternative is expanded on a copy.
    stack.pop_back();
    if (grammar_.elements[pos + 1].kind != Element::Kind::End) stack.push_back(pos + 1);
    for (uint32_t alternative : grammar_.rules[element.value]) {
      std::vector<uint32_t>& copy = scratch(depth);
      copy.assign(stack.begin(), stack.end());
      copy.push_back(alternative);
      expand(copy, depth + 1, out);
    }
    return;
  }
}

bool Matcher::advance(const MatcherState& in, uint8_t byte, MatcherState& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); i += in[i] + 1) {
    const size_t n = in[i];
    if (n == 0) continue;
    const uint32_t top = in[i + n];
    const Element& element = grammar_.elements[top];
    if (!grammar_.byte_sets[element.value].has(byte)) continue;
    std::vector<uint32_t>& stack = scratch(0);
    stack.assign(in.begin() + std::ptrdiff_t(i) + 1, in.begin() + std::ptrdiff_t(i + n));
    if (grammar_.elements[top + 1].kind != Element::Kind::End) stack.push_back(top + 1);
    expand(stack, 1, out);
  }
  return !out.empty();
}

bool Matcher::accepting(const MatcherState& state) {
  for (size_t i = 0; i < state.size(); i += state[i] + 1)
    if (state[i] == 0) return true;
  return false;
}

bool Matcher::can_continue(const MatcherState& state) {
  for (size_t i = 0; i < state.size(); i += state[i] + 1)
    if (state[i] > 0) return true;
  return false;
}

bool Matcher::accept(std::string_view bytes) {
  MatcherState current = state_;
  for (char c : bytes) {
    if (!advance(current, uint8_t(c), step_)) return false;
    current.swap(step_);
  }
  state_.swap(current);
  return true;
}

}  // namespace strata::grammar
