// ChatTemplate — renders a conversation into the prompt text of the Qwen ChatML family
// (`<|im_start|>{role}\n{content}<|im_end|>\n`, generation prompt `<|im_start|>assistant\n`).
//
// strata does not run Jinja. It recognises which member of the family a GGUF's
// `tokenizer.chat_template` is and renders that member natively, byte for byte what transformers
// renders from the template (checked against fixtures rendered by transformers:
// tests/data/tokenizer/chat_cases.json). Formats:
//   ChatML  plain ChatML (no thinking logic): every message as one block.
//   Qwen3   Qwen3's template: `enable_thinking=false` closes an empty think block
//           ("<think>\n\n</think>\n\n") after the generation prompt; assistant turns before the last
//           user query lose their <think> part, later ones keep it; tool results are wrapped in
//           <tool_response> inside a user turn.
//   Qwen35  Qwen3.5/3.6's template: like Qwen3, but contents are trimmed, the generation prompt
//           opens "<think>\n" when thinking is on, and `preserve_thinking` keeps old reasoning.
// Tools (text/tool_format.h): `ChatRenderOptions::tools` become the template's "# Tools" system
// section and an assistant message's `tool_calls` the template's <tool_call> blocks, in the
// member's format: Hermes JSON for ChatML and Qwen3, the XML format for Qwen35. An assistant
// message whose content holds <tool_call>…</tool_call> text is rendered verbatim too.
//
// Contract: `detect` throws strata::Error naming the source (file) when the template is not one of
// these; `render` throws strata::Error for conversations the template itself rejects (unknown role,
// no user query for Qwen35, ...). Immutable; thread-safe.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/tool_format.h"

namespace strata {

class GgufFile;

// A tool call of an assistant message.
struct ChatToolCall {
  std::string name;
  std::string arguments;  // JSON text: rendered as is (Hermes), its object's members (Xml)
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant thinking kept apart from content
  std::vector<ChatToolCall> tool_calls;          // assistant only
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;
  std::optional<bool> preserve_thinking;  // Qwen35 only; unset = the template's default (off)
  std::vector<std::string> tools;         // each tool's JSON object text, as the request sent it
};

enum class ChatFormat { ChatML, Qwen3, Qwen35 };

class ChatTemplate {
 public:
  explicit ChatTemplate(ChatFormat format) : format_(format) {}
  // Recognises the format from the template text; `source` names it in errors (file path).
  static ChatTemplate detect(std::string_view template_text, std::string_view source);
  // From tokenizer.chat_template, or from general.architecture when the key is absent.
  static ChatTemplate from_gguf(const GgufFile& file);

  ChatFormat format() const { return format_; }
  std::string_view format_name() const;
  // How this member's template lists tools and writes tool calls.
  ToolCallFormat tool_format() const {
    return format_ == ChatFormat::Qwen35 ? ToolCallFormat::Xml : ToolCallFormat::Hermes;
  }
  std::string render(std::span<const ChatMessage> messages, const ChatRenderOptions& options = {}) const;
  // True when the rendered prompt ends inside an open <think> block (the reply starts thinking).
  bool prompt_opens_thinking(const ChatRenderOptions& options) const;

  static constexpr std::string_view kEndOfTurn = "<|im_end|>";

 private:
  std::string render_chatml(std::span<const ChatMessage> messages, const ChatRenderOptions& options) const;
  std::string render_qwen3(std::span<const ChatMessage> messages, const ChatRenderOptions& options) const;
  std::string render_qwen35(std::span<const ChatMessage> messages, const ChatRenderOptions& options) const;
  ChatFormat format_;
};

}  // namespace strata
