// The values a chat template computes with, modelled on the Python objects jinja2 hands around:
// None, bool, int, float, str (UTF-8, measured in code points), list, tuple, dict (insertion
// order), jinja2's Undefined, a namespace() and callables (macros, globals, bound methods). Printing
// follows Python's str()/repr(), equality and ordering Python's ==/<, so that a template renders
// byte for byte what jinja2 renders. Internal to the jinja engine.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::data::jinja {

struct Value;
using List = std::vector<Value>;
struct Dict;
struct CallArgs;
using NativeFn = std::function<Value(CallArgs&)>;

struct Callable {
  std::string name;  // for messages: "range", "str.split", "macro m"
  NativeFn fn;
};

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool security = false;  // Undefined: the sandbox's unsafe attribute (using it is a SecurityError)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; Undefined: the message jinja2 raises when it is used
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // Dict and Namespace
  std::shared_ptr<Callable> fn;

  Value() = default;
  static Value undefined(std::string message, bool security = false);
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value make_list(List items = {});
  static Value make_tuple(List items);
  static Value make_dict();
  static Value make_namespace();
  static Value callable(std::string name, NativeFn fn);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_int() const { return kind == Kind::Int || kind == Kind::Bool; }  // Python: bool is an int
  bool is_number() const { return is_int() || kind == Kind::Float; }
  bool is_sequence() const { return kind == Kind::List || kind == Kind::Tuple; }
  bool is_mapping() const { return kind == Kind::Dict; }
  double as_double() const { return kind == Kind::Float ? f : static_cast<double>(as_int()); }
  int64_t as_int() const { return kind == Kind::Bool ? (b ? 1 : 0) : i; }
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(const Value& key, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
};

// Throws a TemplateError with this message (a render error).
[[noreturn]] void render_error(const std::string& message);
// Throws "unsupported Jinja construct `construct` at template line N".
[[noreturn]] void unsupported(const std::string& construct, int line);
// Throws the error jinja2 raises when an undefined value is used (UndefinedError or SecurityError).
[[noreturn]] void fail_undefined(const Value& v);
// Python's truth value.
bool truthy(const Value& v);
// Python's str() and repr() (a callable refuses: its repr names a memory address).
std::string to_str(const Value& v);
std::string repr(const Value& v);
std::string repr_string(std::string_view s);
std::string repr_float(double d);
// Python's == and <; `less` raises the TypeError Python raises for unorderable types.
bool equals(const Value& a, const Value& b);
bool less(const Value& a, const Value& b);
// Python's type name ("str", "dict", ...) for messages.
std::string type_name(const Value& v);
// jinja2's object_type_repr: "'dict object'", "None", ...
std::string object_type_repr(const Value& v);
// Python's iter(): a list's items, a dict's keys, a string's characters; Undefined gives nothing.
List iterate(const Value& v, int line);
// Python's len() (code points for a string).
int64_t length(const Value& v, int line);

// UTF-8 <-> code points.
std::u32string to_u32(std::string_view s);
std::string from_u32(std::u32string_view s);

// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...).
struct JsonStyle {
  int indent = -1;  // -1: None
  std::string indent_str;  // an indent given as a string
  bool has_separators = false;
  std::string item_sep, key_sep;
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string to_json(const Value& v, const JsonStyle& style, int line);

}  // namespace shardlm::data::jinja
