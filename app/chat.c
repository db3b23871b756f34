/* chat: the session controller — the conversation, prompt building (completion mode or chat template), slash commands, and the wiring between the UI thread and the generator thread. */
#include "chat.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <locale.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "app/experts.h"
#include "engine/chat_template.h"
#include "engine/gguf.h"
#include "engine/kernels/quant.h"
#include "engine/stop.h"
#include "engine/tokenizer.h"
#include "engine/worker.h"
#include "engine/speculate.h"
#include "decode_cmd.h"
#include "backend.h"
#include "chatstore.h"
#include "config.h"
#include "conv_tree.h"
#include "models.h"
#include "prompt.h"
#include "store_cli.h"
#include "remote.h"
#include "ui/markdown.h"
#include "ui/reasoning.h"
#include "ui/text.h"
#include "ui/theme.h"
#include "ui/ui.h"

typedef conv_node turn;

enum { REQ_NONE = 0, REQ_REPLY, REQ_RESET, REQ_PREFILL /* /model: the conversation prefilled for the new model */,
       REQ_LOADING /* /model: the new model loads on a thread of its own */ };

typedef struct chat {
    engine *e;           /* NULL: the replies come from a server (remote) */
    sampler *s;          /* the sampler the worker draws with (replaced by /model); NULL remote */
    backend *b;          /* the local engine's worker or the server's client (app/backend.h) */
    int remote;
    prompt_msg *rmsgs;   /* remote: the messages of the request being submitted */
    ui *u;
    chat_options opt;
    sampler_params sp;
    spec_params spec;      /* speculative decoding (/set draft ...) */
    int max_tokens;      /* < 0: unlimited */
    int tmpl;            /* CHAT_TMPL_NONE: completion mode */
    prompt_jinja *pj;    /* tmpl CHAT_TMPL_JINJA: the model's own template */
    char *system;        /* system prompt, NULL for none */
    conv_tree conv;      /* every message of the conversation and the branch shown (app/conv_tree.h) */
    size_t editing;      /* > 0: the input holds an edit of path[editing - 1] (/edit, Up) */
    int busy, req;
    int synced;          /* the worker's conversation tokens match the turns: append to them */
    size_t reply;        /* index of the turn receiving the reply */
    int quit;
    uint64_t last_seed;
    int have_seed;
    char model_label[160]; /* how the model is named on screen (chat_model_label) */
    prompt_buf pb;       /* the prompt of the request being submitted */
    prompt_buf kb;       /* its start that context shifts keep: the system prompt rendered alone */
    chatstore *cs;       /* where conversations are saved (NULL: nowhere) */
    int64_t reply_user;  /* the stored user message the running reply answers (0: none) */
    char sess_query[256];/* the sessions view's search */
    char *stops[STOP_MAX_STRINGS]; /* stop strings (--stop, /set stop) */
    char *attach;        /* /read FILE: its text, sent with the next message (NULL: none) */
    size_t attach_len;
    char attach_name[256];
    int n_stops;
    int markdown;        /* replies shown as rendered Markdown */
    int cand_best_of, cand_beams; /* /best N, /beams N: the next reply's candidates (start_reply takes them) */
    int req_beams;       /* the running reply is a beam search of this many beams (0: not) */
    size_t reply_base;   /* the reply turn's text before this request's (a continued reply, a reasoning marker) */
    /* /read FILE counts the file's tokens on a thread of its own (the UI thread never runs the
     * tokenizer); its end is a byte on done_pipe, which the main loop polls */
    struct read_job {
        pthread_t th;
        int running;
        engine *e;
        char *buf;
        size_t n, nt;
        int rc;
        char name[256];
        int done_pipe[2];
    } rj;
    /* /model NAME loads the model on a thread of its own (engine_open, its sampler and worker);
     * the main loop polls done_pipe and then swaps it in */
    struct model_job {
        pthread_t th;
        int running;
        engine_params ep;
        char path[4096];
        sampler_params sp;
        engine *e;
        sampler *s;
        worker *w;
        kv_error ke;
        int done_pipe[2];
    } mj;
    /* a finished reply is saved after the frame that shows it done (flush_save), so a stop's
     * key-to-idle does not wait for SQLite */
    worker_event save_ev;
    size_t save_i;
    int save_pending;
} chat;

/* ---- signals: restore the terminal whatever happens ------------------------------------------- */

static int g_sigpipe[2] = {-1, -1};
static volatile sig_atomic_t g_signal;

static void on_term_signal(int sig)
{
    g_signal = sig;
    int saved = errno;
    char b = 1;
    if (g_sigpipe[1] >= 0 && write(g_sigpipe[1], &b, 1) < 0) {}
    errno = saved;
}

