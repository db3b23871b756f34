/* store_cli: the conversation subcommands — `kvchat list`, `export` (Markdown or JSON), `import` (JSON, byte-exact round trip), `rm` and `check` — over the SQLite store. */
#include "store_cli.h"

#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "app/chatstore.h"
#include "app/config.h"
#include "app/output.h"
#include "engine/gguf.h"
#include "ui/text.h"
#include "storage/store.h"

enum { SC_OK = 0, SC_RUNTIME = 1, SC_USAGE = 2, SC_DB = 4 };

#define EXPORT_FORMAT "kvchat-conversation"
#define EXPORT_VERSION 1

static const char *const commands[] = {"list", "export", "import", "rm", "check", NULL};

int store_cli_is_command(const char *name)
{
    for (int i = 0; name && commands[i]; i++)
        if (!strcmp(name, commands[i])) return 1;
    return 0;
}

static int usage(const char *cmd, FILE *out)
{
    if (!strcmp(cmd, "list"))
        fprintf(out, "Usage: kvchat list [--json] [--ids] [--db PATH]\n"
                     "List the saved conversations, most recent first: ID, last update, messages,\n"
                     "branches, model and title. --json: one JSON array; --ids: the IDs alone.\n");
    else if (!strcmp(cmd, "export"))
        fprintf(out, "Usage: kvchat export ID|last [--format md|json] [-o FILE] [--db PATH]\n"
                     "Write a conversation as Markdown (the current branch; the default) or JSON\n"
                     "(every message and branch, with generation records; `kvchat import` reads it).\n");
    else if (!strcmp(cmd, "import"))
        fprintf(out, "Usage: kvchat import FILE|- [--db PATH]\n"
                     "Add a conversation from a JSON export as a new conversation; prints its ID.\n"
                     "Exporting it again gives the same bytes.\n");
    else if (!strcmp(cmd, "rm"))
        fprintf(out, "Usage: kvchat rm ID... [--db PATH]\n"
                     "Delete conversations with all their messages (and their KV cache snapshots).\n");
    else
        fprintf(out, "Usage: kvchat check [--db PATH]\n"
                     "Check the database: SQLite's integrity_check and foreign keys, the search index,\n"
                     "every message row, every stored KV prefix's checksum and every delta's base.\n"
                     "Exit 0 when all is well.\n");
    fprintf(out, "\nThe database: --db PATH, else [storage] db in the config file or KVCHAT_DB, else\n"
                 "$XDG_DATA_HOME/kvchat/kvchat.db (~/.local/share/kvchat/kvchat.db).\n");
    return out == stdout ? SC_OK : SC_USAGE;
}

/* Open the database for a subcommand; missing_ok: a missing file is not an error (*s NULL).
 * write: 1 may create it, 2 must exist (kvchat check: the FTS5 check needs a writable handle). */
static int open_db(const char *opt, int write, int missing_ok, store **s)
{
    *s = NULL;
    kv_config cfg;
    config_load_all(&cfg, NULL, NULL); /* config_init included */
    const char *db = opt ? opt : config_get(&cfg, CFG_DB);
    char path[4096], why[700];
    int rc = chatstore_db_path(db, write == 1, path, sizeof path, why, sizeof why);
    config_free(&cfg);
    if (rc) {
        fprintf(stderr, "kvchat: %s\n", why);
        return SC_DB;
    }
    if (access(path, F_OK) != 0 && missing_ok) return SC_OK;
    store_error err = {0};
    int flags = !write ? STORE_OPEN_READONLY : write == 2 ? STORE_OPEN_NO_CREATE : 0;
    if (write == 2 && access(path, W_OK) != 0) flags = STORE_OPEN_READONLY;
    if (flags == STORE_OPEN_READONLY ? chatstore_open_reading(path, s, &err) : store_open(path, flags, s, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        return SC_DB;
    }
    return SC_OK;
}

static void iso_time(int64_t ms, char *buf, size_t cap)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (!gmtime_r(&t, &tm)) {
        snprintf(buf, cap, "1970-01-01T00:00:00.000Z");
        return;
    }
    char base[64];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%.20s.%03dZ", base, (int)(((ms % 1000) + 1000) % 1000));
}

static int parse_iso(const char *s, int64_t *ms)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int frac = 0;
    char z = 0;
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                     &tm.tm_sec, &frac, &z) != 8 || z != 'Z' || strlen(s) != 24)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    *ms = (int64_t)t * 1000 + frac;
    return 0;
}

static void local_time(int64_t ms, char *buf, size_t cap)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (localtime_r(&t, &tm)) strftime(buf, cap, "%Y-%m-%d %H:%M", &tm);
    else snprintf(buf, cap, "?");
}

/* A malloc'd copy of s with its control characters neutralised (ui_neutralize); NULL when out
 * of memory. */
static char *safe_dup(const char *s)
{
    size_t n = strlen(s);
    char *b = malloc(3 * n + 1);
    if (!b) return NULL;
    size_t k = ui_neutralize(s, n, b, 3 * n);
    b[k] = 0;
    return b;
}

/* ---- list ------------------------------------------------------------------------------------- */

