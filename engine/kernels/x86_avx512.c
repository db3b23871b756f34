/* x86_avx512: the AVX-512 level's matrix kernels — activations prepared once per matmul, 16-row weight panels packed once per model, GEMV / GEMM, the attention tile. */
/*
 * A matmul y = W·x quantizes its activation rows once (quant_act_prepare) to exactly the
 * values quant_quantize_row gives for the weight type's vec_dot_type, laid out for the kernels:
 *
 *   weights   activation layout (per group)                                     kernel
 *   F32       x as is (f32)                                                     FMA
 *   F16       x as fp16 (GGML's F16·F16 product)                                F16C + FMA
 *   Q4_0/Q5_0 4 blocks: x[0..15] of each, x[16..31] of each (int8), d_x per     VNNI u8·s8
 *             block, −8·Σq (Q5_0: −16·Σq) per block (int32)
 *   Q8_0      4 blocks: x (int8), d_x per block, −128·Σq per block              VNNI (q+128)·s8
 *   Q4_K/Q5_K 256: x in the order sub-blocks 0,2,1,3,4,6,5,7 (the nibble order),
 *             d_x, Σq per 32                                                    VNNI / maddubs
 *   Q6_K      256: x in order, d_x, Σq per 16 (and −32·Σq per 16)              VNNI / maddubs
 *   MXFP4     as Q4_0, the correction −12·Σq per block                          VNNI (code+12)·s8
 *   others    the vec_dot_type row of quant_quantize_row                        quant_vec_dot
 *
 * Weights. Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K / MXFP4 matrices are packed once at model load
 * (quant_pack, called by op_weights_pack) into 16-row panels where one 64-byte vector holds 4
 * elements of 16 rows (layouts below): decode and prefill then run the same panel kernel — a
 * vector load (and a nibble unpack) feeds vpdpbusd with a broadcast activation dword, each
 * 32-bit lane sums one row exactly — with 1 token (decode: one sequential stream through
 * memory, prefetched ahead) or up to 8 tokens at a time (prefill: the panel slice stays in L1
 * while the tokens pass).
 * quant_gemv on GGUF rows of these types packs 16 rows into a scratch panel and runs the same
 * kernel. F32 / F16 rows are used as they are (gemm_float_avx512.c): GEMV streams one row at a
 * time, GEMM is an inner-product kernel over tiles of 4 rows × 6 tokens (no packing). Every other
 * type goes through quant_vec_dot_rows.
 *
 * Arithmetic. Integer parts are exact. For Q4_0 / Q5_0 / Q8_0 the per-row float order is that of
 * the scalar reference with the block scale fused, acc = fma(d_w·d_x, Σ_block, acc) block after
 * block, in every kernel — 1 token or 8, any number of threads — because the next layer
 * re-quantizes the output and a different rounding there shows up in the logits (the golden
 * tests against llama.cpp see it). K-quants sum a super-block exactly in integers first; Q5_K then
 * scales it exactly as the scalar reference does (below).
 *
 * The kernels need AVX-512 (F, BW, VL, VNNI, VBMI) and F16C/FMA at build time (-march=native on
 * this project's machines); without them quant_pack_size is 0, every type uses the vec_dot_type
 * row and quant_vec_dot_rows, and the API is the same.
 */
#include "engine/kernels/gemm_float.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/quant.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__F16C__) && defined(__FMA__)
#define QG_AVX512 1
#include <immintrin.h>

#include "engine/kernels/simd_util.h"
#endif

#if defined(QG_AVX512) /* the rest of the file, but the fill function */

/* The level below (AVX-VNNI or AVX2), for the types and operations this file leaves to it. */
static kern_ops base;
static void g_gemm_packed(int wtype, int64_t n, int64_t row0, int64_t nrows, const void *packed, const void *act,
                          size_t act_stride, int n_tokens, float *out, size_t out_stride);

/* Activation layouts (see the table above). */
enum act_kind { ACT_STD, ACT_F32, ACT_F16R, ACT_Q4_0, ACT_Q5_0, ACT_Q8_0, ACT_K4, ACT_K6, ACT_MXFP4 };

static int act_kind(int wtype)
{
#if defined(QG_AVX512)
    switch (wtype) {
    case GGML_TYPE_F32: return ACT_F32;
    case GGML_TYPE_F16: return ACT_F16R;
    case GGML_TYPE_Q4_0: return ACT_Q4_0;
    case GGML_TYPE_Q5_0: return ACT_Q5_0;
    case GGML_TYPE_Q8_0: return ACT_Q8_0;
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: return ACT_K4;
    case GGML_TYPE_Q6_K: return ACT_K6;
    case GGML_TYPE_MXFP4: return ACT_MXFP4;
    default: return ACT_STD;
    }
#else
    (void)wtype;
    return ACT_STD;
#endif
}

#define ROUND64(x) (((x) + 63) & ~(size_t)63)

/* Bytes per group of each layout. */
#define Q4G_BYTES 256   /* 128 elements: xlo[64] xhi[64] dx[4 f32] (pad to 192) corr[16 i32] (lane 4b) */
#define Q8G_BYTES 384   /* 128 elements: x[128] dx[4 f32] (pad to 256) corr[2][16 i32] (lanes 0, 8) */
#define KG_BYTES 384    /* 256 elements: x[256], d (f32) at 256, Σq per 32 (K4, 8 × i16) or per 16 (K6,
                           16 × i16) at 260; at 320 K4: Σq per 32 as f32[8], K6: −32·Σq per 16 as i32[16] */

static size_t g_act_row_size(int wtype, int64_t n)
{
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || n < 0 || n % qt->block_size) return 0;
    switch (act_kind(wtype)) {
    case ACT_F32: return ROUND64((size_t)n * 4);
    case ACT_F16R: return ROUND64((size_t)n * 2);
    case ACT_Q4_0: case ACT_Q5_0: case ACT_MXFP4: return (size_t)((n / 32 + 3) / 4) * Q4G_BYTES;
    case ACT_Q8_0: return (size_t)((n / 32 + 3) / 4) * Q8G_BYTES;
    case ACT_K4: case ACT_K6: return (size_t)(n / 256) * KG_BYTES;
    default: return ROUND64(quant_row_size(qt->vec_dot_type, n));
    }
}

#if defined(QG_AVX512)

/* ---- activation preparation ------------------------------------------------------------ */

/* One Q8_0 block exactly as quant_quantize_row(Q8_0): d = fp16(amax/127), q = round-half-even
 * (x·127/amax). Returns d as float; q as 32 int8 at q, Σq in *sum. */
static inline float q8_0_block(const float *x, int8_t *q, int *sum)
{
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    float d = amax / 127.0f;
    uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, id));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qb));
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    return _cvtsh_ss(dh);
}

/* Q4_0 (bias 8) and Q5_0 (bias 16) share the layout; the bias goes into the correction. */
static void prep_q4_0(const float *x, int64_t n, uint8_t *act, int bias)
{
    int64_t nb = n / 32, ng = (nb + 3) / 4;
    memset(act, 0, (size_t)ng * Q4G_BYTES);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *g = act + (b / 4) * Q4G_BYTES;
        int j = (int)(b % 4), sum;
        int8_t q[32];
        float d = q8_0_block(x + 32 * b, q, &sum);
        memcpy(g + 16 * j, q, 16);
        memcpy(g + 64 + 16 * j, q + 16, 16);
        ((float *)(g + 128))[j] = d;
        ((int32_t *)(g + 192))[4 * j] = -bias * sum;
    }
}

static void prep_q8_0(const float *x, int64_t n, uint8_t *act)
{
    int64_t nb = n / 32, ng = (nb + 3) / 4;
    memset(act, 0, (size_t)ng * Q8G_BYTES);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *g = act + (b / 4) * Q8G_BYTES;
        int j = (int)(b % 4), sum;
        float d = q8_0_block(x + 32 * b, (int8_t *)g + 32 * j, &sum);
        ((float *)(g + 128))[j] = d;
        ((int32_t *)(g + 256))[8 * j] = -128 * sum;
    }
}

