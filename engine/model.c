/* model: load a GGUF of one of the supported architectures (hyperparameters, tensors, shape checks) and run its forward pass. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "kernels/quant.h"
#include "ops_extra.h"
#include "forward_segs.h"
#include "fwd_prof.h"

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

/* What each architecture adds to llama, as llama.cpp builds its graph (its per-architecture graph builders) and
 * gguf-py names the keys and tensors. qkv_bias: 0 none, 1 optional, 2 required. */
typedef struct arch_info {
    const char *name;
    int arch, rope_neox, qkv_bias, qk_norm, pre_norm, post_norm, ffn_act, fused;
    int swa_period, no_rope_step, embd_sqrt;
} arch_info;

static const arch_info ARCHS[] = {
    /* name       arch          neox bias qk_norm      pre post act            fused swa nope sqrt */
    {"llama",   ARCH_LLAMA,   0, 1, QK_NORM_NONE, 1, 0, FFN_SILU,      0, 0, 0, 0},
    {"qwen2",   ARCH_QWEN2,   1, 2, QK_NORM_NONE, 1, 0, FFN_SILU,      0, 0, 0, 0},
    {"qwen3",   ARCH_QWEN3,   1, 0, QK_NORM_HEAD, 1, 0, FFN_SILU,      0, 0, 0, 0},
    /* SmolLM3: NoPE every 4th layer; llama.cpp hard-codes the period (no GGUF key says it) */
    {"smollm3", ARCH_SMOLLM3, 0, 0, QK_NORM_NONE, 1, 0, FFN_SILU,      0, 0, 4, 0},
    {"granite", ARCH_GRANITE, 0, 1, QK_NORM_NONE, 1, 0, FFN_SILU,      0, 0, 0, 0},
    {"olmo2",   ARCH_OLMO2,   1, 0, QK_NORM_FULL, 0, 1, FFN_SILU,      0, 0, 0, 0},
    {"gemma2",  ARCH_GEMMA2,  1, 0, QK_NORM_NONE, 1, 1, FFN_GELU_TANH, 0, 2, 0, 1},
    {"gemma3",  ARCH_GEMMA3,  1, 0, QK_NORM_HEAD, 1, 1, FFN_GELU_TANH, 0, 6, 0, 1},
    {"phi3",    ARCH_PHI3,    1, 0, QK_NORM_NONE, 1, 0, FFN_SILU,      1, 0, 0, 0},
    {"qwen2moe", ARCH_QWEN2MOE, 1, 1, QK_NORM_NONE, 1, 0, FFN_SILU,    0, 0, 0, 0},
    {"qwen3moe", ARCH_QWEN3MOE, 1, 0, QK_NORM_HEAD, 1, 0, FFN_SILU,    0, 0, 0, 0},
    {"olmoe",   ARCH_OLMOE,   1, 0, QK_NORM_FULL, 1, 0, FFN_SILU,      0, 0, 0, 0},
    /* Ministral 3 / Mistral Small 3.x: llama + YaRN + query temperature (read below) */
    {"mistral3", ARCH_MISTRAL3, 0, 1, QK_NORM_NONE, 1, 0, FFN_SILU,     0, 0, 0, 0},
    /* InternLM2 / 2.5: llama's graph under its own name (converters split its fused wqkv) */
    {"internlm2", ARCH_INTERNLM2, 0, 1, QK_NORM_NONE, 1, 0, FFN_SILU,   0, 0, 0, 0},
    /* gpt-oss: sliding-window layers alternate with full ones (llama.cpp's swa pattern 2) */
    {"gpt-oss", ARCH_GPTOSS,  1, 2, QK_NORM_NONE, 1, 0, FFN_SILU,      0, 2, 0, 0},
};

/* The mixture-of-experts architectures, as llama.cpp builds them (its build_moe_ffn calls):
 * norm_w: the top-k weights divided by their sum (qwen3moe; hard-coded there, no GGUF key);
 * shared: a shared expert with a sigmoid gate (qwen2moe); ff_exp_key: the experts' width is
 * {arch}.expert_feed_forward_length (default n_ff / n_expert_used), else feed_forward_length (olmoe). */
static const struct { int arch, norm_w, shared, ff_exp_key; } MOE_ARCHS[] = {
    {ARCH_QWEN2MOE, 0, 1, 1},
    {ARCH_QWEN3MOE, 1, 0, 1},
    {ARCH_OLMOE,    0, 0, 0},
    {ARCH_GPTOSS,   0, 0, 1},
};

/* {arch}.expert_count, expert_used_count, the experts' widths (none of them for a dense model). */
static int load_moe_hparams(const gguf_file *f, const char *a, model_hparams *hp, kv_error *err)
{
    int mi = -1, rc;
    for (int i = 0; i < (int)(sizeof MOE_ARCHS / sizeof *MOE_ARCHS); i++)
        if (MOE_ARCHS[i].arch == hp->arch) mi = i;
    if (mi < 0) return KV_OK;
    moe_config *c = &hp->moe;
    if ((rc = get_int(f, a, "expert_count", 1, &c->n_expert, err)) ||
        (rc = get_int(f, a, "expert_used_count", 1, &c->n_expert_used, err)))
        return rc;
    if (c->n_expert < 1 || c->n_expert > 4096 || c->n_expert_used < 1 || c->n_expert_used > c->n_expert)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s.expert_used_count %d must be 1 to %s.expert_count %d (at most 4096)",
                            f->path, a, c->n_expert_used, a, c->n_expert);
    c->gating = hp->arch == ARCH_GPTOSS ? MOE_GATING_SOFTMAX_WEIGHT : MOE_GATING_SOFTMAX;
    c->act = hp->arch == ARCH_GPTOSS ? MOE_ACT_SWIGLU_OAI : MOE_ACT_SILU;
    c->norm_w = MOE_ARCHS[mi].norm_w;
    c->n_ff_exp = MOE_ARCHS[mi].ff_exp_key ? hp->n_ff / c->n_expert_used : hp->n_ff;
    if (MOE_ARCHS[mi].ff_exp_key && (rc = get_int(f, a, "expert_feed_forward_length", 0, &c->n_ff_exp, err))) return rc;
    if (MOE_ARCHS[mi].shared) {
        c->n_ff_shexp = hp->n_ff;
        if ((rc = get_int(f, a, "expert_shared_feed_forward_length", 0, &c->n_ff_shexp, err))) return rc;
    }
    if (c->n_ff_exp < 1 || (MOE_ARCHS[mi].shared && c->n_ff_shexp < 1))
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s.expert_feed_forward_length %d / expert_shared_feed_forward_length %d must be positive",
                            f->path, a, c->n_ff_exp, c->n_ff_shexp);
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

