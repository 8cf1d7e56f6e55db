#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "grammar/pattern.h"

namespace strata::grammar {
namespace {

using ojson = nlohmann::ordered_json;
using B = GrammarBuilder;
using Sequence = B::Sequence;

std::string child(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}
std::string element(const std::string& path, size_t index) {
  return fmt::format("{}[{}]", path, index);
}

std::string describe(const ojson& value) {
  if (value.is_primitive()) {
    std::string text = value.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return text.size() <= 40 ? text : text.substr(0, 40) + "...";
  }
  return value.type_name();
}

[[noreturn]] void refuse(const std::string& path, const std::string& message) {
  throw SchemaError(path, path.empty() ? message : fmt::format("{}: {}", path, message));
}

// Keywords that only describe (ignored), and those that constrain a value but are not honoured
// (refused: ignoring them would let output through that the schema forbids).
const std::set<std::string, std::less<>> kAnnotations = {
    "title",      "description", "examples",  "default", "$schema",     "$id",     "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",   "definitions", "$anchor",
};
const std::set<std::string, std::less<>> kRefused = {
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "prefixItems",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
    "$dynamicRef",
    "$recursiveRef",
    "contentSchema",
};
const std::set<std::string, std::less<>> kObjectKeywords = {"properties", "required",
                                                            "additionalProperties"};
const std::set<std::string, std::less<>> kArrayKeywords = {"items", "minItems", "maxItems",
                                                           "uniqueItems"};
const std::set<std::string, std::less<>> kStringKeywords = {"minLength", "maxLength", "format",
                                                            "pattern"};
// The `format`s a string schema may carry (Compiler::formatted); any other is refused.
const std::set<std::string, std::less<>> kFormats = {"date", "time", "date-time", "uuid"};
const std::set<std::string, std::less<>> kTypes = {"object",  "array",   "string", "number",
                                                   "integer", "boolean", "null"};

int64_t read_bound(const ojson& schema, const char* key, const std::string& path,
                   int64_t fallback) {
  const auto it = schema.find(key);
  if (it == schema.end()) return fallback;
  if (!it->is_number_integer() || (it->is_number_integer() && it->get<int64_t>() < 0) ||
      (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(kMaxRepeat)))
    refuse(child(path, key), fmt::format("expected an integer between 0 and {}, found {}",
                                         kMaxRepeat, describe(*it)));
  const int64_t value = it->get<int64_t>();
  if (value > kMaxRepeat)
    refuse(child(path, key),
           fmt::format("expected an integer between 0 and {}, found {}", kMaxRepeat, value));
  return value;
}

// The keywords that bound a number; honoured on integer schemas (integer_range), refused on
// every other schema.
const std::set<std::string, std::less<>> kNumericBounds = {"minimum", "maximum", "exclusiveMinimum",
                                                           "exclusiveMaximum"};
// The largest magnitude the integer grammar writes (18 digits: it fits an int64).
constexpr int64_t kMaxInteger = 999'999'999'999'999'999;

bool is_integer_schema(const ojson& schema) {
  const auto type = schema.find("type");
  return type != schema.end() && *type == "integer";
}

// The integers an integer schema's bounds allow, [lo, hi] within ±kMaxInteger: minimum m gives
// ⌈m⌉, exclusiveMinimum e gives ⌊e⌋ + 1 (draft 6 on: a number), and the same downwards; a bound
// past ±kMaxInteger is clamped. Refuses a bound that is not a number and an empty range.
std::pair<int64_t, int64_t> integer_bounds(const ojson& schema, const std::string& path) {
  int64_t lo = -kMaxInteger, hi = kMaxInteger;
  auto bound = [&](const char* key, bool lower, bool exclusive) {
    const auto it = schema.find(key);
    if (it == schema.end()) return;
    if (!it->is_number())
      refuse(child(path, key), fmt::format("expected a number, found {}", describe(*it)));
    int64_t exact;
    if (it->is_number_integer()) {  // exact (a double holds only 53 bits), clamped
      const int64_t n = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(kMaxInteger)
                            ? kMaxInteger + 1
                            : std::clamp(it->get<int64_t>(), -kMaxInteger - 1, kMaxInteger + 1);
      exact = !exclusive ? n : lower ? n + 1 : n - 1;
    } else {
      const double v = it->get<double>();
      const double edge = lower ? (exclusive ? std::floor(v) + 1 : std::ceil(v))
                                : (exclusive ? std::ceil(v) - 1 : std::floor(v));
      // ±1e18 are doubles exactly; anything past them is as good as them.
      exact = int64_t(std::clamp(edge, -1e18, 1e18));
    }
    if (lower)
      lo = std::max(lo, exact);
    else
      hi = std::min(hi, exact);
  };
  bound("minimum", true, false);
  bound("exclusiveMinimum", true, true);
  bound("maximum", false, false);
  bound("exclusiveMaximum", false, true);
  if (lo > hi)
    refuse(child(path, schema.contains("minimum") ? "minimum" : "exclusiveMinimum"),
           fmt::format("no integer of at most 18 digits lies within the bounds (from {} to {})", lo,
                       hi));
  return {lo, hi};
}

// Alternatives spelling exactly the digit strings from `lo` to `hi`, both `n` digits long (leading
// zeros included; lo <= hi as strings), as runs of digit ranges: the common first digit, then
// lo's first digit with what may follow it, the digits strictly between with any digits after
// them, hi's first digit with what may follow it.
void digit_runs(const std::string& lo, const std::string& hi, Sequence prefix,
                std::vector<Sequence>& out) {
  const size_t n = lo.size();
  if (n == 0) {
    out.push_back(std::move(prefix));
    return;
  }
  auto with = [&](Sequence items, B::Item item) {
    items.push_back(item);
    return items;
  };
  if (lo[0] == hi[0]) {
    digit_runs(lo.substr(1), hi.substr(1), with(prefix, B::byte(uint8_t(lo[0]))), out);
    return;
  }
  const std::string rest_lo = lo.substr(1), rest_hi = hi.substr(1);
  const bool lo_from_zeros = rest_lo.find_first_not_of('0') == std::string::npos;
  const bool hi_to_nines = rest_hi.find_first_not_of('9') == std::string::npos;
  char full_first = lo[0], full_last = hi[0];
  if (!lo_from_zeros) {
    digit_runs(rest_lo, std::string(n - 1, '9'), with(prefix, B::byte(uint8_t(lo[0]))), out);
    ++full_first;
  }
  if (!hi_to_nines) --full_last;
  if (full_first <= full_last) {
    Sequence run = with(prefix, B::range(uint8_t(full_first), uint8_t(full_last)));
    for (size_t i = 1; i < n; ++i) run.push_back(B::range('0', '9'));
    out.push_back(std::move(run));
  }
  if (!hi_to_nines)
    digit_runs(std::string(n - 1, '0'), rest_hi, with(prefix, B::byte(uint8_t(hi[0]))), out);
}

// The decimal spellings (no leading zeros) of the integers from lo to hi, 0 <= lo <= hi, each
// after `prefix`: one digit_runs per length.
void natural_runs(int64_t lo, int64_t hi, const Sequence& prefix, std::vector<Sequence>& out) {
  int64_t first = 0, last = 9;  // the numbers of `digits` digits
  for (int digits = 1; digits <= 18 && first <= hi; ++digits) {
    const int64_t a = std::max(lo, first), b = std::min(hi, last);
    if (a <= b) digit_runs(std::to_string(a), std::to_string(b), prefix, out);
    first = last + 1;
    last = digits < 18 ? last * 10 + 9 : last;
  }
}

class Compiler {
 public:
  Compiler(B& builder, const ojson& root) : root_(root), builder_(builder) {}

