// The OpenAI wire format of responses: completion objects, streamed chunks (server-sent events),
// usage and errors, for /v1/chat/completions and /v1/completions.
//
// Shapes follow the OpenAI API reference as of 2025:
//   chat, whole:   {"id":"chatcmpl-…","object":"chat.completion","created":…,"model":…,
//                   "system_fingerprint":…,"choices":[{"index":0,"message":{"role":"assistant",
//                   "content":…,"refusal":null},"logprobs":null,"finish_reason":…}],"usage":{…}}
//   chat, chunk:   {"id":…,"object":"chat.completion.chunk","created":…,"model":…,
//                   "system_fingerprint":…,"choices":[{"index":0,"delta":{…},"logprobs":null,
//                   "finish_reason":null|…}]}  (+ "usage":null on every chunk when include_usage,
//                   and one last chunk with "choices":[] and the usage)
//   completions:   "object":"text_completion", choices [{"text":…,"index":0,"logprobs":null,
//                   "finish_reason":…}], same for chunks.
// A stream is a sequence of `data: <json>\n\n` events ending with `data: [DONE]\n\n`.
// Reasoning (a Qwen <think> block) travels in "reasoning_content" next to "content", as
// llama.cpp's and vLLM's servers send it.
//
// Pure functions; every JSON text produced is valid UTF-8 (invalid bytes are replaced).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "serve/api_error.h"
#include "serve/request.h"

namespace strata::serve {

// Keys keep the order they are written in, so responses read like OpenAI's.
using Json = nlohmann::ordered_json;

enum class FinishReason { Stop, Length };
std::string_view finish_reason_name(FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens resumed from the state cache, not prefilled
};

// What every object of one completion shares.
struct CompletionIdentity {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::string id;       // "chatcmpl-…" / "cmpl-…"
  int64_t created = 0;  // unix seconds
  std::string model;
};

// A new id for `endpoint` with 24 random alphanumerics (thread-safe).
std::string new_completion_id(Endpoint endpoint);
// `prefix` followed by 24 random alphanumerics (thread-safe): "msg_…" for Anthropic's messages.
std::string new_random_id(std::string_view prefix);

// One piece of generated text.
struct TextDelta {
  std::string content;
  std::string reasoning;
};

Json usage_json(const Usage& usage);
Json error_json(const ApiError& error);
// The whole (non-streamed) completion object.
Json completion_json(const CompletionIdentity& identity, const TextDelta& text, FinishReason finish,
                     const Usage& usage);

// Chunks of a stream. `include_usage` adds "usage":null to each (OpenAI's stream_options rule).
Json chat_role_chunk(const CompletionIdentity& identity, bool include_usage);
Json delta_chunk(const CompletionIdentity& identity, const TextDelta& delta, bool include_usage);
Json finish_chunk(const CompletionIdentity& identity, FinishReason finish, bool include_usage);
Json usage_chunk(const CompletionIdentity& identity, const Usage& usage);

// JSON text (compact, invalid UTF-8 replaced by U+FFFD).
std::string dump_json(const Json& value);
// "data: <json>\n\n"
std::string sse_event(const Json& value);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace strata::serve
