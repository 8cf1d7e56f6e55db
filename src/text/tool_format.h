// The tool-calling text of the Qwen chat templates, rendered natively (no Jinja), byte for byte
// what the templates render (tests/data/tokenizer/templates/qwen3.jinja, qwen3_6.jinja):
//   Hermes  (ChatML, Qwen3): a "# Tools" system section with one JSON line per tool inside
//           <tools></tools> and the instruction to answer
//           <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>.
//   Xml     (Qwen3.5/3.6):   the same section with the XML call format
//           <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>.
// `tojson` is the templates' filter: Python's json.dumps with its defaults as transformers calls it
// (", " and ": " separators, keys in the order given, non-ASCII kept, control characters escaped).
//
// Contract: pure functions. Inputs are JSON texts; `render_*` throw strata::Error naming what is
// wrong when a text is not the JSON the format needs (the serve layer validates before).
// Thread-safe.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace strata {

struct ChatToolCall;

enum class ToolCallFormat { Hermes, Xml };

// Python's json.dumps(value) of a JSON text (object key order kept).
std::string python_tojson(std::string_view json_text);

// The system section that lists `tools` (each a JSON object's text), without the ChatML framing;
// `system` is the conversation's first system message, when there is one.
std::string render_tools_system(ToolCallFormat format, std::span<const std::string> tools,
                                std::optional<std::string_view> system);

// An assistant message's tool calls as the template appends them after its content.
// `content` is the content as the template tests it (after the <think> split).
std::string render_tool_calls(ToolCallFormat format, std::span<const ChatToolCall> calls,
                              std::string_view content);

// The text an assistant turn starts with to force a tool call (tool_choice "required": any
// function; a named function: that one). Generation continues inside the call.
std::string tool_call_prefix(ToolCallFormat format, std::optional<std::string_view> function_name);

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";

}  // namespace strata
