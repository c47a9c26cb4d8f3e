// jinja2's Lexer (lexer.py, jinja2 3.1) for transformers' environment, written as a hand-rolled
// state machine that takes the same decisions as its regexes: the root state finds the earliest
// {% {{ {# (a {% raw %} first), the tag's sign (- or +) and lstrip_blocks decide what whitespace
// before it survives, and a block end takes one newline after it (trim_blocks).
#include "data/tokenizer/jinja/lexer.h"

#include <algorithm>
#include <stdexcept>

#include "data/tokenizer/hf_text.h"

namespace shardlm::data::jinja {

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

namespace {

struct Lexer {
  std::string src;
  std::vector<size_t> newlines;
  std::vector<Token> out;

  int line_at(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines.begin(), newlines.end(), pos) - newlines.begin());
  }
  [[noreturn]] void fail(size_t pos, const std::string& what) const {
    throw std::runtime_error("template syntax error at template line " + std::to_string(line_at(pos)) + ": " + what);
  }
  // Length of the Python-whitespace run starting at pos.
  size_t ws_run(size_t pos) const {
    size_t p = pos;
    while (p < src.size()) {
      size_t q = p;
      if (!py_isspace(hf::next_char(src, q))) break;
      p = q;
    }
    return p - pos;
  }
  bool starts(size_t pos, const char* s) const { return src.compare(pos, std::char_traits<char>::length(s), s) == 0; }

  // Python's str.rstrip() of text.
  static std::string rstrip(const std::string& text) {
    size_t end = text.size();
    while (end > 0) {
      size_t start = end - 1;
      while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t q = start;
      if (!py_isspace(hf::next_char(text, q))) break;
      end = start;
    }
    return text.substr(0, end);
  }
  // OptionalLStrip: the text before a tag, given the tag's sign.
  std::string strip_before(std::string text, char sign, bool lstrip, bool line_starting) const {
    if (sign == '-') return rstrip(text);
    if (sign != '+' && lstrip) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        bool all_ws = true;
        for (size_t q = l_pos; q < text.size();)
          if (!py_isspace(hf::next_char(text, q))) {
            all_ws = false;
            break;
          }
        if (all_ws) text.resize(l_pos);
      }
    }
    return text;
  }
  void emit(Tok type, std::string value, size_t pos) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.line = line_at(pos);
    out.push_back(std::move(t));
  }
  // A block end at pos ("+%}", "-%}\s*" or "%}\n?"): returns its length, 0 when there is none.
  size_t block_end_at(size_t pos, const char* close) const {
    if (src[pos] == '+' && starts(pos + 1, close)) return 3;
    if (src[pos] == '-' && starts(pos + 1, close)) return 3 + ws_run(pos + 3);
    if (starts(pos, close)) return 2 + (pos + 2 < src.size() && src[pos + 2] == '\n' && close[0] != '}' ? 1 : 0);
    return 0;
  }
  // The raw-begin `{%[-+]?\s*raw\s*(-%}\s*|%})` at pos: its length, or 0.
  size_t raw_begin_at(size_t pos) const {
    size_t p = pos + 2;
    if (p < src.size() && (src[p] == '-' || src[p] == '+')) ++p;
    p += ws_run(p);
    if (!starts(p, "raw")) return 0;
    p += 3;
    p += ws_run(p);
    if (starts(p, "-%}")) return p + 3 + ws_run(p + 3) - pos;
    if (starts(p, "%}")) return p + 2 - pos;
    return 0;
  }
  // `{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)` at pos: its length and sign, or 0.
  size_t raw_end_at(size_t pos, char& sign) const {
    size_t p = pos + 2;
    sign = 0;
    if (p < src.size() && (src[p] == '-' || src[p] == '+')) sign = src[p++];
    p += ws_run(p);
    if (!starts(p, "endraw")) return 0;
    p += 6;
    p += ws_run(p);
    const size_t e = p < src.size() ? block_end_at(p, "%}") : 0;
    return e ? p + e - pos : 0;
  }

  size_t lex_tag(size_t pos, bool block);
  size_t lex_number(size_t pos);
  size_t lex_string(size_t pos);
  void run();
};