  // The rule for `schema` (found at `path`).
  uint32_t value(const ojson& schema, const std::string& path);
  uint32_t any_object();

 private:
  uint32_t schema_object(const ojson& schema, const std::string& path);
  uint32_t typed(const std::string& type, const ojson& schema, const std::string& path);
  uint32_t object(const ojson& schema, const std::string& path);
  uint32_t array(const ojson& schema, const std::string& path);
  uint32_t string(const ojson& schema, const std::string& path);
  uint32_t ref(const ojson& target, const std::string& path);
  uint32_t literal(const ojson& value, const std::string& path);
  // The text (without quotes) of a string `format` in kFormats.
  uint32_t formatted(const std::string& format);
  uint32_t key_excluding(const std::vector<std::string>& names, const std::string& path);

  // Shared rules, made on first use.
  uint32_t ws();
  uint32_t plain_char();
  uint32_t string_char();
  uint32_t any_string();
  uint32_t number();
  uint32_t integer();
  // An integer schema: its minimum / maximum / exclusive* bounds (integer_bounds), if any.
  uint32_t integer(const ojson& schema, const std::string& path);
  uint32_t int_part();
  uint32_t any_value();
  uint32_t any_array();

  const ojson& root_;
  B& builder_;
  int depth_ = 0;
  std::map<std::string, uint32_t> refs_;     // JSON pointer -> rule
  std::map<std::string, uint32_t> formats_;  // string format -> the rule of its text
  std::optional<uint32_t> ws_, plain_char_, string_char_, any_string_, number_, integer_, int_part_,
      any_value_, any_object_, any_array_;
};

uint32_t Compiler::ws() {
  if (!ws_) {
    const uint32_t spaces = builder_.repeat("ws-indent", {B::byte(' ')}, 0, 20);
    ws_ = builder_.add("ws", {{}, {B::byte(' ')}, {B::byte('\n'), B::rule(spaces)}});
  }
  return *ws_;
}

// One character of a string other than '"', '\\' and controls, as well-formed UTF-8.
std::vector<std::pair<ByteSet, Sequence>> plain_char_forms() {
  ByteSet ascii;
  ascii.add_range(0x20, 0x7F);
  ascii.remove('"');
  ascii.remove('\\');
  return B::utf8_char_forms(ascii);
}

uint32_t Compiler::plain_char() {
  if (!plain_char_) {
    std::vector<Sequence> alternatives;
    for (const auto& [first, rest] : plain_char_forms()) {
      Sequence form = {B::bytes(first)};
      form.insert(form.end(), rest.begin(), rest.end());
      alternatives.push_back(std::move(form));
    }
    plain_char_ = builder_.add("plain-char", alternatives);
  }
  return *plain_char_;
}

// A string character: plain, or an escape; \u escapes of surrogates only as a high-low pair.
uint32_t Compiler::string_char() {
  if (!string_char_) {
    ByteSet hex;
    hex.add_range('0', '9');
    hex.add_range('a', 'f');
    hex.add_range('A', 'F');
    ByteSet not_d = hex;  // first hex digit of a non-surrogate
    not_d.remove('d');
    not_d.remove('D');
    ByteSet simple;
    for (char c : std::string_view("\"\\/bfnrt")) simple.add(uint8_t(c));
    ByteSet high, low;
    for (char c : std::string_view("89abAB")) high.add(uint8_t(c));
    for (char c : std::string_view("cdefCDEF")) low.add(uint8_t(c));
    ByteSet d;
    d.add('d');
    d.add('D');
    const B::Item h = B::bytes(hex);
    const uint32_t escape =
        builder_.add("escape", {{B::bytes(simple)},
                                {B::byte('u'), B::bytes(not_d), h, h, h},
                                {B::byte('u'), B::bytes(d), B::range('0', '7'), h, h},
                                {B::byte('u'), B::bytes(d), B::bytes(high), h, h, B::byte('\\'),
                                 B::byte('u'), B::bytes(d), B::bytes(low), h, h}});
    string_char_ =
        builder_.add("char", {{B::rule(plain_char())}, {B::byte('\\'), B::rule(escape)}});
  }
  return *string_char_;
}

uint32_t Compiler::any_string() {
  if (!any_string_) {
    const uint32_t chars = builder_.repeat("chars", {B::rule(string_char())}, 0, -1);
    any_string_ = builder_.add("string", {{B::byte('"'), B::rule(chars), B::byte('"')}});
  }
  return *any_string_;
}

uint32_t Compiler::int_part() {
  if (!int_part_) {
    // At most 18 digits: every such integer fits an int64 (nlohmann, and so validators built on
    // it, parse a longer one as a float, which is no "integer").
    const uint32_t digits = builder_.repeat("int-digits", {B::range('0', '9')}, 0, 17);
    int_part_ = builder_.add("int", {{B::byte('0')}, {B::range('1', '9'), B::rule(digits)}});
  }
  return *int_part_;
}

uint32_t Compiler::integer() {
  if (!integer_)
    integer_ =
        builder_.add("integer", {{B::rule(int_part())}, {B::byte('-'), B::rule(int_part())}});
  return *integer_;
}

// The string formats as grammars of their text (RFC 3339's full-date, full-time and date-time,
// RFC 4122's hyphenated UUID), each a subset of what validators accept: uppercase "T" and "Z",
// days 29-31 only in the months that always have them (no February 29: no leap-year logic),
// seconds up to 59 (no leap second), lowercase hex digits.
uint32_t Compiler::formatted(const std::string& format) {
  if (const auto it = formats_.find(format); it != formats_.end()) return it->second;
  const B::Item digit = B::range('0', '9');
  auto two = [&](char first_lo, char first_hi, char second_lo, char second_hi) {
    return Sequence{B::range(uint8_t(first_lo), uint8_t(first_hi)),
                    B::range(uint8_t(second_lo), uint8_t(second_hi))};
  };
  uint32_t rule = 0;
  if (format == "date") {
    const uint32_t day31 =
        builder_.add("format-day31",
                     {two('0', '0', '1', '9'), two('1', '2', '0', '9'), two('3', '3', '0', '1')});
    const uint32_t day30 = builder_.add(
        "format-day30", {two('0', '0', '1', '9'), two('1', '2', '0', '9'), {B::literal("30")}});
    const uint32_t day28 =
        builder_.add("format-day28",
                     {two('0', '0', '1', '9'), two('1', '1', '0', '9'), two('2', '2', '0', '8')});
    std::vector<Sequence> month_days;
    for (const char* month : {"01", "03", "05", "07", "08", "10", "12"})
      month_days.push_back({B::literal(month), B::byte('-'), B::rule(day31)});
    for (const char* month : {"04", "06", "09", "11"})
      month_days.push_back({B::literal(month), B::byte('-'), B::rule(day30)});
    month_days.push_back({B::literal("02"), B::byte('-'), B::rule(day28)});
    const uint32_t month_day = builder_.add("format-month-day", month_days);
    rule = builder_.add("format-date",
                        {{digit, digit, digit, digit, B::byte('-'), B::rule(month_day)}});
  }
  if (format == "time") {
    const uint32_t hour =
        builder_.add("format-hour", {two('0', '1', '0', '9'), two('2', '2', '0', '3')});
    const Sequence minute = two('0', '5', '0', '9');
    const uint32_t fraction_digits = builder_.repeat("format-fraction", {digit}, 1, 9);
    const uint32_t fraction =
        builder_.add("format-secfrac", {{}, {B::byte('.'), B::rule(fraction_digits)}});
    ByteSet sign;
    sign.add('+');
    sign.add('-');
    Sequence numeric_offset = {B::bytes(sign), B::rule(hour), B::byte(':')};
    numeric_offset.insert(numeric_offset.end(), minute.begin(), minute.end());
    const uint32_t offset = builder_.add("format-offset", {{B::byte('Z')}, numeric_offset});
    Sequence time = {B::rule(hour), B::byte(':')};
    time.insert(time.end(), minute.begin(), minute.end());
    time.push_back(B::byte(':'));
    time.insert(time.end(), minute.begin(), minute.end());  // seconds: 00-59
    time.push_back(B::rule(fraction));
    time.push_back(B::rule(offset));
    rule = builder_.add("format-time", {time});
  }
  if (format == "date-time") {
    const uint32_t date = formatted("date"), time = formatted("time");
    rule = builder_.add("format-date-time", {{B::rule(date), B::byte('T'), B::rule(time)}});
  }
  if (format == "uuid") {
    ByteSet hex;
    hex.add_range('0', '9');
    hex.add_range('a', 'f');
    Sequence uuid;
    for (const int group : {8, 4, 4, 4, 12}) {
      if (!uuid.empty()) uuid.push_back(B::byte('-'));
      for (int i = 0; i < group; ++i) uuid.push_back(B::bytes(hex));
    }
    rule = builder_.add("format-uuid", {uuid});
  }
  formats_.emplace(format, rule);
  return rule;
}

uint32_t Compiler::integer(const ojson& schema, const std::string& path) {
  const bool bounded =
      std::any_of(schema.items().begin(), schema.items().end(),
                  [](const auto& item) { return kNumericBounds.count(item.key()); });
  if (!bounded) return integer();
  const auto [lo, hi] = integer_bounds(schema, path);
  std::vector<Sequence> alternatives;
  if (hi >= 0) natural_runs(std::max<int64_t>(lo, 0), hi, {}, alternatives);
  if (lo < 0) natural_runs(hi < 0 ? -hi : 1, -lo, {B::byte('-')}, alternatives);
  return builder_.add(path.empty() ? "integer-range" : path, alternatives);
}

uint32_t Compiler::number() {
  if (!number_) {
    const uint32_t frac_digits = builder_.repeat("frac-digits", {B::range('0', '9')}, 1, 20);
    const uint32_t frac = builder_.add("frac", {{}, {B::byte('.'), B::rule(frac_digits)}});
    // Two exponent digits: with 18 integer digits the value stays below 1e118, far inside a
    // double (1e8888 is valid JSON, but parsers refuse it or turn it into infinity).
    const uint32_t exp_digits = builder_.repeat("exp-digits", {B::range('0', '9')}, 1, 2);
    ByteSet e, sign;
    e.add('e');
    e.add('E');
    sign.add('+');
    sign.add('-');
    const uint32_t exp = builder_.add("exp", {{},
                                              {B::bytes(e), B::rule(exp_digits)},
                                              {B::bytes(e), B::bytes(sign), B::rule(exp_digits)}});
    number_ = builder_.add("number", {{B::rule(integer()), B::rule(frac), B::rule(exp)}});
  }
  return *number_;
}

uint32_t Compiler::any_value() {
  if (!any_value_) {
    any_value_ = builder_.declare("value");
    const uint32_t object = any_object();
    const uint32_t array = any_array();
    builder_.define(*any_value_, {{B::rule(object)},
                                  {B::rule(array)},
                                  {B::rule(any_string())},
                                  {B::rule(number())},
                                  {B::literal("true")},
                                  {B::literal("false")},
                                  {B::literal("null")}});
  }
  return *any_value_;
}

uint32_t Compiler::any_object() {
  if (!any_object_) {
    any_object_ = builder_.declare("object");
    if (!any_value_) any_value();  // defines value, which refers to this rule
    const Sequence member = {B::rule(any_string()), B::byte(':'), B::rule(ws()),
                             B::rule(*any_value_)};
    const uint32_t members =
        builder_.separated("members", member, {B::byte(','), B::rule(ws())}, 1, -1);
    builder_.define(*any_object_,
                    {{B::byte('{'), B::rule(ws()), B::byte('}')},
                     {B::byte('{'), B::rule(ws()), B::rule(members), B::rule(ws()), B::byte('}')}});
  }
  return *any_object_;
}

uint32_t Compiler::any_array() {
  if (!any_array_) {
    any_array_ = builder_.declare("array");
    const uint32_t items = builder_.separated("elements", {B::rule(any_value())},
                                              {B::byte(','), B::rule(ws())}, 1, -1);
    builder_.define(*any_array_,
                    {{B::byte('['), B::rule(ws()), B::byte(']')},
                     {B::byte('['), B::rule(ws()), B::rule(items), B::rule(ws()), B::byte(']')}});
  }
  return *any_array_;
}

uint32_t Compiler::literal(const ojson& value, const std::string& path) {
  return builder_.add(path.empty() ? "literal" : path,
                      {{B::literal(value.dump(-1, ' ', false, ojson::error_handler_t::strict))}});
}

uint32_t Compiler::value(const ojson& schema, const std::string& path) {
  if (++depth_ > 200) refuse(path, "schema nested more than 200 levels deep");
  if (builder_.n_elements() > kMaxGrammarElements)
    refuse(path,
           fmt::format("schema too large (its grammar passed {} elements)", kMaxGrammarElements));
  uint32_t rule;
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) refuse(path, "the schema false accepts no value");
    rule = any_value();
  } else if (!schema.is_object()) {
    refuse(path,
           fmt::format("expected a schema (an object or a boolean), found {}", describe(schema)));
  } else {
    rule = schema_object(schema, path);
  }
  --depth_;
  return rule;
}

