// Attribute and item lookup as transformers' ImmutableSandboxedEnvironment does it, and the Python
// methods of str, list and dict that chat templates call. A method that mutates a list or dict is
// the sandbox's unsafe Undefined (a SecurityError when called); a real Python method this engine
// does not implement is refused when called, never treated as missing.
#include <algorithm>
#include <set>

#include "data/tokenizer/jinja/builtins.h"
#include "data/tokenizer/jinja/lexer.h"

namespace shardlm::data::jinja {

std::vector<std::optional<Value>> bind(const CallArgs& args, const std::string& fn,
                                       const std::vector<const char*>& names, size_t required) {
  std::vector<std::optional<Value>> out(names.size());
  if (args.pos.size() > names.size())
    render_error(fn + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
                 std::to_string(args.pos.size()) + " given)");
  for (size_t k = 0; k < args.pos.size(); ++k) out[k] = args.pos[k];
  for (const auto& [key, v] : args.kw) {
    size_t k = 0;
    while (k < names.size() && key != names[k]) ++k;
    if (k == names.size()) render_error(fn + "() got an unexpected keyword argument '" + key + "'");
    if (out[k]) render_error(fn + "() got multiple values for argument '" + key + "'");
    out[k] = v;
  }
  for (size_t k = 0; k < required; ++k)
    if (!out[k]) render_error(fn + "() missing required argument '" + std::string(names[k]) + "'");
  return out;
}

Value call_value(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) fail_undefined(fn);
  if (fn.kind != Kind::Callable) render_error("'" + type_name(fn) + "' object is not callable");
  return fn.fn->fn(args);
}

namespace {

const std::set<std::string>& str_methods() {
  static const std::set<std::string> m = {
      "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
      "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
      "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
      "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
      "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill"};
  return m;
}
const std::set<std::string>& list_methods() {
  static const std::set<std::string> m = {"append", "clear", "copy", "count", "extend", "index",
                                          "insert", "pop",   "remove", "reverse", "sort"};
  return m;
}
const std::set<std::string>& dict_methods() {
  static const std::set<std::string> m = {"clear", "copy", "fromkeys", "get", "items", "keys",
                                          "pop",   "popitem", "setdefault", "update", "values"};
  return m;
}
bool mutates(const Value& obj, const std::string& name) {
  static const std::set<std::string> list_mut = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
  static const std::set<std::string> dict_mut = {"clear", "pop", "popitem", "setdefault", "update"};
  if (obj.kind == Kind::List) return list_mut.count(name) > 0;
  if (obj.kind == Kind::Dict) return dict_mut.count(name) > 0;
  return false;
}

std::optional<std::string> opt_str(const std::optional<Value>& v, const std::string& fn) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) render_error(fn + " arg must be None or str");
  return v->s;
}
int64_t opt_int(const std::optional<Value>& v, int64_t dflt) {
  if (!v) return dflt;
  if (!v->is_int()) render_error("'" + type_name(*v) + "' object cannot be interpreted as an integer");
  return v->as_int();
}
const std::string& need_str(const std::optional<Value>& v, const std::string& fn) {
  if (!v->is_string()) render_error(fn + "() argument must be str, not " + type_name(*v));
  return v->s;
}
Value str_list(std::vector<std::string> parts) {
  List items;
  items.reserve(parts.size());
  for (auto& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::make_list(std::move(items));
}
bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (char32_t c : to_u32(s))
    if (!pred(c)) return false;
  return true;
}

// str.format with plain fields ({}, {0}, {name}); a conversion, format spec or attribute path is
// refused.
Value str_format(const std::string& s, CallArgs& a) {
  std::string out;
  int auto_index = 0;
  bool manual = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '}') {
      if (i + 1 < s.size() && s[i + 1] == '}') ++i;
      else render_error("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < s.size() && s[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = s.find('}', i);
    if (close == std::string::npos) render_error("expected '}' before end of string");
    const std::string field = s.substr(i + 1, close - i - 1);
    i = close;
    if (field.find_first_of("!:.[{") != std::string::npos) unsupported("str.format field {" + field + "}", a.line);
    const Value* v = nullptr;
    if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
      if (field.empty() ? manual : auto_index > 0)
        render_error("cannot switch between automatic field numbering and manual field specification");
      const size_t k = field.empty() ? static_cast<size_t>(auto_index++) : std::stoul(field);
      manual = !field.empty();
      if (k >= a.pos.size()) render_error("Replacement index " + std::to_string(k) + " out of range for positional args tuple");
      v = &a.pos[k];
    } else {
      for (const auto& kv : a.kw)
        if (kv.first == field) v = &kv.second;
      if (!v) render_error(repr_string(field));
    }
    out += to_str(*v);
  }
  return Value::string(std::move(out));
}

