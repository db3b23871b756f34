/* model: load a llama/qwen2 GGUF (hyperparameters, tensors, shape checks) and run its forward pass. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "kernels/quant.h"

/* ---- loading ------------------------------------------------------------------------- */

static int get_int(const gguf_file *f, const char *arch, const char *suffix, int required, int *out, kv_error *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v = *out;
    int rc = gguf_get_i64(f, key, required, &v, err);
    if (rc) return rc;
    if (v < 0 || v > (1 << 30))
        return kv_error_set(err, KV_ERR_FORMAT, "%s: metadata '%s' = %lld is out of range", f->path, key, (long long)v);
    *out = (int)v;
    return KV_OK;
}

static int get_float(const gguf_file *f, const char *arch, const char *suffix, int required, float *out, kv_error *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(f, key, required, out, err);
    if (rc) return rc;
    if (!isfinite(*out) || *out <= 0)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: metadata '%s' = %g is not a positive number", f->path, key, *out);
    return KV_OK;
}

/* Find a tensor and check its shape ([ne0, ne1], ne1 = 0 for 1-D) and that its type is
 * usable. Missing and optional → *out = NULL. */
static int want_tensor(const model *m, const char *name, int64_t ne0, int64_t ne1, int optional,
                       const gguf_tensor **out, kv_error *err)
{
    const gguf_file *f = m->gguf;
    const gguf_tensor *t = gguf_find_tensor(f, name);
    *out = NULL;
    if (!t) {
        if (optional) return KV_OK;
        return kv_error_set(err, KV_ERR_FORMAT, "%s: required tensor '%s' is missing", f->path, name);
    }
    int want_dims = ne1 ? 2 : 1;
    int ok = (int)t->n_dims == want_dims && t->ne[0] == ne0 && (ne1 == 0 || t->ne[1] == ne1);
    /* a 1-D tensor may be stored as [n, 1] */
    if (!ok && !ne1 && t->n_dims == 2 && t->ne[0] == ne0 && t->ne[1] == 1) ok = 1;
    if (!ok) {
        char want[64];
        if (ne1) snprintf(want, sizeof want, "[%lld, %lld]", (long long)ne0, (long long)ne1);
        else snprintf(want, sizeof want, "[%lld]", (long long)ne0);
        return kv_error_set(err, KV_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected %s", f->path, name,
                            (long long)t->ne[0], (long long)t->ne[1], want);
    }
    const quant_traits *qt = quant_traits_of(t->type);
    if (!qt || !qt->supported)
        return kv_error_set(err, KV_ERR_UNSUPPORTED, "%s: tensor '%s' has weight type %s, which kvchat does not support",
                            f->path, name, qt ? qt->name : "?");
    *out = t;
    return KV_OK;
}

