/* main: command-line parsing and the one-shot / line-by-line modes of kvchat. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#include "app/chat.h"
#include "app/chatstore.h"
#include "app/config.h"
#include "app/linechat.h"
#include "app/models.h"
#include "app/output.h"
#include "app/serve.h"
#include "app/store_cli.h"
#include "app/prompt.h"
#include "app/remote.h"
#include "app/template_cmd.h"
#include "app/tokenize_cmd.h"
#include "app/tools.h"
#include "app/version.h"
#include "engine/chat_template.h"
#include "engine/generate.h"
#include "engine/stop.h"
#include "engine/logprob.h"
#include "engine/speculate.h"
#include "app/decode_cmd.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/quant.h"

#ifndef KVCHAT_DATADIR
#define KVCHAT_DATADIR "/usr/local/share/kvchat"
#endif

/* Exit status (documented in kvchat(1)). */
enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_MODEL = 3, EXIT_DB = 4 };

typedef struct cli {
    engine_params ep;
    sampler_params sp;
    const char *prompt;
    int n_predict;
    int stats;
    int no_bos;
    int interactive;
    const char *theme;
    int no_mouse;
    int no_markdown;
    const char *chat_template;
    const char *system;      /* --system (else the config's system): new chats' system prompt */
    int system_cli;          /* it came from --system */
    const char *stops[STOP_MAX_STRINGS];   /* --stop, repeatable */
    int n_stops;
    const char *db;          /* --db (else the config's db / KVCHAT_DB, else the default) */
    const char *cache_size;  /* --cache-size */
    const char *resume;      /* --resume [ID|last]: "last" or an ID; NULL: a new chat */
    spec_params spec;        /* --lookup / --draft MODEL, --draft-max, --draft-min-p (the settings table) */
    const char *draft_path;  /* --draft MODEL */
    int top_logprobs;        /* --top-logprobs K */
    int beams;               /* --beams N */
    float length_penalty;    /* --length-penalty A */
    int best_of;             /* --best-of N */
    const char *remote;      /* --remote URL (else [remote] url without -m): the replies come from a server */
    const char *remote_model;/* with it: -m/--model NAME, else [remote] model */
} cli;

static volatile sig_atomic_t g_interrupted;

/* Settings below the command line (defaults < config file < environment; app/config.c), and
 * the output mode of the one-shot completion (--json: JSON lines, app/output.c). */
static kv_config g_config;
static int g_json, g_print_config;
static json_out g_jout;
enum { OPT_JSON = 1100, OPT_PRINT_CONFIG };
enum { OPT_KEEP = 1200, OPT_TRUNCATE_PROMPT, OPT_NO_CONTEXT_SHIFT, OPT_SWA_FULL }; /* KV cache / context options */
enum { OPT_DB = 1300, OPT_RESUME, OPT_CACHE_SIZE };                  /* the conversation store */
enum { OPT_LOOKUP = 1400, OPT_DRAFT, OPT_DRAFT_MAX, OPT_DRAFT_MIN_P, OPT_TOP_LOGPROBS, OPT_BEAMS, OPT_LENGTH_PENALTY,
       OPT_BEST_OF };                                                 /* decoding (engine/speculate.h, app/decode_cmd.c) */
enum { OPT_REMOTE = 1500, OPT_API_KEY, OPT_REMOTE_TIMEOUT };         /* the chat on a server (app/remote.h) */