static void on_fatal_signal(int sig)
{
    ui_emergency_restore();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_signals(struct sigaction *old)
{
    static const int term[] = {SIGTERM, SIGHUP, SIGINT, SIGQUIT};
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_term_signal;
    for (size_t i = 0; i < 4; i++) sigaction(term[i], &sa, &old[i]);
    sa.sa_handler = on_fatal_signal;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    for (size_t i = 0; i < 5; i++) sigaction(fatal[i], &sa, &old[4 + i]);
}

static void restore_signals(const struct sigaction *old)
{
    static const int sigs[] = {SIGTERM, SIGHUP, SIGINT, SIGQUIT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < 9; i++) sigaction(sigs[i], &old[i], NULL);
}

/* ---- the conversation --------------------------------------------------------------------------- */

/* The i-th message of the shown path (valid until the tree grows). */
static turn *T(const chat *c, size_t i) { return conv_at(&c->conv, i); }

/* Append a message to the shown path (after its last message). NULL when out of memory. */
static turn *turn_add(chat *c, int role, const char *text, size_t len) { return conv_append(&c->conv, role, text, len); }

/* Take the last message off the shown path; it stays in the tree as a branch. */
static void turn_drop_last(chat *c)
{
    long k = conv_path_pop(&c->conv);
    if (k < 0) return;
    turn *t = &c->conv.node[k];
    if (t->view) ui_msg_remove(c->u, t->view);
    t->view = NULL;
}

/* Take the last message off the path and out of the tree when nothing else refers to it (an
 * empty reply that failed); otherwise as turn_drop_last. */
static void turn_discard_last(chat *c)
{
    if (!c->conv.n_path) return;
    long k = c->conv.path[c->conv.n_path - 1];
    turn_drop_last(c);
    conv_drop_newest(&c->conv, k);
}

/* Forget the whole conversation (a new one, or another one opened). */
static void turns_clear(chat *c)
{
    while (c->conv.n_path) turn_drop_last(c);
    conv_clear(&c->conv);
    if (c->editing) ui_input_edit_end(c->u); /* an edit of a message that is gone */
    c->editing = 0;
}

/* ---- prompt building ----------------------------------------------------------------------------- */

/* The prompt: the whole conversation, or (append) only the newest user turn / nothing. */
static int build_prompt(chat *c, int append, int with_user, char *err, size_t err_cap)
{
    err[0] = 0;
    if (append) {
        c->pb.len = 0;
        c->pb.n_seg = 0;
        if (!with_user || !c->conv.n_path) return 0;
        const turn *u = T(c, c->conv.n_path - 1);
        const char *prev = "";
        size_t prev_len = 0;
        for (size_t i = c->conv.n_path - 1; i-- > 0;) /* the text the new one follows */
            if (T(c, i)->len) {
                prev = T(c, i)->text;
                prev_len = T(c, i)->len;
                break;
            }
        if (prompt_build_append(prev, prev_len, u->text, u->len, &c->pb)) {
            snprintf(err, err_cap, "out of memory building the prompt");
            return -1;
        }
        return 0;
    }
    size_t n = c->conv.n_path + 1;
    prompt_msg *msgs = calloc(n, sizeof *msgs);
    if (c->remote) { /* the server renders the messages with its own template */
        free(c->rmsgs);
        c->rmsgs = msgs;
    }
    if (!msgs) {
        snprintf(err, err_cap, "out of memory building the prompt");
        return -1;
    }
    size_t k = 0;
    if (c->system && *c->system) msgs[k++] = (prompt_msg){"system", c->system, strlen(c->system)};
    for (size_t i = 0; i < c->conv.n_path; i++) {
        const turn *t = T(c, i);
        size_t skip = 0;
        /* a reply's reasoning stays out of the next prompt, as the reasoning models' templates
         * (Qwen3, DeepSeek-R1) drop earlier turns' reasoning; completion mode sends the text as it is */
        ui_reasoning r;
        if (t->role == UI_ROLE_ASSISTANT && c->tmpl != CHAT_TMPL_NONE && ui_reasoning_split(t->text, t->len, &r))
            skip = r.answer;
        msgs[k++] = (prompt_msg){t->role == UI_ROLE_USER ? "user" : "assistant", t->text + skip, t->len - skip};
    }
    if (c->remote) {
        c->pb.n_seg = k; /* the messages to send */
        return 0;
    }
    int rc = c->pj ? prompt_build_jinja(c->pj, msgs, k, &c->pb, err, err_cap)
                   : prompt_build(c->tmpl, msgs, k, &c->pb, err, err_cap);
    free(msgs);
    return rc;
}

/* ---- requests ------------------------------------------------------------------------------------ */

static void set_busy(chat *c, int busy, int req)
{
    c->busy = busy;
    c->req = busy ? req : REQ_NONE;
    ui_set_busy(c->u, busy);
}

static void refresh_labels(chat *c);

/* Generate a reply to the conversation: into a new assistant turn, or (continue_last) onto
 * the last assistant turn. */
static void start_reply(chat *c, int continue_last)
{
    char err[600];
    /* Completion mode extends the conversation's tokens as they are (the KV cache holds them);
     * anything else re-renders it and the engine keeps the longest cached prefix. */
    int append = c->tmpl == CHAT_TMPL_NONE && c->synced;
    if (build_prompt(c, append, !continue_last, err, sizeof err)) {
        ui_notice(c->u, UI_ROLE_ERROR, "%s", err);
        return;
    }
    if (err[0]) ui_notice(c->u, UI_ROLE_NOTICE, "%s", err); /* the template fell back to the shape table */
    turn *t;
    if (continue_last && c->conv.n_path && T(c, c->conv.n_path - 1)->role == UI_ROLE_ASSISTANT) {
        t = T(c, c->conv.n_path - 1);
        ui_msg_set_note(c->u, t->view, NULL, 0);
        ui_msg_set_state(c->u, t->view, t->len ? UI_MSG_STREAMING : UI_MSG_WAITING);
    } else {
        t = turn_add(c, UI_ROLE_ASSISTANT, "", 0);
        if (!t) {
            ui_notice(c->u, UI_ROLE_ERROR, "out of memory");
            return;
        }
        conv_set_author(&c->conv, c->conv.path[c->conv.n_path - 1], c->model_label); /* it keeps its model's name */
        t = T(c, c->conv.n_path - 1);
        /* a template that opens the reasoning block itself (DeepSeek-R1: "…<think>\n"): the reply
         * starts inside it, so it starts with the marker, as shown and as stored */
        const char *open = c->tmpl != CHAT_TMPL_NONE ? ui_reasoning_open_at_end(c->pb.text, c->pb.len) : NULL;
        if (open) {
            conv_text_append(&t->text, &t->len, &t->cap, open, strlen(open));
            conv_text_append(&t->text, &t->len, &t->cap, "\n", 1);
        }
        t->view = ui_msg_add(c->u, UI_ROLE_ASSISTANT, c->model_label, t->text, t->len);
        ui_msg_set_state(c->u, t->view, UI_MSG_WAITING);
        refresh_labels(c);
    }
    c->reply = c->conv.n_path - 1; /* the reply is always the path's last message */
    c->reply_base = t->len;
    c->reply_user = !continue_last && c->reply > 0 && T(c, c->reply - 1)->role == UI_ROLE_USER
                        ? T(c, c->reply - 1)->id : 0;
    backend_request brq = {.local = {.seg = c->pb.seg, .n_seg = c->pb.n_seg, .no_bos = c->opt.no_bos,
                                     .n_predict = c->max_tokens, .append = append,
                                     .best_of = c->cand_best_of, .beams = c->cand_beams, .length_penalty = 1.0f}};
    c->req_beams = c->cand_beams;
    c->cand_best_of = c->cand_beams = 0;
    worker_request *rq = &brq.local;
    if (c->remote) {
        brq = (backend_request){.msgs = c->rmsgs, .n_msgs = c->pb.n_seg};
        c->pb.n_seg = 0;
    }
    /* the template's prefix and the system prompt survive every context shift */
    if (!c->remote && c->system && *c->system) {
        prompt_msg sys = {"system", c->system, strlen(c->system)};
        if (prompt_build(c->tmpl, &sys, 1, &c->kb, err, sizeof err) == 0) {
            rq->keep_seg = c->kb.seg;
            rq->n_keep_seg = c->kb.n_seg;
        }
    }
    kv_error ke = {0};
    if (backend_submit(c->b, &brq, &ke)) {
        ui_msg_set_state(c->u, t->view, UI_MSG_DONE);
        ui_notice(c->u, UI_ROLE_ERROR, "%s", ke.msg);
        return;
    }
    set_busy(c, 1, REQ_REPLY);
}

static void request_reset(chat *c)
{
    backend_request rq = {.local = {.n_seg = 0, .reset_cache = 1}};
    kv_error ke = {0};
    if (backend_submit(c->b, &rq, &ke) == KV_OK) set_busy(c, 1, REQ_RESET);
}

/* ---- saving (app/chatstore.h) --------------------------------------------------------------------- */

/* Messages from the store's generator-thread side (a KV prefix not used, a restore). */
static void show_store_notes(chat *c)
{
    char buf[700];
    while (c->cs && chatstore_take_note(c->cs, buf, sizeof buf))
        ui_notice(c->u, strstr(buf, "not used") || strstr(buf, "not saved") || strstr(buf, "off:") ? UI_ROLE_ERROR
                                                                                                : UI_ROLE_NOTICE,
                  "%s", buf);
}

/* The stored message before turn i (the parent of what turn i holds), 0 if none. */
static int64_t parent_of(const chat *c, size_t i)
{
    while (i-- > 0)
        if (T(c, i)->id) return T(c, i)->id;
    return 0;
}

/* Store the user message just added (the last turn). */
static void save_user(chat *c, turn *t)
{
    if (!c->cs) return;
    int64_t parent = parent_of(c, c->conv.n_path - 1);
    char why[700];
    if (chatstore_user_message(c->cs, parent, t->text, t->len, c->system, &c->sp, c->max_tokens, &t->id, why, sizeof why))
        ui_notice(c->u, UI_ROLE_ERROR, "%s", why);
}

/* Store the reply in turn i as the DONE event ev finished it (or update a continued one). */
static void save_reply(chat *c, size_t i, const worker_event *ev)
{
    if (!c->cs || i >= c->conv.n_path) return;
    turn *t = T(c, i);
    int64_t parent = parent_of(c, i);
    char why[700];
    /* a server's prompt_tokens is the whole rendered conversation, not what the user message added */
    if (chatstore_reply(c->cs, parent, t->id, c->remote ? 0 : c->reply_user, t->text, t->len, ev->finish, &ev->stats.gen, &c->sp,
                        c->max_tokens, ev->seed, ev->conv, ev->n_conv, &t->id, why, sizeof why))
        ui_notice(c->u, UI_ROLE_ERROR, "%s", why);
    c->reply_user = 0;
}

/* The conversation's head is now the last turn (after /undo, /regen). */
static void save_head(chat *c)
{
    char why[700];
    if (c->cs && chatstore_set_head(c->cs, parent_of(c, c->conv.n_path), why, sizeof why))
        ui_notice(c->u, UI_ROLE_ERROR, "%s", why);
}

static int ui_phase_of(int worker_phase)
{
    return worker_phase == WORKER_PREFILL || worker_phase == WORKER_TOKENIZE ? UI_PHASE_PREFILL
           : worker_phase == WORKER_DECODE ? UI_PHASE_DECODE : UI_PHASE_IDLE;
}

/* The local engine's context length (0 on a server: its own). */
static int n_ctx_of(const chat *c) { return c->e ? engine_n_ctx(c->e) : 0; }

static void refresh_labels(chat *c);

/* The reply's token probabilities for the heat-map (F6, /show probs): the worker's spans are
 * of this request's text, which starts at c->reply_base in the turn. */
static void show_heat(chat *c, turn *t, const worker_event *ev)
{
    if (!t->view || !ev->n_tok) return;
    uint32_t *a = malloc(ev->n_tok * sizeof *a), *b = malloc(ev->n_tok * sizeof *b);
    if (a && b) {
        for (size_t i = 0; i < ev->n_tok; i++) {
            a[i] = ev->tok_start[i] + (uint32_t)c->reply_base;
            b[i] = ev->tok_end[i] + (uint32_t)c->reply_base;
        }
        ui_msg_set_heat(c->u, t->view, t->text, t->len, a, b, ev->tok_p, ev->n_tok);
    }
    free(a);
    free(b);
}

/* A /best or /beams reply is done (cand[0] is the reply shown): the other samples become its
 * sibling branches, stored like any reply, the head stays on the shown one; the ranking said. */
static void candidates_done(chat *c, const worker_event *ev)
{
    long reply = c->conv.path[c->reply];
    long first = decode_add_siblings(&c->conv, reply, ev->cand, ev->n_cand, UI_ROLE_ASSISTANT, c->model_label,
                                     chatstore_finish_of);
    if (first < 0) ui_notice(c->u, UI_ROLE_ERROR, "out of memory keeping the other samples");
    for (long k = first; c->cs && first >= 0 && (size_t)k < c->conv.n; k++) {
        const worker_candidate *w = &ev->cand[k - first + 1];
        char why[700];
        if (chatstore_reply(c->cs, parent_of(c, c->reply), 0, 0, w->text, w->len, w->finish, &ev->stats.gen, &c->sp,
                            c->max_tokens, w->seed, w->conv, w->n_conv, &c->conv.node[k].id, why, sizeof why))
            ui_notice(c->u, UI_ROLE_ERROR, "%s", why);
    }
    if (ev->n_cand > 1) save_head(c); /* the shown reply, not the last sibling stored */
    refresh_labels(c);
    size_t *count, *rank = conv_sibling_ranks(&c->conv, &count);
    char note[1200];
    decode_candidates_note(ev->cand, ev->n_cand, c->req_beams, 1.0f, rank ? rank[reply] : 1,
                           rank ? count[conv_slot_of(&c->conv, reply)] : (size_t)ev->n_cand, note, sizeof note);
    free(rank);
    free(count);
    ui_notice(c->u, UI_ROLE_NOTICE, "%s", note);
}

static void on_done(chat *c, const worker_event *ev)
{
    int req = c->req;
    set_busy(c, 0, REQ_NONE);
    ui_set_kv(c->u, &ev->stats.kv);
    show_store_notes(c);
    if (req == REQ_PREFILL) {
        ui_set_stats(c->u, NULL, UI_PHASE_IDLE, NULL);
        const gen_stats *g = &ev->stats.gen;
        if (ev->status != KV_OK)
            ui_notice(c->u, UI_ROLE_ERROR, "%s: the conversation does not fit this model's context: %s — /undo drops "
                      "the last exchange, /clear starts over", c->model_label, ev->err.msg);
        else if (ev->finish == GEN_FINISH_CANCELLED)
            ui_notice(c->u, UI_ROLE_NOTICE, "prefill stopped: the next reply prefills the rest");
        else
            ui_notice(c->u, UI_ROLE_NOTICE, "the conversation is now %d tokens of %s (%s): %d prefilled in %.0f ms, %d "
                      "reused", g->n_prompt, c->model_label, c->tmpl == CHAT_TMPL_NONE ? "completion mode"
                      : chat_template_name(c->tmpl), g->n_prefilled, g->prefill_ms, g->n_reused);
        return;
    }
    if (req != REQ_REPLY || c->reply >= c->conv.n_path) return;
    show_heat(c, T(c, c->reply), ev);
    c->last_seed = ev->seed;
    c->have_seed = !c->remote; /* a server does not say which seed it drew */
    c->synced = 1;
    turn *t = T(c, c->reply);
    ui_msg_set_state(c->u, t->view, UI_MSG_DONE);
    t->finish = ev->status != KV_OK ? STORE_FINISH_ERROR : chatstore_finish_of(ev->finish);
    if (ev->status != KV_OK) {
        if (t->len) save_reply(c, c->reply, ev); /* the partial text, marked as an error */
        if (t->len == 0 && c->reply == c->conv.n_path - 1) turn_discard_last(c);
        else ui_msg_set_note(c->u, t->view, "[error]", 1);
        if (ev->status == KV_ERR_CONTEXT)
            ui_notice(c->u, UI_ROLE_ERROR, "%s — /undo drops the last exchange, /clear starts over", ev->err.msg);
        else ui_notice(c->u, UI_ROLE_ERROR, "%s", ev->err.msg);
        ui_set_stats(c->u, NULL, UI_PHASE_IDLE, NULL);
        return;
    }
    if (ev->keep_wanted > ev->stats.gen.n_keep && (ev->stats.gen.n_shifts || ev->stats.gen.n_truncated))
        ui_notice(c->u, UI_ROLE_ERROR,
                  "the context shifted, but the system prompt (%d tokens with the template's start) is longer than a "
                  "shift can keep (%d of the %d-token context): the model no longer sees all of it — raise -c or "
                  "shorten it", ev->keep_wanted, ev->stats.gen.n_keep, n_ctx_of(c));
    if (ev->finish == GEN_FINISH_CANCELLED) ui_msg_set_note(c->u, t->view, "[stopped]", 0);
    else if (ev->finish == GEN_FINISH_LENGTH) ui_msg_set_note(c->u, t->view, "[max tokens]", 0);
    /* the engine's cap of one context's worth per unlimited reply is not a full context (the
     * context shifted on the way): say what it is */
    int cap = !c->remote && ev->finish == GEN_FINISH_CONTEXT && ev->stats.gen.n_generated >= n_ctx_of(c);
    if (cap) {
        char note[160];
        snprintf(note, sizeof note, "[%d tokens, a context's worth: %s/set max_tokens N for longer replies]",
                 ev->stats.gen.n_generated, c->tmpl == CHAT_TMPL_NONE ? "Enter on an empty line goes on; " : "");
        ui_msg_set_note(c->u, t->view, note, 0);
    } else if (ev->finish == GEN_FINISH_CONTEXT)
        ui_msg_set_note(c->u, t->view, "[context full: /clear starts over, /undo drops the last exchange]", 1);
    if (ev->stats.gen.n_generated > 0 || ev->finish != GEN_FINISH_CANCELLED)
        ui_set_stats(c->u, &ev->stats.gen, UI_PHASE_IDLE, cap ? "a context's worth" : gen_finish_name(ev->finish));
    if (ev->n_cand) { /* /best, /beams: the shown reply is stored at once, its siblings after it */
        save_reply(c, c->reply, ev);
        candidates_done(c, ev);
        return;
    }
    c->save_ev = *ev;
    c->save_i = c->reply;
    c->save_pending = 1;
}

/* Save the reply on_done left for after the frame (at once when anything else comes first). */
static void flush_save(chat *c)
{
    if (!c->save_pending) return;
    c->save_pending = 0;
    save_reply(c, c->save_i, &c->save_ev);
}

static void drain_events(chat *c)
{
    worker_event ev;
    flush_save(c);
    for (int guard = 0; guard < 64 && backend_next_event(c->b, &ev); guard++) {
        switch (ev.kind) {
        case WORKER_EV_TEXT:
            if (c->req == REQ_REPLY && c->reply < c->conv.n_path) {
                turn *t = T(c, c->reply);
                conv_text_append(&t->text, &t->len, &t->cap, ev.text, ev.len);
                if (t->view) {
                    ui_msg_append(c->u, t->view, ev.text, ev.len);
                    ui_msg_set_state(c->u, t->view, UI_MSG_STREAMING);
                }
            }
            break;
        case WORKER_EV_STATS:
            if (c->req == REQ_REPLY || (c->req == REQ_PREFILL && ev.stats.phase != WORKER_DECODE))
                ui_set_stats(c->u, &ev.stats.gen, ui_phase_of(ev.stats.phase), NULL);
            if ((c->req == REQ_REPLY || c->req == REQ_PREFILL) && ev.stats.prefill_total)
                ui_set_prefill(c->u, ev.stats.prefill_done, ev.stats.prefill_total);
            ui_set_kv(c->u, &ev.stats.kv);
            break;
        case WORKER_EV_DONE: on_done(c, &ev); break;
        default: break;
        }
    }
}

/* ---- branches ------------------------------------------------------------------------------------ */

static const char *finish_note(int finish);
static int need_idle(chat *c, const char *cmd);

/* The label above message t: who wrote it, and "branch k/n" when it has siblings. */
static void label_of(const chat *c, const turn *t, size_t k, size_t n, char *buf, size_t cap)
{
    const char *who = t->role == UI_ROLE_USER ? "you" : t->author ? t->author : c->model_label;
    if (n > 1) snprintf(buf, cap, "%s · branch %zu/%zu", who, k, n);
    else snprintf(buf, cap, "%s", who);
}

static size_t *sibling_ranks(const chat *c, size_t **count) { return conv_sibling_ranks(&c->conv, count); }
static size_t slot_of(const chat *c, long k) { return conv_slot_of(&c->conv, k); }

/* Put "branch k/n" on the shown messages that have siblings. */
static void refresh_labels(chat *c)
{
    size_t *count, *rank = sibling_ranks(c, &count);
    if (!rank) return;
    for (size_t i = 0; i < c->conv.n_path; i++) {
        turn *t = T(c, i);
        if (!t->view) continue;
        char label[256];
        label_of(c, t, rank[c->conv.path[i]], count[slot_of(c, c->conv.path[i])], label, sizeof label);
        ui_msg_set_label(c->u, t->view, label);
    }
    free(rank);
    free(count);
}

/* Show the path's messages from position from on (their views are added at the end). */
static void show_from(chat *c, size_t from)
{
    for (size_t i = from; i < c->conv.n_path; i++) {
        turn *t = T(c, i);
        t->view = ui_msg_add(c->u, t->role, t->role == UI_ROLE_USER ? "you" : t->author ? t->author : c->model_label,
                             t->text, t->len);
        if (t->unreadable) ui_msg_set_note(c->u, t->view, "[unreadable]", 1);
        else if (t->role == UI_ROLE_ASSISTANT && finish_note(t->finish))
            ui_msg_set_note(c->u, t->view, finish_note(t->finish), t->finish == STORE_FINISH_ERROR);
    }
    refresh_labels(c);
}

/* Show node target in place of path position p, followed by its most recent continuation
 * (the newest reply at every step), and make that the conversation's head. */
static void switch_branch(chat *c, size_t p, long target)
{
    while (c->conv.n_path > p) turn_drop_last(c);
    if (conv_show_branch(&c->conv, p, target)) ui_notice(c->u, UI_ROLE_ERROR, "out of memory");
    /* the pane shows the conversation in order again (notices go) */
    for (size_t i = 0; i < c->conv.n_path; i++) T(c, i)->view = NULL;
    ui_pane_clear(c->u);
    if (c->system) ui_notice(c->u, UI_ROLE_NOTICE, "system prompt: %s", c->system);
    show_from(c, 0);
    c->synced = 0; /* the next prompt is rendered again: the engine keeps the common prefix */
    c->editing = 0;
    save_head(c);
}

/* /branch: list the branch points, switch to branch N / next / prev of the last one, or (no
 * argument) start an alternative reply to the last message and keep both. */
static void cmd_branch(chat *c, const char *args)
{
    if (!need_idle(c, "/branch")) return;
    if (!*args) {
        if (!c->conv.n_path) {
            ui_notice(c->u, UI_ROLE_ERROR, "/branch: the conversation is empty — send a message first");
            return;
        }
        if (T(c, c->conv.n_path - 1)->role == UI_ROLE_ASSISTANT) turn_drop_last(c); /* stays as branch 1 */
        c->synced = 0;
        save_head(c);
        start_reply(c, 0);
        return;
    }
    size_t *count, *rank = sibling_ranks(c, &count);
    if (!rank) {
        ui_notice(c->u, UI_ROLE_ERROR, "out of memory");
        return;
    }
    if (!strcmp(args, "list")) {
        char buf[2400];
        size_t o = 0;
        int any = 0;
        for (size_t i = 0; i < c->conv.n_path && o < sizeof buf - 200; i++) {
            size_t n = count[slot_of(c, c->conv.path[i])];
            if (n < 2) continue;
            const turn *t = T(c, i);
            char snip[200];
            size_t cut = t->len < 40 ? t->len : 40;
            while (cut > 0 && cut < t->len && ((unsigned char)t->text[cut] & 0xC0) == 0x80) cut--; /* whole chars */
            size_t sl = ui_sanitize(t->text, cut, snip, sizeof snip - 1);
            snip[sl] = 0;
            for (char *q = snip; *q; q++)
                if (*q == '\n') *q = ' ';
            o += (size_t)snprintf(buf + o, sizeof buf - o, "%smessage %zu (%s): branch %zu of %zu — \"%s%s\"",
                                  any ? "\n" : "", i + 1, t->role == UI_ROLE_USER ? "you" : "reply",
                                  rank[c->conv.path[i]], n, snip, cut < t->len ? "…" : "");
            any = 1;
        }
        if (any)
            ui_notice(c->u, UI_ROLE_NOTICE, "%s\n/branch N shows branch N of the last one (or next, prev); "
                                            "/branch MESSAGE:N of another", buf);
        else
            ui_notice(c->u, UI_ROLE_NOTICE, "no branches yet: /branch (or /regen) adds an alternative reply, /edit "
                                            "(or Up on an empty input) an alternative message");
        free(rank);
        free(count);
        return;
    }
    /* MESSAGE:N picks the branch point by its position on the path; N alone the last one */
    long p = -1;
    const char *colon = strchr(args, ':');
    if (colon) {
        char *end;
        errno = 0;
        long m = strtol(args, &end, 10);
        if (errno || end != colon || m < 1 || (size_t)m > c->conv.n_path || count[slot_of(c, c->conv.path[m - 1])] < 2) {
            ui_notice(c->u, UI_ROLE_ERROR, "/branch %s: message %.*s of the shown conversation has no branches "
                                           "(/branch list shows which do)", args, (int)(colon - args), args);
            free(rank);
            free(count);
            return;
        }
        p = m - 1;
        args = colon + 1;
    }
    for (size_t i = c->conv.n_path; i-- > 0 && p < 0;)
        if (count[slot_of(c, c->conv.path[i])] > 1) p = (long)i;
    if (p < 0) {
        ui_notice(c->u, UI_ROLE_ERROR, "/branch %s: this conversation has no branches (/branch list)", args);
        free(rank);
        free(count);
        return;
    }
    long cur = c->conv.path[p];
    size_t n = count[slot_of(c, cur)], k = rank[cur], want = 0;
    free(rank);
    free(count);
    if (!strcmp(args, "next")) want = k % n + 1;
    else if (!strcmp(args, "prev")) want = (k + n - 2) % n + 1;
    else {
        char *end;
        errno = 0;
        long v = strtol(args, &end, 10);
        if (errno || *end || v < 1 || (size_t)v > n) {
            ui_notice(c->u, UI_ROLE_ERROR, "/branch: '%s' is not one of the %zu branches of message %ld (1-%zu, next, "
                                           "prev; list)", args, n, p + 1, n);
            return;
        }
        want = (size_t)v;
    }
    if (want == k) {
        ui_flash(c->u, "already showing branch %zu/%zu", k, n);
        return;
    }
    long target = conv_sibling(&c->conv, cur, want);
    switch_branch(c, (size_t)p, target);
    ui_flash(c->u, "branch %zu/%zu of message %ld", want, n, p + 1);
}

/* The path position of the last message the user wrote before position before / the first one
 * after position after, or -1. */
static long user_pos_before(const chat *c, size_t before) { return conv_role_before(&c->conv, UI_ROLE_USER, before); }
static long user_pos_after(const chat *c, size_t after) { return conv_role_after(&c->conv, UI_ROLE_USER, after); }

/* Put the user message at path position q in the input to edit it. */
static void edit_at(chat *c, size_t q)
{
    c->editing = q + 1;
    ui_input_edit(c->u, T(c, q)->text, T(c, q)->len, "edit> ");
    ui_flash(c->u, "editing %s · Enter: answer it on a new branch · Up/Down: others · Esc: cancel",
             user_pos_after(c, q) < 0 ? "your last message" : "an earlier message");
}

/* Send text as a new version of the user message at path position q: it follows the same
 * message as the original (a sibling branch; the original and its replies stay), and is
 * answered from the shared prefix. */
static void edit_send(chat *c, size_t q, const char *text, size_t len)
{
    c->editing = 0;
    while (c->conv.n_path > q) turn_drop_last(c);
    turn *t = turn_add(c, UI_ROLE_USER, text, len);
    if (!t) {
        ui_notice(c->u, UI_ROLE_ERROR, "out of memory");
        return;
    }
    t->view = ui_msg_add(c->u, UI_ROLE_USER, "you", text, len);
    c->synced = 0;
    save_user(c, t);
    start_reply(c, 0);
}

/* /edit [TEXT], Up on an empty input: edit the last message you wrote. */
static int begin_edit(chat *c, const char *text)
{
    long q = user_pos_before(c, c->conv.n_path);
    if (q < 0) return 0;
    if (text && *text) edit_send(c, (size_t)q, text, strlen(text));
    else edit_at(c, (size_t)q);
    return 1;
}

/* ---- slash commands ------------------------------------------------------------------------------ */

/* The parameters /set changes: each a key of the settings table (app/config.c keys[]), which gives
 * its range and its text form, as for the command line and config.ini; key -1: the chat's own. */
typedef struct set_param {
    const char *name, *alias;
    int key;
} set_param;

static const set_param set_params[] = {
    {"temp", "temperature", CFG_TEMP},          {"top_k", NULL, CFG_TOP_K},
    {"top_p", NULL, CFG_TOP_P},                 {"min_p", NULL, CFG_MIN_P},
    {"repeat_penalty", NULL, CFG_REPEAT_PENALTY}, {"repeat_last_n", NULL, CFG_REPEAT_LAST_N},
    {"presence_penalty", NULL, CFG_PRESENCE_PENALTY}, {"frequency_penalty", NULL, CFG_FREQUENCY_PENALTY},
    {"seed", NULL, CFG_SEED},                   {"max_tokens", "n_predict", CFG_N_PREDICT},
    {"system", NULL, CFG_SYSTEM},               {"stop", NULL, -1},
    {"markdown", NULL, CFG_MARKDOWN},
    {"draft", NULL, CFG_DRAFT},                 {"draft_max", NULL, CFG_DRAFT_MAX},
    {"draft_min_p", NULL, CFG_DRAFT_MIN_P},
};
#define N_SET_PARAMS (sizeof set_params / sizeof set_params[0])

static const set_param *set_param_find(const char *name)
{
    for (size_t i = 0; i < N_SET_PARAMS; i++)
        if (!strcmp(name, set_params[i].name) || (set_params[i].alias && !strcmp(name, set_params[i].alias)))
            return &set_params[i];
    return NULL;
}

static void push_params(chat *c)
{
    backend_set_params(c->b, &c->sp);
    backend_set_n_predict(c->b, c->max_tokens);
    ui_set_slider(c->u, UI_SL_TEMP, c->sp.temperature);
    ui_set_slider(c->u, UI_SL_TOP_P, c->sp.top_p);
    ui_set_slider(c->u, UI_SL_TOP_K, c->sp.top_k);
    ui_set_slider(c->u, UI_SL_MIN_P, c->sp.min_p);
    ui_set_slider(c->u, UI_SL_REPEAT, c->sp.repeat_penalty);
    ui_set_slider(c->u, UI_SL_MAX_TOKENS, c->max_tokens < 0 ? -1 : c->max_tokens);
}

/* The stop strings as "'a' · 'b'" for /show params (static buffer). */
static const char *stops_list(const chat *c)
{
    static char buf[STOP_MAX_STRINGS * (STOP_MAX_LEN + 8)];
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n_stops; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s'%s'", i ? " · " : "", c->stops[i]);
    return c->n_stops ? buf : "(none)";
}

/* Hand the stop strings to the worker (used from the next reply on). */
static void push_stops(chat *c)
{
    backend_set_stops(c->b, (const char *const *)c->stops, c->n_stops);
}

/* The current value of a numeric / seed key as /show params and /set print it: the table's
 * decimals, its off label ("no limit"), no float noise. */
static void param_text(const chat *c, int key, char *buf, size_t cap)
{
    double v = 0;
    switch (key) {
    case CFG_TEMP: v = c->sp.temperature; break;
    case CFG_TOP_K: v = c->sp.top_k; break;
    case CFG_TOP_P: v = c->sp.top_p; break;
    case CFG_MIN_P: v = c->sp.min_p; break;
    case CFG_REPEAT_PENALTY: v = c->sp.repeat_penalty; break;
    case CFG_REPEAT_LAST_N: v = c->sp.repeat_last_n; break;
    case CFG_PRESENCE_PENALTY: v = c->sp.presence_penalty; break;
    case CFG_FREQUENCY_PENALTY: v = c->sp.frequency_penalty; break;
    case CFG_N_PREDICT: v = c->max_tokens; break;
    case CFG_SEED:
        if (c->sp.seed == SAMPLER_SEED_RANDOM) snprintf(buf, cap, "random");
        else snprintf(buf, cap, "%llu", (unsigned long long)c->sp.seed);
        if (c->have_seed) {
            size_t l = strlen(buf);
            snprintf(buf + l, cap - l, " (last reply: %llu)", (unsigned long long)c->last_seed);
        }
        return;
    case CFG_DRAFT: case CFG_DRAFT_MAX: case CFG_DRAFT_MIN_P: decode_draft_text(&c->spec, key, buf, cap); return;
    default: snprintf(buf, cap, "?"); return;
    }
    cfg_range r;
    config_key_range(key, &r);
    if (key == CFG_N_PREDICT && v < 0) snprintf(buf, cap, "no limit");
    else if (key == CFG_REPEAT_LAST_N && v < 0) snprintf(buf, cap, "-1 (all)");
    else if (r.integer) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%.*f", r.decimals ? r.decimals : 2, v);
}

/* How the prompt is made: completion mode, the chat template's name, or the server's. */
static const char *mode_name(const chat *c)
{
    return c->remote ? "remote (the server's chat template)"
           : c->tmpl == CHAT_TMPL_NONE ? "completion" : chat_template_name(c->tmpl);
}

static void show_params(chat *c)
{
    char line[1200];
    size_t o = 0;
    for (size_t i = 0; i < N_SET_PARAMS; i++) {
        int k = set_params[i].key;
        if (k < 0 || k == CFG_SYSTEM || k == CFG_MARKDOWN) continue;
        char v[96];
        param_text(c, k, v, sizeof v);
        o += (size_t)snprintf(line + o, sizeof line - o, "%s%s %s", o ? " · " : "", set_params[i].name, v);
        if (o >= sizeof line) break;
    }
    ui_notice(c->u, UI_ROLE_NOTICE, "%s\nmode: %s · system prompt: %s\nstop strings: %s", line, mode_name(c),
              c->system && *c->system ? c->system : "(none)", stops_list(c));
}

/* Results of /set: a notice when idle; while a reply streams a flash in the status bar, so
 * nothing comes between the message and its reply in the transcript. */
#define SAY(c, ...) ((c)->busy ? ui_flash((c)->u, __VA_ARGS__) : ui_notice((c)->u, UI_ROLE_NOTICE, __VA_ARGS__))

static int need_idle(chat *c, const char *cmd);

static void set_system(chat *c, const char *value)
{
    if (!need_idle(c, "/set system")) return;
    c->synced = 0;
    free(c->system);
    c->system = *value ? strdup(value) : NULL;
    char why[700];
    if (c->cs && chatstore_set_system(c->cs, c->system, why, sizeof why)) ui_notice(c->u, UI_ROLE_ERROR, "%s", why);
    if (c->system) ui_notice(c->u, UI_ROLE_NOTICE, "system prompt: %s", c->system);
    else ui_notice(c->u, UI_ROLE_NOTICE, "system prompt cleared");
}

static void set_stop(chat *c, const char *value)
{
    if (!*value) {
        for (int i = 0; i < c->n_stops; i++) free(c->stops[i]);
        c->n_stops = 0;
        push_stops(c);
        SAY(c, "stop strings cleared");
        return;
    }
    if (c->n_stops == STOP_MAX_STRINGS || strlen(value) >= STOP_MAX_LEN) {
        ui_notice(c->u, UI_ROLE_ERROR, "/set stop: at most %d stop strings of 1 to %d bytes", STOP_MAX_STRINGS,
                  STOP_MAX_LEN - 1);
        return;
    }
    char *dup = strdup(value);
    if (!dup) return;
    c->stops[c->n_stops++] = dup;
    push_stops(c);
    SAY(c, "stop strings: %s%s", stops_list(c), c->busy ? " (from the next reply)" : "");
}

static void cmd_set(chat *c, char *args)
{
    char *name = args;
    size_t nl = strcspn(args, " ");
    char *value = args + nl;
    if (*value) *value++ = 0;
    while (*value == ' ') value++;
    for (char *p = name; *p; p++)
        if (*p == '-') *p = '_';
    const set_param *sp = *name ? set_param_find(name) : NULL;
    if (!sp) {
        char names[400];
        size_t o = 0;
        for (size_t i = 0; i < N_SET_PARAMS; i++) o += (size_t)snprintf(names + o, sizeof names - o, " %s", set_params[i].name);
        if (*name) ui_notice(c->u, UI_ROLE_ERROR, "/set: unknown parameter '%s' (%s)", name, names + 1);
        else ui_notice(c->u, UI_ROLE_ERROR, "usage: /set NAME VALUE (names:%s)", names);
        return;
    }
    if (sp->key == CFG_SYSTEM) return set_system(c, value);
    if (sp->key == CFG_MARKDOWN) {
        int b = config_parse_bool(value);
        if (b < 0) {
            ui_notice(c->u, UI_ROLE_ERROR, "/set markdown: '%s' is not on or off", value);
            return;
        }
        c->markdown = b;
        ui_set_markdown(c->u, b);
        SAY(c, "markdown = %s", b ? "on (replies rendered)" : "off (replies as plain text)");
        return;
    }
    if (sp->key < 0) return set_stop(c, value);
    if (sp->key == CFG_DRAFT || sp->key == CFG_DRAFT_MAX || sp->key == CFG_DRAFT_MIN_P) { /* app/decode_cmd.c */
        char dm[400];
        if (decode_set_draft(&c->spec, sp->key, value, c->opt.draft_path, dm, sizeof dm)) {
            ui_notice(c->u, UI_ROLE_ERROR, "%s", dm);
            return;
        }
        if (c->remote) {
            ui_notice(c->u, UI_ROLE_ERROR, "/set %s: speculative decoding is the local engine's (the replies come from "
                      "a server)", sp->name);
            return;
        }
        worker_set_spec(backend_worker(c->b), &c->spec);
        SAY(c, "%s%s", dm, c->busy ? " (from the next reply)" : "");
        return;
    }
    if (!*value) {
        ui_notice(c->u, UI_ROLE_ERROR, "/set %s needs a value", sp->name);
        return;
    }
    char msg[300];
    sampler_params p = c->sp;
    int max_tokens = c->max_tokens;
    if (chat_set_param(sp->name, value, &p, &max_tokens, msg, sizeof msg)) {
        ui_notice(c->u, UI_ROLE_ERROR, "%s", msg);
        return;
    }
    c->sp = p;
    c->max_tokens = max_tokens;
    push_params(c);
    SAY(c, "%s%s", msg, c->busy ? " (from the next token)" : "");
}

int chat_set_param(const char *name, const char *value, sampler_params *sp_io, int *max_tokens_io, char *msg, size_t cap)
{
    const set_param *sp = set_param_find(name);
    if (!sp || sp->key < 0 || sp->key == CFG_SYSTEM || sp->key == CFG_MARKDOWN || sp->key == CFG_DRAFT ||
        sp->key == CFG_DRAFT_MAX || sp->key == CFG_DRAFT_MIN_P) {
        snprintf(msg, cap, "/set: unknown parameter '%s'", name);
        return -1;
    }
    /* the chat's spellings of "none": max_tokens 0 = no limit, seed -1 = random */
    if (sp->key == CFG_N_PREDICT && !strcmp(value, "0")) value = "-1";
    if (sp->key == CFG_SEED && !strcmp(value, "-1")) value = "random";
    char norm[1100], why[600];
    if (config_check(sp->key, value, norm, sizeof norm, why, sizeof why)) {
        snprintf(msg, cap, "/set %s: %s", sp->name, why);
        return -1;
    }
    sampler_params p = *sp_io;
    int max_tokens = *max_tokens_io;
    config_apply_key(sp->key, norm, NULL, &p, &max_tokens);
    if (max_tokens <= 0) max_tokens = -1;
    kv_error ke = {0};
    if (sampler_params_validate(&p, &ke)) {
        snprintf(msg, cap, "%s", ke.msg);
        return -1;
    }
    *sp_io = p;
    *max_tokens_io = max_tokens;
    chat tmp = {.sp = p, .max_tokens = max_tokens};
    char shown[96];
    param_text(&tmp, sp->key, shown, sizeof shown);
    snprintf(msg, cap, "%s = %s", sp->name, shown);
    return 0;
}

static void cmd_theme(chat *c, char *name);
static void cb_sessions(void *ud, int action, long long id, const char *text);

static void show_cache(chat *c)
{
    if (c->remote) { /* what only the local engine has */
        remote *r = backend_remote_client(c->b);
        ui_notice(c->u, UI_ROLE_NOTICE,
                  "/show cache is local-only: the replies come from %s, whose KV cache is its own (the KV gauge shows "
                  "the token counts it reports: prompt, cached, completion). The KV prefix store in %s is not used "
                  "for a remote chat; conversations are saved there as usual.",
                  remote_url(r), c->cs ? chatstore_path(c->cs) : "the database");
        return;
    }
    kv_cache_stats ks;
    kv_cache_get_stats(engine_kv(c->e), &ks);
    char buf[1600];
    if (c->cs) chatstore_report(c->cs, buf, sizeof buf);
    else snprintf(buf, sizeof buf, "KV prefix store: none (conversations are not being saved)");
    char win[256] = "";
    if (ks.n_swa_layers) /* sliding-window layers: what they hold against the full history */
        snprintf(win, sizeof win,
                 "\nsliding window: %d of %d layers keep the last %d positions: %.1f MiB used of %.1f MiB the full "
                 "history would take (%.1f MiB allocated)",
                 ks.n_swa_layers, ks.n_layer, ks.swa_keep + 1, ks.bytes_used / 1048576.0,
                 ks.bytes_full_history / 1048576.0, ks.bytes_allocated / 1048576.0);
    ui_notice(c->u, UI_ROLE_NOTICE,
              "%s\nin memory: %d of %d blocks used, %d cached prefix blocks, %llu hash hits, %llu evictions%s", buf,
              ks.n_blocks_used, ks.n_blocks, ks.n_blocks_cached, (unsigned long long)ks.n_hash_hits,
              (unsigned long long)ks.n_evictions, win);
}

static int need_idle(chat *c, const char *cmd)
{
    if (!c->busy) return 1;
    if (c->req == REQ_LOADING) ui_notice(c->u, UI_ROLE_ERROR, "%s: a model is loading (%s) — a moment", cmd, c->mj.path);
    else ui_notice(c->u, UI_ROLE_ERROR, "%s: a reply is streaming — press Esc to stop it first", cmd);
    return 0;
}

static void cmd_help(chat *c, char *args) { (void)args; ui_show_help(c->u, 1); }
static void cmd_quit(chat *c, char *args) { (void)args; c->quit = 1; }
static void cmd_sessions(chat *c, char *args) { (void)args; cb_sessions(c, UI_SESS_SHOW, 0, NULL); }
static void cmd_branch_(chat *c, char *args) { cmd_branch(c, args); }

/* /show experts: the last reply's expert choices per layer (mixture-of-experts models). */
static void show_experts(chat *c)
{
    int nl, ne;
    const uint32_t *cnt = engine_expert_counts(c->e, &nl, &ne);
    static char buf[24576];
    if (!cnt)
        ui_notice(c->u, UI_ROLE_NOTICE, "/show experts: %s is not a mixture-of-experts model", engine_model(c->e)->arch_name);
    else if (!need_idle(c, "/show experts")) return;
    else if (!experts_report(cnt, nl, ne, ui_mono(c->u), buf, sizeof buf))
        ui_notice(c->u, UI_ROLE_NOTICE, "/show experts: no reply yet");
    else ui_notice(c->u, UI_ROLE_NOTICE, "%s", buf);
}

static void cmd_show(chat *c, char *args)
{
    if (!*args || !strcmp(args, "params")) show_params(c);
    else if (!strcmp(args, "cache")) show_cache(c);
    else if (!strcmp(args, "experts")) show_experts(c);
    else if (!strcmp(args, "probs")) {
        size_t n = ui_set_heat(c->u, !ui_heat_on(c->u));
        if (!ui_heat_on(c->u)) ui_flash(c->u, "token probabilities hidden (/show probs, F6)");
        else if (!n) ui_notice(c->u, UI_ROLE_NOTICE, "/show probs: no reply with token probabilities yet (the replies "
                                                     "of the local engine in this session have them)");
        else ui_flash(c->u, "token probabilities: green >= 0.8, yellow >= 0.3, red below (/show probs, F6: off)");
    } else ui_notice(c->u, UI_ROLE_ERROR, "/show: unknown '%s' (try /show params, cache, experts or probs)", args);
}

static void cmd_clear(chat *c, char *args)
{
    (void)args;
    turns_clear(c);
    if (c->cs) chatstore_new(c->cs);
    c->synced = 0;
    ui_pane_clear(c->u);
    ui_set_stats(c->u, NULL, UI_PHASE_IDLE, NULL);
    ui_notice(c->u, UI_ROLE_NOTICE, "New conversation.");
    request_reset(c);
}

static void cmd_regen(chat *c, char *args)
{
    (void)args;
    if (c->conv.n_path && T(c, c->conv.n_path - 1)->role == UI_ROLE_ASSISTANT) turn_drop_last(c);
    c->synced = 0;
    if (!c->conv.n_path) {
        ui_notice(c->u, UI_ROLE_ERROR, "/regen: there is no reply to regenerate");
        return;
    }
    save_head(c); /* the old reply stays in the store as a branch */
    start_reply(c, 0);
}

static int cb_submit(void *ud, const char *line);

/* /best N [MESSAGE], /beams N [MESSAGE]: the reply to MESSAGE, or again to the last message (the
 * old reply kept as a branch, as /regen), as N samples ranked (the others kept as branches) or
 * as a beam search (app/decode_cmd.c, engine/best_of.h, engine/beam.h). */
static void cmd_candidates(chat *c, char *args, int beams)
{
    const char *name = beams ? "/beams" : "/best", *rest;
    int n;
    char msg[300];
    if (c->remote) {
        ui_notice(c->u, UI_ROLE_ERROR, "%s: the local engine only (a server samples its own replies)", name);
        return;
    }
    if (decode_parse_count(name, args, &n, &rest, msg, sizeof msg)) {
        ui_notice(c->u, UI_ROLE_ERROR, "%s", msg);
        return;
    }
    c->cand_best_of = beams ? 0 : n;
    c->cand_beams = beams ? n : 0;
    if (*rest == '/') ui_notice(c->u, UI_ROLE_ERROR, "%s: a message, not a command, after N", name);
    else if (*rest) cb_submit(c, rest);
    else cmd_regen(c, "");
    c->cand_best_of = c->cand_beams = 0;
}
static void cmd_best(chat *c, char *args) { cmd_candidates(c, args, 0); }
static void cmd_beams(chat *c, char *args) { cmd_candidates(c, args, 1); }

static void cmd_undo(chat *c, char *args)
{
    (void)args;
    if (!c->conv.n_path) {
        ui_notice(c->u, UI_ROLE_ERROR, "/undo: the conversation is empty");
        return;
    }
    if (T(c, c->conv.n_path - 1)->role == UI_ROLE_ASSISTANT) turn_drop_last(c);
    if (c->conv.n_path && T(c, c->conv.n_path - 1)->role == UI_ROLE_USER) turn_drop_last(c);
    c->synced = 0;
    save_head(c); /* the exchange stays in the store as a branch */
    ui_flash(c->u, "dropped the last exchange");
}

static void cmd_edit(chat *c, char *args)
{
    if (!begin_edit(c, args)) ui_notice(c->u, UI_ROLE_ERROR, "/edit: there is no message of yours to edit yet");
}

/* Code block `want` (1-based, numbered through the shown replies as the pane labels them:
 * ui/markdown.c) into *out (malloc'd) / *len; returns the number of blocks in all replies. */
static int code_blocks(const chat *c, int want, char **out, size_t *len)
{
    int count = 0;
    for (size_t i = 0; i < c->conv.n_path; i++) {
        const turn *t = T(c, i);
        if (t->role != UI_ROLE_ASSISTANT) continue;
        ui_reasoning r; /* numbered as the pane shows them: in the answer, not the reasoning */
        size_t a = ui_reasoning_split(t->text, t->len, &r) ? r.answer : 0;
        int k = ui_md_code_block(t->text + a, t->len - a, want - count, out, len);
        if (k > 0) count += k;
    }
    return count;
}

/* /read FILE: attach a text file to the next message. Refused: unreadable, larger than 1 MiB,
 * binary (chat_read_text, app/chat_files.c), or more tokens than half the context. */

/* The /read job's thread: count the file's tokens as a message would have them (the tokenizer
 * is reentrant and the engine's model read-only), then wake the main loop. */
static void *read_count(void *arg)
{
    struct read_job *j = arg;
    int32_t *toks = NULL;
    kv_error ke = {0};
    j->rc = engine_tokenize(j->e, j->buf, j->n, 1, 0, &toks, &j->nt, &ke);
    free(toks);
    char b = 1;
    if (write(j->done_pipe[1], &b, 1) < 0) {}
    return NULL;
}

static void cmd_read(chat *c, char *args)
{
    if (!*args) {
        if (c->attach) {
            free(c->attach);
            c->attach = NULL;
            ui_notice(c->u, UI_ROLE_NOTICE, "/read: %s is no longer attached", c->attach_name);
        } else ui_notice(c->u, UI_ROLE_ERROR, "usage: /read FILE (attaches a text file to your next message)");
        return;
    }
    char path[4096], why[300];
    if (c->rj.running) {
        ui_notice(c->u, UI_ROLE_ERROR, "/read %s: the file before is still being counted; not attached", args);
        return;
    }
    size_t n = 0;
    int unreadable = 0;
    char *buf = chat_read_text(args, &n, path, sizeof path, &unreadable, why, sizeof why);
    if (!buf) {
        ui_notice(c->u, UI_ROLE_ERROR, "/read %s: %s%s", args, why, unreadable ? "" : "; not attached");
        return;
    }
    const char *base = strrchr(path, '/');
    if (!c->e) { /* remote: a server's tokenizer is its own, so the file is attached by its size */
        free(c->attach);
        c->attach = buf;
        c->attach_len = n;
        snprintf(c->attach_name, sizeof c->attach_name, "%.255s", base ? base + 1 : path);
        ui_notice(c->u, UI_ROLE_NOTICE, "attached %s (%zu bytes) to your next message (/read alone drops it)",
                  c->attach_name, n);
        return;
    }
    struct read_job *j = &c->rj;
    snprintf(j->name, sizeof j->name, "%.255s", base ? base + 1 : path);
    j->e = c->e;
    j->buf = buf;
    j->n = n;
    j->nt = 0;
    if (j->done_pipe[0] < 0 || pthread_create(&j->th, NULL, read_count, j)) {
        ui_notice(c->u, UI_ROLE_ERROR, "/read %s: cannot start counting its tokens; not attached", args);
        free(buf);
        j->buf = NULL;
        return;
    }
    j->running = 1;
    ui_flash(c->u, "reading %s (%zu bytes): counting its tokens…", j->name, n);
}

/* The /read job's end (its byte on done_pipe came, or /model or the end of the chat waits for
 * it): attach the file, or say why not. */
static void read_finish(chat *c)
{
    struct read_job *j = &c->rj;
    if (!j->running) return;
    pthread_join(j->th, NULL);
    j->running = 0;
    char b;
    while (read(j->done_pipe[0], &b, 1) > 0) {}
    int n_ctx = engine_n_ctx(c->e);
    if (j->rc != KV_OK || j->nt > (size_t)n_ctx / 2) {
        if (j->rc != KV_OK) ui_notice(c->u, UI_ROLE_ERROR, "/read %s: its tokens could not be counted; not attached", j->name);
        else ui_notice(c->u, UI_ROLE_ERROR, "/read %s: %zu tokens, more than half the context (%d): raise -c; not attached",
                       j->name, j->nt, n_ctx);
        free(j->buf);
        j->buf = NULL;
        return;
    }
    free(c->attach);
    c->attach = j->buf;
    c->attach_len = j->n;
    j->buf = NULL;
    snprintf(c->attach_name, sizeof c->attach_name, "%s", j->name);
    ui_notice(c->u, UI_ROLE_NOTICE, "attached %s (%zu bytes, %zu tokens) to your next message (/read alone drops it)",
              c->attach_name, c->attach_len, j->nt);
}

/* /copy: the last reply, or (/copy N) code block N of the replies, to the terminal's clipboard. */
static void cmd_copy(chat *c, char *args)
{
    const char *text = NULL;
    char *block = NULL;
    size_t len = 0;
    char what[64];
    if (!*args) {
        for (size_t i = c->conv.n_path; i-- > 0 && !text;)
            if (T(c, i)->role == UI_ROLE_ASSISTANT && T(c, i)->len) {
                ui_reasoning r; /* the answer, without its reasoning */
                size_t a = ui_reasoning_split(T(c, i)->text, T(c, i)->len, &r) ? r.answer : 0;
                text = T(c, i)->text + a, len = T(c, i)->len - a;
            }
        if (!text) {
            ui_notice(c->u, UI_ROLE_ERROR, "/copy: there is no reply to copy yet");
            return;
        }
        snprintf(what, sizeof what, "the last reply");
    } else {
        char *end;
        long n = strtol(args, &end, 10);
        int count = code_blocks(c, n > 0 && n < INT32_MAX ? (int)n : 0, &block, &len);
        text = block;
        if (*end || n < 1 || n > count || !block) {
            free(block);
            ui_notice(c->u, UI_ROLE_ERROR, "/copy %s: %s", args,
                      count ? "no such code block (/copy N takes 1 to the number of ``` blocks in the replies)"
                            : "the replies have no code blocks; /copy alone copies the last reply");
            return;
        }
        snprintf(what, sizeof what, "code block %ld of %d", n, count);
    }
    char why[300];
    if (ui_clipboard_set(c->u, text, len, why, sizeof why)) ui_notice(c->u, UI_ROLE_ERROR, "/copy: %s", why);
    else ui_flash(c->u, "copied %s (%zu bytes) to the clipboard (OSC 52)", what, len);
    free(block);
}

/* A path typed in a command: "~/x" under $HOME, else as typed. */
static void user_path(const char *arg, char *path, size_t cap)
{
    const char *home = getenv("HOME");
    if (arg[0] == '~' && arg[1] == '/' && home) snprintf(path, cap, "%s%s", home, arg + 1);
    else snprintf(path, cap, "%s", arg);
}

/* /export [md|json] [FILE]: the conversation as `kvchat export` writes it (the same functions,
 * app/store_cli.c), to FILE or ./kvchat-ID.md|json. */
static void cmd_export(chat *c, char *args)
{
    char msg[4400];
    int rc = chat_export_conv(c->cs, args, msg, sizeof msg);
    ui_notice(c->u, rc ? UI_ROLE_ERROR : UI_ROLE_NOTICE, "%s", msg);
}

/* /system [TEXT|-]: show, set or (-) clear the conversation's system prompt; the next reply
 * renders the prompt again with it (the engine reuses the cached prefix before it). */
static void cmd_system(chat *c, char *args)
{
    if (!*args) {
        ui_notice(c->u, UI_ROLE_NOTICE, "system prompt: %s (/system TEXT sets it, /system - clears it)",
                  c->system && *c->system ? c->system : "(none)");
        return;
    }
    set_system(c, strcmp(args, "-") ? args : "");
}

/* ---- /persona: a system prompt and sampler settings from config.ini ---------------------------- */

static const char *persona_names[CFG_MAX_PERSONAS + 1]; /* for Tab after /persona and the help */

/* A persona's settings as "temp 0.2 · top_k 10" (the system prompt left out). */
static void persona_text(const cfg_persona *p, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    for (int k = 0; k < CFG_COUNT && o < cap; k++)
        if (p->v[k] && k != CFG_SYSTEM)
            o += (size_t)snprintf(buf + o, cap - o, "%s%s %s", o ? " · " : "", config_key_name(k), p->v[k]);
}

/* /persona NAME: apply a [persona NAME] section — its sampler settings (the others stay) and its
 * system prompt (the next reply renders the prompt again). Alone: the personas there are. */
static void cmd_persona(chat *c, char *args)
{
    const kv_config *cfg = c->opt.config;
    if (!*args) {
        char list[2400];
        size_t o = 0;
        for (int i = 0; cfg && i < cfg->n_personas && o < sizeof list - 300; i++) {
            char t[600];
            persona_text(&cfg->persona[i], t, sizeof t);
            const char *sys = cfg->persona[i].v[CFG_SYSTEM];
            o += (size_t)snprintf(list + o, sizeof list - o, "\n%s: %.200s%s%s%.60s%s", cfg->persona[i].name, t,
                                  t[0] && sys ? " · " : "", sys ? "system \"" : "", sys ? sys : "",
                                  sys ? (strlen(sys) > 60 ? "…\"" : "\"") : "");
        }
        if (o) ui_notice(c->u, UI_ROLE_NOTICE, "personas (/persona NAME applies one):%s", list);
        else ui_notice(c->u, UI_ROLE_NOTICE, "no personas: add [persona NAME] sections (system = …, temp = …) to %s",
                       cfg && cfg->path[0] ? cfg->path : "config.ini");
        return;
    }
    const cfg_persona *p = cfg ? config_persona_find(cfg, args) : NULL;
    if (!p) {
        char names[800] = "";
        size_t o = 0;
        for (int i = 0; cfg && i < cfg->n_personas && o < sizeof names - 80; i++)
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "", cfg->persona[i].name);
        ui_notice(c->u, UI_ROLE_ERROR, "/persona: no persona '%s' in %s (%s)", args,
                  cfg && cfg->path[0] ? cfg->path : "config.ini", o ? names : "it has none");
        return;
    }
    sampler_params sp = c->sp;
    int max_tokens = c->max_tokens;
    for (int k = 0; k < CFG_COUNT; k++)
        if (p->v[k] && k != CFG_SYSTEM) config_apply_key(k, p->v[k], NULL, &sp, &max_tokens);
    if (max_tokens <= 0) max_tokens = -1;
    kv_error ke = {0};
    if (sampler_params_validate(&sp, &ke)) {
        ui_notice(c->u, UI_ROLE_ERROR, "/persona %s: %s", args, ke.msg);
        return;
    }
    c->sp = sp;
    c->max_tokens = max_tokens;
    push_params(c);
    char t[600];
    persona_text(p, t, sizeof t);
    ui_notice(c->u, UI_ROLE_NOTICE, "persona %s%s%s", p->name, t[0] ? ": " : "", t);
    if (p->v[CFG_SYSTEM]) set_system(c, p->v[CFG_SYSTEM]);
}