/* A 2-D tensor [ne0, ne1] (per-expert biases) as ne0·ne1 f32 values in m->f32_store at *used. */
static int load_mat_f32(model *m, const char *name, int64_t ne0, int64_t ne1, const float **out, size_t *used,
                        kv_error *err)
{
    const gguf_tensor *t;
    int rc = want_tensor(m, name, ne0, ne1, 0, &t, err);
    *out = NULL;
    if (rc) return rc;
    float *dst = m->f32_store + *used;
    for (int64_t r = 0; r < ne1; r++)
        quant_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * quant_row_size(t->type, ne0),
                             dst + (size_t)r * ne0, ne0);
    for (int64_t i = 0; i < ne0 * ne1; i++)
        if (!isfinite(dst[i]))
            return kv_error_set(err, KV_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value at %lld", m->gguf->path,
                                name, (long long)i);
    *used += (size_t)(ne0 * ne1);
    *out = dst;
    return KV_OK;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* An optional float key that may be any finite value (scales), default kept when absent. */
static int get_float_opt(const gguf_file *f, const char *arch, const char *suffix, float *out, kv_error *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(f, key, 0, out, err);
    if (rc) return rc;
    if (!isfinite(*out))
        return kv_error_set(err, KV_ERR_FORMAT, "%s: metadata '%s' is not a finite number", f->path, key);
    return KV_OK;
}

static int load_hparams(model *m, kv_error *err)
{
    const gguf_file *f = m->gguf;
    model_hparams *hp = &m->hp;
    char *arch = NULL;
    int rc = gguf_get_str(f, "general.architecture", 1, &arch, err);
    if (rc) return rc;
    const arch_info *ai = NULL;
    for (size_t i = 0; i < sizeof ARCHS / sizeof *ARCHS; i++)
        if (strcmp(arch, ARCHS[i].name) == 0) ai = &ARCHS[i];
    if (!ai) {
        rc = kv_error_set(err, KV_ERR_UNSUPPORTED, "%s: architecture '%.64s' is not supported (supported: %s)", f->path,
                          arch, MODEL_ARCHS);
        free(arch);
        return rc;
    }
    free(arch);
    m->arch_name = ai->name;
    hp->arch = ai->arch;
    hp->rope_neox = ai->rope_neox;
    hp->qk_norm = ai->qk_norm;
    hp->pre_norm = ai->pre_norm;
    hp->post_norm = ai->post_norm;
    hp->ffn_act = ai->ffn_act;
    hp->fused = ai->fused;
    hp->swa_period = ai->swa_period;
    hp->no_rope_step = ai->no_rope_step;
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
    if (hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv != 0)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s.attention.head_count_kv %d does not divide head_count %d",
                            f->path, a, hp->n_head_kv, hp->n_head);
    /* head_dim: attention.key_length when present (qwen3, gemma: not n_embd / n_head) */
    hp->head_dim = hp->n_embd % hp->n_head == 0 ? hp->n_embd / hp->n_head : 0;
    if ((rc = get_int(f, a, "attention.key_length", 0, &hp->head_dim, err))) return rc;
    if (hp->head_dim < 1)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s.embedding_length %d is not a multiple of %s.attention.head_count %d and no attention.key_length is given",
                            f->path, a, hp->n_embd, a, hp->n_head);
    int val_len = hp->head_dim;
    if ((rc = get_int(f, a, "attention.value_length", 0, &val_len, err))) return rc;
    if (val_len != hp->head_dim)
        return kv_error_set(err, KV_ERR_UNSUPPORTED, "%s: %s.attention.value_length %d differs from key_length %d (not supported)",
                            f->path, a, val_len, hp->head_dim);
    hp->n_embd_q = hp->n_head * hp->head_dim;
    hp->n_embd_kv = hp->n_head_kv * hp->head_dim;
    hp->n_rot = hp->head_dim;
    if ((rc = get_int(f, a, "rope.dimension_count", 0, &hp->n_rot, err))) return rc;
    if (hp->n_rot < 2 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s.rope.dimension_count %d must be even and at most head_dim %d",
                            f->path, a, hp->n_rot, hp->head_dim);

    /* scales (granite) and the gemma family's */
    hp->embd_scale = ai->embd_sqrt ? sqrtf((float)hp->n_embd) : 1.0f;
    hp->residual_scale = 1.0f;
    hp->logit_scale = 1.0f;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    /* Gemma 2 / 3 27B scale queries by n_embd / n_head, the smaller ones by head_dim (llama.cpp
     * tells them apart by their layer count, as we do) */
    if ((hp->arch == ARCH_GEMMA2 && hp->n_layer == 46) || (hp->arch == ARCH_GEMMA3 && hp->n_layer == 62))
        hp->attn_scale = 1.0f / sqrtf((float)hp->n_embd / (float)hp->n_head);
    if (hp->arch == ARCH_GEMMA2) hp->attn_softcap = 50.0f, hp->final_softcap = 30.0f; /* llama.cpp's defaults */
    if ((rc = get_float_opt(f, a, "embedding_scale", &hp->embd_scale, err)) ||
        (rc = get_float_opt(f, a, "residual_scale", &hp->residual_scale, err)) ||
        (rc = get_float_opt(f, a, "logit_scale", &hp->logit_scale, err)) ||
        (rc = get_float_opt(f, a, "attention.scale", &hp->attn_scale, err)) ||
        (rc = get_float_opt(f, a, "attn_logit_softcapping", &hp->attn_softcap, err)) ||
        (rc = get_float_opt(f, a, "final_logit_softcapping", &hp->final_softcap, err)))
        return rc;
    if (hp->logit_scale == 0.0f)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: metadata '%s.logit_scale' is 0", f->path, a);
    if (hp->swa_period) {
        hp->n_swa = 0;
        if ((rc = get_int(f, a, "attention.sliding_window", 0, &hp->n_swa, err))) return rc;
    }
    hp->rope_freq_base_swa = hp->arch == ARCH_GEMMA3 ? 10000.0f : hp->rope_freq_base;
    if ((rc = get_int(f, a, "rope.scaling.original_context_length", 0, &hp->n_ctx_orig, err))) return rc;
    hp->rope_attn_factor = 1.0f;
    if (hp->arch == ARCH_PHI3 && (rc = get_float(f, a, "rope.scaling.attn_factor", 0, &hp->rope_attn_factor, err)))
        return rc;
    hp->rope_uniform = !hp->no_rope_step && hp->rope_freq_base_swa == hp->rope_freq_base;
    if ((rc = load_moe_hparams(f, a, hp, err))) return rc;
    /* Llama 4-style query temperature (mistral3): steps every original_context_length positions */
    if (hp->arch == ARCH_MISTRAL3) {
        if ((rc = get_float_opt(f, a, "attention.temperature_scale", &hp->attn_temp_scale, err))) return rc;
        hp->attn_temp_len = hp->n_ctx_orig ? hp->n_ctx_orig : hp->n_ctx_train;
    }

    char *name = NULL;
    if ((rc = gguf_get_str(f, "general.name", 0, &name, err))) return rc;
    m->name = name ? name : strdup(base_name(f->path));
    return m->name ? KV_OK : kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", f->path);
}

