/* worker: the generator thread — owns the engine while a request runs, streams text and live stats through an event queue, honours cancel and live sampling parameters. */
#include "worker.h"
#include "beam.h"
#include "logprob.h"
#include "model.h"
#include "best_of.h"
#include "speculate.h"

#include "stop.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct worker {
    engine *e;
    sampler *s;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int wake_rd, wake_wr;

    /* --- under mu ---------------------------------------------------------------------- */
    int quit;
    int has_job;          /* a request waits for the thread */
    int busy;             /* from submit until DONE is taken by worker_next_event */
    worker_request job;   /* job.seg points into job_seg / job_text */
    worker_segment *job_seg;
    char *job_text;
    int32_t *job_conv;    /* job.conv points here */
    int keep_wanted;      /* worker thread: the last request's keep_seg positions */
    worker_hooks hooks;
    sampler_params params;
    spec_params spec;          /* worker_set_spec: speculative decoding of the next requests */
    char stops[STOP_MAX_STRINGS][STOP_MAX_LEN]; /* worker_set_stops */
    int n_stops;
    int signaled;         /* a byte sits in the wake-up pipe */
    char *text;           /* text produced since the last drain */
    size_t text_len, text_cap;
    int stats_dirty;
    worker_stats stats;
    int done_pending;
    worker_event done;
    char *ui_text;        /* buffer handed to the UI by the last TEXT event */
    size_t ui_text_cap;

    /* --- atomics (read without mu on the hot path) -------------------------------------- */
    atomic_int cancel;
    atomic_int params_dirty;
    atomic_int limit;      /* live n_predict (< 0: none) */

    /* --- worker thread only ------------------------------------------------------------- */
    double t0, t_first, t_last;
    int n_prompt;
    int n_gen;             /* tokens generated as of the last stats update */
    int n_sampled;         /* tokens sampled so far (on_token), an end of generation too */
    int last_eog;          /* the last token sampled was an end of generation */
    stop_matcher sm;       /* the request's stop strings */
    char *stop_buf;        /* stop_push output */
    size_t stop_cap;
    int stop_hit;          /* a stop string ended the reply */
    int limit_hit;         /* the live token limit stopped the request */
    int32_t last_tok;      /* token of the last on_text call … */
    int last_tok_n;        /* … and its index (1-based) among the generated tokens */
    int32_t *conv;         /* the conversation: last prompt + generated tokens (for append) */
    size_t n_conv, cap_conv;
    int32_t *done_conv;    /* its copy handed out with DONE (worker_event.conv) */
    size_t cap_done_conv;
    int space_prefix;      /* the tokenizer prefixes text with a space (SentencePiece) */
    double itl_sum;
    worker_stats live;
    worker_candidate cand[BEST_OF_MAX]; /* the last best_of / beams request's candidates */
    int n_cand;
    char *cand_text[BEST_OF_MAX];       /* their storage */
    int32_t *cand_conv[BEST_OF_MAX];
    /* the reply's token probabilities (worker_event.tok_*): text [tok_start[i], tok_end[i]) of
     * the raw generated text came with a token of probability tok_p[i] */
    uint32_t *tok_start, *tok_end;
    float *tok_p;
    size_t n_tok, cap_tok;
    size_t raw_off;        /* generated text bytes so far (before the stop matcher) */
    float last_p;          /* probability of the last token sampled */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Under mu: make worker_fd readable. */
static void wake_locked(worker *w)
{
    if (w->signaled) return;
    char b = 1;
    ssize_t r;
    do r = write(w->wake_wr, &b, 1);
    while (r < 0 && errno == EINTR);
    w->signaled = 1;
}

/* Worker thread: apply parameters the UI posted since the last token. */
static void apply_params(worker *w)
{
    if (!atomic_exchange(&w->params_dirty, 0)) return;
    pthread_mutex_lock(&w->mu);
    sampler_params p = w->params;
    pthread_mutex_unlock(&w->mu);
    sampler_set_params(w->s, &p);
}