static int cmd_list(store *s, int json, int ids)
{
    store_conv *rows = NULL;
    size_t n = 0;
    store_error err = {0};
    if (s && store_conv_list(s, NULL, &rows, &n, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        return SC_DB;
    }
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; arr && i < n; i++) {
            cJSON *o = cJSON_CreateObject();
            char c[40], u[40];
            iso_time(rows[i].created_at, c, sizeof c);
            iso_time(rows[i].updated_at, u, sizeof u);
            cJSON_AddNumberToObject(o, "id", (double)rows[i].id);
            cJSON_AddStringToObject(o, "title", rows[i].title);
            cJSON_AddStringToObject(o, "model", rows[i].model_name);
            cJSON_AddStringToObject(o, "created_at", c);
            cJSON_AddStringToObject(o, "updated_at", u);
            cJSON_AddNumberToObject(o, "messages", rows[i].n_messages);
            cJSON_AddNumberToObject(o, "branches", rows[i].n_branches);
            cJSON_AddItemToArray(arr, o);
        }
        char *t = arr ? cJSON_Print(arr) : NULL;
        if (t) printf("%s\n", t);
        free(t);
        cJSON_Delete(arr);
    } else if (ids) {
        for (size_t i = 0; i < n; i++) printf("%lld\n", (long long)rows[i].id);
    } else if (!n) {
        printf("no saved conversations yet\n");
    } else {
        printf("%6s  %-16s  %5s  %3s  %-18s  %s\n", "ID", "UPDATED", "MSGS", "BR", "MODEL", "TITLE");
        for (size_t i = 0; i < n; i++) {
            char d[40];
            local_time(rows[i].updated_at, d, sizeof d);
            /* titles and model names are stored text: their control characters neutralised */
            char *mname = safe_dup(rows[i].model_name[0] ? rows[i].model_name : "-");
            char *title = safe_dup(rows[i].title[0] ? rows[i].title : "(untitled)");
            printf("%6lld  %-16s  %5d  %3d  %-18.18s  %s\n", (long long)rows[i].id, d, rows[i].n_messages,
                   rows[i].n_branches, mname ? mname : "?", title ? title : "?");
            free(mname);
            free(title);
        }
    }
    store_conv_list_free(rows, n);
    return SC_OK;
}

/* ---- export ------------------------------------------------------------------------------------- */

/* A float parameter as the number it was typed as: the shortest decimal that reads back as the
 * same float (1.05, not 1.0499999523162842). */
static double float_num(double v)
{
    char b[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, v);
        if ((float)strtod(b, NULL) == (float)v) break;
    }
    return strtod(b, NULL);
}

static cJSON *params_json(const store_params *p, int with_max)
{
    if (!p->set) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "temperature", float_num(p->temperature));
    cJSON_AddNumberToObject(o, "top_k", p->top_k);
    cJSON_AddNumberToObject(o, "top_p", float_num(p->top_p));
    cJSON_AddNumberToObject(o, "min_p", float_num(p->min_p));
    cJSON_AddNumberToObject(o, "repeat_penalty", float_num(p->repeat_penalty));
    cJSON_AddNumberToObject(o, "repeat_last_n", p->repeat_last_n);
    cJSON_AddNumberToObject(o, "presence_penalty", float_num(p->presence_penalty));
    cJSON_AddNumberToObject(o, "frequency_penalty", float_num(p->frequency_penalty));
    if (p->seed_set) {
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
        cJSON_AddStringToObject(o, "seed", seed); /* a string: JSON numbers lose 64-bit precision */
    } else {
        cJSON_AddNullToObject(o, "seed");
    }
    if (with_max) cJSON_AddNumberToObject(o, "max_tokens", p->max_tokens);
    return o;
}

static long index_of(const store_msg *m, size_t n, int64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (m[i].id == id) return (long)i;
    return -1;
}

/* Conversation id and its messages: every one (all), or the path to its head. 0, or -1 with why
 * set (nothing to free then). */
static int load_conv(store *s, long long id, int all, store_conv *c, store_msg **m, size_t *n, char *why, size_t why_cap)
{
    store_error err = {0};
    *m = NULL;
    *n = 0;
    if (store_conv_get(s, id, c, &err)) {
        snprintf(why, why_cap, "%s", err.msg);
        return -1;
    }
    if (all ? store_conv_messages(s, id, m, n, &err) : store_conv_path(s, id, c->head_id, m, n, &err)) {
        snprintf(why, why_cap, "%s", err.msg);
        store_conv_clear(c);
        return -1;
    }
    return 0;
}

/* A JSON string item of len bytes as json_write_string escapes it (every control, C1 ones
 * included, as \uXXXX; a NUL byte kept as \u0000 where cJSON would end the string); NULL
 * when out of memory. */
static cJSON *json_str(const char *s, size_t len)
{
    char *lit = NULL;
    size_t lit_len = 0;
    FILE *f = open_memstream(&lit, &lit_len);
    if (!f) return NULL;
    json_write_string(f, s, len);
    if (fclose(f)) {
        free(lit);
        return NULL;
    }
    cJSON *item = cJSON_CreateRaw(lit);
    free(lit);
    return item;
}