/* rope.scaling.type = yarn (gpt-oss, mistral3, any architecture whose file says so): the per-pair
 * divisors (m->rope_yarn, n_rot/2 floats taken from m->f32_store at *used, rope_freqs folded in)
 * and the attention factor on RoPE's cos / sin (op_rope_yarn_factors / op_rope_yarn_mscale);
 * other types are left to the architectures that use them. Keys and defaults as llama.cpp reads
 * them: factor, original context (default the training context), yarn_beta_fast 32,
 * yarn_beta_slow 1, yarn_ext_factor 1, yarn_attn_factor 1, yarn_log_multiplier (mistral3: HF's
 * mscale_all_dim). */
static int load_yarn(model *m, size_t *used, kv_error *err)
{
    const gguf_file *f = m->gguf;
    model_hparams *hp = &m->hp;
    const char *a = m->arch_name;
    char key[128], *type = NULL;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    int rc = gguf_get_str(f, key, 0, &type, err);
    if (rc) return rc;
    int yarn = type && strcmp(type, "yarn") == 0;
    free(type);
    if (!yarn) return KV_OK;
    float factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f, ext = 1.0f, attn = 1.0f, log_mul = 0.0f;
    if ((rc = get_float(f, a, "rope.scaling.factor", 1, &factor, err)) ||
        (rc = get_float(f, a, "rope.scaling.yarn_beta_fast", 0, &beta_fast, err)) ||
        (rc = get_float(f, a, "rope.scaling.yarn_beta_slow", 0, &beta_slow, err)) ||
        (rc = get_float_opt(f, a, "rope.scaling.yarn_ext_factor", &ext, err)) ||
        (rc = get_float(f, a, "rope.scaling.yarn_attn_factor", 0, &attn, err)) ||
        (rc = get_float_opt(f, a, "rope.scaling.yarn_log_multiplier", &log_mul, err)))
        return rc;
    if (factor < 1.0f)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s.rope.scaling.factor %g is below 1 (YaRN extends, never shrinks)",
                            f->path, a, factor);
    float *ff = m->f32_store + *used;
    op_rope_yarn_factors(ff, hp->n_rot, hp->rope_freq_base, factor, hp->n_ctx_orig ? hp->n_ctx_orig : hp->n_ctx_train,
                         beta_fast, beta_slow, ext, m->rope_freqs);
    *used += (size_t)hp->n_rot / 2;
    m->rope_yarn = ff;
    hp->rope_attn_factor *= op_rope_yarn_mscale(factor, attn, ext, log_mul);
    return KV_OK;
}