static void on_sigint(int sig)
{
    (void)sig;
    g_interrupted = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: kvchat [OPTION]... [-m MODEL] [-p PROMPT]\n"
            "  or:  kvchat COMMAND [ARG]...\n"
            "Chat with a local GGUF language model, or complete a prompt (one-shot).\n"
            "\n"
            "With -p (or a prompt on standard input) kvchat prints the prompt and its\n"
            "continuation, token by token, and exits. Without a prompt on a terminal it\n"
            "opens the full-screen chat (F1 there lists every key and /command).\n"
            "\n"
            "Mandatory arguments to long options are mandatory for short options too.\n"
            "\n"
            "Model and context:\n"
            "  -m, --model PATH|NAME    GGUF model file, or NAME(.gguf) in the models directory\n"
            "                           (env KVCHAT_MODEL; see 'kvchat models')\n"
            "  -c, --ctx-size N         context length in tokens (default: the model's, capped to fit\n"
            "                           half of the available memory)\n"
            "  -b, --batch-size N       prefill chunk in tokens (default 512)\n"
            "  -t, --threads N          threads (default: all CPUs)\n"
            "      --kv-type TYPE       KV cache type: f16 (default), q8_0 (half the memory) or f32\n"
            "      --keep N             when the context is full, keep the first N tokens (at least 4)\n"
            "                           and drop the older half of the rest (context shift)\n"
            "      --no-context-shift   stop when the context is full instead\n"
            "      --swa-full           sliding-window layers (Gemma 2/3, gpt-oss) keep every position,\n"
            "                           not only their window (more memory; rewinds never recompute)\n"
            "      --truncate-prompt    cut a prompt longer than the context (with a warning) instead\n"
            "                           of refusing it\n"
            "Generation:\n"
            "  -p, --prompt TEXT        prompt text\n"
            "  -n, --n-predict N        tokens to generate (default -1: until end of text or full context)\n"
            "      --stop STR           end the reply where STR appears; STR is never printed (repeatable, up to 16)\n"
            "      --no-bos             do not add the BOS token\n"
            "Sampling (defaults as llama.cpp):\n"
            "      --temp T             temperature, 0 = greedy (default 0.8)\n"
            "      --top-k N            keep the N most likely tokens, 0 = off (default 40)\n"
            "      --top-p P            nucleus sampling, 1 = off (default 0.95)\n"
            "      --min-p P            drop tokens below P x the top probability, 0 = off (default 0.05)\n"
            "      --repeat-penalty F   penalise repeated tokens, 1 = off (default 1.0)\n"
            "      --repeat-last-n N    tokens the penalties look back on (default 64)\n"
            "      --presence-penalty F, --frequency-penalty F   (default 0 = off)\n"
            "      --seed N             random seed, 0 .. 2^64-2 (default: random; --stats and --json say which)\n"
            "Decoding:\n"
            "      --lookup             speculative decoding with drafts from n-grams of the prompt and reply\n"
            "                           (prompt lookup; = --draft lookup)\n"
            "      --draft MODEL        speculative decoding with a draft model of the same vocabulary\n"
            "                           (or lookup, or off)\n"
            "      --draft-max N        tokens drafted per verification pass, 1..32 (default 8)\n"
            "      --draft-min-p P      stop drafting where the draft model's top probability is below P (default 0.5)\n"
            "      --beams N            beam search with N beams (one-shot; 2..16), prints the best beam and its score\n"
            "      --length-penalty A   beam score = sum of log-probs / length^A (default 1)\n"
            "      --best-of N          N samples from one prefill (2..16), prints the one of highest mean log-prob\n"
            "Remote (the chat, or -p, on an OpenAI-compatible server: kvchat serve, llama-server, vLLM, ollama):\n"
            "      --remote URL         stream replies from URL/v1/chat/completions instead of a local model\n"
            "                           (-m NAME then names the server's model; default: its first)\n"
            "      --api-key KEY        send \"Authorization: Bearer KEY\" (env KVCHAT_REMOTE_API_KEY)\n"
            "      --remote-timeout S   a server silent for S seconds fails the reply (default 120)\n"
            "Chat screen (no prompt, on a terminal):\n"
            "      --theme NAME         colour theme: default, light, solarized-dark, high-contrast, mono,\n"
            "                           or a file path; searched in $XDG_CONFIG_HOME/kvchat/themes,\n"
            "                           then " KVCHAT_DATADIR "/themes, then themes/ next to\n"
            "                           the binary (NO_COLOR set: no colours)\n"
            "      --no-markdown        show replies as plain text, not rendered Markdown\n"
            "      --no-mouse           leave the mouse to the terminal (no wheel scrolling)\n"
            "      --system TEXT        the system prompt of new conversations (/set system changes it)\n"
            "      --db PATH            the conversation database (env KVCHAT_DB; default\n"
            "                           $XDG_DATA_HOME/kvchat/kvchat.db, i.e. ~/.local/share/kvchat/kvchat.db)\n"
            "      --resume [ID|last]   reopen a saved conversation and its KV cache (without -m: with\n"
            "                           the model it was saved with)\n"
            "      --cache-size MIB     budget of the KV prefix store in MiB (default 1024; 0 = off;\n"
            "                           or a size: 512M, 2G); least recently used prefixes go first\n"
            "      --chat-template NAME use this template family (chatml, llama3, ...; none = completion\n"
            "                           mode) or Jinja template file (a path, or NAME.jinja) instead of\n"
            "                           the model's own tokenizer.chat_template\n"
            "                           (-n sets the max tokens per reply; TERM=dumb: a line-by-line session)\n"
            "Output:\n"
            "      --stats              print timings (TTFT, prefill and decode tokens/s) to stderr\n"
            "      --json               one-shot output as JSON lines: {\"token\": ID, \"text\": \"...\", \"logprob\": L}\n"
            "                           per sampled token, then one object with the finish reason and timings\n"
            "      --top-logprobs K     --json lines also list the K most likely tokens, 0..20 (default 0)\n"
            "      --print-config       show every setting, its value and where it came from, and exit\n"
            "  -h, --help               show this help and exit\n"
            "  -V, --version            show version and build information and exit\n"
            "\n"
            "Commands (kvchat COMMAND --help for each):\n"
            "  models                   list the models directory (name, size, architecture, type, context)\n"
            "  themes                   list the colour themes and their files\n"
            "  bench                    measure prefill and decode speed (llama-bench style)\n"
            "  gen-model                write a model of a real shape with random weights\n"
            "  tokenize                 show how text is tokenized\n"
            "  template-render          render a Jinja chat template with a JSON context\n"
            "  serve                    an OpenAI-compatible HTTP server on the model (/v1/chat/completions)\n"
            "  list                     the saved conversations (--json, --ids)\n"
            "  export ID|last           a conversation as Markdown or JSON (--format md|json, -o FILE)\n"
            "  import FILE              a JSON export, as a new conversation\n"
            "  rm ID...                 delete saved conversations\n"
            "  check                    check the conversation database (integrity, checksums)\n"
            "\n"
            "Settings also come from the environment and $XDG_CONFIG_HOME/kvchat/config.ini;\n"
            "the command line wins over the environment, which wins over the file (kvchat.conf(5)).\n"
            "\n"
            "Exit status:\n"
            "  0    ok\n"
            "  1    runtime error\n"
            "  2    usage error (bad option or value, no model given)\n"
            "  3    model error (missing, unreadable, corrupt or unsupported model file)\n"
            "  4    database error\n"
            "  141  the reader of the output went away (SIGPIPE ends kvchat quietly)\n"
            "\n"
            "Examples:\n"
            "  kvchat -m stories260K.gguf -p \"Once upon a time\" -n 128 --temp 0\n"
            "  echo \"Why is the sky blue?\" | kvchat -m qwen2.5-0.5b-instruct-q4_k_m --json\n"
            "  kvchat -m stories260K           # the full-screen chat\n"
            "\n"
            "Full documentation: man kvchat\n");
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "kvchat: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'kvchat --help' for more information.\n");
    return EXIT_USAGE;
}