/* ---- /model: another model, the same conversation ----------------------------------------------- */

#define N_MODEL_NAMES 64
static void model_label(const model *m, char *buf, size_t cap);
static void choose_template(chat *c, const char *override, int *unknown, char *notice, size_t cap);
static void show_info(chat *c);
static char *model_names[N_MODEL_NAMES + 1]; /* the models directory's names, for Tab after /model */

/* Prefill the whole conversation for the model just loaded (its template, its tokens), so the
 * gauge shows what it takes and the next reply prefills only its own message. One token is
 * sampled and dropped (the engine always samples after a prefill); the next request renders the
 * prompt again, so it is not part of the conversation. */
static void start_prefill(chat *c)
{
    char err[600];
    if (build_prompt(c, 0, 1, err, sizeof err)) {
        ui_notice(c->u, UI_ROLE_ERROR, "%s", err);
        request_reset(c);
        return;
    }
    worker_request rq = {.seg = c->pb.seg, .n_seg = c->pb.n_seg, .no_bos = c->opt.no_bos, .n_predict = 1,
                         .reset_cache = 1};
    kv_error ke = {0};
    backend_request brq = {.local = rq};
    if (backend_submit(c->b, &brq, &ke)) {
        ui_notice(c->u, UI_ROLE_ERROR, "%s", ke.msg);
        return;
    }
    set_busy(c, 1, REQ_PREFILL);
}

