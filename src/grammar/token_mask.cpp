#include "grammar/token_mask.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "text/tokenizer.h"

namespace strata::grammar {
namespace {

// Masks kept per sequence. A JSON value visits few distinct states at token boundaries apart
// from counted repetitions (minLength / maxItems), where each count is a state of its own; the
// cap bounds the memory (n_vocab / 8 bytes each, 19 KiB for Qwen's 151,936).
constexpr size_t kMaxCachedMasks = 512;

}  // namespace

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes,
                                 std::vector<int32_t> stop_ids, size_t n_vocab)
    : bytes_(std::move(token_bytes)), stop_ids_(std::move(stop_ids)), n_vocab_(n_vocab) {
  n_vocab_ = std::max(n_vocab_, bytes_.size());
  for (int32_t id : stop_ids_)
    if (id >= 0 && size_t(id) < bytes_.size()) bytes_[size_t(id)].clear();
  stop_ids_.erase(std::remove_if(stop_ids_.begin(), stop_ids_.end(),
                                 [&](int32_t id) { return id < 0 || size_t(id) >= n_vocab_; }),
                  stop_ids_.end());
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!bytes_[id].empty()) sorted_.push_back(int32_t(id));
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });
  lcp_.assign(sorted_.size(), 0);
  for (size_t k = 0; k < sorted_.size(); ++k) {
    const std::string& token = bytes_[size_t(sorted_[k])];
    max_bytes_ = std::max(max_bytes_, token.size());
    if (k == 0) continue;
    const std::string& previous = bytes_[size_t(sorted_[k - 1])];
    const size_t n = std::min(previous.size(), token.size());
    uint32_t common = 0;
    while (common < n && previous[common] == token[common]) ++common;
    lcp_[k] = common;
  }
}

TokenVocabulary TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer,
                                                std::vector<int32_t> stop_ids, size_t n_vocab) {
  std::vector<std::string> bytes(size_t(tokenizer.n_tokens()));
  for (int32_t id = 0; id < tokenizer.n_tokens(); ++id) {
    const TokenType type = tokenizer.token_type(id);
    if (type == TokenType::Normal || type == TokenType::Byte) bytes[size_t(id)] = tokenizer.token_bytes(id);
  }
  return TokenVocabulary(std::move(bytes), std::move(stop_ids), n_vocab);
}

bool TokenVocabulary::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

size_t GrammarConstraint::StateHash::operator()(const MatcherState& state) const {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a over the positions
  for (uint32_t v : state) hash = (hash ^ v) * 0x100000001b3ull;
  return size_t(hash);
}

GrammarConstraint::GrammarConstraint(const Grammar& grammar, const TokenVocabulary& vocabulary)
    : vocabulary_(vocabulary), matcher_(grammar), levels_(vocabulary.max_token_bytes() + 1) {}

void GrammarConstraint::compute(std::vector<uint64_t>& bits) {
  bits.assign((vocabulary_.n_vocab() + 63) / 64, 0);
  auto allow = [&](int32_t id) { bits[size_t(id) >> 6] |= uint64_t(1) << (id & 63); };
  const MatcherState& state = matcher_.state();
  if (Matcher::accepting(state))
    for (int32_t id : vocabulary_.stop_ids()) allow(id);
  if (!Matcher::can_continue(state)) return;
  const std::vector<int32_t>& sorted = vocabulary_.sorted_ids();
  const std::vector<uint32_t>& lcp = vocabulary_.common_prefix();
  levels_[0] = state;
  size_t valid = 0;  // levels_[0 .. valid] hold the states after the current token's prefixes
  size_t dead = std::numeric_limits<size_t>::max();  // a prefix length the grammar rejects
  for (size_t k = 0; k < sorted.size(); ++k) {
    const size_t common = lcp[k];
    if (dead <= common) continue;  // starts with the rejected prefix
    dead = std::numeric_limits<size_t>::max();
    const std::string& token = vocabulary_.bytes(sorted[k]);
    size_t depth = std::min(valid, common);
    bool ok = true;
    for (; depth < token.size(); ++depth) {
      ++stats_.matcher_steps;
      if (!matcher_.advance(levels_[depth], uint8_t(token[depth]), levels_[depth + 1])) {
        dead = depth + 1;
        ok = false;
        break;
      }
    }
    valid = depth;
    if (ok) allow(sorted[k]);
  }
}

const std::vector<uint64_t>& GrammarConstraint::allowed() {
  ++stats_.masks;
  if (stopped_) {  // after a stop only stops (a speculative window may sample past one)
    if (stop_only_.empty()) {
      stop_only_.assign((vocabulary_.n_vocab() + 63) / 64, 0);
      for (int32_t id : vocabulary_.stop_ids()) stop_only_[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
    }
    return stop_only_;
  }
  if (current_) {
    ++stats_.cache_hits;
    return *current_;
  }
  const auto found = cache_.find(matcher_.state());
  if (found != cache_.end()) {
    ++stats_.cache_hits;
    current_ = &found->second;
    return *current_;
  }
  if (cache_.size() >= kMaxCachedMasks) cache_.clear();
  std::vector<uint64_t> bits;
  compute(bits);
  current_ = &cache_.emplace(matcher_.state(), std::move(bits)).first->second;
  return *current_;
}

void GrammarConstraint::mask(std::span<float> logits) {
  const std::vector<uint64_t>& bits = allowed();
  bool any = false;
  for (uint64_t word : bits) any |= word != 0;
  if (!any) return;  // finished without a stop token in the vocabulary: the caller ends here
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  for (size_t base = 0; base < logits.size(); base += 64) {
    const size_t word_index = base >> 6;
    const uint64_t word = word_index < bits.size() ? bits[word_index] : 0;
    if (word == ~uint64_t(0)) continue;
    const size_t end = std::min(logits.size(), base + 64);
    for (size_t i = base; i < end; ++i)
      if (!((word >> (i - base)) & 1)) logits[i] = minus_infinity;
  }
}

void GrammarConstraint::accept(int32_t token) {
  if (vocabulary_.is_stop(token)) {
    if (complete()) {
      stopped_ = true;
    } else {
      valid_ = false;
    }
    return;
  }
  if (stopped_ || !vocabulary_.has_bytes(token) || !matcher_.accept(vocabulary_.bytes(token))) {
    valid_ = false;
    return;
  }
  current_ = nullptr;
}

}  // namespace strata::grammar
