#!/usr/bin/env python3
"""Reference token ids of rendered chat prompts, from llama.cpp's own tokenizer (a reference
only): writes chat-prompts.json, read by tests/test_chat_tokens.c.

For every rendering in ../shared/golden/chat-templates.json (the built-in families: its text, not repeated here;
the template files: the text kvchat's Jinja interpreter renders for the same conversation, with
the vocabulary's bos/eos texts and a fixed clock) and every vocabulary below, llama-tokenize
tokenizes the whole text once with special tokens parsed and the BOS the vocabulary asks for,
as llama.cpp does for a chat prompt.

usage: KVCHAT=./kvchat LLAMA_TOKENIZE=/tmp/kvchat-ref/llama.cpp/build/bin/llama-tokenize \
       SHARED=../shared python3 tests/tokenize/make_chat_tokens.py
(llama-tokenize: sh ../shared/bench/build-llamacpp.sh llama-tokenize)
"""
import json, os, subprocess, sys, tempfile

SHARED = os.environ.get("SHARED", "../shared")
KVCHAT = os.environ.get("KVCHAT", "./kvchat")
LT = os.environ.get("LLAMA_TOKENIZE", "/tmp/kvchat-ref/llama.cpp/build/bin/llama-tokenize")
VOCABS = ["vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-phi-3.gguf",
          "vocab/ggml-vocab-deepseek-coder.gguf", "vocab/ggml-vocab-gpt-2.gguf",
          "stories260K.gguf", "syn-qwen2-f32.gguf"]
CLOCK = 1750000000
here = os.path.dirname(os.path.abspath(__file__))
gold = json.load(open(os.path.join(SHARED, "golden/chat-templates.json"), encoding="utf-8"))
conv = gold["conversation"]
tmp = tempfile.mkdtemp()


def llama_ids(vocab, text):
    path = os.path.join(tmp, "prompt.txt")
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    out = subprocess.run([LT, "-m", vocab, "-f", path, "--ids", "--log-disable"], capture_output=True, check=True)
    line = [l for l in out.stdout.decode().splitlines() if l.startswith("[")][-1]
    return json.loads(line)


cases = []
for r in gold["renderings"]:
    if not r["supported"]:
        continue
    msgs = conv if r["with_system"] else [m for m in conv if m["role"] != "system"]
    for v in VOCABS:
        vocab = os.path.join(SHARED, "models", v)
        if r["template"].startswith("builtin:"):
            text = r["text"]
        else:
            ctx = os.path.join(tmp, "ctx.json")
            json.dump({"messages": msgs, "add_generation_prompt": True}, open(ctx, "w"))
            tpath = os.path.join(SHARED, r["template"][len("file:"):])
            p = subprocess.run([KVCHAT, "template-render", "-t", tpath, "-m", vocab, "--now", str(CLOCK), ctx],
                               capture_output=True)
            if p.returncode != 0:  # the template refuses this conversation (gemma-2 and a system turn)
                continue
            text = p.stdout.decode("utf-8")
        case = {"template": r["template"], "with_system": r["with_system"], "vocab": v}
        if not r["template"].startswith("builtin:"):
            case["text"] = text  # the built-in families' text is the golden file's
        case["ids"] = llama_ids(vocab, text)
        cases.append(case)
        print(r["template"], r["with_system"], v, len(cases[-1]["ids"]), file=sys.stderr)

head = {"source": "llama.cpp llama-tokenize (node-llama-cpp 3.22.1's llama.cpp, "
                  "../shared/bench/build-llamacpp.sh), whole text, special tokens parsed, BOS as the vocab asks",
        "clock": CLOCK}
with open(os.path.join(here, "chat-prompts.json"), "w", encoding="utf-8") as f:  # one case per line
    f.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [\n')
    f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases))
    f.write("\n]}\n")
print(len(cases), "cases", file=sys.stderr)
