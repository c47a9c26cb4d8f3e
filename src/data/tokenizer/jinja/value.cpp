// Python semantics of the jinja engine's values (value.h): construction from JSON, truth, str() and
// repr() (Python's quoting and shortest float repr), ==, <, len(), iter() and json.dumps.
#include "data/tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <utf8proc.h>

#include "data/tokenizer/hf_text.h"
#include "data/tokenizer/jinja/jinja.h"

namespace shardlm::data::jinja {

void render_error(const std::string& message) { throw TemplateError(message); }

void unsupported(const std::string& construct, int line) {
  throw TemplateError("unsupported Jinja construct `" + construct + "` at template line " + std::to_string(line));
}

Value Value::undefined(std::string message, bool security) {
  Value v;
  v.s = std::move(message);
  v.security = security;
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::String;
  v.s = std::move(x);
  return v;
}
Value Value::make_list(List items) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::make_tuple(List items) {
  Value v = make_list(std::move(items));
  v.kind = Kind::Tuple;
  return v;
}
Value Value::make_dict() {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::make_namespace() {
  Value v = make_dict();
  v.kind = Kind::Namespace;
  return v;
}
Value Value::callable(std::string name, NativeFn fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) render_error("integer " + std::to_string(u) + " is out of range");
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return number(j.get<double>());
    case nlohmann::json::value_t::string: return string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = make_dict();
      d.dict->items.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.dict->items.emplace_back(string(k), from_json(e));
      return d;
    }
    default: render_error("a binary JSON value cannot be a template variable");
  }
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.s));
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}
const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.kind == Kind::String && k.s == key) return &v;
  return nullptr;
}
void Dict::set(const Value& key, Value v) {
  for (auto& [k, old] : items)
    if (equals(k, key)) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

void fail_undefined(const Value& v) {
  TemplateError e(v.s);
  throw e;
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0;
    case Kind::String: return !v.s.empty();
    case Kind::List:
    case Kind::Tuple: return !v.list->empty();
    case Kind::Dict: return !v.dict->items.empty();
    default: return true;
  }
}

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(hf::next_char(s, i));
  return out;
}
std::string from_u32(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) hf::append_utf8(out, c);
  return out;
}

std::string repr_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;
  const int nd = static_cast<int>(digits.size());
  std::string out;
  if (decpt <= -4 || decpt > 16) {
    out = digits.substr(0, 1);
    if (nd > 1) out += "." + digits.substr(1);
    const int x = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", x < 0 ? '-' : '+', std::abs(x));
    out += eb;
  } else if (decpt <= 0) {
    out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (decpt >= nd) {
    out = digits + std::string(static_cast<size_t>(decpt - nd), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
  }
  return sign + out;
}

namespace {
// Code points utf8proc (Unicode 15) assigns that the pinned Python 3.11 (Unicode 14) does not: its
// repr() escapes them as unassigned.
constexpr char32_t kNewInUnicode15[][2] = {
    {0xcf3, 0xcf3},     {0xece, 0xece},     {0x10efd, 0x10eff}, {0x1123f, 0x11241}, {0x11b00, 0x11b09},
    {0x11f00, 0x11f10}, {0x11f12, 0x11f3a}, {0x11f3e, 0x11f59}, {0x1342f, 0x1342f}, {0x13440, 0x13455},
    {0x1b132, 0x1b132}, {0x1b155, 0x1b155}, {0x1d2c0, 0x1d2d3}, {0x1df25, 0x1df2a}, {0x1e030, 0x1e06d},
    {0x1e08f, 0x1e08f}, {0x1e4d0, 0x1e4f9}, {0x1f6dc, 0x1f6dc}, {0x1f774, 0x1f776}, {0x1f77b, 0x1f77f},
    {0x1f7d9, 0x1f7d9}, {0x1fa75, 0x1fa77}, {0x1fa87, 0x1fa88}, {0x1faad, 0x1faaf}, {0x1fabb, 0x1fabd},
    {0x1fabf, 0x1fabf}, {0x1face, 0x1facf}, {0x1fada, 0x1fadb}, {0x1fae8, 0x1fae8}, {0x1faf7, 0x1faf8},
    {0x2b739, 0x2b739}, {0x31350, 0x323af}};

// Python's str.isprintable() for one code point.
bool printable(char32_t c) {
  if (c == ' ') return true;
  for (const auto& r : kNewInUnicode15)
    if (c >= r[0] && c <= r[1]) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}
}  // namespace

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const char32_t c = hf::next_char(s, i);
    char buf[16];
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x7f || printable(c)) {
      hf::append_utf8(out, c);
    } else {
      if (c <= 0xff) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c <= 0xffff) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  out += quote;
  return out;
}

std::string repr(const Value& v) {
  if (v.kind == Kind::List && v.s == "range") unsupported("printing a range object (use |list)", 0);
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::String: return repr_string(v.s);
    case Kind::List:
    case Kind::Tuple: {
      const bool tuple = v.kind == Kind::Tuple;
      std::string out = tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      if (tuple && v.list->size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.dict->items) {
        out += (first ? "" : ", ") + repr(k) + ": " + repr(e);
        first = false;
      }
      return out + "}";
    }
    case Kind::Namespace: {
      Value d = v;
      d.kind = Kind::Dict;
      return "<Namespace " + repr(d) + ">";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return repr_float(v.f);
    case Kind::String: return v.s;
    case Kind::Callable: unsupported("printing the callable " + v.fn->name, 0);
    default: return repr(v);
  }
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.s == "range" ? "range" : "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "TemplateNamespace";
    default: return "function";
  }
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) return false;
  if (a.kind == Kind::List && (a.s == "range") != (b.s == "range")) return false;  // range(2) != [0, 1]
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::List:
    case Kind::Tuple:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Kind::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, e] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(e, *o)) return false;
      }
      return true;
    case Kind::Namespace: return a.dict == b.dict;
    default: return a.fn == b.fn;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.kind == b.kind && a.is_sequence()) {
    const List& x = *a.list;
    const List& y = *b.list;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k)
      if (!equals(x[k], y[k])) return less(x[k], y[k]);
    return x.size() < y.size();
  }
  render_error("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Kind::Undefined:
      if (v.security) fail_undefined(v);
      return {};
    case Kind::List:
    case Kind::Tuple: return *v.list;
    case Kind::Dict: {
      List keys;
      keys.reserve(v.dict->items.size());
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::String: {
      List chars;
      for (size_t i = 0; i < v.s.size();) {
        const size_t start = i;
        hf::next_char(v.s, i);
        chars.push_back(Value::string(v.s.substr(start, i - start)));
      }
      return chars;
    }
    default:
      render_error("'" + type_name(v) + "' object is not iterable (template line " + std::to_string(line) + ")");
  }
}

int64_t length(const Value& v, int line) {
  switch (v.kind) {
    case Kind::Undefined: return 0;
    case Kind::String: {
      int64_t n = 0;
      for (unsigned char c : v.s) n += (c & 0xC0) != 0x80;
      return n;
    }
    case Kind::List:
    case Kind::Tuple: return static_cast<int64_t>(v.list->size());
    case Kind::Dict: return static_cast<int64_t>(v.dict->items.size());
    default:
      render_error("object of type '" + type_name(v) + "' has no len() (template line " + std::to_string(line) + ")");
  }
}

}  // namespace shardlm::data::jinja
