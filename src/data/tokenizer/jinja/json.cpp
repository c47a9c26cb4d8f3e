// transformers' tojson filter: Python's json.dumps(x, ensure_ascii=False, indent=..., separators=...,
// sort_keys=...), byte for byte: its string escapes, float repr, NaN/Infinity, key coercion, and
// the item separator ", " (or "," with an indent).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "data/tokenizer/hf_text.h"
#include "data/tokenizer/jinja/value.h"

namespace shardlm::data::jinja {
namespace {

void put_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t c = hf::next_char(s, i);
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
          if (c > 0xffff) {
            const char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                          static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          out.append(s.substr(start, i - start));
        }
    }
  }
  out += '"';
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return repr_float(d);
}

struct Writer {
  const JsonStyle& style;
  int line;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) out += style.indent_str;
  }
  bool indented() const { return style.indent >= 0; }
  std::string item_sep() const { return style.has_separators ? style.item_sep : indented() ? "," : ", "; }
  std::string key_sep() const { return style.has_separators ? style.key_sep : ": "; }

  void write(const Value& v, int level) {
    switch (v.kind) {
      case Kind::None: out += "null"; return;
      case Kind::Bool: out += v.b ? "true" : "false"; return;
      case Kind::Int: out += std::to_string(v.i); return;
      case Kind::Float: out += float_json(v.f); return;
      case Kind::String: put_string(out, v.s, style.ensure_ascii); return;
      case Kind::List:
      case Kind::Tuple: {
        if (v.s == "range") render_error("Object of type range is not JSON serializable");
        if (v.list->empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t k = 0; k < v.list->size(); ++k) {
          if (k) out += item_sep();
          if (indented()) newline(level + 1);
          write((*v.list)[k], level + 1);
        }
        if (indented()) newline(level);
        out += ']';
        return;
      }
      case Kind::Dict: {
        if (v.dict->items.empty()) {
          out += "{}";
          return;
        }
        std::vector<std::pair<std::string, const Value*>> items;
        for (const auto& [k, e] : v.dict->items) {
          std::string key;
          if (k.is_string()) key = k.s;
          else if (k.kind == Kind::Float) key = float_json(k.f);
          else if (k.kind == Kind::Bool) key = k.b ? "true" : "false";
          else if (k.is_none()) key = "null";
          else if (k.kind == Kind::Int) key = std::to_string(k.i);
          else render_error("keys must be str, int, float, bool or None, not " + type_name(k));
          items.emplace_back(std::move(key), &e);
        }
        if (style.sort_keys)
          std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        out += '{';
        for (size_t k = 0; k < items.size(); ++k) {
          if (k) out += item_sep();
          if (indented()) newline(level + 1);
          put_string(out, items[k].first, style.ensure_ascii);
          out += key_sep();
          write(*items[k].second, level + 1);
        }
        if (indented()) newline(level);
        out += '}';
        return;
      }
      default:
        render_error("Object of type " + type_name(v) + " is not JSON serializable (template line " +
                     std::to_string(line) + ")");
    }
  }
};

}  // namespace

std::string to_json(const Value& v, const JsonStyle& style, int line) {
  Writer w{style, line, {}};
  w.write(v, 0);
  return std::move(w.out);
}

}  // namespace shardlm::data::jinja
