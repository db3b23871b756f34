/* beam: beam search on forked sequences of the paged KV cache. */
#include "beam.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch.h"
#include "logprob.h"

typedef struct beam {
    int seq;           /* its KV sequence (holds prompt + toks but the last: logits are after it) */
    int32_t *toks;
    int n;
    double lp;
    float *logits;     /* n_vocab: the distribution of its next token */
} beam;

typedef struct cand {
    int b;             /* parent beam */
    int32_t tok;
    double lp;         /* parent's lp + log p(tok) */
} cand;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double score_of(double lp, int n, float alpha)
{
    return alpha == 0 || n <= 0 ? lp : lp / pow((double)n, alpha);
}

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->lp != y->lp) return x->lp > y->lp ? -1 : 1;
    if (x->b != y->b) return x->b - y->b;
    return x->tok - y->tok;
}

void beam_result_free(beam_result *r)
{
    if (!r) return;
    free(r->tokens);
    r->tokens = NULL;
}

/* Keep hypothesis (toks, n, lp) in *best when it scores higher. */
static int consider(beam_result *best, int *have, const int32_t *toks, int n, double lp, float alpha, int finish)
{
    double sc = score_of(lp, n, alpha);
    if (*have && !(sc > best->score)) return 0;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!t) return -1;
    memcpy(t, toks, sizeof(int32_t) * (size_t)n);
    free(best->tokens);
    best->tokens = t;
    best->n_tokens = n;
    best->logprob = lp;
    best->score = sc;
    best->finish = finish;
    *have = 1;
    return 0;
}

