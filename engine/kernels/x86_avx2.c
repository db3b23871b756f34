/* x86_avx2: AVX2/FMA/F16C dot products, activation quantizers and conversions (built twice: AVX2, and AVX-VNNI). */
/*
 * Every kernel here computes exactly what its scalar twin in quant_ref.c computes: the
 * integer parts of the block dot products bit for bit, the float parts up to summation order.
 * Block layouts: GGML ggml-common.h / GGUF spec (see the element map at the top of
 * quant_ref.c). The Makefile compiles this file with -mavx2 -mfma -mf16c (kern_fill_x86_avx2),
 * and x86_avxvnni.c includes it with -mavxvnni added (kern_fill_x86_avxvnni: vpdpbusd in place
 * of vpmaddubsw + vpmaddwd). The dispatcher (kernels.c) installs it only on CPUs that have the
 * features; the rest of the program is built for baseline x86-64.
 */
#include "engine/kernels/kernels.h"
#include "engine/kernels/quant.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QUANT_X86 1
#include <immintrin.h>
#endif

#if defined(QUANT_X86)

/* ---- helpers ---------------------------------------------------------------------------- */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* acc + Σ over groups of 4 of u8 × s8 (vpdpbusd), and acc + Σ pairs of s16 × s16 (vpdpwssd).
 * The non-VNNI fallbacks go through vpmaddubsw, which saturates at ±32767 per pair: every
 * caller keeps |u·s| pairs below that (u <= 128, s in -127..127, or u <= 63). */
#if defined(__AVXVNNI__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#define DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#else
static inline __m256i DPBUSD(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
static inline __m256i DPWSSD(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}
#endif

/* 32 nibbles of a 16-byte Q4 block: low nibbles (elements 0..15) then high (16..31). */
static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0f));
}

/* 0x10 in byte j where bit j of the little-endian u32 at qh is set (Q5 5th bits). */
static inline __m256i bit5_32(const uint8_t *qh) {
    uint32_t b;
    memcpy(&b, qh, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)b), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* ---- F32 / F16 / BF16 ------------------------------------------------------------------- */


static float vd_f32(const float *w, const float *x, int64_t n) {
    int64_t i = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += w[i] * x[i];
    return s;
}

static float vd_f16(const uint16_t *w, const uint16_t *x, int64_t n) {
    int64_t i = 0;
#define LH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(LH(w + i), LH(x + i), a0);
        a1 = _mm256_fmadd_ps(LH(w + i + 8), LH(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(LH(w + i + 16), LH(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(LH(w + i + 24), LH(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LH(w + i), LH(x + i), a0);
#undef LH
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += h2f(w[i]) * h2f(x[i]);
    return s;
}

static float vd_bf16(const uint16_t *w, const uint16_t *x, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    const __m256i z = _mm256_setzero_si256();
    for (; i + 16 <= n; i += 16) {
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + i));
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + i));
        /* same lane permutation on both sides, so the dot product is unchanged */
        a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, wv)),
                             _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, xv)), a0);
        a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, wv)),
                             _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, xv)), a1);
    }
    s = hsum_ps(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += bf16_to_fp32(w[i]) * bf16_to_fp32(x[i]);
    return s;
}

/* ---- 32-element blocks × Q8_0 / Q8_1 ---------------------------------------------------- */

/* d_w·d_x of one block pair as 8 equal floats, without a trip through general registers. */
static inline __m256 scale8(const uint16_t *dw, const uint16_t *dx) {
    __m256 a = _mm256_cvtph_ps(_mm_set1_epi16((short)*dw));
    __m256 b = _mm256_cvtph_ps(_mm_set1_epi16((short)*dx));
    return _mm256_mul_ps(a, b);
}

static float vd_q8_0(const block_q8_0 *w, const block_q8_0 *x, int64_t nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    const __m256i z = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        for (int k = 0; k < 2; k++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)w[i + k].qs);
            __m256i xv = _mm256_loadu_si256((const __m256i *)x[i + k].qs);
            /* |w| (u8) × x·sign(w) (s8) = w × x */
            __m256i p = DPBUSD(z, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
            __m256 d = scale8(&w[i + k].d, &x[i + k].d);
            if (k == 0) a0 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), a0);
            else a1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), a1);
        }
    }
    for (; i < nb; i++) {
        __m256i wv = _mm256_loadu_si256((const __m256i *)w[i].qs);
        __m256i xv = _mm256_loadu_si256((const __m256i *)x[i].qs);
        __m256i p = DPBUSD(z, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
        a0 = _mm256_fmadd_ps(scale8(&w[i].d, &x[i].d), _mm256_cvtepi32_ps(p), a0);
    }
    return hsum_ps(_mm256_add_ps(a0, a1));
}

/* ---- IQ4_NL / IQ4_XS: a 16-entry table lookup (vpshufb) turns the nibbles into int8 values ---- */

static inline __m256i iq4_values32(const uint8_t *qs) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4nl_values));
    return _mm256_shuffle_epi8(lut, nibbles32(qs));
}

/* Σ w·x over 32 int8 pairs as 8 int32 lanes (|w| <= 127: the u8·s8 pairs never saturate). */
static inline __m256i dot32_s8(__m256i w, __m256i x) {
    return DPBUSD(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

static float vd_iq4_nl(const block_iq4_nl *w, const block_q8_0 *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        __m256i p = dot32_s8(iq4_values32(w[i].qs), _mm256_loadu_si256((const __m256i *)x[i].qs));
        s = fmaf(h2f(w[i].d) * h2f(x[i].d), (float)hsum_epi32(p), s); /* the reference's order */
    }
    return s;
}

/* MXFP4: the same lookup into the doubled E2M1 codes (|code| <= 12), E8M0 scale. */
static float vd_mxfp4(const block_mxfp4 *w, const block_q8_0 *x, int64_t nb) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_mxfp4_values));
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        __m256i p = dot32_s8(_mm256_shuffle_epi8(lut, nibbles32(w[i].qs)), _mm256_loadu_si256((const __m256i *)x[i].qs));
        s = fmaf(quant_e8m0_half(w[i].e) * h2f(x[i].d), (float)hsum_epi32(p), s); /* the reference's order */
    }
    return s;
}