/* obj[key] = json_str(s); 0, or -1 when out of memory. */
static int add_json_str(cJSON *obj, const char *key, const char *s, size_t len)
{
    cJSON *item = json_str(s, len);
    if (!item) return -1;
    cJSON_AddItemToObject(obj, key, item);
    return 0;
}

char *store_cli_export_json(store *s, long long id, char *why, size_t why_cap)
{
    store_conv c;
    store_msg *m;
    size_t n;
    if (load_conv(s, id, 1, &c, &m, &n, why, why_cap)) return NULL;
    for (size_t i = 0; i < n; i++)
        if (m[i].problem[0]) {
            snprintf(why, why_cap, "%s: %s — not exported (run `kvchat check`)", store_path(s), m[i].problem);
            store_msgs_free(m, n);
            store_conv_clear(&c);
            return NULL;
        }
    store_model md = {0};
    int have_model = c.model_id > 0 && store_model_get(s, c.model_id, &md, NULL) == STORE_OK;
    /* the models that wrote the replies (messages.model_id), each once: "models" and an index per message */
    int64_t *mids = calloc(n ? n : 1, sizeof *mids);
    size_t n_mids = 0;
    for (size_t i = 0; mids && i < n; i++) {
        if (m[i].model_id <= 0) continue;
        size_t k = 0;
        while (k < n_mids && mids[k] != m[i].model_id) k++;
        if (k == n_mids) mids[n_mids++] = m[i].model_id;
    }
    cJSON *o = cJSON_CreateObject();
    char t[40];
    cJSON_AddStringToObject(o, "format", EXPORT_FORMAT);
    cJSON_AddNumberToObject(o, "version", EXPORT_VERSION);
    add_json_str(o, "title", c.title, strlen(c.title));
    iso_time(c.created_at, t, sizeof t);
    cJSON_AddStringToObject(o, "created_at", t);
    iso_time(c.updated_at, t, sizeof t);
    cJSON_AddStringToObject(o, "updated_at", t);
    if (have_model) {
        cJSON *mo = cJSON_CreateObject();
        add_json_str(mo, "name", md.name, strlen(md.name));
        cJSON_AddStringToObject(mo, "fingerprint", md.fingerprint);
        add_json_str(mo, "path", md.path, strlen(md.path));
        cJSON_AddStringToObject(mo, "arch", md.arch);
        cJSON_AddStringToObject(mo, "weight_type", md.weight_type);
        cJSON_AddItemToObject(o, "model", mo);
    } else {
        cJSON_AddNullToObject(o, "model");
    }
    cJSON *models = cJSON_AddArrayToObject(o, "models");
    for (size_t k = 0; k < n_mids; k++) {
        store_model x = {0};
        cJSON *mo = cJSON_CreateObject();
        if (store_model_get(s, mids[k], &x, NULL) == STORE_OK) {
            char label[256];
            chatstore_label(x.name, x.arch, x.path, label, sizeof label);
            add_json_str(mo, "label", label, strlen(label));
            add_json_str(mo, "name", x.name, strlen(x.name));
            cJSON_AddStringToObject(mo, "fingerprint", x.fingerprint);
            add_json_str(mo, "path", x.path, strlen(x.path));
            cJSON_AddStringToObject(mo, "arch", x.arch);
            cJSON_AddStringToObject(mo, "weight_type", x.weight_type);
        }
        store_model_clear(&x);
        cJSON_AddItemToArray(models, mo);
    }
    if (c.system_prompt) add_json_str(o, "system_prompt", c.system_prompt, strlen(c.system_prompt));
    else cJSON_AddNullToObject(o, "system_prompt");
    cJSON_AddItemToObject(o, "params", params_json(&c.params, 1));
    long head = c.head_id ? index_of(m, n, c.head_id) : -1;
    if (head >= 0) cJSON_AddNumberToObject(o, "head", head);
    else cJSON_AddNullToObject(o, "head");
    cJSON *arr = cJSON_AddArrayToObject(o, "messages");
    for (size_t i = 0; i < n; i++) {
        cJSON *mo = cJSON_CreateObject();
        long p = m[i].parent_id ? index_of(m, n, m[i].parent_id) : -1;
        if (p >= 0) cJSON_AddNumberToObject(mo, "parent", p);
        else cJSON_AddNullToObject(mo, "parent");
        cJSON_AddStringToObject(mo, "role", store_role_name(m[i].role));
        /* content as we escape it: cJSON would stop at a NUL byte (the rest of the reply lost) */
        if (add_json_str(mo, "content", m[i].content, m[i].len)) {
            snprintf(why, why_cap, "out of memory");
            cJSON_Delete(mo);
            cJSON_Delete(o);
            free(mids);
            store_model_clear(&md);
            store_msgs_free(m, n);
            store_conv_clear(&c);
            return NULL;
        }
        cJSON_AddNumberToObject(mo, "n_tokens", m[i].n_tokens);
        iso_time(m[i].created_at, t, sizeof t);
        cJSON_AddStringToObject(mo, "created_at", t);
        cJSON_AddBoolToObject(mo, "partial", m[i].partial);
        size_t mk = 0;
        while (mk < n_mids && mids[mk] != m[i].model_id) mk++;
        if (m[i].model_id > 0 && mk < n_mids) cJSON_AddNumberToObject(mo, "model", (double)mk);
        else cJSON_AddNullToObject(mo, "model");
        if (m[i].gen.set) {
            const store_gen *g = &m[i].gen;
            cJSON *go = cJSON_CreateObject();
            cJSON_AddStringToObject(go, "finish", store_finish_name(g->finish));
            cJSON_AddItemToObject(go, "params", params_json(&g->params, 1));
            cJSON_AddNumberToObject(go, "ttft_ms", g->ttft_ms);
            cJSON_AddNumberToObject(go, "prefill_tps", g->prefill_tps);
            cJSON_AddNumberToObject(go, "decode_tps", g->decode_tps);
            cJSON_AddNumberToObject(go, "n_prompt", g->n_prompt);
            cJSON_AddNumberToObject(go, "n_reused", g->n_reused);
            cJSON_AddNumberToObject(go, "n_prefilled", g->n_prefilled);
            cJSON_AddNumberToObject(go, "n_generated", g->n_generated);
            cJSON_AddItemToObject(mo, "generation", go);
        } else {
            cJSON_AddNullToObject(mo, "generation");
        }
        cJSON_AddItemToArray(arr, mo);
    }
    char *out = cJSON_Print(o);
    cJSON_Delete(o);
    free(mids);
    if (!out) snprintf(why, why_cap, "out of memory");
    store_model_clear(&md);
    store_msgs_free(m, n);
    store_conv_clear(&c);
    return out;
}

