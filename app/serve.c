/* serve: `kvchat serve` — OpenAI-compatible HTTP endpoints (libmicrohttpd + cJSON), a bounded request queue and the generator thread that runs each request on its own engine sequence. */
#include "app/serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <math.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "app/models.h"
#include "app/prompt.h"
#include "app/chatstore.h"
#include "app/serve_store.h"
#include "engine/chat_template.h"
#include "engine/gen_batch.h"
#include "engine/generate.h"
#include "engine/gguf.h"
#include "engine/kv_cache.h"
#include "engine/logprob.h"
#include "engine/stop.h"

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_MODEL = 3 };

#define SERVE_MAX_CONNECTIONS 1024      /* open connections at once (idle ones included) */
#define SERVE_DEFAULT_MAX_BODY (1 << 20) /* bytes of a request body (--max-body) */
#define SERVE_CONN_TIMEOUT_S 300        /* an idle connection is closed after this */
#define SERVE_POLL_MS 100               /* how often a waiting connection checks its client */
#define SERVE_MAX_N 16                  /* choices per request ("n") */
#define SERVE_MAX_TOP_LOGPROBS LOGPROB_MAX_TOP      /* "top_logprobs" (chat) / "logprobs" (completions) at most */

/* The log-probability of one generated token under the model and its most likely alternatives
 * (engine/logprob.h: log-softmax of the logits it was sampled from, before penalties and temperature). */
typedef token_logprob lp_entry;

/* ---- one request's generation (shared by its connection and the generator thread) -------- */
/* One choice's output, under g.mu. */
typedef struct choice {
    char *text;
    size_t len, cap;
    int n_completion;         /* tokens sampled, end-of-generation tokens not counted */
    int finish;               /* enum gen_finish, once done */
    int done;
    lp_entry *lp;             /* with logprobs: one per generated token */
    size_t n_lp, cap_lp;
} choice;

typedef struct job {
    int refs;                 /* g.mu: the connection's and the generator's */
    struct job *next;         /* g.mu: the queue */
    int32_t *toks;
    size_t n_toks;
    gen_opts go;
    sampler_params sp;
    stop_matcher sm0;         /* the request's stop strings, fresh */
    int n_choices;            /* "n": choices decoded together on forks of one prefill */
    int n_slots;              /* g.mu: scheduler slots still running for it */
    int logprobs, top_n;      /* record lp_entry per token; alternatives per token */
    /* output, under g.mu */
    choice ch[SERVE_MAX_N];
    int done, rc;
    kv_error err;
    gen_stats st;
    atomic_int cancel;        /* the client went away (or the server stops) */
    pthread_cond_t cv;        /* signalled on new text and when done */
    char *store_req;          /* --store: the request's messages / prompt (serve_store_capture) */
} job;

static struct {
    const char *api_key;
    char model_id[256];
    int tmpl;                 /* chat template family (CHAT_TMPL_NONE: completion-mode prompts) */
    size_t max_body;
    int parallel;             /* requests admitted at once (decoding together) */
    int prefill_budget;       /* prefill tokens per step while others decode (--prefill-chunk) */
    int no_context_shift;     /* --no-context-shift: a full sequence ends its request ("length") */
    engine *e;
    serve_store *store;       /* --store: finished requests saved as conversations (NULL: off) */
    atomic_int ready;         /* the model is loaded */
    atomic_int shutdown;
    pthread_mutex_t mu;
    pthread_cond_t cv_queue;
    job *head, *tail;
    int n_inflight;           /* admitted, not finished */
    unsigned long long next_id;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv_queue = PTHREAD_COND_INITIALIZER};

static void job_unref_locked(job *j)
{
    if (--j->refs > 0) return;
    pthread_cond_destroy(&j->cv);
    free(j->toks);
    for (int i = 0; i < SERVE_MAX_N; i++) free(j->ch[i].text), free(j->ch[i].lp);
    free(j->store_req);
    free(j);
}

static void job_unref(job *j)
{
    pthread_mutex_lock(&g.mu);
    job_unref_locked(j);
    pthread_mutex_unlock(&g.mu);
}

/* g.mu held: append text to the output of choice c. */
static int job_append_locked(job *j, int ci, const char *t, size_t n)
{
    choice *c = &j->ch[ci];
    if (c->len + n + 1 > c->cap) {
        size_t nc = c->cap ? c->cap : 1024;
        while (nc < c->len + n + 1) nc *= 2;
        char *nt = realloc(c->text, nc);
        if (!nt) return -1;
        c->text = nt;
        c->cap = nc;
    }
    memcpy(c->text + c->len, t, n);
    c->len += n;
    c->text[c->len] = 0;
    return 0;
}

static int job_completion_tokens(const job *j)
{
    int n = 0;
    for (int i = 0; i < j->n_choices; i++) n += j->ch[i].n_completion;
    return n;
}

/* ---- the scheduler: continuous batching (engine/gen_batch.h) ------------------------------
 * One thread owns the engine. Each admitted request gets a slot per choice — its own KV
 * sequence, sampler (the request's parameters, choice i seeded S + i), stop matcher and
 * gen_stream — and, with n > 1, a base slot that prefills the prompt but its last token once;
 * the choices then fork it (sharing its blocks) and decode together. Every step is one
 * gen_batch_step over all slots: one token of each decoding sequence plus prefill chunks of new
 * ones; requests join and leave between steps. Output goes to the job's per-choice buffers,
 * which the connections read at their own pace (a slow reader never blocks this thread). */
typedef struct slot {
    job *j;
    int c;                    /* choice index; -1: the base prefill of n > 1 */
    int seq;
    sampler *s;
    stop_matcher sm;
    gen_stream *gs;
} slot;

static int gen_on_text(void *ud, const char *text, size_t len, int32_t token)
{
    (void)token;
    slot *sl = ud;
    job *j = sl->j;
    char out[4096 + STOP_MAX_LEN];
    int hit = 0;
    while (len > 0 && !hit) {
        size_t chunk = len < 4096 ? len : 4096, n = 0;
        hit = stop_push(&sl->sm, text, chunk, out, &n);
        pthread_mutex_lock(&g.mu);
        int bad = n && job_append_locked(j, sl->c, out, n);
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&g.mu);
        if (bad) return 1;
        text += chunk;
        len -= chunk;
    }
    return hit ? 2 : 0;
}

/* Log-softmax of the logits at tok and the top_n most likely tokens (ties: lower id first). */
static void gen_on_token(void *ud, int32_t token, int is_eog)
{
    slot *sl = ud;
    job *j = sl->j;
    if (is_eog) return;
    lp_entry le;
    int have = 0;
    if (j->logprobs) {
        const float *logits = gen_stream_logits(sl->gs); /* those token was sampled from */
        int n_vocab = engine_model(g.e)->hp.n_vocab;
        if (logits && token >= 0 && token < n_vocab) {
            logprob_token(logits, n_vocab, token, j->top_n, &le);
            have = 1;
        }
    }
    pthread_mutex_lock(&g.mu);
    choice *c = &j->ch[sl->c];
    c->n_completion++;
    if (have && c->n_lp == c->cap_lp) {
        size_t nc = c->cap_lp ? c->cap_lp * 2 : 64;
        lp_entry *nl = realloc(c->lp, nc * sizeof *nl);
        if (nl) c->lp = nl, c->cap_lp = nc;
    }
    if (have && c->n_lp < c->cap_lp) c->lp[c->n_lp++] = le;
    pthread_mutex_unlock(&g.mu);
}

static int gen_should_stop(void *ud)
{
    slot *sl = ud;
    return atomic_load(&sl->j->cancel) || atomic_load(&g.shutdown);
}

static struct {
    slot **slots;             /* [cap]: active, in admission order */
    gen_stream **gs;          /* [cap]: their streams, same order */
    int n, cap;
    gen_batch *b;
} sch;

