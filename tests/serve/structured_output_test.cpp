// Structured output end to end: `strata serve` on the default model (random weights, so the text
// is gibberish) answers response_format requests with JSON that parses and validates against the
// schema — checked by an independent validator (Debian's libvalijson-dev) — greedy and sampled,
// whole and streamed, on /v1/chat/completions and /v1/completions; max_tokens cuts a value with
// "length"; speculative decoding gives the same tokens as plain constrained decoding. The same
// for a GBNF `grammar` (checked by regex).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <regex>

#include "schema_errors.h"
#include "serve_process.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;

const json kNested = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    "size": {"type": "object", "properties": {"w": {"type": "integer"}, "h": {"type": "number"}},
             "required": ["w", "h"], "additionalProperties": false},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "color", "tags", "size"],
  "additionalProperties": false})");

const json kAnyOf = json::parse(R"({
  "anyOf": [
    {"type": "integer"},
    {"type": "object", "properties": {"flag": {"type": "boolean"}, "note": {"type": "null"}},
     "required": ["flag"], "additionalProperties": false},
    {"enum": ["none", "some"]}
  ]})");

const json kTree = json::parse(R"({
  "$defs": {
    "node": {"type": "object",
             "properties": {"id": {"type": "integer"},
                            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                     "maxItems": 2}},
             "required": ["id", "kids"], "additionalProperties": false}
  },
  "$ref": "#/$defs/node"})");

// String patterns (grammar/pattern.h), each string bounded so a random model ends it: anchored,
// a class with `"` and `\` (written escaped in JSON), unanchored (contains a match). ASCII
// classes only: valijson runs std::regex over bytes, the grammar over code points.
const json kPatterned = json::parse(R"({
  "type": "object",
  "properties": {
    "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2,4}$"},
    "slug": {"type": "string", "pattern": "^[a-z0-9]+(?:-[a-z0-9]+)*$", "maxLength": 20},
    "quoted": {"type": "string", "pattern": "^[a-z]{1,4}[\"\\\\][a-z]{1,4}$"},
    "mention": {"type": "string", "pattern": "@[a-z]+", "maxLength": 16}
  },
  "required": ["code", "slug", "quoted", "mention"],
  "additionalProperties": false})");

std::string json_schema_format(const json& schema) {
  return json{{"type", "json_schema"},
              {"json_schema", {{"name", "t"}, {"strict", true}, {"schema", schema}}}}
      .dump();
}

std::string chat_body(const std::string& format, const std::string& sampling) {
  return fmt::format(
      R"({{"messages":[{{"role":"user","content":"Describe a thing as JSON."}}],"max_tokens":400,)"
      R"("response_format":{},{}}})",
      format, sampling);
}

struct Reply {
  std::string content;
  std::string finish;
};

Reply whole(const ServeProcess& server, const std::string& body) {
  const HttpReply reply = post(server, "/v1/chat/completions", body);
  EXPECT_EQ(reply.status, 200) << reply.body;
  if (reply.status != 200) return {};
  const json r = reply.json();
  return {r["choices"][0]["message"]["content"].get<std::string>(),
          r["choices"][0]["finish_reason"].get<std::string>()};
}

Reply streamed(const ServeProcess& server, std::string body) {
  body.insert(body.size() - 1, R"(,"stream":true)");
  const HttpReply reply = post(server, "/v1/chat/completions", body);
  EXPECT_EQ(reply.status, 200) << reply.body;
  Reply out;
  for (const std::string& event : sse_data(reply.body)) {
    if (event == "[DONE]") break;
    const json chunk = json::parse(event);
    if (chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    out.content += choice["delta"].value("content", "");
    EXPECT_FALSE(choice["delta"].contains("reasoning_content")) << event;
    if (!choice["finish_reason"].is_null()) out.finish = choice["finish_reason"].get<std::string>();
  }
  return out;
}

// Integer bounds (minimum / maximum and the exclusive forms) and string formats
// (grammar/json_schema.h); the formats are also checked by regex below.
const json kBounded = json::parse(R"({
  "type": "object",
  "properties": {
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "year": {"type": "integer", "minimum": 1900, "exclusiveMaximum": 2101},
    "offset": {"type": "integer", "exclusiveMinimum": -10, "maximum": -3},
    "count": {"type": "integer", "minimum": 1},
    "day": {"type": "string", "format": "date"},
    "at": {"type": "string", "format": "date-time"},
    "id": {"type": "string", "format": "uuid"}
  },
  "required": ["age", "year", "offset", "count", "day", "at", "id"],
  "additionalProperties": false})");

