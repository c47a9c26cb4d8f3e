// jinja2's expression grammar (parser.py: parse_tuple down to parse_primary, postfix, filters and
// tests), with its precedence: if-else < or < and < not < comparisons/in < + - < ~ < * / // % <
// ** (left-associative, as jinja2 has it) < unary - + < postfix . [] () < | and is.
#include "data/tokenizer/jinja/builtins.h"
#include "data/tokenizer/jinja/parser.h"

namespace shardlm::data::jinja {

ExprPtr Parser::parse_tuple(bool with_condexpr, const char* extra_end, bool explicit_parens) {
  const int line = cur().line;
  std::vector<ExprPtr> args;
  bool is_tuple = false;
  while (true) {
    if (!args.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    args.push_back(parse_expression(with_condexpr));
    if (is_op(",")) is_tuple = true;
    else break;
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parens) fail("Expected an expression, got " + describe(cur()));
  }
  auto e = std::make_unique<Expr>(EK::TupleLit, line);
  e->args = std::move(args);
  return e;
}

ExprPtr Parser::parse_condexpr() {
  int line = cur().line;
  ExprPtr expr1 = parse_or();
  while (skip_name("if")) {
    ExprPtr expr2 = parse_or();
    ExprPtr expr3;
    if (skip_name("else")) expr3 = parse_condexpr();
    auto e = std::make_unique<Expr>(EK::Cond, line);
    e->a = std::move(expr2);
    e->b = std::move(expr1);
    e->c = std::move(expr3);
    expr1 = std::move(e);
    line = cur().line;
  }
  return expr1;
}

ExprPtr Parser::parse_or() {
  const int line = cur().line;
  ExprPtr left = parse_and();
  while (skip_name("or")) left = binary(EK::Or, "or", std::move(left), parse_and(), line);
  return left;
}

ExprPtr Parser::parse_and() {
  const int line = cur().line;
  ExprPtr left = parse_not();
  while (skip_name("and")) left = binary(EK::And, "and", std::move(left), parse_not(), line);
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    const int line = next().line;
    auto e = std::make_unique<Expr>(EK::Not, line);
    e->a = parse_not();
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const int line = cur().line;
  ExprPtr expr = parse_math1();
  std::vector<std::pair<std::string, ExprPtr>> ops;
  while (true) {
    if (cur().type == Tok::Op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                  cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
      const std::string op = next().value;
      ops.emplace_back(op, parse_math1());
    } else if (skip_name("in")) {
      ops.emplace_back("in", parse_math1());
    } else if (is_name("not") && look().type == Tok::Name && look().value == "in") {
      next();
      next();
      ops.emplace_back("notin", parse_math1());
    } else {
      break;
    }
  }
  if (ops.empty()) return expr;
  auto e = std::make_unique<Expr>(EK::Compare, line);
  e->a = std::move(expr);
  e->kwargs = std::move(ops);
  return e;
}

ExprPtr Parser::parse_math1() {
  const int line = cur().line;
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const std::string op = next().value;
    left = binary(EK::Binary, op, std::move(left), parse_concat(), line);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  const int line = cur().line;
  ExprPtr left = parse_math2();
  if (!is_op("~")) return left;
  auto e = std::make_unique<Expr>(EK::Binary, line);
  e->name = "~";
  e->args.push_back(std::move(left));
  while (skip_op("~")) e->args.push_back(parse_math2());
  return e;
}

ExprPtr Parser::parse_math2() {
  const int line = cur().line;
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const std::string op = next().value;
    left = binary(EK::Binary, op, std::move(left), parse_pow(), line);
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  const int line = cur().line;
  ExprPtr left = parse_unary(true);
  while (skip_op("**")) left = binary(EK::Binary, "**", std::move(left), parse_unary(true), line);
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  const int line = cur().line;
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    const bool neg = next().value == "-";
    node = std::make_unique<Expr>(neg ? EK::Neg : EK::Pos, line);
    node->a = parse_unary(false);
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  const Token& tok = cur();
  const int line = tok.line;
  if (tok.type == Tok::Name) {
    const std::string& v = tok.value;
    auto e = std::make_unique<Expr>(EK::Literal, line);
    if (v == "true" || v == "True" || v == "false" || v == "False") {
      e->lit = Value::boolean(v == "true" || v == "True");
    } else if (v == "none" || v == "None") {
      e->lit = Value::none();
    } else {
      e->kind = EK::Name;
      e->name = v;
    }
    next();
    return e;
  }
  if (tok.type == Tok::String) {
    std::string s;
    while (cur().type == Tok::String) s += next().value;
    auto e = std::make_unique<Expr>(EK::Literal, line);
    e->lit = Value::string(std::move(s));
    return e;
  }
  if (tok.type == Tok::Int || tok.type == Tok::Float) {
    auto e = std::make_unique<Expr>(EK::Literal, line);
    e->lit = tok.type == Tok::Int ? Value::integer(tok.ival) : Value::number(tok.fval);
    next();
    return e;
  }
  if (skip_op("(")) {
    ExprPtr e = parse_tuple(true, nullptr, true);
    expect_op(")");
    return e;
  }
  if (is_op("[") || is_op("{")) {
    const bool dict = next().value == "{";
    const char* close = dict ? "}" : "]";
    auto e = std::make_unique<Expr>(dict ? EK::DictLit : EK::ListLit, line);
    while (!is_op(close)) {
      if (!e->args.empty()) expect_op(",");
      if (is_op(close)) break;
      e->args.push_back(parse_expression());
      if (dict) {
        expect_op(":");
        e->args.push_back(parse_expression());
      }
    }
    expect_op(close);
    return e;
  }
  fail("unexpected " + describe(tok), line);
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) node = parse_subscript(std::move(node));
    else if (is_op("(")) {
      auto e = std::make_unique<Expr>(EK::Call, cur().line);
      e->a = std::move(node);
      parse_call_args(*e);
      node = std::move(e);
    } else break;
  }
  return node;
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) node = parse_filter(std::move(node), false);
    else if (is_name("is")) node = parse_test(std::move(node));
    else if (is_op("(")) {
      auto e = std::make_unique<Expr>(EK::Call, cur().line);
      e->a = std::move(node);
      parse_call_args(*e);
      node = std::move(e);
    } else break;
  }
  return node;
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const Token tok = next();
  if (tok.value == ".") {
    const Token attr = next();
    if (attr.type == Tok::Name) {
      auto e = std::make_unique<Expr>(EK::Attr, tok.line);
      e->a = std::move(node);
      e->name = attr.value;
      return e;
    }
    if (attr.type != Tok::Int) fail("expected name or number", attr.line);
    auto e = std::make_unique<Expr>(EK::Item, tok.line);
    e->a = std::move(node);
    e->b = std::make_unique<Expr>(EK::Literal, attr.line);
    e->b->lit = Value::integer(attr.ival);
    return e;
  }
  std::vector<ExprPtr> args;
  while (!is_op("]")) {
    if (!args.empty()) expect_op(",");
    args.push_back(parse_subscribed());
  }
  expect_op("]");
  auto e = std::make_unique<Expr>(EK::Item, tok.line);
  e->a = std::move(node);
  if (args.size() == 1) {
    e->b = std::move(args[0]);
  } else {
    e->b = std::make_unique<Expr>(EK::TupleLit, tok.line);
    e->b->args = std::move(args);
  }
  if (e->b->kind == EK::Slice) {  // a[x:y:z] is its own node
    e->b->a = std::move(e->a);
    return std::move(e->b);
  }
  return e;
}