/* Worker thread: refresh the live stats from the cache and the clock, and post them. */
static void post_live(worker *w, const char *text, size_t len)
{
    double t = now_ms();
    kv_cache_stats kv;
    kv_cache_get_stats(engine_kv(w->e), &kv);
    worker_stats *L = &w->live;
    L->kv = kv;
    L->elapsed_ms = t - w->t0;
    if (w->n_sampled > 0) {
        /* Counted per token (on_token), not from the cache: a context shift shrinks that. */
        int n = w->n_sampled;
        if (L->phase != WORKER_DECODE) {
            L->phase = WORKER_DECODE;
            w->t_first = w->t_last = t;
            L->gen.ttft_ms = t - w->t0;
            L->gen.prefill_ms = L->gen.ttft_ms;
            L->gen.prefill_tps = L->gen.prefill_ms > 0 ? L->gen.n_prefilled / (L->gen.prefill_ms / 1e3) : 0;
            w->n_gen = n;
        } else if (n > w->n_gen) {
            double gap = (t - w->t_last) / (n - w->n_gen);
            w->itl_sum += t - w->t_last;
            if (gap > L->gen.itl_ms_max) L->gen.itl_ms_max = gap;
            w->t_last = t;
            w->n_gen = n;
        }
        L->gen.n_generated = n;
        int lim = atomic_load(&w->limit);
        if (lim >= 0 && n >= lim) w->limit_hit = 1;
        if (n > 1) {
            L->gen.decode_ms = w->t_last - w->t_first;
            L->gen.decode_tps = L->gen.decode_ms > 0 ? (n - 1) / (L->gen.decode_ms / 1e3) : 0;
            L->gen.itl_ms_mean = w->itl_sum / (n - 1);
        }
    }
    pthread_mutex_lock(&w->mu);
    if (len) {
        if (w->text_len + len > w->text_cap) {
            size_t nc = w->text_cap ? w->text_cap : 4096;
            while (nc < w->text_len + len) nc *= 2;
            char *nb = realloc(w->text, nc);
            if (nb) {
                w->text = nb;
                w->text_cap = nc;
            }
        }
        if (w->text_len + len <= w->text_cap) { /* else dropped: out of memory */
            memcpy(w->text + w->text_len, text, len);
            w->text_len += len;
        }
    }
    w->stats = *L;
    w->stats_dirty = 1;
    wake_locked(w);
    pthread_mutex_unlock(&w->mu);
}

/* Worker thread: text [start, end) of the reply came with a token of probability p. */
static void add_span(worker *w, size_t start, size_t end, float p)
{
    if (w->n_tok == w->cap_tok) {
        size_t nc = w->cap_tok ? w->cap_tok * 2 : 256;
        uint32_t *a = realloc(w->tok_start, nc * sizeof *a);
        if (a) w->tok_start = a;
        uint32_t *b = realloc(w->tok_end, nc * sizeof *b);
        if (b) w->tok_end = b;
        float *c = realloc(w->tok_p, nc * sizeof *c);
        if (c) w->tok_p = c;
        if (!a || !b || !c) return;
        w->cap_tok = nc;
    }
    w->tok_start[w->n_tok] = (uint32_t)start;
    w->tok_end[w->n_tok] = (uint32_t)end;
    w->tok_p[w->n_tok++] = p;
}

static void cb_on_token(void *ud, int32_t token, int is_eog)
{
    worker *w = ud;
    /* its probability under the raw model (the row it was sampled from), for the heat-map */
    const float *row = engine_token_logits(w->e);
    if (row) {
        token_logprob tl;
        logprob_token(row, engine_model(w->e)->hp.n_vocab, token, 0, &tl);
        w->last_p = expf(tl.lp);
    }
    w->n_sampled++;
    w->last_eog = is_eog;
    if (!is_eog) {
        w->last_tok = token;
        w->last_tok_n = w->n_sampled;
    }
}

static int cb_on_text(void *ud, const char *text, size_t len, int32_t token)
{
    worker *w = ud;
    (void)token;
    if (w->stop_hit) return 2;
    add_span(w, w->raw_off, w->raw_off + len, w->last_p);
    w->raw_off += len;
    if (w->sm.n_stops > 0) {
        /* A stop string is never shown, not even its first bytes: the matcher holds back any
         * tail that could begin one. */
        size_t need = len + STOP_MAX_LEN;
        if (need > w->stop_cap) {
            char *nb = realloc(w->stop_buf, need);
            if (!nb) return 1;
            w->stop_buf = nb;
            w->stop_cap = need;
        }
        size_t n = 0;
        if (stop_push(&w->sm, text, len, w->stop_buf, &n)) w->stop_hit = 1;
        post_live(w, w->stop_buf, n);
        if (w->stop_hit) return 2;
    } else {
        post_live(w, text, len);
    }
    return atomic_load(&w->cancel) || w->limit_hit;
}

static void cb_on_prefill(void *ud, int done, int total)
{
    worker *w = ud;
    w->live.prefill_done = done;
    w->live.prefill_total = total;
    post_live(w, NULL, 0);
}

/* Between layers of a prefill chunk: only the cancel flag (cheap; no events). */
static int cb_should_abort(void *ud) { return atomic_load(&((worker *)ud)->cancel); }

static int cb_should_stop(void *ud)
{
    worker *w = ud;
    if (atomic_load(&w->cancel)) return 1;
    apply_params(w);
    post_live(w, NULL, 0);
    return w->limit_hit;
}

