/* gemm_avx2: the matmul group for AVX2 + FMA + F16C (and, included by gemm_avxvnni.c with KERN_VNNI, for AVX-VNNI) — prepared activations, 8-row weight panels, GEMV / GEMM. */
/*
 * The design follows engine/kernels/x86_avx512.c (the AVX-512 kernels) with 256-bit vectors:
 *
 * Weights. Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K / MXFP4 matrices are packed once at load (pack) into
 * panels of 8 rows (two per QUANT_PANEL_ROWS chunk of the matmul scheduler). One 32-byte vector
 * holds 4 consecutive elements of each of the 8 rows (dword lane r = row r, byte i = element
 * 4k+i of the step k), so a vector load (plus a nibble unpack) meets one broadcast activation
 * dword and every 32-bit lane sums one row: vpdpbusd with AVX-VNNI, else vpmaddubsw (u8·s8 pairs
 * summed in int16, several steps at a time where the range allows it) and one vpmaddwd that
 * widens to int32 (against ones, or against the row's sub-block scale for the K-quants). Quants
 * stay unsigned; the activation row carries −bias·Σq per block so that Σ u·x − bias·Σx = Σ q·x
 * exactly. Panel layouts, per block (offsets in bytes, r = row 0..7, i = byte 0..3):
 *
 *   Q4_0 (144 B / 32 el.):  V[4] @32k: byte 4r+i = u(4k+i) | u(16+4k+i) << 4; fp16 d[8] @128
 *   Q5_0 (176 B):           V[4] as Q4_0 (low 4 bits); H @128: byte 4r+i bit v = 5th bit of
 *                           u(4v+i) (v < 4) / u(16+4(v-4)+i) (v >= 4); fp16 d[8] @160
 *   Q8_0 (272 B):           V[8] @32k: byte 4r+i = q(4k+i) (signed); fp16 d[8] @256
 *   Q4_K (1184 B / 256):    P[4][8] @32(8c+k): byte 4r+i = u(64c+4k+i) | u(64c+32+4k+i) << 4;
 *                           u8 sc[8][8] @1024, u8 m[8][8] @1088, fp16 d[8] @1152, dmin[8] @1168
 *   Q5_K (1440 B):          P as Q4_K (low 4 bits); H[4][2] @1024+64c+32h: byte 4r+i bit k = 5th
 *                           bit of u(64c+32h+4k+i); sc @1280, m @1344, d @1408, dmin @1424
 *   MXFP4 (136 B / 32):     V[4] as Q4_0 (the E2M1 codes); u8 e[8] @128 (E8M0 scale bytes)
 *   Q6_K (1680 B):          L[8][4] @32(4p+k): byte 4r+i = u(32p+4k+i) & 15 | (u(32p+16+4k+i) & 15) << 4;
 *                           H[4][4] @1024+32(4q+k): bits 2s, 2s+1 = u(64q+16s+4k+i) >> 4;
 *                           i8 sc[16][8] @1536, fp16 d[8] @1664
 *
 * Activations (act_prepare), per row, 64-byte multiples:
 *   Q4_0 / Q5_0 / Q8_0 / MXFP4  groups of 4 blocks (192 B): x[4][32] int8 (the Q8_0 values), f32 d[4] @128,
 *                       i32 corr[4] @144 = −8 / −16 / −128 · Σq (MXFP4: −12·Σq; Q8_0 without VNNI: unused, the
 *                       signed weights go through the vpsignb form |w|·sign(x, w))
 *   Q4_K / Q5_K / Q6_K  per super-block (320 B): the Q8_K values x[256], f32 d @256, i16 Σq per 32
 *                       [8] @260, i16 Σq per 16 [16] @276
 *   F32 / F16 / BF16    f32 x (F16 / BF16: rounded to fp16 / bf16 values, GGML's F16·F16 and
 *                       BF16·BF16 products)
 *   others              the vec_dot_type row of quant_quantize_row (quant_vec_dot_rows does the work)
 *
 * Decode (1 token) streams each panel from memory once (prefetching ahead); prefill runs up to
 * 6 (Q4_0, Q5_0, Q8_0) or 4 (K-quants) tokens per pass over a 1024-element slice of a panel (it
 * stays in L1 while the tokens pass).
 *
 * Arithmetic: the same as engine/kernels/x86_avx512.c, bit for bit (tests/test_kernels.c checks it). Integer parts are exact (every
 * int16 partial sum of vpmaddubsw is bounded: Q4_0 / Q4_K 8 steps ≤ 16·15·127, Q5_0 / Q5_K 4
 * steps ≤ 8·31·127, Q6_K 2 steps ≤ 4·63·127, Q8_0 1 step ≤ 2·128·127). Per row: Q4_0 / Q5_0 /
 * Q8_0 acc = fma(d_w·d_x, Σ_block, acc) block after block; Q4_K acc = fma(d_x, fma(d_w, Σ,
 * −dmin_w·Σm), acc); Q5_K acc += d_x·(d_w·Σ − dmin_w·Σm) (each operation rounded: the scalar
 * reference); Q6_K acc = fma(d_w·d_x, Σ, acc) — whatever the number of tokens or threads.
 * F32 / F16 / BF16 (in gemm_float_avx2.c): a batch runs a blocked GEMM (rows converted to F32
 * panels of 16 per k-block of 256, tiles of 16 rows × 6 tokens, a sequential FMA chain per
 * k-block, the blocks' sums added in order); decode streams one row at a time with 4
 * accumulators (another float order).
 */
#include "engine/kernels/gemm_float.h"
#include "engine/kernels/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && \
    (!defined(KERN_VNNI) || defined(__AVXVNNI__))
#define GA_ON 1
#endif

#if defined(GA_ON)
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/quant.h"

#define AI static inline __attribute__((always_inline))

/* The level's table before this file's entries (dot products, quantizers of x86_avx2.c): the
 * Q8_K quantizer and the vec_dot_rows fallback for types without kernels here. */
static kern_ops base;
#define ROUND64(x) (((x) + 63) & ~(size_t)63)
#define PR 8 /* rows per panel */

