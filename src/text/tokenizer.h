// Tokenizer — GPT-2 style byte-level BPE as GGUF files carry it (tokenizer.ggml.model = "gpt2"),
// with the Qwen pre-tokenizers ("qwen2", "qwen35"). Matches Hugging Face `tokenizers` token for
// token (checked against fixtures in tests/data/tokenizer/, see docs/tokenizer.md).
//
// Encode pipeline
//   1. ill-formed UTF-8 in the input is replaced by U+FFFD (maximal subparts);
//   2. added tokens (token type CONTROL=3 and USER_DEFINED=4) are cut out of the raw text first,
//      leftmost match, longest at that position (Hugging Face's AddedVocabulary semantics);
//      CONTROL tokens only when EncodeOptions::parse_special is true (the default);
//   3. each remaining segment is NFC-normalised and split by the pre-tokenizer (text/pretokenizer.h);
//   4. each piece's bytes start as one symbol per byte (the vocabulary's byte-level token for that
//      byte, or its <0xXX> byte token) and are merged by rank, lowest rank first, leftmost on ties.
//      Results for pieces up to 64 bytes are cached.
// Decode concatenates the tokens' bytes (NORMAL: GPT-2 byte<->unicode mapping undone; BYTE <0xXX>:
// that byte; CONTROL / USER_DEFINED: their text) and repairs ill-formed UTF-8 with U+FFFD.
// `StreamingDecoder` produces the same text incrementally, never splitting a character.
//
// Contract
// - Construction validates everything (sizes, merges whose parts or result are missing, byte
//   coverage, special ids) and throws strata::Error naming the source (file), the field and what
//   was expected vs found. A constructed Tokenizer never fails on any input string.
// - A Tokenizer is immutable apart from an internal, mutex-guarded cache: all const methods are
//   safe to call from several threads at once. Movable, not copyable.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/pretokenizer.h"

namespace strata {

class GgufFile;

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

// Everything a tokenizer is made from, as plain data (what a GGUF stores under tokenizer.ggml.*).
struct TokenizerSpec {
  std::vector<std::string> tokens;       // id order; NORMAL tokens in GPT-2 byte-level form
  std::vector<int32_t> token_types;      // same length as tokens, or empty for all NORMAL
  std::vector<std::string> merges;       // "left right", rank order
  PreTokenizerKind pre_tokenizer = PreTokenizerKind::Qwen2;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::optional<int32_t> pad_id;
  std::string source = "tokenizer";      // names the origin (file path) in error messages
};

struct EncodeOptions {
  // Match CONTROL tokens (e.g. <|im_start|>) in the text. USER_DEFINED tokens (e.g. <think>) are
  // always matched. Set false for untrusted text that must not inject control tokens.
  bool parse_special = true;
};

struct DecodeOptions {
  bool render_control = true;  // false: CONTROL tokens produce no text
};

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerSpec spec);
  // Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,eos_token_id,
  // padding_token_id}. model must be "gpt2"; pre must be "qwen2" or "qwen35" (a missing pre is an
  // error too: guessing a split silently changes tokens).
  static Tokenizer from_gguf(const GgufFile& file);
  // Parses a "tokenizer.ggml.pre" value; throws naming `source` and the accepted values.
  static PreTokenizerKind parse_pre_tokenizer(std::string_view name, std::string_view source);

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Appends to `ids` (avoids a copy when building a prompt from parts).
  void encode_append(std::string_view text, std::vector<int32_t>& ids,
                     const EncodeOptions& options = {}) const;
  // Throws strata::Error naming the id when an id is out of range.
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options = {}) const;

  int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  bool valid_id(int32_t id) const { return id >= 0 && id < n_tokens(); }
  // Stored text of a token (byte-level form for NORMAL tokens). Throws for an invalid id.
  const std::string& token_text(int32_t id) const;
  // The raw bytes a token decodes to (may be a partial UTF-8 character). Throws for an invalid id.
  const std::string& token_bytes(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // Id of the token whose stored text is exactly `text` (any type), if any.
  std::optional<int32_t> find_token(std::string_view text) const;

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> pad_id() const { return pad_id_; }
  PreTokenizerKind pre_tokenizer() const { return pre_; }
  const std::string& source() const { return source_; }

 private:
  struct Impl;  // merge table, added-token matcher, cache
  std::string check_id(int32_t id) const;
  void encode_segment(std::string_view segment, std::vector<int32_t>& ids) const;

  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::vector<std::string> bytes_;  // decoded bytes per token
  PreTokenizerKind pre_ = PreTokenizerKind::Qwen2;
  std::optional<int32_t> bos_id_, eos_id_, pad_id_;
  std::string source_;
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text, emitting only complete UTF-8 characters: a character
// whose bytes span several tokens appears once its last byte has arrived. Ill-formed bytes become
// U+FFFD as soon as they cannot be completed; `finish` flushes an incomplete tail as U+FFFD. The
// concatenation of all `push` results and `finish` equals Tokenizer::decode of all ids.
// Not thread-safe (one per stream); the Tokenizer must outlive it.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, DecodeOptions options = {});
  // Text that became complete with this token (often empty for a partial character).
  std::string push(int32_t id);
  std::string finish();
  // Bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }
  void reset() { pending_.clear(); }

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::string pending_;
};

}  // namespace strata
