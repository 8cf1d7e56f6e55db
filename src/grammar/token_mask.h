// TokenVocabulary and GrammarConstraint — which tokens may come next under a Grammar, as a mask
// over the model's vocabulary (grammar-constrained sampling for response_format).
//
// A token is allowed when every one of its bytes extends the matcher's current state (a token
// may end inside a UTF-8 character: the grammar is over bytes). Stop tokens (end of sequence,
// end of turn) are allowed exactly when the value so far is complete; every other control token
// is never allowed. User-defined tokens (Qwen's <tool_call>, <think>) count as their text.
//
// How the mask is computed: TokenVocabulary holds the token byte strings sorted, with each one's
// common prefix length with the one before, so walking them in order is a depth-first walk of
// the vocabulary's trie: matcher states are kept per depth and reused for the shared prefix, and
// once a prefix is rejected every token that starts with it is skipped without running the
// matcher. Matcher states are interned (an id each) and their transitions by byte memoised in a
// table, so the walk is mostly table lookups: the JSON grammar comes back to the same state
// character after character inside strings, digit after digit, item after item. The masks are
// cached by state id too, so a step at a state seen before costs the pass over the logits; and
// with SharedMasks, by matcher state across the constraints of one grammar (requests).
// Numbers: docs/serve.md (bench/grammar_mask.cpp).
//
// Composition with sampling (engine/sampler.h): the mask runs first, on a copy of the logits;
// repetition penalty, temperature, top-k, top-p and min-p then act on what is left, so they are
// the same filters over the allowed tokens renormalised (a disallowed token has probability 0 and
// never enters top-k/top-p). Greedy takes the argmax of the allowed tokens.
//
// Lazy (a LazyTrigger, grammar/lazy_trigger.h; tool_choice "auto"): until the trigger word has
// been written the constraint allows every token (stops and control tokens too) but those whose
// bytes would complete the word and then go on with bytes the grammar rejects at its start (so
// the reply can always continue under the grammar once it fires); from the byte after the word
// on, it is the grammar's constraint as above, the rest of the firing token its first bytes.
// Before the trigger nothing is finished and a stop is like a control token (the caller ends the
// reply there, or goes on past it with ignore_eos and the constraint still waits). The banned
// tokens depend only on the scanner's state: computed once per state (a pass over the tokens
// that hold the word's last byte), then a lookup.
//
// Thread safety: a TokenVocabulary is immutable (share it between requests); a GrammarConstraint
// belongs to one sequence. The Grammar and the vocabulary must outlive the constraint.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/sampling_constraint.h"
#include "grammar/grammar.h"
#include "grammar/lazy_trigger.h"
#include "grammar/matcher.h"

namespace strata {
class Tokenizer;
}

namespace strata::grammar {

class TokenVocabulary {
 public:
  // token_bytes[id]: the bytes token `id` stands for ("" = never allowed). stop_ids: tokens that
  // end the generation (allowed once the value is complete). n_vocab >= token_bytes.size() is the
  // width of a logits row; ids past token_bytes are never allowed.
  TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> stop_ids,
                  size_t n_vocab);
  // NORMAL, BYTE and USER_DEFINED tokens with their bytes; the rest (control, unused) without.
  static TokenVocabulary from_tokenizer(const Tokenizer& tokenizer, std::vector<int32_t> stop_ids,
                                        size_t n_vocab);

  size_t n_vocab() const { return n_vocab_; }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool is_stop(int32_t id) const;
  bool has_bytes(int32_t id) const {
    return id >= 0 && size_t(id) < bytes_.size() && !bytes_[size_t(id)].empty();
  }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  const std::vector<int32_t>& sorted_ids() const { return sorted_; }
  const std::vector<uint32_t>& common_prefix() const { return lcp_; }
  size_t max_token_bytes() const { return max_bytes_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> stop_ids_;
  size_t n_vocab_;
  std::vector<int32_t> sorted_;  // ids with bytes, by their bytes
  std::vector<uint32_t> lcp_;    // lcp_[k]: common prefix of sorted_[k - 1] and sorted_[k]
  size_t max_bytes_ = 0;
};

struct MatcherStateHash {
  size_t operator()(const MatcherState& state) const;
};

// SharedMasks — masks computed by the constraints of one grammar over one vocabulary, for the
// later constraints of the same pair (a server's requests that send a schema again, whose
// grammar the grammar cache hands out again: serve/generator.h), keyed by matcher state. A mask
// depends on nothing else, so a mask found here is the one the walk would compute. At most
// `max_masks` are kept (the first ones computed: the states every reply of a schema passes
// through come first); each is n_vocab / 8 bytes (19 KiB for Qwen's 151,936 tokens).
// Thread-safe (the constraints of concurrent requests share one).
class SharedMasks {
 public:
  explicit SharedMasks(size_t max_masks) : max_masks_(max_masks) {}
  // Copies the mask of `state` into `bits`; false when none is kept.
  bool find(const MatcherState& state, std::vector<uint64_t>& bits) const;
  void insert(const MatcherState& state, const std::vector<uint64_t>& bits);
  size_t size() const;
  uint64_t hits() const;