/* Worker thread: post the DONE event of a request. */
static void post_done(worker *w, int finish, int status, const kv_error *err, const gen_stats *final)
{
    worker_event d;
    memset(&d, 0, sizeof d);
    d.kind = WORKER_EV_DONE;
    d.finish = finish;
    d.status = status;
    if (status && err) d.err = *err;
    d.stats = w->live;
    d.stats.phase = WORKER_IDLE;
    if (final) {
        d.stats.gen = *final;
        /* the TTFT shown while the reply streamed (measured here when the first token's text
         * came) stays the reply's TTFT: a figure does not change after the reply ends */
        if (w->live.gen.ttft_ms > 0) {
            d.stats.gen.ttft_ms = w->live.gen.ttft_ms;
            d.stats.gen.prefill_ms = w->live.gen.prefill_ms;
            d.stats.gen.prefill_tps = w->live.gen.prefill_tps;
        }
    }
    kv_cache_get_stats(engine_kv(w->e), &d.stats.kv);
    d.stats.elapsed_ms = now_ms() - w->t0;
    d.seed = w->n_cand && w->cand[0].seed ? w->cand[0].seed : sampler_seed(w->s); /* best-of: the chosen sample's */
    d.keep_wanted = w->keep_wanted;
    if (w->n_cand) {
        d.cand = w->cand;
        d.n_cand = w->n_cand;
    }
    if (w->n_tok) {
        d.tok_start = w->tok_start;
        d.tok_end = w->tok_end;
        d.tok_p = w->tok_p;
        d.n_tok = w->n_tok;
    }
    if (w->n_conv > w->cap_done_conv) {
        int32_t *nc = realloc(w->done_conv, w->n_conv * sizeof *nc);
        if (nc) {
            w->done_conv = nc;
            w->cap_done_conv = w->n_conv;
        }
    }
    if (w->n_conv <= w->cap_done_conv && w->n_conv) {
        memcpy(w->done_conv, w->conv, w->n_conv * sizeof *w->conv);
        d.conv = w->done_conv;
        d.n_conv = w->n_conv;
    }
    pthread_mutex_lock(&w->mu);
    w->done = d;
    w->done_pending = 1;
    w->stats = d.stats;
    w->stats_dirty = 0;
    wake_locked(w);
    pthread_mutex_unlock(&w->mu);
}

/* Worker thread: tokenize segments into one prompt (after the conversation for append). The
 * segments are joined into one text and tokenized once (engine_tokenize_prompt), the
 * parse_special = 0 segments marked literal: the tokens are those of the whole rendered text
 * (no SentencePiece space prefix at each segment start), and no control token comes out of
 * message text. */
static int tokenize_segs(worker *w, const worker_request *r, const worker_segment *segs, size_t n_segs, int append,
                         int32_t **out, size_t *n_out, kv_error *err)
{
    size_t total = 0;
    for (size_t i = 0; i < n_segs; i++) total += segs[i].len;
    char *text = malloc(total + 1);
    unsigned char *lit = malloc(total + 1);
    if (!text || !lit) {
        free(text);
        free(lit);
        return kv_error_set(err, KV_ERR_NOMEM, "out of memory tokenizing the prompt");
    }
    size_t len = 0;
    for (size_t i = 0; i < n_segs; i++) {
        const worker_segment *sg = &segs[i];
        const char *t = sg->text;
        size_t k = sg->len;
        if (append && i == 0 && w->space_prefix && k && t[0] == ' ') t++, k--;
        if (k) memcpy(text + len, t, k);
        memset(lit + len, sg->parse_special ? 0 : 1, k);
        len += k;
    }
    int no_bos = r->no_bos || append;
    int32_t *t = NULL;
    size_t k = 0;
    int rc = KV_OK;
    if (len || !no_bos) rc = engine_tokenize_prompt(w->e, text, len, lit, no_bos, &t, &k, err);
    free(text);
    free(lit);
    if (rc) return rc;
    int32_t *all = malloc(((append ? w->n_conv : 0) + k + 1) * sizeof *all);
    if (!all) {
        free(t);
        return kv_error_set(err, KV_ERR_NOMEM, "out of memory tokenizing the prompt");
    }
    size_t n = 0;
    if (append) {
        memcpy(all, w->conv, w->n_conv * sizeof *all);
        n = w->n_conv;
    }
    if (k) memcpy(all + n, t, k * sizeof *t);
    n += k;
    free(t);
    *out = all;
    *n_out = n;
    return KV_OK;
}

static int tokenize_job(worker *w, const worker_request *r, int32_t **out, size_t *n_out, kv_error *err)
{
    return tokenize_segs(w, r, r->seg, r->n_seg, r->append && w->n_conv > 0, out, n_out, err);
}

