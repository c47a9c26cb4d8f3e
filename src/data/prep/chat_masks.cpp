// Rendering, encoding and masking one conversation: the rules are in chat_masks.h.
#include "data/prep/chat_masks.h"

#include <algorithm>

#include "util/error.h"

namespace shardlm::data::chat {
namespace {

using Span = std::pair<size_t, size_t>;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// The length of the common prefix of a and b, cut back to a character boundary of b.
size_t common_prefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  if (i == b.size()) return i;
  while (i > 0 && (static_cast<unsigned char>(b[i]) & 0xC0) == 0x80) --i;
  return i;
}

// 1 for each token whose bytes lie inside one of the spans.
std::vector<unsigned char> tokens_inside(const std::vector<Span>& tokens, const std::vector<Span>& spans) {
  std::vector<unsigned char> out(tokens.size(), 0);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto [b, e] = tokens[t];
    if (b >= e) continue;
    for (const Span& s : spans) {
      if (s.first <= b && e <= s.second) {
        out[t] = 1;
        break;
      }
    }
  }
  return out;
}

// The token holding byte `at` (the first such token), or -1.
long token_at(const std::vector<Span>& tokens, size_t at) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t].first <= at && at < tokens[t].second) return static_cast<long>(t);
  }
  return -1;
}

// transformers' return_assistant_tokens_mask over generation spans (byte spans of the text).
std::vector<unsigned char> generation_mask(const std::vector<Span>& tokens, const std::vector<Span>& blocks,
                                           const std::string& text) {
  std::vector<unsigned char> out(tokens.size(), 0);
  for (const auto& [begin, end] : blocks) {
    const long start = token_at(tokens, begin);
    if (start < 0) break;  // as transformers: a block past the tokens ends the marking
    size_t last_char = end == 0 ? 0 : end - 1;
    while (last_char > 0 && (static_cast<unsigned char>(text[last_char]) & 0xC0) == 0x80) --last_char;
    const long stop = end == 0 ? -1 : token_at(tokens, last_char);
    // range(start, stop + 1 if stop else len): a stop of token 0 (or none) marks to the end, as there.
    const long until = stop > 0 ? stop + 1 : static_cast<long>(tokens.size());
    for (long t = start; t < until; ++t) out[static_cast<size_t>(t)] = 1;
  }
  return out;
}

}  // namespace

TrainOn parse_train_on(const std::string& name) {
  if (name == "assistant") return TrainOn::Assistant;
  if (name == "last") return TrainOn::Last;
  fail("--train-on ", name, " is neither assistant (every assistant turn) nor last (the final assistant turn)");
}

std::string render_conversation(const ChatTemplates& templates, const Conversation& c, size_t n,
                                bool add_generation_prompt) {
  if (n == 0) {
    throw ConversationError("opens with an assistant turn, which no prompt leads to; start it with a user (or system) turn");
  }
  const bool tools = !c.tools.is_null();
  return templates.pick(tools).render(render_context(c, n, add_generation_prompt, templates.special_tokens()));
}

std::vector<Span> token_byte_spans(const Tokenizer& tok, const std::string& text, const std::vector<int>& ids) {
  std::vector<Span> out;
  out.reserve(ids.size());
  size_t at = 0;
  for (int id : ids) {
    const std::string s = tok.token_bytes(id);
    if (text.compare(at, s.size(), s) == 0) {
      out.emplace_back(at, at + s.size());
      at += s.size();
    } else if (!s.empty() && s[0] == ' ' && text.compare(at, s.size() - 1, s, 1, std::string::npos) == 0) {
      out.emplace_back(at, at + s.size() - 1);  // a space the tokenizer prepended (Metaspace, Prepend)
      at += s.size() - 1;
    } else {
      fail("tokenizer ", tok.path(), ": token ", id, " does not spell the rendered text at byte ", at,
           " (its normalizer rewrites the text), so which tokens are the assistant's cannot be told");
    }
  }
  if (at != text.size()) {
    fail("tokenizer ", tok.path(), ": the tokens spell ", at, " of the rendered text's ", text.size(), " bytes");
  }
  return out;
}

ChatSample encode_conversation(const ChatTemplates& templates, const Tokenizer& tok, const Conversation& c,
                               TrainOn train_on) {
  ChatSample out;
  const bool tools = !c.tools.is_null();
  const jinja::Template& tmpl = templates.pick(tools);
  const nlohmann::ordered_json& special = templates.special_tokens();
  std::vector<Span> blocks;
  const bool generation = train_on == TrainOn::Assistant && templates.has_generation_blocks(tools);
  out.text = tmpl.render(render_context(c, c.messages.size(), false, special), generation ? &blocks : nullptr);
  out.ids = tok.encode(out.text, /*add_special_tokens=*/false);
  const std::vector<Span> tokens = token_byte_spans(tok, out.text, out.ids);
  if (generation) {
    out.counts = generation_mask(tokens, blocks, out.text);
    return out;
  }
  const auto render = [&](size_t n, bool agp) { return render_conversation(templates, c, n, agp); };
  const std::vector<size_t>& turns = c.assistant_turns;
  if (turns.empty()) throw ConversationError("has no assistant turn");
  const size_t floor = common_prefix(render(turns[0], true), out.text);
  std::vector<Span> spans;
  if (train_on == TrainOn::Assistant) {
    for (size_t k = 0; k + 1 < turns.size(); ++k) {
      const std::string p = render(turns[k], true), f = render(turns[k] + 1, false);
      if (starts_with(out.text, f) && starts_with(f, p)) {
        spans.emplace_back(p.size(), f.size());
      } else {
        ++out.left_out;
      }
    }
  }
  const size_t last = turns.back();
  const size_t lo = std::max(common_prefix(render(last, true), out.text), floor);
  const size_t hi = common_prefix(render(last + 1, false), out.text);
  if (hi > lo) spans.emplace_back(lo, hi);
  out.counts = tokens_inside(tokens, spans);
  return out;
}

}  // namespace shardlm::data::chat