char *store_cli_export_md(store *s, long long id, char *why, size_t why_cap)
{
    store_conv c;
    store_msg *m;
    size_t n;
    if (load_conv(s, id, 0, &c, &m, &n, why, why_cap)) return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        snprintf(why, why_cap, "out of memory");
        store_msgs_free(m, n);
        store_conv_clear(&c);
        return NULL;
    }
    char cr[40], up[40];
    local_time(c.created_at, cr, sizeof cr);
    local_time(c.updated_at, up, sizeof up);
    /* every stored text goes through out_plain: the model's escape sequences (ESC[2J …) must not
     * run in the terminal that shows the export */
    const char *title = c.title[0] ? c.title : "(untitled)";
    fputs("# ", f);
    out_plain(f, title, strlen(title));
    fputs("\n\n", f);
    fprintf(f, "- conversation %lld, created %s, updated %s\n", (long long)c.id, cr, up);
    if (c.model_name[0]) {
        fputs("- model: ", f);
        out_plain(f, c.model_name, strlen(c.model_name));
        fputc('\n', f);
    }
    if (c.n_branches > 1)
        fprintf(f, "- the current branch of %d (`kvchat export %lld --format json` has every message)\n", c.n_branches,
                (long long)c.id);
    if (c.system_prompt) {
        fputs("- system prompt: ", f);
        out_plain(f, c.system_prompt, strlen(c.system_prompt));
        fputc('\n', f);
    }
    int64_t label_id = 0; /* the last model looked up, and its label */
    char label[256] = "";
    for (size_t i = 0; i < n; i++) {
        const store_msg *x = &m[i];
        fprintf(f, "\n## %s", x->role == STORE_ROLE_USER ? "You" : x->role == STORE_ROLE_ASSISTANT ? "Assistant" : "System");
        if (x->role == STORE_ROLE_ASSISTANT && x->model_id > 0) { /* the model that wrote this reply */
            if (x->model_id != label_id) {
                store_model md = {0};
                label[0] = 0;
                if (store_model_get(s, x->model_id, &md, NULL) == STORE_OK)
                    chatstore_label(md.name, md.arch, md.path, label, sizeof label);
                store_model_clear(&md);
                label_id = x->model_id;
            }
            if (label[0]) {
                fputs(" (", f);
                out_plain(f, label, strlen(label));
                fputc(')', f);
            }
        }
        fputs("\n\n", f);
        if (x->problem[0]) {
            fputs("*[unreadable: ", f);
            out_plain(f, x->problem, strlen(x->problem));
            fputs("]*\n", f);
        }
        else {
            out_plain(f, x->content, x->len); /* a NUL shows as ␀ and the text goes on */
            fputc('\n', f);
        }
        if (x->gen.set && x->gen.finish != STORE_FINISH_EOG && x->gen.finish != STORE_FINISH_STOP)
            fprintf(f, "\n*[%s]*\n", x->gen.finish == STORE_FINISH_STOPPED ? "stopped" : x->gen.finish == STORE_FINISH_LENGTH
                                                                                ? "max tokens"
                                                                            : x->gen.finish == STORE_FINISH_CONTEXT
                                                                                ? "context full"
                                                                                : "error");
    }
    fclose(f);
    store_msgs_free(m, n);
    store_conv_clear(&c);
    return buf;
}

/* ---- import --------------------------------------------------------------------------------------- */

static const char *get_str(const cJSON *o, const char *k, int *ok, int nullable)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsString(v)) return v->valuestring;
    if (nullable && (!v || cJSON_IsNull(v))) return NULL;
    *ok = 0;
    return NULL;
}

static double get_num(const cJSON *o, const char *k, int *ok)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    *ok = 0;
    return 0;
}

/* A number that must fit an int (a count, a token budget): anything else, 1e300 included, is not
 * ok (the cast of an out-of-range double is undefined behaviour). */