/* ---- kept sequences: finished requests' KV as the next requests' prefixes -----------------
 * The paged cache's prefix table (kv_cache.h) reuses whole KV_BLOCK_SIZE blocks only, so a short
 * prompt sent again, or the tail of a longer one, would be prefilled again. So a finished
 * request's sequence (choice 0's) is kept whole, up to --parallel of them, as llama-server's
 * slots keep theirs: a new request forks the kept one with the longest common token prefix at
 * that length (at most n_prompt - 1: one prompt token is always fed for its logits), and
 * gen_stream_begin then adopts any further cached full blocks. Reusing it never gives less than
 * the block table alone: the kept sequence is clean (its K/V what a fresh prefill computes), so
 * its leading blocks are the hashed ones a lookup would find, and the lookup continues after
 * them. Kept sequences are released least recently used first — when a new one is kept beyond
 * the bound, when the cache needs their blocks for active work (engine_set_reclaim: a step never
 * fails or waits for them), and at shutdown. The generator thread alone touches them. */
static struct {
    int seq[256];             /* [n], oldest use first */
    int n;
} kept;

/* Release the least recently used kept sequence (its full blocks stay cached by hash); 0 when
 * none is kept. Also the engine's reclaim callback. */
static int kept_release_oldest(void *ud)
{
    (void)ud;
    if (!kept.n) return 0;
    engine_seq_free(g.e, kept.seq[0]);
    memmove(kept.seq, kept.seq + 1, sizeof kept.seq[0] * (size_t)--kept.n);
    return 1;
}

/* Keep a finished request's sequence (taking it over), as the most recently used. Only its
 * clean part is kept: after a context shift the K/V past n_keep is not what a fresh prefill of
 * those tokens computes. */
static void kept_add(int seq)
{
    int n_clean = kv_seq_n_clean(engine_kv(g.e), seq);
    engine_seq_truncate(g.e, seq, n_clean);
    int n;
    engine_seq_tokens(g.e, seq, &n);
    if (n == 0) {
        engine_seq_free(g.e, seq);
        return;
    }
    while (kept.n >= g.parallel) kept_release_oldest(NULL);
    kept.seq[kept.n++] = seq;
}

/* A sequence for prompt toks[0..n_toks): a fork of the kept sequence sharing the longest common
 * prefix with it (cut at n_toks - 1; that one becomes the most recently used), else a new one. */
static int seq_for_prompt(const int32_t *toks, size_t n_toks, int *seq, kv_error *err)
{
    int best = -1, best_n = 0, cap = n_toks > 1 ? (int)n_toks - 1 : 0;
    for (int i = 0; i < kept.n; i++) {
        int n, l = 0;
        const int32_t *t = engine_seq_tokens(g.e, kept.seq[i], &n);
        while (l < n && l < cap && t[l] == toks[l]) l++;
        if (l > best_n || (l == best_n && l > 0)) best = i, best_n = l; /* ties: the more recent */
    }
    if (best < 0) return engine_seq_new(g.e, seq, err);
    int src = kept.seq[best];
    memmove(kept.seq + best, kept.seq + best + 1, sizeof kept.seq[0] * (size_t)(kept.n - best - 1));
    kept.seq[kept.n - 1] = src;
    return engine_seq_fork(g.e, src, best_n, seq, err);
}

/* g.mu held or the job not yet visible: the request failed before or during generation. */
static void job_fail(job *j, int rc, const kv_error *err)
{
    if (j->rc == KV_OK) {
        j->rc = rc;
        j->err = *err;
    }
}

/* g.mu held: the job's last slot ended (the caller drops its own reference after). */
static void job_finish_locked(job *j)
{
    j->done = 1;
    g.n_inflight--;
    pthread_cond_broadcast(&j->cv);
}

/* A slot on sequence seq for choice c (or the base, c = -1) of j; KV_OK or an error (the
 * sequence is then freed). */
static int slot_start(job *j, int c, int seq, kv_error *err)
{
    slot *sl = calloc(1, sizeof *sl);
    if (!sl) {
        engine_seq_free(g.e, seq);
        return kv_error_set(err, KV_ERR_NOMEM, "out of memory for a request");
    }
    sl->j = j;
    sl->c = c;
    sl->seq = seq;
    int rc = KV_OK;
    gen_callbacks cb = {.should_stop = gen_should_stop, .ud = sl};
    if (c >= 0) {
        sampler_params sp = j->sp;
        uint64_t seed = j->sp.seed;
        if (j->n_choices > 1 && seed != SAMPLER_SEED_RANDOM) seed += (uint64_t)c;
        sp.seed = seed;
        sl->sm = j->sm0;
        if (!(sl->s = sampler_create(engine_model(g.e)->hp.n_vocab, &sp, err))) rc = err->code ? err->code : KV_ERR_NOMEM;
        cb.on_text = gen_on_text;
        cb.on_token = gen_on_token;
    }
    if (!rc)
        rc = gen_stream_begin(g.e, seq, j->toks, c >= 0 ? j->n_toks : j->n_toks - 1, &j->go, sl->s, &cb, c < 0, &sl->gs,
                              err);
    if (rc) {
        sampler_free(sl->s);
        engine_seq_free(g.e, seq);
        free(sl);
        return rc;
    }
    pthread_mutex_lock(&g.mu);
    j->refs++;
    j->n_slots++;
    pthread_mutex_unlock(&g.mu);
    sch.slots[sch.n] = sl;
    sch.gs[sch.n++] = sl->gs;
    return KV_OK;
}

/* Start j: its base prefill (n > 1 with a prompt longer than one token) or its choices. */
static void job_start(job *j)
{
    kv_error err = {0};
    int rc = KV_OK, seq;
    if (j->n_choices > 1 && j->n_toks > 1) {
        if (!(rc = seq_for_prompt(j->toks, j->n_toks, &seq, &err))) rc = slot_start(j, -1, seq, &err);
    } else {
        for (int i = 0; i < j->n_choices && !rc; i++)
            if (!(rc = seq_for_prompt(j->toks, j->n_toks, &seq, &err))) rc = slot_start(j, i, seq, &err);
    }
    pthread_mutex_lock(&g.mu);
    if (rc) {
        job_fail(j, rc, &err);
        for (int i = 0; i < j->n_choices; i++)
            if (!j->ch[i].done) j->ch[i].finish = GEN_FINISH_ERROR, j->ch[i].done = 1;
    }
    if (j->n_slots == 0) job_finish_locked(j);
    job_unref_locked(j); /* the queue's reference: the slots hold theirs */
    pthread_mutex_unlock(&g.mu);
}

/* A slot's stream finished: record the choice (or fork the choices from the base), free it. */
static void slot_end(slot *sl, const kv_error *step_err)
{
    job *j = sl->j;
    int fin = GEN_FINISH_NONE;
    gen_stream_done(sl->gs, &fin);
    kv_error err = {0};
    if (sl->c < 0) { /* the base: every choice forks it (its blocks shared, nothing recomputed) */
        j->st = *gen_stream_stats(sl->gs);
        int rc = fin == GEN_FINISH_ERROR ? (err = *step_err, err.code ? err.code : KV_ERR_INVALID) : KV_OK;
        for (int i = 0; i < j->n_choices && !rc && fin != GEN_FINISH_CANCELLED && fin != GEN_FINISH_CONTEXT; i++) {
            int seq;
            if (!(rc = engine_seq_fork(g.e, sl->seq, -1, &seq, &err))) rc = slot_start(j, i, seq, &err);
        }
        pthread_mutex_lock(&g.mu);
        if (rc) job_fail(j, rc, &err);
        for (int i = 0; i < j->n_choices; i++)
            if (rc || fin == GEN_FINISH_CANCELLED || fin == GEN_FINISH_CONTEXT)
                if (!j->ch[i].done) j->ch[i].finish = rc ? GEN_FINISH_ERROR : fin, j->ch[i].done = 1;
        pthread_mutex_unlock(&g.mu);
    } else {
        char tail[STOP_MAX_LEN];
        size_t n_tail = fin != GEN_FINISH_ERROR ? stop_flush(&sl->sm, tail) : 0;
        pthread_mutex_lock(&g.mu);
        if (sl->c == 0 && (j->n_choices == 1 || j->n_toks == 1)) j->st = *gen_stream_stats(sl->gs); /* its reuse */
        if (n_tail) job_append_locked(j, sl->c, tail, n_tail);
        j->ch[sl->c].finish = fin;
        j->ch[sl->c].done = 1;
        if (fin == GEN_FINISH_ERROR) job_fail(j, step_err->code ? step_err->code : KV_ERR_INVALID, step_err);
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&g.mu);
    }
    gen_stream_free(sl->gs);
    sampler_free(sl->s);
    if (sl->c == 0 && fin != GEN_FINISH_ERROR) kept_add(sl->seq); /* the next requests' prefix */
    else engine_seq_free(g.e, sl->seq); /* its full blocks stay cached by hash */
    pthread_mutex_lock(&g.mu);
    if (--j->n_slots == 0) job_finish_locked(j);
    job_unref_locked(j);
    pthread_mutex_unlock(&g.mu);
    free(sl);
}