/* 1-D tensor as an f32 array in m->f32_store at *used. */
static int load_vec(model *m, const char *name, int64_t n, int optional, const float **out, size_t *used, kv_error *err)
{
    const gguf_tensor *t;
    int rc = want_tensor(m, name, n, 0, optional, &t, err);
    *out = NULL;
    if (rc || !t) return rc;
    float *dst = m->f32_store + *used;
    quant_dequantize_row(t->type, t->data, dst, n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return kv_error_set(err, KV_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value at %lld", m->gguf->path,
                                name, (long long)i);
    *used += (size_t)n;
    *out = dst;
    return KV_OK;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int load_hparams(model *m, kv_error *err)
{
    const gguf_file *f = m->gguf;
    model_hparams *hp = &m->hp;
    char *arch = NULL;
    int rc = gguf_get_str(f, "general.architecture", 1, &arch, err);
    if (rc) return rc;
    if (strcmp(arch, "llama") == 0) {
        hp->arch = ARCH_LLAMA;
        m->arch_name = "llama";
    } else if (strcmp(arch, "qwen2") == 0) {
        hp->arch = ARCH_QWEN2;
        m->arch_name = "qwen2";
        hp->rope_neox = 1;
    } else {
        rc = kv_error_set(err, KV_ERR_UNSUPPORTED, "%s: architecture '%.64s' is not supported (supported: llama, qwen2)",
                          f->path, arch);
        free(arch);
        return rc;
    }
    free(arch);
    const char *a = m->arch_name;
    hp->rope_freq_base = 10000.0f;
    hp->rms_norm_eps = 1e-5f;
    if ((rc = get_int(f, a, "context_length", 1, &hp->n_ctx_train, err)) ||
        (rc = get_int(f, a, "embedding_length", 1, &hp->n_embd, err)) ||
        (rc = get_int(f, a, "block_count", 1, &hp->n_layer, err)) ||
        (rc = get_int(f, a, "feed_forward_length", 1, &hp->n_ff, err)) ||
        (rc = get_int(f, a, "attention.head_count", 1, &hp->n_head, err)))
        return rc;
    hp->n_head_kv = hp->n_head;
    if ((rc = get_int(f, a, "attention.head_count_kv", 0, &hp->n_head_kv, err)) ||
        (rc = get_float(f, a, "rope.freq_base", 0, &hp->rope_freq_base, err)) ||
        (rc = get_float(f, a, "attention.layer_norm_rms_epsilon", 1, &hp->rms_norm_eps, err)))
        return rc;
    if (hp->n_embd < 1 || hp->n_layer < 1 || hp->n_head < 1 || hp->n_ff < 1 || hp->n_ctx_train < 1)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: hyperparameters must be positive (n_embd %d, n_layer %d, n_head %d, n_ff %d, context %d)",
                            f->path, hp->n_embd, hp->n_layer, hp->n_head, hp->n_ff, hp->n_ctx_train);
    if (hp->n_embd % hp->n_head != 0)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s.embedding_length %d is not a multiple of %s.attention.head_count %d",
                            f->path, a, hp->n_embd, a, hp->n_head);
    if (hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv != 0)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s.attention.head_count_kv %d does not divide head_count %d",
                            f->path, a, hp->n_head_kv, hp->n_head);
    hp->head_dim = hp->n_embd / hp->n_head;
    hp->n_embd_kv = hp->n_head_kv * hp->head_dim;
    hp->n_rot = hp->head_dim;
    if ((rc = get_int(f, a, "rope.dimension_count", 0, &hp->n_rot, err))) return rc;
    if (hp->n_rot < 2 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s.rope.dimension_count %d must be even and at most head_dim %d",
                            f->path, a, hp->n_rot, hp->head_dim);
    int key_len = hp->head_dim;
    if ((rc = get_int(f, a, "attention.key_length", 0, &key_len, err))) return rc;
    if (key_len != hp->head_dim)
        return kv_error_set(err, KV_ERR_UNSUPPORTED, "%s: %s.attention.key_length %d differs from n_embd/n_head %d (not supported)",
                            f->path, a, key_len, hp->head_dim);

    char *name = NULL;
    if ((rc = gguf_get_str(f, "general.name", 0, &name, err))) return rc;
    m->name = name ? name : strdup(base_name(f->path));
    return m->name ? KV_OK : kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", f->path);
}

int model_load(const char *path, model **out, kv_error *err)
{
    *out = NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
    int rc = gguf_open(path, &m->gguf, err);
    if (rc || (rc = load_hparams(m, err))) goto fail;
    const model_hparams *hp = &m->hp;
    /* every layer has at least 9 tensors: reject a block_count the file cannot hold before
     * allocating per-layer storage for it */
    if ((uint64_t)hp->n_layer > m->gguf->n_tensors / 9) {
        rc = kv_error_set(err, KV_ERR_FORMAT, "%s: %s.block_count %d needs at least %llu tensors, the file has %llu",
                          path, m->arch_name, hp->n_layer, 9ULL * (unsigned long long)hp->n_layer,
                          (unsigned long long)m->gguf->n_tensors);
        goto fail;
    }
    const gguf_tensor *embd = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!embd) {
        rc = kv_error_set(err, KV_ERR_FORMAT, "%s: required tensor 'token_embd.weight' is missing", path);
        goto fail;
    }
    m->hp.n_vocab = (int)embd->ne[1];
    if ((rc = want_tensor(m, "token_embd.weight", hp->n_embd, hp->n_vocab, 0, &m->tok_embd, err)) ||
        (rc = want_tensor(m, "output.weight", hp->n_embd, hp->n_vocab, 1, &m->output, err)))
        goto fail;
    if (!m->output) m->output = m->tok_embd;

    size_t per_layer = 2 * (size_t)hp->n_embd + (hp->arch == ARCH_QWEN2 ? (size_t)hp->n_embd + 2 * hp->n_embd_kv : 0);
    m->f32_store = malloc(sizeof(float) * (per_layer * hp->n_layer + hp->n_embd + hp->n_rot));
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->f32_store || !m->layers) {
        rc = kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    size_t used = 0;
    if ((rc = load_vec(m, "output_norm.weight", hp->n_embd, 0, &m->output_norm, &used, err)) ||
        (rc = load_vec(m, "rope_freqs.weight", hp->n_rot / 2, 1, &m->rope_freqs, &used, err)))
        goto fail;
    for (int il = 0; il < hp->n_layer; il++) {
        model_layer *L = &m->layers[il];
        char nm[96];
        int qwen = hp->arch == ARCH_QWEN2;
#define T2(field, suffix, ne0, ne1)                                                         \
        snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix);                                   \
        if ((rc = want_tensor(m, nm, ne0, ne1, 0, &L->field, err))) goto fail;
#define T1(field, suffix, n, opt)                                                           \
        snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix);                                   \
        if ((rc = load_vec(m, nm, n, opt, &L->field, &used, err))) goto fail;
        T1(attn_norm, "attn_norm.weight", hp->n_embd, 0)
        T1(ffn_norm, "ffn_norm.weight", hp->n_embd, 0)
        T2(wq, "attn_q.weight", hp->n_embd, hp->n_embd)
        T2(wk, "attn_k.weight", hp->n_embd, hp->n_embd_kv)
        T2(wv, "attn_v.weight", hp->n_embd, hp->n_embd_kv)
        T2(wo, "attn_output.weight", hp->n_embd, hp->n_embd)
        T2(w_gate, "ffn_gate.weight", hp->n_embd, hp->n_ff)
        T2(w_up, "ffn_up.weight", hp->n_embd, hp->n_ff)
        T2(w_down, "ffn_down.weight", hp->n_ff, hp->n_embd)
        T1(bq, "attn_q.bias", hp->n_embd, !qwen)
        T1(bk, "attn_k.bias", hp->n_embd_kv, !qwen)
        T1(bv, "attn_v.bias", hp->n_embd_kv, !qwen)
