/* arm_neon: aarch64 Advanced SIMD kernels — dot products, activation quantizers, fp16/bf16 rows; built three times (NEON, +dotprod, +i8mm). */
/*
 * One source, three kernel levels (engine/kernels/kernels.h):
 *   this file as it is           kern_fill_arm_neon     baseline Armv8-A Advanced SIMD
 *   arm_dotprod.c (KERN_DOTPROD) kern_fill_arm_dotprod  + SDOT (-march=armv8.2-a+dotprod)
 *   arm_i8mm.c (KERN_I8MM)       kern_fill_arm_i8mm     + SMMLA (-march=armv8.6-a+dotprod+i8mm)
 * Outside aarch64 builds each fill function is a no-op (the entries stay the portable ones).
 *
 * Entries overridden: vec_dot and vec_dot_rows for F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K
 * and Q6_K; quantize_row for the activation formats F32, F16, BF16, Q8_0 and Q8_K; dequantize_row
 * for F16 and BF16; the fp16 row conversions; at the i8mm level also gemm for Q8_0 / Q4_0 / MXFP4
 * (2 rows × 2 tokens per SMMLA; MXFP4's codes looked up with tbl). Every other type goes to the
 * entry this level replaced (the portable reference). The rest of the matmul group and attention stay the portable ones, which call these
 * dot products through kern()->vec_dot_rows.
 *
 * Arithmetic, against the scalar reference (engine/kernels/quant_ref.c):
 *   - integer block sums are exact: int8 products through SMULL + SADALP (baseline: 16-bit
 *     products, exact since |w|,|x| <= 128) or SDOT (dotprod), int32 accumulation;
 *   - Q4_0 / Q5_0 / Q8_0 then scale block after block as the reference does,
 *     acc = fma(d_w·d_x, Σ_block, acc), so results are bit-identical to it;
 *   - K-quants sum a super-block in integers and scale it with the reference's own float
 *     expression (bit-identical as well);
 *   - F32 / F16 / BF16 dot products use 4 × 4 fp32 FMA lanes (the reference: one sequential sum),
 *     so they agree to float summation order only;
 *   - quantizers round as the reference: RNE conversions (FCVTNS, FCVTN) give what nearest_int and
 *     fp32_to_fp16 give, amax uses FMAXNM (NaN ignored, as fmaxf), Q8_K keeps the first element of
 *     largest magnitude.
 * Intrinsics as specified in Arm's "Arm C Language Extensions" / NEON intrinsics reference.
 */
#include "engine/kernels/kernels.h"

#if defined(KERN_I8MM)
#define FILL_FN kern_fill_arm_i8mm
#elif defined(KERN_DOTPROD)
#define FILL_FN kern_fill_arm_dotprod
#else
#define FILL_FN kern_fill_arm_neon
#endif

#if !defined(__aarch64__)

void FILL_FN(kern_ops *o) { (void)o; }

#else

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "engine/kernels/quant.h"

#if defined(KERN_DOTPROD) && !defined(__ARM_FEATURE_DOTPROD)
#error "arm_dotprod.c needs -march=armv8.2-a+dotprod (Makefile KFLAGS_arm_dotprod)"
#endif
#if defined(KERN_I8MM) && !(defined(__ARM_FEATURE_DOTPROD) && defined(__ARM_FEATURE_MATMUL_INT8))
#error "arm_i8mm.c needs -march=armv8.6-a+dotprod+i8mm (Makefile KFLAGS_arm_i8mm)"
#endif

/* The entries this level replaces, for the types it does not implement. */
static float (*prev_vec_dot)(int, int64_t, const void *, const void *);
static void (*prev_vec_dot_rows)(int, int64_t, int64_t, const void *, size_t, const void *, float *);
static void (*prev_quantize_row)(int, const float *, void *, int64_t);
static void (*prev_dequantize_row)(int, const void *, float *, int64_t);

/* ---- helpers ------------------------------------------------------------------------------- */

static inline float h2f(uint16_t h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* acc + Σ a[i]·b[i] over the 16 int8 lanes, spread over the 4 int32 lanes (which lane holds which
 * products differs between the two versions; callers only use the lane total or add lanes of
 * equal weight). Exact: |a·b| <= 2^14 fits the 16-bit products of the baseline version. */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

/* Σ over 32 lanes: (a0·b0) + (a1·b1), as one int32. */
static inline int32_t dot32(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1)
{
    return vaddvq_s32(dot16(dot16(vdupq_n_s32(0), a0, b0), a1, b1));
}

static inline int valid_n(int type, int64_t n)
{
    const quant_traits *t = quant_traits_of(type);
    return t && n >= 0 && n % t->block_size == 0;
}

/* ---- F32 / F16 / BF16 ---------------------------------------------------------------------- */

static float vd_f32(const float *w, const float *x, int64_t n)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vld1q_f32(w + i + 4), vld1q_f32(x + i + 4));
        a2 = vfmaq_f32(a2, vld1q_f32(w + i + 8), vld1q_f32(x + i + 8));
        a3 = vfmaq_f32(a3, vld1q_f32(w + i + 12), vld1q_f32(x + i + 12));
    }
    for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) s += w[i] * x[i];
    return s;
}