uint32_t Compiler::schema_object(const ojson& schema, const std::string& path) {
  for (const auto& [key, setting] : schema.items()) {
    if (kNumericBounds.count(key) && !is_integer_schema(schema))
      refuse(child(path, key),
             fmt::format("the keyword \"{}\" is not supported except on integer schemas "
                         "(\"type\": \"integer\")",
                         key));
    if (kRefused.count(key) && !kNumericBounds.count(key))
      refuse(child(path, key), fmt::format("the keyword \"{}\" is not supported", key));
    if (key == "uniqueItems" && setting != false)
      refuse(child(path, key), "only uniqueItems: false is supported");
    if (key == "items" && !setting.is_object() && !setting.is_boolean())
      refuse(child(path, key),
             fmt::format("expected a schema, found {} (tuple items are not supported)",
                         describe(setting)));
  }
  // Keywords that combine with nothing but annotations.
  for (const char* combinator : {"$ref", "anyOf", "oneOf"}) {
    if (!schema.contains(combinator)) continue;
    for (const auto& [key, setting] : schema.items())
      if (key != combinator && !kAnnotations.count(key) &&
          (kObjectKeywords.count(key) || kArrayKeywords.count(key) || kStringKeywords.count(key) ||
           key == "type" || key == "enum" || key == "const" || key == "$ref" || key == "anyOf" ||
           key == "oneOf"))
        refuse(
            child(path, key),
            fmt::format("\"{}\" alongside \"{}\" is not supported (move it into the {})", key,
                        combinator,
                        combinator == std::string("$ref") ? "referenced schema" : "alternatives"));
  }
  if (const auto it = schema.find("$ref"); it != schema.end()) {
    const std::string where = child(path, "$ref");
    if (!it->is_string()) refuse(where, fmt::format("expected a string, found {}", describe(*it)));
    const std::string& target = it->get_ref<const std::string&>();
    if (target != "#" && target.rfind("#/", 0) != 0)
      refuse(where, fmt::format("only references inside the schema (\"#\", \"#/$defs/...\") are "
                                "supported, found {}",
                                describe(*it)));
    const ojson* resolved = nullptr;
    try {
      resolved = &root_.at(ojson::json_pointer(target.substr(1)));
    } catch (const ojson::exception&) {
      refuse(where, fmt::format("{} names no location in the schema", describe(*it)));
    }
    if (const auto found = refs_.find(target); found != refs_.end()) return found->second;
    const uint32_t id = builder_.declare(target);
    refs_.emplace(target, id);
    std::string target_path = target.size() > 2 ? target.substr(2) : std::string();
    for (char& c : target_path)
      if (c == '/') c = '.';
    builder_.define(id, {{B::rule(value(*resolved, target_path))}});
    return id;
  }
  if (const auto it = schema.find("const"); it != schema.end())
    return literal(*it, child(path, "const"));
  if (const auto it = schema.find("enum"); it != schema.end()) {
    const std::string where = child(path, "enum");
    if (!it->is_array() || it->empty())
      refuse(where, fmt::format("expected a non-empty array, found {}", describe(*it)));
    std::vector<Sequence> alternatives;
    for (const ojson& option : *it)
      alternatives.push_back(
          {B::literal(option.dump(-1, ' ', false, ojson::error_handler_t::strict))});
    return builder_.add(where, alternatives);
  }
  for (const char* combinator : {"anyOf", "oneOf"}) {
    const auto it = schema.find(combinator);
    if (it == schema.end()) continue;
    const std::string where = child(path, combinator);
    if (!it->is_array() || it->empty())
      refuse(where, fmt::format("expected a non-empty array of schemas, found {}", describe(*it)));
    std::vector<Sequence> alternatives;
    for (size_t i = 0; i < it->size(); ++i)
      alternatives.push_back({B::rule(value((*it)[i], element(where, i)))});
    return builder_.add(where, alternatives);
  }
  std::vector<std::string> types;
  if (const auto it = schema.find("type"); it != schema.end()) {
    const std::string where = child(path, "type");
    auto add_type = [&](const ojson& name, const std::string& at) {
      if (!name.is_string() || !kTypes.count(name.get_ref<const std::string&>()))
        refuse(at, fmt::format("expected one of object, array, string, number, integer, boolean, "
                               "null, found {}",
                               describe(name)));
      types.push_back(name.get<std::string>());
    };
    if (it->is_array()) {
      if (it->empty()) refuse(where, "expected a type or a non-empty array of types, found []");
      for (size_t i = 0; i < it->size(); ++i) add_type((*it)[i], element(where, i));
    } else {
      add_type(*it, where);
    }
  } else {
    // No type: what the keywords imply, else any value (the keywords of other types do not apply).
    for (const auto& [key, setting] : schema.items()) {
      const char* implied = kObjectKeywords.count(key)   ? "object"
                            : kArrayKeywords.count(key)  ? "array"
                            : kStringKeywords.count(key) ? "string"
                                                         : nullptr;
      if (implied && std::find(types.begin(), types.end(), implied) == types.end())
        types.push_back(implied);
    }
    if (types.empty()) return any_value();
  }
  if (types.size() == 1) return typed(types[0], schema, path);
  std::vector<Sequence> alternatives;
  for (const std::string& type : types)
    alternatives.push_back({B::rule(typed(type, schema, path))});
  return builder_.add(child(path, "type"), alternatives);
}