 private:
  const size_t max_masks_;
  mutable std::mutex mutex_;  // guards masks_ and hits_
  std::unordered_map<MatcherState, std::vector<uint64_t>, MatcherStateHash> masks_;
  mutable uint64_t hits_ = 0;
};

class GrammarConstraint : public SamplingConstraint {
 public:
  // `trigger`: start the grammar lazily, after the trigger's word (above); none: at once.
  // `shared`: masks of earlier constraints of this grammar and vocabulary, looked up before a
  // walk and given the walks' results (null: none); it must outlive the constraint.
  GrammarConstraint(const Grammar& grammar, const TokenVocabulary& vocabulary,
                    const std::optional<LazyTrigger>& trigger = std::nullopt,
                    SharedMasks* shared = nullptr);

  // Bit i set: token i may come next. Cached per matcher state.
  const std::vector<uint64_t>& allowed();
  void mask(std::span<float> logits) override;
  // Advances by the token. A token the grammar rejects leaves the state as it was (and `valid`
  // false from then on): the sampler only draws allowed tokens, so that means a caller bug.
  void accept(int32_t token) override;

  // The grammar applies: there is no trigger, or its word was written.
  bool triggered() const { return !scanner_ || scanner_->fired(); }
  // The bytes so far form a complete value (a stop token would be allowed); before a lazy
  // grammar's trigger, always (but a stop taken then does not finish it: see accept).
  bool complete() const { return !triggered() || matcher_.accepting(states_[size_t(current_)]); }
  // Nothing but a stop can follow: the value is complete and cannot go on, or a stop was taken.
  bool finished() const {
    return stopped_ ||
           (triggered() && complete() && !matcher_.can_continue(states_[size_t(current_)]));
  }
  bool valid() const { return valid_; }

  struct Stats {
    uint64_t masks = 0;  // calls of allowed()
    uint64_t cache_hits = 0;
    uint64_t shared_hits = 0;    // masks taken from SharedMasks instead of a walk
    uint64_t matcher_steps = 0;  // transitions computed by the matcher (not memoised yet)
    uint64_t states = 0;         // distinct matcher states interned so far
  };
  const Stats& stats() const { return stats_; }

 private:
  static constexpr int32_t kDead = -1, kUnknown = -2;
  // Interning: the id of `state`; and the memoised transition of state `id` by `byte`.
  int32_t intern(const MatcherState& state);
  int32_t step(int32_t id, uint8_t byte);
  // Drops every interned state but the current one (bounds the tables' memory).
  void reset_tables();
  void compute(std::vector<uint64_t>& bits);
  // Advances the current state by `bytes`; false (valid_ false, state kept) when one is rejected.
  bool advance(std::string_view bytes);
  // Lazy, before the trigger: the tokens banned in the scanner's current state (class comment).
  const std::vector<int32_t>& banned();

  const TokenVocabulary& vocabulary_;
  Matcher matcher_;
  std::vector<MatcherState> states_;
  std::unordered_map<MatcherState, int32_t, MatcherStateHash> state_ids_;
  std::vector<std::array<int32_t, 256>> next_;
  std::vector<std::vector<uint64_t>> masks_;  // per state id; empty = not computed
  MatcherState scratch_;
  std::vector<int32_t> levels_;  // trie walk: the state after each prefix length
  int32_t current_ = 0;
  std::vector<uint64_t> stop_only_;
  SharedMasks* shared_;
  std::optional<TriggerScanner> scanner_;                      // lazy grammars only
  std::unordered_map<uint32_t, std::vector<int32_t>> banned_;  // by TriggerScanner::key
  std::vector<uint64_t> lazy_bits_;                            // allowed() before the trigger
  bool stopped_ = false;
  bool valid_ = true;
  Stats stats_;
};

}  // namespace strata::grammar
