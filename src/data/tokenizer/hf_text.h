// The text primitives the Hugging Face tokenizer.json pipeline is built from, kept apart from the
// pipeline itself (hf_tokenizer.cpp) because each must reproduce one library's exact behaviour:
// UTF-8 decoding, Unicode predicates as Rust defines them (char::is_whitespace, regex's \w), the
// regex engine (PCRE2 standing in for tokenizers' Oniguruma), Unicode normalization (utf8proc),
// GPT-2's byte<->char table and Rust's String::from_utf8_lossy. Internal to the data layer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardlm::data::hf {

// Decodes the UTF-8 code point at s[i] (s must be valid UTF-8) and advances i past it.
char32_t next_char(std::string_view s, size_t& i);
// Length in bytes of the UTF-8 sequence whose lead byte is b (1 for a continuation byte).
inline size_t char_len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}
void append_utf8(std::string& out, char32_t c);
// Offset of the first byte that is not valid UTF-8, or npos when all of s is valid.
size_t invalid_utf8_at(std::string_view s);
// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Unicode White_Space (Rust's char::is_whitespace, regex's \s).
bool is_white_space(char32_t c);
// Rust regex's Unicode \w: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control.
bool is_word_char(char32_t c);

// A compiled regex with Oniguruma's semantics for the constructs tokenizer.json patterns use.
// The pattern is translated first: \s and \S become explicit White_Space classes (PCRE2's \s adds
// U+180E, Oniguruma's does not), \v becomes VT, each \p{X} / \P{X} of a general category gets the
// code points Oniguruma's newer Unicode tables add to it (hf_unicode_tables.cpp), and what differs
// between the two engines or is not in those tables (\w \W \b \B \h \H \d \R \X \u \g \k \Q,
// octal, ^ $, other properties, inline flags but i) is refused, naming `what`.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Every match, left to right, as onig's find_iter gives them (an empty match right after the
  // previous match is skipped). `text` must be valid UTF-8.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

// For a general category X (\p{X}): the code points Oniguruma's tables have in X and PCRE2's do
// not, as the body of a PCRE2 character class; nullptr when X is not one shardlm can match exactly.
const char* onig_extra_class(std::string_view property);
const std::vector<std::string>& onig_supported_properties();
// Code points utf8proc normalizes but tokenizers' normalizers (older Unicode) leave as they are,
// and code points the two normalize differently in other ways (hf_unicode_tables.cpp).
bool normalization_inert(char32_t c);
bool normalization_refused(char32_t c);

// Unicode normalization forms through utf8proc ("NFC", "NFD", "NFKC", "NFKD"), as tokenizers'
// normalizers give them: the text is normalized piecewise around normalization_inert code points,
// and one with a normalization_refused code point is refused.
enum class NormForm { NFC, NFD, NFKC, NFKD };
std::string normalize_unicode(std::string_view s, NormForm form);

// GPT-2's byte-level alphabet: byte b <-> one code point (printable bytes map to themselves).
struct ByteLevelTable {
  char32_t byte_to_char[256];
  std::string byte_to_utf8[256];  // byte_to_char as UTF-8, precomputed for the encoder
  // code point (< 512) -> byte, or -1 when the code point is not in the alphabet
  int16_t char_to_byte[512];
};
const ByteLevelTable& byte_level_table();

}  // namespace shardlm::data::hf
