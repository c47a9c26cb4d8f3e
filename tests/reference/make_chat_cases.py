#!/usr/bin/env python3
"""Goldens for conversations rendered with real chat templates (issue 41): what the pinned transformers'
apply_chat_template gives for every template of tests/data/chat_templates/ x every conversation below,
and the loss masks of docs/chat-templates.md computed from its renderings.

Big tokenizer.json files of the real models are not stored here, so each template gets a small tokenizer
that holds its special tokens: a byte-level BPE trained with the pinned `tokenizers` on a little text
(the same for all), the template's special tokens added as special added tokens (the `<|...|>`,
`<｜...｜>` and, for Mistral, `[UPPER]` markers its source names, plus the ones listed below), BOS and EOS
as the model defines them, and a TemplateProcessing post-processor that puts BOS first where the model's
own tokenizer does (Llama 3, Mistral, Gemma, DeepSeek, Cohere): apply_chat_template encodes with
add_special_tokens=False, so BOS must appear once, where the template writes it.

Writes into OUT (the build tree, as ctest's reference_chat_cases fixture):
  OUT/<template>/tokenizer.json, tokenizer_config.json (bos/eos/pad tokens and the chat template; every
      other template as chat_template.jinja beside it, the form that overrides the config's key)
  OUT/<template>/cases.jsonl   one object per conversation: "conversation" (its index), and either
      "error" (the exception's message; "template_error": true when the template raised it itself) or
      "text", "ids" (apply_chat_template(..., tokenize=True, return_dict=False)), "prompt_text",
      "prompt_ids" (the conversation up to its last assistant turn with add_generation_prompt=True),
      "mask" (--train-on assistant), "mask_last" (--train-on last), "left_out" (assistant turns the
      prefix rule left out), "generation_mask" (return_assistant_tokens_mask, templates with
      {% generation %} only), "mask_error" (a rendering of a prefix that raised).
  OUT/conversations.jsonl  the conversations, one object a line: messages, tools, chat_template_kwargs.
  OUT/meta.json            {"template_date": TEMPLATE_DATE}.
  OUT/mistralai-Mistral-7B-Instruct-v0.3/  the same for a real pair instead of a small tokenizer: Mistral
      7B Instruct v0.3's own tokenizer.json (SentencePiece-style: Metaspace pre-tokenizer, ▁ for spaces,
      byte fallback) and tokenizer_config.json with its chat template, from tests/data/tokenizers/mistral_v03,
      so that the masks are checked where a token's offsets cover the space its ▁ stands for; and
      OUT/mistralai-Mistral-7B-Instruct-v0.3-generation/, its template with {% generation %} blocks.
Masks are per token, 1 where all of the token's characters lie in a span (tokenizers' offsets).
The date strftime_now renders is pinned to TEMPLATE_DATE (prepare's --template-date).

Usage: make_chat_cases.py OUT
"""
import datetime as _dt
import json
import os
import re
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from transformers.utils import chat_template_utils  # noqa: E402

HERE = Path(__file__).resolve().parent
TEMPLATES_DIR = HERE.parent / "data" / "chat_templates"
TEMPLATE_DATE = "2025-03-14"

_year, _month, _day = (int(x) for x in TEMPLATE_DATE.split("-"))


class _PinnedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(_year, _month, _day, 0, 0, 0)  # shardlm's --template-date: that day at 00:00:00


chat_template_utils.datetime = _PinnedDatetime  # strftime_now reads chat_template_utils.datetime.now()

