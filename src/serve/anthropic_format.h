// The Anthropic Messages API wire format (POST /v1/messages), for clients written against it
// (the `@anthropic-ai/sdk` and `anthropic` packages, Claude-style tools). Requests are parsed by
// serve/request.h (parse_anthropic_messages_request); this file writes the answers.
//   whole:  {"id":"msg_…","type":"message","role":"assistant","model":…,"content":[
//            {"type":"thinking","thinking":…,"signature":""} (when the model thought),
//            {"type":"text","text":…}],"stop_reason":…,"stop_sequence":null,
//            "usage":{"input_tokens":…,"output_tokens":…}}
//   stream: server-sent events, each with its `event:` name: message_start (the message with no
//           content and output_tokens 0), then per content block content_block_start,
//           content_block_delta (thinking_delta or text_delta)…, content_block_stop; then
//           message_delta (stop_reason, usage.output_tokens) and message_stop. A failure after the
//           headers went out is an `error` event.
//   error:  {"type":"error","error":{"type":…,"message":…}}, the type from the HTTP status
//           (invalid_request_error, authentication_error, not_found_error, request_too_large,
//           rate_limit_error, overloaded_error, api_error).
// stop_reason: "max_tokens" when max_tokens (or the context) ended the reply, "stop_sequence"
// when one of stop_sequences did (and "stop_sequence" names it; null otherwise), "tool_use" after
// tool calls, else "end_turn".
// A reply always has a text block (possibly empty) after its thinking block.
// Pure functions and a per-stream writer (not thread-safe: one per stream).
#pragma once

#include <string>
#include <string_view>

#include "serve/openai_format.h"

namespace strata::serve {

// `stop_sequence`: the stop sequence that ended the reply, "" when none did.
Json anthropic_message_json(const std::string& id, const std::string& model, const TextDelta& text,
                            FinishReason finish, const Usage& usage,
                            std::string_view stop_sequence = {});
Json anthropic_error_json(const ApiError& error);
// "event: <name>\ndata: <json>\n\n"
std::string anthropic_event(std::string_view name, const Json& data);

// The events of one streamed message, built as its text arrives.
class AnthropicStream {
 public:
  AnthropicStream(std::string id, std::string model, int64_t input_tokens);
  std::string start() const;
  // Opens a thinking or text block as the delta needs (closing the open one), then its deltas.
  std::string delta(const TextDelta& delta);
  std::string finish(FinishReason finish, const Usage& usage, std::string_view stop_sequence = {});
  static std::string error(const ApiError& error);

 private:
  enum class Block { None, Thinking, Text };
  std::string open(Block block);
  std::string close();

  std::string id_, model_;
  int64_t input_tokens_;
  Block open_ = Block::None;
  int index_ = -1;
};

}  // namespace strata::serve