uint32_t Compiler::typed(const std::string& type, const ojson& schema, const std::string& path) {
  if (type == "object") return object(schema, path);
  if (type == "array") return array(schema, path);
  if (type == "string") return string(schema, path);
  if (type == "number") return number();
  if (type == "integer") return integer(schema, path);
  if (type == "boolean")
    return builder_.add("boolean", {{B::literal("true")}, {B::literal("false")}});
  return builder_.add("null", {{B::literal("null")}});
}

uint32_t Compiler::string(const ojson& schema, const std::string& path) {
  if (const auto it = schema.find("format"); it != schema.end()) {
    const std::string where = child(path, "format");
    if (!it->is_string() || !kFormats.count(it->get_ref<const std::string&>()))
      refuse(where, fmt::format("the format {} is not supported (supported: date, time, "
                                "date-time, uuid)",
                                describe(*it)));
    for (const char* other : {"minLength", "maxLength", "pattern"})
      if (schema.contains(other))
        refuse(child(path, other),
               fmt::format("{} together with a format is not supported", other));
    return builder_.add(where,
                        {{B::byte('"'), B::rule(formatted(it->get<std::string>())), B::byte('"')}});
  }
  const int64_t min = read_bound(schema, "minLength", path, 0);
  const int64_t max = read_bound(schema, "maxLength", path, -1);
  if (max >= 0 && min > max)
    refuse(child(path, "minLength"), fmt::format("minLength {} exceeds maxLength {}", min, max));
  if (const auto it = schema.find("pattern"); it != schema.end()) {
    const std::string where = child(path, "pattern");
    if (!it->is_string())
      refuse(where,
             fmt::format("expected a string (a regular expression), found {}", describe(*it)));
    uint32_t text;
    try {
      text = add_pattern_rule(builder_, it->get_ref<const std::string&>(), min, max, where);
    } catch (const PatternError& error) {
      refuse(where, error.what());
    }
    if (builder_.n_elements() > kMaxGrammarElements)
      refuse(where,
             fmt::format("schema too large (its grammar passed {} elements)", kMaxGrammarElements));
    return builder_.add(path.empty() ? "string" : path,
                        {{B::byte('"'), B::rule(text), B::byte('"')}});
  }
  if (min == 0 && max < 0) return any_string();
  const uint32_t chars = builder_.repeat(child(path, "chars"), {B::rule(string_char())}, min, max);
  return builder_.add(path.empty() ? "string" : path,
                      {{B::byte('"'), B::rule(chars), B::byte('"')}});
}