# Per template: bos and eos tokens as its model's tokenizer_config.json names them (None: none), whether
# the model's tokenizer.json post-processor puts BOS first, and special tokens the source does not spell
# as <|...|> markers.
QWEN_EXTRA = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
MODELS = {
    "meta-llama-Llama-3.1-8B-Instruct": dict(bos="<|begin_of_text|>", eos="<|eot_id|>", post_bos=True),
    "meta-llama-Llama-3.2-3B-Instruct": dict(bos="<|begin_of_text|>", eos="<|eot_id|>", post_bos=True),
    "trl-llama3-training": dict(bos="<|begin_of_text|>", eos="<|eot_id|>", post_bos=True),
    "Qwen-Qwen2.5-7B-Instruct": dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", extra=QWEN_EXTRA),
    "Qwen-Qwen3-0.6B": dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", extra=QWEN_EXTRA),
    "Qwen-Qwen3-4B-Instruct-2507": dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", extra=QWEN_EXTRA),
    "Qwen-QwQ-32B": dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", extra=QWEN_EXTRA),
    "trl-qwen3-training": dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", extra=QWEN_EXTRA),
    "mistralai-Mistral-Nemo-Instruct-2407": dict(bos="<s>", eos="</s>", post_bos=True, mistral=True),
    "Mistral-Small-3.2-24B-Instruct-2506": dict(bos="<s>", eos="</s>", post_bos=True, mistral=True),
    "google-gemma-2-2b-it": dict(bos="<bos>", eos="<eos>", pad="<pad>", post_bos=True,
                                 extra=["<start_of_turn>", "<end_of_turn>"]),
    "google-gemma-3": dict(bos="<bos>", eos="<eos>", pad="<pad>", post_bos=True,
                           extra=["<start_of_turn>", "<end_of_turn>", "<start_of_image>"]),
    "microsoft-Phi-3.5-mini-instruct": dict(bos="<s>", eos="<|endoftext|>", post_bos=False),
    "microsoft-Phi-3": dict(bos="<s>", eos="<|endoftext|>", post_bos=False),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": dict(bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>",
                                                     post_bos=True, extra=["<think>", "</think>"]),
    "deepseek-ai-DeepSeek-V3": dict(bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", post_bos=True,
                                    extra=["<think>", "</think>"]),
    "deepseek-ai-DeepSeek-V3.1": dict(bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", post_bos=True,
                                      extra=["<think>", "</think>"]),
    "ibm-granite-granite-3.3-2B-Instruct": dict(bos="<|end_of_text|>", eos="<|end_of_text|>", pad="<|end_of_text|>",
                                                extra=["<think>", "</think>", "<response>", "</response>"]),
    "zai-org-GLM-4.5": dict(bos=None, eos="<|endoftext|>", pad="<|endoftext|>",
                            extra=["[gMASK]", "<sop>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                                   "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>",
                                   "</tool_response>"]),
    "CohereLabs-aya-expanse": dict(bos="<BOS_TOKEN>", eos="<|END_OF_TURN_TOKEN|>", pad="<PAD>", post_bos=True),
}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TOOL_CALL = {"type": "function", "id": "call00042", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}


def u(text):
    return {"role": "user", "content": text}