/* ---- integer dot steps ------------------------------------------------------------------------
 * S_STEP adds the dot products of 4 u8 × 4 s8 per dword to a running sum: int32 (vpdpbusd) with
 * VNNI, int16 pairs (vpmaddubsw) without; S_FIN1 widens such a sum to int32, S_FINSC multiplies it
 * by a per-row scale (sc32: the scale per dword; sc16: the scale in both int16 halves). */
#if defined(KERN_VNNI)
#define S_STEP(s, u, x) _mm256_dpbusd_avx_epi32((s), (u), (x))
#define S_FIN1(s) (s)
#define S_FINSC(s, sc32, sc16) _mm256_mullo_epi32((s), (sc32))
#define S_SPLIT 0 /* VNNI sums never need splitting */
#else
#define S_STEP(s, u, x) pin_t(T, _mm256_add_epi16((s), _mm256_maddubs_epi16((u), (x))))
#define S_FIN1(s) _mm256_madd_epi16((s), _mm256_set1_epi16(1))
#define S_FINSC(s, sc32, sc16) _mm256_madd_epi16((s), (sc16))
#define S_SPLIT 1
#endif

/* Keeps a running sum a chain in a register: GCC otherwise re-associates the vpaddw chains of all
 * tokens into trees, computing every vpmaddubsw first and spilling them. */
AI __m256i pin(__m256i v)
{
    __asm__("" : "+x"(v));
    return v;
}
/* pin for T tokens at a time: a single token's chain is left free (GCC's tree of vpaddw lets the
 * out-of-order core overlap the steps; with one token nothing spills) */
AI __m256i pin_t(int T, __m256i v)
{
    if (T > 1) __asm__("" : "+x"(v));
    return v;
}

AI __m256i bc32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

AI float ldf(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

AI __m256 ld_ph8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* 8 u8 / i8 (one per row) as int32 lanes. */
AI __m256i ld_u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
AI __m256i ld_i8x8(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* Per-row bytes as int16 pairs, one dword per row r of 8, from one in-lane byte shuffle of the
 * bytes broadcast to both 128-bit lanes (a broadcast is a load alone; a widening load and the
 * pairing had been four vector ALU ops per scale vector — a single token's Q5_K / Q6_K panel
 * kernel, in cache, one thread, ran 9% / 14% faster without them):
 * pair_u8(p) = (p[r], p[r]) and pair2_u8(p) = (p[r], p[8 + r]), unsigned; the _i8 forms
 * sign-extend (each byte into the high half, then an arithmetic shift right by 8). */
/* The shuffle mask of those pairs: dword r takes byte r and byte r + h (h = 0 or 8), each into
 * the low (S = PAIR_LO) or the high (PAIR_HI) byte of its int16, the other byte zeroed. */
#define PAIR_LO(a, b) a, -1, b, -1
#define PAIR_HI(a, b) -1, a, -1, b
#define PAIR_MASK(S, h) _mm256_setr_epi8(S(0, h), S(1, 1 + h), S(2, 2 + h), S(3, 3 + h), S(4, 4 + h), S(5, 5 + h), \
                                         S(6, 6 + h), S(7, 7 + h))
AI __m256i bcast8(const uint8_t *p)
{
    int64_t v;
    memcpy(&v, p, 8);
    return _mm256_set1_epi64x(v);
}
AI __m256i bcast16(const uint8_t *p) { return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)); }
AI __m256i pair_u8(const uint8_t *p) { return _mm256_shuffle_epi8(bcast8(p), PAIR_MASK(PAIR_LO, 0)); }
AI __m256i pair_i8(const uint8_t *p) { return _mm256_srai_epi16(_mm256_shuffle_epi8(bcast8(p), PAIR_MASK(PAIR_HI, 0)), 8); }
AI __m256i pair2_u8(const uint8_t *p) { return _mm256_shuffle_epi8(bcast16(p), PAIR_MASK(PAIR_LO, 8)); }
AI __m256i pair2_i8(const uint8_t *p) { return _mm256_srai_epi16(_mm256_shuffle_epi8(bcast16(p), PAIR_MASK(PAIR_HI, 8)), 8); }

static int hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* ---- activation preparation ------------------------------------------------------------------ */

enum act_kind { ACT_STD, ACT_F32, ACT_F16, ACT_BF16, ACT_Q8B, ACT_K };

static int act_kind(int wtype)
{
    switch (wtype) {
    case GGML_TYPE_F32: return ACT_F32;
    case GGML_TYPE_F16: return ACT_F16;
    case GGML_TYPE_BF16: return ACT_BF16;
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: case GGML_TYPE_MXFP4: return ACT_Q8B;
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: return ACT_K;
    default: return ACT_STD;
    }
}

#define XG 192  /* Q8B group of 4 blocks */
#define MX_BIAS 12 /* the MXFP4 kernel looks its codes up as value + 12 (0..24, unsigned) */
#define KG 320  /* K super-block */

static size_t act_row_size(int wtype, int64_t n)
{
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || n < 0 || n % qt->block_size) return 0;
    switch (act_kind(wtype)) {
    case ACT_F32: case ACT_F16: case ACT_BF16: return ROUND64((size_t)n * 4);
    case ACT_Q8B: return (size_t)((n / 32 + 3) / 4) * XG;
    case ACT_K: return (size_t)(n / 256) * KG;
    default: return ROUND64(quant_row_size(qt->vec_dot_type, n));
    }
}

/* One block exactly as quant_quantize_row(Q8_0): d = fp16(amax/127), q = round-half-even(x·127/amax).
 * Returns d as float; 32 int8 at q, Σq in *sum. */
static float q8_0_block(const float *x, int8_t *q, int *sum)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    float d = amax / 127.0f;
    __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    __m256i qi[4];
    for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    *sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    return _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
}

static void prep_q8b(const float *x, int64_t n, uint8_t *act, int bias)
{
    int64_t nb = n / 32, ng = (nb + 3) / 4;
    memset(act, 0, (size_t)ng * XG);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *g = act + (b / 4) * XG;
        int j = (int)(b % 4), sum;
        float d = q8_0_block(x + 32 * b, (int8_t *)g + 32 * j, &sum);
        int32_t corr = -bias * sum;
        memcpy(g + 128 + 4 * j, &d, 4);
        memcpy(g + 144 + 4 * j, &corr, 4);
    }
}

