#include "serve/plan.h"

#include <fmt/format.h>

#include "serve/tool_call_grammar.h"

#include "util/error.h"

namespace strata::serve {

namespace {

// The tools' call grammar, from `cache` when the same tools were compiled for the same choice.
GrammarResult tool_call_grammar(GrammarCache* cache, ToolCallFormat format,
                                std::span<const std::string> tools,
                                std::optional<std::string_view> forced, bool parallel,
                                std::string_view lead) {
  std::string key = fmt::format("tools\n{}\n{}\n{}\n{}", int(format),
                                forced ? fmt::format("function {}", *forced) : "any",
                                parallel ? "parallel" : "one", lead);
  for (const std::string& tool : tools) key += "\n" + tool;  // JSON texts: no raw newline
  return cached_grammar(
      cache, key, [&] { return compile_tool_call_grammar(format, tools, forced, parallel, lead); });
}

}  // namespace

PlanResult plan_generation(const GenerationRequest& request, const ServedModel& served,
                           uint64_t fresh_seed, GrammarCache* grammars) {
  GenerationPlan plan;
  plan.endpoint = request.endpoint;
  const bool chat = request.endpoint == Endpoint::ChatCompletions;
  const char* prompt_field = chat ? "messages" : "prompt";
  // The request's own constraint on the whole reply: a response_format or a GBNF grammar (the
  // parser lets only one through).
  plan.grammar = request.grammar ? request.grammar : request.response_format.grammar;
  const char* constraint = request.grammar ? "grammar" : "response_format";
  // The reported log-probabilities would be those of the unconstrained distribution, not the
  // masked one the tokens are drawn from: refused until they are computed under the mask.
  if (plan.grammar && request.logprobs)
    return invalid_field("logprobs", "log-probabilities are not supported together with a {}",
                         constraint);
  if (chat) {
    ChatRenderOptions render;
    // A response_format reply is the JSON value alone, and a forced tool call opens the reply:
    // both render without thinking.
    render.enable_thinking = request.enable_thinking.value_or(!plan.grammar);
    if (plan.grammar && render.enable_thinking)
      return invalid_field("chat_template_kwargs.enable_thinking",
                           "a {} reply is the {} alone, without a thinking block: set "
                           "enable_thinking false or leave it out",
                           constraint, request.grammar ? "grammar's text" : "JSON value");
    const bool offer_tools = !request.tools.empty() && request.tool_choice != ToolChoice::None;
    const bool force_call =
        request.tool_choice == ToolChoice::Required || request.tool_choice == ToolChoice::Function;
    if (offer_tools) render.tools = request.tools;
    if (offer_tools && force_call) render.enable_thinking = false;  // the reply opens the call
    std::string text;
    try {
      text = served.chat_template->render(request.messages, render);
    } catch (const Error& error) {
      return invalid_field("messages", "the chat template rejects this conversation: {}",
                           error.what());
    }
    if (offer_tools) {
      plan.parse_tool_calls = true;
      plan.tool_format = served.chat_template->tool_format();
      plan.tools = request.tools;
      plan.parallel_tool_calls = request.parallel_tool_calls;
      plan.stream_tool_calls = request.stream;
      if (force_call) {
        const std::optional<std::string_view> function =
            request.tool_choice == ToolChoice::Function
                ? std::optional<std::string_view>(request.tool_choice_function)
                : std::nullopt;
        plan.tool_prefix = tool_call_prefix(plan.tool_format, function);
        // The rest of the reply is drawn under the calls' grammar (serve/tool_call_grammar.h),
        // which already fixes the reply: no response_format on top, and log-probabilities
        // would be the unconstrained ones (as with a response_format).
        if (plan.grammar)
          return invalid_field("response_format",
                               "a forced tool call (tool_choice \"required\" or a function) is "
                               "the whole reply: it cannot also follow a response_format");
        if (request.logprobs)
          return invalid_field("logprobs",
                               "log-probabilities are not supported with a forced tool call "
                               "(tool_choice \"required\" or a function)");
        auto calls = tool_call_grammar(grammars, plan.tool_format, request.tools, function,
                                       request.parallel_tool_calls, "");
        if (ApiError* error = std::get_if<ApiError>(&calls)) return std::move(*error);
        plan.grammar = std::move(std::get<std::shared_ptr<const grammar::Grammar>>(calls));
      }
      if (!force_call && !plan.grammar && !request.logprobs) {
        // tool_choice "auto": once the model opens a call, the rest of the reply is the calls'
        // grammar, started right after its "<tool_call>" (the forced prefix's "\n" leads it).
        auto calls = tool_call_grammar(grammars, plan.tool_format, request.tools, std::nullopt,
                                       request.parallel_tool_calls, "\n");
        if (auto* compiled = std::get_if<std::shared_ptr<const grammar::Grammar>>(&calls)) {
          plan.grammar = std::move(*compiled);
          plan.grammar_trigger = grammar::LazyTrigger{
              .word = std::string(kToolCallOpen),
              .starts_in_block = served.chat_template->prompt_opens_thinking(render)};
        }
      }
      text += plan.tool_prefix;
    }
    plan.prompt = served.tokenizer->encode(text);
    plan.split_thinking = !request.response_format.grammar && !request.grammar;
    plan.starts_in_thinking = served.chat_template->prompt_opens_thinking(render);
  } else if (request.prompt_is_tokens) {
    plan.prompt = request.prompt_tokens;
  } else {
    plan.prompt = served.tokenizer->encode(request.prompt_text);
  }
  if (plan.prompt.empty()) return invalid_field(prompt_field, "the prompt encodes to no tokens");

  const int64_t n_prompt = int64_t(plan.prompt.size());
  if (served.n_ctx > 0) {
    if (n_prompt >= served.n_ctx) {
      ApiError error = invalid_field(prompt_field,
                                     "the prompt is {} tokens but the context is {} tokens, and at "
                                     "least one must be left for the reply",
                                     n_prompt, served.n_ctx);
      error.code = "context_length_exceeded";
      return error;
    }
    if (request.max_tokens && n_prompt + *request.max_tokens > served.n_ctx) {
      ApiError error =
          invalid_field("max_tokens",
                        "the prompt ({} tokens) plus max_tokens ({}) exceed the context of "
                        "{} tokens; at most {} "
                        "tokens can be generated for this prompt",
                        n_prompt, *request.max_tokens, served.n_ctx, served.n_ctx - n_prompt);
      error.code = "context_length_exceeded";
      return error;
    }
    plan.max_new_tokens = request.max_tokens.value_or(served.n_ctx - n_prompt);
  } else {
    plan.max_new_tokens = request.max_tokens.value_or(kUnboundedDefaultMaxTokens);
  }

  SamplerConfig& s = plan.sampling;
  s = served.default_sampling;
  const SamplingOverrides& o = request.sampling;
  if (o.temperature) s.temperature = *o.temperature;
  if (o.top_p) s.top_p = *o.top_p;
  if (o.top_k) s.top_k = *o.top_k;
  if (o.min_p) s.min_p = *o.min_p;
  if (o.repetition_penalty) s.repetition_penalty = *o.repetition_penalty;
  s.seed = o.seed.value_or(served.default_seed.value_or(fresh_seed));
  if (o.frequency_penalty) s.frequency_penalty = *o.frequency_penalty;
  if (o.presence_penalty) s.presence_penalty = *o.presence_penalty;
  s.logit_bias = o.logit_bias;
  s.n_prompt = plan.prompt.size();  // the penalties count what this request generates
  plan.n_choices = request.n;
  plan.logprobs = request.logprobs;

  plan.stop = request.stop;
  plan.ignore_eos = request.ignore_eos;
  return plan;
}

}  // namespace strata::serve
