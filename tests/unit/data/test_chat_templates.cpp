// Conversations rendered with real chat templates (data/tokenizer/, data/prep/): for every template of
// tests/data/chat_templates/ x every conversation that tests/reference/make_chat_cases.py renders
// with the pinned transformers (fixture reference_chat_cases, which ctest runs first), shardlm gives
// the same text, the same ids (apply_chat_template(tokenize=True)), the same generation prompt, the
// same refusals (the template's raise_exception message), and the loss masks of chat_masks.h that
// the script computes from transformers' renderings and tokenizers' offsets, return_assistant_tokens_mask's
// for {% generation %} templates; plus the per-line rules of conversation.h.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/prep/chat_masks.h"
#include "data/prep/conversation.h"
#include "data/tokenizer/chat_template.h"
#include "data/tokenizer/jinja/jinja.h"
#include "data/tokenizer/tokenizer.h"
#include "test_helpers.h"
#include "util/error.h"

namespace shardlm::data::chat {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string cases_dir() {
#ifdef SHARDLM_CHAT_CASES_DIR
  return SHARDLM_CHAT_CASES_DIR;
#else
  return "";
#endif
}

std::vector<ojson> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<ojson> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(ojson::parse(line));
  }
  return out;
}

std::vector<unsigned char> as_bytes(const ojson& a) {
  std::vector<unsigned char> v;
  for (const ojson& x : a) v.push_back(static_cast<unsigned char>(x.get<int>()));
  return v;
}

TEST(ChatTemplates, EveryTemplateAndConversationMatchesTransformers) {
  const fs::path dir = cases_dir();
  if (dir.empty() || !fs::exists(dir / "conversations.jsonl")) {
    FAIL() << "no golden cases in " << dir << ": ctest makes them first (fixture reference_chat_cases)";
  }
  std::ifstream meta_in(dir / "meta.json");
  jinja::set_template_date(ojson::parse(meta_in)["template_date"].get<std::string>());
  const std::vector<ojson> conversations = read_lines(dir / "conversations.jsonl");
  ASSERT_GE(conversations.size(), 20u);
  int templates = 0, rendered = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    ++templates;
    const ChatTemplates chat(entry.path().string(), "");
    const Tokenizer tok(entry.path().string());
    for (const ojson& golden : read_lines(entry.path() / "cases.jsonl")) {
      const size_t k = golden["conversation"].get<size_t>();
      SCOPED_TRACE(name + " conversation " + std::to_string(k));
      const Conversation c = conversation_from_json(conversations.at(k), ChatFormat::Messages, false);
      const size_t n = c.messages.size();
      if (golden.contains("error")) {
        try {
          render_conversation(chat, c, n, false);
          ADD_FAILURE() << "rendered, but transformers raised: " << golden["error"];
        } catch (const jinja::TemplateError& e) {
          if (golden["template_error"].get<bool>()) {
            EXPECT_TRUE(e.raised_by_template);
            EXPECT_EQ(std::string(e.what()), golden["error"].get<std::string>());
          }
        }
        continue;
      }
      const std::string text = render_conversation(chat, c, n, false);
      ASSERT_EQ(text, golden["text"].get<std::string>());
      const std::vector<int> ids = tok.encode(text, /*add_special_tokens=*/false);
      EXPECT_EQ(ids, golden["ids"].get<std::vector<int>>());
      ++rendered;
      const size_t prompt_n = c.assistant_turns.empty() ? n : c.assistant_turns.back();
      if (golden.contains("prompt_text")) {
        const std::string prompt = render_conversation(chat, c, prompt_n, true);
        EXPECT_EQ(prompt, golden["prompt_text"].get<std::string>());
        EXPECT_EQ(tok.encode(prompt, false), golden["prompt_ids"].get<std::vector<int>>());
      }
      if (c.assistant_turns.empty()) continue;
      if (golden.contains("mask_error")) {
        EXPECT_ANY_THROW(encode_conversation(chat, tok, c, TrainOn::Assistant));
        continue;
      }
      const ChatSample all = encode_conversation(chat, tok, c, TrainOn::Assistant);
      EXPECT_EQ(all.ids, ids);
      if (golden.contains("generation_mask")) {
        EXPECT_EQ(all.counts, as_bytes(golden["generation_mask"])) << "return_assistant_tokens_mask";
      } else {
        EXPECT_EQ(all.counts, as_bytes(golden["mask"])) << "--train-on assistant";
        EXPECT_EQ(all.left_out, golden["left_out"].get<int>());
      }
      const ChatSample last = encode_conversation(chat, tok, c, TrainOn::Last);
      EXPECT_EQ(last.counts, as_bytes(golden["mask_last"])) << "--train-on last";
    }
  }
  EXPECT_GE(templates, 12);
  EXPECT_GE(rendered, 12 * 20);
  // A real SentencePiece-style (Metaspace) tokenizer with its own template, plain and with generation blocks.
  for (const char* real : {"mistralai-Mistral-7B-Instruct-v0.3", "mistralai-Mistral-7B-Instruct-v0.3-generation"})
    EXPECT_TRUE(fs::exists(dir / real / "cases.jsonl")) << real << " is missing from " << dir;
  jinja::set_template_date("");
}

