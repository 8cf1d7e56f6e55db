// From a validated request to a generation plan: the prompt rendered (chat template) and
// tokenized, the context checked, sampling settings resolved against the server's defaults.
//
// Contract: `plan_generation` never throws for bad input; it returns an ApiError naming the field:
// the conversation the chat template rejects ("messages"), a prompt that encodes to no tokens
// ("prompt"), a prompt that leaves no room in the context (code context_length_exceeded, param
// "messages"/"prompt"), max_tokens that do not fit after the prompt ("max_tokens"), or a
// response_format or grammar with chat_template_kwargs.enable_thinking true (structured output
// is the whole reply: it has no room for a thinking block); with a forced tool call, a
// response_format or logprobs, and a tool schema the call grammar refuses
// ("tools[0].function.parameters..."). With tool_choice "auto" the calls' grammar starts lazily
// (GenerationPlan::grammar_trigger) unless the request has a response_format (its grammar holds the
// whole reply) or logprobs (they would be the unconstrained ones), or a schema the grammar refuses:
// then calls are free text as before (never a 400: auto requests did not depend on the grammar).
// Thread-safe: it only reads the model, tokenizer and template (all immutable).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/sampler.h"
#include "grammar/lazy_trigger.h"
#include "serve/api_error.h"
#include "serve/grammar_cache.h"
#include "serve/request.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/tool_format.h"

namespace strata {
class Model;
class ExpertStore;
}  // namespace strata

namespace strata::serve {

// Everything requests share; immutable while the server runs.
struct ServedModel {
  const Model* model = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  ExpertStore* expert_store = nullptr;   // nullptr: experts read through the GGUF mapping
  std::string backend = "cpu";           // compute backend of every request's Session (resolved)
  std::string id;                        // the name clients use ("strata-default")
  int64_t n_ctx = 0;  // every Session's context length (--ctx, else the model's; 0 = unlimited)
  int prefill_rows = 0;  // --chunk: the longest prefill window (0: Generator's default)
  std::optional<int32_t> end_of_turn;    // <|im_end|>, when the vocabulary has it
  SamplerConfig default_sampling;        // for fields a request leaves unset (its seed is not used)
  std::optional<uint64_t> default_seed;  // for requests without a seed; unset = a fresh one each
  int64_t created = 0;                   // unix time for /v1/models (the file's mtime)
};

// Without a context limit, a request without max_tokens generates at most this many tokens.
inline constexpr int64_t kUnboundedDefaultMaxTokens = 4096;

struct GenerationPlan {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 0;
  SamplerConfig sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool split_thinking = false;      // chat: a leading <think> block goes to reasoning_content
  bool starts_in_thinking = false;  // the rendered prompt opened "<think>\n"
  // Structured output (response_format or grammar), or a forced tool call (below): every token is
  // drawn under this grammar, and the generation ends once the value is complete (nothing can
  // follow). Chat renders such requests without thinking.
  std::shared_ptr<const grammar::Grammar> grammar;
  // Set: `grammar` starts lazily, after this trigger's word (grammar/lazy_trigger.h): tool_choice
  // "auto" lets the model write freely until it opens a call ("<tool_call>"), then the rest of
  // the reply is the calls' grammar (with its leading "\n"). Its think block counts as in
  // ThinkFilter (starts_in_thinking). Only the grammar's part ends the generation early.
  std::optional<grammar::LazyTrigger> grammar_trigger;
  // Choices: choice i samples with seed sampling.seed + i (wrapping), so a seeded request
  // reproduces every choice, and choice 0 equals the same request with n = 1.
  int n_choices = 1;
  std::optional<int> logprobs;  // per-token log-probabilities with this many alternatives
  // Tools offered (chat with tools, tool_choice not "none"): they are in the prompt and the
  // reply's content goes through a ToolCallParser (serve/tool_calls.h). tool_choice "required"
  // or a named function is kept by starting the assistant turn with tool_call_prefix (appended
  // to the prompt, with thinking off for that turn, so the reply opens inside the call) and by
  // `grammar` = the calls' grammar (serve/tool_call_grammar.h): the rest is well-formed calls
  // whose arguments fit the tools' schemas, then the end of the turn.
  bool parse_tool_calls = false;
  ToolCallFormat tool_format = ToolCallFormat::Hermes;
  std::vector<std::string> tools;  // the tool objects' JSON texts
  std::string tool_prefix;
  bool parallel_tool_calls = true;
  // A streamed response: tool-call arguments leave in fragments as they are generated
  // (ToolCallParser's streamed mode); a whole one gets each call parsed at its close.
  bool stream_tool_calls = false;
};

using PlanResult = std::variant<GenerationPlan, ApiError>;

// Seeds: the request's, else served.default_seed, else `fresh_seed` (requests then differ).
// `grammars`: where the tools' compiled call grammars are looked up and kept (null: none).
PlanResult plan_generation(const GenerationRequest& request, const ServedModel& served,
                           uint64_t fresh_seed, GrammarCache* grammars = nullptr);

}  // namespace strata::serve
