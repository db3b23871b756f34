# kvchat.fish: fish completion for kvchat(1) — options, subcommands, *.gguf files and model names for -m, theme names, session ids.
# Installed as share/fish/vendor_completions.d/kvchat.fish. Theme names and session ids come
# from the kvchat being completed (`kvchat themes`, `kvchat list --ids`); when that fails
# nothing is offered.

set -l kvchat_cmds models themes list export import rm check bench gen-model tokenize template-render serve

function __kvchat_bin
    set -l cmd (commandline -opc)
    echo $cmd[1]
end

# files with this suffix and directories, under the token being completed
function __kvchat_files_with_suffix -a suffix
    set -l tok (commandline -ct)
    for f in $tok*$suffix
        test -f $f; and echo $f
    end
    for d in $tok*/
        echo $d
    end
end

function __kvchat_models
    set -l dir $XDG_DATA_HOME
    string match -q '/*' -- "$dir"; or set dir $HOME/.local/share
    for f in $dir/kvchat/models/*.gguf
        set -l name (string replace -r '\.gguf$' '' -- (basename $f))
        printf '%s\t%s\n' $name "model in $dir/kvchat/models"
    end
    __kvchat_files_with_suffix .gguf
end

function __kvchat_themes
    set -l bin (__kvchat_bin)
    command $bin themes 2>/dev/null
    __kvchat_files_with_suffix .theme
end

function __kvchat_sessions
    set -l bin (__kvchat_bin)
    command $bin list --ids 2>/dev/null | string match -r '^[0-9]+$'
end

# main command: options only before a subcommand
set -l main "not __fish_seen_subcommand_from $kvchat_cmds"
complete -c kvchat -n $main -s m -l model -r -f -a '(__kvchat_models)' -d 'GGUF model file or name in the models directory'
complete -c kvchat -n $main -s p -l prompt -x -d 'Prompt text'
complete -c kvchat -n $main -s n -l n-predict -x -d 'Tokens to generate (-1: until end of text)'
complete -c kvchat -n $main -s c -l ctx-size -x -d 'Context length in tokens'
complete -c kvchat -n $main -s b -l batch-size -x -d 'Prefill chunk in tokens'
complete -c kvchat -n $main -s t -l threads -x -d 'Threads'
complete -c kvchat -n $main -l kv-type -x -a 'f16 q8_0 f32' -d 'KV cache type'
complete -c kvchat -n $main -l keep -x -d 'On a full context keep the first N tokens (context shift)'
complete -c kvchat -n $main -l no-context-shift -d 'Stop at a full context instead of shifting'
complete -c kvchat -n $main -l swa-full -d 'Sliding-window layers keep every position'
complete -c kvchat -n $main -l truncate-prompt -d 'Drop the start of a prompt longer than the context'
complete -c kvchat -n $main -l stop -x -d 'End the reply where this string appears'
complete -c kvchat -n $main -l no-bos -d 'Do not add the BOS token'
complete -c kvchat -n $main -l temp -x -d 'Temperature 0-2, 0 = greedy'
complete -c kvchat -n $main -l top-k -x -d 'Keep the K most likely tokens'
complete -c kvchat -n $main -l top-p -x -d 'Nucleus sampling'
complete -c kvchat -n $main -l min-p -x -d 'Drop tokens below P x the top probability'
complete -c kvchat -n $main -l repeat-penalty -x -d 'Penalise repeated tokens'
complete -c kvchat -n $main -l repeat-last-n -x -d 'Tokens the penalties look back on, -1 = all'
complete -c kvchat -n $main -l presence-penalty -x -d 'Presence penalty'
complete -c kvchat -n $main -l frequency-penalty -x -d 'Frequency penalty'
complete -c kvchat -n $main -l seed -x -d 'Random seed'
complete -c kvchat -n $main -l theme -r -f -a '(__kvchat_themes)' -d 'Colour theme'
complete -c kvchat -n $main -l no-mouse -d 'Leave the mouse to the terminal'
complete -c kvchat -n $main -l no-markdown -d 'Show replies as plain text, not rendered Markdown'
complete -c kvchat -n $main -l system -x -d 'System prompt of new conversations'
complete -c kvchat -n $main -l chat-template -x -d 'Chat template family' -a 'none chatml llama2 llama2-sys llama2-sys-bos llama2-sys-strip mistral-v1 mistral-v3 mistral-v3-tekken mistral-v7 phi3 phi4 falcon3 zephyr monarch gemma orion openchat vicuna vicuna-orca deepseek deepseek2 deepseek3 command-r llama3 chatglm3 chatglm4 glmedge minicpm exaone3 rwkv-world granite gigachat megrez'
complete -c kvchat -n $main -l db -r -F -d 'Conversation database'
complete -c kvchat -n $main -l resume -x -a 'last (__kvchat_sessions)' -d 'Resume a saved conversation'
complete -c kvchat -n $main -l cache-size -x -d 'KV prefix cache size'
complete -c kvchat -n $main -l top-logprobs -x -d '--json lines list the K most likely tokens'
complete -c kvchat -n $main -l lookup -d 'Speculative decoding with n-gram drafts from the prompt and reply'
complete -c kvchat -n $main -l draft -r -F -a 'lookup off' -d 'Speculative decoding with a draft model of the same vocabulary'
complete -c kvchat -n $main -l draft-max -x -d 'Tokens drafted per verification pass, 1-32'
complete -c kvchat -n $main -l draft-min-p -x -d 'Stop drafting below this draft probability'
complete -c kvchat -n $main -l beams -x -d 'Beam search with N beams'
complete -c kvchat -n $main -l length-penalty -x -d 'Beam score = sum of log-probs / length^A'
complete -c kvchat -n $main -l best-of -x -d 'N samples from one prefill, the best by mean log-prob'
complete -c kvchat -n $main -l remote -x -a 'http://127.0.0.1:8080' -d 'Chat on an OpenAI-compatible server'
complete -c kvchat -n $main -l api-key -x -d 'API key sent to the --remote server'
complete -c kvchat -n $main -l remote-timeout -x -d 'Seconds of silence that fail a remote reply'
complete -c kvchat -n $main -l stats -d 'Print timings to stderr'
complete -c kvchat -n $main -l json -d 'JSON lines output'
complete -c kvchat -n $main -l print-config -d 'Show every setting and where it came from'
complete -c kvchat -n $main -s h -l help -d 'Show help'
complete -c kvchat -n $main -s V -l version -d 'Show version and build information'

# subcommands
complete -c kvchat -n $main -f -a models -d 'List the models directory'
complete -c kvchat -n $main -f -a themes -d 'List the colour themes'
complete -c kvchat -n $main -f -a list -d 'List saved conversations'
complete -c kvchat -n $main -f -a export -d 'Export a conversation'
complete -c kvchat -n $main -f -a import -d 'Import a conversation'
complete -c kvchat -n $main -f -a rm -d 'Delete a conversation'
complete -c kvchat -n $main -f -a check -d 'Check the conversation database'
complete -c kvchat -n $main -f -a bench -d 'Measure prefill and decode speed'
complete -c kvchat -n $main -f -a gen-model -d 'Write a model with random weights'
complete -c kvchat -n $main -f -a tokenize -d 'Show how text is tokenized'
complete -c kvchat -n $main -f -a template-render -d 'Render a Jinja chat template'
complete -c kvchat -n '__fish_seen_subcommand_from template-render' -s t -l template -r -F -d 'Template file'
complete -c kvchat -n '__fish_seen_subcommand_from template-render' -s m -l model -r -f -a '(__kvchat_models)' -d 'GGUF model'
complete -c kvchat -n '__fish_seen_subcommand_from template-render' -l now -r -d 'Clock of strftime_now (seconds)'
complete -c kvchat -n '__fish_seen_subcommand_from template-render' -l spans -d 'Print the message-content byte ranges'
complete -c kvchat -n $main -f -a serve -d 'OpenAI-compatible HTTP server'

complete -c kvchat -n '__fish_seen_subcommand_from models' -f -l json -d 'One JSON object per model'
complete -c kvchat -n '__fish_seen_subcommand_from list' -f -l json -d 'JSON output'
complete -c kvchat -n '__fish_seen_subcommand_from list' -f -l ids -d 'Session ids only'
complete -c kvchat -n '__fish_seen_subcommand_from list export import rm check' -l db -r -F -d 'Conversation database'
complete -c kvchat -n '__fish_seen_subcommand_from export rm' -f -a '(__kvchat_sessions)' -d 'Session id'
complete -c kvchat -n '__fish_seen_subcommand_from export' -f -a last -d 'The most recent conversation'
complete -c kvchat -n '__fish_seen_subcommand_from export' -l format -x -a 'md json' -d 'Markdown or JSON'
complete -c kvchat -n '__fish_seen_subcommand_from export' -s o -r -F -d 'Output file'
complete -c kvchat -n '__fish_seen_subcommand_from import' -F
complete -c kvchat -n '__fish_seen_subcommand_from bench tokenize serve' -s m -l model -r -f -a '(__kvchat_models)' -d 'GGUF model'
complete -c kvchat -n '__fish_seen_subcommand_from bench' -s p -l n-prompt -x -d 'Prompt tokens'
complete -c kvchat -n '__fish_seen_subcommand_from bench' -s n -l n-gen -x -d 'Generated tokens'
complete -c kvchat -n '__fish_seen_subcommand_from bench' -s t -l threads -x -d 'Threads'
complete -c kvchat -n '__fish_seen_subcommand_from bench' -s d -l n-depth -x -d 'Tokens in the KV cache before each test'
complete -c kvchat -n '__fish_seen_subcommand_from bench' -s r -l repetitions -x -d 'Timed runs per test'
complete -c kvchat -n '__fish_seen_subcommand_from bench' -l json -d 'JSON output'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l shape -x -a 'tinyllama llama3.2-1b qwen2.5-0.5b tiny qwen3-0.6b smollm3-3b granite-3-2b olmo2-1b gemma2-2b gemma3-1b gemma3-4b phi4-mini ministral3-3b internlm2.5-1.8b qwen3-30b-a3b qwen1.5-moe-a2.7b olmoe-1b-7b gpt-oss-20b' -d 'Model shape'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l type -x -a 'f16 q8_0 q4_0 q6_k iq4_nl iq4_xs q4_k_m q5_k_m mxfp4' -d 'Weight type'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -s o -r -F -d 'Output file'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l layers -x -d 'Number of layers'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l seed -x -d 'Random seed'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l vocab -x -d 'Vocabulary size'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l ff -x -d 'Feed-forward width'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l swa -x -d 'Sliding window'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l orig-ctx -x -d 'LongRoPE original context'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l attn-softcap -x -d 'Attention soft-cap'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l chat-template -r -F -d 'Store this chat template'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l yarn -x -d 'YaRN RoPE factor'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l experts -x -d 'Expert count'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l experts-used -x -d 'Experts per token'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l ff-exp -x -d 'Experts width'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l ff-shexp -x -d 'Shared expert width'
complete -c kvchat -n '__fish_seen_subcommand_from gen-model' -l special -x -d 'Control tokens'
complete -c kvchat -n '__fish_seen_subcommand_from tokenize' -l ids -d 'Print the ids as a JSON array'
complete -c kvchat -n '__fish_seen_subcommand_from tokenize' -l no-bos -d 'Do not add the BOS token'
complete -c kvchat -n '__fish_seen_subcommand_from tokenize' -l parse-special -d 'Turn control-token text into those tokens'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l host -x -a '127.0.0.1 ::1 0.0.0.0' -d 'Address to listen on'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l port -x -d 'TCP port'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l parallel -x -d 'Requests decoding together'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l prefill-chunk -x -d 'Prompt tokens a step while others decode'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l no-context-shift -d 'End a request at a full context'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l api-key -x -d 'Required API key'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -s c -l ctx-size -x -d 'Context length in tokens'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -s t -l threads -x -d 'Threads'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -s b -l batch-size -x -d 'Prefill chunk in tokens'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l kv-type -x -a 'f16 q8_0 f32' -d 'KV cache type'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l chat-template -x -d 'Chat template family'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l max-body -x -d 'Largest request body in bytes'
complete -c kvchat -n '__fish_seen_subcommand_from serve' -l store -r -F -d 'Save finished requests as conversations'
complete -c kvchat -n "__fish_seen_subcommand_from $kvchat_cmds" -s h -l help -d 'Show help'
