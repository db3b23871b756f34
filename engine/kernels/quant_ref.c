/* quant_ref.c: portable scalar reference of every GGML block codec — dequantize, quantize, vec_dot. */
/*
 * Block formats are those of GGML (ggml-common.h block_* structs, GGUF spec); the code here is
 * written from those layouts. Element numbering inside one block, as GGML defines it:
 *   Q4_0/Q4_1:  qs[j] low nibble = element j, high nibble = element j+16          (j < 16)
 *   Q5_0/Q5_1:  as Q4 plus bit j of the little-endian u32 qh = 5th bit of element j (j < 32)
 *   Q2_K/Q3_K:  element e = 128h + 32k + l (h<2, k<4, l<32) is bits 2k..2k+1 of qs[32h+l];
 *               Q3_K's 3rd bit is bit 4h+k of hmask[l] (set = no -4 offset); scale = e/16
 *   Q4_K/Q5_K:  element e = 64c + l is the low nibble of qs[32c+l], e = 64c+32+l the high one;
 *               Q5_K's 5th bit of those is bit 2c / 2c+1 of qh[l]; scale/min index = e/32
 *   Q6_K:       element e = 128h + 32k + l: low 4 bits from ql[64h + l + 32(k&1)] (low nibble
 *               for k<2, high for k>=2), high 2 bits = bits 2k..2k+1 of qh[32h+l]; scale = e/16
 *   IQ4_NL:     as Q4_0, the nibble an index into quant_iq4nl_values (no offset)
 *   MXFP4:      as Q4_0, the nibble an E2M1 code (quant_mxfp4_values, doubled), the scale
 *               the E8M0 byte e: element = quant_mxfp4_values[nibble] · 2^(e - 128)
 *   IQ4_XS:     sub-block b = e/32 (b < 8) is IQ4_NL-ordered in qs[16b..16b+16); its scale is
 *               d · (ls − 32), ls = low nibble b%2 of scales_l[b/2] | bits 2b..2b+1 of scales_h << 4
 */
#include "engine/kernels/quant.h"

#include <math.h>
#include <string.h>

/* ---- small helpers ---------------------------------------------------------------------- */

#define H2F(h) fp16_to_fp32(h)
#define F2H(f) fp32_to_fp16(f)

/* Round to nearest, ties to even (valid for |x| < 2^22), independent of the FP environment:
 * the same rounding the SIMD conversions use. */
static inline int nearest_int(float x) {
    float v = x + 12582912.0f; /* 1.5 * 2^23 */
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* 6-bit scale and min j (0..7) of a Q4_K / Q5_K super-block, from the 12-byte packing:
 * j<4: low 6 bits of s[j] and s[j+4]; j>=4: low/high nibble of s[j+4] plus the top 2 bits of
 * s[j-4] (scale) and s[j] (min). */
static inline void k4_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void k4_pack_scales(const int sc[8], const int m[8], uint8_t s[12]) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
}

/* The 16 6-bit Q3_K scales, minus their bias 32: low 4 bits from s[j] (j<8, low nibble) or
 * s[j-8] (high nibble); high 2 bits are bits 2(j/4)..2(j/4)+1 of s[8 + j%4]. */
static inline void q3k_scales(const uint8_t *s, int out[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
        int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        out[j] = (lo | (hi << 4)) - 32;
    }
}

static void q3k_pack_scales(const int sc[16], uint8_t s[12]) {
    memset(s, 0, 12);
    for (int j = 0; j < 16; j++) {
        int v = sc[j] + 32; /* 0..63 */
        if (j < 8) s[j] |= (uint8_t)(v & 0x0f);
        else s[j - 8] |= (uint8_t)((v & 0x0f) << 4);
        s[8 + (j & 3)] |= (uint8_t)((v >> 4) << (2 * (j >> 2)));
    }
}

/* Element value (unsigned 2-bit / with Q3_K high bit) index helpers for the K layouts. */
static inline int q2k_get(const uint8_t *qs, int e) {
    int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
    return (qs[32 * h + l] >> (2 * k)) & 3;
}
static inline int q3k_hbit(const uint8_t *hmask, int e) {
    int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
    return (hmask[l] >> (4 * h + k)) & 1;
}
static inline int q4k_get(const uint8_t *qs, int e) {
    int c = e >> 6, l = e & 31;
    return (e & 32) ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0x0f);
}
static inline int q5k_hbit(const uint8_t *qh, int e) {
    int c = e >> 6, l = e & 31;
    return (qh[l] >> (2 * c + ((e >> 5) & 1))) & 1;
}
static inline int q6k_get(const uint8_t *ql, const uint8_t *qh, int e) {
    int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
    int b = ql[64 * h + l + 32 * (k & 1)];
    int lo = k < 2 ? (b & 0x0f) : (b >> 4);
    int hi = (qh[32 * h + l] >> (2 * k)) & 3;
    return (lo | (hi << 4)) - 32;
}

