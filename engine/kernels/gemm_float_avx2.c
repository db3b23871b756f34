/* gemm_float_avx2: the AVX2 and AVX-VNNI levels' GEMV / GEMM on F32 / F16 / BF16 weight rows, a file of its own for its build flags. */
/*
 * gemm_avx2.c's gemm entry (gemv is gemm with one token) calls it for F32 / F16 / BF16 weights,
 * at both levels it is built for (the float kernels use no VNNI instruction: one object serves
 * both). It is apart from gemm_avx2.c only so that the Makefile can build it with other flags:
 * AVX2 + FMA + F16C everywhere (KFLAGS_gemm_float_avx2), and in the unit tests' sanitized build
 * -O2 without the sanitizers (ASAN_PLAIN there says why; gemm_avx2.c checks under ASan the bytes
 * it is about to read and write).
 */
#include "engine/kernels/gemm_float.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/quant.h"

#define AI static inline __attribute__((always_inline))

/* The sum of the 8 lanes (pairwise). */
static float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- F32 / F16 / BF16 rows: decode by inner products, batches by a blocked GEMM -----------------
 * Decode (1 token) streams each row once: 4 accumulators of 8 partial sums, reduced at the end.
 * A batch of more than ST tokens (2..ST: inner-product tiles, below) is a GEMM in the
 * register-blocked form of BLIS (Van Zee & van de Geijn 2015; Goto & van de Geijn 2008): for each
 * k-block of GK elements and each block of GR = 16 rows, the rows are
 * converted (F16 / BF16 → F32) and transposed once into a panel wp[k][16] (16 KiB, in L1), then every
 * tile of up to GT = 6 tokens runs over it: 2 ymm of 8 rows × 6 tokens = 12 accumulators, each
 * step 2 panel loads, 6 broadcast activations and 12 FMAs. The activations of a k-block (all
 * tokens) stay in L2 while the row blocks pass; rows are taken GS = 128 at a time so that their
 * outputs stay in L2 too. Float order, per output: a sequential FMA chain over each k-block
 * (starting at 0), the blocks' sums added in order — the same whatever the tile, the number of
 * tokens (above ST) or the rows of the call (n_tokens == 1 has its own order, as the AVX-512
 * level, and 2..ST tokens another). */
#define GR 16
#define GT 6
#define GK 256
#define GS 128

/* wk: the weight type, WK_F32, WK_F16 or WK_BF16 (a constant in every call, so each is compiled
 * on its own); bf16 → f32 is the 16-bit left shift of the bit pattern (exact). */
enum { WK_F32, WK_F16, WK_BF16 };

AI __m256 ldw(int wk, const uint8_t *row, int64_t k)
{
    if (wk == WK_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k))), 16));
    return wk == WK_F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)))
                        : _mm256_loadu_ps((const float *)row + k);
}

AI int wbytes(int wk) { return wk == WK_F32 ? 4 : 2; } /* bytes per weight */

AI float wval(int wk, const uint8_t *row, int64_t k)
{
    if (wk != WK_F32) {
        uint16_t h;
        memcpy(&h, row + 2 * k, 2);
        return wk == WK_BF16 ? bf16_to_fp32(h) : fp16_to_fp32(h);
    }
    float f;
    memcpy(&f, row + 4 * k, 4);
    return f;
}

/* Decode's prefetch distance in bytes (past the row's end: the next row, read next). The hardware
 * prefetcher alone had left decode at 71-77% of a ~70 GB/s read pass (TinyLlama F16, 2 threads);
 * 4 KiB ahead, a line per 64 bytes read, 80-95% (8 KiB alike). */
#define PF_ROW 4096