static int parse_int(const char *s, const char *opt, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == 0 || *end != 0 || v < lo || v > hi) {
        fprintf(stderr, "kvchat: invalid value '%s' for %s (an integer from %ld to %ld)\n", s, opt, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}


/* Warnings of config.ini and the environment: kept until the mode is known, then shown in the
 * chat (the full screen would hide stderr until it quits) or printed to stderr. */
#define MAX_CFG_WARNINGS 16
static char *g_warn[MAX_CFG_WARNINGS];
static int g_n_warn, g_warn_dropped;

static void keep_warning(void *ud, const char *msg)
{
    (void)ud;
    if (g_n_warn < MAX_CFG_WARNINGS && (g_warn[g_n_warn] = strdup(msg))) g_n_warn++;
    else g_warn_dropped++;
}

static void print_warnings(void)
{
    for (int i = 0; i < g_n_warn; i++) fprintf(stderr, "kvchat: %s\n", g_warn[i]);
    if (g_warn_dropped) fprintf(stderr, "kvchat: %d more config warnings\n", g_warn_dropped);
    for (int i = 0; i < g_n_warn; i++) free(g_warn[i]);
    g_n_warn = g_warn_dropped = 0;
}

/* An option that sets a key of the settings table (app/config.c keys[]): its value is checked
 * against the table's range, the same rule as config.ini and /set. 0, or -1 (message printed). */
static int table_option(const struct option *opts, int val, const char *arg)
{
    const char *name = NULL;
    for (const struct option *o = opts; o->name && !name; o++)
        if (!o->flag && o->val == val) name = o->name;
    int key = name ? config_key_from_name(name) : -1;
    for (int k = 0; k < CFG_COUNT && key < 0 && name; k++)
        if (config_key_option(k) && !strcmp(config_key_option(k), name)) key = k;
    char out[1100], why[600];
    if (key < 0 || config_check(key, arg, out, sizeof out, why, sizeof why)) {
        fprintf(stderr, "kvchat: invalid value for --%s: %s\nTry 'kvchat --help' for more information.\n",
                name ? name : "?", key < 0 ? "not a setting" : why);
        return -1;
    }
    return 0;
}

enum {
    OPT_TEMP = 1000, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT_PENALTY, OPT_REPEAT_LAST_N, OPT_PRESENCE,
    OPT_FREQUENCY, OPT_SEED, OPT_STATS, OPT_KV_TYPE, OPT_NO_BOS, OPT_THEME, OPT_NO_MOUSE, OPT_CHAT_TEMPLATE,
    OPT_STOP, OPT_SYSTEM, OPT_NO_MARKDOWN,
};

/* "N" in [lo, hi] → *out, else a usage error (-1, message printed). */
static int parse_float(const char *s, const char *opt, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !*s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kvchat: invalid value '%s' for %s (a number from %g to %g)\n", s, opt, lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

static int parse_args(int argc, char **argv, cli *c)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},        {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'},    {"ctx-size", required_argument, 0, 'c'},
        {"batch-size", required_argument, 0, 'b'},   {"threads", required_argument, 0, 't'},
        {"temp", required_argument, 0, OPT_TEMP},    {"top-k", required_argument, 0, OPT_TOP_K},
        {"top-p", required_argument, 0, OPT_TOP_P},  {"min-p", required_argument, 0, OPT_MIN_P},
        {"repeat-penalty", required_argument, 0, OPT_REPEAT_PENALTY},
        {"repeat-last-n", required_argument, 0, OPT_REPEAT_LAST_N},
        {"presence-penalty", required_argument, 0, OPT_PRESENCE},
        {"frequency-penalty", required_argument, 0, OPT_FREQUENCY},
        {"seed", required_argument, 0, OPT_SEED},    {"stats", no_argument, 0, OPT_STATS},
        {"kv-type", required_argument, 0, OPT_KV_TYPE}, {"no-bos", no_argument, 0, OPT_NO_BOS},
        {"keep", required_argument, 0, OPT_KEEP},    {"truncate-prompt", no_argument, 0, OPT_TRUNCATE_PROMPT},
        {"no-context-shift", no_argument, 0, OPT_NO_CONTEXT_SHIFT},
        {"swa-full", no_argument, 0, OPT_SWA_FULL},
        {"help", no_argument, 0, 'h'},               {"version", no_argument, 0, 'V'},
        {"theme", required_argument, 0, OPT_THEME},  {"no-mouse", no_argument, 0, OPT_NO_MOUSE},
        {"no-markdown", no_argument, 0, OPT_NO_MARKDOWN},
        {"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE},
        {"stop", required_argument, 0, OPT_STOP},   {"system", required_argument, 0, OPT_SYSTEM},
        {"json", no_argument, 0, OPT_JSON},          {"print-config", no_argument, 0, OPT_PRINT_CONFIG},
        {"db", required_argument, 0, OPT_DB},        {"resume", optional_argument, 0, OPT_RESUME},
        {"cache-size", required_argument, 0, OPT_CACHE_SIZE},
        {"lookup", no_argument, 0, OPT_LOOKUP},      {"draft", required_argument, 0, OPT_DRAFT},
        {"draft-max", required_argument, 0, OPT_DRAFT_MAX}, {"draft-min-p", required_argument, 0, OPT_DRAFT_MIN_P},
        {"top-logprobs", required_argument, 0, OPT_TOP_LOGPROBS}, {"beams", required_argument, 0, OPT_BEAMS},
        {"length-penalty", required_argument, 0, OPT_LENGTH_PENALTY}, {"best-of", required_argument, 0, OPT_BEST_OF},
        {"remote", required_argument, 0, OPT_REMOTE}, {"api-key", required_argument, 0, OPT_API_KEY},
        {"remote-timeout", required_argument, 0, OPT_REMOTE_TIMEOUT},
        {0, 0, 0, 0},
    };
    engine_params_default(&c->ep);
    sampler_params_default(&c->sp);
    c->n_predict = -1;
    c->length_penalty = 1.0f;
    /* under the command line: built-in defaults < config file < environment (app/config.c) */
    config_load_all(&g_config, keep_warning, NULL);
    config_apply(&g_config, &c->ep, &c->sp, &c->n_predict);
    c->theme = config_get(&g_config, CFG_THEME);
    c->chat_template = config_get(&g_config, CFG_CHAT_TEMPLATE);
    c->system = config_get(&g_config, CFG_SYSTEM);
    c->no_mouse = !config_parse_bool(config_get(&g_config, CFG_MOUSE));
    c->no_markdown = !config_parse_bool(config_get(&g_config, CFG_MARKDOWN));
    opterr = 0;
    int o, idx;
    while ((o = getopt_long(argc, argv, ":m:p:n:c:b:t:hV", opts, &idx)) != -1) {
        switch (o) {
        case 'm': c->ep.model_path = optarg; break;
        case 'p': c->prompt = optarg; break;
        case 'n': case 'c': case 'b': case 't': case OPT_TEMP: case OPT_TOP_K: case OPT_TOP_P: case OPT_MIN_P:
        case OPT_REPEAT_PENALTY: case OPT_REPEAT_LAST_N: case OPT_PRESENCE: case OPT_FREQUENCY: case OPT_SEED:
        case OPT_DRAFT: case OPT_DRAFT_MAX: case OPT_DRAFT_MIN_P:
            if (table_option(opts, o, optarg)) return EXIT_USAGE; /* applied after the loop */
            break;
        case OPT_LOOKUP: break; /* config_note_getopt records draft = lookup */
        case OPT_TOP_LOGPROBS:
            if (parse_int(optarg, "--top-logprobs", 0, LOGPROB_MAX_TOP, &c->top_logprobs)) return EXIT_USAGE;
            break;
        case OPT_BEAMS: if (parse_int(optarg, "--beams", 1, DECODE_MAX_N, &c->beams)) return EXIT_USAGE; break;
        case OPT_BEST_OF: if (parse_int(optarg, "--best-of", 1, DECODE_MAX_N, &c->best_of)) return EXIT_USAGE; break;
        case OPT_LENGTH_PENALTY:
            if (parse_float(optarg, "--length-penalty", -10, 10, &c->length_penalty)) return EXIT_USAGE;
            break;
        case OPT_STATS: c->stats = 1; break;
        case OPT_REMOTE:
            if (strncasecmp(optarg, "http://", 7) && strncasecmp(optarg, "https://", 8))
                return usage_error("invalid --remote '%s' (an http:// or https:// URL, e.g. http://127.0.0.1:8080)", optarg);
            break;
        case OPT_API_KEY: break; /* the table holds it (config_note_getopt) */
        case OPT_REMOTE_TIMEOUT:
            if (table_option(opts, o, optarg)) return EXIT_USAGE;
            break;
        case OPT_NO_BOS: c->no_bos = 1; break;
        case OPT_STOP:
            if (c->n_stops == STOP_MAX_STRINGS || !*optarg || strlen(optarg) >= STOP_MAX_LEN)
                return usage_error("invalid --stop '%s' (1 to 255 bytes, at most 16 stop strings)", optarg);
            c->stops[c->n_stops++] = optarg;
            break;
        case OPT_THEME: c->theme = optarg; break;
        case OPT_NO_MOUSE: c->no_mouse = 1; break;
        case OPT_NO_MARKDOWN: c->no_markdown = 1; break;
        case OPT_CHAT_TEMPLATE:
            if (chat_template_from_name(optarg) < 0 && !prompt_is_template_file(optarg)) {
                fprintf(stderr, "kvchat: unknown --chat-template '%s' (one of: none, %s; or a .jinja file)\n", optarg,
                        chat_template_names());
                return EXIT_USAGE;
            }
            c->chat_template = optarg;
            break;
        case OPT_SYSTEM:
            c->system = optarg;
            c->system_cli = 1;
            break;
        case OPT_KV_TYPE:
            if ((c->ep.kv_type = engine_kv_type_from_name(optarg)) < 0)
                return usage_error("invalid --kv-type '%s' (f16, q8_0 or f32)", optarg);
            break;
        case OPT_KEEP: if (parse_int(optarg, "--keep", 0, 1 << 20, &c->ep.n_keep)) return EXIT_USAGE; break;
        case OPT_TRUNCATE_PROMPT: c->ep.truncate_prompt = 1; break;
        case OPT_NO_CONTEXT_SHIFT: c->ep.no_context_shift = 1; break;
        case OPT_SWA_FULL: c->ep.kv_swa_full = 1; break;
        case OPT_JSON: g_json = 1; break;
        case OPT_PRINT_CONFIG: g_print_config = 1; break;
        case OPT_DB:
            if (!*optarg) return usage_error("%s needs a path", "--db");
            c->db = optarg;
            break;
        case OPT_RESUME: /* --resume, --resume=ID, --resume ID, --resume last */
            if (!optarg && optind < argc &&
                (!strcmp(argv[optind], "last") || strspn(argv[optind], "0123456789") == strlen(argv[optind])))
                optarg = argv[optind++];
            c->resume = optarg ? optarg : "last";
            break;
        case OPT_CACHE_SIZE: {
            uint64_t b;
            if (chatstore_parse_cache_size(optarg, &b))
                return usage_error("invalid --cache-size '%s' (MiB, or a size such as 512M or 2G; 0 turns the KV store off)", optarg);
            c->cache_size = optarg;
            break;
        }
        case 'h': usage(stdout); exit(EXIT_OK);
        case 'V': version_print(stdout); exit(EXIT_OK);
        case ':': return usage_error("option '%s' needs a value", argv[optind - 1]);
        default: return usage_error("unknown option '%s'", argv[optind - 1]);
        }
        config_note_getopt(&g_config, opts, o, optarg); /* for --print-config */
    }
    if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
    /* the settings of the one table, resolved: command line > environment > file > default */
    {
        const char *model_cli = c->ep.model_path;
        config_apply(&g_config, &c->ep, &c->sp, &c->n_predict);
        if (model_cli) c->ep.model_path = model_cli;
    }
    /* speculative decoding: draft = off | lookup | a model path (the settings table) */
    spec_params_default(&c->spec);
    {
        const char *d = config_get(&g_config, CFG_DRAFT);
        c->spec.mode = !d || !strcmp(d, "off") ? SPEC_OFF : !strcmp(d, "lookup") ? SPEC_LOOKUP : SPEC_DRAFT;
        if (c->spec.mode == SPEC_DRAFT) c->draft_path = d;
        c->spec.draft_max = atoi(config_get(&g_config, CFG_DRAFT_MAX));
        c->spec.draft_min_p = (float)atof(config_get(&g_config, CFG_DRAFT_MIN_P));
    }
    if (c->beams > 1 && c->best_of > 1) return usage_error("%s: choose one of --beams and --best-of", "--beams");
    if ((c->beams > 1 || c->best_of > 1) && c->spec.mode != SPEC_OFF)
        return usage_error("%s: speculative decoding works with plain decoding only, not --beams / --best-of",
                           c->spec.mode == SPEC_LOOKUP ? "--lookup" : "--draft");
    kv_error err = {0};
    if (sampler_params_validate(&c->sp, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        return EXIT_USAGE;
    }
    /* a server instead of a model: --remote, or [remote] url unless -m names a local model */
    {
        const cfg_value *ru = &g_config.v[CFG_REMOTE_URL];
        int model_on_cli = g_config.v[CFG_MODEL].source == CFG_SRC_CLI;
        if (ru->value && (ru->source == CFG_SRC_CLI || !model_on_cli)) {
            c->remote = ru->value;
            c->remote_model = model_on_cli ? c->ep.model_path : config_get(&g_config, CFG_REMOTE_MODEL);
            if (g_print_config) {
                print_warnings();
                config_print(&g_config, stdout, NULL);
                exit(EXIT_OK);
            }
            return -1;
        }
    }
    /* -m NAME: a bare name is looked up in the models directory (app/models.c) */
    static char model_path[4096];
    int found = c->ep.model_path ? models_resolve(c->ep.model_path, model_path, sizeof model_path) : 0;
    if (g_print_config) {
        print_warnings();
        config_print(&g_config, stdout, found > 0 ? model_path : NULL);
        exit(EXIT_OK);
    }
    if (!c->ep.model_path && c->resume) { /* --resume alone: the model the conversation was with */
        char db[4096], why[900];
        if (chatstore_db_path(c->db ? c->db : config_get(&g_config, CFG_DB), 0, db, sizeof db, why, sizeof why) ||
            chatstore_resume_model(db, c->resume, model_path, sizeof model_path, why, sizeof why)) {
            fprintf(stderr, "kvchat: --resume: %s\n", why);
            return EXIT_DB;
        }
        c->ep.model_path = model_path;
        found = 0;
    }
    if (!c->ep.model_path) {
        models_print_no_model(stderr);
        return EXIT_USAGE;
    }
    if (found < 0) {
        fprintf(stderr, "kvchat: %s\n", model_path);
        return EXIT_MODEL;
    }
    c->ep.model_path = model_path;
    return -1;
}

/* Reads all of stdin; NULL on error. */
static char *read_stdin(void)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    size_t r;
    while ((r = fread(buf + n, 1, cap - n - 1, stdin)) > 0) {
        n += r;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); return NULL; }
            buf = nb;
            cap *= 2;
        }
    }
    buf[n] = 0;
    return buf;
}

