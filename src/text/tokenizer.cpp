#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "text/bpe.h"
#include "text/unicode.h"
#include "text/utf8.h"
#include "util/error.h"

namespace strata {
namespace {

// Pieces up to this many bytes are cached (longer ones are rare and would bloat the cache).
constexpr size_t kMaxCachedPieceBytes = 64;
// The cache is cleared when it reaches this many entries: bounded memory, and a working set of
// common words refills it quickly.
constexpr size_t kMaxCacheEntries = 1 << 16;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TextToId = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// GPT-2's reversible byte <-> printable code point mapping: bytes that are printable Latin-1
// ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map to themselves, the other 68 bytes to U+0100 + k
// in byte order.
std::array<char32_t, 256> make_byte_to_codepoint() {
  std::array<char32_t, 256> table{};
  char32_t next_shifted = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[b] = printable ? char32_t(b) : next_shifted++;
  }
  return table;
}

const std::array<char32_t, 256>& byte_to_codepoint() {
  static const std::array<char32_t, 256> table = make_byte_to_codepoint();
  return table;
}

// Inverse mapping for code points < 0x144 (all mapped code points are below it); -1 elsewhere.
int codepoint_to_byte(char32_t cp) {
  static const std::array<int16_t, 0x144> table = [] {
    std::array<int16_t, 0x144> t{};
    t.fill(-1);
    const auto& forward = byte_to_codepoint();
    for (int b = 0; b < 256; ++b) t[forward[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

// "<0xAB>" -> 0xAB, else -1.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = text[i];
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// The bytes a NORMAL token stands for: the byte-level mapping undone when every code point of the
// text is a mapped one; otherwise the text itself (what Hugging Face's ByteLevel decoder does).
std::string byte_level_decode(std::string_view text) {
  if (!utf8_is_valid(text)) return std::string(text);
  std::string out;
  for (size_t pos = 0; pos < text.size();) {
    char32_t cp = 0;
    pos += utf8_decode_valid(text, pos, cp);
    const int b = codepoint_to_byte(cp);
    if (b < 0) return std::string(text);
    out.push_back(static_cast<char>(b));
  }
  return out;
}

std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  struct AddedToken {
    std::string_view text;
    int32_t id;
    bool control;
  };
  MergeTable merges;
  std::array<int32_t, 256> byte_token{};
  TextToId text_to_id;
  // Added tokens by first byte, longest first (leftmost-longest matching).
  std::array<std::vector<AddedToken>, 256> added_by_first_byte;
  std::array<bool, 256> added_first_byte{};

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;
};

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

PreTokenizerKind Tokenizer::parse_pre_tokenizer(std::string_view name, std::string_view source) {
  if (name == "qwen2") return PreTokenizerKind::Qwen2;
  if (name == "qwen35") return PreTokenizerKind::Qwen35;
  fail("{}: tokenizer.ggml.pre: expected \"qwen2\" or \"qwen35\", found \"{}\" (other pre-tokenizers "
       "split text differently and are not implemented)",
       source, printable(name));
}

Tokenizer::Tokenizer(TokenizerSpec spec)
    : tokens_(std::move(spec.tokens)),
      pre_(spec.pre_tokenizer),
      bos_id_(spec.bos_id),
      eos_id_(spec.eos_id),
      pad_id_(spec.pad_id),
      source_(std::move(spec.source)),
      impl_(std::make_unique<Impl>()) {
  const size_t n = tokens_.size();
  if (n == 0) fail("{}: tokenizer.ggml.tokens: expected at least one token, found none", source_);
  if (n > size_t(INT32_MAX)) fail("{}: tokenizer.ggml.tokens: {} tokens is too many", source_, n);
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    fail("{}: tokenizer.ggml.token_type: expected {} entries (one per token), found {}", source_, n,
         spec.token_types.size());
  }
  types_.resize(n, TokenType::Normal);
  for (size_t i = 0; i < spec.token_types.size(); ++i) {
    const int32_t t = spec.token_types[i];
    if (t < 0 || t > 6) {
      fail("{}: tokenizer.ggml.token_type[{}]: expected a type in 0..6, found {}", source_, i, t);
    }
    types_[i] = static_cast<TokenType>(t);
  }

  // Text -> id: plain tokens first so that an added token with the same text never shadows them.
  Impl& impl = *impl_;
  impl.text_to_id.reserve(n);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < n; ++i) {
      const bool added = types_[i] == TokenType::Control || types_[i] == TokenType::UserDefined;
      if (added == (pass == 1)) impl.text_to_id.emplace(tokens_[i], static_cast<int32_t>(i));
    }
  }

  // Bytes per token, and the added-token matcher.
  bytes_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = tokens_[i];
    switch (types_[i]) {
      case TokenType::Control:
      case TokenType::UserDefined:
        bytes_[i] = text;
        if (!text.empty() && utf8_is_valid(text)) {
          const auto first = static_cast<unsigned char>(text[0]);
          impl.added_by_first_byte[first].push_back(
              {tokens_[i], static_cast<int32_t>(i), types_[i] == TokenType::Control});
          impl.added_first_byte[first] = true;
        }
        break;
      case TokenType::Byte: {
        const int b = parse_byte_token(text);
        bytes_[i] = b >= 0 ? std::string(1, static_cast<char>(b)) : text;
        break;
      }
      default:
        bytes_[i] = byte_level_decode(text);
    }
  }
  for (auto& list : impl.added_by_first_byte) {
    std::stable_sort(list.begin(), list.end(), [](const Impl::AddedToken& a, const Impl::AddedToken& b) {
      return a.text.size() > b.text.size();
    });
  }