static float vd_iq4_xs(const block_iq4_xs *w, const block_q8_K *x, int64_t nb) {
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        __m256i acc = _mm256_setzero_si256();
        for (int b = 0; b < 8; b++) {
            int ls = ((w[i].scales_l[b / 2] >> (4 * (b % 2))) & 0x0f) | (((w[i].scales_h >> (2 * b)) & 3) << 4);
            __m256i p = dot32_s8(iq4_values32(w[i].qs + 16 * b), _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * b)));
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(p, _mm256_set1_epi32(ls - 32)));
        }
        s += x[i].d * h2f(w[i].d) * (float)hsum_epi32(acc);
    }
    return s;
}

/* Horizontal sums of eight int32 vectors, returned as one vector [Σp0, …, Σp7]. */
static inline __m256i reduce8_epi32(const __m256i p[8]) {
    __m256i a0 = _mm256_hadd_epi32(p[0], p[1]), a1 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i a2 = _mm256_hadd_epi32(p[4], p[5]), a3 = _mm256_hadd_epi32(p[6], p[7]);
    __m256i b0 = _mm256_hadd_epi32(a0, a1), b1 = _mm256_hadd_epi32(a2, a3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20), _mm256_permute2x128_si256(b0, b1, 0x31));
}

/* Q4_0 / Q5_0 (unsigned quant u, value u - off) against Q8_0: Σ u·x - off·Σ x per block. */
static float vd_q4_0(const block_q4_0 *w, const block_q8_0 *x, int64_t nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    const __m256i z = _mm256_setzero_si256(), off = _mm256_set1_epi8(8);
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256i q0 = nibbles32(w[i].qs), q1 = nibbles32(w[i + 1].qs);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x[i].qs);
        __m256i x1 = _mm256_loadu_si256((const __m256i *)x[i + 1].qs);
        __m256i p0 = _mm256_sub_epi32(DPBUSD(z, q0, x0), DPBUSD(z, off, x0));
        __m256i p1 = _mm256_sub_epi32(DPBUSD(z, q1, x1), DPBUSD(z, off, x1));
        a0 = _mm256_fmadd_ps(scale8(&w[i].d, &x[i].d), _mm256_cvtepi32_ps(p0), a0);
        a1 = _mm256_fmadd_ps(scale8(&w[i + 1].d, &x[i + 1].d), _mm256_cvtepi32_ps(p1), a1);
    }
    for (; i < nb; i++) {
        __m256i q0 = nibbles32(w[i].qs);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x[i].qs);
        __m256i p0 = _mm256_sub_epi32(DPBUSD(z, q0, x0), DPBUSD(z, off, x0));
        a0 = _mm256_fmadd_ps(scale8(&w[i].d, &x[i].d), _mm256_cvtepi32_ps(p0), a0);
    }
    return hsum_ps(_mm256_add_ps(a0, a1));
}

/* One Q5 block: the 5-bit unsigned quants. */
static inline __m256i q5_quants(const uint8_t *qs, const uint8_t *qh) {
    return _mm256_or_si256(nibbles32(qs), bit5_32(qh));
}

static float vd_q5_0(const block_q5_0 *w, const block_q8_0 *x, int64_t nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    const __m256i z = _mm256_setzero_si256(), off = _mm256_set1_epi8(16);
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x[i].qs);
        __m256i x1 = _mm256_loadu_si256((const __m256i *)x[i + 1].qs);
        __m256i p0 = _mm256_sub_epi32(DPBUSD(z, q5_quants(w[i].qs, w[i].qh), x0), DPBUSD(z, off, x0));
        __m256i p1 = _mm256_sub_epi32(DPBUSD(z, q5_quants(w[i + 1].qs, w[i + 1].qh), x1), DPBUSD(z, off, x1));
        a0 = _mm256_fmadd_ps(scale8(&w[i].d, &x[i].d), _mm256_cvtepi32_ps(p0), a0);
        a1 = _mm256_fmadd_ps(scale8(&w[i + 1].d, &x[i + 1].d), _mm256_cvtepi32_ps(p1), a1);
    }
    for (; i < nb; i++) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x[i].qs);
        __m256i p0 = _mm256_sub_epi32(DPBUSD(z, q5_quants(w[i].qs, w[i].qh), x0), DPBUSD(z, off, x0));
        a0 = _mm256_fmadd_ps(scale8(&w[i].d, &x[i].d), _mm256_cvtepi32_ps(p0), a0);
    }
    return hsum_ps(_mm256_add_ps(a0, a1));
}

/* Q4_1 / Q5_1 against Q8_1: d_w·d_x·Σ u·x + m_w·s_x per block. */
static float vd_q4_1(const block_q4_1 *w, const block_q8_1 *x, int64_t nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    const __m256i z = _mm256_setzero_si256();
    float sm = 0.0f;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256i p0 = DPBUSD(z, nibbles32(w[i].qs), _mm256_loadu_si256((const __m256i *)x[i].qs));
        __m256i p1 = DPBUSD(z, nibbles32(w[i + 1].qs), _mm256_loadu_si256((const __m256i *)x[i + 1].qs));
        a0 = _mm256_fmadd_ps(scale8(&w[i].d, &x[i].d), _mm256_cvtepi32_ps(p0), a0);
        a1 = _mm256_fmadd_ps(scale8(&w[i + 1].d, &x[i + 1].d), _mm256_cvtepi32_ps(p1), a1);
        sm += h2f(w[i].m) * h2f(x[i].s) + h2f(w[i + 1].m) * h2f(x[i + 1].s);
    }
    for (; i < nb; i++) {
        __m256i p0 = DPBUSD(z, nibbles32(w[i].qs), _mm256_loadu_si256((const __m256i *)x[i].qs));
        a0 = _mm256_fmadd_ps(scale8(&w[i].d, &x[i].d), _mm256_cvtepi32_ps(p0), a0);
        sm += h2f(w[i].m) * h2f(x[i].s);
    }
    return hsum_ps(_mm256_add_ps(a0, a1)) + sm;
}

