#include "serve/anthropic_format.h"

#include <fmt/format.h>

namespace strata::serve {
namespace {

using json = Json;

std::string_view stop_reason(FinishReason finish, std::string_view stop_sequence) {
  if (finish == FinishReason::ToolCalls) return "tool_use";
  if (finish == FinishReason::Length) return "max_tokens";
  return stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

json stop_sequence_json(std::string_view stop_sequence) {
  return stop_sequence.empty() ? json(nullptr) : json(std::string(stop_sequence));
}

std::string_view error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json usage(int64_t input_tokens, int64_t output_tokens) {
  return json{{"input_tokens", input_tokens}, {"output_tokens", output_tokens}};
}

// A tool_use block's input: its arguments' JSON text parsed. A whole reply's parser hands a call
// out only once its block closed and parsed (serve/tool_calls.h); a streamed call cut short (by
// max_tokens) has unfinished arguments, and its block in the whole message keeps the empty
// object its start announced (Anthropic's input is always an object).
json tool_input(const std::string& arguments) {
  json input = json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : json::object();
}

}  // namespace

std::string anthropic_tool_use_id(std::string_view call_id) {
  constexpr std::string_view kOpenAiPrefix = "call_";
  if (call_id.starts_with(kOpenAiPrefix)) call_id.remove_prefix(kOpenAiPrefix.size());
  return "toolu_" + std::string(call_id);
}

json anthropic_message_json(const std::string& id, const std::string& model, const TextDelta& text,
                            FinishReason finish, const Usage& counts,
                            std::string_view stop_sequence) {
  AnthropicStream reply(id, model, counts.prompt_tokens);
  reply.delta(text);
  reply.finish(finish, counts, stop_sequence);
  return reply.message(finish, counts, stop_sequence);
}

json anthropic_error_json(const ApiError& error) {
  return json{{"type", "error"},
              {"error", {{"type", error_type(error.status)}, {"message", error.message}}}};
}

std::string anthropic_event(std::string_view name, const json& data) {
  return fmt::format("event: {}\ndata: {}\n\n", name, dump_json(data));
}

AnthropicStream::AnthropicStream(std::string id, std::string model, int64_t input_tokens)
    : id_(std::move(id)), model_(std::move(model)), input_tokens_(input_tokens) {}

std::string AnthropicStream::start() const {
  const json message{{"id", id_},
                     {"type", "message"},
                     {"role", "assistant"},
                     {"model", model_},
                     {"content", json::array()},
                     {"stop_reason", nullptr},
                     {"stop_sequence", nullptr},
                     {"usage", usage(input_tokens_, 0)}};
  return anthropic_event("message_start", json{{"type", "message_start"}, {"message", message}});
}

std::string AnthropicStream::close() {
  if (open_ == Block::None) return "";
  if (open_ == Block::ToolUse) blocks_.back()["input"] = tool_input(arguments_);
  open_ = Block::None;
  return anthropic_event("content_block_stop",
                         json{{"type", "content_block_stop"}, {"index", blocks_.size() - 1}});
}

std::string AnthropicStream::start_block(Block block, json content_block) {
  std::string out = close();
  open_ = block;
  wrote_text_ |= block == Block::Text;
  wrote_calls_ |= block == Block::ToolUse;
  arguments_.clear();
  out += anthropic_event("content_block_start", json{{"type", "content_block_start"},
                                                     {"index", blocks_.size()},
                                                     {"content_block", content_block}});
  blocks_.push_back(std::move(content_block));
  return out;
}

std::string AnthropicStream::append(std::string_view key, std::string_view delta_type,
                                    const std::string& piece) {
  if (open_ == Block::ToolUse) {
    arguments_ += piece;
  } else {
    json& text = blocks_.back()[std::string(key)];
    text = text.get<std::string>() + piece;
  }
  return anthropic_event("content_block_delta",
                         json{{"type", "content_block_delta"},
                              {"index", blocks_.size() - 1},
                              {"delta", {{"type", delta_type}, {key, piece}}}});
}

std::string AnthropicStream::delta(const TextDelta& delta) {
  std::string out;
  if (!delta.reasoning.empty()) {
    if (open_ != Block::Thinking)
      out += start_block(Block::Thinking,
                         json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    out += append("thinking", "thinking_delta", delta.reasoning);
  }
  if (!delta.content.empty()) {
    if (open_ != Block::Text) out += start_block(Block::Text, json{{"type", "text"}, {"text", ""}});
    out += append("text", "text_delta", delta.content);
  }
  // A call's first delta has its id and name; the next ones fragments of its arguments, which
  // follow their call's start with nothing in between (serve/tool_calls.h).
  for (const ToolCallDelta& call : delta.tool_calls) {
    if (!call.id.empty())
      out += start_block(Block::ToolUse, json{{"type", "tool_use"},
                                              {"id", anthropic_tool_use_id(call.id)},
                                              {"name", call.name},
                                              {"input", json::object()}});
    if (!call.arguments.empty() && open_ == Block::ToolUse)
      out += append("partial_json", "input_json_delta", call.arguments);
  }
  return out;
}

std::string AnthropicStream::finish(FinishReason finish, const Usage& counts,
                                    std::string_view stop_sequence) {
  // A reply without tool calls has a text block, even an empty one.
  std::string out = wrote_text_ || wrote_calls_
                        ? std::string()
                        : start_block(Block::Text, json{{"type", "text"}, {"text", ""}});
  out += close();
  out += anthropic_event("message_delta",
                         json{{"type", "message_delta"},
                              {"delta",
                               {{"stop_reason", stop_reason(finish, stop_sequence)},
                                {"stop_sequence", stop_sequence_json(stop_sequence)}}},
                              {"usage", {{"output_tokens", counts.completion_tokens}}}});
  out += anthropic_event("message_stop", json{{"type", "message_stop"}});
  return out;
}

json AnthropicStream::message(FinishReason finish, const Usage& counts,
                              std::string_view stop_sequence) const {
  return json{{"id", id_},
              {"type", "message"},
              {"role", "assistant"},
              {"model", model_},
              {"content", blocks_},
              {"stop_reason", stop_reason(finish, stop_sequence)},
              {"stop_sequence", stop_sequence_json(stop_sequence)},
              {"usage", usage(counts.prompt_tokens, counts.completion_tokens)}};
}

std::string AnthropicStream::error(const ApiError& error) {
  return anthropic_event("error", anthropic_error_json(error));
}

}  // namespace strata::serve