size_t Lexer::lex_number(size_t pos) {
  auto digits = [&](size_t p) {  // (\d+_)*\d+ : end, or p when none
    size_t q = p;
    while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) {
      while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
      if (q + 1 < src.size() && src[q] == '_' && std::isdigit(static_cast<unsigned char>(src[q + 1]))) ++q;
    }
    return q;
  };
  const size_t int_end = digits(pos);
  size_t p = int_end;
  bool is_float = false;
  if (p + 1 < src.size() && src[p] == '.' && std::isdigit(static_cast<unsigned char>(src[p + 1]))) {
    p = digits(p + 1);
    is_float = true;
  }
  if (p < src.size() && (src[p] == 'e' || src[p] == 'E')) {
    size_t q = p + 1;
    if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
    const size_t e = digits(q);
    if (e > q) {
      p = e;
      is_float = true;
    }
  }
  std::string text = src.substr(pos, p - pos);
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  Token t;
  t.line = line_at(pos);
  if (is_float) {
    t.type = Tok::Float;
    t.fval = std::stod(text);
  } else {
    if (text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos)
      fail(pos, "integer literal with a leading zero");
    if (text == "0" && p < src.size() && std::string("xXbBoO").find(src[p]) != std::string::npos)
      fail(pos, "unsupported Jinja construct `binary, octal or hex literal`");
    t.type = Tok::Int;
    try {
      t.ival = std::stoll(text);
    } catch (const std::exception&) {
      fail(pos, "integer literal " + text + " is out of range");
    }
  }
  t.value = text;
  out.push_back(std::move(t));
  return p;
}

size_t Lexer::lex_string(size_t pos) {
  const char quote = src[pos];
  size_t p = pos + 1;
  std::string raw;
  while (true) {
    if (p >= src.size()) fail(pos, "unexpected char " + std::string(1, quote));
    if (src[p] == quote) break;
    if (src[p] == '\\') {
      if (p + 1 >= src.size()) fail(pos, "unexpected char " + std::string(1, quote));
      raw += src[p];
      raw += src[p + 1];
      p += 2;
    } else {
      raw += src[p++];
    }
  }
  // Python's unicode-escape decoding.
  std::string v;
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] != '\\') {
      v += raw[k];
      continue;
    }
    const char e = raw[++k];
    auto hex = [&](size_t n) {
      uint32_t c = 0;
      for (size_t d = 1; d <= n; ++d) {
        if (k + d >= raw.size() || !std::isxdigit(static_cast<unsigned char>(raw[k + d])))
          fail(pos, "truncated \\xXX, \\uXXXX or \\UXXXXXXXX escape in a string literal");
        c = c * 16 + static_cast<uint32_t>(std::stoi(std::string(1, raw[k + d]), nullptr, 16));
      }
      k += n;
      hf::append_utf8(v, static_cast<char32_t>(c));
    };
    switch (e) {
      case '\n': break;
      case '\\': v += '\\'; break;
      case '\'': v += '\''; break;
      case '"': v += '"'; break;
      case 'a': v += '\a'; break;
      case 'b': v += '\b'; break;
      case 'f': v += '\f'; break;
      case 'n': v += '\n'; break;
      case 'r': v += '\r'; break;
      case 't': v += '\t'; break;
      case 'v': v += '\v'; break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      case 'N': fail(pos, "unsupported Jinja construct `\\N{...} escape`");
      default:
        if (e >= '0' && e <= '7') {
          uint32_t c = static_cast<uint32_t>(e - '0');
          for (int d = 0; d < 2 && k + 1 < raw.size() && raw[k + 1] >= '0' && raw[k + 1] <= '7'; ++d)
            c = c * 8 + static_cast<uint32_t>(raw[++k] - '0');
          hf::append_utf8(v, static_cast<char32_t>(c));
        } else {
          v += '\\';
          v += e;
        }
    }
  }
  emit(Tok::String, std::move(v), pos);
  return p + 1;
}

