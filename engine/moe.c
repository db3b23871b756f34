/* moe: the mixture-of-experts FFN block — router, top-k, expert weight normalisation, the token-by-expert grouping and the grouped expert matmuls (kernels: engine/kernels via quant.h). */
#include "moe.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fwd_prof.h"
#include "ops.h"
#include "ops_extra.h"
#include "kernels/quant.h"

/* ---- tensors ------------------------------------------------------------------------------- */

/* A tensor with exactly these dims (ne[i] = 0: any) and a supported type; missing: error unless optional. */
static int find_t(const gguf_file *f, const char *name, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2, int optional,
                  const gguf_tensor **out, kv_error *err)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    *out = NULL;
    if (!t) {
        if (optional) return KV_OK;
        return kv_error_set(err, KV_ERR_FORMAT, "%s: required tensor '%s' is missing", f->path, name);
    }
    int64_t want[3] = {ne0, ne1, ne2};
    int ok = (int)t->n_dims == n_dims;
    for (int i = 0; i < n_dims; i++) ok = ok && t->ne[i] == want[i];
    if (!ok) {
        char w[96], h[96];
        if (n_dims == 3) snprintf(w, sizeof w, "[%lld, %lld, %lld]", (long long)ne0, (long long)ne1, (long long)ne2);
        else snprintf(w, sizeof w, "[%lld, %lld]", (long long)ne0, (long long)ne1);
        if (t->n_dims >= 3)
            snprintf(h, sizeof h, "[%lld, %lld, %lld]", (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2]);
        else snprintf(h, sizeof h, "[%lld, %lld]", (long long)t->ne[0], (long long)t->ne[1]);
        return kv_error_set(err, KV_ERR_FORMAT, "%s: tensor '%s' has shape %s (%u dims), expected %s", f->path, name,
                            h, t->n_dims, w);
    }
    const quant_traits *qt = quant_traits_of(t->type);
    if (!qt || !qt->supported)
        return kv_error_set(err, KV_ERR_UNSUPPORTED, "%s: tensor '%s' has weight type %s, which kvchat does not support",
                            f->path, name, qt ? qt->name : "?");
    *out = t;
    return KV_OK;
}

int moe_find_layer(const gguf_file *f, int il, int n_embd, const moe_config *c, moe_layer *L, kv_error *err)
{
    char nm[96];
    int rc;
    const int64_t E = n_embd, X = c->n_expert, F = c->n_ff_exp, S = c->n_ff_shexp;
#define FIND(field, suffix, nd, a, b, d, opt)                                                   \
    snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix);                                           \
    if ((rc = find_t(f, nm, nd, a, b, d, opt, &L->field, err))) return rc;
    FIND(gate_inp, "ffn_gate_inp.weight", 2, E, X, 1, 0)
    FIND(gate_exps, "ffn_gate_exps.weight", 3, E, F, X, 0)
    FIND(up_exps, "ffn_up_exps.weight", 3, E, F, X, 0)
    FIND(down_exps, "ffn_down_exps.weight", 3, F, E, X, 0)
    if (S > 0) {
        FIND(gate_shexp, "ffn_gate_shexp.weight", 2, E, S, 1, 0)
        FIND(up_shexp, "ffn_up_shexp.weight", 2, E, S, 1, 0)
        FIND(down_shexp, "ffn_down_shexp.weight", 2, S, E, 1, 0)
    }
#undef FIND
    return KV_OK;
}

gguf_tensor moe_expert_view(const gguf_tensor *t, int e)
{
    gguf_tensor v = *t;
    size_t rb = quant_row_size(t->type, t->ne[0]), slice = rb * (size_t)t->ne[1];
    v.n_dims = 2;
    v.ne[2] = v.ne[3] = 1;
    v.n_elements = t->ne[0] * t->ne[1];
    v.nbytes = slice;
    v.data = (const uint8_t *)t->data + (size_t)e * slice;
    v.packed = NULL;
    const void *pk = op_weights_of(t);
    if (pk) {
        /* op_weights_pack packs a 3-D tensor as one matrix of ne1 * ne2 rows only when ne1 is a
         * multiple of the panel height, so expert e's panels start at e panels-of-ne1-rows */
        if (quant_pack_size(t->type, t->ne[0], t->ne[1] * t->ne[2]))
            v.packed = (const uint8_t *)pk + (size_t)e * quant_pack_size(t->type, t->ne[0], t->ne[1]);
        else v.packed = (const uint8_t *)pk + (size_t)e * slice;
    }
    return v;
}

