#include "serve/openai_format.h"

#include <mutex>
#include <random>

namespace strata::serve {
namespace {

using json = Json;

constexpr std::string_view kSystemFingerprint = "fp_strata";

json null_or(const std::string& text) {
  return text.empty() ? json(nullptr) : json(text);
}

json envelope(const CompletionIdentity& identity, bool chunk) {
  const bool chat = identity.endpoint == Endpoint::ChatCompletions;
  return json{
      {"id", identity.id},
      {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
      {"created", identity.created},
      {"model", identity.model},
      {"system_fingerprint", kSystemFingerprint}};
}

json chat_delta(const TextDelta& delta) {
  json out = json::object();
  if (!delta.content.empty()) out["content"] = delta.content;
  if (!delta.reasoning.empty()) out["reasoning_content"] = delta.reasoning;
  return out;
}

// One chunk with one choice: `delta` for chat, `text` for completions.
json chunk(const CompletionIdentity& identity, const TextDelta& delta, json finish_reason,
           bool include_usage, json chat_delta_override = nullptr) {
  json out = envelope(identity, true);
  json choice;
  if (identity.endpoint == Endpoint::ChatCompletions) {
    choice =
        json{{"index", 0},
             {"delta", chat_delta_override.is_null() ? chat_delta(delta) : chat_delta_override},
             {"logprobs", nullptr},
             {"finish_reason", finish_reason}};
  } else {
    choice = json{{"text", delta.content},
                  {"index", 0},
                  {"logprobs", nullptr},
                  {"finish_reason", finish_reason}};
  }
  out["choices"] = json::array({choice});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

}  // namespace

std::string_view finish_reason_name(FinishReason reason) {
  return reason == FinishReason::Stop ? "stop" : "length";
}

std::string new_random_id(std::string_view prefix) {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  static constexpr std::string_view alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id(prefix);
  std::lock_guard lock(mutex);
  for (int i = 0; i < 24; ++i) id += alphabet[rng() % alphabet.size()];
  return id;
}

std::string new_completion_id(Endpoint endpoint) {
  return new_random_id(endpoint == Endpoint::ChatCompletions ? "chatcmpl-" : "cmpl-");
}

json usage_json(const Usage& usage) {
  return json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

json error_json(const ApiError& error) {
  return json{{"error",
               {{"message", error.message},
                {"type", error.type},
                {"param", null_or(error.param)},
                {"code", null_or(error.code)}}}};
}

json completion_json(const CompletionIdentity& identity, const TextDelta& text, FinishReason finish,
                     const Usage& usage) {
  json out = envelope(identity, false);
  json choice;
  if (identity.endpoint == Endpoint::ChatCompletions) {
    json message{{"role", "assistant"}, {"content", text.content}, {"refusal", nullptr}};
    if (!text.reasoning.empty()) message["reasoning_content"] = text.reasoning;
    choice = json{{"index", 0},
                  {"message", message},
                  {"logprobs", nullptr},
                  {"finish_reason", finish_reason_name(finish)}};
  } else {
    choice = json{{"text", text.content},
                  {"index", 0},
                  {"logprobs", nullptr},
                  {"finish_reason", finish_reason_name(finish)}};
  }
  out["choices"] = json::array({choice});
  out["usage"] = usage_json(usage);
  return out;
}

json chat_role_chunk(const CompletionIdentity& identity, bool include_usage) {
  return chunk(identity, {}, nullptr, include_usage,
               json{{"role", "assistant"}, {"content", ""}, {"refusal", nullptr}});
}

json delta_chunk(const CompletionIdentity& identity, const TextDelta& delta, bool include_usage) {
  return chunk(identity, delta, nullptr, include_usage);
}

json finish_chunk(const CompletionIdentity& identity, FinishReason finish, bool include_usage) {
  return chunk(identity, {}, finish_reason_name(finish), include_usage);
}

json usage_chunk(const CompletionIdentity& identity, const Usage& usage) {
  json out = envelope(identity, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& value) {
  return fmt::format("data: {}\n\n", dump_json(value));
}

}  // namespace strata::serve
