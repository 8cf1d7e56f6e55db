// The GBNF parser (grammar/gbnf.h): every construct on strings it must accept and reject, every
// error with its line:column, the rendering round trip (to_text parses back to the same
// language), and the matcher against a reference (std::regex, or a UTF-8 predicate) on every
// byte string up to a length over a small alphabet.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/matcher.h"

namespace strata::grammar {
namespace {

bool matches(const Grammar& grammar, std::string_view text) {
  Matcher matcher(grammar);
  return matcher.accept(text) && matcher.accepting();
}

void expect_language(const std::string& gbnf, const std::vector<std::string>& accepted,
                     const std::vector<std::string>& rejected) {
  SCOPED_TRACE(gbnf);
  const Grammar grammar = parse_gbnf(gbnf);
  for (const std::string& text : accepted) EXPECT_TRUE(matches(grammar, text)) << text;
  for (const std::string& text : rejected) EXPECT_FALSE(matches(grammar, text)) << text;
}

// "LINE:COLUMN: detail" of the error `gbnf` raises, or "(parsed)".
std::string error_of(const std::string& gbnf) {
  try {
    parse_gbnf(gbnf);
  } catch (const GbnfError& error) {
    EXPECT_EQ(std::string(error.what()),
              fmt::format("{}:{}: {}", error.line(), error.column(), error.detail()));
    return error.what();
  }
  return "(parsed)";
}

void expect_error(const std::string& gbnf, const std::string& where, const std::string& says) {
  const std::string error = error_of(gbnf);
  EXPECT_EQ(error.rfind(where + ": ", 0), 0u) << gbnf << "\n -> " << error;
  EXPECT_NE(error.find(says), std::string::npos) << gbnf << "\n -> " << error;
}

TEST(Gbnf, SequencesAlternativesAndGroups) {
  expect_language(R"(root ::= "yes" | "no")", {"yes", "no"}, {"", "y", "yesno", "No"});
  expect_language(R"(root ::= "a" "b" c
c ::= "c" | "C")",
                  {"abc", "abC"}, {"ab", "abcc", "acb"});
  expect_language(R"(root ::= ("a" | "b") ("c" ("d" | "e"))  )", {"acd", "bce"}, {"ac", "abd"});
  // An empty alternative and an empty string match nothing.
  expect_language(R"(root ::= "x" | )", {"x", ""}, {"xx"});
  expect_language(R"(root ::= "" "a" "")", {"a"}, {""});
  // Rules used before they are defined; rules may refer to themselves (not on the left).
  expect_language("root ::= list\nlist ::= \"(\" list \")\" | \"\"", {"", "()", "((()))"},
                  {"(", "())", ")("});
}

TEST(Gbnf, Repetitions) {
  expect_language(R"(root ::= "a"* "b"+ "c"?)", {"b", "aabbb", "bc", "abbc"},
                  {"", "a", "c", "bcc", "ba"});
  expect_language(R"(root ::= "ab"{2})", {"abab"}, {"ab", "ababab", "aab"});
  expect_language(R"(root ::= "x"{2,})", {"xx", "xxxxxxx"}, {"", "x"});
  expect_language(R"(root ::= [0-9]{1,3})", {"0", "12", "999"}, {"", "1234", "a"});
  expect_language(R"(root ::= "a"{0,2} "b"{ 0 , } "c"{0})", {"", "aa", "abbb"}, {"aaa", "c"});
  // A postfix applies to the whole element before it; postfixes stack.
  expect_language(R"(root ::= ("ab" | "c")+ "!")", {"ab!", "cabc!"}, {"!", "a!", "abab"});
  expect_language(R"(root ::= "ab"?{2})", {"", "ab", "abab"}, {"a", "ababab"});
  expect_language(R"(root ::= ("a"{2}){2})", {"aaaa"}, {"aa", "aaa", "aaaaaa"});
}

TEST(Gbnf, StringEscapesAreCodePoints) {
  expect_language(R"(root ::= "\n\t\r\\\"\[\]")", {"\n\t\r\\\"[]"}, {"n"});
  expect_language(R"(root ::= "\x41\u00e9\U0001F642")", {"Aé🙂"}, {"A\xE9\xF0"});
  // \xHH is a code point, as in llama.cpp: \xE9 is é, two bytes.
  expect_language(R"(root ::= "\xE9")", {"\xC3\xA9"}, {"\xE9"});
  expect_language("root ::= \"日本\"", {"日本"}, {"日"});
}

