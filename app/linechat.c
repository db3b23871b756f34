/* linechat: the line-by-line session (TERM=dumb, or no terminal to draw on) — completion mode with the full screen's slash commands (its one table), saved like the chat. */
#include "app/linechat.h"

#include <ctype.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/chat.h"
#include "app/chatstore.h"
#include "app/config.h"
#include "app/models.h"
#include "app/output.h"
#include "app/version.h"
#include "engine/kernels/quant.h"

#define LINE_MAX_TURNS 256 /* exchanges /undo, /regen and /edit can go back over */

typedef struct line_turn {
    size_t len0;             /* the running text's length before the user's text */
    size_t reply0;           /* ... before the reply */
    int64_t parent;          /* the stored message the user's followed (0: the conversation's start) */
    int64_t user_id;         /* the stored user message (0: an empty line, or nothing saved) */
} line_turn;

typedef struct line_session {
    engine *e;
    sampler *s;
    const linechat_options *o;
    FILE *ui;                /* banner, notices: the terminal (stdout, or stderr when stdout is not one) */
    sampler_params sp;
    int max_tokens;
    chatstore *cs;
    int64_t last_id;         /* the stored message the next one follows */
    char *conv;              /* the running text */
    size_t len, cap;
    char *system;            /* --system, /system, a persona's: the text starts with it and a blank line */
    char *attach;            /* /read FILE: its text goes before the next message */
    size_t attach_len;
    char attach_name[256];
    line_turn turns[LINE_MAX_TURNS];
    int n_turns;
    int quit;
} line_session;

static int grow(line_session *L, size_t add)
{
    while (L->len + add + 2 > L->cap) {
        char *nb = realloc(L->conv, L->cap * 2);
        if (!nb) return -1;
        L->conv = nb;
        L->cap *= 2;
    }
    return 0;
}

typedef struct reply_acc {
    line_session *L;
    size_t start;            /* where the reply begins in L->conv */
} reply_acc;

static int on_text(void *ud, const char *text, size_t n, int32_t token)
{
    (void)token;
    reply_acc *a = ud;
    line_session *L = a->L;
    out_plain(stdout, text, n);
    fflush(stdout);
    if (grow(L, n)) return 1;
    memcpy(L->conv + L->len, text, n);
    L->len += n;
    L->conv[L->len] = 0;
    return 0;
}

static int should_stop(void *ud)
{
    reply_acc *a = ud;
    return a->L->o->interrupted && *a->L->o->interrupted;
}

/* The model's name as the full screen shows it: general.name unless that is only the architecture,
 * else the file's name (chatstore_label). */
static void model_label_of(const model *m, char *buf, size_t cap)
{
    chatstore_label(m->name, m->arch_name, m->gguf && m->gguf->path ? m->gguf->path : "model", buf, cap);
}

/* ---- a turn ------------------------------------------------------------------------------------ */

/* The model continues the running text (after the system prompt and a blank line); the reply is
 * saved under L->last_id. user_id: the user message this reply answers (0: none new). */
static void reply(line_session *L, int64_t user_id)
{
    if (L->o->interrupted) *L->o->interrupted = 0;
    kv_error err = {0};
    int32_t *toks = NULL;
    size_t n = 0, sl = L->system ? strlen(L->system) : 0;
    char *prompt = L->conv;
    if (sl) { /* the chat's completion mode: the system prompt, a blank line, the text */
        if (!(prompt = malloc(sl + 2 + L->len + 1))) return;
        memcpy(prompt, L->system, sl);
        memcpy(prompt + sl, "\n\n", 2);
        memcpy(prompt + sl + 2, L->conv, L->len + 1);
    }
    int rc = engine_tokenize(L->e, prompt, sl ? sl + 2 + L->len : L->len, L->o->no_bos, 0, &toks, &n, &err);
    if (sl) free(prompt);
    if (rc) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        return;
    }
    reply_acc acc = {L, L->len};
    gen_callbacks cb = {.on_text = on_text, .should_stop = should_stop, .ud = &acc};
    gen_stats st;
    int finish = GEN_FINISH_ERROR;
    rc = engine_generate(L->e, toks, n, L->max_tokens < 0 ? 256 : L->max_tokens, L->s, &cb, &st, &finish, &err);
    free(toks);
    if (rc) fprintf(stderr, "\nkvchat: %s\n", err.msg);
    printf("\n");
    fflush(stdout);
    if (L->o->stats)
        fprintf(stderr, "prompt: %d tokens (%d reused, %d prefilled) | TTFT %.1f ms | decode %d tokens, %.1f t/s | finish: %s\n",
                st.n_prompt, st.n_reused, st.n_prefilled, st.ttft_ms, st.n_generated, st.decode_tps,
                gen_finish_name(rc ? GEN_FINISH_ERROR : finish));
    char why[700];
    if (L->cs && L->len > acc.start) {
        int nh = 0;
        const int32_t *hist = engine_history(L->e, &nh);
        if (chatstore_reply(L->cs, L->last_id, 0, user_id, L->conv + acc.start, L->len - acc.start,
                            rc ? GEN_FINISH_ERROR : finish, &st, &L->sp, L->max_tokens, sampler_seed(L->s), hist,
                            (size_t)nh, &L->last_id, why, sizeof why))
            fprintf(stderr, "kvchat: %s\n", why);
    }
}

