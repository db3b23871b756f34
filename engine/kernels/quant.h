/* quant: the GGML weight types — block layouts, fp16/bf16, dequantize, quantize and dot-product kernels. */
#ifndef KV_QUANT_H
#define KV_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Type ids exactly as GGML numbers them (ggml.h `enum ggml_type`, also the tensor type field
 * of the GGUF tensor table, see ggml docs/gguf.md). Gaps are ids GGML retired. */
enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    /* 4 (Q4_2), 5 (Q4_3): removed before GGUF existed */
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_Q4_0_4_4 = 31,   /* retired repacked layouts: known by name/size, never supported */
    GGML_TYPE_Q4_0_4_8 = 32,
    GGML_TYPE_Q4_0_8_8 = 33,
    GGML_TYPE_TQ1_0 = 34,
    GGML_TYPE_TQ2_0 = 35,
    GGML_TYPE_IQ4_NL_4_4 = 36,
    GGML_TYPE_IQ4_NL_4_8 = 37,
    GGML_TYPE_IQ4_NL_8_8 = 38,
    GGML_TYPE_MXFP4 = 39,
    GGML_TYPE_COUNT = 40
};

/* Elements per super-block of the K-quants (GGML's QK_K). */
#define QUANT_QK_K 256

/* ---- Block layouts (GGML ggml-common.h / GGUF spec), little-endian, no padding. --------------
 * d / dmin / m / s are IEEE half floats (uint16 bit patterns) except Q8_K's float d. */
typedef struct { uint16_t d; uint8_t qs[16]; } block_q4_0;                 /* 18 B / 32 */
typedef struct { uint16_t d, m; uint8_t qs[16]; } block_q4_1;              /* 20 B / 32 */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;  /* 22 B / 32 */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } block_q5_1; /* 24 B / 32 */
typedef struct { uint16_t d; int8_t qs[32]; } block_q8_0;                  /* 34 B / 32 */
typedef struct { uint16_t d, s; int8_t qs[32]; } block_q8_1;               /* 36 B / 32 */
typedef struct {                                                           /* 84 B / 256 */
    uint8_t scales[16];   /* per 16 elements: low nibble scale, high nibble min */
    uint8_t qs[64];       /* 2-bit quants */
    uint16_t d, dmin;
} block_q2_K;
typedef struct {                                                           /* 110 B / 256 */
    uint8_t hmask[32];    /* high bit of each 3-bit quant */
    uint8_t qs[64];       /* low 2 bits */
    uint8_t scales[12];   /* 16 6-bit scales, biased by 32 */
    uint16_t d;
} block_q3_K;
typedef struct {                                                           /* 144 B / 256 */
    uint16_t d, dmin;
    uint8_t scales[12];   /* 8 6-bit scales + 8 6-bit mins */
    uint8_t qs[128];      /* 4-bit quants */
} block_q4_K;
typedef struct {                                                           /* 176 B / 256 */
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];       /* 5th bit */
    uint8_t qs[128];      /* low 4 bits */
} block_q5_K;
typedef struct {                                                           /* 210 B / 256 */
    uint8_t ql[128];      /* low 4 bits */
    uint8_t qh[64];       /* high 2 bits */
    int8_t scales[16];    /* per 16 elements */
    uint16_t d;
} block_q6_K;
typedef struct {                                                           /* 292 B / 256 */
    float d;
    int8_t qs[256];
    int16_t bsums[16];    /* sum of qs over each 16 elements */
} block_q8_K;
typedef struct { uint16_t d; uint8_t qs[16]; } block_iq4_nl;               /* 18 B / 32 */
typedef struct {                                                           /* 136 B / 256 */
    uint16_t d;
    uint16_t scales_h;    /* high 2 bits of the 8 6-bit sub-block scales */
    uint8_t scales_l[4];  /* low 4 bits, two per byte */
    uint8_t qs[128];      /* 4-bit indices into the IQ4 value table */
} block_iq4_xs;

/* MXFP4 (OCP Microscaling Formats spec v1.0, 2023; GGML_TYPE_MXFP4): 32 FP4 E2M1 elements
 * (1 sign, 2 exponent, 1 mantissa bit: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) sharing one E8M0 scale
 * 2^(e - 127). Nibble order as Q4_0 (qs[j] low nibble element j, high nibble element j + 16). */
typedef struct { uint8_t e; uint8_t qs[16]; } block_mxfp4;                 /* 17 B / 32 */

