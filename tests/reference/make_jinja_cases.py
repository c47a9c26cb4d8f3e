#!/usr/bin/env python3
"""Golden renderings for shardlm's Jinja engine (src/data/tokenizer/jinja/), made by the pinned jinja2 in
transformers' own chat-template environment (transformers.utils.chat_template_utils).

    /opt/shardlm/venv/bin/python tests/reference/make_jinja_cases.py           # write the golden
    /opt/shardlm/venv/bin/python tests/reference/make_jinja_cases.py --check   # compare with it

Writes tests/golden/jinja_cases.json: {"jinja2": version, "transformers": version, "date": the
date strftime_now renders, "cases": [{"name", "template", "context", then "output" and "spans"
(the byte spans of {% generation %} blocks, as transformers' AssistantTracker reports them in
characters, converted to UTF-8 bytes) or "error_type" and "error"; "refused": a substring of the
engine's error where the engine refuses a construct jinja2 renders}]}. Each case renders through
the template transformers compiles (_compile_jinja_template: ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, AssistantTracker, its tojson, raise_exception,
strftime_now, dict, namespace) exactly as _render_with_assistant_indices renders it, with
strftime_now pinned to DATE. test_data's JinjaGolden tests render every case with the engine.
"""
import argparse
import datetime
import json
import os
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "golden", "jinja_cases.json")
DATE = "2026-01-15"

MSGS = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Héllo 😀 世界\n  spaced  "},
    {"role": "assistant", "content": "Hi there!", "reasoning_content": "think"},
    {"role": "user", "content": "Thanks"},
]
CTX = {
    "name": "World", "n": 3, "x": 2.5, "s": "héllo😀", "l": [1, 2, 3, 4, 5], "e": [], "d": {"b": 1, "a": 2, "items": 5},
    "m": {"role": "user", "content": "hi"}, "messages": MSGS, "words": ["b", "A", "c", "a", "B"],
    "people": [{"name": "Bo", "age": 30, "tags": ["x"]}, {"name": "al", "age": 25}, {"name": "Cy", "age": 30}],
    "t": True, "f": False, "z": None, "big": 12345678901234, "fl": 1.0,
}


