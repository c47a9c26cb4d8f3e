// Python's arithmetic and comparison operators on the engine's values (int overflow is refused,
// not wrapped), and the globals of transformers' chat-template environment.
#include <cmath>
#include <ctime>
#include <mutex>

#include "data/tokenizer/jinja/builtins.h"
#include "data/tokenizer/jinja/jinja.h"
#include "data/tokenizer/jinja/render.h"

namespace shardlm::data::jinja {

namespace {
[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  if (op == "+" && a.is_string()) render_error("can only concatenate str (not \"" + type_name(b) + "\") to str");
  render_error("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}
Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string s;
    for (int64_t k = 0; k < n; ++k) s += seq.s;
    return Value::string(std::move(s));
  }
  List items;
  for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq.list->begin(), seq.list->end());
  Value r = Value::make_list(std::move(items));
  r.kind = seq.kind;
  return r;
}
enum class IntOp { Add, Sub, Mul };
int64_t checked(IntOp op, int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = op == IntOp::Add   ? __builtin_add_overflow(a, b, &r)
                        : op == IntOp::Sub ? __builtin_sub_overflow(a, b, &r)
                                           : __builtin_mul_overflow(a, b, &r);
  if (overflow) render_error("integer overflow (Python's integers are unbounded; this engine's are 64-bit)");
  return r;
}
// Python's float divmod (floatobject.c float_divmod): floor quotient and modulo.
std::pair<double, double> py_divmod(double vx, double wx) {
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  double floordiv;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
  return {floordiv, mod};
}
}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "%" && a.is_string()) unsupported("printf-style % formatting of a string", line);
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = a.is_int() && b.is_int();
  if (op == "+") {
    if (ints) return Value::integer(checked(IntOp::Add, a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) return Value::string(a.s + b.s);
    if (a.kind == b.kind && a.is_sequence() && a.s != "range" && b.s != "range") {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      Value v = Value::make_list(std::move(items));
      v.kind = a.kind;
      return v;
    }
    type_error(op, a, b);
  }
  if (op == "-") {
    if (ints) return Value::integer(checked(IntOp::Sub, a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() - b.as_double());
    type_error(op, a, b);
  }
  if (op == "*") {
    if (ints) return Value::integer(checked(IntOp::Mul, a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() * b.as_double());
    if ((a.is_string() || (a.is_sequence() && a.s != "range")) && b.is_int()) return repeat(a, b.as_int());
    if (a.is_int() && (b.is_string() || (b.is_sequence() && b.s != "range"))) return repeat(b, a.as_int());
    type_error(op, a, b);
  }
  if (!nums) type_error(op, a, b);
  if ((op == "/" || op == "//" || op == "%") && b.as_double() == 0) {
    if (op == "/" || !ints) render_error("float division by zero");
    render_error(op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
  }
  if (op == "/") return Value::number(a.as_double() / b.as_double());
  if (op == "//") {
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::integer(q);
    }
    return Value::number(py_divmod(a.as_double(), b.as_double()).first);
  }
  if (op == "%") {
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::integer(m);
    }
    return Value::number(py_divmod(a.as_double(), b.as_double()).second);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t acc = 1;
      for (int64_t k = 0; k < b.as_int(); ++k) acc = checked(IntOp::Mul, acc, a.as_int());
      return Value::integer(acc);
    }
    const double base = a.as_double(), exp = b.as_double();
    if (base < 0 && exp != std::floor(exp)) unsupported("a power with a complex result", line);
    return Value::number(std::pow(base, exp));
  }
  unsupported("operator " + op, line);
}

bool compare_op(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (a.is_undefined()) fail_undefined(a);
      if (!a.is_string()) render_error("'in <string>' requires string as left operand, not " + type_name(a));
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.is_sequence()) {
      for (const auto& x : *b.list)
        if (equals(x, a)) {
          found = true;
          break;
        }
    } else if (b.is_mapping()) {
      if (a.kind == Kind::List || a.kind == Kind::Dict) render_error("unhashable type: '" + type_name(a) + "'");
      found = b.dict->find(a) != nullptr;
    } else if (b.is_undefined()) {
      if (b.security) fail_undefined(b);
      found = false;
    } else {
      render_error("argument of type '" + type_name(b) + "' is not iterable (template line " + std::to_string(line) + ")");
    }
    return op == "in" ? found : !found;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number() && (a.kind == Kind::Float || b.kind == Kind::Float)) {
    const double x = a.as_double(), y = b.as_double();
    if (op == "<") return x < y;
    if (op == "<=") return x <= y;
    if (op == ">") return x > y;
    return x >= y;
  }
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return !less(b, a);
  return !less(a, b);
}

namespace {
std::mutex date_mutex;
std::string template_date;  // "YYYY-MM-DD" or empty
}  // namespace

