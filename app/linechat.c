/* linechat: the line-by-line session (TERM=dumb, or no terminal to draw on) — completion mode with the chat's slash commands, saved like the chat. */
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
#include "app/output.h"
#include "app/version.h"
#include "engine/kernels/quant.h"

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

/* ---- slash commands: one table (dispatch and /help) ------------------------------------------ */

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
    (void)args;
    char seed[32];
    if (L->sp.seed == SAMPLER_SEED_RANDOM) snprintf(seed, sizeof seed, "random");
    else snprintf(seed, sizeof seed, "%llu", (unsigned long long)L->sp.seed);
    fprintf(L->ui, "temp %.2f · top_k %d · top_p %.2f · min_p %.2f · repeat_penalty %.2f · repeat_last_n %d · "
                   "presence_penalty %.2f · frequency_penalty %.2f · seed %s · max_tokens %d\n",
            L->sp.temperature, L->sp.top_k, L->sp.top_p, L->sp.min_p, L->sp.repeat_penalty, L->sp.repeat_last_n,
            L->sp.presence_penalty, L->sp.frequency_penalty, seed, L->max_tokens < 0 ? 256 : L->max_tokens);
}

typedef struct line_cmd {
    const char *name, *alias1, *alias2, *help;
    void (*handler)(line_session *L, char *args);
} line_cmd;

static const line_cmd line_cmds[] = {
    {"/help", "/?", NULL, "/help              this help", cmd_help},
    {"/set", NULL, NULL, "/set NAME VALUE    change a parameter (the chat's names and ranges)", cmd_set},
    {"/show", NULL, NULL, "/show [params]     list the parameters", cmd_show},
    {"/quit", "/exit", "/q", "/quit              quit (also Ctrl-D)", cmd_quit},
};

static void cmd_help(line_session *L, char *args)
{
    (void)args;
    for (size_t i = 0; i < sizeof line_cmds / sizeof line_cmds[0]; i++) fprintf(L->ui, "%s\n", line_cmds[i].help);
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
    for (size_t i = 0; i < sizeof line_cmds / sizeof line_cmds[0]; i++) {
        const line_cmd *c = &line_cmds[i];
        if (!strcmp(buf, c->name) || (c->alias1 && !strcmp(buf, c->alias1)) || (c->alias2 && !strcmp(buf, c->alias2))) {
            c->handler(L, args);
            return 1;
        }
    }
    fprintf(L->ui, "unknown command '%.40s' — /help lists the commands\n", buf);
    return 1;
}

/* ---- a turn ------------------------------------------------------------------------------------ */

static void turn(line_session *L, const char *text)
{
    size_t ll = strlen(text);
    if (grow(L, ll)) return;
    size_t before = L->len;
    if (L->len && ll) L->conv[L->len++] = ' ';
    memcpy(L->conv + L->len, text, ll + 1);
    L->len += ll;
    char why[700];
    if (L->cs && ll &&
        chatstore_user_message(L->cs, L->last_id, text, ll, NULL, &L->sp, L->max_tokens, &L->last_id, why, sizeof why))
        fprintf(stderr, "kvchat: %s\n", why);
    int64_t user_id = ll ? L->last_id : 0;
    if (L->o->interrupted) *L->o->interrupted = 0;
    kv_error err = {0};
    int32_t *toks = NULL;
    size_t n = 0;
    if (engine_tokenize(L->e, L->conv, L->len, L->o->no_bos, 0, &toks, &n, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        L->len = before;
        L->conv[L->len] = 0;
        return;
    }
    reply_acc acc = {L, L->len};
    gen_callbacks cb = {.on_text = on_text, .should_stop = should_stop, .ud = &acc};
    gen_stats st;
    int finish = GEN_FINISH_ERROR;
    int rc = engine_generate(L->e, toks, n, L->max_tokens < 0 ? 256 : L->max_tokens, L->s, &cb, &st, &finish, &err);
    free(toks);
    if (rc) fprintf(stderr, "\nkvchat: %s\n", err.msg);
    printf("\n");
    fflush(stdout);
    if (L->o->stats)
        fprintf(stderr, "prompt: %d tokens (%d reused, %d prefilled) | TTFT %.1f ms | decode %d tokens, %.1f t/s | finish: %s\n",
                st.n_prompt, st.n_reused, st.n_prefilled, st.ttft_ms, st.n_generated, st.decode_tps,
                gen_finish_name(rc ? GEN_FINISH_ERROR : finish));
    if (L->cs && L->len > acc.start) {
        int nh = 0;
        const int32_t *hist = engine_history(L->e, &nh);
        if (chatstore_reply(L->cs, L->last_id, 0, user_id, L->conv + acc.start, L->len - acc.start,
                            rc ? GEN_FINISH_ERROR : finish, &st, &L->sp, L->max_tokens, sampler_seed(L->s), hist,
                            (size_t)nh, &L->last_id, why, sizeof why))
            fprintf(stderr, "kvchat: %s\n", why);
    }
}

int linechat_run(engine *e, sampler *s, const linechat_options *o)
{
    line_session S = {.e = e, .s = s, .o = o, .max_tokens = o->n_predict, .cap = 1 << 16};
    line_session *L = &S;
    L->sp = *sampler_get_params(s);
    L->ui = isatty(STDOUT_FILENO) ? stdout : stderr;
    rl_outstream = L->ui;
    if (!(L->conv = malloc(L->cap))) return 1;
    L->conv[0] = 0;
    const model *m = engine_model(e);
    fprintf(L->ui, "kvchat %s — %s (%s, %s), n_ctx %d, %d threads\n", KVCHAT_VERSION, m->name, m->arch_name,
            quant_traits_of(m->weight_type)->name, engine_n_ctx(e), engine_n_threads(e));
    char why[900];
    if (o->db_path && !(L->cs = chatstore_open(e, o->db_path, o->cache_bytes, why, sizeof why)))
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
    return 0;
}
