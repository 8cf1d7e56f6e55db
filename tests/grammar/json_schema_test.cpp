// The schema compiler and the matcher: valid instances of each schema form are accepted,
// invalid ones rejected, unsupported keywords refused with the keyword's path.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/pattern.h"

namespace strata::grammar {
namespace {

using ojson = nlohmann::ordered_json;

bool matches(const Grammar& grammar, std::string_view text) {
  Matcher matcher(grammar);
  return matcher.accept(text) && matcher.accepting();
}

Grammar compile(std::string_view schema) {
  return compile_json_schema(ojson::parse(schema));
}

// The path of the SchemaError `schema` raises ("" when it compiles).
std::string refusal(std::string_view schema) {
  try {
    compile(schema);
  } catch (const SchemaError& error) {
    EXPECT_NE(std::string(error.what()).find(error.path()), std::string::npos) << error.what();
    return error.path();
  }
  return "(compiled)";
}

TEST(JsonSchemaGrammar, Primitives) {
  const Grammar number = compile(R"({"type": "number"})");
  for (const char* ok : {"0", "-0", "-0.5e+10", "12.25", "1E5", "3e-7", "-12", "0.0"})
    EXPECT_TRUE(matches(number, ok)) << ok;
  for (const char* bad :
       {"", "01", "-", "1.", ".5", "1e", "+1", "1.5.2", "NaN", "1 ", " 1", "\"1\""})
    EXPECT_FALSE(matches(number, bad)) << bad;
  const Grammar integer = compile(R"({"type": "integer"})");
  for (const char* ok : {"0", "-7", "123456789"}) EXPECT_TRUE(matches(integer, ok)) << ok;
  for (const char* bad : {"1.5", "1e3", "00", "-"}) EXPECT_FALSE(matches(integer, bad)) << bad;
  // Bounded so that every parser reads them as they are: integers fit an int64, numbers a double.
  EXPECT_TRUE(matches(integer, "-999999999999999999"));
  EXPECT_FALSE(matches(integer, "9999999999999999999"));
  EXPECT_TRUE(matches(number, "1.5e-99"));
  EXPECT_FALSE(matches(number, "1e100"));
  const Grammar boolean = compile(R"({"type": "boolean"})");
  EXPECT_TRUE(matches(boolean, "true"));
  EXPECT_TRUE(matches(boolean, "false"));
  EXPECT_FALSE(matches(boolean, "tru"));
  EXPECT_FALSE(matches(boolean, "null"));
  const Grammar null = compile(R"({"type": "null"})");
  EXPECT_TRUE(matches(null, "null"));
  EXPECT_FALSE(matches(null, "0"));
  const Grammar either = compile(R"({"type": ["string", "null"]})");
  EXPECT_TRUE(matches(either, "null"));
  EXPECT_TRUE(matches(either, "\"x\""));
  EXPECT_FALSE(matches(either, "1"));
}

TEST(JsonSchemaGrammar, StringsEscapesAndUnicode) {
  const Grammar string = compile(R"({"type": "string"})");
  for (const char* ok : {R"("")", R"("plain")", R"("a\"b")", R"("\\\/\b\f\n\r\t")", R"("\u00e9")",
                         R"("\uD83D\uDE00")", "\"caf\xC3\xA9\"", "\"\xE2\x82\xAC\"",
                         "\"\xF0\x9F\x98\x80\"", "\"\x7F\""})
    EXPECT_TRUE(matches(string, ok)) << ok;
  for (const char* bad : {R"(")", R"("a)", R"("\x")", R"("\u12")", R"("\uD83D")", R"("\uDE00")",
                          "\"a\nb\"", "\"\xC3\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"",
                          "\"\xF4\x90\x80\x80\"", "\"\xFF\"", R"("a" )", R"('a')"})
    EXPECT_FALSE(matches(string, bad)) << bad;
  const Grammar bounded = compile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(matches(bounded, R"("a")"));
  EXPECT_TRUE(matches(bounded, R"("ab")"));
  EXPECT_TRUE(matches(bounded, "\"\xC3\xA9\xC3\xA9\xC3\xA9\""));  // three code points
  EXPECT_TRUE(matches(bounded, R"("\n\u0041b")"));                // escapes count as one
  EXPECT_FALSE(matches(bounded, R"("abcd")"));
}

TEST(JsonSchemaGrammar, ObjectsRequiredAndAdditional) {
  const Grammar person = compile(R"({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age"], "additionalProperties": false})");
  for (const char* ok : {R"({"name":"a","age":3})", R"({"name":"a","age":3,"tags":[]})",
                         R"({ "name": "a", "age": 3, "tags": ["x", "y"] })",
                         "{\n  \"name\": \"a\",\n  \"age\": -1\n}"})
    EXPECT_TRUE(matches(person, ok)) << ok;
  for (const char* bad :
       {R"({"name":"a"})", R"({"age":3})", R"({})", R"({"name":"a","age":3,"extra":1})",
        R"({"name":"a","age":"3"})", R"({"name":"a","age":3,})", R"({"name":"a",,"age":3})",
        R"({"name":"a","age":3}})", R"({"name":"a"  ,"age":3})"})
    EXPECT_FALSE(matches(person, bad)) << bad;

  const Grammar open = compile(R"({"type": "object", "properties": {"id": {"type": "integer"}},
                                  "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(matches(open, R"({})"));
  EXPECT_TRUE(matches(open, R"({"id":1,"x":true,"y":false})"));
  EXPECT_TRUE(matches(open, R"({"i":true,"idx":false})"));  // prefixes and extensions of "id"
  EXPECT_FALSE(matches(open, R"({"id":1,"id":true})"));     // a declared name is no extra key
  EXPECT_FALSE(matches(open, R"({"x":1})"));
  const Grammar any_object = compile(R"({"type": "object"})");
  EXPECT_TRUE(matches(any_object, R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_FALSE(matches(any_object, "[]"));
  const Grammar required_extra = compile(R"({"type": "object", "required": ["k"]})");
  EXPECT_TRUE(matches(required_extra, R"({"k":[true]})"));
  EXPECT_FALSE(matches(required_extra, R"({})"));
}

TEST(JsonSchemaGrammar, ArraysNestedAndBounded) {
  const Grammar nested = compile(R"({"type": "array", "items": {"type": "array", "items":
                                    {"type": "integer"}, "maxItems": 2}, "minItems": 1,
                                    "maxItems": 3})");
  for (const char* ok : {"[[]]", "[[1,2],[3]]", "[ [1], [], [ 2, 3 ] ]"})
    EXPECT_TRUE(matches(nested, ok)) << ok;
  for (const char* bad : {"[]", "[[1,2,3]]", "[[],[],[],[]]", "[1]", "[[1],]", "[[1]"})
    EXPECT_FALSE(matches(nested, bad)) << bad;
}

