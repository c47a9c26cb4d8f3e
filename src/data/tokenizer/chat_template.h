// A model's chat template and the variables it renders with, found in a Hugging Face tokenizer
// folder the way transformers' from_pretrained finds them (docs/chat-templates.md):
//   - templates: when chat_template.jinja or additional_chat_templates/*.jinja exist, they replace
//     tokenizer_config.json's "chat_template" entirely (chat_template.jinja is "default", each
//     additional file is named by its stem); else the config's "chat_template", a string ("default")
//     or a list of {"name", "template"}; --chat-template FILE overrides all of them;
//   - which one renders a line: with several, "tool_use" when the line has tools and the folder has
//     one, else "default"; without "default" that is an error naming the templates there;
//   - variables: the special tokens of tokenizer_config.json (bos_token, eos_token, unk_token,
//     sep_token, pad_token, cls_token, mask_token; strings or AddedToken dicts {"content": ...}), as
//     transformers' special_tokens_map;
//   - end of turn for `generate`: generation_config.json's eos_token_id (an int or a list), else the
//     tokenizer's eos id.
// Templates are parsed once (data/tokenizer/jinja) and render on any thread.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer/jinja/jinja.h"

namespace shardlm::data::chat {

class ChatTemplates {
 public:
  // `tokenizer_dir`: the folder (or its tokenizer.json); `override_file`: --chat-template (empty: none).
  ChatTemplates(const std::string& tokenizer_dir, const std::string& override_file);

  // The template for a line with (or without) tools, and whether it has {% generation %} blocks.
  const jinja::Template& pick(bool has_tools) const;
  bool has_generation_blocks(bool has_tools) const;
  const std::string& source(bool has_tools) const;
  const std::string& name(bool has_tools) const;  // "default", "tool_use", or the file's path

  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  // generation_config.json's eos_token_id as a list (empty when the file or key is absent).
  const std::vector<int>& generation_eos_ids() const { return generation_eos_; }
  // The named templates as tokenizer_config.json's "chat_template" holds them (export writes it):
  // a string for one "default", else a list of {"name", "template"}.
  nlohmann::ordered_json config_value() const;

 private:
  struct Entry {
    std::string name, source;
    std::shared_ptr<jinja::Template> compiled;
    bool generation = false;
  };
  const Entry& entry(bool has_tools) const;
  std::vector<Entry> entries_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  std::vector<int> generation_eos_;
  std::string where_;
};

// The folder a --tokenizer path names (the path itself, or the folder of a tokenizer.json).
std::string tokenizer_folder(const std::string& path);

}  // namespace shardlm::data::chat
