/* gemm_float: the float-weight (F32 / F16 / BF16) GEMV / GEMM kernels that live in files of their own (engine-internal). */
#ifndef KV_GEMM_FLOAT_H
#define KV_GEMM_FLOAT_H

#include <stddef.h>
#include <stdint.h>

/* GEMM_FLOAT_ASAN: this file is being compiled under AddressSanitizer (gcc says so with
 * __SANITIZE_ADDRESS__, clang with __has_feature). */
#if defined(__SANITIZE_ADDRESS__)
#define GEMM_FLOAT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GEMM_FLOAT_ASAN 1
#endif
#endif
#if defined(GEMM_FLOAT_ASAN)
#include <sanitizer/asan_interface.h>
#endif

/* The AVX-512 level's GEMM on F32 (f16 = 0) or F16 (f16 = 1) weight rows, in
 * engine/kernels/gemm_float_avx512.c (its own file so that the build can give it its own flags).
 * w: nrows rows of n weights, ws bytes apart; act: n_tokens activation rows, as bytes apart, of
 * n f32 values (F32 weights) or n fp16 values (F16 weights: x86_avx512.c's ACT_F16R layout);
 * out[t·os + r] = Σ_k w[r][k]·x[t][k] for r < nrows, t < n_tokens, in the tile order described
 * there (the same sums for any nrows / n_tokens split). No errors: the caller checks the shapes.
 * Defined in builds with AVX-512 only (as its callers). */
void kern_avx512_gemm_float(int f16, const uint8_t *w, size_t ws, int64_t nrows, const uint8_t *act, size_t as,
                            int n_tokens, int64_t n, float *out, size_t os);

/* The AVX-512 level's GEMV (one token) on the same rows and activation: out[r] = Σ_k w[r][k]·x[k]
 * for r < nrows, each row streamed once with two accumulators of 16 partial sums (another float
 * order than the GEMM's). In gemm_float_avx512.c; no errors; defined in builds with
 * AVX-512 only (as its callers). */
void kern_avx512_gemv_float(int f16, const uint8_t *w, size_t ws, int64_t nrows, const uint8_t *act, int64_t n,
                            float *out);

/* The AVX2 / AVX-VNNI levels' GEMM on F32, F16 or BF16 weight rows (wtype: GGML_TYPE_F32, _F16,
 * _BF16), in engine/kernels/gemm_float_avx2.c. w: nrows rows of n weights, ws bytes apart; act:
 * n_tokens rows, as bytes apart, of n f32 values (gemm_avx2.c's ACT_F32 / ACT_F16 / ACT_BF16
 * layouts: F16 / BF16 activations already rounded to fp16 / bf16 values); out[t·os + r] =
 * Σ_k w[r][k]·x[t][k] for r < nrows, t < n_tokens. One token streams each row once; 2 ..
 * KERN_AVX2_FLOAT_SMALL tokens run inner-product tiles, more the blocked GEMM, as described there:
 * three float orders, each giving the same sums whatever the tiles, rows or tokens of the call
 * within its range. No errors: the caller checks the shapes. Defined in builds with AVX2 only (as
 * its caller). */
#define KERN_AVX2_FLOAT_SMALL 24
void kern_avx2_gemm_float(int wtype, const uint8_t *w, size_t ws, int64_t nrows, const uint8_t *act, size_t as,
                          int n_tokens, int64_t n, float *out, size_t os);

#if defined(GEMM_FLOAT_ASAN)
/* An ASan report (READ or WRITE of n bytes at the first bad one) unless the n bytes at p are
 * addressable; not inlined, so that the report's first frame is the caller's. */
static __attribute__((noinline, unused)) void gemm_float_asan_region(const void *p, size_t n, int is_write)
{
    void *bad = __asan_region_is_poisoned((void *)p, n);
    if (bad)
        __asan_report_error(__builtin_return_address(0), __builtin_frame_address(0), __builtin_frame_address(0), bad,
                            is_write, n);
}

/* For the callers of the kernels above under ASan: the unit tests' sanitized build compiles the
 * kernels' files without the sanitizers (the Makefile's ASAN_PLAIN says why), so their callers
 * check here, before they run, every byte they will read — w_bytes of each of nrows weight rows ws
 * apart, x_bytes of each of n_tokens activation rows as apart — and write: nrows floats of each
 * token, os apart. */
static inline void gemm_float_asan_check(const uint8_t *w, size_t ws, int64_t nrows, size_t w_bytes, const uint8_t *act,
                                         size_t as, int n_tokens, size_t x_bytes, const float *out, size_t os)
{
    for (int64_t r = 0; r < nrows; r++) gemm_float_asan_region(w + (size_t)r * ws, w_bytes, 0);
    for (int t = 0; t < n_tokens; t++) {
        gemm_float_asan_region(act + (size_t)t * as, x_bytes, 0);
        gemm_float_asan_region(out + (size_t)t * os, (size_t)nrows * sizeof(float), 1);
    }
}
#endif

#endif