static float vd_q5_1(const block_q5_1 *w, const block_q8_1 *x, int64_t nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    const __m256i z = _mm256_setzero_si256();
    float sm = 0.0f;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256i p0 = DPBUSD(z, q5_quants(w[i].qs, w[i].qh), _mm256_loadu_si256((const __m256i *)x[i].qs));
        __m256i p1 = DPBUSD(z, q5_quants(w[i + 1].qs, w[i + 1].qh), _mm256_loadu_si256((const __m256i *)x[i + 1].qs));
        a0 = _mm256_fmadd_ps(scale8(&w[i].d, &x[i].d), _mm256_cvtepi32_ps(p0), a0);
        a1 = _mm256_fmadd_ps(scale8(&w[i + 1].d, &x[i + 1].d), _mm256_cvtepi32_ps(p1), a1);
        sm += h2f(w[i].m) * h2f(x[i].s) + h2f(w[i + 1].m) * h2f(x[i + 1].s);
    }
    for (; i < nb; i++) {
        __m256i p0 = DPBUSD(z, q5_quants(w[i].qs, w[i].qh), _mm256_loadu_si256((const __m256i *)x[i].qs));
        a0 = _mm256_fmadd_ps(scale8(&w[i].d, &x[i].d), _mm256_cvtepi32_ps(p0), a0);
        sm += h2f(w[i].m) * h2f(x[i].s);
    }
    return hsum_ps(_mm256_add_ps(a0, a1)) + sm;
}

/* ---- K-quants × Q8_K -------------------------------------------------------------------- */

/* int16 scale vector for a 32-element step that spans sub-blocks a (first 16) and a+1: built
 * from 16 int8 scales with one byte shuffle and a sign extension. */
static inline __m256i scale_pair16(__m128i sc8, int a) {
    __m128i idx = _mm_set_epi64x(0x0101010101010101LL * (a + 1), 0x0101010101010101LL * a);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, idx));
}

static float vd_q2_K(const block_q2_K *w, const block_q8_K *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < nb; i++) {
        __m128i s8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        __m128i sc8 = _mm_and_si128(s8, _mm_set1_epi8(0x0f));
        __m128i mn8 = _mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0x0f));
        __m256i bs = _mm256_loadu_si256((const __m256i *)x[i].bsums);
        __m256i summ = _mm256_madd_epi16(bs, _mm256_cvtepu8_epi16(mn8));
        __m256i sumi = _mm256_setzero_si256(), s1 = sumi;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[i].qs + 128 * h + 32 * k));
                if (k & 1) s1 = DPWSSD(s1, _mm256_maddubs_epi16(u, xv), scale_pair16(sc8, 8 * h + 2 * k));
                else sumi = DPWSSD(sumi, _mm256_maddubs_epi16(u, xv), scale_pair16(sc8, 8 * h + 2 * k));
            }
        }
        float dy = x[i].d;
        sumi = _mm256_add_epi32(sumi, s1);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * h2f(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(dy * h2f(w[i].dmin)), _mm256_cvtepi32_ps(summ), accm);
    }
    return hsum_ps(acc) - hsum_ps(accm);
}

static float vd_q3_K(const block_q3_K *w, const block_q8_K *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    const __m256i m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; i++) {
        uint32_t a[3];
        memcpy(a, w[i].scales, 12);
        const uint32_t k4 = 0x0f0f0f0fu, k2 = 0x03030303u;
        __m128i sc8 = _mm_setr_epi32((int)((a[0] & k4) | ((a[2] & k2) << 4)),
                                     (int)((a[1] & k4) | (((a[2] >> 2) & k2) << 4)),
                                     (int)(((a[0] >> 4) & k4) | (((a[2] >> 4) & k2) << 4)),
                                     (int)(((a[1] >> 4) & k4) | (((a[2] >> 6) & k2) << 4)));
        sc8 = _mm_sub_epi8(sc8, _mm_set1_epi8(32));
        __m256i bs = _mm256_loadu_si256((const __m256i *)x[i].bsums);
        /* the value is u - 4 with u = low bits + 4·hbit: subtract 4·Σ sc_j·bsum_j */
        __m256i sumi = _mm256_slli_epi32(_mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(sc8)), 2);
        sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
        __m256i s1 = _mm256_setzero_si256();
        __m256i hm = _mm256_loadu_si256((const __m256i *)w[i].hmask);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + k), m1);
                u = _mm256_or_si256(u, _mm256_slli_epi16(hb, 2));
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[i].qs + 128 * h + 32 * k));
                if (k & 1) s1 = DPWSSD(s1, _mm256_maddubs_epi16(u, xv), scale_pair16(sc8, 8 * h + 2 * k));
                else sumi = DPWSSD(sumi, _mm256_maddubs_epi16(u, xv), scale_pair16(sc8, 8 * h + 2 * k));
            }
        }
        sumi = _mm256_add_epi32(sumi, s1);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * h2f(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

/* The 12-byte Q4_K/Q5_K scale block as 16 bytes: sc[0..7] then m[0..7] (6-bit each). */
static inline __m128i k4_scales_mins(const uint8_t *s) {
    uint32_t a, b, c;
    memcpy(&a, s, 4); memcpy(&b, s + 4, 4); memcpy(&c, s + 8, 4);
    return _mm_setr_epi32((int)(a & 0x3f3f3f3fu), (int)((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)),
                          (int)(b & 0x3f3f3f3fu), (int)(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)));
}