/* K layouts: Q8_K values (quant_quantize_row), x reordered for Q4_K's / Q5_K's nibble order. */
static void prep_k(const float *x, int64_t n, uint8_t *act, int k6)
{
    static const int order4[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    block_q8_K blk;
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t *g = act + b * KG_BYTES;
        base.quantize_row(GGML_TYPE_Q8_K, x + 256 * b, &blk, 256);
        memcpy(g + 256, &blk.d, 4);
        int16_t *bs = (int16_t *)(g + 260);
        if (k6) {
            memcpy(g, blk.qs, 256);
            memcpy(bs, blk.bsums, 32);
            int32_t *corr = (int32_t *)(g + 320);
            for (int s = 0; s < 16; s++) corr[s] = -32 * blk.bsums[s];
        } else {
            float *fs = (float *)(g + 320);
            for (int s = 0; s < 8; s++) {
                memcpy(g + 32 * s, blk.qs + 32 * order4[s], 32);
                bs[s] = (int16_t)(blk.bsums[2 * s] + blk.bsums[2 * s + 1]);
                fs[s] = (float)bs[s];
            }
        }
    }
}

static void prep_f16r(const float *x, int64_t n, uint16_t *out)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = fp32_to_fp16(x[i]);
}

/* The 12-byte Q4_K/Q5_K scale block as 16 bytes: sc[0..7] then m[0..7] (6-bit each). */
static inline __m128i k4_unpack_scales(const uint8_t *s)
{
    uint32_t a, b, c;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    return _mm_setr_epi32((int)(a & 0x3f3f3f3fu), (int)((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)),
                          (int)(b & 0x3f3f3f3fu), (int)(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)));
}

/* ---- weights packed at load: 16-row panels -----------------------------------------------------
 * quant_pack rewrites a matrix of Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K rows, 16 rows
 * (QUANT_PANEL_ROWS) at a time, so that one 64-byte vector holds the same 4 elements of all 16
 * rows (dword lane r = row r). One sequential stream then feeds 16 rows: a vector load (plus a
 * nibble unpack) goes to vpdpbusd with an activation dword broadcast, and every 32-bit lane sums
 * the products of one row exactly. The packed matrix is the size of the GGUF one (Q4_K: +2.8%,
 * Q5_K: +2.3%) and keeps quants unsigned (the activation's −bias·Σq starts each sum, so Σ u·x − bias·Σx = Σ q·x exactly):
 *
 *   Q4_0, per block (288 B):    V[4] (lane r byte i: low nibble = element 4k+i, high = 16+4k+i),
 *                               fp16 d[16]
 *   Q5_0, per block (352 B):    V[4] as Q4_0 (low 4 bits), H (byte (r,i) bit v: 5th bit of vector
 *                               v's byte: v < 4 low nibbles of V[v], v >= 4 high nibbles of V[v-4]),
 *                               fp16 d[16]
 *   Q8_0, per block (544 B):    V[8] (q ^ 0x80 = q + 128 of elements 4k..4k+3), fp16 d[16]
 *   Q4_K, per super-block (2368 B): P[4][8] (pair c: low nibble = element 64c+4k+i (sub-block 2c),
 *                               high = 64c+32+4k+i (2c+1)), u8 sc[8][16], u8 m[8][16], fp16 d[16],
 *                               fp16 dmin[16]
 *   Q5_K, per super-block (2880 B): P[4][8] as Q4_K (low 4 bits), H[4][2] (pair c: bit k of byte
 *                               (r,i) of H[c][0] / H[c][1] = 5th bit of the low / high nibble of
 *                               P[c][k]), u8 sc[8][16], u8 m[8][16], fp16 d[16], fp16 dmin[16]
 *   Q6_K, per super-block (3360 B): L[8][4] (pair p: low 4 bits of sub-blocks 2p | 2p+1 << 4),
 *                               H[4][4] (quad q: high 2 bits of sub-blocks 4q..4q+3 at bits 0,2,4,6),
 *                               i8 sc[16][16], fp16 d[16]
 *
 * The per-row float arithmetic is fixed, whatever the number of threads or tokens: Q4_0 / Q8_0
 * acc = fma(d_w·d_x, Σ_block, acc) block after block (the reference's order); K-quants take the
 * exact integer sum of a super-block (Σ_j sc_j·Σq_w·q_x, Σ_j m_j·Σq_x) before one scaling:
 * Q4_K acc = fma(d_x, fma(d_w, Σ, −dmin_w·Σm), acc); Q5_K acc += d_x·(d_w·Σ − dmin_w·Σm), each
 * operation rounded (the build's -std=c11 keeps GCC from contracting them into FMAs), which is
 * quant_vec_dot_ref's order bit for bit: the golden tests against llama.cpp agree best with it
 * (syn-llama-q5_k_m.p1 within 1e-5, where GGML's x86 AVX2 vec_dot order or the Q4_K form flip an
 * activation rounding and move logits by 0.4). */

#define PB_Q4_0 288
#define PB_Q5_0 352
#define PB_Q8_0 544
#define PB_Q4_K 2368
#define PB_Q5_K 2880
#define PB_Q6_K 3360
#define PB_MXFP4 272 /* V[4] @64k as Q4_0 (the E2M1 codes of 16 rows), u8 e[16] @256 (E8M0 scales) */
#define MX_BIAS 12   /* the MXFP4 kernel looks its codes up as value + 12 (0..24, unsigned) */

/* Bytes of one 16-row panel of rows of n elements; 0 for types without a packed layout. */
static size_t panel_bytes(int wtype, int64_t n)
{
    switch (wtype) {
    case GGML_TYPE_Q4_0: return (size_t)(n / 32) * PB_Q4_0;
    case GGML_TYPE_Q5_0: return (size_t)(n / 32) * PB_Q5_0;
    case GGML_TYPE_Q8_0: return (size_t)(n / 32) * PB_Q8_0;
    case GGML_TYPE_Q4_K: return (size_t)(n / 256) * PB_Q4_K;
    case GGML_TYPE_Q5_K: return (size_t)(n / 256) * PB_Q5_K;
    case GGML_TYPE_Q6_K: return (size_t)(n / 256) * PB_Q6_K;
    case GGML_TYPE_MXFP4: return (size_t)(n / 32) * PB_MXFP4;
    default: return 0;
    }
}

static inline __attribute__((always_inline)) void transpose16i(__m512i v[16])
{
    simd_transpose16x16((__m512 *)v);
}

/* Unsigned quants of 64 consecutive elements (from e0) of each of 16 rows (rows >= nrows are
 * zero), transposed: out[k] = elements e0+4k..e0+4k+3 of every row. */
static inline __attribute__((always_inline)) void rows64(int wtype, const uint8_t *w, size_t stride, int nrows,
                                                        int64_t e0, int64_t n, __m512i out[16])
{
    static const uint8_t idx_q4_0[64] __attribute__((aligned(64))) = {
        2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
        20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35,
    };
    static const uint8_t idx_q5_0[64] __attribute__((aligned(64))) = {
        6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
        28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
    };
    static const uint8_t idx_q8_0[64] __attribute__((aligned(64))) = {
        2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33,
        36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67,
    };
    static const uint16_t sh_q4_0[32] __attribute__((aligned(64))) = {
        0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4,
    };
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    int two = e0 + 64 <= n; /* Q4_0 / Q5_0 / Q8_0 rows of an odd block count end with half a chunk */
    for (int r = 0; r < 16; r++) {
        if (r >= nrows) {
            out[r] = _mm512_setzero_si512();
            continue;
        }
        const uint8_t *row = w + (size_t)r * stride;
        switch (wtype) {
        case GGML_TYPE_Q4_0: {
            const uint8_t *p = row + (e0 / 32) * 18;
            __m512i q = _mm512_permutexvar_epi8(_mm512_load_si512(idx_q4_0),
                                                _mm512_maskz_loadu_epi8(((__mmask64)1 << (two ? 36 : 18)) - 1, p));
            out[r] = _mm512_maskz_and_epi32(two ? 0xffff : 0x00ff, _mm512_srlv_epi16(q, _mm512_load_si512(sh_q4_0)), m4);
            break;
        }
        case GGML_TYPE_Q5_0: {
            const uint8_t *p = row + (e0 / 32) * 22;
            __m512i q = _mm512_permutexvar_epi8(_mm512_load_si512(idx_q5_0),
                                                _mm512_maskz_loadu_epi8(((__mmask64)1 << (two ? 44 : 22)) - 1, p));
            q = _mm512_and_si512(_mm512_srlv_epi16(q, _mm512_load_si512(sh_q4_0)), m4);
            uint32_t h0, h1 = 0;
            memcpy(&h0, p + 2, 4);
            if (two) memcpy(&h1, p + 24, 4);
            q = _mm512_mask_add_epi8(q, (__mmask64)h0 | (__mmask64)h1 << 32, q, _mm512_set1_epi8(0x10)); /* nibble + 16 */
            out[r] = _mm512_maskz_mov_epi32(two ? 0xffff : 0x00ff, q);
            break;
        }
        case GGML_TYPE_Q8_0: {
            const uint8_t *p = row + (e0 / 32) * 34;
            __m512i A = _mm512_maskz_loadu_epi8(two ? ~(__mmask64)0 : ((__mmask64)1 << 34) - 1, p);
            __m512i B = _mm512_maskz_loadu_epi8(two ? 0xf : 0, p + 64);
            __m512i q = _mm512_xor_si512(_mm512_permutex2var_epi8(A, _mm512_load_si512(idx_q8_0), B),
                                         _mm512_set1_epi8((char)0x80));
            out[r] = _mm512_maskz_mov_epi32(two ? 0xffff : 0x00ff, q);
            break;
        }
        case GGML_TYPE_Q4_K: {
            const block_q4_K *blk = (const block_q4_K *)row + e0 / 256;
            int c = (int)(e0 % 256) / 64;
            __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * c));
            __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
            out[r] = _mm512_and_si512(_mm512_srlv_epi64(qq, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), m4);
            break;
        }
        case GGML_TYPE_Q5_K: { /* as Q4_K, plus bit 2c (low nibbles) / 2c+1 (high) of qh[l] as bit 4 */
            const block_q5_K *blk = (const block_q5_K *)row + e0 / 256;
            int c = (int)(e0 % 256) / 64;
            __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * c));
            __m256i h = _mm256_loadu_si256((const __m256i *)blk->qh);
            __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
            __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
            qq = _mm512_and_si512(_mm512_srlv_epi64(qq, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), m4);
            hh = _mm512_srlv_epi64(hh, _mm512_set_epi64(2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c, 2 * c, 2 * c, 2 * c));
            out[r] = _mm512_or_si512(qq, _mm512_slli_epi16(_mm512_and_si512(hh, _mm512_set1_epi8(1)), 4));
            break;
        }
        default: { /* Q6_K: elements 64c..64c+63 of the super-block (ggml's element map) */
            const block_q6_K *x = (const block_q6_K *)row + e0 / 256;
            int c = (int)(e0 % 256) / 64, h = c / 2, hi = c % 2;
            const __m256i m4y = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
            __m256i a, b;
            if (!hi) {
                a = _mm256_or_si256(_mm256_and_si256(l0, m4y), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
                b = _mm256_or_si256(_mm256_and_si256(l1, m4y),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            } else {
                a = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4y),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
                b = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4y),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            }
            out[r] = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
            break;
        }
        }
    }
    transpose16i(out);
}