/* Worker thread: the positions of toks[0..n) a context shift must keep for the request: those
 * it shares with keep_seg's tokens (0: no keep_seg). */
static int keep_positions(worker *w, const worker_request *r, const int32_t *toks, size_t n)
{
    if (!r->n_keep_seg) return 0;
    int32_t *k = NULL;
    size_t nk = 0;
    kv_error ignored = {0};
    if (tokenize_segs(w, r, r->keep_seg, r->n_keep_seg, 0, &k, &nk, &ignored)) return 0;
    size_t common = 0;
    while (common < nk && common < n && k[common] == toks[common]) common++;
    free(k);
    return (int)common;
}

/* Worker thread: the conversation is now the tokens the sequence holds — after a context
 * shift fewer than prompt + reply, so it is rebuilt from engine_seq_tokens, never from counts —
 * and the last token sampled (it is not in the cache yet; an end of generation never is). When
 * nothing was generated (cancelled in prefill, an error) it is the prompt. */
static void remember_conversation(worker *w, const int32_t *prompt, size_t n, int n_generated)
{
    int nh = 0;
    const int32_t *hist = engine_seq_tokens(w->e, ENGINE_SEQ_DEFAULT, &nh);
    if (n_generated <= 0 || !hist) {
        hist = prompt;
        nh = (int)n;
    }
    size_t need = (size_t)nh + 1;
    if (need > w->cap_conv) {
        int32_t *nc = realloc(w->conv, need * sizeof *nc);
        if (!nc) {
            w->n_conv = 0; /* the next append falls back to the segments alone */
            return;
        }
        w->conv = nc;
        w->cap_conv = need;
    }
    if (nh) memmove(w->conv, hist, (size_t)nh * sizeof *hist);
    w->n_conv = (size_t)nh;
    if (n_generated > 0 && !w->last_eog && w->last_tok_n == n_generated) w->conv[w->n_conv++] = w->last_tok;
}

/* Worker thread: make tokens the conversation (for append). */
static void set_conversation(worker *w, const int32_t *t, size_t n)
{
    if (n > w->cap_conv) {
        int32_t *nc = realloc(w->conv, n * sizeof *nc);
        if (!nc) {
            w->n_conv = 0;
            return;
        }
        w->conv = nc;
        w->cap_conv = n;
    }
    if (n) memcpy(w->conv, t, n * sizeof *t);
    w->n_conv = n;
}

/* Worker thread: forget the last request's candidates. */
static void free_candidates(worker *w)
{
    for (int i = 0; i < BEST_OF_MAX; i++) {
        free(w->cand_text[i]);
        free(w->cand_conv[i]);
        w->cand_text[i] = NULL;
        w->cand_conv[i] = NULL;
    }
    memset(w->cand, 0, sizeof w->cand);
    w->n_cand = 0;
}

/* Worker thread: candidate i from its tokens — text (detokenized, cut at a stop string) and
 * conversation (the prompt and the tokens but an end of generation). 0, or -1 out of memory. */
static int add_candidate(worker *w, const int32_t *prompt, size_t n, const int32_t *toks, const float *lp, int nt,
                         double score, double logprob, int finish, uint64_t seed)
{
    int i = w->n_cand;
    const tokenizer *tk = engine_tokenizer(w->e);
    int n_gen = nt;
    if (n_gen > 0 && tokenizer_is_eog(tk, toks[n_gen - 1])) n_gen--;
    size_t cap = 64 + (size_t)nt * 64, len = 0;
    char *text = malloc(cap + STOP_MAX_LEN);
    int32_t *conv = malloc((n + (size_t)nt + 1) * sizeof *conv);
    if (!text || !conv) {
        free(text);
        free(conv);
        return -1;
    }
    detok_stream ds;
    detok_stream_init(&ds);
    char piece[256];
    const char *sv[STOP_MAX_STRINGS];
    pthread_mutex_lock(&w->mu);
    for (int k = 0; k < w->n_stops; k++) sv[k] = w->stops[k];
    stop_matcher sm;
    stop_init(&sm, sv, w->n_stops);
    pthread_mutex_unlock(&w->mu);
    int stopped = 0, kept = n_gen;
    size_t raw = 0;
    for (int k = 0; k <= n_gen && !stopped; k++) {
        size_t m = k < n_gen ? detok_stream_push(&ds, tk, toks[k], piece, sizeof piece)
                             : detok_stream_flush(&ds, piece, sizeof piece);
        if (m > sizeof piece) m = sizeof piece;
        if (i == 0 && lp && m && n_gen > 0) add_span(w, raw, raw + m, expf(lp[k < n_gen ? k : n_gen - 1])); /* the heat-map */
        raw += m;
        if (len + m + STOP_MAX_LEN > cap) m = cap > len + STOP_MAX_LEN ? cap - len - STOP_MAX_LEN : 0;
        size_t out = 0;
        if (sm.n_stops > 0) {
            if (stop_push(&sm, piece, m, text + len, &out)) {
                stopped = 1;
                kept = k + 1; /* the stop string's tokens stay in the conversation, as in a streamed reply */
            }
        } else {
            memcpy(text + len, piece, m);
            out = m;
        }
        len += out;
    }
    if (!stopped && sm.n_stops > 0) len += stop_flush(&sm, text + len);
    memcpy(conv, prompt, n * sizeof *conv);
    memcpy(conv + n, toks, (size_t)kept * sizeof *conv);
    w->cand_text[i] = text;
    w->cand_conv[i] = conv;
    w->cand[i] = (worker_candidate){.text = text, .len = len, .conv = conv, .n_conv = n + (size_t)kept,
                                    .n_tokens = nt, .score = score, .logprob = logprob,
                                    .finish = stopped ? GEN_FINISH_STOP : finish, .seed = seed};
    w->n_cand++;
    return 0;
}

