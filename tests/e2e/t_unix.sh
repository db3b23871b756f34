# Unix citizenship: config file and precedence (--print-config), the models directory, pipes (plain text, --json, SIGPIPE), --help and --version.
ux=$tmp/unix
mkdir -p "$ux/cfg/kvchat" "$ux/data/kvchat/models" "$ux/home"
ln -sf "$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")" "$ux/data/kvchat/models/stories260K.gguf"
head -c 5000 "$MODEL" >"$ux/data/kvchat/models/broken.gguf"
# every command here sees only this test's config, data and home
uxrun() { env -u KVCHAT_MODEL -u KVCHAT_DB HOME="$ux/home" XDG_CONFIG_HOME="$ux/cfg" XDG_DATA_HOME="$ux/data" "$BIN" "$@"; }

cat >"$ux/cfg/kvchat/config.ini" <<'EOF'
# kvchat test config
model = stories260K
[sampling]
temp = 0.3      ; from the file
top_k = lots
[model]
threads = 1
this line has no equals sign
[storage]
db = ~/chats.db
EOF

# --print-config: each value and its source; precedence command line > environment > file > default
uxrun --print-config >"$ux/pc" 2>"$ux/pc.err"
rc=$?
if [ $rc -eq 0 ] && grep -Eq '^temp += 0\.3 .*; config file .*config\.ini:4$' "$ux/pc" &&
    grep -Eq '^top_k += 40 .*; default$' "$ux/pc" &&
    grep -Eq '^model += stories260K .*config\.ini:2 -> .*/kvchat/models/stories260K\.gguf$' "$ux/pc" &&
    grep -Eq "^db += $ux/home/chats.db " "$ux/pc"; then
    ok "--print-config shows file values with FILE:LINE, defaults, the resolved model"
else bad "--print-config shows file values with FILE:LINE, defaults, the resolved model" "rc=$rc $(head -c 600 "$ux/pc")"; fi
if grep -q 'config.ini:5: top_k:' "$ux/pc.err" && grep -q 'config.ini:8: expected' "$ux/pc.err"; then
    ok "bad config lines warn with file and line ($(head -1 "$ux/pc.err"))"
else bad "bad config lines warn with file and line" "$(cat "$ux/pc.err")"; fi
env KVCHAT_DB=/env.db HOME="$ux/home" XDG_CONFIG_HOME="$ux/cfg" XDG_DATA_HOME="$ux/data" \
    KVCHAT_MODEL="$MODEL" "$BIN" --print-config --temp 0.9 >"$ux/pc2" 2>/dev/null
if grep -Eq '^temp += 0\.9 .*; command line --temp$' "$ux/pc2" && grep -Eq '^db += /env\.db .*; environment KVCHAT_DB$' "$ux/pc2" &&
    grep -Eq '^model += .*; environment KVCHAT_MODEL$' "$ux/pc2"; then
    ok "command line beats environment beats config file"
else bad "command line beats environment beats config file" "$(grep -E '^(temp|db|model) ' "$ux/pc2")"; fi
mkdir -p "$ux/cfg3/kvchat" && cp "$ux/pc" "$ux/cfg3/kvchat/config.ini"
env -u KVCHAT_MODEL -u KVCHAT_DB HOME="$ux/home" XDG_CONFIG_HOME="$ux/cfg3" XDG_DATA_HOME="$ux/data" "$BIN" --print-config >"$ux/pc3" 2>"$ux/e"
if [ ! -s "$ux/e" ] && diff <(grep -v '^;' "$ux/pc" | sed 's/ *;.*//') <(grep -v '^;' "$ux/pc3" | sed 's/ *;.*//') >/dev/null; then
    ok "--print-config output read back as a config file: no warnings, same values"
else bad "--print-config output read back as a config file" "$(head -3 "$ux/e")"; fi
if env HOME="$ux/home" XDG_CONFIG_HOME="$ux/cfg2" "$BIN" --print-config >/dev/null 2>"$ux/e" && [ ! -s "$ux/e" ]; then
    ok "no config file: no warnings"
else bad "no config file: no warnings" "$(cat "$ux/e")"; fi

# The config file's values are used: model by name from the models directory, temp 0.3 (sampled;
# here only checked to run) — and -m NAME resolves in the models directory.
uxrun -p "Once upon a time" -n 8 --temp 0 >"$ux/o1" 2>/dev/null
"$BIN" -m "$MODEL" -p "Once upon a time" -n 8 --temp 0 >"$ux/o2" 2>/dev/null
if [ -s "$ux/o1" ] && cmp -s "$ux/o1" "$ux/o2"; then ok "model from the config file, found by name in the models directory"
else bad "model from the config file, found by name in the models directory" "$(head -c 200 "$ux/o1")"; fi
rm "$ux/cfg/kvchat/config.ini"
uxrun -m stories260K -p "Once upon a time" -n 8 --temp 0 >"$ux/o3" 2>/dev/null
cmp -s "$ux/o3" "$ux/o2" && ok "-m NAME finds NAME.gguf in the models directory" || bad "-m NAME finds NAME.gguf in the models directory"
uxrun -m no-such-model -p x >/dev/null 2>"$ux/e"
rc=$?
if [ $rc -eq 3 ] && grep -q "no model 'no-such-model'" "$ux/e"; then ok "unknown model name: exit 3, says where it looked"
else bad "unknown model name: exit 3" "rc=$rc $(cat "$ux/e")"; fi
uxrun -p x >/dev/null 2>"$ux/e"
rc=$?
if [ $rc -eq 2 ] && grep -q "kvchat/models/" "$ux/e" && grep -q "GGUF" "$ux/e"; then ok "no model: exit 2 with how to get one and where to put it"
else bad "no model: exit 2 with a helpful message" "rc=$rc $(cat "$ux/e")"; fi