/* The 16 E2M1 codes times 2 (integers, as GGML's kvalues_mxfp4: 0 1 2 3 4 6 8 12, then the
 * negatives with code 8 = -0): the dot products sum these exactly in int8 and take the factor
 * 1/2 into the scale, quant_e8m0_half(e) = 2^(e - 128) (e < 2 gives the subnormals 2^-128 and
 * 2^-127, as GGML's ggml_e8m0_to_fp32_half; e = 255, NaN in the OCP spec, gives 2^127 there). */
extern const int8_t quant_mxfp4_values[16];
static inline float quant_e8m0_half(uint8_t e)
{
    union { uint32_t u; float f; } v;
    v.u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return v.f;
}

/* The 16 values a 4-bit IQ4_NL / IQ4_XS index stands for (GGML's kvalues_iq4nl: a non-linear
 * grid fitted to the distribution of LLM weights, Kawrakow 2024, llama.cpp PR 5590). */
extern const int8_t quant_iq4nl_values[16];

typedef struct quant_traits {
    const char *name;        /* "Q4_K" … as GGML/GGUF name them */
    int64_t block_size;      /* elements per block (1 for F32/F16/BF16, 32, 256) */
    size_t type_size;        /* bytes per block */
    int supported;           /* 1 if dequantize + vec_dot are implemented here */
    int vec_dot_type;        /* the activation format dot products use: F32→F32, F16→F16,
                                BF16→BF16, Q4_0/Q5_0/Q8_0→Q8_0, Q4_1/Q5_1→Q8_1, K-quants→Q8_K;
                                -1 for the integer / F64 types (no dot product defined) */
} quant_traits;

/* Traits of a GGML type id. Returns NULL for an id GGML never defined or retired before GGUF
 * (4, 5, negative, >= GGML_TYPE_COUNT). Source: ggml.c type_traits / GGUF spec block sizes. */
const quant_traits *quant_traits_of(int type);

/* Bytes taken by n elements of `type` (n / block_size * type_size). Returns 0 when the type is
 * unknown, n < 0, or n is not a multiple of the block size (callers validate first). */
size_t quant_row_size(int type, int64_t n);

/* 1 if quant_quantize_row can produce `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q8_1, Q2_K … Q6_K, Q8_K, IQ4_NL, IQ4_XS, MXFP4); 1 if quant_dequantize_row can read it (every supported type plus
 * Q8_1 and Q8_K). */
int quant_can_quantize(int type);
int quant_can_dequantize(int type);

/* Decode n elements (n a multiple of the type's block size) of `type` at src
 * (quant_row_size(type, n) bytes, 2-byte aligned, 4 for F32/Q8_K) into n floats at dst.
 * For a type quant_can_dequantize() rejects, or a bad n, dst[0..n) is filled with NaN.
 * Block formats: GGML block_q4_0 … block_q6_K / block_q8_K (ggml-common.h layouts, GGUF spec);
 * the element order inside each block is spelled out at the top of engine/quant_ref.c. */