/* Worker thread: the log-probs lp[0..nt) of tokens t[0..nt) after prompt[0..n) (which seq
 * ENGINE_SEQ_DEFAULT holds), teacher-forced on a fork in batched passes of all rows' logits
 * (for a beam's heat-map). 0, or -1 (lp then unset). */
static int replay_logprobs(worker *w, const int32_t *prompt, size_t n, const int32_t *t, int nt, float *lp)
{
    enum { CHUNK = 32 };
    engine *e = w->e;
    int nv = engine_model(e)->hp.n_vocab, f, rc = 0;
    kv_error err = {0};
    if (n == 0 || nt <= 0 || engine_seq_fork(e, ENGINE_SEQ_DEFAULT, -1, &f, &err)) return -1;
    float *rows = malloc(sizeof(float) * (size_t)nv * CHUNK);
    int32_t in[CHUNK];
    engine_seq_truncate(e, f, (int)n - 1);
    for (int i = 0; rows && !rc && i < nt; i += CHUNK) {
        int m = nt - i < CHUNK ? nt - i : CHUNK;
        for (int k = 0; k < m; k++) in[k] = i + k == 0 ? prompt[n - 1] : t[i + k - 1];
        if (engine_forward(e, f, in, m, rows, 1, &err)) rc = -1;
        for (int k = 0; !rc && k < m; k++) {
            token_logprob tl;
            logprob_token(rows + (size_t)k * nv, nv, t[i + k], 0, &tl);
            lp[i + k] = tl.lp;
        }
    }
    if (!rows) rc = -1;
    free(rows);
    engine_seq_free(e, f);
    return rc;
}

/* Worker thread: a best_of / beams request on the prompt toks[0..n): the candidates, the best
 * one's text posted, the conversation made the best one's. */
static int run_candidates(worker *w, const worker_request *r, const int32_t *toks, size_t n, gen_stats *st,
                          int *finish, kv_error *err)
{
    int lim = atomic_load(&w->limit);
    int n_predict = lim >= 0 ? lim : engine_n_ctx(w->e) - (int)n;
    if (n_predict < 1) n_predict = 1;
    int rc;
    memset(st, 0, sizeof *st);
    if (r->beams > 1) {
        beam_result br;
        rc = engine_beam_search(w->e, ENGINE_SEQ_DEFAULT, toks, (int)n, r->beams, r->length_penalty, n_predict, &br, st,
                                err);
        if (rc) return rc;
        float *lp = br.n_tokens > 0 ? malloc(sizeof(float) * (size_t)br.n_tokens) : NULL;
        if (lp && replay_logprobs(w, toks, n, br.tokens, br.n_tokens, lp)) {
            free(lp); /* no heat-map for it then */
            lp = NULL;
        }
        int ar = add_candidate(w, toks, n, br.tokens, lp, br.n_tokens, br.score, br.logprob, br.finish, 0);
        free(lp);
        if (ar)
            rc = kv_error_set(err, KV_ERR_NOMEM, "out of memory for the beam's text");
        beam_result_free(&br);
    } else {
        gen_candidate c[BEST_OF_MAX];
        gen_callbacks cb = {.should_stop = cb_should_stop, .ud = w};
        int nb = r->best_of > BEST_OF_MAX ? BEST_OF_MAX : r->best_of;
        rc = engine_best_of(w->e, ENGINE_SEQ_DEFAULT, w->s, toks, n, nb, n_predict, 0, &cb, c, st, err);
        if (rc) return rc;
        for (int i = 0; i < nb && !rc; i++) {
            double sum = 0;
            for (int k = 0; k < c[i].n; k++) sum += c[i].lp[k];
            int f = c[i].finish == GEN_FINISH_CANCELLED && w->limit_hit && !atomic_load(&w->cancel) ? GEN_FINISH_LENGTH
                                                                                                    : c[i].finish;
            if (add_candidate(w, toks, n, c[i].tokens, c[i].lp, c[i].n, c[i].mean_lp, sum, f, c[i].seed))
                rc = kv_error_set(err, KV_ERR_NOMEM, "out of memory for the samples' text");
        }
        gen_candidates_free(c, nb);
    }
    if (rc) return rc;
    const worker_candidate *best = &w->cand[0];
    *finish = best->finish;
    st->n_prompt = (int)n;
    w->n_sampled = best->n_tokens;
    if (best->len) post_live(w, best->text, best->len);
    set_conversation(w, best->conv, best->n_conv);
    return KV_OK;
}

