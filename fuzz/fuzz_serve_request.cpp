// libFuzzer target for the server's request handling without sockets (src/serve/request.h,
// stop_matcher.h, openai_format.h). Input layout: byte 0 selects the mode, the rest is the payload.
//   mode 0/1: the payload is a /v1/chat/completions or /v1/completions body. Invariants (trap on
//             violation): parse_generation_request never throws; a rejection is a 4xx ApiError with
//             a message, and its JSON body parses back; an accepted request obeys the limits
//             (max_tokens in [1, n_ctx], token ids in the vocabulary, at most 4 non-empty stops,
//             include_usage only with stream, chat has messages; logit_bias ids in the
//             vocabulary, sorted, biases in [-100, 100]; penalties in [-2, 2]; n in
//             [1, max_choices]; logprobs in [0, 20]; tools JSON objects, a named tool_choice among
//             them; history tool-call arguments JSON objects; a response_format grammar unless
//             its type is text; a GBNF `grammar` only without a json response_format and
//             offered tools); the completion and chunk JSON
//             built from its text (with logprobs and tool calls) parse back; the chat templates
//             render its messages and tools or throw strata::Error; parsed through a grammar
//             cache the answer is the same, and a second parse finds the same grammars.
//   mode 2:   StopMatcher: "stop1\x1fstop2...\x1etext"; the text cut after each stop-string search
//             is the same fed whole or byte by byte.
//   mode 3/4: the payload is a /tokenize or /detokenize body (llama-server's); a rejection is a
//             4xx with a message and a JSON body that parses back; accepted token ids are in the
//             vocabulary.
//   mode 5:   ToolCallParser: payload byte 0 picks the format (even Hermes, odd XML), the rest is a
//             model reply; the pieces are the same fed whole or byte by byte, every call's
//             arguments are a JSON object, and with no call found the content is the reply.
//   mode 6:   the payload is a /v1/messages body (Anthropic's Messages API, translated to a chat
//             request): never throws; a rejection is a 4xx whose message names its param
//             (renamed to the Anthropic body's own path: `system[i]`, `messages[i].content[j]…`,
//             `tools[i]…` as sent); an accepted request obeys the chat limits above (tools
//             included: JSON function tools, a named tool_choice among them, history calls' input
//             a JSON object, the templates render it) plus the Messages API's (one reply, no
//             logprobs, no response_format or grammar), and the message, its stream's events
//             (thinking, text and tool_use blocks, numbered 0, 1, … in order) and an error event
//             built from its text parse back.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "serve/anthropic_format.h"
#include "serve/openai_format.h"
#include "serve/request.h"
#include "serve/stop_matcher.h"
#include "serve/tool_calls.h"
#include "text/chat_template.h"
#include "util/error.h"

