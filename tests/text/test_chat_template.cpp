// Chat templates: native rendering must equal what transformers 5.17 renders from the real Qwen3
// and Qwen3.6 Jinja templates (chat_cases.json, 182 renderings incl. thinking on/off, history with
// <think>, tool turns, whitespace, errors), plus hand-written exact strings and the think filter.
#include <gtest/gtest.h>

#include <map>

#include "text/chat_template.h"
#include "text/think_filter.h"
#include "text_fixtures.h"
#include "util/error.h"

namespace strata {
namespace {

std::vector<ChatMessage> to_messages(const nlohmann::json& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list) {
    ChatMessage msg{m.at("role").get<std::string>(), m.at("content").get<std::string>(), std::nullopt};
    if (m.contains("reasoning_content")) msg.reasoning_content = m.at("reasoning_content").get<std::string>();
    out.push_back(std::move(msg));
  }
  return out;
}

TEST(ChatTemplate, DetectsTheQwenTemplates) {
  const auto qwen3 = test::read_file(test::tokenizer_data_path("templates/qwen3.jinja"));
  const auto qwen36 = test::read_file(test::tokenizer_data_path("templates/qwen3_6.jinja"));
  EXPECT_EQ(ChatTemplate::detect(qwen3, "a.gguf").format(), ChatFormat::Qwen3);
  EXPECT_EQ(ChatTemplate::detect(qwen36, "a.gguf").format(), ChatFormat::Qwen35);
  EXPECT_EQ(ChatTemplate::detect("{% for m in messages %}{{'<|im_start|>' + m.role + '\\n' + m.content"
                                 " + '<|im_end|>\\n'}}{% endfor %}",
                                 "a.gguf")
                .format(),
            ChatFormat::ChatML);
}

TEST(ChatTemplate, MatchesTransformersRenderingOfRealTemplates) {
  const nlohmann::json fixture = test::load_json("chat_cases.json");
  ASSERT_TRUE(fixture.at("transformers_cross_checked").get<bool>());
  std::map<std::string, ChatTemplate> templates;
  for (const char* name : {"qwen3", "qwen3_6"}) {
    const auto text = test::read_file(test::tokenizer_data_path(std::string("templates/") + name + ".jinja"));
    templates.emplace(name, ChatTemplate::detect(text, name));
  }
  int rendered = 0, rejected = 0;
  for (const auto& c : fixture.at("cases")) {
    ASSERT_FALSE(c.contains("transformers")) << "jinja2 and transformers disagreed on this fixture";
    const auto messages = to_messages(fixture.at("conversations").at(c.at("conversation").get<std::string>()));
    const auto& o = c.at("options");
    ChatRenderOptions options;
    options.add_generation_prompt = o.at("add_generation_prompt").get<bool>();
    if (o.contains("enable_thinking")) options.enable_thinking = o.at("enable_thinking").get<bool>();
    if (o.contains("preserve_thinking")) options.preserve_thinking = o.at("preserve_thinking").get<bool>();
    const ChatTemplate& tmpl = templates.at(c.at("template").get<std::string>());
    const std::string where = c.at("template").get<std::string>() + " / " + c.at("conversation").get<std::string>() +
                              " / " + o.dump();
    if (c.contains("expected")) {
      EXPECT_EQ(tmpl.render(messages, options), c.at("expected").get<std::string>()) << where;
      ++rendered;
    } else {
      EXPECT_THROW(tmpl.render(messages, options), Error) << where << ": " << c.at("error");
      ++rejected;
    }
  }
  EXPECT_EQ(rendered + rejected, 182);
  EXPECT_GT(rejected, 0);
}

TEST(ChatTemplate, PlainChatMLExactStrings) {
  const ChatTemplate chatml(ChatFormat::ChatML);
  const std::vector<ChatMessage> messages = {{"system", "Be brief.", {}}, {"user", "Hi", {}}};
  EXPECT_EQ(chatml.render(messages),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chatml.render(messages, {.add_generation_prompt = false}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, ThinkingSwitchExactStrings) {
  const std::vector<ChatMessage> messages = {{"user", "Hi", {}}};
  const ChatTemplate qwen3(ChatFormat::Qwen3), qwen35(ChatFormat::Qwen35);
  EXPECT_EQ(qwen3.render(messages, {.enable_thinking = false}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(qwen3.render(messages, {.enable_thinking = true}), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(qwen35.render(messages, {.enable_thinking = true}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_FALSE(qwen3.prompt_opens_thinking({.enable_thinking = true}));
  EXPECT_TRUE(qwen35.prompt_opens_thinking({.enable_thinking = true}));
  EXPECT_FALSE(qwen35.prompt_opens_thinking({.enable_thinking = false}));
}

TEST(ChatTemplate, ToolCallTagsPassThrough) {
  const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  const std::vector<ChatMessage> messages = {
      {"user", "go", {}}, {"assistant", call, {}}, {"tool", "42", {}}};
  EXPECT_EQ(ChatTemplate(ChatFormat::Qwen3).render(messages, {.add_generation_prompt = false}),
            "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n" + call +
                "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n");
}

// tools/make_tool_chat_fixtures.py: the real templates rendered by jinja2 as transformers sets it
// up, with tools, assistant tool_calls and tool results (the tool objects keep their key order).
TEST(ChatTemplate, ToolsAndToolCallsMatchTheJinjaRendering) {
  using Ordered = nlohmann::ordered_json;
  const Ordered fixture = Ordered::parse(test::read_file(test::tokenizer_data_path("tool_chat_cases.json")));
  std::map<std::string, ChatTemplate> templates;
  for (const char* name : {"qwen3", "qwen3_6"}) {
    const auto text = test::read_file(test::tokenizer_data_path(std::string("templates/") + name + ".jinja"));
    templates.emplace(name, ChatTemplate::detect(text, name));
  }
  int rendered = 0;
  for (const auto& c : fixture.at("cases")) {
    const Ordered& conversation = fixture.at("conversations").at(c.at("conversation").get<std::string>());
    std::vector<ChatMessage> messages;
    for (const auto& m : conversation.at("messages")) {
      ChatMessage msg{m.at("role").get<std::string>(),
                      m.at("content").is_null() ? std::string() : m.at("content").get<std::string>(),
                      std::nullopt,
                      {}};
      if (m.contains("tool_calls"))
        for (const auto& call : m.at("tool_calls"))
          msg.tool_calls.push_back({call.at("function").at("name").get<std::string>(),
                                    call.at("function").at("arguments").get<std::string>()});
      messages.push_back(std::move(msg));
    }
    ChatRenderOptions options;
    options.enable_thinking = c.at("options").at("enable_thinking").get<bool>();
    for (const auto& tool : conversation.at("tools")) options.tools.push_back(tool.dump());
    const std::string where = c.at("template").get<std::string>() + " / " + c.at("conversation").get<std::string>() +
                              " / " + c.at("options").dump();
    EXPECT_EQ(templates.at(c.at("template").get<std::string>()).render(messages, options),
              c.at("expected").get<std::string>())
        << where;
    ++rendered;
  }
  EXPECT_EQ(rendered, 20);
}

TEST(ChatTemplate, ToolFormatPrefixesAndTojson) {
  EXPECT_EQ(python_tojson(R"({"b":[1,2.5,true,null],"a":"x\u0001\"\u00e9"})"),
            "{\"b\": [1, 2.5, true, null], \"a\": \"x\\u0001\\\"\u00e9\"}");
  EXPECT_EQ(tool_call_prefix(ToolCallFormat::Hermes, std::nullopt), "<tool_call>\n");
  EXPECT_EQ(tool_call_prefix(ToolCallFormat::Hermes, "f"), "<tool_call>\n{\"name\": \"f\", \"arguments\": ");
  EXPECT_EQ(tool_call_prefix(ToolCallFormat::Xml, "f"), "<tool_call>\n<function=f>\n");
  EXPECT_EQ(ChatTemplate(ChatFormat::Qwen35).tool_format(), ToolCallFormat::Xml);
  EXPECT_EQ(ChatTemplate(ChatFormat::Qwen3).tool_format(), ToolCallFormat::Hermes);
  // The XML format needs an arguments object.
  const std::vector<ChatMessage> messages = {{"user", "go", {}, {}}, {"assistant", "", {}, {{"f", "[1]"}}}};
  EXPECT_THROW(ChatTemplate(ChatFormat::Qwen35).render(messages), Error);
}

TEST(ChatTemplate, ErrorsNameTheSourceAndTheProblem) {
  try {
    ChatTemplate::detect("{{ bos_token }}{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %}", "mistral.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mistral.gguf"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.chat_template"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate::detect("<|im_start|><|im_end|>{{ reasoning_effort }}", "x"), Error);
  const std::vector<ChatMessage> bad_role = {{"narrator", "once", {}}};
  try {
    ChatTemplate(ChatFormat::ChatML).render(bad_role);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"narrator\""), std::string::npos) << e.what();
  }
}

// Feeds `reply` in every two-chunk split and char by char; the result must not depend on chunking.
void expect_filtered(const std::string& reply, bool starts_in_thinking, const std::string& thinking,
                     const std::string& answer) {
  std::vector<std::vector<std::string>> chunkings;
  for (size_t cut = 0; cut <= reply.size(); ++cut) chunkings.push_back({reply.substr(0, cut), reply.substr(cut)});
  std::vector<std::string> chars;
  for (char c : reply) chars.emplace_back(1, c);
  chunkings.push_back(chars);
  for (const auto& chunks : chunkings) {
    for (auto mode : {ThinkFilter::Mode::Hide, ThinkFilter::Mode::Show}) {
      ThinkFilter filter(mode, starts_in_thinking);
      std::string got_thinking, got_answer, visible;
      for (const auto& chunk : chunks) {
        auto d = filter.push(chunk);
        got_thinking += d.thinking;
        got_answer += d.answer;
        visible += d.visible;
      }
      auto d = filter.finish();
      got_thinking += d.thinking;
      got_answer += d.answer;
      visible += d.visible;
      ASSERT_EQ(got_thinking, thinking) << reply;
      ASSERT_EQ(got_answer, answer) << reply;
      ASSERT_EQ(visible, mode == ThinkFilter::Mode::Show ? reply : answer) << reply;
    }
  }
}

TEST(ThinkFilter, SplitsThinkingFromAnswerWhateverTheChunking) {
  expect_filtered("<think>\nLet me see.\n\nOK.\n</think>\n\nThe answer.", false, "Let me see.\n\nOK.", "The answer.");
  expect_filtered("Let me see.\n</think>\n\nThe answer.", true, "Let me see.", "The answer.");
  expect_filtered("\n<think>\n\n</think>\n\nNo thoughts.", false, "", "No thoughts.");
  expect_filtered("Plain answer <think>not a block</think>", false, "", "Plain answer <think>not a block</think>");
  expect_filtered("<think>\nunfinished\n", false, "unfinished\n", "");
  expect_filtered("<thin", false, "", "<thin");
  expect_filtered("", false, "", "");
}

}  // namespace
}  // namespace strata