static void prep_k(const float *x, int64_t n, uint8_t *act)
{
    block_q8_K blk;
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t *g = act + b * KG;
        base.quantize_row(GGML_TYPE_Q8_K, x + 256 * b, &blk, 256);
        memcpy(g, blk.qs, 256);
        memcpy(g + 256, &blk.d, 4);
        int16_t s32[8];
        for (int s = 0; s < 8; s++) s32[s] = (int16_t)(blk.bsums[2 * s] + blk.bsums[2 * s + 1]);
        memcpy(g + 260, s32, 16);
        memcpy(g + 276, blk.bsums, 32);
        memset(g + 308, 0, KG - 308);
    }
}

static void prep_f16(const float *x, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++) out[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
}

/* x rounded to bf16 values (fp32_to_bf16: to nearest even, NaN kept quiet), as f32. */
static void prep_bf16(const float *x, int64_t n, float *out)
{
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff), hi = _mm256_set1_epi32((int)0xffff0000u);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256i u = _mm256_castps_si256(v);
        __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, half), _mm256_and_si256(_mm256_srli_epi32(u, 16), one)), hi);
        __m256i q = _mm256_or_si256(_mm256_and_si256(u, hi), _mm256_set1_epi32(0x400000));
        __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        _mm256_storeu_ps(out + i, _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
    }
    for (; i < n; i++) out[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
}

static void act_prepare(int wtype, const float *x, int64_t n, void *act)
{
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || n < 0 || n % qt->block_size) return;
    switch (act_kind(wtype)) {
    case ACT_F32: memcpy(act, x, (size_t)n * 4); return;
    case ACT_F16: prep_f16(x, n, act); return;
    case ACT_BF16: prep_bf16(x, n, act); return;
    case ACT_Q8B:
        prep_q8b(x, n, act, wtype == GGML_TYPE_Q4_0 ? 8 : wtype == GGML_TYPE_Q5_0 ? 16 : wtype == GGML_TYPE_MXFP4 ? MX_BIAS : 128);
        return;
    case ACT_K: prep_k(x, n, act); return;
    default:
        if (qt->vec_dot_type == GGML_TYPE_F32) memcpy(act, x, (size_t)n * 4);
        else base.quantize_row(qt->vec_dot_type, x, act, n);
        return;
    }
}

/* ---- packing ---------------------------------------------------------------------------------- */

#define PB_Q4_0 144
#define PB_Q5_0 176
#define PB_Q8_0 272
#define PB_Q4_K 1184
#define PB_Q5_K 1440
#define PB_Q6_K 1680
#define PB_MXFP4 136 /* MXFP4: V[4] as Q4_0 (the E2M1 codes), u8 e[8] @128 (the E8M0 scale bytes) */

/* Bytes per block of an 8-row panel; 0 for types without panels. */
static size_t pblock(int wtype)
{
    switch (wtype) {
    case GGML_TYPE_Q4_0: return PB_Q4_0;
    case GGML_TYPE_Q5_0: return PB_Q5_0;
    case GGML_TYPE_Q8_0: return PB_Q8_0;
    case GGML_TYPE_Q4_K: return PB_Q4_K;
    case GGML_TYPE_Q5_K: return PB_Q5_K;
    case GGML_TYPE_Q6_K: return PB_Q6_K;
    case GGML_TYPE_MXFP4: return PB_MXFP4;
    default: return 0;
    }
}

static size_t panel_bytes(int wtype, int64_t n)
{
    size_t pb = pblock(wtype);
    return pb ? (size_t)(n / quant_traits_of(wtype)->block_size) * pb : 0;
}

/* Q4_K / Q5_K 6-bit scales and mins of sub-blocks 0..7 from the 12-byte block (GGML's
 * get_scale_min_k4 layout: j < 4 low 6 bits of bytes j / j+4; j >= 4 nibbles of byte j+4 and the
 * top 2 bits of bytes j-4 / j). */
