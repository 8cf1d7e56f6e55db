#include "serve/tool_call_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "grammar/json_schema.h"
#include "serve/response_format.h"

namespace strata::serve {
namespace {

using ojson = nlohmann::ordered_json;
using B = grammar::GrammarBuilder;
using Sequence = B::Sequence;

// What serve/tool_calls.h takes for the end of an XML value and of a block: a raw value must
// contain neither, or the parser would cut it there.
constexpr std::string_view kValueEnd = "\n</parameter>";
const std::vector<std::string> kForbiddenInValue = {"</parameter>", "</tool_call>"};
// Between two calls, as render_tool_calls writes them in both formats.
constexpr std::string_view kNextCall = "\n<tool_call>\n";

std::string child(const std::string& path, std::string_view key) {
  return fmt::format("{}.{}", path, key);
}

std::string describe(const ojson& value) {
  const std::string text = value.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return text.size() <= 42 ? text : text.substr(0, 40) + "...";
}

// Only annotations (or `true`): any value.
bool unconstrained(const ojson& schema) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (!schema.is_object()) return false;
  return std::all_of(schema.items().begin(), schema.items().end(),
                     [](const auto& item) { return grammar::is_annotation(item.key()); });
}

// The type serve/tool_calls.h reads a property by: the first non-null one, "" when none.
std::string first_type(const ojson& schema) {
  if (!schema.is_object() || !schema.contains("type")) return {};
  const ojson& type = schema["type"];
  if (type.is_string()) return type.get<std::string>();
  if (type.is_array())
    for (const ojson& t : type)
      if (t.is_string() && t != "null") return t.get<std::string>();
  return {};
}

struct Tool {
  std::string name;
  const ojson* parameters = nullptr;  // null: the tool declares none
  std::string path;                   // "tools[i].function.parameters"
};

class Compiler {
 public:
  Compiler(ToolCallFormat format, std::vector<Tool> tools)
      : format_(format), tools_(std::move(tools)) {}

  grammar::Grammar compile(std::optional<std::string_view> forced, bool parallel,
                           std::string_view lead) {
    std::vector<Sequence> calls;
    std::optional<Sequence> named_rest;
    for (const Tool& tool : tools_) {
      if (forced && tool.name != *forced) continue;
      const uint32_t arguments =
          format_ == ToolCallFormat::Hermes ? hermes_arguments(tool) : xml_parameters(tool);
      // The call after its name (what a prefix naming the function leaves to write), and whole.
      const Sequence rest =
          format_ == ToolCallFormat::Hermes
              ? Sequence{B::rule(arguments), B::literal("}\n</tool_call>")}
              : Sequence{B::rule(arguments), B::literal("</function>\n</tool_call>")};
      Sequence call = {
          B::literal(format_ == ToolCallFormat::Hermes
                         ? fmt::format("{{\"name\": \"{}\", \"arguments\": ", tool.name)
                         : fmt::format("<function={}>\n", tool.name))};
      call.insert(call.end(), rest.begin(), rest.end());
      calls.push_back(std::move(call));
      if (forced) named_rest = rest;
    }
    const uint32_t any_call = builder_.add("call", calls);
    Sequence root = forced ? *named_rest : Sequence{B::rule(any_call)};
    if (!lead.empty()) root.insert(root.begin(), B::literal(lead));
    if (parallel)
      root.push_back(B::rule(
          builder_.repeat("more-calls", {B::literal(kNextCall), B::rule(any_call)}, 0, -1)));
    return grammar::finish_checked(builder_, builder_.add("tool-calls", {root}));
  }

 private:
  // Arguments are a JSON object: parameters of type "object" (or only annotations).
  bool check_object_schema(const Tool& tool) {
    if (!tool.parameters || unconstrained(*tool.parameters)) return false;
    const ojson& schema = *tool.parameters;
    const auto type = schema.find("type");
    if (type == schema.end() || *type != "object")
      throw invalid_field(type == schema.end() ? tool.path : child(tool.path, "type"),
                          "a tool's arguments are a JSON object: expected \"type\": \"object\", "
                          "found {}",
                          type == schema.end() ? std::string("no type") : describe(*type));
    return true;
  }

