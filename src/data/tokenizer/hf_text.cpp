// Text primitives of the tokenizer.json pipeline (see hf_text.h): UTF-8, Unicode predicates, the
// PCRE2 regex with Oniguruma-compatible translation, utf8proc normalization, GPT-2's byte table.
#include "data/tokenizer/hf_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/error.h"

namespace shardlm::data::hf {

char32_t next_char(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const size_t n = char_len(b0);
  char32_t c = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

namespace {

// Length of the valid UTF-8 sequence at s[i], or -k when only its first k bytes are a valid prefix
// (k >= 1: the maximal invalid subsequence that Rust replaces by one U+FFFD).
long valid_seq_at(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  unsigned char lo = 0x80, hi = 0xBF;
  size_t n = 0;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -static_cast<long>(k);
    const auto c = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return -static_cast<long>(k);
  }
  return static_cast<long>(n);
}

}  // namespace

size_t invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const long n = valid_seq_at(s, i);
    if (n < 0) return i;
    i += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const long n = valid_seq_at(s, i);
    if (n > 0) {
      out.append(s.data() + i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

bool is_white_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols (circled and squared Latin letters), outside the L and M categories.
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189)) {
    return true;
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// ---- regex ------------------------------------------------------------------------------------

namespace {

// Unicode White_Space as the body of a PCRE2 character class.
constexpr const char* kWhiteSpaceClass =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"
    "\\x{205f}\\x{3000}";

std::string translate_pattern(const std::string& p, const std::string& what) {
  auto refuse = [&](const std::string& construct) {
    fail(what, ": regex ", p, " uses ", construct,
         ", whose meaning differs between Oniguruma (what tokenizers uses) and PCRE2; shardlm refuses ",
         "it rather than risk different token ids");
  };
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in p just after '[' or '[^'
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) refuse("a trailing backslash");
      const char e = p[++i];
      switch (e) {
        case 's':
          out += in_class ? std::string(kWhiteSpaceClass) : "[" + std::string(kWhiteSpaceClass) + "]";
          break;
        case 'S':
          if (in_class) refuse("\\S inside a character class");
          out += "[^" + std::string(kWhiteSpaceClass) + "]";
          break;
        case 'v': out += "\\x{b}"; break;
        case 'p': case 'P': {
          std::string name;
          if (i + 1 < p.size() && p[i + 1] == '{') {
            const size_t close = p.find('}', i + 1);
            if (close == std::string::npos) refuse("an unterminated \\p{");
            name = p.substr(i + 2, close - i - 2);
            i = close;
          } else if (i + 1 < p.size()) {
            name = p.substr(++i, 1);
          }
          const char* extra = onig_extra_class(name);
          if (!extra) {
            std::string known;
            for (const std::string& k : onig_supported_properties()) known += (known.empty() ? "" : " ") + k;
            refuse(std::string("\\") + e + "{" + name + "} (supported properties: " + known + ")");
          }
          const std::string prop = std::string("\\p{") + name + "}" + extra;
          if (e == 'p') {
            out += in_class ? prop : "[" + prop + "]";
          } else {
            if (in_class) refuse("\\P{...} inside a character class");
            out += "[^" + prop + "]";
          }
          break;
        }
        case 'x': case 'n': case 'r': case 't': case 'f': case 'e': case 'a': case 'A': case 'z':
          out += '\\';
          out += e;
          break;
        default:
          if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
            refuse(std::string("\\") + e);
          }
          out += '\\';
          out += e;
      }
      continue;
    }
    if (in_class) {
      if (c == ']' && i > class_start) {
        in_class = false;
      } else if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {
          const size_t close = p.find(":]", i + 2);
          if (close == std::string::npos) refuse("an unterminated POSIX class");
          out.append(p, i, close + 2 - i);
          i = close + 1;
          continue;
        }
        refuse("a nested character class");
      } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        refuse("class intersection &&");
      }
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      class_start = i + 1;
      continue;
    }
    if (c == '^' || c == '$') refuse(std::string("the anchor ") + c + " (line-based in Oniguruma)");
    if (c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      // Inline flags: only (?i) / (?i:...) / (?-i...) mean the same in both engines.
      size_t j = i + 2;
      while (j < p.size() && ((p[j] >= 'a' && p[j] <= 'z') || p[j] == '-')) {
        if (p[j] != 'i' && p[j] != '-') refuse(std::string("the inline flag (?") + p[j]);
        ++j;
      }
    }
    out += c;
  }
  if (in_class) refuse("an unterminated character class");
  return out;
}

struct ThreadMatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    md = pcre2_match_data_create(1, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (stack) pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

ThreadMatchState& match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, const std::string& what)
    : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  const std::string translated = translate_pattern(pattern, what);
  int err = 0;
  PCRE2_SIZE err_at = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_at, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail(what, ": cannot compile regex ", pattern, ": ", reinterpret_cast<const char*>(msg),
         " (at offset ", err_at, " of its PCRE2 translation ", translated, ")");
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  ThreadMatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t start = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (start <= n) {
    const int rc = impl_->jit
                       ? pcre2_jit_match(impl_->code, subject, n, start, 0, st.md, st.mctx)
                       : pcre2_match(impl_->code, subject, n, start, PCRE2_NO_UTF_CHECK, st.md, st.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      fail("regex ", pattern_, " failed on a text of ", n, " bytes: ", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    const size_t s = ov[0], e = ov[1];
    if (s == e && have_last && last_end == e) {
      if (start >= n) break;
      start += char_len(static_cast<unsigned char>(text[start]));
      continue;
    }
    out.emplace_back(s, e);
    start = e;
    last_end = e;
    have_last = true;
  }
}

// ---- normalization ----------------------------------------------------------------------------

namespace {

std::string utf8proc_normalize(std::string_view s, NormForm form) {
  if (s.empty()) return std::string();
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case NormForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                   &dst, static_cast<utf8proc_option_t>(options));
  if (len < 0) fail("Unicode normalization failed: ", utf8proc_errmsg(len));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(len));
  std::free(dst);
  return out;
}

}  // namespace

std::string normalize_unicode(std::string_view s, NormForm form) {
  bool ascii = true;
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);  // every form leaves ASCII unchanged
  std::string out;
  size_t segment = 0;  // start of the text not yet normalized
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const char32_t c = next_char(s, i);
    if (c < 0x300) continue;
    if (normalization_refused(c)) {
      char hex[16];
      std::snprintf(hex, sizeof(hex), "U+%04X", static_cast<unsigned>(c));
      fail("Unicode normalization of ", hex, " differs between utf8proc and tokenizers' Unicode tables; ",
           "shardlm refuses the text rather than give different token ids");
    }
    if (normalization_inert(c)) {
      out += utf8proc_normalize(s.substr(segment, at - segment), form);
      out.append(s, at, i - at);
      segment = i;
    }
  }
  out += utf8proc_normalize(s.substr(segment), form);
  return out;
}

// ---- byte level -------------------------------------------------------------------------------

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table = [] {
    ByteLevelTable t{};
    bool direct[256] = {};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) t.byte_to_char[b] = direct[b] ? b : 256 + n++;
    for (int c = 0; c < 512; ++c) t.char_to_byte[c] = -1;
    for (int b = 0; b < 256; ++b) {
      t.char_to_byte[t.byte_to_char[b]] = static_cast<int16_t>(b);
      append_utf8(t.byte_to_utf8[b], t.byte_to_char[b]);
    }
    return t;
  }();
  return table;
}

}  // namespace shardlm::data::hf
