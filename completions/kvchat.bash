# kvchat.bash: bash completion for kvchat(1) — options, subcommands, *.gguf files and model names for -m, theme names, session ids.
# Installed as share/bash-completion/completions/kvchat (loaded on demand by bash-completion),
# or source it from ~/.bashrc. Theme names and session ids come from the kvchat being
# completed (`kvchat themes`, `kvchat list --ids`); when that fails nothing is offered.

_kvchat_opts='-m --model -p --prompt -n --n-predict -c --ctx-size -b --batch-size -t --threads
    --kv-type --keep --no-context-shift --swa-full --truncate-prompt --stop --no-bos --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n
    --presence-penalty --frequency-penalty --seed --theme --no-mouse --no-markdown --system --chat-template --db --resume
    --cache-size --remote --api-key --remote-timeout --stats --json --top-logprobs --lookup --draft --draft-max --draft-min-p --beams --length-penalty --best-of
    --print-config -h --help -V --version'
_kvchat_cmds='models themes list export import rm check bench gen-model tokenize template-render serve'
_kvchat_templates='none chatml llama2 llama2-sys llama2-sys-bos llama2-sys-strip mistral-v1 mistral-v3
    mistral-v3-tekken mistral-v7 phi3 phi4 falcon3 zephyr monarch gemma orion openchat vicuna
    vicuna-orca deepseek deepseek2 deepseek3 command-r llama3 chatglm3 chatglm4 glmedge minicpm
    exaone3 rwkv-world granite gigachat megrez'

# Model names in $XDG_DATA_HOME/kvchat/models (what -m NAME finds), then *.gguf files and dirs.
_kvchat_models()
{
    local cur=$1 dir f
    dir=${XDG_DATA_HOME:-$HOME/.local/share}
    [[ $dir == /* ]] || dir=$HOME/.local/share
    dir=$dir/kvchat/models
    if [[ $cur != */* && -d $dir ]]; then
        for f in "$dir"/*.gguf; do
            [[ -e $f ]] || continue
            f=${f##*/}
            f=${f%.gguf}
            [[ $f == "$cur"* ]] && COMPREPLY+=("$f")
        done
    fi
    local IFS=$'\n'
    COMPREPLY+=($(compgen -f -X '!*.gguf' -- "$cur") $(compgen -d -- "$cur"))
    compopt -o filenames 2>/dev/null
}

