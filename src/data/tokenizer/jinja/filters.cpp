// jinja2's filters (filters.py, jinja2 3.1) as transformers' environment has them (its own tojson),
// with jinja2's argument names and defaults and Python's semantics underneath.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include <utf8proc.h>

#include "data/tokenizer/hf_text.h"
#include "data/tokenizer/jinja/builtins.h"
#include "data/tokenizer/jinja/lexer.h"
#include "data/tokenizer/jinja/render.h"

namespace shardlm::data::jinja {
namespace {

using FilterFn = Value (*)(const Value&, CallArgs&);

bool opt_bool(const std::optional<Value>& v) { return v && truthy(*v); }

// make_attrgetter: "a.b.0" looked up part by part with getitem (item first, then attribute).
Value attr_path(const Value& item, const Value& attribute, const std::optional<Value>& dflt, int line) {
  Value cur = item;
  if (attribute.is_none()) return cur;
  if (!attribute.is_string()) return get_item(cur, attribute, line);
  for (const std::string& part : py::split(attribute.s, std::string("."), -1)) {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part), line);
    if (dflt && !dflt->is_none() && cur.is_undefined()) cur = *dflt;
  }
  return cur;
}
Value ignore_case(const Value& v) { return v.is_string() ? Value::string(py::lower(v.s)) : v; }

// The key sort, unique, min and max order by: attribute(s) of each item, lower-cased unless case_sensitive.
Value sort_key(const Value& item, const std::optional<Value>& attribute, bool case_sensitive, bool multi, int line) {
  auto one = [&](const Value& attr) {
    Value v = attr_path(item, attr, std::nullopt, line);
    return case_sensitive ? v : ignore_case(v);
  };
  if (!attribute || attribute->is_none()) return case_sensitive ? item : ignore_case(item);
  if (multi && attribute->is_string()) {
    List keys;
    for (const auto& part : py::split(attribute->s, std::string(","), -1)) keys.push_back(one(Value::string(part)));
    return Value::make_list(std::move(keys));
  }
  return one(*attribute);
}

Value f_default(const Value& v, CallArgs& a) {
  const auto b = bind(a, "default", {"default_value", "boolean"}, 0);
  if (v.is_undefined() || (opt_bool(b[1]) && !truthy(v))) return b[0] ? *b[0] : Value::string("");
  return v;
}

Value f_tojson(const Value& v, CallArgs& a) {
  const auto b = bind(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}, 0);
  JsonStyle style;
  style.ensure_ascii = opt_bool(b[0]);
  if (b[1] && !b[1]->is_none()) {
    if (b[1]->is_string()) {
      style.indent = 0;
      style.indent_str = b[1]->s;
    } else if (b[1]->is_int()) {
      style.indent = static_cast<int>(std::max<int64_t>(b[1]->as_int(), 0));
      style.indent_str = std::string(static_cast<size_t>(style.indent), ' ');
    } else {
      unsupported("tojson indent of type " + type_name(*b[1]), a.line);
    }
  }
  if (b[2] && !b[2]->is_none()) {
    const List seps = iterate(*b[2], a.line);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
      render_error("tojson separators must be an (item_separator, key_separator) pair of strings");
    style.has_separators = true;
    style.item_sep = seps[0].s;
    style.key_sep = seps[1].s;
  }
  style.sort_keys = opt_bool(b[3]);
  return Value::string(to_json(v, style, a.line));
}

Value f_indent(const Value& v, CallArgs& a) {
  const auto b = bind(a, "indent", {"width", "first", "blank"}, 0);
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string()) render_error("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  std::string ind = "    ";
  if (b[0]) ind = b[0]->is_string() ? b[0]->s : std::string(static_cast<size_t>(std::max<int64_t>(b[0]->as_int(), 0)), ' ');
  const std::vector<std::string> lines = py::splitlines(v.s + "\n", false);
  std::string rv;
  if (opt_bool(b[2])) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
  }
  return Value::string(opt_bool(b[1]) ? ind + rv : rv);
}