uint32_t Compiler::array(const ojson& schema, const std::string& path) {
  const int64_t min = read_bound(schema, "minItems", path, 0);
  const int64_t max = read_bound(schema, "maxItems", path, -1);
  if (max >= 0 && min > max)
    refuse(child(path, "minItems"), fmt::format("minItems {} exceeds maxItems {}", min, max));
  const auto it = schema.find("items");
  const uint32_t item = it == schema.end() ? any_value() : value(*it, child(path, "items"));
  const std::string name = path.empty() ? "array" : path;
  const Sequence empty = {B::byte('['), B::rule(ws()), B::byte(']')};
  if (max == 0) return builder_.add(name, {empty});
  const uint32_t list =
      builder_.separated(child(name, "items"), {B::rule(item)}, {B::byte(','), B::rule(ws())},
                         std::max<int64_t>(min, 1), max);
  const Sequence full = {B::byte('['), B::rule(ws()), B::rule(list), B::rule(ws()), B::byte(']')};
  if (min == 0) return builder_.add(name, {empty, full});
  return builder_.add(name, {full});
}

uint32_t Compiler::object(const ojson& schema, const std::string& path) {
  struct Property {
    std::string name;
    uint32_t rule;
    bool required;
  };
  std::vector<Property> properties;
  const auto props = schema.find("properties");
  if (props != schema.end()) {
    if (!props->is_object())
      refuse(child(path, "properties"),
             fmt::format("expected an object, found {}", describe(*props)));
    for (const auto& [name, sub] : props->items())
      properties.push_back({name, value(sub, child(child(path, "properties"), name)), false});
  }
  // Extra keys: additionalProperties false / absent with properties: none; true / absent without
  // properties: any value; a schema: its values.
  std::optional<uint32_t> extra;
  const auto additional = schema.find("additionalProperties");
  if (additional == schema.end()) {
    if (props == schema.end()) extra = any_value();
  } else if (additional->is_boolean()) {
    if (additional->get<bool>()) extra = any_value();
  } else {
    extra = value(*additional, child(path, "additionalProperties"));
  }
  if (const auto required = schema.find("required"); required != schema.end()) {
    const std::string where = child(path, "required");
    if (!required->is_array())
      refuse(where,
             fmt::format("expected an array of property names, found {}", describe(*required)));
    for (size_t i = 0; i < required->size(); ++i) {
      const ojson& name = (*required)[i];
      if (!name.is_string())
        refuse(element(where, i),
               fmt::format("expected a property name, found {}", describe(name)));
      auto found = std::find_if(properties.begin(), properties.end(), [&](const Property& p) {
        return p.name == name.get_ref<const std::string&>();
      });
      if (found != properties.end()) {
        found->required = true;
      } else if (extra) {
        properties.push_back({name.get<std::string>(), *extra, true});
      } else {
        refuse(element(where, i),
               fmt::format("{} is required but additionalProperties forbids it (it is not in "
                           "properties)",
                           describe(name)));
      }
    }
  }
  const std::string name = path.empty() ? "object" : path;
  const uint32_t space = ws();
  const Sequence comma = {B::byte(','), B::rule(space)};
  // The extra members after the declared ones: after (something came before) and first.
  std::vector<Sequence> after_alts = {{}}, first_alts = {{}};
  if (extra) {
    std::vector<std::string> names;
    for (const Property& p : properties) names.push_back(p.name);
    const uint32_t key = names.empty() ? any_string() : key_excluding(names, name);
    const Sequence member = {B::rule(key), B::byte(':'), B::rule(space), B::rule(*extra)};
    Sequence more = comma;
    more.insert(more.end(), member.begin(), member.end());
    const uint32_t after = builder_.repeat(child(name, "extra"), more, 0, -1);
    after_alts = {{B::rule(after)}};
    Sequence first = member;
    first.push_back(B::rule(after));
    first_alts = {{}, first};
  }
  // rest_i: members from property i on, something already written (so each starts with a comma);
  // first_i: the same with nothing written yet.
  uint32_t rest = builder_.add(child(name, "rest"), after_alts);
  uint32_t first = builder_.add(child(name, "first"), first_alts);
  for (size_t i = properties.size(); i-- > 0;) {
    const Property& p = properties[i];
    const Sequence member = {
        B::literal(ojson(p.name).dump(-1, ' ', false, ojson::error_handler_t::strict)),
        B::byte(':'), B::rule(space), B::rule(p.rule)};
    Sequence with_comma = comma;
    with_comma.insert(with_comma.end(), member.begin(), member.end());
    with_comma.push_back(B::rule(rest));
    Sequence leading = member;
    leading.push_back(B::rule(rest));
    std::vector<Sequence> rest_alts = {with_comma}, first_alts_i = {leading};
    if (!p.required) {
      rest_alts.push_back({B::rule(rest)});
      first_alts_i.push_back({B::rule(first)});
    }
    const std::string at = child(child(name, "properties"), p.name);
    const uint32_t new_rest = builder_.add(at + "-rest", rest_alts);
    first = builder_.add(at + "-first", first_alts_i);
    rest = new_rest;
  }
  return builder_.add(
      name, {{B::byte('{'), B::rule(space), B::rule(first), B::rule(space), B::byte('}')}});
}