  // Initial symbol of each byte: its byte-level token, else its <0xXX> byte token (byte fallback).
  for (int b = 0; b < 256; ++b) {
    std::string byte_char;
    append_utf8(byte_char, byte_to_codepoint()[b]);
    auto it = impl.text_to_id.find(byte_char);
    if (it == impl.text_to_id.end()) it = impl.text_to_id.find(fmt::format("<0x{:02X}>", b));
    if (it == impl.text_to_id.end()) {
      fail("{}: tokenizer.ggml.tokens: byte 0x{:02X} has no token (expected \"{}\" or \"<0x{:02X}>\"); "
           "a byte-level BPE vocabulary must cover all 256 bytes",
           source_, b, byte_char, b);
    }
    impl.byte_token[b] = it->second;
  }

  // Merge table: (left id, right id) -> (rank, merged id).
  impl.merges = MergeTable(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string& merge = spec.merges[rank];
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos || space + 1 >= merge.size()) {
      fail("{}: tokenizer.ggml.merges[{}]: expected \"left right\", found \"{}\"", source_, rank,
           printable(merge));
    }
    const std::string_view left(merge.data(), space);
    const std::string_view right(merge.data() + space + 1, merge.size() - space - 1);
    const std::string merged = std::string(left) + std::string(right);
    int32_t ids[3];
    const std::string_view parts[3] = {left, right, merged};
    const char* roles[3] = {"left part", "right part", "merge result"};
    for (int k = 0; k < 3; ++k) {
      const auto it = impl.text_to_id.find(parts[k]);
      if (it == impl.text_to_id.end()) {
        fail("{}: tokenizer.ggml.merges[{}] = \"{}\": {} \"{}\" is not in tokenizer.ggml.tokens",
             source_, rank, printable(merge), roles[k], printable(parts[k]));
      }
      ids[k] = it->second;
    }
    impl.merges.insert(ids[0], ids[1], static_cast<int32_t>(rank), ids[2]);  // duplicates: first wins
  }

  const std::pair<const char*, const std::optional<int32_t>*> specials[] = {
      {"bos_token_id", &bos_id_}, {"eos_token_id", &eos_id_}, {"padding_token_id", &pad_id_}};
  for (const auto& [name, id] : specials) {
    if (id->has_value() && !valid_id(**id)) {
      fail("{}: tokenizer.ggml.{}: expected a token id in [0, {}), found {}", source_, name, n, **id);
    }
  }
}

