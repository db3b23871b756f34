/* gen_batch: the continuous-batching scheduler's engine side — per-stream prefix reuse, prefill chunks and sampling around one model_forward_batch per step. */
#include "gen_batch.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch.h"
#include "kv_cache.h"
#include "tokenizer.h"

#define MIN_N_KEEP 4          /* as generate.c */
#define DEFAULT_BUDGET 32     /* prefill tokens per step while others decode */

enum { ST_PREFILL = 0, ST_DECODE, ST_DONE };

struct gen_stream {
    engine *e;
    int seq;
    int32_t *prompt;
    int n_prompt;          /* after truncation */
    int reuse_max;         /* n_prompt - 1 (a token is always fed for logits), or n_prompt */
    int n_fed;             /* prompt tokens in the sequence */
    int prefill_only;
    gen_opts o;
    sampler *s;
    gen_callbacks cb;
    int state, finish;
    int32_t pending;       /* ST_DECODE: the sampled token to feed next */
    int row;               /* this step's logits row, or -1 */
    int n_in_step;         /* tokens this step */
    detok_stream ds;
    char *text;
    size_t text_cap;
    const float *logits;   /* the row the last token was sampled from */
    gen_stats st;
    double t0, t_prev, t_first, itl_sum;
};

struct gen_batch {
    engine *e;
    int max_streams, n_vocab;
    kv_batch kb;
    float *logits; /* [max_streams][n_vocab] */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Adopt every cached full block that continues the sequence's prompt (another stream may have
 * committed it since the last look). */
static void adopt(gen_stream *gs)
{
    kv_cache *kv = engine_kv(gs->e);
    if (gs->n_fed >= gs->reuse_max) return;
    int got = kv_seq_adopt(kv, gs->seq, gs->prompt, gs->reuse_max, NULL);
    if (got <= 0) return;
    gs->n_fed += got;
    gs->st.n_reused += got;
    gs->st.n_reused_hash += got;
    gs->st.n_prefilled -= got;
}

int gen_stream_begin(engine *e, int seq, const int32_t *prompt, size_t n_prompt, const gen_opts *o, sampler *s,
                     const gen_callbacks *cb, int prefill_only, gen_stream **out, kv_error *err)
{
    *out = NULL;
    kv_cache *kv = engine_kv(e);
    int n_ctx = engine_n_ctx(e);
    if (!kv_seq_valid(kv, seq)) return kv_error_set(err, KV_ERR_INVALID, "no KV sequence %d", seq);
    if (n_prompt == 0) return kv_error_set(err, KV_ERR_INVALID, "the prompt is empty");
    gen_stream *gs = calloc(1, sizeof *gs);
    if (!gs) return kv_error_set(err, KV_ERR_NOMEM, "out of memory for a generation stream");
    gs->e = e;
    gs->seq = seq;
    gs->s = s;
    gs->prefill_only = prefill_only;
    gs->row = -1;
    if (o) gs->o = *o;
    else gs->o.n_predict = -1;
    if (cb) gs->cb = *cb;
    int n_keep = gs->o.n_keep < MIN_N_KEEP ? MIN_N_KEEP : gs->o.n_keep;
    if (n_keep > n_ctx * 3 / 4) n_keep = n_ctx * 3 / 4;
    gs->st.n_keep = n_keep;
    int n = (int)n_prompt, limit = prefill_only ? n_ctx + 1 : n_ctx;
    if (n_prompt >= (size_t)limit) {
        if (!gs->o.truncate_prompt) {
            free(gs);
            return kv_error_set(err, KV_ERR_CONTEXT,
                                "the prompt is %zu tokens but the context holds %d; shorten it or raise -c", n_prompt,
                                n_ctx);
        }
        n = n_keep + (n_ctx - n_keep) / 2;
    }
    gs->text_cap = 64 + 3 * tokenizer_max_piece_len(engine_tokenizer(e));
    if (!(gs->prompt = malloc(sizeof(int32_t) * (size_t)n)) || !(gs->text = malloc(gs->text_cap))) {
        gen_stream_free(gs);
        return kv_error_set(err, KV_ERR_NOMEM, "out of memory for a generation stream");
    }
    if (n < (int)n_prompt) { /* keep the start (system prompt / sinks) and the most recent tokens */
        memcpy(gs->prompt, prompt, sizeof(int32_t) * (size_t)n_keep);
        memcpy(gs->prompt + n_keep, prompt + n_prompt - (n - n_keep), sizeof(int32_t) * (size_t)(n - n_keep));
        gs->st.n_truncated = (int)n_prompt - n;
    } else {
        memcpy(gs->prompt, prompt, sizeof(int32_t) * (size_t)n);
    }
    gs->n_prompt = n;
    gs->reuse_max = prefill_only ? n : n - 1;
    gs->t0 = now_ms();
    /* the sequence's own common prefix, then cached blocks by hash */
    int n_have = kv_seq_n_tokens(kv, seq), common = 0;
    const int32_t *have = kv_seq_tokens(kv, seq);
    while (common < n_have && common < gs->reuse_max && have[common] == gs->prompt[common]) common++;
    kv_seq_truncate(kv, seq, common);
    common = kv_seq_n_tokens(kv, seq); /* fewer when sliding-window layers freed that window */
    gs->n_fed = common;
    gs->st.n_prompt = (int)n_prompt;
    gs->st.n_reused = common;
    gs->st.n_prefilled = n - common;
    adopt(gs);
    kv_cache_note_request(kv, seq, n, gs->st.n_reused, gs->st.n_reused_hash, n - gs->st.n_reused);
    detok_stream_init(&gs->ds);
    gs->state = ST_PREFILL;
    gs->finish = GEN_FINISH_NONE;
    if (gs->cb.on_prefill) gs->cb.on_prefill(gs->cb.ud, gs->n_fed, n);
    if (prefill_only && gs->n_fed == n) gs->state = ST_DONE;
    *out = gs;
    return KV_OK;
}

