#include "serve/tool_calls.h"

#include <nlohmann/json.hpp>

#include <functional>

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

constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

std::string compact(const OrderedJson& value) {
  return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// The text as the inside of a JSON string (what compact() writes between the quotes).
std::string escaped(std::string_view text) {
  const std::string quoted = compact(OrderedJson(std::string(text)));
  return quoted.substr(1, quoted.size() - 2);
}

// How many bytes at the end of `text` begin a well-formed UTF-8 sequence that more bytes may
// complete (0 to 3). A string value streamed in pieces holds them back: escaped() turns a sequence
// cut in two into replacement characters, so a multi-byte character split across two pushes would
// come out differently from the same value escaped whole. The rules are Unicode's well-formed byte
// sequences (table 3-7), those of the JSON writer's decoder: a byte that breaks a sequence starts
// the next one.
size_t incomplete_utf8_tail(std::string_view text) {
  size_t start = 0;
  int need = 0;
  unsigned char low = 0x80, high = 0xBF;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (need > 0) {
      if (byte >= low && byte <= high) {
        --need;
        low = 0x80;
        high = 0xBF;
        continue;
      }
      need = 0;  // the sequence is broken; this byte is read again as a new one
    }
    start = i;
    low = 0x80;
    high = 0xBF;
    if (byte >= 0xC2 && byte <= 0xDF) {
      need = 1;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      need = 2;
      if (byte == 0xE0) low = 0xA0;   // no overlong forms
      if (byte == 0xED) high = 0x9F;  // no surrogates
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      need = 3;
      if (byte == 0xF0) low = 0x90;   // no overlong forms
      if (byte == 0xF4) high = 0x8F;  // nothing above U+10FFFF
    }  // ASCII, a stray continuation byte or an invalid lead byte stands alone
  }
  return need > 0 ? text.size() - start : 0;
}

// `text` is a proper prefix of `tag` (so more text may complete it).
bool may_become(std::string_view text, std::string_view tag) {
  return text.size() < tag.size() && tag.starts_with(text);
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

// XML: a parameter's value stays text for "string" (or no type, for a listed tool).
bool value_is_text(const OrderedJson* tool, std::string_view key) {
  const std::string type = tool ? schema_type(*tool, key) : std::string("?");
  return type == "string" || (tool && type.empty());
}

// XML: a parameter's value as JSON (value_is_text, else parsed; text again when it does not parse).
OrderedJson xml_value(const OrderedJson* tool, std::string_view key, std::string_view value) {
  if (!value_is_text(tool, key)) {
    OrderedJson parsed = OrderedJson::parse(value, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) return parsed;
  }
  return OrderedJson(std::string(value));
}

}  // namespace

void join_pieces(std::vector<ReplyPart>& reply, std::span<const ReplyPiece> pieces) {
  for (const ReplyPiece& piece : pieces) {
    switch (piece.kind) {
      case ReplyPiece::Kind::Content:
        if (reply.empty() || reply.back().call) reply.emplace_back();
        reply.back().content += piece.text;
        break;
      case ReplyPiece::Kind::CallStart:
        reply.push_back({{}, ParsedToolCall{piece.text, {}}});
        break;
      case ReplyPiece::Kind::Arguments:
        if (!reply.empty() && reply.back().call) reply.back().call->arguments += piece.text;
        break;
    }
  }
}

