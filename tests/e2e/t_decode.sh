# Decoding beyond one sample per step: --json log-probs (against llama.cpp's golden logits), one line per sampled token, --lookup / --draft equal to plain greedy decoding, the vocabulary check, --beams, --best-of, the draft settings in config.ini.
dc=$tmp/decode
mkdir -p "$dc/cfg/kvchat"

# every sampled token has its own line, also a BOS in the middle of a reply (no text of its own)
"$BIN" -m "$MODEL" -p "Once upon a time" -n 400 --seed 2 --json >"$dc/bos.json" 2>"$dc/bos.err"
python3 - "$dc/bos.json" <<'PY' >"$dc/bos.check" 2>&1
import json, sys
objs = [json.loads(l) for l in open(sys.argv[1], encoding='utf-8')]
done = objs[-1]
toks = [o for o in objs[:-1] if o["token"] >= 0]
assert done["done"] and len(toks) == done["n_generated"], (len(toks), done)
bos = [i for i, o in enumerate(toks) if o["token"] == 1]
assert bos and all(toks[i]["text"] == "" for i in bos), bos
assert 0 < bos[0] < len(toks) - 1, bos      # in the middle of the reply
assert all(o["logprob"] <= 0 for o in toks)
PY
if [ ! -s "$dc/bos.check" ]; then ok "--json: one line per sampled token, a mid-reply BOS too (its id recoverable, empty text)"
else bad "--json: one line per sampled token" "$(head -5 "$dc/bos.check")"; fi

# logprob and top_logprobs against the golden files: log-softmax = logit - logsumexp (llama.cpp's)
gold_ok=1
for g in "$SHARED"/golden/stories260K.p[1-5].json; do
    n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["steps"]))' "$g")
    prompt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt"], end="")' "$g")
    "$BIN" -m "$MODEL" -p "$prompt" -n "$n" --temp 0 --kv-type f32 --json --top-logprobs 5 >"$dc/g.json" 2>/dev/null
    python3 - "$g" "$dc/g.json" <<'PY' >"$dc/g.check" 2>&1 || gold_ok=0
import json, sys
g = json.load(open(sys.argv[1]))
objs = [json.loads(l) for l in open(sys.argv[2], encoding='utf-8')][:-1]
objs = [o for o in objs if o["token"] >= 0]
assert len(objs) == len(g["steps"]), (len(objs), len(g["steps"]))
for o, st in zip(objs, g["steps"]):
    lse = st["logsumexp"]
    assert o["token"] == st["token"], (o, st["token"])
    assert abs(o["logprob"] - (st["top"][0][1] - lse)) < 2e-3, (o["logprob"], st["top"][0][1] - lse)
    assert len(o["top_logprobs"]) == 5
    for a, (tid, logit) in zip(o["top_logprobs"], st["top"][:5]):
        assert abs(a["logprob"] - (logit - lse)) < 2e-3, (a, logit - lse)
        assert a["token"] == tid or abs(a["logprob"] - (logit - lse)) < 2e-3
PY
    [ -s "$dc/g.check" ] && { gold_ok=0; cat "$dc/g.check" >>"$dc/gold.err"; }
done
if [ "$gold_ok" = 1 ]; then ok "--json --top-logprobs 5: logprob and alternatives = golden logit - logsumexp (5 prompts, every step)"
else bad "--json logprobs match the golden files" "$(head -5 "$dc/gold.err")"; fi

# speculative decoding at temperature 0 prints what plain decoding prints
P="Once upon a time, there was a little girl named Lily. She liked to play. Once upon a time, there was a little girl named"
"$BIN" -m "$MODEL" -p "$P" -n 120 --temp 0 >"$dc/plain" 2>/dev/null
spec_ok=1
for a in "--lookup" "--lookup --draft-max 1" "--draft-max 8 --lookup" "--draft $MODEL --draft-max 3" \
         "--draft $SHARED/models/syn-llama-q4_0.gguf --draft-min-p 0"; do
    # shellcheck disable=SC2086
    "$BIN" -m "$MODEL" -p "$P" -n 120 --temp 0 $a --stats >"$dc/spec" 2>"$dc/spec.err"
    cmp -s "$dc/plain" "$dc/spec" && grep -q "^speculative: [0-9]* drafted, [0-9]* accepted" "$dc/spec.err" ||
        { spec_ok=0; echo "$a: $(head -c 300 "$dc/spec.err")" >>"$dc/spec.fail"; }
