// The jinja engine's parser class, shared by parser.cpp (statements) and parser_expr.cpp
// (expressions), which together follow jinja2's Parser (parser.py, jinja2 3.1). Internal.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/tokenizer/jinja/ast.h"
#include "data/tokenizer/jinja/lexer.h"

namespace shardlm::data::jinja {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body subparse(const std::vector<std::string>& end_names);
  bool at_eof() const { return cur().type == Tok::Eof; }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int loop_depth_ = 0;  // for loops around the statement being parsed, within its function (macro, call, generation)

  const Token& cur() const { return t_[p_]; }
  const Token& look() const { return t_[p_ + 1 < t_.size() ? p_ + 1 : p_]; }
  const Token& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const std::string& what, int line = 0) const {
    throw std::runtime_error("template syntax error at template line " + std::to_string(line ? line : cur().line) +
                             ": " + what);
  }
  [[noreturn]] void refuse(const std::string& construct, int line) const {
    throw std::runtime_error("unsupported Jinja construct `" + construct + "` at template line " + std::to_string(line));
  }
  std::string describe(const Token& tok) const {
    switch (tok.type) {
      case Tok::Eof: return "end of template";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarEnd: return "end of print statement";
      case Tok::Data: return "template data";
      default: return "'" + tok.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail("expected a name, got " + describe(cur()));
    return next().value;
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail(std::string("expected ") + what + ", got " + describe(cur()));
    next();
  }

  std::unique_ptr<Stmt> parse_statement();
  std::unique_ptr<Stmt> parse_if(int line);
  std::unique_ptr<Stmt> parse_for(int line);
  std::unique_ptr<Stmt> parse_set(int line);
  std::unique_ptr<Stmt> parse_macro(int line, bool call_block);
  Body parse_statements(const std::vector<std::string>& end_names, bool drop_needle);
  void parse_signature(Stmt& s);
  Target parse_target(bool with_namespace, const char* extra_end);
  Target parse_target_primary(bool with_namespace);

  bool is_tuple_end(const char* extra_end) const {
    return cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")") || (extra_end && is_name(extra_end));
  }
  ExprPtr parse_tuple(bool with_condexpr, const char* extra_end = nullptr, bool explicit_parens = false);
  ExprPtr parse_expression(bool with_condexpr = true) { return with_condexpr ? parse_condexpr() : parse_or(); }
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  void parse_call_args(Expr& e);
  ExprPtr parse_filter(ExprPtr node, bool start_inline);
  ExprPtr parse_test(ExprPtr node);
  ExprPtr binary(EK kind, std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = std::make_unique<Expr>(kind, line);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }
};

}  // namespace shardlm::data::jinja