/* ---- dequantize ------------------------------------------------------------------------- */

static void deq_f32(const float *x, float *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }
static void deq_f16(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = H2F(x[i]);
}
static void deq_bf16(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = bf16_to_fp32(x[i]);
}

static void deq_q4_0(const block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = H2F(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((x[i].qs[j] & 0x0f) - 8);
            y[j + 16] = d * (float)((x[i].qs[j] >> 4) - 8);
        }
    }
}

const int8_t quant_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void deq_mxfp4(const block_mxfp4 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = quant_e8m0_half(x[i].e);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)quant_mxfp4_values[x[i].qs[j] & 0x0f];
            y[j + 16] = d * (float)quant_mxfp4_values[x[i].qs[j] >> 4];
        }
    }
}

static void deq_iq4_nl(const block_iq4_nl *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = H2F(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)quant_iq4nl_values[x[i].qs[j] & 0x0f];
            y[j + 16] = d * (float)quant_iq4nl_values[x[i].qs[j] >> 4];
        }
    }
}

/* IQ4_XS sub-block scale b (0..7), biased: 0..63. */
static inline int iq4xs_scale(const block_iq4_xs *x, int b) {
    return ((x->scales_l[b / 2] >> (4 * (b % 2))) & 0x0f) | (((x->scales_h >> (2 * b)) & 3) << 4);
}

static void deq_iq4_xs(const block_iq4_xs *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = H2F(x[i].d);
        for (int b = 0; b < 8; b++, y += 32) {
            float dl = d * (float)(iq4xs_scale(&x[i], b) - 32);
            const uint8_t *qs = x[i].qs + 16 * b;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)quant_iq4nl_values[qs[j] & 0x0f];
                y[j + 16] = dl * (float)quant_iq4nl_values[qs[j] >> 4];
            }
        }
    }
}

static void deq_q4_1(const block_q4_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = H2F(x[i].d), m = H2F(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(x[i].qs[j] & 0x0f) + m;
            y[j + 16] = d * (float)(x[i].qs[j] >> 4) + m;
        }
    }
}

static inline uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void deq_q5_0(const block_q5_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = H2F(x[i].d);
        uint32_t qh = load_u32le(x[i].qh);
        for (int j = 0; j < 16; j++) {
            int lo = (x[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
            int hi = (x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
    }
}

static void deq_q5_1(const block_q5_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = H2F(x[i].d), m = H2F(x[i].m);
        uint32_t qh = load_u32le(x[i].qh);
        for (int j = 0; j < 16; j++) {
            int lo = (x[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
            int hi = (x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * (float)lo + m;
            y[j + 16] = d * (float)hi + m;
        }
    }
}

static void deq_q8_0(const block_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = H2F(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = d * (float)x[i].qs[j];
    }
}

static void deq_q8_1(const block_q8_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = H2F(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = d * (float)x[i].qs[j];
    }
}

static void deq_q2_K(const block_q2_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256) {
        float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
        for (int e = 0; e < 256; e++) {
            int s = x[i].scales[e >> 4];
            y[e] = d * (float)(s & 0x0f) * (float)q2k_get(x[i].qs, e) - dmin * (float)(s >> 4);
        }
    }
}

static void deq_q3_K(const block_q3_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256) {
        float d = H2F(x[i].d);
        int sc[16];
        q3k_scales(x[i].scales, sc);
        for (int e = 0; e < 256; e++) {
            int q = q2k_get(x[i].qs, e) - (q3k_hbit(x[i].hmask, e) ? 0 : 4);
            y[e] = d * (float)sc[e >> 4] * (float)q;
        }
    }
}

static void deq_q4_K(const block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256) {
        float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(j, x[i].scales, &sc, &m);
            float ds = d * (float)sc, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++) y[32 * j + l] = ds * (float)q4k_get(x[i].qs, 32 * j + l) - dm;
        }
    }
}

static void deq_q5_K(const block_q5_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256) {
        float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(j, x[i].scales, &sc, &m);
            float ds = d * (float)sc, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int e = 32 * j + l;
                int q = q4k_get(x[i].qs, e) | (q5k_hbit(x[i].qh, e) << 4);
                y[e] = ds * (float)q - dm;
            }
        }
    }
}

static void deq_q6_K(const block_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256) {
        float d = H2F(x[i].d);
        for (int e = 0; e < 256; e++)
            y[e] = d * (float)x[i].scales[e >> 4] * (float)q6k_get(x[i].ql, x[i].qh, e);
    }
}