TEST(Gbnf, CharacterClasses) {
  expect_language(R"(root ::= [a-cx]+)", {"abc", "x", "cab"}, {"", "d", "A"});
  expect_language(R"(root ::= [^a-z"]*)", {"", "ABC", "12 é"}, {"a", "\""});
  expect_language(R"(root ::= [-a] [a-] [\]-] )", {"-a]", "aa-"}, {"b--"});
  // Classes over code points, spelled as UTF-8: a range across byte lengths.
  expect_language(R"(root ::= [\u00e0-\u4e2d])", {"à", "é", "ÿ", "中", "\u0800"}, {"a", "Ô", "丮"});
  expect_language(R"(root ::= [^\x00-\x7F])", {"é", "🙂", "\U0010FFFF"},
                  {"a", "\xC3", "\xED\xA0\x80", "\xC0\x80", "\xF4\x90\x80\x80"});
  expect_language(R"(root ::= [^])", {"a", "\n", "é"}, {"", "ab"});
  expect_language(R"(root ::= [😀-🙏])", {"😀", "🙂", "🙏"}, {"x", "🚀", "😀😀"});
}

TEST(Gbnf, AnyCharacterIsWellFormedUtf8) {
  expect_language(R"(root ::= . .)", {"ab", std::string("\n\0", 2), "é日", "🙂x"},
                  {"a", "abc", "\xC3\x28", "\xE0\x80\x80", "\xED\xA0\x80z"});
}

TEST(Gbnf, CommentsLineBreaksAndNames) {
  expect_language(R"(# a comment
root ::=   # the rule
  greeting   # who
  ( ", " Name_2 )?  # optional
greeting ::= "hi" |
             "hello"
Name_2 ::= [A-Z] [a-z]*
)",
                  {"hi", "hello, Bob"}, {"hi, ", "hey"});
  // llama.cpp's layout (a line break ends a rule, parentheses span lines) and Windows line ends.
  expect_language("root ::= (\r\n  \"a\"\r\n  | \"b\"\r\n)\r\nx-y ::= \"z\"\r\n", {"a", "b"},
                  {"z"});
}