static int get_int(const cJSON *o, const char *k, int *ok)
{
    double d = get_num(o, k, ok);
    if (d >= INT_MIN && d <= INT_MAX) return (int)d;
    *ok = 0;
    return 0;
}

/* A message index ("head", "parent"): -1 when absent or null; -2 (never valid) when it is a number
 * no conversation could hold, so store_conv_import refuses it. */
static long get_index(const cJSON *v)
{
    if (!cJSON_IsNumber(v)) return -1;
    return v->valuedouble >= -1 && v->valuedouble <= 1e15 ? (long)v->valuedouble : -2;
}

static int get_params(const cJSON *v, store_params *p, const char **what)
{
    memset(p, 0, sizeof *p);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsObject(v)) return -1;
    int ok = 1;
    p->set = 1;
    p->temperature = get_num(v, "temperature", &ok);
    p->top_k = get_int(v, "top_k", &ok);
    p->top_p = get_num(v, "top_p", &ok);
    p->min_p = get_num(v, "min_p", &ok);
    p->repeat_penalty = get_num(v, "repeat_penalty", &ok);
    p->repeat_last_n = get_int(v, "repeat_last_n", &ok);
    p->presence_penalty = get_num(v, "presence_penalty", &ok);
    p->frequency_penalty = get_num(v, "frequency_penalty", &ok);
    p->max_tokens = get_int(v, "max_tokens", &ok);
    const char *seed = get_str(v, "seed", &ok, 1);
    if (seed) {
        char *end;
        errno = 0;
        p->seed = strtoull(seed, &end, 10);
        if (errno || *end || !*seed) ok = 0;
        p->seed_set = 1;
    }
    if (!ok) *what = "params";
    return ok ? 0 : -1;
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    size_t r;
    while ((r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n - 1 == 0) {
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
            cap *= 2;
        }
    }
    b[n] = 0;
    *len = n;
    return b;
}

/* cJSON ends a string at the NUL byte that "\u0000" decodes to, so a reply holding one would
 * be cut. Before parsing, each \u0000 escape in a string becomes \uffff (same length; U+FFFF
 * is a noncharacter no model writes), turned back into NUL in the message texts by
 * unmark_nuls. Sets *had_nul; returns -1 when the text already holds U+FFFF (raw or escaped)
 * as well as \u0000, where the swap would be ambiguous. */
static int mark_nuls(char *t, size_t len, int *had_nul)
{
    int in_str = 0, had_ffff = 0;
    *had_nul = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == 0xEF && i + 2 < len && (unsigned char)t[i + 1] == 0xBF && (unsigned char)t[i + 2] == 0xBF) had_ffff = 1;
        if (!in_str) {
            in_str = c == '"';
        } else if (c == '"') {
            in_str = 0;
        } else if (c == '\\' && i + 1 < len) {
            if (t[i + 1] == 'u' && i + 5 < len) {
                if (!memcmp(t + i + 2, "0000", 4)) {
                    memcpy(t + i + 2, "ffff", 4);
                    *had_nul = 1;
                } else if (!strncasecmp(t + i + 2, "ffff", 4)) {
                    had_ffff = 1;
                }
                i += 5;
            } else {
                i++;
            }
        }
    }
    return *had_nul && had_ffff ? -1 : 0;
}

/* U+FFFF (EF BF BF) back to NUL in place; returns the new length. */
static size_t unmark_nuls(char *s, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)s[i] == 0xEF && i + 2 < len && (unsigned char)s[i + 1] == 0xBF && (unsigned char)s[i + 2] == 0xBF) {
            s[o++] = 0;
            i += 2;
        } else {
            s[o++] = s[i];
        }
    }
    s[o] = 0;
    return o;
}