/* Broadcast int16 lane j (0..7, same in both 128-bit halves) to all 16 lanes. */
static inline __m256i bcast16(__m256i v, int j) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
}

/* Σ_j m_j·(bsum_2j + bsum_2j+1) per lane pair, from the 8 mins in bytes 8..15 of sm. */
static inline __m256i k4_min_terms(__m128i sm, const int16_t *bsums) {
    __m128i m8 = _mm_unpackhi_epi8(sm, sm); /* m0 m0 m1 m1 … m7 m7 */
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), _mm256_cvtepu8_epi16(m8));
}

static float vd_q4_K(const block_q4_K *w, const block_q8_K *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < nb; i++) {
        __m128i sm = k4_scales_mins(w[i].scales);
        __m256i summ = k4_min_terms(sm, x[i].bsums);
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c + 32));
            s0 = DPWSSD(s0, _mm256_maddubs_epi16(lo, x0), bcast16(sc16, 2 * c));
            s1 = DPWSSD(s1, _mm256_maddubs_epi16(hi, x1), bcast16(sc16, 2 * c + 1));
        }
        float dy = x[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * h2f(w[i].d)), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(dy * h2f(w[i].dmin)), _mm256_cvtepi32_ps(summ), accm);
    }
    return hsum_ps(acc) - hsum_ps(accm);
}

static float vd_q5_K(const block_q5_K *w, const block_q8_K *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < nb; i++) {
        __m128i sm = k4_scales_mins(w[i].scales);
        __m256i summ = k4_min_terms(sm, x[i].bsums);
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        __m256i hb = _mm256_loadu_si256((const __m256i *)w[i].qh);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            /* hb >> 2c: bit 0 / bit 1 of each byte are the 5th bits of the low / high nibbles */
            __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * c));
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4));
            hb = _mm256_srli_epi16(hb, 2);
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c + 32));
            s0 = DPWSSD(s0, _mm256_maddubs_epi16(lo, x0), bcast16(sc16, 2 * c));
            s1 = DPWSSD(s1, _mm256_maddubs_epi16(hi, x1), bcast16(sc16, 2 * c + 1));
        }
        float dy = x[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * h2f(w[i].d)), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(dy * h2f(w[i].dmin)), _mm256_cvtepi32_ps(summ), accm);
    }
    return hsum_ps(acc) - hsum_ps(accm);
}

static float vd_q6_K(const block_q6_K *w, const block_q8_K *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < nb; i++) {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        __m256i bs = _mm256_loadu_si256((const __m256i *)x[i].bsums);
        /* the value is u - 32 with u in 0..63: subtract 32·Σ sc_j·bsum_j */
        __m256i sumi = _mm256_slli_epi32(_mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(sc8)), 5);
        sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
        __m256i s1 = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
            __m256i u[4];
            u[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            u[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[i].qs + 128 * h + 32 * k));
                if (k & 1) s1 = DPWSSD(s1, _mm256_maddubs_epi16(u[k], xv), scale_pair16(sc8, 8 * h + 2 * k));
                else sumi = DPWSSD(sumi, _mm256_maddubs_epi16(u[k], xv), scale_pair16(sc8, 8 * h + 2 * k));
            }
        }
        sumi = _mm256_add_epi32(sumi, s1);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * h2f(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

/* ---- activation quantizers -------------------------------------------------------------- */

/* 8 int32 → 8 int8 in order (values already within -128..127). */
static inline void store8_i32_as_i8(int8_t *dst, __m256i v) {
    __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    p = _mm_packs_epi16(p, p);
    _mm_storel_epi64((__m128i *)dst, p);
}

/* Q8_0 / Q8_1 activation blocks: d = amax/127, q = round-half-even(x·127/amax); Q8_1 also
 * stores s = d·Σq. `stride` is the block size in bytes, d at offset 0, s (Q8_1) at 2, qs at
 * `qs_off`. */
static inline void qz_q8_blocks(const float *x, uint8_t *y, int64_t nb, size_t stride, size_t qs_off, int with_sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < nb; i++, x += 32, y += stride) {
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        float amax = _mm_cvtss_f32(m);
        float d = amax / 127.0f;
        uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT); /* == fp32_to_fp16(d) */
        memcpy(y, &dh, 2);
        __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        /* cvtps2dq rounds half to even under the default MXCSR, like nearest_int() */
        __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id));
        __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id));
        __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id));
        __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id));
        if (with_sum) {
            int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
            uint16_t sh = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
            memcpy(y + 2, &sh, 2);
        }
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(y + qs_off), p);
    }
}

static void qz_q8_0(const float *x, block_q8_0 *y, int64_t nb) {
    qz_q8_blocks(x, (uint8_t *)y, nb, sizeof(block_q8_0), offsetof(block_q8_0, qs), 0);
}

static void qz_q8_1(const float *x, block_q8_1 *y, int64_t nb) {
    qz_q8_blocks(x, (uint8_t *)y, nb, sizeof(block_q8_1), offsetof(block_q8_1, qs), 1);
}

