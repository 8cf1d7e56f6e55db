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
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "serve/api_error.h"
#include "serve/request.h"

namespace strata::serve {

// Keys keep the order they are written in, so responses read like OpenAI's.
using Json = nlohmann::ordered_json;

enum class FinishReason { Stop, Length, ToolCalls };
std::string_view finish_reason_name(FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens resumed from the state cache, not prefilled
  // Of completion_tokens, those generated inside the reply's leading think block (its closing
  // tag included; ThinkFilter decides where the block is): OpenAI's reasoning_tokens.
  int64_t reasoning_tokens = 0;
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

// One generated token's log-probability, as responses report it (serve/generator.h says of
// which distribution). Bytes are the token's own, possibly part of a UTF-8 character.
struct LogprobEntry {
  struct Alternative {
    std::string bytes;
    double logprob = 0;
  };
  std::string bytes;
  double logprob = 0;
  std::vector<Alternative> top;  // most likely first
};

// A tool call, or a piece of one, of a streamed reply (OpenAI's delta.tool_calls[i]): the first
// delta of call `index` has its id and name, the next ones fragments of its arguments.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

// One piece of generated text of choice `choice`, with the log-probabilities of the tokens that
// produced it (when the request asked for them) and tool calls found in it.
struct TextDelta {
  std::string content;
  std::string reasoning;
  int choice = 0;
  std::vector<LogprobEntry> logprobs;
  std::vector<ToolCallDelta> tool_calls;
};

// One whole choice of a non-streamed response.
struct ChoiceResult {
  TextDelta text;  // every delta of the choice appended (tool calls merged by index)
  FinishReason finish = FinishReason::Stop;
};

Json usage_json(const Usage& usage);
Json error_json(const ApiError& error);
// The whole (non-streamed) completion object, one choice or several (`logprobs`: the request
// asked for log-probabilities, so each choice carries them, possibly an empty list).
Json completion_json(const CompletionIdentity& identity, const TextDelta& text, FinishReason finish,
                     const Usage& usage);
Json completion_json(const CompletionIdentity& identity, std::span<const ChoiceResult> choices,
                     const Usage& usage, bool logprobs);

// A choice's "logprobs" value. Chat: {"content":[{"token","logprob","bytes","top_logprobs"}],
// "refusal":null}. Completions (the legacy shape): {"tokens","token_logprobs","top_logprobs"
// (one {token: logprob} object per token),"text_offset"}; `text_offset` is the byte offset of the
// first entry in the choice's text (counting from the start of the completion, not the prompt).
Json logprobs_json(Endpoint endpoint, std::span<const LogprobEntry> entries, int64_t text_offset);

// Chunks of a stream. `include_usage` adds "usage":null to each (OpenAI's stream_options rule).
// `text_offset`: see logprobs_json (completions with logprobs only).
Json chat_role_chunk(const CompletionIdentity& identity, bool include_usage, int choice = 0);
Json delta_chunk(const CompletionIdentity& identity, const TextDelta& delta, bool include_usage,
                 int64_t text_offset = 0);
Json finish_chunk(const CompletionIdentity& identity, FinishReason finish, bool include_usage,
                  int choice = 0);
Json usage_chunk(const CompletionIdentity& identity, const Usage& usage);

// JSON text (compact, invalid UTF-8 replaced by U+FFFD).
std::string dump_json(const Json& value);
// "data: <json>\n\n"
std::string sse_event(const Json& value);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace strata::serve