static int cmd_import(store *s, const char *file)
{
    FILE *f = strcmp(file, "-") ? fopen(file, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "kvchat: %s: %s\n", file, strerror(errno));
        return SC_RUNTIME;
    }
    size_t len = 0;
    char *text = read_all(f, &len);
    if (f != stdin) fclose(f);
    if (!text) {
        fprintf(stderr, "kvchat: %s: cannot read it\n", file);
        return SC_RUNTIME;
    }
    int had_nul = 0;
    if (mark_nuls(text, len, &had_nul)) {
        fprintf(stderr, "kvchat: %s: a message holds both NUL (\\u0000) and U+FFFF; kvchat import cannot tell them apart\n",
                file);
        free(text);
        return SC_RUNTIME;
    }
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(o) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "format")) ||
        strcmp(cJSON_GetObjectItemCaseSensitive(o, "format")->valuestring, EXPORT_FORMAT)) {
        fprintf(stderr, "kvchat: %s: not a kvchat export (a JSON object with \"format\": \"%s\")\n", file, EXPORT_FORMAT);
        cJSON_Delete(o);
        return SC_RUNTIME;
    }
    int ok = 1;
    double ver = get_num(o, "version", &ok);
    if (!ok || ver != EXPORT_VERSION) {
        fprintf(stderr, "kvchat: %s: export version %g; this kvchat reads version %d\n", file, ver, EXPORT_VERSION);
        cJSON_Delete(o);
        return SC_RUNTIME;
    }
    const char *what = NULL;
    store_conv c;
    memset(&c, 0, sizeof c);
    c.title = (char *)get_str(o, "title", &ok, 0);
    if (!ok) what = "title";
    if (!what && parse_iso(get_str(o, "created_at", &ok, 0), &c.created_at)) what = "created_at";
    if (!what && parse_iso(get_str(o, "updated_at", &ok, 0), &c.updated_at)) what = "updated_at";
    c.system_prompt = (char *)get_str(o, "system_prompt", &ok, 1);
    if (!what && !ok) what = "system_prompt";
    if (!what && get_params(cJSON_GetObjectItemCaseSensitive(o, "params"), &c.params, &what)) what = "params";
    const cJSON *mobj = cJSON_GetObjectItemCaseSensitive(o, "model");
    const char *mfp = NULL, *mname = NULL, *mpath = NULL, *march = NULL, *mtype = NULL;
    if (!what && cJSON_IsObject(mobj)) {
        mfp = get_str(mobj, "fingerprint", &ok, 0);
        mname = get_str(mobj, "name", &ok, 0);
        mpath = get_str(mobj, "path", &ok, 0);
        march = get_str(mobj, "arch", &ok, 0);
        mtype = get_str(mobj, "weight_type", &ok, 0);
        if (!ok) what = "model";
    } else if (!what && mobj && !cJSON_IsNull(mobj)) what = "model";
    /* the models of the replies (optional: older exports have none): registered by fingerprint */
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(o, "models");
    int64_t *model_ids = NULL;
    int n_models = 0;
    if (!what && models && !cJSON_IsNull(models)) {
        if (!cJSON_IsArray(models)) what = "models";
        else if ((n_models = cJSON_GetArraySize(models)) > 0 && !(model_ids = calloc((size_t)n_models, sizeof *model_ids)))
            what = "models (out of memory)";
        int k = 0;
        const cJSON *mi;
        cJSON_ArrayForEach(mi, models) {
            if (what) break;
            int mok = 1;
            const char *fp = get_str(mi, "fingerprint", &mok, 0), *nm = get_str(mi, "name", &mok, 0),
                       *pa = get_str(mi, "path", &mok, 0), *ar = get_str(mi, "arch", &mok, 0),
                       *wt = get_str(mi, "weight_type", &mok, 0);
            store_error merr = {0};
            if (!mok || !*fp) what = "models";
            else if (store_model_register(s, fp, pa, nm, ar, wt, 0, &model_ids[k], &merr)) {
                fprintf(stderr, "kvchat: %s\n", merr.msg);
                cJSON_Delete(o);
                free(model_ids);
                return SC_DB;
            }
            k++;
        }
    }
    const cJSON *head = cJSON_GetObjectItemCaseSensitive(o, "head");
    long head_index = get_index(head);
    if (!what && head && !cJSON_IsNull(head) && !cJSON_IsNumber(head)) what = "head";
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!what && !cJSON_IsArray(arr)) what = "messages";
    size_t n = what ? 0 : (size_t)cJSON_GetArraySize(arr);
    store_msg *m = calloc(n ? n : 1, sizeof *m);
    long *parents = calloc(n ? n : 1, sizeof *parents);
    char msg_what[80] = "";
    size_t i = 0;
    const cJSON *it;
    if (!what && m && parents) {
        cJSON_ArrayForEach(it, arr) {
            store_msg *x = &m[i];
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(it, "parent");
            parents[i] = get_index(p);
            if (p && !cJSON_IsNull(p) && !cJSON_IsNumber(p)) ok = 0;
            x->role = store_role_from_name(get_str(it, "role", &ok, 0));
            x->content = (char *)get_str(it, "content", &ok, 0);
            x->len = x->content ? strlen(x->content) : 0;
            if (x->content && had_nul) x->len = unmark_nuls(x->content, x->len);
            x->n_tokens = get_int(it, "n_tokens", &ok);
            if (parse_iso(get_str(it, "created_at", &ok, 0), &x->created_at)) ok = 0;
            const cJSON *part = cJSON_GetObjectItemCaseSensitive(it, "partial");
            if (!cJSON_IsBool(part)) ok = 0;
            x->partial = cJSON_IsTrue(part);
            const cJSON *g = cJSON_GetObjectItemCaseSensitive(it, "generation");
            if (cJSON_IsObject(g)) {
                x->gen.set = 1;
                x->gen.finish = store_finish_from_name(get_str(g, "finish", &ok, 0));
                const char *pw = NULL;
                if (get_params(cJSON_GetObjectItemCaseSensitive(g, "params"), &x->gen.params, &pw)) ok = 0;
                x->gen.ttft_ms = get_num(g, "ttft_ms", &ok);
                x->gen.prefill_tps = get_num(g, "prefill_tps", &ok);
                x->gen.decode_tps = get_num(g, "decode_tps", &ok);
                x->gen.n_prompt = get_int(g, "n_prompt", &ok);
                x->gen.n_reused = get_int(g, "n_reused", &ok);
                x->gen.n_prefilled = get_int(g, "n_prefilled", &ok);
                x->gen.n_generated = get_int(g, "n_generated", &ok);
                if (x->gen.finish < 0) ok = 0;
            } else if (g && !cJSON_IsNull(g)) ok = 0;
            const cJSON *mk = cJSON_GetObjectItemCaseSensitive(it, "model");
            if (cJSON_IsNumber(mk)) {
                if (mk->valuedouble >= 0 && mk->valuedouble < n_models && mk->valuedouble == (int)mk->valuedouble)
                    x->gen.model_id = model_ids[(int)mk->valuedouble];
                else ok = 0;
            } else if (mk && !cJSON_IsNull(mk)) ok = 0;
            if (x->role < 0) ok = 0;
            if (!ok) {
                snprintf(msg_what, sizeof msg_what, "message %zu", i);
                what = msg_what;
                break;
            }
            i++;
        }
    }
    int rc = SC_OK;
    if (!m || !parents) {
        fprintf(stderr, "kvchat: out of memory\n");
        rc = SC_RUNTIME;
    } else if (what) {
        fprintf(stderr, "kvchat: %s: not a valid kvchat export: bad or missing %s\n", file, what);
        rc = SC_RUNTIME;
    } else {
        int64_t id;
        store_error err = {0};
        int r = store_conv_import(s, &c, mfp, mname, mpath, march, mtype, m, parents, n, head_index, &id, &err);
        if (r == STORE_ERR_INVALID) {
            fprintf(stderr, "kvchat: %s: not a valid kvchat export: %s\n", file, err.msg);
            rc = SC_RUNTIME;
        } else if (r) {
            fprintf(stderr, "kvchat: %s\n", err.msg);
            rc = SC_DB;
        } else {
            printf("%lld\n", (long long)id);
        }
    }
    free(m);
    free(parents);
    free(model_ids);
    cJSON_Delete(o);
    return rc;
}