ToolCallParser::ToolCallParser(ToolCallFormat format, std::span<const std::string> tools,
                               std::string_view prefix, bool stream_arguments)
    : format_(format), stream_arguments_(stream_arguments) {
  tools_.reserve(tools.size());
  for (const std::string& tool : tools) tools_.push_back(OrderedJson::parse(tool, nullptr, false));
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
  if (inside_ && stream_arguments_) {  // never closed
    block_ += pending_;
    pending_.clear();
    advance(out, /*complete=*/true);
    end_block(out, /*closed=*/false);
  } else if (inside_) {  // never closed: the block as generated
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
  if (!out.empty() && out.back().kind == ReplyPiece::Kind::Content) {
    out.back().text += text;
  } else {
    out.push_back({ReplyPiece::Kind::Content, std::move(text)});
  }
}

void ToolCallParser::emit_arguments(std::vector<ReplyPiece>& out, std::string_view fragment) {
  if (!call_started_) {  // the block is a call from here on
    call_started_ = true;
    ++calls_found_;
    out.push_back({ReplyPiece::Kind::CallStart, call_name_});
  }
  if (fragment.empty()) return;
  if (!out.empty() && out.back().kind == ReplyPiece::Kind::Arguments) {
    out.back().text += fragment;
  } else {
    out.push_back({ReplyPiece::Kind::Arguments, std::string(fragment)});
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
    if (stream_arguments_) {
      // The block's text up to its close (or what cannot be the start of the close) is read now.
      const size_t take = close != std::string::npos
                              ? close
                              : pending_.size() - partial_tag_suffix(pending_, kToolCallClose);
      block_.append(pending_, 0, take);
      pending_.erase(0, close != std::string::npos ? close + kToolCallClose.size() : take);
      advance(out, /*complete=*/close != std::string::npos);
      if (close == std::string::npos) return;
      end_block(out, /*closed=*/true);
      inside_ = false;
      continue;
    }
    if (close == std::string::npos) return;
    const std::string body = pending_.substr(0, close);
    pending_.erase(0, close + kToolCallClose.size());
    inside_ = false;
    if (std::optional<ParsedToolCall> call = parse_block(body)) {
      ++calls_found_;
      out.push_back({ReplyPiece::Kind::CallStart, std::move(call->name)});
      out.push_back({ReplyPiece::Kind::Arguments, std::move(call->arguments)});
    } else {
      emit_content(out,
                   separator_ + std::string(kToolCallOpen) + body + std::string(kToolCallClose));
    }
  }
}

void ToolCallParser::end_block(std::vector<ReplyPiece>& out, bool closed) {
  const std::string close = closed ? std::string(kToolCallClose) : std::string();
  if (step_ == Step::Whole) {
    if (std::optional<ParsedToolCall> call = parse_block(block_)) {
      call_name_ = std::move(call->name);
      emit_arguments(out, call->arguments);
    } else {
      emit_content(out, separator_ + std::string(kToolCallOpen) + block_ + close);
    }
  } else if (!call_started_) {  // never became a call: as generated
    emit_content(out, separator_ + std::string(kToolCallOpen) + block_ + close);
  } else if (step_ != Step::AfterCall) {  // broke after the call was out: the rest is content
    emit_content(out, block_.substr(position_) + close);
  }
  block_.clear();
  position_ = 0;
  step_ = Step::Header;
  call_name_.clear();
  call_started_ = false;
  first_member_ = true;
  value_started_ = false;
}

void ToolCallParser::advance(std::vector<ReplyPiece>& out, bool complete) {
  while (format_ == ToolCallFormat::Xml ? advance_xml(out) : advance_hermes(out)) {
  }
  // A block that ends where it still needed text is broken there.
  if (complete && step_ != Step::AfterCall && step_ != Step::Whole) step_ = Step::Broken;
}

const OrderedJson* ToolCallParser::find_tool(std::string_view name) const {
  const OrderedJson* found = nullptr;  // the last tool of that name, as the request lists them
  for (const OrderedJson& tool : tools_)
    if (tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
        tool["function"].value("name", "") == name)
      found = &tool;
  return found;
}

// After a call's end, in either format, only whitespace may follow before </tool_call>: it is
// consumed; anything else makes the rest of the block content.
void ToolCallParser::skip_after_call(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos) step_ = Step::Broken;
  position_ += first == std::string_view::npos ? text.size() : first;
}

