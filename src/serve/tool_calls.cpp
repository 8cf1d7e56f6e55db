#include "serve/tool_calls.h"

#include <nlohmann/json.hpp>

namespace strata::serve {
namespace {

using OrderedJson = nlohmann::ordered_json;

bool is_blank(std::string_view text) {
  return text.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

std::string_view trim(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

std::string_view trim_end(std::string_view text) {
  const size_t last = text.find_last_not_of(" \t\r\n");
  return last == std::string_view::npos ? std::string_view{} : text.substr(0, last + 1);
}

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

bool consume(std::string_view& text, std::string_view token) {
  if (!text.starts_with(token)) return false;
  text.remove_prefix(token.size());
  return true;
}

void skip_space(std::string_view& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  text.remove_prefix(first == std::string_view::npos ? text.size() : first);
}

// The JSON type a parameter's schema names ("string", "integer", ...), "" when there is none.
std::string schema_type(const OrderedJson& tool, std::string_view parameter) {
  const OrderedJson* function = tool.contains("function") ? &tool["function"] : nullptr;
  if (!function || !function->is_object() || !function->contains("parameters")) return {};
  const OrderedJson& properties = (*function)["parameters"].value("properties", OrderedJson());
  if (!properties.is_object() || !properties.contains(std::string(parameter))) return {};
  const OrderedJson& type = properties[std::string(parameter)].value("type", OrderedJson());
  if (type.is_string()) return type.get<std::string>();
  // ["integer", "null"]: the first non-null type.
  if (type.is_array())
    for (const OrderedJson& t : type)
      if (t.is_string() && t != "null") return t.get<std::string>();
  return {};
}

}  // namespace

ToolCallParser::ToolCallParser(ToolCallFormat format, std::span<const std::string> tools,
                               std::string_view prefix)
    : format_(format), tools_(tools.begin(), tools.end()) {
  if (prefix.starts_with(kToolCallOpen)) {
    inside_ = true;
    pending_ = std::string(prefix.substr(kToolCallOpen.size()));
  } else {
    pending_ = std::string(prefix);
  }
}

std::vector<ReplyPiece> ToolCallParser::push(std::string_view text) {
  std::vector<ReplyPiece> out;
  pending_ += text;
  drain(out, /*at_end=*/false);
  return out;
}

std::vector<ReplyPiece> ToolCallParser::finish() {
  std::vector<ReplyPiece> out;
  drain(out, /*at_end=*/true);
  if (inside_) {  // never closed: the block as generated
    emit_content(out, separator_ + std::string(kToolCallOpen) + pending_);
  } else {
    emit_content(out, std::move(pending_));
  }
  pending_.clear();
  inside_ = false;
  return out;
}

void ToolCallParser::emit_content(std::vector<ReplyPiece>& out, std::string text) {
  if (text.empty() || (calls_found_ > 0 && is_blank(text))) return;
  if (!out.empty() && !out.back().call) {
    out.back().content += text;
  } else {
    out.push_back({std::move(text), std::nullopt});
  }
}

void ToolCallParser::drain(std::vector<ReplyPiece>& out, bool at_end) {
  while (true) {
    if (!inside_) {
      const size_t open = pending_.find(kToolCallOpen);
      if (open == std::string::npos) {
        // Hold back what may be the start of a tag and the whitespace before it (the template's
        // separator between content and a call, dropped if a call follows).
        size_t keep = 0;
        if (!at_end) {
          const size_t partial = partial_tag_suffix(pending_, kToolCallOpen);
          const std::string_view before =
              std::string_view(pending_).substr(0, pending_.size() - partial);
          keep = partial + (before.size() - trim_end(before).size());
        }
        emit_content(out, pending_.substr(0, pending_.size() - keep));
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      const std::string_view before = trim_end(std::string_view(pending_).substr(0, open));
      separator_ = pending_.substr(before.size(), open - before.size());
      emit_content(out, std::string(before));
      pending_.erase(0, open + kToolCallOpen.size());
      inside_ = true;
    }
    const size_t close = pending_.find(kToolCallClose);
    if (close == std::string::npos) return;
    const std::string body = pending_.substr(0, close);
    pending_.erase(0, close + kToolCallClose.size());
    inside_ = false;
    if (std::optional<ParsedToolCall> call = parse_block(body)) {
      ++calls_found_;
      out.push_back({{}, std::move(call)});
    } else {
      emit_content(out,
                   separator_ + std::string(kToolCallOpen) + body + std::string(kToolCallClose));
    }
  }
}

std::optional<ParsedToolCall> ToolCallParser::parse_block(std::string_view body) const {
  try {
    return format_ == ToolCallFormat::Hermes ? parse_hermes(body) : parse_xml(body);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::optional<ParsedToolCall> ToolCallParser::parse_hermes(std::string_view body) const {
  const OrderedJson call = OrderedJson::parse(trim(body), nullptr, /*allow_exceptions=*/false);
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string() ||
      call["name"].get_ref<const std::string&>().empty())
    return std::nullopt;
  ParsedToolCall out;
  out.name = call["name"].get<std::string>();
  const OrderedJson arguments = call.value("arguments", OrderedJson::object());
  if (arguments.is_object()) {
    out.arguments = arguments.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  } else if (arguments.is_string()) {  // some models quote the object
    const OrderedJson inner = OrderedJson::parse(arguments.get<std::string>(), nullptr, false);
    if (!inner.is_object()) return std::nullopt;
    out.arguments = inner.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  } else {
    return std::nullopt;
  }
  return out;
}

std::optional<ParsedToolCall> ToolCallParser::parse_xml(std::string_view body) const {
  std::string_view text = trim(body);
  if (!consume(text, "<function=")) return std::nullopt;
  const size_t name_end = text.find('>');
  if (name_end == std::string_view::npos || name_end == 0) return std::nullopt;
  ParsedToolCall out;
  out.name = std::string(trim(text.substr(0, name_end)));
  if (out.name.empty() || out.name.find_first_of("<\n") != std::string::npos) return std::nullopt;
  text.remove_prefix(name_end + 1);
  const OrderedJson* tool = nullptr;
  std::vector<OrderedJson> parsed_tools;
  parsed_tools.reserve(tools_.size());
  for (const std::string& t : tools_) {
    parsed_tools.push_back(OrderedJson::parse(t, nullptr, false));
    const OrderedJson& candidate = parsed_tools.back();
    if (candidate.is_object() && candidate.contains("function") &&
        candidate["function"].is_object() && candidate["function"].value("name", "") == out.name)
      tool = &candidate;
  }
  OrderedJson arguments = OrderedJson::object();
  while (true) {
    skip_space(text);
    if (consume(text, "</function>")) break;
    if (!consume(text, "<parameter=")) return std::nullopt;
    const size_t key_end = text.find('>');
    if (key_end == std::string_view::npos || key_end == 0) return std::nullopt;
    const std::string key(trim(text.substr(0, key_end)));
    text.remove_prefix(key_end + 1);
    const size_t value_end = text.find("</parameter>");
    if (value_end == std::string_view::npos) return std::nullopt;
    std::string_view value = text.substr(0, value_end);
    text.remove_prefix(value_end + std::string_view("</parameter>").size());
    // The template writes "<parameter=k>\n" + value + "\n</parameter>".
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const std::string type = tool ? schema_type(*tool, key) : std::string("?");
    OrderedJson typed = OrderedJson(std::string(value));
    if (type != "string" && !(tool && type.empty())) {
      OrderedJson parsed = OrderedJson::parse(value, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded()) typed = std::move(parsed);
    }
    arguments[key] = std::move(typed);
  }
  if (!is_blank(text)) return std::nullopt;
  out.arguments = arguments.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  return out;
}

}  // namespace strata::serve