TEST(JsonSchemaGrammar, LargeBoundsCompileAndMatch) {
  // 10,000-long repetition chains (the largest bound allowed), nested.
  const Grammar big = compile(R"({"type": "array", "minItems": 2, "maxItems": 10000,
                                 "items": {"type": "string", "minLength": 1, "maxLength": 10000}})");
  EXPECT_TRUE(matches(big, R"(["a","bc"])"));
  EXPECT_FALSE(matches(big, R"(["a"])"));
  EXPECT_FALSE(matches(big, R"(["a",""])"));
  std::string long_item = "[\"" + std::string(10000, 'x') + "\",\"y\"]";
  EXPECT_TRUE(matches(big, long_item));
  long_item = "[\"" + std::string(10001, 'x') + "\",\"y\"]";
  EXPECT_FALSE(matches(big, long_item));
}

TEST(JsonSchemaGrammar, EnumConstAnyOf) {
  const Grammar color = compile(R"({"enum": ["red", "green", 3, null, {"a": [1]}]})");
  for (const char* ok : {R"("red")", R"("green")", "3", "null", R"({"a":[1]})"})
    EXPECT_TRUE(matches(color, ok)) << ok;
  for (const char* bad : {R"("blue")", R"("re")", "4", R"({"a": [1]})"})
    EXPECT_FALSE(matches(color, bad)) << bad;
  const Grammar fixed = compile(R"({"const": "v1"})");
  EXPECT_TRUE(matches(fixed, R"("v1")"));
  EXPECT_FALSE(matches(fixed, R"("v2")"));
  const Grammar any_of = compile(R"({"anyOf": [{"type": "integer"},
                                   {"type": "object", "properties": {"k": {"const": true}},
                                    "required": ["k"]}], "description": "either"})");
  EXPECT_TRUE(matches(any_of, "12"));
  EXPECT_TRUE(matches(any_of, R"({"k":true})"));
  EXPECT_FALSE(matches(any_of, R"({"k":false})"));
  const Grammar one_of = compile(R"({"oneOf": [{"type": "boolean"}, {"type": "null"}]})");
  EXPECT_TRUE(matches(one_of, "null"));
  EXPECT_FALSE(matches(one_of, "0"));
}

