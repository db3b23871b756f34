/* speculate: the drafters (prompt lookup over n-grams of the context; a draft model kept in step with the target) and the verification rule of speculative decoding. */
#include "speculate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"

struct spec_state {
    spec_params p;
    int n_vocab, n_batch;
    float *rows;         /* (SPEC_MAX_DRAFT + 1) x n_vocab: the target's logits of a pass */
    float *q;            /* draft_max x n_vocab: the draft model's distribution at each draft */
    float *pd;           /* n_vocab: the target's p, dense */
    int32_t *ids;        /* n_vocab */
    float *probs;        /* n_vocab */
    float *dlogits;      /* n_vocab: the draft model's last row */
    sampler *ds;         /* the draft model's filters (no penalties), for q */
    sampler_rng rng;     /* acceptance tests and residual draws */
    int kcap;            /* current draft length limit */
    int skip;            /* passes left without drafting (back-off) */
    int fails;           /* consecutive passes whose first draft was rejected */
    int declined;        /* the draft model ran but drafted nothing (its top probability < draft_min_p) */
    int pause_scale;     /* pauses are (4^f - 1) * this: 1 + the draft model's relative cost, rounded up */
    int off;             /* the draft model's sequence holds hist[off..): a window after a resync */
    long n_draft_read;   /* tokens the draft model has read (its forward passes' rows) */
    double plain_ms;     /* the target's steps without drafts: their time, */
    int plain_n;         /* and their number */
    double draft_ms_tok; /* the last pass's drafting time per drafted token */
    int too_costly;      /* the draft model costs at least a target step per token: no more drafts */
};

void spec_params_default(spec_params *p)
{
    memset(p, 0, sizeof *p);
    p->draft_max = SPEC_DEFAULT_DRAFT_MAX;
    p->draft_min_p = SPEC_DEFAULT_MIN_P;
}

static const char *const mode_names[] = {[SPEC_OFF] = "off", [SPEC_LOOKUP] = "lookup", [SPEC_DRAFT] = "draft"};

int spec_mode_from_name(const char *name)
{
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, mode_names[i])) return i;
    return -1;
}

const char *spec_mode_name(int mode) { return mode >= 0 && mode < 3 ? mode_names[mode] : "?"; }

int spec_draft_open(const char *draft_path, const engine *target, int n_threads, engine **out, kv_error *err)
{
    *out = NULL;
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = draft_path;
    ep.n_ctx = engine_n_ctx(target);
    ep.n_batch = engine_n_batch(target);
    ep.n_threads = n_threads > 0 ? n_threads : engine_n_threads(target);
    ep.kv_type = engine_kv_type(target);
    engine *d;
    int rc = engine_open(&ep, &d, err);
    if (rc) return rc;
    const tokenizer *a = engine_tokenizer(target), *b = engine_tokenizer(d);
    int na = tokenizer_n_vocab(a), nb = tokenizer_n_vocab(b);
    if (na != nb) {
        engine_close(d);
        return kv_error_set(err, KV_ERR_FORMAT, "%s: its vocabulary differs from the target model's: %d tokens vs %d",
                            draft_path, nb, na);
    }
    for (int i = 0; i < na; i++) {
        const char *ta = tokenizer_token_text(a, i), *tb = tokenizer_token_text(b, i);
        if (strcmp(ta ? ta : "", tb ? tb : "")) {
            rc = kv_error_set(err, KV_ERR_FORMAT,
                              "%s: its vocabulary differs from the target model's: token %d is '%.40s' there and "
                              "'%.40s' here", draft_path, i, tb ? tb : "", ta ? ta : "");
            engine_close(d);
            return rc;
        }
    }
    *out = d;
    return KV_OK;
}

