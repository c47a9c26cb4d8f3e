// tokenizer.json: reading the file (every component checked against what is implemented, unknown
// keys refused unless listed as math-neutral), the added-token matching of tokenizers'
// AddedVocabulary, and encode/decode as TokenizerImpl runs them. The stages themselves are in
// hf_components.cpp, the model in hf_bpe.cpp, the added-token trie in hf_added_trie.cpp.
#include "data/tokenizer/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "data/tokenizer/hf_added_trie.h"
#include "data/tokenizer/hf_bpe.h"
#include "data/tokenizer/hf_components.h"
#include "data/tokenizer/hf_text.h"
#include "util/error.h"

namespace shardlm::data {

using nlohmann::json;
using namespace hf;

namespace {

struct AddedToken {
  int id = -1;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

char32_t last_char(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return next_char(s, start);
}

char32_t single_code_point(const json& j, const std::string& what) {
  const std::string s = j.get<std::string>();
  size_t i = 0;
  if (s.empty()) fail(what, " must be one character, not an empty string");
  const char32_t c = next_char(s, i);
  if (i != s.size()) fail(what, " must be one character, not ", s);
  return c;
}

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  std::vector<std::unique_ptr<Normalizer>> normalizers;
  std::vector<std::unique_ptr<PreTokenizer>> pre_tokenizers;
  std::unique_ptr<Bpe> model;
  std::vector<std::unique_ptr<Decoder>> decoders;
  bool has_decoder = false;
  std::vector<int> prefix_ids, suffix_ids;  // what the post-processor adds around the sequence
  std::vector<AddedToken> added;
  std::unordered_map<int, size_t> added_by_id;
  std::unordered_map<std::string, int> added_by_content;
  std::unordered_map<int, std::string> decode_form;  // normalized forms used when decoding
  std::unordered_set<std::string> special_contents;
  Trie raw_trie, normalized_trie;
  int max_id = -1;

  // ---- parsing helpers ----
  [[noreturn]] void refuse(const std::string& component, const std::string& why) const {
    fail("tokenizer ", path, ": ", component, " ", why,
         "; shardlm implements only what it can reproduce token for token (see src/data/tokenizer/hf_tokenizer.h)");
  }
  void check_keys(const json& j, const std::string& component,
                  std::initializer_list<const char*> known) const {
    if (!j.is_object()) refuse(component, "is not a JSON object");
    for (const auto& [key, value] : j.items()) {
      bool ok = false;
      for (const char* k : known) ok = ok || key == k;
      if (!ok) {
        std::string list;
        for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
        refuse(component, "has the key \"" + key + "\", which shardlm does not know (known: " + list + ")");
      }
    }
  }
  static std::string type_of(const json& j) {
    return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
  }
  bool get_bool(const json& j, const char* key, bool dflt) const {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    return j[key].get<bool>();
  }
  Pattern parse_pattern(const json& j, const std::string& component) const {
    if (!j.is_object() || j.size() != 1) refuse(component, "has a pattern that is neither {\"String\": ...} nor {\"Regex\": ...}");
    if (j.contains("String")) {
      const std::string s = j["String"].get<std::string>();
      if (s.empty()) refuse(component, "has an empty String pattern");
      return Pattern::literal(s);
    }
    if (j.contains("Regex")) return Pattern::regex(j["Regex"].get<std::string>(), "tokenizer " + path + ": " + component);
    refuse(component, "has a pattern that is neither {\"String\": ...} nor {\"Regex\": ...}");
  }
  PrependScheme parse_scheme(const json& j, const std::string& component) const {
    PrependScheme scheme = PrependScheme::Always;
    if (j.contains("prepend_scheme")) {
      const std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "first") scheme = PrependScheme::First;
      else if (s == "never") scheme = PrependScheme::Never;
      else if (s == "always") scheme = PrependScheme::Always;
      else refuse(component, "has prepend_scheme \"" + s + "\" (known: first, always, never)");
    }
    if (j.contains("add_prefix_space") && !j["add_prefix_space"].is_null() && !j["add_prefix_space"].get<bool>()) {
      if (scheme != PrependScheme::Never) refuse(component, "has add_prefix_space false but prepend_scheme not never (tokenizers refuses it too)");
    }
    return scheme;
  }