TEST(JsonSchemaGrammar, RecursiveRefs) {
  const Grammar tree = compile(R"({
    "$defs": {"node": {"type": "object", "properties": {
      "value": {"type": "integer"},
      "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["value"], "additionalProperties": false}},
    "$ref": "#/$defs/node"})");
  EXPECT_TRUE(matches(tree, R"({"value":1})"));
  EXPECT_TRUE(matches(tree, R"({"value":1,"children":[{"value":2,"children":[{"value":3}]}]})"));
  EXPECT_FALSE(matches(tree, R"({"value":1,"children":[{"children":[]}]})"));
  const Grammar list = compile(R"({"definitions": {"list": {"anyOf": [{"type": "null"},
    {"type": "object", "properties": {"head": {"type": "string"}, "tail": {"$ref": "#/definitions/list"}},
     "required": ["head", "tail"], "additionalProperties": false}]}}, "$ref": "#/definitions/list"})");
  EXPECT_TRUE(matches(list, R"({"head":"a","tail":{"head":"b","tail":null}})"));
  EXPECT_FALSE(matches(list, R"({"head":"a"})"));
  const Grammar root = compile(R"({"type": "array", "items": {"$ref": "#"}, "maxItems": 2})");
  EXPECT_TRUE(matches(root, "[[],[[]]]"));
  EXPECT_FALSE(matches(root, "[1]"));
}

TEST(JsonSchemaGrammar, AnyValueAndJsonObject) {
  const Grammar any = compile("{}");
  for (const char* ok : {"1", "\"s\"", "[1,\"a\",{\"b\":[null,true]}]", "{}", "false"})
    EXPECT_TRUE(matches(any, ok)) << ok;
  EXPECT_FALSE(matches(any, "[1,]"));
  const Grammar object = json_object_grammar();
  EXPECT_TRUE(matches(object, R"({"a":{"b":[1,2.5,-3e2]}})"));
  EXPECT_TRUE(matches(object, "{ }"));
  EXPECT_FALSE(matches(object, "[]"));
  EXPECT_FALSE(matches(object, "{}  "));
  EXPECT_FALSE(matches(object, "{   \"a\":1}"));  // whitespace is one space or a newline + indent
}

TEST(JsonSchemaGrammar, WhitespaceIsBounded) {
  const Grammar object = json_object_grammar();
  std::string indented = "{\n" + std::string(20, ' ') + "\"a\":1}";
  EXPECT_TRUE(matches(object, indented));
  indented = "{\n" + std::string(21, ' ') + "\"a\":1}";
  EXPECT_FALSE(matches(object, indented));
}

