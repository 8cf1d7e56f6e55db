#include "grammar/token_mask.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "text/tokenizer.h"

namespace strata::grammar {
namespace {

// Interned states per sequence before the tables start over: each holds a 1 KiB transition row
// and possibly a mask (n_vocab / 8 bytes, 19 KiB for Qwen's 151,936). A JSON value visits few
// distinct states apart from counted repetitions (minLength, maxItems, digits), where each count
// is a state of its own.
constexpr size_t kMaxStates = 4096;

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
    // USER_DEFINED tokens are text the tokenizer matches wherever it occurs and decodes as that
    // text (Qwen's <tool_call>, </tool_call>, <think>: llama.cpp's converter types added tokens
    // that are not special so), so a grammar may take them as their bytes, as llama.cpp's does:
    // a forced tool call then closes with the one "</tool_call>" token the model was trained
    // on rather than spelling it in pieces. CONTROL tokens stay out (only the stop ids).
    if (type == TokenType::Normal || type == TokenType::Byte || type == TokenType::UserDefined)
      bytes[size_t(id)] = tokenizer.token_bytes(id);
  }
  return TokenVocabulary(std::move(bytes), std::move(stop_ids), n_vocab);
}

bool TokenVocabulary::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

size_t MatcherStateHash::operator()(const MatcherState& state) const {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a over the positions
  for (uint32_t v : state) hash = (hash ^ v) * 0x100000001b3ull;
  return size_t(hash);
}

bool SharedMasks::find(const MatcherState& state, std::vector<uint64_t>& bits) const {
  std::lock_guard lock(mutex_);
  const auto found = masks_.find(state);
  if (found == masks_.end()) return false;
  bits = found->second;
  ++hits_;
  return true;
}

void SharedMasks::insert(const MatcherState& state, const std::vector<uint64_t>& bits) {
  std::lock_guard lock(mutex_);
  if (masks_.size() < max_masks_) masks_.try_emplace(state, bits);
}

size_t SharedMasks::size() const {
  std::lock_guard lock(mutex_);
  return masks_.size();
}

uint64_t SharedMasks::hits() const {
  std::lock_guard lock(mutex_);
  return hits_;
}

GrammarConstraint::GrammarConstraint(const Grammar& grammar, const TokenVocabulary& vocabulary,
                                     const std::optional<LazyTrigger>& trigger, SharedMasks* shared)
    : vocabulary_(vocabulary),
      matcher_(grammar),
      levels_(vocabulary.max_token_bytes() + 1),
      shared_(shared) {
  current_ = intern(matcher_.initial());
  if (trigger) scanner_.emplace(*trigger);
}

const std::vector<int32_t>& GrammarConstraint::banned() {
  const auto [it, added] = banned_.try_emplace(scanner_->key());
  if (!added) return it->second;
  // A token can fire the word only if it holds the word's last byte: the few that do are run
  // through a copy of the scanner, and the bytes after the word through the grammar's start.
  const char last = char(scanner_->last_word_byte());
  for (int32_t id : vocabulary_.sorted_ids()) {
    const std::string& bytes = vocabulary_.bytes(id);
    if (bytes.find(last) == std::string::npos) continue;
    TriggerScanner scanner = *scanner_;
    const size_t after = scanner.feed(bytes);
    if (after == std::string_view::npos) continue;
    matcher_.reset();
    if (!matcher_.accept(std::string_view(bytes).substr(after))) it->second.push_back(id);
  }
  return it->second;
}

int32_t GrammarConstraint::intern(const MatcherState& state) {
  const auto found = state_ids_.find(state);
  if (found != state_ids_.end()) return found->second;
  const int32_t id = int32_t(states_.size());
  states_.push_back(state);
  state_ids_.emplace(state, id);
  next_.emplace_back();
  next_.back().fill(kUnknown);
  masks_.emplace_back();
  stats_.states = states_.size();
  return id;
}

int32_t GrammarConstraint::step(int32_t id, uint8_t byte) {
  int32_t next = next_[size_t(id)][byte];
  if (next != kUnknown) return next;
  ++stats_.matcher_steps;
  next = matcher_.advance(states_[size_t(id)], byte, scratch_) ? intern(scratch_) : kDead;
  next_[size_t(id)][byte] = next;  // (intern may have grown next_: index again)
  return next;
}

