// Runs a parsed template as jinja2's generated code runs it: statements in order, output written to
// the top level or, inside a macro, call, filter block, block set or generation block, to that
// block's buffer; a for loop's iterations, macro calls and those blocks each get their own frame
// (so a `set` inside them stays inside), `if` does not. Generation blocks are placed as
// transformers' AssistantTracker places them.
#include "data/tokenizer/jinja/render.h"

#include "data/tokenizer/hf_text.h"
#include "data/tokenizer/jinja/builtins.h"
#include "data/tokenizer/jinja/jinja.h"

namespace shardlm::data::jinja {

namespace {
size_t count_chars(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
}  // namespace

size_t Renderer::top_chars() {
  counted_chars_ += count_chars(std::string_view(top_).substr(counted_bytes_));
  counted_bytes_ = top_.size();
  return counted_chars_;
}

std::string Renderer::run(const Program& prog, const nlohmann::ordered_json& context,
                          std::vector<std::pair<size_t, size_t>>* spans) {
  // The globals hold no state of their own (joiner's lives in what it returns): one set serves all.
  static const ScopePtr globals = [] {
    auto g = std::make_shared<Scope>();
    add_globals(*g);
    return g;
  }();
  auto root = std::make_shared<Scope>();
  root->parent = globals;
  if (!context.is_object()) throw TemplateError("the template context must be a JSON object");
  for (const auto& [k, v] : context.items()) root->vars[k] = Value::from_json(v);
  if (exec(prog.body, root) != Flow::Normal) unsupported("break or continue outside a for loop", 0);
  if (spans) {
    // Character offsets (what Python's len counts) to byte offsets of the output.
    spans->clear();
    auto to_byte = [&](size_t c) {  // where the c-th code point starts
      size_t chars = 0;
      for (size_t i = 0; i < top_.size(); ++i)
        if ((static_cast<unsigned char>(top_[i]) & 0xC0) != 0x80 && chars++ == c) return i;
      return top_.size();
    };
    for (const auto& [b, e] : spans_chars_) spans->emplace_back(to_byte(b), to_byte(e));
  }
  return std::move(top_);
}

Flow Renderer::exec(const Body& body, const ScopePtr& scope) {
  for (const auto& s : body) {
    const Flow f = exec_stmt(*s, scope);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

// Renders body into a buffer of its own. A break or continue inside it (only a filter block's or a
// block set's, which jinja2 compiles inline in the loop) is returned through `flow`.
std::string Renderer::capture(const Body& body, const ScopePtr& scope, Flow* flow) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  Flow f;
  try {
    f = exec(body, scope);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  if (flow) *flow = f;
  else if (f != Flow::Normal) unsupported("break or continue inside a block", body.empty() ? 0 : body.front()->line);
  return buf;
}

namespace {
ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}
}  // namespace

Flow Renderer::exec_stmt(const Stmt& s, const ScopePtr& scope) {
  switch (s.kind) {
    case SK::Text: *out_ += s.text; return Flow::Normal;
    case SK::Print: {
      const Value v = eval(*s.expr, scope);
      if (v.kind == Kind::Callable) unsupported("printing the callable " + v.fn->name, s.line);
      *out_ += to_str(v);
      return Flow::Normal;
    }
    case SK::If:
      for (const auto& [cond, body] : s.branches)
        if (truthy(eval(*cond, scope))) return exec(body, scope);
      return exec(s.else_body, scope);
    case SK::For: return exec_for(s, scope);
    case SK::Break: return Flow::Break;
    case SK::Continue: return Flow::Continue;
    case SK::Set: assign(s.target, eval(*s.expr, scope), *scope, s.line); return Flow::Normal;
    case SK::SetBlock:
    case SK::FilterBlock: {
      Flow flow = Flow::Normal;
      const Value body = Value::string(capture(s.body, child(scope), &flow));
      if (flow != Flow::Normal) return flow;  // the block's output and assignment are skipped
      const Value* saved = placeholder_;
      placeholder_ = &body;
      Value v;
      try {
        v = eval(*s.expr, scope);
      } catch (...) {
        placeholder_ = saved;
        throw;
      }
      placeholder_ = saved;
      if (s.kind == SK::SetBlock) assign(s.target, v, *scope, s.line);
      else *out_ += to_str(v);
      return Flow::Normal;
    }
    case SK::Macro: scope->vars[s.text] = make_macro(s, scope, s.text); return Flow::Normal;
    case SK::CallBlock: {
      const Expr& call = *s.expr;
      Value fn = eval(*call.a, scope);
      CallArgs args = eval_args(call, scope);
      args.kw.emplace_back("caller", make_macro(s, scope, "caller"));
      *out_ += to_str(call_value(fn, args));
      return Flow::Normal;
    }
    case SK::Generation: {
      const std::string rv = capture(s.body, child(scope));
      if (track_) {
        const size_t start = top_chars();
        spans_chars_.emplace_back(start, start + count_chars(rv));
      }
      *out_ += rv;
      return Flow::Normal;
    }
  }
  return Flow::Normal;
}

Flow Renderer::exec_for(const Stmt& s, const ScopePtr& scope) {
  const Value iterable = eval(*s.expr, scope);
  List items = iterate(iterable, s.line);
  if (s.cond) {
    List kept;
    for (auto& item : items) {
      auto it_scope = child(scope);
      assign(s.target, item, *it_scope, s.line);
      if (truthy(eval(*s.cond, it_scope))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  // loop.cycle and loop.changed are made once per loop; cycle reads the current index.
  auto index = std::make_shared<int64_t>(0);
  auto last_changed = std::make_shared<std::optional<List>>();
  const Value cycle = Value::callable("loop.cycle", [index](CallArgs& a) {
    if (a.pos.empty()) render_error("no items for cycling given");
    return a.pos[static_cast<size_t>(*index) % a.pos.size()];
  });
  const Value changed = Value::callable("loop.changed", [last_changed](CallArgs& a) {
    if (last_changed->has_value() && equals(Value::make_list(**last_changed), Value::make_list(a.pos)))
      return Value::boolean(false);
    *last_changed = a.pos;
    return Value::boolean(true);
  });
  bool completed = false;  // jinja2 runs `else` unless some iteration reached the end of the body
  for (int64_t k = 0; k < n; ++k) {
    *index = k;
    auto it_scope = child(scope);
    assign(s.target, items[static_cast<size_t>(k)], *it_scope, s.line);
    Value loop = Value::make_namespace();
    loop.s = "loop";
    auto& d = loop.dict->items;
    d.reserve(13);
    auto put = [&](const char* name, Value v) { d.emplace_back(Value::string(name), std::move(v)); };
    put("index", Value::integer(k + 1));
    put("index0", Value::integer(k));
    put("revindex", Value::integer(n - k));
    put("revindex0", Value::integer(n - k - 1));
    put("first", Value::boolean(k == 0));
    put("last", Value::boolean(k == n - 1));
    put("length", Value::integer(n));
    put("depth", Value::integer(1));
    put("depth0", Value::integer(0));
    put("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item"));
    put("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item"));
    put("cycle", cycle);
    put("changed", changed);
    it_scope->vars["loop"] = std::move(loop);
    const Flow f = exec(s.body, it_scope);
    if (f == Flow::Break) break;
    completed |= f == Flow::Normal;
  }
  if (!completed) return exec(s.else_body, scope);
  return Flow::Normal;
}

void Renderer::assign(const Target& t, const Value& v, Scope& scope, int line) {
  if (t.is_tuple) {
    const List items = iterate(v, line);
    if (items.size() != t.items.size())
      render_error(std::string(items.size() > t.items.size() ? "too many" : "not enough") +
                   " values to unpack (expected " + std::to_string(t.items.size()) + ", got " +
                   std::to_string(items.size()) + ") at template line " + std::to_string(line));
    for (size_t k = 0; k < items.size(); ++k) assign(t.items[k], items[k], scope, line);
    return;
  }
  if (t.attr.empty()) {
    scope.vars[t.name] = v;
    return;
  }
  const Value* ns = scope.find(t.name);
  if (!ns || ns->kind != Kind::Namespace || ns->s == "loop")
    render_error("cannot assign attribute on non-namespace object (template line " + std::to_string(line) + ")");
  if (!t.attr.empty() && t.attr[0] == '_')
    render_error("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
                 repr_string(t.attr) + ". Please rename the attribute.");
  ns->dict->set(Value::string(t.attr), v);
}

// A macro (or a call block's caller) as a callable: binds its arguments as jinja2's Macro does,
// then renders its body into a string in a frame of its own whose parent is where it was defined.
Value Renderer::make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name) {
  const Stmt* def = &s;
  // The definition's frame is held weakly: the frame holds the macro, so a strong hold would be a cycle.
  std::weak_ptr<Scope> weak = scope;
  return Value::callable("macro " + name, [this, def, weak, name](CallArgs& a) {
    if (call_depth_ >= 256) render_error("maximum recursion depth exceeded calling macro " + name);
    struct Depth {
      int& d;
      explicit Depth(int& x) : d(++x) {}
      ~Depth() { --d; }
    } depth(call_depth_);
    ScopePtr defining = weak.lock();
    if (!defining) unsupported("calling macro " + name + " after the frame that defined it ended", def->line);
    auto frame = child(defining);
    const auto& params = def->params;
    if (a.pos.size() > params.size() && !def->uses_varargs)
      render_error("macro '" + name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
    std::vector<bool> given(params.size(), false);
    for (size_t k = 0; k < a.pos.size() && k < params.size(); ++k) {
      frame->vars[params[k].name] = a.pos[k];
      given[k] = true;
    }
    Value kwargs = Value::make_dict();
    Value caller;
    for (auto& [key, v] : a.kw) {
      size_t k = 0;
      while (k < params.size() && params[k].name != key) ++k;
      if (k < params.size()) {
        if (given[k]) render_error("macro '" + name + "' got multiple values for argument '" + key + "'");
        frame->vars[key] = v;
        given[k] = true;
      } else if (key == "caller" && def->kind == SK::Macro) {
        if (!def->uses_caller) render_error("macro '" + name + "' was invoked with two values for the special caller argument");
        caller = v;
      } else if (def->uses_kwargs) {
        kwargs.dict->set(Value::string(key), v);
      } else {
        render_error("macro '" + name + "' takes no keyword argument '" + key + "'");
      }
    }
    for (size_t k = 0; k < params.size(); ++k) {
      if (given[k]) continue;
      frame->vars[params[k].name] = params[k].default_value
                                        ? eval(*params[k].default_value, frame)
                                        : Value::undefined("parameter '" + params[k].name + "' was not provided");
    }
    if (def->uses_varargs) {
      List extra(a.pos.size() > params.size() ? a.pos.begin() + static_cast<long>(params.size()) : a.pos.end(),
                 a.pos.end());
      frame->vars["varargs"] = Value::make_tuple(std::move(extra));
    }
    if (def->uses_kwargs) frame->vars["kwargs"] = kwargs;
    if (def->kind == SK::Macro && def->uses_caller)
      frame->vars["caller"] = caller.is_undefined() ? Value::undefined("No caller defined") : caller;
    return Value::string(capture(def->body, frame));
  });
}

}  // namespace shardlm::data::jinja