  void parse_normalizer(const json& j) {
    if (j.is_null()) return;
    const std::string t = type_of(j);
    const std::string c = "normalizer " + (t.empty() ? std::string("(no type)") : t);
    if (t == "Sequence") {
      check_keys(j, c, {"type", "normalizers"});
      for (const json& n : j["normalizers"]) parse_normalizer(n);
    } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
      check_keys(j, c, {"type"});
      const NormForm f = t == "NFC" ? NormForm::NFC : t == "NFD" ? NormForm::NFD : t == "NFKC" ? NormForm::NFKC : NormForm::NFKD;
      normalizers.push_back(std::make_unique<UnicodeNormalizer>(f));
    } else if (t == "Prepend") {
      check_keys(j, c, {"type", "prepend"});
      normalizers.push_back(std::make_unique<PrependNormalizer>(j.at("prepend").get<std::string>()));
    } else if (t == "Replace") {
      check_keys(j, c, {"type", "pattern", "content"});
      normalizers.push_back(std::make_unique<ReplaceNormalizer>(parse_pattern(j.at("pattern"), c), j.at("content").get<std::string>()));
    } else if (t == "Strip") {
      check_keys(j, c, {"type", "strip_left", "strip_right"});
      normalizers.push_back(std::make_unique<StripNormalizer>(get_bool(j, "strip_left", false), get_bool(j, "strip_right", false)));
    } else {
      refuse(c, "is not implemented (implemented: NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence)");
    }
  }