def a(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def s(text):
    return {"role": "system", "content": text}


# The conversations: multi-turn up to 4 assistant turns, with and without system, CJK, emoji, accents,
# whitespace and newlines at both ends, reasoning as <think> text and as reasoning_content (and its aliases),
# tools, null values, kwargs.
CONVERSATIONS = [
    {"messages": [u("Hello!"), a("Hi! How can I help you today?")]},
    {"messages": [s("You are a helpful assistant."), u("What is 2 + 2?"), a("2 + 2 = 4.")]},
    {"messages": [u("Name a colour."), a("Blue."), u("Another one?"), a("Green.")]},
    {"messages": [s("Answer briefly."), u("One?"), a("1"), u("Two?"), a("2"), u("Three?"), a("3"), u("Four?"), a("4")]},
    {"messages": [u("你好，世界！请用中文回答：天空是什么颜色？"), a("天空是蓝色的。日本語：空は青い。한국어: 하늘은 파랗다.")]},
    {"messages": [u("Tell me a joke 😂🚀"), a("Why did the 🐔 cross the road? 🤔 To get to the other side! 🎉")]},
    {"messages": [s("Réponds en français, s'il te plaît."), u("Où est le café crème? Señor, naïve façade, über."),
                  a("Le café crème est à côté de la façade — voilà, señor!")]},
    {"messages": [u("   leading spaces and trailing newline\n\n"), a("\n\nAnswer after two newlines.   \n")]},
    {"messages": [u("\ttabbed\tquestion?\t"), a("  indented answer  "), u("\n"), a("\n")]},
    {"messages": [u("What is 17 * 3?"), a("<think>\n17 * 3 = 51, check: 51 / 3 = 17.\n</think>\n\n17 * 3 = 51.")]},
    {"messages": [u("Is 91 prime?"), a("No: 91 = 7 * 13.", reasoning_content="Try 7: 7 * 13 = 91, so it is not prime.")]},
    {"messages": [u("First?"), a("<think>\nfirst thought\n</think>\n\nFirst answer."), u("Second?"),
                  a("<think>\nsecond thought\n</think>\n\nSecond answer.")]},
    {"messages": [s("Think step by step."), u("2^10?"), a("1024", thinking="2^10 = 1024"), u("And 2^11?"),
                  a("2048", reasoning="double 1024")]},
    {"messages": [s("You can call tools."), u("What is the weather in Zürich?"),
                  {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
                  {"role": "tool", "name": "get_weather", "tool_call_id": "call00042", "content": "{\"temperature\": 21, \"unit\": \"celsius\"}"},
                  a("It is 21 °C in Zürich.")],
     "tools": [WEATHER_TOOL]},
    {"messages": [u("Weather in Paris, please."), a("Let me check that for you.")], "tools": [WEATHER_TOOL]},
    {"messages": [u("Say hi without thinking."), a("Hi!")], "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [s(""), u("Empty system prompt above."), a("Noted.")]},
    {"messages": [u("Show code with braces: {{ x }} and {% if %}"),
                  a("```python\ndef f(d):\n    return {k: v for k, v in d.items()}\n```\nBraces {{ }} and {% %} stay text.")]},
    {"messages": [u("Quote \"this\" and a backslash \\ and C:\\dir\\file."), a("Quoted: \"this\", '\\', C:\\dir\\file.")]},
    {"messages": [u("A question."), a("A first answer."), u("A follow-up."), a("A second answer."), u("One more."),
                  a("A third answer.")]},
    {"messages": [u("What does <|im_end|> or <|eot_id|> mean?"), a("They are special tokens that end a turn.")]},
    {"messages": [s("Be terse."), u("Hi"), a("Hello.", name=None), u("Bye"), a("Bye.")]},
    {"messages": [u("A null content is dropped, as transformers drops null values."), a(None)]},
    {"messages": [u("Only a user turn, waiting for the model.")]},
    {"messages": [{"role": "user", "content": "Mixed: ¿Qué tal? Ça va. Привет! مرحبا 🌍"},
                  a("Multilingual: bien, ça va, хорошо, بخير 👍\n")]},
]


def special_tokens_of(name, source, model):
    found = re.findall(r"<\|[A-Za-z0-9_./=-]+\|>|<｜[^｜<>]{1,40}｜>", source)
    if model.get("mistral"):
        found += re.findall(r"\[/?[A-Z_]{3,}\]", source)
    tokens = []
    for t in [model.get("bos"), model.get("eos"), model.get("pad")] + model.get("extra", []) + found:
        if t and t not in tokens:
            tokens.append(t)
    return tokens


def base_corpus():
    text = []
    for conv in CONVERSATIONS:
        for m in conv["messages"]:
            for key in ("content", "reasoning_content", "thinking", "reasoning"):
                if isinstance(m.get(key), str):
                    text.append(m[key])
    text += ["system user assistant tool function parameters description required properties type object string",
             "You are a helpful assistant. Cutting Knowledge Date: December 2023 Today Date: 14 Mar 2025",
             "The quick brown fox jumps over the lazy dog. 0123456789 !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"]
    return text * 3


def build_tokenizer(specials, model):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(base_corpus(), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if model.get("post_bos"):
        bos = model["bos"]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def common_prefix(x, y):
    n = min(len(x), len(y))
    i = 0
    while i < n and x[i] == y[i]:
        i += 1
    return i


def token_mask(offsets, spans):
    mask = []
    for b, e in offsets:
        mask.append(1 if any(sb <= b and e <= se and b < e for sb, se in spans) else 0)
    return mask


def assistant_spans(render, messages, full):
    """The rule of docs/chat-templates.md: (spans of --train-on assistant, span of --train-on last, left out)."""
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        return None, None, 0
    floor = common_prefix(render(messages[:turns[0]], True), full)  # nothing before the first assistant turn
    spans, left_out = [], 0
    for i in turns[:-1]:
        p, f = render(messages[:i], True), render(messages[:i + 1], False)
        if full.startswith(f) and f.startswith(p):
            spans.append((len(p), len(f)))
        else:
            left_out += 1
    last = turns[-1]
    p, f = render(messages[:last], True), render(messages[:last + 1], False)
    lo = max(common_prefix(p, full), floor)
    hi = common_prefix(f, full)
    last_span = (lo, hi) if hi > lo else None
    if last_span:
        spans.append(last_span)
    return spans, [last_span] if last_span else [], left_out


def case(name, tok, index, conv):
    messages, tools = conv["messages"], conv.get("tools")
    kwargs = conv.get("chat_template_kwargs", {})
    out = {"conversation": index}

    def render(msgs, agp):
        return tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=agp, **kwargs)

    try:
        text = render(messages, False)
        ids = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - the golden records what the template does
        import jinja2
        out["error"] = str(e)
        out["template_error"] = type(e) is jinja2.exceptions.TemplateError
        return out
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    assert enc.ids == ids, (name, index)
    out.update(text=text, ids=ids)
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        prompt = render(messages, True)
        out.update(prompt_text=prompt, prompt_ids=tok.apply_chat_template(
            messages, tools=tools, tokenize=True, return_dict=False, add_generation_prompt=True, **kwargs))
        return out
    try:
        prompt_msgs = messages[:turns[-1]]
        out["prompt_text"] = render(prompt_msgs, True)
        out["prompt_ids"] = tok.apply_chat_template(prompt_msgs, tools=tools, tokenize=True, return_dict=False,
                                                    add_generation_prompt=True, **kwargs)
        spans, last_span, left_out = assistant_spans(render, messages, text)
    except Exception as e:  # noqa: BLE001
        out["mask_error"] = str(e)
        return out
    offsets = enc.offsets
    out["mask"] = token_mask(offsets, spans)
    out["mask_last"] = token_mask(offsets, last_span)
    out["left_out"] = left_out
    if re.search(r"\{%-?\s*generation\s*-?%\}", tok.chat_template):
        g = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                    return_assistant_tokens_mask=True, **kwargs)
        assert g["input_ids"] == ids
        out["generation_mask"] = list(g["assistant_masks"])
    return out


# Real tokenizer folders of tests/data/tokenizers/ (xz-compressed) whose tokenizer_config.json holds the
# model's chat template: out-dir name -> (folder, edit of the template or None). The "-generation" variant
# wraps each assistant turn in {% generation %} as TRL's training templates do, leaving the space before
# it outside: the ▁ token that starts the turn straddles the block's start, which transformers'
# return_assistant_tokens_mask counts.
MISTRAL_V03_ASSISTANT = '{{- " " + message["content"]|trim + eos_token}}'
MISTRAL_V03_GENERATION = ('{{- " " }}{%- generation %}{{- message["content"]|trim + eos_token}}'
                          '{%- endgeneration %}')
REAL_PAIRS = {
    "mistralai-Mistral-7B-Instruct-v0.3": ("mistral_v03", None),
    "mistralai-Mistral-7B-Instruct-v0.3-generation": (
        "mistral_v03", lambda t: t.replace(MISTRAL_V03_ASSISTANT, MISTRAL_V03_GENERATION)),
}


def write_cases(d, name, tok):
    """d/cases.jsonl: case() of every conversation; returns how many the template refused."""
    errors = 0
    with open(d / "cases.jsonl", "w", encoding="utf-8") as f:
        for i, conv in enumerate(CONVERSATIONS):
            c = case(name, tok, i, conv)
            errors += "error" in c
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    return errors


def write_real_pair(out_dir, name, folder, edit):
    import lzma
    d = out_dir / name
    d.mkdir(exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes(lzma.decompress((HERE.parent / "data" / "tokenizers" / folder / f"{f}.xz").read_bytes()))
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    if edit:
        edited = edit(config["chat_template"])
        assert edited != config["chat_template"], f"{name}: the template edit found nothing to change"
        config["chat_template"] = edited
        (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n",
                                                 encoding="utf-8")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"), bos_token=config["bos_token"],
                                  eos_token=config["eos_token"], unk_token=config.get("unk_token"))
    tok.chat_template = config["chat_template"]
    errors = write_cases(d, name, tok)
    print(f"{name}: real tokenizer {tok.backend_tokenizer.pre_tokenizer.__class__.__name__}, "
          f"{len(CONVERSATIONS)} conversations, {errors} refused")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "meta.json").write_text(json.dumps({"template_date": TEMPLATE_DATE}) + "\n", encoding="utf-8")
    with open(out_dir / "conversations.jsonl", "w", encoding="utf-8") as f:
        for conv in CONVERSATIONS:
            f.write(json.dumps(conv, ensure_ascii=False) + "\n")
    names = sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))
    missing = set(names) ^ set(MODELS)
    if missing:
        sys.exit(f"templates and MODELS differ: {sorted(missing)}")
    for stale in out_dir.iterdir():
        if stale.is_dir() and stale.name not in names and stale.name not in REAL_PAIRS:
            shutil.rmtree(stale)
    for k, name in enumerate(names):
        source = (TEMPLATES_DIR / f"{name}.jinja").read_text(encoding="utf-8")
        model = MODELS[name]
        specials = special_tokens_of(name, source, model)
        backend = build_tokenizer(specials, model)
        tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=model.get("bos"), eos_token=model["eos"],
                                      pad_token=model.get("pad"))
        tok.chat_template = source
        d = out_dir / name
        d.mkdir(exist_ok=True)
        backend.save(str(d / "tokenizer.json"))
        config = {"bos_token": model.get("bos"), "eos_token": model["eos"], "pad_token": model.get("pad"),
                  "tokenizer_class": "PreTrainedTokenizerFast"}
        if k % 3 == 1:  # the AddedToken-dict form some models write
            config["eos_token"] = {"__type": "AddedToken", "content": model["eos"], "lstrip": False,
                                   "normalized": False, "rstrip": False, "single_word": False, "special": True}
        config = {key: v for key, v in config.items() if v is not None}
        if k % 2 == 0:
            config["chat_template"] = source
            (d / "chat_template.jinja").unlink(missing_ok=True)
        else:
            config["chat_template"] = "{{ 'overridden by chat_template.jinja' }}"
            (d / "chat_template.jinja").write_text(source, encoding="utf-8")
        (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n",
                                                 encoding="utf-8")
        errors = write_cases(d, name, tok)
        print(f"{name}: {len(specials)} special tokens, {len(CONVERSATIONS)} conversations, {errors} refused")
    for name, (folder, edit) in REAL_PAIRS.items():
        write_real_pair(out_dir, name, folder, edit)


if __name__ == "__main__":
    main()