std::string Tokenizer::check_id(int32_t id) const {
  return fmt::format("{}: token id {} is out of range (vocabulary has {} tokens)", source_, id,
                     n_tokens());
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (!valid_id(id)) throw Error(check_id(id));
  return tokens_[id];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (!valid_id(id)) throw Error(check_id(id));
  return bytes_[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (!valid_id(id)) throw Error(check_id(id));
  return types_[id];
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const auto it = impl_->text_to_id.find(text);
  if (it == impl_->text_to_id.end()) return std::nullopt;
  return it->second;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_append(text, ids, options);
  return ids;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& ids,
                              const EncodeOptions& options) const {
  std::string repaired;
  if (!utf8_is_valid(text)) {
    repaired = utf8_repair(text);
    text = repaired;
  }
  const Impl& impl = *impl_;
  size_t segment_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const auto first = static_cast<unsigned char>(text[pos]);
    const Impl::AddedToken* match = nullptr;
    if (impl.added_first_byte[first]) {
      for (const Impl::AddedToken& token : impl.added_by_first_byte[first]) {
        if (token.control && !options.parse_special) continue;
        if (text.compare(pos, token.text.size(), token.text) == 0) {
          match = &token;
          break;
        }
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    encode_segment(text.substr(segment_start, pos - segment_start), ids);
    ids.push_back(match->id);
    pos += match->text.size();
    segment_start = pos;
  }
  encode_segment(text.substr(segment_start), ids);
}

void Tokenizer::encode_segment(std::string_view segment, std::vector<int32_t>& ids) const {
  if (segment.empty()) return;
  std::string normalized;
  if (!is_nfc(segment)) {
    normalized = nfc_normalize(segment);
    segment = normalized;
  }
  const Impl& impl = *impl_;
  BpeScratch bpe_scratch;
  std::vector<int32_t> piece_ids;
  PreTokenizerCursor cursor(segment, pre_);
  std::string_view piece;
  while (cursor.next(piece)) {
    const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
    if (cacheable) {
      std::lock_guard lock(impl.cache_mutex);
      const auto it = impl.cache.find(piece);
      if (it != impl.cache.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    piece_ids.clear();
    for (const char c : piece) piece_ids.push_back(impl.byte_token[static_cast<unsigned char>(c)]);
    bpe_merge(impl.merges, piece_ids, bpe_scratch);
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    if (cacheable) {
      std::lock_guard lock(impl.cache_mutex);
      if (impl.cache.size() >= kMaxCacheEntries) impl.cache.clear();
      impl.cache.emplace(std::string(piece), piece_ids);
    }
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  std::string raw;
  for (const int32_t id : ids) {
    if (!valid_id(id)) throw Error(check_id(id));
    if (!options.render_control && types_[id] == TokenType::Control) continue;
    raw += bytes_[id];
  }
  if (utf8_is_valid(raw)) return raw;
  return utf8_repair(raw);
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(&tokenizer), options_(options) {}

std::string StreamingDecoder::push(int32_t id) {
  const std::string& bytes = tokenizer_->token_bytes(id);  // throws for a bad id
  if (!options_.render_control && tokenizer_->token_type(id) == TokenType::Control) return {};
  pending_ += bytes;
  std::string out;
  const size_t consumed = utf8_repair_prefix(pending_, /*at_end=*/false, out);
  pending_.erase(0, consumed);
  return out;
}

std::string StreamingDecoder::finish() {
  std::string out;
  utf8_repair_prefix(pending_, /*at_end=*/true, out);
  pending_.clear();
  return out;
}

}  // namespace strata