// Integer bounds: the grammar spells exactly the integers within them (no leading zeros, no
// "-0"), checked value by value around each range's ends on hand-picked and random ranges, then
// one-sided and fractional and exclusive bounds, and bounds at the 18-digit limit.
TEST(JsonSchemaGrammar, IntegerBoundsAllowExactlyTheIntegersWithin) {
  std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 0},     {1, 1},        {0, 9},     {5, 123},  {-15, 7},   {-300, -17},
      {10, 99},   {7, 1000},     {99, 101},  {-1, -1},  {-9, 0},    {100, 100},
      {190, 210}, {-1000, 1000}, {123, 987}, {0, 1099}, {-1099, -1}};
  std::mt19937 rng(17);
  std::uniform_int_distribution<int64_t> pick(-1100, 1100);
  for (int i = 0; i < 12; ++i) {
    const int64_t a = pick(rng), b = pick(rng);
    ranges.emplace_back(std::min(a, b), std::max(a, b));
  }
  for (const auto& [lo, hi] : ranges) {
    const Grammar g =
        compile(fmt::format(R"({{"type": "integer", "minimum": {}, "maximum": {}}})", lo, hi));
    for (int64_t v = -1120; v <= 1120; ++v)
      ASSERT_EQ(matches(g, std::to_string(v)), lo <= v && v <= hi)
          << "[" << lo << ", " << hi << "]: " << v;
    EXPECT_FALSE(matches(g, "-0")) << lo << " " << hi;
    EXPECT_FALSE(matches(g, fmt::format("0{}", std::max<int64_t>(lo, 1)))) << lo << " " << hi;
  }
  const Grammar natural = compile(R"({"type": "integer", "minimum": 0})");
  for (const char* ok : {"0", "7", "999999999999999999"}) EXPECT_TRUE(matches(natural, ok)) << ok;
  for (const char* bad : {"-1", "1000000000000000000", "1.0", "00"})
    EXPECT_FALSE(matches(natural, bad)) << bad;
  const Grammar below = compile(R"({"type": "integer", "exclusiveMaximum": -4.5})");
  EXPECT_TRUE(matches(below, "-5"));
  EXPECT_TRUE(matches(below, "-999999999999999999"));
  EXPECT_FALSE(matches(below, "-4"));
  const Grammar fractional =
      compile(R"({"type": "integer", "minimum": 0.5, "exclusiveMaximum": 3})");
  EXPECT_FALSE(matches(fractional, "0"));
  EXPECT_TRUE(matches(fractional, "1"));
  EXPECT_TRUE(matches(fractional, "2"));
  EXPECT_FALSE(matches(fractional, "3"));
  const Grammar exclusive =
      compile(R"({"type": "integer", "exclusiveMinimum": 9, "maximum": 1e300})");
  EXPECT_FALSE(matches(exclusive, "9"));
  EXPECT_TRUE(matches(exclusive, "10"));
  const Grammar huge = compile(
      R"({"type": "integer", "minimum": 999999999999999990, "maximum": 999999999999999999})");
  EXPECT_TRUE(matches(huge, "999999999999999995"));
  EXPECT_FALSE(matches(huge, "999999999999999989"));
  // Inside an object, as response_format schemas use them.
  const Grammar person = compile(
      R"({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["age"]})");
  EXPECT_TRUE(matches(person, R"({"age": 42})"));
  EXPECT_FALSE(matches(person, R"({"age": 151})"));
  EXPECT_FALSE(matches(person, R"({"age": -1})"));
}

