#include "serve/request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "grammar/gbnf.h"
#include "serve/request_fields.h"
#include "text/utf8.h"

namespace strata::serve {

// The shared readers (reject, field, describe, ...): serve/request_fields.h.
using namespace request_fields;

namespace {

// ---- fields -----------------------------------------------------------------------------------

void read_model(const json& body, const RequestLimits& limits, GenerationRequest& out) {
  out.model = limits.model_id;
  const std::string* model = read_string(body, "model", "model");
  if (!model || *model == limits.model_id) return;
  ApiError error;
  error.status = 404;
  error.param = "model";
  error.code = "model_not_found";
  error.message = fmt::format("model: the model {} does not exist; this server serves \"{}\"",
                              describe(json(*model)), limits.model_id);
  throw Rejection{std::move(error)};
}

std::string read_content(const json& message, const std::string& path, const std::string& role) {
  const json* content = field(message, "content");
  const std::string content_path = child(path, "content");
  if (!content) {
    if (role == "assistant") return {};
    reject(content_path, "required for a \"{}\" message", role);
  }
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array())
    reject(content_path, "expected a string or an array of content parts, found {}",
           describe(*content));
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const json& part = (*content)[i];
    const std::string part_path = element(content_path, i);
    if (!part.is_object())
      reject(part_path, "expected a content part object, found {}", describe(part));
    const std::string* type = read_string(part, "type", child(part_path, "type"));
    if (!type) reject(child(part_path, "type"), "required");
    if (*type != "text")
      reject(child(part_path, "type"), "only \"text\" content parts are supported, found {}",
             describe(json(*type)));
    const std::string* part_text = read_string(part, "text", child(part_path, "text"));
    if (!part_text) reject(child(part_path, "text"), "required for a text part");
    text += *part_text;
  }
  return text;
}
// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": "<JSON object>"}}]; the arguments may also be the object itself.
std::vector<ChatToolCall> read_tool_calls(const json& calls, const std::string& path) {
  if (!calls.is_array()) reject(path, "expected an array of tool calls, found {}", describe(calls));
  std::vector<ChatToolCall> out;
  for (size_t i = 0; i < calls.size(); ++i) {
    const json& call = calls[i];
    const std::string at = element(path, i);
    if (!call.is_object()) reject(at, "expected a tool call object, found {}", describe(call));
    if (const std::string* type = read_string(call, "type", child(at, "type"));
        type && *type != "function")
      reject(child(at, "type"), "expected \"function\", found {}", describe(json(*type)));
    read_string(call, "id", child(at, "id"));
    const json* function = field(call, "function");
    if (!function || !function->is_object())
      reject(child(at, "function"), "required: an object with name and arguments");
    ChatToolCall parsed;
    parsed.name = read_function_name(*function, child(at, "function"));
    const std::string arguments_path = child(child(at, "function"), "arguments");
    const json* arguments = field(*function, "arguments");
    json object = json::object();
    if (arguments && arguments->is_string()) {
      object = json::parse(arguments->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!object.is_object())
        reject(arguments_path, "expected a JSON object as a string, found {}",
               describe(*arguments));
      parsed.arguments = arguments->get<std::string>();  // as sent: the template renders it so
    } else if (arguments && arguments->is_object()) {
      parsed.arguments = arguments->dump();
    } else if (arguments) {
      reject(arguments_path, "expected a JSON object as a string, found {}", describe(*arguments));
    } else {
      parsed.arguments = "{}";
    }
    out.push_back(std::move(parsed));
  }
  return out;
}