#undef T1
#undef T2
    }
    /* The most common 2-D weight type names the model's type (as in "Q4_K_M" files most
     * tensors are Q4_K). */
    int counts[GGML_TYPE_COUNT] = {0};
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        const gguf_tensor *t = &m->gguf->tensors[i];
        m->n_params += (uint64_t)t->n_elements;
        if (t->n_dims == 2 && t->type >= 0 && t->type < GGML_TYPE_COUNT) counts[t->type]++;
    }
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (counts[t] > counts[m->weight_type]) m->weight_type = t;
    /* matrices are repacked once, here, into the layouts the matmul kernels read (engine/ops.c) */
    if ((rc = op_weights_pack(m->gguf, m->output == m->tok_embd ? NULL : m->tok_embd, &m->packed, err)))
        goto fail;
    *out = m;
    return KV_OK;
fail:
    model_free(m);
    return rc;
}

void model_free(model *m)
{
    if (!m) return;
    op_weights_free(m->gguf, m->packed);
    gguf_close(m->gguf);
    free(m->name);
    free(m->layers);
    free(m->f32_store);
    free(m);
}

uint64_t model_weight_bytes(const model *m)
{
    uint64_t b = 0;
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        const gguf_tensor *t = &m->gguf->tensors[i];
        if (t->n_dims == 2 && t != m->tok_embd) b += t->nbytes;
    }
    if (m->output == m->tok_embd) b += m->tok_embd->nbytes;
    return b;
}

/* ---- forward pass ---------------------------------------------------------------------- */

struct forward_ctx {
    int n_batch, n_ctx;
    float *x;       /* [n_batch][n_embd] residual stream */
    float *xb;      /* [n_batch][n_embd] normed input */
    float *xb2;     /* [n_batch][n_embd] */
    float *q;       /* [n_batch][n_embd] */
    float *k, *v;   /* [n_batch][n_embd_kv] */
    float *att;     /* [n_batch][n_embd] attention output */
    float *hb, *hb2;/* [n_batch][n_ff] */
    float *rope_cs; /* [n_batch][n_rot] */
    float *k_tmp, *v_tmp; /* [n_ctx][n_embd_kv]: f32 copies of a Q8_0 cache's rows (untouched otherwise) */
    const uint8_t **kblk, **vblk; /* [n_ctx / KV_BLOCK_SIZE + 1]: where an F16 / F32 cache keeps them */
    void *act;      /* activation conversion scratch */
};