/* ---- check: what storage cannot know ------------------------------------------------------------- */

/* The saved exact tokens of each conversation (conversations.ctx_tokens) against the vocabulary
 * of the model they were saved for (its GGUF file's tokenizer.ggml.tokens, header only): an id
 * outside it made every later message of that chat fail. Appends one line per bad context to
 * *out (malloc'd, may be NULL) and returns the number of problems. A model file that is gone
 * is said, not counted (the context is never used without its model). */
static int check_contexts(store *s, char **out)
{
    store_conv *rows = NULL;
    size_t n = 0;
    store_error err = {0};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return 0;
    int problems = 0;
    if (store_conv_list(s, NULL, &rows, &n, &err)) {
        fprintf(f, "contexts: %s\n", err.msg);
        problems++;
    }
    int64_t vocab_model = 0;
    int64_t n_vocab = -1;
    for (size_t i = 0; i < n; i++) {
        store_conv c;
        if (store_conv_get(s, rows[i].id, &c, &err)) continue; /* reported by store_check */
        if (c.ctx_tokens && c.n_ctx_tokens && c.ctx_model_id > 0) {
            if (c.ctx_model_id != vocab_model) {
                vocab_model = c.ctx_model_id;
                n_vocab = -1;
                store_model md = {0};
                if (store_model_get(s, c.ctx_model_id, &md, NULL) == STORE_OK) {
                    gguf_file *g = NULL;
                    kv_error ke = {0};
                    const gguf_kv *kv;
                    if (gguf_open(md.path, &g, &ke) == KV_OK && (kv = gguf_find_kv(g, "tokenizer.ggml.tokens")) &&
                        kv->type == GGUF_VT_ARRAY)
                        n_vocab = (int64_t)kv->arr_len;
                    else
                        fprintf(f, "conversation %lld: its saved context was not checked: %s\n", (long long)c.id,
                                ke.msg[0] ? ke.msg : "the model has no vocabulary");
                    gguf_close(g);
                }
                store_model_clear(&md);
            }
            size_t bad = 0, first = 0;
            for (size_t k = 0; n_vocab >= 0 && k < c.n_ctx_tokens; k++)
                if (c.ctx_tokens[k] < 0 || c.ctx_tokens[k] >= n_vocab)
                    if (!bad++) first = k;
            if (bad) {
                fprintf(f, "conversation %lld: its saved context holds %zu token id%s outside the model's vocabulary of "
                           "%lld (token %zu is %d); the chat rebuilds it from the messages\n",
                        (long long)c.id, bad, bad > 1 ? "s" : "", (long long)n_vocab, first, (int)c.ctx_tokens[first]);
                problems++;
            }
        }
        store_conv_clear(&c);
    }
    store_conv_list_free(rows, n);
    fclose(f);
    *out = buf;
    return problems;
}

/* ---- main ------------------------------------------------------------------------------------- */