/* The /model job's thread: open the model with the chat's engine parameters, its sampler and its
 * worker (j->w NULL and j->ke on failure), then wake the main loop. The signals the UI thread
 * handles stay blocked here, so the engine's threads never take them (as main's do). */
static void *model_job_run(void *arg)
{
    struct model_job *j = arg;
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGWINCH);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    j->e = NULL, j->s = NULL, j->w = NULL;
    if (engine_open(&j->ep, &j->e, &j->ke) == KV_OK &&
        (j->s = sampler_create(engine_model(j->e)->hp.n_vocab, &j->sp, &j->ke)) &&
        worker_create(j->e, j->s, &j->w, &j->ke) == KV_OK) {
    } else {
        sampler_free(j->s);
        engine_close(j->e);
        j->e = NULL, j->s = NULL, j->w = NULL;
    }
    char b = 1;
    if (write(j->done_pipe[1], &b, 1) < 0) {}
    return NULL;
}

static void model_swap(chat *c, engine *ne, sampler *ns, worker *nw);

/* The /model job ended: swap the new model in, or say why not. */
static void model_loaded(chat *c)
{
    struct model_job *j = &c->mj;
    if (!j->running) return;
    pthread_join(j->th, NULL);
    j->running = 0;
    char b;
    while (read(j->done_pipe[0], &b, 1) > 0) {}
    set_busy(c, 0, REQ_NONE);
    if (!j->w) {
        ui_notice(c->u, UI_ROLE_ERROR, "/model: %s (still on %s)", j->ke.msg, c->model_label);
        return;
    }
    model_swap(c, j->e, j->s, j->w);
    j->e = NULL, j->s = NULL, j->w = NULL;
}