void GrammarConstraint::reset_tables() {
  MatcherState current = states_[size_t(current_)];
  std::vector<uint64_t> current_mask = std::move(masks_[size_t(current_)]);
  states_.clear();
  state_ids_.clear();
  next_.clear();
  masks_.clear();
  current_ = intern(current);
  masks_[size_t(current_)] = std::move(current_mask);
}

void GrammarConstraint::compute(std::vector<uint64_t>& bits) {
  bits.assign((vocabulary_.n_vocab() + 63) / 64, 0);
  auto allow = [&](int32_t id) { bits[size_t(id) >> 6] |= uint64_t(1) << (id & 63); };
  const MatcherState& state = states_[size_t(current_)];
  if (matcher_.accepting(state))
    for (int32_t id : vocabulary_.stop_ids()) allow(id);
  if (!matcher_.can_continue(state)) return;
  const std::vector<int32_t>& sorted = vocabulary_.sorted_ids();
  const std::vector<uint32_t>& lcp = vocabulary_.common_prefix();
  levels_[0] = current_;
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
      const int32_t next = step(levels_[depth], uint8_t(token[depth]));
      if (next == kDead) {
        dead = depth + 1;
        ok = false;
        break;
      }
      levels_[depth + 1] = next;
    }
    valid = depth;
    if (ok) allow(sorted[k]);
  }
}

const std::vector<uint64_t>& GrammarConstraint::allowed() {
  ++stats_.masks;
  if (!triggered()) {
    lazy_bits_.assign((vocabulary_.n_vocab() + 63) / 64, ~uint64_t(0));
    if (const size_t tail = vocabulary_.n_vocab() % 64)
      lazy_bits_.back() = (uint64_t(1) << tail) - 1;
    for (int32_t id : banned()) lazy_bits_[size_t(id) >> 6] &= ~(uint64_t(1) << (id & 63));
    return lazy_bits_;
  }
  if (stopped_) {  // after a stop only stops (a speculative window may sample past one)
    if (stop_only_.empty()) {
      stop_only_.assign((vocabulary_.n_vocab() + 63) / 64, 0);
      for (int32_t id : vocabulary_.stop_ids())
        stop_only_[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
    }
    return stop_only_;
  }
  if (!masks_[size_t(current_)].empty()) {
    ++stats_.cache_hits;
    return masks_[size_t(current_)];
  }
  if (states_.size() >= kMaxStates) reset_tables();
  std::vector<uint64_t> bits;
  if (shared_ && shared_->find(states_[size_t(current_)], bits)) {
    ++stats_.shared_hits;
  } else {
    compute(bits);
    if (shared_) shared_->insert(states_[size_t(current_)], bits);
  }
  masks_[size_t(current_)] = std::move(bits);
  return masks_[size_t(current_)];
}

void GrammarConstraint::mask(std::span<float> logits) {
  if (!triggered()) {  // only the banned tokens: no pass over the logits
    ++stats_.masks;
    for (int32_t id : banned())
      if (size_t(id) < logits.size()) logits[size_t(id)] = -std::numeric_limits<float>::infinity();
    return;
  }
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
  if (!triggered()) {  // free text; stops and control tokens add no bytes (nor end anything:
                       // a caller that goes on after a stop, ignore_eos, stays free)
    const std::string_view bytes =
        vocabulary_.has_bytes(token) ? std::string_view(vocabulary_.bytes(token)) : "";
    const size_t after = scanner_->feed(bytes);
    if (after != std::string_view::npos) advance(bytes.substr(after));
    return;
  }
  if (vocabulary_.is_stop(token)) {
    if (complete()) {
      stopped_ = true;
    } else {
      valid_ = false;
    }
    return;
  }
  if (stopped_ || !vocabulary_.has_bytes(token)) {
    valid_ = false;
    return;
  }
  advance(vocabulary_.bytes(token));
}

bool GrammarConstraint::advance(std::string_view bytes) {
  int32_t id = current_;
  for (char c : bytes) {
    id = step(id, uint8_t(c));
    if (id == kDead) {
      valid_ = false;
      return false;
    }
  }
  current_ = id;
  return true;
}

}  // namespace strata::grammar
