// ToolCallParser (serve/tool_calls.h) on the exact text the Qwen templates teach the model
// (text/tool_format.h renders the same blocks for history), whatever the chunking.
#include "serve/tool_calls.h"

#include <gtest/gtest.h>

#include <tuple>

#include "text/chat_template.h"

namespace strata::serve {
namespace {

const std::vector<std::string> kTools = {
    R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"},"days":{"type":"integer"},"zip":{"type":"string"},)"
    R"("detail":{"type":["boolean","null"]}}}}})"};

// Everything the parser gives for `text`, pushed in pieces of `chunk` bytes, joined as a whole
// response shows it.
std::vector<ReplyPart> parse(ToolCallFormat format, const std::string& text, size_t chunk,
                             std::string_view prefix = {}, bool stream_arguments = false) {
  ToolCallParser parser(format, kTools, prefix, stream_arguments);
  std::vector<ReplyPart> all;
  for (size_t at = 0; at < text.size(); at += chunk)
    join_pieces(all, parser.push(text.substr(at, chunk)));
  join_pieces(all, parser.finish());
  return all;
}

// Both modes (whole and streamed arguments), or the whole mode only, every chunking.
void expect_same_for_every_chunking(ToolCallFormat format, const std::string& text,
                                    const std::vector<ReplyPart>& expected,
                                    std::string_view prefix = {}, bool whole_only = false) {
  for (const bool stream_arguments : {false, true}) {
    if (stream_arguments && whole_only) continue;
    for (size_t chunk : {size_t(1), size_t(2), size_t(5), size_t(13), text.size() + 1}) {
      SCOPED_TRACE(::testing::Message() << "chunk " << chunk << ", streamed " << stream_arguments);
      const std::vector<ReplyPart> got = parse(format, text, chunk, prefix, stream_arguments);
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
}

ReplyPart text(std::string content) {
  return {std::move(content), std::nullopt};
}
ReplyPart call(std::string name, std::string arguments) {
  return {{}, ParsedToolCall{std::move(name), std::move(arguments)}};
}

// What a stream sends, push by push: the pieces of each push of `chunk` bytes, then finish's.
std::vector<std::vector<ReplyPiece>> stream(ToolCallFormat format, const std::string& text,
                                            size_t chunk, std::string_view prefix = {}) {
  ToolCallParser parser(format, kTools, prefix, /*stream_arguments=*/true);
  std::vector<std::vector<ReplyPiece>> pushes;
  for (size_t at = 0; at < text.size(); at += chunk)
    pushes.push_back(parser.push(text.substr(at, chunk)));
  pushes.push_back(parser.finish());
  return pushes;
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
  // Streamed too: these break before the call is known, so they are content in both modes.
  for (const auto& [format, block] : std::vector<std::pair<ToolCallFormat, std::string>>{
           {ToolCallFormat::Hermes,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>"},
           {ToolCallFormat::Hermes, "<tool_call>\n{\"arguments\": {}}\n</tool_call>"},
           {ToolCallFormat::Hermes, "<tool_call>[1, 2]</tool_call>"},
           {ToolCallFormat::Hermes,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>"},
           {ToolCallFormat::Xml, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>"},
           {ToolCallFormat::Xml, "<tool_call>\n<function=f>\nno parameter\n</tool_call>"},
       }) {
    SCOPED_TRACE(block);
    expect_same_for_every_chunking(format, "a " + block + " b", {text("a " + block + " b")});
  }
  // These break after the call is known: content in whole mode; streamed, the call stands with
  // what was sent and the rest of the block is content (AStreamedCallThatBreaksKeepsWhatWasSent).
  for (const auto& [block, arguments, rest] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>", R"({"x":)",
            "1\n</function>\n</tool_call>"},
           {"<tool_call>\n<function=f>\n</function> trailing\n</tool_call>", "{}",
            "trailing\n</tool_call>"}}) {
    SCOPED_TRACE(block);
    expect_same_for_every_chunking(ToolCallFormat::Xml, "a " + block + " b",
                                   {text("a " + block + " b")}, {}, /*whole_only=*/true);
    for (size_t chunk : {size_t(1), size_t(6), block.size() + 4}) {
      const std::vector<ReplyPart> got =
          parse(ToolCallFormat::Xml, "a " + block + " b", chunk, {}, true);
      ASSERT_EQ(got.size(), 3u);
      EXPECT_EQ(got[0].content, "a");
      ASSERT_TRUE(got[1].call);
      EXPECT_EQ(got[1].call->arguments, arguments);
      EXPECT_EQ(got[2].content, rest + " b");
    }
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
  EXPECT_EQ(now[0].text, "hello <b>");
  now = parser.push("x");
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].text, " \nx");
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

TEST(ToolCallParser, StreamedArgumentsLeaveAsTheyAreWritten) {
  // The Qwen3.5 template's call, a token or so at a time: the call is announced (its name) before
  // the block closes, its arguments come in several fragments, the string value as it is
  // written, and they join to the whole mode's arguments.
  const std::string rendered = render_tool_calls(
      ToolCallFormat::Xml, {{{"get_weather", R"({"city": "New York City", "days": 3})"}}}, "");
  const std::string whole_arguments = R"({"city":"New York City","days":3})";
  for (size_t chunk : {size_t(1), size_t(3), size_t(4)}) {
    SCOPED_TRACE(chunk);
    const std::vector<std::vector<ReplyPiece>> pushes =
        stream(ToolCallFormat::Xml, rendered, chunk);
    std::string arguments;
    int fragments = 0, starts = 0;
    size_t first_fragment_push = pushes.size(), new_york_push = pushes.size();
    for (size_t i = 0; i < pushes.size(); ++i) {
      for (const ReplyPiece& piece : pushes[i]) {
        ASSERT_NE(piece.kind, ReplyPiece::Kind::Content) << piece.text;
        if (piece.kind == ReplyPiece::Kind::CallStart) {
          ++starts;
          EXPECT_EQ(piece.text, "get_weather");
          EXPECT_EQ(fragments, 0);
          continue;
        }
        ++fragments;
        arguments += piece.text;
        if (first_fragment_push == pushes.size()) first_fragment_push = i;
        if (new_york_push == pushes.size() && arguments.find("New York") != std::string::npos)
          new_york_push = i;
      }
    }
    EXPECT_EQ(starts, 1);
    EXPECT_EQ(arguments, whole_arguments);
    // "New York City" alone is several pushes: its words left before its closing tag arrived.
    EXPECT_GT(fragments, 5);
    // The push that completes the value's "</parameter>".
    const size_t close_push = (rendered.find("</parameter>") + 11) / chunk;
    EXPECT_LT(first_fragment_push, close_push);
    EXPECT_LT(new_york_push, close_push);
  }
  // Hermes (Qwen3): per top-level member of the arguments, as each completes.
  const std::string hermes =
      render_tool_calls(ToolCallFormat::Hermes,
                        {{{"get_weather", R"({"city": "Oslo", "days": 2, "detail": null})"}}}, "");
  const std::vector<std::vector<ReplyPiece>> pushes = stream(ToolCallFormat::Hermes, hermes, 1);
  std::vector<std::string> fragments;
  for (const auto& push : pushes)
    for (const ReplyPiece& piece : push)
      if (piece.kind == ReplyPiece::Kind::Arguments) fragments.push_back(piece.text);
  EXPECT_EQ(fragments,
            (std::vector<std::string>{R"({"city":"Oslo")", R"(,"days":2)", R"(,"detail":null})"}));
}

TEST(ToolCallParser, AStreamedCallThatBreaksKeepsWhatWasSent) {
  // Cut by max_tokens inside a value: the call stands with the arguments sent so far, the rest
  // of the block is content (the whole mode makes all of it content).
  const std::string cut = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar\n</para";
  expect_same_for_every_chunking(ToolCallFormat::Xml, cut, {text(cut)}, {}, /*whole_only=*/true);
  for (size_t chunk : {size_t(1), size_t(4), cut.size()}) {
    const std::vector<ReplyPart> got = parse(ToolCallFormat::Xml, cut, chunk, {}, true);
    ASSERT_EQ(got.size(), 2u);
    ASSERT_TRUE(got[0].call);
    EXPECT_EQ(got[0].call->arguments, R"({"city":"Par)");
    EXPECT_EQ(got[1].content, "\n</para");
  }
  // Text after </function> inside the block: the call is complete, that text is content.
  const std::vector<ReplyPart> got = parse(
      ToolCallFormat::Xml,
      "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function> extra\n</tool_call>",
      7, {}, true);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].call->arguments, R"({"x":1})");
  EXPECT_EQ(got[1].content, "extra\n</tool_call>");
  // A Hermes call in another key order is parsed at its close, as a whole.
  expect_same_for_every_chunking(
      ToolCallFormat::Hermes,
      "<tool_call>\n{\"arguments\": {\"city\": \"Rome\"}, \"name\": \"get_weather\"}\n</tool_call>",
      {call("get_weather", R"({"city":"Rome"})")});
}

TEST(ToolCallParser, AStreamedStringValueNeverSplitsACharacter) {
  // Multi-byte characters (2, 3 and 4 bytes), a broken sequence and a stray continuation byte in
  // a string value, pushed a byte at a time: the arguments are the whole mode's, with the same
  // replacement characters for the bytes that are not UTF-8 (the fuzzer found a split "ď" turned
  // into two replacement characters).
  const std::string value =
      "Z\xc3\xbcrich \xe2\x82\xac \xf0\x9f\x8c\x8d \xc4\x8f\x9e\x8a \xe2\x82x";
  const std::string block = "<tool_call>\n<function=get_weather>\n<parameter=city>\n" + value +
                            "\n</parameter>\n</function>\n</tool_call>";
  const std::string whole = parse(ToolCallFormat::Xml, block, block.size() + 1)[0].call->arguments;
  EXPECT_NE(whole.find("Z\xc3\xbcrich \xe2\x82\xac \xf0\x9f\x8c\x8d \xc4\x8f\xef\xbf\xbd"),
            std::string::npos)
      << whole;
  expect_same_for_every_chunking(ToolCallFormat::Xml, block, {call("get_weather", whole)});
}

}  // namespace
}  // namespace strata::serve
