# Shell completions (completions/): bash, zsh and fish each load their file and complete an option, a subcommand, model names for -m, theme names and session ids; every option of --help is in each file and in kvchat(1).
CP=$tmp/compl
CROOT=$(cd "$here/../.." && pwd)
ABSBIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
mkdir -p "$CP/bin" "$CP/data/kvchat/models" "$CP/zdot" "$CP/bc/completions" "$CP/home"
ln -sf "$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")" "$CP/data/kvchat/models/stories260K.gguf"
# `kvchat` on PATH: the real binary, except that `list --ids` prints two ids when KVCHAT_FAKE_IDS
# is set (the completions read session ids from it); without it, `list --ids` is the real one
# pointed at a database that cannot exist, so it fails and the completion must stay silent.
cat >"$CP/bin/kvchat" <<EOF
#!/bin/sh
if [ "\$1" = list ] && [ -n "\${KVCHAT_FAKE_IDS:-}" ]; then printf '17\n42\n'; exit 0; fi
exec "$ABSBIN" "\$@"
EOF
chmod +x "$CP/bin/kvchat"
cenv=(env -u KVCHAT_MODEL HOME="$CP/home" PATH="$CP/bin:$PATH" XDG_DATA_HOME="$CP/data" XDG_CONFIG_HOME="$CP/home/.config"
    KVCHAT_DB="$CP/no/such/dir/kvchat.db")

# ---- bash: bash-completion's loader finds completions/kvchat.bash installed as completions/kvchat
if [ -r /usr/share/bash-completion/bash_completion ]; then
    cp "$CROOT/completions/kvchat.bash" "$CP/bc/completions/kvchat"
    bash_complete() { # WORD... → the candidates for the last word, one a line
        "${cenv[@]}" BASH_COMPLETION_USER_DIR="$CP/bc" bash --norc --noprofile -c '
            source /usr/share/bash-completion/bash_completion
            _completion_loader kvchat >/dev/null 2>&1
            f=$(complete -p kvchat 2>/dev/null | sed -n "s/.*-F \([^ ]*\) .*/\1/p")
            [ -n "$f" ] || { echo "NO-COMPLETION-LOADED"; exit; }
            COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
            COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
            "$f" kvchat "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
            printf "%s\n" "${COMPREPLY[@]}"' _ "$@" 2>"$CP/bash.err"
    }
    b_expect() { # description expected-candidate WORD...
        local what=$1 want=$2
        shift 2
        local got
        got=$(bash_complete "$@")
        if printf '%s\n' "$got" | grep -qxF -- "$want" && [ ! -s "$CP/bash.err" ]; then ok "bash: $what"
        else bad "bash: $what" "got: $(echo $got | head -c 200) $(head -c 200 "$CP/bash.err")"; fi
    }
    b_expect "--tem<TAB> completes --temp" --temp kvchat --tem
    b_expect "subcommand mod<TAB> → models" models kvchat mod
    b_expect "-m completes a model name from the models directory" stories260K kvchat -m stor
    b_expect "-m completes *.gguf paths" "$SHARED/models/stories260K.gguf" kvchat -m "$SHARED/models/stories2"
    b_expect "--theme completes theme names" solarized-dark kvchat --theme sol
    b_expect "--kv-type values" q8_0 kvchat --kv-type q
    KVCHAT_FAKE_IDS=1 b_expect "--resume completes session ids from kvchat list --ids" 42 kvchat --resume 4
    got=$(bash_complete kvchat rm "")
    if [ -z "$got" ] && [ ! -s "$CP/bash.err" ]; then ok "bash: session ids degrade silently when kvchat list fails"
    else bad "bash: session ids degrade silently when kvchat list fails" "got '$got' $(cat "$CP/bash.err")"; fi
else
    bad "bash-completion is installed (make deps)"
fi

# ---- fish: complete -C, with the file on fish's completion path
if command -v fish >/dev/null 2>&1; then
    mkdir -p "$CP/fish/completions"
    cp "$CROOT/completions/kvchat.fish" "$CP/fish/completions/kvchat.fish"
    fish_complete() { # COMMANDLINE → candidates (without descriptions)
        "${cenv[@]}" fish --no-config -c "set -p fish_complete_path '$CP/fish/completions'; complete -C '$1'" 2>"$CP/fish.err" |
            cut -f1
    }
    f_expect() { # description expected-candidate COMMANDLINE
        local got
        got=$(fish_complete "$3")
        if printf '%s\n' "$got" | grep -qxF -- "$2" && [ ! -s "$CP/fish.err" ]; then ok "fish: $1"
        else bad "fish: $1" "got: $(echo $got | head -c 200) $(head -c 200 "$CP/fish.err")"; fi
    }
    f_expect "--tem<TAB> completes --temp" --temp "kvchat --tem"
    f_expect "subcommand mod<TAB> → models" models "kvchat mod"
    f_expect "-m completes a model name from the models directory" stories260K "kvchat -m stor"
    f_expect "--theme completes theme names" solarized-dark "kvchat --theme sol"
    KVCHAT_FAKE_IDS=1 f_expect "--resume completes session ids" 42 "kvchat --resume "
    got=$(fish_complete "kvchat rm ")
    if [ -z "$got" ] && [ ! -s "$CP/fish.err" ]; then ok "fish: session ids degrade silently when kvchat list fails"
    else bad "fish: session ids degrade silently" "got '$got' $(cat "$CP/fish.err")"; fi