void gen_stream_free(gen_stream *gs)
{
    if (!gs) return;
    free(gs->prompt);
    free(gs->text);
    free(gs);
}

int gen_stream_done(const gen_stream *gs, int *finish)
{
    if (finish) *finish = gs->finish;
    return gs->state == ST_DONE;
}

int gen_stream_seq(const gen_stream *gs) { return gs->seq; }
const gen_stats *gen_stream_stats(const gen_stream *gs) { return &gs->st; }
const float *gen_stream_logits(const gen_stream *gs) { return gs->logits; }

gen_batch *gen_batch_create(engine *e, int max_streams, kv_error *err)
{
    if (max_streams < 1) {
        kv_error_set(err, KV_ERR_INVALID, "batch: %d streams", max_streams);
        return NULL;
    }
    gen_batch *b = calloc(1, sizeof *b);
    if (!b) goto nomem;
    b->e = e;
    b->max_streams = max_streams;
    b->n_vocab = engine_model(e)->hp.n_vocab;
    if (kv_batch_init(&b->kb, forward_ctx_n_batch(engine_forward_ctx(e)), err)) {
        free(b);
        return NULL;
    }
    if (!(b->logits = malloc(sizeof(float) * (size_t)max_streams * b->n_vocab))) goto nomem;
    return b;
nomem:
    gen_batch_free(b);
    kv_error_set(err, KV_ERR_NOMEM, "out of memory for a batch of %d streams", max_streams);
    return NULL;
}

void gen_batch_free(gen_batch *b)
{
    if (!b) return;
    kv_batch_free(&b->kb);
    free(b->logits);
    free(b);
}

static void finish_stream(gen_stream *gs, int fin)
{
    if (gs->state == ST_DONE) return;
    gs->state = ST_DONE;
    gs->finish = fin;
    if (fin == GEN_FINISH_ERROR || gs->prefill_only) return;
    size_t nt = detok_stream_flush(&gs->ds, gs->text, gs->text_cap);
    if (nt && gs->cb.on_text) gs->cb.on_text(gs->cb.ud, gs->text, nt < gs->text_cap ? nt : gs->text_cap, -1);
    gen_stats *st = &gs->st;
    if (st->n_generated > 1) {
        st->decode_ms = gs->t_prev - gs->t_first;
        st->itl_ms_mean = gs->itl_sum / (st->n_generated - 1);
        st->decode_tps = st->decode_ms > 0 ? (st->n_generated - 1) / (st->decode_ms / 1e3) : 0;
    }
}

/* The stream got logits: sample, report, and decide whether it goes on (as engine_generate_seq). */
static void after_logits(gen_stream *gs, const float *logits, int n_ctx)
{
    gen_stats *st = &gs->st;
    kv_error err = {0};
    int32_t tok;
    gs->logits = logits;
    if (sampler_sample(gs->s, logits, &tok, &err)) {
        finish_stream(gs, GEN_FINISH_ERROR);
        return;
    }
    double t = now_ms();
    st->n_generated++;
    if (st->n_generated == 1) {
        st->ttft_ms = t - gs->t0;
        gs->t_first = t;
    } else {
        double gap = t - gs->t_prev;
        gs->itl_sum += gap;
        if (gap > st->itl_ms_max) st->itl_ms_max = gap;
    }
    gs->t_prev = t;
    sampler_accept(gs->s, tok);
    const tokenizer *tk = engine_tokenizer(gs->e);
    int eog = tokenizer_is_eog(tk, tok);
    if (gs->cb.on_token) gs->cb.on_token(gs->cb.ud, tok, eog);
    if (eog) return finish_stream(gs, GEN_FINISH_EOG);
    size_t n = detok_stream_push(&gs->ds, tk, tok, gs->text, gs->text_cap);
    if (n > gs->text_cap) n = gs->text_cap;
    int stop = n && gs->cb.on_text ? gs->cb.on_text(gs->cb.ud, gs->text, n, tok) : 0;
    if (stop) return finish_stream(gs, stop == 2 ? GEN_FINISH_STOP : GEN_FINISH_CANCELLED);
    if (gs->o.n_predict >= 0 && st->n_generated >= gs->o.n_predict) return finish_stream(gs, GEN_FINISH_LENGTH);
    if (gs->o.n_predict < 0 && !gs->o.no_length_cap && st->n_generated >= n_ctx)
        return finish_stream(gs, GEN_FINISH_CONTEXT);
    if (kv_seq_n_tokens(engine_kv(gs->e), gs->seq) >= n_ctx) {
        /* full: shift as engine_generate_seq does (keep n_keep, drop half of the rest) before the
         * token is fed; a model that cannot shift ends the stream as a full context */
        kv_error e2 = {0};
        if (gs->o.no_context_shift || engine_seq_shift(gs->e, gs->seq, st->n_keep, st, &e2))
            return finish_stream(gs, GEN_FINISH_CONTEXT);
    }
    gs->state = ST_DECODE;
    gs->pending = tok;
}