/* 8 halves at p as two float32x4 (exact widening). */
static inline void load_f16x8(const uint16_t *p, float32x4_t *lo, float32x4_t *hi)
{
    float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(p));
    *lo = vcvt_f32_f16(vget_low_f16(h));
    *hi = vcvt_high_f32_f16(h);
}

static float vd_f16(const uint16_t *w, const uint16_t *x, int64_t n)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        float32x4_t w0, w1, w2, w3, x0, x1, x2, x3;
        load_f16x8(w + i, &w0, &w1);
        load_f16x8(w + i + 8, &w2, &w3);
        load_f16x8(x + i, &x0, &x1);
        load_f16x8(x + i + 8, &x2, &x3);
        a0 = vfmaq_f32(a0, w0, x0);
        a1 = vfmaq_f32(a1, w1, x1);
        a2 = vfmaq_f32(a2, w2, x2);
        a3 = vfmaq_f32(a3, w3, x3);
    }
    for (; i + 8 <= n; i += 8) {
        float32x4_t w0, w1, x0, x1;
        load_f16x8(w + i, &w0, &w1);
        load_f16x8(x + i, &x0, &x1);
        a0 = vfmaq_f32(a0, w0, x0);
        a1 = vfmaq_f32(a1, w1, x1);
    }
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) s += h2f(w[i]) * h2f(x[i]);
    return s;
}

/* bf16 → fp32 is a 16-bit left shift of the bit pattern (exact). */
static inline float32x4_t bf16_lo(uint16x8_t v) { return vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)); }
static inline float32x4_t bf16_hi(uint16x8_t v) { return vreinterpretq_f32_u32(vshll_high_n_u16(v, 16)); }

static float vd_bf16(const uint16_t *w, const uint16_t *x, int64_t n)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        uint16x8_t w0 = vld1q_u16(w + i), w1 = vld1q_u16(w + i + 8);
        uint16x8_t x0 = vld1q_u16(x + i), x1 = vld1q_u16(x + i + 8);
        a0 = vfmaq_f32(a0, bf16_lo(w0), bf16_lo(x0));
        a1 = vfmaq_f32(a1, bf16_hi(w0), bf16_hi(x0));
        a2 = vfmaq_f32(a2, bf16_lo(w1), bf16_lo(x1));
        a3 = vfmaq_f32(a3, bf16_hi(w1), bf16_hi(x1));
    }
    for (; i + 8 <= n; i += 8) {
        uint16x8_t w0 = vld1q_u16(w + i), x0 = vld1q_u16(x + i);
        a0 = vfmaq_f32(a0, bf16_lo(w0), bf16_lo(x0));
        a1 = vfmaq_f32(a1, bf16_hi(w0), bf16_hi(x0));
    }
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) s += bf16_to_fp32(w[i]) * bf16_to_fp32(x[i]);
    return s;
}

/* ---- 32-element blocks × Q8_0 -------------------------------------------------------------- */

/* The signed quants of one block as elements 0..15 (lo) and 16..31 (hi). */
static inline void dec_q4_0(const block_q4_0 *b, int8x16_t *lo, int8x16_t *hi)
{
    uint8x16_t q = vld1q_u8(b->qs);
    const int8x16_t eight = vdupq_n_s8(8);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), eight);
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
}

/* Bit j of the little-endian u32 qh is the 5th bit of element j: bytes 0,1 of qh feed elements
 * 0..15, bytes 2,3 elements 16..31; each byte is spread over 8 lanes and tested bit by bit. */
static inline void dec_q5_0(const block_q5_0 *b, int8x16_t *lo, int8x16_t *hi)
{
    static const uint8_t idx_lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t idx_hi[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    uint8x16_t h = vreinterpretq_u8_u32(vdupq_n_u32(qh)), bit = vld1q_u8(bits), b16 = vdupq_n_u8(0x10);
    uint8x16_t h_lo = vandq_u8(vtstq_u8(vqtbl1q_u8(h, vld1q_u8(idx_lo)), bit), b16);
    uint8x16_t h_hi = vandq_u8(vtstq_u8(vqtbl1q_u8(h, vld1q_u8(idx_hi)), bit), b16);
    uint8x16_t q = vld1q_u8(b->qs);
    const int8x16_t sixteen = vdupq_n_s8(16);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), h_lo)), sixteen);
    *hi = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), h_hi)), sixteen);
}

