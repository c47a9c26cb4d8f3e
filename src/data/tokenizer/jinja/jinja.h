// A Jinja engine for Hugging Face chat templates, so that `prepare --sft`, `generate` and `export`
// render a conversation exactly as transformers' apply_chat_template renders it with jinja2 3.1
// (no C++ Jinja engine is packaged in Debian or on PyPI). It replicates transformers' environment
// (utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks,
// the loopcontrols and AssistantTracker ({% generation %}) extensions, its tojson filter
// (json.dumps, ensure_ascii=False, input key order) and the raise_exception, strftime_now, dict and
// namespace globals. Values print as Python's str() prints them.
//
// What it covers (anything else is refused at parse or render time with "unsupported Jinja
// construct `X` at template line N"; it never renders differently):
// - text, {{ }}, comments, raw blocks, whitespace control ({%- -%} {{- -}} {#- -#} {%+) with
//   jinja2's trim_blocks/lstrip_blocks rules, one trailing newline of the template dropped;
// - statements: if/elif/else; for (tuple targets, `if` filter, else, loop.index/index0/revindex/
//   revindex0/first/last/length/previtem/nextitem/depth/depth0/cycle()/changed()), break,
//   continue; set (names, tuples, ns.attr, block set with filters); macro (defaults, varargs,
//   kwargs, caller) and call blocks; filter blocks; generation blocks;
// - expressions: literals, names, attribute/item lookup with jinja2's attr<->item fallback,
//   slices, calls, + - * / // % ** ~, comparisons, in/not in, and/or/not, a if c else b, tests
//   and filters (see filters.cpp and tests.cpp for the lists), Python str/list/dict methods
//   (methods.cpp), the sandbox's refusal of mutating methods (SecurityError);
// - globals: range, dict, namespace, joiner, raise_exception, strftime_now.
// Not covered (refused): extends/include/import/block/with/do/print/autoescape, recursive loops,
// cycler, lipsum, str.format fields with a conversion or spec, printf-style `%` on strings,
// printing a callable, integers beyond 64 bits.
#pragma once
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::data::jinja {

// An error while rendering: raise_exception(...) (raised_by_template), an undefined value used
// where jinja2 raises, a type error, a SecurityError of the sandbox, or an unsupported construct.
struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
  bool raised_by_template = false;
};

struct Program;  // the parsed template (ast.h)

class Template {
 public:
  // Parses a template; throws std::runtime_error naming the construct and the template line for
  // syntax errors and for any construct not implemented.
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // context: the variables (messages, tools, add_generation_prompt, bos_token, ...).
  std::string render(const nlohmann::ordered_json& context) const;
  // As render, and fills generation_spans with the byte spans [begin, end) of the output that the
  // {% generation %} blocks wrote, as transformers' AssistantTracker reports them (it measures a
  // block's start as the length of what the template had yielded so far, so a block inside a macro,
  // a block set or a filter block is placed where transformers places it).
  std::string render(const nlohmann::ordered_json& context,
                     std::vector<std::pair<size_t, size_t>>* generation_spans) const;

 private:
  std::unique_ptr<Program> program_;
};

// strftime_now uses this date when set ("YYYY-MM-DD", at 00:00:00), else the local time now.
// An empty string goes back to the local time.
void set_template_date(const std::string& yyyy_mm_dd);

}  // namespace shardlm::data::jinja
