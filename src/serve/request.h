// OpenAI request parsing and validation for /v1/chat/completions and /v1/completions (and the
// llama-server /tokenize and /detokenize bodies).
//
// Pure: a request body (bytes) and the server's limits in, a validated GenerationRequest or an
// ApiError out. No sockets, no model; unit-tested (tests/serve/request_test.cpp) and fuzzed
// (fuzz/fuzz_serve_request.cpp).
//
// Contract
// - Never throws and never crashes, whatever the bytes: every rejection is an ApiError with a 4xx
//   status whose `param` names the field at fault (a JSON path such as "messages[1].content")
//   and whose message says what was expected and what was found.
// - Malformed JSON and invalid UTF-8 are reported with the byte offset and the field being read
//   when the parser stopped. Nesting deeper than RequestLimits::max_json_depth is rejected before
//   parsing.
// - Accepted: the OpenAI fields that strata honours (model, messages / prompt, max_tokens,
//   max_completion_tokens, temperature, top_p, seed, n (1..RequestLimits::max_choices), stop,
//   stream, stream_options.include_usage, logit_bias (token-id keys in [0, n_vocab), values in
//   [-100, 100]), frequency_penalty and presence_penalty ([-2, 2]), logprobs and top_logprobs
//   (chat: a boolean and 0..20; completions: the legacy integer 0..20)) and the llama.cpp server
//   extensions top_k, min_p, repeat_penalty (alias repetition_penalty), ignore_eos and
//   chat_template_kwargs.enable_thinking, and response_format (serve/response_format.h: text,
//   json_object, json_schema; both endpoints), and llama-server's grammar (GBNF text,
//   grammar/gbnf.h; both endpoints; "" or null is none; a syntax error is a 400 naming its line
//   and column; refused together with a json_object / json_schema response_format or with tools
//   offered, each of which constrains the reply on its own). Chat also takes tools (function tools:
//   name [a-zA-Z0-9_-]{1,64}, optional description and parameters object; at most
//   RequestLimits::max_tools), tool_choice ("none", "auto", "required" or {"type": "function",
//   "function": {"name": …}} naming one of the tools), parallel_tool_calls, assistant messages
//   with tool_calls (function.arguments a JSON object, as a string or an object) and tool
//   messages with tool_call_id. OpenAI fields whose effect strata cannot give (legacy
//   functions/function_call, echo, best_of, suffix) are rejected
//   with a message saying so rather than silently ignored. Other unknown fields are ignored (as
//   llama.cpp's server does).
// - A missing "model" means the served model; a different name is 404 model_not_found.
// - Checks that need the tokenizer or the context length of the prompt (empty prompt, prompt
//   longer than the context) are made later, by serve/plan.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "serve/api_error.h"
#include "serve/response_format.h"
#include "text/chat_template.h"

namespace strata::serve {

enum class Endpoint { ChatCompletions, Completions };

struct RequestLimits {
  std::string model_id;         // the one model this server serves
  int32_t n_vocab = 0;          // token-id prompts must be in [0, n_vocab)
  int64_t n_ctx = 0;            // the context length (--ctx, else the model's; 0 = no limit)
  size_t max_stop_strings = 4;  // OpenAI's limit
  size_t max_stop_bytes = 256;
  int max_json_depth = 32;
  int max_choices = 16;          // n: each choice is a generation of its own
  size_t max_logit_bias = 1024;  // logit_bias entries
  size_t max_tools = 128;
};

// OpenAI's bounds (API reference): top_logprobs and logit_bias values.
inline constexpr int kMaxTopLogprobs = 20;
inline constexpr double kMaxLogitBias = 100.0;

// Sampling settings the request set; unset ones take the server's defaults.
struct SamplingOverrides {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<uint64_t> seed;
  std::optional<float> frequency_penalty;
  std::optional<float> presence_penalty;
  std::vector<std::pair<int32_t, float>> logit_bias;  // by token id, ascending
};

// tool_choice: "none" (tools not offered: neither rendered nor parsed), "auto" (the default),
// "required" (some call) or one named function (see serve/plan.h for how the last two are kept).
enum class ToolChoice { None, Auto, Required, Function };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::string model;                   // the served model id (also when the request named none)
  std::vector<ChatMessage> messages;   // chat: at least one
  std::string prompt_text;             // completions: a text prompt ...
  std::vector<int32_t> prompt_tokens;  // ... or token ids (prompt_is_tokens)
  bool prompt_is_tokens = false;
  std::optional<int64_t> max_tokens;  // >= 1 and <= n_ctx when set
  SamplingOverrides sampling;
  std::vector<std::string> stop;  // non-empty strings
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;
  std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking
  ResponseFormat response_format;       // structured output (grammar set unless type Text)
  // The `grammar` field compiled: every token of the reply is drawn under it (as under a
  // response_format's grammar, which it excludes). Null when not given.
  std::shared_ptr<const grammar::Grammar> grammar;
  int n = 1;  // choices, each generated on its own
  // Set when the response carries log-probabilities: how many alternatives per token (chat:
  // top_logprobs with logprobs: true; completions: logprobs N).
  std::optional<int> logprobs;
  std::vector<std::string> tools;  // chat: each tool object's JSON text, keys in the order sent
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_function;  // ToolChoice::Function: the function's name
  bool parallel_tool_calls = true;   // false: only the first call of a reply is returned
};