static float vd_q4_0(const block_q4_0 *w, const block_q8_0 *x, int64_t nb)
{
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t lo, hi;
        dec_q4_0(&w[i], &lo, &hi);
        int32_t sumi = dot32(lo, hi, vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16));
        s = fmaf(h2f(w[i].d) * h2f(x[i].d), (float)sumi, s);
    }
    return s;
}

static float vd_q5_0(const block_q5_0 *w, const block_q8_0 *x, int64_t nb)
{
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t lo, hi;
        dec_q5_0(&w[i], &lo, &hi);
        int32_t sumi = dot32(lo, hi, vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16));
        s = fmaf(h2f(w[i].d) * h2f(x[i].d), (float)sumi, s);
    }
    return s;
}

static float vd_q8_0(const block_q8_0 *w, const block_q8_0 *x, int64_t nb)
{
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sumi = dot32(vld1q_s8(w[i].qs), vld1q_s8(w[i].qs + 16), vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16));
        s = fmaf(h2f(w[i].d) * h2f(x[i].d), (float)sumi, s);
    }
    return s;
}

/* Two rows at once against one activation (loads of x shared); each row's arithmetic is the
 * single-row kernel's, so the results equal vd_q8_0's / vd_q4_0's bit for bit. */
static void vd2_q8_0(const block_q8_0 *w0, const block_q8_0 *w1, const block_q8_0 *x, int64_t nb, float *out)
{
    float s0 = 0.0f, s1 = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t xl = vld1q_s8(x[i].qs), xh = vld1q_s8(x[i].qs + 16);
        float dx = h2f(x[i].d);
        int32_t a = dot32(vld1q_s8(w0[i].qs), vld1q_s8(w0[i].qs + 16), xl, xh);
        int32_t b = dot32(vld1q_s8(w1[i].qs), vld1q_s8(w1[i].qs + 16), xl, xh);
        s0 = fmaf(h2f(w0[i].d) * dx, (float)a, s0);
        s1 = fmaf(h2f(w1[i].d) * dx, (float)b, s1);
    }
    out[0] = s0;
    out[1] = s1;
}

static void vd2_q4_0(const block_q4_0 *w0, const block_q4_0 *w1, const block_q8_0 *x, int64_t nb, float *out)
{
    float s0 = 0.0f, s1 = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t xl = vld1q_s8(x[i].qs), xh = vld1q_s8(x[i].qs + 16), l0, h0, l1, h1;
        float dx = h2f(x[i].d);
        dec_q4_0(&w0[i], &l0, &h0);
        dec_q4_0(&w1[i], &l1, &h1);
        int32_t a = dot32(l0, h0, xl, xh), b = dot32(l1, h1, xl, xh);
        s0 = fmaf(h2f(w0[i].d) * dx, (float)a, s0);
        s1 = fmaf(h2f(w1[i].d) * dx, (float)b, s1);
    }
    out[0] = s0;
    out[1] = s1;
}

/* ---- K-quants × Q8_K ----------------------------------------------------------------------- */

/* 6-bit scale and min j of a Q4_K / Q5_K super-block (12-byte packing, see quant_ref.c). */
static inline void k4_scales(const uint8_t *s, int sc[8], int m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

/* Σ_j m_j · (bsums[2j] + bsums[2j+1]) */
static inline int k4_summ(const int m[8], const int16_t *bsums)
{
    int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8)); /* |pair| <= 2·16·127 */
    int16_t p[8];
    vst1q_s16(p, pairs);
    int summ = 0;
    for (int j = 0; j < 8; j++) summ += m[j] * p[j];
    return summ;
}

static float vd_q4_K(const block_q4_K *w, const block_q8_K *x, int64_t nb)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sc[8], m[8];
        k4_scales(w[i].scales, sc, m);
        const uint8_t *q = w[i].qs;
        const int8_t *y = x[i].qs;
        int32x4_t acc = vdupq_n_s32(0);
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
            int32x4_t t = dot16(dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(q0, m4)), vld1q_s8(y)),
                                vreinterpretq_s8_u8(vandq_u8(q1, m4)), vld1q_s8(y + 16));
            acc = vmlaq_n_s32(acc, t, sc[2 * c]);
            t = dot16(dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)), vld1q_s8(y + 32)),
                      vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)), vld1q_s8(y + 48));
            acc = vmlaq_n_s32(acc, t, sc[2 * c + 1]);
        }
        int sumi = vaddvq_s32(acc), summ = k4_summ(m, x[i].bsums);
        s += x[i].d * (h2f(w[i].d) * (float)sumi - h2f(w[i].dmin) * (float)summ);
    }
    return s;
}