static void run_job(worker *w, const worker_request *r)
{
    kv_error err = {0};
    pthread_mutex_lock(&w->mu);
    worker_hooks hooks = w->hooks;
    pthread_mutex_unlock(&w->mu);
    w->t0 = now_ms();
    memset(&w->live, 0, sizeof w->live);
    w->n_gen = 0;
    w->n_sampled = 0;
    w->last_eog = 0;
    w->stop_hit = 0;
    w->limit_hit = 0;
    pthread_mutex_lock(&w->mu);
    {
        const char *sv[STOP_MAX_STRINGS];
        for (int i = 0; i < w->n_stops; i++) sv[i] = w->stops[i];
        stop_init(&w->sm, sv, w->n_stops);
    }
    pthread_mutex_unlock(&w->mu);
    w->itl_sum = 0;
    w->n_prompt = 0;
    w->keep_wanted = 0;
    free_candidates(w);
    w->n_tok = 0;
    w->raw_off = 0;
    w->last_p = 1.0f;
    apply_params(w);
    if (r->reset_cache) {
        engine_reset(w->e);
        w->n_conv = 0;
    }
    if (r->set_conv) {
        set_conversation(w, r->conv, r->n_conv);
        if (hooks.restore && w->n_conv) hooks.restore(hooks.ud, w->e, w->conv, w->n_conv);
    }
    if (r->n_seg == 0 && !(r->append && w->n_conv > 0)) { /* only a reset */
        post_done(w, GEN_FINISH_NONE, KV_OK, NULL, NULL);
        return;
    }
    w->live.phase = WORKER_TOKENIZE;
    int32_t *toks = NULL;
    size_t n = 0;
    int rc = tokenize_job(w, r, &toks, &n, &err);
    if (rc) {
        post_done(w, GEN_FINISH_ERROR, rc, &err, NULL);
        return;
    }
    if (atomic_load(&w->cancel)) {
        free(toks);
        post_done(w, GEN_FINISH_CANCELLED, KV_OK, NULL, NULL);
        return;
    }
    if (hooks.restore) hooks.restore(hooks.ud, w->e, toks, n);
    /* The engine reuses the longest cached prefix (at least one token is always fed): the
     * same rule here tells the UI "reused vs prefilled" before the first token. */
    int n_hist = 0;
    const int32_t *hist = engine_history(w->e, &n_hist);
    int common = 0;
    while (common < n_hist && (size_t)common + 1 < n && hist[common] == toks[common]) common++;
    w->n_prompt = (int)n;
    w->live.phase = WORKER_PREFILL;
    w->live.gen.n_prompt = (int)n;
    w->live.gen.n_reused = common;
    w->live.gen.n_prefilled = (int)n - common;
    post_live(w, NULL, 0);

    sampler_reset(w->s);
    gen_callbacks cb = {.on_text = cb_on_text, .should_stop = cb_should_stop, .ud = w, .on_token = cb_on_token,
                        .on_prefill = cb_on_prefill, .prefill_slice_ms = WORKER_PREFILL_SLICE_MS,
                        .should_abort = cb_should_abort};
    gen_stats st;
    int finish = GEN_FINISH_NONE;
    /* The token limit is enforced here (it may change mid-reply): the engine stops at the
     * same token as it would with n_predict, reporting a cancel we turn back into LENGTH. With a
     * limit the engine's cap of one context's worth is off (-c 64 -n 300 shifts and gives 300). */
    w->last_tok_n = 0;
    gen_opts go;
    engine_default_opts(w->e, &go);
    go.no_length_cap = atomic_load(&w->limit) >= 0;
    w->keep_wanted = keep_positions(w, r, toks, n);
    if (w->keep_wanted > go.n_keep) go.n_keep = w->keep_wanted;
    pthread_mutex_lock(&w->mu);
    spec_params spec = w->spec;
    pthread_mutex_unlock(&w->mu);
    if (spec.mode != SPEC_OFF) go.spec = &spec;
    if (r->best_of > 1 || r->beams > 1) {
        rc = run_candidates(w, r, toks, n, &st, &finish, &err);
        if (rc) remember_conversation(w, toks, n, 0);
        free(toks);
        if (rc) post_done(w, GEN_FINISH_ERROR, rc, &err, &st);
        else post_done(w, finish, KV_OK, NULL, &st);
        if (hooks.saved) hooks.saved(hooks.ud, w->e, w->conv, w->n_conv, rc ? GEN_FINISH_ERROR : finish);
        return;
    }
    rc = engine_generate_seq(w->e, ENGINE_SEQ_DEFAULT, toks, n, &go, w->s, &cb, &st, &finish, &err);
    remember_conversation(w, toks, n, st.n_generated);
    free(toks);
    if (!rc && finish == GEN_FINISH_CANCELLED && w->limit_hit && !atomic_load(&w->cancel)) finish = GEN_FINISH_LENGTH;
    if (!rc && w->stop_hit) finish = GEN_FINISH_STOP;
    if (!w->stop_hit) { /* release what the matcher held back */
        char tail[STOP_MAX_LEN];
        size_t nt = stop_flush(&w->sm, tail);
        if (nt) post_live(w, tail, nt);
    }
    if (rc) post_done(w, GEN_FINISH_ERROR, rc, &err, &st);
    else post_done(w, finish, KV_OK, NULL, &st);
    if (hooks.saved) hooks.saved(hooks.ud, w->e, w->conv, w->n_conv, rc ? GEN_FINISH_ERROR : finish);
}

