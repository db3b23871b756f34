# The chat's decoding commands (issue 15), driven in tmux: the token-probability heat-map (F6,
# /show probs) checked colour by colour against --json's log-probs, on wrapped text and after a
# resize; /best N (the ranking said, equal to one-shot --best-of; the others kept as branches,
# stored and there after a resume); /beams N (the score said, equal to one-shot --beams).
# With chat_lib.sh's session helpers.

if ! command -v tmux >/dev/null 2>&1; then
    bad "chat decode: tmux is installed (make deps)"
    return 0
fi
# the session helpers (chat_start, wait_for, keys, cap …), when t_chat.sh did not define them
type chat_start >/dev/null 2>&1 || . "$here/chat_lib.sh"

DD=$tmp/chat_decode
mkdir -p "$DD"
ARGS="-t 1 --temp 1.2 --seed 3 -n 40"
# the reply's tokens and log-probs as the one-shot mode gives them (the same prompt, seed, sampling)
# shellcheck disable=SC2086
"$BIN" -m "$MODEL" $ARGS -p "Once upon a time" --json >"$DD/ref.json" 2>/dev/null

# heat_check CAPTURE: the reply's characters in the capture (tmux capture-pane -e) carry the
# colour of their token's probability (default theme: green >= 0.8, yellow >= 0.3, red below)
heat_check() {
    python3 - "$DD/ref.json" "$1" <<'PY'
import json, math, re, sys
toks = [json.loads(l) for l in open(sys.argv[1], encoding='utf-8')][:-1]
want = ""
for t in toks:
    if t["token"] < 0: continue
    p = math.exp(t["logprob"])
    c = "G" if p >= 0.8 else "Y" if p >= 0.3 else "R"
    want += "".join(c for ch in t["text"] if not ch.isspace())
lines = open(sys.argv[2], encoding='utf-8').read().split("\n")
start = next(i for i, l in enumerate(lines) if re.match(r"^ stories260K( ·|\s|$)", re.sub(r"\x1b\[[0-9;]*m", "", l))) + 1
got, fg = "", None
for l in lines[start:]:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", l)
    if plain.strip().startswith("[max tokens]"): break
    for m in re.finditer(r"\x1b\[([0-9;]*)m|([^\x1b])", l):
        if m.group(1) is not None:
            for code in (m.group(1) or "0").split(";"):
                if code in ("0", "39"): fg = None
                elif code == "32": fg = "G"
                elif code == "33": fg = "Y"
                elif code == "31": fg = "R"
        elif m.group(2) == "│": break  # the sliders panel beside the pane
        elif not m.group(2).isspace():
            got += fg or "-"
got = got[:len(want)]
import os
if os.environ.get("HEAT_OFF"):  # no heat colour on any character of the reply
    assert got == "-" * len(want), got
    sys.exit(0)
assert len(set(want)) > 1, "the reference has one colour only: no test"
assert got == want, "\nwant %s\ngot  %s" % (want, got)
print(len(want))
PY
}

chat_start 60 24 -- $ARGS --db "$DD/c.db"
wait_idle 30
keys "Once upon a time" Enter
wait_for '\[max tokens\]' 30 && wait_idle 20
keys F6
wait_for 'token probabilities shown' 10
cap -e >"$DD/heat1"
if n=$(heat_check "$DD/heat1" 2>"$DD/heat1.err"); then ok "chat decode: F6 colours each token of the reply by its probability (the colours of --json's log-probs, $n characters, wrapped at 60 columns)"
else bad "chat decode: F6 heat-map = --json log-probs" "$(cat "$DD/heat1.err" | tail -3)"; fi
$TMC resize-window -t c -x 44 -y 24
sleep 0.5
wait_for '\[max tokens\]' 10
cap -e >"$DD/heat2"
if [ "$(cap | head -1 | wc -L)" -le 44 ] &&
    n=$(heat_check "$DD/heat2" 2>"$DD/heat2.err") && ! cmp -s "$DD/heat1" "$DD/heat2"; then
    ok "chat decode: the heat-map follows a resize to 44 columns (rewrapped, the same colours)"
