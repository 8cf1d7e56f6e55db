// ToolCallParser (serve/tool_calls.h) on the exact text the Qwen templates teach the model
// (text/tool_format.h renders the same blocks for history), whatever the chunking.
#include "serve/tool_calls.h"

#include <gtest/gtest.h>

#include "text/chat_template.h"

namespace strata::serve {
namespace {

const std::vector<std::string> kTools = {
    R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"},"days":{"type":"integer"},"zip":{"type":"string"},)"
    R"("detail":{"type":["boolean","null"]}}}}})"};

// Everything the parser gives for `text`, pushed in pieces of `chunk` bytes.
std::vector<ReplyPiece> parse(ToolCallFormat format, const std::string& text, size_t chunk,
                              std::string_view prefix = {}) {
  ToolCallParser parser(format, kTools, prefix);
  std::vector<ReplyPiece> all;
  auto add = [&](std::vector<ReplyPiece> pieces) {
    for (ReplyPiece& piece : pieces) {
      if (!piece.call && !all.empty() && !all.back().call) {
        all.back().content += piece.content;
      } else {
        all.push_back(std::move(piece));
      }
    }
  };
  for (size_t at = 0; at < text.size(); at += chunk) add(parser.push(text.substr(at, chunk)));
  add(parser.finish());
  return all;
}

void expect_same_for_every_chunking(ToolCallFormat format, const std::string& text,
                                    const std::vector<ReplyPiece>& expected,
                                    std::string_view prefix = {}) {
  for (size_t chunk : {size_t(1), size_t(2), size_t(5), size_t(13), text.size() + 1}) {
    SCOPED_TRACE(chunk);
    const std::vector<ReplyPiece> got = parse(format, text, chunk, prefix);
    ASSERT_EQ(got.size(), expected.size()) << text;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].content, expected[i].content);
      ASSERT_EQ(got[i].call.has_value(), expected[i].call.has_value());
      if (got[i].call) {
        EXPECT_EQ(got[i].call->name, expected[i].call->name);
        EXPECT_EQ(got[i].call->arguments, expected[i].call->arguments);
      }
    }
  }
}

ReplyPiece text(std::string content) {
  return {std::move(content), std::nullopt};
}
ReplyPiece call(std::string name, std::string arguments) {
  return {{}, ParsedToolCall{std::move(name), std::move(arguments)}};
}

TEST(ToolCallParser, HermesBlocksAsTheQwen3TemplateWritesThem) {
  // The template's own rendering of two calls (render_tool_calls) parses back to them, and the
  // separator before them is not content (so the reply renders back the same as history).
  const std::vector<ChatToolCall> calls = {{"get_weather", R"({"city": "Paris", "days": 2})"},
                                           {"search", R"({"q": "a\"b"})"}};
  const std::string rendered =
      "Let me look." + render_tool_calls(ToolCallFormat::Hermes, calls, "Let me look.");
  expect_same_for_every_chunking(
      ToolCallFormat::Hermes, rendered,
      {text("Let me look."), call("get_weather", R"({"city":"Paris","days":2})"),
       call("search", R"({"q":"a\"b"})")});
  // Text after the calls is content again; whitespace between calls is dropped.
  expect_same_for_every_chunking(
      ToolCallFormat::Hermes,
      "<tool_call>\n{\"name\": \"f\"}\n</tool_call>\n\n <tool_call>{\"name\":\"g\",\"arguments\":"
      "\"{\\\"x\\\":1}\"}</tool_call>\nDone.",
      {call("f", "{}"), call("g", R"({"x":1})"), text("\nDone.")});
}

TEST(ToolCallParser, XmlBlocksAsTheQwen35TemplateWritesThem) {
  const std::vector<ChatToolCall> calls = {
      {"get_weather", R"({"city": "New York", "days": 3, "zip": "01234", "detail": true})"},
      {"unlisted", R"({"n": 5, "s": "text", "o": {"a": [1]}})"}};
  const std::string rendered = render_tool_calls(ToolCallFormat::Xml, calls, "");
  // Types by the schema: city/zip strings (zip keeps its leading 0), days an integer, detail a
  // boolean; the unlisted function parses what is valid JSON.
  expect_same_for_every_chunking(
      ToolCallFormat::Xml, rendered,
      {call("get_weather", R"({"city":"New York","days":3,"zip":"01234","detail":true})"),
       call("unlisted", R"({"n":5,"s":"text","o":{"a":[1]}})")});
  // A multi-line string value keeps its inner newlines.
  expect_same_for_every_chunking(
      ToolCallFormat::Xml,
      "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nline 1\nline 2\n"
      "</parameter>\n<parameter=days>\nnot a number\n</parameter>\n</function>\n</tool_call>",
      {text("I will check."),
       call("get_weather", R"({"city":"line 1\nline 2","days":"not a number"})")});
}

TEST(ToolCallParser, MalformedBlocksStayContent) {
  for (const auto& [format, block] : std::vector<std::pair<ToolCallFormat, std::string>>{
           {ToolCallFormat::Hermes,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>"},
           {ToolCallFormat::Hermes, "<tool_call>\n{\"arguments\": {}}\n</tool_call>"},
           {ToolCallFormat::Hermes, "<tool_call>[1, 2]</tool_call>"},
           {ToolCallFormat::Hermes,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>"},
           {ToolCallFormat::Xml,
            "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>"},
           {ToolCallFormat::Xml, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>"},
           {ToolCallFormat::Xml, "<tool_call>\n<function=f>\n</function> trailing\n</tool_call>"},
       }) {
    SCOPED_TRACE(block);
    expect_same_for_every_chunking(format, "a " + block + " b", {text("a " + block + " b")});
  }
  // Never closed: passed on as generated. A lone "<tool" at the end too.
  expect_same_for_every_chunking(ToolCallFormat::Hermes, "x <tool_call>\n{\"name\": \"f\"",
                                 {text("x <tool_call>\n{\"name\": \"f\"")});
  expect_same_for_every_chunking(ToolCallFormat::Hermes, "x <tool", {text("x <tool")});
  // Nothing held back needlessly: plain text comes out at once, trailing whitespace when text
  // follows it.
  ToolCallParser parser(ToolCallFormat::Hermes, kTools);
  std::vector<ReplyPiece> now = parser.push("hello <b> \n");
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].content, "hello <b>");
  now = parser.push("x");
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].content, " \nx");
  EXPECT_EQ(parser.calls_found(), 0);
}

TEST(ToolCallParser, ForcedPrefixStartsInsideTheCall) {
  const std::string named = tool_call_prefix(ToolCallFormat::Hermes, "get_weather");
  expect_same_for_every_chunking(ToolCallFormat::Hermes, "{\"city\": \"Oslo\"}}\n</tool_call>",
                                 {call("get_weather", R"({"city":"Oslo"})")}, named);
  expect_same_for_every_chunking(
      ToolCallFormat::Xml, "<parameter=days>\n4\n</parameter>\n</function>\n</tool_call>",
      {call("get_weather", R"({"days":4})")}, tool_call_prefix(ToolCallFormat::Xml, "get_weather"));
  // A forced block the model does not finish is content, the prefix included.
  expect_same_for_every_chunking(ToolCallFormat::Xml, "oops",
                                 {text("<tool_call>\n<function=f>\noops")},
                                 tool_call_prefix(ToolCallFormat::Xml, "f"));
}

}  // namespace
}  // namespace strata::serve
