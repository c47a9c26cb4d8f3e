// Python's str methods on UTF-8 text, counted in code points as Python counts them: strip, split,
// splitlines, case mapping (utf8proc's simple mappings plus Python's special cases for ß, the Latin
// ligatures and İ), title, capitalize, replace, find, count, center, slicing.
#include <utf8proc.h>

#include "data/tokenizer/hf_text.h"
#include "data/tokenizer/jinja/builtins.h"
#include "data/tokenizer/jinja/lexer.h"

namespace shardlm::data::jinja {
namespace py {
namespace {

bool in_chars(char32_t c, const std::u32string& chars) { return chars.find(c) != std::u32string::npos; }

const char* special_upper(char32_t c, bool title) {
  switch (c) {
    case 0xDF: return title ? "Ss" : "SS";
    case 0xFB00: return title ? "Ff" : "FF";
    case 0xFB01: return title ? "Fi" : "FI";
    case 0xFB02: return title ? "Fl" : "FL";
    case 0xFB03: return title ? "Ffi" : "FFI";
    case 0xFB04: return title ? "Ffl" : "FFL";
    case 0xFB05:
    case 0xFB06: return title ? "St" : "ST";
    case 0x149: return title ? "\xCA\xBCN" : "\xCA\xBCN";
    default: return nullptr;
  }
}
void put_upper(std::string& out, char32_t c) {
  if (const char* s = special_upper(c, false)) out += s;
  else hf::append_utf8(out, static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))));
}
void put_lower(std::string& out, char32_t c) {
  if (c == 0x130) out += "i\xCC\x87";
  else hf::append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}
void put_title(std::string& out, char32_t c) {
  if (const char* s = special_upper(c, true)) out += s;
  else hf::append_utf8(out, static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))));
}
bool is_cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}
// Byte offset of code point index `cp` in s (s.size() when past the end).
size_t byte_of(std::string_view s, int64_t cp) {
  size_t i = 0;
  for (int64_t k = 0; k < cp && i < s.size(); ++k) i += hf::char_len(static_cast<unsigned char>(s[i]));
  return i;
}
int64_t chars_in(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
}  // namespace

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string set = chars ? to_u32(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? in_chars(c, set) : py_isspace(c); };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e) {
      size_t q = b;
      if (!strip_it(hf::next_char(s, q))) break;
      b = q;
    }
  if (right)
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t q = start;
      if (!strip_it(hf::next_char(s, q))) break;
      e = start;
    }
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) render_error("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t f = s.find(*sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const std::u32string u = to_u32(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && py_isspace(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(from_u32(std::u32string_view(u).substr(i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !py_isspace(u[j])) ++j;
    out.push_back(from_u32(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) render_error("empty separator");
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    const std::u32string u = to_u32(s);
    size_t e = u.size();
    while (true) {
      while (e > 0 && py_isspace(u[e - 1])) --e;
      if (e == 0) break;
      if (static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(from_u32(std::u32string_view(u).substr(0, e)));
        break;
      }
      size_t b = e;
      while (b > 0 && !py_isspace(u[b - 1])) --b;
      out.push_back(from_u32(std::u32string_view(u).substr(b, e - b)));
      e = b;
    }
  }
  return {out.rbegin(), out.rend()};
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t i = 0, start = 0;
  while (i < s.size()) {
    const size_t at = i;
    const char32_t c = hf::next_char(s, i);
    if (!is_line_break(c)) continue;
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    out.emplace_back(s.substr(start, (keepends ? i : at) - start));
    start = i;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) put_upper(out, hf::next_char(s, i));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) put_lower(out, hf::next_char(s, i));
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = hf::next_char(s, i);
    if (prev_cased) put_lower(out, c);
    else put_title(out, c);
    prev_cased = is_cased(c);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = hf::next_char(s, i);
    if (first) put_title(out, c);
    else put_lower(out, c);
    first = false;
  }
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  std::string out;
  if (old.empty()) {
    int64_t n = 0;
    size_t i = 0;
    while (true) {
      if (count < 0 || n < count) {
        out += with;
        ++n;
      }
      if (i >= s.size()) break;
      const size_t len = hf::char_len(static_cast<unsigned char>(s[i]));
      out += s.substr(i, len);
      i += len;
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out += s.substr(pos, f - pos);
    out += with;
    pos = f + old.size();
    ++n;
  }
  out += s.substr(pos);
  return out;
}

int64_t find(std::string_view s, std::string_view sub, bool reverse) {
  const size_t f = reverse ? s.rfind(sub) : s.find(sub);
  if (f == std::string_view::npos) return -1;
  return chars_in(s.substr(0, f));
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return chars_in(s) + 1;
  int64_t n = 0;
  for (size_t pos = 0; (pos = s.find(sub, pos)) != std::string_view::npos; pos += sub.size()) ++n;
  return n;
}

std::string center(std::string_view s, int64_t width, std::string_view fill) {
  const int64_t len = chars_in(s);
  const int64_t marg = width - len;
  if (marg <= 0) return std::string(s);
  const int64_t left = marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

bool is_cased_upper(std::string_view s) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(hf::next_char(s, i)));
    if (cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT) return false;
    cased |= cat == UTF8PROC_CATEGORY_LU;
  }
  return cased;
}

bool is_cased_lower(std::string_view s) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(hf::next_char(s, i)));
    if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) return false;
    cased |= cat == UTF8PROC_CATEGORY_LL;
  }
  return cased;
}

std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop,
                  std::optional<int64_t> step) {
  if (!step || *step == 1) {  // the common case, without decoding
    const int64_t n = chars_in(s);
    int64_t b = start.value_or(0), e = stop.value_or(n);
    if (b < 0) b = std::max<int64_t>(b + n, 0);
    if (e < 0) e = std::max<int64_t>(e + n, 0);
    b = std::min(b, n);
    e = std::min(e, n);
    if (e <= b) return "";
    const size_t bb = byte_of(s, b);
    return std::string(s.substr(bb, byte_of(s.substr(bb), e - b)));
  }
  const std::u32string u = to_u32(s);
  List chars;
  chars.reserve(u.size());
  for (char32_t c : u) chars.push_back(Value::integer(static_cast<int64_t>(c)));
  std::string out;
  for (const Value& v : slice_list(chars, start, stop, step)) hf::append_utf8(out, static_cast<char32_t>(v.i));
  return out;
}

}  // namespace py

List slice_list(const List& items, std::optional<int64_t> start, std::optional<int64_t> stop,
                std::optional<int64_t> step) {
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t st = step.value_or(1);
  int64_t b, e;
  if (st > 0) {
    b = start.value_or(0);
    e = stop.value_or(n);
    if (b < 0) b = std::max<int64_t>(b + n, 0);
    if (e < 0) e = std::max<int64_t>(e + n, 0);
    b = std::min(b, n);
    e = std::min(e, n);
  } else {
    b = start ? *start : n - 1;
    e = stop ? *stop : -1;
    if (start) {
      if (b < 0) b = std::max<int64_t>(b + n, -1);
      b = std::min(b, n - 1);
    }
    if (stop) {
      if (e < 0) e = std::max<int64_t>(e + n, -1);
      e = std::min(e, n - 1);
    }
  }
  List out;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) out.push_back(items[static_cast<size_t>(k)]);
  return out;
}

}  // namespace shardlm::data::jinja