/* Blocks for the stream's next k positions before it joins the batch, so a full block budget
 * ends that stream (GEN_FINISH_CONTEXT, as a full context does) rather than the whole step. */
static int reserve(kv_cache *kv, gen_stream *gs, int k)
{
    kv_error e2 = {0};
    if (kv_seq_reserve(kv, gs->seq, k, &e2) == KV_OK) return 1;
    finish_stream(gs, GEN_FINISH_CONTEXT);
    return 0;
}

int gen_batch_step(gen_batch *b, gen_stream **streams, int n, int budget, kv_error *err)
{
    engine *e = b->e;
    kv_cache *kv = engine_kv(e);
    int n_ctx = engine_n_ctx(e);
    if (n > b->max_streams) {
        kv_error_set(err, KV_ERR_INVALID, "batch step: %d streams, room for %d", n, b->max_streams);
        return -1;
    }
    if (budget <= 0) budget = DEFAULT_BUDGET;
    kv_batch_clear(&b->kb);
    int n_decode = 0;
    for (int i = 0; i < n; i++) {
        gen_stream *gs = streams[i];
        gs->row = -1;
        gs->n_in_step = 0;
        if (gs->state == ST_DONE) continue;
        if (gs->cb.should_stop && gs->cb.should_stop(gs->cb.ud)) {
            finish_stream(gs, GEN_FINISH_CANCELLED);
            continue;
        }
        if (gs->state == ST_DECODE) {
            if (b->kb.n == b->kb.cap || !reserve(kv, gs, 1)) continue; /* full: it waits a step */
            gs->row = kv_batch_add(&b->kb, gs->pending, gs->seq, 1);
            gs->n_in_step = 1;
            n_decode++;
        }
    }
    /* prefill chunks, in the order the streams were given, within the budget */
    int room = b->kb.cap - b->kb.n;
    if (n_decode && budget < room) room = budget;
    for (int i = 0; i < n && room > 0; i++) {
        gen_stream *gs = streams[i];
        if (gs->state != ST_PREFILL) continue;
        adopt(gs);
        int left = gs->n_prompt - gs->n_fed;
        if (gs->prefill_only && left == 0) {
            finish_stream(gs, GEN_FINISH_NONE);
            continue;
        }
        int k = left < room ? left : room;
        if (!reserve(kv, gs, k)) continue;
        for (int j = 0; j < k; j++) {
            int last = gs->n_fed + j == gs->n_prompt - 1;
            int r = kv_batch_add(&b->kb, gs->prompt[gs->n_fed + j], gs->seq, last && !gs->prefill_only);
            if (r >= 0) gs->row = r;
        }
        gs->n_in_step = k;
        room -= k;
    }
    if (b->kb.n == 0) return 0;
    int rc = kv_batch_run(engine_model(e), engine_forward_ctx(e), kv, engine_pool(e), &b->kb, b->logits, err);
    if (rc) {
        for (int i = 0; i < n; i++)
            if (streams[i]->n_in_step) finish_stream(streams[i], GEN_FINISH_ERROR);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        gen_stream *gs = streams[i];
        if (!gs->n_in_step) continue;
        if (gs->state == ST_PREFILL) {
            gs->n_fed += gs->n_in_step;
            if (gs->cb.on_prefill) gs->cb.on_prefill(gs->cb.ud, gs->n_fed, gs->n_prompt);
            if (gs->n_fed < gs->n_prompt) continue;
            double t = now_ms();
            gs->st.prefill_ms = t - gs->t0;
            gs->st.prefill_tps = gs->st.prefill_ms > 0 ? gs->st.n_prefilled / (gs->st.prefill_ms / 1e3) : 0;
            if (gs->prefill_only) {
                finish_stream(gs, GEN_FINISH_NONE);
                continue;
            }
            for (int j = 0; j < gs->n_prompt; j++) sampler_accept(gs->s, gs->prompt[j]);
        }
        if (gs->row >= 0) after_logits(gs, b->logits + (size_t)gs->row * b->n_vocab, n_ctx);
    }
    return b->kb.n;
}