/* One 16-row panel of rows [0, nrows) (nrows <= 16) of n elements into dst (panel_bytes). */
static void pack_panel(int wtype, const uint8_t *w, size_t stride, int nrows, int64_t n, uint8_t *dst)
{
    __m512i v[16];
    switch (wtype) {
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q8_0: {
        int q8 = wtype == GGML_TYPE_Q8_0, q5 = wtype == GGML_TYPE_Q5_0;
        int pb = q8 ? PB_Q8_0 : q5 ? PB_Q5_0 : PB_Q4_0, doff = q8 ? 512 : q5 ? 320 : 256;
        size_t bb = q8 ? sizeof(block_q8_0) : q5 ? sizeof(block_q5_0) : sizeof(block_q4_0);
        const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
        for (int64_t e0 = 0; e0 < n; e0 += 64) {
            rows64(wtype, w, stride, nrows, e0, n, v);
            for (int h = 0; h < 2 && e0 + 32 * h < n; h++) {
                uint8_t *pb_ = dst + (e0 / 32 + h) * pb;
                if (q8) {
                    for (int k = 0; k < 8; k++) _mm512_storeu_si512(pb_ + 64 * k, v[8 * h + k]);
                    continue;
                }
                for (int k = 0; k < 4; k++)
                    _mm512_storeu_si512(pb_ + 64 * k, _mm512_or_si512(_mm512_and_si512(v[8 * h + k], m4),
                                                                      _mm512_slli_epi16(_mm512_and_si512(v[8 * h + k + 4], m4), 4)));
                if (q5) {
                    __m512i hb = _mm512_setzero_si512();
                    for (int k = 0; k < 8; k++)
                        hb = _mm512_or_si512(hb, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(v[8 * h + k], 4), one), k));
                    _mm512_storeu_si512(pb_ + 256, hb);
                }
            }
        }
        for (int64_t b = 0; b < n / 32; b++) {
            uint16_t *d = (uint16_t *)(dst + b * pb + doff);
            for (int r = 0; r < 16; r++) {
                uint16_t dr = 0;
                if (r < nrows) memcpy(&dr, w + (size_t)r * stride + (size_t)b * bb, 2); /* d leads every block */
                d[r] = dr;
            }
        }
        break;
    }
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: {
        /* Q4_K and Q5_K share d, dmin and the scale block at the start of a super-block */
        const int q5 = wtype == GGML_TYPE_Q5_K, pb = q5 ? PB_Q5_K : PB_Q4_K, so = q5 ? 2560 : 2048;
        const size_t bb = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
        const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
        for (int64_t b = 0; b < n / 256; b++) {
            uint8_t *sb = dst + b * pb;
            for (int c = 0; c < 4; c++) {
                rows64(wtype, w, stride, nrows, 256 * b + 64 * c, n, v);
                for (int k = 0; k < 8; k++)
                    _mm512_storeu_si512(sb + 64 * (8 * c + k),
                                        _mm512_or_si512(_mm512_and_si512(v[k], m4), _mm512_slli_epi16(_mm512_and_si512(v[k + 8], m4), 4)));
                if (q5) { /* the 5th bits of step k of sub-block 2c (v[k]) / 2c+1 (v[8+k]) at bit k */
                    __m512i h0 = _mm512_setzero_si512(), h1 = h0;
                    for (int k = 0; k < 8; k++) {
                        h0 = _mm512_or_si512(h0, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(v[k], 4), one), k));
                        h1 = _mm512_or_si512(h1, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(v[k + 8], 4), one), k));
                    }
                    _mm512_storeu_si512(sb + 2048 + 128 * c, h0);
                    _mm512_storeu_si512(sb + 2048 + 128 * c + 64, h1);
                }
            }
            uint8_t *sc = sb + so, *mn = sb + so + 128;
            uint16_t *d = (uint16_t *)(sb + so + 256), *dmin = (uint16_t *)(sb + so + 288);
            for (int r = 0; r < 16; r++) {
                uint8_t sm[16] = {0};
                if (r < nrows) {
                    const uint8_t *blk = w + (size_t)r * stride + (size_t)b * bb;
                    _mm_storeu_si128((__m128i *)sm, k4_unpack_scales(blk + offsetof(block_q4_K, scales)));
                    memcpy(&d[r], blk + offsetof(block_q4_K, d), 2);
                    memcpy(&dmin[r], blk + offsetof(block_q4_K, dmin), 2);
                } else {
                    d[r] = dmin[r] = 0;
                }
                for (int j = 0; j < 8; j++) {
                    sc[16 * j + r] = sm[j];
                    mn[16 * j + r] = sm[8 + j];
                }
            }
        }
        break;
    }
    case GGML_TYPE_MXFP4: /* the GGUF bytes as they are: qs byte j holds codes j and 16 + j (as Q4_0) */
        memset(dst, 0, (size_t)(n / 32) * PB_MXFP4);
        for (int64_t b = 0; b < n / 32; b++) {
            uint8_t *p = dst + b * PB_MXFP4;
            for (int r = 0; r < nrows; r++) {
                const uint8_t *blk = w + (size_t)r * stride + (size_t)b * sizeof(block_mxfp4);
                for (int k = 0; k < 4; k++) memcpy(p + 64 * k + 4 * r, blk + 1 + 4 * k, 4);
                p[256 + r] = blk[0];
            }
        }
        break;
    case GGML_TYPE_Q6_K:
        for (int64_t b = 0; b < n / 256; b++) {
            uint8_t *sb = dst + b * PB_Q6_K;
            for (int c = 0; c < 4; c++) {
                rows64(wtype, w, stride, nrows, 256 * b + 64 * c, n, v);
                /* v[4i + k]: sub-block 4c+i, step k */
                const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(3);
                for (int k = 0; k < 4; k++) {
                    for (int pp = 0; pp < 2; pp++) /* pairs 2c, 2c+1 */
                        _mm512_storeu_si512(sb + 64 * (4 * (2 * c + pp) + k),
                                           _mm512_or_si512(_mm512_and_si512(v[4 * (2 * pp) + k], m4),
                                                           _mm512_slli_epi16(_mm512_and_si512(v[4 * (2 * pp + 1) + k], m4), 4)));
                    __m512i h = _mm512_setzero_si512();
                    for (int i = 0; i < 4; i++)
                        h = _mm512_or_si512(h, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(v[4 * i + k], 4), m3), 2 * i));
                    _mm512_storeu_si512(sb + 2048 + 64 * (4 * c + k), h);
                }
            }
            int8_t *sc = (int8_t *)(sb + 3072);
            uint16_t *d = (uint16_t *)(sb + 3328);
            for (int r = 0; r < 16; r++) {
                const block_q6_K *x = r < nrows ? (const block_q6_K *)(w + (size_t)r * stride) + b : NULL;
                for (int j = 0; j < 16; j++) sc[16 * j + r] = x ? x->scales[j] : 0;
                d[r] = x ? x->d : 0;
            }
        }
        break;
    default:
        break;
    }
}

