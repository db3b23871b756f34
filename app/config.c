/* config: kvchat's settings — built-in defaults, the config file (INI, inih), the environment and the command line, resolved in that order of precedence. */
#include "app/config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/chatstore.h"
#include "app/util.h"
#include "engine/chat_template.h"
#include "app/prompt.h"
#include "engine/kernels/quant.h"
#include "engine/speculate.h"

enum cfg_type {
    T_PATH,     /* a file path; "~/" expanded */
    T_NAME,     /* a name or a path (theme) */
    T_INT,      /* integer in [lo, hi] */
    T_AUTOINT,  /* "auto" (= 0) or an integer in [lo, hi] */
    T_FLOAT,    /* finite number in [lo, hi] */
    T_SEED,     /* "random" or a non-negative integer */
    T_KVTYPE,   /* f16, f32, q8_0 */
    T_TEMPLATE, /* a chat template family, or none */
    T_BOOL,
    T_SIZE,     /* MiB, or a size with a unit: 512M, 2G (chatstore_parse_cache_size) */
    T_TEXT,     /* any text (a system prompt) */
    T_DRAFT,    /* speculative decoding: off, lookup, or a draft model's path */
};

typedef struct key_def {
    const char *name, *section;
    const char *option; /* long option that sets it, NULL if none */
    const char *env;    /* environment variable, NULL if none */
    int type;
    double lo, hi;      /* the values accepted everywhere: command line, config.ini, /set */
    const char *what;   /* short description, for --print-config of unset keys */
    /* the slider (ui_lo == ui_hi: none) and how a value reads */
    double ui_lo, ui_hi, step;
    int decimals;
    double off_value;   /* the value meaning "off" (off_label), if off_label */
    const char *off_label;
    int log;            /* the slider moves on a log scale; off_value sits past its right end */
} key_def;