// The formatted members of a kBounded value, by regex: "" when they match.
std::string format_errors(const std::string& text) {
  const json value = json::parse(text);
  const std::regex date(R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))");
  const std::regex time(
      R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))");
  const std::regex uuid(R"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})");
  std::string errors;
  const std::string day = value["day"], at = value["at"], id = value["id"];
  if (!std::regex_match(day, date)) errors += "day " + day + "; ";
  const size_t t = at.find('T');
  if (t == std::string::npos || !std::regex_match(at.substr(0, t), date) ||
      !std::regex_match(at.substr(t + 1), time))
    errors += "at " + at + "; ";
  if (!std::regex_match(id, uuid)) errors += "id " + id;
  return errors;
}

const std::vector<std::string> kSamplings = {
    R"("temperature":0)", R"("temperature":0.8,"top_p":0.95,"seed":11)",
    R"("temperature":1.2,"top_k":40,"repeat_penalty":1.1,"seed":5)"};

TEST(StructuredOutput, ValuesValidateAgainstTheirSchemas) {
  ServeProcess server({"-t", "1"});
  for (const json* schema : {&kNested, &kAnyOf, &kTree, &kBounded, &kPatterned}) {
    for (const std::string& sampling : kSamplings) {
      SCOPED_TRACE(schema->dump() + " " + sampling);
      const std::string body = chat_body(json_schema_format(*schema), sampling);
      const Reply reply = whole(server, body);
      ASSERT_EQ(reply.finish, "stop") << reply.content;
      EXPECT_EQ(schema_errors(*schema, reply.content), "");
      if (schema == &kBounded) {
        EXPECT_EQ(format_errors(reply.content), "");
      }
      const Reply stream = streamed(server, body);
      EXPECT_EQ(stream.content, reply.content);
      EXPECT_EQ(stream.finish, "stop");
    }
  }
}

TEST(StructuredOutput, JsonObjectAndCompletions) {
  ServeProcess server({"-t", "1"});
  const json object_schema = {{"type", "object"}};
  for (const std::string& sampling : kSamplings) {
    SCOPED_TRACE(sampling);
    const Reply reply = whole(server, chat_body(R"({"type":"json_object"})", sampling));
    if (reply.finish == "stop") {
      EXPECT_EQ(schema_errors(object_schema, reply.content), "");
    } else {
      EXPECT_EQ(reply.finish, "length");
      EXPECT_EQ(reply.content.rfind('{', 0), 0u) << reply.content;
    }
  }
  // /v1/completions takes response_format too.
  const HttpReply reply = post(
      server, "/v1/completions",
      fmt::format(
          R"({{"prompt":"A JSON value:","max_tokens":300,"temperature":0,"response_format":{}}})",
          json_schema_format(kNested)));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json r = reply.json();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(schema_errors(kNested, r["choices"][0]["text"].get<std::string>()), "");
}

TEST(StructuredOutput, MaxTokensCutsWithLength) {
  ServeProcess server({"-t", "1"});
  std::string body = chat_body(json_schema_format(kNested), R"("temperature":0)");
  const Reply full = whole(server, body);
  ASSERT_EQ(full.finish, "stop");
  const size_t at = body.find("\"max_tokens\":400");
  body.replace(at, 16, "\"max_tokens\":3");
  const Reply cut = whole(server, body);
  EXPECT_EQ(cut.finish, "length");
  EXPECT_EQ(full.content.rfind(cut.content, 0), 0u) << cut.content << " vs " << full.content;
  EXPECT_NE(schema_errors(kNested, cut.content), "");  // an unfinished value
}