/* /model NAME|PATH: go on with another model. The conversation stays (its replies keep the names
 * of the models that wrote them); its prompt is rendered with the new model's template and
 * tokenized for its vocabulary, and prefilled at once. /model alone: the model in use. */
static void cmd_model(chat *c, char *args)
{
    if (c->remote) {
        ui_notice(c->u, UI_ROLE_ERROR, "/model: the replies come from %s (remote); its model is chosen with "
                  "--model NAME (or [remote] model) when the chat starts", remote_url(backend_remote_client(c->b)));
        return;
    }
    const model *m = engine_model(c->e);
    if (!*args) {
        char list[1200] = "";
        size_t o = 0;
        for (int i = 0; i < N_MODEL_NAMES && model_names[i] && o < sizeof list - 100; i++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", model_names[i]);
        char dir[4096] = "";
        models_dir(dir, sizeof dir);
        ui_notice(c->u, UI_ROLE_NOTICE, "model: %s (%s) · %s · ctx %d\n/model NAME|PATH switches; in %s: %s",
                  c->model_label, m->gguf && m->gguf->path ? m->gguf->path : "?",
                  c->tmpl == CHAT_TMPL_NONE ? "completion mode" : chat_template_name(c->tmpl), engine_n_ctx(c->e),
                  dir[0] ? dir : "the models directory", list[0] ? list : "(none)");
        return;
    }
    if (!c->opt.ep) {
        ui_notice(c->u, UI_ROLE_ERROR, "/model: not available here");
        return;
    }
    char path[4096];
    int found = models_resolve(args, path, sizeof path);
    if (found < 0) {
        ui_notice(c->u, UI_ROLE_ERROR, "/model: %s", path);
        return;
    }
    if (found == 0) user_path(args, path, sizeof path);
    read_finish(c); /* a /read count uses the engine that is about to go */
    struct model_job *j = &c->mj;
    j->ep = *c->opt.ep;
    snprintf(j->path, sizeof j->path, "%s", path);
    j->ep.model_path = j->path;
    j->sp = c->sp;
    memset(&j->ke, 0, sizeof j->ke);
    if (j->done_pipe[0] < 0 || pthread_create(&j->th, NULL, model_job_run, j)) {
        ui_notice(c->u, UI_ROLE_ERROR, "/model: cannot start loading %s (still on %s)", path, c->model_label);
        return;
    }
    j->running = 1;
    set_busy(c, 1, REQ_LOADING);
    ui_flash(c->u, "loading %s…", path);
}

/* Go on with the model just loaded: the replies so far keep their model's name, the store and
 * the worker's hooks move to it, the template is its own, and the conversation is prefilled. */
static void model_swap(chat *c, engine *ne, sampler *ns, worker *nw)
{
    /* the replies so far keep the name of the model that wrote them */
    for (size_t i = 0; i < c->conv.n; i++)
        if (c->conv.node[i].role == UI_ROLE_ASSISTANT && !c->conv.node[i].author)
            conv_set_author(&c->conv, (long)i, c->model_label);
    char old_label[160];
    snprintf(old_label, sizeof old_label, "%s", c->model_label);
    backend *nb = backend_local(nw);
    if (!nb) { /* out of memory: stay on the model in use */
        worker_destroy(nw);
        engine_close(ne);
        sampler_free(ns);
        ui_notice(c->u, UI_ROLE_ERROR, "/model: out of memory; still on %s", c->model_label);
        return;
    }
    backend_free(c->b); /* idle: joins the thread */
    engine_close(c->e);
    sampler_free(c->s);
    c->b = nb;
    c->e = ne;
    c->s = ns;
    char why[900];
    if (c->cs) {
        if (chatstore_switch_engine(c->cs, ne, why, sizeof why)) ui_notice(c->u, UI_ROLE_ERROR, "%s", why);
        worker_hooks hooks;
        chatstore_worker_hooks(c->cs, &hooks);
        worker_set_hooks(backend_worker(c->b), &hooks);
    }
    push_stops(c);
    push_params(c);
    model_label(engine_model(ne), c->model_label, sizeof c->model_label);
    char notice[700];
    int unknown;
    choose_template(c, NULL, &unknown, notice, sizeof notice);
    show_info(c);
    c->synced = 0;
    c->have_seed = 0;
    const model *nm = engine_model(ne);
    ui_notice(c->u, UI_ROLE_NOTICE, "model: %s → %s (%s, %s, ctx %d) · %s%s", old_label, c->model_label, nm->arch_name,
              quant_traits_of(nm->weight_type) ? quant_traits_of(nm->weight_type)->name : "?", engine_n_ctx(ne),
              c->tmpl == CHAT_TMPL_NONE ? "completion mode" : chat_template_name(c->tmpl),
              c->conv.n_path ? ": the conversation is tokenized again for it" : "");
    if (unknown) ui_notice(c->u, UI_ROLE_ERROR, "warning: %s has a chat template kvchat does not recognise; using chatml",
                           c->model_label);
    if (notice[0]) ui_notice(c->u, UI_ROLE_NOTICE, "%s", notice);
    /* --chat-template was written for the first model: a different model's prompt format is its own */
    if (c->opt.chat_template && *c->opt.chat_template)
        ui_notice(c->u, UI_ROLE_NOTICE, "--chat-template %s was for the first model only: %s uses its own template (%s)",
                  c->opt.chat_template, c->model_label,
                  c->tmpl == CHAT_TMPL_NONE ? "none: completion mode" : chat_template_name(c->tmpl));
    show_store_notes(c);
    if (c->conv.n_path) start_prefill(c);
    else request_reset(c);
}

/* The slash commands: one table gives dispatch, the help overlay and Tab completion (Redis's
 * command table). usage: help lines "USAGE\tdescription" ('\n' between lines; a line starting
 * with '\t' continues the one above); "@set" stands for the generated list of /set's parameters. */
typedef struct chat_cmd {
    const char *name;
    const char *aliases[3];        /* NULL-terminated */
    const char *usage;
    int needs_idle;                /* refused while a reply streams */
    void (*handler)(chat *c, char *args);
    const char *const *args;       /* what Tab completes the first argument to; NULL: nothing */
    int args_themes;               /* ... the theme names */
} chat_cmd;

static const char *const show_args[] = {"params", "cache", "experts", "probs", NULL};
static const char *const branch_args[] = {"list", "next", "prev", NULL};
static const char *const export_args[] = {"md", "json", NULL};
static const char *set_args[N_SET_PARAMS + 1];

static const chat_cmd commands[] = {
    {"/help", {"/?"}, "/help\tthis help", 0, cmd_help, NULL, 0},
    {"/set", {0}, "/set NAME VALUE\tchange a parameter (from the next token on):\n@set\n"
                  "\t  stop STR: end replies where STR appears\n\t  (repeatable; /set stop alone clears them)",
     0, cmd_set, set_args, 0},
    {"/show", {0}, "/show params\tlist the parameters\n/show cache\tthe KV prefix store: size, hit rate\n"
                        "/show experts\texpert usage of the last reply per layer (MoE models)\n"
                        "/show probs\tcolour the replies by their tokens' probability\n\t  (on / off; also F6)", 0, cmd_show,
     show_args, 0},
    {"/sessions", {0}, "/sessions\tsaved conversations (also F3)", 0, cmd_sessions, NULL, 0},
    {"/clear", {0}, "/clear\tnew conversation (empties the KV cache)", 1, cmd_clear, NULL, 0},
    {"/regen", {0}, "/regen\ta new reply to your last message (the old one\n\t  stays as a branch)", 1, cmd_regen, NULL, 0},
    {"/best", {0}, "/best N [MSG]\tN samples of the reply (to MSG, or again to your\n\t  last message), the one of the highest mean\n\t  log-probability shown, the others as branches", 1, cmd_best, NULL, 0},
    {"/beams", {0}, "/beams N [MSG]\tthe reply by beam search of N beams (its score\n\t  said)", 1, cmd_beams, NULL, 0},
    {"/undo", {0}, "/undo\tdrop the last exchange (kept as a branch)", 1, cmd_undo, NULL, 0},
    {"/edit", {0}, "/edit [TEXT]\tedit your last message; the answer goes on a new\n\t  branch, the original stays (Up on an "
                   "empty input)", 1, cmd_edit, NULL, 0},
    {"/branch", {0}, "/branch\tan alternative reply, keeping this one\n/branch N\tshow branch N of the last branch point "
                     "(next,\n\t  prev); the label says \"branch 2/3\"\n/branch M:N\tbranch N of message M\n/branch list\tthe "
                     "branch points of the shown conversation", 1, cmd_branch_, branch_args, 0},
    {"/theme", {0}, "/theme NAME\tswitch theme; /theme alone lists them", 0, cmd_theme, NULL, 1},
    {"/system", {0}, "/system [TEXT]\tshow / set the system prompt (- clears it)", 1, cmd_system, NULL, 0},
    {"/export", {0}, "/export [md|json] [FILE]\tsave the conversation (as kvchat\n\t  export; default ./kvchat-ID.md)", 0,
     cmd_export, export_args, 0},
    {"/persona", {0}, "/persona [NAME]\tapply a [persona NAME] of config.ini (system\n\t  prompt + sampling); alone: list them@personas", 1,
     cmd_persona, (const char *const *)persona_names, 0},
    {"/model", {0}, "/model [NAME|PATH]\tgo on with another model (Tab: the models\n\t  directory); alone: the model in use", 1,
     cmd_model, (const char *const *)model_names, 0},
    {"/read", {0}, "/read FILE\tattach a text file to your next message", 0, cmd_read, NULL, 0},
    {"/copy", {0}, "/copy\tcopy the last reply to the clipboard (OSC 52)\n/copy N\tcopy code block N of the replies", 0,
     cmd_copy, NULL, 0},
    {"/quit", {"/exit", "/q"}, "/quit\tquit (also /exit)", 0, cmd_quit, NULL, 0},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

const char *chat_command_name(size_t i, const char **help)
{
    if (i >= N_COMMANDS) return NULL;
    if (help) *help = commands[i].usage;
    return commands[i].name;
}

static const chat_cmd *command_find(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (!strcmp(name, commands[i].name)) return &commands[i];
        for (int a = 0; a < 3 && commands[i].aliases[a]; a++)
            if (!strcmp(name, commands[i].aliases[a])) return &commands[i];
    }
    return NULL;
}

static void run_command(chat *c, const char *line)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", line);
    size_t l = strlen(buf);
    while (l && isspace((unsigned char)buf[l - 1])) buf[--l] = 0;
    char *cmd = buf, *args = buf + strcspn(buf, " ");
    if (*args) *args++ = 0;
    while (*args == ' ') args++;
    const chat_cmd *k = command_find(cmd);
    if (!k) {
        ui_notice(c->u, UI_ROLE_ERROR, "unknown command '%.40s' — /help lists the commands", cmd);
        return;
    }
    if (k->needs_idle && !need_idle(c, k->name)) return;
    k->handler(c, args);
}