#define BCAST32(p) _mm512_set1_epi32(*(const int32_t *)(p))

/* Decode (one token) is a memory stream with a few dozen instructions per cache line: the
 * hardware prefetcher alone leaves the core waiting, so the GEMV prefetches about 4 KiB (Q4_0,
 * Q8_0) or two super-blocks (K-quants) ahead. Measured on TinyLlama, 2 threads: +8% (Q4_0),
 * +20% (Q8_0), +60% (Q4_K_M) tokens per second. */
#define PF_Q8BLK 4096
#define PF_K(pb) (2 * (pb))


/* Q4_0 (kind 0) / Q5_0 (1) / Q8_0 (2) panel · T tokens, blocks [b0, b1). Token t's activation
 * row is act + t·as. Per row: acc = fma(d_w·d_x, Σ_block, acc), block after block. */
static inline __attribute__((always_inline)) void pgemm_q8blk(int kind, const uint8_t *panel, int64_t b0, int64_t b1,
                                                             const uint8_t *act, size_t as, int T, __m512 *acc)
{
    const int q8 = kind == 2, q5 = kind == 1;
    const int pb = q8 ? PB_Q8_0 : q5 ? PB_Q5_0 : PB_Q4_0, gb = q8 ? Q8G_BYTES : Q4G_BYTES;
    const int doff = q8 ? 512 : q5 ? 320 : 256;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *pq = panel + b * pb;
        int bq = (int)(b & 3);
        if (T <= 8) /* decode and a batched decode step stream the panel once */
            for (int l = 0; l < pb; l += 64) _mm_prefetch((const char *)pq + PF_Q8BLK + l, _MM_HINT_T0);
        const uint8_t *g[8];
        __m512i isum[8];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            g[t] = act + (size_t)t * as + (b >> 2) * gb;
            isum[t] = BCAST32(g[t] + (q8 ? 256 + 32 * bq : 192 + 16 * bq));
        }
        if (q8) {
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                __m512i W = _mm512_loadu_si512(pq + 64 * k);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) isum[t] = _mm512_dpbusd_epi32(isum[t], W, BCAST32(g[t] + 32 * bq + 4 * k));
            }
        } else {
            __m512i H = q5 ? _mm512_loadu_si512(pq + 256) : _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i V = _mm512_loadu_si512(pq + 64 * k);
                __m512i lo = _mm512_and_si512(V, m4), hi = _mm512_and_si512(_mm512_srli_epi16(V, 4), m4);
                if (q5) { /* 5th bits: bit k (low nibbles) and bit k+4 (high) of H, moved to bit 4 */
                    lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(H, 4 - k), m10));
                    hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(H, k), m10));
                }
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    isum[t] = _mm512_dpbusd_epi32(isum[t], lo, BCAST32(g[t] + 16 * bq + 4 * k));
                    isum[t] = _mm512_dpbusd_epi32(isum[t], hi, BCAST32(g[t] + 64 + 16 * bq + 4 * k));
                }
            }
        }
        __m512 S = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pq + doff)));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            float dx = ((const float *)(g[t] + 128))[bq];
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(S, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
}

/* MXFP4 panel · T tokens, blocks [b0, b1), on the Q4_0 activation layout with the correction
 * −MX_BIAS·Σq: the nibbles index the E2M1 codes + MX_BIAS (vpshufb, 0..24 unsigned) for vpdpbusd,
 * the correction takes the bias out (Σ code·q exact); per row acc = fma(2^(e−128)·d_x, Σ, acc)
 * block after block, the scalar reference's order. */
static inline __attribute__((always_inline)) void pgemm_mxfp4(const uint8_t *panel, int64_t b0, int64_t b1,
                                                             const uint8_t *act, size_t as, int T, __m512 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *pq = panel + b * PB_MXFP4;
        int bq = (int)(b & 3);
        if (T == 1)
            for (int l = 0; l < PB_MXFP4; l += 64) _mm_prefetch((const char *)pq + PF_Q8BLK + l, _MM_HINT_T0);
        const uint8_t *g[8];
        __m512i isum[8];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            g[t] = act + (size_t)t * as + (b >> 2) * Q4G_BYTES;
            isum[t] = BCAST32(g[t] + 192 + 16 * bq);
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512i V = _mm512_loadu_si512(pq + 64 * k);
            __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(V, m4));
            __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(V, 4), m4));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                isum[t] = _mm512_dpbusd_epi32(isum[t], lo, BCAST32(g[t] + 16 * bq + 4 * k));
                isum[t] = _mm512_dpbusd_epi32(isum[t], hi, BCAST32(g[t] + 64 + 16 * bq + 4 * k));
            }
        }
        /* quant_e8m0_half on 16 bytes: e < 2 the subnormals 0x00200000 << e, else (e − 1) << 23 */
        __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(pq + 256)));
        __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
        __m512i bits = _mm512_mask_sllv_epi32(_mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23), small,
                                              _mm512_set1_epi32(0x00200000), e);
        __m512 S = _mm512_castsi512_ps(bits);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            float dx = ((const float *)(g[t] + 128))[bq];
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(S, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
}

/* 5th bits of step k (0..7) of a Q5_K pair from its H vector (bit k of each byte), at bit 4:
 * shifted in 16-bit lanes, bit 4 of every byte comes from bit k of the same byte. */
static inline __attribute__((always_inline)) __m512i k5_bit4(__m512i H, int k)
{
    return k < 4 ? _mm512_slli_epi16(H, 4 - k) : k > 4 ? _mm512_srli_epi16(H, k - 4) : H;
}

/* Q4_K (q5 = 0) / Q5_K (q5 = 1) panel · T tokens, super-blocks [b0, b1). */
static inline __attribute__((always_inline)) void pgemm_k45(int q5, const uint8_t *panel, int64_t b0, int64_t b1,
                                                           const uint8_t *act, size_t as, int T, __m512 *acc)
{
    static const int pos[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    const int pb = q5 ? PB_Q5_K : PB_Q4_K, so = q5 ? 2560 : 2048;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *sb = panel + b * pb;
        const uint8_t *g[4];
        __m512i A[4], B[4];
        /* decode and a batched decode step stream the panel once; the loop unrolled (a single
         * token's Q4_K / Q5_K / Q6_K kernel, in cache, one thread: 7-12% faster than as a loop) */
        if (T <= 8)
#pragma GCC unroll 32
            for (int l = 0; l < pb; l += 64) _mm_prefetch((const char *)sb + PF_K(pb) + l, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            g[t] = act + (size_t)t * as + b * KG_BYTES;
            A[t] = B[t] = _mm512_setzero_si512();
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i s0[4], s1[4];
            __m512i H0 = _mm512_setzero_si512(), H1 = H0;
            if (q5) {
                H0 = _mm512_loadu_si512(sb + 2048 + 128 * c);
                H1 = _mm512_loadu_si512(sb + 2048 + 128 * c + 64);
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) s0[t] = s1[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                __m512i P = _mm512_loadu_si512(sb + 64 * (8 * c + k));
                __m512i lo = _mm512_and_si512(P, m4), hi = _mm512_and_si512(_mm512_srli_epi16(P, 4), m4);
                if (q5) { /* lo | (bit4 & 0x10), hi likewise (vpternlogd 0xF8: A | (B & C)) */
                    lo = _mm512_ternarylogic_epi32(lo, k5_bit4(H0, k), m10, 0xF8);
                    hi = _mm512_ternarylogic_epi32(hi, k5_bit4(H1, k), m10, 0xF8);
                }
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    s0[t] = _mm512_dpbusd_epi32(s0[t], lo, BCAST32(g[t] + 32 * pos[2 * c] + 4 * k));
                    s1[t] = _mm512_dpbusd_epi32(s1[t], hi, BCAST32(g[t] + 32 * pos[2 * c + 1] + 4 * k));
                }
            }
            __m512i sc0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sb + so + 16 * (2 * c))));
            __m512i sc1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sb + so + 16 * (2 * c + 1))));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                A[t] = _mm512_add_epi32(A[t], _mm512_add_epi32(_mm512_mullo_epi32(s0[t], sc0), _mm512_mullo_epi32(s1[t], sc1)));
        }
        /* Σ_j m_j·Σq_x(sub-block j): vpdpwssd of (m_2i, m_2i+1) pairs per row with the activation's
         * (Σq_x 2i, Σq_x 2i+1) int16 pairs */
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512i M = _mm512_or_si512(
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sb + so + 128 + 32 * i))),
                _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sb + so + 128 + 32 * i + 16))), 16));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) B[t] = _mm512_dpwssd_epi32(B[t], M, BCAST32(g[t] + 260 + 4 * i));
        }
        __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + so + 256)));
        __m512 Dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + so + 288)));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 dx = _mm512_set1_ps(*(const float *)(g[t] + 256));
            if (q5) { /* the scalar reference's order, every product and sum rounded on its own */
                __m512 v = _mm512_sub_ps(_mm512_mul_ps(D, _mm512_cvtepi32_ps(A[t])), _mm512_mul_ps(Dm, _mm512_cvtepi32_ps(B[t])));
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(dx, v));
            } else {
                __m512 v = _mm512_fmsub_ps(D, _mm512_cvtepi32_ps(A[t]), _mm512_mul_ps(Dm, _mm512_cvtepi32_ps(B[t])));
                acc[t] = _mm512_fmadd_ps(dx, v, acc[t]);
            }
        }
    }
}