// tools, tool_choice and parallel_tool_calls of a chat request.
void read_tools(const json& body, const RequestLimits& limits, GenerationRequest& out) {
  std::vector<std::string> names;
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array())
      reject("tools", "expected an array of tools, found {}", describe(*tools));
    if (tools->size() > limits.max_tools)
      reject("tools", "at most {} tools are allowed, found {}", limits.max_tools, tools->size());
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string at = element("tools", i);
      if (!tool.is_object()) reject(at, "expected a tool object, found {}", describe(tool));
      const std::string* type = read_string(tool, "type", child(at, "type"));
      if (!type || *type != "function")
        reject(child(at, "type"), "expected \"function\", found {}",
               type ? describe(json(*type)) : std::string("nothing"));
      const json* function = field(tool, "function");
      if (!function || !function->is_object())
        reject(child(at, "function"), "required: an object with name, description, parameters");
      const std::string name = read_function_name(*function, child(at, "function"));
      if (std::find(names.begin(), names.end(), name) != names.end())
        reject(child(child(at, "function"), "name"), "two tools are named {}",
               describe(json(name)));
      names.push_back(name);
      read_string(*function, "description", child(child(at, "function"), "description"));
      // OpenAI's strict: a forced call is always grammar-constrained (serve/tool_call_grammar.h),
      // and tool_choice auto never is, whatever it says.
      if (const json* strict = field(*function, "strict"); strict && !strict->is_null())
        read_bool(*function, "strict", child(child(at, "function"), "strict"));
      if (const json* parameters = field(*function, "parameters");
          parameters && !parameters->is_object())
        reject(child(child(at, "function"), "parameters"),
               "expected a JSON schema object, found {}", describe(*parameters));
      out.tools.push_back(tool.dump());
    }
  }
  out.parallel_tool_calls =
      read_bool(body, "parallel_tool_calls", "parallel_tool_calls").value_or(true);
  const json* choice = field(body, "tool_choice");
  out.tool_choice = out.tools.empty() ? ToolChoice::None : ToolChoice::Auto;
  if (!choice) return;
  if (choice->is_string()) {
    const std::string& mode = choice->get_ref<const std::string&>();
    if (mode == "none") {
      out.tool_choice = ToolChoice::None;
    } else if (mode == "auto" || mode == "required") {
      if (out.tools.empty())
        reject("tool_choice", "{} needs tools, and the request has none", describe(*choice));
      out.tool_choice = mode == "auto" ? ToolChoice::Auto : ToolChoice::Required;
    } else {
      reject("tool_choice",
             "expected \"none\", \"auto\", \"required\" or a function object, found {}",
             describe(*choice));
    }
    return;
  }
  if (!choice->is_object())
    reject("tool_choice",
           "expected \"none\", \"auto\", \"required\" or a function object, found {}",
           describe(*choice));
  const std::string* type = read_string(*choice, "type", "tool_choice.type");
  if (!type || *type != "function")
    reject("tool_choice.type", "expected \"function\", found {}",
           type ? describe(json(*type)) : std::string("nothing"));
  const json* function = field(*choice, "function");
  if (!function || !function->is_object())
    reject("tool_choice.function", "required: an object with the function's name");
  const std::string name = read_function_name(*function, "tool_choice.function");
  if (std::find(names.begin(), names.end(), name) == names.end())
    reject("tool_choice.function.name", "{} is not one of the request's tools",
           describe(json(name)));
  out.tool_choice = ToolChoice::Function;
  out.tool_choice_function = name;
}

void read_messages(const json& body, GenerationRequest& out) {
  const json& messages = message_array(body);
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& message = messages[i];
    const std::string path = element("messages", i);
    const std::string* role = read_string(message, "role", child(path, "role"));
    if (!role) reject(child(path, "role"), "required");
    std::string chat_role = *role;
    if (chat_role == "developer") chat_role = "system";  // OpenAI's newer name for system
    if (chat_role != "system" && chat_role != "user" && chat_role != "assistant" &&
        chat_role != "tool")
      reject(child(path, "role"),
             "expected \"system\", \"developer\", \"user\", \"assistant\" or \"tool\", found {}",
             describe(json(*role)));
    ChatMessage chat{chat_role, read_content(message, path, chat_role), std::nullopt, {}};
    if (const json* calls = field(message, "tool_calls")) {
      if (chat_role != "assistant")
        reject(child(path, "tool_calls"), "only assistant messages carry tool calls");
      chat.tool_calls = read_tool_calls(*calls, child(path, "tool_calls"));
    }
    if (const std::string* id = read_string(message, "tool_call_id", child(path, "tool_call_id"));
        id && chat_role != "tool")
      reject(child(path, "tool_call_id"), "only tool messages answer a tool call");
    if (const std::string* reasoning =
            read_string(message, "reasoning_content", child(path, "reasoning_content")))
      chat.reasoning_content = *reasoning;
    out.messages.push_back(std::move(chat));
  }
}