// A key (with its quotes) that is none of `names`: a trie over the names' bytes, leaving it at
// a character boundary into any plain characters. No escapes, so no other spelling of a name.
uint32_t Compiler::key_excluding(const std::vector<std::string>& names, const std::string& path) {
  struct Node {
    std::map<uint8_t, size_t> children;
    bool terminal = false;
    int pending = 0;  // continuation bytes left in the current character
  };
  std::vector<Node> nodes(1);
  for (const std::string& name : names) {
    const std::string encoded = ojson(name).dump(-1, ' ', false, ojson::error_handler_t::replace);
    const std::string_view content = std::string_view(encoded).substr(1, encoded.size() - 2);
    if (content.find('\\') != std::string_view::npos) continue;  // never spelled without escapes
    size_t at = 0;
    for (char c : content) {
      const uint8_t b = uint8_t(c);
      const int pending = nodes[at].pending > 0 ? nodes[at].pending - 1
                          : b < 0x80            ? 0
                          : b >= 0xF0           ? 3
                          : b >= 0xE0           ? 2
                                                : 1;
      const auto found = nodes[at].children.find(b);
      size_t next;
      if (found == nodes[at].children.end()) {
        next = nodes.size();
        nodes.push_back({});
        nodes.back().pending = pending;
        nodes[at].children.emplace(b, next);
      } else {
        next = found->second;
      }
      at = next;
    }
    nodes[at].terminal = true;
  }
  const uint32_t chars = builder_.repeat(child(path, "key-chars"), {B::rule(plain_char())}, 0, -1);
  const uint32_t free_rest =
      builder_.add(child(path, "key-free"), {{B::rule(chars), B::byte('"')}});
  const std::vector<std::pair<ByteSet, Sequence>> char_forms = plain_char_forms();
  std::vector<uint32_t> rules(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i)
    rules[i] = builder_.declare(fmt::format("{}-key{}", path, i));
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = nodes[i];
    std::vector<Sequence> alternatives;
    for (const auto& [b, next] : node.children)
      alternatives.push_back({B::byte(b), B::rule(rules[next])});
    if (node.pending == 0) {
      for (const auto& [first, rest] : char_forms) {
        ByteSet leave = first;
        for (const auto& [b, next] : node.children) leave.remove(b);
        if (leave == ByteSet()) continue;
        Sequence alternative = {B::bytes(leave)};
        alternative.insert(alternative.end(), rest.begin(), rest.end());
        alternative.push_back(B::rule(free_rest));
        alternatives.push_back(std::move(alternative));
      }
      if (!node.terminal) alternatives.push_back({B::byte('"')});
    }
    builder_.define(rules[i], alternatives);
  }
  return builder_.add(child(path, "key"), {{B::byte('"'), B::rule(rules[0])}});
}

}  // namespace

