#include "serve/llama_endpoints.h"

#include <charconv>
#include <cstdlib>

#include "experts/expert_store.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace strata::serve {

Json tokenize_response(const Tokenizer& tokenizer, const TokenizeRequest& request) {
  EncodeOptions options;
  options.parse_special = request.parse_special;
  const std::vector<int32_t> ids = tokenizer.encode(request.content, options);
  if (!request.with_pieces) return Json{{"tokens", ids}};
  Json tokens = Json::array();
  for (const int32_t id : ids) {
    const std::string& bytes = tokenizer.token_bytes(id);
    Json piece;
    if (utf8_is_valid(bytes)) {
      piece = bytes;
    } else {
      piece = Json::array();
      for (const char byte : bytes) piece.push_back(int(static_cast<unsigned char>(byte)));
    }
    tokens.push_back(Json{{"id", id}, {"piece", std::move(piece)}});
  }
  return Json{{"tokens", std::move(tokens)}};
}

Json detokenize_response(const Tokenizer& tokenizer, const DetokenizeRequest& request) {
  return Json{{"content", tokenizer.decode(request.tokens)}};
}

namespace {

// A float setting as the user wrote it (0.8, not 0.800000011920929 from widening to double).
Json float_json(float value) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof(text), value).ptr;
  return Json(std::strtod(std::string(text, end).c_str(), nullptr));
}

}  // namespace

Json props_json(const ServedModel& served, const PropsLimits& limits) {
  const SamplerConfig& s = served.default_sampling;
  const HParams& hp = served.model->hparams();
  const Json params{{"temperature", float_json(s.temperature)},
                    {"top_k", s.top_k},
                    {"top_p", float_json(s.top_p)},
                    {"min_p", float_json(s.min_p)},
                    {"repeat_penalty", float_json(s.repetition_penalty)},
                    {"repeat_last_n", s.repeat_last_n},
                    // -1: each request without a seed gets a fresh one
                    {"seed", served.default_seed ? Json(*served.default_seed) : Json(-1)}};
  Json experts{
      {"n_layer", hp.n_layer}, {"n_expert", hp.n_expert}, {"n_expert_used", hp.n_expert_used}};
  if (const ExpertStore* store = served.expert_store) {
    experts["source"] = "store";
    experts["slots_per_layer"] = store->slots_per_layer();
    experts["cache_bytes"] = store->arena_bytes();
    experts["direct_io"] = store->direct_io();
  } else {
    experts["source"] = "mapped";  // read through the GGUF mapping: the page cache decides
  }
  const GgufFile& file = served.model->file();
  return Json{
      {"default_generation_settings",
       {{"id", 0},
        {"n_ctx", served.n_ctx},
        {"speculative", limits.speculative != "off"},
        {"is_processing", false},
        {"params", params}}},
      {"total_slots", limits.slots},
      {"model_path", file.path()},
      {"chat_template", file.get_or<std::string>("tokenizer.chat_template", "")},
      {"modalities", {{"vision", false}, {"audio", false}}},
      {"build_info", limits.build_info},
      {"strata",
       {{"model", served.id},
        {"chat_format",
         served.chat_template ? std::string(served.chat_template->format_name()) : std::string()},
        {"speculative", limits.speculative},
        {"max_queue", limits.max_queue},
        {"max_connections", limits.max_connections},
        {"max_body_bytes", limits.max_body_bytes},
        {"timeout_s", limits.timeout_s},
        {"batch_groups", {{"groups", limits.batch_groups}, {"reason", limits.batch_groups_reason}}},
        {"experts", std::move(experts)}}}};
}

}  // namespace strata::serve
