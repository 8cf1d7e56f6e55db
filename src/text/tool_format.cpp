#include "text/tool_format.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"
#include "util/error.h"

namespace strata {
namespace {

using OrderedJson = nlohmann::ordered_json;

OrderedJson parse_json(std::string_view text, std::string_view what) {
  OrderedJson value = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) fail("{}: not valid JSON", what);
  return value;
}

void append_python_string(std::string& out, const std::string& text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void append_python_json(std::string& out, const OrderedJson& value) {
  switch (value.type()) {
    case OrderedJson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        append_python_string(out, key);
        out += ": ";
        append_python_json(out, item);
      }
      out += '}';
      return;
    }
    case OrderedJson::value_t::array: {
      out += '[';
      for (size_t i = 0; i < value.size(); ++i) {
        if (i > 0) out += ", ";
        append_python_json(out, value[i]);
      }
      out += ']';
      return;
    }
    case OrderedJson::value_t::string:
      append_python_string(out, value.get_ref<const std::string&>());
      return;
    case OrderedJson::value_t::boolean:
      out += value.get<bool>() ? "true" : "false";
      return;
    case OrderedJson::value_t::null:
      out += "null";
      return;
    case OrderedJson::value_t::number_float: {
      // Python's repr: shortest round-trip digits, always with a '.' or an exponent.
      std::string number = value.dump();
      if (number.find_first_of(".eE") == std::string::npos &&
          number.find_first_of("0123456789") != std::string::npos)
        number += ".0";
      out += number;
      return;
    }
    default:
      out += value.dump();
  }
}

}  // namespace

std::string python_tojson(std::string_view json_text) {
  std::string out;
  append_python_json(out, parse_json(json_text, "tojson"));
  return out;
}

std::string render_tools_system(ToolCallFormat format, std::span<const std::string> tools,
                                std::optional<std::string_view> system) {
  std::string out;
  if (format == ToolCallFormat::Hermes) {
    if (system) {
      out += *system;
      out += "\n\n";
    }
    out +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
        "provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const std::string& tool : tools) {
      out += '\n';
      out += python_tojson(tool);
    }
    out +=
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
    return out;
  }
  out += "# Tools\n\nYou have access to the following functions:\n\n<tools>";
  for (const std::string& tool : tools) {
    out += '\n';
    out += python_tojson(tool);
  }
  out += "\n</tools>";
  out +=
      "\n\nIf you choose to call a function ONLY reply in the following format with NO "
      "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"
      "\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the "
      "second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>"
      "\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
      "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
      "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
      "function call in natural language BEFORE the function call, but NOT after\n- If there is "
      "no function call available, answer the question like normal with your current knowledge "
      "and do not tell the user about function calls\n</IMPORTANT>";
  if (system && !system->empty()) {
    out += "\n\n";
    out += *system;
  }
  return out;
}

std::string render_tool_calls(ToolCallFormat format, std::span<const ChatToolCall> calls,
                              std::string_view content) {
  std::string out;
  for (size_t i = 0; i < calls.size(); ++i) {
    const ChatToolCall& call = calls[i];
    if (format == ToolCallFormat::Hermes) {
      if (i > 0 || !content.empty()) out += '\n';
      out += "<tool_call>\n{\"name\": \"";
      out += call.name;
      out += "\", \"arguments\": ";
      out += call.arguments;  // a string in the request: rendered as sent
      out += "}\n</tool_call>";
      continue;
    }
    if (i > 0) {
      out += '\n';
    } else if (!content.empty()) {
      out += "\n\n";
    }
    out += "<tool_call>\n<function=";
    out += call.name;
    out += ">\n";
    const OrderedJson arguments =
        parse_json(call.arguments, fmt::format("tool call {} ({}): arguments", i, call.name));
    if (!arguments.is_object())
      fail("tool call {} ({}): arguments: expected a JSON object, found {}", i, call.name,
           arguments.type_name());
    for (const auto& [key, value] : arguments.items()) {
      out += "<parameter=";
      out += key;
      out += ">\n";
      if (value.is_string()) {
        out += value.get_ref<const std::string&>();
      } else {
        append_python_json(out, value);
      }
      out += "\n</parameter>\n";
    }
    out += "</function>\n</tool_call>";
  }
  return out;
}

std::string tool_call_prefix(ToolCallFormat format, std::optional<std::string_view> function_name) {
  std::string out = "<tool_call>\n";
  if (!function_name) return out;
  if (format == ToolCallFormat::Hermes) {
    out += "{\"name\": \"";
    out += *function_name;
    out += "\", \"arguments\": ";
  } else {
    out += "<function=";
    out += *function_name;
    out += ">\n";
  }
  return out;
}

}  // namespace strata