static void *generator_main(void *arg)
{
    (void)arg;
    kv_error err = {0};
    for (;;) {
        pthread_mutex_lock(&g.mu);
        while (!g.head && !sch.n && !atomic_load(&g.shutdown)) pthread_cond_wait(&g.cv_queue, &g.mu);
        if (atomic_load(&g.shutdown) && !sch.n) { /* queued jobs are freed by serve_main */
            pthread_mutex_unlock(&g.mu);
            while (kept_release_oldest(NULL)) {}
            return NULL;
        }
        /* admit waiting requests while slots are free (requests join between steps) */
        job *admit[64];
        int n_admit = 0, room = sch.cap - sch.n;
        while (g.head && n_admit < 64) {
            job *j = g.head;
            int need = j->n_choices + (j->n_choices > 1);
            if (need > sch.cap) { /* never fits: -b too small for this many choices */
                g.head = j->next;
                if (!g.head) g.tail = NULL;
                kv_error e2;
                kv_error_set(&e2, KV_ERR_INVALID, "n = %d choices need %d sequences; this server steps at most %d (raise -b)",
                             j->n_choices, need, sch.cap);
                job_fail(j, e2.code, &e2);
                for (int c = 0; c < j->n_choices; c++) j->ch[c].finish = GEN_FINISH_ERROR, j->ch[c].done = 1;
                job_finish_locked(j);
                job_unref_locked(j);
                continue;
            }
            if (need > room) break;
            room -= need;
            g.head = j->next;
            if (!g.head) g.tail = NULL;
            admit[n_admit++] = j;
        }
        pthread_mutex_unlock(&g.mu);
        for (int i = 0; i < n_admit; i++) {
            job *j = admit[i];
            if (atomic_load(&j->cancel) || atomic_load(&g.shutdown)) {
                pthread_mutex_lock(&g.mu);
                for (int c = 0; c < j->n_choices; c++) j->ch[c].finish = GEN_FINISH_CANCELLED, j->ch[c].done = 1;
                job_finish_locked(j);
                job_unref_locked(j);
                pthread_mutex_unlock(&g.mu);
                continue;
            }
            job_start(j);
        }
        if (!sch.n) continue;
        err = (kv_error){0};
        gen_batch_step(sch.b, sch.gs, sch.n, g.prefill_budget, &err);
        /* slots that finished leave (in order; a base adds its choices at the end) */
        for (int i = 0; i < sch.n;) {
            if (!gen_stream_done(sch.gs[i], NULL)) {
                i++;
                continue;
            }
            slot *sl = sch.slots[i];
            memmove(sch.slots + i, sch.slots + i + 1, sizeof *sch.slots * (size_t)(sch.n - i - 1));
            memmove(sch.gs + i, sch.gs + i + 1, sizeof *sch.gs * (size_t)(sch.n - i - 1));
            sch.n--;
            slot_end(sl, &err);
        }
    }
}

/* ---- HTTP helpers ------------------------------------------------------------------------ */
typedef struct req_ctx {
    char *body;
    size_t len, cap;
    int too_large;
} req_ctx;

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *obj)
{
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!s) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* OpenAI's error object: {"error": {"message", "type", "param", "code"}}. */
static cJSON *error_obj(const char *message, const char *type, const char *param, const char *code)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return o;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *message, const char *type,
                                  const char *param, const char *code)
{
    return send_json(c, status, error_obj(message, type, param, code));
}

/* g.mu held: wait up to SERVE_POLL_MS for j's condition. */
static void job_wait_locked(job *j)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += SERVE_POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&j->cv, &g.mu, &ts);
}

/* 1 when the client has closed its end (or the socket failed). */
static int client_gone(int fd)
{
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int connection_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* ---- request parsing --------------------------------------------------------------------- */
typedef struct api_req {
    int chat;                 /* /v1/chat/completions (else /v1/completions) */
    int stream, include_usage;
    int n_predict, n;
    int logprobs, top_n;
    sampler_params sp;
    const char *stops[STOP_MAX_STRINGS];
    int n_stops;
    int32_t *toks;
    size_t n_toks;
} api_req;

/* A 400 being built: message and the field it is about. */
typedef struct bad_field {
    char msg[512];
    char param[64];
    const char *code;
} bad_field;

static int bad(bad_field *b, const char *param, const char *code, const char *fmt, const char *arg)
{
    snprintf(b->param, sizeof b->param, "%s", param ? param : "");
    snprintf(b->msg, sizeof b->msg, fmt, arg);
    b->code = code;
    return -1;
}

/* Optional number field name in [lo, hi]: 0 (absent or null: *out untouched, or set), -1 wrong. */
static int get_number(const cJSON *o, const char *name, double lo, double hi, int integer, double *out, bad_field *b)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    char m[160];
    if (!cJSON_IsNumber(v)) return bad(b, name, "invalid_type", "'%s' must be a number", name);
    double d = v->valuedouble;
    if (integer && !(isfinite(d) && floor(d) == d)) return bad(b, name, "invalid_type", "'%s' must be an integer", name);
    if (!(d >= lo && d <= hi)) {
        snprintf(m, sizeof m, "'%s' is %g, must be in [%g, %g]", name, d, lo, hi);
        return bad(b, name, "invalid_value", "%s", m);
    }
    *out = d;
    return 0;
}

static int get_bool(const cJSON *o, const char *name, int *out, bad_field *b)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return bad(b, name, "invalid_type", "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Tokenize the prompt segments as the chat's worker does: BOS (per the model) before the first
 * only; template scaffolding with control tokens, message contents without. */
static int tokenize_segments(const worker_segment *seg, size_t n_seg, api_req *r, kv_error *err)
{
    for (size_t i = 0; i < n_seg; i++) {
        int no_bos = i > 0;
        if (seg[i].len == 0 && no_bos) continue;
        int32_t *t = NULL;
        size_t k = 0;
        if (engine_tokenize(g.e, seg[i].text, seg[i].len, no_bos, seg[i].parse_special, &t, &k, err)) return -1;
        int32_t *na = realloc(r->toks, (r->n_toks + k + 1) * sizeof *na);
        if (!na) {
            free(t);
            return kv_error_set(err, KV_ERR_NOMEM, "out of memory tokenizing the prompt");
        }
        r->toks = na;
        memcpy(r->toks + r->n_toks, t, k * sizeof *t);
        r->n_toks += k;
        free(t);
    }
    return 0;
}

/* The text of a message's content: a string, or an array of {"type": "text", "text": ...} parts
 * (joined); null for an assistant message. *out malloc'd. */
static int message_text(const cJSON *content, int idx, char **out, bad_field *b)
{
    char p[64];
    snprintf(p, sizeof p, "messages[%d].content", idx);
    if (!content || cJSON_IsNull(content)) {
        *out = strdup("");
        return *out ? 0 : bad(b, p, NULL, "%s", "out of memory");
    }
    if (cJSON_IsString(content)) {
        *out = strdup(content->valuestring);
        return *out ? 0 : bad(b, p, NULL, "%s", "out of memory");
    }
    if (!cJSON_IsArray(content)) return bad(b, p, "invalid_type", "'%s' must be a string or an array of text parts", p);
    size_t len = 0;
    char *s = calloc(1, 1);
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            free(s);
            return bad(b, p, "invalid_value", "'%s': only parts {\"type\": \"text\", \"text\": STRING} are supported", p);
        }
        size_t l = strlen(text->valuestring);
        char *ns = realloc(s, len + l + 1);
        if (!ns) {
            free(s);
            return bad(b, p, NULL, "%s", "out of memory");
        }
        s = ns;
        memcpy(s + len, text->valuestring, l + 1);
        len += l;
    }
    *out = s;
    return 0;
}