// The grammar cache (serve/grammar_cache.h, in /props): the same schema sent again is not
// compiled again, its masks are taken from the first request's (grammar::SharedMasks), and the
// request gives the same tokens as the first time; another schema is compiled once.
TEST(StructuredOutput, ASchemaSentAgainReusesItsGrammar) {
  ServeProcess server({"-t", "1"});
  auto cache = [&] { return get(server, "/props").json()["strata"]["grammar_cache"]; };
  const std::string body = chat_body(json_schema_format(kNested), R"("temperature":0.8,"seed":5)");
  const Reply first = whole(server, body);
  EXPECT_EQ(cache()["misses"], 1);
  EXPECT_EQ(cache()["hits"], 0);
  const json masks_before = cache()["shared_masks"];
  EXPECT_EQ(masks_before["grammars"], 1);
  EXPECT_GT(masks_before["masks"].get<int>(), 0);
  EXPECT_EQ(masks_before["hits"], 0);
  const Reply again = whole(server, body);
  EXPECT_EQ(cache()["misses"], 1);
  EXPECT_EQ(cache()["hits"], 1);
  // The second request took the first one's masks instead of walking the vocabulary again.
  EXPECT_GT(cache()["shared_masks"]["hits"].get<int>(), 0);
  EXPECT_EQ(again.content, first.content);
  EXPECT_EQ(again.finish, first.finish);
  EXPECT_EQ(schema_errors(kNested, again.content), "");
  whole(server, chat_body(json_schema_format(kAnyOf), R"("temperature":0)"));
  EXPECT_EQ(cache()["misses"], 2);
  EXPECT_EQ(cache()["entries"], 2);
}

TEST(StructuredOutput, BadSchemasAre400sNamingThePath) {
  ServeProcess server({"-t", "1"});
  const HttpReply reply = post(
      server, "/v1/chat/completions",
      chat_body(
          json_schema_format(json::parse(
              R"j({"type":"object","properties":{"code":{"type":"string","pattern":"(?=A)"}}})j")),
          R"("temperature":0)"));
  EXPECT_EQ(reply.status, 400);
  const json error = reply.json()["error"];
  EXPECT_EQ(error["param"], "response_format.json_schema.schema.properties.code.pattern");
  EXPECT_NE(error["message"].get<std::string>().find("not supported"), std::string::npos);
  const HttpReply thinking = post(
      server, "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},)"
      R"("chat_template_kwargs":{"enable_thinking":true}})");
  EXPECT_EQ(thinking.status, 400);
  EXPECT_EQ(thinking.json()["error"]["param"], "chat_template_kwargs.enable_thinking");
  // Log-probabilities would be the unconstrained distribution's: refused with a response_format.
  const HttpReply logprobs = post(
      server, "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},)"
      R"("logprobs":true})");
  EXPECT_EQ(logprobs.status, 400);
  EXPECT_EQ(logprobs.json()["error"]["param"], "logprobs");
}

