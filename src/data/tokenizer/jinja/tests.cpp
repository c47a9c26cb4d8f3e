// jinja2's tests (tests.py, `value is name(args)`) as transformers' environment has them.
#include <unordered_map>

#include "data/tokenizer/jinja/builtins.h"
#include "data/tokenizer/jinja/render.h"

namespace shardlm::data::jinja {
namespace {

using TestFn = bool (*)(const Value&, CallArgs&);

const Value& arg1(CallArgs& a, const char* name) {
  const auto b = bind(a, name, {"other"}, 1);
  a.pos = {*b[0]};
  return a.pos[0];
}
// value % d == want, as Python computes it.
bool mod_is(const Value& v, const Value& d, int64_t want) {
  if (v.is_undefined()) fail_undefined(v);
  return equals(binary_op("%", v, d, 0), Value::integer(want));
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> t = {
      {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, CallArgs&) { return v.is_none(); }},
      {"boolean", [](const Value& v, CallArgs&) { return v.kind == Kind::Bool; }},
      {"true", [](const Value& v, CallArgs&) { return v.kind == Kind::Bool && v.b; }},
      {"false", [](const Value& v, CallArgs&) { return v.kind == Kind::Bool && !v.b; }},
      {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
      {"number", [](const Value& v, CallArgs&) { return v.is_number(); }},
      {"integer", [](const Value& v, CallArgs&) { return v.kind == Kind::Int; }},
      {"float", [](const Value& v, CallArgs&) { return v.kind == Kind::Float; }},
      {"mapping", [](const Value& v, CallArgs&) { return v.is_mapping(); }},
      {"iterable", [](const Value& v, CallArgs&) {
         return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_mapping() ||
                (v.kind == Kind::Namespace && v.s == "loop");
       }},
      {"sequence", [](const Value& v, CallArgs&) {
         return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_mapping();
       }},
      {"callable", [](const Value& v, CallArgs&) { return v.kind == Kind::Callable || v.is_undefined(); }},
      {"even", [](const Value& v, CallArgs&) { return mod_is(v, Value::integer(2), 0); }},
      {"odd", [](const Value& v, CallArgs&) { return mod_is(v, Value::integer(2), 1); }},
      {"divisibleby", [](const Value& v, CallArgs& a) {
         const auto b = bind(a, "divisibleby", {"num"}, 1);
         return mod_is(v, *b[0], 0);
       }},
      {"eq", [](const Value& v, CallArgs& a) { return compare_op("==", v, arg1(a, "eq"), a.line); }},
      {"ne", [](const Value& v, CallArgs& a) { return compare_op("!=", v, arg1(a, "ne"), a.line); }},
      {"lt", [](const Value& v, CallArgs& a) { return compare_op("<", v, arg1(a, "lt"), a.line); }},
      {"le", [](const Value& v, CallArgs& a) { return compare_op("<=", v, arg1(a, "le"), a.line); }},
      {"gt", [](const Value& v, CallArgs& a) { return compare_op(">", v, arg1(a, "gt"), a.line); }},
      {"ge", [](const Value& v, CallArgs& a) { return compare_op(">=", v, arg1(a, "ge"), a.line); }},
      {"in", [](const Value& v, CallArgs& a) {
         const auto b = bind(a, "in", {"seq"}, 1);
         return compare_op("in", v, *b[0], a.line);
       }},
      {"sameas", [](const Value& v, CallArgs& a) {
         const Value& o = arg1(a, "sameas");
         if (v.kind != o.kind) return false;
         switch (v.kind) {
           case Kind::None:
           case Kind::Bool: return equals(v, o);
           case Kind::Int:
             if (v.i >= -5 && v.i <= 256) return v.i == o.i;
             unsupported("`is sameas` on large integers", a.line);
           case Kind::List:
           case Kind::Tuple: return v.list == o.list;
           case Kind::Dict:
           case Kind::Namespace: return v.dict == o.dict;
           case Kind::Callable: return v.fn == o.fn;
           default: unsupported("`is sameas` on " + type_name(v), a.line);
         }
       }},
      {"lower", [](const Value& v, CallArgs&) { return py::is_cased_lower(to_str(v)); }},
      {"upper", [](const Value& v, CallArgs&) { return py::is_cased_upper(to_str(v)); }},
  };
  return t;
}

const std::string& canonical(const std::string& name) {
  static const std::unordered_map<std::string, std::string> alias = {
      {"==", "eq"}, {"equalto", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"lessthan", "lt"}, {"<=", "le"},
      {">", "gt"},  {"greaterthan", "gt"}, {">=", "ge"}};
  auto it = alias.find(name);
  return it == alias.end() ? name : it->second;
}

}  // namespace

bool has_test(const std::string& name) { return tests().count(canonical(name)) > 0; }

bool apply_test(const std::string& name, const Value& value, CallArgs& args) {
  auto it = tests().find(canonical(name));
  if (it == tests().end()) unsupported("test " + name, args.line);
  const std::string& n = it->first;
  if (n != "divisibleby" && n != "in" && n != "eq" && n != "ne" && n != "lt" && n != "le" && n != "gt" &&
      n != "ge" && n != "sameas")
    bind(args, name, {}, 0);
  return it->second(value, args);
}

}  // namespace shardlm::data::jinja