namespace {

using namespace strata::serve;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool parses_back(const std::string& text) {
  return !nlohmann::json::parse(text, nullptr, false).is_discarded();
}

// An accepted chat request's tools, history calls and rendering (both APIs').
void check_chat(const GenerationRequest& request, const RequestLimits& limits) {
  check(request.tools.size() <= limits.max_tools);
  bool named_listed = request.tool_choice != ToolChoice::Function;
  for (const std::string& tool : request.tools) {
    const nlohmann::json parsed = nlohmann::json::parse(tool, nullptr, false);
    check(parsed.is_object() && parsed["type"] == "function" && parsed["function"].is_object() &&
          parsed["function"]["name"].is_string());
    named_listed |= parsed["function"]["name"] == request.tool_choice_function;
  }
  check(named_listed);
  for (const strata::ChatMessage& message : request.messages)
    for (const strata::ChatToolCall& call : message.tool_calls)
      check(nlohmann::json::parse(call.arguments, nullptr, false).is_object());
  strata::ChatRenderOptions options;
  options.tools = request.tools;
  for (const strata::ChatFormat format :
       {strata::ChatFormat::ChatML, strata::ChatFormat::Qwen3, strata::ChatFormat::Qwen35}) {
    try {
      strata::ChatTemplate(format).render(request.messages, options);
    } catch (const strata::Error&) {
      // the template rejects the conversation: a 400 in the server
    }
  }
}

void fuzz_parse(std::string_view body, Endpoint endpoint) {
  RequestLimits limits;
  limits.model_id = "strata-default";
  limits.n_vocab = 6144;
  limits.n_ctx = 4096;
  const ParseResult result = parse_generation_request(body, endpoint, limits);
  // Through the grammar cache (one across inputs, two entries: it evicts often): the same answer,
  // and a response_format grammar found again the second time.
  static GrammarCache cache(2);
  const ParseResult cached = parse_generation_request(body, endpoint, limits, &cache);
  check(cached.index() == result.index());
  if (const auto* first = std::get_if<GenerationRequest>(&cached)) {
    const ParseResult again = parse_generation_request(body, endpoint, limits, &cache);
    check(std::get<GenerationRequest>(again).response_format.grammar ==
          first->response_format.grammar);
    check(std::get<GenerationRequest>(again).grammar == first->grammar);
  }
  if (const ApiError* error = std::get_if<ApiError>(&result)) {
    check(error->status >= 400 && error->status < 500);
    check(!error->message.empty());
    check(parses_back(dump_json(error_json(*error))));
    return;
  }
  const GenerationRequest& request = std::get<GenerationRequest>(result);
  check(request.model == limits.model_id);
  if (request.max_tokens) check(*request.max_tokens >= 1 && *request.max_tokens <= limits.n_ctx);
  check(request.stop.size() <= limits.max_stop_strings);
  for (const std::string& stop : request.stop)
    check(!stop.empty() && stop.size() <= limits.max_stop_bytes);
  check(!request.include_usage || request.stream);
  // response_format: a grammar exactly when the type is not text.
  check((request.response_format.type == ResponseFormat::Type::Text) ==
        (request.response_format.grammar == nullptr));
  // A GBNF grammar only alone: no json response_format, no tools offered.
  if (request.grammar)
    check(!request.response_format.grammar &&
          (request.tools.empty() || request.tool_choice == ToolChoice::None));
  if (endpoint == Endpoint::ChatCompletions) {
    check(!request.messages.empty());
  } else if (request.prompt_is_tokens) {
    check(!request.prompt_tokens.empty());
    for (int32_t id : request.prompt_tokens) check(id >= 0 && id < limits.n_vocab);
  }
  const SamplingOverrides& s = request.sampling;
  check(s.logit_bias.size() <= limits.max_logit_bias);
  for (size_t i = 0; i < s.logit_bias.size(); ++i) {
    check(s.logit_bias[i].first >= 0 && s.logit_bias[i].first < limits.n_vocab);
    check(s.logit_bias[i].second >= -100.0f && s.logit_bias[i].second <= 100.0f);
    if (i > 0) check(s.logit_bias[i - 1].first <= s.logit_bias[i].first);
  }
  for (const auto& penalty : {s.frequency_penalty, s.presence_penalty})
    if (penalty) check(*penalty >= -2.0f && *penalty <= 2.0f);
  check(request.n >= 1 && request.n <= limits.max_choices);
  if (request.logprobs) check(*request.logprobs >= 0 && *request.logprobs <= kMaxTopLogprobs);
  if (endpoint == Endpoint::ChatCompletions) check_chat(request, limits);
  // The reply objects built from request text (stand-in for generated text) are valid JSON.
  const std::string text =
      endpoint == Endpoint::ChatCompletions ? request.messages[0].content : request.prompt_text;
  const CompletionIdentity identity{endpoint, new_completion_id(endpoint), 0, request.model};
  check(
      parses_back(dump_json(completion_json(identity, {text, text}, FinishReason::Stop, {1, 2}))));
  const std::string event = sse_event(delta_chunk(identity, {text, ""}, request.include_usage));
  check(event.rfind("data: ", 0) == 0 && event.size() >= 8 &&
        event.substr(event.size() - 2) == "\n\n");
  check(parses_back(event.substr(6, event.size() - 8)));
  TextDelta rich{text, text, 0, {{text, -1.0, {{text, -2.0}}}}, {{0, "call_x", text, text}}};
  ChoiceResult choice{rich, FinishReason::ToolCalls};
  check(parses_back(dump_json(completion_json(identity, std::span(&choice, 1), {1, 2}, true))));
  check(parses_back(dump_json(delta_chunk(identity, rich, true, 3))));
}

void fuzz_tool_reply(std::string_view payload) {
  if (payload.empty()) return;
  const strata::ToolCallFormat format =
      payload[0] % 2 == 0 ? strata::ToolCallFormat::Hermes : strata::ToolCallFormat::Xml;
  const std::string_view reply = payload.substr(1);
  const std::vector<std::string> tools = {
      R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
      R"("properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}})"};
  // Whole and streamed mode, the reply pushed at once and byte by byte.
  auto parse = [&](bool stream_arguments, size_t chunk, int& calls) {
    ToolCallParser parser(format, tools, {}, stream_arguments);
    std::vector<ReplyPart> parts;
    for (size_t i = 0; i < reply.size(); i += chunk)
      join_pieces(parts, parser.push(reply.substr(i, chunk)));
    join_pieces(parts, parser.finish());
    calls = parser.calls_found();
    return parts;
  };
  auto same = [](const std::vector<ReplyPart>& a, const std::vector<ReplyPart>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].content != b[i].content || a[i].call.has_value() != b[i].call.has_value())
        return false;
      if (a[i].call &&
          (a[i].call->name != b[i].call->name || a[i].call->arguments != b[i].call->arguments))
        return false;
    }
    return true;
  };
  int calls = 0, streamed_calls = 0, ignored = 0;
  const std::vector<ReplyPart> a = parse(false, reply.size() + 1, calls);
  check(same(a, parse(false, 1, ignored)));
  for (const ReplyPart& part : a)
    if (part.call) check(nlohmann::json::parse(part.call->arguments, nullptr, false).is_object());
  if (calls == 0) check(a.empty() ? reply.empty() : a[0].content == reply);
  // Streamed: the same whatever the chunking; with no call found, what the whole mode gives.
  const std::vector<ReplyPart> s = parse(true, reply.size() + 1, streamed_calls);
  check(same(s, parse(true, 1, ignored)));
  if (streamed_calls == 0) check(same(s, a));
}

