/* gemm_float: the float-weight (F32 / F16) GEMM kernels that live in files of their own (engine-internal). */
#ifndef KV_GEMM_FLOAT_H
#define KV_GEMM_FLOAT_H

#include <stddef.h>
#include <stdint.h>

/* The AVX-512 level's GEMM on F32 (f16 = 0) or F16 (f16 = 1) weight rows, in
 * engine/kernels/gemm_float_avx512.c (its own file so that the build can give it its own flags).
 * w: nrows rows of n weights, ws bytes apart; act: n_tokens activation rows, as bytes apart, of
 * n f32 values (F32 weights) or n fp16 values (F16 weights: x86_avx512.c's ACT_F16R layout);
 * out[t·os + r] = Σ_k w[r][k]·x[t][k] for r < nrows, t < n_tokens, in the tile order described
 * there (the same sums for any nrows / n_tokens split). No errors: the caller checks the shapes.
 * A no-op in a build without AVX-512. */
void kern_avx512_gemm_float(int f16, const uint8_t *w, size_t ws, int64_t nrows, const uint8_t *act, size_t as,
                            int n_tokens, int64_t n, float *out, size_t os);

#endif