using ParseResult = std::variant<GenerationRequest, ApiError>;

// `grammars`: where a response_format's or a grammar field's compiled grammar is looked up and
// kept (null: none).
ParseResult parse_generation_request(std::string_view body, Endpoint endpoint,
                                     const RequestLimits& limits, GrammarCache* grammars = nullptr);

// Anthropic's Messages API (POST /v1/messages) through the same validation
// (serve/anthropic_request.cpp): the body is translated to the OpenAI chat shape and parsed as a
// chat request.
// - `system` (a string or text blocks) becomes a first system message; `stop_sequences` becomes
//   `stop`; `thinking.type` "enabled"/"disabled" becomes chat_template_kwargs.enable_thinking;
//   `max_tokens` is required, as Anthropic requires it; `metadata` is ignored.
// - `messages`: roles "user" and "assistant", content a string or blocks. An assistant message's
//   text, thinking ({"type": "thinking", "thinking"}) and tool_use ({"id", "name", "input": an
//   object}) blocks become one assistant message with content, reasoning_content and tool_calls
//   (arguments: the input's JSON, keys as sent). A user message's tool_result blocks
//   ({"tool_use_id", "content": a string or text blocks, "is_error"}) become "tool" messages and
//   its runs of text blocks user messages, in the order sent; a tool_result must answer a
//   tool_use of the assistant message just before it (each once), and one with is_error true
//   reaches the model as "Error: " and its content. Other blocks (image, document, ...) are
//   refused, naming them.
// - `tools`: client tools {name, description, input_schema} (type absent or "custom") become
//   function tools {"type": "function", "function": {name, description, parameters}}, keys in the
//   order sent; `tool_choice` {"type": "auto" | "any" | "tool" (with "name") | "none"} becomes
//   "auto", "required", the named function or "none", and its disable_parallel_tool_use true
//   parallel_tool_calls false.
// Errors name the Anthropic field as sent (system[1].type, stop_sequences[1], thinking.type,
// messages[2].content[0].tool_use_id, tools[0].input_schema, tool_choice.name); the shared fields
// keep their names (max_tokens, temperature).
ParseResult parse_anthropic_messages_request(std::string_view body, const RequestLimits& limits);
// An error about the translated chat request found later (serve/plan.h compiles the tools'
// grammar) renamed to the Anthropic body's field: tools[0].function.parameters.properties.x
// becomes tools[0].input_schema.properties.x, in `param` and in the message.
void name_anthropic_fields(ApiError& error);

// llama-server's tokenizer endpoints, same JSON shapes and defaults:
//   POST /tokenize   {"content": "text", "add_special": false, "parse_special": true,
//                     "with_pieces": false}
//   POST /detokenize {"tokens": [1, 2, 3]}
// The same contract as parse_generation_request: bad JSON, a missing or mistyped field, a token id
// outside [0, n_vocab) is an ApiError naming the field ("tokens[2]").
struct TokenizeRequest {
  std::string content;
  bool add_special = false;   // BOS/EOS as the model adds them (strata's tokenizers add none)
  bool parse_special = true;  // control-token text such as <|im_start|> becomes that token
  bool with_pieces = false;   // answer [{"id", "piece"}] instead of bare ids
};
struct DetokenizeRequest {
  std::vector<int32_t> tokens;
};
std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body,
                                                               const RequestLimits& limits);
std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view body,
                                                                   const RequestLimits& limits);

// The path of the endpoint ("/v1/chat/completions"), for messages and metrics labels.
std::string_view endpoint_path(Endpoint endpoint);

}  // namespace strata::serve