int store_cli_main(int argc, char **argv)
{
    const char *cmd = argv[0];
    static const struct option opts[] = {
        {"db", required_argument, 0, 'D'}, {"json", no_argument, 0, 'j'}, {"ids", no_argument, 0, 'i'},
        {"format", required_argument, 0, 'f'}, {"output", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *db = NULL, *format = "md", *out_path = NULL;
    int json = 0, ids = 0, o;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        switch (o) {
        case 'D': db = optarg; break;
        case 'j': json = 1; break;
        case 'i': ids = 1; break;
        case 'f': format = optarg; break;
        case 'o': out_path = optarg; break;
        case 'h': return usage(cmd, stdout);
        case ':': fprintf(stderr, "kvchat %s: option '%s' needs a value\n", cmd, argv[optind - 1]); return usage(cmd, stderr);
        default: fprintf(stderr, "kvchat %s: unknown option '%s'\n", cmd, argv[optind - 1]); return usage(cmd, stderr);
        }
    }
    int n_args = argc - optind;
    char **args = argv + optind;
    int is_list = !strcmp(cmd, "list"), is_export = !strcmp(cmd, "export"), is_import = !strcmp(cmd, "import"),
        is_rm = !strcmp(cmd, "rm");
    if ((json || ids) && !is_list) {
        fprintf(stderr, "kvchat %s: --json and --ids belong to `kvchat list`\n", cmd);
        return usage(cmd, stderr);
    }
    if ((is_list || !strcmp(cmd, "check")) && n_args) {
        fprintf(stderr, "kvchat %s: unexpected argument '%s'\n", cmd, args[0]);
        return usage(cmd, stderr);
    }
    if ((is_export || is_import) && n_args != 1) {
        fprintf(stderr, "kvchat %s: needs exactly one %s\n", cmd, is_export ? "conversation ID" : "FILE");
        return usage(cmd, stderr);
    }
    if (is_rm && !n_args) {
        fprintf(stderr, "kvchat rm: which conversation? (kvchat list shows the IDs)\n");
        return usage(cmd, stderr);
    }
    if (is_export && strcmp(format, "md") && strcmp(format, "json")) {
        fprintf(stderr, "kvchat export: unknown --format '%s' (md or json)\n", format);
        return SC_USAGE;
    }
    store *s = NULL;
    int write = is_import || is_rm ? 1 : !strcmp(cmd, "check") ? 2 : 0;
    int rc = open_db(db, write, is_list, &s);
    if (rc) return rc;
    if (is_list) rc = cmd_list(s, json, ids);
    else if (is_import) rc = cmd_import(s, args[0]);
    else if (is_rm) {
        for (int i = 0; i < n_args; i++) {
            char *end;
            errno = 0;
            long long id = strtoll(args[i], &end, 10);
            store_error err = {0};
            if (errno || *end || id <= 0) {
                fprintf(stderr, "kvchat rm: '%s' is not a conversation ID\n", args[i]);
                rc = SC_USAGE;
            } else if (store_conv_delete(s, id, &err)) {
                fprintf(stderr, "kvchat: %s\n", err.msg);
                if (!rc) rc = err.code == STORE_ERR_NOTFOUND ? SC_RUNTIME : SC_DB;
            } else {
                printf("deleted conversation %lld\n", id);
            }
        }
    } else if (is_export) {
        int64_t id = 0;
        store_error err = {0};
        char why[800];
        if (!strcmp(args[0], "last")) {
            if (store_conv_last(s, &id, &err)) {
                fprintf(stderr, "kvchat: %s\n", err.msg);
                rc = SC_RUNTIME;
            }
        } else {
            char *end;
            errno = 0;
            id = strtoll(args[0], &end, 10);
            if (errno || *end || id <= 0) {
                fprintf(stderr, "kvchat export: '%s' is not a conversation ID (a number, or 'last')\n", args[0]);
                rc = SC_USAGE;
            }
        }
        char *text = rc ? NULL : !strcmp(format, "json") ? store_cli_export_json(s, id, why, sizeof why)
                                                         : store_cli_export_md(s, id, why, sizeof why);
        if (!rc && !text) {
            fprintf(stderr, "kvchat: %s\n", why);
            rc = strstr(why, "no conversation") ? SC_RUNTIME : SC_DB;
        }
        if (text) {
            FILE *f = out_path ? fopen(out_path, "wb") : stdout;
            if (!f) {
                fprintf(stderr, "kvchat: %s: %s\n", out_path, strerror(errno));
                rc = SC_RUNTIME;
            } else {
                size_t tl = strlen(text);
                if (fwrite(text, 1, tl, f) != tl || (tl && text[tl - 1] != '\n' && fputc('\n', f) == EOF)) rc = SC_RUNTIME;
                if (f != stdout && fclose(f)) rc = SC_RUNTIME;
                if (rc) fprintf(stderr, "kvchat: %s: write error\n", out_path ? out_path : "standard output");
            }
            free(text);
        }
    } else { /* check */
        char *report = NULL;
        int n_problems = 0;
        store_error err = {0};
        if (store_check(s, &report, &n_problems, &err)) {
            fprintf(stderr, "kvchat: %s\n", err.msg);
            rc = SC_DB;
        } else {
            char *more = NULL;
            int n_more = check_contexts(s, &more);
            /* the storage's problems, then the contexts' lines, then "ok" when neither found one */
            printf("%s: ", store_path(s));
            if (n_problems) out_plain(stdout, report, strlen(report)); /* it quotes stored text (a bad role …) */
            if (more) out_plain(stdout, more, strlen(more));
            if (!n_problems && !n_more) out_plain(stdout, report, strlen(report));
            free(more);
            rc = n_problems || n_more ? SC_DB : SC_OK;
        }
        free(report);
    }
    store_close(s);
    return rc;
}