def gen_cases():
    cases = []

    def add(name, template, ctx=None, refused=None):
        c = {"name": name, "template": template, "context": CTX if ctx is None else ctx}
        if refused:
            c["refused"] = refused
        cases.append(c)

    # Whitespace control, trim_blocks, lstrip_blocks, comments, raw, newlines.
    ws = [
        "Hello {{ name }}!", "{% if true %}\nyes\n{% endif %}\nafter", "  {% if true %}\n  x\n  {% endif %}\n",
        "{%- if true -%}  a  {%- endif -%}  b", "a  {{- 'x' -}}  b", "a {#- comment -#} b", "a {# c #}\nb",
        "  {# c #}\n b", "  {%+ if true %}x{% endif %}", "{% if true +%}\nx{% endif %}", "x\n  {%- if true %}y{% endif %}",
        "{% raw %}{{ x }}{% endraw %}", "  {% raw %}\n{{ a }}\n  {% endraw %}\nz", "{% raw -%}  a  {%- endraw %}",
        "abc\n", "abc\n\n", "a\r\nb\rc\r\n", "\t{% if true %}x{% endif %}", "{{ 1 }}\n{{ 2 }}\n",
        "a\n    {% for i in [1,2] %}\n    {{ i }}\n    {% endfor %}\nb", "{{ '{{' }}{{ '}}' }}",
        "\u3000{% if true %}x{% endif %}", "x {% if true %}\n  y{% endif %}", "{% for i in [1] -%}\n\n  {{ i }}\n{%- endfor %}",
        "{#\nmulti\nline\n#}\nz", "a{{- ' ' -}}b", "{{ x -}}\n\n  y", "  {{ x }}", " \t {% set q = 1 %} \n{{ q }}",
        "{% if true %}a{% else %}b{% endif %}\n\n", "line1\n{% if false %}\nno\n{% endif %}\nline2",
        "{%- for i in [1,2] %}\n  {{- i }}\n{%- endfor %}", "{{ 'a' }}{# x #}{{ 'b' }}", "{% if true %}  \n{% endif %}",
        "  {%- if true %}\n x\n{%- endif %}  ", "{% raw %}\n  {% if %}\n{% endraw %}", "a\n\n{%- if true -%}\n\nb",
    ]
    for k, t in enumerate(ws):
        add(f"whitespace_{k}", t)

    # Literals and Python str() printing.
    prints = [
        "1", "-5", "1.0", "0.1", "1e-5", "1e16", "1.5e300", "123456789012345678.0", "0.000123", "2.5", "-0.0",
        "3.14159", "1/3", "10/2", "7//2", "-7//2", "7 % 3", "-7 % 3", "2**10", "2**-1", "2**3**2", "7.5 // 2",
        "-7.5 % 2", "0.1 + 0.2", "1e22", "1e15", "1e-4", "12345.678", "'a\\nb'", "'tab\\tx'", "'\\x41\\u00e9\\U0001F600'",
        "'it\\'s'", "\"q\\\"\"", "'\\d'", "'a' 'b' \"c\"", "[1, 'a', None, True, 1.5]", "[]", "{}",
        "{'a': 1, 'b': [1, 2]}", "(1,)", "()", "(1, 2)", "1, 2", "[\"it's\"]", "['say \"hi\"']", "['both \\' and \"']",
        "['back\\\\slash']", "['new\\nline\\r\\t']", "['\\x00\\x7f\\x1b']", "['é😀']", "['\\u200b\\xa0\\u2028']",
        "{1: 'a', 2.5: None, True: 'x'}", "[[1, [2]], {'k': {'j': ()}}]", "true", "none", "None", "False", "m",
        "messages[2]", "big", "fl", "[fl, x, z, t]", "d", "'%d'", "1_000", "0", "0.5e1", "[1.0, 1e100, -1e-100]",
        "'\\101'", "['\U0001fae8 \u0cf3 \U00031350', '\U0001f600']", "[s]", "['\\'']", "(s, 'x')", "['\\x85']",
    ]
    for k, p in enumerate(prints):
        add(f"print_{k}", "{{ " + p + " }}")

    # Operators and expressions.
    exprs = [
        "0 or 'x'", "'a' and 'b'", "'' and 'b'", "none or []", "not 0", "not 'a'", "1 < 2", "1 == 1.0", "'a' < 'b'",
        "[1,2] < [1,3]", "1 < 2 < 3", "3 > 2 > 2", "true == 1", "'a' != 'b'", "'a' in 'cat'", "2 in [1,2]",
        "'k' in {'k':1}", "'x' not in ['y']", "'a' in undefined_var", "1 ~ 'a' ~ none ~ true", "undefined_x ~ 'a'",
        "[1] ~ 'x'", "'a' + 'b'", "[1] + [2]", "1 + 2.5", "true + 1", "'ab' * 3", "[0] * 3", "3 * 'x'", "-(3)", "-x",
        "-1|abs", "+1", "'y' if true else 'n'", "'y' if false", "'a' if 0 else 'b' if 1 else 'c'", "1 + 2 * 3",
        "(1 + 2) * 3", "2 * 3 ~ 4", "1 + 1 ~ 2", "not 1 == 2", "'a' ~ 1 + 2", "m.role", "m['role']", "m.missing",
        "m['missing']", "l[0]", "l[-1]", "l[10]", "l.0", "s[0]", "s[-1]", "d['items']", "d.items()|list",
        "d.keys()|list", "d.values()|list", "d.get('x')", "d.get('x', 1)", "d.get('items')", "s[1:3]", "s[::-1]",
        "s[-2:]", "s[:-1]", "l[::2]", "l[1::2]", "l[::-2]", "l[5:1:-1]", "l[-100:100]", "'héllo😀'[1:4]",
        "messages[1:]|length", "messages[-1]['content']", "messages[-1].content", "undefined_x", "undefined_x is defined",
        "undefined_x.attr", "undefined_x['a']", "undefined_x + 1", "undefined_x|length", "undefined_x == undefined_y",
        "undefined_x|default('d')", "none|default('d')", "none|default('d', true)", "''|default('d', boolean=true)",
        "m.missing.deeper", "m.missing is defined", "z is none", "(1, 2)[0]", "[1, 2, 3][1:]", "{'a': {'b': 1}}.a.b",
        "l[1:3][0]", "'abc'[10:]", "l|length > 3", "n > 2 and n < 5", "not n is odd", "-n ** 2", "n * -1",
        "'x' if undefined_x else 'y'", "undefined_x or 'fallback'", "1 if t", "'%s' if t", "10 // 3 * 3 + 10 % 3",
        "x * 2", "x // 1", "5 / 2 * 2", "true and 0", "[] or {} or 0", "1 != 1.0", "s == 'héllo😀'", "l == [1,2,3,4,5]",
        "d == {'a': 2, 'b': 1, 'items': 5}", "(1,) == [1]", "none == none", "'b' > 'a' > ''", "m.role == 'user'",
        "messages|selectattr('role', 'eq', 'user')|list|length", "1 in [1.0]", "'1' in [1]", "l[1.5] is defined",
        "d[undefined_x] is defined", "range(3)[1]", "'a' * 0", "[1,2][-3] is defined",
        "-2 ** n", "(1 - 3) ** n", "-2.0 ** n", "[-2][0] ** n", "-0.0 ** n", "(-2)|abs ** n", "-(2) ** fl", "-2 ** 2",
        "(-2) ** 2", "((1 - 3) if true else 0) ** n", "1 % -1.0", "1 // 0.1", "-7.5 // 2", "1 % 0.1", "{'k': 1} in d",
        "[[1]]|unique|list", "none|map('string')|list", "range(2) == [0, 1]", "range(2)|list == [0, 1]", "range(3)|tojson",
        "range(3)[1:]|list", "range(3)|length", "range(3)|join", "range(3)|last", "1 in range(3)",
        "range(2) + [1]", "range(2) * 2", "range(4)[::2] == range(0, 4, 2)",
    ]
    for k, e in enumerate(exprs):
        add(f"expr_{k}", "{{ " + e + " }}")

    # Statements.
    stmts = [
        "{% if n == 1 %}one{% elif n == 3 %}three{% elif n == 3 %}again{% else %}other{% endif %}",
        "{% if false %}a{% elif false %}b{% else %}c{% endif %}",
        "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
        "{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}",
        "{% for x in l %}{{ loop.cycle('odd', 'even') }} {% endfor %}",
        "{% for x in [1,1,2,2,1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}",
        "{% for x in e %}{{ x }}{% else %}empty{% endfor %}", "{% for x in l %}{{ x }}{% else %}empty{% endfor %}",
        "{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }}{{ loop.length }} {% endfor %}",
        "{% for x in l if x > 10 %}{{ x }}{% else %}none left{% endfor %}",
        "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{% for a, b in [[1,2],[3,4]] %}{{ a + b }}{% endfor %}",
        "{% for (a, b) in [(1,2)] %}{{ a }}{{ b }}{% endfor %}", "{% for k in d %}{{ k }}{% endfor %}",
        "{% for c in s %}[{{ c }}]{% endfor %}", "{% for x in l %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
        "{% for x in l %}{% if x is even %}{% continue %}{% endif %}{{ x }}{% endfor %}",
        "{% for x in [1,2] %}{% for y in [3,4] %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.index }}|{% endfor %}",
        "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }},{% endfor %}{{ x }}",
        "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
        "{% for i in [1,2] %}{% if i == 2 %}[{{ z2 }}]{% endif %}{% set z2 = i %}{% endfor %}[{{ z2 }}]",
        "{% set ns = namespace(found=false, count=0) %}{% for m in messages %}{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% set ns.count = ns.count + 1 %}{% endfor %}{{ ns.found }} {{ ns.count }}",
        "{% set ns = namespace(a=1) %}{{ ns }}", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c }}",
        "{% set ns = namespace() %}{% set ns.x = [1] %}{{ ns.x }}{{ ns['x'] }}",
        "{% set a, b = 1, 2 %}{{ a }}{{ b }}", "{% set a = b = 3 %}", "{% set x %}hello {{ name }}{% endset %}{{ x|upper }}",
        "{% set x | trim %}  hi  {% endset %}[{{ x }}]", "{% set x | trim | upper %}  hi  {% endset %}[{{ x }}]",
        "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }}{{ greet('Al', punct='?') }}{{ greet(name='Z') }}{{ greet() }}",
        "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}",
        "{% macro m(a, b=a * 2) %}{{ a }},{{ b }}{% endmacro %}{{ m(3) }}", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
        "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }}", "{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inner {{ name }}{% endcall %}",
        "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1,2]) %}<{{ x }}>{% endcall %}",
        "{% filter upper %}hello {{ name }}{% endfilter %}", "{% filter replace('a', 'b') | upper %}aaa{% endfilter %}",
        "{% macro m() %}{{ v }}{% endmacro %}{% set v = 1 %}{{ m() }}{% set v = 2 %}{{ m() }}",
        "{% macro outer() %}{% macro inner() %}in{% endmacro %}{{ inner() }}{% endmacro %}{{ outer() }}",
        "{{ raise_exception('bad role: ' ~ m.role) }}", "{% if m.role != 'system' %}{{ raise_exception('Only system!') }}{% endif %}",
        "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%A %B %j') }}",
        "{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ range(0)|list }}",
        "{% for i in range(3) %}{{ i }}{% endfor %}", "{{ dict(a=1, b=2) }}{{ dict([('a', 1)]) }}{{ dict() }}",
        "{% set j = joiner(', ') %}{% for x in [1,2,3] %}{{ j() }}{{ x }}{% endfor %}",
        "{% set j = joiner() %}{{ j() }}{{ j() }}{{ j() }}", "{{ namespace(_x=1) }}",
        "{% set ns = namespace() %}{% set ns._y = 1 %}", "{% set q = 1 %}{% set q = q + 1 %}{{ q }}",
        "{% for m in messages %}{{ loop.index }}:{{ m.role }}\n{% endfor %}",
        "{% for m in messages %}{% if loop.first and m.role == 'system' %}{% continue %}{% endif %}{{ m.content|trim }}{% if not loop.last %}|{% endif %}{% endfor %}",
        "{% for x in l %}{% set sq = x * x %}{{ sq }}{% endfor %}{{ sq }}", "{% for x in none %}{% endfor %}",
        "{% for x in 5 %}{% endfor %}", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", "{% set l2 = l %}{{ l2 is sameas l }}",
        "{% if [] %}a{% elif {} %}b{% elif '' %}c{% elif 0.0 %}d{% else %}e{% endif %}",
        "{% for x in [3,1,2]|sort %}{{ x }}{% endfor %}", "{% for i in range(2) %}{% for j in range(2) %}{% if j == 1 %}{% break %}{% endif %}{{ i }}{{ j }}{% endfor %}{% endfor %}",
        "{{ loop }}", "{% for x in [1] %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}",
        "{% set ns = namespace(x=1) %}{% set ns.x %}hi {{ name }}{% endset %}{{ ns.x }}",
        "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(4) }}",
        "{% macro r(x) %}{{ r(x) }}{% endmacro %}{{ r(1) }}",
        "{% for m in messages %}{% set ns = namespace(a=loop.index) %}{{ ns.a }}{% endfor %}",
        "{% macro c(content) %}{% if content is string %}{{ content }}{% else %}{% for p in content %}{{ p.text }}{% endfor %}{% endif %}{% endmacro %}{{ c('x') }}{{ c([{'text': 'y'}]) }}",
        "{% macro m() %}{% set inner = 1 %}{{ inner }}{% endmacro %}{{ m() }}[{{ inner }}]",
        "{% set v = 5 %}{% macro m(a=v) %}{{ a }}{% endmacro %}{{ m() }}", "{% macro m() %}x{% endmacro %}{{ m(caller=1) }}",
        "{% for x in l if loop.index > 1 %}{{ x }}{% endfor %}", "{% for x in l %}{% endfor %}[{{ x }}]",
        "{% for a in [[1, [2, 3]]] %}{% for b, (c, e) in [a] %}{{ b }}{{ c }}{{ e }}{% endfor %}{% endfor %}",
        "{% for i in range(3) %}{{ i }}{% break %}{% else %}E{% endfor %}", "{% for i in range(3) %}{% continue %}{% else %}E{% endfor %}",
        "{% for i in range(3) %}{% if i < 2 %}{% continue %}{% endif %}{{ i }}{% else %}E{% endfor %}",
        "{% for i in range(3) %}{% filter upper %}a{% if i == 1 %}{% continue %}{% endif %}b{% endfilter %}{% endfor %}",
        "{% for i in range(3) %}{% set v %}{{ i }}{% if i == 1 %}{% break %}{% endif %}{% endset %}{{ v }}{% endfor %}",
        "{% if false %}{% break %}{% endif %}", "{% for i in l %}{% else %}{% continue %}{% endfor %}",
        "{% for i in l %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}",
        "{% for i in l %}{% generation %}{% continue %}{% endgeneration %}{% endfor %}",
        "{% macro m() %}{% for i in l %}{{ i }}{% break %}{% endfor %}{% endmacro %}{{ m() }}",
    ]
    for k, t in enumerate(stmts):
        add(f"stmt_{k}", t)

    # Generation blocks (spans).
    gen = "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<eos>{% endgeneration %}{% else %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}"
    add("generation_0", gen)
    add("generation_1", "{{ bos }}{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}\n{% endfor %}", {**CTX, "bos": "<s>"})
    add("generation_2", "{% macro r(m) %}pre{% generation %}{{ m.content }}{% endgeneration %}{% endmacro %}é{% for m in messages %}{{ r(m) }}{% endfor %}")
    add("generation_3", "{% set x %}{% generation %}ab{% endgeneration %}{% endset %}xyz{{ x }}{% generation %}{% set inner = 1 %}cd{% endgeneration %}[{{ inner }}]")
    add("generation_4", "{% filter upper %}a{% generation %}bé{% endgeneration %}{% endfilter %}")
    add("generation_5", "😀{% generation %}{% endgeneration %}{% generation %}😀{% endgeneration %}")

    # Tests.
    tests = [
        "n is divisibleby 3", "n is divisibleby(2)", "f is sameas false", "'x' is equalto 'x'", "z is none", "z is not none",
        "s is string", "t is number", "t is integer", "n is integer", "x is float", "n is float", "d is mapping",
        "l is mapping", "n is iterable", "s is iterable", "d is sequence", "n is sequence", "t is boolean", "n is boolean",
        "t is true", "1 is true", "f is false", "n is even", "n is odd", "x is odd", "n is eq(3)", "n is ne 2", "n is lt 3",
        "n is gt 3", "n is le 3", "n is ge 3", "n is in [1,2]", "n is in l", "range is callable", "n is callable",
        "undefined_x is callable", "'ab' is lower", "'Ab' is lower", "'AB' is upper", "'1' is upper", "m is defined",
        "m.nope is undefined", "n is == 3", "n is != 3", "n is > 2", "n is lessthan 4", "n is greaterthan 4",
        "undefined_x is none", "undefined_x is string", "undefined_x is iterable", "undefined_x is sequence",
        "n is odd and s is string", "n is not odd or true", "z is sameas none", "1 is sameas 1", "undefined_x is even",
        "n is divisibleby 0", "'a' is in 'cat'", "n is number", "none is mapping",
    ]
    for k, t in enumerate(tests):
        add(f"test_{k}", "{{ " + t + " }}")

    # Filters.
    filters = [
        "'  a b  '|trim", "'xxaxx'|trim('x')", "s|length", "l|length", "d|length", "m|count", "words|join",
        "words|join(', ')", "people|join(', ', attribute='name')", "'banana'|replace('a', 'o')", "'banana'|replace('a', 'o', 2)",
        "'abc'|replace('', '-')", "messages|tojson", "{'a': [1, 2.0, None, true], 'é': 'ü\"\\n\\t\\u0001<>&\\''}|tojson",
        "{'a': [1, {'b': []}], 'c': {}}|tojson(indent=2)", "[1, [2, 3]]|tojson(indent=0)", "{'a': 1, 'b': [1, 2]}|tojson(separators=(',', ':'))",
        "{'b': 1, 'a': 2}|tojson(sort_keys=true)", "'é😀'|tojson(ensure_ascii=true)", "none|tojson", "(1, 'a')|tojson",
        "1.0|tojson", "[1e-7, 1e20, 0.1]|tojson", "'x'|tojson(indent='\\t')", "{'a': {'b': 1}}|tojson(indent='--')",
        "d|items|list", "messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list",
        "messages|selectattr('reasoning_content')|list|length", "messages|selectattr('role', 'in', ['user', 'system'])|list|length",
        "messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|join(',')", "l|select('odd')|list", "[0, 1, '', 'a', none]|select|list",
        "[0, 1, none]|reject('none')|list", "messages|map(attribute='role')|list", "people|map(attribute='tags', default=['d'])|list",
        "people|map(attribute='tags.0')|list", "words|map('upper')|list", "[none, 'x']|map('default', 'z')|list",
        "'a\\nb\\n\\nc'|indent", "'a\\nb'|indent(2, true)", "'a\\n\\nb\\n'|indent(2, blank=true)", "'a\\nb'|indent('> ')",
        "'a\\r\\nb\\u2028c'|indent(1)", "''|indent(2, true)", "'HeLLo wOrld'|upper", "'HeLLo'|lower", "'straße ǆ'|upper",
        "'hello-world (x) [y] o\\'neil'|title", "'ÉCOLE été'|title", "'hELLO world'|capitalize", "'ßa'|capitalize",
        "l|first", "l|last", "s|first", "s|last", "e|first", "e|last is defined", "s|list", "d|list", "l|string",
        "'42'|int", "'42.7'|int", "' -3 '|int", "'abc'|int", "'abc'|int(7)", "3.9|int", "-3.9|int", "'1e3'|int",
        "none|int", "true|int", "'3.5'|float", "'x'|float", "'x'|float(1.5)", "3|float", "' 2 '|float", "'1_000'|int",
        "-3|abs", "-2.5|abs", "2.5|round", "3.5|round", "3.14159|round(2)", "2.675|round(2)", "3.1|round(method='ceil')",
        "3.9|round(0, 'floor')", "7|round", "words|unique|list", "words|unique(case_sensitive=true)|list",
        "people|unique(attribute='age')|map(attribute='name')|list", "words|sort|list", "words|sort(reverse=true)|list",
        "words|sort(case_sensitive=true)|list", "people|sort(attribute='age')|map(attribute='name')|list",
        "people|sort(attribute='age,name')|map(attribute='name')|list", "l|reverse|list", "s|reverse", "l|batch(2)|list",
        "l|batch(3, 'x')|list", "d|dictsort", "d|dictsort(by='value')", "d|dictsort(reverse=true)", "{'b': 1, 'A': 2}|dictsort",
        "'<b>'|safe", "'<a href=\"x\">&\\'</a>'|e", "'<x>'|escape", "'ab'|center(7)", "'abc'|center(8)", "'héllo wörld, 3 words_x!'|wordcount",
        "l|sum", "people|sum(attribute='age')", "[0.1, 0.2]|sum", "l|sum(start=10)", "words|min", "words|max", "l|max",
        "people|max(attribute='age')|string", "people|min(attribute='name')", "e|max is defined", "undefined_x|upper",
        "undefined_x|trim", "undefined_x|join", "undefined_x|list", "undefined_x|items|list", "undefined_x|first is defined",
        "undefined_x|tojson", "undefined_x|int", "none|length", "m|items|list", "'a'|string ~ 1|string",
        "[1, 'b']|join('-')", "messages|map(attribute='role')|unique|list", "l|select('divisibleby', 2)|list",
        "l|select('gt', 2)|list", "people|selectattr('age', 'ge', 30)|map(attribute='name')|join", "l|map('string')|join('+')",
        "'a,b,,c'|replace(',', '')|length", "words|map('lower')|unique|sort|join", "x|string|length", "l|list is sameas l",
        "people|map(attribute='missing')|list", "people|map(attribute='missing', default='?')|list", "'x'|indent(first=true)",
        "3|center", "{'a': 1}|tojson(indent=none)",
    ]
    for k, t in enumerate(filters):
        add(f"filter_{k}", "{{ " + t + " }}")

    # Python methods, and the sandbox's refusal of methods that mutate.
    methods = [
        "'  a b  '.strip()", "'xxaxx'.strip('x')", "'  a '.lstrip()", "'  a '.rstrip()", "'abcba'.rstrip('ab')",
        "'a b  c'.split()", "'a,b,,c'.split(',')", "'a,b,c'.split(',', 1)", "'  a  b  c  '.split(none, 1)", "'a,b,c'.rsplit(',', 1)",
        "'  a  b  c  '.rsplit(none, 1)", "'a b'.split(' ', -1)", "'abc'.startswith('ab')", "'abc'.startswith(('x', 'a'))",
        "'abc'.endswith('bc')", "'abc'.endswith(('x', 'y'))", "'aBc'.upper()", "'aBc'.lower()", "'hello world\\'s'.title()",
        "'hello World'.capitalize()", "'aaa'.replace('a', 'b', 2)", "'héllo'.find('l')", "'héllo'.rfind('l')", "'héllo'.find('z')",
        "'banana'.count('an')", "', '.join(['a', 'b'])", "'-'.join('abc')", "'a\\nb\\r\\nc\\n'.splitlines()", "'a\\nb\\n'.splitlines(true)",
        "d.keys()|list", "d.values()|list", "d.items()|list", "d.get('a')", "d.get('nope', 'dflt')", "m.get('role')",
        "'prefix_x'.removeprefix('prefix_')", "'x.json'.removesuffix('.json')", "' '.isspace()", "'12'.isdigit()",
        "'ab'.isalpha()", "'AB'.isupper()", "'ab'.islower()", "l.count(2)", "l.index(3)", "(1, 2).index(2)",
        "l.append(6)", "d.update({'c': 3})", "d.pop('a')", "l.pop()", "m.clear()", "l.append", "''.__class__",
        "m.__class__.__name__", "messages[0].content.split(' ')[0]", "(messages|last).content.strip()", "m.content.upper().lower()",
        "'a'.join([1, 2])", "'x'.index('y')", "'a\\u0130'.lower()",
        "m['get']('role')", "d['keys']()|list", "'ab'.split('')", "'{} and {}'.format(1, none)", "'{1}{0}{1}'.format('a', 'b')",
        "'{x}-{{y}}'.format(x=[1])", "'{}{1}'.format(1, 2)", "'{2}'.format(1)", "'{z}'.format()", "'a}'.format()",
    ]
    for k, t in enumerate(methods):
        add(f"method_{k}", "{{ " + t + " }}")

    # What jinja2 renders but the engine refuses, naming the construct and line.
    refusals = [
        ("\n\n{% include 'x' %}", "`{% include %}` at template line 3"), ("{% extends 'x' %}", "`{% extends %}`"),
        ("{% import 'x' as y %}", "`{% import %}`"), ("{% from 'x' import y %}", "`{% from %}`"),
        ("{% with a = 1 %}{{ a }}{% endwith %}", "`{% with %}`"), ("{% block b %}x{% endblock %}", "`{% block %}`"),
        ("{% set c = cycler('a', 'b') %}{{ c.next() }}", "`cycler()`"), ("{{ lipsum(1) }}", "`lipsum()`"),
        ("{{ '%s!' % 'x' }}", "printf-style"), ("{{ '{:>3}'.format(1) }}", "`str.format field {:>3}`"),
        ("{% for x in [1] recursive %}{{ x }}{% endfor %}", "recursive"), ("{{ 'a b'|wordwrap(1) }}", "`filter wordwrap`"),
        ("{{ 'abc'|truncate(2) }}", "`filter truncate`"), ("{{ '%s'|format(1) }}", "`filter format`"),
        ("{{ m.items }}", "printing the callable"), ("{{ range }}", "printing the callable"), ("{{ range(2) }}", "printing a range object"), ("{{ range(3)[1:] }}", "printing a range object"),
        ("{% autoescape true %}x{% endautoescape %}", "`{% autoescape %}`"), ("{% print 1 %}", "`{% print %}`"),
        ("{{ 'abc'.zfill(5) }}", "`str.zfill()`"), ("{{ x.is_integer() }}", "`float.is_integer`"),
        ("{{ 1 is escaped }}", "`test escaped`"), ("{{ l|groupby('x') }}", "`filter groupby`"),
        ("{{ 0x1F }}", "hex literal"), ("{{ 5|items }}", "a generator"), ("{{ s.encode() }}", "`str.encode()`"),
        ("{{ (-8) ** (1 / 3) }}", "complex result"),
    ]
    for k, (t, r) in enumerate(refusals):
        add(f"refused_{k}", t, refused=r)

    # Syntax errors jinja2 reports: the engine must refuse them too.
    syntax = ["{% if %}x{% endif %}", "{% endif %}", "{{ x", "{% for x in %}{% endfor %}", "{% if true %}", "{{ 1 + }}",
              "{% set %}", "{% for x in l %}{% endif %}", "{{ (1, 2 }}", "{% do l.append(1) %}", "{{ 'abc }}",
              "{% macro m(a=1, b) %}{% endmacro %}", "{% if true %}{% else %}{% else %}{% endif %}", "{{ x is }}",
              "{{ }}", "{{ 1 2 }}", "{# unclosed", "{% raw %}x"]
    for k, t in enumerate(syntax):
        add(f"syntax_{k}", t)
    return cases