  uint32_t hermes_arguments(const Tool& tool) {
    if (!check_object_schema(tool)) return grammar::SchemaRules(builder_, ojson()).any_object();
    try {
      return grammar::SchemaRules(builder_, *tool.parameters).value(*tool.parameters, "");
    } catch (const grammar::SchemaError& error) {
      throw schema_error(error, tool.path);
    }
  }

  uint32_t xml_parameters(const Tool& tool) {
    std::vector<std::pair<std::string, Sequence>> parameters;  // name, its whole <parameter>
    std::vector<bool> required;
    if (check_object_schema(tool)) {
      const ojson& schema = *tool.parameters;
      for (const auto& [key, setting] : schema.items())
        if (!grammar::is_annotation(key) && key != "type" && key != "properties" &&
            key != "required" && key != "additionalProperties")
          throw invalid_field(child(tool.path, key),
                              "\"{}\" at the top of a tool's parameters is not supported in the "
                              "XML tool-call format (only type, properties, required)",
                              key);
      grammar::SchemaRules rules(builder_, schema);
      const std::string properties_path = child(tool.path, "properties");
      if (const auto properties = schema.find("properties"); properties != schema.end()) {
        if (!properties->is_object())
          throw invalid_field(properties_path, "expected an object, found {}",
                              describe(*properties));
        for (const auto& [name, sub] : properties->items()) {
          const std::string at = child(properties_path, name);
          if (name.empty() || name.find_first_of("<>\n") != std::string::npos)
            throw invalid_field(at,
                                "an XML parameter name cannot be empty or hold '<', '>' or a "
                                "newline");
          Sequence parameter = {B::literal(fmt::format("<parameter={}>\n", name))};
          const Sequence value = xml_value(sub, at, tool.path, name, rules);
          parameter.insert(parameter.end(), value.begin(), value.end());
          parameters.push_back({name, std::move(parameter)});
          required.push_back(false);
        }
      }
      if (const auto names = schema.find("required"); names != schema.end()) {
        if (!names->is_array())
          throw invalid_field(child(tool.path, "required"),
                              "expected an array of property names, found {}", describe(*names));
        for (size_t i = 0; i < names->size(); ++i) {
          const ojson& name = (*names)[i];
          const auto found = std::find_if(parameters.begin(), parameters.end(), [&](const auto& p) {
            return name.is_string() && p.first == name.get_ref<const std::string&>();
          });
          if (found == parameters.end())
            throw invalid_field(fmt::format("{}.required[{}]", tool.path, i),
                                "{} is required but not in properties (the XML tool-call format "
                                "writes declared parameters only)",
                                describe(name));
          required[size_t(found - parameters.begin())] = true;
        }
      }
    }
    // from_i ::= parameter_i from_{i+1} | from_{i+1} (when optional); the last one ends.
    uint32_t rest = builder_.add(fmt::format("{}-end", tool.name), {{}});
    for (size_t i = parameters.size(); i-- > 0;) {
      Sequence with = parameters[i].second;
      with.push_back(B::rule(rest));
      std::vector<Sequence> alternatives = {with};
      if (!required[i]) alternatives.push_back({B::rule(rest)});
      rest = builder_.add(fmt::format("{}-{}", tool.name, parameters[i].first), alternatives);
    }
    return rest;
  }