_kvchat()
{
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local self=${COMP_WORDS[0]} i w cmd=
    COMPREPLY=()
    # --opt=value: bash splits it at '='
    if [[ $cur == = ]]; then
        cur=
    elif [[ $prev == = && $COMP_CWORD -ge 2 ]]; then
        prev=${COMP_WORDS[COMP_CWORD-2]}
    fi
    # the subcommand, if any: the first word that is not an option or an option's value
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
            -m|--model|-p|--prompt|-n|--n-predict|-c|--ctx-size|-b|--batch-size|-t|--threads|--kv-type|--keep|--stop|\
            --temp|--top-k|--top-p|--min-p|--repeat-penalty|--repeat-last-n|--presence-penalty|\
            --frequency-penalty|--seed|--theme|--system|--chat-template|--db|--resume|--cache-size|-r|-o|--shape|--type|--layers|--format|\
            --top-logprobs|--draft|--draft-max|--draft-min-p|--beams|--length-penalty|--best-of|\
            --vocab|--ff|--swa|--orig-ctx|--attn-softcap|--special|--yarn|--experts|--experts-used|--ff-exp|--ff-shexp|--host|--port|--parallel|--prefill-chunk|--api-key|--max-body|--remote|--remote-timeout)
                ((i++)) ;;
            -*|=) ;;
            *) cmd=$w; break ;;
        esac
    done

    case $prev in
        -m|--model) _kvchat_models "$cur"; return ;;
        --theme)
            local IFS=$'\n'
            COMPREPLY=($(compgen -W "$("$self" themes 2>/dev/null | cut -f1)" -- "$cur") $(compgen -f -X '!*.theme' -- "$cur"))
            return ;;
        --kv-type) COMPREPLY=($(compgen -W 'f16 q8_0 f32' -- "$cur")); return ;;
        --draft) _kvchat_models "$cur"; COMPREPLY+=($(compgen -W 'lookup off' -- "$cur")); return ;;
        --chat-template) COMPREPLY=($(compgen -W "$_kvchat_templates" -- "$cur")); return ;;
        --resume) COMPREPLY=($(compgen -W "last $("$self" list --ids 2>/dev/null)" -- "$cur")); return ;;
        --db|-o) COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2>/dev/null; return ;;
        --shape) COMPREPLY=($(compgen -W 'tinyllama llama3.2-1b qwen2.5-0.5b tiny qwen3-0.6b smollm3-3b granite-3-2b olmo2-1b gemma2-2b gemma3-1b gemma3-4b phi4-mini ministral3-3b internlm2.5-1.8b qwen3-30b-a3b qwen1.5-moe-a2.7b olmoe-1b-7b gpt-oss-20b' -- "$cur")); return ;;
        --type) COMPREPLY=($(compgen -W 'f16 q8_0 q4_0 q6_k iq4_nl iq4_xs q4_k_m q5_k_m mxfp4' -- "$cur")); return ;;
        -p|--prompt|-n|--n-predict|-c|--ctx-size|-b|--batch-size|-t|--threads|--keep|--stop|--temp|--top-k|--top-p|\
        --min-p|--repeat-penalty|--repeat-last-n|--presence-penalty|--frequency-penalty|--seed|--cache-size|\
        --system|-r|--layers|--vocab|--ff|--swa|--orig-ctx|--attn-softcap|--special|--yarn|--experts|--experts-used|--ff-exp|--ff-shexp|--host|--port|--parallel|--prefill-chunk|--api-key|--max-body|\
        --top-logprobs|--draft-max|--draft-min-p|--beams|--length-penalty|--best-of|--remote|--remote-timeout)
            return ;; # a value of the user's own
    esac

    case $cmd in
        '')
            if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W "$_kvchat_opts" -- "$cur"))
            else COMPREPLY=($(compgen -W "$_kvchat_cmds" -- "$cur")); fi ;;
        models) COMPREPLY=($(compgen -W '--json --help' -- "$cur")) ;;
        themes) COMPREPLY=($(compgen -W '--help' -- "$cur")) ;;
        list) COMPREPLY=($(compgen -W '--json --ids --db --help' -- "$cur")) ;;
        export)
            if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W '--format -o --db --help' -- "$cur"))
            elif [[ $prev == --format ]]; then COMPREPLY=($(compgen -W 'md json' -- "$cur"))
            else COMPREPLY=($(compgen -W "last $("$self" list --ids 2>/dev/null)" -- "$cur")); fi ;;
        rm)
            if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W '--db --help' -- "$cur"))
            else COMPREPLY=($(compgen -W "$("$self" list --ids 2>/dev/null)" -- "$cur")); fi ;;
        check) COMPREPLY=($(compgen -W '--db --help' -- "$cur")) ;;
        import)
            if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W '--db --help' -- "$cur"))
            else COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2>/dev/null; fi ;;
        bench) COMPREPLY=($(compgen -W '-m --model -p --n-prompt -n --n-gen -t --threads -d --n-depth -r --repetitions --json --help' -- "$cur")) ;;
        gen-model) COMPREPLY=($(compgen -W '--shape --type -o --layers --seed --vocab --ff --swa --orig-ctx --attn-softcap --chat-template --special --yarn --experts --experts-used --ff-exp --ff-shexp --help' -- "$cur")) ;;
        tokenize) COMPREPLY=($(compgen -W '-m --model --ids --no-bos --parse-special --help' -- "$cur")) ;;
        template-render) COMPREPLY=($(compgen -W '-t --template -m --model --now --spans --help' -- "$cur")) ;;
        serve) COMPREPLY=($(compgen -W '-m --model --host --port --parallel --prefill-chunk --api-key -c --ctx-size -t --threads
            -b --batch-size --kv-type --chat-template --max-body --store --no-context-shift --help' -- "$cur")) ;;
    esac
}
complete -F _kvchat kvchat