TEST(ChatConversation, NormalisesAsTransformers) {
  const Conversation c = parse_conversation(
      R"({"messages": [{"role": "user", "content": "q", "name": null},
                       {"role": "assistant", "content": "a", "reasoning": "r", "tool_calls": null}],
          "id": 7, "chat_template_kwargs": {"enable_thinking": false}})",
      ChatFormat::Auto);
  EXPECT_EQ(c.messages[0].dump(), R"({"role":"user","content":"q"})");
  // {"thinking": r, **message, "reasoning_content": r}
  EXPECT_EQ(c.messages[1].dump(), R"({"thinking":"r","role":"assistant","content":"a","reasoning":"r","reasoning_content":"r"})");
  EXPECT_EQ(c.assistant_turns, std::vector<size_t>{1});
  EXPECT_EQ(c.kwargs.dump(), R"({"enable_thinking":false})");
  EXPECT_TRUE(c.tools.is_null());
  const ojson ctx = render_context(c, 1, true, ojson{{"bos_token", "<s>"}});
  EXPECT_EQ(ctx["messages"].size(), 1u);
  EXPECT_TRUE(ctx["add_generation_prompt"].get<bool>());
  EXPECT_EQ(ctx["bos_token"], "<s>");
  EXPECT_FALSE(ctx["enable_thinking"].get<bool>());
}

TEST(ChatConversation, ReadsShareGpt) {
  const Conversation c = parse_conversation(
      R"({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})",
      ChatFormat::Auto);
  EXPECT_EQ(c.messages.dump(),
            R"([{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"a"}])");
}

TEST(ChatConversation, RefusesBadLinesNamingTheProblem) {
  const auto error_of = [](const std::string& line, ChatFormat f = ChatFormat::Auto) {
    try {
      parse_conversation(line, f);
    } catch (const ConversationError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p"})").find("no \"messages\""), std::string::npos);
  EXPECT_NE(error_of(R"({"messages": [{"role": "robot", "content": "x"}]})").find("unknown role \"robot\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"messages": [{"role": "user", "content": "x"}]})").find("no assistant turn"), std::string::npos);
  EXPECT_NE(error_of(R"({"conversations": [{"from": "alien", "value": "x"}]})").find("\"alien\""), std::string::npos);
  EXPECT_NE(error_of(R"({"messages": []})").find("empty"), std::string::npos);
  EXPECT_NE(error_of(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "tools": 3})")
                .find("\"tools\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"conversations": []})", ChatFormat::Messages).find("--format messages"), std::string::npos);
}

// transformers' order: chat_template.jinja and additional_chat_templates/ replace the config's key;
// a list of named templates gives tool_use to lines with tools; --chat-template overrides all.
TEST(ChatTemplateFiles, AreFoundInTransformersOrder) {
  testing::TempDir dir;
  const auto one = [&](bool tools) {
    Conversation c;
    c.messages = ojson::array({ojson{{"role", "user"}, {"content", "q"}}});
    if (tools) c.tools = ojson::array();
    return c;
  };
  const auto rendered = [&](const ChatTemplates& t, bool tools) { return render_conversation(t, one(tools), 1, false); };
  testing::write_text(dir.file("tokenizer_config.json"),
                      R"({"bos_token": {"content": "<B>", "special": true}, "eos_token": "<E>",
                          "chat_template": [{"name": "default", "template": "d{{ bos_token }}"},
                                            {"name": "tool_use", "template": "t{{ eos_token }}"}]})");
  const ChatTemplates listed(dir.path().string(), "");
  EXPECT_EQ(rendered(listed, false), "d<B>");
  EXPECT_EQ(rendered(listed, true), "t<E>");
  EXPECT_EQ(listed.special_tokens().dump(), R"({"bos_token":"<B>","eos_token":"<E>"})");
  EXPECT_TRUE(listed.config_value().is_array());

  testing::write_text(dir.file("chat_template.jinja"), "file");
  const ChatTemplates file(dir.path().string(), "");
  EXPECT_EQ(rendered(file, true), "file");  // the file replaces the config's list entirely
  EXPECT_EQ(file.config_value(), "file");

  std::filesystem::create_directories(dir.path() / "additional_chat_templates");
  testing::write_text(dir.file("additional_chat_templates/tool_use.jinja"), "extra tool");
  const ChatTemplates both(dir.path().string(), "");
  EXPECT_EQ(rendered(both, false), "file");
  EXPECT_EQ(rendered(both, true), "extra tool");

  testing::write_text(dir.file("mine.jinja"), "{% generation %}mine{% endgeneration %}");
  const ChatTemplates overridden(dir.path().string(), dir.file("mine.jinja"));
  EXPECT_EQ(rendered(overridden, true), "mine");
  EXPECT_TRUE(overridden.has_generation_blocks(false));

  std::filesystem::remove(dir.file("chat_template.jinja"));
  const ChatTemplates no_default(dir.path().string(), "");
  EXPECT_EQ(rendered(no_default, true), "extra tool");
  EXPECT_THROW(rendered(no_default, false), Error);

  testing::TempDir empty;
  testing::write_text(empty.file("tokenizer_config.json"), R"({"eos_token": "<E>"})");
  try {
    ChatTemplates none(empty.path().string(), "");
    ADD_FAILURE() << "a folder without a template was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos);
  }
  testing::write_text(empty.file("generation_config.json"), R"({"eos_token_id": [7, 9]})");
  const ChatTemplates eos(empty.path().string(), dir.file("mine.jinja"));
  EXPECT_EQ(eos.generation_eos_ids(), (std::vector<int>{7, 9}));
}

}  // namespace
}  // namespace shardlm::data::chat