/* One-shot output: text goes through the stop-string matcher (ud), so a stop string is
 * never printed, even partly; returns 1 (end generation) once one has appeared. */
typedef struct oneshot_out {
    stop_matcher sm;
    plain_out po;         /* stdout, control characters neutralised (app/output.h) */
    const char *prompt;   /* echoed before the first generated text, once the prompt is accepted */
    /* --json: one line per sampled token, written when the next one is sampled (or at the end),
     * with the text its sampling released (possibly none: a partial character, a BOS) */
    engine *e;
    int top_logprobs;
    int pending;          /* a token waits for its text */
    int32_t tok;
    int eog;
    token_logprob lp;
    char *text;
    size_t n_text, cap_text;
} oneshot_out;

static void json_flush_pending(oneshot_out *o)
{
    if (!o->pending) return;
    json_out_token_lp(&g_jout, o->tok, o->text, o->n_text, &o->lp, o->eog, engine_tokenizer(o->e));
    o->pending = 0;
    o->n_text = 0;
}

static void on_token(void *ud, int32_t token, int is_eog)
{
    oneshot_out *o = ud;
    json_flush_pending(o);
    o->pending = 1;
    o->tok = token;
    o->eog = is_eog;
    logprob_token(engine_token_logits(o->e), engine_model(o->e)->hp.n_vocab, token, o->top_logprobs, &o->lp);
}

