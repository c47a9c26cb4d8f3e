// Reading and normalising one conversation line: the rules are in conversation.h.
#include "data/prep/conversation.h"

#include <algorithm>
#include <array>

namespace shardlm::data::chat {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::array<const char*, 6> kRoles = {"system", "developer", "user", "assistant", "tool", "ipython"};

[[noreturn]] void refuse(const std::string& what) { throw ConversationError(what); }

// ShareGPT's speakers as roles (the names axolotl and LLaMA-Factory accept).
std::string sharegpt_role(const std::string& from) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant" || from == "model") return "assistant";
  if (from == "system") return "system";
  if (from == "tool" || from == "function" || from == "observation") return "tool";
  refuse("has a ShareGPT turn from \"" + from +
         "\"; the speakers are human, gpt, system and tool (or function/observation)");
}

// A message with null values dropped and reasoning aliased (transformers' _alias_reasoning_fields).
ojson normalise_message(const ojson& m) {
  ojson out = ojson::object();
  for (const auto& [k, v] : m.items()) {
    if (!v.is_null()) out[k] = v;
  }
  const ojson* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    if (out.contains(key)) {
      reasoning = &out[key];
      break;
    }
  }
  if (!reasoning) return out;
  ojson r = *reasoning;
  ojson aliased = ojson::object();
  aliased["thinking"] = r;
  for (const auto& [k, v] : out.items()) aliased[k] = v;  // a "thinking" of the message keeps its value
  aliased["reasoning_content"] = r;
  return aliased;
}

}  // namespace

ChatFormat parse_chat_format(const std::string& name) {
  if (name == "auto") return ChatFormat::Auto;
  if (name == "messages") return ChatFormat::Messages;
  if (name == "sharegpt") return ChatFormat::ShareGpt;
  refuse("--format " + name + " is none of auto, messages, sharegpt");
}

bool is_conversation(const ojson& line) {
  return line.is_object() && (line.contains("messages") || line.contains("conversations"));
}

Conversation parse_conversation(const std::string& line, ChatFormat format, bool require_assistant) {
  ojson j;
  try {
    j = ojson::parse(line);
  } catch (const ojson::parse_error& e) {
    refuse(std::string("is not valid JSON (") + e.what() + ")");
  }
  return conversation_from_json(j, format, require_assistant);
}

Conversation conversation_from_json(const ojson& j, ChatFormat format, bool require_assistant) {
  if (!j.is_object()) refuse(std::string("is a JSON ") + j.type_name() + ", not an object with \"messages\"");
  if (format == ChatFormat::Auto) {
    if (j.contains("messages")) {
      format = ChatFormat::Messages;
    } else if (j.contains("conversations")) {
      format = ChatFormat::ShareGpt;
    } else {
      std::string keys;
      for (const auto& kv : j.items()) keys += (keys.empty() ? "" : ", ") + kv.key();
      refuse("has no \"messages\" (OpenAI/TRL) and no \"conversations\" (ShareGPT) list (its keys: " + keys + ")");
    }
  }
  const char* list_key = format == ChatFormat::Messages ? "messages" : "conversations";
  const auto list = j.find(list_key);
  if (list == j.end() || !list->is_array()) {
    refuse(std::string("has no \"") + list_key + "\" list" +
           (format == ChatFormat::Messages ? " (--format messages)" : " (--format sharegpt)"));
  }
  if (list->empty()) refuse(std::string("has an empty \"") + list_key + "\" list");
  Conversation c;
  for (size_t i = 0; i < list->size(); ++i) {
    const ojson& raw = (*list)[i];
    const std::string at = std::string("\"") + list_key + "\"[" + std::to_string(i) + "]";
    if (!raw.is_object()) refuse(at + " is a JSON " + raw.type_name() + ", not an object");
    ojson m = ojson::object();
    if (format == ChatFormat::ShareGpt) {
      const auto from = raw.find("from");
      if (from == raw.end() || !from->is_string()) refuse(at + " has no string \"from\"");
      m["role"] = sharegpt_role(from->get<std::string>());
      for (const auto& [k, v] : raw.items()) {
        if (k == "from") continue;
        m[k == "value" ? "content" : k] = v;
      }
    } else {
      m = raw;
    }
    m = normalise_message(m);
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) refuse(at + " has no string \"role\"");
    const std::string r = role->get<std::string>();
    if (std::find(kRoles.begin(), kRoles.end(), r) == kRoles.end()) {
      refuse(at + " has the unknown role \"" + r + "\"; roles are system, developer, user, assistant, tool, ipython");
    }
    if (r == "assistant") c.assistant_turns.push_back(i);
    c.messages.push_back(std::move(m));
  }
  if (require_assistant && c.assistant_turns.empty()) {
    refuse("has no assistant turn, so nothing in it would count in the loss; add the assistant's reply or drop the line");
  }
  if (const auto t = j.find("tools"); t != j.end() && !t->is_null()) {
    if (!t->is_array()) refuse(std::string("has \"tools\" as a JSON ") + t->type_name() + ", not a list of tool schemas");
    c.tools = *t;
  }
  if (const auto k = j.find("chat_template_kwargs"); k != j.end() && !k->is_null()) {
    if (!k->is_object()) {
      refuse(std::string("has \"chat_template_kwargs\" as a JSON ") + k->type_name() + ", not an object of variables");
    }
    c.kwargs = *k;
  }
  return c;
}

ojson render_context(const Conversation& c, size_t n_messages, bool add_generation_prompt, const ojson& special_tokens) {
  ojson ctx = ojson::object();
  ojson messages = ojson::array();
  for (size_t i = 0; i < n_messages && i < c.messages.size(); ++i) messages.push_back(c.messages[i]);
  ctx["messages"] = std::move(messages);
  ctx["tools"] = c.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, v] : special_tokens.items()) ctx[k] = v;
  for (const auto& [k, v] : c.kwargs.items()) ctx[k] = v;
  return ctx;
}

}  // namespace shardlm::data::chat