/* The user's line (with a /read file before it): appended to the text, saved, and replied to. */
static void turn(line_session *L, const char *text_in)
{
    char *joined = NULL;
    const char *text = text_in;
    if (L->attach) { /* as the full screen sends it: "File NAME:", a blank line, the file, a blank line */
        size_t cap = L->attach_len + strlen(text_in) + strlen(L->attach_name) + 64;
        if ((joined = malloc(cap))) {
            int k = snprintf(joined, cap, "File %s:\n\n", L->attach_name);
            memcpy(joined + k, L->attach, L->attach_len);
            snprintf(joined + k + L->attach_len, cap - (size_t)k - L->attach_len, "\n\n%s", text_in);
            text = joined;
        }
        free(L->attach);
        L->attach = NULL;
    }
    size_t ll = strlen(text);
    if (grow(L, ll)) {
        free(joined);
        return;
    }
    line_turn t = {.len0 = L->len, .parent = L->last_id};
    if (L->len && ll) L->conv[L->len++] = ' ';
    memcpy(L->conv + L->len, text, ll + 1);
    L->len += ll;
    t.reply0 = L->len;
    char why[700];
    if (L->cs && ll &&
        chatstore_user_message(L->cs, L->last_id, text, ll, L->system, &L->sp, L->max_tokens, &L->last_id, why,
                               sizeof why))
        fprintf(stderr, "kvchat: %s\n", why);
    t.user_id = ll && L->last_id != t.parent ? L->last_id : 0;
    free(joined);
    if (L->n_turns == LINE_MAX_TURNS) { /* the oldest exchange can no longer be undone */
        memmove(L->turns, L->turns + 1, sizeof L->turns[0] * (LINE_MAX_TURNS - 1));
        L->n_turns--;
    }
    L->turns[L->n_turns++] = t;
    reply(L, t.user_id);
}

/* ---- slash commands: the full screen's table (chat_command_name), each done here or refused with
 * the reason ------------------------------------------------------------------------------------ */

static void say_head(line_session *L, int64_t head)
{
    char why[700];
    if (L->cs && chatstore_current(L->cs) && chatstore_set_head(L->cs, head, why, sizeof why))
        fprintf(stderr, "kvchat: %s\n", why);
}

static void cmd_help(line_session *L, char *args);
static void cmd_quit(line_session *L, char *args) { (void)args; L->quit = 1; }

static void cmd_set(line_session *L, char *args)
{
    char *value = args + strcspn(args, " ");
    if (*value) *value++ = 0;
    while (*value == ' ') value++;
    for (char *p = args; *p; p++)
        if (*p == '-') *p = '_';
    char msg[300];
    if (!*args || !*value) {
        fprintf(L->ui, "usage: /set NAME VALUE (temp top_k top_p min_p repeat_penalty repeat_last_n presence_penalty "
                       "frequency_penalty seed max_tokens)\n");
        return;
    }
    if (chat_set_param(args, value, &L->sp, &L->max_tokens, msg, sizeof msg)) {
        fprintf(L->ui, "%s\n", msg);
        return;
    }
    sampler_set_params(L->s, &L->sp);
    fprintf(L->ui, "%s\n", msg);
}