static void *thread_main(void *arg)
{
    worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->quit && !w->has_job) pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit) break;
        worker_request r = w->job;
        w->has_job = 0;
        pthread_mutex_unlock(&w->mu);
        run_job(w, &r);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int worker_create(engine *e, sampler *s, worker **out, kv_error *err)
{
    *out = NULL;
    worker *w = calloc(1, sizeof *w);
    if (!w) return kv_error_set(err, KV_ERR_NOMEM, "out of memory creating the generator thread");
    w->e = e;
    w->s = s;
    w->wake_rd = w->wake_wr = -1;
    w->params = *sampler_get_params(s);
    atomic_init(&w->cancel, 0);
    atomic_init(&w->params_dirty, 0);
    atomic_init(&w->limit, -1);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC)) {
        int e2 = errno;
        worker_destroy(w);
        return kv_error_set(err, KV_ERR_IO, "generator thread: cannot create its wake-up pipe: %s", strerror(e2));
    }
    w->wake_rd = fds[0];
    w->wake_wr = fds[1];
    /* Does the tokenizer put a space in front of a text (SentencePiece's add_space_prefix)? */
    int32_t *t = NULL;
    size_t nt = 0;
    kv_error ignored = {0};
    if (engine_tokenize(e, "a", 1, 1, 0, &t, &nt, &ignored) == KV_OK && nt > 0) {
        char piece[64];
        size_t pl = tokenizer_token_to_piece(engine_tokenizer(e), t[0], 0, piece, sizeof piece);
        w->space_prefix = pl > 0 && pl <= sizeof piece && piece[0] == ' ';
    }
    free(t);
    /* Signals go to the UI thread, whose handlers restore the terminal. */
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGABRT);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&w->thread, NULL, thread_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        worker_destroy(w);
        return kv_error_set(err, KV_ERR_IO, "cannot start the generator thread: %s", strerror(rc));
    }
    w->thread_started = 1;
    *out = w;
    return KV_OK;
}

void worker_destroy(worker *w)
{
    if (!w) return;
    if (w->thread_started) {
        pthread_mutex_lock(&w->mu);
        w->quit = 1;
        atomic_store(&w->cancel, 1);
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    if (w->wake_rd >= 0) close(w->wake_rd);
    if (w->wake_wr >= 0) close(w->wake_wr);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->job_seg);
    free(w->job_text);
    free(w->job_conv);
    free(w->done_conv);
    free_candidates(w);
    free(w->tok_start);
    free(w->tok_end);
    free(w->tok_p);
    free(w->text);
    free(w->stop_buf);
    free(w->ui_text);
    free(w->conv);
    free(w);
}

int worker_fd(const worker *w) { return w->wake_rd; }

int worker_busy(worker *w)
{
    pthread_mutex_lock(&w->mu);
    int b = w->busy;
    pthread_mutex_unlock(&w->mu);
    return b;
}