/* ---- grouped matmul ------------------------------------------------------------------------ */

/* One weight matrix times its own group of prepared activation rows. */
typedef struct mm_group {
    int type;
    int64_t n_in, n_out;
    const uint8_t *rows;  /* GGUF-layout rows (mapped or copied) */
    size_t row_bytes;
    const void *panels;   /* packed panels, or NULL */
    const uint8_t *act;   /* n_tok prepared rows, act_stride apart */
    size_t act_stride;
    int n_tok;
    float *y;             /* [n_tok][y_stride] */
    size_t y_stride;
    long chunk_rows, first_item;
} mm_group;

typedef struct mm_job {
    mm_group *g;
    int n_groups;
    long n_items;
    atomic_long next;
    const tpool *pool; /* its cancellation (tpool_set_cancel) is polled between chunks */
} mm_job;

static void mm_worker(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    (void)ith;
    (void)nth;
    for (long i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_items;) {
        if (i > 0 && tpool_cancelled(j->pool)) break; /* a stop: moe_ffn drops out */
        int lo_g = 0, hi_g = j->n_groups - 1; /* the last group whose first item is <= i */
        while (lo_g < hi_g) {
            int mid = (lo_g + hi_g + 1) / 2;
            if (j->g[mid].first_item <= i) lo_g = mid;
            else hi_g = mid - 1;
        }
        const mm_group *g = &j->g[lo_g];
        long lo = (i - g->first_item) * g->chunk_rows;
        long hi = lo + g->chunk_rows < g->n_out ? lo + g->chunk_rows : (long)g->n_out;
        if (g->panels)
            quant_gemm_packed(g->type, g->n_in, lo, hi - lo, g->panels, g->act, g->act_stride, g->n_tok, g->y + lo,
                              g->y_stride);
        else if (g->n_tok == 1)
            quant_gemv(g->type, g->n_in, hi - lo, g->rows + (size_t)lo * g->row_bytes, g->row_bytes, g->act, g->y + lo);
        else
            quant_gemm(g->type, g->n_in, hi - lo, g->rows + (size_t)lo * g->row_bytes, g->row_bytes, g->act,
                       g->act_stride, g->n_tok, g->y + lo, g->y_stride);
    }
}

/* A group for expert e of the 3-D tensor t. */
static mm_group expert_group(const gguf_tensor *t, int e, const uint8_t *act, size_t act_stride, int n_tok, float *y,
                             size_t y_stride)
{
    gguf_tensor v = moe_expert_view(t, e);
    mm_group g = {.type = t->type, .n_in = t->ne[0], .n_out = t->ne[1], .rows = v.data,
                  .row_bytes = quant_row_size(t->type, t->ne[0]), .act = act, .act_stride = act_stride,
                  .n_tok = n_tok, .y = y, .y_stride = y_stride};
    if (v.packed && quant_pack_size(t->type, t->ne[0], t->ne[1])) g.panels = v.packed;
    else if (v.packed) g.rows = v.packed;
    return g;
}

/* A group for the 2-D matrix t (the shared expert's): its panels, its copied rows or the mapping. */
static mm_group matrix_group(const gguf_tensor *t, const uint8_t *act, size_t act_stride, int n_tok, float *y,
                             size_t y_stride)
{
    mm_group g = {.type = t->type, .n_in = t->ne[0], .n_out = t->ne[1], .rows = t->data,
                  .row_bytes = quant_row_size(t->type, t->ne[0]), .act = act, .act_stride = act_stride,
                  .n_tok = n_tok, .y = y, .y_stride = y_stride};
    const void *pk = op_weights_of(t);
    if (pk && quant_pack_size(t->type, t->ne[0], t->ne[1])) g.panels = pk;
    else if (pk) g.rows = pk;
    return g;
}