static void deq_q8_K(const block_q8_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256)
        for (int e = 0; e < 256; e++) y[e] = x[i].d * (float)x[i].qs[e];
}

void quant_dequantize_row_ref(int type, const void *src, float *dst, int64_t n) {
    const quant_traits *t = quant_traits_of(type);
    if (!t || n < 0 || n % t->block_size != 0 || !quant_can_dequantize(type)) {
        for (int64_t i = 0; i < n; i++) dst[i] = NAN;
        return;
    }
    int64_t nb = n / t->block_size;
    switch (type) {
    case GGML_TYPE_F32: deq_f32(src, dst, n); break;
    case GGML_TYPE_F16: deq_f16(src, dst, n); break;
    case GGML_TYPE_BF16: deq_bf16(src, dst, n); break;
    case GGML_TYPE_Q4_0: deq_q4_0(src, dst, nb); break;
    case GGML_TYPE_Q4_1: deq_q4_1(src, dst, nb); break;
    case GGML_TYPE_Q5_0: deq_q5_0(src, dst, nb); break;
    case GGML_TYPE_Q5_1: deq_q5_1(src, dst, nb); break;
    case GGML_TYPE_Q8_0: deq_q8_0(src, dst, nb); break;
    case GGML_TYPE_Q8_1: deq_q8_1(src, dst, nb); break;
    case GGML_TYPE_Q2_K: deq_q2_K(src, dst, nb); break;
    case GGML_TYPE_Q3_K: deq_q3_K(src, dst, nb); break;
    case GGML_TYPE_Q4_K: deq_q4_K(src, dst, nb); break;
    case GGML_TYPE_Q5_K: deq_q5_K(src, dst, nb); break;
    case GGML_TYPE_Q6_K: deq_q6_K(src, dst, nb); break;
    case GGML_TYPE_Q8_K: deq_q8_K(src, dst, nb); break;
    case GGML_TYPE_IQ4_NL: deq_iq4_nl(src, dst, nb); break;
    case GGML_TYPE_IQ4_XS: deq_iq4_xs(src, dst, nb); break;
    case GGML_TYPE_MXFP4: deq_mxfp4(src, dst, nb); break;
    default: break;
    }
}

/* ---- quantize: activation formats (llama.cpp x86 semantics) ----------------------------- */

static void q_q8_0(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = F2H(d);
        for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)nearest_int(x[j] * id);
    }
}

static void q_q8_1(const float *x, block_q8_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = nearest_int(x[j] * id);
            y[i].qs[j] = (int8_t)q;
            sum += q;
        }
        y[i].d = F2H(d);
        y[i].s = F2H(d * (float)sum);
    }
}

static void q_q8_K(const float *x, block_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 256; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < 256; j++) {
            int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

/* ---- quantize: weight formats (our own encoders for GGML layouts) ----------------------- */

/* Largest-magnitude element (first one on ties), with its sign. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
    return max;
}

static void q_q4_0(const float *x, block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float max = signed_absmax(x, 32);
        y[i].d = F2H(max / -8.0f);
        float d = H2F(y[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 16; j++) {
            int a = clampi(nearest_int(x[j] * id) + 8, 0, 15);
            int b = clampi(nearest_int(x[j + 16] * id) + 8, 0, 15);
            y[i].qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

const int8_t quant_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};


/* The MXFP4 code (0..15) of v, a value already divided by the block's scale (doubled units, so
 * the grid is 0 1 2 3 4 6 8 12): the nearest grid magnitude, ties to the even mantissa as the
 * OCP spec's round-to-nearest-even (1.5 units between 1 and 2 → 2 ...), clamped at 12 (the spec
 * saturates to the largest normal); the sign in bit 3 (a zero keeps code 0). */
static int mxfp4_code(float v) {
    float a = fabsf(v);
    /* midpoints between grid magnitudes; a tie goes to the code with an even mantissa bit
     * (codes 0, 2, 4, 6: magnitudes 0, 2, 4, 8) */
    static const float mid[7] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f};
    int k = 0;
    while (k < 7 && (a > mid[k] || (a == mid[k] && (k & 1) == 1))) k++;
    return k == 0 ? 0 : (v < 0 ? 8 | k : k);
}

/* Our MXFP4 quantizer, the OCP spec's conversion: shared exponent floor(log2(amax)) − 2 (2 is
 * E2M1's largest exponent), so amax lands in [4, 8) scale units and elements above 6 saturate;
 * every element rounded to its nearest E2M1 value. An all-zero (or all-subnormal-tiny) block
 * gets e = 0. Exponents are clamped to the E8M0 range 0..254. */