static float vd_q5_K(const block_q5_K *w, const block_q8_K *x, int64_t nb)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0f), b16 = vdupq_n_u8(0x10);
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sc[8], m[8];
        k4_scales(w[i].scales, sc, m);
        const uint8_t *q = w[i].qs;
        const int8_t *y = x[i].qs;
        uint8x16_t qh0 = vld1q_u8(w[i].qh), qh1 = vld1q_u8(w[i].qh + 16);
        int32x4_t acc = vdupq_n_s32(0);
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
            /* sub-block 2c: low nibbles + bit 2c of qh[l]; sub-block 2c+1: high nibbles + bit 2c+1 */
            uint8x16_t bl = vdupq_n_u8((uint8_t)(1u << (2 * c))), bh = vdupq_n_u8((uint8_t)(2u << (2 * c)));
            int8x16_t l0 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q0, m4), vandq_u8(vtstq_u8(qh0, bl), b16)));
            int8x16_t l1 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q1, m4), vandq_u8(vtstq_u8(qh1, bl), b16)));
            int8x16_t h0 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q0, 4), vandq_u8(vtstq_u8(qh0, bh), b16)));
            int8x16_t h1 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q1, 4), vandq_u8(vtstq_u8(qh1, bh), b16)));
            acc = vmlaq_n_s32(acc, dot16(dot16(vdupq_n_s32(0), l0, vld1q_s8(y)), l1, vld1q_s8(y + 16)), sc[2 * c]);
            acc = vmlaq_n_s32(acc, dot16(dot16(vdupq_n_s32(0), h0, vld1q_s8(y + 32)), h1, vld1q_s8(y + 48)),
                              sc[2 * c + 1]);
        }
        int sumi = vaddvq_s32(acc), summ = k4_summ(m, x[i].bsums);
        s += x[i].d * (h2f(w[i].d) * (float)sumi - h2f(w[i].dmin) * (float)summ);
    }
    return s;
}

/* Q6_K: element 128h + 32k + l has its low 4 bits in ql[64h + l + 32(k&1)] (low nibble for k < 2,
 * high for k >= 2) and its high 2 bits at bits 2k..2k+1 of qh[32h + l]; value - 32; scale
 * index (128h + 32k + l) / 16. */
static float vd_q6_K(const block_q6_K *w, const block_q8_K *x, int64_t nb)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x03);
    const int8x16_t off = vdupq_n_s8(32);
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h, *qh = w[i].qh + 32 * h;
            const int8_t *y = x[i].qs + 128 * h, *sc = w[i].scales + 8 * h;
            uint8x16_t la[2] = {vld1q_u8(ql), vld1q_u8(ql + 16)};
            uint8x16_t lb[2] = {vld1q_u8(ql + 32), vld1q_u8(ql + 48)};
            uint8x16_t hb[2] = {vld1q_u8(qh), vld1q_u8(qh + 16)};
            for (int half = 0; half < 2; half++) {
                uint8x16_t v0 = vorrq_u8(vandq_u8(la[half], m4), vshlq_n_u8(vandq_u8(hb[half], m3), 4));
                uint8x16_t v1 = vorrq_u8(vandq_u8(lb[half], m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb[half], 2), m3), 4));
                uint8x16_t v2 = vorrq_u8(vshrq_n_u8(la[half], 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb[half], 4), m3), 4));
                uint8x16_t v3 = vorrq_u8(vshrq_n_u8(lb[half], 4), vshlq_n_u8(vshrq_n_u8(hb[half], 6), 4));
                const int8_t *yy = y + 16 * half;
                const int8_t *ss = sc + half;
                int32x4_t z = vdupq_n_s32(0);
                acc = vmlaq_n_s32(acc, dot16(z, vsubq_s8(vreinterpretq_s8_u8(v0), off), vld1q_s8(yy)), ss[0]);
                acc = vmlaq_n_s32(acc, dot16(z, vsubq_s8(vreinterpretq_s8_u8(v1), off), vld1q_s8(yy + 32)), ss[2]);
                acc = vmlaq_n_s32(acc, dot16(z, vsubq_s8(vreinterpretq_s8_u8(v2), off), vld1q_s8(yy + 64)), ss[4]);
                acc = vmlaq_n_s32(acc, dot16(z, vsubq_s8(vreinterpretq_s8_u8(v3), off), vld1q_s8(yy + 96)), ss[6]);
            }
        }
        int sumi = vaddvq_s32(acc);
        s += x[i].d * h2f(w[i].d) * (float)sumi;
    }
    return s;
}