static void k4_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        m[j] = (uint8_t)(j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* One panel of rows [0, nrows) (nrows <= 8) of n elements into dst (panel_bytes). */
static void pack_panel(int wtype, const uint8_t *w, size_t stride, int nrows, int64_t n, uint8_t *dst)
{
    const quant_traits *qt = quant_traits_of(wtype);
    const int64_t bs = qt->block_size, nb = n / bs;
    const size_t bb = qt->type_size, pb = pblock(wtype);
    /* a whole panel writes every byte below; only a partial one leaves the missing rows' lanes */
    if (nrows < PR) memset(dst, 0, (size_t)nb * pb);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = dst + (size_t)b * pb;
        /* quants: Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K steps are the GGUF bytes themselves (a Q4_0 byte
         * holds elements j and 16 + j, a Q4_K byte elements 64c + l and 64c + 32 + l) */
        for (int r = 0; r < nrows; r++) {
            const uint8_t *blk = w + (size_t)r * stride + (size_t)b * bb;
            switch (wtype) {
            case GGML_TYPE_Q4_0:
                for (int k = 0; k < 4; k++) memcpy(p + 32 * k + 4 * r, blk + 2 + 4 * k, 4);
                break;
            case GGML_TYPE_Q5_0: {
                uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 | (uint32_t)blk[4] << 16 | (uint32_t)blk[5] << 24;
                for (int k = 0; k < 4; k++) memcpy(p + 32 * k + 4 * r, blk + 6 + 4 * k, 4);
                for (int i = 0; i < 4; i++) {
                    unsigned h = 0;
                    for (int v = 0; v < 8; v++) h |= ((qh >> (v < 4 ? 4 * v + i : 16 + 4 * (v - 4) + i)) & 1u) << v;
                    p[128 + 4 * r + i] = (uint8_t)h;
                }
                break;
            }
            case GGML_TYPE_Q8_0:
                for (int k = 0; k < 8; k++) memcpy(p + 32 * k + 4 * r, blk + 2 + 4 * k, 4);
                break;
            case GGML_TYPE_MXFP4: /* qs after the scale byte: byte j holds codes j and 16 + j, as Q4_0 */
                for (int k = 0; k < 4; k++) memcpy(p + 32 * k + 4 * r, blk + 1 + 4 * k, 4);
                p[128 + r] = blk[0];
                break;
            case GGML_TYPE_Q4_K:
            case GGML_TYPE_Q5_K: {
                const uint8_t *qs = blk + (wtype == GGML_TYPE_Q5_K ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs));
                for (int c = 0; c < 4; c++)
                    for (int k = 0; k < 8; k++) memcpy(p + 32 * (8 * c + k) + 4 * r, qs + 32 * c + 4 * k, 4);
                if (wtype == GGML_TYPE_Q5_K) { /* element 64c + 32h + l: bit 2c + h of qh[l] */
                    /* H byte i bit k = bit 2c + h of qh[4k + i]: qh's bytes reordered so that byte
                     * 8i + k is qh[4k + i] (a 4x4 byte transpose per lane, then the lanes' dwords
                     * interleaved), then one movemask per bit plane gives the 4 bytes of a row */
                    __m256i q = _mm256_loadu_si256((const __m256i *)(blk + offsetof(block_q5_K, qh)));
                    q = _mm256_shuffle_epi8(q, _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                                                0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
                    q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                    for (int b2 = 0; b2 < 8; b2++) { /* b2 = 2c + h */
                        uint32_t m = (uint32_t)_mm256_movemask_epi8(_mm256_sll_epi16(q, _mm_cvtsi32_si128(7 - b2)));
                        memcpy(p + 1024 + 32 * b2 + 4 * r, &m, 4);
                    }
                }
                break;
            }
            case GGML_TYPE_Q6_K: {
                /* GGML's element map (engine/kernels/quant_ref.c): u(128h + 32a + l) has low nibble ql[64h + l]
                 * (a = 0) / ql[64h + 32 + l] (a = 1) / their high nibbles (a = 2, 3), and high bits
                 * (qh[32h + l] >> 2a) & 3. L[p = 4h + a] byte j = nibble(j) | nibble(16 + j) << 4;
                 * H[q] byte j = bits of u(64q + 16s + j), s = 0..3: A = qh[32h + j], B = qh[32h +
                 * 16 + j] (h = q / 2) shifted by 4(q & 1), then A, B, A >> 2, B >> 2 two bits each */
                const uint8_t *ql = blk + offsetof(block_q6_K, ql), *qh = blk + offsetof(block_q6_K, qh);
                const __m256i m4 = _mm256_set1_epi8(15);
                const __m128i m3 = _mm_set1_epi8(3);
                for (int h = 0; h < 2; h++) {
                    __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
                    __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
                    __m256i nib[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                      _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                      _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
                    for (int a = 0; a < 4; a++) {
                        __m128i v = _mm_or_si128(_mm256_castsi256_si128(nib[a]),
                                                 _mm_slli_epi16(_mm256_extracti128_si256(nib[a], 1), 4));
                        uint8_t *d = p + 32 * 4 * (4 * h + a) + 4 * r;
                        for (int k = 0; k < 4; k++) {
                            uint32_t x = (uint32_t)_mm_extract_epi32(v, 0);
                            memcpy(d + 32 * k, &x, 4);
                            v = _mm_srli_si128(v, 4);
                        }
                    }
                    __m128i A = _mm_loadu_si128((const __m128i *)(qh + 32 * h));
                    __m128i B = _mm_loadu_si128((const __m128i *)(qh + 32 * h + 16));
                    for (int odd = 0; odd < 2; odd++) {
                        __m128i sa = _mm_srli_epi16(A, 4 * odd), sb = _mm_srli_epi16(B, 4 * odd);
                        __m128i v = _mm_or_si128(_mm_and_si128(sa, m3), _mm_slli_epi16(_mm_and_si128(sb, m3), 2));
                        v = _mm_or_si128(v, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(sa, 2), m3), 4));
                        v = _mm_or_si128(v, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(sb, 2), m3), 6));
                        uint8_t *d = p + 1024 + 32 * 4 * (2 * h + odd) + 4 * r;
                        for (int k = 0; k < 4; k++) {
                            uint32_t x = (uint32_t)_mm_extract_epi32(v, 0);
                            memcpy(d + 32 * k, &x, 4);
                            v = _mm_srli_si128(v, 4);
                        }
                    }
                }
                break;
            }
            default: break;
            }
        }
        /* scales */
        for (int r = 0; r < nrows; r++) {
            const uint8_t *blk = w + (size_t)r * stride + (size_t)b * bb;
            switch (wtype) {
            case GGML_TYPE_Q4_0: memcpy(p + 128 + 2 * r, blk, 2); break;
            case GGML_TYPE_Q5_0: memcpy(p + 160 + 2 * r, blk, 2); break;
            case GGML_TYPE_Q8_0: memcpy(p + 256 + 2 * r, blk, 2); break;
            case GGML_TYPE_Q4_K:
            case GGML_TYPE_Q5_K: {
                const size_t so = wtype == GGML_TYPE_Q5_K ? 1280 : 1024;
                uint8_t sc[8], m[8];
                k4_scales(blk + offsetof(block_q4_K, scales), sc, m);
                for (int j = 0; j < 8; j++) {
                    p[so + 8 * j + r] = sc[j];
                    p[so + 64 + 8 * j + r] = m[j];
                }
                memcpy(p + so + 128 + 2 * r, blk + offsetof(block_q4_K, d), 2);
                memcpy(p + so + 144 + 2 * r, blk + offsetof(block_q4_K, dmin), 2);
                break;
            }
            case GGML_TYPE_Q6_K:
                for (int j = 0; j < 16; j++) p[1536 + 8 * j + r] = blk[offsetof(block_q6_K, scales) + (size_t)j];
                memcpy(p + 1664 + 2 * r, blk + offsetof(block_q6_K, d), 2);
                break;
            default: break;
            }
        }
    }
}

static size_t pack_size(int wtype, int64_t n, int64_t nrows)
{
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || !pblock(wtype) || n <= 0 || nrows <= 0 || n % qt->block_size) return 0;
    return panel_bytes(wtype, n) * (size_t)((nrows + PR - 1) / PR);
}

static void pack(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, void *dst)
{
    if (!pack_size(wtype, n, nrows)) return;
    size_t pb = panel_bytes(wtype, n);
    for (int64_t r0 = 0; r0 < nrows; r0 += PR) {
        int nr = nrows - r0 < PR ? (int)(nrows - r0) : PR;
        pack_panel(wtype, (const uint8_t *)w + (size_t)r0 * w_stride, w_stride, nr, n, (uint8_t *)dst + (size_t)(r0 / PR) * pb);
    }
}