void fuzz_stop(std::string_view payload) {
  const size_t split = payload.find('\x1e');
  if (split == std::string_view::npos) return;
  std::vector<std::string> stops;
  std::string_view list = payload.substr(0, split);
  while (!list.empty()) {
    const size_t end = list.find('\x1f');
    stops.emplace_back(list.substr(0, end));
    list = end == std::string_view::npos ? std::string_view() : list.substr(end + 1);
  }
  const std::string_view text = payload.substr(split + 1);
  StopMatcher whole(stops), bytes(stops);
  std::string a = whole.push(text) + whole.finish();
  std::string b;
  for (size_t i = 0; i < text.size() && !bytes.stopped(); ++i) b += bytes.push(text.substr(i, 1));
  b += bytes.finish();
  check(a == b);
  check(whole.stopped() == bytes.stopped());
  // The stop string named is the same either way, one of the list, and where the text was cut.
  check(whole.matched() == bytes.matched());
  check(whole.stopped() == !whole.matched().empty());
  if (whole.stopped()) check(text.substr(a.size(), whole.matched().size()) == whole.matched());
  // The output is a prefix of the text, and a stop string never survives in it.
  check(text.substr(0, a.size()) == a);
  for (const std::string& stop : stops)
    if (!stop.empty()) check(a.find(stop) == std::string::npos);
}

RequestLimits tokenizer_limits() {
  RequestLimits limits;
  limits.model_id = "strata-default";
  limits.n_vocab = 6144;
  limits.n_ctx = 4096;
  return limits;
}

void check_rejection(const ApiError& error) {
  check(error.status >= 400 && error.status < 500);
  check(!error.message.empty());
  check(parses_back(dump_json(error_json(error))));
}

void fuzz_tokenizer_body(std::string_view body, bool tokenize) {
  const RequestLimits limits = tokenizer_limits();
  if (tokenize) {
    const auto result = parse_tokenize_request(body, limits);
    if (const ApiError* error = std::get_if<ApiError>(&result)) check_rejection(*error);
    return;
  }
  const auto result = parse_detokenize_request(body, limits);
  if (const ApiError* error = std::get_if<ApiError>(&result)) return check_rejection(*error);
  for (const int32_t id : std::get<DetokenizeRequest>(result).tokens)
    check(id >= 0 && id < limits.n_vocab);
}