static int build_chat_prompt(const cJSON *root, api_req *r, bad_field *b)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) return bad(b, "messages", "missing_required_parameter", "'%s' is required", "messages");
    if (!cJSON_IsArray(msgs)) return bad(b, "messages", "invalid_type", "'%s' must be an array", "messages");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return bad(b, "messages", "invalid_value", "'%s' must not be empty", "messages");
    prompt_msg *pm = calloc((size_t)n, sizeof *pm);
    char **texts = calloc((size_t)n, sizeof *texts);
    int rc = -1, k = 0;
    if (!pm || !texts) {
        bad(b, "messages", NULL, "%s", "out of memory");
        goto out;
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char p[64];
        snprintf(p, sizeof p, "messages[%d]", k);
        if (!cJSON_IsObject(m)) {
            bad(b, p, "invalid_type", "'%s' must be an object", p);
            goto out;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(p, sizeof p, "messages[%d].role", k);
        if (!cJSON_IsString(role)) {
            bad(b, p, "invalid_type", "'%s' must be a string", p);
            goto out;
        }
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
            bad(b, p, "invalid_value", "'%s' must be system, developer, user or assistant", p);
            goto out;
        }
        if (message_text(cJSON_GetObjectItemCaseSensitive(m, "content"), k, &texts[k], b)) goto out;
        pm[k] = (prompt_msg){rs, texts[k], strlen(texts[k])};
        k++;
    }
    prompt_buf pb = {0};
    char why[512];
    if (prompt_build(g.tmpl, pm, (size_t)k, &pb, why, sizeof why)) {
        bad(b, "messages", "invalid_value", "%s", why);
        prompt_buf_free(&pb);
        goto out;
    }
    kv_error err = {0};
    if (tokenize_segments(pb.seg, pb.n_seg, r, &err)) bad(b, "messages", NULL, "%s", err.msg);
    else rc = 0;
    prompt_buf_free(&pb);
out:
    for (int i = 0; i < k; i++) free(texts[i]);
    free(texts);
    free(pm);
    return rc;
}

static int build_completion_prompt(const cJSON *root, api_req *r, bad_field *b)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) return bad(b, "prompt", "missing_required_parameter", "'%s' is required", "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (!cJSON_IsString(p))
        return bad(b, "prompt", "invalid_type", "'%s' must be a string (or an array of one string)", "prompt");
    /* as `kvchat -p TEXT` tokenizes it: BOS per the model, no control tokens */
    worker_segment seg = {p->valuestring, strlen(p->valuestring), 0};
    kv_error err = {0};
    if (tokenize_segments(&seg, 1, r, &err)) return bad(b, "prompt", NULL, "%s", err.msg);
    return 0;
}

/* Every field of a (chat) completion request; 0, or -1 with b filled (a 400). */
static int parse_request(const cJSON *root, api_req *r, bad_field *b)
{
    sampler_params_default(&r->sp);
    r->n_predict = r->chat ? -1 : 16; /* OpenAI's default max_tokens for /v1/completions is 16 */
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (v && !cJSON_IsNull(v) && !cJSON_IsString(v)) return bad(b, "model", "invalid_type", "'%s' must be a string", "model");
    if (get_bool(root, "stream", &r->stream, b)) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return bad(b, "stream_options", "invalid_type", "'%s' must be an object", "stream_options");
        if (get_bool(so, "include_usage", &r->include_usage, b)) {
            snprintf(b->param, sizeof b->param, "stream_options.include_usage");
            return -1;
        }
    }
    double d;
    int n_ctx = engine_n_ctx(g.e);
    static const char *const max_names[] = {"max_tokens", "max_completion_tokens"};
    for (int i = 0; i < 2; i++) {
        d = -2;
        if (get_number(root, max_names[i], 1, INT_MAX, 1, &d, b)) return -1;
        if (d > 0) r->n_predict = d > n_ctx ? n_ctx : (int)d;
    }
    d = r->sp.temperature;
    if (get_number(root, "temperature", 0, 100, 0, &d, b)) return -1;
    r->sp.temperature = (float)d;
    d = r->sp.top_p;
    if (get_number(root, "top_p", 0, 1, 0, &d, b)) return -1;
    r->sp.top_p = (float)d;
    d = r->sp.top_k;
    if (get_number(root, "top_k", 0, INT_MAX, 1, &d, b)) return -1;
    r->sp.top_k = (int32_t)d;
    d = r->sp.min_p;
    if (get_number(root, "min_p", 0, 1, 0, &d, b)) return -1;
    r->sp.min_p = (float)d;
    d = r->sp.presence_penalty;
    if (get_number(root, "presence_penalty", -2, 2, 0, &d, b)) return -1;
    r->sp.presence_penalty = (float)d;
    d = r->sp.frequency_penalty;
    if (get_number(root, "frequency_penalty", -2, 2, 0, &d, b)) return -1;
    r->sp.frequency_penalty = (float)d;
    d = r->sp.repeat_penalty;
    if (get_number(root, "repeat_penalty", 1e-6, 100, 0, &d, b)) return -1;
    r->sp.repeat_penalty = (float)d;
    d = -1;
    if (get_number(root, "seed", -1, 18446744073709551615.0, 1, &d, b)) return -1;
    r->sp.seed = d < 0 ? SAMPLER_SEED_RANDOM : (uint64_t)d;
    d = 1;
    if (get_number(root, "n", 1, SERVE_MAX_N, 1, &d, b)) return -1;
    r->n = (int)d;
    if (!r->chat) { /* /v1/completions: "logprobs" is the number of alternatives (0: the token's own only) */
        const cJSON *lpv = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
        d = -1;
        if (get_number(root, "logprobs", 0, SERVE_MAX_TOP_LOGPROBS, 1, &d, b)) return -1;
        r->logprobs = lpv && !cJSON_IsNull(lpv);
        r->top_n = d > 0 ? (int)d : 0;
    } else {
        if (get_bool(root, "logprobs", &r->logprobs, b)) return -1;
        d = 0;
        if (get_number(root, "top_logprobs", 0, SERVE_MAX_TOP_LOGPROBS, 1, &d, b)) return -1;
        r->top_n = (int)d;
        if (r->top_n > 0 && !r->logprobs)
            return bad(b, "top_logprobs", "invalid_value", "%s", "'top_logprobs' needs 'logprobs': true");
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (cJSON_IsString(st)) {
        if (*st->valuestring) r->stops[r->n_stops++] = st->valuestring;
    } else if (cJSON_IsArray(st)) {
        const cJSON *s1;
        cJSON_ArrayForEach(s1, st) {
            if (!cJSON_IsString(s1)) return bad(b, "stop", "invalid_type", "'%s' must be a string or an array of strings", "stop");
            if (r->n_stops == STOP_MAX_STRINGS) return bad(b, "stop", "invalid_value", "%s", "at most 16 stop strings");
            if (*s1->valuestring) r->stops[r->n_stops++] = s1->valuestring;
        }
    } else if (st && !cJSON_IsNull(st)) {
        return bad(b, "stop", "invalid_type", "'%s' must be a string or an array of strings", "stop");
    }
    for (int i = 0; i < r->n_stops; i++)
        if (strlen(r->stops[i]) >= STOP_MAX_LEN) return bad(b, "stop", "invalid_value", "%s", "a stop string is longer than 255 bytes");
    kv_error err = {0};
    if (sampler_params_validate(&r->sp, &err)) return bad(b, NULL, "invalid_value", "%s", err.msg);
    if (r->chat ? build_chat_prompt(root, r, b) : build_completion_prompt(root, r, b)) return -1;
    if (r->n_toks == 0) return bad(b, r->chat ? "messages" : "prompt", "invalid_value", "%s", "the prompt is empty");
    if (r->n_toks >= (size_t)n_ctx) {
        char m[200];
        snprintf(m, sizeof m, "the prompt is %zu tokens; this server's context is %d tokens", r->n_toks, n_ctx);
        return bad(b, r->chat ? "messages" : "prompt", "context_length_exceeded", "%s", m);
    }
    return 0;
}

/* ---- responses --------------------------------------------------------------------------- */
static const char *finish_reason(int finish)
{
    return finish == GEN_FINISH_LENGTH || finish == GEN_FINISH_CONTEXT ? "length" : "stop";
}

