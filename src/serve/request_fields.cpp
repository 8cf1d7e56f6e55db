#include "serve/request_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "text/utf8.h"

namespace strata::serve::request_fields {

[[noreturn]] void reject_body(std::string message, std::string param) {
  ApiError error;
  error.message = std::move(message);
  error.param = std::move(param);
  throw Rejection{std::move(error)};
}

std::string describe(const json& value) {
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text.size() <= 40) return json(text).dump(-1, ' ', false, json::error_handler_t::replace);
    return json(utf8_repair(std::string_view(text).substr(0, 40)) + "...")
        .dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (value.is_number() || value.is_boolean() || value.is_null()) return value.dump();
  return value.type_name();
}

std::string child(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}

std::string element(const std::string& path, size_t index) {
  return fmt::format("{}[{}]", path, index);
}

// The value of `key`, or nullptr when it is absent or null (OpenAI treats null as "not set").
const json* field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

const json& message_array(const json& body) {
  const json* messages = field(body, "messages");
  if (!messages) reject("messages", "required: a non-empty array of messages");
  if (!messages->is_array())
    reject("messages", "expected a non-empty array of messages, found {}", describe(*messages));
  if (messages->empty())
    reject("messages", "expected a non-empty array of messages, found an empty array");
  for (size_t i = 0; i < messages->size(); ++i)
    if (!(*messages)[i].is_object())
      reject(element("messages", i), "expected a message object, found {}", describe((*messages)[i]));
  return *messages;
}

std::optional<bool> read_bool(const json& object, const char* key, const std::string& path) {
  const json* value = field(object, key);
  if (!value) return std::nullopt;
  if (!value->is_boolean()) reject(path, "expected true or false, found {}", describe(*value));
  return value->get<bool>();
}

std::optional<int64_t> read_int(const json& object, const char* key, const std::string& path,
                                int64_t min, int64_t max) {
  const json* value = field(object, key);
  if (!value) return std::nullopt;
  if (!value->is_number_integer())
    reject(path, "expected an integer between {} and {}, found {}", min, max, describe(*value));
  if (value->is_number_unsigned() && value->get<uint64_t>() > uint64_t(max))
    reject(path, "expected an integer between {} and {}, found {}", min, max, describe(*value));
  const int64_t number = value->get<int64_t>();
  if (number < min || number > max)
    reject(path, "expected an integer between {} and {}, found {}", min, max, number);
  return number;
}

std::optional<double> read_number(const json& object, const char* key, const std::string& path,
                                  double min, double max) {
  const json* value = field(object, key);
  if (!value) return std::nullopt;
  if (!value->is_number())
    reject(path, "expected a number between {} and {}, found {}", min, max, describe(*value));
  const double number = value->get<double>();
  if (!std::isfinite(number) || number < min || number > max)
    reject(path, "expected a number between {} and {}, found {}", min, max, describe(*value));
  return number;
}

const std::string* read_string(const json& object, const char* key, const std::string& path) {
  const json* value = field(object, key);
  if (!value) return nullptr;
  if (!value->is_string()) reject(path, "expected a string, found {}", describe(*value));
  return &value->get_ref<const std::string&>();
}

std::string read_function_name(const json& function, const std::string& path) {
  const std::string* name = read_string(function, "name", child(path, "name"));
  if (!name) reject(child(path, "name"), "required: the function's name");
  // [a-zA-Z0-9_-]{1,64}
  const bool valid = !name->empty() && name->size() <= 64 &&
                     name->find_first_not_of(
                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                         "0123456789_-") == std::string::npos;
  if (!valid)
    reject(child(path, "name"), "expected 1 to 64 letters, digits, '_' or '-', found {}",
           describe(json(*name)));
  return *name;
}

// ---- JSON-level checks run before and after nlohmann's parser --------------------------------