/* Q6_K panel · T tokens, super-blocks [b0, b1). */
static inline __attribute__((always_inline)) void pgemm_q6_K(const uint8_t *panel, int64_t b0, int64_t b1,
                                                            const uint8_t *act, size_t as, int T, __m512 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *sb = panel + b * PB_Q6_K;
        const uint8_t *g[4];
        __m512i A[4];
        if (T <= 8) /* decode and a batched decode step stream the panel once */
#pragma GCC unroll 32
            for (int l = 0; l < PB_Q6_K; l += 64) _mm_prefetch((const char *)sb + PF_K(PB_Q6_K) + l, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            g[t] = act + (size_t)t * as + b * KG_BYTES;
            A[t] = _mm512_setzero_si512();
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            __m512i s[4][4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) s[i][t] = BCAST32(g[t] + 320 + 4 * (4 * q + i));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i L0 = _mm512_loadu_si512(sb + 64 * (4 * (2 * q) + k));
                __m512i L1 = _mm512_loadu_si512(sb + 64 * (4 * (2 * q + 1) + k));
                __m512i H = _mm512_loadu_si512(sb + 2048 + 64 * (4 * q + k));
                __m512i u[4];
                u[0] = _mm512_or_si512(_mm512_and_si512(L0, m4), _mm512_and_si512(_mm512_slli_epi16(H, 4), m30));
                u[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L0, 4), m4),
                                       _mm512_and_si512(_mm512_slli_epi16(H, 2), m30));
                u[2] = _mm512_or_si512(_mm512_and_si512(L1, m4), _mm512_and_si512(H, m30));
                u[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L1, 4), m4),
                                       _mm512_and_si512(_mm512_srli_epi16(H, 2), m30));
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++)
                        s[i][t] = _mm512_dpbusd_epi32(s[i][t], u[i], BCAST32(g[t] + 16 * (4 * q + i) + 4 * k));
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sb + 3072 + 16 * (4 * q + i))));
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) A[t] = _mm512_add_epi32(A[t], _mm512_mullo_epi32(s[i][t], sc));
            }
        }
        __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + 3328)));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float dx = *(const float *)(g[t] + 256);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(D, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(A[t]), acc[t]);
        }
    }
}

/* T tokens through elements [e0, e1) of one panel; adds to (accumulate) or sets the outputs. */
static inline __attribute__((always_inline)) void ptile(int wtype, const uint8_t *panel, int64_t e0, int64_t e1,
                                                       const uint8_t *act, size_t as, int T, float *out, size_t os,
                                                       __mmask16 rows, int accumulate)
{
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        acc[t] = accumulate ? _mm512_maskz_loadu_ps(rows, out + (size_t)t * os) : _mm512_setzero_ps();
    switch (wtype) {
    case GGML_TYPE_Q4_0: pgemm_q8blk(0, panel, e0 / 32, e1 / 32, act, as, T, acc); break;
    case GGML_TYPE_Q5_0: pgemm_q8blk(1, panel, e0 / 32, e1 / 32, act, as, T, acc); break;
    case GGML_TYPE_Q8_0: pgemm_q8blk(2, panel, e0 / 32, e1 / 32, act, as, T, acc); break;
    case GGML_TYPE_Q4_K: pgemm_k45(0, panel, e0 / 256, e1 / 256, act, as, T, acc); break;
    case GGML_TYPE_Q5_K: pgemm_k45(1, panel, e0 / 256, e1 / 256, act, as, T, acc); break;
    case GGML_TYPE_Q6_K: pgemm_q6_K(panel, e0 / 256, e1 / 256, act, as, T, acc); break;
    case GGML_TYPE_MXFP4: pgemm_mxfp4(panel, e0 / 32, e1 / 32, act, as, T, acc); break;
    default: break;
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(out + (size_t)t * os, rows, acc[t]);
}

/* Elements per k-chunk of a batch: that slice of the panel stays in L1 while the tokens pass. */
#define KC 1024

#define PT(W, T) ptile(W, panel, e0, e1, act + (size_t)t * as, as, T, out + (size_t)t * os, os, rows, e0 > 0)
#define PGEMM(name, wt, TMAX)                                                                              \
    static void name(const uint8_t *panel, int64_t n, const uint8_t *act, size_t as, int n_tokens, float *out, \
                     size_t os, __mmask16 rows)                                                           \
    {                                                                                                      \
        int64_t kc = n_tokens == 1 ? n : KC;                                                               \
        for (int64_t e0 = 0; e0 < n; e0 += kc) {                                                           \
            int64_t e1 = n - e0 < kc ? n : e0 + kc;                                                        \
            int t = 0;                                                                                     \
            for (; t + (TMAX) <= n_tokens; t += (TMAX)) PT(wt, TMAX);                                          \
            switch (n_tokens - t) {                                                                        \
            case 1: PT(wt, 1); break;                                                                          \
            case 2: if ((TMAX) > 2) PT(wt, 2 < (TMAX) ? 2 : 1); break;                                         \
            case 3: if ((TMAX) > 3) PT(wt, 3 < (TMAX) ? 3 : 1); break;                                         \
            case 4: if ((TMAX) > 4) PT(wt, 4 < (TMAX) ? 4 : 1); break;                                         \
            case 5: if ((TMAX) > 5) PT(wt, 5 < (TMAX) ? 5 : 1); break;                                         \
            case 6: if ((TMAX) > 6) PT(wt, 6 < (TMAX) ? 6 : 1); break;                                         \
            case 7: if ((TMAX) > 7) PT(wt, 7 < (TMAX) ? 7 : 1); break;                                         \
            default: break;                                                                                \
            }                                                                                              \
        }                                                                                                  \
    }
PGEMM(pgemm_run_q4_0, GGML_TYPE_Q4_0, 8)
PGEMM(pgemm_run_q5_0, GGML_TYPE_Q5_0, 8)
PGEMM(pgemm_run_q8_0, GGML_TYPE_Q8_0, 8)
PGEMM(pgemm_run_q4_K, GGML_TYPE_Q4_K, 4)
PGEMM(pgemm_run_q5_K, GGML_TYPE_Q5_K, 4)
PGEMM(pgemm_run_q6_K, GGML_TYPE_Q6_K, 4)
PGEMM(pgemm_run_mxfp4, GGML_TYPE_MXFP4, 8)

#endif /* QG_AVX512 */

/* ---- public entry points ----------------------------------------------------------------- */

static void g_act_prepare(int wtype, const float *x, int64_t n, void *act)
{
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || n < 0 || n % qt->block_size) return;
    switch (act_kind(wtype)) {
#if defined(QG_AVX512)
    case ACT_F32: memcpy(act, x, (size_t)n * 4); return;
    case ACT_F16R: prep_f16r(x, n, act); return;
    case ACT_Q4_0: prep_q4_0(x, n, act, 8); return;
    case ACT_Q5_0: prep_q4_0(x, n, act, 16); return;
    case ACT_MXFP4: prep_q4_0(x, n, act, MX_BIAS); return;
    case ACT_Q8_0: prep_q8_0(x, n, act); return;
    case ACT_K4: prep_k(x, n, act, 0); return;
    case ACT_K6: prep_k(x, n, act, 1); return;
#endif
    default:
        if (qt->vec_dot_type == GGML_TYPE_F32) memcpy(act, x, (size_t)n * 4);
        else base.quantize_row(qt->vec_dot_type, x, act, n);
        return;
    }
}