int model_load(const char *path, model **out, kv_error *err)
{
    *out = NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
    int rc = gguf_open(path, &m->gguf, err);
    if (rc || (rc = load_hparams(m, err))) goto fail;
    const model_hparams *hp = &m->hp;
    /* every layer has at least 6 tensors: reject a block_count the file cannot hold before
     * allocating per-layer storage for it */
    if ((uint64_t)hp->n_layer > m->gguf->n_tensors / 6) {
        rc = kv_error_set(err, KV_ERR_FORMAT, "%s: %s.block_count %d needs at least %llu tensors, the file has %llu",
                          path, m->arch_name, hp->n_layer, 6ULL * (unsigned long long)hp->n_layer,
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

    const size_t E = (size_t)hp->n_embd, EQ = (size_t)hp->n_embd_q, EKV = (size_t)hp->n_embd_kv;
    size_t per_layer = 5 * E + 2 * EQ + 3 * EKV; /* every norm and bias a layer may have (+ a shared expert's gate) */
    if (hp->arch == ARCH_GPTOSS) /* sinks, router and expert biases */
        per_layer += (size_t)hp->n_head + (size_t)hp->moe.n_expert * (1 + 2 * (size_t)hp->moe.n_ff_exp + E);
    m->f32_store = malloc(sizeof(float) * (per_layer * hp->n_layer + E + 3 * (size_t)hp->n_rot));
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->f32_store || !m->layers) {
        rc = kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    size_t used = 0;
    if ((rc = load_vec(m, "output_norm.weight", hp->n_embd, 0, &m->output_norm, &used, err)) ||
        (rc = load_vec(m, "rope_freqs.weight", hp->n_rot / 2, 1, &m->rope_freqs, &used, err)))
        goto fail;
    if (hp->arch == ARCH_PHI3) {
        if ((rc = load_vec(m, "rope_factors_long.weight", hp->n_rot / 2, 1, &m->rope_long, &used, err)) ||
            (rc = load_vec(m, "rope_factors_short.weight", hp->n_rot / 2, 1, &m->rope_short, &used, err)))
            goto fail;
    }
    if (hp->arch == ARCH_GEMMA3) {
        /* linear RoPE scaling of the global layers (Gemma 3 4B+: factor 8); sliding layers unscaled */
        float factor = 1.0f;
        if ((rc = get_float(m->gguf, m->arch_name, "rope.scaling.factor", 0, &factor, err))) goto fail;
        if (factor != 1.0f) {
            float *ff = m->f32_store + used;
            for (int i = 0; i < hp->n_rot / 2; i++) ff[i] = factor;
            used += (size_t)hp->n_rot / 2;
            m->rope_freqs_linear = ff;
            m->hp.rope_uniform = 0;
        }
    }
    if ((rc = load_yarn(m, &used, err))) goto fail;
    const int heads = hp->qk_norm == QK_NORM_HEAD;
    for (int il = 0; il < hp->n_layer; il++) {
        model_layer *L = &m->layers[il];
        char nm[96];
        int bias_opt = hp->arch != ARCH_QWEN2 && hp->arch != ARCH_GPTOSS;
#define T2(field, suffix, ne0, ne1)                                                         \
        snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix);                                   \
        if ((rc = want_tensor(m, nm, ne0, ne1, 0, &L->field, err))) goto fail;
#define T1(field, suffix, n, opt)                                                           \
        snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix);                                   \
        if ((rc = load_vec(m, nm, n, opt, &L->field, &used, err))) goto fail;
#define TB(field, suffix, ne0, ne1)                                                         \
        snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix);                                   \
        if ((rc = load_mat_f32(m, nm, ne0, ne1, &L->field, &used, err))) goto fail;
        if (hp->pre_norm) {
            T1(attn_norm, "attn_norm.weight", hp->n_embd, 0)
            /* gpt-oss's FFN norm is named post_attention_norm (it normalises the attention's output) */
            T1(ffn_norm, hp->arch == ARCH_GPTOSS ? "post_attention_norm.weight" : "ffn_norm.weight", hp->n_embd, 0)
        }
        if (hp->post_norm) {
            T1(attn_post_norm, "post_attention_norm.weight", hp->n_embd, 0)
            T1(ffn_post_norm, "post_ffw_norm.weight", hp->n_embd, 0)
        }
        if (hp->qk_norm) {
            T1(q_norm, "attn_q_norm.weight", heads ? hp->head_dim : hp->n_embd_q, 0)
            T1(k_norm, "attn_k_norm.weight", heads ? hp->head_dim : hp->n_embd_kv, 0)
        }
        if (hp->fused) {
            /* phi3: fused attn_qkv when present (older files have separate q, k, v) */
            snprintf(nm, sizeof nm, "blk.%d.attn_qkv.weight", il);
            if ((rc = want_tensor(m, nm, hp->n_embd, hp->n_embd_q + 2 * hp->n_embd_kv, 1, &L->wqkv, err))) goto fail;
        }
        if (!L->wqkv) {
            T2(wq, "attn_q.weight", hp->n_embd, hp->n_embd_q)
            T2(wk, "attn_k.weight", hp->n_embd, hp->n_embd_kv)
            T2(wv, "attn_v.weight", hp->n_embd, hp->n_embd_kv)
        }
        T2(wo, "attn_output.weight", hp->n_embd_q, hp->n_embd)
        if (hp->arch == ARCH_GPTOSS) {
            T1(bo, "attn_output.bias", hp->n_embd, 0)
            T1(sinks, "attn_sinks.weight", hp->n_head, 0)
        }
        if (hp->moe.n_expert) {
            /* router, 3-D experts [, shared expert and its sigmoid gate] (engine/moe.c) */
            if ((rc = moe_find_layer(m->gguf, il, hp->n_embd, &hp->moe, &L->moe, err))) goto fail;
            if (hp->moe.n_ff_shexp) {
                T1(moe.gate_inp_shexp, "ffn_gate_inp_shexp.weight", hp->n_embd, 0)
            }
            if (hp->arch == ARCH_GPTOSS) {
                const int X = hp->moe.n_expert, F = hp->moe.n_ff_exp;
                T1(moe.gate_inp_b, "ffn_gate_inp.bias", X, 0)
                TB(moe.gate_exps_b, "ffn_gate_exps.bias", F, X)
                TB(moe.up_exps_b, "ffn_up_exps.bias", F, X)
                TB(moe.down_exps_b, "ffn_down_exps.bias", hp->n_embd, X)
            }
        } else if (hp->fused) {
            T2(w_up, "ffn_up.weight", hp->n_embd, 2 * hp->n_ff)
        } else {
            T2(w_gate, "ffn_gate.weight", hp->n_embd, hp->n_ff)
            T2(w_up, "ffn_up.weight", hp->n_embd, hp->n_ff)
        }
        if (!hp->moe.n_expert) {
            T2(w_down, "ffn_down.weight", hp->n_ff, hp->n_embd)
        }
        if (ARCHS[hp->arch].qkv_bias) {
            T1(bq, "attn_q.bias", hp->n_embd_q, bias_opt)
            T1(bk, "attn_k.bias", hp->n_embd_kv, bias_opt)
            T1(bv, "attn_v.bias", hp->n_embd_kv, bias_opt)
        }
#undef T1
#undef T2
#undef TB
        L->swa = hp->swa_period && hp->n_swa > 0 && il % hp->swa_period < hp->swa_period - 1;
        L->use_rope = !hp->no_rope_step || (il + 1) % hp->no_rope_step != 0;
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
    m->n_params_active = m->n_params;
    for (int il = 0; il < hp->n_layer && hp->moe.n_expert; il++) {
        const gguf_tensor *ex[] = {m->layers[il].moe.gate_exps, m->layers[il].moe.up_exps, m->layers[il].moe.down_exps};
        for (int i = 0; i < 3; i++)
            m->n_params_active -= (uint64_t)ex[i]->n_elements / (uint64_t)hp->moe.n_expert *
                                  (uint64_t)(hp->moe.n_expert - hp->moe.n_expert_used);
    }
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
    /* MoE: each token reads n_expert_used of the n_expert matrices of every 3-D expert tensor */
    for (int il = 0; il < m->hp.n_layer && m->hp.moe.n_expert; il++) {
        const moe_layer *L = &m->layers[il].moe;
        const gguf_tensor *ex[] = {L->gate_exps, L->up_exps, L->down_exps};
        for (int i = 0; i < 3; i++) b += ex[i]->nbytes / (uint64_t)m->hp.moe.n_expert * (uint64_t)m->hp.moe.n_expert_used;
    }
    if (m->output == m->tok_embd) b += m->tok_embd->nbytes;
    return b;
}

/* ---- forward pass ---------------------------------------------------------------------- */

uint8_t *model_swa_layers(const model *m, int *n_swa)
{
    *n_swa = 0;
    int any = 0;
    for (int il = 0; il < m->hp.n_layer; il++) any |= m->layers[il].swa;
    if (!any || m->hp.n_swa < 1) return NULL;
    uint8_t *f = malloc((size_t)m->hp.n_layer);
    if (!f) return NULL;
    for (int il = 0; il < m->hp.n_layer; il++) f[il] = m->layers[il].swa != 0;
    *n_swa = m->hp.n_swa;
    return f;
}

const float *model_rope_factors(const model *m, int n_ctx)
{
    if (m->rope_long && m->rope_short) return n_ctx > m->hp.n_ctx_orig ? m->rope_long : m->rope_short;
    if (m->rope_long || m->rope_short) return m->rope_long ? m->rope_long : m->rope_short;
    return m->rope_yarn ? m->rope_yarn : m->rope_freqs;
}