void read_token_ids(const json& array, const std::string& path, const RequestLimits& limits,
                    std::vector<int32_t>& out) {
  for (size_t i = 0; i < array.size(); ++i) {
    const json& id = array[i];
    if (!id.is_number_integer())
      reject(element(path, i), "expected a token id (integer), found {}", describe(id));
    const bool in_range = id.is_number_unsigned()
                              ? id.get<uint64_t>() < uint64_t(std::max(limits.n_vocab, 0))
                              : id.get<int64_t>() >= 0 && id.get<int64_t>() < limits.n_vocab;
    if (!in_range)
      reject(element(path, i), "token id {} is outside the vocabulary [0, {})", describe(id),
             limits.n_vocab);
    out.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
}

void read_prompt(const json& body, const RequestLimits& limits, GenerationRequest& out) {
  const json* prompt = field(body, "prompt");
  if (!prompt) reject("prompt", "required: a string (or token ids)");
  if (prompt->is_string()) {
    out.prompt_text = prompt->get<std::string>();
    return;
  }
  if (!prompt->is_array())
    reject("prompt",
           "expected a string, an array of token ids or a one-element array of either, found {}",
           describe(*prompt));
  if (prompt->empty()) reject("prompt", "expected a non-empty prompt, found an empty array");
  if ((*prompt)[0].is_number()) {
    out.prompt_is_tokens = true;
    read_token_ids(*prompt, "prompt", limits, out.prompt_tokens);
    return;
  }
  if (prompt->size() > 1)
    reject("prompt", "only one prompt per request is supported, found {}", prompt->size());
  const json& only = (*prompt)[0];
  if (only.is_string()) {
    out.prompt_text = only.get<std::string>();
  } else if (only.is_array() && !only.empty()) {
    out.prompt_is_tokens = true;
    read_token_ids(only, "prompt[0]", limits, out.prompt_tokens);
  } else {
    reject("prompt[0]", "expected a string or a non-empty array of token ids, found {}",
           describe(only));
  }
}

void read_stop(const json& body, const RequestLimits& limits, GenerationRequest& out) {
  const json* stop = field(body, "stop");
  if (!stop) return;
  auto add = [&](const json& value, const std::string& path) {
    if (!value.is_string()) reject(path, "expected a string, found {}", describe(value));
    const std::string& text = value.get_ref<const std::string&>();
    if (text.empty()) reject(path, "expected a non-empty string");
    if (text.size() > limits.max_stop_bytes)
      reject(path, "a stop string may have at most {} bytes, found {}", limits.max_stop_bytes,
             text.size());
    out.stop.push_back(text);
  };
  if (stop->is_string()) {
    add(*stop, "stop");
    return;
  }
  if (!stop->is_array())
    reject("stop", "expected a string or an array of strings, found {}", describe(*stop));
  if (stop->size() > limits.max_stop_strings)
    reject("stop", "at most {} stop strings are allowed, found {}", limits.max_stop_strings,
           stop->size());
  for (size_t i = 0; i < stop->size(); ++i) add((*stop)[i], element("stop", i));
}

void read_sampling(const json& body, GenerationRequest& out) {
  SamplingOverrides& s = out.sampling;
  if (auto v = read_number(body, "temperature", "temperature", 0.0, 2.0)) s.temperature = float(*v);
  if (auto v = read_number(body, "top_p", "top_p", 0.0, 1.0)) s.top_p = float(*v);
  if (auto v = read_int(body, "top_k", "top_k", 0, std::numeric_limits<int32_t>::max()))
    s.top_k = int(*v);
  if (auto v = read_number(body, "min_p", "min_p", 0.0, 1.0)) s.min_p = float(*v);
  for (const char* key : {"repeat_penalty", "repetition_penalty"})
    if (auto v = read_number(body, key, key, 0.0, 100.0)) {
      if (*v <= 0.0) reject(key, "expected a number above 0, found {}", *v);
      s.repetition_penalty = float(*v);
    }
  if (const json* seed = field(body, "seed")) {
    if (!seed->is_number_integer())
      reject("seed", "expected an integer, found {}", describe(*seed));
    // Negative seeds are accepted (OpenAI's schema is a signed integer): their bit pattern is used.
    s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
  }
}

void read_limits_and_stream(const json& body, const RequestLimits& limits, GenerationRequest& out) {
  const int64_t max_allowed = limits.n_ctx > 0 ? limits.n_ctx : std::numeric_limits<int32_t>::max();
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    const json* value = field(body, key);
    if (!value) continue;
    if (value->is_number_integer() && value->get<int64_t>() < 1 &&
        (!value->is_number_unsigned() || value->get<uint64_t>() == 0))
      reject(key, "expected an integer >= 1, found {}", value->get<int64_t>());
    if (value->is_number_integer() &&
        (value->is_number_unsigned() ? value->get<uint64_t>() > uint64_t(max_allowed)
                                     : value->get<int64_t>() > max_allowed))
      reject(key, "{} exceeds the context length of {} tokens", describe(*value), max_allowed);
    out.max_tokens = read_int(body, key, key, 1, max_allowed);
  }
  if (auto n = read_int(body, "n", "n", 1, std::numeric_limits<int32_t>::max())) {
    if (*n > limits.max_choices)
      reject("n", "at most {} choices per request are allowed, found {}", limits.max_choices, *n);
    out.n = int(*n);
  }
  out.stream = read_bool(body, "stream", "stream").value_or(false);
  if (const json* options = field(body, "stream_options")) {
    if (!options->is_object())
      reject("stream_options", "expected an object, found {}", describe(*options));
    if (!out.stream) reject("stream_options", "only allowed when stream is true");
    out.include_usage =
        read_bool(*options, "include_usage", "stream_options.include_usage").value_or(false);
  }
  out.ignore_eos = read_bool(body, "ignore_eos", "ignore_eos").value_or(false);
}

