// Evaluates the jinja engine's expressions as jinja2's compiled code does: names through the
// frames, `.`/`[]` through the sandbox's getattr/getitem, and/or returning an operand, an if
// without else giving an Undefined, and the Undefined errors where jinja2 raises them.
#include <cmath>

#include "data/tokenizer/jinja/builtins.h"
#include "data/tokenizer/jinja/render.h"

namespace shardlm::data::jinja {

CallArgs Renderer::eval_args(const Expr& e, const ScopePtr& scope) {
  CallArgs args;
  args.line = e.line;
  args.pos.reserve(e.args.size());
  for (const auto& x : e.args) args.pos.push_back(eval(*x, scope));
  for (const auto& [k, x] : e.kwargs) args.kw.emplace_back(k, eval(*x, scope));
  return args;
}

namespace {
// Whether jinja2's optimizer folds this expression into a constant (filters and tests are taken as
// not folded: none of the quirk's cases below depends on them).
bool is_const(const Expr* e) {
  if (!e) return true;
  switch (e->kind) {
    case EK::Literal: return true;
    case EK::Neg:
    case EK::Pos:
    case EK::Not:
    case EK::And:
    case EK::Or:
    case EK::Cond:
    case EK::Item:
    case EK::Binary:
    case EK::Compare:
    case EK::ListLit:
    case EK::TupleLit:
    case EK::DictLit: {
      if (e->kind == EK::Cond && !e->c) return false;
      if (!is_const(e->a.get()) || !is_const(e->b.get()) || !is_const(e->c.get())) return false;
      for (const auto& x : e->args)
        if (!is_const(x.get())) return false;
      for (const auto& kv : e->kwargs)
        if (!is_const(kv.second.get())) return false;
      return true;
    }
    default: return false;
  }
}

Value negate(const Value& v) {
  return v.kind == Kind::Float ? Value::number(-v.f) : Value::integer(-v.as_int());
}

std::optional<int64_t> slice_bound(const Value& v, int line) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (!v.is_int())
    render_error("slice indices must be integers or None (template line " + std::to_string(line) + ")");
  return v.as_int();
}
}  // namespace

Value Renderer::eval(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case EK::Literal: return e.lit;
    case EK::Name: {
      const Value* v = scope->find(e.name);
      return v ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case EK::Attr: return get_attr(eval(*e.a, scope), e.name, e.line);
    case EK::Item: return get_item(eval(*e.a, scope), eval(*e.b, scope), e.line);
    case EK::Slice: {
      if (!e.a) unsupported("a slice inside a tuple subscript", e.line);
      const Value obj = eval(*e.a, scope);
      std::optional<int64_t> b[3];
      for (int k = 0; k < 3; ++k)
        if (e.args[static_cast<size_t>(k)]) b[k] = slice_bound(eval(*e.args[static_cast<size_t>(k)], scope), e.line);
      if (b[2] && *b[2] == 0) render_error("slice step cannot be zero");
      if (obj.is_undefined()) fail_undefined(obj);
      if (obj.is_string()) return Value::string(py::slice(obj.s, b[0], b[1], b[2]));
      if (obj.is_sequence()) {
        Value r = Value::make_list(slice_list(*obj.list, b[0], b[1], b[2]));
        r.kind = obj.kind;
        r.s = obj.s;  // a slice of a range is a range
        return r;
      }
      render_error("'" + type_name(obj) + "' object is not subscriptable (template line " + std::to_string(e.line) + ")");
    }
    case EK::Call: {
      const Value fn = eval(*e.a, scope);
      CallArgs args = eval_args(e, scope);
      return call_value(fn, args);
    }
    case EK::Filter: {
      const Value v = e.a->kind == EK::Placeholder ? *placeholder_ : eval(*e.a, scope);
      CallArgs args = eval_args(e, scope);
      return apply_filter(e.name, v, args);
    }
    case EK::Test: {
      const Value v = eval(*e.a, scope);
      CallArgs args = eval_args(e, scope);
      return Value::boolean(apply_test(e.name, v, args));
    }
    case EK::Neg:
    case EK::Pos: {
      const Value v = eval(*e.a, scope);
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number())
        render_error(std::string("bad operand type for unary ") + (e.kind == EK::Neg ? "-" : "+") + ": '" +
                     type_name(v) + "'");
      if (e.kind == EK::Pos) return v.kind == Kind::Float ? v : Value::integer(v.as_int());
      return v.kind == Kind::Float ? Value::number(-v.f) : Value::integer(-v.as_int());
    }
    case EK::Not: return Value::boolean(!truthy(eval(*e.a, scope)));
    case EK::Binary: {
      if (e.name == "~") {
        std::string s;
        for (const auto& x : e.args) s += to_str(eval(*x, scope));
        return Value::string(std::move(s));
      }
      const Value a = eval(*e.a, scope);
      // jinja2 folds a constant left operand into a literal and writes `-2 ** x` into Python, which
      // means -(2 ** x): a negative constant base raised to a non-constant power keeps its sign.
      if (e.name == "**" && a.is_number() && is_const(e.a.get()) && !is_const(e.b.get()) &&
          (a.kind == Kind::Float ? std::signbit(a.f) : a.as_int() < 0))
        return negate(binary_op("**", negate(a), eval(*e.b, scope), e.line));
      return binary_op(e.name, a, eval(*e.b, scope), e.line);
    }
    case EK::Compare: {
      Value left = eval(*e.a, scope);
      for (const auto& [op, x] : e.kwargs) {
        Value right = eval(*x, scope);
        if (!compare_op(op, left, right, e.line)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case EK::And: {
      Value a = eval(*e.a, scope);
      return truthy(a) ? eval(*e.b, scope) : a;
    }
    case EK::Or: {
      Value a = eval(*e.a, scope);
      return truthy(a) ? a : eval(*e.b, scope);
    }
    case EK::Cond:
      if (truthy(eval(*e.a, scope))) return eval(*e.b, scope);
      if (e.c) return eval(*e.c, scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    case EK::ListLit:
    case EK::TupleLit: {
      List items;
      items.reserve(e.args.size());
      for (const auto& x : e.args) items.push_back(eval(*x, scope));
      return e.kind == EK::ListLit ? Value::make_list(std::move(items)) : Value::make_tuple(std::move(items));
    }
    case EK::DictLit: {
      Value d = Value::make_dict();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        Value key = eval(*e.args[k], scope);
        if (key.kind == Kind::List || key.kind == Kind::Dict)
          render_error("unhashable type: '" + type_name(key) + "'");
        d.dict->set(key, eval(*e.args[k + 1], scope));
      }
      return d;
    }
    case EK::Placeholder: return *placeholder_;
  }
  return Value();
}

}  // namespace shardlm::data::jinja