/* One line per generation on stderr: route, outcome, token counts. g.mu held or j done. */
static void log_job(const char *route, const job *j, const char *outcome)
{
    /* TTFT and t/s as the engine saw them (from the step that took the request), context shifts */
    fprintf(stderr, "kvchat serve: %s: %s — prompt %zu tokens (cached %d), completion %d tokens, TTFT %.0f ms, %.1f t/s%s\n",
            route, outcome ? outcome : j->rc != KV_OK ? j->err.msg : gen_finish_name(j->ch[0].finish), j->n_toks,
            j->st.n_reused, job_completion_tokens(j), j->st.ttft_ms, j->st.decode_tps,
            j->st.n_shifts ? ", context shifted" : "");
}

/* --store: a finished request (done, not cancelled) as a conversation (app/serve_store.h). */
static void store_job(const job *j)
{
    if (!g.store || !j->store_req || j->rc != KV_OK || j->ch[0].finish == GEN_FINISH_CANCELLED) return;
    char why[700];
    long long id;
    if (serve_store_save(g.store, j->store_req, j->ch[0].text, j->ch[0].len, j->ch[0].finish, &j->st, &j->sp,
                         j->go.n_predict, &id, why, sizeof why))
        fprintf(stderr, "kvchat serve: --store: %s: not saved: %s\n", serve_store_path(g.store), why);
}

static cJSON *usage_obj(const job *j)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->n_toks);
    cJSON_AddNumberToObject(u, "completion_tokens", job_completion_tokens(j));
    cJSON_AddNumberToObject(u, "total_tokens", (double)j->n_toks + job_completion_tokens(j));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", j->st.n_reused);
    return u;
}

/* Copy src[0..n) to dst as valid UTF-8 (each invalid byte becomes U+FFFD); dst holds 3n + 1. */
static void utf8_sanitize(const unsigned char *src, size_t n, char *dst)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = src[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4 : 0;
        int okseq = len > 0 && i + len <= n;
        for (size_t k = 1; okseq && k < len; k++) okseq = (src[i + k] & 0xC0) == 0x80;
        if (okseq && len == 3) okseq = !(c == 0xE0 && src[i + 1] < 0xA0) && !(c == 0xED && src[i + 1] >= 0xA0);
        if (okseq && len == 4) okseq = !(c == 0xF0 && src[i + 1] < 0x90) && !(c == 0xF4 && src[i + 1] >= 0x90);
        if (okseq) {
            memcpy(dst + o, src + i, len);
            o += len;
            i += len;
        } else {
            memcpy(dst + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    dst[o] = 0;
}

/* A token's text as JSON: "token" (valid UTF-8) and, for chat, "bytes" (the raw bytes); returns
 * the raw length (for text_offset). */
static size_t token_json(int32_t tok, cJSON *into, int chat, char *name_out, size_t name_cap)
{
    char raw[256], text[3 * 256 + 1];
    size_t n = tokenizer_token_to_piece(engine_tokenizer(g.e), tok, 0, raw, sizeof raw);
    if (n > sizeof raw) n = 0;
    utf8_sanitize((const unsigned char *)raw, n, text);
    if (name_out) snprintf(name_out, name_cap, "%s", text);
    if (into) {
        cJSON_AddStringToObject(into, "token", text);
        if (chat) {
            cJSON *b = cJSON_AddArrayToObject(into, "bytes");
            for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)raw[i]));
        }
    }
    return n;
}

/* The logprobs of entries e[0..n): chat's {"content": [{token, logprob, bytes, top_logprobs}]}
 * or completions' {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (offsets from
 * *offset, advanced). */
static cJSON *logprobs_obj(int chat, const lp_entry *e, size_t n, size_t *offset)
{
    cJSON *o = cJSON_CreateObject();
    char name[3 * 256 + 1];
    if (chat) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (size_t i = 0; i < n; i++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddItemToArray(content, t);
            token_json(e[i].tok, t, 1, NULL, 0);
            cJSON_AddNumberToObject(t, "logprob", e[i].lp);
            cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
            for (int k = 0; k < e[i].n_top; k++) {
                cJSON *a = cJSON_CreateObject();
                cJSON_AddItemToArray(top, a);
                token_json(e[i].top[k], a, 1, NULL, 0);
                cJSON_AddNumberToObject(a, "logprob", e[i].top_lp[k]);
            }
        }
        cJSON_AddNullToObject(o, "refusal");
        return o;
    }
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (size_t i = 0; i < n; i++) {
        size_t len = token_json(e[i].tok, NULL, 0, name, sizeof name);
        cJSON_AddItemToArray(toks, cJSON_CreateString(name));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(e[i].lp));
        cJSON *t = cJSON_CreateObject();
        for (int k = 0; k < e[i].n_top; k++) {
            token_json(e[i].top[k], NULL, 0, name, sizeof name);
            if (!cJSON_GetObjectItemCaseSensitive(t, name)) cJSON_AddNumberToObject(t, name, e[i].top_lp[k]);
        }
        cJSON_AddItemToArray(tops, t);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        *offset += len;
    }
    return o;
}

/* g.mu held: a copy of the choice's entries from *from on (advanced); NULL when none or off. */
static lp_entry *take_logprobs_locked(const job *j, const choice *c, size_t *from, size_t *n)
{
    *n = 0;
    if (!j->logprobs || c->n_lp <= *from) return NULL;
    lp_entry *e = malloc((c->n_lp - *from) * sizeof *e);
    if (!e) return NULL;
    *n = c->n_lp - *from;
    memcpy(e, c->lp + *from, *n * sizeof *e);
    *from = c->n_lp;
    return e;
}

/* The fields every response and chunk starts with. */
static cJSON *response_head(const char *id, const char *object, long created)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", g.model_id);
    return o;
}

/* A streamed response: the connection's view of its job. */
typedef struct stream_ctx {
    job *j;
    int chat, include_usage, fd;
    char id[48];
    long created;
    int c;                    /* the choice being sent */
    size_t sent;              /* bytes of its text already sent */
    size_t lp_sent;           /* its logprob entries already sent */
    size_t text_off;          /* completions' text_offset of the next entry */
    int phase;                /* 0: the role chunk is next, 1: content, 2: everything queued */
    int logged;
    const char *route;
    char *out;                /* bytes queued for MHD */
    size_t out_len, out_off, out_cap;
} stream_ctx;

static void sse_push(stream_ctx *s, cJSON *obj)
{
    char *js = obj ? cJSON_PrintUnformatted(obj) : NULL;
    if (obj) cJSON_Delete(obj);
    const char *payload = js ? js : "[DONE]";
    size_t need = strlen(payload) + 8;
    if (s->out_len + need > s->out_cap) {
        size_t nc = s->out_cap ? s->out_cap : 4096;
        while (nc < s->out_len + need) nc *= 2;
        char *no = realloc(s->out, nc);
        if (!no) {
            free(js);
            return;
        }
        s->out = no;
        s->out_cap = nc;
    }
    s->out_len += (size_t)sprintf(s->out + s->out_len, "data: %s\n\n", payload);
    free(js);
}