/* Run the groups' row chunks over the pool in one pass: chunks of whole panels, about 64 KiB of
 * weights and at most ~2^26 multiply-adds (op_matmul_chunk_rows), that the threads take in turn
 * from a shared counter (a preempted thread delays the pass by one chunk), polling a stop between
 * them (then the outputs are undefined: moe_ffn checks tpool_cancelled and drops out). */
static void mm_run(mm_group *g, int n_groups, tpool *pool)
{
    if (!n_groups) return;
    int nth = tpool_size(pool);
    long items = 0;
    for (int i = 0; i < n_groups; i++) {
        g[i].chunk_rows = op_matmul_chunk_rows(g[i].row_bytes, g[i].n_in, g[i].n_out, g[i].n_tok, nth, 0);
        g[i].first_item = items;
        items += ((long)g[i].n_out + g[i].chunk_rows - 1) / g[i].chunk_rows;
    }
    mm_job j = {.g = g, .n_groups = n_groups, .n_items = items, .pool = pool};
    atomic_init(&j.next, 0);
    if (nth == 1) mm_worker(&j, 0, 1);
    else tpool_run_shared(pool, mm_worker, &j);
}

/* ---- scratch ------------------------------------------------------------------------------- */

struct moe_scratch {
    int n_batch, n_embd, k, n_expert, n_ff, n_ff_sh;
    float *logits;      /* [B][n_expert] */
    int32_t *sel;       /* [B][k] selected experts, rank order */
    float *margin;      /* [B] smallest routing margin since moe_margin_reset (moe_margin) */
    float *w;           /* [B][k] their weights */
    uint8_t *taken;     /* [n_expert] */
    int32_t *cnt, *off; /* [n_expert], [n_expert + 1]: rows per expert and where they start */
    int32_t *rowmap;    /* [B * k]: the grouped row of (token t, rank j) */
    int32_t *rowtok;    /* [B * k]: the token of a grouped row */
    int32_t *rowexp;    /* [B * k]: the expert of a grouped row */
    uint8_t *act_x, *act_x2;   /* [B][act row of n_embd] prepared inputs (gate type, up type) */
    uint8_t *act_g, *act_g2;   /* [B * k][...] the same rows gathered by expert */
    float *hg, *hu;     /* [B * k][n_ff_exp] gate / up outputs by grouped row */
    uint8_t *act_h;     /* [B * k][act row of n_ff_exp] prepared down inputs */
    float *yd;          /* [B * k][n_embd] down outputs */
    float *sg, *su, *sy;/* shared expert [B][n_ff_shexp] x2, [B][n_embd] */
    uint8_t *act_sx, *act_sx2, *act_sd; /* its prepared inputs: gate, up (when its type differs), down */
    size_t arow_sx, arow_sd;
    void *mm_act;       /* op_matmul scratch (router, shared expert) */
    mm_group *groups;   /* [2 n_expert] */
    size_t arow_x, arow_h; /* largest prepared row sizes over the layers */
};

static void *amalloc(size_t n) { return aligned_alloc(64, (n + 63) & ~(size_t)63); }