  void parse_pre_tokenizer(const json& j) {
    if (j.is_null()) return;
    const std::string t = type_of(j);
    const std::string c = "pre_tokenizer " + (t.empty() ? std::string("(no type)") : t);
    if (t == "Sequence") {
      check_keys(j, c, {"type", "pretokenizers"});
      for (const json& p : j["pretokenizers"]) parse_pre_tokenizer(p);
    } else if (t == "ByteLevel") {
      // trim_offsets changes offsets only, never ids.
      check_keys(j, c, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
      pre_tokenizers.push_back(std::make_unique<ByteLevelPreTokenizer>(get_bool(j, "add_prefix_space", true), get_bool(j, "use_regex", true)));
    } else if (t == "Split") {
      check_keys(j, c, {"type", "pattern", "behavior", "invert"});
      const std::string b = j.at("behavior").get<std::string>();
      SplitBehavior behavior;
      if (b == "Removed") behavior = SplitBehavior::Removed;
      else if (b == "Isolated") behavior = SplitBehavior::Isolated;
      else if (b == "MergedWithPrevious") behavior = SplitBehavior::MergedWithPrevious;
      else if (b == "MergedWithNext") behavior = SplitBehavior::MergedWithNext;
      else if (b == "Contiguous") behavior = SplitBehavior::Contiguous;
      else refuse(c, "has the behavior \"" + b + "\"");
      pre_tokenizers.push_back(std::make_unique<SplitPreTokenizer>(parse_pattern(j.at("pattern"), c), behavior, j.at("invert").get<bool>()));
    } else if (t == "Metaspace") {
      // str_rep is the replacement again (older files write it).
      check_keys(j, c, {"type", "replacement", "add_prefix_space", "prepend_scheme", "split", "str_rep"});
      pre_tokenizers.push_back(std::make_unique<MetaspacePreTokenizer>(
          single_code_point(j.at("replacement"), "tokenizer " + path + ": " + c + " replacement"),
          parse_scheme(j, c), get_bool(j, "split", true)));
    } else {
      refuse(c, "is not implemented (implemented: ByteLevel, Split, Metaspace, Sequence)");
    }
  }

  void parse_decoder(const json& j) {
    if (j.is_null()) return;
    const std::string t = type_of(j);
    const std::string c = "decoder " + (t.empty() ? std::string("(no type)") : t);
    has_decoder = true;
    if (t == "Sequence") {
      check_keys(j, c, {"type", "decoders"});
      for (const json& d : j["decoders"]) parse_decoder(d);
    } else if (t == "ByteLevel") {
      // The ByteLevel decoder ignores all three options.
      check_keys(j, c, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
      decoders.push_back(std::make_unique<ByteLevelDecoder>());
    } else if (t == "Metaspace") {
      check_keys(j, c, {"type", "replacement", "add_prefix_space", "prepend_scheme", "split", "str_rep"});
      decoders.push_back(std::make_unique<MetaspaceDecoder>(
          single_code_point(j.at("replacement"), "tokenizer " + path + ": " + c + " replacement"), parse_scheme(j, c)));
    } else if (t == "Replace") {
      check_keys(j, c, {"type", "pattern", "content"});
      decoders.push_back(std::make_unique<ReplaceDecoder>(parse_pattern(j.at("pattern"), c), j.at("content").get<std::string>()));
    } else if (t == "ByteFallback") {
      check_keys(j, c, {"type"});
      decoders.push_back(std::make_unique<ByteFallbackDecoder>());
    } else if (t == "Fuse") {
      check_keys(j, c, {"type"});
      decoders.push_back(std::make_unique<FuseDecoder>());
    } else if (t == "Strip") {
      check_keys(j, c, {"type", "content", "start", "stop"});
      decoders.push_back(std::make_unique<StripDecoder>(
          single_code_point(j.at("content"), "tokenizer " + path + ": " + c + " content"),
          j.at("start").get<size_t>(), j.at("stop").get<size_t>()));
    } else {
      refuse(c, "is not implemented (implemented: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)");
    }
  }

  void parse_post_processor(const json& j) {
    if (j.is_null()) return;
    const std::string t = type_of(j);
    const std::string c = "post_processor " + (t.empty() ? std::string("(no type)") : t);
    if (t == "Sequence") {
      check_keys(j, c, {"type", "processors"});
      for (const json& p : j["processors"]) parse_post_processor(p);
    } else if (t == "ByteLevel") {
      // As a post-processor ByteLevel only trims offsets.
      check_keys(j, c, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    } else if (t == "TemplateProcessing") {
      // `pair` applies to pair inputs only, which shardlm never encodes.
      check_keys(j, c, {"type", "single", "pair", "special_tokens"});
      const json& specials = j.at("special_tokens");
      std::vector<int> before, after;
      bool seen_a = false;
      for (const json& item : j.at("single")) {
        if (item.contains("SpecialToken") && item.size() == 1) {
          const std::string name = item["SpecialToken"].at("id").get<std::string>();
          if (!specials.contains(name)) refuse(c, "uses the special token " + name + ", which its special_tokens lack");
          const json& st = specials[name];
          check_keys(st, c + " special_tokens entry", {"id", "ids", "tokens"});
          for (const json& id : st.at("ids")) (seen_a ? after : before).push_back(id.get<int>());
        } else if (item.contains("Sequence") && item.size() == 1) {
          const std::string id = item["Sequence"].at("id").get<std::string>();
          if (id != "A" || seen_a) refuse(c, "has a single template that uses sequence " + id + " (only one A is valid)");
          seen_a = true;
        } else {
          refuse(c, "has a single-template piece that is neither SpecialToken nor Sequence");
        }
      }
      if (!seen_a) refuse(c, "has a single template without the sequence A");
      prefix_ids.insert(prefix_ids.begin(), before.begin(), before.end());
      suffix_ids.insert(suffix_ids.end(), after.begin(), after.end());
    } else {
      refuse(c, "is not implemented (implemented: TemplateProcessing, ByteLevel, Sequence)");
    }
  }

  void parse_model(const json& j) {
    std::string t = type_of(j);
    if (t.empty() && j.is_object() && j.contains("merges")) t = "BPE";  // untagged older files
    const std::string c = "model " + (t.empty() ? std::string("(no type)") : t);
    if (t != "BPE") refuse(c, "is not implemented (implemented: BPE)");
    check_keys(j, c, {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                      "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"});
    if (j.contains("dropout") && !j["dropout"].is_null()) refuse(c, "has a dropout, which makes encoding random");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (j.contains(k) && !j[k].is_null() && !j[k].get<std::string>().empty()) {
        refuse(c, std::string("has a non-empty ") + k + ", which is not implemented");
      }
    }
    std::vector<std::pair<std::string, int>> vocab;
    const json& v = j.at("vocab");
    vocab.reserve(v.size());
    for (const auto& [token, id] : v.items()) vocab.emplace_back(token, id.get<int>());
    std::vector<std::pair<std::string, std::string>> merges;
    const json& m = j.at("merges");
    merges.reserve(m.size());
    size_t line = 0;
    for (const json& item : m) {
      ++line;
      if (item.is_string()) {
        const std::string s = item.get<std::string>();
        if (s.rfind("#version", 0) == 0) continue;
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          refuse(c, "has merge " + std::to_string(line) + " \"" + s + "\", which is not two tokens split by one space");
        }
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (item.is_array() && item.size() == 2) {
        merges.emplace_back(item[0].get<std::string>(), item[1].get<std::string>());
      } else {
        refuse(c, "has merge " + std::to_string(line) + " that is neither \"a b\" nor [a, b]");
      }
    }
    const std::string unk = j.contains("unk_token") && !j["unk_token"].is_null() ? j["unk_token"].get<std::string>() : "";
    model = std::make_unique<Bpe>(std::move(vocab), merges, unk, get_bool(j, "fuse_unk", false),
                                  get_bool(j, "byte_fallback", false), get_bool(j, "ignore_merges", false),
                                  "tokenizer " + path);
  }

  void parse_added_tokens(const json& arr) {
    if (arr.is_null()) return;
    // Ids as tokenizers' AddedVocabulary::add_tokens assigns them: the model's id for a content in
    // its vocabulary, else the next free id counted from the vocabulary's size.
    int next_id = static_cast<int>(model->size());
    for (const json& j : arr) {
      check_keys(j, "added_tokens entry", {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
      AddedToken t;
      t.id = j.at("id").get<int>();
      t.content = j.at("content").get<std::string>();
      t.single_word = get_bool(j, "single_word", false);
      t.lstrip = get_bool(j, "lstrip", false);
      t.rstrip = get_bool(j, "rstrip", false);
      t.special = get_bool(j, "special", false);
      t.normalized = get_bool(j, "normalized", !t.special);
      if (t.content.empty()) continue;
      int assigned;
      if (const auto it = added_by_content.find(t.content); it != added_by_content.end()) {
        assigned = it->second;
      } else if (const int mid = model->token_to_id(t.content); mid >= 0) {
        assigned = mid;
      } else {
        assigned = next_id++;
      }
      if (assigned != t.id) {
        refuse("added token " + t.content, "has id " + std::to_string(t.id) + " in the file, but tokenizers would give it id " +
                                              std::to_string(assigned) + " (ids must follow the model vocabulary in order)");
      }
      added_by_content[t.content] = t.id;
      if (t.special) special_contents.insert(t.content);
      if (const auto it = added_by_id.find(t.id); it != added_by_id.end()) {
        added[it->second] = t;
      } else {
        added_by_id[t.id] = added.size();
        added.push_back(t);
      }
    }
    for (size_t i = 0; i < added.size(); ++i) {
      const AddedToken& t = added[i];
      max_id = std::max(max_id, t.id);
      if (t.normalized) {
        std::string form = t.content;
        for (const auto& n : normalizers) n->normalize(form);
        if (form != t.content) decode_form[t.id] = form;
        normalized_trie.add(form, static_cast<int>(i));
      } else {
        raw_trie.add(t.content, static_cast<int>(i));
      }
    }
  }

  // ---- encoding ----
  // AddedVocabulary::find_matches + split_with_indices on one piece.
  void split_added(Piece&& piece, const Trie& trie, std::vector<Piece>& out) const {
    const std::string& s = piece.text;
    if (trie.empty() || s.empty()) {
      if (!s.empty()) out.push_back(std::move(piece));
      return;
    }
    size_t start_offset = 0;
    bool any = false;
    auto push_text = [&](size_t b, size_t e) {
      if (e <= b) return;
      Piece p;
      p.text.assign(s, b, e - b);
      p.at_origin = piece.at_origin && b == 0;
      out.push_back(std::move(p));
    };
    for (size_t i = 0; i < s.size();) {
      const auto [index, len] = trie.longest_at(s, i);
      if (index < 0) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + len;
      i = stop;  // the match is consumed even when discarded, as with leftmost_find_iter
      const AddedToken& t = added[static_cast<size_t>(index)];
      if (t.single_word) {
        const bool start_space = start == 0 || !is_word_char(last_char(std::string_view(s).substr(0, start)));
        size_t k = stop;
        const bool stop_space = stop == s.size() || !is_word_char(next_char(s, k));
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        size_t b = start;
        while (b > 0) {
          size_t cs = b - 1;
          while (cs > 0 && (static_cast<unsigned char>(s[cs]) & 0xC0) == 0x80) --cs;
          size_t k = cs;
          if (!is_white_space(next_char(s, k))) break;
          b = cs;
        }
        start = std::max(b, start_offset);
      }
      if (t.rstrip) {
        while (stop < s.size()) {
          size_t k = stop;
          if (!is_white_space(next_char(s, k))) break;
          stop = k;
        }
      }
      push_text(start_offset, start);
      Piece tok;
      tok.text.assign(s, start, stop - start);
      tok.added_id = t.id;
      out.push_back(std::move(tok));
      start_offset = stop;
      any = true;
    }
    if (!any) {
      out.push_back(std::move(piece));
      return;
    }
    push_text(start_offset, s.size());
  }

  std::vector<int> encode(std::string_view text, bool add_special_tokens) const {
    if (const size_t bad = invalid_utf8_at(text); bad != std::string_view::npos) {
      fail("tokenizer ", path, " cannot encode text that is not valid UTF-8 (first bad byte at offset ", bad,
           "); tokenizers takes only Unicode strings");
    }
    std::vector<Piece> pieces, stage;
    Piece whole;
    whole.text.assign(text);
    whole.at_origin = true;
    split_added(std::move(whole), raw_trie, stage);
    for (Piece& p : stage) {
      if (p.added_id >= 0) {
        pieces.push_back(std::move(p));
        continue;
      }
      for (const auto& n : normalizers) n->normalize(p.text);
      split_added(std::move(p), normalized_trie, pieces);
    }
    for (const auto& pt : pre_tokenizers) pt->pre_tokenize(pieces);
    std::vector<int> ids;
    ids.reserve(text.size() / 3 + prefix_ids.size() + suffix_ids.size() + 4);
    if (add_special_tokens) ids.insert(ids.end(), prefix_ids.begin(), prefix_ids.end());
    for (const Piece& p : pieces) {
      if (p.added_id >= 0) {
        ids.push_back(p.added_id);
      } else {
        model->tokenize(p.text, ids);
      }
    }
    if (add_special_tokens) ids.insert(ids.end(), suffix_ids.begin(), suffix_ids.end());
    return ids;
  }

  std::string decode(const std::vector<int>& ids, bool skip_special) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int id : ids) {
      const std::string* s = nullptr;
      if (const auto it = added_by_id.find(id); it != added_by_id.end()) {
        const auto f = decode_form.find(id);
        s = f != decode_form.end() ? &f->second : &added[it->second].content;
      } else {
        s = model->id_to_token(id);
      }
      if (!s) continue;
      if (skip_special && special_contents.count(*s)) continue;
      tokens.push_back(*s);
    }
    if (!has_decoder) {
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return out;
    }
    for (const auto& d : decoders) d->decode_chain(tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }
};

HfTokenizer::HfTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  im.path = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open tokenizer ", path, "; pass a tokenizer.json file or the folder holding one");
  std::stringstream buf;
  buf << in.rdbuf();
  json j;
  try {
    j = json::parse(buf.str());
  } catch (const json::exception& e) {
    fail("tokenizer ", path, " is not valid JSON: ", e.what());
  }
  try {
    // "version" is the format's version; the rest are the components.
    im.check_keys(j, "the top level", {"version", "truncation", "padding", "added_tokens", "normalizer",
                                       "pre_tokenizer", "model", "post_processor", "decoder"});
    if (j.contains("version") && j["version"] != "1.0") {
      im.refuse("version", "is " + j["version"].dump() + " (tokenizers reads only \"1.0\")");
    }
    for (const char* k : {"truncation", "padding"}) {
      if (j.contains(k) && !j[k].is_null()) {
        im.refuse(k, "is set; shardlm needs the untruncated, unpadded ids, so set \"" + std::string(k) +
                         "\": null in the file (tokenizers would cut or pad every text)");
      }
    }
    if (!j.contains("model")) im.refuse("model", "is missing");
    im.parse_normalizer(j.value("normalizer", json()));
    im.parse_pre_tokenizer(j.value("pre_tokenizer", json()));
    im.parse_model(j["model"]);
    im.parse_post_processor(j.value("post_processor", json()));
    im.parse_decoder(j.value("decoder", json()));
    im.max_id = im.model->max_id();
    im.parse_added_tokens(j.value("added_tokens", json()));
  } catch (const json::exception& e) {
    fail("tokenizer ", path, " has a component of an unexpected shape: ", e.what());
  }
}

HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

std::vector<int> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string HfTokenizer::decode(const std::vector<int>& ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

int HfTokenizer::vocab_size() const { return impl_->max_id + 1; }

int HfTokenizer::token_to_id(std::string_view token) const {
  if (const auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end()) {
    return it->second;
  }
  return impl_->model->token_to_id(token);
}

bool HfTokenizer::is_special_added(std::string_view token) const {
  return impl_->special_contents.count(std::string(token)) != 0;
}

int HfTokenizer::template_bos_id() const {
  return impl_->prefix_ids.empty() ? -1 : impl_->prefix_ids.front();
}

std::string HfTokenizer::token_bytes(int id) const {
  if (const auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
    return impl_->added[it->second].content;
  }
  const std::string* s = impl_->model->id_to_token(id);
  if (!s) fail("tokenizer ", impl_->path, " has no token with id ", id);
  const bool byte_level =
      std::any_of(impl_->decoders.begin(), impl_->decoders.end(),
                  [](const auto& d) { return dynamic_cast<const ByteLevelDecoder*>(d.get()) != nullptr; }) ||
      std::any_of(impl_->pre_tokenizers.begin(), impl_->pre_tokenizers.end(),
                  [](const auto& p) { return dynamic_cast<const ByteLevelPreTokenizer*>(p.get()) != nullptr; });
  std::string out;
  if (byte_level) {
    const ByteLevelTable& table = byte_level_table();
    for (size_t i = 0; i < s->size();) {
      const char32_t c = next_char(*s, i);
      if (c >= 512 || table.char_to_byte[c] < 0) return *s;  // not of the alphabet: the text itself
      out.push_back(static_cast<char>(table.char_to_byte[c]));
    }
    return out;
  }
  if (s->size() == 6 && s->compare(0, 3, "<0x") == 0 && s->back() == '>') {
    return std::string(1, static_cast<char>(std::stoi(s->substr(3, 2), nullptr, 16)));
  }
  static const std::string kMetaspace = "\xe2\x96\x81";  // U+2581
  for (size_t i = 0; i < s->size();) {
    if (s->compare(i, kMetaspace.size(), kMetaspace) == 0) {
      out.push_back(' ');
      i += kMetaspace.size();
    } else {
      out.push_back((*s)[i++]);
    }
  }
  return out;
}

const std::string& HfTokenizer::path() const { return impl_->path; }

}  // namespace shardlm::data