/* One row · one token (decode): one sequential stream, 4 accumulators of 8 partial sums. */
AI float dot_row1(int wk, const uint8_t *row, const float *x, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
#pragma GCC unroll 2
        for (int l = 0; l < 32 * wbytes(wk); l += 64) /* the lines of the 32 weights PF_ROW ahead */
            _mm_prefetch((const char *)row + wbytes(wk) * k + PF_ROW + l, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(ldw(wk, row, k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(ldw(wk, row, k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(ldw(wk, row, k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(ldw(wk, row, k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= n; k += 8) a0 = _mm256_fmadd_ps(ldw(wk, row, k), _mm256_loadu_ps(x + k), a0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < n; k++) s += wval(wk, row, k) * x[k];
    return s;
}

/* In-register transpose of 8 vectors of 8 floats: v[i] element j becomes v[j] element i. */
AI void transpose8(__m256 v[8])
{
    __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    v[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    v[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    v[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    v[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    v[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    v[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    v[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    v[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* wp[k][16] = row r (< R, else 0) element k0 + k, for k < kc. */
AI void pack_rows(int wk, const uint8_t *w, size_t ws, int R, int64_t k0, int kc, float *wp)
{
    for (int g = 0; g < GR; g += 8) {
        int k = 0;
        if (R - g >= 8) {
            for (; k + 8 <= kc; k += 8) {
                __m256 v[8];
                for (int i = 0; i < 8; i++) v[i] = ldw(wk, w + (size_t)(g + i) * ws, k0 + k);
                transpose8(v);
                for (int i = 0; i < 8; i++) _mm256_store_ps(wp + (size_t)(k + i) * GR + g, v[i]);
            }
        }
        for (; k < kc; k++)
            for (int i = 0; i < 8; i++)
                wp[(size_t)k * GR + g + i] = g + i < R ? wval(wk, w + (size_t)(g + i) * ws, k0 + k) : 0.0f;
    }
}

/* The tile: T tokens (x[t] = x + t·xs, at the block's first element) × the panel's 16 rows over
 * kc elements; out[t·os + 0..R) = the sums (first block) or += them. */
AI void gemm_tile(const float *wp, int kc, const float *x, size_t xs, int T, float *out, size_t os, int R,
                  int first, __m256i m0, __m256i m1)
{
    __m256 a0[GT], a1[GT];
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) a0[t] = a1[t] = _mm256_setzero_ps();
    const float *xp[GT];
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) xp[t] = x + (size_t)t * xs;
#pragma GCC unroll 4
    for (int k = 0; k < kc; k++) {
        __m256 w0 = _mm256_load_ps(wp + (size_t)k * GR), w1 = _mm256_load_ps(wp + (size_t)k * GR + 8);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 b = _mm256_broadcast_ss(xp[t] + k);
            a0[t] = _mm256_fmadd_ps(w0, b, a0[t]);
            a1[t] = _mm256_fmadd_ps(w1, b, a1[t]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * os;
        if (R == GR) {
            if (!first) {
                a0[t] = _mm256_add_ps(_mm256_loadu_ps(o), a0[t]);
                a1[t] = _mm256_add_ps(_mm256_loadu_ps(o + 8), a1[t]);
            }
            _mm256_storeu_ps(o, a0[t]);
            _mm256_storeu_ps(o + 8, a1[t]);
        } else {
            if (!first) {
                a0[t] = _mm256_add_ps(_mm256_maskload_ps(o, m0), a0[t]);
                a1[t] = _mm256_add_ps(_mm256_maskload_ps(o + 8, m1), a1[t]);
            }
            _mm256_maskstore_ps(o, m0, a0[t]);
            _mm256_maskstore_ps(o + 8, m1, a1[t]);
        }
    }
}

static void gemm_tile_any(const float *wp, int kc, const float *x, size_t xs, int T, float *out, size_t os, int R,
                          int first)
{
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(R), idx), m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(R - 8), idx);
    switch (T) {
    case 6: gemm_tile(wp, kc, x, xs, 6, out, os, R, first, m0, m1); break;
    case 5: gemm_tile(wp, kc, x, xs, 5, out, os, R, first, m0, m1); break;
    case 4: gemm_tile(wp, kc, x, xs, 4, out, os, R, first, m0, m1); break;
    case 3: gemm_tile(wp, kc, x, xs, 3, out, os, R, first, m0, m1); break;
    case 2: gemm_tile(wp, kc, x, xs, 2, out, os, R, first, m0, m1); break;
    case 1: gemm_tile(wp, kc, x, xs, 1, out, os, R, first, m0, m1); break;
    default: break;
    }
}

/* ---- a few tokens: inner products, no panel ------------------------------------------------------
 * For 2..ST tokens (short prompts, a few sequences' decode steps) the panel's conversion and
 * transpose, paid once per 16 rows × 256 elements whatever the tokens, cost more than the FMAs
 * they feed. TinyLlama F16's matmuls, 2 threads, ms per pass, panels / these tiles: 2 tokens
 * 145 / 55-65, 4 tokens 155 / 90, 9 tokens 209 / 140, 16 tokens 273 / 216, 24 tokens 334-344 /
 * 319-326, 32 tokens 412 / 409, 64 tokens 703 / 805 (hence ST). Rows are contiguous along k, so
 * a tile of R rows × T tokens keeps R·T ≤ 12 accumulators of 8 partial sums (lane = k mod 8): 4
 * rows for tiles of up to 3 tokens, else 2 rows × up to ST_T = 6 tokens (enough independent FMA
 * chains either way); it loads and converts each row vector once per tile and each token vector
 * once per step (as the AVX-512 level's inner-product GEMM, after llamafile's tinyBLAS), and the
 * rows stay in L1 while another tile of tokens passes. Float order, per output: 8 sequential FMA
 * chains (k ≡ lane mod 8), summed pairwise at the end (hsum_ps), then the tail in order — the
 * same whatever the tile, the rows of the call or the number of tokens from 2 to ST. */
#define SR 4
#define ST_T 6
#define ST KERN_AVX2_FLOAT_SMALL

/* The k loop of a tile, the lanes' sums into sums[r·ST_T + t]; a function of its own per (kind,
 * R, T), so that GCC keeps every accumulator in a register (inlined into one large function, it
 * spilled two of them per step). */
AI void small_loop(int wk, const uint8_t *w, size_t ws, const float *x, size_t xs, int64_t n8, int R, int T,
                   float *sums)
{
    __m256 a[SR][ST_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) a[r][t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < n8; k += 8) {
        __m256 wv[SR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = ldw(wk, w + (size_t)r * ws, k);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)t * xs + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) a[r][t] = _mm256_fmadd_ps(wv[r], xv, a[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) sums[r * ST_T + t] = hsum_ps(a[r][t]);
}

typedef void (*small_fn)(const uint8_t *w, size_t ws, const float *x, size_t xs, int64_t n8, float *sums);
#define SMALL_FN(WK, R, T)                                                                                \
    static __attribute__((noinline)) void small_##WK##_##R##_##T(const uint8_t *w, size_t ws, const float *x, \
                                                                 size_t xs, int64_t n8, float *sums)      \
    {                                                                                                     \
        small_loop(WK, w, ws, x, xs, n8, R, T, sums);                                                     \
    }
/* the (R, T) a call can ask for: 1-2 rows × 1-6 tokens, 3-4 rows × 1-3 tokens */
#define SMALL_FNS(WK)                                                                                     \
    SMALL_FN(WK, 1, 1) SMALL_FN(WK, 1, 2) SMALL_FN(WK, 1, 3) SMALL_FN(WK, 1, 4) SMALL_FN(WK, 1, 5)       \
    SMALL_FN(WK, 1, 6) SMALL_FN(WK, 2, 1) SMALL_FN(WK, 2, 2) SMALL_FN(WK, 2, 3) SMALL_FN(WK, 2, 4)       \
    SMALL_FN(WK, 2, 5) SMALL_FN(WK, 2, 6) SMALL_FN(WK, 3, 1) SMALL_FN(WK, 3, 2) SMALL_FN(WK, 3, 3)       \
    SMALL_FN(WK, 4, 1) SMALL_FN(WK, 4, 2) SMALL_FN(WK, 4, 3)                                             \
    static const small_fn small_##WK[SR][ST_T] = {                                                        \
        {small_##WK##_1_1, small_##WK##_1_2, small_##WK##_1_3, small_##WK##_1_4, small_##WK##_1_5,         \
         small_##WK##_1_6},                                                                               \
        {small_##WK##_2_1, small_##WK##_2_2, small_##WK##_2_3, small_##WK##_2_4, small_##WK##_2_5,         \
         small_##WK##_2_6},                                                                               \
        {small_##WK##_3_1, small_##WK##_3_2, small_##WK##_3_3},                                           \
        {small_##WK##_4_1, small_##WK##_4_2, small_##WK##_4_3}};
SMALL_FNS(WK_F32)
SMALL_FNS(WK_F16)
SMALL_FNS(WK_BF16)

/* R rows × T tokens over the whole row: out[t·os + r] = the lanes' sums, then the tail in order. */
static void small_tile(int wk, const uint8_t *w, size_t ws, const float *x, size_t xs, int64_t n, int R, int T,
                       float *out, size_t os)
{
    float sums[SR * ST_T];
    int64_t n8 = n & ~(int64_t)7;
    (wk == WK_BF16 ? small_WK_BF16 : wk == WK_F16 ? small_WK_F16 : small_WK_F32)[R - 1][T - 1](w, ws, x, xs, n8, sums);
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) {
            float v = sums[r * ST_T + t];
            for (int64_t j = n8; j < n; j++) v += wval(wk, w + (size_t)r * ws, j) * x[(size_t)t * xs + j];
            out[(size_t)t * os + r] = v;
        }
}

/* 2..ST tokens: blocks of rows (4 when no tile has more than 3 tokens, else 2), each meeting the
 * tokens in the fewest tiles of at most ST_T, of sizes differing by one at most. */
static void gemm_small(int wk, const uint8_t *w, size_t ws, int64_t nrows, const float *x, size_t xs, int n_tokens,
                       int64_t n, float *out, size_t os)
{
    int n_tiles = (n_tokens + ST_T - 1) / ST_T, base_t = n_tokens / n_tiles, extra = n_tokens % n_tiles;
    int rb = base_t + (extra > 0) <= 3 ? 4 : 2;
    for (int64_t r = 0; r < nrows; r += rb) {
        int R = nrows - r < rb ? (int)(nrows - r) : rb;
        for (int i = 0, t = 0; i < n_tiles; i++) {
            int T = base_t + (i < extra);
            small_tile(wk, w + (size_t)r * ws, ws, x + (size_t)t * xs, xs, n, R, T, out + (size_t)t * os + r, os);
            t += T;
        }
    }
}

/* out[t·os + r] for rows [0, nrows), tokens [0, n_tokens) (see the comment above). */
static void gemm_float(int wk, const uint8_t *w, size_t ws, int64_t nrows, const uint8_t *act, size_t as, int n_tokens,
                       int64_t n, float *out, size_t os)
{
    if (n_tokens == 1) { /* decode: another summation order than the tiles' (as x86_avx512.c's) */
        const float *x1 = (const float *)act;
        for (int64_t r = 0; r < nrows; r++)
            out[r] = wk == WK_BF16  ? dot_row1(WK_BF16, w + (size_t)r * ws, x1, n)
                     : wk == WK_F16 ? dot_row1(WK_F16, w + (size_t)r * ws, x1, n)
                                    : dot_row1(WK_F32, w + (size_t)r * ws, x1, n);
        return;
    }
    if (n_tokens <= ST) { /* gemm_small picks its kind's tile functions itself */
        gemm_small(wk, w, ws, nrows, (const float *)act, as / 4, n_tokens, n, out, os);
        return;
    }
    const int eb = wbytes(wk);
    float wp[GK * GR] __attribute__((aligned(64)));
    const float *x = (const float *)act;
    size_t xs = as / 4;
    for (int64_t s0 = 0; s0 < nrows; s0 += GS) {
        int64_t s1 = s0 + GS < nrows ? s0 + GS : nrows;
        for (int64_t k0 = 0; k0 < n; k0 += GK) {
            int kc = n - k0 < GK ? (int)(n - k0) : GK;
            for (int64_t r = s0; r < s1; r += GR) {
                int R = s1 - r < GR ? (int)(s1 - r) : GR;
                if (wk == WK_BF16) pack_rows(WK_BF16, w + (size_t)r * ws, ws, R, k0, kc, wp);
                else if (wk == WK_F16) pack_rows(WK_F16, w + (size_t)r * ws, ws, R, k0, kc, wp);
                else pack_rows(WK_F32, w + (size_t)r * ws, ws, R, k0, kc, wp);
                /* the next block's rows into L1 while this one computes (16 short streams are
                 * too many for the hardware prefetcher to have them in time) */
                {
                    int64_t rn = r + GR < s1 ? r + GR : s0, kn = r + GR < s1 ? k0 : k0 + GK;
                    if (kn < n)
                        for (int i = 0; i < GR && rn + i < s1; i++) {
                            const char *pr = (const char *)(w + (size_t)(rn + i) * ws) + eb * kn;
                            for (int b = 0; b < eb * kc; b += 64) _mm_prefetch(pr + b, _MM_HINT_T0);
                        }
                }
                /* the fewest tiles of at most GT tokens, of sizes differing by one at most (no
                 * small tail tile) */
                int n_tiles = (n_tokens + GT - 1) / GT, base_t = n_tokens / n_tiles, extra = n_tokens % n_tiles;
                for (int i = 0, t = 0; i < n_tiles; i++) {
                    int T = base_t + (i < extra);
                    gemm_tile_any(wp, kc, x + (size_t)t * xs + k0, xs, T, out + (size_t)t * os + r, os, R, k0 == 0);
                    t += T;
                }
            }
        }
    }
}

void kern_avx2_gemm_float(int wtype, const uint8_t *w, size_t ws, int64_t nrows, const uint8_t *act, size_t as,
                          int n_tokens, int64_t n, float *out, size_t os)
{
    gemm_float(wtype == GGML_TYPE_BF16 ? WK_BF16 : wtype == GGML_TYPE_F16 ? WK_F16 : WK_F32, w, ws, nrows, act, as,
               n_tokens, n, out, os);
}

#endif /* without AVX2 nothing here: gemm_avx2.c, whose guard implies this one, never calls it */