/* MXFP4: the nibbles index the doubled E2M1 codes (tbl), dot32 exact, E8M0 scale. */
static float vd_mxfp4(const block_mxfp4 *w, const block_q8_0 *x, int64_t nb)
{
    const int8x16_t lut = vld1q_s8(quant_mxfp4_values);
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint8x16_t q = vld1q_u8(w[i].qs);
        int8x16_t lo = vqtbl1q_s8(lut, vandq_u8(q, m4)), hi = vqtbl1q_s8(lut, vshrq_n_u8(q, 4));
        int32_t sumi = dot32(lo, hi, vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16));
        s = fmaf(quant_e8m0_half(w[i].e) * h2f(x[i].d), (float)sumi, s);
    }
    return s;
}

/* ---- vec_dot entries ----------------------------------------------------------------------- */

static int implemented(int type)
{
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: case GGML_TYPE_MXFP4:
        return 1;
    default:
        return 0;
    }
}

/* type is implemented() and n valid. */
static float dot_one(int type, int64_t n, const void *w, const void *x)
{
    switch (type) {
    case GGML_TYPE_F32: return vd_f32(w, x, n);
    case GGML_TYPE_F16: return vd_f16(w, x, n);
    case GGML_TYPE_BF16: return vd_bf16(w, x, n);
    case GGML_TYPE_Q4_0: return vd_q4_0(w, x, n / 32);
    case GGML_TYPE_Q5_0: return vd_q5_0(w, x, n / 32);
    case GGML_TYPE_Q8_0: return vd_q8_0(w, x, n / 32);
    case GGML_TYPE_Q4_K: return vd_q4_K(w, x, n / QUANT_QK_K);
    case GGML_TYPE_Q5_K: return vd_q5_K(w, x, n / QUANT_QK_K);
    case GGML_TYPE_Q6_K: return vd_q6_K(w, x, n / QUANT_QK_K);
    case GGML_TYPE_MXFP4: return vd_mxfp4(w, x, n / 32);
    default: return NAN;
    }
}

static float neon_vec_dot(int type, int64_t n, const void *w_row, const void *x_act)
{
    if (!implemented(type)) return prev_vec_dot(type, n, w_row, x_act);
    if (!valid_n(type, n)) return NAN;
    return dot_one(type, n, w_row, x_act);
}

static void neon_vec_dot_rows(int type, int64_t n, int64_t nrows, const void *w, size_t row_stride,
                              const void *x_act, float *out)
{
    if (!implemented(type)) {
        prev_vec_dot_rows(type, n, nrows, w, row_stride, x_act, out);
        return;
    }
    const uint8_t *wb = w;
    if (!valid_n(type, n)) {
        for (int64_t r = 0; r < nrows; r++) out[r] = NAN;
        return;
    }
    int64_t r = 0;
    if (type == GGML_TYPE_Q8_0)
        for (; r + 2 <= nrows; r += 2)
            vd2_q8_0((const void *)(wb + (size_t)r * row_stride), (const void *)(wb + (size_t)(r + 1) * row_stride),
                     x_act, n / 32, out + r);
    else if (type == GGML_TYPE_Q4_0)
        for (; r + 2 <= nrows; r += 2)
            vd2_q4_0((const void *)(wb + (size_t)r * row_stride), (const void *)(wb + (size_t)(r + 1) * row_stride),
                     x_act, n / 32, out + r);
    for (; r < nrows; r++) out[r] = dot_one(type, n, wb + (size_t)r * row_stride, x_act);
}

/* ---- conversions --------------------------------------------------------------------------- */

/* FCVTL / FCVTN: exact widening, and narrowing with the FPCR rounding mode, which Linux leaves at
 * round-to-nearest-even with subnormals kept (FZ = 0) and NaN payloads kept and quieted (DN = 0):
 * what fp32_to_fp16 computes. */
static void neon_fp16_to_fp32_row(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t lo, hi;
        load_f16x8(src + i, &lo, &hi);
        vst1q_f32(dst + i, lo);
        vst1q_f32(dst + i + 4, hi);
    }
    for (; i < n; i++) dst[i] = fp16_to_fp32(src[i]);
}