def render(template, context):
    compiled = ctu._compile_jinja_template(template)
    compiled.environment.globals["strftime_now"] = lambda fmt: datetime.datetime.strptime(DATE, "%Y-%m-%d").strftime(fmt)
    rendered_blocks, generation_indices = [], []
    with compiled.environment.activate_tracker(rendered_blocks, generation_indices):
        for block in compiled.generate(**context):
            rendered_blocks.append(block)
        out = "".join(rendered_blocks)
    to_bytes = lambda i: len(out[:i].encode("utf-8"))
    return out, [[to_bytes(b), to_bytes(e)] for b, e in generation_indices]


def make():
    cases = []
    for c in gen_cases():
        c = json.loads(json.dumps(c))  # what the C++ side reads: plain JSON, key order kept
        try:
            out, spans = render(c["template"], c["context"])
            if "refused" in c:  # what jinja2 renders here may name a memory address
                out, spans = "(rendered by jinja2)", []
            c["output"], c["spans"] = out, spans
        except Exception as e:  # noqa: BLE001 - the golden records what jinja2 raises
            c["error_type"], c["error"] = type(e).__name__, str(e)
        if c["context"] == CTX:
            c["context"] = "default"
        cases.append(c)
    return {"jinja2": jinja2.__version__, "transformers": transformers.__version__, "date": DATE,
            "default_context": CTX, "cases": cases}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the written golden instead of writing it")
    args = ap.parse_args()
    text = json.dumps(make(), ensure_ascii=False, indent=1) + "\n"
    if args.check:
        with open(OUT, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit(f"{OUT} differs from what make_jinja_cases.py makes with jinja2 {jinja2.__version__}: "
                         "regenerate it (without --check) and review the diff")
        print(f"{OUT}: up to date")
        return
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