// logit_bias: {"<token id>": bias}, the ids in the vocabulary, the biases in [-100, 100].
void read_logit_bias(const json& body, const RequestLimits& limits, GenerationRequest& out) {
  const json* bias = field(body, "logit_bias");
  if (!bias) return;
  if (!bias->is_object())
    reject("logit_bias", "expected an object mapping token ids (as strings) to numbers, found {}",
           describe(*bias));
  if (bias->size() > limits.max_logit_bias)
    reject("logit_bias", "at most {} entries are allowed, found {}", limits.max_logit_bias,
           bias->size());
  auto& entries = out.sampling.logit_bias;
  for (const auto& [key, value] : bias->items()) {
    const std::string path = child("logit_bias", utf8_repair(key));
    // Digits only: "01", "+1", " 1" and "1e3" are not token ids.
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos &&
                        (key.size() == 1 || key[0] != '0');
    const int64_t id = digits ? std::strtoll(key.c_str(), nullptr, 10) : -1;
    if (!digits || id >= limits.n_vocab)
      reject(path, "the key must be a token id in the vocabulary [0, {}), found {}", limits.n_vocab,
             describe(json(key)));
    if (!value.is_number() || !std::isfinite(value.get<double>()) ||
        std::abs(value.get<double>()) > kMaxLogitBias)
      reject(path, "expected a number between -100 and 100, found {}", describe(value));
    entries.emplace_back(int32_t(id), float(value.get<double>()));
  }
  std::sort(entries.begin(), entries.end());
}