static void neon_fp32_to_fp16_row(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(src + i)), vld1q_f32(src + i + 4));
        vst1q_u16(dst + i, vreinterpretq_u16_f16(h));
    }
    for (; i < n; i++) dst[i] = fp32_to_fp16(src[i]);
}

/* fp32_to_bf16 on 4 lanes: (u + 0x7fff + ((u >> 16) & 1)) >> 16, NaN → (u >> 16) | 0x40. */
static inline uint16x4_t f32_to_bf16x4(float32x4_t f)
{
    uint32x4_t u = vreinterpretq_u32_f32(f);
    uint32x4_t r = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1)));
    uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u));
    uint32x4_t qn = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40));
    return vmovn_u32(vbslq_u32(nan, qn, vshrq_n_u32(r, 16)));
}

static void bf16_from_f32_row(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        vst1q_u16(dst + i, vcombine_u16(f32_to_bf16x4(vld1q_f32(src + i)), f32_to_bf16x4(vld1q_f32(src + i + 4))));
    for (; i < n; i++) dst[i] = fp32_to_bf16(src[i]);
}

static void bf16_to_f32_row(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t v = vld1q_u16(src + i);
        vst1q_f32(dst + i, bf16_lo(v));
        vst1q_f32(dst + i + 4, bf16_hi(v));
    }
    for (; i < n; i++) dst[i] = bf16_to_fp32(src[i]);
}

/* ---- activation quantizers ----------------------------------------------------------------- */

/* Largest |x| over 32 floats; NaN ignored (FMAXNM, as fmaxf). */
static inline float amax32(const float *x)
{
    float32x4_t m = vabsq_f32(vld1q_f32(x));
    for (int j = 4; j < 32; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + j)));
    return vmaxnmvq_f32(m);
}

/* 16 floats × scale, rounded to nearest even (FCVTNS), optionally capped at 127, as int8. */
static inline int8x16_t round16(const float *x, float scale, int cap)
{
    int32x4_t q[4];
    for (int k = 0; k < 4; k++) {
        q[k] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4 * k), scale));
        if (cap) q[k] = vminq_s32(q[k], vdupq_n_s32(127));
    }
    int16x8_t a = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
    int16x8_t b = vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]));
    return vcombine_s8(vmovn_s16(a), vmovn_s16(b));
}

/* Q8_0: d = amax/127 (fp16), q = RNE(x · 127/amax). */
static void q8_0_row(const float *x, block_q8_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = amax32(x);
        float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = fp32_to_fp16(d);
        vst1q_s8(y[i].qs, round16(x, id, 0));
        vst1q_s8(y[i].qs + 16, round16(x + 16, id, 0));
    }
}

/* Q8_K: max = the first element of largest magnitude, iscale = -127/max,
 * q = min(127, RNE(iscale·x)), d = 1/iscale, bsums over 16. */
static void q8_K_row(const float *x, block_q8_K *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QUANT_QK_K) {
        float32x4_t m = vabsq_f32(vld1q_f32(x));
        for (int j = 4; j < QUANT_QK_K; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + j)));
        float amax = vmaxnmvq_f32(m);
        if (!(amax > 0.0f)) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max = 0.0f;
        for (int j = 0; j < QUANT_QK_K; j++)
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        float iscale = -127.0f / max;
        for (int j = 0; j < QUANT_QK_K / 16; j++) {
            int8x16_t q = round16(x + 16 * j, iscale, 1);
            vst1q_s8(y[i].qs + 16 * j, q);
            y[i].bsums[j] = vaddlvq_s8(q);
        }
        y[i].d = 1.0f / iscale;
    }
}

static void neon_quantize_row(int type, const float *src, void *dst, int64_t n)
{
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q8_0: case GGML_TYPE_Q8_K: break;
    default: prev_quantize_row(type, src, dst, n); return;
    }
    if (!valid_n(type, n)) return;
    switch (type) {
    case GGML_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case GGML_TYPE_F16: neon_fp32_to_fp16_row(src, dst, n); break;
    case GGML_TYPE_BF16: bf16_from_f32_row(src, dst, n); break;
    case GGML_TYPE_Q8_0: q8_0_row(src, dst, n / 32); break;
    case GGML_TYPE_Q8_K: q8_K_row(src, dst, n / QUANT_QK_K); break;
    default: break;
    }
}

static void neon_dequantize_row(int type, const void *src, float *dst, int64_t n)
{
    if ((type != GGML_TYPE_F16 && type != GGML_TYPE_BF16) || n < 0) {
        prev_dequantize_row(type, src, dst, n);
        return;
    }
    if (type == GGML_TYPE_F16) neon_fp16_to_fp32_row(src, dst, n);
    else bf16_to_f32_row(src, dst, n);
}

