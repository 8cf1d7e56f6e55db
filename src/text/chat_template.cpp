#include "text/chat_template.h"

#include <array>

#include "gguf/gguf.h"
#include "text/unicode.h"
#include "text/utf8.h"
#include "util/error.h"

namespace strata {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolResponseOpen = "<tool_response>";
constexpr std::string_view kToolResponseClose = "</tool_response>";
constexpr std::string_view kEmptyThinkBlock = "<think>\n\n</think>\n\n";

bool contains(std::string_view text, std::string_view needle) {
  return text.find(needle) != std::string_view::npos;
}

std::string_view lstrip_newlines(std::string_view s) {
  const size_t k = s.find_first_not_of('\n');
  return k == std::string_view::npos ? std::string_view{} : s.substr(k);
}
std::string_view rstrip_newlines(std::string_view s) {
  const size_t k = s.find_last_not_of('\n');
  return k == std::string_view::npos ? std::string_view{} : s.substr(0, k + 1);
}

void check_role(const ChatMessage& message, size_t index) {
  static constexpr std::array<std::string_view, 4> roles = {"system", "user", "assistant", "tool"};
  for (const auto role : roles) {
    if (message.role == role) return;
  }
  fail("chat message {}: unknown role \"{}\" (expected system, user, assistant or tool)", index,
       message.role);
}

// Index of the last user message that is a real query (not a wrapped tool response), as both Qwen
// templates compute it; nullopt when there is none.
std::optional<size_t> last_query_index(std::span<const ChatMessage> messages, bool trimmed) {
  for (size_t k = messages.size(); k-- > 0;) {
    if (messages[k].role != "user") continue;
    const std::string_view content = trimmed ? python_strip(messages[k].content) : messages[k].content;
    const bool tool_response = content.starts_with(kToolResponseOpen) && content.ends_with(kToolResponseClose);
    if (!tool_response) return k;
  }
  return std::nullopt;
}

// Thinking of an assistant message and the remaining content, as the templates split them:
// reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'),
// content = content.split('</think>')[-1].lstrip('\n'). Returns false when there is no </think>.
bool split_reasoning(std::string_view content, std::string_view& reasoning, std::string_view& rest) {
  const size_t first_close = content.find(kThinkClose);
  if (first_close == std::string_view::npos) return false;
  std::string_view before = rstrip_newlines(content.substr(0, first_close));
  const size_t last_open = before.rfind(kThinkOpen);
  if (last_open != std::string_view::npos) before = before.substr(last_open + kThinkOpen.size());
  reasoning = lstrip_newlines(before);
  rest = lstrip_newlines(content.substr(content.rfind(kThinkClose) + kThinkClose.size()));
  return true;
}

void append_block(std::string& out, std::string_view role, std::string_view content) {
  out += "<|im_start|>";
  out += role;
  out += '\n';
  out += content;
  out += "<|im_end|>\n";
}

// Messages with their contents repaired to valid UTF-8 (trimming walks code points).
std::vector<ChatMessage> repaired(std::span<const ChatMessage> messages) {
  std::vector<ChatMessage> out(messages.begin(), messages.end());
  for (ChatMessage& m : out) {
    if (!utf8_is_valid(m.content)) m.content = utf8_repair(m.content);
    if (m.reasoning_content && !utf8_is_valid(*m.reasoning_content)) {
      m.reasoning_content = utf8_repair(*m.reasoning_content);
    }
  }
  return out;
}

}  // namespace

std::string_view ChatTemplate::format_name() const {
  switch (format_) {
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Qwen3: return "qwen3";
    case ChatFormat::Qwen35: return "qwen3.5";
  }
  return "?";
}

ChatTemplate ChatTemplate::detect(std::string_view text, std::string_view source) {
  if (!contains(text, "<|im_start|>") || !contains(text, "<|im_end|>")) {
    fail("{}: tokenizer.chat_template: not a ChatML template (no <|im_start|> / <|im_end|> markers); "
         "strata renders only the Qwen ChatML family",
         source);
  }
  if (contains(text, "reasoning_effort")) {
    fail("{}: tokenizer.chat_template: this ChatML template injects reasoning-effort instructions "
         "(reasoning_effort), which strata does not render",
         source);
  }
  if (contains(text, "enable_thinking")) {
    // Qwen3.5+ opens the think block in the generation prompt: `{{- '<think>\n' }}` in the else
    // branch of the enable_thinking test. Qwen3 only closes an empty one when thinking is off.
    if (contains(text, "{{- '<think>\\n' }}")) return ChatTemplate(ChatFormat::Qwen35);
    return ChatTemplate(ChatFormat::Qwen3);
  }
  if (contains(text, "<think>")) {
    fail("{}: tokenizer.chat_template: a ChatML template with <think> handling but no enable_thinking "
         "switch; strata does not know how it renders thinking",
         source);
  }
  return ChatTemplate(ChatFormat::ChatML);
}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& file) {
  if (file.has("tokenizer.chat_template")) {
    return detect(file.get<std::string>("tokenizer.chat_template"), file.path());
  }
  const std::string arch = file.has("general.architecture") ? file.architecture() : std::string();
  if (arch == "qwen3moe" || arch == "qwen3next" || arch == "qwen3") return ChatTemplate(ChatFormat::Qwen3);
  if (arch == "qwen4exp" || arch == "qwen35" || arch == "qwen35moe") return ChatTemplate(ChatFormat::Qwen35);
  fail("{}: tokenizer.chat_template is missing and architecture \"{}\" has no known chat format", file.path(),
       arch);
}

