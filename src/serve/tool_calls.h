// ToolCallParser — finds the tool calls in a chat reply as it streams, in the format of the
// model's chat template (text/tool_format.h):
//   Hermes  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   Xml     <tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n</function>\n</tool_call>
// Text outside the blocks passes through as content, except whitespace before and after a call
// (the template's separators: dropped, so that the reply sent back as history renders the same).
// Text that might open a block ("<tool_" at the end of a push) and trailing whitespace are held
// until they are decided. A block is parsed when its closing tag arrives; one that does not
// parse (bad JSON, no name, no <function=…>) or never closes is passed on as content, tags
// included, exactly as generated: malformed model output is never an error.
//
// Arguments come out as compact JSON object text (OpenAI's `function.arguments` string). In the
// XML format a parameter's value is text; it becomes a JSON value by the tool's schema: "string"
// (or no schema for that parameter of a known tool) keeps the text, other types parse it as
// JSON and keep the text when it does not parse; a function the request did not list parses
// every value that is valid JSON.
//
// `prefix`: text the assistant turn was started with in the prompt (tool_choice "required" or a
// named function, see tool_call_prefix): parsing starts as if the model had written it, and a
// malformed block passed on as content includes it.
//
// Not thread-safe; one per choice (runs on the generator's thread).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/tool_format.h"

namespace strata::serve {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON object text
};

// One piece of the parsed reply, in order: content text or a complete call.
struct ReplyPiece {
  std::string content;
  std::optional<ParsedToolCall> call;
};

class ToolCallParser {
 public:
  // `tools`: the request's tool objects (JSON texts) for the XML format's parameter types.
  ToolCallParser(ToolCallFormat format, std::span<const std::string> tools,
                 std::string_view prefix = {});
  std::vector<ReplyPiece> push(std::string_view text);
  std::vector<ReplyPiece> finish();
  int calls_found() const { return calls_found_; }

 private:
  void drain(std::vector<ReplyPiece>& out, bool at_end);
  void emit_content(std::vector<ReplyPiece>& out, std::string text);
  std::optional<ParsedToolCall> parse_block(std::string_view body) const;
  std::optional<ParsedToolCall> parse_hermes(std::string_view body) const;
  std::optional<ParsedToolCall> parse_xml(std::string_view body) const;

  const ToolCallFormat format_;
  std::vector<std::string> tools_;
  bool inside_ = false;    // after <tool_call>, before </tool_call>
  std::string pending_;    // undecided text (outside) or the block so far (inside)
  std::string separator_;  // the whitespace before the open block: content again if it fails
  int calls_found_ = 0;
};

}  // namespace strata::serve
