// Finding a tokenizer folder's chat templates and special tokens: the rules are in chat_template.h.
#include "data/tokenizer/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "util/error.h"

namespace shardlm::data::chat {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("cannot read ", p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

ojson read_json_file(const fs::path& p) {
  try {
    return ojson::parse(read_text(p));
  } catch (const ojson::parse_error& e) {
    fail(p.string(), " is not valid JSON (", e.what(), ")");
  }
}

// A special token as tokenizer_config.json writes it: a string or an AddedToken dict.
bool token_text(const ojson& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    *out = v["content"].get<std::string>();
    return true;
  }
  return false;
}

bool has_generation(const std::string& source) {
  static const std::regex re(R"(\{%-?\s*generation\s*-?%\})");
  return std::regex_search(source, re);
}

}  // namespace

std::string tokenizer_folder(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) return p.string();
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

ChatTemplates::ChatTemplates(const std::string& tokenizer_dir, const std::string& override_file) {
  const fs::path dir(tokenizer_folder(tokenizer_dir));
  where_ = dir.string();
  std::error_code ec;
  ojson config = ojson::object();
  if (fs::is_regular_file(dir / "tokenizer_config.json", ec)) config = read_json_file(dir / "tokenizer_config.json");
  if (!config.is_object()) fail(dir.string(), "/tokenizer_config.json is not a JSON object");
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    std::string text;
    if (config.contains(key) && token_text(config[key], &text)) special_tokens_[key] = text;
  }
  if (fs::is_regular_file(dir / "generation_config.json", ec)) {
    const ojson g = read_json_file(dir / "generation_config.json");
    if (g.is_object() && g.contains("eos_token_id")) {
      const ojson& e = g["eos_token_id"];
      if (e.is_number_integer()) generation_eos_.push_back(e.get<int>());
      if (e.is_array()) {
        for (const ojson& x : e) {
          if (!x.is_number_integer()) fail(dir.string(), "/generation_config.json: eos_token_id holds a non-integer");
          generation_eos_.push_back(x.get<int>());
        }
      }
    }
  }

  std::vector<std::pair<std::string, std::string>> named;  // name -> source
  if (!override_file.empty()) {
    if (!fs::is_regular_file(override_file, ec)) fail("--chat-template ", override_file, " is not a file");
    named.emplace_back("default", read_text(override_file));
    where_ = override_file;
  } else {
    if (fs::is_regular_file(dir / "chat_template.jinja", ec)) named.emplace_back("default", read_text(dir / "chat_template.jinja"));
    const fs::path extra = dir / "additional_chat_templates";
    if (fs::is_directory(extra, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(extra)) {
        if (e.path().extension() == ".jinja") files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) named.emplace_back(f.stem().string(), read_text(f));
    }
    if (named.empty() && config.contains("chat_template")) {
      const ojson& t = config["chat_template"];
      if (t.is_string()) {
        named.emplace_back("default", t.get<std::string>());
      } else if (t.is_array()) {
        for (const ojson& item : t) {
          if (!item.is_object() || !item.contains("name") || !item.contains("template") || !item["name"].is_string() ||
              !item["template"].is_string()) {
            fail(dir.string(), "/tokenizer_config.json: chat_template is a list whose items are not {\"name\", \"template\"}");
          }
          named.emplace_back(item["name"].get<std::string>(), item["template"].get<std::string>());
        }
      } else if (!t.is_null()) {
        fail(dir.string(), "/tokenizer_config.json: chat_template is a JSON ", t.type_name(), ", not a string or a list");
      }
    }
  }
  if (named.empty()) {
    fail("tokenizer folder ", dir.string(), " has no chat template (no chat_template.jinja, no chat_template in ",
         "tokenizer_config.json); pass the model's template with --chat-template FILE");
  }
  for (auto& [name, source] : named) {
    Entry e;
    e.name = name;
    e.generation = has_generation(source);
    try {
      e.compiled = std::make_shared<jinja::Template>(source);
    } catch (const std::exception& ex) {
      fail("chat template \"", name, "\" of ", where_, " cannot be rendered here: ", ex.what());
    }
    e.source = std::move(source);
    entries_.push_back(std::move(e));
  }
}

const ChatTemplates::Entry& ChatTemplates::entry(bool has_tools) const {
  if (entries_.size() == 1 && entries_[0].name == "default") return entries_[0];
  const auto find = [&](const char* n) {
    return std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == n; });
  };
  if (has_tools) {
    if (const auto it = find("tool_use"); it != entries_.end()) return *it;
  }
  if (const auto it = find("default"); it != entries_.end()) return *it;
  std::string names;
  for (const Entry& e : entries_) names += (names.empty() ? "" : ", ") + e.name;
  fail("the tokenizer folder ", where_, " has several chat templates (", names, ") and none named \"default\"",
       has_tools ? "" : " (\"tool_use\" renders only lines with tools)", "; pass one with --chat-template FILE");
}

const jinja::Template& ChatTemplates::pick(bool has_tools) const { return *entry(has_tools).compiled; }
bool ChatTemplates::has_generation_blocks(bool has_tools) const { return entry(has_tools).generation; }
const std::string& ChatTemplates::source(bool has_tools) const { return entry(has_tools).source; }
const std::string& ChatTemplates::name(bool has_tools) const { return entry(has_tools).name; }

ojson ChatTemplates::config_value() const {
  if (entries_.size() == 1 && entries_[0].name == "default") return entries_[0].source;
  ojson list = ojson::array();
  for (const Entry& e : entries_) list.push_back(ojson{{"name", e.name}, {"template", e.source}});
  return list;
}

}  // namespace shardlm::data::chat
