/* main: command-line parsing and the one-shot / line-by-line modes of kvchat. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#include "app/chat.h"
#include "app/tools.h"
#include "engine/chat_template.h"
#include "engine/generate.h"
#include "engine/quant.h"

#ifndef KVCHAT_DATADIR
#define KVCHAT_DATADIR "/usr/local/share/kvchat"
#endif

/* Exit status (documented in kvchat(1)). */
enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_MODEL = 3 };

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
    const char *chat_template;
} cli;

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    g_interrupted = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: kvchat -m MODEL [-p PROMPT] [OPTION]...\n"
            "Chat with a local GGUF language model, or complete a prompt (one-shot).\n"
            "\n"
            "With -p (or a prompt on standard input) kvchat prints the prompt and its\n"
            "continuation, token by token, and exits. Without a prompt on a terminal it\n"
            "opens the full-screen chat (F1 there lists every key and /command).\n"
            "\n"
            "Model and context:\n"
            "  -m, --model PATH         GGUF model file (env KVCHAT_MODEL)\n"
            "  -c, --ctx-size N         context length in tokens (default: the model's, at most 4096)\n"
            "  -b, --batch-size N       prefill chunk in tokens (default 512)\n"
            "  -t, --threads N          threads (default: all CPUs)\n"
            "      --kv-type TYPE       KV cache type: f16 (default) or f32\n"
            "Generation:\n"
            "  -p, --prompt TEXT        prompt text\n"
            "  -n, --n-predict N        tokens to generate (default -1: until end of text or full context)\n"
            "      --no-bos             do not add the BOS token\n"
            "Sampling (defaults as llama.cpp):\n"
            "      --temp T             temperature, 0 = greedy (default 0.8)\n"
            "      --top-k N            keep the N most likely tokens, 0 = off (default 40)\n"
            "      --top-p P            nucleus sampling, 1 = off (default 0.95)\n"
            "      --min-p P            drop tokens below P x the top probability, 0 = off (default 0.05)\n"
            "      --repeat-penalty F   penalise repeated tokens, 1 = off (default 1.0)\n"
            "      --repeat-last-n N    tokens the penalties look back on (default 64)\n"
            "      --presence-penalty F, --frequency-penalty F   (default 0 = off)\n"
            "      --seed N             random seed (default: random)\n"
            "Chat screen (no prompt, on a terminal):\n"
            "      --theme NAME         colour theme: default, light, solarized-dark, high-contrast, mono,\n"
            "                           or a file path; searched in $XDG_CONFIG_HOME/kvchat/themes,\n"
            "                           then " KVCHAT_DATADIR "/themes, then themes/ next to\n"
            "                           the binary (NO_COLOR set: no colours)\n"
            "      --no-mouse           leave the mouse to the terminal (no wheel scrolling)\n"
            "      --chat-template NAME use this template family (chatml, llama3, ...; none = completion\n"
            "                           mode) instead of the one the model's metadata names\n"
            "                           (-n sets the max tokens per reply; TERM=dumb: a line-by-line session)\n"
            "Output:\n"
            "      --stats              print timings (TTFT, prefill and decode tokens/s) to stderr\n"
            "  -h, --help               show this help and exit\n"
            "  -V, --version            show version and build information and exit\n"
            "\n"
            "Exit status: 0 ok, 1 runtime error, 2 usage error, 3 model error.\n"
            "Example: kvchat -m stories260K.gguf -p \"Once upon a time\" -n 128 --temp 0\n");
}

static void version(void)
{
    printf("kvchat %s\n", KVCHAT_VERSION);
    printf("build: C11, OpenBLAS prefill, SIMD:");
#if defined(__AVX512F__)
    printf(" AVX-512");
#endif
#if defined(__AVX512VNNI__)
    printf(" AVX512-VNNI");
#endif
#if defined(__AVX2__)
    printf(" AVX2");
#endif
#if defined(__FMA__)
    printf(" FMA");
#endif
#if defined(__F16C__)
    printf(" F16C");
#endif
#if !defined(__AVX2__)
    printf(" scalar");
#endif
    printf("\n");
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

static int parse_float(const char *s, const char *opt, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *s == 0 || *end != 0 || v != v) {
        fprintf(stderr, "kvchat: invalid value '%s' for %s (a number)\n", s, opt);
        return -1;
    }
    *out = v;
    return 0;
}