void set_template_date(const std::string& yyyy_mm_dd) {
  if (!yyyy_mm_dd.empty()) {
    int y = 0, m = 0, d = 0;
    char extra = 0;
    if (std::sscanf(yyyy_mm_dd.c_str(), "%4d-%2d-%2d%c", &y, &m, &d, &extra) != 3 || yyyy_mm_dd.size() != 10 ||
        m < 1 || m > 12 || d < 1 || d > 31)
      throw std::runtime_error("template date '" + yyyy_mm_dd + "' is not YYYY-MM-DD");
  }
  std::lock_guard<std::mutex> lock(date_mutex);
  template_date = yyyy_mm_dd;
}

namespace {
Value strftime_now(CallArgs& a) {
  const auto b = bind(a, "strftime_now", {"format"}, 1);
  if (!b[0]->is_string()) render_error("strftime() argument 1 must be str, not " + type_name(*b[0]));
  std::tm tm{};
  std::string date;
  {
    std::lock_guard<std::mutex> lock(date_mutex);
    date = template_date;
  }
  if (date.empty()) {
    const std::time_t now = std::time(nullptr);
    localtime_r(&now, &tm);
  } else {
    tm.tm_year = std::stoi(date.substr(0, 4)) - 1900;
    tm.tm_mon = std::stoi(date.substr(5, 2)) - 1;
    tm.tm_mday = std::stoi(date.substr(8, 2));
    tm.tm_hour = 12;  // timegm normalizes the weekday and day of the year
    const std::time_t t = timegm(&tm);
    gmtime_r(&t, &tm);
    tm.tm_hour = 0;
  }
  std::string buf(256 + b[0]->s.size() * 8, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), b[0]->s.c_str(), &tm);
  if (n == 0 && !b[0]->s.empty()) unsupported("strftime format " + repr_string(b[0]->s), a.line);
  buf.resize(n);
  return Value::string(buf);
}

Value make_dict_from(CallArgs& a, const std::string& fn) {
  Value d = Value::make_dict();
  if (a.pos.size() > 1) render_error(fn + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_mapping() || src.kind == Kind::Namespace) {
      for (const auto& kv : src.dict->items) d.dict->set(kv.first, kv.second);
    } else {
      for (const Value& pair : iterate(src, a.line)) {
        const List kv = iterate(pair, a.line);
        if (kv.size() != 2) render_error("dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        d.dict->set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kw) d.dict->set(Value::string(k), v);
  return d;
}
}  // namespace

void add_globals(Scope& root) {
  root.vars["range"] = Value::callable("range", [](CallArgs& a) {
    if (!a.kw.empty()) render_error("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3) render_error("range expected 1 to 3 arguments");
    for (const auto& v : a.pos)
      if (!v.is_int()) render_error("'" + type_name(v) + "' object cannot be interpreted as an integer");
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) stop = a.pos[0].as_int();
    else start = a.pos[0].as_int(), stop = a.pos[1].as_int();
    if (a.pos.size() == 3) step = a.pos[2].as_int();
    if (step == 0) render_error("range() arg 3 must not be zero");
    List items;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (items.size() >= 100000)
        render_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      items.push_back(Value::integer(k));
    }
    Value r = Value::make_list(std::move(items));
    r.s = "range";  // a Python range object: prints, compares and serializes unlike a list
    return r;
  });
  root.vars["dict"] = Value::callable("dict", [](CallArgs& a) { return make_dict_from(a, "dict"); });
  root.vars["namespace"] = Value::callable("namespace", [](CallArgs& a) {
    Value d = make_dict_from(a, "namespace");
    for (const auto& kv : d.dict->items)
      if (kv.first.is_string() && !kv.first.s.empty() && kv.first.s[0] == '_')
        render_error("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
                     repr_string(kv.first.s) + ". Please rename the attribute.");
    d.kind = Kind::Namespace;
    return d;
  });
  root.vars["joiner"] = Value::callable("joiner", [](CallArgs& a) {
    const auto b = bind(a, "joiner", {"sep"}, 0);
    const std::string sep = b[0] ? to_str(*b[0]) : ", ";
    auto used = std::make_shared<bool>(false);
    return Value::callable("joiner", [sep, used](CallArgs&) {
      if (!*used) {
        *used = true;
        return Value::string("");
      }
      return Value::string(sep);
    });
  });
  root.vars["raise_exception"] = Value::callable("raise_exception", [](CallArgs& a) -> Value {
    const auto b = bind(a, "raise_exception", {"message"}, 1);
    TemplateError e(to_str(*b[0]));
    e.raised_by_template = true;
    throw e;
  });
  root.vars["strftime_now"] = Value::callable("strftime_now", strftime_now);
  for (const char* name : {"cycler", "lipsum"}) {
    const std::string n = name;
    root.vars[n] = Value::callable(n, [n](CallArgs& a) -> Value { unsupported(n + "()", a.line); });
  }
}

}  // namespace shardlm::data::jinja