static void q_mxfp4(const float *x, block_mxfp4 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        int e = 0;
        if (amax > 0.0f) {
            int ex;
            frexpf(amax, &ex); /* amax = m · 2^ex, m in [0.5, 1): floor(log2 amax) = ex − 1 */
            e = clampi(ex - 1 - 2 + 127, 0, 254);
        }
        y[i].e = (uint8_t)e;
        /* x / 2^(e - 128), exactly (ldexpf: 2^128 itself is not a float) */
        for (int j = 0; j < 16; j++)
            y[i].qs[j] = (uint8_t)(mxfp4_code(ldexpf(x[j], 128 - e)) | (mxfp4_code(ldexpf(x[j + 16], 128 - e)) << 4));
    }
}

/* Index of the IQ4 grid value nearest to v (ties to the lower one). */
static int iq4_nearest(float v) {
    int best = 0;
    float bd = fabsf(v - (float)quant_iq4nl_values[0]);
    for (int k = 1; k < 16; k++) {
        float dk = fabsf(v - (float)quant_iq4nl_values[k]);
        if (dk < bd) bd = dk, best = k;
    }
    return best;
}

/* 32 values at scale d (a sub-block) into IQ4_NL-ordered nibbles. */
static void iq4_encode32(const float *x, float d, uint8_t qs[16]) {
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)(iq4_nearest(x[j] * id) | (iq4_nearest(x[j + 16] * id) << 4));
}

/* Our IQ4_NL quantizer: the element of largest magnitude maps to the grid's end of its sign
 * (−127 or 113), every element to its nearest grid value (decodes with GGML's layout; bytes need
 * not equal llama-quantize's, which searches the scale). */
static void q_iq4_nl(const float *x, block_iq4_nl *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float max = signed_absmax(x, 32);
        y[i].d = F2H(max < 0 ? max / -127.0f : max / 113.0f);
        iq4_encode32(x, H2F(y[i].d), y[i].qs);
    }
}

/* IQ4_XS: per sub-block the same scale choice, as a 6-bit multiple (ls − 32 in −32..31) of one
 * super-block d = max |sub-block scale| / 31. */
static void q_iq4_xs(const float *x, block_iq4_xs *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float sc[8], amax = 0.0f;
        for (int b = 0; b < 8; b++) {
            float max = signed_absmax(x + 32 * b, 32);
            sc[b] = max < 0 ? max / -127.0f : max / 113.0f;
            amax = fmaxf(amax, sc[b]);
        }
        y[i].d = F2H(amax / 31.0f);
        float d = H2F(y[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].scales_h = 0;
        memset(y[i].scales_l, 0, sizeof y[i].scales_l);
        for (int b = 0; b < 8; b++) {
            int ls = clampi(nearest_int(sc[b] * id), -32, 31) + 32;
            y[i].scales_l[b / 2] |= (uint8_t)((ls & 0x0f) << (4 * (b % 2)));
            y[i].scales_h |= (uint16_t)((ls >> 4) << (2 * b));
            iq4_encode32(x + 32 * b, d * (float)(ls - 32), y[i].qs + 16 * b);
        }
    }
}

static void q_q5_0(const float *x, block_q5_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float max = signed_absmax(x, 32);
        y[i].d = F2H(max / -16.0f);
        float d = H2F(y[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int a = clampi(nearest_int(x[j] * id) + 16, 0, 31);
            int b = clampi(nearest_int(x[j + 16] * id) + 16, 0, 31);
            y[i].qs[j] = (uint8_t)((a & 0x0f) | ((b & 0x0f) << 4));
            qh |= (uint32_t)(a >> 4) << j;
            qh |= (uint32_t)(b >> 4) << (j + 16);
        }
        for (int k = 0; k < 4; k++) y[i].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

/* min/max affine blocks (Q4_1, Q5_1): x ≈ d*q + m, q in 0..qmax. */
static void affine_block(const float *x, int qmax, uint16_t *dh, uint16_t *mh, int q[32]) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) { mn = fminf(mn, x[j]); mx = fmaxf(mx, x[j]); }
    *mh = F2H(mn);
    float m = H2F(*mh);
    *dh = F2H((mx - m) / (float)qmax);
    float d = H2F(*dh), id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) q[j] = clampi(nearest_int((x[j] - m) * id), 0, qmax);
}