// Returns true while it made progress (call again), false when it needs more text or the block
// is decided.
bool ToolCallParser::advance_xml(std::vector<ReplyPiece>& out) {
  std::string_view text = std::string_view(block_).substr(position_);
  const size_t first = text.find_first_not_of(" \t\r\n");
  const std::string_view word =
      first == std::string_view::npos ? std::string_view() : text.substr(first);
  switch (step_) {
    case Step::Header: {
      if (word.empty() || may_become(word, kFunctionOpen)) return false;
      const size_t name_end = word.find('>');
      if (!word.starts_with(kFunctionOpen) || name_end == kFunctionOpen.size()) {
        step_ = Step::Broken;
        return false;
      }
      if (name_end == std::string_view::npos) return false;
      const std::string_view name =
          trim(word.substr(kFunctionOpen.size(), name_end - kFunctionOpen.size()));
      if (name.empty() || name.find_first_of("<\n") != std::string_view::npos) {
        step_ = Step::Broken;
        return false;
      }
      call_name_ = std::string(name);
      position_ += first + name_end + 1;
      step_ = Step::Parameters;
      return true;
    }
    case Step::Parameters: {
      if (word.empty() || may_become(word, kFunctionClose) || may_become(word, kParameterOpen))
        return false;
      if (word.starts_with(kFunctionClose)) {
        emit_arguments(out, first_member_ ? "{}" : "}");
        position_ += first + kFunctionClose.size();
        step_ = Step::AfterCall;
        return true;
      }
      const size_t key_end = word.find('>');
      if (!word.starts_with(kParameterOpen) || key_end == kParameterOpen.size()) {
        step_ = Step::Broken;
        return false;
      }
      if (key_end == std::string_view::npos) return false;
      key_ = std::string(trim(word.substr(kParameterOpen.size(), key_end - kParameterOpen.size())));
      std::string member(first_member_ ? "{" : ",");
      member += compact(OrderedJson(key_));
      member += ':';
      emit_arguments(out, member);
      first_member_ = false;
      value_is_text_ = value_is_text(find_tool(call_name_), key_);
      value_started_ = false;
      position_ += first + key_end + 1;
      step_ = Step::Value;
      return true;
    }
    case Step::Value: {
      if (!value_started_) {  // the template writes "<parameter=k>\n" + value + "\n</parameter>"
        if (text.empty()) return false;
        if (text.front() == '\n') {
          text.remove_prefix(1);
          ++position_;
        }
        value_started_ = true;
        if (value_is_text_) emit_arguments(out, "\"");
      }
      const size_t end = text.find(kParameterClose);
      if (end != std::string_view::npos) {
        std::string_view value = text.substr(0, end);
        if (value.ends_with('\n')) value.remove_suffix(1);
        emit_arguments(out, value_is_text_
                                ? escaped(value) + "\""
                                : compact(xml_value(find_tool(call_name_), key_, value)));
        position_ += end + kParameterClose.size();
        step_ = Step::Parameters;
        return true;
      }
      if (!value_is_text_) return false;
      // A string value streams as written, less what may be its closing "\n</parameter>".
      size_t ready = text.size() - partial_tag_suffix(text, kParameterClose);
      if (ready > 0 && text[ready - 1] == '\n') --ready;
      ready -= incomplete_utf8_tail(text.substr(0, ready));
      emit_arguments(out, escaped(text.substr(0, ready)));
      position_ += ready;
      return false;
    }
    case Step::AfterCall:
      skip_after_call(text);
      return false;
    case Step::CallClose:  // Hermes only
    case Step::Whole:
    case Step::Broken:
      return false;
  }
  return false;
}