namespace {

// Records the field being read while nlohmann's SAX parser walks the text, so that a syntax error
// can name where it happened ("messages[0].content"). Values are not stored.
class FieldTracker : public json::json_sax_t {
 public:
  bool null() override { return value_done(); }
  bool boolean(bool) override { return value_done(); }
  bool number_integer(number_integer_t) override { return value_done(); }
  bool number_unsigned(number_unsigned_t) override { return value_done(); }
  bool number_float(number_float_t, const string_t&) override { return value_done(); }
  bool string(string_t&) override { return value_done(); }
  bool binary(binary_t&) override { return value_done(); }
  bool start_object(std::size_t) override {
    frames_.push_back({false, 0, {}, false});
    return true;
  }
  bool key(string_t& key) override {
    frames_.back().key = key;
    frames_.back().has_key = true;
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return value_done();
  }
  bool start_array(std::size_t) override {
    frames_.push_back({true, 0, {}, false});
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return value_done();
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& error) override {
    // nlohmann's messages start with "[json.exception.parse_error.101] parse error at line 1, ...".
    const std::string what = error.what();
    const size_t cut = what.find("] ");
    error_ = cut == std::string::npos ? what : what.substr(cut + 2);
    return false;
  }

  std::string path() const {
    std::string out;
    for (const Frame& frame : frames_) {
      if (frame.is_array) {
        out = element(out, frame.index);
      } else if (frame.has_key) {
        out = child(out, utf8_repair(frame.key));
      }
    }
    return out;
  }
  const std::string& error() const { return error_; }
  // True once the top-level value was complete: an error after that is trailing data.
  bool value_complete() const { return value_complete_; }

 private:
  struct Frame {
    bool is_array;
    size_t index;
    std::string key;
    bool has_key;
  };
  bool value_done() {
    if (frames_.empty()) value_complete_ = true;
    if (!frames_.empty()) {
      if (frames_.back().is_array) {
        ++frames_.back().index;
      } else {
        frames_.back().has_key = false;
      }
    }
    return true;
  }
  std::vector<Frame> frames_;
  std::string error_;
  bool value_complete_ = false;
};

std::string where(const std::string& path) {
  return path.empty() ? std::string() : fmt::format(" (in {})", path);
}

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t first_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    char32_t cp;
    const size_t n = utf8_sequence_at(text, pos, cp);
    if (n == 0) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

// nlohmann parses arbitrarily deep input; a bound keeps a hostile body from costing more than
// its size. Counts [ and { outside strings.
void check_depth(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        reject_body(fmt::format("request body: JSON nested deeper than {} levels (at byte {})",
                                max_depth, i));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace

json parse_body(std::string_view body, int max_depth) {
  if (body.empty()) reject_body("request body is empty; expected a JSON object");
  if (const size_t bad = first_invalid_utf8(body); bad != std::string_view::npos) {
    FieldTracker tracker;
    json::sax_parse(body.substr(0, bad), &tracker, json::input_format_t::json, false);
    reject_body(
        fmt::format("request body is not valid UTF-8: ill-formed byte 0x{:02X} at byte {}{}",
                    static_cast<unsigned char>(body[bad]), bad, where(tracker.path())),
        tracker.path());
  }
  check_depth(body, max_depth);
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    // Strict, like json::parse: trailing data after the value is an error here too (a lenient
    // walk would find none and leave the message empty).
    FieldTracker tracker;
    json::sax_parse(body, &tracker, json::input_format_t::json, /*strict=*/true);
    const std::string what = tracker.error().empty() ? "the parser stopped" : tracker.error();
    if (tracker.value_complete())
      reject_body(
          fmt::format("request body is not valid JSON: unexpected data after the JSON "
                      "object ended (one object per request): {}",
                      what));
    reject_body(fmt::format("request body is not valid JSON{}: {}", where(tracker.path()), what),
                tracker.path());
  }
  if (!parsed.is_object())
    reject_body(fmt::format("request body: expected a JSON object, found {}", parsed.type_name()));
  return parsed;
}

}  // namespace strata::serve::request_fields