static void g_gemv(int wtype, int64_t n, int64_t nrows, const void *w, size_t stride, const void *act, float *out)
{
    int kind = act_kind(wtype);
    if (kind == ACT_STD) {
        base.vec_dot_rows(wtype, n, nrows, w, stride, act, out);
        return;
    }
#if defined(QG_AVX512)
    const uint8_t *wb = w;
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || n < 0 || n % qt->block_size) {
        for (int64_t r = 0; r < nrows; r++) out[r] = NAN;
        return;
    }
    size_t pb = panel_bytes(wtype, n);
    if (pb) {
        /* GGUF rows of a type with panels (a model packs them at load; this path serves direct
         * calls): pack 16 rows at a time into a scratch panel and run the panel kernel, so the
         * results are those of the packed weights bit for bit */
        uint8_t *panel = aligned_alloc(64, (pb + 63) & ~(size_t)63);
        if (!panel) {
            for (int64_t r = 0; r < nrows; r++) out[r] = NAN;
            return;
        }
        for (int64_t r = 0; r < nrows; r += QUANT_PANEL_ROWS) {
            int nr = nrows - r < QUANT_PANEL_ROWS ? (int)(nrows - r) : QUANT_PANEL_ROWS;
            pack_panel(wtype, wb + (size_t)r * stride, stride, nr, n, panel);
            g_gemm_packed(wtype, n, 0, nr, panel, act, 0, 1, out + r, 0);
        }
        free(panel);
        return;
    }
    if (kind == ACT_F32 || kind == ACT_F16R) {
#if defined(GEMM_FLOAT_ASAN)
        size_t row = (size_t)n * (kind == ACT_F16R ? 2 : 4);
        gemm_float_asan_check(wb, stride, nrows, row, act, 0, 1, row, out, 0);
#endif
        kern_avx512_gemv_float(kind == ACT_F16R, wb, stride, nrows, act, n, out);
    }
#endif
}


static size_t g_pack_size(int wtype, int64_t n, int64_t nrows)
{
#if defined(QG_AVX512)
    const quant_traits *qt = quant_traits_of(wtype);
    if (!qt || n <= 0 || nrows <= 0 || n % qt->block_size) return 0;
    return panel_bytes(wtype, n) * (size_t)((nrows + QUANT_PANEL_ROWS - 1) / QUANT_PANEL_ROWS);
#else
    (void)wtype;
    (void)n;
    (void)nrows;
    return 0;
#endif
}

static void g_pack(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, void *dst)
{
#if defined(QG_AVX512)
    size_t pb = panel_bytes(wtype, n);
    if (!g_pack_size(wtype, n, nrows)) return;
    for (int64_t r0 = 0; r0 < nrows; r0 += QUANT_PANEL_ROWS) {
        int nr = nrows - r0 < QUANT_PANEL_ROWS ? (int)(nrows - r0) : QUANT_PANEL_ROWS;
        pack_panel(wtype, (const uint8_t *)w + (size_t)r0 * w_stride, w_stride, nr, n,
                   (uint8_t *)dst + (size_t)(r0 / QUANT_PANEL_ROWS) * pb);
    }
#else
    (void)wtype;
    (void)n;
    (void)nrows;
    (void)w;
    (void)w_stride;
    (void)dst;
#endif
}

static void g_gemm_packed(int wtype, int64_t n, int64_t row0, int64_t nrows, const void *packed, const void *act,
                       size_t act_stride, int n_tokens, float *out, size_t out_stride)
{
#if defined(QG_AVX512)
    size_t pb = panel_bytes(wtype, n);
    for (int64_t r = row0; r < row0 + nrows; r += QUANT_PANEL_ROWS) {
        int nr = row0 + nrows - r < QUANT_PANEL_ROWS ? (int)(row0 + nrows - r) : QUANT_PANEL_ROWS;
        const uint8_t *panel = (const uint8_t *)packed + (size_t)(r / QUANT_PANEL_ROWS) * pb;
        __mmask16 rows = (__mmask16)((1u << nr) - 1u);
        float *o = out + (r - row0);
        switch (wtype) {
        case GGML_TYPE_Q4_0: pgemm_run_q4_0(panel, n, act, act_stride, n_tokens, o, out_stride, rows); break;
        case GGML_TYPE_Q5_0: pgemm_run_q5_0(panel, n, act, act_stride, n_tokens, o, out_stride, rows); break;
        case GGML_TYPE_Q8_0: pgemm_run_q8_0(panel, n, act, act_stride, n_tokens, o, out_stride, rows); break;
        case GGML_TYPE_Q4_K: pgemm_run_q4_K(panel, n, act, act_stride, n_tokens, o, out_stride, rows); break;
        case GGML_TYPE_Q5_K: pgemm_run_q5_K(panel, n, act, act_stride, n_tokens, o, out_stride, rows); break;
        case GGML_TYPE_Q6_K: pgemm_run_q6_K(panel, n, act, act_stride, n_tokens, o, out_stride, rows); break;
        case GGML_TYPE_MXFP4: pgemm_run_mxfp4(panel, n, act, act_stride, n_tokens, o, out_stride, rows); break;
        default: break;
        }
    }
#else
    (void)wtype;
    (void)n;
    (void)row0;
    (void)nrows;
    (void)packed;
    (void)act;
    (void)act_stride;
    (void)n_tokens;
    (void)out;
    (void)out_stride;
#endif
}


static void g_gemm(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act,
                size_t act_stride, int n_tokens, float *out, size_t out_stride)
{
    const uint8_t *ab = act;
#if defined(QG_AVX512)
    const quant_traits *qt = quant_traits_of(wtype);
    size_t pb = n_tokens > 1 && act_kind(wtype) != ACT_STD && qt && n >= 0 && n % qt->block_size == 0
                    ? panel_bytes(wtype, n) : 0;
    uint8_t *panel = pb ? aligned_alloc(64, (pb + 63) & ~(size_t)63) : NULL;
    if (panel) {
        /* GGUF rows of a type with panels, a batch (a prefill before op_weights_pack's later job
         * has packed the matrix): each 16 rows packed once for all tokens, as g_gemv does for one,
         * so the results are again those of the packed weights bit for bit */
        for (int64_t r = 0; r < nrows; r += QUANT_PANEL_ROWS) {
            int nr = nrows - r < QUANT_PANEL_ROWS ? (int)(nrows - r) : QUANT_PANEL_ROWS;
            pack_panel(wtype, (const uint8_t *)w + (size_t)r * w_stride, w_stride, nr, n, panel);
            g_gemm_packed(wtype, n, 0, nr, panel, act, act_stride, n_tokens, out + r, out_stride);
        }
        free(panel);
        return;
    }
    if ((wtype == GGML_TYPE_F32 || wtype == GGML_TYPE_F16) && n_tokens > 1) {
#if defined(GEMM_FLOAT_ASAN)
        size_t row = (size_t)n * (wtype == GGML_TYPE_F16 ? 2 : 4);
        gemm_float_asan_check(w, w_stride, nrows, row, ab, act_stride, n_tokens, row, out, out_stride);
#endif
        kern_avx512_gemm_float(wtype == GGML_TYPE_F16, w, w_stride, nrows, ab, act_stride, n_tokens, n, out, out_stride);
        return;
    }
#endif
    for (int t = 0; t < n_tokens; t++)
        g_gemv(wtype, n, nrows, w, w_stride, ab + (size_t)t * act_stride, out + (size_t)t * out_stride);
}

/* ---- F32 / F16 / BF16 dot products ------------------------------------------------------- */

#if defined(QG_AVX512)

static int has_bf16; /* AVX512-BF16 (vdpbf16ps): Zen 4, Sapphire Rapids; not Ice Lake */