static const key_def keys[CFG_COUNT] = {
    [CFG_MODEL] = {"model", "model", "model", "KVCHAT_MODEL", T_PATH, 0, 0, "GGUF file, or a name in the models directory"},
    [CFG_N_CTX] = {"n_ctx", "model", "ctx-size", NULL, T_AUTOINT, 8, 1 << 20, NULL},
    [CFG_N_BATCH] = {"n_batch", "model", "batch-size", NULL, T_AUTOINT, 1, 1 << 16, NULL},
    [CFG_THREADS] = {"threads", "model", "threads", NULL, T_AUTOINT, 1, 1024, NULL},
    [CFG_KV_TYPE] = {"kv_type", "model", "kv-type", NULL, T_KVTYPE, 0, 0, NULL},
    [CFG_CHAT_TEMPLATE] = {"chat_template", "model", "chat-template", NULL, T_TEMPLATE, 0, 0, "the model's own"},
    [CFG_TEMP] = {"temp", "sampling", "temp", NULL, T_FLOAT, 0, 2, NULL, 0, 2, 0.05, 2, 0, "greedy", 0},
    [CFG_TOP_K] = {"top_k", "sampling", "top-k", NULL, T_INT, 0, 1000000, NULL, 0, 200, 1, 0, 0, "off", 0},
    [CFG_TOP_P] = {"top_p", "sampling", "top-p", NULL, T_FLOAT, 0, 1, NULL, 0, 1, 0.01, 2, 1, "off", 0},
    [CFG_MIN_P] = {"min_p", "sampling", "min-p", NULL, T_FLOAT, 0, 1, NULL, 0, 1, 0.01, 2, 0, "off", 0},
    [CFG_REPEAT_PENALTY] = {"repeat_penalty", "sampling", "repeat-penalty", NULL, T_FLOAT, 0.1, 10, NULL, 1, 2, 0.05, 2,
                            1, "off", 0},
    [CFG_REPEAT_LAST_N] = {"repeat_last_n", "sampling", "repeat-last-n", NULL, T_INT, -1, SAMPLER_MAX_LAST_N, NULL, 0, 0,
                           0, 0, -1, "all", 0},
    [CFG_PRESENCE_PENALTY] = {"presence_penalty", "sampling", "presence-penalty", NULL, T_FLOAT, -2, 2, NULL, 0, 0, 0, 2,
                              0, "off", 0},
    [CFG_FREQUENCY_PENALTY] = {"frequency_penalty", "sampling", "frequency-penalty", NULL, T_FLOAT, -2, 2, NULL, 0, 0, 0,
                               2, 0, "off", 0},
    [CFG_SEED] = {"seed", "sampling", "seed", NULL, T_SEED, 0, 0, NULL},
    [CFG_N_PREDICT] = {"n_predict", "sampling", "n-predict", NULL, T_INT, -1, INT_MAX, NULL, 16, 8192, 1, 0, -1, "∞", 1},
    [CFG_THEME] = {"theme", "chat", "theme", NULL, T_NAME, 0, 0, NULL},
    [CFG_MOUSE] = {"mouse", "chat", NULL, NULL, T_BOOL, 0, 0, NULL},
    [CFG_SYSTEM] = {"system", "chat", "system", NULL, T_TEXT, 0, 0, "the system prompt of new chats (none)"},
    [CFG_MARKDOWN] = {"markdown", "chat", NULL, NULL, T_BOOL, 0, 0, NULL},
    [CFG_DB] = {"db", "storage", "db", "KVCHAT_DB", T_PATH, 0, 0, NULL},
    [CFG_CACHE_SIZE] = {"cache_size", "storage", "cache-size", NULL, T_SIZE, 0, 0, NULL},
    [CFG_DRAFT] = {"draft", "sampling", "draft", NULL, T_DRAFT, 0, 0, "speculative decoding: off, lookup or a draft model"},
    [CFG_DRAFT_MAX] = {"draft_max", "sampling", "draft-max", NULL, T_INT, 1, SPEC_MAX_DRAFT, NULL},
    [CFG_DRAFT_MIN_P] = {"draft_min_p", "sampling", "draft-min-p", NULL, T_FLOAT, 0, 1, NULL},
    [CFG_REMOTE_URL] = {"url", "remote", "remote", NULL, T_TEXT, 0, 0, "the chat runs on the local model"},
    [CFG_REMOTE_API_KEY] = {"api_key", "remote", "api-key", "KVCHAT_REMOTE_API_KEY", T_TEXT, 0, 0, "no Authorization header"},
    /* [remote] model: the server's model name (with --remote, -m/--model NAME sets it) */
    [CFG_REMOTE_MODEL] = {"model", "remote", NULL, NULL, T_TEXT, 0, 0, "the server's first (GET /v1/models)"},
    [CFG_REMOTE_TIMEOUT] = {"timeout", "remote", "remote-timeout", NULL, T_FLOAT, 0.1, 86400, NULL},
};

static const char *const sections[] = {"model", "sampling", "chat", "storage", "remote", NULL};

static void put(kv_config *c, int key, const char *text, int src, const char *where)
{
    char *dup = text ? strdup(text) : NULL;
    if (text && !dup) return; /* out of memory: keep the old value */
    free(c->v[key].value);
    c->v[key].value = dup;
    c->v[key].source = src;
    snprintf(c->v[key].where, sizeof c->v[key].where, "%s", where ? where : "");
}

/* ---- names --------------------------------------------------------------------------------- */

int config_key_from_name(const char *name)
{
    char n[64];
    size_t i = 0;
    for (; name[i] && i < sizeof n - 1; i++) n[i] = name[i] == '-' ? '_' : (char)tolower((unsigned char)name[i]);
    if (name[i]) return -1;
    n[i] = 0;
    for (int k = 0; k < CFG_COUNT; k++)
        if (!strcmp(n, keys[k].name)) return k;
    return -1;
}

const char *config_key_name(int key) { return key >= 0 && key < CFG_COUNT ? keys[key].name : NULL; }
const char *config_key_section(int key) { return key >= 0 && key < CFG_COUNT ? keys[key].section : NULL; }
const char *config_get(const kv_config *c, int key) { return key >= 0 && key < CFG_COUNT ? c->v[key].value : NULL; }

/* ---- value parsers ---------------------------------------------------------------------------- */