static void q_q4_1(const float *x, block_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        int q[32];
        affine_block(x, 15, &y[i].d, &y[i].m, q);
        for (int j = 0; j < 16; j++) y[i].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

static void q_q5_1(const float *x, block_q5_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        int q[32];
        affine_block(x, 31, &y[i].d, &y[i].m, q);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            y[i].qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
            qh |= (uint32_t)(q[j] >> 4) << j;
            qh |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
        }
        for (int k = 0; k < 4; k++) y[i].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

/* Fit x[0..n) ≈ s*L - m with L in 0..lmax, s >= 0, m >= 0 (the K-quant "scale and min"
 * sub-blocks): start from the min/max range, then a few least-squares refits of (s, m) to the
 * current L, keeping the best squared error. */
static void fit_scale_min(const float *x, int n, int lmax, float *s_out, float *m_out) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < n; j++) { mn = fminf(mn, x[j]); mx = fmaxf(mx, x[j]); }
    if (mn > 0.0f) mn = 0.0f;
    if (mx <= mn) { *s_out = 0.0f; *m_out = -mn; return; }
    float s = (mx - mn) / (float)lmax, m = -mn;
    float best_err = INFINITY, best_s = s, best_m = m;
    for (int it = 0; it < 4; it++) {
        /* assign and measure */
        float is = 1.0f / s, err = 0.0f;
        double sl = 0, sll = 0, sx = 0, slx = 0;
        for (int j = 0; j < n; j++) {
            int l = clampi(nearest_int((x[j] + m) * is), 0, lmax);
            float e = s * (float)l - m - x[j];
            err += e * e;
            sl += l; sll += (double)l * l; sx += x[j]; slx += (double)l * x[j];
        }
        if (err < best_err) { best_err = err; best_s = s; best_m = m; }
        /* least squares for x ≈ s*l - m */
        double det = n * sll - sl * sl;
        if (det <= 0) break;
        double ns = (n * slx - sl * sx) / det;
        double nm = -(sx - ns * sl) / n;
        if (nm < 0) { nm = 0; ns = sll > 0 ? slx / sll : 0; }
        if (ns <= 0) break;
        s = (float)ns; m = (float)nm;
    }
    *s_out = best_s; *m_out = best_m;
}

/* Fit x[0..n) ≈ s*L with L in -lneg..lneg-1 (signed scale): try mapping the largest magnitude
 * onto -lneg and onto +(lneg-1), refit s by least squares, keep the best. */
static float fit_symmetric(const float *x, int n, int lneg) {
    float max = signed_absmax(x, n);
    if (max == 0.0f) return 0.0f;
    float cands[2] = {max / (float)-lneg, max / (float)(lneg - 1)};
    float best_err = INFINITY, best_s = cands[0];
    for (int c = 0; c < 2; c++) {
        float s = cands[c];
        for (int it = 0; it < 3; it++) {
            float is = 1.0f / s, err = 0.0f;
            double sll = 0, slx = 0;
            for (int j = 0; j < n; j++) {
                int l = clampi(nearest_int(x[j] * is), -lneg, lneg - 1);
                float e = s * (float)l - x[j];
                err += e * e;
                sll += (double)l * l; slx += (double)l * x[j];
            }
            if (err < best_err) { best_err = err; best_s = s; }
            if (sll <= 0 || slx == 0) break;
            s = (float)(slx / sll);
        }
    }
    return best_s;
}

/* Quantize the sub-block scales s[0..ns) (>= 0) to 0..qmax with a half-float super scale. */
static void quantize_scales(const float *s, int ns, int qmax, uint16_t *dh, int *q) {
    float mx = 0.0f;
    for (int j = 0; j < ns; j++) mx = fmaxf(mx, s[j]);
    *dh = F2H(mx / (float)qmax);
    float d = H2F(*dh), id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < ns; j++) q[j] = clampi(nearest_int(s[j] * id), 0, qmax);
}

static void q_q2_K(const float *x, block_q2_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float s[16], m[16];
        int qs[16], qm[16];
        for (int j = 0; j < 16; j++) fit_scale_min(x + 16 * j, 16, 3, &s[j], &m[j]);
        quantize_scales(s, 16, 15, &y[i].d, qs);
        quantize_scales(m, 16, 15, &y[i].dmin, qm);
        float d = H2F(y[i].d), dmin = H2F(y[i].dmin);
        memset(y[i].qs, 0, sizeof(y[i].qs));
        for (int j = 0; j < 16; j++) y[i].scales[j] = (uint8_t)(qs[j] | (qm[j] << 4));
        for (int e = 0; e < 256; e++) {
            int j = e >> 4;
            float ds = d * (float)qs[j], dm = dmin * (float)qm[j];
            int l = ds != 0.0f ? clampi(nearest_int((x[e] + dm) / ds), 0, 3) : 0;
            int h = e >> 7, k = (e >> 5) & 3;
            y[i].qs[32 * h + (e & 31)] |= (uint8_t)(l << (2 * k));
        }
    }
}