Value f_join(const Value& v, CallArgs& a) {
  const auto b = bind(a, "join", {"d", "attribute"}, 0);
  const std::string sep = b[0] ? to_str(*b[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v, a.line)) {
    if (!first) out += sep;
    first = false;
    out += to_str(b[1] ? attr_path(item, *b[1], std::nullopt, a.line) : item);
  }
  return Value::string(std::move(out));
}

Value f_map(const Value& v, CallArgs& a) {
  List out;
  if (!truthy(v)) return Value::make_list();  // jinja2: `if value:` before iterating
  if (a.pos.empty()) {
    std::optional<Value> attribute, dflt;
    for (const auto& [k, x] : a.kw) {
      if (k == "attribute") attribute = x;
      else if (k == "default") dflt = x;
      else render_error("Unexpected keyword argument '" + k + "'");
    }
    if (!attribute) render_error("map requires a filter argument");
    for (const Value& item : iterate(v, a.line)) out.push_back(attr_path(item, *attribute, dflt, a.line));
    return Value::make_list(std::move(out));
  }
  if (!a.pos[0].is_string()) render_error("map requires a filter name");
  const std::string name = a.pos[0].s;
  if (!has_filter(name)) unsupported("filter " + name, a.line);
  for (const Value& item : iterate(v, a.line)) {
    CallArgs sub;
    sub.line = a.line;
    sub.pos.assign(a.pos.begin() + 1, a.pos.end());
    sub.kw = a.kw;
    out.push_back(apply_filter(name, item, sub));
  }
  return Value::make_list(std::move(out));
}

template <bool Select, bool Attr>
Value f_select(const Value& v, CallArgs& a) {
  List out;
  if (!truthy(v)) return Value::make_list();
  const size_t off = Attr ? 1 : 0;
  if (Attr && a.pos.empty()) render_error("Missing parameter for attribute name");
  std::string test;
  if (a.pos.size() > off) {
    if (!a.pos[off].is_string()) render_error("a test name must be a string");
    test = a.pos[off].s;
    if (!has_test(test)) unsupported("test " + test, a.line);
  }
  for (const Value& item : iterate(v, a.line)) {
    const Value x = Attr ? attr_path(item, a.pos[0], std::nullopt, a.line) : item;
    bool keep;
    if (test.empty()) {
      keep = truthy(x);
    } else {
      CallArgs sub;
      sub.line = a.line;
      sub.pos.assign(a.pos.begin() + static_cast<long>(off) + 1, a.pos.end());
      sub.kw = a.kw;
      keep = apply_test(test, x, sub);
    }
    if (keep == Select) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value f_sort(const Value& v, CallArgs& a) {
  const auto b = bind(a, "sort", {"reverse", "case_sensitive", "attribute"}, 0);
  const bool reverse = opt_bool(b[0]), cs = opt_bool(b[1]);
  List items = iterate(v, a.line);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t k = 0; k < items.size(); ++k) keyed.emplace_back(sort_key(items[k], b[2], cs, true, a.line), k);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? less(y.first, x.first) : less(x.first, y.first);
  });
  List out;
  for (const auto& kv : keyed) out.push_back(items[kv.second]);
  return Value::make_list(std::move(out));
}

Value f_dictsort(const Value& v, CallArgs& a) {
  const auto b = bind(a, "dictsort", {"case_sensitive", "by", "reverse"}, 0);
  if (!v.is_mapping()) render_error("dictsort needs a mapping, got " + type_name(v));
  const std::string by = b[1] ? to_str(*b[1]) : "key";
  if (by != "key" && by != "value") render_error("You can only sort by either \"key\" or \"value\"");
  const bool cs = opt_bool(b[0]), reverse = opt_bool(b[2]);
  std::vector<std::pair<Value, Value>> items = v.dict->items;
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    const Value kx = by == "key" ? x.first : x.second, ky = by == "key" ? y.first : y.second;
    const Value a1 = cs ? kx : ignore_case(kx), b1 = cs ? ky : ignore_case(ky);
    return reverse ? less(b1, a1) : less(a1, b1);
  });
  List out;
  for (auto& kv : items) out.push_back(Value::make_tuple({kv.first, kv.second}));
  return Value::make_list(std::move(out));
}