ExprPtr Parser::parse_subscribed() {
  const int line = cur().line;
  std::vector<ExprPtr> parts;
  if (skip_op(":")) {
    parts.emplace_back();
  } else {
    ExprPtr node = parse_expression();
    if (!skip_op(":")) return node;
    parts.push_back(std::move(node));
  }
  if (is_op(":") || is_op("]") || is_op(",")) parts.emplace_back();
  else parts.push_back(parse_expression());
  if (skip_op(":")) {
    if (is_op("]") || is_op(",")) parts.emplace_back();
    else parts.push_back(parse_expression());
  } else {
    parts.emplace_back();
  }
  auto e = std::make_unique<Expr>(EK::Slice, line);
  e->args = std::move(parts);  // start, stop, step; `a` is set by parse_subscript
  return e;
}

void Parser::parse_call_args(Expr& e) {
  const int line = cur().line;
  expect_op("(");
  bool require_comma = false;
  while (!is_op(")")) {
    if (require_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**")) refuse("*args or **kwargs in a call", line);
    if (cur().type == Tok::Name && look().type == Tok::Op && look().value == "=") {
      std::string key = next().value;
      next();
      e.kwargs.emplace_back(std::move(key), parse_expression());
    } else {
      if (!e.kwargs.empty()) fail("invalid syntax for function call expression", line);
      e.args.push_back(parse_expression());
    }
    require_comma = true;
  }
  expect_op(")");
}

ExprPtr Parser::parse_filter(ExprPtr node, bool start_inline) {
  while (is_op("|") || start_inline) {
    if (!start_inline) next();
    const int line = cur().line;
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    if (!has_filter(name)) refuse("filter " + name, line);
    auto e = std::make_unique<Expr>(EK::Filter, line);
    e->a = std::move(node);
    e->name = name;
    if (is_op("(")) parse_call_args(*e);
    node = std::move(e);
    start_inline = false;
  }
  return node;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  const int line = next().line;
  const bool negated = skip_name("not");
  std::string name = expect_name();
  while (skip_op(".")) name += "." + expect_name();
  if (!has_test(name)) refuse("test " + name, line);
  auto e = std::make_unique<Expr>(EK::Test, line);
  e->a = std::move(node);
  e->name = name;
  const Tok ty = cur().type;
  if (is_op("(")) {
    parse_call_args(*e);
  } else if ((ty == Tok::Name || ty == Tok::String || ty == Tok::Int || ty == Tok::Float || is_op("[") ||
              is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("You cannot chain multiple tests with is");
    e->args.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return e;
  auto n = std::make_unique<Expr>(EK::Not, line);
  n->a = std::move(e);
  return n;
}

Program parse(const std::string& source) {
  Parser parser(tokenize(source));
  Program prog;
  prog.body = parser.subparse({});
  return prog;
}

}  // namespace shardlm::data::jinja
