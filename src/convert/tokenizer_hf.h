// The tokenizer section of a converted GGUF, written as llama.cpp's converter writes it for a
// GPT-2-style byte-level BPE (`_set_vocab_gpt2` + gguf-py's SpecialVocab):
//   tokenizer.ggml.model "gpt2", .pre (per arch), .tokens (id order, vocab_size of them; ids the
//   tokenizer lacks become "[PAD<id>]" of type UNUSED), .token_type (NORMAL 1, CONTROL 3 for special
//   added tokens or ones that look special like <|...|>, USER_DEFINED 4 for other added tokens),
//   .merges ("a b"), the special token ids (from tokenizer_config.json's *_token strings looked up
//   among tokenizer.json's added tokens, then config.json's *_token_id), add_{bos,eos,sep}_token
//   flags from tokenizer_config.json, and tokenizer.chat_template.
// Throws strata::Error naming the file and field for malformed input (e.g. a non-BPE model, a token
// id outside the vocabulary).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "convert/hf_config.h"
#include "gguf/gguf_writer.h"

namespace strata::convert {

// Returns false and writes nothing when `directory` has no tokenizer.json.
bool add_hf_tokenizer(const std::string& directory, const HfConfig& config, int64_t vocab_size,
                      std::string_view pre, GgufWriter& writer);

// llama.cpp's heuristic for added tokens that should be CONTROL even when not marked special.
bool token_looks_special(std::string_view token);

}  // namespace strata::convert