/* ---- i8mm: Q8_0 / Q4_0 / MXFP4 GEMM, 2 rows × 2 tokens per SMMLA ----------------------------------- */

#if defined(KERN_I8MM)
static void (*prev_gemm)(int, int64_t, int64_t, const void *, size_t, const void *, size_t, int, float *, size_t);

/* The 32 signed quants of a Q8_0 / Q4_0 / MXFP4 block as elements 0..15, 16..31 (MXFP4: the
 * doubled E2M1 codes, looked up with tbl). */
static inline void dec_w(int wtype, const void *blk, int8x16_t *lo, int8x16_t *hi)
{
    if (wtype == GGML_TYPE_MXFP4) {
        const int8x16_t lut = vld1q_s8(quant_mxfp4_values);
        uint8x16_t q = vld1q_u8(((const block_mxfp4 *)blk)->qs);
        *lo = vqtbl1q_s8(lut, vandq_u8(q, vdupq_n_u8(0x0f)));
        *hi = vqtbl1q_s8(lut, vshrq_n_u8(q, 4));
    } else if (wtype == GGML_TYPE_Q8_0) {
        *lo = vld1q_s8(((const block_q8_0 *)blk)->qs);
        *hi = vld1q_s8(((const block_q8_0 *)blk)->qs + 16);
    } else {
        dec_q4_0(blk, lo, hi);
    }
}

/* The block's scale: the fp16 d leading a Q8_0 / Q4_0 block, MXFP4's E8M0 byte as 2^(e−128). */
static inline float w_scale(int wtype, const void *blk)
{
    if (wtype == GGML_TYPE_MXFP4) return quant_e8m0_half(((const block_mxfp4 *)blk)->e);
    uint16_t d;
    memcpy(&d, blk, 2);
    return h2f(d);
}

/* SMMLA (vmmlaq_s32) multiplies the 2×8 int8 matrix of its first operand by the transpose of the
 * 2×8 matrix of its second: acc lanes = (row0·tok0, row0·tok1, row1·tok0, row1·tok1) over 8
 * elements. A 32-element block is 4 such steps (zip of the two rows' / tokens' 8-byte halves),
 * all exact in int32; each lane then scales block after block as the reference does,
 * acc = fma(d_w·d_x, Σ, acc), so every output equals quant_vec_dot_ref's bit for bit. */
static void mm2x2(int wtype, int64_t nb, size_t wbs, const uint8_t *w0, const uint8_t *w1, const block_q8_0 *x0,
                  const block_q8_0 *x1, float out[4])
{
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < nb; i++) {
        const void *b0 = w0 + (size_t)i * wbs, *b1 = w1 + (size_t)i * wbs;
        int8x16_t l0, h0, l1, h1;
        dec_w(wtype, b0, &l0, &h0);
        dec_w(wtype, b1, &l1, &h1);
        int8x16_t xl0 = vld1q_s8(x0[i].qs), xh0 = vld1q_s8(x0[i].qs + 16);
        int8x16_t xl1 = vld1q_s8(x1[i].qs), xh1 = vld1q_s8(x1[i].qs + 16);
#define ZIP1(a, b) vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)))
#define ZIP2(a, b) vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)))
        int32x4_t s = vmmlaq_s32(vdupq_n_s32(0), ZIP1(l0, l1), ZIP1(xl0, xl1));
        s = vmmlaq_s32(s, ZIP2(l0, l1), ZIP2(xl0, xl1));
        s = vmmlaq_s32(s, ZIP1(h0, h1), ZIP1(xh0, xh1));
        s = vmmlaq_s32(s, ZIP2(h0, h1), ZIP2(xh0, xh1));
#undef ZIP1
#undef ZIP2
        float dw0 = w_scale(wtype, b0), dw1 = w_scale(wtype, b1);
        float dx0 = h2f(x0[i].d), dx1 = h2f(x1[i].d);
        float sc[4] = {dw0 * dx0, dw0 * dx1, dw1 * dx0, dw1 * dx1};
        acc = vfmaq_f32(acc, vld1q_f32(sc), vcvtq_f32_s32(s));
    }
    vst1q_f32(out, acc);
}

/* quant_gemm for Q8_0 / Q4_0 / MXFP4 weights on the portable activation layout (the Q8_0 row of each
 * token); rows and tokens left over from the 2×2 tiles, and every other type, go to the portable
 * gemm (vec_dot_rows per token). */