bool ToolCallParser::advance_hermes(std::vector<ReplyPiece>& out) {
  const std::string_view text = std::string_view(block_).substr(position_);
  switch (step_) {
    case Step::Header: {
      // {"name": "<name>", "arguments": {   -- anything else is parsed whole at the close.
      size_t at = 0;
      auto space = [&] {
        while (at < text.size() &&
               std::string_view(" \t\r\n").find(text[at]) != std::string_view::npos)
          ++at;
      };
      enum Match { Need, No, Yes };
      auto literal = [&](std::string_view expected) {
        const size_t n = std::min(expected.size(), text.size() - at);
        if (text.substr(at, n) != expected.substr(0, n)) return No;
        if (n < expected.size()) return Need;
        at += n;
        return Yes;
      };
      std::string name;
      auto string_value = [&] {
        if (at >= text.size()) return Need;
        if (text[at] != '"') return No;
        size_t end = at + 1;
        while (end < text.size() && text[end] != '"') end += text[end] == '\\' ? 2 : 1;
        if (end >= text.size()) return Need;
        const OrderedJson parsed =
            OrderedJson::parse(text.substr(at, end + 1 - at), nullptr, /*allow_exceptions=*/false);
        if (!parsed.is_string() || parsed.get_ref<const std::string&>().empty()) return No;
        name = parsed.get<std::string>();
        at = end + 1;
        return Yes;
      };
      for (const auto& part : std::initializer_list<std::function<Match()>>{
               [&] { return literal("{"); }, [&] { return literal("\"name\""); },
               [&] { return literal(":"); }, string_value, [&] { return literal(","); },
               [&] { return literal("\"arguments\""); }, [&] { return literal(":"); },
               [&] { return literal("{"); }}) {
        space();
        const Match match = part();
        if (match == Need) return false;
        if (match == No) {
          step_ = Step::Whole;
          return false;
        }
      }
      call_name_ = std::move(name);
      position_ += at;
      step_ = Step::Parameters;
      return true;
    }
    case Step::Parameters: {
      // The next top-level member of the arguments object: up to a ',' or the '}' at depth 0.
      int depth = 0;
      bool in_string = false;
      size_t end = 0;
      for (; end < text.size(); ++end) {
        const char c = text[end];
        if (in_string) {
          if (c == '\\') {
            ++end;
          } else if (c == '"') {
            in_string = false;
          }
        } else if (c == '"') {
          in_string = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if ((c == '}' || c == ']') && depth > 0) {
          --depth;
        } else if ((c == '}' || c == ',') && depth == 0) {
          break;
        }
      }
      if (end >= text.size()) return false;
      const bool last = text[end] == '}';
      const std::string_view member = text.substr(0, end);
      if (last && first_member_ && is_blank(member)) {
        emit_arguments(out, "{}");
      } else {
        std::string object(1, '{');
        object.append(member).push_back('}');
        const OrderedJson one = OrderedJson::parse(object, nullptr, /*allow_exceptions=*/false);
        if (!one.is_object() || one.size() != 1) {
          step_ = Step::Broken;
          return false;
        }
        std::string dumped = compact(one);  // {"key":value}
        if (!first_member_) dumped.front() = ',';
        if (!last) dumped.pop_back();
        emit_arguments(out, dumped);
        first_member_ = false;
      }
      position_ += end + 1;
      step_ = last ? Step::CallClose : Step::Parameters;
      return true;
    }
    case Step::CallClose: {
      const size_t first = text.find_first_not_of(" \t\r\n");
      if (first == std::string_view::npos) return false;
      if (text[first] != '}') {
        step_ = Step::Broken;
        return false;
      }
      position_ += first + 1;
      step_ = Step::AfterCall;
      return true;
    }
    case Step::AfterCall:
      skip_after_call(text);
      return false;
    case Step::Value:  // XML only
    case Step::Whole:
    case Step::Broken:
      return false;
  }
  return false;
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
  if (!consume(text, kFunctionOpen)) return std::nullopt;
  const size_t name_end = text.find('>');
  if (name_end == std::string_view::npos || name_end == 0) return std::nullopt;
  ParsedToolCall out;
  out.name = std::string(trim(text.substr(0, name_end)));
  if (out.name.empty() || out.name.find_first_of("<\n") != std::string::npos) return std::nullopt;
  text.remove_prefix(name_end + 1);
  const OrderedJson* tool = find_tool(out.name);
  OrderedJson arguments = OrderedJson::object();
  while (true) {
    skip_space(text);
    if (consume(text, kFunctionClose)) break;
    if (!consume(text, kParameterOpen)) return std::nullopt;
    const size_t key_end = text.find('>');
    if (key_end == std::string_view::npos || key_end == 0) return std::nullopt;
    const std::string key(trim(text.substr(0, key_end)));
    text.remove_prefix(key_end + 1);
    const size_t value_end = text.find(kParameterClose);
    if (value_end == std::string_view::npos) return std::nullopt;
    std::string_view value = text.substr(0, value_end);
    text.remove_prefix(value_end + kParameterClose.size());
    // The template writes "<parameter=k>\n" + value + "\n</parameter>".
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    arguments[key] = xml_value(tool, key, value);
  }
  if (!is_blank(text)) return std::nullopt;
  out.arguments = compact(arguments);
  return out;
}

}  // namespace strata::serve
