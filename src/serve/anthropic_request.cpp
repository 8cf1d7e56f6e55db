// Anthropic's Messages API request (POST /v1/messages) translated to the OpenAI chat body that
// serve/request.cpp parses; the rules are in serve/request.h (parse_anthropic_messages_request).
// Everything Anthropic-shaped (content blocks, tools, tool_choice) is checked here, so that its
// errors name the body's own paths; what the two APIs share is checked by the chat parser.
#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/request.h"
#include "serve/request_fields.h"

namespace strata::serve {

// The shared readers (reject, field, describe, ...): serve/request_fields.h.
using namespace request_fields;

namespace {

using OrderedJson = nlohmann::ordered_json;

std::string dump_text(const OrderedJson& value) {
  return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// The body again with its keys in the order sent, parsed on first use. The chat template renders
// a tool and a tool call's arguments as the client wrote them, and a forced call's grammar writes
// a schema's properties in their written order: all three come from this parse (the one the
// checks read sorts keys). parse_body has accepted the text, so this parse cannot fail.
class OrderedBody {
 public:
  explicit OrderedBody(std::string_view body) : body_(body) {}
  const OrderedJson& get() {
    if (!parsed_) parsed_ = OrderedJson::parse(body_);
    return *parsed_;
  }

 private:
  std::string_view body_;
  std::optional<OrderedJson> parsed_;
};

// The chat body built from an Anthropic body, and what is needed to read its parser's answer.
struct ChatBody {
  json chat = json::object();
  // Per chat message, the Anthropic field it came from ("system", "messages[3]"): errors about
  // the chat message are renamed to it.
  std::vector<std::string> message_paths;
  std::vector<std::string> tool_texts;  // the function tools' JSON texts, keys as sent
};

// `error`'s param renamed `renamed`, in the message too (it starts with the param).
void rename_param(ApiError& error, const std::string& renamed) {
  const size_t at = error.message.find(error.param);
  if (at != std::string::npos) error.message.replace(at, error.param.size(), renamed);
  error.param = renamed;
}

// ---- tools and tool_choice --------------------------------------------------------------------

// An Anthropic tool as an OpenAI function tool, for the sorted and the order-keeping parse alike.
template <typename Json>
Json function_tool(const Json& tool) {
  Json function = Json::object();
  function["name"] = tool.at("name");
  if (tool.contains("description") && !tool.at("description").is_null())
    function["description"] = tool.at("description");
  function["parameters"] = tool.at("input_schema");
  Json out = Json::object();
  out["type"] = "function";
  out["function"] = std::move(function);
  return out;
}

// tools: client tools {name, description?, input_schema}; returns their names.
std::vector<std::string> read_tools(const json& body, OrderedBody& ordered, ChatBody& out) {
  const json* tools = field(body, "tools");
  if (!tools) return {};
  if (!tools->is_array()) reject("tools", "expected an array of tools, found {}", describe(*tools));
  std::vector<std::string> names;
  json functions = json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& tool = (*tools)[i];
    const std::string at = element("tools", i);
    if (!tool.is_object())
      reject(at, "expected a tool object with name, description and input_schema, found {}",
             describe(tool));
    // Anthropic's server tools (web_search_…, bash_…, …) run on Anthropic's side.
    if (const std::string* type = read_string(tool, "type", child(at, "type"));
        type && *type != "custom")
      reject(child(at, "type"),
             "only client tools (type \"custom\" or none: name, description, input_schema) are "
             "supported, found {}",
             describe(json(*type)));
    const std::string name = read_function_name(tool, at);
    if (std::find(names.begin(), names.end(), name) != names.end())
      reject(child(at, "name"), "two tools are named {}", describe(json(name)));
    names.push_back(name);
    read_string(tool, "description", child(at, "description"));
    const json* schema = field(tool, "input_schema");
    if (!schema)
      reject(child(at, "input_schema"),
             "required: the JSON schema of the tool's input (an object)");
    if (!schema->is_object())
      reject(child(at, "input_schema"), "expected a JSON schema object, found {}",
             describe(*schema));
    functions.push_back(function_tool(tool));
    out.tool_texts.push_back(dump_text(function_tool(ordered.get().at("tools").at(i))));
  }
  out.chat["tools"] = std::move(functions);
  return names;
}

// tool_choice {"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}.
void read_tool_choice(const json& body, const std::vector<std::string>& names, ChatBody& out) {
  const json* choice = field(body, "tool_choice");
  if (!choice) return;
  if (!choice->is_object())
    reject("tool_choice", "expected an object such as {{\"type\": \"auto\"}}, found {}",
           describe(*choice));
  const std::string* type = read_string(*choice, "type", "tool_choice.type");
  if (!type) reject("tool_choice.type", "required: \"auto\", \"any\", \"tool\" or \"none\"");
  if (*type != "auto" && *type != "any" && *type != "tool" && *type != "none")
    reject("tool_choice.type", "expected \"auto\", \"any\", \"tool\" or \"none\", found {}",
           describe(json(*type)));
  if (*type == "none") {
    out.chat["tool_choice"] = "none";
    return;
  }
  if (names.empty())
    reject("tool_choice", "type {} needs tools, and the request has none", describe(json(*type)));
  if (*type == "tool") {
    const std::string name = read_function_name(*choice, "tool_choice");
    if (std::find(names.begin(), names.end(), name) == names.end())
      reject("tool_choice.name", "{} is not one of the request's tools", describe(json(name)));
    out.chat["tool_choice"] = json{{"type", "function"}, {"function", {{"name", name}}}};
  } else {
    out.chat["tool_choice"] = *type == "auto" ? "auto" : "required";
  }
  if (auto disable =
          read_bool(*choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use"))
    out.chat["parallel_tool_calls"] = !*disable;
}

// ---- content blocks ---------------------------------------------------------------------------

// A content block's type; the block must be an object with one.
std::string block_type(const json& block, const std::string& at) {
  if (!block.is_object()) reject(at, "expected a content block object, found {}", describe(block));
  const std::string* type = read_string(block, "type", child(at, "type"));
  if (!type) reject(child(at, "type"), "required: the block's type, such as \"text\"");
  return *type;
}

[[noreturn]] void reject_block(const std::string& at, const std::string& type,
                               std::string_view role) {
  if (type == "tool_use" || type == "thinking" || type == "tool_result")
    reject(child(at, "type"), "a {} block belongs in {} message, found in a \"{}\" message",
           describe(json(type)), type == "tool_result" ? "a \"user\"" : "an \"assistant\"", role);
  reject(child(at, "type"),
         "only \"text\", \"thinking\", \"tool_use\" and \"tool_result\" blocks are supported, "
         "found {}",
         describe(json(type)));
}

// A text block's text ({"type": "text", "text": …}; citations and cache_control are ignored).
std::string read_text_block(const json& block, const std::string& at) {
  const std::string* text = read_string(block, "text", child(at, "text"));
  if (!text) reject(child(at, "text"), "required for a text block");
  return *text;
}

// A tool_result's content as text: a string, text blocks joined, or "" when absent.
std::string tool_result_text(const json& block, const std::string& at) {
  const json* content = field(block, "content");
  const std::string path = child(at, "content");
  if (!content) return {};
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array())
    reject(path, "expected a string or an array of text blocks, found {}", describe(*content));
  std::string text;
  for (size_t k = 0; k < content->size(); ++k) {
    const std::string inner = element(path, k);
    const std::string type = block_type((*content)[k], inner);
    if (type != "text")
      reject(child(inner, "type"),
             "a tool result reaches the model as text: expected \"text\", found {}",
             describe(json(type)));
    text += read_text_block((*content)[k], inner);
  }
  return text;
}

// The ids a tool_result may still answer, listed for a message.
std::string describe_ids(const std::vector<std::string>& ids) {
  if (ids.empty()) return "that message has no unanswered tool_use block";
  std::string out = "its unanswered ids: ";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + describe(json(ids[i]));
  return out;
}

// A tool_result block as a "tool" message. `open_calls`: the ids of the previous assistant
// message's tool_use blocks not answered yet; the one answered is taken out.
json read_tool_result(const json& block, const std::string& at,
                      std::vector<std::string>& open_calls) {
  const std::string* id = read_string(block, "tool_use_id", child(at, "tool_use_id"));
  if (!id) reject(child(at, "tool_use_id"), "required: the id of the tool_use block it answers");
  const auto open = std::find(open_calls.begin(), open_calls.end(), *id);
  if (open == open_calls.end())
    reject(child(at, "tool_use_id"),
           "{} answers no tool_use block of the assistant message just before ({})",
           describe(json(*id)), describe_ids(open_calls));
  open_calls.erase(open);
  std::string text = tool_result_text(block, at);
  // The chat templates have no place for the flag: the model reads it in the text.
  if (read_bool(block, "is_error", child(at, "is_error")).value_or(false)) text = "Error: " + text;
  return json{{"role", "tool"}, {"tool_call_id", *id}, {"content", std::move(text)}};
}

// A tool_use block as an OpenAI tool call; its id joins `call_ids`. `ordered_input()`: the
// block's input from the order-keeping parse (asked for once the input is known to be there).
template <typename OrderedInput>
json read_tool_use(const json& block, const std::string& at, OrderedInput ordered_input,
                   std::vector<std::string>& call_ids) {
  const std::string* id = read_string(block, "id", child(at, "id"));
  if (!id || id->empty())
    reject(child(at, "id"),
           "required: the call's id (a non-empty string) that its tool_result names");
  if (std::find(call_ids.begin(), call_ids.end(), *id) != call_ids.end())
    reject(child(at, "id"), "two tool_use blocks of this message have the id {}",
           describe(json(*id)));
  call_ids.push_back(*id);
  const std::string name = read_function_name(block, at);
  const json* arguments = field(block, "input");
  if (!arguments || !arguments->is_object())
    reject(child(at, "input"), "required: the call's arguments as a JSON object, found {}",
           arguments ? describe(*arguments) : std::string("nothing"));
  return json{{"id", *id},
              {"type", "function"},
              {"function", {{"name", name}, {"arguments", dump_text(ordered_input())}}}};
}

// ---- messages ---------------------------------------------------------------------------------

// An assistant message's blocks as one chat message: text joined as content, thinking as
// reasoning_content, tool_use blocks as tool_calls. `index`: the message's place in `messages`;
// `call_ids` gets the ids of its tool_use blocks.
json translate_assistant(const json& blocks, size_t index, OrderedBody& ordered,
                         std::vector<std::string>& call_ids) {
  const std::string path = child(element("messages", index), "content");
  std::string text, thinking;
  bool thought = false;
  json calls = json::array();
  for (size_t j = 0; j < blocks.size(); ++j) {
    const std::string at = element(path, j);
    const std::string type = block_type(blocks[j], at);
    if (type == "text") {
      text += read_text_block(blocks[j], at);
    } else if (type == "thinking") {
      const std::string* part = read_string(blocks[j], "thinking", child(at, "thinking"));
      if (!part) reject(child(at, "thinking"), "required for a thinking block");
      thinking += *part;
      thought = true;
    } else if (type == "tool_use") {
      auto input = [&]() -> const OrderedJson& {
        return ordered.get().at("messages").at(index).at("content").at(j).at("input");
      };
      calls.push_back(read_tool_use(blocks[j], at, input, call_ids));
    } else {
      reject_block(at, type, "assistant");
    }
  }
  json message{{"role", "assistant"}, {"content", std::move(text)}};
  if (thought) message["reasoning_content"] = std::move(thinking);
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  return message;
}

// A user message's blocks as chat messages in the order sent: each run of text blocks one user
// message, each tool_result a "tool" message (answering one of `open_calls`).
std::vector<json> translate_user(const json& blocks, size_t index,
                                 std::vector<std::string>& open_calls) {
  const std::string path = child(element("messages", index), "content");
  std::vector<json> out;
  std::optional<std::string> text;  // the run of text blocks not yet a message
  auto flush = [&] {
    if (text) out.push_back(json{{"role", "user"}, {"content", std::move(*text)}});
    text.reset();
  };
  for (size_t j = 0; j < blocks.size(); ++j) {
    const std::string at = element(path, j);
    const std::string type = block_type(blocks[j], at);
    if (type == "text") {
      text = text.value_or("") + read_text_block(blocks[j], at);
    } else if (type == "tool_result") {
      flush();
      out.push_back(read_tool_result(blocks[j], at, open_calls));
    } else {
      reject_block(at, type, "user");
    }
  }
  if (text || out.empty()) out.push_back(json{{"role", "user"}, {"content", text.value_or("")}});
  return out;
}

// messages: each Anthropic message as one or more chat messages (see request.h).
void read_messages(const json& body, OrderedBody& ordered, ChatBody& out, json& messages) {
  const json& turns = message_array(body);
  std::vector<std::string> open_calls;  // the previous assistant message's unanswered tool_use ids
  for (size_t i = 0; i < turns.size(); ++i) {
    const json& message = turns[i];
    const std::string path = element("messages", i);
    const std::string* role = read_string(message, "role", child(path, "role"));
    if (!role || (*role != "user" && *role != "assistant"))
      reject(child(path, "role"),
             "expected \"user\" or \"assistant\" (the Messages API takes the system prompt in "
             "\"system\"), found {}",
             role ? describe(json(*role)) : std::string("nothing"));
    const json* content = field(message, "content");
    if (!content || (!content->is_string() && !content->is_array()))
      reject(child(path, "content"), "expected a string or an array of content blocks, found {}",
             content ? describe(*content) : std::string("nothing"));
    std::vector<json> translated;
    std::vector<std::string> call_ids;
    if (content->is_string()) {
      translated.push_back(json{{"role", *role}, {"content", *content}});
    } else if (*role == "assistant") {
      translated.push_back(translate_assistant(*content, i, ordered, call_ids));
    } else {
      translated = translate_user(*content, i, open_calls);
    }
    open_calls = std::move(call_ids);
    for (json& chat_message : translated) {
      messages.push_back(std::move(chat_message));
      out.message_paths.push_back(path);
    }
  }
}

// ---- the body ---------------------------------------------------------------------------------

// The fields with another name or shape in the OpenAI chat body; the others are copied.
ChatBody anthropic_to_chat(const json& body, OrderedBody& ordered) {
  if (!field(body, "max_tokens")) reject("max_tokens", "required by the Messages API");
  if (field(body, "response_format"))
    reject("response_format", "not part of the Messages API (use /v1/chat/completions)");
  if (field(body, "grammar"))
    reject("grammar", "not part of the Messages API (use /v1/chat/completions)");
  ChatBody out;
  for (const auto& [key, value] : body.items())
    if (key != "system" && key != "stop_sequences" && key != "thinking" && key != "messages" &&
        key != "metadata" && key != "tools" && key != "tool_choice")
      out.chat[key] = value;
  json messages = json::array();
  if (const json* system = field(body, "system")) {
    if (!system->is_string() && !system->is_array())
      reject("system", "expected a string or an array of text blocks, found {}", describe(*system));
    // Its blocks are checked by the chat parser (errors renamed to system[i] below).
    messages.push_back(json{{"role", "system"}, {"content", *system}});
    out.message_paths.push_back("system");
  }
  read_messages(body, ordered, out, messages);
  out.chat["messages"] = std::move(messages);
  read_tool_choice(body, read_tools(body, ordered, out), out);
  if (const json* stops = field(body, "stop_sequences")) {
    if (!stops->is_array())
      reject("stop_sequences", "expected an array of strings, found {}", describe(*stops));
    for (size_t i = 0; i < stops->size(); ++i)
      if (!(*stops)[i].is_string())
        reject(element("stop_sequences", i), "expected a string, found {}", describe((*stops)[i]));
    out.chat["stop"] = *stops;
  }
  if (const json* thinking = field(body, "thinking")) {
    if (!thinking->is_object())
      reject("thinking", "expected an object, found {}", describe(*thinking));
    const std::string* type = read_string(*thinking, "type", "thinking.type");
    if (!type || (*type != "enabled" && *type != "disabled"))
      reject("thinking.type", "expected \"enabled\" or \"disabled\", found {}",
             type ? describe(json(*type)) : std::string("nothing"));
    out.chat["chat_template_kwargs"] = json{{"enable_thinking", *type == "enabled"}};
  }
  return out;
}

// An error of the chat parser about chat message k renamed to the Anthropic field it came from.
// The system message's content is `system` itself: its blocks keep their index
// (messages[0].content[1].type is system[1].type).
void name_message_field(ApiError& error, const std::vector<std::string>& message_paths) {
  constexpr std::string_view kMessages = "messages[";
  if (!error.param.starts_with(kMessages)) return;
  const size_t index = std::strtoul(error.param.c_str() + kMessages.size(), nullptr, 10);
  const size_t close = error.param.find(']');
  if (index >= message_paths.size() || close == std::string::npos) return;
  const std::string rest = error.param.substr(close + 1);
  constexpr std::string_view kContent = ".content";
  const std::string& origin = message_paths[index];
  if (origin == "system") {
    rename_param(error, "system" + (rest.starts_with(kContent) ? rest.substr(kContent.size())
                                                               : std::string()));
  } else {
    rename_param(error, origin + rest);
  }
}

}  // namespace

void name_anthropic_fields(ApiError& error) {
  // tools[i].function.parameters… is tools[i].input_schema…; tools[i].function.x is tools[i].x.
  constexpr std::string_view kTools = "tools[";
  constexpr std::string_view kFunction = ".function";
  constexpr std::string_view kParameters = ".parameters";
  if (!error.param.starts_with(kTools)) return;
  const size_t close = error.param.find(']');
  if (close == std::string::npos || error.param.compare(close + 1, kFunction.size(), kFunction))
    return;
  std::string rest = error.param.substr(close + 1 + kFunction.size());
  if (rest.starts_with(kParameters)) rest = ".input_schema" + rest.substr(kParameters.size());
  rename_param(error, error.param.substr(0, close + 1) + rest);
}

ParseResult parse_anthropic_messages_request(std::string_view body, const RequestLimits& limits) {
  return parse_with<GenerationRequest>(body, limits, [&](const json& parsed) {
    OrderedBody ordered(body);
    const ChatBody chat = anthropic_to_chat(parsed, ordered);
    try {
      GenerationRequest request = parse_fields(chat.chat, Endpoint::ChatCompletions, limits);
      // The Messages API's response has one reply and no log-probabilities to carry them in.
      if (request.n != 1) reject("n", "the Messages API gives one reply, found n {}", request.n);
      if (request.logprobs) reject("logprobs", "the Messages API has no log probabilities");
      request.tools = chat.tool_texts;
      return request;
    } catch (Rejection& rejection) {
      name_message_field(rejection.error, chat.message_paths);
      name_anthropic_fields(rejection.error);
      throw;
    }
  });
}

}  // namespace strata::serve