forward_ctx *forward_ctx_create(const model *m, int n_batch, int n_ctx, kv_error *err)
{
    const model_hparams *hp = &m->hp;
    if (n_batch < 1 || n_ctx < 1) {
        kv_error_set(err, KV_ERR_INVALID, "forward: invalid n_batch %d / n_ctx %d", n_batch, n_ctx);
        return NULL;
    }
    forward_ctx *fc = calloc(1, sizeof *fc);
    if (!fc) goto nomem;
    fc->n_batch = n_batch;
    fc->n_ctx = n_ctx;
    size_t B = (size_t)n_batch;
    size_t act = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer *L = &m->layers[il];
        const gguf_tensor *ws[] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
            size_t s = op_matmul_scratch_size(ws[i], n_batch);
            act = s > act ? s : act;
        }
    }
    size_t so = op_matmul_scratch_size(m->output, n_batch);
    act = so > act ? so : act;
    if (!(fc->x = malloc(sizeof(float) * B * hp->n_embd)) || !(fc->xb = malloc(sizeof(float) * B * hp->n_embd)) ||
        !(fc->xb2 = malloc(sizeof(float) * B * hp->n_embd)) || !(fc->q = malloc(sizeof(float) * B * hp->n_embd)) ||
        !(fc->k = malloc(sizeof(float) * B * hp->n_embd_kv)) || !(fc->v = malloc(sizeof(float) * B * hp->n_embd_kv)) ||
        !(fc->att = malloc(sizeof(float) * B * hp->n_embd)) || !(fc->hb = malloc(sizeof(float) * B * hp->n_ff)) ||
        !(fc->hb2 = malloc(sizeof(float) * B * hp->n_ff)) ||
        !(fc->rope_cs = malloc(sizeof(float) * B * hp->n_rot)) ||
        !(fc->k_tmp = malloc(sizeof(float) * (size_t)n_ctx * hp->n_embd_kv)) ||
        !(fc->v_tmp = malloc(sizeof(float) * (size_t)n_ctx * hp->n_embd_kv)) || !(fc->act = malloc(act ? act : 1)) ||
        !(fc->kblk = malloc(sizeof *fc->kblk * ((size_t)n_ctx / KV_BLOCK_SIZE + 1))) ||
        !(fc->vblk = malloc(sizeof *fc->vblk * ((size_t)n_ctx / KV_BLOCK_SIZE + 1))))
        goto nomem;
    return fc;
nomem:
    forward_ctx_free(fc);
    kv_error_set(err, KV_ERR_NOMEM, "forward: out of memory for a batch of %d and context of %d", n_batch, n_ctx);
    return NULL;
}

void forward_ctx_free(forward_ctx *fc)
{
    if (!fc) return;
    free(fc->x); free(fc->xb); free(fc->xb2); free(fc->q); free(fc->k); free(fc->v); free(fc->att);
    free(fc->hb); free(fc->hb2); free(fc->rope_cs); free(fc->k_tmp); free(fc->v_tmp); free(fc->kblk); free(fc->vblk);
    free(fc->act);
    free(fc);
}

int forward_ctx_n_batch(const forward_ctx *fc) { return fc->n_batch; }

static void add_bias(float *y, const float *b, int n_tokens, int n)
{
    if (!b) return;
    for (int t = 0; t < n_tokens; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * n + i] += b[i];
}

int model_forward(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens,
                  int n_tokens, float *logits, int all_logits, kv_error *err)
{
    return model_forward_seq(m, fc, kv, KV_SEQ_DEFAULT, pool, tokens, n_tokens, logits, all_logits, err);
}