Value str_method(const std::string& s, const std::string& name, CallArgs& a) {
  const std::string fn = "str." + name;
  if (name == "format") return str_format(s, a);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const auto b = bind(a, fn, {"chars"}, 0);
    return Value::string(py::strip(s, opt_str(b[0], fn), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const auto b = bind(a, fn, {"sep", "maxsplit"}, 0);
    const auto sep = opt_str(b[0], fn);
    const int64_t max = opt_int(b[1], -1);
    return str_list(name == "split" ? py::split(s, sep, max) : py::rsplit(s, sep, max));
  }
  if (name == "splitlines") {
    const auto b = bind(a, fn, {"keepends"}, 0);
    return str_list(py::splitlines(s, b[0] && truthy(*b[0])));
  }
  if (name == "startswith" || name == "endswith") {
    const auto b = bind(a, fn, {"prefix"}, 1);
    List options = b[0]->kind == Kind::Tuple ? *b[0]->list : List{*b[0]};
    for (const Value& o : options) {
      if (!o.is_string())
        render_error(fn + " first arg must be str or a tuple of str, not " + type_name(o));
      const bool hit = name == "startswith" ? s.compare(0, o.s.size(), o.s) == 0
                                            : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
      if (hit) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    bind(a, fn, {}, 0);
    if (name == "upper") return Value::string(py::upper(s));
    if (name == "lower") return Value::string(py::lower(s));
    if (name == "title") return Value::string(py::title(s));
    return Value::string(py::capitalize(s));
  }
  if (name == "replace") {
    const auto b = bind(a, fn, {"old", "new", "count"}, 2);
    return Value::string(py::replace(s, need_str(b[0], fn), need_str(b[1], fn), opt_int(b[2], -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const auto b = bind(a, fn, {"sub"}, 1);
    const std::string& sub = need_str(b[0], fn);
    if (name == "count") return Value::integer(py::count(s, sub));
    const int64_t at = py::find(s, sub, name[0] == 'r');
    if (at < 0 && (name == "index" || name == "rindex")) render_error("substring not found");
    return Value::integer(at);
  }
  if (name == "join") {
    const auto b = bind(a, fn, {"iterable"}, 1);
    std::string out;
    size_t k = 0;
    for (const Value& v : iterate(*b[0], a.line)) {
      if (!v.is_string())
        render_error("sequence item " + std::to_string(k) + ": expected str instance, " + type_name(v) + " found");
      if (k++) out += s;
      out += v.s;
    }
    return Value::string(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const auto b = bind(a, fn, {"affix"}, 1);
    const std::string& x = need_str(b[0], fn);
    if (name == "removeprefix") return Value::string(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    const bool ends = s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    return Value::string(ends ? s.substr(0, s.size() - x.size()) : s);
  }
  if (name == "isspace" || name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isupper" ||
      name == "islower") {
    bind(a, fn, {}, 0);
    if (name == "isupper") return Value::boolean(py::is_cased_upper(s));
    if (name == "islower") return Value::boolean(py::is_cased_lower(s));
    if (name == "isspace") return Value::boolean(all_chars(s, [](char32_t c) { return py_isspace(c); }));
    for (unsigned char c : s)
      if (c >= 0x80 && name != "isspace") unsupported("str." + name + "() on non-ASCII text", a.line);
    if (name == "isdigit") return Value::boolean(all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; }));
    if (name == "isalpha") return Value::boolean(all_chars(s, [](char32_t c) { return std::isalpha(static_cast<int>(c)) != 0; }));
    return Value::boolean(all_chars(s, [](char32_t c) { return std::isalnum(static_cast<int>(c)) != 0; }));
  }
  unsupported("str." + name + "()", a.line);
}

Value seq_or_dict_method(const Value& obj, const std::string& name, CallArgs& a) {
  const std::string fn = type_name(obj) + "." + name;
  if (obj.is_mapping()) {
    if (name == "get") {
      const auto b = bind(a, fn, {"key", "default"}, 1);
      const Value* v = obj.dict->find(*b[0]);
      return v ? *v : (b[1] ? *b[1] : Value::none());
    }
    bind(a, fn, {}, 0);
    List out;
    out.reserve(obj.dict->items.size());
    for (const auto& [k, v] : obj.dict->items) {
      if (name == "keys") out.push_back(k);
      else if (name == "values") out.push_back(v);
      else if (name == "items") out.push_back(Value::make_tuple({k, v}));
      else unsupported(fn + "()", a.line);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "count" || name == "index") {
    const auto b = bind(a, fn, {"value"}, 1);
    int64_t n = 0;
    for (size_t k = 0; k < obj.list->size(); ++k)
      if (equals((*obj.list)[k], *b[0])) {
        if (name == "index") return Value::integer(static_cast<int64_t>(k));
        ++n;
      }
    if (name == "index") render_error(repr(*b[0]) + " is not in " + type_name(obj));
    return Value::integer(n);
  }
  unsupported(fn + "()", a.line);
}

Value bound_method(const Value& obj, const std::string& name) {
  return Value::callable(type_name(obj) + "." + name, [obj, name](CallArgs& a) {
    return obj.is_string() ? str_method(obj.s, name, a) : seq_or_dict_method(obj, name, a);
  });
}

// getattr(obj, name): the Python attribute, or std::nullopt when the object has none.
std::optional<Value> python_attr(const Value& obj, const std::string& name, int line) {
  if (name.size() > 4 && name.compare(0, 2, "__") == 0 && name.compare(name.size() - 2, 2, "__") == 0)
    return Value::undefined("access to attribute " + repr_string(name) + " of " + repr_string(type_name(obj)) +
                                " object is unsafe.",
                            true);
  const bool is_method = (obj.is_string() && str_methods().count(name)) ||
                         (obj.kind == Kind::List && list_methods().count(name)) ||
                         (obj.kind == Kind::Tuple && (name == "count" || name == "index")) ||
                         (obj.is_mapping() && dict_methods().count(name));
  if (is_method) {
    if (mutates(obj, name))
      return Value::undefined("access to attribute " + repr_string(name) + " of " + repr_string(type_name(obj)) +
                                  " object is unsafe.",
                              true);
    return bound_method(obj, name);
  }
  if (obj.kind == Kind::Namespace) {
    const Value* v = obj.dict->find(std::string_view(name));
    if (v) return *v;
    return std::nullopt;
  }
  if (obj.is_number() && (name == "real" || name == "imag" || name == "conjugate" || name == "is_integer" ||
                          name == "bit_length" || name == "numerator" || name == "denominator" || name == "hex"))
    unsupported(type_name(obj) + "." + name, line);
  return std::nullopt;
}

std::string namespace_repr(const Value& obj) {
  if (obj.kind != Kind::Namespace) return object_type_repr(obj);
  return obj.s == "loop" ? "jinja2.runtime.LoopContext object"
                         : "transformers.utils.chat_template_utils.TemplateNamespace object";
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (auto v = python_attr(obj, name, line)) return *v;
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict->find(std::string_view(name))) return *v;
  }
  return Value::undefined(repr_string(namespace_repr(obj)) + " has no attribute " + repr_string(name));
}

Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict->find(key)) return *v;
  } else if ((obj.is_sequence() || obj.is_string()) && key.is_int()) {
    const int64_t n = length(obj, line);
    int64_t k = key.as_int();
    if (k < 0) k += n;
    if (k >= 0 && k < n) {
      if (obj.is_sequence()) return (*obj.list)[static_cast<size_t>(k)];
      return Value::string(py::slice(obj.s, k, k + 1, std::nullopt));
    }
  }
  if (key.is_string()) {
    if (auto v = python_attr(obj, key.s, line)) return *v;
    return Value::undefined(repr_string(namespace_repr(obj)) + " has no attribute " + repr_string(key.s));
  }
  return Value::undefined(namespace_repr(obj) + " has no element " + repr(key));
}

}  // namespace shardlm::data::jinja
