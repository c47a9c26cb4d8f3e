// One conversation of fine-tuning data (`prepare --sft` on chat data, docs/chat-templates.md), read
// from one JSON line and normalised the way transformers' apply_chat_template normalises what it is
// given, so that a chat template sees exactly what it sees there:
//   - formats: OpenAI/TRL {"messages": [{"role", "content", ...}]} and ShareGPT {"conversations":
//     [{"from": "human"|"gpt"|"system"|"tool"|..., "value"}]} (from -> role, value -> content, other
//     keys kept), detected per line (Auto) or forced;
//   - a line's "tools" (a list) and "chat_template_kwargs" (an object whose keys become template
//     variables, as TRL passes them) are read; other top-level keys (ids, sources) are ignored;
//   - in each message, keys whose value is null are dropped, and reasoning given as "thinking" or
//     "reasoning" is aliased as transformers does ({"thinking": r, **message, "reasoning_content": r});
//   - roles are system, developer, user, assistant, tool, ipython; anything else is refused, as is a
//     conversation without an assistant turn (nothing to learn from).
// Errors are ConversationError, whose message says what is wrong and how to fix it.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardlm::data::chat {

enum class ChatFormat { Auto, Messages, ShareGpt };
// "auto" | "messages" | "sharegpt" (prepare's --format, less "pairs").
ChatFormat parse_chat_format(const std::string& name);

struct ConversationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Conversation {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // normalised, see above
  nlohmann::ordered_json tools;                                        // null when the line has none
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();    // chat_template_kwargs
  std::vector<size_t> assistant_turns;                                 // indexes into messages
};

// Whether a JSON object holds a conversation ("messages" or "conversations").
bool is_conversation(const nlohmann::ordered_json& line);

// Parses one line (or its parsed JSON); throws ConversationError. require_assistant: refuse a conversation without an
// assistant turn (fine-tuning data; generate's --messages passes false).
Conversation parse_conversation(const std::string& line, ChatFormat format, bool require_assistant = true);
Conversation conversation_from_json(const nlohmann::ordered_json& line, ChatFormat format, bool require_assistant = true);

// The variables a chat template renders with, as apply_chat_template passes them: messages (the
// first n_messages), tools (null without), documents (null), add_generation_prompt, then the special
// tokens (bos_token, ...: an object of strings), then the line's chat_template_kwargs (which win).
nlohmann::ordered_json render_context(const Conversation& c, size_t n_messages, bool add_generation_prompt,
                                      const nlohmann::ordered_json& special_tokens);

}  // namespace shardlm::data::chat