bool ChatTemplate::prompt_opens_thinking(const ChatRenderOptions& options) const {
  return format_ == ChatFormat::Qwen35 && options.add_generation_prompt && options.enable_thinking;
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, const ChatRenderOptions& options) const {
  for (size_t i = 0; i < messages.size(); ++i) check_role(messages[i], i);
  const std::vector<ChatMessage> valid = repaired(messages);
  switch (format_) {
    case ChatFormat::ChatML: return render_chatml(valid, options);
    case ChatFormat::Qwen3: return render_qwen3(valid, options);
    case ChatFormat::Qwen35: return render_qwen35(valid, options);
  }
  return {};
}

std::string ChatTemplate::render_chatml(std::span<const ChatMessage> messages,
                                        const ChatRenderOptions& options) const {
  std::string out;
  size_t first = 0;
  if (!options.tools.empty()) {
    const bool system = !messages.empty() && messages[0].role == "system";
    append_block(out, "system",
                 render_tools_system(ToolCallFormat::Hermes, options.tools,
                                     system ? std::optional<std::string_view>(messages[0].content)
                                            : std::nullopt));
    first = system ? 1 : 0;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    append_block(out, m.role,
                 m.content + render_tool_calls(ToolCallFormat::Hermes, m.tool_calls, m.content));
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string ChatTemplate::render_qwen3(std::span<const ChatMessage> messages,
                                       const ChatRenderOptions& options) const {
  std::string out;
  const size_t n = messages.size();
  const bool system = n > 0 && messages[0].role == "system";
  if (!options.tools.empty()) {
    append_block(out, "system",
                 render_tools_system(ToolCallFormat::Hermes, options.tools,
                                     system ? std::optional<std::string_view>(messages[0].content)
                                            : std::nullopt));
  } else if (system) {
    append_block(out, "system", messages[0].content);
  }
  const size_t query = last_query_index(messages, /*trimmed=*/false).value_or(n == 0 ? 0 : n - 1);
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      append_block(out, m.role, m.content);
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else {
        split_reasoning(m.content, reasoning, content);
      }
      out += "<|im_start|>assistant\n";
      if (i > query && (i + 1 == n || !reasoning.empty())) {
        out += "<think>\n";
        out += lstrip_newlines(rstrip_newlines(reasoning));
        out += "\n</think>\n\n";
        out += lstrip_newlines(content);
      } else {
        out += content;
      }
      out += render_tool_calls(ToolCallFormat::Hermes, m.tool_calls, content);
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += m.content;
      out += "\n</tool_response>";
      if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!options.enable_thinking) out += kEmptyThinkBlock;
  }
  return out;
}

std::string ChatTemplate::render_qwen35(std::span<const ChatMessage> messages,
                                        const ChatRenderOptions& options) const {
  if (messages.empty()) fail("chat: no messages provided");
  std::string out;
  const size_t n = messages.size();
  if (!options.tools.empty()) {
    append_block(out, "system",
                 render_tools_system(ToolCallFormat::Xml, options.tools,
                                     messages[0].role == "system"
                                         ? std::optional<std::string_view>(
                                               python_strip(messages[0].content))
                                         : std::nullopt));
  } else if (messages[0].role == "system") {
    append_block(out, "system", python_strip(messages[0].content));
  }
  const std::optional<size_t> query = last_query_index(messages, /*trimmed=*/true);
  if (!query) fail("chat: no user query found in messages (the template requires one)");
  const bool preserve = options.preserve_thinking.value_or(false);
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    std::string_view content = python_strip(m.content);
    if (m.role == "system") {
      if (i != 0) fail("chat message {}: a system message must be at the beginning", i);
    } else if (m.role == "user") {
      append_block(out, "user", content);
    } else if (m.role == "assistant") {
      std::string_view reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else {
        split_reasoning(content, reasoning, content);
      }
      reasoning = python_strip(reasoning);
      out += "<|im_start|>assistant\n";
      if (preserve || i > *query) {
        out += "<think>\n";
        out += reasoning;
        out += "\n</think>\n\n";
      }
      out += content;
      out += render_tool_calls(ToolCallFormat::Xml, m.tool_calls, python_strip(content));
      out += "<|im_end|>\n";
    } else {  // tool
      if (i > 0 && messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += content;
      out += "\n</tool_response>";
      if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    out += options.enable_thinking ? std::string_view("<think>\n") : kEmptyThinkBlock;
  }
  return out;
}

}  // namespace strata
