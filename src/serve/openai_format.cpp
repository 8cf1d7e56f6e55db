#include "serve/openai_format.h"

#include <mutex>
#include <random>

#include "text/utf8.h"

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
  if (!delta.tool_calls.empty()) {
    json calls = json::array();
    for (const ToolCallDelta& call : delta.tool_calls) {
      json item{{"index", call.index}};
      if (!call.id.empty()) {
        item["id"] = call.id;
        item["type"] = "function";
      }
      json function = json::object();
      if (!call.name.empty()) function["name"] = call.name;
      function["arguments"] = call.arguments;
      item["function"] = std::move(function);
      calls.push_back(std::move(item));
    }
    out["tool_calls"] = std::move(calls);
  }
  return out;
}

bool is_blank(const std::string& text) {
  return text.find_first_not_of(" \t\r\n") == std::string::npos;
}

// Printable text of a token's bytes (a partial UTF-8 character becomes U+FFFD).
std::string token_text(const std::string& bytes) {
  return utf8_is_valid(bytes) ? bytes : utf8_repair(bytes);
}

json byte_values(const std::string& bytes) {
  json out = json::array();
  for (char c : bytes) out.push_back(int(static_cast<unsigned char>(c)));
  return out;
}

// One chunk with one choice: `delta` for chat, `text` for completions.
json chunk(const CompletionIdentity& identity, const TextDelta& delta, json finish_reason,
           bool include_usage, json chat_delta_override = nullptr, int64_t text_offset = 0) {
  json out = envelope(identity, true);
  json choice;
  const json logprobs = delta.logprobs.empty()
                            ? json(nullptr)
                            : logprobs_json(identity.endpoint, delta.logprobs, text_offset);
  if (identity.endpoint == Endpoint::ChatCompletions) {
    choice =
        json{{"index", delta.choice},
             {"delta", chat_delta_override.is_null() ? chat_delta(delta) : chat_delta_override},
             {"logprobs", logprobs},
             {"finish_reason", finish_reason}};
  } else {
    choice = json{{"text", delta.content},
                  {"index", delta.choice},
                  {"logprobs", logprobs},
                  {"finish_reason", finish_reason}};
  }
  out["choices"] = json::array({choice});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

}  // namespace

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::ToolCalls:
      return "tool_calls";
  }
  return "stop";
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
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
              {"completion_tokens_details", {{"reasoning_tokens", usage.reasoning_tokens}}}};
}

json error_json(const ApiError& error) {
  return json{{"error",
               {{"message", error.message},
                {"type", error.type},
                {"param", null_or(error.param)},
                {"code", null_or(error.code)}}}};
}

json logprobs_json(Endpoint endpoint, std::span<const LogprobEntry> entries, int64_t text_offset) {
  if (endpoint == Endpoint::ChatCompletions) {
    json content = json::array();
    for (const LogprobEntry& entry : entries) {
      json top = json::array();
      for (const LogprobEntry::Alternative& alt : entry.top)
        top.push_back(json{{"token", token_text(alt.bytes)},
                           {"logprob", alt.logprob},
                           {"bytes", byte_values(alt.bytes)}});
      content.push_back(json{{"token", token_text(entry.bytes)},
                             {"logprob", entry.logprob},
                             {"bytes", byte_values(entry.bytes)},
                             {"top_logprobs", std::move(top)}});
    }
    return json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (const LogprobEntry& entry : entries) {
    tokens.push_back(token_text(entry.bytes));
    token_logprobs.push_back(entry.logprob);
    json top = json::object();
    // Two alternatives with the same text (a partial character each) keep the likelier one.
    for (const LogprobEntry::Alternative& alt : entry.top)
      if (!top.contains(token_text(alt.bytes))) top[token_text(alt.bytes)] = alt.logprob;
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += int64_t(entry.bytes.size());
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(offsets)}};
}

json completion_json(const CompletionIdentity& identity, const TextDelta& text, FinishReason finish,
                     const Usage& usage) {
  const ChoiceResult choice{text, finish};
  return completion_json(identity, std::span(&choice, 1), usage, /*logprobs=*/false);
}

json completion_json(const CompletionIdentity& identity, std::span<const ChoiceResult> choices,
                     const Usage& usage, bool logprobs) {
  json out = envelope(identity, false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const TextDelta& text = choices[i].text;
    const json choice_logprobs =
        logprobs ? logprobs_json(identity.endpoint, text.logprobs, 0) : json(nullptr);
    if (identity.endpoint == Endpoint::ChatCompletions) {
      const bool calls = !text.tool_calls.empty();
      // With tool calls and no text besides, content is null (as OpenAI answers).
      json message{
          {"role", "assistant"},
          {"content", calls && is_blank(text.content) ? json(nullptr) : json(text.content)},
          {"refusal", nullptr}};
      if (!text.reasoning.empty()) message["reasoning_content"] = text.reasoning;
      if (calls) {
        json list_calls = json::array();
        for (const ToolCallDelta& call : text.tool_calls)
          list_calls.push_back(
              json{{"id", call.id},
                   {"type", "function"},
                   {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        message["tool_calls"] = std::move(list_calls);
      }
      list.push_back(json{{"index", i},
                          {"message", message},
                          {"logprobs", choice_logprobs},
                          {"finish_reason", finish_reason_name(choices[i].finish)}});
    } else {
      list.push_back(json{{"text", text.content},
                          {"index", i},
                          {"logprobs", choice_logprobs},
                          {"finish_reason", finish_reason_name(choices[i].finish)}});
    }
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

json chat_role_chunk(const CompletionIdentity& identity, bool include_usage, int choice) {
  TextDelta empty;
  empty.choice = choice;
  return chunk(identity, empty, nullptr, include_usage,
               json{{"role", "assistant"}, {"content", ""}, {"refusal", nullptr}});
}

json delta_chunk(const CompletionIdentity& identity, const TextDelta& delta, bool include_usage,
                 int64_t text_offset) {
  return chunk(identity, delta, nullptr, include_usage, nullptr, text_offset);
}

json finish_chunk(const CompletionIdentity& identity, FinishReason finish, bool include_usage,
                  int choice) {
  TextDelta empty;
  empty.choice = choice;
  return chunk(identity, empty, finish_reason_name(finish), include_usage);
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
