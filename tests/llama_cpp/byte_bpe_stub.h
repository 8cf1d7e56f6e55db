// A stand-in vocabulary for the tokenizer-less fixture checkpoints, so that `strata convert` writes
// a tokenizer section llama.cpp accepts (llama.cpp refuses a GGUF without tokenizer.ggml.model, and
// a "gpt2" vocabulary without tokenizer.ggml.merges).  It exists for the llama.cpp parity test
// only: the comparison feeds token ids, so what the tokens spell never matters, only that the
// vocabulary has exactly the model's vocab_size entries.
//
// Layout (GPT-2 byte-level BPE, as HF tokenizers writes it):
//   ids 0..n_bytes-1  the byte tokens of bytes 0..n_bytes-1, spelled with GPT-2's byte→unicode map
//   ids n_bytes..     merges of two lower-case letters "a b" → "ab", in the order aa, ab, ..., pp
// n_bytes = 256 when vocab_size > 256; when vocab_size ≤ 256 (qwen3next: 256) the top bytes are
// dropped so that one merge still fits, because llama.cpp requires at least one merge.
// Throws strata::Error when vocab_size is < 2 or > 512 (more than 16×16 letter merges).
#pragma once

#include <cstdint>
#include <string>

namespace strata::testing_llama_cpp {

struct ByteBpeStubSummary {
  int64_t n_byte_tokens = 0;
  int64_t n_merges = 0;
};

// Writes `directory`/tokenizer.json and `directory`/tokenizer_config.json for `vocab_size` ids.
ByteBpeStubSummary write_byte_bpe_stub(const std::string& directory, int64_t vocab_size);

// GPT-2's printable spelling of one byte (U+0021..U+007E, U+00A1..U+00AC, U+00AE..U+00FF map to
// themselves; the other 68 bytes to U+0100.. in byte order), as UTF-8.
std::string gpt2_byte_spelling(uint8_t byte);

}  // namespace strata::testing_llama_cpp