static void q_q3_K(const float *x, block_q3_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float s[16], amax = 0.0f, smax = 0.0f;
        for (int j = 0; j < 16; j++) {
            s[j] = fit_symmetric(x + 16 * j, 16, 4);
            if (fabsf(s[j]) > amax) { amax = fabsf(s[j]); smax = s[j]; }
        }
        /* 6-bit signed scales -32..31: map the largest onto -32 */
        y[i].d = F2H(smax / -32.0f);
        float d = H2F(y[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        int sc[16];
        for (int j = 0; j < 16; j++) sc[j] = clampi(nearest_int(s[j] * id), -32, 31);
        q3k_pack_scales(sc, y[i].scales);
        memset(y[i].qs, 0, sizeof(y[i].qs));
        memset(y[i].hmask, 0, sizeof(y[i].hmask));
        for (int e = 0; e < 256; e++) {
            float ds = d * (float)sc[e >> 4];
            int l = ds != 0.0f ? clampi(nearest_int(x[e] / ds), -4, 3) : 0;
            int u = l + 4; /* 0..7: bit 2 = "no offset" flag, bits 0..1 = low bits */
            int h = e >> 7, k = (e >> 5) & 3, p = e & 31;
            y[i].qs[32 * h + p] |= (uint8_t)((u & 3) << (2 * k));
            if (u & 4) y[i].hmask[p] |= (uint8_t)(1u << (4 * h + k));
        }
    }
}

/* Q4_K and Q5_K share the scale/min packing; bits = 4 or 5. */
static void q_k45(const float *x, void *yv, int64_t nb, int bits) {
    int lmax = (1 << bits) - 1;
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float s[8], m[8];
        int qs[8], qm[8];
        for (int j = 0; j < 8; j++) fit_scale_min(x + 32 * j, 32, lmax, &s[j], &m[j]);
        uint16_t dh, dminh;
        quantize_scales(s, 8, 63, &dh, qs);
        quantize_scales(m, 8, 63, &dminh, qm);
        float d = H2F(dh), dmin = H2F(dminh);
        uint8_t L[256];
        for (int e = 0; e < 256; e++) {
            int j = e >> 5;
            float ds = d * (float)qs[j], dm = dmin * (float)qm[j];
            L[e] = (uint8_t)(ds != 0.0f ? clampi(nearest_int((x[e] + dm) / ds), 0, lmax) : 0);
        }
        uint8_t *packed_scales, *q;
        if (bits == 4) {
            block_q4_K *y = (block_q4_K *)yv + i;
            y->d = dh; y->dmin = dminh;
            packed_scales = y->scales; q = y->qs;
        } else {
            block_q5_K *y = (block_q5_K *)yv + i;
            y->d = dh; y->dmin = dminh;
            packed_scales = y->scales; q = y->qs;
            memset(y->qh, 0, sizeof(y->qh));
            for (int e = 0; e < 256; e++)
                if (L[e] & 16) y->qh[e & 31] |= (uint8_t)(1u << (2 * (e >> 6) + ((e >> 5) & 1)));
        }
        k4_pack_scales(qs, qm, packed_scales);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                q[32 * c + l] = (uint8_t)((L[64 * c + l] & 0x0f) | ((L[64 * c + 32 + l] & 0x0f) << 4));
    }
}