Value f_unique(const Value& v, CallArgs& a) {
  const auto b = bind(a, "unique", {"case_sensitive", "attribute"}, 0);
  List seen, out;
  for (const Value& item : iterate(v, a.line)) {
    const Value key = sort_key(item, b[1], opt_bool(b[0]), false, a.line);
    if (key.kind == Kind::List || key.kind == Kind::Dict) render_error("unhashable type: '" + type_name(key) + "'");
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::make_list(std::move(out));
}

template <bool Max>
Value f_minmax(const Value& v, CallArgs& a) {
  const auto b = bind(a, Max ? "max" : "min", {"case_sensitive", "attribute"}, 0);
  const List items = iterate(v, a.line);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(items[0], b[1], opt_bool(b[0]), false, a.line);
  for (size_t k = 1; k < items.size(); ++k) {
    Value key = sort_key(items[k], b[1], opt_bool(b[0]), false, a.line);
    if (Max ? less(best_key, key) : less(key, best_key)) {
      best = k;
      best_key = std::move(key);
    }
  }
  return items[best];
}

Value f_batch(const Value& v, CallArgs& a) {
  const auto b = bind(a, "batch", {"linecount", "fill_with"}, 1);
  if (!b[0]->is_int() || b[0]->as_int() <= 0) render_error("batch linecount must be a positive integer");
  const size_t n = static_cast<size_t>(b[0]->as_int());
  List out, tmp;
  for (const Value& item : iterate(v, a.line)) {
    if (tmp.size() == n) {
      out.push_back(Value::make_list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (b[1] && !b[1]->is_none())
      while (tmp.size() < n) tmp.push_back(*b[1]);
    out.push_back(Value::make_list(std::move(tmp)));
  }
  return Value::make_list(std::move(out));
}

Value f_round(const Value& v, CallArgs& a) {
  const auto b = bind(a, "round", {"precision", "method"}, 0);
  const int64_t prec = b[0] ? b[0]->as_int() : 0;
  const std::string method = b[1] ? to_str(*b[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    render_error("method must be common, ceil or floor");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) render_error("type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (v.is_int()) return Value::integer(v.as_int());  // round(int, n>=0) is the int
    if (prec < 0 || prec > 300) unsupported("round with precision " + std::to_string(prec), a.line);
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), v.f);  // correctly rounded, half to even
    return Value::number(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(prec));
  const double x = v.as_double() * scale;
  const double r = method == "ceil" ? std::ceil(x) : std::floor(x);
  return Value::number(r / scale);
}

std::optional<double> parse_py_float(const std::string& text) {
  std::string t = py::strip(text, std::nullopt, true, true);
  std::string clean;
  for (size_t k = 0; k < t.size(); ++k) {
    if (t[k] == '_') {
      if (k == 0 || k + 1 >= t.size() || !std::isdigit(static_cast<unsigned char>(t[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(t[k + 1])))
        return std::nullopt;
      continue;
    }
    clean += t[k];
  }
  if (clean.empty() || clean.find_first_of("xXpP(") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}
std::optional<int64_t> parse_py_int(const std::string& text) {
  std::string t = py::strip(text, std::nullopt, true, true);
  size_t k = 0;
  bool neg = false;
  if (k < t.size() && (t[k] == '+' || t[k] == '-')) neg = t[k++] == '-';
  if (k >= t.size()) return std::nullopt;
  int64_t v = 0;
  for (size_t j = k; j < t.size(); ++j) {
    if (t[j] == '_' && j > k && j + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[j - 1])) &&
        std::isdigit(static_cast<unsigned char>(t[j + 1])))
      continue;
    if (!std::isdigit(static_cast<unsigned char>(t[j]))) return std::nullopt;
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, t[j] - '0', &v))
      render_error("integer overflow in the int filter");
  }
  return neg ? -v : v;
}
std::optional<int64_t> float_to_int(double d) {
  if (std::isnan(d) || std::isinf(d)) return std::nullopt;
  if (std::fabs(d) >= 9.2e18) render_error("integer overflow in the int filter");
  return static_cast<int64_t>(std::trunc(d));
}

Value f_int(const Value& v, CallArgs& a) {
  const auto b = bind(a, "int", {"default", "base"}, 0);
  const Value dflt = b[0] ? *b[0] : Value::integer(0);
  if (b[1] && b[1]->as_int() != 10) unsupported("int filter with base " + to_str(*b[1]), a.line);
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int()) return Value::integer(v.as_int());
  if (v.kind == Kind::Float) {
    const auto i = float_to_int(v.f);
    return i ? Value::integer(*i) : dflt;
  }
  if (v.is_string()) {
    if (const auto i = parse_py_int(v.s)) return Value::integer(*i);
    if (const auto d = parse_py_float(v.s))
      if (const auto i = float_to_int(*d)) return Value::integer(*i);
  }
  return dflt;
}

Value f_float(const Value& v, CallArgs& a) {
  const auto b = bind(a, "float", {"default"}, 0);
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string())
    if (const auto d = parse_py_float(v.s)) return Value::number(*d);
  return b[0] ? *b[0] : Value::number(0.0);
}