moe_scratch *moe_scratch_create(const moe_config *c, int n_embd, int n_batch, const moe_layer *layers, int n_layer,
                                kv_error *err)
{
    moe_scratch *s = calloc(1, sizeof *s);
    if (!s) goto nomem;
    s->n_batch = n_batch, s->n_embd = n_embd, s->k = c->n_expert_used, s->n_expert = c->n_expert;
    s->n_ff = c->n_ff_exp, s->n_ff_sh = c->n_ff_shexp;
    size_t B = (size_t)n_batch, BK = B * (size_t)c->n_expert_used, mm = 64;
    for (int il = 0; il < n_layer; il++) {
        const moe_layer *L = &layers[il];
        const gguf_tensor *in_e[] = {L->gate_exps, L->up_exps}, *mms[] = {L->gate_inp, L->gate_shexp, L->up_shexp,
                                                                           L->down_shexp};
        for (int i = 0; i < 2; i++) {
            size_t r = quant_act_row_size(in_e[i]->type, n_embd);
            s->arow_x = r > s->arow_x ? r : s->arow_x;
        }
        size_t r = quant_act_row_size(L->down_exps->type, c->n_ff_exp);
        s->arow_h = r > s->arow_h ? r : s->arow_h;
        for (int i = 1; i < 3; i++)
            if (mms[i]) {
                size_t q = quant_act_row_size(mms[i]->type, n_embd);
                s->arow_sx = q > s->arow_sx ? q : s->arow_sx;
            }
        if (mms[3]) {
            size_t q = quant_act_row_size(mms[3]->type, c->n_ff_shexp);
            s->arow_sd = q > s->arow_sd ? q : s->arow_sd;
        }
        for (int i = 0; i < 4; i++)
            if (mms[i]) {
                size_t q = op_matmul_scratch_size(mms[i], n_batch);
                mm = q > mm ? q : mm;
            }
    }
    size_t F = (size_t)c->n_ff_exp, S = (size_t)c->n_ff_shexp, E = (size_t)n_embd;
    if (!(s->logits = amalloc(sizeof(float) * B * c->n_expert)) || !(s->sel = amalloc(sizeof(int32_t) * BK)) ||
        !(s->w = amalloc(sizeof(float) * BK)) || !(s->margin = amalloc(sizeof(float) * B)) || !(s->taken = amalloc((size_t)c->n_expert)) ||
        !(s->cnt = amalloc(sizeof(int32_t) * c->n_expert)) || !(s->off = amalloc(sizeof(int32_t) * (c->n_expert + 1))) ||
        !(s->rowmap = amalloc(sizeof(int32_t) * BK)) || !(s->rowtok = amalloc(sizeof(int32_t) * BK)) ||
        !(s->rowexp = amalloc(sizeof(int32_t) * BK)) || !(s->act_x = amalloc(B * s->arow_x)) ||
        !(s->act_x2 = amalloc(B * s->arow_x)) || !(s->act_g = amalloc(BK * s->arow_x)) ||
        !(s->act_g2 = amalloc(BK * s->arow_x)) || !(s->hg = amalloc(sizeof(float) * BK * F)) ||
        !(s->hu = amalloc(sizeof(float) * BK * F)) || !(s->act_h = amalloc(BK * s->arow_h)) ||
        !(s->yd = amalloc(sizeof(float) * BK * E)) || !(s->mm_act = amalloc(mm)) ||
        !(s->groups = calloc(2 * (size_t)c->n_expert + 2, sizeof *s->groups)))
        goto nomem;
    if (S && (!(s->sg = amalloc(sizeof(float) * B * S)) || !(s->su = amalloc(sizeof(float) * B * S)) ||
              !(s->sy = amalloc(sizeof(float) * B * E)) || !(s->act_sx = amalloc(B * s->arow_sx + 64)) ||
              !(s->act_sx2 = amalloc(B * s->arow_sx + 64)) || !(s->act_sd = amalloc(B * s->arow_sd + 64))))
        goto nomem;
    moe_margin_reset(s);
    return s;
nomem:
    moe_scratch_free(s);
    kv_error_set(err, KV_ERR_NOMEM, "moe: out of memory for the expert buffers of a batch of %d", n_batch);
    return NULL;
}

void moe_scratch_free(moe_scratch *s)
{
    if (!s) return;
    free(s->logits); free(s->sel); free(s->w); free(s->margin); free(s->taken); free(s->cnt); free(s->off);
    free(s->rowmap); free(s->rowtok); free(s->rowexp); free(s->act_x); free(s->act_x2); free(s->act_g);
    free(s->act_g2); free(s->hg); free(s->hu); free(s->act_h); free(s->yd); free(s->sg); free(s->su);
    free(s->sy); free(s->mm_act); free(s->groups); free(s->act_sx); free(s->act_sx2); free(s->act_sd);
    free(s);
}

