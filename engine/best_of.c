/* best_of: best-of-N sampling on forks of one prefill, decoded together, ranked by mean log-probability. */
#include "best_of.h"

#include <stdlib.h>
#include <string.h>

#include "gen_batch.h"
#include "model.h"

typedef struct collect {
    engine *e;
    gen_candidate *d;
    size_t cap;
    int top_n;        /* > 0: keep each token's alternatives too (d->tlp) */
    gen_stream *gs;   /* the sample's stream: the logits its token came from */
    const gen_callbacks *user;
} collect;

static void on_tok(void *ud, int32_t tok, int eog)
{
    (void)eog;
    collect *c = ud;
    if ((size_t)c->d->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 64;
        int32_t *nt = realloc(c->d->tokens, nc * sizeof *nt);
        if (nt) c->d->tokens = nt;
        float *nl = realloc(c->d->lp, nc * sizeof *nl);
        if (nl) c->d->lp = nl;
        token_logprob *ntl = c->top_n > 0 ? realloc(c->d->tlp, nc * sizeof *ntl) : NULL;
        if (ntl) c->d->tlp = ntl;
        if (!nt || !nl || (c->top_n > 0 && !ntl)) return;
        c->cap = nc;
    }
    token_logprob tl;
    const float *l = c->gs ? gen_stream_logits(c->gs) : engine_token_logits(c->e);
    logprob_token(l, engine_model(c->e)->hp.n_vocab, tok, c->top_n, &tl);
    if (c->top_n > 0) c->d->tlp[c->d->n] = tl;
    c->d->tokens[c->d->n] = tok;
    c->d->lp[c->d->n++] = tl.lp;
}

static int should_stop(void *ud)
{
    const collect *c = ud;
    return c->user && c->user->should_stop ? c->user->should_stop(c->user->ud) : 0;
}

void gen_candidates_free(gen_candidate *c, int n)
{
    for (int i = 0; c && i < n; i++) {
        free(c[i].tokens);
        free(c[i].lp);
        free(c[i].tlp);
        memset(&c[i], 0, sizeof c[i]);
    }
}

static int by_mean(const void *a, const void *b)
{
    const gen_candidate *x = a, *y = b;
    if (x->mean_lp != y->mean_lp) return x->mean_lp > y->mean_lp ? -1 : 1;
    return x->seed < y->seed ? -1 : x->seed > y->seed;
}

void gen_candidates_rank(gen_candidate *c, int n)
{
    if (c && n > 1) qsort(c, (size_t)n, sizeof *c, by_mean);
}

int engine_best_of(engine *e, int seq, sampler *s, const int32_t *prompt, size_t n_prompt, int n, int n_predict,
                   int top_n, const gen_callbacks *ucb, gen_candidate *out, gen_stats *st, kv_error *err)
{
    if (n < 1 || n > BEST_OF_MAX) return kv_error_set(err, KV_ERR_INVALID, "best-of: %d samples (1 to %d)", n, BEST_OF_MAX);
    memset(out, 0, sizeof *out * (size_t)n);
    if (n_prompt == 0) return kv_error_set(err, KV_ERR_INVALID, "best-of: the prompt is empty");
    /* one prefill: the prompt but its last token; each sample's fork feeds that token itself */
    gen_stats pst;
    int rc = n_prompt > 1 ? engine_prefill_seq(e, seq, prompt, n_prompt - 1, NULL, &pst, err) : KV_OK;
    if (rc) return rc;
    sampler_params sp = *sampler_get_params(s);
    uint64_t seed0 = sampler_seed(s);
    gen_opts go;
    engine_default_opts(e, &go);
    go.n_predict = n_predict;
    go.no_context_shift = 1; /* batched streams do not shift */
    sampler *smp[BEST_OF_MAX] = {0};
    gen_stream *gs[BEST_OF_MAX] = {0};
    collect col[BEST_OF_MAX];
    gen_callbacks cb[BEST_OF_MAX];
    int forks[BEST_OF_MAX], n_forks = 0;
    gen_batch *b = gen_batch_create(e, n, err);
    if (!b) return err && err->code ? err->code : KV_ERR_NOMEM;
    /* the samples decode together: one batched forward pass per step over every sample's token */
    for (int i = 0; i < n && !rc; i++) {
        if ((rc = engine_seq_fork(e, seq, -1, &forks[i], err))) break;
        n_forks++;
        sp.seed = seed0 + (uint64_t)i == SAMPLER_SEED_RANDOM ? 0 : seed0 + (uint64_t)i;
        if (!(smp[i] = sampler_create(engine_model(e)->hp.n_vocab, &sp, err))) {
            rc = err && err->code ? err->code : KV_ERR_NOMEM;
            break;
        }
        out[i].seed = sampler_seed(smp[i]);
        col[i] = (collect){.e = e, .d = &out[i], .top_n = top_n, .user = ucb};
        cb[i] = (gen_callbacks){.on_token = on_tok, .should_stop = ucb && ucb->should_stop ? should_stop : NULL,
                                .ud = &col[i]};
        rc = gen_stream_begin(e, forks[i], prompt, n_prompt, &go, smp[i], &cb[i], 0, &gs[i], err);
        col[i].gs = gs[i];
    }
    while (!rc) {
        int r = gen_batch_step(b, gs, n, 0, err);
        if (r < 0) rc = err && err->code ? err->code : KV_ERR_INVALID;
        if (r <= 0) break;
    }
    for (int i = 0; i < n && !rc; i++) {
        gen_stream_done(gs[i], &out[i].finish);
        double sum = 0;
        for (int k = 0; k < out[i].n; k++) sum += out[i].lp[k];
        out[i].mean_lp = out[i].n ? sum / out[i].n : -1e30;
        const gen_stats *one = gen_stream_stats(gs[i]);
        if (st) {
            if (i == 0) *st = *one;
            else {
                st->n_generated += one->n_generated;
                if (one->decode_ms > st->decode_ms) st->decode_ms = one->decode_ms;
            }
        }
    }
    if (st && !rc) st->decode_tps = st->decode_ms > 0 ? (st->n_generated - n) / (st->decode_ms / 1e3) : 0;
    for (int i = 0; i < n; i++) {
        gen_stream_free(gs[i]);
        sampler_free(smp[i]);
    }
    for (int i = 0; i < n_forks; i++) engine_seq_free(e, forks[i]);
    gen_batch_free(b);
    if (rc) {
        gen_candidates_free(out, n);
        return rc;
    }
    gen_candidates_rank(out, n);
    return KV_OK;
}