int model_forward_seq(const model *m, forward_ctx *fc, kv_cache *kv, int seq, tpool *pool, const int32_t *tokens,
                      int n_tokens, float *logits, int all_logits, kv_error *err)
{
    const model_hparams *hp = &m->hp;
    if (!kv_seq_valid(kv, seq)) return kv_error_set(err, KV_ERR_INVALID, "forward: no KV sequence %d", seq);
    int pos0 = kv_seq_n_tokens(kv, seq);
    if (n_tokens < 1 || n_tokens > fc->n_batch)
        return kv_error_set(err, KV_ERR_INVALID, "forward: batch of %d tokens (1 to %d allowed)", n_tokens, fc->n_batch);
    if (pos0 + n_tokens > kv_cache_n_ctx(kv) || pos0 + n_tokens > fc->n_ctx)
        return kv_error_set(err, KV_ERR_CONTEXT, "context is full: %d + %d tokens exceed n_ctx %d", pos0, n_tokens,
                            kv_cache_n_ctx(kv));
    for (int t = 0; t < n_tokens; t++) {
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return kv_error_set(err, KV_ERR_INVALID, "forward: token id %d out of range (n_vocab %d)", tokens[t],
                                hp->n_vocab);
        op_get_row(m->tok_embd, tokens[t], fc->x + (size_t)t * hp->n_embd);
        op_rope_cache(fc->rope_cs + (size_t)t * hp->n_rot, pos0 + t, hp->n_rot, hp->rope_freq_base, m->rope_freqs);
    }
    int rc = kv_seq_reserve(kv, seq, n_tokens, err); /* blocks for the new positions (paged cache) */
    if (rc) return rc;
    const int E = hp->n_embd, EKV = hp->n_embd_kv;
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer *L = &m->layers[il];
        for (int t = 0; t < n_tokens; t++)
            op_rmsnorm(fc->xb + (size_t)t * E, fc->x + (size_t)t * E, L->attn_norm, E, hp->rms_norm_eps);
        op_matmul(L->wq, fc->xb, n_tokens, fc->q, fc->act, pool);
        op_matmul(L->wk, fc->xb, n_tokens, fc->k, fc->act, pool);
        op_matmul(L->wv, fc->xb, n_tokens, fc->v, fc->act, pool);
        add_bias(fc->q, L->bq, n_tokens, E);
        add_bias(fc->k, L->bk, n_tokens, EKV);
        add_bias(fc->v, L->bv, n_tokens, EKV);
        for (int t = 0; t < n_tokens; t++) {
            const float *cs = fc->rope_cs + (size_t)t * hp->n_rot;
            op_rope(fc->q + (size_t)t * E, hp->n_head, hp->head_dim, hp->n_rot, cs, hp->rope_neox);
            op_rope(fc->k + (size_t)t * EKV, hp->n_head_kv, hp->head_dim, hp->n_rot, cs, hp->rope_neox);
            kv_cache_store(kv, seq, il, pos0 + t, fc->k + (size_t)t * EKV, fc->v + (size_t)t * EKV);
        }
        int n_kv = pos0 + n_tokens;
        if (kv_cache_type(kv) == GGML_TYPE_F16 || kv_cache_type(kv) == GGML_TYPE_F32) {
            /* read in place, block by block: decode at depth copies nothing */
            kv_cache_blocks(kv, seq, il, 0, n_kv, fc->kblk);
            kv_cache_blocks(kv, seq, il, 1, n_kv, fc->vblk);
            op_attention_paged(fc->q, fc->kblk, fc->vblk, KV_BLOCK_SIZE, kv_cache_row_bytes(kv), kv_cache_type(kv),
                               fc->att, n_tokens, pos0, hp->n_head, hp->n_head_kv, hp->head_dim, pool);
        } else {
            const float *K = kv_cache_k(kv, seq, il, n_kv, fc->k_tmp), *V = kv_cache_v(kv, seq, il, n_kv, fc->v_tmp);
            op_attention(fc->q, K, V, fc->att, n_tokens, pos0, hp->n_head, hp->n_head_kv, hp->head_dim, pool);
        }
        op_matmul(L->wo, fc->att, n_tokens, fc->xb2, fc->act, pool);
        for (size_t i = 0; i < (size_t)n_tokens * E; i++) fc->x[i] += fc->xb2[i];

        for (int t = 0; t < n_tokens; t++)
            op_rmsnorm(fc->xb + (size_t)t * E, fc->x + (size_t)t * E, L->ffn_norm, E, hp->rms_norm_eps);
        op_matmul(L->w_gate, fc->xb, n_tokens, fc->hb, fc->act, pool);
        op_matmul(L->w_up, fc->xb, n_tokens, fc->hb2, fc->act, pool);
        for (int t = 0; t < n_tokens; t++)
            op_swiglu(fc->hb + (size_t)t * hp->n_ff, fc->hb2 + (size_t)t * hp->n_ff, hp->n_ff);
        op_matmul(L->w_down, fc->hb, n_tokens, fc->xb2, fc->act, pool);
        for (size_t i = 0; i < (size_t)n_tokens * E; i++) fc->x[i] += fc->xb2[i];
    }
    kv_seq_commit(kv, seq, tokens, n_tokens);

    int first = all_logits ? 0 : n_tokens - 1, n_out = n_tokens - first;
    for (int t = first; t < n_tokens; t++)
        op_rmsnorm(fc->xb + (size_t)(t - first) * E, fc->x + (size_t)t * E, m->output_norm, E, hp->rms_norm_eps);
    op_matmul(m->output, fc->xb, n_out, logits, fc->act, pool);
    return KV_OK;
}
