// One conversation -> its token ids and which of them count in the loss (docs/chat-templates.md).
// The ids are those of transformers' apply_chat_template(messages, tokenize=True): the template's
// rendering encoded without the tokenizer's own special tokens (add_special_tokens=False), so BOS
// appears only where the template writes it. Which tokens count (--train-on):
//   - assistant (default): for every assistant turn i, a token counts when all of its bytes lie in
//     [len(render(messages[:i], add_generation_prompt=True)), len(render(messages[:i+1]))) of the full
//     rendering: the reply and its end-of-turn tokens. An earlier turn whose two renderings are not
//     prefixes of the full one (templates that rewrite earlier turns, or open the generation prompt
//     with text the full rendering lacks) counts nothing and is counted as left out; the final turn
//     then counts from where render(messages[:last], add_generation_prompt=True) departs from the
//     full rendering (their common prefix) to where render(messages[:last+1]) departs from it;
//     nothing before the first assistant turn's generation prompt ends ever counts;
//   - a template with {% generation %} blocks uses them instead, as transformers'
//     return_assistant_tokens_mask does (the token holding a block's first character through the
//     token holding its last, so tokens straddling a block's ends count);
//   - last: only the final turn, by the rule above.
// Spans are measured in bytes of the rendered text and cut back to character boundaries, which
// counts the same tokens as transformers' character offsets. A token's bytes are found by laying
// the tokens' bytes (Tokenizer::token_bytes) along the text; a tokenizer whose tokens do not spell
// the text (a normalizer that rewrites it) is refused, never approximated.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "data/prep/conversation.h"
#include "data/tokenizer/chat_template.h"
#include "data/tokenizer/tokenizer.h"

namespace shardlm::data::chat {

enum class TrainOn { Assistant, Last };
TrainOn parse_train_on(const std::string& name);  // "assistant" | "last"

struct ChatSample {
  std::string text;                   // the full rendering
  std::vector<int> ids;               // its ids
  std::vector<unsigned char> counts;  // per token: 1 when it counts in the loss
  int left_out = 0;                   // earlier assistant turns the prefix rule left out
};

// Renders and encodes c. Throws jinja::TemplateError (the template's raise_exception or a render
// error), ConversationError, or shardlm::Error (tokens that do not spell the text).
ChatSample encode_conversation(const ChatTemplates& templates, const Tokenizer& tok, const Conversation& c,
                               TrainOn train_on);

// The rendering of c's first n messages, as apply_chat_template(tokenize=False) gives it.
std::string render_conversation(const ChatTemplates& templates, const Conversation& c, size_t n,
                                bool add_generation_prompt);

// The byte span [begin, end) of each token of `ids` in `text` (see above).
std::vector<std::pair<size_t, size_t>> token_byte_spans(const Tokenizer& tok, const std::string& text,
                                                        const std::vector<int>& ids);

}  // namespace shardlm::data::chat