int worker_submit(worker *w, const worker_request *r, kv_error *err)
{
    size_t total = 0, n_all = r->n_seg + r->n_keep_seg;
    for (size_t i = 0; i < r->n_seg; i++) total += r->seg[i].len;
    for (size_t i = 0; i < r->n_keep_seg; i++) total += r->keep_seg[i].len;
    pthread_mutex_lock(&w->mu);
    if (w->busy) {
        pthread_mutex_unlock(&w->mu);
        return kv_error_set(err, KV_ERR_INVALID, "a reply is still being generated");
    }
    worker_segment *seg = malloc((n_all ? n_all : 1) * sizeof *seg);
    char *text = malloc(total ? total : 1);
    size_t n_conv = r->set_conv ? r->n_conv : 0;
    int32_t *conv = malloc((n_conv ? n_conv : 1) * sizeof *conv);
    if (!seg || !text || !conv) {
        pthread_mutex_unlock(&w->mu);
        free(seg);
        free(text);
        free(conv);
        return kv_error_set(err, KV_ERR_NOMEM, "out of memory queueing a request");
    }
    if (n_conv) memcpy(conv, r->conv, n_conv * sizeof *conv);
    size_t o = 0;
    for (size_t i = 0; i < n_all; i++) { /* the prompt's segments, then keep_seg's */
        const worker_segment *sg = i < r->n_seg ? &r->seg[i] : &r->keep_seg[i - r->n_seg];
        if (sg->len) memcpy(text + o, sg->text, sg->len);
        seg[i] = (worker_segment){text + o, sg->len, sg->parse_special};
        o += sg->len;
    }
    free(w->job_seg);
    free(w->job_text);
    w->job_seg = seg;
    w->job_text = text;
    free(w->job_conv);
    w->job_conv = conv;
    w->job = *r;
    w->job.seg = seg;
    w->job.keep_seg = seg + r->n_seg;
    w->job.conv = conv;
    w->job.n_conv = n_conv;
    w->has_job = 1;
    w->busy = 1;
    atomic_store(&w->cancel, 0);
    atomic_store(&w->limit, r->n_predict);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return KV_OK;
}

void worker_cancel(worker *w)
{
    pthread_mutex_lock(&w->mu);
    if (w->busy) atomic_store(&w->cancel, 1);
    pthread_mutex_unlock(&w->mu);
}

void worker_set_n_predict(worker *w, int n_predict) { atomic_store(&w->limit, n_predict); }

void worker_set_hooks(worker *w, const worker_hooks *h)
{
    pthread_mutex_lock(&w->mu);
    if (h) w->hooks = *h;
    else memset(&w->hooks, 0, sizeof w->hooks);
    pthread_mutex_unlock(&w->mu);
}

int worker_set_stops(worker *w, const char *const *stops, int n)
{
    if (n < 0 || n > STOP_MAX_STRINGS) return -1;
    for (int i = 0; i < n; i++)
        if (!stops[i] || strlen(stops[i]) >= STOP_MAX_LEN) return -1;
    pthread_mutex_lock(&w->mu);
    w->n_stops = 0;
    for (int i = 0; i < n; i++) {
        if (!*stops[i]) continue;
        strcpy(w->stops[w->n_stops++], stops[i]);
    }
    pthread_mutex_unlock(&w->mu);
    return 0;
}

void worker_set_spec(worker *w, const spec_params *p)
{
    pthread_mutex_lock(&w->mu);
    if (p) w->spec = *p;
    else w->spec.mode = SPEC_OFF;
    pthread_mutex_unlock(&w->mu);
}

void worker_set_params(worker *w, const sampler_params *p)
{
    pthread_mutex_lock(&w->mu);
    w->params = *p;
    atomic_store(&w->params_dirty, 1);
    pthread_mutex_unlock(&w->mu);
}

int worker_next_event(worker *w, worker_event *ev)
{
    memset(ev, 0, sizeof *ev);
    pthread_mutex_lock(&w->mu);
    if (w->text_len) {
        /* Hand the filled buffer to the caller and keep the other one for the worker. */
        char *t = w->ui_text;
        size_t tc = w->ui_text_cap;
        w->ui_text = w->text;
        w->ui_text_cap = w->text_cap;
        ev->kind = WORKER_EV_TEXT;
        ev->text = w->ui_text;
        ev->len = w->text_len;
        w->text = t;
        w->text_cap = tc;
        w->text_len = 0;
    } else if (w->stats_dirty) {
        ev->kind = WORKER_EV_STATS;
        ev->stats = w->stats;
        w->stats_dirty = 0;
    } else if (w->done_pending) {
        *ev = w->done;
        w->done_pending = 0;
        w->busy = 0;
    } else {
        char buf[64];
        while (read(w->wake_rd, buf, sizeof buf) > 0) {}
        w->signaled = 0;
    }
    pthread_mutex_unlock(&w->mu);
    return ev->kind != WORKER_EV_NONE;
}