static float vd_f32(const float *w, const float *x, int64_t n)
{
    int64_t i = 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static float vd_f16(const uint16_t *w, const uint16_t *x, int64_t n)
{
    int64_t i = 0;
#define LH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(LH(w + i), LH(x + i), a0);
        a1 = _mm512_fmadd_ps(LH(w + i + 16), LH(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(LH(w + i + 32), LH(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(LH(w + i + 48), LH(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(LH(w + i), LH(x + i), a0);
#undef LH
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i));
        __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
        a1 = _mm512_fmadd_ps(wv, xv, a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

__attribute__((target("avx512bf16"))) static float vd_bf16(const uint16_t *w, const uint16_t *x, int64_t n)
{
    int64_t i = 0;
    float s = 0.0f;
    /* vdpbf16ps: pairs of exact bf16 products added into fp32 lanes */
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + i), (__m512bh)_mm512_loadu_si512(x + i));
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + i + 32),
                              (__m512bh)_mm512_loadu_si512(x + i + 32));
    }
    for (; i + 32 <= n; i += 32)
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + i), (__m512bh)_mm512_loadu_si512(x + i));
    s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < n; i++) s += bf16_to_fp32(w[i]) * bf16_to_fp32(x[i]);
    return s;
}

/* MXFP4 · Q8_0, two blocks per 512-bit step: 128-bit lanes [lo nibbles, hi nibbles] of block i then
 * of block i + 1, each code looked up (vpshufb) in the doubled E2M1 table; |code| · (x with the
 * code's sign) by vpdpbusd, exact; lanes 0-7 sum block i, 8-15 block i + 1; the block scales are
 * applied one block after the other as the reference does. */
static float vd_mxfp4(const block_mxfp4 *w, const block_q8_0 *x, int64_t nb)
{
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)quant_mxfp4_values));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    float s = 0.0f;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m128i q0 = _mm_loadu_si128((const __m128i *)w[i].qs), q1 = _mm_loadu_si128((const __m128i *)w[i + 1].qs);
        __m512i idx = _mm512_castsi128_si512(_mm_and_si128(q0, m4));
        idx = _mm512_inserti32x4(idx, _mm_and_si128(_mm_srli_epi16(q0, 4), m4), 1);
        idx = _mm512_inserti32x4(idx, _mm_and_si128(q1, m4), 2);
        idx = _mm512_inserti32x4(idx, _mm_and_si128(_mm_srli_epi16(q1, 4), m4), 3);
        __m512i wv = _mm512_shuffle_epi8(lut, idx);
        __m512i xv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x[i].qs)),
                                        _mm256_loadu_si256((const __m256i *)x[i + 1].qs), 1);
        xv = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(wv), _mm512_setzero_si512(), xv);
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(wv), xv);
        s = fmaf(quant_e8m0_half(w[i].e) * fp16_to_fp32(x[i].d), (float)_mm512_mask_reduce_add_epi32(0x00ff, p), s);
        s = fmaf(quant_e8m0_half(w[i + 1].e) * fp16_to_fp32(x[i + 1].d), (float)_mm512_mask_reduce_add_epi32(0xff00, p),
                 s);
    }
    if (i < nb) { /* an odd last block: the same on 256 bits */
        __m128i q0 = _mm_loadu_si128((const __m128i *)w[i].qs);
        __m256i idx = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(q0, m4)),
                                              _mm_and_si128(_mm_srli_epi16(q0, 4), m4), 1);
        __m256i wv = _mm256_shuffle_epi8(_mm512_castsi512_si256(lut), idx);
        __m256i xv = _mm256_loadu_si256((const __m256i *)x[i].qs);
        xv = _mm256_mask_sub_epi8(xv, _mm256_movepi8_mask(wv), _mm256_setzero_si256(), xv);
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv), xv);
        __m512i p512 = _mm512_castsi256_si512(p);
        s = fmaf(quant_e8m0_half(w[i].e) * fp16_to_fp32(x[i].d), (float)_mm512_mask_reduce_add_epi32(0x00ff, p512), s);
    }
    return s;
}

static float x_vec_dot(int type, int64_t n, const void *w, const void *x)
{
    if (n >= 0) switch (type) {
        case GGML_TYPE_MXFP4: if ((n & 31) == 0) return vd_mxfp4(w, x, n >> 5); break;
        case GGML_TYPE_F32: return vd_f32(w, x, n);
        case GGML_TYPE_F16: return vd_f16(w, x, n);
        case GGML_TYPE_BF16: if (has_bf16) return vd_bf16(w, x, n); break;
        default: break;
        }
    return base.vec_dot(type, n, w, x);
}

static void x_vec_dot_rows(int type, int64_t n, int64_t nrows, const void *w, size_t row_stride, const void *x_act,
                           float *out)
{
    if (type != GGML_TYPE_F32 && type != GGML_TYPE_F16 && type != GGML_TYPE_MXFP4 && (type != GGML_TYPE_BF16 || !has_bf16)) {
        base.vec_dot_rows(type, n, nrows, w, row_stride, x_act, out);
        return;
    }
    for (int64_t r = 0; r < nrows; r++) out[r] = x_vec_dot(type, n, (const uint8_t *)w + (size_t)r * row_stride, x_act);
}

/* ---- attention ------------------------------------------------------------------------------ */

/* exp of 8 doubles: n = round(x·log2 e), r = x − n·ln2 (|r| <= 0.35), Taylor to r^12
 * (relative error < 1e-14), scaled by 2^n. */
static inline __m512d exp8d(__m512d x)
{
    __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), x);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
    static const double c[] = {1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320,
                               1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0};
    __m512d p = _mm512_set1_pd(c[0]);
    for (int i = 1; i < 13; i++) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c[i]));
    return _mm512_scalef_pd(p, n);
}

/* expf of 16 lanes, computed in double and rounded once: equal to a correctly rounded expf
 * (as glibc's) except in vanishingly rare near-ties, so softmax matches the scalar libm path
 * and the reference bit for bit in practice. Inputs are <= 0 here (x − max). */
static inline __m512 exp16(__m512 x, __m512d *sum)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512d lo = exp8d(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    __m512d hi = exp8d(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
    __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
    /* the sum in double of the rounded floats, as the scalar softmax does */
    *sum = _mm512_add_pd(*sum, _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(e)),
                                             _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)))));
    return e;
}

static inline __mmask16 mask16(int n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}


/* 16 values (mask m) from element off of the K or V row of position p, widened to f32. */
static inline __m512 kv_load16(const kern_attn *a, const uint8_t *const *blk, int p, int off, __mmask16 m)
{
    const uint8_t *row = blk[p >> __builtin_ctz((unsigned)a->bs)] + (size_t)(p & (a->bs - 1)) * a->row_bytes;
    if (a->kv_type == GGML_TYPE_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + off));
    return _mm512_maskz_loadu_ps(m, (const float *)row + off);
}