static void qz_q8_K(const float *x, block_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256) {
        __m256 vmax = _mm256_loadu_ps(x), vmin = vmax;
        for (int k = 8; k < 256; k += 8) {
            __m256 v = _mm256_loadu_ps(x + k);
            vmax = _mm256_max_ps(vmax, v);
            vmin = _mm256_min_ps(vmin, v);
        }
        __m128 a = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        a = _mm_max_ps(a, _mm_movehl_ps(a, a));
        a = _mm_max_ss(a, _mm_movehdup_ps(a));
        __m128 b = _mm_min_ps(_mm256_castps256_ps128(vmin), _mm256_extractf128_ps(vmin, 1));
        b = _mm_min_ps(b, _mm_movehl_ps(b, b));
        b = _mm_min_ss(b, _mm_movehdup_ps(b));
        float hi = _mm_cvtss_f32(a), lo = _mm_cvtss_f32(b), max;
        if (hi > -lo) max = hi;
        else if (-lo > hi) max = lo;
        else { /* tie in magnitude: the reference keeps the first such element */
            max = 0.0f;
            for (int j = 0; j < 256; j++)
                if (fabsf(x[j]) == hi) { max = x[j]; break; }
        }
        if (max == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float iscale = -127.0f / max;
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i c127 = _mm256_set1_epi32(127);
        for (int j = 0; j < 16; j++) {
            __m256i q0 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * j), is)), c127);
            __m256i q1 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * j + 8), is)), c127);
            store8_i32_as_i8(y[i].qs + 16 * j, q0);
            store8_i32_as_i8(y[i].qs + 16 * j + 8, q1);
            y[i].bsums[j] = (int16_t)hsum_epi32(_mm256_add_epi32(q0, q1));
        }
        y[i].d = 1.0f / iscale;
    }
}

static void cvt_f32_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = fp32_to_fp16(x[i]);
}

static void cvt_f16_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = fp16_to_fp32(x[i]);
}

static void cvt_f32_bf16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
        r = _mm256_srli_epi32(r, 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
        __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
        r = _mm256_blendv_epi8(r, qn, nan);
        /* 8 u32 holding 16-bit values → 8 u16 */
        __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128((__m128i *)(y + i), p);
    }
    for (; i < n; i++) y[i] = fp32_to_bf16(x[i]);
}

/* ---- eight rows at a time ----------------------------------------------------------------
 * For a matrix-vector product the activation is shared by every row: these kernels walk
 * eight weight rows together so the activation loads, its block sums and d_x are paid once,
 * reduce the eight rows' integer block sums into one vector and apply the eight scales
 * d_w·d_x with one multiply. The eight rows' half-float scales are first gathered into a
 * small stack table, QCHUNK blocks at a time, so the main loop loads them as one vector. */

#define QCHUNK 32

/* Q4_0 · Q8_0 for rows w + r·stride, r = 0..7. Lanes are in row order 0,2,4,6,1,3,5,7 (the
 * order the pairwise reduction leaves them in) until the final store. */
static void vd8_q4_0(int64_t nb, const uint8_t *w, size_t stride, const block_q8_0 *x, float out[8]) {
    static const int perm[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    const block_q4_0 *W[8];
    for (int r = 0; r < 8; r++) W[r] = (const block_q4_0 *)(w + (size_t)r * stride);
    const __m256i m4 = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    uint16_t dw[QCHUNK * 8];
    for (int64_t b0 = 0; b0 < nb; b0 += QCHUNK) {
        int64_t nbc = nb - b0 < QCHUNK ? nb - b0 : QCHUNK;
        for (int64_t b = 0; b < nbc; b++) {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) dw[8 * b + j] = W[perm[j]][b0 + b].d;
        }
        for (int64_t b = 0; b < nbc; b++) {
            const block_q8_0 *xb = &x[b0 + b];
            __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb->qs));
            __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb->qs + 16)));
            /* -8·Σx in both 128-bit halves (each half's four lanes sum to it) */
            __m256i c = DPBUSD(DPBUSD(_mm256_setzero_si256(), eight, xlo), eight, xhi);
            c = _mm256_sub_epi32(_mm256_setzero_si256(), c);
            __m256i p[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                /* rows 2k (low half) and 2k+1 (high half): low nibbles pair with x[0..15],
                 * high nibbles with x[16..31] */
                __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)W[2 * k + 1][b0 + b].qs),
                                             _mm_loadu_si128((const __m128i *)W[2 * k][b0 + b].qs));
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                p[k] = DPBUSD(DPBUSD(c, lo, xlo), hi, xhi);
            }
            __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)&dw[8 * b])),
                                     _mm256_cvtph_ps(_mm_set1_epi16((short)xb->d)));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
    }
    float t[8];
    _mm256_storeu_ps(t, acc);
    for (int j = 0; j < 8; j++) out[perm[j]] = t[j];
}

/* Q8_0 · Q8_0 for rows w + r·stride, r = 0..7; lanes in row order. */
static void vd8_q8_0(int64_t nb, const uint8_t *w, size_t stride, const block_q8_0 *x, float out[8]) {
    const block_q8_0 *W[8];
    for (int r = 0; r < 8; r++) W[r] = (const block_q8_0 *)(w + (size_t)r * stride);
    const __m256i z = _mm256_setzero_si256();
    __m256 acc = _mm256_setzero_ps();
    uint16_t dw[QCHUNK * 8];
    for (int64_t b0 = 0; b0 < nb; b0 += QCHUNK) {
        int64_t nbc = nb - b0 < QCHUNK ? nb - b0 : QCHUNK;
        for (int64_t b = 0; b < nbc; b++) {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) dw[8 * b + j] = W[j][b0 + b].d;
        }
        for (int64_t b = 0; b < nbc; b++) {
            const block_q8_0 *xb = &x[b0 + b];
            __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
            __m256i p[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)W[r][b0 + b].qs);
                p[r] = DPBUSD(z, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
            }
            __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)&dw[8 * b])),
                                     _mm256_cvtph_ps(_mm_set1_epi16((short)xb->d)));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(reduce8_epi32(p)), acc);
        }
    }
    _mm256_storeu_ps(out, acc);
}


/* ---- attention tile ---------------------------------------------------------------------- */

/* exp of 4 doubles: n = round(x·log2 e), r = x − n·ln2 (|r| <= 0.35, ln2 in two parts), Taylor to
 * r^12 (relative error < 1e-14), times 2^n built in the exponent bits (x >= -104 here, so n is far
 * inside the double range). */