/* A chunk with one choice: delta content (chat) or text (completions), and a finish reason. */
static cJSON *chunk(stream_ctx *s, const char *text, size_t len, const char *finish, int role, cJSON *lp)
{
    cJSON *o = response_head(s->id, s->chat ? "chat.completion.chunk" : "text_completion", s->created);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", s->c);
    char *t = malloc(len + 1);
    if (t) {
        if (text) memcpy(t, text, len);
        t[len] = 0;
    }
    if (s->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text && t) cJSON_AddStringToObject(d, "content", t);
    } else {
        cJSON_AddStringToObject(c, "text", t ? t : "");
    }
    free(t);
    if (lp) cJSON_AddItemToObject(c, "logprobs", lp);
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    if (s->include_usage) cJSON_AddNullToObject(o, "usage");
    return o;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_ctx *s = cls;
    job *j = s->j;
    for (;;) {
        if (s->out_off < s->out_len) {
            size_t n = s->out_len - s->out_off < max ? s->out_len - s->out_off : max;
            memcpy(buf, s->out + s->out_off, n);
            s->out_off += n;
            return (ssize_t)n;
        }
        s->out_len = s->out_off = 0;
        if (s->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->phase == 0) {
            s->phase = 1;
            if (s->chat) sse_push(s, chunk(s, "", 0, NULL, 1, NULL));
            continue;
        }
        pthread_mutex_lock(&g.mu);
        choice *cc = &j->ch[s->c];
        while (cc->len == s->sent && !j->done && !(cc->done && s->c + 1 < j->n_choices && cc->finish != GEN_FINISH_ERROR)) {
            job_wait_locked(j);
            if (!j->done && (client_gone(s->fd) || atomic_load(&g.shutdown))) {
                atomic_store(&j->cancel, 1);
                s->logged = 1;
                log_job(s->route, j, "client gone, cancelled");
                pthread_mutex_unlock(&g.mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        if (cc->len > s->sent) {
            size_t n = cc->len - s->sent, n_lp;
            char *t = malloc(n);
            if (t) memcpy(t, cc->text + s->sent, n);
            s->sent = cc->len;
            lp_entry *le = take_logprobs_locked(j, cc, &s->lp_sent, &n_lp);
            pthread_mutex_unlock(&g.mu);
            if (!t) {
                free(le);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            sse_push(s, chunk(s, t, n, NULL, 0, le ? logprobs_obj(s->chat, le, n_lp, &s->text_off) : NULL));
            free(le);
            free(t);
            continue;
        }
        /* this choice is done and all its text sent: its finish chunk, then the next choice */
        if (cc->done && cc->finish != GEN_FINISH_ERROR && s->c + 1 < j->n_choices) {
            int fin = cc->finish;
            size_t n_lp;
            lp_entry *le = take_logprobs_locked(j, cc, &s->lp_sent, &n_lp);
            pthread_mutex_unlock(&g.mu);
            sse_push(s, chunk(s, NULL, 0, finish_reason(fin), 0, le ? logprobs_obj(s->chat, le, n_lp, &s->text_off) : NULL));
            free(le);
            s->c++;
            s->sent = s->lp_sent = s->text_off = 0;
            if (s->chat) sse_push(s, chunk(s, "", 0, NULL, 1, NULL));
            continue;
        }
        if (!j->done) { /* not reached: the wait above ends only on text, a next choice or done */
            pthread_mutex_unlock(&g.mu);
            continue;
        }
        size_t n_lp;
        lp_entry *le = take_logprobs_locked(j, cc, &s->lp_sent, &n_lp);
        pthread_mutex_unlock(&g.mu);
        if (j->rc != KV_OK) {
            sse_push(s, error_obj(j->err.msg, "server_error", NULL, NULL));
        } else {
            sse_push(s, chunk(s, NULL, 0, finish_reason(cc->finish), 0, le ? logprobs_obj(s->chat, le, n_lp, &s->text_off) : NULL));
            if (s->include_usage) {
                cJSON *o = response_head(s->id, s->chat ? "chat.completion.chunk" : "text_completion", s->created);
                cJSON_AddArrayToObject(o, "choices");
                cJSON_AddItemToObject(o, "usage", usage_obj(j));
                sse_push(s, o);
            }
        }
        free(le);
        sse_push(s, NULL);
        s->phase = 2;
        s->logged = 1;
        log_job(s->route, j, NULL);
        store_job(j);
    }
}

static void stream_free(void *cls)
{
    stream_ctx *s = cls;
    atomic_store(&s->j->cancel, 1); /* no-op when it is done; else the client went away */
    if (!s->logged) {
        pthread_mutex_lock(&g.mu);
        log_job(s->route, s->j, "connection closed, cancelled");
        pthread_mutex_unlock(&g.mu);
    }
    job_unref(s->j);
    free(s->out);
    free(s);
}

/* Wait for a non-streamed job; 0 done, -1 the client went away or the server stops (cancelled). */
static int wait_job(job *j, int fd)
{
    pthread_mutex_lock(&g.mu);
    while (!j->done) {
        job_wait_locked(j);
        if (!j->done && (client_gone(fd) || atomic_load(&g.shutdown))) {
            atomic_store(&j->cancel, 1);
            pthread_mutex_unlock(&g.mu);
            return -1;
        }
    }
    pthread_mutex_unlock(&g.mu);
    return 0;
}

static enum MHD_Result handle_completion(struct MHD_Connection *c, req_ctx *rq, int chat)
{
    cJSON *root = cJSON_ParseWithLength(rq->body ? rq->body : "", rq->len);
    if (!root) return send_error(c, MHD_HTTP_BAD_REQUEST, "the request body is not valid JSON", "invalid_request_error", NULL, "invalid_json");
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return send_error(c, MHD_HTTP_BAD_REQUEST, "the request body must be a JSON object", "invalid_request_error", NULL, "invalid_json");
    }
    api_req r = {.chat = chat};
    bad_field b;
    memset(&b, 0, sizeof b);
    if (parse_request(root, &r, &b)) {
        cJSON_Delete(root);
        free(r.toks);
        return send_error(c, MHD_HTTP_BAD_REQUEST, b.msg, "invalid_request_error", b.param[0] ? b.param : NULL, b.code);
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        cJSON_Delete(root);
        free(r.toks);
        return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "server_error", NULL, NULL);
    }
    j->refs = 2;
    j->toks = r.toks;
    j->n_toks = r.n_toks;
    j->sp = r.sp;
    /* a sequence that fills -c shifts (keeps 4 sink positions, drops half of the rest) and goes on */
    j->go = (gen_opts){.n_predict = r.n_predict, .no_context_shift = g.no_context_shift};
    j->n_choices = r.n;
    j->logprobs = r.logprobs;
    j->top_n = r.top_n;
    stop_init(&j->sm0, r.stops, r.n_stops);
    pthread_cond_init(&j->cv, NULL);
    if (g.store) j->store_req = serve_store_capture(root, chat);
    cJSON_Delete(root); /* r.stops pointed into it; stop_init copied them */
    pthread_mutex_lock(&g.mu);
    if (g.n_inflight >= g.parallel) {
        pthread_mutex_unlock(&g.mu);
        j->refs = 1;
        job_unref(j);
        return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "the server is busy; try again later", "server_error", NULL, "server_busy");
    }
    g.n_inflight++;
    if (g.tail) g.tail->next = j;
    else g.head = j;
    g.tail = j;
    unsigned long long id = ++g.next_id;
    pthread_cond_signal(&g.cv_queue);
    pthread_mutex_unlock(&g.mu);

    char idbuf[48];
    snprintf(idbuf, sizeof idbuf, "%s-%llx%llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL), id);
    long created = (long)time(NULL);
    int fd = connection_fd(c);
    if (r.stream) {
        stream_ctx *s = calloc(1, sizeof *s);
        struct MHD_Response *resp = s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, s, stream_free) : NULL;
        if (!resp) {
            free(s);
            atomic_store(&j->cancel, 1);
            job_unref(j);
            return MHD_NO;
        }
        *s = (stream_ctx){.j = j, .chat = chat, .include_usage = r.include_usage, .fd = fd, .created = created,
                          .route = chat ? "chat stream" : "completion stream"};
        snprintf(s->id, sizeof s->id, "%s", idbuf);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    const char *route = chat ? "chat" : "completion";
    if (wait_job(j, fd)) {
        pthread_mutex_lock(&g.mu);
        log_job(route, j, "client gone, cancelled");
        pthread_mutex_unlock(&g.mu);
        job_unref(j);
        return MHD_NO; /* nobody to answer */
    }
    enum MHD_Result ret;
    log_job(route, j, NULL);
    store_job(j);
    if (j->rc != KV_OK) {
        ret = send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, j->err.msg, "server_error", NULL, NULL);
    } else {
        cJSON *o = response_head(idbuf, chat ? "chat.completion" : "text_completion", created);
        cJSON *ch = cJSON_AddArrayToObject(o, "choices");
        for (int i = 0; i < j->n_choices; i++) {
            cJSON *c0 = cJSON_CreateObject();
            const char *text = j->ch[i].text ? j->ch[i].text : "";
            cJSON_AddItemToArray(ch, c0);
            cJSON_AddNumberToObject(c0, "index", i);
            if (chat) {
                cJSON *m = cJSON_AddObjectToObject(c0, "message");
                cJSON_AddStringToObject(m, "role", "assistant");
                cJSON_AddStringToObject(m, "content", text);
            } else {
                cJSON_AddStringToObject(c0, "text", text);
            }
            size_t off = 0;
            if (j->logprobs) cJSON_AddItemToObject(c0, "logprobs", logprobs_obj(chat, j->ch[i].lp, j->ch[i].n_lp, &off));
            else cJSON_AddNullToObject(c0, "logprobs");
            cJSON_AddStringToObject(c0, "finish_reason", finish_reason(j->ch[i].finish));
        }
        cJSON_AddItemToObject(o, "usage", usage_obj(j));
        ret = send_json(c, MHD_HTTP_OK, o);
    }
    job_unref(j);
    return ret;
}

