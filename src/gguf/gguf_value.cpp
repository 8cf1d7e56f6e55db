// Names and human-readable renderings of GGUF metadata values.
#include <fmt/format.h>

#include "gguf/gguf.h"

namespace strata {

std::string_view gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8: return "u8";
    case GgufValueType::I8: return "i8";
    case GgufValueType::U16: return "u16";
    case GgufValueType::I16: return "i16";
    case GgufValueType::U32: return "u32";
    case GgufValueType::I32: return "i32";
    case GgufValueType::F32: return "f32";
    case GgufValueType::BOOL: return "bool";
    case GgufValueType::STRING: return "string";
    case GgufValueType::ARRAY: return "array";
    case GgufValueType::U64: return "u64";
    case GgufValueType::I64: return "i64";
    case GgufValueType::F64: return "f64";
  }
  return "invalid";
}

size_t GgufArray::size() const {
  switch (element_type) {
    case GgufValueType::F32:
    case GgufValueType::F64: return floats.size();
    case GgufValueType::STRING: return strings.size();
    default: return ints.size();
  }
}

std::string gguf_value_type_description(const GgufValue& value) {
  if (value.type != GgufValueType::ARRAY) return std::string(gguf_value_type_name(value.type));
  const GgufArray& array = std::get<GgufArray>(value.value);
  return fmt::format("array<{}>[{}]", gguf_value_type_name(array.element_type), array.size());
}

namespace {

// Strings are shown quoted with control characters escaped and long ones cut, so one value is
// one line of output whatever the file holds (chat templates are kilobytes of Jinja).
std::string quote(const std::string& text, size_t max_chars = 60) {
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < max_chars; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\'') out += "\\'";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += char(c);
  }
  out += "'";
  if (text.size() > max_chars) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

std::string int_element(GgufValueType type, int64_t value) {
  if (type == GgufValueType::U64) return fmt::format("{}", static_cast<uint64_t>(value));
  if (type == GgufValueType::BOOL) return value ? "true" : "false";
  return fmt::format("{}", value);
}

}  // namespace

std::string gguf_value_to_string(const GgufValue& value, size_t max_array_elements) {
  switch (value.type) {
    case GgufValueType::BOOL: return std::get<bool>(value.value) ? "true" : "false";
    case GgufValueType::STRING: return quote(std::get<std::string>(value.value));
    case GgufValueType::F32: return fmt::format("{}", static_cast<float>(std::get<double>(value.value)));
    case GgufValueType::F64: return fmt::format("{}", std::get<double>(value.value));
    case GgufValueType::ARRAY: break;
    default:
      if (const auto* u = std::get_if<uint64_t>(&value.value)) return fmt::format("{}", *u);
      return fmt::format("{}", std::get<int64_t>(value.value));
  }
  const GgufArray& array = std::get<GgufArray>(value.value);
  const size_t n = array.size();
  std::string out = "[";
  for (size_t i = 0; i < n && i < max_array_elements; ++i) {
    if (i > 0) out += ", ";
    switch (array.element_type) {
      case GgufValueType::F32: out += fmt::format("{}", static_cast<float>(array.floats[i])); break;
      case GgufValueType::F64: out += fmt::format("{}", array.floats[i]); break;
      case GgufValueType::STRING: out += quote(array.strings[i], 24); break;
      default: out += int_element(array.element_type, array.ints[i]); break;
    }
  }
  if (n > max_array_elements) out += ", ...";
  out += fmt::format("] ({} x {})", n, gguf_value_type_name(array.element_type));
  return out;
}

}  // namespace strata