static inline __m256d exp4d(__m256d x) {
    __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93147180369123816490e-01), x);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), r);
    static const double c[] = {1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320,
                               1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0};
    __m256d p = _mm256_set1_pd(c[0]);
    for (int i = 1; i < 13; i++) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c[i]));
    const __m256d magic = _mm256_set1_pd(6755399441055744.0); /* 2^52 + 2^51: n in the low bits */
    __m256i ni = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(n, magic)), _mm256_castpd_si256(magic));
    __m256d scale = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(ni, _mm256_set1_epi64x(1023)), 52));
    return _mm256_mul_pd(p, scale);
}

/* expf of 8 lanes computed in double and rounded once (a correctly rounded expf but in vanishingly
 * rare near-ties, as the AVX-512 tile). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
    __m128 lo = _mm256_cvtpd_ps(exp4d(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    __m128 hi = _mm256_cvtpd_ps(exp4d(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
    return _mm256_set_m128(hi, lo);
}

/* Lanes [0, n) set (n <= 8), as a blend mask. */
static inline __m256i lanes8(int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

/* K or V value i of the row of position p, widened to f32. */
static inline float kv_at(const kern_attn *a, const uint8_t *const *blk, int p, int i) {
    const uint8_t *row = blk[p >> __builtin_ctz((unsigned)a->bs)] + (size_t)(p & (a->bs - 1)) * a->row_bytes;
    return a->kv_type == GGML_TYPE_F16 ? h2f(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

/* 8 values from element off of the row of position p (off + 8 <= the row's length). */
static inline __m256 kv_load8(const kern_attn *a, const uint8_t *const *blk, int p, int off) {
    const uint8_t *row = blk[p >> __builtin_ctz((unsigned)a->bs)] + (size_t)(p & (a->bs - 1)) * a->row_bytes;
    if (a->kv_type == GGML_TYPE_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + off)));
    return _mm256_loadu_ps((const float *)row + off);
}

/* 8×8 f32 transpose in registers: on return v[k] holds element k of every input row. */
static inline void transpose8x8(__m256 v[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* kern_ops.attn_tile with 8-lane vectors. Same arithmetic as the portable tile: q·k summed
 * dimension by dimension with products and sums rounded separately (8 positions per vector, K
 * laid out as KT[d][8] for them), softmax with a correctly rounded exp and a double sum, P·V
 * position by position; so results equal the portable tile's but where glibc's expf is an ulp
 * off. */
static void x_attn_tile(const kern_attn *a, int g, int t0, int t1, float *S, int ldS, float *KT) {
    const int hd = a->hd, G = a->n_head / a->n_head_kv, E = a->n_head * hd;
    const int nrows = (t1 - t0) * G, n_kv = a->pos0 + t1;
#define QROW(i) (a->q + (size_t)(t0 + (i) / G) * E + (size_t)(g * G + (i) % G) * hd)
#define OROW(i) (a->out + (size_t)(t0 + (i) / G) * E + (size_t)(g * G + (i) % G) * hd)
#define LEN(i) (a->pos0 + t0 + (i) / G + 1)
    const __m256 sc = _mm256_set1_ps(a->scale);
    for (int p0 = 0; p0 < n_kv; p0 += 8) {
        int np = n_kv - p0 < 8 ? n_kv - p0 : 8;
        if (hd % 8 == 0)
            for (int c = 0; c < hd; c += 8) { /* 8 positions x 8 dims at a time, transposed */
                __m256 v[8];
                for (int r = 0; r < 8; r++) v[r] = r < np ? kv_load8(a, a->kb, p0 + r, g * hd + c) : _mm256_setzero_ps();
                transpose8x8(v);
                for (int d = 0; d < 8; d++) _mm256_store_ps(KT + (size_t)(c + d) * 8, v[d]);
            }
        else
            for (int d = 0; d < hd; d++)
                for (int r = 0; r < 8; r++) KT[(size_t)d * 8 + r] = r < np ? kv_at(a, a->kb, p0 + r, g * hd + d) : 0.0f;
        int i = 0;
        for (; i + 4 <= nrows; i += 4) {
            const float *q0 = QROW(i), *q1 = QROW(i + 1), *q2 = QROW(i + 2), *q3 = QROW(i + 3);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < hd; d++) {
                __m256 kt = _mm256_load_ps(KT + (size_t)d * 8);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_set1_ps(q0[d]), kt));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_set1_ps(q1[d]), kt));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_set1_ps(q2[d]), kt));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_set1_ps(q3[d]), kt));
            }
            _mm256_storeu_ps(S + (size_t)i * ldS + p0, _mm256_mul_ps(a0, sc));
            _mm256_storeu_ps(S + (size_t)(i + 1) * ldS + p0, _mm256_mul_ps(a1, sc));
            _mm256_storeu_ps(S + (size_t)(i + 2) * ldS + p0, _mm256_mul_ps(a2, sc));
            _mm256_storeu_ps(S + (size_t)(i + 3) * ldS + p0, _mm256_mul_ps(a3, sc));
        }
        for (; i < nrows; i++) {
            const float *q0 = QROW(i);
            __m256 a0 = _mm256_setzero_ps();
            for (int d = 0; d < hd; d++)
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_set1_ps(q0[d]), _mm256_load_ps(KT + (size_t)d * 8)));
            _mm256_storeu_ps(S + (size_t)i * ldS + p0, _mm256_mul_ps(a0, sc));
        }
    }
    /* softmax of each row over its causal length; the rest of the row (to a multiple of 8) is
     * zeroed so the value pass runs every row of a group to the same length */
    for (int i = 0; i < nrows; i++) {
        float *s = S + (size_t)i * ldS;
        int len = LEN(i);
        /* the row's maximum 8 lanes at a time (as the AVX-512 tile; a maximum is exact, and the
         * sign of a zero maximum does not change s − max) */
        __m256 vm = _mm256_set1_ps(-INFINITY);
        for (int p = 0; p < len; p += 8)
            vm = _mm256_max_ps(vm, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(s + p),
                                                    _mm256_castsi256_ps(lanes8(len - p))));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        __m256 vmax = _mm256_set1_ps(_mm_cvtss_f32(m4));
        __m256d sum = _mm256_setzero_pd();
        for (int p = 0; p < len; p += 8) {
            __m256 m = _mm256_castsi256_ps(lanes8(len - p));
            __m256 xs = _mm256_blendv_ps(_mm256_set1_ps(-104.0f), _mm256_sub_ps(_mm256_loadu_ps(s + p), vmax), m);
            __m256 e = _mm256_and_ps(exp8(xs), m); /* lanes past len: 0 */
            __m128 lo = _mm256_castps256_ps128(e), hi = _mm256_extractf128_ps(e, 1);
            sum = _mm256_add_pd(sum, _mm256_add_pd(_mm256_cvtps_pd(lo), _mm256_cvtps_pd(hi)));
            _mm256_storeu_ps(s + p, e);
        }
        __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(sum), _mm256_extractf128_pd(sum, 1));
        double total = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
        __m256 inv = _mm256_set1_ps((float)(1.0 / total));
        for (int p = 0; p < len; p += 8) _mm256_storeu_ps(s + p, _mm256_mul_ps(_mm256_loadu_ps(s + p), inv));
        for (int p = (len + 7) & ~7; p < ((n_kv + 7) & ~7); p += 8) _mm256_storeu_ps(s + p, _mm256_setzero_ps());
    }
    /* O = P V: up to 4 rows keep 4 vectors (32 dims) of outputs in registers while V rows pass.
     * A group of 4 whole rows with hd a multiple of 16 takes 16 dims at a time instead (8
     * accumulators + 2 V vectors + the weight: the 16 of 4 × 4 with their V vectors do not fit
     * the 16 ymm registers, and GCC kept them on the stack, a load and store per product). Each
     * output's sum is the same sequence of products in either form. */
    for (int i = 0; i < nrows; i += 4) {
        int nr = nrows - i < 4 ? nrows - i : 4, len = LEN(i + nr - 1);
        if (nr == 4 && hd % 16 == 0) {
            const float *s0 = S + (size_t)i * ldS, *s1 = s0 + ldS, *s2 = s1 + ldS, *s3 = s2 + ldS;
            for (int c0 = 0; c0 < hd; c0 += 16) {
                const int off = g * hd + c0;
                __m256 o00 = _mm256_setzero_ps(), o01 = o00, o10 = o00, o11 = o00, o20 = o00, o21 = o00, o30 = o00,
                       o31 = o00;
                for (int p = 0; p < len; p++) {
                    __m256 v0 = kv_load8(a, a->vb, p, off), v1 = kv_load8(a, a->vb, p, off + 8), w;
                    w = _mm256_set1_ps(s0[p]);
                    o00 = _mm256_add_ps(o00, _mm256_mul_ps(w, v0));
                    o01 = _mm256_add_ps(o01, _mm256_mul_ps(w, v1));
                    w = _mm256_set1_ps(s1[p]);
                    o10 = _mm256_add_ps(o10, _mm256_mul_ps(w, v0));
                    o11 = _mm256_add_ps(o11, _mm256_mul_ps(w, v1));
                    w = _mm256_set1_ps(s2[p]);
                    o20 = _mm256_add_ps(o20, _mm256_mul_ps(w, v0));
                    o21 = _mm256_add_ps(o21, _mm256_mul_ps(w, v1));
                    w = _mm256_set1_ps(s3[p]);
                    o30 = _mm256_add_ps(o30, _mm256_mul_ps(w, v0));
                    o31 = _mm256_add_ps(o31, _mm256_mul_ps(w, v1));
                }
                _mm256_storeu_ps(OROW(i) + c0, o00);
                _mm256_storeu_ps(OROW(i) + c0 + 8, o01);
                _mm256_storeu_ps(OROW(i + 1) + c0, o10);
                _mm256_storeu_ps(OROW(i + 1) + c0 + 8, o11);
                _mm256_storeu_ps(OROW(i + 2) + c0, o20);
                _mm256_storeu_ps(OROW(i + 2) + c0 + 8, o21);
                _mm256_storeu_ps(OROW(i + 3) + c0, o30);
                _mm256_storeu_ps(OROW(i + 3) + c0 + 8, o31);
            }
            continue;
        }
        for (int c0 = 0; c0 < hd; c0 += 32) {
            int nc = (hd - c0 + 7) / 8 < 4 ? (hd - c0 + 7) / 8 : 4;
            if (hd % 8) { /* rows not a multiple of 8 values: the plain loop */
                for (int r = 0; r < nr; r++) {
                    float *o = OROW(i + r);
                    for (int d = c0; d < hd && d < c0 + 32; d++) {
                        float acc = 0.0f;
                        for (int p = 0; p < len; p++) acc += S[(size_t)(i + r) * ldS + p] * kv_at(a, a->vb, p, g * hd + d);
                        o[d] = acc;
                    }
                }
                continue;
            }
            __m256 acc[4][4];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_ps();
            for (int p = 0; p < len; p++) {
                __m256 vv[4];
                for (int c = 0; c < nc; c++) vv[c] = kv_load8(a, a->vb, p, g * hd + c0 + 8 * c);
                for (int r = 0; r < nr; r++) {
                    __m256 w = _mm256_set1_ps(S[(size_t)(i + r) * ldS + p]);
                    for (int c = 0; c < nc; c++) acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(w, vv[c]));
                }
            }
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < nc; c++) _mm256_storeu_ps(OROW(i + r) + c0 + 8 * c, acc[r][c]);
        }
    }
