#include "convert/tokenizer_hf.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "util/error.h"

namespace strata::convert {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// GGUF token types (llama.cpp's TokenType).
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

std::optional<json> read_json_if_present(const fs::path& path) {
  if (!fs::is_regular_file(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read", path.string());
  std::stringstream text;
  text << in.rdbuf();
  json parsed = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) fail("{}: not valid JSON", path.string());
  if (!parsed.is_object()) fail("{}: expected a JSON object", path.string());
  return parsed;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read", path.string());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct AddedToken {
  std::string content;
  bool special = false;
};

std::string replace_all(std::string text, std::string_view from, std::string_view to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// merges as "a b": the old string form is kept; the [a, b] pair form (transformers >= 4.45) is
// joined with a space after encoding spaces inside a part as U+0120, as gguf-py does.
std::vector<std::string> read_merges(const json& model, const std::string& origin) {
  std::vector<std::string> merges;
  const auto it = model.find("merges");
  if (it == model.end() || it->is_null()) return merges;
  if (!it->is_array()) fail("{}: field model.merges: expected a list", origin);
  for (const json& merge : *it) {
    if (merge.is_string()) {
      merges.push_back(merge.get<std::string>());
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      merges.push_back(replace_all(merge[0].get<std::string>(), " ", "\xC4\xA0") + " " +
                       replace_all(merge[1].get<std::string>(), " ", "\xC4\xA0"));
    } else {
      fail("{}: field model.merges: unknown merge format {}", origin, merge.dump());
    }
  }
  return merges;
}

// The content of a tokenizer_config.json "<typ>_token" entry (a string or {"content": ...}).
std::optional<std::string> special_token_content(const json& tokenizer_config, const std::string& field) {
  const auto it = tokenizer_config.find(field);
  if (it == tokenizer_config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

void add_chat_template(const json& value, const std::string& origin, GgufWriter& writer) {
  if (value.is_string()) {
    if (!value.get<std::string>().empty()) writer.add_string("tokenizer.chat_template", value.get<std::string>());
    return;
  }
  if (!value.is_array()) fail("{}: field chat_template: expected a string or a list of templates", origin);
  std::vector<std::string> names;
  std::optional<std::string> default_template;
  for (const json& entry : value) {
    if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) continue;
    std::string name = entry.value("name", std::string());
    for (char& ch : name) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    if (name == "default") {
      default_template = entry["template"].get<std::string>();
    } else if (!name.empty()) {
      writer.add_string("tokenizer.chat_template." + name, entry["template"].get<std::string>());
      names.push_back(name);
    }
  }
  if (!names.empty()) writer.add_array_string("tokenizer.chat_templates", names);
  if (default_template) writer.add_string("tokenizer.chat_template", *default_template);
}

}  // namespace

bool token_looks_special(std::string_view token) {
  const auto wrapped = [&](std::string_view open, std::string_view close) {
    return token.size() >= open.size() + close.size() && token.starts_with(open) && token.ends_with(close);
  };
  return token == "<pad>" || token == "<mask>" || token == "<2mass>" || token == "[@BOS@]" ||
         wrapped("<|", "|>") || wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wrapped("<unused", ">");
}

bool add_hf_tokenizer(const std::string& directory, const HfConfig& config, int64_t vocab_size,
                      std::string_view pre, GgufWriter& writer) {
  const fs::path dir(directory);
  const std::string origin = (dir / "tokenizer.json").string();
  const std::optional<json> tokenizer = read_json_if_present(dir / "tokenizer.json");
  if (!tokenizer) return false;
  const auto model_it = tokenizer->find("model");
  if (model_it == tokenizer->end() || !model_it->is_object()) fail("{}: missing object field model", origin);
  const json& model = *model_it;
  const std::string type = model.value("type", std::string());
  if (type != "BPE") fail("{}: field model.type: expected \"BPE\" (byte-level), found \"{}\"", origin, type);
  if (model.value("byte_fallback", false)) {
    fail("{}: field model.byte_fallback: SentencePiece-style BPE is not supported (expected false)", origin);
  }

  std::map<int64_t, std::string> tokens;
  const auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) fail("{}: missing object field model.vocab", origin);
  for (const auto& [token, id] : vocab_it->items()) {
    if (!id.is_number_integer()) fail("{}: model.vocab[{}]: expected an integer id", origin, token);
    tokens[id.get<int64_t>()] = token;
  }
  std::map<int64_t, AddedToken> added;
  std::vector<std::pair<std::string, int64_t>> added_by_content;  // in file order, for special ids
  if (const auto it = tokenizer->find("added_tokens"); it != tokenizer->end() && it->is_array()) {
    for (const json& entry : *it) {
      if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
          !entry.contains("content") || !entry["content"].is_string()) {
        fail("{}: added_tokens: expected entries with an integer id and a string content, found {}", origin,
             entry.dump());
      }
      const int64_t id = entry["id"].get<int64_t>();
      added[id] = {entry["content"].get<std::string>(), entry.value("special", false)};
      tokens[id] = added[id].content;
      added_by_content.emplace_back(added[id].content, id);
    }
  }
  if (!tokens.empty() && (tokens.begin()->first < 0 || tokens.rbegin()->first >= vocab_size)) {
    fail("{}: token id {} outside the model's vocab_size {}", origin,
         tokens.begin()->first < 0 ? tokens.begin()->first : tokens.rbegin()->first, vocab_size);
  }

  std::vector<std::string> token_list;
  std::vector<int32_t> token_types;
  token_list.reserve(static_cast<size_t>(vocab_size));
  token_types.reserve(static_cast<size_t>(vocab_size));
  for (int64_t id = 0; id < vocab_size; ++id) {
    const auto token = tokens.find(id);
    if (token == tokens.end()) {
      token_list.push_back(fmt::format("[PAD{}]", id));
      token_types.push_back(kUnused);
    } else if (const auto a = added.find(id); a != added.end()) {
      if (a->second.special || token_looks_special(a->second.content)) {
        token_list.push_back(a->second.content);
        token_types.push_back(kControl);
      } else {
        token_list.push_back(replace_all(a->second.content, "\xE2\x96\x81", " "));  // "▁" → " "
        token_types.push_back(kUserDefined);
      }
    } else {
      token_list.push_back(token->second);
      token_types.push_back(kNormal);
    }
  }

  writer.add_string("tokenizer.ggml.model", "gpt2");
  writer.add_string("tokenizer.ggml.pre", std::string(pre));
  writer.add_array_string("tokenizer.ggml.tokens", token_list);
  writer.add_array_i32("tokenizer.ggml.token_type", token_types);
  const std::vector<std::string> merges = read_merges(model, origin);
  if (!merges.empty()) writer.add_array_string("tokenizer.ggml.merges", merges);

  // Special ids: tokenizer_config.json first (its strings looked up among the added tokens), then
  // config.json's <typ>_token_id for types still unset; first value wins, insertion order kept.
  static const std::pair<const char*, const char*> kSpecialKeys[] = {
      {"bos", "tokenizer.ggml.bos_token_id"},       {"eos", "tokenizer.ggml.eos_token_id"},
      {"unk", "tokenizer.ggml.unknown_token_id"},   {"sep", "tokenizer.ggml.seperator_token_id"},
      {"pad", "tokenizer.ggml.padding_token_id"},   {"cls", "tokenizer.ggml.cls_token_id"},
      {"mask", "tokenizer.ggml.mask_token_id"},
  };
  std::vector<std::pair<std::string, int64_t>> special_ids;
  const auto set_special = [&](const std::string& type, std::optional<int64_t> id) {
    if (!id) return;
    if (*id < 0) fail("{}: special token {} has the negative id {}", directory, type, *id);
    for (const auto& [existing, _] : special_ids) {
      if (existing == type) return;
    }
    special_ids.emplace_back(type, *id);
  };
  std::optional<json> tokenizer_config = read_json_if_present(dir / "tokenizer_config.json");
  std::vector<std::pair<std::string, bool>> add_flags;
  if (tokenizer_config) {
    json& tc = *tokenizer_config;
    if (!special_token_content(tc, "bos_token") && special_token_content(tc, "cls_token")) tc["bos_token"] = tc["cls_token"];
    if (!special_token_content(tc, "eos_token") && special_token_content(tc, "sep_token")) tc["eos_token"] = tc["sep_token"];
    for (const auto& [type, _] : kSpecialKeys) {
      if (const auto flag = tc.find(std::string("add_") + type + "_token"); flag != tc.end() && flag->is_boolean()) {
        add_flags.emplace_back(type, flag->get<bool>());
      }
      const auto content = special_token_content(tc, std::string(type) + "_token");
      if (!content) continue;
      for (const auto& [text, id] : added_by_content) {
        if (text == *content) {
          set_special(type, id);
          break;
        }
      }
    }
  }
  for (const auto& [type, _] : kSpecialKeys) set_special(type, config.token_id(std::string(type) + "_token_id"));
  for (const auto& [type, id] : special_ids) {
    for (const auto& [t, key] : kSpecialKeys) {
      if (type == t) writer.add_u32(key, static_cast<uint32_t>(id));
    }
  }
  for (const auto& [type, value] : add_flags) {
    if (type == "bos" || type == "eos" || type == "sep") writer.add_bool("tokenizer.ggml.add_" + type + "_token", value);
  }
  if (tokenizer_config) {
    const std::string tc_origin = (dir / "tokenizer_config.json").string();
    if (const auto it = tokenizer_config->find("chat_template"); it != tokenizer_config->end() && !it->is_null()) {
      add_chat_template(*it, tc_origin, writer);
    } else if (fs::is_regular_file(dir / "chat_template.jinja")) {
      add_chat_template(json(read_text(dir / "chat_template.jinja")), tc_origin, writer);
    } else if (const auto alt = read_json_if_present(dir / "chat_template.json")) {
      if (const auto t = alt->find("chat_template"); t != alt->end()) add_chat_template(*t, tc_origin, writer);
    }
  }
  return true;
}

}  // namespace strata::convert