  // The value of one XML parameter and its closing "\n</parameter>\n".
  // `document_path`: the parameters' path, which SchemaRules paths are relative to.
  Sequence xml_value(const ojson& schema, const std::string& at, const std::string& document_path,
                     const std::string& name, grammar::SchemaRules& rules) {
    if (!schema.is_object() && !unconstrained(schema))
      throw invalid_field(at, "expected a schema object, found {}", describe(schema));
    const std::string type = first_type(schema);
    const bool typed = schema.is_object() && schema.contains("type");
    if (typed && type != "string") {  // a JSON value, parsed by the parser as one
      try {
        return {B::rule(rules.value(schema, fmt::format("properties.{}", name))),
                B::literal(fmt::format("{}\n", kValueEnd))};
      } catch (const grammar::SchemaError& error) {
        throw schema_error(error, document_path);
      }
    }
    if (unconstrained(schema)) return text_value();
    // Raw text: only a list of strings can be honoured (the parser keeps the text as it is).
    for (const auto& [key, setting] : schema.items())
      if (!grammar::is_annotation(key) && key != "type" && key != "enum" && key != "const")
        throw invalid_field(child(at, key), "\"{}\" is not supported {}", key,
                            typed ? "on a string parameter of the XML tool-call format (its "
                                    "value is raw text)"
                                  : "on a parameter without \"type\" in the XML tool-call "
                                    "format (such a value is read as text): give it a type");
    std::vector<Sequence> options;
    auto add_option = [&](const ojson& option, const std::string& where) {
      if (!option.is_string())
        throw invalid_field(where,
                            "a text parameter of the XML tool-call format takes strings, "
                            "found {}",
                            describe(option));
      const std::string& text = option.get_ref<const std::string&>();
      for (const std::string& tag : kForbiddenInValue)
        if (text.find(tag) != std::string::npos)
          throw invalid_field(where, "{} would end the XML value early", describe(option));
      options.push_back({B::literal(text)});
    };
    if (const auto it = schema.find("const"); it != schema.end())
      add_option(*it, child(at, "const"));
    if (const auto it = schema.find("enum"); it != schema.end()) {
      if (!it->is_array() || it->empty())
        throw invalid_field(child(at, "enum"), "expected a non-empty array, found {}",
                            describe(*it));
      if (options.empty())
        for (size_t i = 0; i < it->size(); ++i)
          add_option((*it)[i], fmt::format("{}.enum[{}]", at, i));
    }
    if (options.empty()) return text_value();
    return {B::rule(builder_.add(at, options)), B::literal(fmt::format("{}\n", kValueEnd))};
  }

  Sequence text_value() {
    if (!text_) text_ = builder_.text_until("text-value", kValueEnd, kForbiddenInValue);
    return {B::rule(*text_), B::byte('\n')};
  }

  const ToolCallFormat format_;
  const std::vector<Tool> tools_;
  B builder_;
  std::optional<uint32_t> text_;
};

}  // namespace

std::variant<std::shared_ptr<const grammar::Grammar>, ApiError> compile_tool_call_grammar(
    ToolCallFormat format, std::span<const std::string> tools,
    std::optional<std::string_view> forced_function, bool parallel_calls, std::string_view lead) {
  try {
    std::vector<ojson> parsed;
    parsed.reserve(tools.size());  // Tool points into these
    std::vector<Tool> listed;
    for (size_t i = 0; i < tools.size(); ++i) {
      parsed.push_back(ojson::parse(tools[i]));
      const ojson& function = parsed.back().at("function");
      Tool tool;
      tool.name = function.at("name").get<std::string>();
      tool.path = fmt::format("tools[{}].function.parameters", i);
      if (const auto it = function.find("parameters"); it != function.end() && !it->is_null())
        tool.parameters = &*it;
      listed.push_back(std::move(tool));
    }
    Compiler compiler(format, std::move(listed));
    return std::make_shared<const grammar::Grammar>(
        compiler.compile(forced_function, parallel_calls, lead));
  } catch (ApiError& error) {
    return std::move(error);
  } catch (const ojson::exception& error) {  // serve/request.h validated them: not expected
    return invalid_field("tools", "cannot read the tools: {}", error.what());
  } catch (const grammar::SchemaError& error) {  // left recursion, found at the end
    return schema_error(error, "tools");
  } catch (const std::bad_alloc&) {
    ApiError error;
    error.status = 413;
    error.message = "tools: the tools' schemas are too large to compile";
    error.param = "tools";
    return error;
  }
}

}  // namespace strata::serve
