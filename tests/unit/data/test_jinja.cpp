// The chat-template engine (src/data/tokenizer/jinja/) against jinja2 itself: every case of
// tests/golden/jinja_cases.json (made by tests/reference/make_jinja_cases.py with the pinned jinja2
// in transformers' own environment) renders to the same text and generation spans, raises where
// jinja2 raises (with jinja2's message for raise_exception, undefined values and the sandbox), and
// is refused by name where the engine does not implement what jinja2 renders. Then the API's own
// promises: raise_exception's flag, the pinned date, byte spans, parse errors naming the line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <string>

#include "data/tokenizer/jinja/jinja.h"

namespace shardlm::data::jinja {
namespace {

using ojson = nlohmann::ordered_json;

const ojson& golden() {
  static const ojson g = [] {
    std::ifstream in(std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/jinja_cases.json");
    if (!in) throw std::runtime_error("tests/golden/jinja_cases.json is missing: run tests/reference/make_jinja_cases.py");
    return ojson::parse(in);
  }();
  return g;
}

// Renders every golden case whose name starts with `prefix`; returns how many there were.
int check_group(const std::string& prefix) {
  const ojson& g = golden();
  set_template_date(g["date"].get<std::string>());
  int n = 0;
  for (const auto& c : g["cases"]) {
    const std::string name = c["name"].get<std::string>();
    if (name.rfind(prefix, 0) != 0) continue;
    ++n;
    const std::string tpl = c["template"].get<std::string>();
    const ojson& ctx = c["context"] == "default" ? g["default_context"] : c["context"];
    SCOPED_TRACE(name + ": " + tpl);
    std::string out, error;
    bool raised_by_template = false;
    std::vector<std::pair<size_t, size_t>> spans;
    try {
      Template t(tpl);
      out = t.render(ctx, &spans);
    } catch (const TemplateError& e) {
      error = std::string("E:") + e.what();
      raised_by_template = e.raised_by_template;
    } catch (const std::runtime_error& e) {
      error = std::string("E:") + e.what();
    }
    if (c.contains("refused")) {
      EXPECT_NE(error.find(c["refused"].get<std::string>()), std::string::npos) << "got: " << (error.empty() ? out : error);
      continue;
    }
    if (c.contains("error")) {
      EXPECT_FALSE(error.empty()) << "jinja2 raised " << c["error_type"] << ": " << c["error"] << ", the engine rendered "
                                  << out;
      const std::string type = c["error_type"].get<std::string>();
      if (type == "TemplateError" || type == "UndefinedError" || type == "SecurityError") {
        EXPECT_NE(error.find(c["error"].get<std::string>()), std::string::npos) << "got " << error;
      }
      EXPECT_EQ(raised_by_template, type == "TemplateError") << error;
      continue;
    }
    EXPECT_EQ(error, "");
    EXPECT_EQ(out, c["output"].get<std::string>());
    std::vector<std::pair<size_t, size_t>> want;
    for (const auto& s : c["spans"]) want.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
    EXPECT_EQ(spans, want);
    EXPECT_EQ(Template(tpl).render(ctx), out) << "rendering without spans differs";
  }
  return n;
}

TEST(JinjaGolden, WhitespaceControlTrimAndLstripBlocks) { EXPECT_GT(check_group("whitespace_"), 30); }
TEST(JinjaGolden, LiteralsPrintAsPythonStr) { EXPECT_GT(check_group("print_"), 70); }
TEST(JinjaGolden, Expressions) { EXPECT_GT(check_group("expr_"), 120); }
TEST(JinjaGolden, Statements) { EXPECT_GT(check_group("stmt_"), 60); }
TEST(JinjaGolden, GenerationSpans) { EXPECT_EQ(check_group("generation_"), 6); }
TEST(JinjaGolden, Tests) { EXPECT_GT(check_group("test_"), 55); }
TEST(JinjaGolden, Filters) { EXPECT_GT(check_group("filter_"), 140); }
TEST(JinjaGolden, PythonMethodsAndSandbox) { EXPECT_GT(check_group("method_"), 55); }
TEST(JinjaGolden, RefusesWhatItDoesNotImplement) { EXPECT_GT(check_group("refused_"), 20); }
TEST(JinjaGolden, SyntaxErrors) { EXPECT_GT(check_group("syntax_"), 15); }

TEST(JinjaGolden, EveryCaseBelongsToAGroup) {
  const std::set<std::string> groups = {"whitespace_", "print_", "expr_",    "stmt_",    "generation_",
                                        "test_",       "filter_", "method_", "refused_", "syntax_"};
  for (const auto& c : golden()["cases"]) {
    const std::string name = c["name"].get<std::string>();
    const std::string group = name.substr(0, name.find('_') + 1);
    EXPECT_TRUE(groups.count(group)) << name;
  }
}

TEST(JinjaEngine, RaiseExceptionCarriesTheTemplatesMessage) {
  Template t("{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}");
  try {
    t.render(ojson::parse(R"({"messages": [{"role": "assistant", "content": "x"}]})"));
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_STREQ(e.what(), "Conversations must start with a user turn");
    EXPECT_TRUE(e.raised_by_template);
  }
  try {
    Template("{{ x.y }}").render(ojson::object());
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_STREQ(e.what(), "'x' is undefined");
    EXPECT_FALSE(e.raised_by_template);
  }
}

TEST(JinjaEngine, TemplateDatePinsStrftimeNow) {
  Template t("{{ strftime_now('%Y-%m-%d %A %d %B') }}");
  set_template_date("2024-02-29");
  EXPECT_EQ(t.render(ojson::object()), "2024-02-29 Thursday 29 February");
  set_template_date("2026-12-31");
  EXPECT_EQ(t.render(ojson::object()), "2026-12-31 Thursday 31 December");
  EXPECT_THROW(set_template_date("2026-13-01"), std::runtime_error);
  EXPECT_THROW(set_template_date("26-1-1"), std::runtime_error);
  set_template_date("");  // back to the local time: a date of the same shape
  const std::string today = Template("{{ strftime_now('%Y-%m-%d') }}").render(ojson::object());
  ASSERT_EQ(today.size(), 10u);
  EXPECT_EQ(today[4], '-');
  EXPECT_EQ(today[7], '-');
}

TEST(JinjaEngine, GenerationSpansAreByteOffsetsOfTheOutput) {
  Template t("é{% for m in messages %}<{{ m.role }}>{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}");
  std::vector<std::pair<size_t, size_t>> spans;
  const std::string out =
      t.render(ojson::parse(R"({"messages": [{"role": "a", "content": "ü😀"}, {"role": "b", "content": "x"}]})"), &spans);
  EXPECT_EQ(out, "é<a>ü😀<b>x");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(out.substr(spans[0].first, spans[0].second - spans[0].first), "ü😀");
  EXPECT_EQ(out.substr(spans[1].first, spans[1].second - spans[1].first), "x");
}

TEST(JinjaEngine, ParseErrorsAndRefusalsNameTheLine) {
  try {
    Template("a\nb\n{% if x %}\n{% include 'y' %}{% endif %}");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported Jinja construct `{% include %}` at template line 4"), std::string::npos)
        << e.what();
  }
  try {
    Template("{{ x }}\n{{ y | nosuchfilter }}");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("`filter nosuchfilter` at template line 2"), std::string::npos) << e.what();
  }
}

TEST(JinjaEngine, KeepsTheContextsKeyOrderAndMoves) {
  Template a("{{ tools | tojson }} {{ tools[0] }}");
  Template b(std::move(a));
  EXPECT_EQ(b.render(ojson::parse(R"({"tools": [{"z": 1, "a": [true, null, 1.5]}]})")),
            R"([{"z": 1, "a": [true, null, 1.5]}] {'z': 1, 'a': [True, None, 1.5]})");
}

}  // namespace
}  // namespace shardlm::data::jinja