static void cmd_show(line_session *L, char *args)
{
    if (!strcmp(args, "cache")) {
        char rep[2000];
        if (!L->cs) fprintf(L->ui, "/show cache: conversations are not being saved\n");
        else {
            chatstore_report(L->cs, rep, sizeof rep);
            fprintf(L->ui, "%s\n", rep);
        }
        return;
    }
    if (*args && strcmp(args, "params")) {
        fprintf(L->ui, "/show %s: not in line mode (params and cache are; the expert heat map needs the full screen)\n",
                args);
        return;
    }
    char seed[32];
    if (L->sp.seed == SAMPLER_SEED_RANDOM) snprintf(seed, sizeof seed, "random");
    else snprintf(seed, sizeof seed, "%llu", (unsigned long long)L->sp.seed);
    fprintf(L->ui, "temp %.2f · top_k %d · top_p %.2f · min_p %.2f · repeat_penalty %.2f · repeat_last_n %d · "
                   "presence_penalty %.2f · frequency_penalty %.2f · seed %s · max_tokens %d\n",
            L->sp.temperature, L->sp.top_k, L->sp.top_p, L->sp.min_p, L->sp.repeat_penalty, L->sp.repeat_last_n,
            L->sp.presence_penalty, L->sp.frequency_penalty, seed, L->max_tokens < 0 ? 256 : L->max_tokens);
}

static void cmd_clear(line_session *L, char *args)
{
    (void)args;
    L->len = 0;
    L->conv[0] = 0;
    L->n_turns = 0;
    L->last_id = 0;
    engine_reset(L->e);
    if (L->cs) chatstore_new(L->cs);
    fprintf(L->ui, "new conversation\n");
}

static void cmd_undo(line_session *L, char *args)
{
    (void)args;
    if (!L->n_turns) {
        fprintf(L->ui, "/undo: nothing to undo\n");
        return;
    }
    line_turn t = L->turns[--L->n_turns];
    L->len = t.len0;
    L->conv[L->len] = 0;
    L->last_id = t.parent;
    say_head(L, t.parent);
    fprintf(L->ui, "dropped the last exchange (the store keeps it as a branch)\n");
}

static void cmd_regen(line_session *L, char *args)
{
    (void)args;
    if (!L->n_turns) {
        fprintf(L->ui, "/regen: no message to answer again\n");
        return;
    }
    line_turn *t = &L->turns[L->n_turns - 1];
    L->len = t->reply0;
    L->conv[L->len] = 0;
    L->last_id = t->user_id ? t->user_id : t->parent;
    say_head(L, L->last_id);
    reply(L, 0); /* a new branch under the same message */
}

static void cmd_edit(line_session *L, char *args)
{
    if (!*args) {
        fprintf(L->ui, "usage: /edit TEXT (line mode has no editor to put your last message back in: type it "
                       "anew; the answer goes on a new branch)\n");
        return;
    }
    if (!L->n_turns) {
        fprintf(L->ui, "/edit: no message to edit\n");
        return;
    }
    line_turn t = L->turns[--L->n_turns];
    L->len = t.len0;
    L->conv[L->len] = 0;
    L->last_id = t.parent;
    turn(L, args); /* under the same parent: a branch beside the original */
}

static void cmd_system(line_session *L, char *args)
{
    if (!*args) {
        fprintf(L->ui, "system prompt: %s (/system TEXT sets it, /system - clears it)\n",
                L->system && *L->system ? L->system : "(none)");
        return;
    }
    free(L->system);
    L->system = strcmp(args, "-") ? strdup(args) : NULL;
    char why[700];
    if (L->cs && chatstore_current(L->cs) && chatstore_set_system(L->cs, L->system, why, sizeof why))
        fprintf(stderr, "kvchat: %s\n", why);
    fprintf(L->ui, L->system ? "system prompt set: the text starts with it from the next reply\n"
                             : "system prompt cleared\n");
}