#undef QROW
#undef OROW
#undef LEN
}

/* ---- entry points (the kern_ops entries) ------------------------------------------------ */

/* Length checks without a division: n must be a non-negative multiple of 32 / 256. */
#define OK32(n) ((n) >= 0 && ((n) & 31) == 0)
#define OK256(n) ((n) >= 0 && ((n) & 255) == 0)

static float x_vec_dot(int type, int64_t n, const void *w, const void *x) {
    switch (type) {
    case GGML_TYPE_F32: if (n >= 0) return vd_f32(w, x, n); break;
    case GGML_TYPE_F16: if (n >= 0) return vd_f16(w, x, n); break;
    case GGML_TYPE_BF16: if (n >= 0) return vd_bf16(w, x, n); break;
    case GGML_TYPE_Q8_0: if (OK32(n)) return vd_q8_0(w, x, n >> 5); break;
    case GGML_TYPE_Q4_0: if (OK32(n)) return vd_q4_0(w, x, n >> 5); break;
    case GGML_TYPE_Q4_1: if (OK32(n)) return vd_q4_1(w, x, n >> 5); break;
    case GGML_TYPE_Q5_0: if (OK32(n)) return vd_q5_0(w, x, n >> 5); break;
    case GGML_TYPE_Q5_1: if (OK32(n)) return vd_q5_1(w, x, n >> 5); break;
    case GGML_TYPE_Q2_K: if (OK256(n)) return vd_q2_K(w, x, n >> 8); break;
    case GGML_TYPE_Q3_K: if (OK256(n)) return vd_q3_K(w, x, n >> 8); break;
    case GGML_TYPE_Q4_K: if (OK256(n)) return vd_q4_K(w, x, n >> 8); break;
    case GGML_TYPE_Q5_K: if (OK256(n)) return vd_q5_K(w, x, n >> 8); break;
    case GGML_TYPE_Q6_K: if (OK256(n)) return vd_q6_K(w, x, n >> 8); break;
    case GGML_TYPE_IQ4_NL: if (OK32(n)) return vd_iq4_nl(w, x, n >> 5); break;
    case GGML_TYPE_IQ4_XS: if (OK256(n)) return vd_iq4_xs(w, x, n >> 8); break;
    case GGML_TYPE_MXFP4: if (OK32(n)) return vd_mxfp4(w, x, n >> 5); break;
    default: break;
    }
    return quant_vec_dot_ref(type, n, w, x); /* also the NaN answer for bad type / n */
}

