/* kernels: the table of compute kernels of one ISA level, chosen once at run time from the CPU's features. */
#ifndef KV_KERNELS_H
#define KV_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* ISA levels, lowest first per architecture. A level is usable when the CPU (cpuid + xgetbv on
 * x86-64, getauxval(AT_HWCAP/AT_HWCAP2) on aarch64) and the OS (saved register state) have every
 * feature it needs:
 *   KERN_PORTABLE      C reference, any CPU
 *   KERN_AVX2          x86-64 AVX2 + FMA + F16C
 *   KERN_AVXVNNI       KERN_AVX2 + AVX-VNNI (256-bit vpdpbusd, Alder Lake / Zen 5 client)
 *   KERN_AVX512        AVX-512 F, BW, VL, DQ, VNNI, VBMI (+ BF16 where the CPU has it) + FMA, F16C
 *   KERN_NEON          aarch64 Advanced SIMD (every aarch64 CPU)
 *   KERN_NEON_DOTPROD  + SDOT/UDOT (Armv8.2 dotprod: Cortex-A76+, Apple M1+, Graviton 2+)
 *   KERN_NEON_I8MM     + SMMLA (Armv8.6 i8mm: Apple M2+, Graviton 3+) */
typedef enum kern_isa {
    KERN_PORTABLE = 0,
    KERN_AVX2,
    KERN_AVXVNNI,
    KERN_AVX512,
    KERN_NEON,
    KERN_NEON_DOTPROD,
    KERN_NEON_I8MM,
    KERN_ISA_COUNT
} kern_isa;

/* Arguments of one attention tile (see kern_ops.attn_tile). q and out are [n_tokens][n_head·hd]
 * f32. K and V are read where they are stored, block by block (a paged KV cache, or one block of
 * contiguous rows): the row of position p (n_head_kv·hd values of kv_type, F32 or F16) starts at
 * kb[p / bs] + (p % bs)·row_bytes (V: vb). F16 values are widened exactly on load, so the results
 * do not depend on the storage type's layout, only on its values. */
typedef struct kern_attn {
    const float *q;
    float *out;
    const uint8_t *const *kb, *const *vb;
    int bs;           /* positions per block, a power of two (rows are found by shift and mask) */
    size_t row_bytes; /* bytes of one row */
    int kv_type;      /* GGML_TYPE_F32 or GGML_TYPE_F16 */
    int n_tokens, pos0, n_head, n_head_kv, hd;
    float scale;
} kern_attn;

/* One ISA level's kernels. Every entry has the contract of the quant.h / ops.h function of the
 * same name (quant_vec_dot, quant_gemv, ...). A level's fill function (below) overrides only the
 * entries it implements; the rest keep the next lower level's. The MATMUL GROUP — act_row_size,
 * act_prepare, gemv, gemm, pack_size, pack, gemm_packed — shares one activation and panel layout,
 * so a level overrides all seven or none. */
typedef struct kern_ops {
    kern_isa isa;
    /* dot products, conversions */
    float (*vec_dot)(int type, int64_t n, const void *w_row, const void *x_act);
    void (*vec_dot_rows)(int type, int64_t n, int64_t nrows, const void *w, size_t row_stride, const void *x_act,
                         float *out);
    void (*quantize_row)(int type, const float *src, void *dst, int64_t n);
    void (*dequantize_row)(int type, const void *src, float *dst, int64_t n);
    void (*fp16_to_fp32_row)(const uint16_t *src, float *dst, int64_t n);
    void (*fp32_to_fp16_row)(const float *src, uint16_t *dst, int64_t n);
    /* matmul group */
    size_t (*act_row_size)(int wtype, int64_t n);
    void (*act_prepare)(int wtype, const float *x, int64_t n, void *act);
    void (*gemv)(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act, float *out);
    void (*gemm)(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act,
                 size_t act_stride, int n_tokens, float *out, size_t out_stride);
    size_t (*pack_size)(int wtype, int64_t n, int64_t nrows);
    void (*pack)(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, void *dst);
    void (*gemm_packed)(int wtype, int64_t n, int64_t row0, int64_t nrows, const void *packed, const void *act,
                        size_t act_stride, int n_tokens, float *out, size_t out_stride);
    /* attention: scores, causal softmax and weighted values of the queries of kv head g and tokens
     * [t0, t1) (rows i = (t - t0)·G + h, G = n_head / n_head_kv); S is scratch [rows][ldS] with
     * ldS >= pos0 + t1 rounded up to 16, KT 64-byte aligned scratch of (hd + 15)·16 floats. */
    void (*attn_tile)(const kern_attn *a, int g, int t0, int t1, float *S, int ldS, float *KT);
    /* SwiGLU: gate[i] = silu(gate[i]) · up[i] (kern_swiglu) */
    void (*swiglu)(float *gate, const float *up, int64_t n);
} kern_ops;