// A /v1/messages body: the translation to a chat request, the limits of both APIs, and the
// Anthropic-shaped answers built from its text.
void fuzz_anthropic(std::string_view body) {
  RequestLimits limits = tokenizer_limits();
  const ParseResult result = parse_anthropic_messages_request(body, limits);
  if (const ApiError* error = std::get_if<ApiError>(&result)) {
    check_rejection(*error);
    // The message names the field at fault (first, or "(in PARAM)" for a body that does not
    // parse), also after a path was renamed from the chat request's to the body's own.
    if (!error->param.empty()) check(error->message.find(error->param) != std::string::npos);
    check(parses_back(dump_json(anthropic_error_json(*error))));
    return;
  }
  const GenerationRequest& request = std::get<GenerationRequest>(result);
  check(request.model == limits.model_id);
  check(!request.messages.empty());
  check(request.max_tokens && *request.max_tokens >= 1 && *request.max_tokens <= limits.n_ctx);
  check(request.n == 1 && !request.logprobs);
  check(request.response_format.grammar == nullptr && request.grammar == nullptr);
  check(request.stop.size() <= limits.max_stop_strings);
  check(!request.include_usage || request.stream);
  check_chat(request, limits);
  const std::string& text = request.messages.back().content;
  const TextDelta delta{text, text, 0, {}, {}};
  const Usage usage{int64_t(text.size()), 2, 0, 1};
  check(parses_back(dump_json(
      anthropic_message_json("msg_x", request.model, delta, FinishReason::Length, usage))));
  check(parses_back(dump_json(
      anthropic_message_json("msg_x", request.model, delta, FinishReason::Stop, usage, text))));
  // A reply with a tool call named and argued by the request's text (arguments need not parse).
  const TextDelta call{text, "", 0, {}, {{0, "call_" + text, text, text}}};
  check(parses_back(dump_json(
      anthropic_message_json("msg_x", request.model, call, FinishReason::ToolCalls, usage))));
  AnthropicStream stream("msg_x", request.model, usage.prompt_tokens);
  // Every event is "event: NAME\ndata: JSON\n\n" with JSON that parses, and content blocks
  // open numbered 0, 1, … and close before the next opens.
  auto events_parse = [](const std::string& events) {
    size_t at = 0;
    int64_t opened = 0;
    bool open = false;
    while (at < events.size()) {
      if (events.compare(at, 7, "event: ") != 0) return false;
      const size_t data = events.find("\ndata: ", at);
      const size_t end = events.find("\n\n", at);
      if (data == std::string::npos || end == std::string::npos || data > end) return false;
      const nlohmann::json event =
          nlohmann::json::parse(events.substr(data + 7, end - data - 7), nullptr, false);
      if (event.is_discarded()) return false;
      if (event["type"] == "content_block_start") {
        if (open || event["index"] != opened++) return false;
        open = true;
      } else if (event["type"] == "content_block_delta") {
        if (!open || event["index"] != opened - 1) return false;
      } else if (event["type"] == "content_block_stop") {
        if (!open || event["index"] != opened - 1) return false;
        open = false;
      }
      at = end + 2;
    }
    return !open;
  };
  std::string events = stream.start();
  events += stream.delta({"", text, 0, {}, {}});                         // a thinking block
  events += stream.delta({text, "", 0, {}, {}});                         // then the text block
  events += stream.delta({"", "", 0, {}, {{0, "call_x", text, ""}}});    // a tool_use block
  events += stream.delta({"", "", 0, {}, {{0, "", "", text}}});          // its arguments
  events += stream.delta({"", "", 0, {}, {{1, "call_y", text, text}}});  // another call
  events += stream.finish(FinishReason::ToolCalls, usage);
  check(events_parse(events));
  AnthropicStream plain("msg_x", request.model, usage.prompt_tokens);
  std::string plain_events = plain.start();  // one statement each: the order they run in
  plain_events += plain.delta({text, "", 0, {}, {}});
  plain_events += plain.finish(FinishReason::Stop, usage, text);
  check(events_parse(plain_events));
  ApiError error;
  error.status = 400;
  error.param = "messages";
  error.message = text;
  check(events_parse(AnthropicStream::error(error)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Seven modes (the committed seeds start with bytes 0-6, so they keep their mode).
  switch (data[0] % 7) {
    case 0:
      fuzz_parse(payload, Endpoint::ChatCompletions);
      break;
    case 1:
      fuzz_parse(payload, Endpoint::Completions);
      break;
    case 2:
      fuzz_stop(payload);
      break;
    case 5:
      fuzz_tool_reply(payload);
      break;
    case 6:
      fuzz_anthropic(payload);
      break;
    default:
      fuzz_tokenizer_body(payload, data[0] % 7 == 3);
      break;
  }
  return 0;
}