// String formats: RFC 3339 dates, times and date-times and hyphenated UUIDs, as a subset of the
// valid spellings (no February 29, no leap second, uppercase T and Z, lowercase hex).
TEST(JsonSchemaGrammar, StringFormatsSpellValidDatesTimesAndUuids) {
  const Grammar date = compile(R"({"type": "string", "format": "date"})");
  for (const char* ok :
       {R"("2024-01-31")", R"("1999-04-30")", R"("2023-02-28")", R"("0001-12-01")"})
    EXPECT_TRUE(matches(date, ok)) << ok;
  for (const char* bad :
       {R"("2024-02-30")", R"("2024-04-31")", R"("2024-13-01")", R"("2024-00-10")",
        R"("2024-01-00")", R"("2024-1-01")", R"("24-01-01")", "2024-01-01"})
    EXPECT_FALSE(matches(date, bad)) << bad;
  const Grammar time = compile(R"({"type": "string", "format": "time"})");
  for (const char* ok : {R"("00:00:00Z")", R"("23:59:59.123456789+05:30")", R"("12:30:00-08:00")"})
    EXPECT_TRUE(matches(time, ok)) << ok;
  for (const char* bad : {R"("24:00:00Z")", R"("12:60:00Z")", R"("12:00:60Z")", R"("12:00:00")",
                          R"("12:00:00.Z")", R"("12:00:00.1234567890Z")", R"("12:00Z")"})
    EXPECT_FALSE(matches(time, bad)) << bad;
  const Grammar stamp = compile(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(matches(stamp, R"("2024-06-30T18:05:00.5Z")"));
  EXPECT_FALSE(matches(stamp, R"("2024-06-30 18:05:00Z")"));
  EXPECT_FALSE(matches(stamp, R"("2024-06-31T18:05:00Z")"));
  const Grammar uuid = compile(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(matches(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(matches(uuid, R"("123e4567e89b12d3a456426614174000")"));
  EXPECT_FALSE(matches(uuid, R"("123e4567-e89b-12d3-a456-42661417400")"));
  EXPECT_FALSE(matches(uuid, R"("123e4567-e89b-12d3-a456-42661417400g")"));
  // Several formats in one schema share their rules.
  const Grammar event = compile(
      R"({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
          "day": {"type": "string", "format": "date"}, "at": {"type": "string", "format": "date-time"}},
          "required": ["id", "day", "at"]})");
  EXPECT_TRUE(matches(
      event,
      R"({"id": "00000000-0000-0000-0000-000000000000", "day": "2020-10-10", "at": "2020-10-10T10:10:10Z"})"));
}

// A string schema with `pattern` (and `extra` keywords), compiled.
Grammar pattern_grammar(const std::string& pattern, const ojson& extra = ojson::object()) {
  ojson schema = {{"type", "string"}, {"pattern", pattern}};
  schema.update(extra);
  return compile_json_schema(schema);
}

// Whether the grammar accepts `text` written as a JSON string (nlohmann's escapes: \" \\ \n ...,
// \u00XX for other controls).
bool accepts_text(const Grammar& grammar, const std::string& text) {
  return matches(grammar, ojson(text).dump());
}

struct PatternCase {
  std::string pattern;
  std::vector<std::string> match, no_match;
};

void expect_language(const PatternCase& c) {
  SCOPED_TRACE(c.pattern);
  const Grammar grammar = pattern_grammar(c.pattern);
  for (const std::string& text : c.match) EXPECT_TRUE(accepts_text(grammar, text)) << text;
  for (const std::string& text : c.no_match) EXPECT_FALSE(accepts_text(grammar, text)) << text;
}

TEST(JsonSchemaPattern, EachConstructMatchesItsLanguage) {
  const std::vector<PatternCase> cases = {
      // Literals and escapes.
      {"^abc$", {"abc"}, {"", "ab", "abcd", "xabc", "ABC"}},
      {R"(^a\.b\-c\/d\"$)", {"a.b-c/d\""}, {"axb-c/d\"", "a.b-c/d"}},
      {R"(^\d\w\s$)", {"1_ ", "9a\t", "0Z\n", "5b\xC2\xA0"}, {"a_ ", "1- ", "-a ", "1_x"}},
      {R"(^\D\W\S$)", {"a-x", "-!1", "\xC3\xA9 \xC3\xA9"}, {"1-x", "aax", "a- "}},
      {R"(^\u00e9\x41\u{1F600}$)",
       {"\xC3\xA9"
        "A\xF0\x9F\x98\x80"},
       {"eA\xF0\x9F\x98\x80"}},
      {R"(^\uD83D\uDE00$)", {"\xF0\x9F\x98\x80"}, {"", "\xF0\x9F\x98\x81"}},  // one character
      {R"(^\t\n\r\f\v\0\cA$)", {std::string("\t\n\r\f\v\0\x01", 7)}, {"\t\n\r\f\v"}},
      // Classes, ranges, negation.
      {"^[a-z0-9_]+$", {"ab_9", "z", "0"}, {"", "aB", "a-b", "\xC3\xA9"}},
      {R"(^[^"\\]*$)", {"", "plain text", "\xE2\x82\xAC", "a\nb"}, {"a\"b", "a\\b", "\""}},
      {R"(^[\d.\-]+$)", {"1.5", "-2", "..."}, {"1,5", "a"}},
      {R"(^[-a]$)", {"-", "a"}, {"b"}},
      {R"(^[\b]$)", {"\b"}, {"b"}},
      {"^[^]$", {"x", "\n", "\xF0\x9F\x98\x80"}, {"", "xy"}},
      {"^a[]?b$", {"ab"}, {"axb"}},  // [] matches nothing
      {"^.$", {"a", "\"", "\\", "\xC3\xA9", "\t"}, {"", "\n", "\r", "\xE2\x80\xA8", "ab"}},
      // Groups and alternation.
      {"^(ab|cd)+$", {"ab", "cdab", "abcdab"}, {"", "ac", "abc"}},
      {"^(?:x|y)z$", {"xz", "yz"}, {"z", "xyz"}},
      {"^(?<word>a+)-$", {"a-", "aaa-"}, {"-", "a"}},
      {"^a|b$", {"ax", "xb", "a", "b"}, {"xa", "bx", ""}},
      {"^(a|)$", {"", "a"}, {"aa"}},
      // Quantifiers: greedy and lazy give the same language.
      {"^a*b+c?$", {"b", "aabbc", "bbb"}, {"", "ac", "abcc"}},
      {"^a{3}$", {"aaa"}, {"aa", "aaaa"}},
      {"^a{2,}$", {"aa", "aaaaaaa"}, {"a", ""}},
      {"^(ab){1,3}$", {"ab", "abab", "ababab"}, {"", "abababab", "aba"}},
      {"^a{0,2}$", {"", "a", "aa"}, {"aaa"}},
      {"^a+?b*?c??$", {"a", "aabbc"}, {"b", "acc"}},
      {"^x{2,3}?$", {"xx", "xxx"}, {"x", "xxxx"}},
      // Annex B literals: `{` that opens no quantifier, a lone `}` or `]`.
      {"^a{b}]$", {"a{b}]"}, {"ab"}},
      {"^(a*)*$", {"", "aaa"}, {"b"}},  // a repetition of something that can match nothing
      {"^$", {""}, {"a"}},
  };
  for (const PatternCase& c : cases) expect_language(c);
}