void quant_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* Encode n floats (n a multiple of the block size) into quant_row_size(type, n) bytes at dst.
 * F16 / BF16 round to nearest even (as fp32_to_fp16 / fp32_to_bf16).
 * Activation formats follow llama.cpp's x86 semantics exactly, since our logits are compared
 * against it: Q8_0: d = amax/127 stored as fp16, q = round-half-even(x * 127/amax);
 * Q8_1: same plus s = fp16(d * Σq); Q8_K: d = 1/(-127/max) where max is the first element of
 * largest magnitude (so d may be negative), q = min(127, round-half-even(x * -127/max)), 16
 * int16 sums of 16 q each. Weight formats (Q4_0 … Q6_K) use our own min/max + scale-search
 * quantizers (they decode with the GGML layout; bytes need not equal llama-quantize's).
 * For a type quant_can_quantize() rejects, dst is left untouched. */
void quant_quantize_row(int type, const float *src, void *dst, int64_t n);

/* Dot product Σ w[i]·x[i] over n elements (n a multiple of the block size): w_row is one row
 * of `type` (quant_row_size(type, n) bytes), x_act the activation already quantized to
 * quant_traits_of(type)->vec_dot_type with quant_quantize_row. Semantics per block as in
 * GGML's ggml_vec_dot_<type>_<vec_dot_type>: integer block sums times d_w·d_x, minus the
 * min terms (Q4_1/Q5_1 via Q8_1's s, K-quants via Q8_K's bsums). Uses AVX2/FMA/F16C/
 * AVX-512/VNNI kernels when compiled with them, else the scalar reference. No allocation.
 * Returns NaN for a type that is not supported (traits->supported == 0) or a bad n. */
float quant_vec_dot(int type, int64_t n, const void *w_row, const void *x_act);

/* out[r] = quant_vec_dot(type, n, (const char *)w + r * row_stride, x_act) for r < nrows: the
 * matrix-vector product of nrows weight rows with one activation. Same contract as
 * quant_vec_dot (NaN for unsupported types); faster for Q4_0 and Q8_0, whose kernels walk eight
 * rows at once and share the activation work (results equal per-row ones up to float
 * summation order). No allocation. */
void quant_vec_dot_rows(int type, int64_t n, int64_t nrows, const void *w, size_t row_stride,
                        const void *x_act, float *out);

/* ---- Matrix kernels on prepared activations (engine/quant_gemm.c) ---------------------------
 * A matmul converts each activation row once, with quant_act_prepare, into the layout the
 * kernels for the weight type read: the same quantized values quant_quantize_row gives for the
 * type's vec_dot_type (so results equal quant_vec_dot's up to float summation order), laid out
 * for AVX-512 VNNI when the build has it (else it is exactly the vec_dot_type row).
 * quant_act_row_size is a multiple of 64; act buffers must be 64-byte aligned. */
size_t quant_act_row_size(int wtype, int64_t n);
void quant_act_prepare(int wtype, const float *x, int64_t n, void *act);

/* Matrix-vector product for decode: out[r] = Σ_i w[r][i]·x[i] for r < nrows, weight rows at
 * w + r·w_stride in the GGUF layout. NaN for unsupported types. No allocation. */
void quant_gemv(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act,
                float *out);

/* Matrix-matrix product for prefill: out[t·out_stride + r] = Σ_i w[r][i]·x_t[i] for r < nrows,
 * t < n_tokens, activation row t at act + t·act_stride, weights in the GGUF layout (F32 / F16:
 * an inner-product kernel over the rows as they are; other types: quant_gemv per token). */
void quant_gemm(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act,
                size_t act_stride, int n_tokens, float *out, size_t out_stride);

/* Weights packed once (at model load) for the panel kernels: QUANT_PANEL_ROWS rows interleaved
 * so one vector load feeds 16 rows (layouts at the top of engine/quant_gemm.c). Q4_0, Q5_0,
 * Q8_0, Q4_K, Q5_K and Q6_K with AVX-512 VNNI; quant_pack_size is 0 for every other case (use the
 * GGUF layout). The packed size equals the GGUF size (Q4_K: +2.8%, Q5_K: +2.3%) for whole panels. */
#define QUANT_PANEL_ROWS 16
size_t quant_pack_size(int wtype, int64_t n, int64_t nrows);
void quant_pack(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, void *dst);
/* Rows [row0, row0 + nrows) (row0 a multiple of QUANT_PANEL_ROWS) of a packed matrix times
 * n_tokens prepared activation rows (1 = decode); out[t·out_stride + r - row0]. Per row the float
 * arithmetic is fixed (see quant_gemm.c), so results do not depend on threads or batch size. */
void quant_gemm_packed(int wtype, int64_t n, int64_t row0, int64_t nrows, const void *packed, const void *act,
                       size_t act_stride, int n_tokens, float *out, size_t out_stride);

/* Portable scalar references of the three operations above (always compiled; the SIMD
 * kernels must agree with them: integer parts exactly, float sums to rounding order). */
void quant_dequantize_row_ref(int type, const void *src, float *dst, int64_t n);
void quant_quantize_row_ref(int type, const float *src, void *dst, int64_t n);
float quant_vec_dot_ref(int type, int64_t n, const void *w_row, const void *x_act);

/* IEEE 754 binary16 <-> binary32. fp32_to_fp16 rounds to nearest even, overflows to ±inf,
 * keeps NaN a (quiet) NaN and produces subnormals; fp16_to_fp32 is exact. */
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

/* bfloat16 (top 16 bits of a binary32) <-> binary32. fp32_to_bf16 rounds to nearest even and
 * keeps NaN NaN (quiet bit set); subnormals are kept, not flushed. bf16_to_fp32 is exact. */
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

/* Bulk conversions of n values, any n >= 0 (F16C when available); same results as the
 * scalar conversions above. */
void quant_fp16_to_fp32_row(const uint16_t *src, float *dst, int64_t n);
void quant_fp32_to_fp16_row(const float *src, uint16_t *dst, int64_t n);

#endif