/* Text for the pending token's line (or a line of its own when none is pending). */
static void json_text(oneshot_out *o, const char *t, size_t n)
{
    if (!o->pending) {
        json_out_token(&g_jout, -1, t, n);
        return;
    }
    if (o->n_text + n > o->cap_text) {
        size_t nc = (o->n_text + n) * 2 + 64;
        char *nb = realloc(o->text, nc);
        if (!nb) return;
        o->text = nb;
        o->cap_text = nc;
    }
    memcpy(o->text + o->n_text, t, n);
    o->n_text += n;
}

static void echo_prompt(oneshot_out *o)
{
    if (!o->prompt) return;
    out_plain(stdout, o->prompt, strlen(o->prompt)); /* the prompt is text like the reply: no raw controls */
    fflush(stdout);
    o->prompt = NULL;
}

static int on_text(void *ud, const char *text, size_t len, int32_t token)
{
    (void)token;
    char out[4096 + STOP_MAX_LEN];
    oneshot_out *o = ud;
    stop_matcher *sm = &o->sm;
    echo_prompt(o);
    while (len > 0) {
        size_t chunk = len < 4096 ? len : 4096, n;
        int hit = stop_push(sm, text, chunk, out, &n);
        if (g_json) json_text(o, out, n);                   /* the pending token's JSON line */
        else plain_out_write(&o->po, out, n);               /* control bytes never raw */
        fflush(stdout);
        if (hit) return 2; /* GEN_FINISH_STOP */
        text += chunk;
        len -= chunk;
    }
    return 0;
}