const int32_t *moe_last_selected(const moe_scratch *s, int t) { return s->sel + (size_t)t * s->k; }
const float *moe_last_weights(const moe_scratch *s, int t) { return s->w + (size_t)t * s->k; }

void moe_margin_reset(moe_scratch *s)
{
    for (int t = 0; t < s->n_batch; t++) s->margin[t] = INFINITY;
}

float moe_margin(const moe_scratch *s, int t) { return s->margin[t]; }

/* ---- the block ----------------------------------------------------------------------------- */

/* Router output of one token -> its k experts and weights; *margin = min(*margin, the k-th
 * selected score - the best unselected one). */
static void route(const moe_config *c, float *logits, int32_t *sel, float *w, uint8_t *taken, float *margin)
{
    const int n = c->n_expert, k = c->n_expert_used;
    if (c->gating == MOE_GATING_SOFTMAX) op_softmax(logits, n);
    memset(taken, 0, (size_t)n);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) /* strictly greater: the lower index wins a tie */
            if (!taken[e] && (best < 0 || logits[e] > logits[best])) best = e;
        taken[best] = 1;
        sel[j] = best;
        w[j] = logits[best];
    }
    for (int e = 0; e < n; e++)
        if (!taken[e] && logits[sel[k - 1]] - logits[e] < *margin) *margin = logits[sel[k - 1]] - logits[e];
    if (c->gating == MOE_GATING_SOFTMAX_WEIGHT) op_softmax(w, k);
    if (c->norm_w) {
        float sum = 0;
        for (int j = 0; j < k; j++) sum += w[j];
        if (!(sum >= 6.103515625e-5f)) sum = 6.103515625e-5f; /* the reference's clamp (smallest normal f16) */
        for (int j = 0; j < k; j++) w[j] /= sum;
    }
    if (c->w_scale != 0.0f && c->w_scale != 1.0f)
        for (int j = 0; j < k; j++) w[j] *= c->w_scale;
}

typedef struct prep_job {
    int type;
    const float *x;
    int64_t n;
    uint8_t *act;
    size_t arow;
    long rows;
} prep_job;

static void prep_worker(void *arg, int ith, int nth)
{
    const prep_job *p = arg;
    long lo, hi;
    tpool_split(p->rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) quant_act_prepare(p->type, p->x + r * p->n, p->n, p->act + (size_t)r * p->arow);
}

static void prepare_rows(int type, const float *x, int64_t n, long rows, uint8_t *act, size_t arow, tpool *pool)
{
    prep_job p = {type, x, n, act, arow, rows};
    if (rows > 1 && tpool_size(pool) > 1) tpool_run(pool, prep_worker, &p);
    else prep_worker(&p, 0, 1);
}

/* SwiGLU of the grouped rows (+ expert biases) and their preparation for the down matrices. */
typedef struct act_job {
    const moe_config *c;
    const moe_layer *L;
    moe_scratch *s;
    int down_type;
    size_t arow;
    long rows;
} act_job;

static void act_worker(void *arg, int ith, int nth)
{
    const act_job *a = arg;
    moe_scratch *s = a->s;
    const int F = s->n_ff;
    long lo, hi;
    tpool_split(a->rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        float *g = s->hg + (size_t)r * F, *u = s->hu + (size_t)r * F;
        int e = s->rowexp[r];
        if (a->L->gate_exps_b)
            for (int i = 0; i < F; i++) g[i] += a->L->gate_exps_b[(size_t)e * F + i];
        if (a->L->up_exps_b)
            for (int i = 0; i < F; i++) u[i] += a->L->up_exps_b[(size_t)e * F + i];
        if (a->c->act == MOE_ACT_SWIGLU_OAI) op_swiglu_oai(g, u, F, 1.702f, 7.0f);
        else op_swiglu(g, u, F);
        quant_act_prepare(a->down_type, g, F, s->act_h + (size_t)r * a->arow);
    }
}