else
    bad "fish is installed (make deps)"
fi

# ---- zsh: an interactive zsh in tmux with completions/ on $fpath and compinit; type, press Tab
if command -v zsh >/dev/null 2>&1 && command -v tmux >/dev/null 2>&1; then
    ZT="tmux -L kvchat-compl-$$"
    cat >"$CP/zdot/.zshrc" <<EOF
PS1='ZSH> '
fpath=('$CROOT/completions' \$fpath)
autoload -Uz compinit && compinit -u -D
EOF
    # one interactive zsh for all the checks (compinit takes seconds); KVCHAT_FAKE_IDS on, as
    # the session-id check needs it and nothing else reads it
    $ZT kill-server >/dev/null 2>&1
    $ZT -f /dev/null new-session -d -s z -x 160 -y 20 \
        "$(printf '%q ' "${cenv[@]}" KVCHAT_FAKE_IDS=1 ZDOTDIR="$CP/zdot" TERM=xterm zsh -i)"
    zline() { $ZT capture-pane -p -t z 2>/dev/null | grep '^ZSH>' | tail -1; }
    # z_expect description REGEX TEXT: on an empty, cleared prompt type TEXT and Tab; the prompt
    # line must then match REGEX
    z_expect() {
        local what=$1 re=$2 text=$3 end line=
        $ZT send-keys -t z C-u C-l
        end=$(($(date +%s) + 20))
        until [ "$(zline)" = "ZSH>" ] && [ "$($ZT capture-pane -p -t z 2>/dev/null | grep -c .)" -eq 1 ]; do
            [ "$(date +%s)" -gt "$end" ] && break
            sleep 0.1
        done
        $ZT send-keys -t z -l "$text"
        $ZT send-keys -t z Tab
        end=$(($(date +%s) + 10))
        while [ "$(date +%s)" -le "$end" ]; do
            line=$(zline)
            printf '%s\n' "$line" | grep -qE -- "$re" && break
            sleep 0.1
        done
        if printf '%s\n' "$line" | grep -qE -- "$re"; then ok "zsh: $what"
        else bad "zsh: $what" "prompt line: '$line'"; fi
    }
    z_expect "--tem<TAB> completes --temp" '^ZSH> kvchat --temp=' "kvchat --tem"
    z_expect "subcommand mod<TAB> → models" '^ZSH> kvchat models$' "kvchat mod"
    z_expect "-m completes a model name from the models directory" '^ZSH> kvchat -m stories260K$' "kvchat -m stories2"
    z_expect "--theme completes theme names" '^ZSH> kvchat --theme solarized-dark$' "kvchat --theme sol"
    z_expect "--resume completes session ids" '^ZSH> kvchat --resume 42$' "kvchat --resume 4"
    $ZT kill-server >/dev/null 2>&1
else
    bad "zsh and tmux are installed (make deps)"
fi

# ---- every long option of --help is offered by each completion file and documented in kvchat(1)
"$BIN" --help | grep -oE -- '--[a-z][a-z0-9-]+' | sort -u >"$CP/help-opts"
missing=
while read -r o; do
    grep -qF -- "$o" "$CROOT/completions/kvchat.bash" || missing="$missing bash:$o"
    grep -qF -- "${o}" "$CROOT/completions/_kvchat" || missing="$missing zsh:$o"
    grep -qE -- "-l ${o#--}( |$)" "$CROOT/completions/kvchat.fish" || missing="$missing fish:$o"
    grep -qF -- "Fl ${o#-}" "$CROOT/man/kvchat.1" || missing="$missing man:$o"
done <"$CP/help-opts"
if [ -z "$missing" ]; then ok "all $(wc -l <"$CP/help-opts") long options of --help are in the completions and kvchat(1)"
else bad "every --help option in the completions and kvchat(1)" "missing:$missing"; fi