bool is_annotation(std::string_view keyword) {
  return kAnnotations.count(keyword) > 0;
}

Grammar finish_checked(GrammarBuilder& builder, uint32_t root) {
  Grammar grammar = builder.finish(root);
  if (const int64_t rule = grammar.find_left_recursion(); rule >= 0) {
    const std::string& name = grammar.rule_names[size_t(rule)];
    refuse(name.rfind("#", 0) == 0 ? "$ref" : name,
           fmt::format("the schema refers to itself ({}) before any value is written (left "
                       "recursion), so no finite value matches it",
                       name));
  }
  return grammar;
}

struct SchemaRules::Impl {
  Impl(GrammarBuilder& builder, const nlohmann::ordered_json& document)
      : compiler(builder, document) {}
  Compiler compiler;
};

SchemaRules::SchemaRules(GrammarBuilder& builder, const nlohmann::ordered_json& document)
    : impl_(std::make_unique<Impl>(builder, document)) {}
SchemaRules::~SchemaRules() = default;

uint32_t SchemaRules::value(const nlohmann::ordered_json& schema, const std::string& path) {
  return impl_->compiler.value(schema, path);
}
uint32_t SchemaRules::any_object() {
  return impl_->compiler.any_object();
}

Grammar compile_json_schema(const nlohmann::ordered_json& schema) {
  GrammarBuilder builder;
  SchemaRules rules(builder, schema);
  const uint32_t value = rules.value(schema, "");
  return finish_checked(builder, value);
}

Grammar json_object_grammar() {
  const nlohmann::ordered_json empty = nlohmann::ordered_json::object();
  GrammarBuilder builder;
  SchemaRules rules(builder, empty);
  return finish_checked(builder, rules.any_object());
}

}  // namespace strata::grammar