void moe_ffn(const moe_config *c, const moe_layer *L, const float *x, int n_tokens, float *out, moe_scratch *s,
             uint32_t *counts, tpool *pool)
{
    const int E = s->n_embd, k = c->n_expert_used, X = c->n_expert, F = c->n_ff_exp;
    /* 1. router and selection */
    op_matmul(L->gate_inp, x, n_tokens, s->logits, s->mm_act, pool);
    /* a stop (tpool_set_cancel) may have cut the router short: its logits must not choose the
     * experts (indices); the caller drops out */
    if (tpool_cancelled(pool)) return;
    for (int t = 0; t < n_tokens; t++) {
        float *lg = s->logits + (size_t)t * X;
        if (L->gate_inp_b)
            for (int e = 0; e < X; e++) lg[e] += L->gate_inp_b[e];
        route(c, lg, s->sel + (size_t)t * k, s->w + (size_t)t * k, s->taken, &s->margin[t]);
    }
    /* 2. group the (token, expert) pairs by expert, tokens ascending within an expert */
    memset(s->cnt, 0, sizeof(int32_t) * X);
    const long n_rows = (long)n_tokens * k;
    for (long i = 0; i < n_rows; i++) s->cnt[s->sel[i]]++;
    s->off[0] = 0;
    for (int e = 0; e < X; e++) s->off[e + 1] = s->off[e] + s->cnt[e];
    if (counts)
        for (int e = 0; e < X; e++) counts[e] += (uint32_t)s->cnt[e];
    memset(s->cnt, 0, sizeof(int32_t) * X);
    for (long i = 0; i < n_rows; i++) {
        int e = s->sel[i];
        int r = s->off[e] + s->cnt[e]++;
        s->rowmap[i] = r;
        s->rowtok[r] = (int32_t)(i / k);
        s->rowexp[r] = e;
    }
    /* 3. the inputs prepared once for the gate (and up, if its type differs) kernels, then
     * gathered by expert (decode: one row shared by every expert) */
    const int tg = L->gate_exps->type, tu = L->up_exps->type;
    const size_t ag = quant_act_row_size(tg, E), au = quant_act_row_size(tu, E);
    prepare_rows(tg, x, E, n_tokens, s->act_x, ag, pool);
    if (tu != tg) prepare_rows(tu, x, E, n_tokens, s->act_x2, au, pool);
    const uint8_t *xg = s->act_x, *xu = tu != tg ? s->act_x2 : s->act_x;
    if (n_tokens > 1) {
        for (long r = 0; r < n_rows; r++) {
            memcpy(s->act_g + (size_t)r * ag, s->act_x + (size_t)s->rowtok[r] * ag, ag);
            if (tu != tg) memcpy(s->act_g2 + (size_t)r * au, s->act_x2 + (size_t)s->rowtok[r] * au, au);
        }
        xg = s->act_g;
        xu = tu != tg ? s->act_g2 : s->act_g;
    }
    /* the shared expert's inputs (its matrices run in the experts' passes below) */
    const moe_layer *Ls = L->gate_shexp && L->up_shexp && L->down_shexp ? L : NULL;
    const int S = c->n_ff_shexp;
    size_t asg = 0, asu = 0, asd = 0;
    const uint8_t *xsg = NULL, *xsu = NULL;
    if (Ls) {
        const int tsg = Ls->gate_shexp->type, tsu = Ls->up_shexp->type;
        asg = quant_act_row_size(tsg, E), asu = quant_act_row_size(tsu, E);
        asd = quant_act_row_size(Ls->down_shexp->type, S);
        if (tsg == tg) xsg = s->act_x; /* the experts' prepared rows serve when the types agree */
        else if (tsg == tu) xsg = tu != tg ? s->act_x2 : s->act_x;
        else prepare_rows(tsg, x, E, n_tokens, (uint8_t *)(xsg = s->act_sx), asg, pool);
        if (tsu == tsg) xsu = xsg;
        else if (tsu == tg) xsu = s->act_x;
        else if (tsu == tu) xsu = s->act_x2;
        else prepare_rows(tsu, x, E, n_tokens, (uint8_t *)(xsu = s->act_sx2), asu, pool);
    }
    FWD_PROF_MARK(FP_MOE_ROUTE);
    /* 4. gate and up of every selected expert (and of the shared expert) in one pass over the pool */
    int ng = 0;
    if (Ls) {
        s->groups[ng++] = matrix_group(Ls->gate_shexp, xsg, asg, n_tokens, s->sg, (size_t)S);
        s->groups[ng++] = matrix_group(Ls->up_shexp, xsu, asu, n_tokens, s->su, (size_t)S);
    }
    for (int e = 0; e < X; e++) {
        int n = s->off[e + 1] - s->off[e];
        if (!n) continue;
        size_t r0 = n_tokens > 1 ? (size_t)s->off[e] : 0;
        s->groups[ng++] = expert_group(L->gate_exps, e, xg + r0 * ag, ag, n, s->hg + (size_t)s->off[e] * F, (size_t)F);
        s->groups[ng++] = expert_group(L->up_exps, e, xu + r0 * au, au, n, s->hu + (size_t)s->off[e] * F, (size_t)F);
    }
    mm_run(s->groups, ng, pool);
    if (tpool_cancelled(pool)) return; /* a stop cut the pass short: the caller drops out */
    FWD_PROF_MARK(FP_MOE_UP);
    /* 5. SwiGLU, then the down inputs */
    const int td = L->down_exps->type;
    const size_t ad = quant_act_row_size(td, F);
    act_job aj = {c, L, s, td, ad, n_rows};
    if (n_rows > 8 && tpool_size(pool) > 1) tpool_run(pool, act_worker, &aj);
    else act_worker(&aj, 0, 1);
    if (Ls)
        for (int t = 0; t < n_tokens; t++) {
            op_swiglu(s->sg + (size_t)t * S, s->su + (size_t)t * S, S);
            quant_act_prepare(Ls->down_shexp->type, s->sg + (size_t)t * S, S, s->act_sd + (size_t)t * asd);
        }
    FWD_PROF_MARK(FP_MOE_ACT);
    /* 6. down of every selected expert (and of the shared expert) */
    ng = 0;
    if (Ls) s->groups[ng++] = matrix_group(Ls->down_shexp, s->act_sd, asd, n_tokens, s->sy, (size_t)E);
    for (int e = 0; e < X; e++) {
        int n = s->off[e + 1] - s->off[e];
        if (n)
            s->groups[ng++] = expert_group(L->down_exps, e, s->act_h + (size_t)s->off[e] * ad, ad, n,
                                           s->yd + (size_t)s->off[e] * E, (size_t)E);
    }
    mm_run(s->groups, ng, pool);
    if (tpool_cancelled(pool)) return;
    FWD_PROF_MARK(FP_MOE_DOWN);
    /* 7. the weighted sum in rank order (+ expert down biases) */
    for (int t = 0; t < n_tokens; t++) {
        float *o = out + (size_t)t * E;
        memset(o, 0, sizeof(float) * E);
        for (int j = 0; j < k; j++) {
            int r = s->rowmap[(size_t)t * k + j];
            float wj = s->w[(size_t)t * k + j];
            float *y = s->yd + (size_t)r * E;
            if (L->down_exps_b) {
                const float *b = L->down_exps_b + (size_t)s->rowexp[r] * E;
                for (int i = 0; i < E; i++) y[i] += b[i];
            }
            for (int i = 0; i < E; i++) o[i] += y[i] * wj;
        }
    }
    /* 8. the shared expert's output (computed in the passes above), gated by sigmoid(gate_inp_shexp . x) */
    if (Ls) {
        for (int t = 0; t < n_tokens; t++) {
            const float *xt = x + (size_t)t * E;
            float *o = out + (size_t)t * E, *y = s->sy + (size_t)t * E, gate = 1.0f;
            if (L->gate_inp_shexp) {
                float d = 0;
                for (int i = 0; i < E; i++) d += L->gate_inp_shexp[i] * xt[i];
                gate = 1.0f / (1.0f + expf(-d));
            }
            for (int i = 0; i < E; i++) o[i] += y[i] * gate;
        }
    }
    FWD_PROF_MARK(FP_MOE_SUM);
}