static const char help_keys[] =
    "Keys\n"
    "Enter\tsend the message, or run a /command\n"
    "Alt-Enter\tnew line in the message (pastes keep theirs)\n"
    "Esc, Ctrl-C\tstop the streaming reply (the partial reply stays)\n"
    "Ctrl-C Ctrl-C\tquit (on an empty input); on a draft: clear (Ctrl-Y)\n"
    "Ctrl-D\tquit (on an empty input)\n"
    "F1\tthis help\n"
    "F2, F4, F6\tshow / hide: sliders, reasoning, token probabilities\n"
    "F3\tsaved conversations: open, search, rename, delete\n"
    "Tab, Shift-Tab\tfocus input > sliders > chat; completes /commands\n"
    "Left, Right\t(sliders) change the selected slider\n"
    "Ctrl-Left, Ctrl-Right\t(sliders) ten steps; Home, End: min, max\n"
    "Up, Down\t(sliders) select; (chat) scroll; (input) history\n"
    "Up (empty input)\tedit your last message; Up, Down again: earlier,\n"
    "\t  later ones (Esc cancels); Ctrl-P, Ctrl-N: history\n"
    "PgUp, PgDn\tscroll the chat; so does the mouse wheel\n"
    "Home, End\ttop / bottom of the chat (chat focused or no input)\n"
    "Ctrl-R\tsearch the message history; Ctrl-X Ctrl-E: $EDITOR\n"
    "Ctrl-A E K U W Y\treadline (Emacs) editing; Alt-B, Alt-F: words\n"
    "Ctrl-L\tredraw the screen\n"
    "Ctrl-Z\tsuspend (fg resumes)\n"
    "Shift + drag\tselect text while the wheel is on (--no-mouse)\n"
    "\n"
    "Commands\n";

static const char help_tail[] =
    "//text\tsend a message that starts with '/'\n"
    "Enter (empty)\tcompletion mode: let the model go on\n"
    "\n"
    " Themes are looked up in $XDG_CONFIG_HOME/kvchat/themes, then\n"
    " the install dir (share/kvchat/themes), then themes/ by the binary.\n"
    " NO_COLOR turns colours off. History: $XDG_STATE_HOME/kvchat/history\n"
    " Conversations are saved as you go in $XDG_DATA_HOME/kvchat/kvchat.db\n"
    " (--db, KVCHAT_DB); kvchat --resume [ID|last] reopens one.";

/* The help overlay's text from the command table (malloc'd; NULL when out of memory). The
 * parameters of /set are listed with their ranges from the settings table, two or three a line. */
static char *help_build(void)
{
    size_t cap = sizeof help_keys + sizeof help_tail + 4096, o = 0;
    char *h = malloc(cap);
    if (!h) return NULL;
    o += (size_t)snprintf(h + o, cap - o, "%s", help_keys);
    for (size_t i = 0; i < N_COMMANDS && o < cap; i++) {
        const char *u = commands[i].usage, *at = strstr(u, "@set"), *pe = strstr(u, "@personas");
        if (pe) { /* the personas of config.ini, by name */
            o += (size_t)snprintf(h + o, cap - o, "%.*s\n", (int)(pe - u), u);
            for (int k = 0; persona_names[k] && o < cap; k++)
                o += (size_t)snprintf(h + o, cap - o, "%s%s", k ? ", " : "\t  here: ", persona_names[k]);
            if (persona_names[0] && o < cap) o += (size_t)snprintf(h + o, cap - o, "\n");
            continue;
        }
        if (!at) {
            o += (size_t)snprintf(h + o, cap - o, "%s\n", u);
            continue;
        }
        o += (size_t)snprintf(h + o, cap - o, "%.*s", (int)(at - u), u);
        size_t line = 0;
        for (size_t k = 0; k < N_SET_PARAMS && o < cap; k++) {
            int key = set_params[k].key;
            if (key < 0) continue;
            char r[64], item[120];
            if (key == CFG_SYSTEM) snprintf(r, sizeof r, "TEXT");
            else if (key == CFG_MARKDOWN) snprintf(r, sizeof r, "on|off");
            else config_range_text(key, r, sizeof r);
            snprintf(item, sizeof item, "%s %s", set_params[k].name, r);
            size_t w = strlen(item);
            if (line && line + 3 + w > 48) {
                o += (size_t)snprintf(h + o, cap - o, "\n");
                line = 0;
            }
            o += (size_t)snprintf(h + o, cap - o, "%s%s", line ? " · " : "\t  ", item);
            line += (line ? 3 : 0) + w;
        }
        o += (size_t)snprintf(h + o, cap - o, "%s\n", at + 4);
    }
    if (o < cap) snprintf(h + o, cap - o, "%s", help_tail);
    return h;
}

/* ---- themes --------------------------------------------------------------------------------------- */

typedef struct warn_list {
    char msg[8][600];
    int n;
} warn_list;

static void collect_warning(void *ud, const char *msg)
{
    warn_list *w = ud;
    if (w->n < 8) snprintf(w->msg[w->n], sizeof w->msg[0], "%s", msg);
    w->n++;
}

static void show_warnings(chat *c, const warn_list *w)
{
    for (int i = 0; i < w->n && i < 8; i++) ui_notice(c->u, UI_ROLE_ERROR, "theme warning: %s", w->msg[i]);
    if (w->n > 8) ui_notice(c->u, UI_ROLE_ERROR, "theme: %d more warnings", w->n - 8);
}

static void cmd_theme(chat *c, char *name)
{
    if (!*name) {
        char list[1024];
        ui_theme_list(list, sizeof list);
        ui_notice(c->u, UI_ROLE_NOTICE, "themes: %s (/theme NAME switches)", list);
        return;
    }
    ui_theme t;
    warn_list w = {0};
    char why[1200];
    if (ui_theme_load(name, &t, collect_warning, &w, why, sizeof why)) {
        ui_notice(c->u, UI_ROLE_ERROR, "/theme: %s", why);
        return;
    }
    ui_set_theme(c->u, &t);
    show_warnings(c, &w);
    ui_flash(c->u, "theme %s%s", t.name, ui_mono(c->u) ? " (no colours: NO_COLOR or the terminal)" : "");
}

/* ---- ui callbacks ----------------------------------------------------------------------------------- */

static int cb_submit(void *ud, const char *line)
{
    chat *c = ud;
    size_t editing = c->editing;
    c->editing = 0;
    if (line[0] == '/' && line[1] != '/') {
        run_command(c, line);
        return 1;
    }
    const char *text = line[0] == '/' ? line + 1 : line;
    if (c->busy) {
        if (c->req == REQ_LOADING) ui_flash(c->u, "loading %s — a moment (Enter again then)", c->mj.path);
        else ui_flash(c->u, "a reply is streaming — Esc stops it");
        return 0;
    }
    if (editing) { /* the edited version of path[editing - 1] */
        if (!*text) ui_flash(c->u, "edit cancelled (an empty message)");
        else if (editing - 1 < c->conv.n_path && T(c, editing - 1)->role == UI_ROLE_USER)
            edit_send(c, editing - 1, text, strlen(text));
        return 1;
    }
    if (!*text) {
        if (c->tmpl == CHAT_TMPL_NONE && c->conv.n_path) start_reply(c, 1);
        return 1;
    }
    if (c->rj.running) {
        ui_flash(c->u, "counting the tokens of %s — a moment (Enter again then)", c->rj.name);
        return 0;
    }

    char *joined = NULL;
    if (c->attach) { /* /read FILE: the file goes with this message, before it */
        size_t tl = strlen(text), nl = strlen(c->attach_name);
        size_t cap = c->attach_len + tl + nl + 64;
        if ((joined = malloc(cap))) {
            int k = snprintf(joined, cap, "File %s:\n\n", c->attach_name);
            memcpy(joined + k, c->attach, c->attach_len);
            snprintf(joined + k + c->attach_len, cap - (size_t)k - c->attach_len, "\n\n%s", text);
            text = joined;
        }
        free(c->attach);
        c->attach = NULL;
    }
    turn *t = turn_add(c, UI_ROLE_USER, text, strlen(text));
    if (!t) {
        free(joined);
        ui_notice(c->u, UI_ROLE_ERROR, "out of memory");
        return 1;
    }
    t->view = ui_msg_add(c->u, UI_ROLE_USER, "you", text, strlen(text));
    free(joined);
    save_user(c, t);
    start_reply(c, 0);
    return 1;
}