// The tokens of one {% %} or {{ }} tag starting at pos (after its begin and sign); returns the
// position after its end.
size_t Lexer::lex_tag(size_t pos, bool block) {
  const char* close = block ? "%}" : "}}";
  std::vector<char> balance;
  size_t p = pos;
  static const char* ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                              ")",  "{",  "}",  ">",  "<",  "=",  ".", ":", "|", ",", ";"};
  while (true) {
    if (p >= src.size()) fail(pos, std::string("unexpected end of template, expected '") + close + "'");
    if (balance.empty()) {
      size_t e = 0;
      if (block) {
        e = block_end_at(p, close);
      } else if (src[p] == '-' && starts(p + 1, close)) {
        e = 3 + ws_run(p + 3);
      } else if (starts(p, close)) {
        e = 2;
      }
      if (e) {
        emit(block ? Tok::BlockEnd : Tok::VarEnd, "", p);
        return p + e;
      }
    }
    const unsigned char c = static_cast<unsigned char>(src[p]);
    if (const size_t w = ws_run(p)) {
      p += w;
    } else if (std::isdigit(c)) {
      p = lex_number(p);
    } else if (std::isalpha(c) || c == '_' || c >= 0x80) {
      size_t q = p;
      while (q < src.size() && (std::isalnum(static_cast<unsigned char>(src[q])) || src[q] == '_' ||
                                static_cast<unsigned char>(src[q]) >= 0x80))
        ++q;
      emit(Tok::Name, src.substr(p, q - p), p);
      p = q;
    } else if (c == '\'' || c == '"') {
      p = lex_string(p);
    } else {
      const char* op = nullptr;
      for (const char* o : ops)
        if (starts(p, o)) {
          op = o;
          break;
        }
      if (!op) fail(p, std::string("unexpected char '") + src[p] + "'");
      const std::string o(op);
      if (o == "(" || o == "[" || o == "{") {
        balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
      } else if (o == ")" || o == "]" || o == "}") {
        if (balance.empty()) fail(p, "unexpected '" + o + "'");
        if (balance.back() != o[0]) fail(p, "unexpected '" + o + "', expected '" + std::string(1, balance.back()) + "'");
        balance.pop_back();
      }
      emit(Tok::Op, o, p);
      p += o.size();
    }
  }
}

void Lexer::run() {
  size_t pos = 0;
  bool line_starting = true;
  while (pos < src.size()) {
    size_t p = pos;
    while ((p = src.find('{', p)) != std::string::npos) {
      if (p + 1 < src.size() && (src[p + 1] == '%' || src[p + 1] == '{' || src[p + 1] == '#')) break;
      ++p;
    }
    if (p == std::string::npos) {
      emit(Tok::Data, src.substr(pos), pos);
      return;
    }
    const char kind = src[p + 1];
    size_t q = p + 2;
    char sign = 0;
    if (q < src.size() && (src[q] == '-' || src[q] == '+')) sign = src[q++];
    const size_t raw_len = kind == '%' ? raw_begin_at(p) : 0;
    std::string text = strip_before(src.substr(pos, p - pos), sign, kind != '{', line_starting);
    if (!text.empty()) emit(Tok::Data, std::move(text), pos);
    if (raw_len) {
      const size_t body = p + raw_len;
      line_starting = src[body - 1] == '\n';
      size_t r = body;
      size_t end_len = 0;
      char end_sign = 0;
      while ((r = src.find("{%", r)) != std::string::npos && !(end_len = raw_end_at(r, end_sign))) ++r;
      if (r == std::string::npos) fail(p, "Missing end of raw directive");
      std::string raw = strip_before(src.substr(body, r - body), end_sign, true, line_starting);
      if (!raw.empty()) emit(Tok::Data, std::move(raw), body);
      pos = r + end_len;
    } else if (kind == '#') {
      size_t r = q;
      size_t end_len = 0;
      for (; r < src.size(); ++r) {
        if ((src[r] == '+' || src[r] == '-') && starts(r + 1, "#}")) {
          end_len = src[r] == '+' ? 3 : 3 + ws_run(r + 3);
          break;
        }
        if (starts(r, "#}")) {
          end_len = 2 + (r + 2 < src.size() && src[r + 2] == '\n' ? 1 : 0);
          break;
        }
      }
      if (!end_len) fail(p, "Missing end of comment tag");
      pos = r + end_len;
    } else {
      emit(kind == '%' ? Tok::BlockBegin : Tok::VarBegin, "", p);
      pos = lex_tag(q, kind == '%');
    }
    line_starting = src[pos - 1] == '\n';
  }
}

}  // namespace

std::vector<Token> tokenize(const std::string& source) {
  Lexer lx;
  // Newlines normalized to \n, and one trailing newline dropped (keep_trailing_newline=False).
  lx.src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      lx.src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      lx.src += source[k];
    }
  }
  if (!lx.src.empty() && lx.src.back() == '\n') lx.src.pop_back();
  for (size_t k = 0; k < lx.src.size(); ++k)
    if (lx.src[k] == '\n') lx.newlines.push_back(k);
  lx.run();
  Token eof;
  eof.type = Tok::Eof;
  eof.line = lx.line_at(lx.src.size());
  lx.out.push_back(eof);
  return std::move(lx.out);
}

}  // namespace shardlm::data::jinja
