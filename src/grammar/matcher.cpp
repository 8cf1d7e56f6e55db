#include "grammar/matcher.h"

#include <algorithm>
#include <cstddef>

namespace strata::grammar {

Matcher::Matcher(const Grammar& grammar) : grammar_(grammar) {
  std::vector<uint32_t> start;
  for (uint32_t alternative : grammar_.rules[grammar_.root]) {
    start.assign(1, alternative);
    if (grammar_.elements[alternative].kind == Element::Kind::End) start.clear();
    add_stack(start, initial_);
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
    if (n == stack.size() &&
        std::equal(stack.begin(), stack.end(), out.begin() + std::ptrdiff_t(i) + 1))
      return;
  }
  if (count >= kMaxStacks) return;
  out.push_back(uint32_t(stack.size()));
  out.insert(out.end(), stack.begin(), stack.end());
}

void Matcher::consume(std::vector<uint32_t>& stack, uint8_t byte, size_t depth, MatcherState& out) {
  const std::vector<Element>& elements = grammar_.elements;
  while (!stack.empty()) {
    if (stack.size() > kMaxStackDepth || depth > kMaxStackDepth) return;
    const uint32_t pos = stack.back();
    const Element& element = elements[pos];
    if (element.kind == Element::Kind::End) {
      stack.pop_back();
      continue;
    }
    if (element.kind == Element::Kind::Bytes) {
      if (!grammar_.byte_sets[element.value].has(byte)) return;
      stack.back() = pos + 1;  // then pop the ends of finished alternatives
      while (!stack.empty() && elements[stack.back()].kind == Element::Kind::End) stack.pop_back();
      add_stack(stack, out);
      return;
    }
    // A rule: neither it nor what follows can start with the byte, and it cannot be skipped.
    if (!grammar_.first[pos].has(byte) && !grammar_.nullable[pos]) return;
    // Its continuation stays below (unless the reference ends its alternative: a tail call);
    // each alternative that can take the byte, or match nothing, is tried on a copy.
    stack.pop_back();
    if (elements[pos + 1].kind != Element::Kind::End) stack.push_back(pos + 1);
    for (uint32_t alternative : grammar_.rules[element.value]) {
      if (!grammar_.first[alternative].has(byte) && !grammar_.nullable[alternative]) continue;
      std::vector<uint32_t>& copy = scratch(depth);
      copy.assign(stack.begin(), stack.end());
      copy.push_back(alternative);
      consume(copy, byte, depth + 1, out);
    }
    return;
  }
}

bool Matcher::advance(const MatcherState& in, uint8_t byte, MatcherState& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); i += in[i] + 1) {
    const size_t n = in[i];
    if (n == 0) continue;
    std::vector<uint32_t>& stack = scratch(0);
    stack.assign(in.begin() + std::ptrdiff_t(i) + 1, in.begin() + std::ptrdiff_t(i + n) + 1);
    consume(stack, byte, 1, out);
  }
  return !out.empty();
}

bool Matcher::accepting(const MatcherState& state) const {
  for (size_t i = 0; i < state.size(); i += state[i] + 1) {
    bool all = true;
    for (size_t k = 1; k <= state[i] && all; ++k) all = grammar_.nullable[state[i + k]];
    if (all) return true;
  }
  return false;
}

bool Matcher::can_continue(const MatcherState& state) const {
  for (size_t i = 0; i < state.size(); i += state[i] + 1)
    for (size_t k = 1; k <= state[i]; ++k)
      if (!grammar_.first[state[i + k]].empty()) return true;
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