static void x_quantize_row(int type, const float *src, void *dst, int64_t n) {
    switch (type) {
    case GGML_TYPE_Q8_0: if (OK32(n)) { qz_q8_0(src, dst, n >> 5); return; } break;
    case GGML_TYPE_Q8_1: if (OK32(n)) { qz_q8_1(src, dst, n >> 5); return; } break;
    case GGML_TYPE_Q8_K: if (OK256(n)) { qz_q8_K(src, dst, n >> 8); return; } break;
    case GGML_TYPE_F16: if (n >= 0) { cvt_f32_f16(src, dst, n); return; } break;
    case GGML_TYPE_BF16: if (n >= 0) { cvt_f32_bf16(src, dst, n); return; } break;
    default: break;
    }
    quant_quantize_row_ref(type, src, dst, n);
}

static void x_dequantize_row(int type, const void *src, float *dst, int64_t n) {
    if (type == GGML_TYPE_F16 && n >= 0) {
        cvt_f16_f32(src, dst, n);
        return;
    }
    quant_dequantize_row_ref(type, src, dst, n);
}

static void x_vec_dot_rows(int type, int64_t n, int64_t nrows, const void *w, size_t row_stride, const void *x_act,
                           float *out) {
    int64_t r = 0;
    const uint8_t *wb = w;
    if (type == GGML_TYPE_Q4_0 && OK32(n))
        for (; r + 8 <= nrows; r += 8) vd8_q4_0(n >> 5, wb + (size_t)r * row_stride, row_stride, x_act, out + r);
    else if (type == GGML_TYPE_Q8_0 && OK32(n))
        for (; r + 8 <= nrows; r += 8) vd8_q8_0(n >> 5, wb + (size_t)r * row_stride, row_stride, x_act, out + r);
    for (; r < nrows; r++) out[r] = x_vec_dot(type, n, wb + (size_t)r * row_stride, x_act);
}

/* ---- SwiGLU (kern_swiglu) ------------------------------------------------------------------ */

/* e^x for x in [-87, 88] (clamped there; silu needs no more: 1 + e^-87 rounds to 1, and
 * g / (1 + e^88) is below 2^-120 for the g that reach it): x = n·ln 2 + r with ln 2 in two parts
 * (Cody-Waite), e^r = 1 + r + r²·P(r) with Cephes expf's coefficients, then 2^n added to the
 * exponent bits. */
static inline __m256 exp_ps(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
}

static inline __m256 swiglu8(__m256 g, __m256 u) {
    __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void x_swiglu(float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(gate + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) { /* the tail through the same vector code, on a padded copy */
        float g[8] = {0}, u[8] = {0};
        memcpy(g, gate + i, sizeof(float) * (size_t)(n - i));
        memcpy(u, up + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(g, swiglu8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
        memcpy(gate + i, g, sizeof(float) * (size_t)(n - i));
    }
}

#endif /* QUANT_X86 */

#if defined(KERN_VNNI) /* the wrapper x86_avxvnni.c; also names the no-op on other architectures */
#define FILL_NAME kern_fill_x86_avxvnni
#else
#define FILL_NAME kern_fill_x86_avx2
#endif

void FILL_NAME(kern_ops *o) {
#if defined(QUANT_X86)
    o->vec_dot = x_vec_dot;
    o->vec_dot_rows = x_vec_dot_rows;
    o->quantize_row = x_quantize_row;
    o->dequantize_row = x_dequantize_row;
    o->fp16_to_fp32_row = cvt_f16_f32;
    o->fp32_to_fp16_row = cvt_f32_f16;
    o->attn_tile = x_attn_tile;
    o->swiglu = x_swiglu;
#else
    (void)o;
#endif
}