static int should_stop(void *ud)
{
    (void)ud;
    return g_interrupted;
}

/* seed: the sampler's seed (sampler_seed: the random one it picked when --seed was not given),
 * so a run can be repeated with --seed N */
static void print_stats(const gen_stats *st, int finish, uint64_t seed)
{
    if (st->n_verify)
        fprintf(stderr, "\nspeculative: %d drafted, %d accepted (%.1f%%), %d verification passes, %.2f tokens per pass",
                st->n_drafted, st->n_accepted, st->n_drafted ? 100.0 * st->n_accepted / st->n_drafted : 0.0,
                st->n_verify, (double)(st->n_generated - 1) / st->n_verify);
    if (st->draft_stopped)
        fprintf(stderr, "\nspeculative: the draft model took longer per token than a step of the target: drafting "
                        "stopped (it cannot make decoding faster)");
    fprintf(stderr,
            "\nprompt: %d tokens (%d reused, %d prefilled) | TTFT %.1f ms | prefill %.1f t/s | "
            "decode %d tokens, %.1f t/s | ITL mean %.2f ms, max %.2f ms | finish: %s | seed %llu\n",
            st->n_prompt, st->n_reused, st->n_prefilled, st->ttft_ms, st->prefill_tps, st->n_generated,
            st->decode_tps, st->itl_ms_mean, st->itl_ms_max, gen_finish_name(finish), (unsigned long long)seed);
}

