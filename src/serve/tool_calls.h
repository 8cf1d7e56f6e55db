// ToolCallParser — finds the tool calls in a chat reply as it streams, in the format of the
// model's chat template (text/tool_format.h):
//   Hermes  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   Xml     <tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n</function>\n</tool_call>
// Text outside the blocks passes through as content, except whitespace before and after a call
// (the template's separators: dropped, so that the reply sent back as history renders the same).
// Text that might open a block ("<tool_" at the end of a push) and trailing whitespace are held
// until they are decided. A block that does not parse (bad JSON, no name, no <function=…>) or
// never closes is passed on as content, tags included, exactly as generated: malformed model
// output is never an error.
//
// Arguments come out as compact JSON object text (OpenAI's `function.arguments` string). In the
// XML format a parameter's value is text; it becomes a JSON value by the tool's schema: "string"
// (or no schema for that parameter of a known tool) keeps the text, other types parse it as
// JSON and keep the text when it does not parse; a function the request did not list parses
// every value that is valid JSON.
//
// Two modes, the same calls for every well-formed block (tests/serve/tool_calls_test.cpp checks
// both on every chunking):
// - Whole (`stream_arguments` false, the non-streamed responses): a block is parsed when its
//   closing tag arrives, and a call leaves as a CallStart and one Arguments piece.
// - Streamed (`stream_arguments` true): a call leaves as soon as its block is known to be a call
//   (XML: `<function=NAME>` and the first `<parameter=KEY>` or `</function>` after it; Hermes:
//   `{"name": NAME, "arguments": {` and its first complete member or `}`), then its arguments in
//   fragments as the text arrives: XML string values as they are written, other XML values per
//   parameter, Hermes arguments per top-level member. A block in another Hermes shape (other key
//   order, quoted arguments) is parsed whole at its close. Before that point a malformed block
//   is content as in whole mode; after it the call stands: where the block then breaks (or ends
//   unclosed, e.g. at max_tokens) its arguments are what was streamed (possibly unfinished JSON,
//   as OpenAI's streams are when max_tokens cuts a call) and the rest of the block is content.
//   Arguments that repeat a key carry it twice (JSON readers keep the last, as the whole mode's
//   parse does).
//
// `prefix`: text the assistant turn was started with in the prompt (tool_choice "required" or a
// named function, see tool_call_prefix): parsing starts as if the model had written it, and a
// malformed block passed on as content includes it.
//
// Not thread-safe; one per choice (runs on the generator's thread).
#pragma once

#include <nlohmann/json.hpp>
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

// One piece of the parsed reply, in order: content text, the start of a call (its function's
// name), or a fragment of the arguments of the call started last.
struct ReplyPiece {
  enum class Kind { Content, CallStart, Arguments };
  Kind kind = Kind::Content;
  std::string text;  // the content, the name or the arguments fragment
};

// A reply as a whole response shows it: runs of content joined, and each call's start and
// argument fragments joined into one call (for the tests and the fuzz target).
struct ReplyPart {
  std::string content;
  std::optional<ParsedToolCall> call;
};
void join_pieces(std::vector<ReplyPart>& reply, std::span<const ReplyPiece> pieces);

class ToolCallParser {
 public:
  // `tools`: the request's tool objects (JSON texts) for the XML format's parameter types.
  ToolCallParser(ToolCallFormat format, std::span<const std::string> tools,
                 std::string_view prefix = {}, bool stream_arguments = false);
  std::vector<ReplyPiece> push(std::string_view text);
  std::vector<ReplyPiece> finish();
  int calls_found() const { return calls_found_; }

 private:
  // Where the streamed parse of the open block stands (stream_arguments only).
  enum class Step {
    Header,      // before the call is known (XML: <function=…>; Hermes: up to "arguments": {)
    Parameters,  // XML: between parameters; Hermes: the arguments object's members
    Value,       // XML: inside a parameter's value
    CallClose,   // Hermes: after the arguments, before the call object's closing '}'
    AfterCall,   // the arguments are complete; only whitespace may follow
    Whole,       // Hermes in another shape: parsed whole at the close
    Broken,      // the rest of the block is content
  };
  void drain(std::vector<ReplyPiece>& out, bool at_end);
  void emit_content(std::vector<ReplyPiece>& out, std::string text);
  void emit_arguments(std::vector<ReplyPiece>& out, std::string_view fragment);
  void end_block(std::vector<ReplyPiece>& out, bool closed);
  // Consumes what it can of block_ from position_; `complete`: the block has no more text.
  void advance(std::vector<ReplyPiece>& out, bool complete);
  bool advance_xml(std::vector<ReplyPiece>& out);
  bool advance_hermes(std::vector<ReplyPiece>& out);
  void skip_after_call(std::string_view text);
  const nlohmann::ordered_json* find_tool(std::string_view name) const;
  std::optional<ParsedToolCall> parse_block(std::string_view body) const;
  std::optional<ParsedToolCall> parse_hermes(std::string_view body) const;
  std::optional<ParsedToolCall> parse_xml(std::string_view body) const;

  const ToolCallFormat format_;
  const bool stream_arguments_;
  std::vector<nlohmann::ordered_json> tools_;  // the request's tools, parsed
  bool inside_ = false;                        // after <tool_call>, before </tool_call>
  std::string pending_;    // undecided text (outside) or the block so far (inside, whole mode)
  std::string separator_;  // the whitespace before the open block: content again if it fails
  int calls_found_ = 0;
  // The streamed parse of the open block: its text so far (block_), how much of it is consumed
  // (position_), the call's name until it is announced, and the parameter being read.
  std::string block_;
  size_t position_ = 0;
  Step step_ = Step::Header;
  std::string call_name_;
  bool call_started_ = false;
  bool first_member_ = true;
  std::string key_;  // XML: the parameter whose value is being read
  bool value_is_text_ = false;
  bool value_started_ = false;  // XML: the value's optional leading newline is decided
};

}  // namespace strata::serve
