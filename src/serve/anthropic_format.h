// The Anthropic Messages API wire format (POST /v1/messages), for clients written against it
// (the `@anthropic-ai/sdk` and `anthropic` packages, Claude-style tools). Requests are parsed by
// serve/request.h (parse_anthropic_messages_request); this file writes the answers.
//   whole:  {"id":"msg_…","type":"message","role":"assistant","model":…,"content":[
//            {"type":"thinking","thinking":…,"signature":""} (when the model thought),
//            {"type":"text","text":…} (unless the reply is tool calls and no text),
//            {"type":"tool_use","id":"toolu_…","name":…,"input":{…}} per tool call],
//            "stop_reason":…,"stop_sequence":null,"usage":{"input_tokens":…,"output_tokens":…}}
//   stream: server-sent events, each with its `event:` name: message_start (the message with no
//           content and output_tokens 0), then per content block content_block_start,
//           content_block_delta (thinking_delta, text_delta, or input_json_delta with a fragment
//           of a tool call's arguments as `partial_json`)…, content_block_stop; then
//           message_delta (stop_reason, usage.output_tokens) and message_stop. Blocks are
//           numbered 0, 1, … in the order they open, whatever their type; a tool_use block opens
//           with "input":{} and its arguments arrive as input_json_delta fragments. A failure
//           after the headers went out is an `error` event.
//   error:  {"type":"error","error":{"type":…,"message":…}}, the type from the HTTP status
//           (invalid_request_error, authentication_error, not_found_error, request_too_large,
//           rate_limit_error, overloaded_error, api_error).
// stop_reason: "max_tokens" when max_tokens (or the context) ended the reply, "stop_sequence"
// when one of stop_sequences did (and "stop_sequence" names it; null otherwise), "tool_use" after
// tool calls, else "end_turn".
// Blocks come in the order the reply wrote them, the same whole and streamed (text written after
// a call, such as the start of a call max_tokens cut short, is a text block after the tool_use
// blocks). A reply always has a text block (possibly empty) after its thinking block, unless it
// has tool calls: then a text block only when there is text. The generator's call ids
// ("call_…") are written as Anthropic's ("toolu_…", the same random part).
// Pure functions and a per-stream writer (not thread-safe: one per stream).
#pragma once

#include <string>
#include <string_view>

#include "serve/openai_format.h"

namespace strata::serve {

// `stop_sequence`: the stop sequence that ended the reply, "" when none did. `text`: the reply as
// one delta (its thinking, its text, then its calls); a reply with its deltas in the order
// generated is AnthropicStream::message.
Json anthropic_message_json(const std::string& id, const std::string& model, const TextDelta& text,
                            FinishReason finish, const Usage& usage,
                            std::string_view stop_sequence = {});
Json anthropic_error_json(const ApiError& error);
// "event: <name>\ndata: <json>\n\n"
std::string anthropic_event(std::string_view name, const Json& data);
// A tool call's id as Anthropic writes it: "call_abc" (the generator's) is "toolu_abc".
std::string anthropic_tool_use_id(std::string_view call_id);

// The events of one streamed message, built as its text arrives, and the content blocks they
// describe: the whole (non-streamed) reply is the message() of the same deltas, so a stream put
// back together is the whole reply, block for block (only the ids differ between two requests).
// Each delta opens the next block or continues the open one: reasoning a thinking block, content
// a text block, a tool call's start a tool_use block (its argument fragments continue it).
class AnthropicStream {
 public:
  AnthropicStream(std::string id, std::string model, int64_t input_tokens);
  std::string start() const;
  std::string delta(const TextDelta& delta);
  std::string finish(FinishReason finish, const Usage& usage, std::string_view stop_sequence = {});
  // The whole message of the deltas given (after finish(): every block closed).
  Json message(FinishReason finish, const Usage& usage, std::string_view stop_sequence = {}) const;
  static std::string error(const ApiError& error);

 private:
  enum class Block { None, Thinking, Text, ToolUse };
  std::string start_block(Block block, Json content_block);
  // A piece of the open block: `key` of a text or thinking block grows by `piece`; a tool_use
  // block's arguments do (its input is parsed from them when it closes).
  std::string append(std::string_view key, std::string_view delta_type, const std::string& piece);
  std::string close();

  std::string id_, model_;
  int64_t input_tokens_;
  Block open_ = Block::None;
  Json blocks_ = Json::array();  // the content blocks so far; the last one is open_'s
  std::string arguments_;        // the open tool_use block's arguments so far
  bool wrote_text_ = false;      // a text block was opened
  bool wrote_calls_ = false;     // a tool_use block was opened
};

}  // namespace strata::serve