TEST(Gbnf, ErrorsNameLineColumnAndWhatWasExpected) {
  expect_error(R"(root ::= foo)", "1:10", "undefined rule 'foo'");
  expect_error("root ::= \"a\" | b\n\nb ::= c d\nc ::= \"c\"", "3:9", "undefined rule 'd'");
  expect_error(R"(main ::= "a")", "1:1", "no rule named 'root'");
  expect_error("", "1:1", "no rule named 'root'");
  expect_error("root ::= \"abc\n", "1:10", "unterminated string");
  expect_error(R"(root ::= "abc)", "1:10", "unterminated string");
  expect_error("root ::= [a-z\n", "1:10", "unterminated character class: expected ']'");
  expect_error("root ::= (\"a\" | \"b\"", "1:10", "unterminated group: expected ')'");
  expect_error("root ::= (\"a\"\nx ::= \"b\"", "2:1",
               "expected ')' to close the group opened at 1:10");
  expect_error(R"(root ::= "a"))", "1:13", "unmatched ')'");
  expect_error(R"(root ::= "\q")", "1:11", "bad escape '\\q': expected \\n, \\t");
  expect_error(R"(root ::= "\x4")", "1:11", "'\\x' takes 2 hex digits, found '\"'");
  expect_error(R"(root ::= [\uD800])", "1:11", "surrogate");
  expect_error(R"(root ::= "\U00110000")", "1:11", "above U+10FFFF");
  expect_error(R"(root ::= [z-a])", "1:11", "ends before it starts");
  expect_error(R"(root ::= [])", "1:10", "empty character class");
  expect_error(R"(root ::= [^\x00-\U0010FFFF])", "1:10", "matches no character");
  expect_error(R"(root ::= "a"{3,2})", "1:13", "bad repetition bounds {3,2}");
  expect_error(R"(root ::= "a"{,2})", "1:14", "expected a number after '{'");
  expect_error(R"(root ::= "a"{2)", "1:15", "expected '}' or ','");
  expect_error(R"(root ::= "a"{2;})", "1:15", "expected '}' or ','");
  expect_error(R"(root ::= "a"{10001})", "1:14", "at most 10000");
  expect_error(R"(root ::= * "a")", "1:10", "'*' must follow an element");
  expect_error(R"(root ::= "a" | + )", "1:16", "'+' must follow an element");
  expect_error(R"(root = "a")", "1:6", "expected '::=' after the rule name 'root', found '='");
  expect_error("root ::= \"a\"\n\"b\" ::= x", "2:5", "expected a string, a character class");
  expect_error("root ::= \"a\"\n!", "2:1", "found '!'");
  expect_error("::= \"a\"", "1:1", "expected a rule (name ::= ...), found ':'");
  expect_error("root ::= a a ::= \"b\"", "1:12", "expected a line break before the next rule 'a'");
  expect_error("root ::= \"a\"\nroot ::= \"b\"", "2:1",
               "rule 'root' is defined twice (first at 1:1)");
  expect_error("root ::= \"é\" \xFF", "1:14", "invalid UTF-8 (byte 0xFF)");
  expect_error("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", "2:1",
               "rule 'expr' can reach itself without reading any input (left recursion");
  expect_error("root ::= (\"a\"?)*", "1:16", "the repetition '*' in rule 'root' can reach itself");
  expect_error("root ::= a\na ::= \"b\"? a", "2:1", "left recursion");
  expect_error("root ::= " + std::string(kMaxGbnfNesting + 1, '(') + "\"a\"" +
                   std::string(kMaxGbnfNesting + 1, ')'),
               fmt::format("1:{}", 10 + kMaxGbnfNesting), "nested deeper than 128");
  expect_error("root ::= \"" + std::string(100, 'a') + "\"{10000}", "1:112",
               "the repetition {10000} makes the grammar too large");
}

// Every named rule and its rendering: to_text() of a parsed grammar is GBNF the parser reads back
// to the same language (for ASCII grammars: the rendering spells bytes, the parser code points).
TEST(Gbnf, RenderingParsesBackToTheSameLanguage) {
  const std::vector<std::string> grammars = {
      R"(root ::= ("yes" | "no") ", " [0-9]{3})", R"(root ::= "a" ("b" | "c")* "d"?)",
      R"g(root ::= item ("," item){0,2}
item ::= [a-b]+ | "(" root ")")g",
      R"(root ::= [^a-c\x00-\x1F\x7F-\U0010FFFF]{1,2} | "")",  // printable ASCII but a-c
  };
  for (const std::string& gbnf : grammars) {
    SCOPED_TRACE(gbnf);
    const Grammar grammar = parse_gbnf(gbnf);
    const std::string text = grammar.to_text();
    const Grammar again = parse_gbnf(text);
    // The same rules (the rendering lists them by id, which follow first mentions).
    const auto lines = [](const std::string& rendered) {
      std::vector<std::string> out;
      for (size_t at = 0; at < rendered.size();) {
        const size_t end = rendered.find('\n', at);
        out.push_back(rendered.substr(at, end - at));
        at = end + 1;
      }
      std::sort(out.begin(), out.end());
      return out;
    };
    EXPECT_EQ(lines(again.to_text()), lines(text));
    std::string alphabet = "abcdy,no0 9()!";
    std::vector<std::string> frontier = {""};
    for (int length = 0; length <= 4; ++length) {
      std::vector<std::string> next;
      for (const std::string& s : frontier) {
        EXPECT_EQ(matches(grammar, s), matches(again, s)) << s;
        if (length < 4)
          for (char c : alphabet) next.push_back(s + c);
      }
      frontier = std::move(next);
    }
  }
}