static void cmd_persona(line_session *L, char *args)
{
    const kv_config *cfg = L->o->config;
    if (!*args || !cfg || !config_persona_find(cfg, args)) {
        if (*args) fprintf(L->ui, "/persona: no persona '%s' in %s\n", args, cfg && cfg->path[0] ? cfg->path : "config.ini");
        fprintf(L->ui, "personas:");
        for (int i = 0; cfg && i < cfg->n_personas; i++) fprintf(L->ui, " %s", cfg->persona[i].name);
        fprintf(L->ui, "%s\n", cfg && cfg->n_personas ? " (/persona NAME applies one)"
                                                       : " none — add [persona NAME] sections to config.ini");
        return;
    }
    const cfg_persona *p = config_persona_find(cfg, args);
    sampler_params sp = L->sp;
    int max_tokens = L->max_tokens;
    for (int k = 0; k < CFG_COUNT; k++)
        if (p->v[k] && k != CFG_SYSTEM) config_apply_key(k, p->v[k], NULL, &sp, &max_tokens);
    if (max_tokens <= 0) max_tokens = -1;
    kv_error ke = {0};
    if (sampler_params_validate(&sp, &ke)) {
        fprintf(L->ui, "/persona %s: %s\n", args, ke.msg);
        return;
    }
    L->sp = sp;
    L->max_tokens = max_tokens;
    sampler_set_params(L->s, &L->sp);
    if (p->v[CFG_SYSTEM]) {
        free(L->system);
        L->system = strdup(p->v[CFG_SYSTEM]);
    }
    fprintf(L->ui, "persona %s: temp %.2f · top_k %d · top_p %.2f · max_tokens %d%s%s\n", p->name, sp.temperature,
            sp.top_k, sp.top_p, max_tokens < 0 ? 256 : max_tokens, p->v[CFG_SYSTEM] ? " · system: " : "",
            p->v[CFG_SYSTEM] ? p->v[CFG_SYSTEM] : "");
}

static void cmd_model(line_session *L, char *args)
{
    const model *m = engine_model(L->e);
    if (!*args) {
        char dir[1024] = "";
        models_dir(dir, sizeof dir);
        char label[160];
        model_label_of(m, label, sizeof label);
        fprintf(L->ui, "model: %s (%s); /model NAME|PATH switches (the models directory: %s)\n", label,
                m->gguf && m->gguf->path ? m->gguf->path : "?", dir[0] ? dir : "none");
        return;
    }
    if (!L->o->ep) {
        fprintf(L->ui, "/model: not available here\n");
        return;
    }
    char path[4096];
    int found = models_resolve(args, path, sizeof path);
    if (found < 0) {
        fprintf(L->ui, "/model: %s\n", path);
        return;
    }
    const char *home = getenv("HOME");
    if (found == 0) {
        if (args[0] == '~' && args[1] == '/' && home) snprintf(path, sizeof path, "%s%s", home, args + 1);
        else snprintf(path, sizeof path, "%s", args);
    }
    engine_params ep = *L->o->ep;
    ep.model_path = path;
    engine *ne = NULL;
    sampler *ns = NULL;
    kv_error ke = {0};
    fprintf(L->ui, "loading %s…\n", path);
    if (engine_open(&ep, &ne, &ke) || !(ns = sampler_create(engine_model(ne)->hp.n_vocab, &L->sp, &ke))) {
        engine_close(ne);
        fprintf(L->ui, "/model: %s (still on %s)\n", ke.msg, m->gguf && m->gguf->path ? m->gguf->path : m->name);
        return;
    }
    char old[160], label[160];
    model_label_of(m, old, sizeof old);
    char why[900];
    if (L->cs && chatstore_switch_engine(L->cs, ne, why, sizeof why)) fprintf(stderr, "kvchat: %s\n", why);
    sampler_free(L->s);
    engine_close(L->e);
    L->e = ne;
    L->s = ns;
    const model *nm = engine_model(ne);
    model_label_of(nm, label, sizeof label);
    fprintf(L->ui, "model: %s → %s (%s, %s, n_ctx %d): the text is tokenized again for it\n", old, label,
            nm->arch_name, quant_traits_of(nm->weight_type) ? quant_traits_of(nm->weight_type)->name : "?",
            engine_n_ctx(ne));
}

