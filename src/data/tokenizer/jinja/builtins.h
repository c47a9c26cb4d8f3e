// What the engine offers a template beyond its syntax: jinja2's filters (filters.cpp), tests
// (tests.cpp), attribute and item lookup with the sandbox's rules and the Python methods of str,
// list and dict (methods.cpp), Python's string operations (pystr.cpp), and argument binding as
// Python binds a call. Internal to the jinja engine.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/jinja/value.h"

namespace shardlm::data::jinja {

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
// `value | name(args)`; `value is name(args)`.
Value apply_filter(const std::string& name, const Value& value, CallArgs& args);
bool apply_test(const std::string& name, const Value& value, CallArgs& args);

// The sandboxed environment's getattr (obj.name) and getitem (obj[key]): attribute first then item
// for `.`, item first then attribute for `[]`, an Undefined when neither exists, and an unsafe
// Undefined (a SecurityError when used) for _private attributes and methods that mutate.
Value get_attr(const Value& obj, const std::string& name, int line);
Value get_item(const Value& obj, const Value& key, int line);
// Calls a callable; an Undefined raises its error; anything else is not callable.
Value call_value(const Value& fn, CallArgs& args);

// Binds a call's arguments to a Python signature: names in order; the first `required` must be
// given. Missing optional ones are std::nullopt. Too many or unknown arguments are a TypeError.
std::vector<std::optional<Value>> bind(const CallArgs& args, const std::string& fn,
                                       const std::vector<const char*>& names, size_t required);

// Python str operations on UTF-8 text (indices in code points).
namespace py {
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
int64_t find(std::string_view s, std::string_view sub, bool reverse);  // code point index or -1
int64_t count(std::string_view s, std::string_view sub);
std::string center(std::string_view s, int64_t width, std::string_view fill);
bool is_cased_upper(std::string_view s);  // str.isupper()
bool is_cased_lower(std::string_view s);  // str.islower()
std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop,
                  std::optional<int64_t> step);
}  // namespace py

// Python's slice of a list (a[start:stop:step]).
List slice_list(const List& items, std::optional<int64_t> start, std::optional<int64_t> stop,
                std::optional<int64_t> step);

}  // namespace shardlm::data::jinja