TEST(JsonSchemaPattern, UnanchoredMeansTheStringContainsAMatch) {
  expect_language({"foo", {"foo", "xxfooyy", "\n\"foo\\", "ffoo"}, {"", "fo", "fxoo", "FOO"}});
  expect_language({"^foo", {"foo", "foobar"}, {"xfoo", "fo"}});
  expect_language({"foo$", {"foo", "barfoo"}, {"foox", "foo\n"}});  // $ is the end, not a line's
  expect_language({"a.c", {"abc", "xxa-cxx"}, {"a\nc", "ac"}});
  expect_language({"", {"", "anything"}, {}});
  expect_language({"[0-9]{3}", {"a123b", "4567"}, {"12a3", "1 2 3"}});
}

TEST(JsonSchemaPattern, MinAndMaxLengthHoldTogetherWithThePattern) {
  const Grammar bounded = pattern_grammar("^[a-z]+$", {{"minLength", 2}, {"maxLength", 4}});
  for (const char* ok : {"ab", "abcd"}) EXPECT_TRUE(accepts_text(bounded, ok)) << ok;
  for (const char* bad : {"a", "abcde", "AB"}) EXPECT_FALSE(accepts_text(bounded, bad)) << bad;
  // Code points, not bytes; unanchored: the length is the whole string's.
  const Grammar contains = pattern_grammar("\xC3\xA9", {{"maxLength", 3}});
  EXPECT_TRUE(accepts_text(contains, "\xC3\xA9\xC3\xA9\xC3\xA9"));
  EXPECT_FALSE(accepts_text(contains, "\xC3\xA9\xC3\xA9\xC3\xA9x"));
  EXPECT_FALSE(accepts_text(contains, "abc"));
  const Grammar at_least = pattern_grammar("x", {{"minLength", 3}});
  EXPECT_FALSE(accepts_text(at_least, "xx"));
  EXPECT_TRUE(accepts_text(at_least, "axa"));
  EXPECT_TRUE(accepts_text(at_least, std::string(200, 'x')));
}

TEST(JsonSchemaPattern, CharactersAreSpelledOneWayAsJson) {
  const Grammar any = pattern_grammar("^.*$");
  for (const char* ok : {R"("a\"b\\c")", R"("\b\f\t")", R"("\u0001\u001f\u001F")", "\"\x7F\""})
    EXPECT_TRUE(matches(any, ok)) << ok;
  // Raw controls, other escapes of a character that has a short one, \u of printable characters.
  for (const char* bad : {"\"a\tb\"", R"("\u0009")", R"("\u0041")", R"("\/")", R"("\u0022")"})
    EXPECT_FALSE(matches(any, bad)) << bad;
  // A model can always finish: every prefix the grammar allows extends to a match.
  const Grammar digits = pattern_grammar("^[0-9]{2}$");
  Matcher matcher(digits);
  EXPECT_TRUE(matcher.accept("\"4"));
  EXPECT_FALSE(matcher.accept("\""));
  EXPECT_FALSE(matcher.accept("x"));
  EXPECT_TRUE(matcher.accept("2\""));
  EXPECT_TRUE(matcher.accepting());
}

// The message of the SchemaError that a string schema with `pattern` raises ("" if none).
std::string pattern_refusal(const std::string& pattern, const ojson& extra = ojson::object()) {
  try {
    pattern_grammar(pattern, extra);
  } catch (const SchemaError& error) {
    EXPECT_EQ(error.path(), "pattern") << error.what();
    return error.what();
  }
  return "";
}