done
if [ "$spec_ok" = 1 ]; then ok "--lookup and --draft at temperature 0 print plain decoding's text; --stats shows drafted / accepted"
else bad "--lookup / --draft = plain greedy" "$(head -3 "$dc/spec.fail")"; fi
# through context shifts (-c 64, 300 tokens) and a stop string, too
"$BIN" -m "$MODEL" -p "Once upon a time" -c 64 -n 300 --temp 0 --stop park >"$dc/shift.plain" 2>&1
"$BIN" -m "$MODEL" -p "Once upon a time" -c 64 -n 300 --temp 0 --stop park --lookup >"$dc/shift.lookup" 2>&1
"$BIN" -m "$MODEL" -p "Once upon a time" -c 64 -n 300 --temp 0 --stop park --draft "$MODEL" >"$dc/shift.draft" 2>&1
if [ -s "$dc/shift.plain" ] && cmp -s "$dc/shift.plain" "$dc/shift.lookup" && cmp -s "$dc/shift.plain" "$dc/shift.draft"
then ok "--lookup / --draft = plain greedy through context shifts (-c 64) and a stop string"
else bad "--lookup / --draft through context shifts" "$(head -c 200 "$dc/shift.lookup")"; fi
"$BIN" -m "$MODEL" -p "$P" -n 60 --temp 0 --lookup --json 2>/dev/null | tail -1 >"$dc/spec.done"
if grep -q '"n_drafted": [1-9][0-9]*, "n_accepted": [1-9]' "$dc/spec.done"; then ok "--json's done object has n_drafted / n_accepted"
else bad "--json's done object has n_drafted / n_accepted" "$(cat "$dc/spec.done")"; fi

# a draft of another vocabulary is refused at load, naming both
"$BIN" -m "$MODEL" -p "Hi" -n 4 --draft "$SHARED/models/syn-qwen2-f16.gguf" >/dev/null 2>"$dc/voc.err"
rc=$?
if [ $rc -eq 3 ] && grep -q "syn-qwen2-f16.gguf: its vocabulary differs from the target model's: 50257 tokens vs 512" "$dc/voc.err"
then ok "--draft with another vocabulary: exit 3, a message naming the file and both sizes"
else bad "--draft vocabulary check" "rc=$rc $(cat "$dc/voc.err")"; fi
"$BIN" -m "$MODEL" -p "Hi" --draft-max 40 >/dev/null 2>"$dc/dm.err"; rc=$?
if [ $rc -eq 2 ] && grep -q "draft-max" "$dc/dm.err"; then ok "--draft-max 40 refused by the settings table (usage error)"
else bad "--draft-max range" "rc=$rc $(cat "$dc/dm.err")"; fi

# beam search and best-of-N say how they chose
"$BIN" -m "$MODEL" -p "Once upon a time" -n 24 --beams 4 --length-penalty 0 >"$dc/beam" 2>"$dc/beam.err"; rc=$?
if [ $rc -eq 0 ] && grep -q "^Once upon a time" "$dc/beam" && grep -q "beam search: 4 beams, chose the beam of score -" "$dc/beam.err"
then ok "--beams 4: the chosen beam printed, its score on stderr"
else bad "--beams" "rc=$rc $(cat "$dc/beam.err")"; fi
"$BIN" -m "$MODEL" -p "Once upon a time" -n 24 --best-of 3 --seed 5 --json >"$dc/best" 2>"$dc/best.err"; rc=$?
if [ $rc -eq 0 ] && grep -q "best of 3: chose the sample of the highest mean log-prob" "$dc/best.err" &&
    python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$dc/best"
