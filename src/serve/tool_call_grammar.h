// The grammar of a forced tool call ("strict" tool calls): what the model may write after the
// assistant turn was opened with tool_call_prefix (text/tool_format.h), so that the reply is
// well-formed calls in the chat template's format, each naming an allowed tool with arguments
// its `parameters` schema accepts (grammar/json_schema.h compiles them), and then the end.
//
//   Hermes  {"name": "NAME", "arguments": ARGS}\n</tool_call>      ARGS: the schema's JSON object
//   Xml     <function=NAME>\n PARAMS </function>\n</tool_call>
//           PARAMS: per property, in the schema's order (optional ones may be left out),
//           <parameter=KEY>\nVALUE\n</parameter>\n; VALUE is raw text (GrammarBuilder::text_until,
//           with no "</parameter>" or "</tool_call>" in it) when the property's type is "string"
//           (its enum / const as raw text), else the subschema's JSON value, exactly what
//           serve/tool_calls.h parses into those arguments.
// With `lead`, the grammar first spells that text: tool_choice "auto" starts the grammar lazily
// right after the "<tool_call>" the model wrote (grammar/lazy_trigger.h), so its `lead` is the
// "\n" the forced prefix ("<tool_call>\n") would have held.
// After the first call (its name already in the prefix when tool_choice names the function),
// with `parallel_calls` more calls may follow, each "\n<tool_call>\n" and a call; without, the
// grammar ends after the first "</tool_call>".
//
// Refused (ApiError 400 whose param is the JSON path, "tools[0].function.parameters.properties.
// city.pattern"): what compile_json_schema refuses, arguments that are not an object schema
// (`type` other than "object", or anyOf / $ref / enum at the top), and in the XML format what
// raw text cannot honour: minLength / maxLength or other keywords on a string property, a
// property without "type" that constrains its value (the parser reads it as text), a required
// name missing from `properties`, a property name with '<', '>' or a newline.
//
// Contract: pure; never throws (bad_alloc becomes a 413 ApiError as response_format's does).
// `tools` are the request's tool objects' JSON texts (validated by serve/request.h).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "grammar/grammar.h"
#include "serve/api_error.h"
#include "text/tool_format.h"

namespace strata::serve {

// `forced_function`: tool_choice's named function (only it may be called), or none for
// "required" (any of the tools).
std::variant<std::shared_ptr<const grammar::Grammar>, ApiError> compile_tool_call_grammar(
    ToolCallFormat format, std::span<const std::string> tools,
    std::optional<std::string_view> forced_function, bool parallel_calls,
    std::string_view lead = {});

}  // namespace strata::serve
