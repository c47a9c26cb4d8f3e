"""Chat in `generate` and `export` (issue 41, docs/chat-templates.md): `shardlm generate --messages FILE`
(and `--chat TEXT`) renders the conversation with the model's chat template and add_generation_prompt and
gives transformers' greedy ids, stopping at generation_config.json's eos_token_id; `shardlm export` carries
tokenizer_config.json, the chat template and generation_config.json to the exported folder, which then
renders as before in transformers. The model is a tiny random Llama saved by transformers with a tokenizer
folder of the chat_cases fixture (Llama 3.1's template)."""
import json
import os
import shutil
import unittest

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from common import SHARDLM, main_args, run, tmpdir

CASES = os.path.join(os.path.dirname(SHARDLM), "chat_cases")
TEMPLATE = "meta-llama-Llama-3.1-8B-Instruct"


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def make_model(d):
    """A tiny Llama in d with the fixture's tokenizer folder; returns (tokenizer, end-of-turn id)."""
    src = os.path.join(CASES, TEMPLATE)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), d)
    with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"), bos_token=cfg["bos_token"],
                                  eos_token="<|eot_id|>")
    template = os.path.join(d, "chat_template.jinja")
    tok.chat_template = read(template) if os.path.exists(template) else cfg["chat_template"]
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                         tie_word_embeddings=False))
    model.save_pretrained(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [eot]}, f)
    return tok, model, eot


def greedy(model, tok, messages, eot, n):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=[eot], pad_token_id=eot)
    new = out[0, len(ids):].tolist()
    return new[:-1] if new and new[-1] == eot else new


def ids_of(stdout):
    return json.loads(stdout.split("ids: ", 1)[1].split("\n", 1)[0])


class GenerateChat(unittest.TestCase):
    def test_greedy_ids_equal_transformers_and_export_keeps_the_template(self):
        if not os.path.isdir(CASES):
            self.fail(f"no chat cases in {CASES}: ctest makes them first (fixture reference_chat_cases)")
        d = tmpdir("gen_chat")
        tok, model, eot = make_model(d)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, café 🚀"}]
        with open(os.path.join(d, "msgs.json"), "w", encoding="utf-8") as f:
            json.dump({"messages": messages}, f, ensure_ascii=False)
        want = greedy(model, tok, messages, eot, 16)
        code, stdout, err, _ = run(["generate", "--model", d, "--messages", os.path.join(d, "msgs.json"),
                                    "--temperature", "0", "--max-new-tokens", "16", "--print-ids"])
        self.assertEqual(code, 0, stdout + err)
        self.assertEqual(ids_of(stdout), want)
        code, stdout, err, _ = run(["generate", "--model", d, "--chat", "Hi there", "--temperature", "0",
                                    "--max-new-tokens", "16", "--print-ids"])
        self.assertEqual(code, 0, stdout + err)
        self.assertEqual(ids_of(stdout), greedy(model, tok, [{"role": "user", "content": "Hi there"}], eot, 16))

        out = os.path.join(d, "exported")
        code, stdout, err, _ = run(["export", "--run", d, "--out", out])
        self.assertEqual(code, 0, stdout + err)
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            self.assertTrue(os.path.exists(os.path.join(out, name)), name)
        with open(os.path.join(out, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        again = PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "tokenizer.json"), bos_token=cfg["bos_token"])
        template = os.path.join(out, "chat_template.jinja")
        again.chat_template = read(template) if os.path.exists(template) else cfg["chat_template"]
        self.assertEqual(again.apply_chat_template(messages, tokenize=False), tok.apply_chat_template(messages, tokenize=False))


if __name__ == "__main__":
    unittest.main(argv=main_args())
