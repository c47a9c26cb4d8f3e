// The renderer's state and entry points, shared by render.cpp (statements), eval.cpp
// (expressions) and ops.cpp (Python's operators). Internal to the jinja engine.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer/jinja/ast.h"

namespace shardlm::data::jinja {

// One jinja2 frame: the root (the context and globals), a loop iteration, a macro call, a block.
struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  explicit Renderer(bool track_generation) : track_(track_generation) {}

  std::string run(const Program& prog, const nlohmann::ordered_json& context,
                  std::vector<std::pair<size_t, size_t>>* spans);

  Flow exec(const Body& body, const ScopePtr& scope);
  Value eval(const Expr& e, const ScopePtr& scope);

 private:
  bool track_;
  std::string top_;                    // what the template has yielded (the top-level output)
  std::string* out_ = &top_;           // where output goes now (top_ or a block's buffer)
  size_t counted_bytes_ = 0, counted_chars_ = 0;  // code points of top_[0, counted_bytes_)
  std::vector<std::pair<size_t, size_t>> spans_chars_;
  const Value* placeholder_ = nullptr;  // the body of the filter block or block set being filtered
  int call_depth_ = 0;                  // macros being called (Python's recursion limit stands behind jinja2's)

  Flow exec_stmt(const Stmt& s, const ScopePtr& scope);
  Flow exec_for(const Stmt& s, const ScopePtr& scope);
  void assign(const Target& t, const Value& v, Scope& scope, int line);
  std::string capture(const Body& body, const ScopePtr& scope, Flow* flow = nullptr);
  Value make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name);
  CallArgs eval_args(const Expr& e, const ScopePtr& scope);
  size_t top_chars();
};

// Python's binary operators (+ - * / // % **) and comparisons (== != < <= > >= in not in).
Value binary_op(const std::string& op, const Value& a, const Value& b, int line);
bool compare_op(const std::string& op, const Value& a, const Value& b, int line);
// The globals transformers' environment offers (range, dict, namespace, joiner, raise_exception,
// strftime_now) and those it refuses (cycler, lipsum).
void add_globals(Scope& root);

}  // namespace shardlm::data::jinja
