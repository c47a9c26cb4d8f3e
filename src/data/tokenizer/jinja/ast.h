// The parsed form of a chat template: expressions and statements as jinja2's parser builds them
// (nodes.py), reduced to what the engine supports. The parser (parser.cpp) makes them, the
// renderer (render.cpp) walks them. Internal to the jinja engine.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer/jinja/value.h"

namespace shardlm::data::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

enum class EK {
  Literal,    // lit
  Name,       // name
  Attr,       // a.name
  Item,       // a[b]
  Slice,      // a[args0:args1:args2], absent parts are null
  Call,       // a(args, kwargs)
  Filter,     // a | name(args, kwargs)
  Test,       // a is name(args, kwargs)
  Neg, Pos, Not,
  Binary,     // a name b: + - * / // % ** ~
  Compare,    // a name b: == != < <= > >= in notin
  And, Or,
  Cond,       // b if a else c (c may be null)
  ListLit, TupleLit, DictLit,  // args (DictLit: key, value, key, value, ...)
  Placeholder,  // the body of a filter block or block set
};

struct Expr {
  EK kind;
  int line = 0;
  std::string name;
  Value lit;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  int filter_id = -1;  // Filter/Test: the implementation's index (filters.h / tests.h)
  Expr(EK k, int l) : kind(k), line(l) {}
};

// An assignment target: a name, ns.attr, or a tuple of them.
struct Target {
  std::string name;
  std::string attr;  // non-empty: name.attr (a namespace attribute)
  std::vector<Target> items;  // a tuple target
  bool is_tuple = false;
};

enum class SK { Text, Print, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Generation, Break, Continue };

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: none
};

struct Stmt {
  SK kind;
  int line = 0;
  std::string text;                             // Text; Macro: its name
  ExprPtr expr;                                 // Print/Set value, For iterable, CallBlock call, filter chain
  ExprPtr cond;                                 // For: `if` filter
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body) for if and each elif
  Target target;                                // Set/SetBlock/For
  Body body, else_body;
  std::vector<MacroParam> params;               // Macro, CallBlock (caller's parameters)
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;  // Macro
  Stmt(SK k, int l) : kind(k), line(l) {}
};

struct Program {
  Body body;
};

Program parse(const std::string& source);

}  // namespace shardlm::data::jinja