struct forward_ctx {
    int n_batch, n_ctx;
    float *x;       /* [n_batch][n_embd] residual stream */
    float *xb;      /* [n_batch][n_embd] normed input */
    float *xb2;     /* [n_batch][n_embd] */
    float *q;       /* [n_batch][n_embd_q] */
    float *k, *v;   /* [n_batch][n_embd_kv] */
    float *qkv;     /* [n_batch][n_embd_q + 2 n_embd_kv] fused projection (phi3) or NULL */
    float *att;     /* [n_batch][n_embd_q] attention output */
    float *hb, *hb2;/* [n_batch][n_ff]; hb2 is [n_batch][2 n_ff] for a fused gate|up */
    float *rope_cs; /* [n_batch][n_rot] */
    float *rope_cs_swa; /* [n_batch][n_rot] for sliding layers with their own RoPE (gemma3) or NULL */
    const float *rope_factors, *rope_factors_swa; /* chosen for n_ctx (model_rope_factors) */
    float *k_tmp, *v_tmp; /* [n_ctx][n_embd_kv]: f32 copies of the cache's rows where attention needs them */
    const uint8_t **kblk, **vblk; /* [n_ctx / KV_BLOCK_SIZE + 1]: where an F16 / F32 cache keeps them */
    void *act;      /* activation conversion scratch */
    int *ib0, *ib1, *ib2; /* [n_batch] each: batch bookkeeping (forward_segs.h) */
    int32_t *itok;  /* [n_batch] tokens in segment order */
    fwd_seg *segs;  /* [n_batch] */
    op_attn_seq *aseq;      /* [n_batch]: the sequences of one batched paged attention */
    const uint8_t **mblk;   /* their K and V block pointers, grown as needed */
    size_t mblk_cap;
    int (*abort_cb)(void *ud); /* forward_ctx_set_abort: polled between layers (NULL: never) */
    void *abort_ud;
    moe_scratch *moe;         /* MoE FFN buffers, or NULL (dense) */
    uint32_t *expert_counts;  /* [n_layer][n_expert] selections since the last reset, or NULL */
    int n_layer, n_expert;
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
        const gguf_tensor *ws[] = {L->wq, L->wk, L->wv, L->wqkv, L->wo, L->w_gate, L->w_up, L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
            if (!ws[i]) continue;
            size_t s = op_matmul_scratch_size(ws[i], n_batch);
            act = s > act ? s : act;
        }
    }
    size_t so = op_matmul_scratch_size(m->output, n_batch);
    act = so > act ? so : act;
    int n_multi = n_batch < OP_MULTI_MAX_TOKENS ? n_batch : OP_MULTI_MAX_TOKENS;
    for (int il = 0; il < hp->n_layer; il++) { /* decode steps' fused passes (op_matmul_multi) */
        const model_layer *L = &m->layers[il];
        if (L->wq && L->wk && L->wv) {
            const gguf_tensor *qkv[] = {L->wq, L->wk, L->wv};
            size_t s = op_matmul_multi_scratch_size(qkv, 3, n_multi);
            act = s > act ? s : act;
        }
        if (L->w_gate && L->w_up) {
            const gguf_tensor *gu[] = {L->w_gate, L->w_up};
            size_t s = op_matmul_multi_scratch_size(gu, 2, n_multi);
            act = s > act ? s : act;
        }
    }
    size_t ff2 = hp->fused ? 2 * (size_t)hp->n_ff : (size_t)hp->n_ff;
    if (!(fc->x = malloc(sizeof(float) * B * hp->n_embd)) || !(fc->xb = malloc(sizeof(float) * B * hp->n_embd)) ||
        !(fc->xb2 = malloc(sizeof(float) * B * hp->n_embd)) || !(fc->q = malloc(sizeof(float) * B * hp->n_embd_q)) ||
        !(fc->k = malloc(sizeof(float) * B * hp->n_embd_kv)) || !(fc->v = malloc(sizeof(float) * B * hp->n_embd_kv)) ||
        !(fc->att = malloc(sizeof(float) * B * hp->n_embd_q)) || !(fc->hb = malloc(sizeof(float) * B * hp->n_ff)) ||
        !(fc->hb2 = malloc(sizeof(float) * B * ff2)) ||
        !(fc->rope_cs = malloc(sizeof(float) * B * hp->n_rot)) ||
        !(fc->k_tmp = malloc(sizeof(float) * (size_t)n_ctx * hp->n_embd_kv)) ||
        !(fc->v_tmp = malloc(sizeof(float) * (size_t)n_ctx * hp->n_embd_kv)) || !(fc->act = malloc(act ? act : 1)) ||
        !(fc->kblk = malloc(sizeof *fc->kblk * ((size_t)n_ctx / KV_BLOCK_SIZE + 1))) ||
        !(fc->vblk = malloc(sizeof *fc->vblk * ((size_t)n_ctx / KV_BLOCK_SIZE + 1))) ||
        !(fc->ib0 = malloc(sizeof(int) * B)) || !(fc->ib1 = malloc(sizeof(int) * B)) ||
        !(fc->ib2 = malloc(sizeof(int) * B)) || !(fc->itok = malloc(sizeof(int32_t) * B)) ||
        !(fc->segs = malloc(sizeof *fc->segs * B)) || !(fc->aseq = malloc(sizeof *fc->aseq * B)))
        goto nomem;
    if (hp->moe.n_expert) {
        model_layer *L0 = m->layers;
        moe_layer *ml = malloc(sizeof *ml * (size_t)hp->n_layer);
        if (!ml) goto nomem;
        for (int il = 0; il < hp->n_layer; il++) ml[il] = L0[il].moe;
        fc->moe = moe_scratch_create(&hp->moe, hp->n_embd, n_batch, ml, hp->n_layer, err);
        free(ml);
        if (!fc->moe) {
            forward_ctx_free(fc);
            return NULL;
        }
        fc->n_layer = hp->n_layer;
        fc->n_expert = hp->moe.n_expert;
        if (!(fc->expert_counts = calloc((size_t)hp->n_layer * hp->moe.n_expert, sizeof(uint32_t)))) goto nomem;
    }
    if (hp->fused && !(fc->qkv = malloc(sizeof(float) * B * (hp->n_embd_q + 2 * (size_t)hp->n_embd_kv)))) goto nomem;
    fc->rope_factors = model_rope_factors(m, n_ctx);
    fc->rope_factors_swa = fc->rope_factors;
    if (m->rope_freqs_linear) fc->rope_factors = m->rope_freqs_linear; /* global layers only */
    if (hp->rope_freq_base_swa != hp->rope_freq_base || fc->rope_factors_swa != fc->rope_factors)
        if (!(fc->rope_cs_swa = malloc(sizeof(float) * B * hp->n_rot))) goto nomem;
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
    free(fc->qkv); free(fc->hb); free(fc->hb2); free(fc->rope_cs); free(fc->rope_cs_swa);
    free(fc->k_tmp); free(fc->v_tmp); free(fc->kblk); free(fc->vblk);
    free(fc->act); free(fc->ib0); free(fc->ib1); free(fc->ib2); free(fc->itok); free(fc->segs);
    free(fc->aseq); free(fc->mblk);
    moe_scratch_free(fc->moe);
    free(fc->expert_counts);
    free(fc);
}

int forward_ctx_n_batch(const forward_ctx *fc) { return fc->n_batch; }

void forward_ctx_batch_scratch(forward_ctx *fc, int **i0, int **i1, int **i2, int32_t **toks, fwd_seg **segs)
{
    *i0 = fc->ib0;
    *i1 = fc->ib1;
    *i2 = fc->ib2;
    *toks = fc->itok;
    *segs = fc->segs;
}

moe_scratch *forward_ctx_moe(forward_ctx *fc) { return fc->moe; }

void forward_ctx_set_abort(forward_ctx *fc, int (*abort_cb)(void *ud), void *ud)
{
    fc->abort_cb = abort_cb;
    fc->abort_ud = ud;
}