/* ---- panel kernels ---------------------------------------------------------------------------- */

/* Decode prefetch distances, the same bytes ahead as x86_avx512.c's: 4 KiB for Q4_0 / Q5_0 / Q8_0,
 * four of these 8-row super-blocks (its two 16-row ones: 4.6 KiB Q4_K, 6.6 KiB Q6_K) for the
 * K-quants. Two super-blocks had been too close when the machine's read bandwidth was high (a
 * core's lines arrived after its compute reached them): TinyLlama matmuls of a token, 2 threads,
 * against a read pass of ~65 GB/s, Q4_K_M 59-67% -> 67-81%, Q6_K 68-72% -> 73-84% of it; at ~40
 * GB/s both within noise. Q8_0 8 KiB or 2 KiB ahead was worse than 4 (57-66% / 65-71%, 69-84%). */
#define PF_Q8BLK 4096
#define PF_K(pb) (4 * (pb))
#define TMAX 6 /* most tokens per pass (array bound; each type has its own, TM_* below) */

/* Q4_0 (kind 0) / Q5_0 (1) / Q8_0 (2): one block pq of a panel · T tokens; g[t] is token t's
 * activation group of 4 blocks, bq the block's place in it. */
AI void q8blk_block(int kind, const uint8_t *pq, const uint8_t *const *g, int bq, int T, __m256 *acc)
{
    const int pb = kind == 2 ? PB_Q8_0 : kind == 1 ? PB_Q5_0 : PB_Q4_0;
    const int doff = kind == 2 ? 256 : kind == 1 ? 160 : 128;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
    if (T <= 8) /* decode and a batched decode step stream the panel once */
        for (int l = 0; l < pb; l += 64) _mm_prefetch((const char *)pq + PF_Q8BLK + l, _MM_HINT_T0);
    __m256i isum[TMAX];
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) isum[t] = bc32(g[t] + 144 + 4 * bq);
    const int xo = 32 * bq;
    if (kind == 2) {
#if defined(KERN_VNNI)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i W = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(pq + 32 * k)), _mm256_set1_epi8((char)0x80));
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) isum[t] = _mm256_dpbusd_avx_epi32(isum[t], W, bc32(g[t] + xo + 4 * k));
        }
#else
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i W = _mm256_loadu_si256((const __m256i *)(pq + 32 * k)), aw = _mm256_abs_epi8(W);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++)
                isum[t] = pin(_mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(bc32(g[t] + xo + 4 * k), W)),
                                                                      _mm256_set1_epi16(1))));
        }
#endif
    } else {
        __m256i s[TMAX];
        const __m256i H = kind == 1 ? _mm256_loadu_si256((const __m256i *)(pq + 128)) : _mm256_setzero_si256();
        /* the low nibbles (elements 0..15), then the high ones (16..31) */
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            if (h == 0 || kind == 1 || !S_SPLIT)
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 6
            for (int k = 0; k < 4; k++) {
                __m256i V = _mm256_loadu_si256((const __m256i *)(pq + 32 * k)), u;
                if (h == 0) {
                    u = _mm256_and_si256(V, m4);
                    if (kind == 1) u = _mm256_or_si256(u, _mm256_and_si256(_mm256_slli_epi16(H, 4 - k), m10));
                } else {
                    u = _mm256_and_si256(_mm256_srli_epi16(V, 4), m4);
                    if (kind == 1) u = _mm256_or_si256(u, _mm256_and_si256(_mm256_srli_epi16(H, k), m10));
                }
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) s[t] = S_STEP(s[t], u, bc32(g[t] + xo + 16 * h + 4 * k));
            }
            if (h == 1 || kind == 1 || !S_SPLIT)
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) isum[t] = _mm256_add_epi32(isum[t], S_FIN1(s[t]));
        }
    }
    const __m256 S = ld_ph8(pq + doff);
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        __m256 dx = _mm256_set1_ps(ldf(g[t] + 128 + 4 * bq));
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(S, dx), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
}

/* Q4_0 / Q5_0 / Q8_0: one panel · T tokens, blocks [b0, b1), in order. Decode takes whole
 * activation groups 4 blocks at a time (constant offsets: the block's address arithmetic was
 * a fifth of the instructions of a single token's block, which the front end, not the vector
 * units, bounds); a batch keeps one block per iteration (its vector work dominates). */
AI void k_q8blk(int kind, const uint8_t *panel, int64_t b0, int64_t b1, const uint8_t *act, size_t as, int T,
                __m256 *acc)
{
    const int pb = kind == 2 ? PB_Q8_0 : kind == 1 ? PB_Q5_0 : PB_Q4_0;
    int64_t b = b0;
    if (T == 1) {
        for (; b < b1 && (b & 3); b++) {
            const uint8_t *g0 = act + (b >> 2) * XG;
            q8blk_block(kind, panel + b * pb, &g0, (int)(b & 3), 1, acc);
        }
        for (; b + 4 <= b1; b += 4) {
            const uint8_t *g0 = act + (b >> 2) * XG, *pq = panel + b * pb;
#pragma GCC unroll 4
            for (int bq = 0; bq < 4; bq++) q8blk_block(kind, pq + bq * pb, &g0, bq, 1, acc);
        }
    }
    for (; b < b1; b++) {
        const uint8_t *g[TMAX];
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) g[t] = act + (size_t)t * as + (b >> 2) * XG;
        q8blk_block(kind, panel + b * pb, g, (int)(b & 3), T, acc);
    }
}

/* MXFP4: one panel · T tokens, blocks [b0, b1). The nibbles index the E2M1 codes plus MX_BIAS
 * (vpshufb: 0..24, unsigned, so vpmaddubsw / vpdpbusd take them against the signed activation);
 * the activation's correction −MX_BIAS·Σq takes the bias out again, so each block's integer sum
 * is Σ code·q exactly (4 vpmaddubsw steps per half ≤ 8·24·127 in int16). Then per row, as the
 * scalar reference: acc = fma(2^(e−128)·d_x, Σ, acc) block after block. */