# kvchat models: name, size, architecture, type, context from the headers; broken files listed with their error
uxrun models >"$ux/m" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -Eq '^stories260K +[0-9.]+ MiB +[0-9.]+K +llama +F32 +2048$' "$ux/m" && grep -q '^broken .*error: truncated' "$ux/m"; then
    ok "kvchat models lists name, size, params, arch, type, context"
else bad "kvchat models lists name, size, params, arch, type, context" "rc=$rc $(cat "$ux/m")"; fi
uxrun models --json | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
ok = any(r["name"] == "stories260K" and r["architecture"] == "llama" and r["n_ctx_train"] == 2048 for r in rows)
sys.exit(0 if ok and any("error" in r for r in rows) else 1)' && ok "kvchat models --json" || bad "kvchat models --json"
uxrun themes | grep -q "^solarized-dark	" && ok "kvchat themes lists theme names" || bad "kvchat themes lists theme names"

# Pipes: plain text with no escape bytes; --json one valid object per token and a final stats object
"$BIN" -m "$MODEL" -p "Once upon a time" -n 32 --temp 0 --stats >"$ux/plain" 2>"$ux/plain.err"
if [ -s "$ux/plain" ] && ! grep -q $'\x1b' "$ux/plain" && ! grep -q $'\x1b' "$ux/plain.err"; then ok "piped output has no escape codes"
else bad "piped output has no escape codes"; fi
printf 'Once upon a time' | "$BIN" -m "$MODEL" -n 24 --temp 0 --json >"$ux/j" 2>"$ux/j.err"
rc=$?
python3 - "$ux/j" "$ux/o2" <<'PY' >"$ux/j.check" 2>&1
import json, sys
lines = open(sys.argv[1], 'rb').read().decode('utf-8').splitlines()
objs = [json.loads(l) for l in lines]
toks, last = objs[:-1], objs[-1]
assert len(toks) == 24, len(toks)
assert all(isinstance(o["token"], int) and isinstance(o["text"], str) for o in toks)
assert last["done"] is True and last["finish"] == "length" and last["n_generated"] == 24, last
assert last["decode_tps"] > 0 and last["n_prompt"] > 0
# the same text as the plain mode (whose first 8 tokens were saved with the prompt)
plain = open(sys.argv[2], 'rb').read().decode('utf-8')
text = "Once upon a time" + "".join(o["text"] for o in toks)
assert text.startswith(plain), (text[:80], plain[:80])
PY
if [ $rc -eq 0 ] && [ ! -s "$ux/j.err" ] && [ ! -s "$ux/j.check" ]; then ok "--json: one object per token and a final stats object"
else bad "--json: one object per token and a final stats object" "rc=$rc $(cat "$ux/j.err" "$ux/j.check" | head -5)"; fi

# SIGPIPE: a reader that goes away ends kvchat quietly (status 141, or 0), nothing on stderr
"$BIN" -m "$MODEL" -p "Once upon a time" -n 2000 -c 2048 --temp 0 2>"$ux/sp.err" | head -c 10 >/dev/null
rc=${PIPESTATUS[0]}
if { [ "$rc" -eq 141 ] || [ "$rc" -eq 0 ]; } && [ ! -s "$ux/sp.err" ]; then ok "SIGPIPE ends kvchat quietly (status $rc)"
else bad "SIGPIPE ends kvchat quietly" "status $rc, stderr: $(head -c 300 "$ux/sp.err")"; fi
"$BIN" -m "$MODEL" -p "Once upon a time" -n 2000 -c 2048 --temp 0 --json 2>"$ux/sp.err" | head -n 1 >/dev/null
rc=${PIPESTATUS[0]}
if { [ "$rc" -eq 141 ] || [ "$rc" -eq 0 ]; } && [ ! -s "$ux/sp.err" ]; then ok "SIGPIPE ends --json quietly (status $rc)"
else bad "SIGPIPE ends --json quietly" "status $rc, stderr: $(head -c 300 "$ux/sp.err")"; fi

# --help in the GNU style, --version with build options and the kernel level
"$BIN" --help >"$ux/h"
if head -1 "$ux/h" | grep -q '^Usage: kvchat ' && grep -q '^Mandatory arguments to long options' "$ux/h" &&
    grep -q '^Exit status:' "$ux/h" && grep -q -- '--print-config' "$ux/h" && grep -q 'man kvchat' "$ux/h"; then
    ok "--help in the GNU style"
else bad "--help in the GNU style"; fi
"$BIN" --version >"$ux/v"
if head -1 "$ux/v" | grep -Eq '^kvchat [0-9]' && grep -q '^build: ' "$ux/v" && grep -q '^kernels: ' "$ux/v" &&
    grep -q '^kernel levels this CPU can run: portable' "$ux/v"; then ok "--version: $(grep '^kernels: ' "$ux/v" | cut -c1-60)"
else bad "--version shows build and kernels" "$(cat "$ux/v")"; fi