static void cmd_read(line_session *L, char *args)
{
    if (!*args) {
        if (L->attach) fprintf(L->ui, "/read: %s is no longer attached\n", L->attach_name);
        else fprintf(L->ui, "usage: /read FILE (attaches a text file to your next message)\n");
        free(L->attach);
        L->attach = NULL;
        return;
    }
    char path[4096], why[300];
    size_t n = 0;
    int unreadable = 0;
    char *buf = chat_read_text(args, &n, path, sizeof path, &unreadable, why, sizeof why);
    if (!buf) {
        fprintf(L->ui, "/read %s: %s%s\n", args, why, unreadable ? "" : "; not attached");
        return;
    }
    int32_t *toks = NULL;
    size_t nt = 0;
    kv_error ke = {0};
    int rc = engine_tokenize(L->e, buf, n, 1, 0, &toks, &nt, &ke);
    free(toks);
    if (rc || nt > (size_t)engine_n_ctx(L->e) / 2) {
        if (rc) fprintf(L->ui, "/read %s: its tokens could not be counted; not attached\n", args);
        else fprintf(L->ui, "/read %s: %zu tokens, more than half the context (%d): raise -c; not attached\n", args, nt,
                     engine_n_ctx(L->e));
        free(buf);
        return;
    }
    const char *base = strrchr(path, '/');
    free(L->attach);
    L->attach = buf;
    L->attach_len = n;
    snprintf(L->attach_name, sizeof L->attach_name, "%.255s", base ? base + 1 : path);
    fprintf(L->ui, "attached %s (%zu bytes, %zu tokens) to your next message (/read alone drops it)\n", L->attach_name, n,
            nt);
}

static void cmd_export(line_session *L, char *args)
{
    char msg[4400];
    chat_export_conv(L->cs, args, msg, sizeof msg);
    fprintf(L->ui, "%s\n", msg);
}

/* What line mode does with each of the full screen's commands: a handler, or why it does not apply. */
typedef struct line_cmd {
    const char *name, *alias1, *alias2;
    void (*handler)(line_session *L, char *args);
    const char *not_here;    /* the reason, for a command that needs the full screen */
} line_cmd;

static const line_cmd line_cmds[] = {
    {"/help", "/?", NULL, cmd_help, NULL},
    {"/set", NULL, NULL, cmd_set, NULL},
    {"/show", NULL, NULL, cmd_show, NULL},
    {"/sessions", NULL, NULL, NULL, "the saved conversations are a panel of the full screen: `kvchat list` lists "
                                    "them, `kvchat export ID` prints one, `kvchat --resume ID` goes on with one"},
    {"/clear", NULL, NULL, cmd_clear, NULL},
    {"/regen", NULL, NULL, cmd_regen, NULL},
    {"/undo", NULL, NULL, cmd_undo, NULL},
    {"/edit", NULL, NULL, cmd_edit, NULL},
    {"/branch", NULL, NULL, NULL, "branches need the full screen's tree; line mode follows one path (/regen and "
                                  "/edit make branches, `kvchat export` shows them)"},
    {"/theme", NULL, NULL, NULL, "line mode has no colours"},
    {"/system", NULL, NULL, cmd_system, NULL},
    {"/export", NULL, NULL, cmd_export, NULL},
    {"/persona", NULL, NULL, cmd_persona, NULL},
    {"/model", NULL, NULL, cmd_model, NULL},
    {"/read", NULL, NULL, cmd_read, NULL},
    {"/copy", NULL, NULL, NULL, "a dumb terminal has no clipboard escape (OSC 52): select the text on screen, or "
                                "/export it to a file"},
    {"/best", NULL, NULL, NULL, "its other samples are branches; one-shot: kvchat -p TEXT --best-of N"},
    {"/beams", NULL, NULL, NULL, "not in line mode yet; one-shot: kvchat -p TEXT --beams N"},
    {"/quit", "/exit", "/q", cmd_quit, NULL},
};
#define N_LINE_CMDS (sizeof line_cmds / sizeof line_cmds[0])

static const line_cmd *line_cmd_of(const char *name)
{
    for (size_t i = 0; i < N_LINE_CMDS; i++)
        if (!strcmp(name, line_cmds[i].name)) return &line_cmds[i];
    return NULL;
}

/* /help: the full screen's command table, in its order and words; each command line mode does
 * not do says why. */