AI __m256 e8m0_half8(const uint8_t *e)
{
    /* quant_e8m0_half on 8 bytes: e < 2 the subnormals 0x00200000 << e, else (e − 1) << 23 */
    __m256i v = ld_u8x8(e), small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), v);
    __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(norm, sub, small));
}

AI void k_mxfp4(const uint8_t *panel, int64_t b0, int64_t b1, const uint8_t *act, size_t as, int T, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15,
                                         16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *pq = panel + b * PB_MXFP4;
        const int bq = (int)(b & 3), xo = 32 * bq;
        if (T == 1)
            for (int l = 0; l < PB_MXFP4; l += 64) _mm_prefetch((const char *)pq + PF_Q8BLK + l, _MM_HINT_T0);
        const uint8_t *g[TMAX];
        __m256i isum[TMAX], s[TMAX];
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            g[t] = act + (size_t)t * as + (b >> 2) * XG;
            isum[t] = bc32(g[t] + 144 + 4 * bq);
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i V = _mm256_loadu_si256((const __m256i *)(pq + 32 * k));
                __m256i u = _mm256_shuffle_epi8(lut, h ? _mm256_and_si256(_mm256_srli_epi16(V, 4), m4) : _mm256_and_si256(V, m4));
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) s[t] = S_STEP(s[t], u, bc32(g[t] + xo + 16 * h + 4 * k));
            }
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) isum[t] = _mm256_add_epi32(isum[t], S_FIN1(s[t]));
        }
        const __m256 S = e8m0_half8(pq + 128);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 dx = _mm256_set1_ps(ldf(g[t] + 128 + 4 * bq));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(S, dx), _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
}

/* 5th bit of step k (bit k of each byte of H) at bit 4 (16-bit shifts; no bit of the other byte
 * reaches bit 4). */
AI __m256i bit4_of(__m256i H, int k)
{
    return k < 4 ? _mm256_slli_epi16(H, 4 - k) : k > 4 ? _mm256_srli_epi16(H, k - 4) : H;
}

/* Q4_K (q5 = 0) / Q5_K (q5 = 1): one panel · T tokens, super-blocks [b0, b1). */
AI void k_k45(int q5, const uint8_t *panel, int64_t b0, int64_t b1, const uint8_t *act, size_t as, int T, __m256 *acc)
{
    const int pb = q5 ? PB_Q5_K : PB_Q4_K, so = q5 ? 1280 : 1024;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *sb = panel + b * pb;
        const uint8_t *g[TMAX];
        __m256i A[TMAX], B[TMAX];
        /* decode and a batched decode step stream the panel once; the loop unrolled (as a loop of
         * 19-27 turns it had been 8% of a single token's Q4_K time) */
        if (T <= 8)
#pragma GCC unroll 32
            for (int l = 0; l < pb; l += 64) _mm_prefetch((const char *)sb + PF_K(pb) + l, _MM_HINT_T0);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            g[t] = act + (size_t)t * as + b * KG;
            A[t] = B[t] = _mm256_setzero_si256();
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) { /* sub-block j: pair c = j / 2, low (j even) or high nibbles */
            const int c = j / 2, h = j & 1;
            /* VNNI scales the int32 sums (sc32), vpmaddubsw's int16 pairs take sc16 */
            const __m256i sc32 = S_SPLIT ? _mm256_setzero_si256() : ld_u8x8(sb + so + 8 * j),
                          sc16 = S_SPLIT ? pair_u8(sb + so + 8 * j) : sc32;
            (void)sc16;
            (void)sc32;
            __m256i H = q5 ? _mm256_loadu_si256((const __m256i *)(sb + 1024 + 64 * c + 32 * h)) : _mm256_setzero_si256();
            __m256i s[TMAX];
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                __m256i P = _mm256_loadu_si256((const __m256i *)(sb + 32 * (8 * c + k)));
                __m256i u = h ? _mm256_and_si256(_mm256_srli_epi16(P, 4), m4) : _mm256_and_si256(P, m4);
                if (q5) u = _mm256_or_si256(u, _mm256_and_si256(bit4_of(H, k), m10));
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) s[t] = S_STEP(s[t], u, bc32(g[t] + 64 * c + 32 * h + 4 * k));
                if (q5 && S_SPLIT && k == 3)
#pragma GCC unroll 6
                    for (int t = 0; t < T; t++) {
                        A[t] = _mm256_add_epi32(A[t], S_FINSC(s[t], sc32, sc16));
                        s[t] = _mm256_setzero_si256();
                    }
            }
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) A[t] = _mm256_add_epi32(A[t], S_FINSC(s[t], sc32, sc16));
        }
        /* Σ_j m_j·Σq_x(sub-block j): (m_2i, m_2i+1) int16 pairs per row · the activation's pairs */
#pragma GCC unroll 6
        for (int i = 0; i < 4; i++) {
            __m256i M = pair2_u8(sb + so + 64 + 16 * i);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) B[t] = _mm256_add_epi32(B[t], _mm256_madd_epi16(M, bc32(g[t] + 260 + 4 * i)));
        }
        const __m256 D = ld_ph8(sb + so + 128), Dm = ld_ph8(sb + so + 144);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 dx = _mm256_set1_ps(ldf(g[t] + 256));
            if (q5) {
                __m256 v = _mm256_sub_ps(_mm256_mul_ps(D, _mm256_cvtepi32_ps(A[t])), _mm256_mul_ps(Dm, _mm256_cvtepi32_ps(B[t])));
                acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(dx, v));
            } else {
                __m256 v = _mm256_fmsub_ps(D, _mm256_cvtepi32_ps(A[t]), _mm256_mul_ps(Dm, _mm256_cvtepi32_ps(B[t])));
                acc[t] = _mm256_fmadd_ps(dx, v, acc[t]);
            }
        }
    }
}

