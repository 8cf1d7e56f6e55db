// HfConfig — typed, error-naming access to a model's config.json.
//
// A composite config (e.g. Qwen4ExpForConditionalGeneration) keeps the language model's fields in
// "text_config"; like llama.cpp's converter, lookups see those fields merged over the top level
// (text_config wins). `rope_parameters` (transformers 5.x) and top-level rope fields (4.x) are both
// consulted by `rope_value`.
//
// Every getter that fails throws strata::Error naming the file, the field and what was expected
// versus found, e.g. "m/config.json: field num_experts: expected a non-negative integer, found "8"".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::convert {

class HfConfig {
 public:
  // Reads DIR/config.json; throws "DIR: missing config.json" when absent.
  static HfConfig load(const std::string& directory);
  // For tests: a config from a JSON value; `origin` names it in errors.
  HfConfig(nlohmann::json merged, std::string origin);

  const std::string& origin() const { return origin_; }
  const nlohmann::json& raw() const { return merged_; }
  bool has(std::string_view field) const;

  int64_t integer(std::string_view field) const;
  // The first of `fields` present (llama.cpp's find_hparam), e.g. {"num_local_experts", "num_experts"}.
  std::optional<int64_t> optional_integer_any(std::initializer_list<std::string_view> fields) const;
  int64_t integer_any(std::initializer_list<std::string_view> fields) const;
  std::optional<int64_t> optional_integer(std::string_view field) const;
  double number(std::string_view field) const;
  std::optional<double> optional_number(std::string_view field) const;
  std::string string(std::string_view field) const;
  std::optional<std::string> optional_string(std::string_view field) const;
  bool boolean_or(std::string_view field, bool fallback) const;
  std::vector<int64_t> integer_list(std::string_view field) const;  // [] when absent
  std::vector<std::string> string_list(std::string_view field) const;  // [] when absent
  // A token id field that may be an integer or a list of integers (HF allows both); the list's last
  // element is returned (llama.cpp's converter picks eos[-1]). nullopt when absent or null.
  std::optional<int64_t> token_id(std::string_view field) const;
  // rope_parameters.<field>, else the top-level <field>.
  std::optional<double> rope_value(std::string_view field) const;
  std::vector<int64_t> rope_integer_list(std::string_view field) const;

 private:
  const nlohmann::json* find(std::string_view field) const;
  nlohmann::json merged_;
  std::string origin_;
};

}  // namespace strata::convert