TEST(JsonSchemaPattern, RefusesWhatTheSubsetDoesNotCoverNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"^(?=a)", "pattern: lookahead (?= at offset 1 of the pattern is not supported"},
      {"a(?!b)", "negative lookahead (?! at offset 1 of the pattern is not supported"},
      {"(?<=a)b", "lookbehind (?<= at offset 0 of the pattern is not supported"},
      {"(?<!a)b", "negative lookbehind (?<! at offset 0"},
      {R"((a)\1)", "the backreference \\1 at offset 3 of the pattern is not supported"},
      {R"((?<x>a)\k<x>)", "the named backreference \\k<...> at offset 7"},
      {R"(\bword\b)", "the word boundary \\b at offset 0"},
      {R"(\Ba)", "the word boundary \\B at offset 0"},
      {R"(^\p{L}+$)", "the Unicode property escape \\p{...} at offset 1"},
      {R"(\P{Lu})", "the Unicode property escape \\P{...} at offset 0"},
      {"(?i)abc", "the group form \"(?i\" (inline flags are not ECMA-262) at offset 0"},
      {"^a{0,5000}$", "{0,5000}: a repetition bound above 1000 is not supported"},
      {"^a{1001,}$", "{1001,}: a repetition bound above 1000"},
      {"^a{3,2}$", "{3,2}: the bounds are out of order"},
      {"^a{,2}$", "{,2} is no quantifier in ECMA-262 (write {0,2})"},
      {"^(a{100}){300}$", "more than 20000 automaton states"},
      {"a.{20}$", "needs more than 10000 automaton states"},
      {"^[z-a]$", "character range U+007A-U+0061 ends before it starts"},
      {R"(^[\d-z]$)", "cannot start or end with a class escape"},
      {"^(ab$", "unterminated group: no ')' closes this '(' (at offset 1"},
      {"ab)", "unbalanced ')'"},
      {"^[ab", "unterminated character class"},
      {"*a", "nothing to repeat"},
      {"a**", "nothing to repeat: a quantifier after a quantifier"},
      {"^*", "nothing to repeat: a quantifier after ^ or $"},
      {R"(\q)", "unknown escape \\q"},
      {R"(\x4)", "\\x must be followed by two hex digits"},
      {"a\\", "lone backslash"},
      {"^[]$", "no string matches the pattern"},
      {"a$b", "no string matches the pattern"},
  };
  for (const auto& [pattern, message] : cases)
    EXPECT_NE(pattern_refusal(pattern).find(message), std::string::npos)
        << pattern << " -> " << pattern_refusal(pattern);
  EXPECT_NE(pattern_refusal("^a{3}$", {{"maxLength", 2}}).find("no string of 0 to 2 characters"),
            std::string::npos);
  EXPECT_EQ(pattern_refusal("^.{1,1000}$", {{"maxLength", 1000}}), "");  // large but fine
  EXPECT_EQ(refusal(R"({"type": "string", "pattern": 3})"), "pattern");
  EXPECT_EQ(refusal(R"({"type": "string", "format": "uuid", "pattern": "^a"})"), "pattern");
  EXPECT_EQ(refusal(R"j({"type": "object", "properties": {"code": {"pattern": "(?=x)"}}})j"),
            "properties.code.pattern");
  EXPECT_EQ(refusal(R"({"anyOf": [{"type": "string"}], "pattern": "a"})"), "pattern");
}

TEST(JsonSchemaPattern, InsideObjectsAndWithoutAType) {
  const Grammar person = compile(R"({"type": "object", "properties": {
      "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
      "tag": {"pattern": "^#"}}, "required": ["code"]})");
  EXPECT_TRUE(matches(person, R"({"code": "AB-123", "tag": "#x"})"));
  EXPECT_FALSE(matches(person, R"({"code": "AB-12"})"));
  EXPECT_FALSE(matches(person, R"({"code": "AB-123", "tag": "x#"})"));
  EXPECT_FALSE(matches(person, R"({"code": "AB-123", "tag": 1})"));  // as minLength: a string
}

// Random strings over a small alphabet: the grammar accepts exactly what std::regex (ECMAScript)
// finds a match in (regex_search; regex_match for patterns anchored at both ends).
TEST(JsonSchemaPattern, AgreesWithStdRegexOnRandomStrings) {
  const std::vector<std::string> patterns = {
      "^[ab]+-?[0-9]{1,2}$",
      "a+b",
      "^(ab|ba)*$",
      "b{2,3}$",
      "^a|b$",
      R"(^[^a"]*1[^b]*$)",
      "(?:a1|b-){2}",
      R"(^\w*\s?\W+$)",
      "^.a.$",
      R"(-\d)",
      "^(a?){3}b$",
      R"("|\\)",
      "^$",
      "^a*?(b|1){1,3}?-*$",
  };
  const std::string alphabet = "ab1-\" \\\n";
  std::mt19937 random(17);
  for (const std::string& pattern : patterns) {
    SCOPED_TRACE(pattern);
    const Grammar grammar = pattern_grammar(pattern);
    const std::regex reference(pattern, std::regex::ECMAScript);
    const bool anchored = pattern.size() >= 2 && pattern.front() == '^' && pattern.back() == '$' &&
                          pattern.find('|') == std::string::npos;
    size_t accepted = 0;
    for (int i = 0; i < 1500; ++i) {
      std::string text(random() % 8, ' ');
      for (char& c : text) c = alphabet[random() % alphabet.size()];
      const bool expected =
          anchored ? std::regex_match(text, reference) : std::regex_search(text, reference);
      EXPECT_EQ(accepts_text(grammar, text), expected) << ojson(text).dump();
      accepted += expected;
    }
    EXPECT_GT(accepted, 0u);  // each pattern is exercised on both sides
    EXPECT_LT(accepted, 1500u);
  }
}

