// The jinja engine's lexer: splits a template into text and tag tokens exactly as jinja2's Lexer
// does under transformers' environment (trim_blocks, lstrip_blocks, keep_trailing_newline off,
// newlines normalized to \n), including where {%- -%} {{- -}} {#- -#} {%+ strip whitespace and
// how string and number literals are decoded. Internal to the jinja engine.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::data::jinja {

enum class Tok { Data, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type = Tok::Eof;
  std::string value;  // Data text, a name, a decoded string, an operator
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
};

// Throws std::runtime_error "template syntax error at template line N: ..." on what jinja2's
// lexer rejects.
std::vector<Token> tokenize(const std::string& source);

// Python's str.isspace() for one code point.
bool py_isspace(char32_t c);

}  // namespace shardlm::data::jinja
