/* ops: numeric kernels of the forward pass; the per-type inner loops live in quant.c. */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "quant.h"

void op_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void op_rope_cache(float *cs, int pos, int n_rot, float freq_base, const float *freq_factors)
{
    /* theta_i = pos * base^(-2i/n_rot), evaluated as the reference (ggml) does: in single
     * precision by repeated multiplication with base^(-2/n_rot). A double-precision angle
     * differs from it by ~1e-4 rad at positions in the hundreds, which is enough to flip the
     * 8-bit rounding of activations in quantized matmuls and move logits by ~0.1. */
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        float t = freq_factors ? theta / freq_factors[i] : theta;
        cs[2 * i] = cosf(t);
        cs[2 * i + 1] = sinf(t);
        theta *= theta_scale;
    }
}

void op_rope(float *vec, int n_head, int head_dim, int n_rot, const float *cs, int neox)
{
    int half = n_rot / 2;
    for (int h = 0; h < n_head; h++) {
        float *v = vec + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

void op_rope_shift(float *vec, int n_head, int head_dim, int n_rot, int delta, float freq_base,
                   const float *freq_factors, int neox)
{
    float cs[1024];
    if (n_rot > 1024 || delta == 0) {
        if (delta == 0) return;
        /* never happens for real models (n_rot <= head_dim <= 256): rotate pair by pair */
        for (int i = 0; i < n_rot / 2; i++) {
            float c2[2];
            double theta = (double)delta * pow((double)freq_base, -2.0 * i / n_rot);
            if (freq_factors) theta /= freq_factors[i];
            c2[0] = (float)cos(theta), c2[1] = (float)sin(theta);
            for (int h = 0; h < n_head; h++) {
                float *v = vec + (size_t)h * head_dim;
                int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c2[0] - x1 * c2[1];
                v[b] = x0 * c2[1] + x1 * c2[0];
            }
        }
        return;
    }
    op_rope_cache(cs, delta, n_rot, freq_base, freq_factors);
    op_rope(vec, n_head, head_dim, n_rot, cs, neox);
}

void op_softmax(float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void op_swiglu(float *gate, const float *up, int n)
{
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

size_t op_matmul_scratch_size(const gguf_tensor *w, int n_tokens)
{
    const quant_traits *qt = quant_traits_of(w->type);
    return (size_t)n_tokens * quant_row_size(qt->vec_dot_type, w->ne[0]);
}

typedef struct matmul_job {
    const gguf_tensor *w;
    const float *x;
    float *y;
    int n_tokens;
    int64_t n_in, n_out;
    size_t w_row_bytes, act_row_bytes;
    const uint8_t *act;
    int act_is_x;
} matmul_job;

static void matmul_quantize_act(void *arg, int ith, int nth)
{
    matmul_job *j = arg;
    const quant_traits *qt = quant_traits_of(j->w->type);
    long lo, hi;
    tpool_split(j->n_tokens, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        quant_quantize_row(qt->vec_dot_type, j->x + t * j->n_in, (uint8_t *)j->act + t * j->act_row_bytes, j->n_in);
}

/* Each thread takes a contiguous slice of the weight rows; for a batch, the slice is walked
 * in blocks of 16 rows so a block stays in cache while every token's activations pass it. */
#define MATMUL_ROW_BLOCK 16

static void matmul_rows(void *arg, int ith, int nth)
{
    matmul_job *j = arg;
    long lo, hi;
    tpool_split(j->n_out, ith, nth, &lo, &hi);
    const uint8_t *wbase = j->w->data;
    if (j->n_tokens == 1) {
        quant_vec_dot_rows(j->w->type, j->n_in, hi - lo, wbase + (size_t)lo * j->w_row_bytes, j->w_row_bytes, j->act,
                           j->y + lo);
        return;
    }
    float tmp[MATMUL_ROW_BLOCK];
    for (long o = lo; o < hi; o += MATMUL_ROW_BLOCK) {
        long nr = hi - o < MATMUL_ROW_BLOCK ? hi - o : MATMUL_ROW_BLOCK;
        for (int t = 0; t < j->n_tokens; t++) {
            quant_vec_dot_rows(j->w->type, j->n_in, nr, wbase + (size_t)o * j->w_row_bytes, j->w_row_bytes,
                               j->act + t * j->act_row_bytes, tmp);
            memcpy(j->y + (size_t)t * j->n_out + o, tmp, sizeof(float) * (size_t)nr);
        }
    }
}

void op_matmul(const gguf_tensor *w, const float *x, int n_tokens, float *y, void *scratch, tpool *pool)
{
    int64_t n_in = w->ne[0], n_out = w->ne[1];
    if (w->type == GGML_TYPE_F32 && n_tokens > 1) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tokens, (int)n_out, (int)n_in, 1.0f, x, (int)n_in,
                    (const float *)w->data, (int)n_in, 0.0f, y, (int)n_out);
        return;
    }
    const quant_traits *qt = quant_traits_of(w->type);
    matmul_job j = {
        .w = w, .x = x, .y = y, .n_tokens = n_tokens, .n_in = n_in, .n_out = n_out,
        .w_row_bytes = quant_row_size(w->type, n_in),
        .act_row_bytes = quant_row_size(qt->vec_dot_type, n_in),
    };
    if (qt->vec_dot_type == GGML_TYPE_F32) {
        j.act = (const uint8_t *)x;
    } else {
        j.act = scratch;
        if (n_tokens > 1)
            tpool_run(pool, matmul_quantize_act, &j);
        else
            matmul_quantize_act(&j, 0, 1);
    }
    tpool_run(pool, matmul_rows, &j);
}

void op_get_row(const gguf_tensor *w, int64_t row, float *dst)
{
    size_t rb = quant_row_size(w->type, w->ne[0]);
    quant_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)row * rb, dst, w->ne[0]);
}
