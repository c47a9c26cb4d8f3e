// The pipeline stages of a tokenizer.json that sit around the model (normalizers, pre-tokenizers,
// decoders), each a small class doing what the tokenizers component of the same name does to the
// token ids; parsing and refusing of their JSON is in hf_tokenizer.cpp. Internal to the data layer.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/hf_text.h"

namespace shardlm::data::hf {

// One split of the text on its way to the model. added_id >= 0: an added token, left alone by
// every later stage. at_origin: the piece starts at byte 0 of the input (Metaspace's "first").
struct Piece {
  std::string text;
  int added_id = -1;
  bool at_origin = false;
};

// A literal or regex pattern as Split/Replace take it ({"String": ...} or {"Regex": ...}).
class Pattern {
 public:
  static Pattern literal(std::string s);
  static Pattern regex(const std::string& re, const std::string& what);
  static Pattern single_char(char32_t c);
  // Spans covering all of text, flagged match/non-match, as tokenizers' Pattern::find_matches.
  struct Span {
    size_t start, end;
    bool match;
  };
  void find_matches(std::string_view text, std::vector<Span>& out) const;

 private:
  std::string literal_;
  std::shared_ptr<Regex> regex_;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};
class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormForm f) : form_(f) {}
  void normalize(std::string& s) const override { s = normalize_unicode(s, form_); }
 private:
  NormForm form_;
};
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }
 private:
  std::string prepend_;
};
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  void normalize(std::string& s) const override;
 private:
  Pattern pattern_;
  std::string content_;
};
class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override;
 private:
  bool left_, right_;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits/transforms every piece without added_id; keeps added-token pieces as they are.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};
class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern p, SplitBehavior b, bool invert) : pattern_(std::move(p)), behavior_(b), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override;
 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex);
  void pre_tokenize(std::vector<Piece>& pieces) const override;
 private:
  bool add_prefix_space_, use_regex_;
  std::shared_ptr<Regex> regex_;
};
enum class PrependScheme { First, Never, Always };
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split);
  void pre_tokenize(std::vector<Piece>& pieces) const override;
 private:
  char32_t replacement_;
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

// Splits pieces with `pattern` under `behavior` (NormalizedString::split); empty parts dropped.
void split_pieces(std::vector<Piece>& pieces, const Pattern& pattern, SplitBehavior behavior, bool invert);

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, PrependScheme scheme) : replacement_(replacement), scheme_(scheme) {}
  void decode_chain(std::vector<std::string>& tokens) const override;
 private:
  char32_t replacement_;
  PrependScheme scheme_;
};
class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override;
 private:
  Pattern pattern_;
  std::string content_;
};
class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};
class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override;
 private:
  char32_t content_;
  size_t start_, stop_;
};

}  // namespace shardlm::data::hf