/* Up on an empty input edits your last message; Up / Down while an edit is unchanged move to
 * the message before / after it (Down past the last one ends the edit). */
static int cb_edit_step(void *ud, int dir)
{
    chat *c = ud;
    if (c->busy) return 0;
    if (!c->editing) return dir < 0 && begin_edit(c, NULL);
    size_t cur = c->editing - 1;
    long q = dir < 0 ? user_pos_before(c, cur) : user_pos_after(c, cur);
    if (q >= 0) edit_at(c, (size_t)q);
    else if (dir > 0) {
        c->editing = 0;
        ui_input_edit_end(c->u);
    } else ui_flash(c->u, "this is your first message");
    return 1;
}

static void cb_edit_cancel(void *ud)
{
    chat *c = ud;
    c->editing = 0;
    ui_flash(c->u, "edit cancelled");
}

static void cb_quit(void *ud) { ((chat *)ud)->quit = 1; }

static void cb_stop(void *ud)
{
    chat *c = ud;
    if (c->busy) backend_cancel(c->b);
}

static void cb_slider(void *ud, int id, double v)
{
    chat *c = ud;
    switch (id) {
    case UI_SL_TEMP: c->sp.temperature = (float)v; break;
    case UI_SL_TOP_P: c->sp.top_p = (float)v; break;
    case UI_SL_TOP_K: c->sp.top_k = (int32_t)lround(v); break;
    case UI_SL_MIN_P: c->sp.min_p = (float)v; break;
    case UI_SL_REPEAT: c->sp.repeat_penalty = (float)v; break;
    case UI_SL_MAX_TOKENS: c->max_tokens = v <= 0 ? -1 : (int)lround(v); break; /* -1: ∞ */
    default: return;
    }
    backend_set_params(c->b, &c->sp);
    backend_set_n_predict(c->b, c->max_tokens);
}

/* ---- saved conversations: open, the sessions view ---------------------------------------------------- */

static const char *finish_note(int finish)
{
    switch (finish) {
    case STORE_FINISH_STOPPED: return "[stopped]";
    case STORE_FINISH_LENGTH: return "[max tokens]";
    case STORE_FINISH_CONTEXT: return "[context full]";
    case STORE_FINISH_ERROR: return "[error]";
    default: return NULL;
    }
}

/* The tree of a stored conversation: its path and other branches merged in id order (a parent
 * before its children), parents found by id (a system message's children are first messages);
 * the path is the stored head's branch. */
static void load_tree(chat *c, const chatstore_conv *cv)
{
    size_t i = 0, j = 0;
    while (i < cv->n || j < cv->n_others) {
        int from_path = j >= cv->n_others || (i < cv->n && cv->msgs[i].id < cv->others[j].id);
        const chatstore_msg *m = from_path ? &cv->msgs[i++] : &cv->others[j++];
        long parent = conv_find_id(&c->conv, m->parent); /* ids ascend */
        int role = m->role == STORE_ROLE_USER ? UI_ROLE_USER : UI_ROLE_ASSISTANT;
        long k = conv_add(&c->conv, parent, role, m->text, m->len);
        if (k < 0) break;
        c->conv.node[k].id = m->id;
        /* a reply keeps the name of the model that wrote it (schema 4), else of the model the
         * conversation was held with */
        if (role == UI_ROLE_ASSISTANT && (m->author[0] || cv->model_name[0]))
            conv_set_author(&c->conv, k, m->author[0] ? m->author : cv->model_name);
        c->conv.node[k].finish = m->finish;
        c->conv.node[k].unreadable = m->problem[0] != 0;
        if (from_path && conv_path_push(&c->conv, k)) break;
    }
}

/* Show conversation id and continue it: its messages (the current branch), system prompt and
 * parameters; the worker gets its exact tokens and restores their KV cache from the store. */
static int open_conversation(chat *c, int64_t id)
{
    if (!c->cs || !need_idle(c, "open")) return -1;
    chatstore_conv cv;
    char why[900];
    if (chatstore_load(c->cs, id, &cv, why, sizeof why)) {
        ui_notice(c->u, UI_ROLE_ERROR, "%s", why);
        return -1;
    }
    turns_clear(c);
    ui_pane_clear(c->u);
    ui_set_stats(c->u, NULL, UI_PHASE_IDLE, NULL);
    free(c->system);
    c->system = cv.system ? strdup(cv.system) : NULL;
    kv_error ke = {0};
    if (cv.have_params && sampler_params_validate(&cv.sp, &ke) == KV_OK) {
        c->sp = cv.sp;
        c->max_tokens = cv.max_tokens <= 0 ? -1 : cv.max_tokens;
        push_params(c);
    }
    ui_notice(c->u, UI_ROLE_NOTICE, "Conversation %lld: %s", (long long)cv.id, cv.title && *cv.title ? cv.title : "(untitled)");
    if (c->system) ui_notice(c->u, UI_ROLE_NOTICE, "system prompt: %s", c->system);
    load_tree(c, &cv);
    show_from(c, 0);
    if (cv.note[0]) ui_notice(c->u, UI_ROLE_ERROR, "%s", cv.note);
    if (c->conv.n_path && T(c, c->conv.n_path - 1)->role == UI_ROLE_USER)
        ui_notice(c->u, UI_ROLE_NOTICE, "the last message has no reply (the chat ended before it): /regen answers it");
    backend_request rq = {.local = {.reset_cache = 1, .set_conv = cv.ctx != NULL, .conv = cv.ctx, .n_conv = cv.n_ctx}};
    if (cv.ctx) chatstore_announce_restore(c->cs);
    if (backend_submit(c->b, &rq, &ke) == KV_OK) set_busy(c, 1, REQ_RESET);
    else ui_notice(c->u, UI_ROLE_ERROR, "%s", ke.msg);
    c->synced = cv.ctx != NULL; /* completion mode appends to the exact tokens, as before */
    chatstore_conv_free(&cv);
    return 0;
}

static void sessions_refresh(chat *c, const char *status)
{
    store_conv *rows = NULL;
    size_t n = 0;
    char why[700];
    if (chatstore_list(c->cs, c->sess_query, &rows, &n, why, sizeof why)) {
        ui_sessions_show(c->u, NULL, 0, why);
        return;
    }
    ui_session_row *r = calloc(n ? n : 1, sizeof *r);
    char (*dates)[32] = calloc(n ? n : 1, sizeof *dates);
    char (*labels)[160] = calloc(n ? n : 1, sizeof *labels);
    if (r && dates && labels) {
        for (size_t i = 0; i < n; i++) {
            /* the model column: the file's name ("tinyllama-q4_0"), which says more than general.name */
            const char *mp = rows[i].model_path, *base = mp && *mp ? strrchr(mp, '/') : NULL;
            base = base ? base + 1 : mp && *mp ? mp : NULL;
            size_t bl = base ? strlen(base) : 0;
            if (bl > 5 && !strcasecmp(base + bl - 5, ".gguf")) bl -= 5;
            if (bl && !strstr(mp, "://")) snprintf(labels[i], sizeof labels[i], "%.*s", (int)bl, base);
            else snprintf(labels[i], sizeof labels[i], "%s", rows[i].model_name ? rows[i].model_name : "");
            time_t t = (time_t)(rows[i].updated_at / 1000);
            struct tm tm;
            if (localtime_r(&t, &tm)) strftime(dates[i], sizeof dates[i], "%Y-%m-%d %H:%M", &tm);
            r[i] = (ui_session_row){.id = rows[i].id, .title = rows[i].title, .model = labels[i],
                                    .date = dates[i], .n_messages = rows[i].n_messages,
                                    .n_branches = rows[i].n_branches,
                                    .current = rows[i].id == chatstore_current(c->cs),
                                    .snippet = rows[i].snippet};
        }
        ui_sessions_show(c->u, r, n, status);
    }
    free(r);
    free(dates);
    free(labels);
    store_conv_list_free(rows, n);
}

static void cb_sessions(void *ud, int action, long long id, const char *text)
{
    chat *c = ud;
    char why[700], status[200];
    if (!c->cs) {
        ui_flash(c->u, "conversations are not being saved (see the notice at start)");
        return;
    }
    switch (action) {
    case UI_SESS_SHOW:
        if (ui_sessions_visible(c->u)) {
            ui_sessions_hide(c->u);
            break;
        }
        c->sess_query[0] = 0;
        sessions_refresh(c, NULL);
        break;
    case UI_SESS_SEARCH:
        snprintf(c->sess_query, sizeof c->sess_query, "%s", text ? text : "");
        sessions_refresh(c, NULL);
        break;
    case UI_SESS_OPEN:
        if (c->busy) {
            ui_flash(c->u, "a reply is streaming — Esc stops it first");
            break;
        }
        ui_sessions_hide(c->u);
        open_conversation(c, id);
        break;
    case UI_SESS_RENAME:
        if (chatstore_rename(c->cs, id, text, why, sizeof why)) snprintf(status, sizeof status, "%.190s", why);
        else snprintf(status, sizeof status, "renamed conversation %lld", id);
        sessions_refresh(c, status);
        break;
    case UI_SESS_DELETE:
        if (id == chatstore_current(c->cs) && c->busy) {
            ui_flash(c->u, "a reply is streaming — Esc stops it first");
            break;
        }
        if (id == chatstore_current(c->cs))
            for (size_t i = 0; i < c->conv.n; i++) c->conv.node[i].id = 0; /* the next message starts a new one */
        if (chatstore_delete(c->cs, id, why, sizeof why)) snprintf(status, sizeof status, "%.190s", why);
        else snprintf(status, sizeof status, "deleted conversation %lld", id);
        sessions_refresh(c, status);
        break;
    case UI_SESS_NEW:
        ui_sessions_hide(c->u);
        run_command(c, "/clear");
        break;
    default: break;
    }
}

/* ---- run ------------------------------------------------------------------------------------------- */

int chat_history_path(char *buf, size_t cap)
{
    const char *st = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (st && *st == '/') snprintf(buf, cap, "%s/kvchat/history", st);
    else if (home && *home) snprintf(buf, cap, "%s/.local/state/kvchat/history", home);
    else return -1;
    return 0;
}

static void setup_locale(void)
{
    setlocale(LC_ALL, "");
    const char *cs = nl_langinfo(CODESET);
    if (!cs || (strcmp(cs, "UTF-8") && strcmp(cs, "utf8"))) {
        if (!setlocale(LC_CTYPE, "C.UTF-8")) setlocale(LC_CTYPE, "C.utf8");
    }
    setlocale(LC_NUMERIC, "C"); /* "0.80", and /set parses dots */
}

/* Synthetic history for the UI benchmark (tests/bench_ui.sh): n messages in the pane only. */
static void bench_fill(chat *c, long n)
{
    static const char *const words[] = {"the", "little", "cat", "sat", "on", "a", "warm", "mat", "and", "dreamed",
                                        "of", "fish", "日本語", "🙂", "naïve", "über"};
    char text[600];
    unsigned seed = 7;
    for (long i = 0; i < n; i++) {
        size_t o = 0;
        int nw = 10 + (int)(i % 60);
        for (int k = 0; k < nw && o < sizeof text - 32; k++) {
            seed = seed * 1103515245u + 12345u;
            o += (size_t)snprintf(text + o, sizeof text - o, "%s%s", k ? " " : "", words[(seed >> 16) % 16]);
        }
        int user = i % 2 == 0;
        ui_msg_add(c->u, user ? UI_ROLE_USER : UI_ROLE_ASSISTANT, user ? "you" : c->model_label, text, o);
    }
}

/* The model's name on screen: its general.name, unless that is missing or only the architecture
 * ("llama"): then the file's name without .gguf ("stories260K"), which says more. */
static void model_label(const model *m, char *buf, size_t cap)
{
    chatstore_label(m->name, m->arch_name, m->gguf && m->gguf->path ? m->gguf->path : "model", buf, cap);
}

/* The chat template of engine e's model: its own (run by the Jinja interpreter), --chat-template's
 * (override; NULL for none), or the shape table's; an unknown one is chatml (*unknown = 1). */
static void choose_template(chat *c, const char *override, int *unknown, char *notice, size_t cap)
{
    const model *m = engine_model(c->e);
    char *tmpl_text = NULL;
    kv_error ke = {0};
    gguf_get_str(m->gguf, "tokenizer.chat_template", 0, &tmpl_text, &ke);
    const tokenizer *tk = engine_tokenizer(c->e);
    int32_t bos = tokenizer_bos(tk), eos = tokenizer_eos(tk);
    prompt_jinja_free(c->pj);
    c->pj = NULL;
    c->tmpl = prompt_choose(tmpl_text, override, bos >= 0 ? tokenizer_token_text(tk, bos) : NULL,
                            eos >= 0 ? tokenizer_token_text(tk, eos) : NULL, &c->pj, notice, cap);
    *unknown = c->tmpl == CHAT_TMPL_UNKNOWN;
    if (*unknown) c->tmpl = CHAT_TMPL_CHATML; /* the most common family; said on screen */
    free(tmpl_text);
}

/* The status bar's model fields for the engine in use. */
static void show_info(chat *c)
{
    const model *m = engine_model(c->e);
    char params[48] = ""; /* MoE: total and active parameters */
    if (m->n_params_active != m->n_params) {
        double t = (double)m->n_params, a = (double)m->n_params_active;
        if (t >= 1e9) snprintf(params, sizeof params, "%.1fB, %.1fB active", t / 1e9, a / 1e9);
        else snprintf(params, sizeof params, "%.0fM, %.0fM active", t / 1e6, a / 1e6);
    }
    ui_info info = {
        .model_name = c->model_label,
        .params = params[0] ? params : NULL,
        .arch = m->arch_name,
        .weight_type = quant_traits_of(m->weight_type) ? quant_traits_of(m->weight_type)->name : "?",
        .mode = c->tmpl == CHAT_TMPL_NONE ? "completion" : chat_template_name(c->tmpl),
        .n_ctx = engine_n_ctx(c->e),
        .n_threads = engine_n_threads(c->e),
    };
    ui_set_info(c->u, &info);
}