// The `grammar` field (GBNF, llama-server's): every reply is a sentence of the grammar, greedy and
// sampled, whole and streamed, on both endpoints, n=2 too; the grammar is compiled once (the
// cache, keyed by its text); a bad grammar is a 400 naming its line and column; with logprobs or
// thinking on, or with a json response_format, a 400 naming the field.
TEST(StructuredOutput, GbnfGrammarRepliesAreSentencesOfTheGrammar) {
  ServeProcess server({"-t", "1"});
  const std::string gbnf = "# an answer and a three-digit code\n"
                           "root ::= answer \", \" code\n"
                           "answer ::= \"yes\" | \"no\"\n"
                           "code ::= [0-9]{3}\n";
  const std::regex sentence("(yes|no), [0-9]{3}");
  auto cache = [&] { return get(server, "/props").json()["strata"]["grammar_cache"]; };
  for (const std::string& sampling : kSamplings) {
    SCOPED_TRACE(sampling);
    const std::string body =
        json{{"messages", {{{"role", "user"}, {"content", "Answer with a code."}}}},
             {"max_tokens", 40},
             {"grammar", gbnf}}
            .dump();
    std::string with_sampling = body;
    with_sampling.insert(with_sampling.size() - 1, "," + sampling);
    const Reply reply = whole(server, with_sampling);
    EXPECT_EQ(reply.finish, "stop");
    EXPECT_TRUE(std::regex_match(reply.content, sentence)) << reply.content;
    const Reply stream = streamed(server, with_sampling);
    EXPECT_EQ(stream.content, reply.content);
    EXPECT_EQ(stream.finish, "stop");
  }
  EXPECT_EQ(cache()["misses"], 1);
  EXPECT_EQ(cache()["hits"], 2 * kSamplings.size() - 1);
  // /v1/completions, two choices.
  const HttpReply completion =
      post(server, "/v1/completions",
           json{{"prompt", "Q: yes or no? A:"}, {"max_tokens", 40}, {"n", 2}, {"seed", 7},
                {"temperature", 1.0}, {"grammar", gbnf}}
               .dump());
  ASSERT_EQ(completion.status, 200) << completion.body;
  const json choices = completion.json()["choices"];
  ASSERT_EQ(choices.size(), 2u);
  for (const json& choice : choices) {
    EXPECT_EQ(choice["finish_reason"], "stop");
    EXPECT_TRUE(std::regex_match(choice["text"].get<std::string>(), sentence)) << choice;
  }
  // Errors: the syntax error's line and column, and the combinations refused.
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  struct Case {
    std::string extra;
    std::string param;
    std::string in_message;
  };
  const std::vector<Case> cases = {
      {R"("grammar":"root ::= answer\nanswer ::= \"yes\" | maybe")", "grammar",
       "grammar: line 2, column 20: undefined rule 'maybe'"},
      {R"("grammar":"root ::= [a-z")", "grammar",
       "grammar: line 1, column 10: unterminated character class"},
      {R"("grammar":"root ::= \"a\"","response_format":{"type":"json_object"})", "grammar",
       "cannot be combined with a response_format"},
      {R"("grammar":"root ::= \"a\"","logprobs":true)", "logprobs",
       "not supported together with a grammar"},
      {R"("grammar":"root ::= \"a\"","chat_template_kwargs":{"enable_thinking":true})",
       "chat_template_kwargs.enable_thinking", "a grammar reply is the grammar's text alone"},
  };
  for (const Case& c : cases) {
    const HttpReply reply = post(server, "/v1/chat/completions", chat + c.extra + "}");
    EXPECT_EQ(reply.status, 400) << c.extra;
    const json error = reply.json()["error"];
    EXPECT_EQ(error["param"], c.param) << reply.body;
    EXPECT_NE(error["message"].get<std::string>().find(c.in_message), std::string::npos)
        << reply.body;
  }
}

// The drafts are judged by the constrained sampler row by row: the same tokens as without --spec.
// (The end of the value is judged on the delivered tokens: a verify window's rows are all sampled,
// advancing the sampler's constraint, before its tokens are delivered; judging on that one cut
// replies short now and then, depending on how many drafts SpecGate chose.)
TEST(StructuredOutput, SpeculativeDecodingGivesThePlainTokens) {
  std::vector<std::pair<std::string, Reply>> plain;
  {
    ServeProcess server({"-t", "1"});
    for (const json* schema : {&kNested, &kTree})
      for (const std::string& sampling : kSamplings) {
        const std::string body = chat_body(json_schema_format(*schema), sampling);
        plain.push_back({body, whole(server, body)});
      }
  }
  std::vector<std::vector<std::string>> spec_args = {
      {"--spec", "both", "--draft-max", "3"},
      {"--spec", "suffix", "--draft-max", "4", "--spec-gate", "off"}};
  // Under AddressSanitizer (CI's clang build) the first setting only: each server here costs ~25 s
  // there, and the second repeats the same constrained-verify code with another drafter. The
  // release build runs both (scripts/test.sh, docs/ci.md).
#if defined(__SANITIZE_ADDRESS__)
  spec_args.resize(1);
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  spec_args.resize(1);
#endif
#endif
  for (const std::vector<std::string>& args : spec_args) {
    ServeProcess server([&] {
      std::vector<std::string> all = {"-t", "1"};
      all.insert(all.end(), args.begin(), args.end());
      return all;
    }());
    for (const auto& [body, expected] : plain) {
      SCOPED_TRACE(args[1] + " " + body);
      const Reply reply = whole(server, body);
      EXPECT_EQ(reply.content, expected.content);
      EXPECT_EQ(reply.finish, expected.finish);
    }
  }
}

}  // namespace
}  // namespace strata::serve::test