static void i8mm_gemm(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act,
                      size_t act_stride, int n_tokens, float *out, size_t out_stride)
{
    if ((wtype != GGML_TYPE_Q8_0 && wtype != GGML_TYPE_Q4_0 && wtype != GGML_TYPE_MXFP4) || n <= 0 || n % 32 || n_tokens < 2 || nrows < 2) {
        prev_gemm(wtype, n, nrows, w, w_stride, act, act_stride, n_tokens, out, out_stride);
        return;
    }
    const uint8_t *wb = w, *ab = act;
    size_t wbs = wtype == GGML_TYPE_Q8_0 ? sizeof(block_q8_0) : wtype == GGML_TYPE_MXFP4 ? sizeof(block_mxfp4) : sizeof(block_q4_0);
    int64_t nb = n / 32, r2 = nrows & ~(int64_t)1;
    int t2 = n_tokens & ~1;
    for (int t = 0; t < t2; t += 2) {
        const block_q8_0 *x0 = (const void *)(ab + (size_t)t * act_stride);
        const block_q8_0 *x1 = (const void *)(ab + (size_t)(t + 1) * act_stride);
        for (int64_t r = 0; r < r2; r += 2) {
            float o[4];
            mm2x2(wtype, nb, wbs, wb + (size_t)r * w_stride, wb + (size_t)(r + 1) * w_stride, x0, x1, o);
            out[(size_t)t * out_stride + r] = o[0];
            out[(size_t)(t + 1) * out_stride + r] = o[1];
            out[(size_t)t * out_stride + r + 1] = o[2];
            out[(size_t)(t + 1) * out_stride + r + 1] = o[3];
        }
        if (r2 < nrows)
            for (int k = 0; k < 2; k++)
                out[(size_t)(t + k) * out_stride + r2] =
                    dot_one(wtype, n, wb + (size_t)r2 * w_stride, ab + (size_t)(t + k) * act_stride);
    }
    if (t2 < n_tokens)
        neon_vec_dot_rows(wtype, n, nrows, w, w_stride, ab + (size_t)t2 * act_stride, out + (size_t)t2 * out_stride);
}
#endif

/* ---- the level's table entries ------------------------------------------------------------- */

/* ---- SwiGLU (kern_swiglu): the AVX2 level's algorithm (x86_avx2.c exp_ps), 4 lanes ---------- */
static inline float32x4_t neon_exp(float32x4_t x)
{
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
    float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    float32x4_t y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    int32x4_t e = vshlq_n_s32(vcvtq_s32_f32(n), 23);
    return vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(y), e));
}

static inline float32x4_t neon_swiglu4(float32x4_t g, float32x4_t u)
{
    float32x4_t e = neon_exp(vnegq_f32(g));
    return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)), u);
}

static void neon_swiglu(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(gate + i, neon_swiglu4(vld1q_f32(gate + i), vld1q_f32(up + i)));
    if (i < n) { /* the tail through the same vector code, on a padded copy */
        float g[4] = {0}, u[4] = {0};
        memcpy(g, gate + i, sizeof(float) * (size_t)(n - i));
        memcpy(u, up + i, sizeof(float) * (size_t)(n - i));
        vst1q_f32(g, neon_swiglu4(vld1q_f32(g), vld1q_f32(u)));
        memcpy(gate + i, g, sizeof(float) * (size_t)(n - i));
    }
}

void FILL_FN(kern_ops *o)
{
    /* keep what this level replaces (never ourselves, should the same table be filled twice) */
    if (o->vec_dot != neon_vec_dot) prev_vec_dot = o->vec_dot;
    if (o->vec_dot_rows != neon_vec_dot_rows) prev_vec_dot_rows = o->vec_dot_rows;
    if (o->quantize_row != neon_quantize_row) prev_quantize_row = o->quantize_row;
    if (o->dequantize_row != neon_dequantize_row) prev_dequantize_row = o->dequantize_row;
    o->vec_dot = neon_vec_dot;
    o->vec_dot_rows = neon_vec_dot_rows;
    o->quantize_row = neon_quantize_row;
    o->dequantize_row = neon_dequantize_row;
    o->fp16_to_fp32_row = neon_fp16_to_fp32_row;
    o->fp32_to_fp16_row = neon_fp32_to_fp16_row;
    o->swiglu = neon_swiglu;
#if defined(KERN_I8MM)
    /* gemm reads the portable group's activation layout (no packing), so the other six matmul
     * entries stay the portable ones */
    if (o->gemm != i8mm_gemm) prev_gemm = o->gemm;
    o->gemm = i8mm_gemm;
#endif
}

#endif /* __aarch64__ */