/* What chat_run owns besides the engine, worker, store and screen, freed on every way out (an
 * early error too: the Jinja prompt state, the strings, the pipes). Returns status. */
static int chat_release(chat *c, int status)
{
    if (c->mj.done_pipe[0] >= 0) close(c->mj.done_pipe[0]), close(c->mj.done_pipe[1]);
    c->mj.done_pipe[0] = c->mj.done_pipe[1] = -1;
    free(c->rj.buf);
    if (c->rj.done_pipe[0] >= 0) close(c->rj.done_pipe[0]), close(c->rj.done_pipe[1]);
    c->rj.done_pipe[0] = c->rj.done_pipe[1] = -1;
    conv_free(&c->conv); /* the views went with the ui */
    free(c->system);
    for (int i = 0; i < c->n_stops; i++) free(c->stops[i]);
    prompt_buf_free(&c->pb);
    prompt_jinja_free(c->pj);
    prompt_buf_free(&c->kb);
    free(c->attach);
    for (int i = 0; i < N_MODEL_NAMES && model_names[i]; i++) free(model_names[i]), model_names[i] = NULL;
    free(c->rmsgs);
    memset(c, 0, sizeof *c);
    return status;
}

int chat_run(engine **pe, sampler **ps, const chat_options *o)
{
    setup_locale();
    chat C, *c = &C;
    memset(c, 0, sizeof *c);
    engine *e = pe ? *pe : NULL; /* NULL with --remote */
    sampler *s = ps ? *ps : NULL;
    c->e = e;
    c->s = s;
    if (pipe2(c->rj.done_pipe, O_NONBLOCK | O_CLOEXEC)) c->rj.done_pipe[0] = c->rj.done_pipe[1] = -1;
    if (pipe2(c->mj.done_pipe, O_NONBLOCK | O_CLOEXEC)) c->mj.done_pipe[0] = c->mj.done_pipe[1] = -1;
    c->opt = *o;
    c->remote = o->remote_url != NULL;
    if (c->remote) sampler_params_default(&c->sp);
    if (c->remote && o->sp) c->sp = *o->sp;
    if (!c->remote) c->sp = *sampler_get_params(s);
    c->max_tokens = o->n_predict;
    if (o->system && *o->system) c->system = strdup(o->system); /* --system, or the config's */

    /* theme first: a bad --theme is a usage error before the screen opens */
    ui_theme theme;
    warn_list tw = {0};
    char why[1200];
    const char *theme_name = o->theme ? o->theme : "default";
    if (ui_theme_load(theme_name, &theme, collect_warning, &tw, why, sizeof why)) {
        fprintf(stderr, "kvchat: %s\n", why);
        return chat_release(c, 2);
    }

    kv_error ke = {0};
    char tmpl_notice[700] = "", remote_note[1200] = "";
    int tmpl_unknown = 0;
    const model *m = e ? engine_model(e) : NULL;
    if (c->remote) { /* the server renders the messages: chat mode, its template */
        remote_options ro = {.url = o->remote_url, .api_key = o->remote_api_key, .model = o->remote_model,
                             .timeout_s = o->remote_timeout_s};
        remote *r = NULL;
        if (remote_create(&ro, &r, &ke) || !(c->b = backend_remote(r))) {
            remote_destroy(r);
            fprintf(stderr, "kvchat: %s\n", ke.msg[0] ? ke.msg : "out of memory");
            return chat_release(c, ke.code == KV_ERR_INVALID ? 2 : 1);
        }
        if (remote_probe(r, remote_note, sizeof remote_note) == 0) remote_note[0] = 0; /* else said in the chat */
        snprintf(c->model_label, sizeof c->model_label, "%s", *remote_model(r) ? remote_model(r) : "remote");
        c->tmpl = CHAT_TMPL_CHATML; /* not NONE: messages, not continued text */
    } else {
        model_label(m, c->model_label, sizeof c->model_label);
        choose_template(c, o->chat_template, &tmpl_unknown, tmpl_notice, sizeof tmpl_notice);
        worker *w = NULL;
        if (worker_create(e, s, &w, &ke)) {
            fprintf(stderr, "kvchat: %s\n", ke.msg);
            return chat_release(c, 1);
        }
        if (!(c->b = backend_local(w))) {
            worker_destroy(w);
            fprintf(stderr, "kvchat: out of memory\n");
            return chat_release(c, 1);
        }
    }
    spec_params_default(&c->spec);
    if (o->spec) c->spec = *o->spec;
    if (!c->remote) worker_set_spec(backend_worker(c->b), &c->spec);
    for (int i = 0; i < o->n_stops && c->n_stops < STOP_MAX_STRINGS; i++) /* --stop */
        if (o->stops[i] && *o->stops[i] && (c->stops[c->n_stops] = strdup(o->stops[i]))) c->n_stops++;
    push_stops(c);
    /* the conversation store: a failure only means nothing is saved, unless --resume needs it */
    char store_why[900] = "";
    int64_t resume_id = 0;
    if (c->remote && o->db_path) /* conversations are saved as usual; no KV prefixes (local-only) */
        c->cs = chatstore_open_remote(remote_url(backend_remote_client(c->b)), c->model_label, o->db_path, store_why,
                                      sizeof store_why);
    else if (o->db_path && (c->cs = chatstore_open(e, o->db_path, o->cache_bytes, store_why, sizeof store_why))) {
        worker_hooks hooks;
        chatstore_worker_hooks(c->cs, &hooks);
        worker_set_hooks(backend_worker(c->b), &hooks);
    }
    if (o->resume && (!c->cs || chatstore_resolve(c->cs, o->resume, &resume_id, store_why, sizeof store_why))) {
        fprintf(stderr, "kvchat: --resume: %s\n", o->db_path ? store_why : "no conversation database");
        backend_free(c->b);
        chatstore_close(c->cs);
        return chat_release(c, 4);
    }
    char hist[1024] = "";
    if (o->history_path) snprintf(hist, sizeof hist, "%s", o->history_path);
    else chat_history_path(hist, sizeof hist);
    {
        int nm = models_names(model_names, N_MODEL_NAMES);
        model_names[nm] = NULL;
        int np = 0;
        for (int i = 0; o->config && i < o->config->n_personas; i++) persona_names[np++] = o->config->persona[i].name;
        persona_names[np] = NULL;
    }
    /* completion, help and sliders from the command and settings tables */
    ui_command ucmds[N_COMMANDS];
    for (size_t i = 0; i < N_COMMANDS; i++)
        ucmds[i] = (ui_command){commands[i].name, commands[i].args, commands[i].args_themes};
    for (size_t i = 0; i < N_SET_PARAMS; i++) set_args[i] = set_params[i].name;
    static const struct { int key; const char *label; } slider_keys[UI_SL_COUNT] = {
        [UI_SL_TEMP] = {CFG_TEMP, "temperature"}, [UI_SL_TOP_P] = {CFG_TOP_P, "top-p"},
        [UI_SL_TOP_K] = {CFG_TOP_K, "top-k"},     [UI_SL_MIN_P] = {CFG_MIN_P, "min-p"},
        [UI_SL_REPEAT] = {CFG_REPEAT_PENALTY, "repeat penalty"}, [UI_SL_MAX_TOKENS] = {CFG_N_PREDICT, "max tokens"},
    };
    ui_slider_spec sliders[UI_SL_COUNT];
    for (int i = 0; i < UI_SL_COUNT; i++) {
        cfg_range r;
        config_key_range(slider_keys[i].key, &r);
        sliders[i] = (ui_slider_spec){slider_keys[i].label, r.ui_lo, r.ui_hi, r.step, r.decimals, r.off_value,
                                      r.off_label, r.log};
    }
    char *help = help_build();
    ui_config cfg = {
        .history_path = hist,
        .mouse = o->mouse,
        .commands = ucmds,
        .n_commands = N_COMMANDS,
        .sliders = sliders,
        .n_ctx = e ? engine_n_ctx(e) : 8192, /* the max-tokens slider's span */
        .help_text = help,
    };
    ui_callbacks cb = {.submit = cb_submit, .quit = cb_quit, .stop = cb_stop, .slider = cb_slider, .ud = c,
                       .sessions = cb_sessions, .edit_step = cb_edit_step, .edit_cancel = cb_edit_cancel};
    struct sigaction old[9];
    if (pipe2(g_sigpipe, O_NONBLOCK | O_CLOEXEC)) g_sigpipe[0] = g_sigpipe[1] = -1;
    g_signal = 0;
    install_signals(old);
    c->u = ui_open(&cfg, &cb, &theme, why, sizeof why);
    free(help);
    if (!c->u) {
        restore_signals(old);
        backend_free(c->b);
        chatstore_close(c->cs);
        fprintf(stderr, "kvchat: %s\n", why);
        return chat_release(c, 1);
    }
    if (c->remote) {
        ui_info info = {
            .model_name = c->model_label,
            .arch = "remote",
            .weight_type = "?",
            .mode = "server's template",
            .remote = remote_url(backend_remote_client(c->b)),
        };
        ui_set_info(c->u, &info);
    } else {
        show_info(c);
    }
    c->markdown = o->markdown;
    ui_set_markdown(c->u, c->markdown);
    push_params(c);
    const char *bench = getenv("KVCHAT_BENCH_HISTORY");
    if (bench && atol(bench) > 0) bench_fill(c, atol(bench));
    if (tmpl_unknown)
        ui_notice(c->u, UI_ROLE_ERROR,
                  "warning: %s has a chat template kvchat does not recognise; using chatml "
                  "(choose another with --chat-template NAME, or 'none' for completion mode)",
                  c->model_label);
    if (c->remote)
        ui_notice(c->u, UI_ROLE_NOTICE, "kvchat %s · %s on %s (remote: the server renders the chat with its own "
                  "template; KV prefixes in SQLite and /show cache are local-only). F1 help · F2 sliders · Ctrl-D quits.",
                  KVCHAT_VERSION, c->model_label, remote_url(backend_remote_client(c->b)));
    else if (c->tmpl == CHAT_TMPL_NONE)
        ui_notice(c->u, UI_ROLE_NOTICE,
                  "kvchat %s · %s has no chat template, so this is completion mode: the model continues the "
                  "conversation text (Enter on an empty line lets it go on). F1 help · F2 sliders · Ctrl-D quits.",
                  KVCHAT_VERSION, c->model_label);
    else
        ui_notice(c->u, UI_ROLE_NOTICE, "kvchat %s · %s · chat template %s. F1 help · F2 sliders · Ctrl-D quits.",
                  KVCHAT_VERSION, c->model_label, chat_template_name(c->tmpl));
    show_warnings(c, &tw);
    if (tmpl_notice[0]) ui_notice(c->u, UI_ROLE_NOTICE, "%s", tmpl_notice);
    for (int i = 0; i < o->n_warnings; i++) ui_notice(c->u, UI_ROLE_ERROR, "config warning: %s", o->warnings[i]);
    if (remote_note[0]) ui_notice(c->u, UI_ROLE_ERROR, "%s", remote_note);
    if (e) {
        gen_opts go;
        engine_default_opts(e, &go);
        int n_ctx = engine_n_ctx(e), max_keep = n_ctx * 3 / 4;
        if (go.n_keep > max_keep)
            ui_notice(c->u, UI_ROLE_ERROR, "--keep %d is more than a context shift can keep in a %d-token context: it "
                      "keeps the first %d (3/4 of the context)", go.n_keep, n_ctx, max_keep);
    }
    if (c->system && !resume_id) ui_notice(c->u, UI_ROLE_NOTICE, "system prompt: %s", c->system);
    if (o->db_path && !c->cs) ui_notice(c->u, UI_ROLE_ERROR, "conversations are not saved: %s", store_why);
    /* the gauge starts from the engine's real figures (a resumed chat: with its restored KV) */
    if (!(resume_id && open_conversation(c, resume_id) == 0)) request_reset(c);

    int status = 0;
    while (!c->quit) {
        struct pollfd p[5] = {
            {.fd = ui_input_fd(c->u), .events = POLLIN},
            {.fd = backend_fd(c->b), .events = POLLIN},
            {.fd = c->rj.done_pipe[0], .events = POLLIN},
            {.fd = c->mj.done_pipe[0], .events = POLLIN},
            {.fd = g_sigpipe[0], .events = POLLIN},
        };
        int t = ui_timeout_ms(c->u);
        if (t < 0 || t > 500) t = 500;
        poll(p, g_sigpipe[0] >= 0 ? 5 : 4, t);
        if (p[2].revents & POLLIN) read_finish(c);
        if (p[3].revents & POLLIN) model_loaded(c);
        if (g_signal) {
            status = 128 + g_signal;
            break;
        }
        ui_handle_input(c->u);
        drain_events(c);
        ui_render(c->u);
        flush_save(c);
    }
    if (c->busy) { /* stop a streaming reply and save it (partial) before leaving */
        backend_cancel(c->b);
        for (int i = 0; i < 100 && c->busy; i++) {
            struct pollfd p = {.fd = backend_fd(c->b), .events = POLLIN};
            poll(&p, 1, 50);
            drain_events(c);
        }
    }
    flush_save(c);
    if (c->rj.running) pthread_join(c->rj.th, NULL);
    if (c->mj.running) { /* a model still loading: wait for it, then let it go */
        pthread_join(c->mj.th, NULL);
        worker_destroy(c->mj.w);
        sampler_free(c->mj.s);
        engine_close(c->mj.e);
    }
    backend_free(c->b); /* cancels a running reply and joins the thread (after a KV save) */
    chatstore_close(c->cs);
    ui_close(c->u);
    restore_signals(old);
    if (g_sigpipe[0] >= 0) close(g_sigpipe[0]), close(g_sigpipe[1]);
    g_sigpipe[0] = g_sigpipe[1] = -1;
    if (pe) *pe = c->e; /* /model may have replaced them */
    if (ps) *ps = c->s;
    return chat_release(c, status);
}