/* Q6_K: one panel · T tokens, super-blocks [b0, b1). Σ_j sc_j·Σ u·x − 32·Σ_j sc_j·Σx. */
AI void k_q6_K(const uint8_t *panel, int64_t b0, int64_t b1, const uint8_t *act, size_t as, int T, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *sb = panel + b * PB_Q6_K;
        const uint8_t *g[TMAX];
        __m256i A[TMAX], B[TMAX];
        if (T <= 8) /* decode and a batched decode step stream the panel once */
#pragma GCC unroll 32
            for (int l = 0; l < PB_Q6_K; l += 64) _mm_prefetch((const char *)sb + PF_K(PB_Q6_K) + l, _MM_HINT_T0);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            g[t] = act + (size_t)t * as + b * KG;
            A[t] = B[t] = _mm256_setzero_si256();
        }
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) { /* sub-block j = 4q + s */
            const int q = j / 4, s4 = j % 4;
            const __m256i sc32 = S_SPLIT ? _mm256_setzero_si256() : ld_i8x8(sb + 1536 + 8 * j),
                          sc16 = S_SPLIT ? pair_i8(sb + 1536 + 8 * j) : sc32;
            (void)sc16;
            (void)sc32;
            __m256i s[TMAX];
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 6
            for (int k = 0; k < 4; k++) {
                __m256i L = _mm256_loadu_si256((const __m256i *)(sb + 32 * (4 * (2 * q + s4 / 2) + k)));
                __m256i H = _mm256_loadu_si256((const __m256i *)(sb + 1024 + 32 * (4 * q + k)));
                __m256i lo = s4 & 1 ? _mm256_and_si256(_mm256_srli_epi16(L, 4), m4) : _mm256_and_si256(L, m4);
                __m256i hi = s4 == 0 ? _mm256_slli_epi16(H, 4) : s4 == 1 ? _mm256_slli_epi16(H, 2) : s4 == 2 ? H : _mm256_srli_epi16(H, 2);
                __m256i u = _mm256_or_si256(lo, _mm256_and_si256(hi, m30));
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) s[t] = S_STEP(s[t], u, bc32(g[t] + 16 * j + 4 * k));
                if (S_SPLIT && k == 1)
#pragma GCC unroll 6
                    for (int t = 0; t < T; t++) {
                        A[t] = _mm256_add_epi32(A[t], S_FINSC(s[t], sc32, sc16));
                        s[t] = _mm256_setzero_si256();
                    }
            }
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) A[t] = _mm256_add_epi32(A[t], S_FINSC(s[t], sc32, sc16));
        }
        /* Σ_j sc_j·Σq_x(j): (sc_2i, sc_2i+1) int16 pairs per row · the activation's Σ per 16 pairs */
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m256i SC = pair2_i8(sb + 1536 + 16 * i);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) B[t] = _mm256_add_epi32(B[t], _mm256_madd_epi16(SC, bc32(g[t] + 276 + 4 * i)));
        }
        const __m256 D = ld_ph8(sb + 1664);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 dx = _mm256_set1_ps(ldf(g[t] + 256));
            __m256i tot = _mm256_sub_epi32(A[t], _mm256_slli_epi32(B[t], 5));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(D, dx), _mm256_cvtepi32_ps(tot), acc[t]);
        }
    }
}

/* T tokens through elements [e0, e1) of one panel; adds to (accumulate) or sets the outputs of
 * the rows in rmask (all 8 when full). */
AI void ptile(int wtype, const uint8_t *panel, int64_t e0, int64_t e1, const uint8_t *act, size_t as, int T, float *out,
              size_t os, __m256i rmask, int full, int accumulate)
{
    __m256 acc[TMAX];
#pragma GCC unroll 6
    for (int t = 0; t < T; t++)
        acc[t] = !accumulate ? _mm256_setzero_ps()
                 : full      ? _mm256_loadu_ps(out + (size_t)t * os)
                             : _mm256_maskload_ps(out + (size_t)t * os, rmask);
    switch (wtype) {
    case GGML_TYPE_Q4_0: k_q8blk(0, panel, e0 / 32, e1 / 32, act, as, T, acc); break;
    case GGML_TYPE_Q5_0: k_q8blk(1, panel, e0 / 32, e1 / 32, act, as, T, acc); break;
    case GGML_TYPE_Q8_0: k_q8blk(2, panel, e0 / 32, e1 / 32, act, as, T, acc); break;
    case GGML_TYPE_Q4_K: k_k45(0, panel, e0 / 256, e1 / 256, act, as, T, acc); break;
    case GGML_TYPE_Q5_K: k_k45(1, panel, e0 / 256, e1 / 256, act, as, T, acc); break;
    case GGML_TYPE_Q6_K: k_q6_K(panel, e0 / 256, e1 / 256, act, as, T, acc); break;
    case GGML_TYPE_MXFP4: k_mxfp4(panel, e0 / 32, e1 / 32, act, as, T, acc); break;
    default: break;
    }
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        if (full) _mm256_storeu_ps(out + (size_t)t * os, acc[t]);
        else _mm256_maskstore_ps(out + (size_t)t * os, rmask, acc[t]);
    }
}

/* Elements per k-slice of a batch (a multiple of 256). */
#define KC 1024

#define PT(W, T) ptile(W, panel, e0, e1, act + (size_t)t * as, as, T, out + (size_t)t * os, os, rmask, full, e0 > 0)
#define PRUN(name, wt, TM)                                                                                  \
    static void name(const uint8_t *panel, int64_t n, const uint8_t *act, size_t as, int n_tokens, float *out, \
                     size_t os, __m256i rmask, int full)                                                    \
    {                                                                                                       \
        int64_t kc = n_tokens == 1 ? n : KC;                                                                \
        for (int64_t e0 = 0; e0 < n; e0 += kc) {                                                            \
            int64_t e1 = n - e0 < kc ? n : e0 + kc;                                                         \
            int t = 0;                                                                                      \
            for (; t + (TM) <= n_tokens; t += (TM)) PT(wt, TM);                                             \
            switch (n_tokens - t) {                                                                         \
            case 1: PT(wt, 1); break;                                                                       \
            case 2: if ((TM) > 2) PT(wt, (TM) > 2 ? 2 : 1); break;                                          \
            case 3: if ((TM) > 3) PT(wt, (TM) > 3 ? 3 : 1); break;                                          \
            case 4: if ((TM) > 4) PT(wt, (TM) > 4 ? 4 : 1); break;                                          \
            case 5: if ((TM) > 5) PT(wt, (TM) > 5 ? 5 : 1); break;                                          \
            default: break;                                                                                 \
            }                                                                                               \
        }                                                                                                   \
    }