// The language of each grammar equals its reference on every string up to `max_length` over
// `alphabet` (walking the matcher states depth first, so a string costs one byte of matching).
void expect_same_language(const std::string& gbnf,
                          const std::function<bool(const std::string&)>& reference,
                          const std::string& alphabet, size_t max_length) {
  SCOPED_TRACE(gbnf);
  const Grammar grammar = parse_gbnf(gbnf);
  Matcher matcher(grammar);
  size_t checked = 0, members = 0;
  std::function<void(std::string&, const MatcherState&, bool)> walk =
      [&](std::string& text, const MatcherState& state, bool alive) {
        const bool accepted = alive && matcher.accepting(state);
        const bool expected = reference(text);
        ++checked;
        members += expected;
        if (accepted != expected) ADD_FAILURE() << "\"" << text << "\": matcher " << accepted;
        if (text.size() == max_length) return;
        MatcherState next;
        for (char c : alphabet) {
          const bool ok = alive && matcher.advance(state, uint8_t(c), next);
          text.push_back(c);
          walk(text, ok ? next : MatcherState(), ok);
          text.pop_back();
        }
      };
  std::string text;
  walk(text, matcher.initial(), true);
  EXPECT_GT(members, 0u);
  EXPECT_LT(members, checked);
}

TEST(Gbnf, MatcherAcceptsExactlyTheLanguageOnShortStrings) {
  const auto regex = [](const char* pattern) {
    return [re = std::regex(pattern)](const std::string& s) { return std::regex_match(s, re); };
  };
  expect_same_language(R"(root ::= ("ye" | "n") "," [0-1]{2})", regex("(ye|n),[01]{2}"), "yen,01",
                       6);
  expect_same_language(R"(root ::= "a" ("b" | "cd")* "d"?)", regex("a(b|cd)*d?"), "abcd", 8);
  expect_same_language(R"(root ::= ("ab"){1,3} [^a]? | "b"{2,})", regex("(ab){1,3}[^a]?|b{2,}"),
                       "abc", 8);
  expect_same_language(
      "root ::= x\nx ::= \"(\" x \")\" x | \"\"",
      [](const std::string& s) {  // balanced parentheses
        int depth = 0;
        for (char c : s) {
          depth += c == '(' ? 1 : -1;
          if (depth < 0) return false;
        }
        return depth == 0;
      },
      "()", 12);
  // Bytes, not characters: one well-formed UTF-8 character other than "a", twice.
  const auto one_char = [](const std::string& s, size_t& at) {
    const auto b = [&](size_t i) { return i < s.size() ? uint8_t(s[i]) : uint8_t(0); };
    const uint8_t b0 = b(at);
    size_t n = 0;
    if (at >= s.size()) return false;
    if (b0 < 0x80) {
      n = 1;
    } else if (b0 >= 0xC2 && b0 <= 0xDF && (b(at + 1) & 0xC0) == 0x80) {
      n = 2;
    } else if (b0 == 0xE0 && b(at + 1) >= 0xA0 && b(at + 1) <= 0xBF && (b(at + 2) & 0xC0) == 0x80) {
      n = 3;
    }
    if (n == 0 || (n == 1 && b0 == 'a')) return false;
    at += n;
    return true;
  };
  expect_same_language(R"(root ::= [^a] [^a])",
                       [&](const std::string& s) {
                         size_t at = 0;
                         return one_char(s, at) && one_char(s, at) && at == s.size();
                       },
                       std::string("a\x7F\xC3\xA9\xE0\xA0\x80", 7), 6);
}

// Rules written top-down (each uses the next, first): GrammarBuilder::finish's worklist settles
// them in one walk each, where passes in definition order took one pass per rule.
TEST(Gbnf, LongChainsOfRulesParseQuickly) {
  std::string gbnf = "root ::= r0\n";
  const int n = 40000;
  for (int i = 0; i < n; ++i) gbnf += fmt::format("r{} ::= r{} \"x\"\n", i, i + 1);
  gbnf += fmt::format("r{} ::= \"y\"\n", n);
  const auto start = std::chrono::steady_clock::now();
  const Grammar grammar = parse_gbnf(gbnf);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 2.0);
  ByteSet y;
  y.add('y');
  EXPECT_EQ(grammar.first[grammar.rules[grammar.root][0]], y);
  EXPECT_FALSE(grammar.nullable[grammar.rules[grammar.root][0]]);
}

}  // namespace
}  // namespace strata::grammar
