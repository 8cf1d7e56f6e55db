// The answers of llama-server's utility endpoints, as pure functions from a parsed request to
// JSON (the routes are in http_server.cpp):
//   POST /tokenize   → {"tokens": [ids]} or, with with_pieces, {"tokens": [{"id", "piece"}]};
//                      a piece that is not valid UTF-8 on its own (part of a character) is its
//                      list of byte values, as llama-server does
//   POST /detokenize → {"content": "text"} (invalid UTF-8 from a partial character is replaced
//                      with U+FFFD by the JSON writer)
//   GET  /props      → llama-server's fields (default_generation_settings with n_ctx and the
//                      default sampling params, total_slots, model_path, chat_template,
//                      build_info, modalities) plus "strata": the served id, the request limits,
//                      the batch groups (how many, and why) and the expert budget (how the
//                      routed experts are held)
// No state; thread-safe as far as the tokenizer is (its encode/decode are const).
#pragma once

#include <string>

#include "serve/openai_format.h"
#include "serve/plan.h"
#include "serve/request.h"

namespace strata::serve {

Json tokenize_response(const Tokenizer& tokenizer, const TokenizeRequest& request);
Json detokenize_response(const Tokenizer& tokenizer, const DetokenizeRequest& request);

// The server-side figures /props reports besides the model's.
struct PropsLimits {
  size_t max_queue = 0;
  size_t max_connections = 0;
  size_t max_body_bytes = 0;
  int timeout_s = 0;
  std::string speculative;  // "off", "mtp", "suffix", "both"
  std::string build_info;   // `strata --version`'s text, "" when not given
  int slots = 1;            // --parallel
  int batch_groups = 1;     // --batch-groups, as chosen at start
  std::string batch_groups_reason;
};
Json props_json(const ServedModel& served, const PropsLimits& limits);

}  // namespace strata::serve