static void q_q6_K(const float *x, block_q6_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float s[16], amax = 0.0f, smax = 0.0f;
        for (int j = 0; j < 16; j++) {
            s[j] = fit_symmetric(x + 16 * j, 16, 32);
            if (fabsf(s[j]) > amax) { amax = fabsf(s[j]); smax = s[j]; }
        }
        y[i].d = F2H(smax / -128.0f);
        float d = H2F(y[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        int sc[16];
        for (int j = 0; j < 16; j++) {
            sc[j] = clampi(nearest_int(s[j] * id), -128, 127);
            y[i].scales[j] = (int8_t)sc[j];
        }
        uint8_t L[256];
        for (int e = 0; e < 256; e++) {
            float ds = d * (float)sc[e >> 4];
            L[e] = (uint8_t)((ds != 0.0f ? clampi(nearest_int(x[e] / ds), -32, 31) : 0) + 32);
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *Lh = L + 128 * h;
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0x0f) | ((Lh[l + 64] & 0x0f) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0x0f) | ((Lh[l + 96] & 0x0f) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                  ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

void quant_quantize_row_ref(int type, const float *src, void *dst, int64_t n) {
    const quant_traits *t = quant_traits_of(type);
    if (!t || n < 0 || n % t->block_size != 0 || !quant_can_quantize(type)) return;
    int64_t nb = n / t->block_size;
    switch (type) {
    case GGML_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = F2H(src[i]);
        break;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = fp32_to_bf16(src[i]);
        break;
    case GGML_TYPE_Q4_0: q_q4_0(src, dst, nb); break;
    case GGML_TYPE_Q4_1: q_q4_1(src, dst, nb); break;
    case GGML_TYPE_Q5_0: q_q5_0(src, dst, nb); break;
    case GGML_TYPE_Q5_1: q_q5_1(src, dst, nb); break;
    case GGML_TYPE_Q8_0: q_q8_0(src, dst, nb); break;
    case GGML_TYPE_Q8_1: q_q8_1(src, dst, nb); break;
    case GGML_TYPE_Q2_K: q_q2_K(src, dst, nb); break;
    case GGML_TYPE_Q3_K: q_q3_K(src, dst, nb); break;
    case GGML_TYPE_Q4_K: q_k45(src, dst, nb, 4); break;
    case GGML_TYPE_Q5_K: q_k45(src, dst, nb, 5); break;
    case GGML_TYPE_Q6_K: q_q6_K(src, dst, nb); break;
    case GGML_TYPE_Q8_K: q_q8_K(src, dst, nb); break;
    case GGML_TYPE_IQ4_NL: q_iq4_nl(src, dst, nb); break;
    case GGML_TYPE_IQ4_XS: q_iq4_xs(src, dst, nb); break;
    case GGML_TYPE_MXFP4: q_mxfp4(src, dst, nb); break;
    default: break;
    }
}

/* ---- vec_dot ---------------------------------------------------------------------------- */

static float dot_f32(const float *w, const float *x, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += w[i] * x[i];
    return s;
}
static float dot_f16(const uint16_t *w, const uint16_t *x, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += H2F(w[i]) * H2F(x[i]);
    return s;
}
static float dot_bf16(const uint16_t *w, const uint16_t *x, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += bf16_to_fp32(w[i]) * bf16_to_fp32(x[i]);
    return s;
}

static float dot_q4_0(const block_q4_0 *w, const block_q8_0 *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += ((w[i].qs[j] & 0x0f) - 8) * x[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
        s = fmaf(H2F(w[i].d) * H2F(x[i].d), (float)sumi, s); /* one rounding, as every SIMD level */
    }
    return s;
}

static float dot_q4_1(const block_q4_1 *w, const block_q8_1 *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += (w[i].qs[j] & 0x0f) * x[i].qs[j] + (w[i].qs[j] >> 4) * x[i].qs[j + 16];
        s += H2F(w[i].d) * H2F(x[i].d) * (float)sumi + H2F(w[i].m) * H2F(x[i].s);
    }
    return s;
}

static float dot_q5_0(const block_q5_0 *w, const block_q8_0 *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint32_t qh = load_u32le(w[i].qh);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int lo = ((w[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4)) - 16;
            int hi = ((w[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4)) - 16;
            sumi += lo * x[i].qs[j] + hi * x[i].qs[j + 16];
        }
        s = fmaf(H2F(w[i].d) * H2F(x[i].d), (float)sumi, s); /* one rounding, as every SIMD level */
    }
    return s;
}

static float dot_q5_1(const block_q5_1 *w, const block_q8_1 *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint32_t qh = load_u32le(w[i].qh);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (w[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
            int hi = (w[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            sumi += lo * x[i].qs[j] + hi * x[i].qs[j + 16];
        }
        s += H2F(w[i].d) * H2F(x[i].d) * (float)sumi + H2F(w[i].m) * H2F(x[i].s);
    }
    return s;
}

static float dot_q8_0(const block_q8_0 *w, const block_q8_0 *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += w[i].qs[j] * x[i].qs[j];
        s = fmaf(H2F(w[i].d) * H2F(x[i].d), (float)sumi, s); /* one rounding, as every SIMD level */
    }
    return s;
}

static float dot_iq4_nl(const block_iq4_nl *w, const block_q8_0 *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += quant_iq4nl_values[w[i].qs[j] & 0x0f] * x[i].qs[j] + quant_iq4nl_values[w[i].qs[j] >> 4] * x[i].qs[j + 16];
        s = fmaf(H2F(w[i].d) * H2F(x[i].d), (float)sumi, s); /* one rounding, as every SIMD level */
    }
    return s;
}

/* MXFP4 · Q8_0: per block Σ code·q exactly in integers (|code| <= 12), times 2^(e-128)·d_x. */
static float dot_mxfp4(const block_mxfp4 *w, const block_q8_0 *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += quant_mxfp4_values[w[i].qs[j] & 0x0f] * x[i].qs[j] + quant_mxfp4_values[w[i].qs[j] >> 4] * x[i].qs[j + 16];
        s = fmaf(quant_e8m0_half(w[i].e) * H2F(x[i].d), (float)sumi, s); /* one rounding, as every SIMD level */
    }
    return s;
}

/* Σ over a super-block exactly in integers (scales times sub-block sums), then scaled. */
static float dot_iq4_xs(const block_iq4_xs *w, const block_q8_K *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int b = 0; b < 8; b++) {
            const uint8_t *qs = w[i].qs + 16 * b;
            const int8_t *q8 = x[i].qs + 32 * b;
            int t = 0;
            for (int j = 0; j < 16; j++)
                t += quant_iq4nl_values[qs[j] & 0x0f] * q8[j] + quant_iq4nl_values[qs[j] >> 4] * q8[j + 16];
            sumi += (iq4xs_scale(&w[i], b) - 32) * t;
        }
        s += x[i].d * H2F(w[i].d) * (float)sumi;
    }
    return s;
}