// The OpenAI rules strata honours beyond the basic sampling settings: logit_bias, the
// frequency/presence penalties and log-probabilities.
void read_openai_rules(const json& body, Endpoint endpoint, const RequestLimits& limits,
                       GenerationRequest& out) {
  read_logit_bias(body, limits, out);
  if (auto v = read_number(body, "frequency_penalty", "frequency_penalty", -2.0, 2.0))
    out.sampling.frequency_penalty = float(*v);
  if (auto v = read_number(body, "presence_penalty", "presence_penalty", -2.0, 2.0))
    out.sampling.presence_penalty = float(*v);
  if (endpoint == Endpoint::Completions) {
    // The legacy field: the number of alternatives per token (0 = only the chosen token's).
    if (auto n = read_int(body, "logprobs", "logprobs", 0, kMaxTopLogprobs)) out.logprobs = int(*n);
    return;
  }
  const bool wanted = read_bool(body, "logprobs", "logprobs").value_or(false);
  const auto top = read_int(body, "top_logprobs", "top_logprobs", 0, kMaxTopLogprobs);
  if (top && !wanted)
    reject("top_logprobs", "requires \"logprobs\": true, found logprobs {}",
           describe(field(body, "logprobs") ? *field(body, "logprobs") : json(nullptr)));
  if (wanted) out.logprobs = int(top.value_or(0));
}

// Fields whose effect strata cannot give: rejected so a client never silently gets something else.
void reject_unsupported(const json& body, Endpoint endpoint) {
  if (endpoint == Endpoint::Completions) {
    if (const json* tools = field(body, "tools"); tools && !(tools->is_array() && tools->empty()))
      reject("tools", "tools are only for /v1/chat/completions");
    if (const json* choice = field(body, "tool_choice"); choice && *choice != "none")
      reject("tool_choice", "tools are only for /v1/chat/completions");
  }
  if (field(body, "functions") || field(body, "function_call"))
    reject(field(body, "functions") ? "functions" : "function_call",
           "function calling is not supported by this server");
  if (endpoint == Endpoint::Completions) {
    if (read_bool(body, "echo", "echo").value_or(false))
      reject("echo", "echo is not supported by this server");
    if (auto best_of = read_int(body, "best_of", "best_of", 1, 1 << 20); best_of && *best_of != 1)
      reject("best_of", "only best_of=1 is supported, found {}", *best_of);
    if (const std::string* suffix = read_string(body, "suffix", "suffix");
        suffix && !suffix->empty())
      reject("suffix", "suffix is not supported by this server");
  }
}

}  // namespace

GenerationRequest request_fields::parse_fields(const json& body, Endpoint endpoint,
                                               const RequestLimits& limits) {
  GenerationRequest out;
  out.endpoint = endpoint;
  read_model(body, limits, out);
  if (endpoint == Endpoint::ChatCompletions) {
    read_messages(body, out);
    read_tools(body, limits, out);
    if (const json* kwargs = field(body, "chat_template_kwargs")) {
      if (!kwargs->is_object())
        reject("chat_template_kwargs", "expected an object, found {}", describe(*kwargs));
      out.enable_thinking =
          read_bool(*kwargs, "enable_thinking", "chat_template_kwargs.enable_thinking");
    }
  } else {
    read_prompt(body, limits, out);
  }
  read_limits_and_stream(body, limits, out);
  read_sampling(body, out);
  read_stop(body, limits, out);
  read_openai_rules(body, endpoint, limits, out);
  reject_unsupported(body, endpoint);
  return out;
}

std::string_view endpoint_path(Endpoint endpoint) {
  return endpoint == Endpoint::ChatCompletions ? "/v1/chat/completions" : "/v1/completions";
}

