#!/usr/bin/env python3
"""Render chat templates with Python's Jinja2 the way Hugging Face transformers does
(ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls; tojson as
json.dumps(ensure_ascii=False); raise_exception; strftime_now on a fixed UTC clock): the second
reference of tests/e2e/t_jinja.sh, and the one that decides where @huggingface/jinja has a bug
(tests/jinja/deviations.txt).
usage: python3 py_render.py NOW_SECONDS LIST
  LIST: lines "TEMPLATE<TAB>CONTEXT.json<TAB>OUT"; writes the rendering to OUT, or on a template
  error the message to OUT.err."""
import datetime, json, sys
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
    x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
env.globals["raise_exception"] = raise_exception
now = datetime.datetime.fromtimestamp(int(sys.argv[1]), datetime.timezone.utc)
env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
for line in open(sys.argv[2], encoding="utf-8").read().splitlines():
    if not line:
        continue
    tmpl, ctx, out = line.split("\t")
    try:
        text = env.from_string(open(tmpl, encoding="utf-8").read()).render(**json.load(open(ctx, encoding="utf-8")))
        open(out, "w", encoding="utf-8", newline="").write(text)
    except Exception as e:  # the template's own refusal or an error: both are reported
        open(out + ".err", "w").write(f"{e}\n")