const uint32_t *forward_ctx_expert_counts(const forward_ctx *fc, int *n_layer, int *n_expert)
{
    *n_layer = fc->expert_counts ? fc->n_layer : 0;
    *n_expert = fc->expert_counts ? fc->n_expert : 0;
    return fc->expert_counts;
}

void forward_ctx_expert_counts_reset(forward_ctx *fc)
{
    if (fc->expert_counts) memset(fc->expert_counts, 0, sizeof(uint32_t) * (size_t)fc->n_layer * fc->n_expert);
}

static void add_bias(float *y, const float *b, int n_tokens, int n)
{
    if (!b) return;
    for (int t = 0; t < n_tokens; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * n + i] += b[i];
}

static void scale_vec(float *x, size_t n, float s)
{
    if (s == 1.0f) return;
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* A stop asked for mid-pass (forward_ctx_set_abort): the pool stopped too (the same callback is
 * its cancellation during the layers), so the last op's output may be cut short. Nothing is
 * committed: the positions stay unfilled (the layers already stored wrote only reserved,
 * uncounted slots). */
static int stopped(forward_ctx *fc, tpool *pool, int il, int n_layer, kv_error *err)
{
    if (!fc->abort_cb || !fc->abort_cb(fc->abort_ud)) return 0;
    tpool_set_cancel(pool, NULL, NULL);
    kv_error_set(err, KV_ERR_CANCELLED, "forward: stopped in layer %d of %d", il + 1, n_layer);
    return 1;
}
#define STOP_POINT()                                        \
    do {                                                    \
        if (stopped(fc, pool, il, hp->n_layer, err)) return KV_ERR_CANCELLED; \
    } while (0)

/* x += s * post_norm(y) for each token (the norm when w is not NULL) */
static void residual_add(float *x, float *y, const float *w, float s, int n_tokens, int E, float eps)
{
    for (int t = 0; t < n_tokens; t++) {
        float *yt = y + (size_t)t * E, *xt = x + (size_t)t * E;
        if (w) op_rmsnorm(yt, yt, w, E, eps);
        for (int i = 0; i < E; i++) xt[i] += s * yt[i];
    }
}

int model_forward(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens,
                  int n_tokens, float *logits, int all_logits, kv_error *err)
{
    return model_forward_seq(m, fc, kv, KV_SEQ_DEFAULT, pool, tokens, n_tokens, logits, all_logits, err);
}

int model_forward_seq(const model *m, forward_ctx *fc, kv_cache *kv, int seq, tpool *pool, const int32_t *tokens,
                      int n_tokens, float *logits, int all_logits, kv_error *err)
{
    if (n_tokens < 1 || n_tokens > fc->n_batch)
        return kv_error_set(err, KV_ERR_INVALID, "forward: batch of %d tokens (1 to %d allowed)", n_tokens, fc->n_batch);
    fwd_seg seg = {.seq = seq, .row0 = 0, .n_rows = n_tokens};
    int first = all_logits ? 0 : n_tokens - 1;
    for (int t = first; t < n_tokens; t++) fc->ib2[t - first] = t;
    return model_forward_segs(m, fc, kv, pool, tokens, n_tokens, &seg, 1, fc->ib2, n_tokens - first, logits, err);
}

/* Paged attention of every segment in one op_attention_paged_multi; 0, or -1 (out of memory:
 * the caller runs them one by one). */
static int attention_multi(forward_ctx *fc, kv_cache *kv, int il, const fwd_seg *segs, int n_segs,
                           const model_hparams *hp, tpool *pool)
{
    size_t need = 0;
    for (int g = 0; g < n_segs; g++) need += 2 * (size_t)((segs[g].pos0 + segs[g].n_rows + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE);
    if (need > fc->mblk_cap) {
        const uint8_t **nb = realloc(fc->mblk, sizeof *nb * need * 2);
        if (!nb) return -1;
        fc->mblk = nb;
        fc->mblk_cap = need * 2;
    }
    const uint8_t **p = fc->mblk;
    const int EQ = hp->n_embd_q;
    for (int g = 0; g < n_segs; g++) {
        int n_kv = segs[g].pos0 + segs[g].n_rows, nb = (n_kv + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE;
        kv_cache_blocks(kv, segs[g].seq, il, 0, n_kv, p);
        kv_cache_blocks(kv, segs[g].seq, il, 1, n_kv, p + nb);
        fc->aseq[g] = (op_attn_seq){.q = fc->q + (size_t)segs[g].row0 * EQ, .out = fc->att + (size_t)segs[g].row0 * EQ,
                                    .kb = p, .vb = p + nb, .n_tokens = segs[g].n_rows, .pos0 = segs[g].pos0};
        p += 2 * nb;
    }
    return op_attention_paged_multi(fc->aseq, n_segs, KV_BLOCK_SIZE, kv_cache_row_bytes(kv), kv_cache_type(kv),
                                    hp->n_head, hp->n_head_kv, hp->head_dim, pool);
}

/* The pass itself; model_forward_segs tells op_weights_pass when it begins and ends. */
static int forward_pass(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens, int n_rows,
                        fwd_seg *segs, int n_segs, const int *out_rows, int n_out, float *logits, kv_error *err);

int model_forward_segs(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens, int n_rows,
                       fwd_seg *segs, int n_segs, const int *out_rows, int n_out, float *logits, kv_error *err)
{
    /* the first pass runs on the matrices packed so far; a later one finishes the packing first */
    op_weights_pass(m->packed, 1);
    int rc = forward_pass(m, fc, kv, pool, tokens, n_rows, segs, n_segs, out_rows, n_out, logits, err);
    op_weights_pass(m->packed, 0);
    return rc;
}

static int forward_pass(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens, int n_rows,
                        fwd_seg *segs, int n_segs, const int *out_rows, int n_out, float *logits, kv_error *err)
{
    const model_hparams *hp = &m->hp;
    const int n_tokens = n_rows;
    if (n_tokens < 1 || n_tokens > fc->n_batch)
        return kv_error_set(err, KV_ERR_INVALID, "forward: batch of %d tokens (1 to %d allowed)", n_tokens, fc->n_batch);
    for (int g = 0; g < n_segs; g++) {
        fwd_seg *sg = &segs[g];
        if (!kv_seq_valid(kv, sg->seq)) return kv_error_set(err, KV_ERR_INVALID, "forward: no KV sequence %d", sg->seq);
        sg->pos0 = kv_seq_n_tokens(kv, sg->seq);
        if (sg->pos0 + sg->n_rows > kv_cache_n_ctx(kv) || sg->pos0 + sg->n_rows > fc->n_ctx)
            return kv_error_set(err, KV_ERR_CONTEXT, "context is full: %d + %d tokens exceed n_ctx %d%s", sg->pos0,
                                sg->n_rows, kv_cache_n_ctx(kv) < fc->n_ctx ? kv_cache_n_ctx(kv) : fc->n_ctx,
                                n_segs > 1 ? " (a sequence of the batch)" : "");
    }
    const int E = hp->n_embd, EQ = hp->n_embd_q, EKV = hp->n_embd_kv, HD = hp->head_dim, FF = hp->n_ff;
    FWD_PROF_BEGIN();
    for (int t = 0; t < n_tokens; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return kv_error_set(err, KV_ERR_INVALID, "forward: token id %d out of range (n_vocab %d)", tokens[t],
                                hp->n_vocab);
    for (int g = 0; g < n_segs; g++)
        for (int j = 0; j < segs[g].n_rows; j++) {
            int t = segs[g].row0 + j, pos = segs[g].pos0 + j;
            op_get_row(m->tok_embd, tokens[t], fc->x + (size_t)t * E);
            scale_vec(fc->x + (size_t)t * E, (size_t)E, hp->embd_scale);
            op_rope_cache(fc->rope_cs + (size_t)t * hp->n_rot, pos, hp->n_rot, hp->rope_freq_base, fc->rope_factors);
            /* LongRoPE's attention factor scales the rotation (q and k alike); a context shift's
             * re-rotation (op_rope_shift) is a pure rotation and keeps it */
            scale_vec(fc->rope_cs + (size_t)t * hp->n_rot, (size_t)hp->n_rot, hp->rope_attn_factor);
            if (fc->rope_cs_swa)
                op_rope_cache(fc->rope_cs_swa + (size_t)t * hp->n_rot, pos, hp->n_rot, hp->rope_freq_base_swa,
                              fc->rope_factors_swa);
        }
    for (int g = 0; g < n_segs; g++) { /* blocks for the new positions (paged cache) */
        int rc = kv_seq_reserve(kv, segs[g].seq, segs[g].n_rows, err);
        if (rc) return rc;
    }
    const float def_scale = 1.0f / sqrtf((float)HD);
    int n_segs_left;
    /* with an abort callback the pool stops too, between its work chunks (tpool_set_cancel), and
     * the pass looks at it after every op: a stop waits for one chunk of one matmul */
    if (fc->abort_cb) tpool_set_cancel(pool, fc->abort_cb, fc->abort_ud);
    int il = 0;
    for (il = 0; il < hp->n_layer; il++) {
        const model_layer *L = &m->layers[il];
        if (il > 0) STOP_POINT();
        /* attention block: [norm] -> q, k, v [+ bias] [-> q/k norm] [-> RoPE] -> attention -> wo */
        FWD_PROF_MARK(FP_EMBD);
        const float *in = fc->x;
        if (L->attn_norm) {
            for (int t = 0; t < n_tokens; t++)
                op_rmsnorm(fc->xb + (size_t)t * E, fc->x + (size_t)t * E, L->attn_norm, E, hp->rms_norm_eps);
            in = fc->xb;
        }
        FWD_PROF_MARK(FP_NORM);
        if (L->wqkv) {
            const int W = EQ + 2 * EKV;
            op_matmul(L->wqkv, in, n_tokens, fc->qkv, fc->act, pool);
            for (int t = 0; t < n_tokens; t++) {
                const float *r = fc->qkv + (size_t)t * W;
                memcpy(fc->q + (size_t)t * EQ, r, sizeof(float) * EQ);
                memcpy(fc->k + (size_t)t * EKV, r + EQ, sizeof(float) * EKV);
                memcpy(fc->v + (size_t)t * EKV, r + EQ + EKV, sizeof(float) * EKV);
            }
        } else {
            /* a decode step (one token per sequence): q, k and v in one pool pass */
            const gguf_tensor *qkv[] = {L->wq, L->wk, L->wv};
            float *ys[] = {fc->q, fc->k, fc->v};
            if (n_tokens > OP_MULTI_MAX_TOKENS || op_matmul_multi(qkv, 3, in, n_tokens, ys, 0, fc->act, pool) != 0) {
                op_matmul(L->wq, in, n_tokens, fc->q, fc->act, pool);
                op_matmul(L->wk, in, n_tokens, fc->k, fc->act, pool);
                op_matmul(L->wv, in, n_tokens, fc->v, fc->act, pool);
            }
        }
        STOP_POINT();
        add_bias(fc->q, L->bq, n_tokens, EQ);
        add_bias(fc->k, L->bk, n_tokens, EKV);
        add_bias(fc->v, L->bv, n_tokens, EKV);
        FWD_PROF_MARK(FP_QKV);
        const float *cs_all = L->swa && fc->rope_cs_swa ? fc->rope_cs_swa : fc->rope_cs;
        for (int g = 0; g < n_segs; g++)
        for (int t = segs[g].row0; t < segs[g].row0 + segs[g].n_rows; t++) {
            float *qt = fc->q + (size_t)t * EQ, *kt = fc->k + (size_t)t * EKV;
            if (hp->qk_norm == QK_NORM_HEAD) {
                op_rmsnorm_heads(qt, L->q_norm, hp->n_head, HD, hp->rms_norm_eps);
                op_rmsnorm_heads(kt, L->k_norm, hp->n_head_kv, HD, hp->rms_norm_eps);
            } else if (hp->qk_norm == QK_NORM_FULL) {
                op_rmsnorm(qt, qt, L->q_norm, EQ, hp->rms_norm_eps);
                op_rmsnorm(kt, kt, L->k_norm, EKV, hp->rms_norm_eps);
            }
            if (L->use_rope) {
                const float *cs = cs_all + (size_t)t * hp->n_rot;
                op_rope(qt, hp->n_head, HD, hp->n_rot, cs, hp->rope_neox);
                op_rope(kt, hp->n_head_kv, HD, hp->n_rot, cs, hp->rope_neox);
            }
            int pos = segs[g].pos0 + (t - segs[g].row0);
            if (hp->attn_temp_scale != 0.0f) /* mistral3: the query's temperature at its position */
                scale_vec(qt, (size_t)EQ,
                          (float)(1.0 + hp->attn_temp_scale * log(floor((double)pos / hp->attn_temp_len) + 1.0)));
            kv_cache_store(kv, segs[g].seq, il, pos, kt, fc->v + (size_t)t * EKV);
        }
        FWD_PROF_MARK(FP_ROPE);
        int paged = kv_cache_type(kv) == GGML_TYPE_F16 || kv_cache_type(kv) == GGML_TYPE_F32;
        int ext = hp->attn_softcap > 0 || L->swa || L->sinks;
        /* op_attention scales by 1/sqrt(head_dim): fold any other query scale into q */
        if (!ext && hp->attn_scale != def_scale) scale_vec(fc->q, (size_t)n_tokens * EQ, hp->attn_scale / def_scale);
        /* attention per sequence, over its own blocks (the batch's other rows are not its history);
         * several sequences of a paged cache go in one dispatch over the pool */
        if (!ext && paged && n_segs > 1 && attention_multi(fc, kv, il, segs, n_segs, hp, pool) == 0) n_segs_left = 0;
        else n_segs_left = n_segs;
        for (int g = 0; g < n_segs_left; g++) {
            const int seq = segs[g].seq, pos0 = segs[g].pos0, nt = segs[g].n_rows;
            const float *q = fc->q + (size_t)segs[g].row0 * EQ;
            float *att = fc->att + (size_t)segs[g].row0 * EQ;
            int n_kv = pos0 + nt;
            /* a sliding layer's first query (position pos0) reads nothing before pos0 - n_swa + 1 */
            int kv_lo = L->swa && pos0 - hp->n_swa + 1 > 0 ? pos0 - hp->n_swa + 1 : 0;
            if (ext) {
                const float *K = kv_cache_k_from(kv, seq, il, kv_lo, n_kv, fc->k_tmp);
                const float *V = kv_cache_v_from(kv, seq, il, kv_lo, n_kv, fc->v_tmp);
                op_attention_sinks(q, K, V, att, nt, pos0, hp->n_head, hp->n_head_kv, HD, hp->attn_scale,
                                   hp->attn_softcap, L->swa ? hp->n_swa : 0, L->sinks, pool);
            } else if (paged) { /* read in place, block by block: decode at depth copies nothing */
                kv_cache_blocks(kv, seq, il, 0, n_kv, fc->kblk);
                kv_cache_blocks(kv, seq, il, 1, n_kv, fc->vblk);
                op_attention_paged(q, fc->kblk, fc->vblk, KV_BLOCK_SIZE, kv_cache_row_bytes(kv), kv_cache_type(kv),
                                   att, nt, pos0, hp->n_head, hp->n_head_kv, HD, pool);
            } else {
                const float *K = kv_cache_k(kv, seq, il, n_kv, fc->k_tmp), *V = kv_cache_v(kv, seq, il, n_kv, fc->v_tmp);
                op_attention(q, K, V, att, nt, pos0, hp->n_head, hp->n_head_kv, HD, pool);
            }
        }
        FWD_PROF_MARK(FP_ATTN);
        STOP_POINT();
        op_matmul(L->wo, fc->att, n_tokens, fc->xb2, fc->act, pool);
        STOP_POINT();
        add_bias(fc->xb2, L->bo, n_tokens, E);
        FWD_PROF_MARK(FP_WO);
        residual_add(fc->x, fc->xb2, L->attn_post_norm, hp->residual_scale, n_tokens, E, hp->rms_norm_eps);

        /* FFN block: [norm] -> act(gate) * up -> down [-> norm] */
        in = fc->x;
        if (L->ffn_norm) {
            for (int t = 0; t < n_tokens; t++)
                op_rmsnorm(fc->xb + (size_t)t * E, fc->x + (size_t)t * E, L->ffn_norm, E, hp->rms_norm_eps);
            in = fc->xb;
        }
        FWD_PROF_MARK(FP_NORM);
        if (L->moe.gate_inp) {
            /* mixture of experts: router, top-k, the selected experts [+ shared expert] */
            moe_ffn(&hp->moe, &L->moe, in, n_tokens, fc->xb2, fc->moe,
                    fc->expert_counts + (size_t)il * fc->n_expert, pool);
        } else if (!L->w_gate) {
            /* fused gate|up: the first n_ff outputs are the gate, the next n_ff the up projection */
            op_matmul(L->w_up, in, n_tokens, fc->hb2, fc->act, pool);
            for (int t = 0; t < n_tokens; t++) {
                float *g = fc->hb2 + (size_t)t * 2 * FF;
                memcpy(fc->hb + (size_t)t * FF, g, sizeof(float) * FF);
                if (hp->ffn_act == FFN_GELU_TANH) op_geglu_tanh(fc->hb + (size_t)t * FF, g + FF, FF);
                else op_swiglu(fc->hb + (size_t)t * FF, g + FF, FF);
            }
        } else {
            const gguf_tensor *gu[] = {L->w_gate, L->w_up};
            float *ys[] = {fc->hb, fc->hb2};
            /* a decode step: gate, up and SwiGLU in one pool pass, chunk by chunk */
            if (n_tokens <= OP_MULTI_MAX_TOKENS && hp->ffn_act != FFN_GELU_TANH &&
                op_matmul_multi(gu, 2, in, n_tokens, ys, 1, fc->act, pool) == 0) {
                FWD_PROF_MARK(FP_FFN_UP);
            } else {
                op_matmul(L->w_gate, in, n_tokens, fc->hb, fc->act, pool);
                STOP_POINT();
                op_matmul(L->w_up, in, n_tokens, fc->hb2, fc->act, pool);
                FWD_PROF_MARK(FP_FFN_UP);
                if (hp->ffn_act == FFN_GELU_TANH)
                    for (int t = 0; t < n_tokens; t++)
                        op_geglu_tanh(fc->hb + (size_t)t * FF, fc->hb2 + (size_t)t * FF, FF);
                else op_swiglu_pool(fc->hb, fc->hb2, (size_t)n_tokens * FF, pool);
            }
        }
        FWD_PROF_MARK(FP_FFN_ACT);
        STOP_POINT();
        if (!L->moe.gate_inp) op_matmul(L->w_down, fc->hb, n_tokens, fc->xb2, fc->act, pool);
        FWD_PROF_MARK(FP_FFN_DOWN);
        residual_add(fc->x, fc->xb2, L->ffn_post_norm, hp->residual_scale, n_tokens, E, hp->rms_norm_eps);
        FWD_PROF_MARK(FP_NORM);
    }
    il = hp->n_layer - 1;
    STOP_POINT(); /* the last op may have been cut short */
    if (fc->abort_cb) tpool_set_cancel(pool, NULL, NULL);
    for (int g = 0; g < n_segs; g++) kv_seq_commit(kv, segs[g].seq, tokens + segs[g].row0, segs[g].n_rows);

    if (n_out < 1) return KV_OK;
    for (int k = 0; k < n_out; k++)
        op_rmsnorm(fc->xb + (size_t)k * E, fc->x + (size_t)out_rows[k] * E, m->output_norm, E, hp->rms_norm_eps);
    op_matmul(m->output, fc->xb, n_out, logits, fc->act, pool);
    size_t n_logits = (size_t)n_out * hp->n_vocab;
    if (hp->logit_scale != 1.0f) scale_vec(logits, n_logits, 1.0f / hp->logit_scale);
    if (hp->final_softcap > 0) op_softcap(logits, (int)n_logits, hp->final_softcap);
    FWD_PROF_MARK(FP_LOGITS);
    return KV_OK;
}