/* The kernels in use: the best level the CPU has, or the level KVCHAT_ISA names (portable, avx2,
 * avxvnni, avx512, neon, dotprod, i8mm) when the CPU has it. Chosen on the first call (thread-safe),
 * never changed afterwards except by kern_select. */
const kern_ops *kern(void);

/* Force a level (tests; benchmarks). Returns 0, or -1 (nothing changes) when this CPU or this
 * build lacks it. Not safe while another thread runs kernels. */
int kern_select(kern_isa isa);

/* 1 if this CPU and build can run the level. */
int kern_supported(kern_isa isa);

/* The best level this CPU and build support. */
kern_isa kern_best(void);

/* "avx2" ... as KVCHAT_ISA spells it; NULL for a bad id. kern_isa_parse: the id, or -1. */
const char *kern_isa_name(kern_isa isa);
int kern_isa_parse(const char *name);

/* A one-line warning when KVCHAT_ISA was set to a level that is unknown or that this CPU lacks
 * (the level used instead is named), else NULL. The app prints it; kernels never print. */
const char *kern_warning(void);

/* Numerically stable softmax in place over n floats: x - max, expf, the sum in double, times its
 * reciprocal (the order op_attention's kernels and the reference share). */
void kern_softmax(float *x, int n);

/* SwiGLU in place (Shazeer 2020, "GLU Variants Improve Transformer"): gate[i] = gate[i] /
 * (1 + e^-gate[i]) · up[i] for i < n, through the level's kernel. The portable level computes
 * e^x with the C library's expf; the SIMD levels (AVX2, inherited by AVX-VNNI and AVX-512; NEON)
 * with the same vector algorithm — x = n·ln 2 + r, |r| <= ln 2 / 2, e^r by the degree-7
 * polynomial of Cephes' expf (S. L. Moshier, Cephes Math Library), times 2^n — within a few ulp
 * of expf, the same bits for an element wherever it falls in the array (a tail shorter than a
 * vector runs the vector code on a padded copy), so a batch and a decode step agree. NaN stays
 * NaN. No errors. */
void kern_swiglu(float *gate, const float *up, int64_t n);

/* Fill functions, one per source file and level (each a no-op in a build for another
 * architecture): they override the entries of *o that the file implements. */
void kern_fill_portable(kern_ops *o);        /* engine/kernels/portable.c: every entry */
void kern_fill_x86_avx2(kern_ops *o);      /* engine/kernels/x86_avx2.c: dot products, conversions */
void kern_fill_x86_avxvnni(kern_ops *o);   /* the same file built with AVX-VNNI */
void kern_fill_gemm_avx2(kern_ops *o);     /* engine/kernels/gemm_avx2.c: matmul group, attention */
void kern_fill_gemm_avxvnni(kern_ops *o);  /* the same file built with AVX-VNNI */
void kern_fill_x86_avx512(kern_ops *o);    /* engine/kernels/x86_avx512.c: everything */
void kern_fill_arm_neon(kern_ops *o);      /* engine/kernels/arm_neon.c */
void kern_fill_arm_dotprod(kern_ops *o);   /* the same file built with +dotprod */
void kern_fill_arm_i8mm(kern_ops *o);      /* the same file built with +dotprod+i8mm */

#endif