Value f_abs(const Value& v, CallArgs& a) {
  bind(a, "abs", {}, 0);
  if (v.is_undefined()) fail_undefined(v);
  if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
  if (v.is_int()) return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  render_error("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_first_last(const Value& v, CallArgs& a, bool first) {
  bind(a, first ? "first" : "last", {}, 0);
  const List items = iterate(v, a.line);
  if (items.empty()) return Value::undefined(first ? "No first item, sequence was empty." : "No last item, sequence was empty.");
  return first ? items.front() : items.back();
}

Value f_items(const Value& v, CallArgs& a) {
  bind(a, "items", {}, 0);
  if (v.is_undefined()) return Value::make_list();
  if (!v.is_mapping())  // jinja2 returns a generator that raises only when iterated
    unsupported("the items filter on a " + type_name(v) + " (jinja2 makes a generator of it that fails when iterated)", a.line);
  List out;
  for (const auto& [k, e] : v.dict->items) out.push_back(Value::make_tuple({k, e}));
  return Value::make_list(std::move(out));
}

Value f_title(const Value& v) {
  // jinja2's do_title: split on runs of [-\s({\[<], then item[0].upper() + item[1:].lower().
  const std::string s = to_str(v);
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i, q = i;
    const bool sep = is_sep(hf::next_char(s, q));
    while (j < s.size()) {
      size_t r = j;
      if (is_sep(hf::next_char(s, r)) != sep) break;
      j = r;
    }
    const std::string_view item = std::string_view(s).substr(i, j - i);
    out += py::upper(item.substr(0, q - i));
    out += py::lower(item.substr(q - i));
    i = j;
  }
  return Value::string(out);
}