spec_state *spec_state_create(const spec_params *p, int n_vocab, int n_batch, uint64_t seed)
{
    spec_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->p = *p;
    if (st->p.draft_max <= 0) st->p.draft_max = SPEC_DEFAULT_DRAFT_MAX;
    if (st->p.draft_max > SPEC_MAX_DRAFT) st->p.draft_max = SPEC_MAX_DRAFT;
    st->n_vocab = n_vocab;
    st->n_batch = n_batch;
    st->kcap = st->p.no_backoff ? st->p.draft_max : 2;
    st->pause_scale = 1;
    if (st->kcap > st->p.draft_max) st->kcap = st->p.draft_max;
    size_t nv = (size_t)n_vocab;
    st->rows = malloc(sizeof(float) * nv * (SPEC_MAX_DRAFT + 1));
    st->pd = calloc(nv, sizeof(float));
    st->ids = malloc(sizeof(int32_t) * nv);
    st->probs = malloc(sizeof(float) * nv);
    int ok = st->rows && st->pd && st->ids && st->probs;
    if (ok && p->mode == SPEC_DRAFT) {
        st->q = malloc(sizeof(float) * nv * (size_t)st->p.draft_max);
        st->dlogits = malloc(sizeof(float) * nv);
        st->ds = sampler_create(n_vocab, NULL, NULL);
        ok = st->q && st->dlogits && st->ds && p->draft;
    }
    if (!ok) {
        spec_state_free(st);
        return NULL;
    }
    sampler_rng_seed(&st->rng, seed ^ 0x5bd1e9955bd1e995ull);
    return st;
}

void spec_state_free(spec_state *st)
{
    if (!st) return;
    free(st->rows);
    free(st->q);
    free(st->pd);
    free(st->ids);
    free(st->probs);
    free(st->dlogits);
    sampler_free(st->ds);
    free(st);
}

float *spec_rows(spec_state *st) { return st->rows; }

/* Prompt lookup (Saxena 2023, "prompt lookup decoding"; the n-gram drafts of llama.cpp's lookup
 * example are the same idea): the most recent earlier occurrence of the context's last n tokens,
 * n from SPEC_NGRAM_MAX down to SPEC_NGRAM_MIN; the tokens that followed it are the draft. */
static int propose_lookup(const int32_t *h, int n, int max_k, int32_t *out)
{
    for (int g = SPEC_NGRAM_MAX; g >= SPEC_NGRAM_MIN; g--) {
        if (n < g + 1) continue;
        const int32_t *tail = h + n - g;
        for (int s = n - g - 1; s >= 0; s--) { /* candidate start of an earlier copy */
            if (h[s] != tail[0] || memcmp(h + s, tail, sizeof(int32_t) * (size_t)g)) continue;
            /* what followed it; past the end of the context the copy goes on from the draft
             * itself (a repeating period shorter than the draft) */
            int k = 0;
            for (; k < max_k; k++) {
                int at = s + g + k;
                out[k] = at < n ? h[at] : out[at - n];
            }
            return k;
        }
    }
    return 0;
}

/* The largest softmax probability of a row of logits. */
static float top_prob(const float *l, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (l[i] > mx) mx = l[i];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)l[i] - mx);
    return sum > 0 ? (float)(1.0 / sum) : 0;
}