static enum MHD_Result handle_models(struct MHD_Connection *c, req_ctx *rq, int unused)
{
    (void)rq, (void)unused;
    cJSON *o = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(d, m);
    cJSON_AddStringToObject(m, "id", g.model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "kvchat");
    return send_json(c, MHD_HTTP_OK, o);
}

static enum MHD_Result handle_health(struct MHD_Connection *c, req_ctx *rq, int unused)
{
    (void)rq, (void)unused;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    return send_json(c, MHD_HTTP_OK, o);
}

/* The routes: method, path, handler, its argument, whether the API key is checked. */
static const struct route {
    const char *method, *path;
    enum MHD_Result (*fn)(struct MHD_Connection *, req_ctx *, int);
    int arg, auth;
} routes[] = {
    {"POST", "/v1/chat/completions", handle_completion, 1, 1},
    {"POST", "/v1/completions", handle_completion, 0, 1},
    {"GET", "/v1/models", handle_models, 0, 1},
    {"GET", "/health", handle_health, 0, 0},
};

static int key_ok(struct MHD_Connection *c)
{
    if (!g.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(g.api_key);
    unsigned diff = a != b;
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(h[i] ^ g.api_key[i]);
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)cls, (void)version;
    req_ctx *rq = *con_cls;
    if (!rq) { /* the headers are in; refuse a body declared too large before reading it */
        if (!(rq = calloc(1, sizeof *rq))) return MHD_NO;
        *con_cls = rq;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > g.max_body) rq->too_large = 1;
        else return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (rq->too_large || rq->len + n > g.max_body) {
            rq->too_large = 1;
            return MHD_YES; /* discard the rest; answered at the end */
        }
        if (rq->len + n + 1 > rq->cap) {
            size_t nc = rq->cap ? rq->cap : 4096;
            while (nc < rq->len + n + 1) nc *= 2;
            char *nb = realloc(rq->body, nc);
            if (!nb) return MHD_NO;
            rq->body = nb;
            rq->cap = nc;
        }
        memcpy(rq->body + rq->len, upload_data, n);
        rq->len += n;
        rq->body[rq->len] = 0;
        return MHD_YES;
    }
    const struct route *rt = NULL;
    int path_known = 0;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path)) continue;
        path_known = 1;
        if (!strcmp(method, routes[i].method)) rt = &routes[i];
    }
    char m[600];
    if (!rt && !path_known) {
        snprintf(m, sizeof m, "unknown route %.16s %.500s", method, url);
        return send_error(c, MHD_HTTP_NOT_FOUND, m, "invalid_request_error", NULL, "not_found");
    }
    if (!rt) {
        snprintf(m, sizeof m, "method %.16s not allowed on %.500s", method, url);
        return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, m, "invalid_request_error", NULL, "method_not_allowed");
    }
    if (rt->auth && !key_ok(c))
        return send_error(c, MHD_HTTP_UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer KEY)",
                          "invalid_request_error", NULL, "invalid_api_key");
    if (rq->too_large) {
        snprintf(m, sizeof m, "the request body is larger than %zu bytes", g.max_body);
        return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, m, "invalid_request_error", NULL, "request_too_large");
    }
    if (!atomic_load(&g.ready))
        return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "the model is loading", "server_error", NULL, "model_loading");
    return rt->fn(c, rq, rt->arg);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    req_ctx *rq = *con_cls;
    if (rq) {
        free(rq->body);
        free(rq);
        *con_cls = NULL;
    }
}

/* ---- the command ------------------------------------------------------------------------- */
static void serve_usage(FILE *out)
{
    fprintf(out,
            "Usage: kvchat serve -m MODEL [OPTION]...\n"
            "An OpenAI-compatible HTTP server on the model: POST /v1/chat/completions,\n"
            "POST /v1/completions, GET /v1/models, GET /health (Server-Sent Events with \"stream\": true).\n"
            "\n"
            "  -m, --model PATH|NAME    GGUF model file, or NAME(.gguf) in the models directory\n"
            "      --host ADDR          address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
            "      --port N             TCP port (default 8080; 0 picks a free one, printed at start)\n"
            "      --parallel N         requests decoding together (continuous batching: one forward pass a\n"
            "                           step for all of them); more at once get 503 (default 4, at most 256)\n"
            "      --prefill-chunk N    prompt tokens a step takes while other requests decode (default 32):\n"
            "                           smaller keeps their inter-token latency low, larger gives a faster TTFT\n"
            "      --no-context-shift   a request whose sequence fills -c ends (finish_reason \"length\")\n"
            "                           instead of dropping the oldest half of its context and going on\n"
            "      --api-key KEY        require \"Authorization: Bearer KEY\" on every route but /health\n"
            "                           (env KVCHAT_API_KEY)\n"
            "  -c, --ctx-size N         context length in tokens (prompt + reply of one request)\n"
            "  -t, --threads N          threads (default: all CPUs)\n"
            "  -b, --batch-size N       prefill chunk in tokens (default 512)\n"
            "      --kv-type TYPE       KV cache type: f16 (default), q8_0 or f32\n"
            "      --chat-template NAME how chat messages become the prompt (default: the model's; none =\n"
            "                           completion mode)\n"
            "      --max-body BYTES     largest request body (default 1048576); larger ones get 413\n"
            "      --store[=DB]         save each finished request as a conversation in the chat's database\n"
            "                           (DB, else env KVCHAT_DB, else ~/.local/share/kvchat/kvchat.db): kvchat list\n"
            "                           and the chat's F3 show them (default: off)\n"
            "  -h, --help               show this help and exit\n"
            "\n"
            "Stops on SIGINT or SIGTERM.\n");
}

enum { SO_HOST = 2000, SO_PORT, SO_PARALLEL, SO_API_KEY, SO_KV_TYPE, SO_CHAT_TEMPLATE, SO_MAX_BODY, SO_PREFILL_CHUNK, SO_STORE, SO_NO_SHIFT };

