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

}  // namespace

json anthropic_message_json(const std::string& id, const std::string& model, const TextDelta& text,
                            FinishReason finish, const Usage& counts,
                            std::string_view stop_sequence) {
  json content = json::array();
  if (!text.reasoning.empty())
    content.push_back(json{{"type", "thinking"}, {"thinking", text.reasoning}, {"signature", ""}});
  content.push_back(json{{"type", "text"}, {"text", text.content}});
  return json{{"id", id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", model},
              {"content", std::move(content)},
              {"stop_reason", stop_reason(finish, stop_sequence)},
              {"stop_sequence", stop_sequence_json(stop_sequence)},
              {"usage", usage(counts.prompt_tokens, counts.completion_tokens)}};
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
  open_ = Block::None;
  return anthropic_event("content_block_stop",
                         json{{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicStream::open(Block block) {
  if (open_ == block) return "";
  std::string out = close();
  open_ = block;
  ++index_;
  const json content_block = block == Block::Thinking
                                 ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                 : json{{"type", "text"}, {"text", ""}};
  out += anthropic_event(
      "content_block_start",
      json{{"type", "content_block_start"}, {"index", index_}, {"content_block", content_block}});
  return out;
}

std::string AnthropicStream::delta(const TextDelta& delta) {
  std::string out;
  if (!delta.reasoning.empty()) {
    out += open(Block::Thinking);
    out += anthropic_event(
        "content_block_delta",
        json{{"type", "content_block_delta"},
             {"index", index_},
             {"delta", {{"type", "thinking_delta"}, {"thinking", delta.reasoning}}}});
  }
  if (!delta.content.empty()) {
    out += open(Block::Text);
    out += anthropic_event("content_block_delta",
                           json{{"type", "content_block_delta"},
                                {"index", index_},
                                {"delta", {{"type", "text_delta"}, {"text", delta.content}}}});
  }
  return out;
}

std::string AnthropicStream::finish(FinishReason finish, const Usage& counts,
                                    std::string_view stop_sequence) {
  std::string out = open(Block::Text);  // every reply has a text block, even an empty one
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

std::string AnthropicStream::error(const ApiError& error) {
  return anthropic_event("error", anthropic_error_json(error));
}

}  // namespace strata::serve
