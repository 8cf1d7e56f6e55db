#include "convert/hf_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace strata::convert {

using json = nlohmann::json;

HfConfig HfConfig::load(const std::string& directory) {
  const std::filesystem::path path = std::filesystem::path(directory) / "config.json";
  if (!std::filesystem::is_directory(directory)) fail("{}: not a directory", directory);
  if (!std::filesystem::is_regular_file(path)) fail("{}: missing config.json", directory);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read", path.string());
  std::stringstream text;
  text << in.rdbuf();
  json root = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) fail("{}: not valid JSON", path.string());
  if (!root.is_object()) fail("{}: expected a JSON object, found {}", path.string(), root.type_name());
  json merged = root;
  if (const auto text_config = root.find("text_config");
      text_config != root.end() && text_config->is_object()) {
    for (const auto& [key, value] : text_config->items()) merged[key] = value;
  }
  return HfConfig(std::move(merged), path.string());
}

HfConfig::HfConfig(json merged, std::string origin) : merged_(std::move(merged)), origin_(std::move(origin)) {}

const json* HfConfig::find(std::string_view field) const {
  const auto it = merged_.find(field);
  if (it == merged_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool HfConfig::has(std::string_view field) const { return find(field) != nullptr; }

std::optional<int64_t> HfConfig::optional_integer(std::string_view field) const {
  const json* value = find(field);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number_integer()) {
    fail("{}: field {}: expected an integer, found {}", origin_, field, value->dump());
  }
  return value->get<int64_t>();
}

int64_t HfConfig::integer(std::string_view field) const {
  const auto value = optional_integer(field);
  if (!value) fail("{}: missing field {} (an integer)", origin_, field);
  return *value;
}

std::optional<int64_t> HfConfig::optional_integer_any(std::initializer_list<std::string_view> fields) const {
  for (std::string_view field : fields) {
    if (auto value = optional_integer(field)) return value;
  }
  return std::nullopt;
}

int64_t HfConfig::integer_any(std::initializer_list<std::string_view> fields) const {
  if (auto value = optional_integer_any(fields)) return *value;
  std::string names;
  for (std::string_view field : fields) names += (names.empty() ? "" : " or ") + std::string(field);
  fail("{}: missing field {} (an integer)", origin_, names);
}

std::optional<double> HfConfig::optional_number(std::string_view field) const {
  const json* value = find(field);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) fail("{}: field {}: expected a number, found {}", origin_, field, value->dump());
  return value->get<double>();
}

double HfConfig::number(std::string_view field) const {
  const auto value = optional_number(field);
  if (!value) fail("{}: missing field {} (a number)", origin_, field);
  return *value;
}

std::optional<std::string> HfConfig::optional_string(std::string_view field) const {
  const json* value = find(field);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) fail("{}: field {}: expected a string, found {}", origin_, field, value->dump());
  return value->get<std::string>();
}

std::string HfConfig::string(std::string_view field) const {
  const auto value = optional_string(field);
  if (!value) fail("{}: missing field {} (a string)", origin_, field);
  return *value;
}

bool HfConfig::boolean_or(std::string_view field, bool fallback) const {
  const json* value = find(field);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) fail("{}: field {}: expected true or false, found {}", origin_, field, value->dump());
  return value->get<bool>();
}

std::vector<int64_t> HfConfig::integer_list(std::string_view field) const {
  const json* value = find(field);
  std::vector<int64_t> out;
  if (value == nullptr) return out;
  if (!value->is_array()) fail("{}: field {}: expected a list of integers, found {}", origin_, field, value->dump());
  for (const json& item : *value) {
    if (!item.is_number_integer()) {
      fail("{}: field {}: expected a list of integers, found {}", origin_, field, value->dump());
    }
    out.push_back(item.get<int64_t>());
  }
  return out;
}

std::vector<std::string> HfConfig::string_list(std::string_view field) const {
  const json* value = find(field);
  std::vector<std::string> out;
  if (value == nullptr) return out;
  if (!value->is_array()) fail("{}: field {}: expected a list of strings, found {}", origin_, field, value->dump());
  for (const json& item : *value) {
    if (!item.is_string()) fail("{}: field {}: expected a list of strings, found {}", origin_, field, value->dump());
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::optional<int64_t> HfConfig::token_id(std::string_view field) const {
  const json* value = find(field);
  if (value == nullptr) return std::nullopt;
  if (value->is_number_integer()) return value->get<int64_t>();
  if (value->is_array() && !value->empty()) {
    bool all_integers = true;
    for (const json& item : *value) all_integers = all_integers && item.is_number_integer();
    if (all_integers) return value->back().get<int64_t>();
  }
  fail("{}: field {}: expected a token id or a list of them, found {}", origin_, field, value->dump());
}

std::optional<double> HfConfig::rope_value(std::string_view field) const {
  if (const json* rope = find("rope_parameters"); rope != nullptr && rope->is_object()) {
    const auto it = rope->find(field);
    if (it != rope->end() && !it->is_null()) {
      if (!it->is_number()) {
        fail("{}: field rope_parameters.{}: expected a number, found {}", origin_, field, it->dump());
      }
      return it->get<double>();
    }
  }
  return optional_number(field);
}

std::vector<int64_t> HfConfig::rope_integer_list(std::string_view field) const {
  if (const json* rope = find("rope_parameters"); rope != nullptr && rope->is_object()) {
    const auto it = rope->find(field);
    if (it != rope->end() && !it->is_null()) {
      std::vector<int64_t> out;
      if (!it->is_array()) fail("{}: field rope_parameters.{}: expected a list", origin_, field);
      for (const json& item : *it) {
        if (!item.is_number_integer()) {
          fail("{}: field rope_parameters.{}: expected integers, found {}", origin_, field, it->dump());
        }
        out.push_back(item.get<int64_t>());
      }
      return out;
    }
  }
  return integer_list(field);
}

}  // namespace strata::convert
