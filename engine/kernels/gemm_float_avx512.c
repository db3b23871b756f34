/* gemm_float_avx512: the AVX-512 level's GEMV and GEMM on F32 / F16 weight rows (no packing), a file of its own for its build flags. */
/*
 * x86_avx512.c's gemv and gemm entries call them for F32 / F16 weights. They are apart
 * from x86_avx512.c only so that the Makefile can build it with other flags than the rest of the
 * level: the level's ISA flags everywhere (KFLAGS_gemm_float_avx512), and in the unit tests'
 * sanitized build -O2 without the sanitizers (ASAN_PLAIN there says why; x86_avx512.c checks
 * under ASan the bytes they are about to read and write).
 */
#include "engine/kernels/gemm_float.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

/* ---- GEMV: one token, one row at a time ------------------------------------------------------ */

#define GEMV_ROWS 1

/* F16 · fp16 activation, R rows (products and sums in f32, as GGML's F16·F16 dot); tails masked. */
static void gemv_f16(int64_t n, int R, const uint8_t *w, size_t stride, const uint16_t *x, float *out)
{
    __m512 acc[GEMV_ROWS], acc2[GEMV_ROWS];
    for (int r = 0; r < GEMV_ROWS; r++) acc[r] = acc2[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i xv = _mm512_loadu_si512(x + i);
        __m512 x0 = _mm512_cvtph_ps(_mm512_castsi512_si256(xv)), x1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(xv, 1));
        for (int r = 0; r < R; r++) {
            const uint8_t *p = w + (size_t)r * stride + 2 * i;
            __m512i v = _mm512_loadu_si512(p);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(v)), x0, acc[r]);
            acc2[r] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1)), x1, acc2[r]);
        }
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
        for (int r = 0; r < R; r++) {
            const uint16_t *p = (const uint16_t *)(w + (size_t)r * stride) + i;
            acc[r] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)), x0, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc2[r]));
}

static void gemv_f32(int64_t n, int R, const uint8_t *w, size_t stride, const float *x, float *out)
{
    __m512 acc[GEMV_ROWS], acc2[GEMV_ROWS];
    for (int r = 0; r < GEMV_ROWS; r++) acc[r] = acc2[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
        for (int r = 0; r < R; r++) {
            const float *p = (const float *)(w + (size_t)r * stride) + i;
            acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(p), x0, acc[r]);
            acc2[r] = _mm512_fmadd_ps(_mm512_loadu_ps(p + 16), x1, acc2[r]);
        }
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x0 = _mm512_maskz_loadu_ps(m, x + i);
        for (int r = 0; r < R; r++) {
            const float *p = (const float *)(w + (size_t)r * stride) + i;
            acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, p), x0, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc2[r]));
}

void kern_avx512_gemv_float(int f16, const uint8_t *w, size_t ws, int64_t nrows, const uint8_t *act, int64_t n,
                            float *out)
{
    for (int64_t r = 0; r < nrows; r += GEMV_ROWS) {
        int R = nrows - r < GEMV_ROWS ? (int)(nrows - r) : GEMV_ROWS;
        const uint8_t *wr = w + (size_t)r * ws;
        if (f16) gemv_f16(n, R, wr, ws, (const uint16_t *)act, out + r);
        else gemv_f32(n, R, wr, ws, (const float *)act, out + r);
    }
}

/* ---- float weights: inner-product GEMM, no packing -------------------------------------------
 * F32 / F16 rows are already contiguous along k, so a tile of FR rows × FT tokens keeps FR·FT
 * vector accumulators of 16 partial sums each, loads each row chunk once (converting F16) and
 * each token chunk once per step, and reduces the accumulators horizontally at the end (as
 * llamafile's tinyBLAS does). The activation is f32 (F16: already rounded to fp16 values). */
#define FR 4
#define FT 6

static inline __attribute__((always_inline)) void dot_step(int f16, const uint8_t *w, size_t ws, const float *x,
                                                          size_t xs, int64_t k, __mmask16 m, int full, int R, int T,
                                                          __m512 acc[FR][FT])
{
    __m512 wv[FR];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + (size_t)r * ws;
        if (f16)
            wv[r] = _mm512_cvtph_ps(full ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k))
                                         : _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
        else wv[r] = full ? _mm512_loadu_ps((const float *)row + k) : _mm512_maskz_loadu_ps(m, (const float *)row + k);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        __m512 xv;
        if (f16) {
            const uint16_t *xp = (const uint16_t *)x + (size_t)t * xs + k;
            xv = _mm512_cvtph_ps(full ? _mm256_loadu_si256((const __m256i *)xp) : _mm256_maskz_loadu_epi16(m, xp));
        } else {
            xv = full ? _mm512_loadu_ps(x + (size_t)t * xs + k) : _mm512_maskz_loadu_ps(m, x + (size_t)t * xs + k);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
}

static inline __attribute__((always_inline)) void dot_tile(int f16, const uint8_t *w, size_t ws, const float *x,
                                                          size_t xs, int64_t n, int R, int T, float *out, size_t os)
{
    __m512 acc[FR][FT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) dot_step(f16, w, ws, x, xs, k, 0xffff, 1, R, T, acc);
    if (k < n) dot_step(f16, w, ws, x, xs, k, (__mmask16)((1u << (n - k)) - 1u), 0, R, T, acc);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) out[(size_t)t * os + r] = _mm512_reduce_add_ps(acc[r][t]);
}

#define DOT_T(R)                                                                                         \
    switch (T) {                                                                                          \
    case 1: dot_tile(f16, w, ws, x, xs, n, R, 1, out, os); break;                                         \
    case 2: dot_tile(f16, w, ws, x, xs, n, R, 2, out, os); break;                                         \
    case 3: dot_tile(f16, w, ws, x, xs, n, R, 3, out, os); break;                                         \
    case 4: dot_tile(f16, w, ws, x, xs, n, R, 4, out, os); break;                                         \
    case 5: dot_tile(f16, w, ws, x, xs, n, R, 5, out, os); break;                                         \
    case 6: dot_tile(f16, w, ws, x, xs, n, R, 6, out, os); break;                                         \
    default: break;                                                                                       \
    }

static inline __attribute__((always_inline)) void dot_tile_any(int f16, const uint8_t *w, size_t ws, const float *x,
                                                              size_t xs, int64_t n, int R, int T, float *out, size_t os)
{
    switch (R) {
    case 1: DOT_T(1) break;
    case 2: DOT_T(2) break;
    case 3: DOT_T(3) break;
    case 4: DOT_T(4) break;
    default: break;
    }
}

/* Rows are taken FR at a time; each block of rows meets every token in groups of FT, so the
 * rows stay in L1 while the activations stream from L2. */
void kern_avx512_gemm_float(int f16, const uint8_t *w, size_t ws, int64_t nrows, const uint8_t *act, size_t as,
                            int n_tokens, int64_t n, float *out, size_t os)
{
    for (int64_t r = 0; r < nrows; r += FR) {
        int R = nrows - r < FR ? (int)(nrows - r) : FR;
        for (int t = 0; t < n_tokens; t += FT) {
            int T = n_tokens - t < FT ? n_tokens - t : FT;
            const float *x = (const float *)(act + (size_t)t * as);
            if (f16) dot_tile_any(1, w + (size_t)r * ws, ws, x, as / 2, n, R, T, out + (size_t)t * os + r, os);
            else dot_tile_any(0, w + (size_t)r * ws, ws, x, as / 4, n, R, T, out + (size_t)t * os + r, os);
        }
    }
}

#endif /* without AVX-512 nothing here: x86_avx512.c, whose guard implies this one, never calls them */
