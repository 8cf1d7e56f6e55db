#include "serve/request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "grammar/gbnf.h"
#include "text/utf8.h"

namespace strata::serve {
namespace {

using nlohmann::json;

// Thrown inside the parser only; parse_generation_request turns it into its result.
struct Rejection {
  ApiError error;
};

template <typename... Args>
[[noreturn]] void reject(std::string param, fmt::format_string<Args...> format, Args&&... args) {
  throw Rejection{invalid_field(std::move(param), format, std::forward<Args>(args)...)};
}

[[noreturn]] void reject_body(std::string message, std::string param = {}) {
  ApiError error;
  error.message = std::move(message);
  error.param = std::move(param);
  throw Rejection{std::move(error)};
}

// A short, printable rendering of a value for messages: numbers and booleans as written, strings
// quoted and cut at 40 bytes, containers by their type.
std::string describe(const json& value) {
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text.size() <= 40) return json(text).dump(-1, ' ', false, json::error_handler_t::replace);
    return json(utf8_repair(std::string_view(text).substr(0, 40)) + "...")
        .dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (value.is_number() || value.is_boolean() || value.is_null()) return value.dump();
  return value.type_name();
}

std::string child(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}

std::string element(const std::string& path, size_t index) {
  return fmt::format("{}[{}]", path, index);
}

// The value of `key`, or nullptr when it is absent or null (OpenAI treats null as "not set").
const json* field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> read_bool(const json& object, const char* key, const std::string& path) {
  const json* value = field(object, key);
  if (!value) return std::nullopt;
  if (!value->is_boolean()) reject(path, "expected true or false, found {}", describe(*value));
  return value->get<bool>();
}

std::optional<int64_t> read_int(const json& object, const char* key, const std::string& path,
                                int64_t min, int64_t max) {
  const json* value = field(object, key);
  if (!value) return std::nullopt;
  if (!value->is_number_integer())
    reject(path, "expected an integer between {} and {}, found {}", min, max, describe(*value));
  if (value->is_number_unsigned() && value->get<uint64_t>() > uint64_t(max))
    reject(path, "expected an integer between {} and {}, found {}", min, max, describe(*value));
  const int64_t number = value->get<int64_t>();
  if (number < min || number > max)
    reject(path, "expected an integer between {} and {}, found {}", min, max, number);
  return number;
}

std::optional<double> read_number(const json& object, const char* key, const std::string& path,
                                  double min, double max) {
  const json* value = field(object, key);
  if (!value) return std::nullopt;
  if (!value->is_number())
    reject(path, "expected a number between {} and {}, found {}", min, max, describe(*value));
  const double number = value->get<double>();
  if (!std::isfinite(number) || number < min || number > max)
    reject(path, "expected a number between {} and {}, found {}", min, max, describe(*value));
  return number;
}

const std::string* read_string(const json& object, const char* key, const std::string& path) {
  const json* value = field(object, key);
  if (!value) return nullptr;
  if (!value->is_string()) reject(path, "expected a string, found {}", describe(*value));
  return &value->get_ref<const std::string&>();
}

// ---- JSON-level checks run before and after nlohmann's parser
// ------------------------------------

// Records the field being read while nlohmann's SAX parser walks the text, so that a syntax error
// can name where it happened ("messages[0].content"). Values are not stored.
class FieldTracker : public json::json_sax_t {
 public:
  bool null() override { return value_done(); }
  bool boolean(bool) override { return value_done(); }
  bool number_integer(number_integer_t) override { return value_done(); }
  bool number_unsigned(number_unsigned_t) override { return value_done(); }
  bool number_float(number_float_t, const string_t&) override { return value_done(); }
  bool string(string_t&) override { return value_done(); }
  bool binary(binary_t&) override { return value_done(); }
  bool start_object(std::size_t) override {
    frames_.push_back({false, 0, {}, false});
    return true;
  }
  bool key(string_t& key) override {
    frames_.back().key = key;
    frames_.back().has_key = true;
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return value_done();
  }
  bool start_array(std::size_t) override {
    frames_.push_back({true, 0, {}, false});
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return value_done();
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& error) override {
    // nlohmann's messages start with "[json.exception.parse_error.101] parse error at line 1, ...".
    const std::string what = error.what();
    const size_t cut = what.find("] ");
    error_ = cut == std::string::npos ? what : what.substr(cut + 2);
    return false;
  }

