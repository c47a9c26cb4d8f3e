// jinja2's Parser (parser.py, jinja2 3.1) over the lexer's tokens: the same grammar, operator
// precedence and statement forms, so that a template means what it means to jinja2. Statements and
// filters or tests the engine does not implement are refused here, naming the construct and line.
#include "data/tokenizer/jinja/parser.h"

namespace shardlm::data::jinja {

Body Parser::subparse(const std::vector<std::string>& end_names) {
  Body body;
  while (!at_eof()) {
    const Token& tok = cur();
    if (tok.type == Tok::Data) {
      auto s = std::make_unique<Stmt>(SK::Text, tok.line);
      s->text = tok.value;
      body.push_back(std::move(s));
      next();
    } else if (tok.type == Tok::VarBegin) {
      next();
      auto s = std::make_unique<Stmt>(SK::Print, tok.line);
      s->expr = parse_tuple(true);
      expect(Tok::VarEnd, "end of print statement");
      body.push_back(std::move(s));
    } else if (tok.type == Tok::BlockBegin) {
      next();
      if (cur().type == Tok::Name)
        for (const auto& n : end_names)
          if (cur().value == n) return body;
      body.push_back(parse_statement());
      expect(Tok::BlockEnd, "end of statement block");
    } else {
      fail("unexpected " + describe(tok));
    }
  }
  if (!end_names.empty()) {
    std::string names;
    for (const auto& n : end_names) names += (names.empty() ? "'" : " or '") + n + "'";
    fail("unexpected end of template, expected " + names);
  }
  return body;
}

Body Parser::parse_statements(const std::vector<std::string>& end_names, bool drop_needle) {
  skip_op(":");
  expect(Tok::BlockEnd, "end of statement block");
  Body body = subparse(end_names);
  if (at_eof()) fail("unexpected end of template");
  if (drop_needle) next();
  return body;
}

std::unique_ptr<Stmt> Parser::parse_statement() {
  if (cur().type != Tok::Name) fail("tag name expected");
  const int line = cur().line;
  const std::string tag = cur().value;
  if (tag == "if") return next(), parse_if(line);
  if (tag == "for") return next(), parse_for(line);
  if (tag == "set") return next(), parse_set(line);
  if (tag == "macro") return next(), parse_macro(line, false);
  if (tag == "call") return next(), parse_macro(line, true);
  if (tag == "break" || tag == "continue") {
    // jinja2 compiles them to Python's break/continue: outside a loop of the same function (a
    // macro, call or generation block is one) Python refuses the template.
    if (loop_depth_ == 0) fail("'" + tag + "' not properly in loop", line);
    next();
    return std::make_unique<Stmt>(tag == "break" ? SK::Break : SK::Continue, line);
  }
  if (tag == "filter") {
    next();
    auto s = std::make_unique<Stmt>(SK::FilterBlock, line);
    s->expr = parse_filter(std::make_unique<Expr>(EK::Placeholder, line), true);
    s->body = parse_statements({"endfilter"}, true);
    return s;
  }
  if (tag == "generation") {
    next();
    auto s = std::make_unique<Stmt>(SK::Generation, line);
    const int depth = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endgeneration"}, true);
    loop_depth_ = depth;
    return s;
  }
  refuse("{% " + tag + " %}", line);
}

std::unique_ptr<Stmt> Parser::parse_if(int line) {
  auto s = std::make_unique<Stmt>(SK::If, line);
  while (true) {
    ExprPtr test = parse_tuple(false);
    Body body = parse_statements({"elif", "else", "endif"}, false);
    s->branches.emplace_back(std::move(test), std::move(body));
    const std::string tok = next().value;
    if (tok == "elif") continue;
    if (tok == "else") s->else_body = parse_statements({"endif"}, true);
    break;
  }
  return s;
}

std::unique_ptr<Stmt> Parser::parse_for(int line) {
  auto s = std::make_unique<Stmt>(SK::For, line);
  s->target = parse_target(false, "in");
  if (!skip_name("in")) fail("expected 'in', got " + describe(cur()));
  s->expr = parse_tuple(false, "recursive");
  if (skip_name("if")) s->cond = parse_expression();
  if (is_name("recursive")) refuse("recursive for loop", line);
  ++loop_depth_;
  s->body = parse_statements({"endfor", "else"}, false);
  --loop_depth_;
  if (next().value == "else") s->else_body = parse_statements({"endfor"}, true);
  return s;
}

std::unique_ptr<Stmt> Parser::parse_set(int line) {
  Target target = parse_target(true, nullptr);
  if (skip_op("=")) {
    auto s = std::make_unique<Stmt>(SK::Set, line);
    s->target = std::move(target);
    s->expr = parse_tuple(true);
    return s;
  }
  if (target.is_tuple) fail("a block set assigns one name or namespace attribute");
  auto s = std::make_unique<Stmt>(SK::SetBlock, line);
  s->target = std::move(target);
  s->expr = std::make_unique<Expr>(EK::Placeholder, line);
  if (is_op("|")) s->expr = parse_filter(std::move(s->expr), false);
  s->body = parse_statements({"endset"}, true);
  return s;
}

void Parser::parse_signature(Stmt& s) {
  expect_op("(");
  while (!is_op(")")) {
    if (!s.params.empty()) expect_op(",");
    MacroParam p;
    p.name = expect_name();
    if (skip_op("=")) p.default_value = parse_expression();
    else if (!s.params.empty() && s.params.back().default_value) fail("non-default argument follows default argument");
    s.params.push_back(std::move(p));
  }
  expect_op(")");
}

namespace {
// Whether a macro body reads caller, varargs or kwargs (jinja2 decides this from the body too).
void scan_names(const Expr* e, Stmt& m);
void scan_names(const Body& body, Stmt& m);
void scan_names(const Expr* e, Stmt& m) {
  if (!e) return;
  if (e->kind == EK::Name) {
    m.uses_caller |= e->name == "caller";
    m.uses_varargs |= e->name == "varargs";
    m.uses_kwargs |= e->name == "kwargs";
  }
  scan_names(e->a.get(), m);
  scan_names(e->b.get(), m);
  scan_names(e->c.get(), m);
  for (const auto& x : e->args) scan_names(x.get(), m);
  for (const auto& kv : e->kwargs) scan_names(kv.second.get(), m);
}
void scan_names(const Body& body, Stmt& m) {
  for (const auto& s : body) {
    scan_names(s->expr.get(), m);
    scan_names(s->cond.get(), m);
    for (const auto& br : s->branches) {
      scan_names(br.first.get(), m);
      scan_names(br.second, m);
    }
    for (const auto& p : s->params) scan_names(p.default_value.get(), m);
    scan_names(s->body, m);
    scan_names(s->else_body, m);
  }
}

}  // namespace

std::unique_ptr<Stmt> Parser::parse_macro(int line, bool call_block) {
  auto s = std::make_unique<Stmt>(call_block ? SK::CallBlock : SK::Macro, line);
  struct LoopReset {  // a macro's or caller's body is a function of its own
    int& depth;
    int saved;
    explicit LoopReset(int& d) : depth(d), saved(d) { d = 0; }
    ~LoopReset() { depth = saved; }
  } reset(loop_depth_);
  if (call_block) {
    if (is_op("(")) parse_signature(*s);
    s->expr = parse_expression();
    if (s->expr->kind != EK::Call) fail("expected call", line);
    s->body = parse_statements({"endcall"}, true);
  } else {
    s->text = expect_name();
    parse_signature(*s);
    s->body = parse_statements({"endmacro"}, true);
  }
  scan_names(s->body, *s);
  for (const auto& p : s->params) scan_names(p.default_value.get(), *s);
  return s;
}

Target Parser::parse_target_primary(bool with_namespace) {
  if (cur().type == Tok::Name) {
    const std::string& v = cur().value;
    if (v == "true" || v == "false" || v == "True" || v == "False" || v == "none" || v == "None")
      fail("can't assign to a constant");
    Target t;
    t.name = next().value;
    if (with_namespace && is_op(".")) {
      next();
      t.attr = expect_name();
    }
    return t;
  }
  if (skip_op("(")) {
    Target t;
    t.is_tuple = true;
    while (!is_op(")")) {
      if (!t.items.empty()) {
        expect_op(",");
        if (is_op(")")) break;
      }
      t.items.push_back(parse_target_primary(with_namespace));
      if (!is_op(",")) {
        if (t.items.size() == 1) {
          expect_op(")");
          return std::move(t.items[0]);
        }
        break;
      }
    }
    expect_op(")");
    return t;
  }
  fail("can't assign to " + describe(cur()));
}

Target Parser::parse_target(bool with_namespace, const char* extra_end) {
  Target tuple;
  tuple.is_tuple = false;
  while (true) {
    if (!tuple.items.empty()) expect_op(",");
    if (is_tuple_end(extra_end) || (cur().type == Tok::Op && cur().value == "=")) break;
    tuple.items.push_back(parse_target_primary(with_namespace));
    if (is_op(",")) tuple.is_tuple = true;
    else break;
  }
  if (!tuple.is_tuple) {
    if (tuple.items.empty()) fail("expected an assignment target, got " + describe(cur()));
    return std::move(tuple.items[0]);
  }
  for (const auto& it : tuple.items)
    if (!it.attr.empty()) fail("can't assign to a namespace attribute inside a tuple");
  return tuple;
}

}  // namespace shardlm::data::jinja