int engine_beam_search(engine *e, int seq, const int32_t *prompt, int n_prompt, int n_beams, float length_penalty,
                       int n_predict, beam_result *out, gen_stats *st, kv_error *err)
{
    gen_stats local;
    if (!st) st = &local;
    memset(out, 0, sizeof *out);
    if (n_beams < 1 || n_beams > BEAM_MAX)
        return kv_error_set(err, KV_ERR_INVALID, "beam search: %d beams (1 to %d)", n_beams, BEAM_MAX);
    if (n_prompt <= 0) return kv_error_set(err, KV_ERR_INVALID, "the prompt is empty");
    const int nv = engine_model(e)->hp.n_vocab, n_ctx = engine_n_ctx(e);
    const tokenizer *tk = engine_tokenizer(e);
    if (n_predict < 0 || n_predict > n_ctx - n_prompt) n_predict = n_ctx - n_prompt;
    double t0 = now_ms();
    int rc = engine_prefill_seq(e, seq, prompt, (size_t)n_prompt, NULL, st, err);
    if (rc) return rc;
    st->prefill_ms = now_ms() - t0;
    beam bm[BEAM_MAX], nb[BEAM_MAX];
    memset(bm, 0, sizeof bm);
    memset(nb, 0, sizeof nb);
    cand *cs = malloc(sizeof(cand) * (size_t)(n_beams * n_beams));
    float *rows = malloc(sizeof(float) * (size_t)nv * (size_t)n_beams);
    int n_live = 0, have = 0, fin = GEN_FINISH_LENGTH;
    if (!cs || !rows) {
        free(cs);
        free(rows);
        return kv_error_set(err, KV_ERR_NOMEM, "out of memory for beam search");
    }
    for (int i = 0; i < n_beams; i++) {
        bm[i].logits = malloc(sizeof(float) * (size_t)nv);
        nb[i].logits = malloc(sizeof(float) * (size_t)nv);
        bm[i].toks = malloc(sizeof(int32_t) * (size_t)(n_predict + 1));
        nb[i].toks = malloc(sizeof(int32_t) * (size_t)(n_predict + 1));
        if (!bm[i].logits || !nb[i].logits || !bm[i].toks || !nb[i].toks) {
            rc = kv_error_set(err, KV_ERR_NOMEM, "out of memory for beam search");
            goto done;
        }
        bm[i].seq = nb[i].seq = -1;
    }
    if ((rc = engine_seq_fork(e, seq, -1, &bm[0].seq, err))) goto done;
    if (st->n_prefilled > 0) {
        memcpy(bm[0].logits, engine_logits(e), sizeof(float) * (size_t)nv);
    } else { /* all of the prompt was reused: recompute its last position for the logits */
        engine_seq_truncate(e, bm[0].seq, n_prompt - 1);
        if ((rc = engine_forward(e, bm[0].seq, prompt + n_prompt - 1, 1, bm[0].logits, 0, err))) goto done;
    }
    n_live = 1;
    token_logprob tl;
    int step = 0;
    for (; step < n_predict && n_live > 0 && out->n_finished < n_beams; step++) {
        int nc = 0;
        for (int b = 0; b < n_live; b++) {
            logprob_token(bm[b].logits, nv, -1, n_beams, &tl);
            for (int k = 0; k < tl.n_top; k++) cs[nc++] = (cand){b, tl.top[k], bm[b].lp + tl.top_lp[k]};
        }
        qsort(cs, (size_t)nc, sizeof *cs, cand_cmp);
        int n_new = 0;
        for (int c = 0; c < nc && n_new < n_beams; c++) {
            const beam *p = &bm[cs[c].b];
            if (tokenizer_is_eog(tk, cs[c].tok)) { /* a finished hypothesis (its EOG token counted) */
                p->toks[p->n] = cs[c].tok;
                if (consider(out, &have, p->toks, p->n + 1, cs[c].lp, length_penalty, GEN_FINISH_EOG)) goto oom;
                out->n_finished++;
                if (out->n_finished >= n_beams) break;
                continue;
            }
            beam *q = &nb[n_new];
            memcpy(q->toks, p->toks, sizeof(int32_t) * (size_t)p->n);
            q->toks[p->n] = cs[c].tok;
            q->n = p->n + 1;
            q->lp = cs[c].lp;
            if ((rc = engine_seq_fork(e, p->seq, -1, &q->seq, err))) goto done;
            n_new++;
            st->n_generated++;
        }
        /* the new beams' next-token logits, unless this is the last step: one forward pass over
         * every beam's new token (model_forward_batch: weights read once for all beams) */
        if (step + 1 < n_predict && n_new > 0) {
            int32_t bt[BEAM_MAX];
            int bs[BEAM_MAX];
            for (int b = 0; b < n_new; b++) bt[b] = nb[b].toks[nb[b].n - 1], bs[b] = nb[b].seq;
            if ((rc = model_forward_batch(engine_model(e), engine_forward_ctx(e), engine_kv(e), engine_pool(e), bt, bs,
                                          n_new, NULL, rows, err)))
                goto done;
            for (int b = 0; b < n_new; b++) memcpy(nb[b].logits, rows + (size_t)b * nv, sizeof(float) * (size_t)nv);
        }
        for (int b = 0; b < n_live; b++) {
            engine_seq_free(e, bm[b].seq);
            bm[b].seq = -1;
        }
        for (int b = 0; b < n_new; b++) { /* swap buffers */
            beam t = bm[b];
            bm[b] = nb[b];
            nb[b] = t;
        }
        n_live = n_new;
    }
    if (n_live > 0 && step >= n_ctx - n_prompt) fin = GEN_FINISH_CONTEXT;
    for (int b = 0; b < n_live && out->n_finished < n_beams; b++) /* cut at the length: hypotheses too */
        if (consider(out, &have, bm[b].toks, bm[b].n, bm[b].lp, length_penalty, fin)) goto oom;
    st->decode_ms = now_ms() - t0 - st->prefill_ms;
    st->decode_tps = st->decode_ms > 0 ? st->n_generated / (st->decode_ms / 1e3) : 0;
    goto done;
oom:
    rc = kv_error_set(err, KV_ERR_NOMEM, "out of memory for beam search");
done:
    for (int i = 0; i < n_beams; i++) {
        if (bm[i].seq >= 0) engine_seq_free(e, bm[i].seq);
        if (nb[i].seq >= 0 && nb[i].seq != bm[i].seq) engine_seq_free(e, nb[i].seq);
        free(bm[i].logits);
        free(nb[i].logits);
        free(bm[i].toks);
        free(nb[i].toks);
    }
    free(cs);
    free(rows);
    if (rc) beam_result_free(out);
    return rc;
}