namespace {

// llama-server's `grammar`: GBNF text the whole reply is drawn under ("" is none, as there).
// Compiled through `grammars`, keyed by the text.
void read_grammar(const json& value, GenerationRequest& out, GrammarCache* grammars) {
  if (!value.is_string())
    reject("grammar", "expected GBNF text (a string), found {}", describe(value));
  const std::string& text = value.get_ref<const std::string&>();
  if (text.empty()) return;
  if (out.response_format.grammar)
    reject("grammar",
           "cannot be combined with a response_format of type {}: each constrains the whole "
           "reply; send one of them",
           out.response_format.type == ResponseFormat::Type::JsonObject ? "json_object"
                                                                        : "json_schema");
  if (!out.tools.empty() && out.tool_choice != ToolChoice::None)
    reject("grammar",
           "cannot be combined with tools: tool calls are drawn under their own grammar; send "
           "one or the other (or tool_choice \"none\")");
  GrammarResult result = cached_grammar(grammars, "gbnf\n" + text, [&]() -> GrammarResult {
    try {
      return std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(text));
    } catch (const grammar::GbnfError& error) {
      return invalid_field("grammar", "line {}, column {}: {}", error.line(), error.column(),
                           error.detail());
    }
  });
  if (ApiError* error = std::get_if<ApiError>(&result)) throw Rejection{std::move(*error)};
  out.grammar = std::get<std::shared_ptr<const grammar::Grammar>>(std::move(result));
}

}  // namespace

ParseResult parse_generation_request(std::string_view body, Endpoint endpoint,
                                     const RequestLimits& limits, GrammarCache* grammars) {
  return parse_with<GenerationRequest>(body, limits, [&](const json& parsed) {
    GenerationRequest request = parse_fields(parsed, endpoint, limits);
    // The template renders each tool as the client wrote it (key order too), and a schema's
    // properties are generated in the order they are written: both again from an order-keeping
    // parse (the one above sorts keys).
    if (!request.tools.empty() || field(parsed, "response_format")) {
      const auto ordered = nlohmann::ordered_json::parse(body);
      for (size_t i = 0; i < request.tools.size(); ++i)
        request.tools[i] =
            ordered.at("tools").at(i).dump(-1, ' ', false, json::error_handler_t::replace);
      if (field(parsed, "response_format")) {
        auto format = parse_response_format(ordered["response_format"], grammars);
        if (ApiError* error = std::get_if<ApiError>(&format)) throw Rejection{std::move(*error)};
        request.response_format = std::move(std::get<ResponseFormat>(format));
      }
    }
    if (const json* gbnf = field(parsed, "grammar"); gbnf && !gbnf->is_null())
      read_grammar(*gbnf, request, grammars);
    return request;
  });
}

std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body,
                                                               const RequestLimits& limits) {
  return parse_with<TokenizeRequest>(body, limits, [](const json& parsed) {
    TokenizeRequest out;
    const std::string* content = read_string(parsed, "content", "content");
    if (!content) reject("content", "missing: expected the text to tokenize as a string");
    out.content = *content;
    out.add_special = read_bool(parsed, "add_special", "add_special").value_or(false);
    out.parse_special = read_bool(parsed, "parse_special", "parse_special").value_or(true);
    out.with_pieces = read_bool(parsed, "with_pieces", "with_pieces").value_or(false);
    return out;
  });
}

std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view body,
                                                                   const RequestLimits& limits) {
  return parse_with<DetokenizeRequest>(body, limits, [&](const json& parsed) {
    const json* tokens = field(parsed, "tokens");
    if (!tokens) reject("tokens", "missing: expected an array of token ids");
    if (!tokens->is_array())
      reject("tokens", "expected an array of token ids, found {}", describe(*tokens));
    DetokenizeRequest out;
    out.tokens.reserve(tokens->size());
    for (size_t i = 0; i < tokens->size(); ++i) {
      const json& id = (*tokens)[i];
      const int64_t max_id = limits.n_vocab > 0 ? limits.n_vocab - 1 : INT32_MAX;
      if (!id.is_number_integer() ||
          (id.is_number_unsigned() && id.get<uint64_t>() > uint64_t(max_id)) ||
          id.get<int64_t>() < 0 || id.get<int64_t>() > max_id)
        reject(element("tokens", i), "expected a token id between 0 and {}, found {}", max_id,
               describe(id));
      out.tokens.push_back(int32_t(id.get<int64_t>()));
    }
    return out;
  });
}

}  // namespace strata::serve