  std::string path() const {
    std::string out;
    for (const Frame& frame : frames_) {
      if (frame.is_array) {
        out = element(out, frame.index);
      } else if (frame.has_key) {
        out = child(out, utf8_repair(frame.key));
      }
    }
    return out;
  }
  const std::string& error() const { return error_; }
  // True once the top-level value was complete: an error after that is trailing data.
  bool value_complete() const { return value_complete_; }

 private:
  struct Frame {
    bool is_array;
    size_t index;
    std::string key;
    bool has_key;
  };
  bool value_done() {
    if (frames_.empty()) value_complete_ = true;
    if (!frames_.empty()) {
      if (frames_.back().is_array) {
        ++frames_.back().index;
      } else {
        frames_.back().has_key = false;
      }
    }
    return true;
  }
  std::vector<Frame> frames_;
  std::string error_;
  bool value_complete_ = false;
};

std::string where(const std::string& path) {
  return path.empty() ? std::string() : fmt::format(" (in {})", path);
}

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t first_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    char32_t cp;
    const size_t n = utf8_sequence_at(text, pos, cp);
    if (n == 0) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

// nlohmann parses arbitrarily deep input; a bound keeps a hostile body from costing more than
// its size. Counts [ and { outside strings.
void check_depth(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        reject_body(fmt::format("request body: JSON nested deeper than {} levels (at byte {})",
                                max_depth, i));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

json parse_body(std::string_view body, int max_depth) {
  if (body.empty()) reject_body("request body is empty; expected a JSON object");
  if (const size_t bad = first_invalid_utf8(body); bad != std::string_view::npos) {
    FieldTracker tracker;
    json::sax_parse(body.substr(0, bad), &tracker, json::input_format_t::json, false);
    reject_body(
        fmt::format("request body is not valid UTF-8: ill-formed byte 0x{:02X} at byte {}{}",
                    static_cast<unsigned char>(body[bad]), bad, where(tracker.path())),
        tracker.path());
  }
  check_depth(body, max_depth);
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    // Strict, like json::parse: trailing data after the value is an error here too (a lenient
    // walk would find none and leave the message empty).
    FieldTracker tracker;
    json::sax_parse(body, &tracker, json::input_format_t::json, /*strict=*/true);
    const std::string what = tracker.error().empty() ? "the parser stopped" : tracker.error();
    if (tracker.value_complete())
      reject_body(
          fmt::format("request body is not valid JSON: unexpected data after the JSON "
                      "object ended (one object per request): {}",
                      what));
    reject_body(fmt::format("request body is not valid JSON{}: {}", where(tracker.path()), what),
                tracker.path());
  }
  if (!parsed.is_object())
    reject_body(fmt::format("request body: expected a JSON object, found {}", parsed.type_name()));
  return parsed;
}

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

// OpenAI's function names: [a-zA-Z0-9_-]{1,64} (they are written into the prompt's tags).
bool valid_function_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 &&
         name.find_first_not_of(
             "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
             std::string::npos;
}

// By value: g++ 13 takes a reference bound to the result for one into the temporary `path`
// (-Wdangling-reference), though it points into `function`.
std::string read_function_name(const json& function, const std::string& path) {
  const std::string* name = read_string(function, "name", child(path, "name"));
  if (!name) reject(child(path, "name"), "required: the function's name");
  if (!valid_function_name(*name))
    reject(child(path, "name"), "expected 1 to 64 letters, digits, '_' or '-', found {}",
           describe(json(*name)));
  return *name;
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
  const json* messages = field(body, "messages");
  if (!messages) reject("messages", "required: a non-empty array of messages");
  if (!messages->is_array())
    reject("messages", "expected a non-empty array of messages, found {}", describe(*messages));
  if (messages->empty())
    reject("messages", "expected a non-empty array of messages, found an empty array");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string path = element("messages", i);
    if (!message.is_object())
      reject(path, "expected a message object, found {}", describe(message));
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

GenerationRequest parse_fields(const json& body, Endpoint endpoint, const RequestLimits& limits) {
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

}  // namespace

std::string_view endpoint_path(Endpoint endpoint) {
  return endpoint == Endpoint::ChatCompletions ? "/v1/chat/completions" : "/v1/completions";
}

namespace {

// Parses `body` and runs `read` on the object; a rejection or an allocation failure becomes the
// ApiError of the result.
template <typename Result, typename Read>
std::variant<Result, ApiError> parse_with(std::string_view body, const RequestLimits& limits,
                                          Read read) {
  try {
    const json parsed = parse_body(body, limits.max_json_depth);
    return read(parsed);
  } catch (Rejection& rejection) {
    return std::move(rejection.error);
  } catch (const std::bad_alloc&) {
    ApiError error;
    error.status = 413;
    error.message = "request body: too large to parse";
    return error;
  }
}

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

namespace {

// The Anthropic fields with another name or shape in the OpenAI chat body; see request.h.
json anthropic_to_chat(const json& body) {
  if (!field(body, "max_tokens")) reject("max_tokens", "required by the Messages API");
  if (field(body, "response_format"))
    reject("response_format", "not part of the Messages API (use /v1/chat/completions)");
  if (field(body, "grammar"))
    reject("grammar", "not part of the Messages API (use /v1/chat/completions)");
  // Anthropic's tool shapes (input_schema, tool_use blocks) are not translated.
  if (const json* tools = field(body, "tools"); tools && !(tools->is_array() && tools->empty()))
    reject("tools", "tools are not supported on /v1/messages; use /v1/chat/completions");
  json chat = json::object();
  for (const auto& [key, value] : body.items())
    if (key != "system" && key != "stop_sequences" && key != "thinking" && key != "messages" &&
        key != "metadata")
      chat[key] = value;
  json messages = json::array();
  if (const json* system = field(body, "system")) {
    if (!system->is_string() && !system->is_array())
      reject("system", "expected a string or an array of text blocks, found {}", describe(*system));
    messages.push_back(json{{"role", "system"}, {"content", *system}});
  }
  const json* turns = field(body, "messages");
  if (!turns || !turns->is_array() || turns->empty())
    reject("messages", "expected a non-empty array of messages, found {}",
           turns ? (turns->is_array() ? std::string("an empty array") : describe(*turns))
                 : std::string("nothing"));
  for (const json& turn : *turns) messages.push_back(turn);
  chat["messages"] = std::move(messages);
  if (const json* stops = field(body, "stop_sequences")) {
    if (!stops->is_array())
      reject("stop_sequences", "expected an array of strings, found {}", describe(*stops));
    for (size_t i = 0; i < stops->size(); ++i)
      if (!(*stops)[i].is_string())
        reject(element("stop_sequences", i), "expected a string, found {}", describe((*stops)[i]));
    chat["stop"] = *stops;
  }
  if (const json* thinking = field(body, "thinking")) {
    if (!thinking->is_object())
      reject("thinking", "expected an object, found {}", describe(*thinking));
    const std::string* type = read_string(*thinking, "type", "thinking.type");
    if (!type || (*type != "enabled" && *type != "disabled"))
      reject("thinking.type", "expected \"enabled\" or \"disabled\", found {}",
             type ? describe(json(*type)) : std::string("nothing"));
    chat["chat_template_kwargs"] = json{{"enable_thinking", *type == "enabled"}};
  }
  return chat;
}

}  // namespace

ParseResult parse_anthropic_messages_request(std::string_view body, const RequestLimits& limits) {
  return parse_with<GenerationRequest>(body, limits, [&](const json& parsed) {
    const json chat = anthropic_to_chat(parsed);
    // A system message from `system` shifts the indices of the others: name them as sent.
    const size_t shift = field(parsed, "system") ? 1 : 0;
    try {
      GenerationRequest request = parse_fields(chat, Endpoint::ChatCompletions, limits);
      // The Messages API's response has one reply and no log-probabilities to carry them in.
      if (request.n != 1) reject("n", "the Messages API gives one reply, found n {}", request.n);
      if (request.logprobs) reject("logprobs", "the Messages API has no log probabilities");
      return request;
    } catch (Rejection& rejection) {
      std::string& param = rejection.error.param;
      if (shift && param.rfind("messages[", 0) == 0) {
        const size_t index = std::strtoul(param.c_str() + 9, nullptr, 10);
        const std::string rest = param.substr(param.find(']') + 1);
        // The system message's content is `system` itself: its blocks keep their index
        // (messages[0].content[1].type is system[1].type).
        constexpr std::string_view kContent = ".content";
        const std::string renamed =
            index == 0 ? "system" + (rest.rfind(kContent, 0) == 0 ? rest.substr(kContent.size())
                                                                  : std::string())
                       : element("messages", index - 1) + rest;
        const size_t at = rejection.error.message.find(param);
        if (at != std::string::npos) rejection.error.message.replace(at, param.size(), renamed);
        param = renamed;
      }
      throw;
    }
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
