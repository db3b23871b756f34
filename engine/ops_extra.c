/* ops_extra: masked, soft-capped and sink attention, YaRN RoPE factors, GeGLU (tanh), gpt-oss's clamped SwiGLU, soft-capping and per-head RMSNorm for the newer architectures. */
#include "ops_extra.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

typedef struct attn_ext_job {
    const float *q, *K, *V;
    float *out;
    int n_tokens, pos0, n_head, n_head_kv, hd, n_swa;
    float scale, softcap;
    const float *sinks; /* [n_head] or NULL */
    tpool *pool;
    atomic_long next; /* the next (query, head) job to take */
} attn_ext_job;

/* Softmax of x[0..n) with one more logit `sink` in the denominator only: x - m (m the max of
 * all n + 1), expf, the sum in double (kern_softmax's order), times its reciprocal. */
static void softmax_sink(float *x, int n, float sink)
{
    float mx = sink;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = (double)expf(sink - mx);
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

static void attn_ext_worker(void *arg, int ith, int nth)
{
    attn_ext_job *j = arg;
    int n_kv = j->pos0 + j->n_tokens, G = j->n_head / j->n_head_kv;
    size_t EQ = (size_t)j->n_head * j->hd, EKV = (size_t)j->n_head_kv * j->hd;
    float *s = tpool_scratch(j->pool, ith, sizeof(float) * (size_t)n_kv), *own = NULL;
    if (!s && !(s = own = malloc(sizeof(float) * (size_t)n_kv))) return;
    long n_jobs = (long)j->n_tokens * j->n_head;
    /* taken in turn from a shared counter: late queries (long rows) spread over the threads, and a
     * descheduled thread is not waited for (tpool_run_shared) */
    (void)nth;
    for (long jb; (jb = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < n_jobs;) {
        int t = (int)(jb / j->n_head), h = (int)(jb % j->n_head), g = h / G;
        int p1 = j->pos0 + t, lo = j->n_swa > 0 && p1 - j->n_swa + 1 > 0 ? p1 - j->n_swa + 1 : 0;
        int len = p1 + 1 - lo;
        const float *qv = j->q + (size_t)t * EQ + (size_t)h * j->hd;
        for (int p = lo; p <= p1; p++) {
            const float *kv = j->K + (size_t)p * EKV + (size_t)g * j->hd;
            /* 8 partial sums: a fixed order the compiler can keep in one vector register */
            float part[8] = {0};
            int d = 0;
            for (; d + 8 <= j->hd; d += 8)
                for (int l = 0; l < 8; l++) part[l] += qv[d + l] * kv[d + l];
            float acc = 0.0f;
            for (; d < j->hd; d++) acc += qv[d] * kv[d];
            for (int l = 0; l < 8; l++) acc += part[l];
            acc *= j->scale;
            if (j->softcap > 0) acc = j->softcap * tanhf(acc / j->softcap);
            s[p - lo] = acc;
        }
        if (j->sinks) softmax_sink(s, len, j->sinks[h]);
        else op_softmax(s, len);
        float *o = j->out + (size_t)t * EQ + (size_t)h * j->hd;
        memset(o, 0, sizeof(float) * (size_t)j->hd);
        for (int p = lo; p <= p1; p++) {
            const float *vv = j->V + (size_t)p * EKV + (size_t)g * j->hd;
            float w = s[p - lo];
            for (int d = 0; d < j->hd; d++) o[d] += w * vv[d];
        }
    }
    free(own);
}

void op_attention_sinks(const float *q, const float *K, const float *V, float *out, int n_tokens, int pos0,
                        int n_head, int n_head_kv, int head_dim, float scale, float softcap, int n_swa,
                        const float *sinks, tpool *pool)
{
    attn_ext_job j = {
        .q = q, .K = K, .V = V, .out = out, .n_tokens = n_tokens, .pos0 = pos0, .n_head = n_head,
        .n_head_kv = n_head_kv, .hd = head_dim, .n_swa = n_swa, .scale = scale, .softcap = softcap,
        .sinks = sinks, .pool = pool,
    };
    atomic_init(&j.next, 0);
    tpool_run_shared(pool, attn_ext_worker, &j);
}

void op_attention_ext(const float *q, const float *K, const float *V, float *out, int n_tokens, int pos0,
                      int n_head, int n_head_kv, int head_dim, float scale, float softcap, int n_swa, tpool *pool)
{
    op_attention_sinks(q, K, V, out, n_tokens, pos0, n_head, n_head_kv, head_dim, scale, softcap, n_swa, NULL, pool);
}

void op_swiglu_oai(float *gate, const float *up, int n, float alpha, float limit)
{
    for (int i = 0; i < n; i++) {
        float g = fminf(gate[i], limit), u = fmaxf(-limit, fminf(up[i], limit));
        gate[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
    }
}

void op_geglu_tanh(float *gate, const float *up, int n)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * up[i];
    }
}

void op_softcap(float *x, int n, float cap)
{
    for (int i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

void op_rmsnorm_heads(float *x, const float *w, int n_head, int head_dim, float eps)
{
    for (int h = 0; h < n_head; h++) op_rmsnorm(x + (size_t)h * head_dim, x + (size_t)h * head_dim, w, head_dim, eps);
}

void op_rope_yarn_factors(float *ff, int n_rot, float freq_base, float factor, int n_ctx_orig, float beta_fast,
                          float beta_slow, float ext_factor, const float *freq_factors)
{
    const float pi = 3.14159265358979323846f;
    /* the pair index at which a pair turns b times over n_ctx_orig positions */
    float d_fast = (float)n_rot * logf((float)n_ctx_orig / (beta_fast * 2 * pi)) / (2 * logf(freq_base));
    float d_slow = (float)n_rot * logf((float)n_ctx_orig / (beta_slow * 2 * pi)) / (2 * logf(freq_base));
    float low = floorf(d_fast), high = ceilf(d_slow);
    if (low < 0) low = 0;
    if (high > (float)(n_rot - 1)) high = (float)(n_rot - 1);
    const float s = 1.0f / factor;
    for (int i = 0; i < n_rot / 2; i++) {
        float y = ((float)i - low) / (high - low > 0.001f ? high - low : 0.001f);
        float ramp = 1.0f - (y < 0 ? 0 : y > 1 ? 1 : y), r = ramp * ext_factor;
        float mix = s * (1.0f - r) + r; /* theta_interp (1 - r) + theta_extrap r = theta_extrap mix */
        ff[i] = (freq_factors ? freq_factors[i] : 1.0f) / mix;
    }
}

static float yarn_m(float f, float k) { return f <= 1.0f ? 1.0f : 0.1f * k * logf(f) + 1.0f; }

float op_rope_yarn_mscale(float factor, float attn_factor, float ext_factor, float log_mul)
{
    if (ext_factor == 0.0f) return attn_factor;
    return attn_factor * (log_mul != 0.0f ? yarn_m(factor, 1.0f) / yarn_m(factor, log_mul) : yarn_m(factor, 1.0f));
}