Value f_wordcount(const Value& v) {
  const std::string s = to_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = hf::next_char(s, i);
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    const bool w = c == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                   (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
    n += w && !in_word;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_escape(const Value& v) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::string(out);
}

Value f_sum(const Value& v, CallArgs& a) {
  const auto b = bind(a, "sum", {"attribute", "start"}, 0);
  Value rv = b[1] ? *b[1] : Value::integer(0);
  for (const Value& item : iterate(v, a.line))
    rv = binary_op("+", rv, b[0] ? attr_path(item, *b[0], std::nullopt, a.line) : item, a.line);
  return rv;
}

Value f_reverse(const Value& v, CallArgs& a) {
  bind(a, "reverse", {}, 0);
  if (v.is_string()) return Value::string(py::slice(v.s, std::nullopt, std::nullopt, -1));
  List items = iterate(v, a.line);
  std::reverse(items.begin(), items.end());
  return Value::make_list(std::move(items));
}

// Filters whose only argument is the value, on its str().
template <std::string (*F)(std::string_view)>
Value on_str(const Value& v, CallArgs& a) {
  bind(a, "filter", {}, 0);
  return Value::string(F(to_str(v)));
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> f = {
      {"default", f_default}, {"d", f_default}, {"tojson", f_tojson}, {"indent", f_indent}, {"join", f_join},
      {"map", f_map}, {"select", f_select<true, false>}, {"reject", f_select<false, false>},
      {"selectattr", f_select<true, true>}, {"rejectattr", f_select<false, true>}, {"sort", f_sort},
      {"dictsort", f_dictsort}, {"unique", f_unique}, {"min", f_minmax<false>}, {"max", f_minmax<true>},
      {"batch", f_batch}, {"round", f_round}, {"int", f_int}, {"float", f_float}, {"abs", f_abs},
      {"items", f_items}, {"sum", f_sum}, {"reverse", f_reverse},
      {"upper", on_str<py::upper>}, {"lower", on_str<py::lower>}, {"capitalize", on_str<py::capitalize>},
      {"first", [](const Value& v, CallArgs& a) { return f_first_last(v, a, true); }},
      {"last", [](const Value& v, CallArgs& a) { return f_first_last(v, a, false); }},
      {"length", [](const Value& v, CallArgs& a) { bind(a, "length", {}, 0); return Value::integer(length(v, a.line)); }},
      {"count", [](const Value& v, CallArgs& a) { bind(a, "count", {}, 0); return Value::integer(length(v, a.line)); }},
      {"list", [](const Value& v, CallArgs& a) { bind(a, "list", {}, 0); return Value::make_list(iterate(v, a.line)); }},
      {"string", [](const Value& v, CallArgs& a) { bind(a, "string", {}, 0); return Value::string(to_str(v)); }},
      {"safe", [](const Value& v, CallArgs& a) { bind(a, "safe", {}, 0); return Value::string(to_str(v)); }},
      {"title", [](const Value& v, CallArgs& a) { bind(a, "title", {}, 0); return f_title(v); }},
      {"wordcount", [](const Value& v, CallArgs& a) { bind(a, "wordcount", {}, 0); return f_wordcount(v); }},
      {"e", [](const Value& v, CallArgs& a) { bind(a, "escape", {}, 0); return f_escape(v); }},
      {"escape", [](const Value& v, CallArgs& a) { bind(a, "escape", {}, 0); return f_escape(v); }},
      {"trim", [](const Value& v, CallArgs& a) {
         const auto b = bind(a, "trim", {"chars"}, 0);
         std::optional<std::string> chars;
         if (b[0] && !b[0]->is_none()) chars = to_str(*b[0]);
         return Value::string(py::strip(to_str(v), chars, true, true));
       }},
      {"replace", [](const Value& v, CallArgs& a) {
         const auto b = bind(a, "replace", {"old", "new", "count"}, 2);
         const int64_t count = b[2] && !b[2]->is_none() ? b[2]->as_int() : -1;
         return Value::string(py::replace(to_str(v), to_str(*b[0]), to_str(*b[1]), count));
       }},
      {"center", [](const Value& v, CallArgs& a) {
         const auto b = bind(a, "center", {"width"}, 0);
         return Value::string(py::center(to_str(v), b[0] ? b[0]->as_int() : 80, " "));
       }},
  };
  return f;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& value, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) unsupported("filter " + name, args.line);
  return it->second(value, args);
}

}  // namespace shardlm::data::jinja