/* kern_ops.attn_tile: rows i = (t - t0)·G + h of kv head g. */
static void g_attn_tile(const kern_attn *j, int g, int t0, int t1, float *S, int ldS, float *KT)
{
    const int hd = j->hd, G = j->n_head / j->n_head_kv, E = j->n_head * hd;
    const int nrows = (t1 - t0) * G;
#define QROW(i) (j->q + (size_t)(t0 + (i) / G) * E + (size_t)(g * G + (i) % G) * hd)
#define OROW(i) (j->out + (size_t)(t0 + (i) / G) * E + (size_t)(g * G + (i) % G) * hd)
#define LEN(i) (j->pos0 + t0 + (i) / G + 1)
    const int n_kv = j->pos0 + t1;
    /* S = scale · Q Kᵀ, 16 positions at a time: the K rows are transposed so each dimension of
     * the 16 positions is one vector, and every query row takes hd multiply-adds with a broadcast
     * q[d]. Products and sums are rounded separately and summed in the scalar loop's order
     * (dimension by dimension, position by position for P·V), and exp is correctly rounded:
     * the results equal the plain C loops (tests/test_ops.c) but where glibc's expf is an ulp
     * off, which keeps quantized models on the reference's activation roundings. */
    const int nch = (hd + 15) / 16;
    for (int p0 = 0; p0 < n_kv; p0 += 16) {
        int np = n_kv - p0 < 16 ? n_kv - p0 : 16;
        for (int c = 0; c < nch; c++) {
            __m512 v[16];
            __mmask16 m = mask16(hd - 16 * c);
            for (int r = 0; r < 16; r++)
                v[r] = r < np ? kv_load16(j, j->kb, p0 + r, g * hd + 16 * c, m) : _mm512_setzero_ps();
            simd_transpose16x16(v);
            int nd = hd - 16 * c < 16 ? hd - 16 * c : 16;
            for (int d = 0; d < nd; d++) _mm512_store_ps(KT + (size_t)(16 * c + d) * 16, v[d]);
        }
        const __m512 sc = _mm512_set1_ps(j->scale);
        int i = 0;
        for (; i + 4 <= nrows; i += 4) {
            const float *q0 = QROW(i), *q1 = QROW(i + 1), *q2 = QROW(i + 2), *q3 = QROW(i + 3);
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < hd; d++) {
                __m512 kt = _mm512_load_ps(KT + (size_t)d * 16);
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_set1_ps(q0[d]), kt));
                a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_set1_ps(q1[d]), kt));
                a2 = _mm512_add_ps(a2, _mm512_mul_ps(_mm512_set1_ps(q2[d]), kt));
                a3 = _mm512_add_ps(a3, _mm512_mul_ps(_mm512_set1_ps(q3[d]), kt));
            }
            _mm512_storeu_ps(S + (size_t)i * ldS + p0, _mm512_mul_ps(a0, sc));
            _mm512_storeu_ps(S + (size_t)(i + 1) * ldS + p0, _mm512_mul_ps(a1, sc));
            _mm512_storeu_ps(S + (size_t)(i + 2) * ldS + p0, _mm512_mul_ps(a2, sc));
            _mm512_storeu_ps(S + (size_t)(i + 3) * ldS + p0, _mm512_mul_ps(a3, sc));
        }
        for (; i < nrows; i++) {
            const float *q0 = QROW(i);
            __m512 a0 = _mm512_setzero_ps();
            for (int d = 0; d < hd; d++)
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_set1_ps(q0[d]), _mm512_load_ps(KT + (size_t)d * 16)));
            _mm512_storeu_ps(S + (size_t)i * ldS + p0, _mm512_mul_ps(a0, sc));
        }
    }
    /* softmax of each row over its causal length; the rest of the row is zeroed so the
     * value pass can run every row of a block to the same length */
    for (int i = 0; i < nrows; i++) {
        float *s = S + (size_t)i * ldS;
        int len = LEN(i);
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int p = 0; p < len; p += 16) mx = _mm512_mask_max_ps(mx, mask16(len - p), mx, _mm512_loadu_ps(s + p));
        __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512d sum = _mm512_setzero_pd();
        for (int p = 0; p < len; p += 16) {
            __mmask16 m = mask16(len - p);
            /* lanes past len hold -104 - max at worst: exp underflows to 0 there, masked anyway */
            __m512 xs = _mm512_maskz_sub_ps(m, _mm512_loadu_ps(s + p), vmax);
            __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_mask_mov_ps(_mm512_set1_ps(-104.0f), m, xs), &sum));
            _mm512_storeu_ps(s + p, e);
        }
        __m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(sum)));
        for (int p = 0; p < len; p += 16) _mm512_storeu_ps(s + p, _mm512_mul_ps(_mm512_loadu_ps(s + p), inv));
        for (int p = (len + 15) & ~15; p < n_kv; p += 16) _mm512_storeu_ps(s + p, _mm512_setzero_ps());
    }
    /* O = P V: blocks of up to 4 rows keep 4 vectors (64 dims) of outputs each in registers while
     * the V rows pass. Whole blocks (4 rows × 64 dims) take the unrolled form: with the row and
     * vector counts not known to GCC it kept acc[][] and vv[] on the stack, a load and a store
     * per product. Each output's sum is the same sequence of products in either form. */
    const __mmask16 mlast = mask16(hd - 16 * (nch - 1));
    for (int i = 0; i < nrows; i += 4) {
        int nr = nrows - i < 4 ? nrows - i : 4, len = LEN(i + nr - 1);
        for (int c0 = 0; c0 < nch; c0 += 4) {
            int nc = nch - c0 < 4 ? nch - c0 : 4;
            if (nr == 4 && nc == 4 && hd % 16 == 0) {
                const float *s0 = S + (size_t)i * ldS, *s1 = s0 + ldS, *s2 = s1 + ldS, *s3 = s2 + ldS;
                const int off = g * hd + 16 * c0;
                __m512 o00 = _mm512_setzero_ps(), o01 = o00, o02 = o00, o03 = o00, o10 = o00, o11 = o00, o12 = o00,
                       o13 = o00, o20 = o00, o21 = o00, o22 = o00, o23 = o00, o30 = o00, o31 = o00, o32 = o00, o33 = o00;
                const int f16 = j->kv_type == GGML_TYPE_F16, sh = __builtin_ctz((unsigned)j->bs);
                for (int p = 0; p < len; p++) {
                    const uint8_t *row = j->vb[p >> sh] + (size_t)(p & (j->bs - 1)) * j->row_bytes;
                    __m512 v0, v1, v2, v3;
                    if (f16) {
                        const uint16_t *h = (const uint16_t *)row + off;
                        v0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
                        v1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 16)));
                        v2 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 32)));
                        v3 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 48)));
                    } else {
                        const float *f = (const float *)row + off;
                        v0 = _mm512_loadu_ps(f), v1 = _mm512_loadu_ps(f + 16), v2 = _mm512_loadu_ps(f + 32), v3 = _mm512_loadu_ps(f + 48);
                    }
/* one output row: its 4 accumulators += its weight at p · the 4 V vectors */
#define PV_ROW(sr, a0, a1, a2, a3)                                                                   \
    do {                                                                                         \
        const __m512 w = _mm512_set1_ps((sr)[p]);                                                \
        a0 = _mm512_add_ps(a0, _mm512_mul_ps(w, v0)), a1 = _mm512_add_ps(a1, _mm512_mul_ps(w, v1)); \
        a2 = _mm512_add_ps(a2, _mm512_mul_ps(w, v2)), a3 = _mm512_add_ps(a3, _mm512_mul_ps(w, v3)); \
    } while (0)
                    PV_ROW(s0, o00, o01, o02, o03);
                    PV_ROW(s1, o10, o11, o12, o13);
                    PV_ROW(s2, o20, o21, o22, o23);
                    PV_ROW(s3, o30, o31, o32, o33);
#undef PV_ROW
                }
                float *r0 = OROW(i) + 16 * c0, *r1 = OROW(i + 1) + 16 * c0, *r2 = OROW(i + 2) + 16 * c0,
                      *r3 = OROW(i + 3) + 16 * c0;
                _mm512_storeu_ps(r0, o00), _mm512_storeu_ps(r0 + 16, o01), _mm512_storeu_ps(r0 + 32, o02), _mm512_storeu_ps(r0 + 48, o03);
                _mm512_storeu_ps(r1, o10), _mm512_storeu_ps(r1 + 16, o11), _mm512_storeu_ps(r1 + 32, o12), _mm512_storeu_ps(r1 + 48, o13);
                _mm512_storeu_ps(r2, o20), _mm512_storeu_ps(r2 + 16, o21), _mm512_storeu_ps(r2 + 32, o22), _mm512_storeu_ps(r2 + 48, o23);
                _mm512_storeu_ps(r3, o30), _mm512_storeu_ps(r3 + 16, o31), _mm512_storeu_ps(r3 + 32, o32), _mm512_storeu_ps(r3 + 48, o33);
                continue;
            }
            __m512 acc[4][4];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
            for (int p = 0; p < len; p++) {
                __m512 vv[4];
                for (int c = 0; c < nc; c++)
                    vv[c] = kv_load16(j, j->vb, p, g * hd + 16 * (c0 + c), c0 + c == nch - 1 ? mlast : (__mmask16)0xffff);
                for (int r = 0; r < nr; r++) {
                    __m512 a = _mm512_set1_ps(S[(size_t)(i + r) * ldS + p]);
                    for (int c = 0; c < nc; c++) acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_mul_ps(a, vv[c]));
                }
            }
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < nc; c++)
                    _mm512_mask_storeu_ps(OROW(i + r) + 16 * (c0 + c), c0 + c == nch - 1 ? mlast : (__mmask16)0xffff,
                                          acc[r][c]);
        }
    }
#undef QROW
#undef OROW
#undef LEN
}


#endif /* QG_AVX512 */
#endif /* QG_AVX512: the whole file */

void kern_fill_x86_avx512(kern_ops *o)
{
#if defined(QG_AVX512)
    base = *o;
    has_bf16 = __builtin_cpu_supports("avx512bf16");
    o->vec_dot = x_vec_dot;
    o->vec_dot_rows = x_vec_dot_rows;
    o->act_row_size = g_act_row_size;
    o->act_prepare = g_act_prepare;
    o->gemv = g_gemv;
    o->gemm = g_gemm;
    o->pack_size = g_pack_size;
    o->pack = g_pack;
    o->gemm_packed = g_gemm_packed;
    o->attn_tile = g_attn_tile;
#else
    (void)o;
#endif
}