#ifndef TM_Q6
#define TM_Q6 4
#endif
#ifndef TM_K
#define TM_K 4
#endif
#ifndef TM_Q4
#define TM_Q4 6
#endif
#ifndef TM_Q8
#define TM_Q8 6
#endif
PRUN(prun_q4_0, GGML_TYPE_Q4_0, TM_Q4)
PRUN(prun_q5_0, GGML_TYPE_Q5_0, TM_Q4)
PRUN(prun_q8_0, GGML_TYPE_Q8_0, TM_Q8)
PRUN(prun_q4_K, GGML_TYPE_Q4_K, TM_K)
PRUN(prun_q5_K, GGML_TYPE_Q5_K, TM_K)
PRUN(prun_q6_K, GGML_TYPE_Q6_K, TM_Q6)
PRUN(prun_mxfp4, GGML_TYPE_MXFP4, TM_Q4)

static void gemm_packed(int wtype, int64_t n, int64_t row0, int64_t nrows, const void *packed, const void *act,
                        size_t act_stride, int n_tokens, float *out, size_t out_stride)
{
    size_t pb = panel_bytes(wtype, n);
    if (!pb) return;
    for (int64_t r = row0; r < row0 + nrows; r += PR) {
        int nr = row0 + nrows - r < PR ? (int)(row0 + nrows - r) : PR;
        const uint8_t *panel = (const uint8_t *)packed + (size_t)(r / PR) * pb;
        __m256i rmask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        float *o = out + (r - row0);
        int full = nr == PR;
        switch (wtype) {
        case GGML_TYPE_Q4_0: prun_q4_0(panel, n, act, act_stride, n_tokens, o, out_stride, rmask, full); break;
        case GGML_TYPE_Q5_0: prun_q5_0(panel, n, act, act_stride, n_tokens, o, out_stride, rmask, full); break;
        case GGML_TYPE_Q8_0: prun_q8_0(panel, n, act, act_stride, n_tokens, o, out_stride, rmask, full); break;
        case GGML_TYPE_Q4_K: prun_q4_K(panel, n, act, act_stride, n_tokens, o, out_stride, rmask, full); break;
        case GGML_TYPE_Q5_K: prun_q5_K(panel, n, act, act_stride, n_tokens, o, out_stride, rmask, full); break;
        case GGML_TYPE_Q6_K: prun_q6_K(panel, n, act, act_stride, n_tokens, o, out_stride, rmask, full); break;
        case GGML_TYPE_MXFP4: prun_mxfp4(panel, n, act, act_stride, n_tokens, o, out_stride, rmask, full); break;
        default: break;
        }
    }
}

/* ---- entry points on GGUF rows ------------------------------------------------------------------ */

static void fill_nan(float *out, int64_t nrows, int n_tokens, size_t os)
{
    for (int t = 0; t < n_tokens; t++)
        for (int64_t r = 0; r < nrows; r++) out[(size_t)t * os + r] = NAN;
}

/* GGUF rows of a type with panels (a model packs them at load; this path serves direct calls):
 * 8 rows at a time into a scratch panel, then the panel kernel — the results are those of the
 * packed weights bit for bit. */
static void gemm_via_panels(int wtype, int64_t n, int64_t nrows, const uint8_t *w, size_t stride, const void *act,
                            size_t as, int n_tokens, float *out, size_t os)
{
    size_t pb = panel_bytes(wtype, n);
    uint8_t *panel = aligned_alloc(64, ROUND64(pb));
    if (!panel) {
        fill_nan(out, nrows, n_tokens, os);
        return;
    }
    for (int64_t r = 0; r < nrows; r += PR) {
        int nr = nrows - r < PR ? (int)(nrows - r) : PR;
        pack_panel(wtype, w + (size_t)r * stride, stride, nr, n, panel);
        gemm_packed(wtype, n, 0, nr, panel, act, as, n_tokens, out + r, os);
    }
    free(panel);
}

static void gemm(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act, size_t act_stride,
                 int n_tokens, float *out, size_t out_stride)
{
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || !qt->supported || n < 0 || n % qt->block_size) {
        fill_nan(out, nrows, n_tokens, out_stride);
        return;
    }
    switch (act_kind(wtype)) {
    case ACT_F32:
    case ACT_F16:
    case ACT_BF16:
#if defined(GEMM_FLOAT_ASAN)
        gemm_float_asan_check(w, w_stride, nrows, (size_t)n * (wtype == GGML_TYPE_F32 ? 4 : 2), act, act_stride, n_tokens,
                              (size_t)n * 4, out, out_stride);
#endif
        kern_avx2_gemm_float(wtype, w, w_stride, nrows, act, act_stride, n_tokens, n, out, out_stride);
        return;
    case ACT_Q8B:
    case ACT_K:
        gemm_via_panels(wtype, n, nrows, w, w_stride, act, act_stride, n_tokens, out, out_stride);
        return;
    default:
        for (int t = 0; t < n_tokens; t++)
            base.vec_dot_rows(wtype, n, nrows, w, w_stride, (const uint8_t *)act + (size_t)t * act_stride,
                              out + (size_t)t * out_stride);
        return;
    }
}

static void gemv(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act, float *out)
{
    gemm(wtype, n, nrows, w, w_stride, act, 0, 1, out, 0);
}

#if defined(KERN_VNNI)
void kern_fill_gemm_avxvnni(kern_ops *o)
#else
void kern_fill_gemm_avx2(kern_ops *o)
#endif
{
    base = *o;
    if (!base.quantize_row) base.quantize_row = quant_quantize_row;
    if (!base.vec_dot_rows) base.vec_dot_rows = quant_vec_dot_rows;
    o->act_row_size = act_row_size;
    o->act_prepare = act_prepare;
    o->gemv = gemv;
    o->gemm = gemm;
    o->pack_size = pack_size;
    o->pack = pack;
    o->gemm_packed = gemm_packed;
}

#else /* not an AVX2 (+ AVX-VNNI) build: nothing to fill */

#if defined(KERN_VNNI)
void kern_fill_gemm_avxvnni(kern_ops *o)
#else
void kern_fill_gemm_avx2(kern_ops *o)
#endif
{
    (void)o;
}

#endif