static void cmd_help(line_session *L, char *args)
{
    (void)args;
    const char *help, *name;
    for (size_t i = 0; (name = chat_command_name(i, &help)) != NULL; i++) {
        for (const char *p = help; *p;) {
            size_t n = strcspn(p, "\n");
            const char *at = memchr(p, '@', n);
            size_t keep = at ? (size_t)(at - p) : n; /* "@set", "…@personas": lists the screen fills in */
            if (keep) {
                const char *tab = memchr(p, '\t', keep);
                if (tab == p) fprintf(L->ui, "%19s%.*s\n", "", (int)(keep - 1), p + 1);
                else if (tab) fprintf(L->ui, "%-18.*s %.*s\n", (int)(tab - p), p, (int)(keep - (size_t)(tab - p) - 1), tab + 1);
                else fprintf(L->ui, "%.*s\n", (int)keep, p);
            }
            p += n + (p[n] == '\n');
        }
        const line_cmd *lc = line_cmd_of(name);
        if (!lc || !lc->handler) fprintf(L->ui, "%19s(not in line mode: %s)\n", "", lc ? lc->not_here : "it needs the full screen");
    }
    fprintf(L->ui, "//text             send text that starts with '/'\n"
                   "(empty line)       let the model go on\n");
}

static int run_command(line_session *L, const char *line)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", line);
    size_t l = strlen(buf);
    while (l && isspace((unsigned char)buf[l - 1])) buf[--l] = 0;
    char *args = buf + strcspn(buf, " ");
    if (*args) *args++ = 0;
    while (*args == ' ') args++;
    for (size_t i = 0; i < N_LINE_CMDS; i++) {
        const line_cmd *c = &line_cmds[i];
        if (!strcmp(buf, c->name) || (c->alias1 && !strcmp(buf, c->alias1)) || (c->alias2 && !strcmp(buf, c->alias2))) {
            if (c->handler) c->handler(L, args);
            else fprintf(L->ui, "%s: not in line mode: %s\n", c->name, c->not_here);
            return 1;
        }
    }
    /* a command of the full screen's table that this file does not know yet */
    const char *name;
    for (size_t i = 0; (name = chat_command_name(i, NULL)) != NULL; i++)
        if (!strcmp(buf, name)) {
            fprintf(L->ui, "%s: not in line mode: it needs the full screen\n", name);
            return 1;
        }
    fprintf(L->ui, "unknown command '%.40s' — /help lists the commands\n", buf);
    return 1;
}

int linechat_run(engine **pe, sampler **ps, const linechat_options *o)
{
    line_session S = {.e = *pe, .s = *ps, .o = o, .max_tokens = o->n_predict, .cap = 1 << 16};
    line_session *L = &S;
    L->sp = *sampler_get_params(L->s);
    L->ui = isatty(STDOUT_FILENO) ? stdout : stderr;
    rl_outstream = L->ui;
    if (!(L->conv = malloc(L->cap))) return 1;
    L->conv[0] = 0;
    if (o->system && *o->system) L->system = strdup(o->system);
    const model *m = engine_model(L->e);
    char label[160];
    model_label_of(m, label, sizeof label);
    fprintf(L->ui, "kvchat %s — %s (%s, %s), n_ctx %d, %d threads\n", KVCHAT_VERSION, label, m->arch_name,
            quant_traits_of(m->weight_type)->name, engine_n_ctx(L->e), engine_n_threads(L->e));
    char why[900];
    if (o->db_path && !(L->cs = chatstore_open(L->e, o->db_path, o->cache_bytes, why, sizeof why)))
        fprintf(stderr, "kvchat: conversations are not saved: %s\n", why);
    fprintf(L->ui, "Type text for the model to continue; an empty line continues it; /help lists the commands; "
                   "Ctrl-D quits; Ctrl-C stops a reply.\n");
    char *line;
    while (!L->quit && (line = readline("> ")) != NULL) {
        if (*line) add_history(line);
        if (line[0] == '/' && line[1] != '/') run_command(L, line);
        else turn(L, line[0] == '/' ? line + 1 : line);
        free(line);
    }
    if (!L->quit) printf("\n");
    chatstore_close(L->cs);
    free(L->conv);
    free(L->system);
    free(L->attach);
    *pe = L->e; /* /model may have replaced them */
    *ps = L->s;
    return 0;
}