else bad "chat decode: the heat-map after a resize" "$(tail -3 "$DD/heat2.err")"; fi
keys "/show probs" Enter
wait_for 'token probabilities hidden' 10
cap -e >"$DD/heat3"
if HEAT_OFF=1 heat_check "$DD/heat3" >/dev/null 2>"$DD/heat3.err"; then
    ok "chat decode: /show probs turns the heat-map off again (no heat colours)"
else bad "chat decode: /show probs off" "$(cat -v "$DD/heat3" | sed -n 8,14p)"; fi

# /best 3: the note has the one-shot --best-of ranking; the other samples are branches 3/4 and 4/4
# shellcheck disable=SC2086
ref=$("$BIN" -m "$MODEL" $ARGS -p "Once upon a time" --best-of 3 2>&1 >/dev/null | tail -1)
s0=$(echo "$ref" | sed -n 's/.*log-prob \(-[0-9.]*\) (seed \([0-9]*\)).*/\1 (seed \2)/p')
others=$(echo "$ref" | sed -n 's/.*the others: //p')
keys "/best 3" Enter
if wait_for 'best of 3, ranked by mean' 30 && wait_idle 20 && cap | tr '\n' ' ' | tr -s ' ' |
    grep -qF "ranked by mean log-probability per token: this reply $s0; the others, branches 3-4/4 (/branch N): $others" &&
    cap | grep -q 'stories260K · branch 2/4'; then
    ok "chat decode: /best 3 says the ranking (= one-shot --best-of: $s0; $others), the chosen one is branch 2/4"
else bad "chat decode: /best 3 ranking" "$(screen_dump)"; fi
shown=$(cap | sed -n '/branch 2\/4/,/max tokens/p' | sed '1d;$d' | tr -d '\n ')
keys "/branch 3" Enter
if wait_for 'branch 3/4' 10 && other=$(cap | sed -n '/branch 3\/4/,/max tokens/p' | sed '1d;$d' | tr -d '\n ') &&
    [ -n "$other" ] && [ "$other" != "$shown" ]; then
    ok "chat decode: /branch 3 shows another of the samples (branch 3/4)"
else bad "chat decode: /best's other samples as branches" "$(screen_dump)"; fi
keys "/branch 2" Enter
wait_for 'branch 2/4' 10

# /beams 3: the score of one-shot --beams
# shellcheck disable=SC2086
bref=$("$BIN" -m "$MODEL" $ARGS -p "Once upon a time" --beams 3 2>&1 >/dev/null | sed -n 's/.*chose the beam of score \(-[0-9.]*\) (sum of log-probs \(-[0-9.]*\) over \([0-9]*\) tokens.*/score \1 (sum of log-probs \2 over \3 tokens/p')
keys "/beams 3" Enter
if [ -n "$bref" ] && wait_for 'beam search, 3 beams' 30 && wait_idle 20 &&
    cap | tr '\n' ' ' | tr -s ' ' | grep -qF "chose the beam of $bref"; then
    ok "chat decode: /beams 3 says the chosen beam's $bref, as one-shot --beams"
else bad "chat decode: /beams 3" "$bref | $(screen_dump)"; fi
keys "/best 1" Enter
if wait_for 'usage: /best N \[MESSAGE\]' 10; then ok "chat decode: /best 1 is refused with the usage"
else bad "chat decode: /best 1 refused" "$(screen_dump)"; fi
keys C-d
sleep 1

# resumed: the samples are stored branches of the conversation
chat_start 60 24 -- $ARGS --db "$DD/c.db" --resume last
wait_idle 30
keys "/branch list" Enter
if wait_for 'message 2 \(reply\): branch' 10 && cap | sed -E 's/ *│.*$//' | tr '\n' ' ' | tr -s ' ' | grep -q 'branch 5 of 5'; then ok "chat decode: after a resume the samples and the beam are branches (5 replies)"
else bad "chat decode: /best's branches stored" "$(screen_dump)"; fi
chat_stop