int config_parse_bool(const char *s)
{
    static const char *const t[] = {"1", "true", "yes", "on"}, *const f[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, t[i])) return 1;
        if (!strcasecmp(s, f[i])) return 0;
    }
    return -1;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !*s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* "~/x" → "$HOME/x" (into out); other text as it is. */
static void expand_home(const char *s, char *out, size_t cap)
{
    const char *home = getenv("HOME");
    if (s[0] == '~' && (s[1] == '/' || !s[1]) && home && *home) snprintf(out, cap, "%s%s", home, s + 1);
    else snprintf(out, cap, "%s", s);
}

/* Validate text for key; the normalized form goes to out. */
static int normalize(int key, const char *text, char *out, size_t cap, char *why, size_t why_cap)
{
    const key_def *d = &keys[key];
    while (isspace((unsigned char)*text)) text++;
    size_t len = strlen(text);
    while (len && isspace((unsigned char)text[len - 1])) len--;
    char t[1024];
    if (len >= sizeof t) {
        util_set_why(why, why_cap, "value too long");
        return -1;
    }
    memcpy(t, text, len);
    t[len] = 0;
    if (!*t) {
        util_set_why(why, why_cap, "empty value");
        return -1;
    }
    switch (d->type) {
    case T_PATH:
        expand_home(t, out, cap);
        return 0;
    case T_TEXT:
        if (strlen(t) >= cap) {
            util_set_why(why, why_cap, "longer than %zu bytes", cap - 1);
            return -1;
        }
        snprintf(out, cap, "%s", t);
        return 0;
    case T_DRAFT:
        if (!strcmp(t, "off") || !strcmp(t, "lookup")) snprintf(out, cap, "%s", t);
        else expand_home(t, out, cap);
        return 0;
    case T_NAME:
        if (strchr(t, '/')) expand_home(t, out, cap);
        else snprintf(out, cap, "%s", t);
        return 0;
    case T_AUTOINT:
        if (!strcasecmp(t, "auto") || !strcmp(t, "0")) {
            snprintf(out, cap, "auto");
            return 0;
        }
        /* fall through */
    case T_INT: {
        long v;
        if (parse_long(t, (long)d->lo, (long)d->hi, &v)) {
            util_set_why(why, why_cap, "'%s' is not an integer from %ld to %ld%s", t, (long)d->lo, (long)d->hi,
                         d->type == T_AUTOINT ? ", or auto" : "");
            return -1;
        }
        snprintf(out, cap, "%ld", v);
        return 0;
    }
    case T_FLOAT: {
        char *end;
        errno = 0;
        double v = strtod(t, &end);
        if (errno || *end || !isfinite(v) || v < d->lo || v > d->hi) {
            if (d->hi >= 1e9) util_set_why(why, why_cap, "'%s' is not a number%s", t, d->lo > 0 ? " above 0" : "");
            else util_set_why(why, why_cap, "'%s' is not a number from %g to %g", t, d->lo, d->hi);
            return -1;
        }
        snprintf(out, cap, "%g", v);
        return 0;
    }
    case T_SEED: {
        if (!strcasecmp(t, "random")) {
            snprintf(out, cap, "random");
            return 0;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(t, &end, 10);
        if (errno || *t == '-' || *end || !*t) {
            util_set_why(why, why_cap, "'%s' is not a seed (a non-negative integer, or random)", t);
            return -1;
        }
        if (v == SAMPLER_SEED_RANDOM) { /* 2^64 - 1 is the sampler's "pick one": never silently random */
            util_set_why(why, why_cap, "'%s' is out of range (0 .. 18446744073709551614, or random)", t);
            return -1;
        }
        snprintf(out, cap, "%llu", v);
        return 0;
    }
    case T_KVTYPE:
        for (char *p = t; *p; p++) *p = (char)tolower((unsigned char)*p);
        if (strcmp(t, "f16") && strcmp(t, "f32") && strcmp(t, "q8_0")) {
            util_set_why(why, why_cap, "'%s' is not a KV cache type (f16, q8_0, f32)", t);
            return -1;
        }
        snprintf(out, cap, "%s", t);
        return 0;
    case T_TEMPLATE:
        if (chat_template_from_name(t) < 0 && !prompt_is_template_file(t)) {
            util_set_why(why, why_cap, "unknown chat template '%s' (one of: none, %s; or a .jinja file)", t,
                         chat_template_names());
            return -1;
        }
        snprintf(out, cap, "%s", t);
        return 0;
    case T_BOOL: {
        int b = config_parse_bool(t);
        if (b < 0) {
            util_set_why(why, why_cap, "'%s' is not a boolean (true/false, yes/no, on/off, 1/0)", t);
            return -1;
        }
        snprintf(out, cap, "%s", b ? "true" : "false");
        return 0;
    }
    case T_SIZE: {
        uint64_t b;
        if (chatstore_parse_cache_size(t, &b)) {
            util_set_why(why, why_cap, "'%s' is not a size (MiB, or a number with K, M or G: 512M, 2G; 0 = off)", t);
            return -1;
        }
        snprintf(out, cap, "%s", t);
        return 0;
    }
    }
    return -1;
}

int config_check(int key, const char *text, char *out, size_t cap, char *why, size_t why_cap)
{
    if (key < 0 || key >= CFG_COUNT || !text) {
        util_set_why(why, why_cap, "no such setting");
        return -1;
    }
    return normalize(key, text, out, cap, why, why_cap);
}

int config_key_range(int key, cfg_range *r)
{
    memset(r, 0, sizeof *r);
    if (key < 0 || key >= CFG_COUNT) return -1;
    const key_def *d = &keys[key];
    if (d->type != T_INT && d->type != T_AUTOINT && d->type != T_FLOAT) return -1;
    *r = (cfg_range){.lo = d->lo, .hi = d->hi, .integer = d->type != T_FLOAT, .ui_lo = d->ui_lo, .ui_hi = d->ui_hi,
                     .step = d->step, .decimals = d->decimals, .off_value = d->off_value, .off_label = d->off_label,
                     .log = d->log};
    return 0;
}

const char *config_key_option(int key) { return key >= 0 && key < CFG_COUNT ? keys[key].option : NULL; }

void config_range_text(int key, char *buf, size_t cap)
{
    cfg_range r;
    if (config_key_range(key, &r)) {
        snprintf(buf, cap, "%s", key == CFG_SEED ? "N|random" : "");
        return;
    }
    char hi[32];
    if (r.hi >= INT_MAX) snprintf(hi, sizeof hi, "N");
    else snprintf(hi, sizeof hi, "%.15g", r.hi);
    int n = snprintf(buf, cap, "%.15g-%s", r.lo, hi);
    if (r.off_label && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, ", %g %s", r.off_value, !strcmp(r.off_label, "∞") ? "no limit" : r.off_label);
}

int config_set(kv_config *c, int key, const char *text, int src, const char *where, char *why, size_t why_cap)
{
    if (key < 0 || key >= CFG_COUNT || !text) {
        util_set_why(why, why_cap, "no such setting");
        return -1;
    }
    char out[1100];
    if (normalize(key, text, out, sizeof out, why, why_cap)) return -1;
    put(c, key, out, src, where);
    return 0;
}

/* ---- defaults ---------------------------------------------------------------------------------- */

static void kv_type_text(int type, char *out, size_t cap)
{
    const quant_traits *qt = quant_traits_of(type);
    snprintf(out, cap, "%s", qt && qt->name ? qt->name : "f16");
    for (char *p = out; *p; p++) *p = (char)tolower((unsigned char)*p);
}

void config_init(kv_config *c)
{
    memset(c, 0, sizeof *c);
    engine_params ep;
    sampler_params sp;
    engine_params_default(&ep);
    sampler_params_default(&sp);
    char b[64];
#define DEF(key, ...) (snprintf(b, sizeof b, __VA_ARGS__), put(c, key, b, CFG_SRC_DEFAULT, ""))
    if (ep.n_ctx) DEF(CFG_N_CTX, "%d", ep.n_ctx); else DEF(CFG_N_CTX, "auto");
    if (ep.n_batch) DEF(CFG_N_BATCH, "%d", ep.n_batch); else DEF(CFG_N_BATCH, "auto");
    if (ep.n_threads) DEF(CFG_THREADS, "%d", ep.n_threads); else DEF(CFG_THREADS, "auto");
    kv_type_text(ep.kv_type, b, sizeof b);
    put(c, CFG_KV_TYPE, b, CFG_SRC_DEFAULT, "");
    DEF(CFG_TEMP, "%g", (double)sp.temperature);
    DEF(CFG_TOP_K, "%d", (int)sp.top_k);
    DEF(CFG_TOP_P, "%g", (double)sp.top_p);
    DEF(CFG_MIN_P, "%g", (double)sp.min_p);
    DEF(CFG_REPEAT_PENALTY, "%g", (double)sp.repeat_penalty);
    DEF(CFG_REPEAT_LAST_N, "%d", (int)sp.repeat_last_n);
    DEF(CFG_PRESENCE_PENALTY, "%g", (double)sp.presence_penalty);
    DEF(CFG_FREQUENCY_PENALTY, "%g", (double)sp.frequency_penalty);
    if (sp.seed == SAMPLER_SEED_RANDOM) DEF(CFG_SEED, "random"); else DEF(CFG_SEED, "%llu", (unsigned long long)sp.seed);
    DEF(CFG_N_PREDICT, "-1");
    DEF(CFG_THEME, "default");
    DEF(CFG_DRAFT, "off");
    DEF(CFG_DRAFT_MAX, "%d", SPEC_DEFAULT_DRAFT_MAX);
    DEF(CFG_DRAFT_MIN_P, "%g", (double)SPEC_DEFAULT_MIN_P);
    DEF(CFG_MOUSE, "true");
    DEF(CFG_MARKDOWN, "true");
    DEF(CFG_CACHE_SIZE, "%d", CHATSTORE_DEFAULT_CACHE_MIB);
    DEF(CFG_REMOTE_TIMEOUT, "120");
#undef DEF
}

void config_free(kv_config *c)
{
    for (int k = 0; k < CFG_COUNT; k++) {
        free(c->v[k].value);
        c->v[k].value = NULL;
    }
    for (int i = 0; i < c->n_personas; i++)
        for (int k = 0; k < CFG_COUNT; k++) {
            free(c->persona[i].v[k]);
            c->persona[i].v[k] = NULL;
        }
    c->n_personas = 0;
}

int config_persona_key(int key)
{
    return key == CFG_SYSTEM || (key >= 0 && key < CFG_COUNT && !strcmp(keys[key].section, "sampling"));
}

const cfg_persona *config_persona_find(const kv_config *c, const char *name)
{
    for (int i = 0; i < c->n_personas; i++)
        if (!strcmp(c->persona[i].name, name)) return &c->persona[i];
    return NULL;
}

/* "[persona NAME]": NAME (trimmed) into name; 0, or -1 when section is not a persona's. */
static int persona_section(const char *section, char *name, size_t cap)
{
    if (strncasecmp(section, "persona", 7) || (section[7] != ' ' && section[7] != '\t')) return -1;
    const char *p = section + 8;
    while (*p == ' ' || *p == '\t') p++;
    size_t n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    if (!n || n >= cap) return -1;
    memcpy(name, p, n);
    name[n] = 0;
    return 0;
}

int config_default_path(char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (xdg && *xdg == '/') snprintf(buf, cap, "%s/kvchat/config.ini", xdg);
    else if (home && *home) snprintf(buf, cap, "%s/.config/kvchat/config.ini", home);
    else {
        if (cap) buf[0] = 0;
        return -1;
    }
    return 0;
}

/* ---- the file ---------------------------------------------------------------------------------- */

typedef struct load_ctx {
    kv_config *c;
    const char *path;
    FILE *f;
    int line;
    int expect_pair, got_pair; /* the line read last is a name = value line / the handler saw it */
    cfg_warn_fn warn;
    void *ud;
} load_ctx;

static void default_warn(void *ud, const char *msg)
{
    (void)ud;
    fprintf(stderr, "kvchat: %s\n", msg);
}

static void warnf(load_ctx *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warnf(load_ctx *l, const char *fmt, ...)
{
    char msg[1400];
    int n = snprintf(msg, sizeof msg, "%s:%d: ", l->path, l->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    l->c->n_warnings++;
    (l->warn ? l->warn : default_warn)(l->ud, msg);
}

/* inih reads through this, so each warning knows its line, and lines inih drops silently (no
 * '=', no ']') or cuts (too long) are reported too. */
static char *reader(char *str, int num, void *stream)
{
    load_ctx *l = stream;
    if (l->expect_pair && !l->got_pair) warnf(l, "expected 'name = value', '[section]' or a comment; line ignored");
    l->expect_pair = l->got_pair = 0;
    if (!fgets(str, num, l->f)) return NULL;
    l->line++;
    size_t len = strlen(str);
    if (len == (size_t)num - 1 && str[len - 1] != '\n' && !feof(l->f)) {
        int ch;
        while ((ch = fgetc(l->f)) != EOF && ch != '\n') {}
        warnf(l, "line longer than %d bytes; line ignored", num - 2);
        str[0] = '\n', str[1] = 0;
        return str;
    }
    const char *p = str;
    if (l->line == 1 && (unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xBB && (unsigned char)p[2] == 0xBF) p += 3;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == 0 || *p == '\n' || *p == '\r' || *p == ';' || *p == '#') return str;
    if (*p == '[') {
        if (!strchr(p, ']')) warnf(l, "section header without ']'; line ignored");
        return str;
    }
    l->expect_pair = 1;
    return str;
}

static int known_section(const char *s)
{
    for (int i = 0; sections[i]; i++)
        if (!strcasecmp(s, sections[i])) return 1;
    return 0;
}

/* A line of a [persona NAME] section: system or a [sampling] key, checked as everywhere. */
static void persona_line(load_ctx *l, const char *pname, const char *name, const char *value)
{
    kv_config *c = l->c;
    int key = config_key_from_name(name);
    if (key < 0 || !config_persona_key(key)) {
        warnf(l, "%s '%s' in [persona %s]: a persona sets system and the [sampling] keys; line ignored",
              key < 0 ? "unknown key" : "key", name, pname);
        return;
    }
    cfg_persona *p = NULL;
    for (int i = 0; i < c->n_personas && !p; i++)
        if (!strcmp(c->persona[i].name, pname)) p = &c->persona[i];
    if (!p) {
        if (c->n_personas == CFG_MAX_PERSONAS) {
            warnf(l, "more than %d personas; [persona %s] ignored", CFG_MAX_PERSONAS, pname);
            return;
        }
        p = &c->persona[c->n_personas++];
        snprintf(p->name, sizeof p->name, "%s", pname);
    }
    char norm[1100], why[600];
    if (config_check(key, value, norm, sizeof norm, why, sizeof why)) {
        warnf(l, "%s: %s; line ignored", keys[key].name, why);
        return;
    }
    char *dup = strdup(norm);
    if (!dup) return;
    free(p->v[key]);
    p->v[key] = dup;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
    load_ctx *l = user;
    l->got_pair = 1;
    char pname[64];
    if (*section && persona_section(section, pname, sizeof pname) == 0) {
        persona_line(l, pname, name, value);
        return 1;
    }
    if (*section && !known_section(section)) {
        warnf(l, "unknown section '[%s]' (model, sampling, chat, storage, remote, persona NAME); line ignored", section);
        return 1;
    }
    int key = config_key_from_name(name);
    /* a name two sections share ([model] model, [remote] model): the section's own key */
    for (int k = 0; *section && key >= 0 && k < CFG_COUNT; k++)
        if (k != key && !strcmp(keys[k].name, keys[key].name) && !strcasecmp(section, keys[k].section)) key = k;
    if (key < 0) {
        warnf(l, "unknown key '%s'%s%s%s; line ignored", name, *section ? " in [" : "", section, *section ? "]" : "");
        return 1;
    }
    if (*section && strcasecmp(section, keys[key].section)) {
        warnf(l, "'%s' belongs in [%s], not [%s]; line ignored", keys[key].name, keys[key].section, section);
        return 1;
    }
    char why[600], where[600];
    snprintf(where, sizeof where, "%s:%d", l->path, l->line);
    if (config_set(l->c, key, value, CFG_SRC_FILE, where, why, sizeof why))
        warnf(l, "%s: %s; line ignored", keys[key].name, why);
    return 1;
}

int config_load_file(kv_config *c, const char *path, cfg_warn_fn warn, void *ud)
{
    snprintf(c->path, sizeof c->path, "%s", path);
    c->file_found = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR) return 0;
        char msg[700];
        snprintf(msg, sizeof msg, "%s: %s; config file ignored", path, strerror(errno));
        c->n_warnings++;
        (warn ? warn : default_warn)(ud, msg);
        return -1;
    }
    c->file_found = 1;
    load_ctx l = {.c = c, .path = path, .f = f, .warn = warn, .ud = ud};
    bool old_multiline = ini_allow_multiline;
    ini_allow_multiline = false; /* an indented line is not the continuation of the value above */
    ini_parse_stream(reader, &l, handler, &l);
    ini_allow_multiline = old_multiline;
    if (l.expect_pair && !l.got_pair) warnf(&l, "expected 'name = value', '[section]' or a comment; line ignored");
    fclose(f);
    return 0;
}

void config_load_env(kv_config *c, cfg_warn_fn warn, void *ud)
{
    for (int k = 0; k < CFG_COUNT; k++) {
        if (!keys[k].env) continue;
        const char *v = getenv(keys[k].env);
        if (!v || !*v) continue;
        char why[600];
        if (config_set(c, k, v, CFG_SRC_ENV, keys[k].env, why, sizeof why)) {
            char msg[700];
            snprintf(msg, sizeof msg, "%s: %s; ignored", keys[k].env, why);
            c->n_warnings++;
            (warn ? warn : default_warn)(ud, msg);
        }
    }
}

void config_load_all(kv_config *c, cfg_warn_fn warn, void *ud)
{
    config_init(c);
    char path[512];
    if (config_default_path(path, sizeof path) == 0) config_load_file(c, path, warn, ud);
    config_load_env(c, warn, ud);
}

/* ---- the command line ---------------------------------------------------------------------------- */

int config_note_option(kv_config *c, const char *name, const char *optarg_text)
{
    char where[80];
    snprintf(where, sizeof where, "--%s", name);
    if (!strcmp(name, "no-mouse")) {
        put(c, CFG_MOUSE, "false", CFG_SRC_CLI, where);
        return CFG_MOUSE;
    }
    if (!strcmp(name, "lookup")) { /* --lookup = --draft lookup */
        put(c, CFG_DRAFT, "lookup", CFG_SRC_CLI, where);
        return CFG_DRAFT;
    }
    if (!strcmp(name, "no-markdown")) {
        put(c, CFG_MARKDOWN, "false", CFG_SRC_CLI, where);
        return CFG_MARKDOWN;
    }
    for (int k = 0; k < CFG_COUNT; k++) {
        if (!keys[k].option || strcmp(keys[k].option, name)) continue;
        if (!optarg_text) return -1;
        /* main.c has accepted the value already; keep its own text if ours is stricter */
        if (config_set(c, k, optarg_text, CFG_SRC_CLI, where, NULL, 0)) put(c, k, optarg_text, CFG_SRC_CLI, where);
        return k;
    }
    return -1;
}

int config_note_getopt(kv_config *c, const struct option *opts, int val, const char *optarg_text)
{
    for (const struct option *o = opts; o->name; o++)
        if (!o->flag && o->val == val) return config_note_option(c, o->name, optarg_text);
    return -1;
}

/* ---- typed values ---------------------------------------------------------------------------------- */

void config_apply(const kv_config *c, engine_params *ep, sampler_params *sp, int *n_predict)
{
    for (int k = 0; k < CFG_COUNT; k++)
        if (c->v[k].value) config_apply_key(k, c->v[k].value, ep, sp, n_predict);
}

void config_apply_key(int k, const char *s, engine_params *ep, sampler_params *sp, int *n_predict)
{
    {
        long l = !strcmp(s, "auto") ? 0 : strtol(s, NULL, 10);
        float f = strtof(s, NULL);
        switch (k) {
        case CFG_MODEL: if (ep) ep->model_path = s; break;
        case CFG_N_CTX: if (ep) ep->n_ctx = (int)l; break;
        case CFG_N_BATCH: if (ep) ep->n_batch = (int)l; break;
        case CFG_THREADS: if (ep) ep->n_threads = (int)l; break;
        case CFG_KV_TYPE:
            if (!ep) break;
            ep->kv_type = !strcmp(s, "f32") ? GGML_TYPE_F32 : !strcmp(s, "q8_0") ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
            break;
        case CFG_TEMP: sp->temperature = f; break;
        case CFG_TOP_K: sp->top_k = (int32_t)l; break;
        case CFG_TOP_P: sp->top_p = f; break;
        case CFG_MIN_P: sp->min_p = f; break;
        case CFG_REPEAT_PENALTY: sp->repeat_penalty = f; break;
        case CFG_REPEAT_LAST_N: sp->repeat_last_n = (int32_t)l; break;
        case CFG_PRESENCE_PENALTY: sp->presence_penalty = f; break;
        case CFG_FREQUENCY_PENALTY: sp->frequency_penalty = f; break;
        case CFG_SEED: sp->seed = !strcmp(s, "random") ? SAMPLER_SEED_RANDOM : strtoull(s, NULL, 10); break;
        case CFG_N_PREDICT: if (n_predict) *n_predict = (int)l; break;
        default: break;
        }
    }
}

/* ---- --print-config ---------------------------------------------------------------------------------- */

static void source_text(const cfg_value *v, char *out, size_t cap)
{
    switch (v->source) {
    case CFG_SRC_FILE: snprintf(out, cap, "config file %s", v->where); break;
    case CFG_SRC_ENV: snprintf(out, cap, "environment %s", v->where); break;
    case CFG_SRC_CLI: snprintf(out, cap, "command line %s", v->where); break;
    default: snprintf(out, cap, "default"); break;
    }
}

void config_print(const kv_config *c, FILE *out, const char *resolved_model)
{
    fprintf(out, "; kvchat settings: command line > environment > config file > default\n");
    if (c->path[0]) fprintf(out, "; config file: %s (%s)\n", c->path, c->file_found ? "read" : "not found");
    else fprintf(out, "; config file: none (neither XDG_CONFIG_HOME nor HOME is set)\n");
    const char *section = NULL;
    for (int k = 0; k < CFG_COUNT; k++) {
        const key_def *d = &keys[k];
        const cfg_value *v = &c->v[k];
        if (!section || strcmp(section, d->section)) {
            fprintf(out, "%s[%s]\n", section ? "\n" : "", d->section);
            section = d->section;
        }
        if (!v->value) {
            char dflt[1200], db[1100];
            if (k == CFG_DB && chatstore_db_path(NULL, 0, db, sizeof db, NULL, 0) == 0)
                snprintf(dflt, sizeof dflt, "default %s", db);
            else
                snprintf(dflt, sizeof dflt, "%s", d->what ? d->what : "");
            fprintf(out, ";%-17s =                                 ; not set: %s\n", d->name, dflt);
            continue;
        }
        char src[700];
        source_text(v, src, sizeof src);
        int w = fprintf(out, "%-18s = %s", d->name, k == CFG_REMOTE_API_KEY ? "(set, not shown)" : v->value);
        fprintf(out, "%*s ; %s", w < 52 ? 52 - w : 0, "", src);
        if (k == CFG_MODEL && resolved_model && strcmp(resolved_model, v->value)) fprintf(out, " -> %s", resolved_model);
        fputc('\n', out);
    }
    for (int i = 0; i < c->n_personas; i++) {
        fprintf(out, "\n[persona %s]\n", c->persona[i].name);
        for (int k = 0; k < CFG_COUNT; k++)
            if (c->persona[i].v[k]) fprintf(out, "%-18s = %s\n", keys[k].name, c->persona[i].v[k]);
    }
}