enum {
    OPT_TEMP = 1000, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT_PENALTY, OPT_REPEAT_LAST_N, OPT_PRESENCE,
    OPT_FREQUENCY, OPT_SEED, OPT_STATS, OPT_KV_TYPE, OPT_NO_BOS, OPT_THEME, OPT_NO_MOUSE, OPT_CHAT_TEMPLATE,
};

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
        {"help", no_argument, 0, 'h'},               {"version", no_argument, 0, 'V'},
        {"theme", required_argument, 0, OPT_THEME},  {"no-mouse", no_argument, 0, OPT_NO_MOUSE},
        {"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE},
        {0, 0, 0, 0},
    };
    engine_params_default(&c->ep);
    sampler_params_default(&c->sp);
    c->n_predict = -1;
    c->ep.model_path = getenv("KVCHAT_MODEL");
    opterr = 0;
    int o, idx;
    while ((o = getopt_long(argc, argv, ":m:p:n:c:b:t:hV", opts, &idx)) != -1) {
        switch (o) {
        case 'm': c->ep.model_path = optarg; break;
        case 'p': c->prompt = optarg; break;
        case 'n': if (parse_int(optarg, "-n", -1, INT_MAX, &c->n_predict)) return EXIT_USAGE; break;
        case 'c': if (parse_int(optarg, "-c", 8, 1 << 20, &c->ep.n_ctx)) return EXIT_USAGE; break;
        case 'b': if (parse_int(optarg, "-b", 1, 1 << 16, &c->ep.n_batch)) return EXIT_USAGE; break;
        case 't': if (parse_int(optarg, "-t", 1, 1024, &c->ep.n_threads)) return EXIT_USAGE; break;
        case OPT_TEMP: if (parse_float(optarg, "--temp", &c->sp.temperature)) return EXIT_USAGE; break;
        case OPT_TOP_K: if (parse_int(optarg, "--top-k", 0, INT_MAX, &c->sp.top_k)) return EXIT_USAGE; break;
        case OPT_TOP_P: if (parse_float(optarg, "--top-p", &c->sp.top_p)) return EXIT_USAGE; break;
        case OPT_MIN_P: if (parse_float(optarg, "--min-p", &c->sp.min_p)) return EXIT_USAGE; break;
        case OPT_REPEAT_PENALTY:
            if (parse_float(optarg, "--repeat-penalty", &c->sp.repeat_penalty)) return EXIT_USAGE;
            break;
        case OPT_REPEAT_LAST_N:
            if (parse_int(optarg, "--repeat-last-n", 0, 1 << 20, &c->sp.repeat_last_n)) return EXIT_USAGE;
            break;
        case OPT_PRESENCE:
            if (parse_float(optarg, "--presence-penalty", &c->sp.presence_penalty)) return EXIT_USAGE;
            break;
        case OPT_FREQUENCY:
            if (parse_float(optarg, "--frequency-penalty", &c->sp.frequency_penalty)) return EXIT_USAGE;
            break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno || *optarg == 0 || *optarg == '-' || *end) {
                fprintf(stderr, "kvchat: invalid value '%s' for --seed (a non-negative integer)\n", optarg);
                return EXIT_USAGE;
            }
            c->sp.seed = v;
            break;
        }
        case OPT_STATS: c->stats = 1; break;
        case OPT_NO_BOS: c->no_bos = 1; break;
        case OPT_THEME: c->theme = optarg; break;
        case OPT_NO_MOUSE: c->no_mouse = 1; break;
        case OPT_CHAT_TEMPLATE:
            if (chat_template_from_name(optarg) < 0) {
                fprintf(stderr, "kvchat: unknown --chat-template '%s' (one of: none, %s)\n", optarg, chat_template_names());
                return EXIT_USAGE;
            }
            c->chat_template = optarg;
            break;
        case OPT_KV_TYPE:
            if (strcmp(optarg, "f16") == 0) c->ep.kv_type = GGML_TYPE_F16;
            else if (strcmp(optarg, "f32") == 0) c->ep.kv_type = GGML_TYPE_F32;
            else return usage_error("invalid --kv-type '%s' (f16 or f32)", optarg);
            break;
        case 'h': usage(stdout); exit(EXIT_OK);
        case 'V': version(); exit(EXIT_OK);
        case ':': return usage_error("option '%s' needs a value", argv[optind - 1]);
        default: return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
    kv_error err = {0};
    if (sampler_params_validate(&c->sp, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        return EXIT_USAGE;
    }
    if (!c->ep.model_path) {
        fprintf(stderr,
                "kvchat: no model given. Use -m MODEL.gguf or set KVCHAT_MODEL.\n"
                "Any LLaMA-family GGUF works, e.g. a Q4_K_M or Q8_0 file of TinyLlama, Llama 3.2 or Qwen2.5.\n");
        return EXIT_USAGE;
    }
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

static int on_text(void *ud, const char *text, size_t len, int32_t token)
{
    (void)ud; (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static int should_stop(void *ud)
{
    (void)ud;
    return g_interrupted;
}

static void print_stats(const gen_stats *st, int finish)
{
    fprintf(stderr,
            "\nprompt: %d tokens (%d reused, %d prefilled) | TTFT %.1f ms | prefill %.1f t/s | "
            "decode %d tokens, %.1f t/s | ITL mean %.2f ms, max %.2f ms | finish: %s\n",
            st->n_prompt, st->n_reused, st->n_prefilled, st->ttft_ms, st->prefill_tps, st->n_generated,
            st->decode_tps, st->itl_ms_mean, st->itl_ms_max, gen_finish_name(finish));
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
    if (print_prompt) {
        fputs(text, stdout);
        fflush(stdout);
    }
    gen_callbacks cb = {.on_text = on_text, .should_stop = should_stop};
    gen_stats st;
    int finish;
    int rc = engine_generate(e, toks, n, c->n_predict, s, &cb, &st, &finish, &err);
    free(toks);
    if (rc) {
        fprintf(stderr, "\nkvchat: %s\n", err.msg);
        return EXIT_RUNTIME;
    }
    if (finish == GEN_FINISH_CONTEXT)
        fprintf(stderr, "\nkvchat: the context is full (%d tokens); use -c to raise it\n", engine_n_ctx(e));
    if (c->stats) print_stats(&st, finish);
    return EXIT_OK;
}

typedef struct text_acc {
    char **buf;
    size_t *len, *cap;
} text_acc;

/* Streams generated text to stdout and appends it to the conversation buffer. */
static int append_text(void *ud, const char *text, size_t tl, int32_t token)
{
    text_acc *acc = ud;
    (void)token;
    fwrite(text, 1, tl, stdout);
    fflush(stdout);
    while (*acc->len + tl + 1 > *acc->cap) {
        char *nb = realloc(*acc->buf, *acc->cap * 2);
        if (!nb) return 1;
        *acc->buf = nb;
        *acc->cap *= 2;
    }
    memcpy(*acc->buf + *acc->len, text, tl);
    *acc->len += tl;
    (*acc->buf)[*acc->len] = 0;
    return 0;
}

/* Line-by-line session: each line is appended to the running text, which the model
 * continues (completion mode); the KV cache keeps the conversation, so each turn prefills
 * only its new tokens. */
static int run_interactive(engine *e, sampler *s, const cli *c)
{
    const model *m = engine_model(e);
    printf("kvchat %s — %s (%s, %s), n_ctx %d, %d threads\n", KVCHAT_VERSION, m->name, m->arch_name,
           quant_traits_of(m->weight_type)->name, engine_n_ctx(e), engine_n_threads(e));
    printf("Type text for the model to continue; an empty line continues it; Ctrl-D quits; Ctrl-C stops a reply.\n");
    size_t cap = 1 << 16, len = 0;
    char *conv = malloc(cap);
    if (!conv) return EXIT_RUNTIME;
    conv[0] = 0;
    char *line;
    while ((line = readline("> ")) != NULL) {
        if (*line) add_history(line);
        size_t ll = strlen(line);
        while (len + ll + 2 > cap) {
            char *nc = realloc(conv, cap *= 2);
            if (!nc) { free(line); free(conv); return EXIT_RUNTIME; }
            conv = nc;
        }
        if (len && ll) conv[len++] = ' ';
        memcpy(conv + len, line, ll + 1);
        len += ll;
        free(line);
        g_interrupted = 0;
        kv_error err = {0};
        int32_t *toks = NULL;
        size_t n = 0;
        if (engine_tokenize(e, conv, len, c->no_bos, 0, &toks, &n, &err)) {
            fprintf(stderr, "kvchat: %s\n", err.msg);
            continue;
        }
        text_acc acc = {&conv, &len, &cap};
        gen_callbacks cb = {.on_text = append_text, .should_stop = should_stop, .ud = &acc};
        gen_stats st;
        int finish;
        if (engine_generate(e, toks, n, c->n_predict < 0 ? 256 : c->n_predict, s, &cb, &st, &finish, &err))
            fprintf(stderr, "\nkvchat: %s\n", err.msg);
        free(toks);
        printf("\n");
        if (c->stats) print_stats(&st, finish);
    }
    printf("\n");
    free(conv);
    return EXIT_OK;
}

int main(int argc, char **argv)
{
    /* subcommands: speed measurement and synthetic benchmark models (app/bench.c, app/gen_model.c) */
    if (argc > 1 && !strcmp(argv[1], "bench")) return bench_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "gen-model")) return gen_model_main(argc - 1, argv + 1);
    cli c = {0};
    int rc = parse_args(argc, argv, &c);
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
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &c.sp, &err);
    if (!s) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        engine_close(e);
        free(stdin_prompt);
        return EXIT_RUNTIME;
    }
    const char *term = getenv("TERM");
    if (c.prompt)
        rc = run_prompt(e, s, c.prompt, &c, 1);
    else if (!term || !*term || !strcmp(term, "dumb"))
        rc = run_interactive(e, s, &c); /* no screen to draw on: the line-by-line session */
    else {
        chat_options co = {.theme = c.theme, .n_predict = c.n_predict, .no_bos = c.no_bos, .mouse = !c.no_mouse,
                           .chat_template = c.chat_template};
        rc = chat_run(e, s, &co);
    }
    if (c.prompt && rc == EXIT_OK && isatty(STDOUT_FILENO)) printf("\n");
    sampler_free(s);
    engine_close(e);
    free(stdin_prompt);
    return rc;
}
