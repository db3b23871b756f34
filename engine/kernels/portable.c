/* portable: the C reference level of the kernel table — every entry, for any CPU; the base the SIMD levels override. */
#include <math.h>
#include <string.h>

#include "engine/kernels/kernels.h"
#include "engine/kernels/quant.h"

#define ROUND64(x) (((x) + 63) & ~(size_t)63)

static void p_vec_dot_rows(int type, int64_t n, int64_t nrows, const void *w, size_t row_stride, const void *x_act,
                           float *out)
{
    for (int64_t r = 0; r < nrows; r++) out[r] = quant_vec_dot_ref(type, n, (const uint8_t *)w + (size_t)r * row_stride, x_act);
}

static void p_fp16_to_fp32_row(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(src[i]);
}

static void p_fp32_to_fp16_row(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = fp32_to_fp16(src[i]);
}

/* The reference SwiGLU: silu(g) = g / (1 + expf(-g)), times up. */
static void p_swiglu(float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* Matmul group without packing: the activation is the vec_dot_type row of quant_quantize_row
 * (F32 as is), and the rows go through the level's vec_dot_rows, which kern() names at the time
 * of the call (so a level that overrides only the dot products still speeds these up). */
static size_t p_act_row_size(int wtype, int64_t n)
{
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || n < 0 || n % qt->block_size) return 0;
    return ROUND64(quant_row_size(qt->vec_dot_type, n));
}

static void p_act_prepare(int wtype, const float *x, int64_t n, void *act)
{
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || n < 0 || n % qt->block_size) return;
    if (qt->vec_dot_type == GGML_TYPE_F32) memcpy(act, x, (size_t)n * 4);
    else kern()->quantize_row(qt->vec_dot_type, x, act, n);
}

static void p_gemv(int wtype, int64_t n, int64_t nrows, const void *w, size_t stride, const void *act, float *out)
{
    kern()->vec_dot_rows(wtype, n, nrows, w, stride, act, out);
}

static void p_gemm(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act,
                   size_t act_stride, int n_tokens, float *out, size_t out_stride)
{
    const kern_ops *k = kern();
    for (int t = 0; t < n_tokens; t++)
        k->vec_dot_rows(wtype, n, nrows, w, w_stride, (const uint8_t *)act + (size_t)t * act_stride,
                        out + (size_t)t * out_stride);
}

static size_t p_pack_size(int wtype, int64_t n, int64_t nrows)
{
    (void)wtype, (void)n, (void)nrows;
    return 0; /* no panel layout: the GGUF rows are used as they are */
}

static void p_pack(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, void *dst)
{
    (void)wtype, (void)n, (void)nrows, (void)w, (void)w_stride, (void)dst;
}

static void p_gemm_packed(int wtype, int64_t n, int64_t row0, int64_t nrows, const void *packed, const void *act,
                          size_t act_stride, int n_tokens, float *out, size_t out_stride)
{
    (void)wtype, (void)n, (void)row0, (void)packed, (void)act, (void)act_stride, (void)out_stride;
    for (int t = 0; t < n_tokens; t++) /* never called: p_pack_size is 0 */
        for (int64_t r = 0; r < nrows; r++) out[(size_t)t * out_stride + r] = NAN;
}

void kern_softmax(float *x, int n)
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

/* Scaled dot-product attention of one tile, as plain loops (Vaswani et al. 2017): per query row,
 * scores over its causal length, softmax, weighted sum of the values. */
/* Element i of the K (or V) row of position p. */
static inline float kv_at(const kern_attn *a, const uint8_t *const *blk, int p, int i)
{
    const uint8_t *row = blk[p >> __builtin_ctz((unsigned)a->bs)] + (size_t)(p & (a->bs - 1)) * a->row_bytes;
    return a->kv_type == GGML_TYPE_F16 ? fp16_to_fp32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

static void p_attn_tile(const kern_attn *a, int g, int t0, int t1, float *S, int ldS, float *KT)
{
    (void)KT;
    const int hd = a->hd, G = a->n_head / a->n_head_kv, E = a->n_head * hd;
    const int nrows = (t1 - t0) * G;
    for (int i = 0; i < nrows; i++) {
        const float *q = a->q + (size_t)(t0 + i / G) * E + (size_t)(g * G + i % G) * hd;
        float *s = S + (size_t)i * ldS, *o = a->out + (size_t)(t0 + i / G) * E + (size_t)(g * G + i % G) * hd;
        int len = a->pos0 + t0 + i / G + 1;
        for (int p = 0; p < len; p++) {
            float acc = 0.0f;
            for (int d = 0; d < hd; d++) acc += q[d] * kv_at(a, a->kb, p, g * hd + d);
            s[p] = acc * a->scale;
        }
        kern_softmax(s, len);
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int p = 0; p < len; p++)
            for (int d = 0; d < hd; d++) o[d] += s[p] * kv_at(a, a->vb, p, g * hd + d);
    }
}

void kern_fill_portable(kern_ops *o)
{
    o->vec_dot = quant_vec_dot_ref;
    o->vec_dot_rows = p_vec_dot_rows;
    o->quantize_row = quant_quantize_row_ref;
    o->dequantize_row = quant_dequantize_row_ref;
    o->fp16_to_fp32_row = p_fp16_to_fp32_row;
    o->fp32_to_fp16_row = p_fp32_to_fp16_row;
    o->act_row_size = p_act_row_size;
    o->act_prepare = p_act_prepare;
    o->gemv = p_gemv;
    o->gemm = p_gemm;
    o->pack_size = p_pack_size;
    o->pack = p_pack;
    o->gemm_packed = p_gemm_packed;
    o->attn_tile = p_attn_tile;
    o->swiglu = p_swiglu;
}