static int argmax(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* Draw from weights w[ids[0..n)] (not necessarily normalised) with the state's RNG. */
static int32_t draw(spec_state *st, const float *w, const int32_t *ids, int n, double total)
{
    double u = sampler_rng_uniform(&st->rng) * total, c = 0;
    int32_t last = ids[0];
    for (int i = 0; i < n; i++) {
        if (w[i] <= 0) continue;
        c += w[i];
        last = ids[i];
        if (c > u) return ids[i];
    }
    return last;
}

/* The draft model's sequence made to hold hist[off..n): the common prefix kept, the rest fed in
 * batches (at least the last token, so st->dlogits is the row after hist[n-1]). Unless full (the
 * prefill), a sequence more than SPEC_RESYNC_MAX tokens behind (a pause of the back-off, a context
 * shift) restarts on the last SPEC_RESYNC_MAX tokens (off moves up): what the draft model reads
 * stays bounded per pass, not one read of every token of every pause. 1 when the draft model
 * cannot follow (its context too small: no draft), 0, or -1 with err set. */
static int draft_sync(spec_state *st, const int32_t *hist, int n, int full, kv_error *err)
{
    engine *d = st->p.draft;
    int seq = ENGINE_SEQ_DEFAULT, have_n;
    if (st->off > n - 1) st->off = 0;
    const int32_t *have = engine_seq_tokens(d, seq, &have_n);
    int common = 0;
    while (common < have_n && st->off + common < n - 1 && have[common] == hist[st->off + common]) common++;
    if (!full && (n - st->off - common > SPEC_RESYNC_MAX || n - st->off > engine_n_ctx(d))) {
        st->off = n - SPEC_RESYNC_MAX > 0 ? n - SPEC_RESYNC_MAX : 0;
        common = 0;
    }
    engine_seq_truncate(d, seq, common);
    engine_seq_tokens(d, seq, &common); /* fewer when sliding-window layers freed that window */
    if (n - st->off > engine_n_ctx(d)) return 1; /* cannot follow */
    int nb = engine_n_batch(d);
    for (int i = st->off + common; i < n;) {
        int k = n - i < nb ? n - i : nb;
        if (engine_forward(d, seq, hist + i, k, st->dlogits, 0, err)) return -1;
        st->n_draft_read += k;
        i += k;
    }
    return 0;
}

void spec_set_cost(spec_state *st, double c)
{
    st->pause_scale = c > 0 ? 1 + (int)ceil(c) : 1;
}

long spec_draft_read(const spec_state *st) { return st->n_draft_read; }

void spec_time(spec_state *st, int k, double ms)
{
    if (ms <= 0) return;
    if (k > 0) {
        st->draft_ms_tok = ms / k;
    } else {
        st->plain_ms += ms;
        st->plain_n++;
    }
    /* Leviathan et al. 2023 (section 3.4): the expected speed-up is (1 - a^(g+1)) / ((1 - a)(g c + 1))
     * for acceptance a, g drafts and cost c; it is at most (g + 1) / (g c + 1) <= 1 once c >= 1 */
    if (st->p.mode == SPEC_DRAFT && !st->p.no_backoff && st->plain_n > 0 && st->draft_ms_tok > 0 &&
        st->draft_ms_tok >= st->plain_ms / st->plain_n)
        st->too_costly = 1;
}

int spec_too_costly(const spec_state *st) { return st->too_costly; }

int spec_paused(spec_state *st)
{
    if (st->too_costly) return 1;
    if (st->p.no_backoff || st->skip <= 0) return 0;
    st->skip--;
    return 1;
}

int spec_prefill(spec_state *st, const int32_t *toks, int n, kv_error *err)
{
    if (st->p.mode != SPEC_DRAFT || n <= 0) return KV_OK;
    st->off = 0;
    int rc = draft_sync(st, toks, n, 1, err);
    return rc < 0 ? (err && err->code ? err->code : KV_ERR_INVALID) : KV_OK;
}

/* The draft model: make its sequence hold hist[0..n-1) and the pending token (draft_sync), then
 * draft greedily (temperature 0) or from q. */
static int propose_draft(spec_state *st, const int32_t *hist, int n, int max_k, const sampler *s, int32_t *out,
                         kv_error *err)
{
    engine *d = st->p.draft;
    int seq = ENGINE_SEQ_DEFAULT;
    int sr = draft_sync(st, hist, n, 0, err);
    if (sr) return sr < 0 ? -1 : 0;
    sampler_params dp = *sampler_get_params(s);
    dp.repeat_penalty = 1.0f;
    dp.presence_penalty = dp.frequency_penalty = 0;
    dp.seed = 1; /* fixed: sampler_set_params never reseeds; q draws use st->rng */
    sampler_set_params(st->ds, &dp);
    int greedy = !(dp.temperature > 0);
    int k = 0;
    st->declined = 0;
    for (; k < max_k; k++) {
        if (st->p.draft_min_p > 0 && top_prob(st->dlogits, st->n_vocab) < st->p.draft_min_p) break;
        int32_t tok;
        if (greedy) {
            tok = argmax(st->dlogits, st->n_vocab);
        } else {
            int32_t nq;
            if (sampler_dist(st->ds, st->dlogits, st->ids, st->probs, &nq, err)) return -1;
            float *q = st->q + (size_t)k * st->n_vocab;
            memset(q, 0, sizeof(float) * (size_t)st->n_vocab);
            double tot = 0;
            for (int i = 0; i < nq; i++) {
                q[st->ids[i]] = st->probs[i];
                tot += st->probs[i];
            }
            tok = draw(st, st->probs, st->ids, nq, tot);
        }
        out[k] = tok;
        if (k + 1 == max_k) {
            k++;
            break;
        }
        if (n - st->off + k + 1 >= engine_n_ctx(d)) {
            k++;
            break;
        }
        if (engine_forward(d, seq, &tok, 1, st->dlogits, 0, err)) return -1;
        st->n_draft_read++;
    }
    st->declined = k == 0;
    return k;
}

int spec_propose(spec_state *st, const int32_t *hist, int n_hist, int max_k, const sampler *s, int32_t *drafts,
                 kv_error *err)
{
    if (max_k > st->p.draft_max) max_k = st->p.draft_max;
    if (spec_paused(st)) return 0;
    if (!st->p.no_backoff && max_k > st->kcap) max_k = st->kcap;
    if (max_k > st->n_batch - 1) max_k = st->n_batch - 1;
    if (max_k <= 0) return 0;
    if (st->p.mode == SPEC_LOOKUP) return propose_lookup(hist, n_hist, max_k, drafts);
    if (st->p.mode == SPEC_DRAFT) return propose_draft(st, hist, n_hist, max_k, s, drafts, err);
    return 0;
}

int spec_verify(spec_state *st, sampler *s, const float *row, int i, int32_t draft, int32_t *tok, int *accepted,
                kv_error *err)
{
    *accepted = 0;
    const sampler_params *sp = sampler_get_params(s);
    if (draft < 0 || !(sp->temperature > 0)) { /* bonus token, or greedy: the target's own choice */
        int rc = sampler_sample(s, row, tok, err);
        if (!rc && draft >= 0) *accepted = *tok == draft;
        return rc;
    }
    if (st->p.test_accept_all) {
        *tok = draft;
        *accepted = 1;
        return KV_OK;
    }
    int32_t n;
    int rc = sampler_dist(s, row, st->ids, st->probs, &n, err);
    if (rc) return rc;
    for (int k = 0; k < n; k++) st->pd[st->ids[k]] = st->probs[k];
    const float *q = st->p.mode == SPEC_DRAFT ? st->q + (size_t)i * st->n_vocab : NULL;
    float pd = st->pd[draft], qd = q ? q[draft] : 1.0f;
    double u = sampler_rng_uniform(&st->rng);
    if (qd > 0 && u * qd < pd) { /* accept with probability min(1, p/q) */
        *tok = draft;
        *accepted = 1;
    } else { /* the residual max(0, p - q), renormalised */
        double tot = 0;
        for (int k = 0; k < n; k++) {
            float qv = q ? q[st->ids[k]] : (st->ids[k] == draft ? 1.0f : 0.0f);
            float r = st->probs[k] - qv;
            st->probs[k] = r > 0 ? r : 0;
            tot += st->probs[k];
        }
        if (tot > 0) *tok = draw(st, st->probs, st->ids, n, tot);
        else { /* p <= q everywhere yet rejected: only by rounding; draw from p */
            double t2 = 0;
            for (int k = 0; k < n; k++) t2 += (st->probs[k] = st->pd[st->ids[k]]);
            *tok = draw(st, st->probs, st->ids, n, t2);
        }
    }
    for (int k = 0; k < n; k++) st->pd[st->ids[k]] = 0;
    return KV_OK;
}

void spec_feedback(spec_state *st, int k, int j)
{
    if (st->p.no_backoff) return;
    if (k == 0) {
        /* a draft model that ran and declined (below draft_min_p) cost a draft step for nothing:
         * it backs off as a rejected draft does; no lookup match costs nothing */
        if (!st->declined) return;
        st->declined = 0;
        j = 0;
        k = 1;
    }
    if (j == k) {
        st->kcap += 2;
        if (st->kcap > st->p.draft_max) st->kcap = st->p.draft_max;
    } else {
        st->kcap = j + 1;
    }
    if (j == 0) {
        st->fails++;
        int f = st->fails < SPEC_BACKOFF_MAX ? st->fails : SPEC_BACKOFF_MAX;
        st->skip = ((1 << (2 * f)) - 1) * st->pause_scale; /* (4^f - 1) (1 + c) */
    } else {
        st->fails = 0;
    }
}