static int run_prompt(engine *e, sampler *s, const char *text, const cli *c, int print_prompt)
{
    kv_error err = {0};
    int32_t *toks = NULL;
    size_t n = 0;
    if (engine_tokenize(e, text, strlen(text), c->no_bos, 0, &toks, &n, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        return EXIT_RUNTIME;
    }
    oneshot_out o = {.prompt = print_prompt && !g_json ? text : NULL, .po = {.f = stdout}, .e = e,
                     .top_logprobs = c->top_logprobs};
    json_out_init(&g_jout, stdout);
    json_out_set_seed(&g_jout, sampler_seed(s));
    g_jout.top_logprobs = c->top_logprobs;
    stop_init(&o.sm, c->stops, c->n_stops);
    gen_callbacks cb = {.on_text = on_text, .should_stop = should_stop, .ud = &o};
    if (g_json) cb.on_token = on_token;
    gen_stats st;
    int finish;
    gen_opts go;
    engine_default_opts(e, &go);
    go.n_predict = c->n_predict;
    if (c->spec.mode != SPEC_OFF) go.spec = &c->spec;
    int rc;
    if (c->beams > 1 || c->best_of > 1) {
        decode_opts dop = {.beams = c->beams, .best_of = c->best_of, .length_penalty = c->length_penalty,
                           .n_predict = c->n_predict, .json = g_json, .top_logprobs = c->top_logprobs,
                           .prompt_text = print_prompt && !g_json ? text : NULL};
        rc = decode_oneshot(e, s, toks, n, &dop, &g_jout, &st, &finish, &err);
        if (!rc && !g_json) o.prompt = NULL; /* decode_oneshot printed prompt and reply */
    } else {
        rc = engine_generate_seq(e, ENGINE_SEQ_DEFAULT, toks, n, &go, s, &cb, &st, &finish, &err);
    }
    free(toks);
    if (g_json) json_flush_pending(&o);
    free(o.text);
    if (rc) {
        plain_out_flush(&o.po);
        fprintf(stderr, "%skvchat: %s\n", o.prompt || g_json ? "" : "\n", err.msg);
        if (g_json) json_out_done(&g_jout, NULL, GEN_FINISH_ERROR, err.msg);
        return EXIT_RUNTIME;
    }
    echo_prompt(&o);
    char tail[STOP_MAX_LEN];
    size_t n_tail = stop_flush(&o.sm, tail);
    if (g_json) {
        if (n_tail) json_out_token(&g_jout, -1, tail, n_tail);
        json_out_done(&g_jout, &st, finish, NULL);
    } else {
        plain_out_write(&o.po, tail, n_tail);
        plain_out_flush(&o.po);
    }
    if (finish == GEN_FINISH_CONTEXT && st.n_generated >= engine_n_ctx(e))
        fprintf(stderr, "\nkvchat: stopped after %d tokens, a whole context's worth; use -n to ask for more\n",
                st.n_generated);
    else if (finish == GEN_FINISH_CONTEXT)
        fprintf(stderr, "\nkvchat: the context is full (%d tokens); use -c to raise it\n", engine_n_ctx(e));
    if (c->ep.n_keep > st.n_keep && (st.n_shifts || st.n_truncated))
        fprintf(stderr, "\nkvchat: warning: --keep %d is more than 3/4 of the context (%d): kept the first %d\n",
                c->ep.n_keep, engine_n_ctx(e), st.n_keep);
    if (st.n_truncated)
        fprintf(stderr, "\nkvchat: warning: the prompt (%d tokens) did not fit the context of %d: dropped %d tokens after "
                "its first %d\n", st.n_prompt, engine_n_ctx(e), st.n_truncated, st.n_keep);
    if (c->stats) print_stats(&st, finish, sampler_seed(s));
    if (c->stats && st.n_shifts)
        fprintf(stderr, "context shifts: %d (dropped %d positions, kept the first %d)\n", st.n_shifts, st.n_discarded,
                st.n_keep);
    return EXIT_OK;
}

/* --remote: the one-shot prompt or the full-screen chat on a server (no engine is loaded). */
static int run_remote(const cli *c, int full_screen)
{
    remote_options ro = {.url = c->remote, .api_key = config_get(&g_config, CFG_REMOTE_API_KEY),
                         .model = c->remote_model, .timeout_s = strtod(config_get(&g_config, CFG_REMOTE_TIMEOUT), NULL)};
    if (c->cache_size) keep_warning(NULL, "--cache-size: the KV prefix store is local-only; a --remote chat does not use it");
    if (c->prompt) return remote_oneshot(&ro, c->prompt, &c->sp, c->n_predict, c->stops, c->n_stops, c->stats, g_json,
                                         &g_interrupted);
    if (!full_screen) {
        fprintf(stderr, "kvchat: --remote needs a terminal for the chat, or a prompt (-p TEXT, or text on standard "
                        "input); the line-by-line session runs on a local model only\n");
        return EXIT_USAGE;
    }
    char db_path[4096], why[900];
    int have_db = !chatstore_db_path(c->db ? c->db : config_get(&g_config, CFG_DB), 1, db_path, sizeof db_path, why,
                                     sizeof why);
    if (!have_db) fprintf(stderr, "kvchat: conversations will not be saved: %s\n", why);
    chat_options co = {.theme = c->theme, .n_predict = c->n_predict, .mouse = !c->no_mouse, .markdown = !c->no_markdown,
                       .resume = c->resume, .stops = c->stops, .n_stops = c->n_stops, .system = c->system,
                       .warnings = (const char *const *)g_warn, .n_warnings = g_n_warn,
                       .remote_url = ro.url, .remote_api_key = ro.api_key, .remote_model = ro.model,
                       .remote_timeout_s = ro.timeout_s, .sp = &c->sp};
    if (have_db) co.db_path = db_path;
    int rc = chat_run(NULL, NULL, &co);
    if (rc == 1) print_warnings();
    for (int i = 0; i < g_n_warn; i++) free(g_warn[i]);
    g_n_warn = 0;
    return rc;
}

int main(int argc, char **argv)
{
    /* a KVCHAT_ISA the kernels cannot honour is said once, before anything runs */
    if (kern_warning() && !(argc > 1 && !strcmp(argv[1], "--version"))) fprintf(stderr, "kvchat: %s\n", kern_warning());
    /* subcommands: speed measurement and synthetic benchmark models (app/bench.c, app/gen_model.c) */
    if (argc > 1 && !strcmp(argv[1], "bench")) return bench_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "gen-model")) return gen_model_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "tokenize")) return tokenize_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "template-render")) return template_main(argc - 1, argv + 1);
    /* the OpenAI-compatible HTTP server (app/serve.c) */
    if (argc > 1 && !strcmp(argv[1], "serve")) return serve_main(argc - 1, argv + 1);
    /* the models directory and the themes found (app/models.c) */
    if (argc > 1 && !strcmp(argv[1], "models")) return models_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "themes")) return themes_main(argc - 1, argv + 1);
    /* the conversation database: list, export, import, rm, check (app/store_cli.c) */
    if (argc > 1 && store_cli_is_command(argv[1])) return store_cli_main(argc - 1, argv + 1);
    cli c = {0};
    int rc = parse_args(argc, argv, &c);
    const char *term = getenv("TERM");
    int full_screen = !c.prompt && isatty(STDIN_FILENO) && term && *term && strcmp(term, "dumb") && isatty(STDOUT_FILENO);
    if (rc >= 0 || !full_screen) print_warnings(); /* the chat shows them on its screen */
    if (rc >= 0) return rc;
    signal(SIGPIPE, SIG_DFL);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);

    char *stdin_prompt = NULL;
    if (!c.prompt && !isatty(STDIN_FILENO)) {
        if (!(stdin_prompt = read_stdin())) {
            fprintf(stderr, "kvchat: cannot read the prompt from standard input\n");
            return EXIT_RUNTIME;
        }
        size_t l = strlen(stdin_prompt);
        while (l && stdin_prompt[l - 1] == '\n') stdin_prompt[--l] = 0;
        c.prompt = stdin_prompt;
    }
    if (c.prompt && c.system_cli) {
        free(stdin_prompt);
        return usage_error("%s is the chat's system prompt; with a prompt (-p or standard input) the model continues "
                           "the text as it is", "--system");
    }
    if (g_json && !c.prompt) {
        free(stdin_prompt);
        return usage_error("%s needs a prompt (-p TEXT, or text on standard input)", "--json");
    }

    if (c.remote) {
        rc = run_remote(&c, full_screen);
        if (c.prompt && rc == EXIT_OK && isatty(STDOUT_FILENO)) printf("\n");
        free(stdin_prompt);
        return rc;
    }
    kv_error err = {0};
    engine *e = NULL;
    /* The engine's threads inherit a mask without the signals the chat screen handles
     * (resize, quit), so these reach the thread that polls the terminal. */
    sigset_t block, old_mask;
    sigemptyset(&block);
    sigaddset(&block, SIGWINCH);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &block, &old_mask);
    int open_rc = engine_open(&c.ep, &e, &err);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (open_rc) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        free(stdin_prompt);
        return err.code == KV_ERR_NOMEM ? EXIT_RUNTIME : EXIT_MODEL;
    }
    if (engine_notice(e)) fprintf(stderr, "kvchat: %s\n", engine_notice(e));
    /* e.g. a BPE vocab with no tokenizer.ggml.pre: said in every mode, as `kvchat tokenize` does */
    if (tokenizer_warning(engine_tokenizer(e))) fprintf(stderr, "kvchat: warning: %s\n", tokenizer_warning(engine_tokenizer(e)));
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &c.sp, &err);
    if (!s) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        engine_close(e);
        free(stdin_prompt);
        return EXIT_RUNTIME;
    }
    engine *draft = NULL; /* --draft MODEL (engine/speculate.h) */
    if (c.spec.mode == SPEC_DRAFT) {
        if (spec_draft_open(c.draft_path, e, c.ep.n_threads, &draft, &err)) {
            fprintf(stderr, "kvchat: --draft: %s\n", err.msg);
            sampler_free(s);
            engine_close(e);
            free(stdin_prompt);
            return err.code == KV_ERR_NOMEM ? EXIT_RUNTIME : EXIT_MODEL;
        }
        c.spec.draft = draft;
    }
    if (c.prompt)
        rc = run_prompt(e, s, c.prompt, &c, 1);
    else {
        /* the conversation store (app/chatstore.h): --db > config db / KVCHAT_DB > the default */
        char db_path[4096], why[900];
        const char *cs_text = c.cache_size ? c.cache_size : config_get(&g_config, CFG_CACHE_SIZE);
        uint64_t cache_bytes = (uint64_t)CHATSTORE_DEFAULT_CACHE_MIB << 20;
        if (cs_text && chatstore_parse_cache_size(cs_text, &cache_bytes))
            fprintf(stderr, "kvchat: cache_size '%s' is not a size; using %d MiB\n", cs_text, CHATSTORE_DEFAULT_CACHE_MIB);
        int have_db = !chatstore_db_path(c.db ? c.db : config_get(&g_config, CFG_DB), 1, db_path, sizeof db_path, why,
                                         sizeof why);
        if (!have_db) fprintf(stderr, "kvchat: conversations will not be saved: %s\n", why);
        if (!full_screen) { /* no screen to draw on: the line-by-line session */
            linechat_options lo = {.n_predict = c.n_predict, .no_bos = c.no_bos, .stats = c.stats,
                                   .db_path = have_db ? db_path : NULL, .cache_bytes = cache_bytes,
                                   .interrupted = &g_interrupted, .system = c.system, .ep = &c.ep,
                                   .config = &g_config};
            rc = linechat_run(&e, &s, &lo); /* /model may have replaced them */
        } else {
        chat_options co = {.theme = c.theme, .n_predict = c.n_predict, .no_bos = c.no_bos, .mouse = !c.no_mouse,
                           .markdown = !c.no_markdown,
                           .chat_template = c.chat_template, .resume = c.resume,
                           .stops = c.stops, .n_stops = c.n_stops, .system = c.system,
                           .ep = &c.ep, .config = &g_config, .warnings = (const char *const *)g_warn, .n_warnings = g_n_warn,
                           .spec = &c.spec, .draft_path = c.draft_path};
        co.cache_bytes = cache_bytes;
        if (have_db) co.db_path = db_path;
        rc = chat_run(&e, &s, &co); /* /model may have replaced them */
        if (rc == 1) print_warnings(); /* the screen could not start: they were not shown */
        for (int i = 0; i < g_n_warn; i++) free(g_warn[i]);
        g_n_warn = 0;
        }
    }
    if (c.prompt && rc == EXIT_OK && isatty(STDOUT_FILENO)) printf("\n");
    sampler_free(s);
    engine_close(draft);
    engine_close(e);
    free(stdin_prompt);
    return rc;
}