static float dot_q2_K(const block_q2_K *w, const block_q8_K *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 16; j++) {
            int t = 0;
            for (int l = 0; l < 16; l++) t += q2k_get(w[i].qs, 16 * j + l) * x[i].qs[16 * j + l];
            sumi += (w[i].scales[j] & 0x0f) * t;
            summ += (w[i].scales[j] >> 4) * x[i].bsums[j];
        }
        s += x[i].d * (H2F(w[i].d) * (float)sumi - H2F(w[i].dmin) * (float)summ);
    }
    return s;
}

static float dot_q3_K(const block_q3_K *w, const block_q8_K *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sc[16], sumi = 0;
        q3k_scales(w[i].scales, sc);
        for (int j = 0; j < 16; j++) {
            int t = 0;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l;
                t += (q2k_get(w[i].qs, e) - (q3k_hbit(w[i].hmask, e) ? 0 : 4)) * x[i].qs[e];
            }
            sumi += sc[j] * t;
        }
        s += x[i].d * H2F(w[i].d) * (float)sumi;
    }
    return s;
}

static float dot_q4_K(const block_q4_K *w, const block_q8_K *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, t = 0;
            k4_scale_min(j, w[i].scales, &sc, &m);
            for (int l = 0; l < 32; l++) t += q4k_get(w[i].qs, 32 * j + l) * x[i].qs[32 * j + l];
            sumi += sc * t;
            summ += m * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        s += x[i].d * (H2F(w[i].d) * (float)sumi - H2F(w[i].dmin) * (float)summ);
    }
    return s;
}

static float dot_q5_K(const block_q5_K *w, const block_q8_K *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, t = 0;
            k4_scale_min(j, w[i].scales, &sc, &m);
            for (int l = 0; l < 32; l++) {
                int e = 32 * j + l;
                t += (q4k_get(w[i].qs, e) | (q5k_hbit(w[i].qh, e) << 4)) * x[i].qs[e];
            }
            sumi += sc * t;
            summ += m * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        s += x[i].d * (H2F(w[i].d) * (float)sumi - H2F(w[i].dmin) * (float)summ);
    }
    return s;
}

static float dot_q6_K(const block_q6_K *w, const block_q8_K *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int t = 0;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l;
                t += q6k_get(w[i].ql, w[i].qh, e) * x[i].qs[e];
            }
            sumi += w[i].scales[j] * t;
        }
        s += x[i].d * H2F(w[i].d) * (float)sumi;
    }
    return s;
}

float quant_vec_dot_ref(int type, int64_t n, const void *w, const void *x) {
    const quant_traits *t = quant_traits_of(type);
    if (!t || !t->supported || n < 0 || n % t->block_size != 0) return NAN;
    int64_t nb = n / t->block_size;
    switch (type) {
    case GGML_TYPE_F32: return dot_f32(w, x, n);
    case GGML_TYPE_F16: return dot_f16(w, x, n);
    case GGML_TYPE_BF16: return dot_bf16(w, x, n);
    case GGML_TYPE_Q4_0: return dot_q4_0(w, x, nb);
    case GGML_TYPE_Q4_1: return dot_q4_1(w, x, nb);
    case GGML_TYPE_Q5_0: return dot_q5_0(w, x, nb);
    case GGML_TYPE_Q5_1: return dot_q5_1(w, x, nb);
    case GGML_TYPE_Q8_0: return dot_q8_0(w, x, nb);
    case GGML_TYPE_Q2_K: return dot_q2_K(w, x, nb);
    case GGML_TYPE_Q3_K: return dot_q3_K(w, x, nb);
    case GGML_TYPE_Q4_K: return dot_q4_K(w, x, nb);
    case GGML_TYPE_Q5_K: return dot_q5_K(w, x, nb);
    case GGML_TYPE_Q6_K: return dot_q6_K(w, x, nb);
    case GGML_TYPE_IQ4_NL: return dot_iq4_nl(w, x, nb);
    case GGML_TYPE_IQ4_XS: return dot_iq4_xs(w, x, nb);
    case GGML_TYPE_MXFP4: return dot_mxfp4(w, x, nb);
    default: return NAN;
    }
}