then ok "--best-of 3: ranked by mean log-prob (said on stderr), JSON lines of the chosen sample"
else bad "--best-of" "rc=$rc $(cat "$dc/best.err")"; fi

# --json with --beams / --best-of: each token's logprob and top_logprobs; the beam's log-probs sum to
# the score stderr says, the chosen best-of sample's lines equal its seed's plain sampled run
"$BIN" -m "$MODEL" -p "Once upon a time" -n 16 --beams 3 --json --top-logprobs 4 >"$dc/bj" 2>"$dc/bj.err"
"$BIN" -m "$MODEL" -p "Once upon a time" -n 16 --best-of 3 --seed 7 --temp 1 --json --top-logprobs 4 >"$dc/boj" 2>"$dc/boj.err"
seed=$(sed -n 's/.*(seed \([0-9]*\)).*/\1/p' "$dc/boj.err")
"$BIN" -m "$MODEL" -p "Once upon a time" -n 16 --seed "$seed" --temp 1 --json --top-logprobs 4 >"$dc/bop" 2>/dev/null
python3 - "$dc/bj" "$dc/bj.err" "$dc/boj" "$dc/bop" "$dc/boj.err" <<'PY' >"$dc/lpj.check" 2>&1
import json, re, sys
def toks(f): return [o for o in map(json.loads, open(f, encoding='utf-8')) if "done" not in o and o["token"] >= 0]
def check(ts):
    assert ts
    for o in ts:
        t = o["top_logprobs"]
        assert len(t) == 4 and all(t[i]["logprob"] >= t[i + 1]["logprob"] for i in range(3)), o
        assert o["logprob"] <= t[0]["logprob"] + 1e-6 and o["logprob"] <= 1e-6, o
        for a in t:
            if a["token"] == o["token"]: assert abs(a["logprob"] - o["logprob"]) < 1e-5, o
beam = toks(sys.argv[1]); check(beam)
s = float(re.search(r"sum of log-probs (-?[0-9.]+) over (\d+)", open(sys.argv[2]).read()).group(1))
assert abs(sum(o["logprob"] for o in beam) - s) < 2e-3, (sum(o["logprob"] for o in beam), s)
best, plain = toks(sys.argv[3]), toks(sys.argv[4]); check(best)
assert [o["token"] for o in best] == [o["token"] for o in plain], "best-of's sample is not its seed's sample"
for a, b in zip(best, plain):
    assert abs(a["logprob"] - b["logprob"]) < 1e-4 and [x["token"] for x in a["top_logprobs"]] == [x["token"] for x in b["top_logprobs"]], (a, b)
m = float(re.search(r"highest mean log-prob (-?[0-9.]+)", open(sys.argv[5]).read()).group(1))
assert abs(sum(o["logprob"] for o in best) / len(best) - m) < 2e-3, m
PY
if [ ! -s "$dc/lpj.check" ]; then ok "--json --top-logprobs with --beams (log-probs sum to the beam's) and --best-of (the chosen sample's lines = its seed's plain run)"
else bad "--json top_logprobs with --beams / --best-of" "$(head -5 "$dc/lpj.check")"; fi

# config.ini: draft = lookup, draft_max (the settings table), shown by --print-config
printf '[sampling]\ndraft = lookup\ndraft_max = 5\n' >"$dc/cfg/kvchat/config.ini"
XDG_CONFIG_HOME="$dc/cfg" "$BIN" --print-config -m "$MODEL" >"$dc/pc" 2>&1
XDG_CONFIG_HOME="$dc/cfg" "$BIN" -m "$MODEL" -p "$P" -n 40 --temp 0 --stats >/dev/null 2>"$dc/cfg.err"
if grep -q "^draft  *= lookup .*config file" "$dc/pc" && grep -q "^draft_max  *= 5" "$dc/pc" && grep -q "^speculative:" "$dc/cfg.err"
then ok "config.ini draft = lookup / draft_max: in --print-config and used by -p"
else bad "draft settings in config.ini" "$(grep draft "$dc/pc") $(head -c 200 "$dc/cfg.err")"; fi