static int serve_int(const char *s, const char *opt, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !*s || *end || v < lo || v > hi) {
        fprintf(stderr, "kvchat serve: invalid value '%s' for %s (an integer from %ld to %ld)\n", s, opt, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int serve_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},       {"host", required_argument, 0, SO_HOST},
        {"port", required_argument, 0, SO_PORT},    {"parallel", required_argument, 0, SO_PARALLEL},
        {"prefill-chunk", required_argument, 0, SO_PREFILL_CHUNK},
        {"api-key", required_argument, 0, SO_API_KEY}, {"ctx-size", required_argument, 0, 'c'},
        {"threads", required_argument, 0, 't'},     {"batch-size", required_argument, 0, 'b'},
        {"kv-type", required_argument, 0, SO_KV_TYPE}, {"chat-template", required_argument, 0, SO_CHAT_TEMPLATE},
        {"max-body", required_argument, 0, SO_MAX_BODY}, {"help", no_argument, 0, 'h'},
        {"store", optional_argument, 0, SO_STORE},  {"no-context-shift", no_argument, 0, SO_NO_SHIFT},
        {0, 0, 0, 0},
    };
    engine_params ep;
    engine_params_default(&ep);
    const char *host = "127.0.0.1", *model_arg = NULL, *tmpl_name = NULL, *store_arg = NULL;
    int want_store = 0;
    int port = 8080, max_body = SERVE_DEFAULT_MAX_BODY;
    g.parallel = 4;
    g.prefill_budget = 32;
    g.api_key = getenv("KVCHAT_API_KEY");
    if (g.api_key && !*g.api_key) g.api_key = NULL;
    opterr = 0;
    optind = 1;
    int o;
    while ((o = getopt_long(argc, argv, ":m:c:t:b:h", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model_arg = optarg; break;
        case SO_HOST: host = optarg; break;
        case SO_PORT: if (serve_int(optarg, "--port", 0, 65535, &port)) return EXIT_USAGE; break;
        case SO_PARALLEL: if (serve_int(optarg, "--parallel", 1, 256, &g.parallel)) return EXIT_USAGE; break;
        case SO_PREFILL_CHUNK: if (serve_int(optarg, "--prefill-chunk", 1, 1 << 16, &g.prefill_budget)) return EXIT_USAGE; break;
        case SO_API_KEY: g.api_key = *optarg ? optarg : NULL; break;
        case SO_NO_SHIFT: g.no_context_shift = 1; break;
        case 'c': if (serve_int(optarg, "-c", 8, 1 << 20, &ep.n_ctx)) return EXIT_USAGE; break;
        case 't': if (serve_int(optarg, "-t", 1, 1024, &ep.n_threads)) return EXIT_USAGE; break;
        case 'b': if (serve_int(optarg, "-b", 1, 1 << 16, &ep.n_batch)) return EXIT_USAGE; break;
        case SO_MAX_BODY: if (serve_int(optarg, "--max-body", 1024, 1 << 30, &max_body)) return EXIT_USAGE; break;
        case SO_KV_TYPE:
            if ((ep.kv_type = engine_kv_type_from_name(optarg)) < 0) {
                fprintf(stderr, "kvchat serve: invalid --kv-type '%s' (f16, q8_0 or f32)\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case SO_CHAT_TEMPLATE:
            if (chat_template_from_name(optarg) < 0) {
                fprintf(stderr, "kvchat serve: unknown --chat-template '%s' (one of: none, %s)\n", optarg, chat_template_names());
                return EXIT_USAGE;
            }
            tmpl_name = optarg;
            break;
        case SO_STORE: /* --store, --store=DB, --store DB (a next word that is not an option) */
            if (!optarg && optind < argc && argv[optind][0] != '-') optarg = argv[optind++];
            want_store = 1;
            store_arg = optarg;
            break;
        case 'h': serve_usage(stdout); return EXIT_OK;
        case ':': fprintf(stderr, "kvchat serve: option '%s' needs a value\n", argv[optind - 1]); return EXIT_USAGE;
        default: fprintf(stderr, "kvchat serve: unknown option '%s'\nTry 'kvchat serve --help'.\n", argv[optind - 1]); return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvchat serve: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (!model_arg) model_arg = getenv("KVCHAT_MODEL");
    if (!model_arg || !*model_arg) {
        fprintf(stderr, "kvchat serve: no model given (-m MODEL)\n");
        return EXIT_USAGE;
    }
    static char model_path[4096];
    if (models_resolve(model_arg, model_path, sizeof model_path) < 0) {
        fprintf(stderr, "kvchat serve: %s\n", model_path);
        return EXIT_MODEL;
    }
    ep.model_path = model_path;
    ep.kv_seqs = g.parallel; /* a block budget for every admitted request's sequence */
    g.max_body = (size_t)max_body;
    const char *base = strrchr(model_path, '/');
    snprintf(g.model_id, sizeof g.model_id, "%.200s", base ? base + 1 : model_path);
    size_t bl = strlen(g.model_id);
    if (bl > 5 && !strcmp(g.model_id + bl - 5, ".gguf")) g.model_id[bl - 5] = 0;

    /* the address: IPv4 or IPv6 literal, or localhost */
    struct sockaddr_storage ss = {0};
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "kvchat serve: --host '%s' is not an IPv4 or IPv6 address\n", host);
        return EXIT_USAGE;
    }

    /* SIGINT / SIGTERM are taken by sigwait in this thread; every thread started from here on
     * inherits the mask. A client gone mid-write must not kill the server. */
    signal(SIGPIPE, SIG_IGN);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    struct MHD_Daemon *d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL,
                                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)SERVE_MAX_CONNECTIONS,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)SERVE_CONN_TIMEOUT_S,
                                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1 << 20),
                                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                                            MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "kvchat serve: cannot listen on %s port %d: %s\n", host, port, strerror(errno));
        return EXIT_RUNTIME;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int bound = di ? di->port : port;
    fprintf(stderr, "kvchat serve: listening on http://%s%s%s:%d (loading %s)\n", strchr(host, ':') ? "[" : "", host,
            strchr(host, ':') ? "]" : "", bound, model_path);

    kv_error err = {0};
    if (engine_open(&ep, &g.e, &err)) {
        fprintf(stderr, "kvchat serve: %s\n", err.msg);
        MHD_stop_daemon(d);
        return err.code == KV_ERR_NOMEM ? EXIT_RUNTIME : EXIT_MODEL;
    }
    if (engine_notice(g.e)) fprintf(stderr, "kvchat serve: %s\n", engine_notice(g.e));
    char *tmpl_text = NULL;
    gguf_get_str(engine_model(g.e)->gguf, "tokenizer.chat_template", 0, &tmpl_text, &err);
    g.tmpl = tmpl_name ? chat_template_from_name(tmpl_name) : chat_template_detect(tmpl_text);
    free(tmpl_text);
    if (g.tmpl < 0) g.tmpl = CHAT_TMPL_NONE;
    if (g.tmpl == CHAT_TMPL_UNKNOWN) {
        fprintf(stderr, "kvchat serve: the model's chat template is not one kvchat knows; using chatml "
                        "(--chat-template NAME to choose)\n");
        g.tmpl = CHAT_TMPL_CHATML;
    }
    /* scheduler slots: every admitted request's choices (+ a base prefill), at most a batch of rows */
    int n_batch = forward_ctx_n_batch(engine_forward_ctx(g.e));
    sch.cap = 2 * g.parallel + SERVE_MAX_N < n_batch ? 2 * g.parallel + SERVE_MAX_N : n_batch;
    sch.slots = calloc((size_t)sch.cap, sizeof *sch.slots);
    sch.gs = calloc((size_t)sch.cap, sizeof *sch.gs);
    if (!sch.slots || !sch.gs || !(sch.b = gen_batch_create(g.e, sch.cap, &err))) {
        fprintf(stderr, "kvchat serve: %s\n", sch.b ? "out of memory" : err.msg);
        MHD_stop_daemon(d);
        engine_close(g.e);
        return EXIT_RUNTIME;
    }
    if (want_store) { /* the chat's database (app/chatstore.h): --store DB > KVCHAT_DB > the default */
        char db[4096], why[900];
        if (chatstore_db_path(store_arg, 1, db, sizeof db, why, sizeof why) ||
            !(g.store = serve_store_open(g.e, db, why, sizeof why))) {
            fprintf(stderr, "kvchat serve: --store: %s\n", why);
            MHD_stop_daemon(d);
            engine_close(g.e);
            return 4; /* a database error, as kvchat's */
        }
        fprintf(stderr, "kvchat serve: storing finished requests in %s\n", db);
    }
    engine_set_reclaim(g.e, kept_release_oldest, NULL); /* kept sequences make room for active work */
    pthread_t gen;
    if (pthread_create(&gen, NULL, generator_main, NULL)) {
        fprintf(stderr, "kvchat serve: cannot start the generator thread\n");
        MHD_stop_daemon(d);
        engine_close(g.e);
        return EXIT_RUNTIME;
    }
    atomic_store(&g.ready, 1);
    fprintf(stderr, "kvchat serve: ready — model %s, n_ctx %d, chat template %s, %d requests batched together%s\n",
            g.model_id, engine_n_ctx(g.e), chat_template_name(g.tmpl), g.parallel, g.api_key ? ", API key required" : "");

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kvchat serve: signal %d, stopping\n", sig);
    pthread_mutex_lock(&g.mu);
    atomic_store(&g.shutdown, 1);
    pthread_cond_broadcast(&g.cv_queue);
    pthread_mutex_unlock(&g.mu);
    pthread_join(gen, NULL);
    MHD_stop_daemon(d); /* connections still waiting see g.shutdown within SERVE_POLL_MS */
    /* jobs left in the queue were never started: answer nobody, free them */
    pthread_mutex_lock(&g.mu);
    while (g.head) {
        job *j = g.head;
        g.head = j->next;
        job_unref_locked(j);
    }
    pthread_mutex_unlock(&g.mu);
    gen_batch_free(sch.b);
    free(sch.slots);
    free(sch.gs);
    serve_store_close(g.store); /* the connections that save are gone (MHD_stop_daemon) */
    g.store = NULL;
    engine_close(g.e);
    return EXIT_OK;
}