TEST(JsonSchemaGrammar, RefusesWhatItCannotHonour) {
  EXPECT_EQ(refusal(R"j({"type": "string", "pattern": "^(?=a)"})j"), "pattern");
  EXPECT_EQ(
      refusal(R"({"type": "object", "properties": {"age": {"type": "number", "minimum": 0}}})"),
      "properties.age.minimum");
  EXPECT_EQ(refusal(R"({"type": ["integer", "null"], "maximum": 3})"), "maximum");
  EXPECT_EQ(refusal(R"({"minimum": 3})"), "minimum");
  EXPECT_EQ(refusal(R"({"type": "integer", "minimum": 5, "maximum": 4})"), "minimum");
  EXPECT_EQ(refusal(R"({"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3})"),
            "exclusiveMinimum");
  EXPECT_EQ(refusal(R"({"type": "integer", "minimum": 1e30})"), "minimum");
  EXPECT_EQ(refusal(R"({"type": "integer", "exclusiveMinimum": true})"), "exclusiveMinimum");
  EXPECT_EQ(refusal(R"({"type": "integer", "minimum": "0"})"), "minimum");
  EXPECT_EQ(refusal(R"({"type": "integer", "multipleOf": 2})"), "multipleOf");
  EXPECT_EQ(refusal(R"({"type": "string", "format": "email"})"), "format");
  EXPECT_EQ(refusal(R"({"type": "string", "format": 3})"), "format");
  EXPECT_EQ(refusal(R"({"type": "string", "format": "date", "maxLength": 20})"), "maxLength");
  EXPECT_EQ(refusal(R"({"allOf": [{}]})"), "allOf");
  EXPECT_EQ(refusal(R"({"type": "array", "items": [{}]})"), "items");
  EXPECT_EQ(refusal(R"({"type": "array", "uniqueItems": true})"), "uniqueItems");
  EXPECT_EQ(refusal(R"({"type": "thing"})"), "type");
  EXPECT_EQ(refusal(R"({"type": ["string", 3]})"), "type[1]");
  EXPECT_EQ(refusal(R"({"$ref": "#/$defs/missing"})"), "$ref");
  EXPECT_EQ(refusal(R"({"$ref": "https://example.com/s.json"})"), "$ref");
  EXPECT_EQ(refusal(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"), "$ref");
  EXPECT_EQ(
      refusal(
          R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"})"),
      "$ref");
  EXPECT_EQ(refusal(R"({"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}})"), "type");
  EXPECT_EQ(
      refusal(
          R"({"type": "object", "required": ["x"], "properties": {}, "additionalProperties": false})"),
      "required[0]");
  EXPECT_EQ(refusal(R"({"type": "string", "maxLength": -1})"), "maxLength");
  EXPECT_EQ(refusal(R"({"type": "string", "maxLength": 100000})"), "maxLength");
  EXPECT_EQ(refusal(R"({"type": "array", "minItems": 3, "maxItems": 2})"), "minItems");
  EXPECT_EQ(refusal(R"({"enum": []})"), "enum");
  EXPECT_EQ(refusal(R"({"properties": {"a": false}})"), "properties.a");
  EXPECT_EQ(refusal(R"(false)"), "");
  EXPECT_EQ(refusal(R"(3)"), "");
  // Annotations are no reason to refuse.
  EXPECT_EQ(refusal(R"({"title": "T", "description": "d", "examples": [1], "default": 2,
                      "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"})"),
            "(compiled)");
}

}  // namespace
}  // namespace strata::grammar
