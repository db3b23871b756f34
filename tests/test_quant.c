/* test_quant: GGML weight types — fp16/bf16, hand-built blocks, quantizers, SIMD vs scalar dot products, real GGUF rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/testisa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "engine/gguf.h"
#include "engine/kernels/quant.h"
#include "tests/support/testutil.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static void rng_seed(uint64_t s) { rng_state = s ? s : 1; }
static uint64_t rng_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_unit(void) { return (double)(rng_u64() >> 11) * 0x1p-53; } /* [0,1) */
static float rng_gauss(void) {
    double u = rng_unit() + 1e-300, v = rng_unit();
    return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}
static float u32_as_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_as_u32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static const int SUPPORTED[] = {
    GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
    GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
    GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4,
};
#define N_SUPPORTED (int)(sizeof(SUPPORTED) / sizeof(SUPPORTED[0]))

/* MXFP4 round trip on Gaussian data: measured 0.115 (power-of-two scales, 3 bits of magnitude) */
#define MXFP4_RMS 0.14
static const char *tname(int type) { return quant_traits_of(type)->name; }

/* Random weight row of `type` made of random bytes, with every half-float scale field
 * replaced by a finite value in ±[lo, hi] (sign only where the format allows it): covers
 * every bit pattern of the quants, scales and mins, including the extremes. */
static uint16_t rand_half(float lo, float hi, int allow_neg) {
    float v = lo + (hi - lo) * (float)rng_unit();
    if (allow_neg && (rng_u64() & 1)) v = -v;
    return fp32_to_fp16(v);
}
static void random_bytes_row(int type, void *row, int64_t n) {
    size_t bytes = quant_row_size(type, n);
    uint8_t *p = row;
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)rng_u64();
    int64_t nb = n / quant_traits_of(type)->block_size;
    for (int64_t i = 0; i < nb; i++) {
        switch (type) {
        case GGML_TYPE_F32: ((float *)row)[i] = rng_gauss(); break;
        case GGML_TYPE_F16: ((uint16_t *)row)[i] = fp32_to_fp16(rng_gauss()); break;
        case GGML_TYPE_BF16: ((uint16_t *)row)[i] = fp32_to_bf16(rng_gauss()); break;
        case GGML_TYPE_Q4_0: ((block_q4_0 *)row)[i].d = rand_half(0.001f, 0.1f, 1); break;
        case GGML_TYPE_Q4_1:
            ((block_q4_1 *)row)[i].d = rand_half(0.001f, 0.1f, 0);
            ((block_q4_1 *)row)[i].m = rand_half(0.0f, 0.5f, 1);
            break;
        case GGML_TYPE_Q5_0: ((block_q5_0 *)row)[i].d = rand_half(0.001f, 0.1f, 1); break;
        case GGML_TYPE_Q5_1:
            ((block_q5_1 *)row)[i].d = rand_half(0.001f, 0.1f, 0);
            ((block_q5_1 *)row)[i].m = rand_half(0.0f, 0.5f, 1);
            break;
        case GGML_TYPE_Q8_0: ((block_q8_0 *)row)[i].d = rand_half(0.001f, 0.1f, 1); break;
        case GGML_TYPE_Q2_K:
            ((block_q2_K *)row)[i].d = rand_half(0.001f, 0.1f, 0);
            ((block_q2_K *)row)[i].dmin = rand_half(0.001f, 0.1f, 0);
            break;
        case GGML_TYPE_Q3_K: ((block_q3_K *)row)[i].d = rand_half(0.001f, 0.1f, 1); break;
        case GGML_TYPE_Q4_K:
            ((block_q4_K *)row)[i].d = rand_half(0.0001f, 0.01f, 0);
            ((block_q4_K *)row)[i].dmin = rand_half(0.0001f, 0.01f, 0);
            break;
        case GGML_TYPE_Q5_K:
            ((block_q5_K *)row)[i].d = rand_half(0.0001f, 0.01f, 0);
            ((block_q5_K *)row)[i].dmin = rand_half(0.0001f, 0.01f, 0);
            break;
        case GGML_TYPE_Q6_K: ((block_q6_K *)row)[i].d = rand_half(0.0001f, 0.01f, 1); break;
        case GGML_TYPE_IQ4_NL: ((block_iq4_nl *)row)[i].d = rand_half(0.0001f, 0.001f, 1); break;
        case GGML_TYPE_IQ4_XS: ((block_iq4_xs *)row)[i].d = rand_half(0.00001f, 0.0001f, 1); break;
        case GGML_TYPE_MXFP4: ((block_mxfp4 *)row)[i].e = (uint8_t)(112 + rng_u64() % 16); break; /* 2^-16..2^-1 */
        default: fail_msg("random_bytes_row: type %d", type);
        }
    }
}

/* Σ|a_i b_i| and Σ a_i b_i in double. */
static void dot_stats(const float *a, const float *b, int64_t n, double *dot, double *abs_sum) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d += (double)a[i] * b[i];
        s += fabs((double)a[i] * b[i]);
    }
    *dot = d;
    *abs_sum = s;
}

/* ---- fp16 / bf16 ------------------------------------------------------------------------ */

static void test_fp16_known_values(void **state) {
    (void)state;
    assert_int_equal(fp32_to_fp16(1.0f), 0x3C00);
    assert_int_equal(fp32_to_fp16(-2.0f), 0xC000);
    assert_int_equal(fp32_to_fp16(0.5f), 0x3800);
    assert_int_equal(fp32_to_fp16(0.0f), 0x0000);
    assert_int_equal(fp32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(fp32_to_fp16(65504.0f), 0x7BFF);               /* largest finite */
    assert_int_equal(fp32_to_fp16(65519.99f), 0x7BFF);              /* below the halfway point */
    assert_int_equal(fp32_to_fp16(65520.0f), 0x7C00);               /* tie → even → inf */
    assert_int_equal(fp32_to_fp16(1e6f), 0x7C00);
    assert_int_equal(fp32_to_fp16(-1e6f), 0xFC00);
    assert_int_equal(fp32_to_fp16(INFINITY), 0x7C00);
    assert_int_equal(fp32_to_fp16(-INFINITY), 0xFC00);
    uint16_t nan = fp32_to_fp16(NAN);
    assert_int_equal(nan & 0x7C00, 0x7C00);
    assert_true((nan & 0x03FF) != 0);
    assert_int_equal(fp32_to_fp16(u32_as_f32(0x7F800001u)) & 0x7E00, 0x7E00); /* sNaN → quiet NaN */
    assert_int_equal(fp32_to_fp16(0x1p-14f), 0x0400);               /* smallest normal */
    assert_int_equal(fp32_to_fp16(0x1p-24f), 0x0001);               /* smallest subnormal */
    assert_int_equal(fp32_to_fp16(1023 * 0x1p-24f), 0x03FF);        /* largest subnormal */
    assert_int_equal(fp32_to_fp16(0x1p-25f), 0x0000);               /* tie between 0 and 1 ulp → 0 */
    assert_int_equal(fp32_to_fp16(0x1.8p-25f), 0x0001);             /* above the tie */
    assert_int_equal(fp32_to_fp16(3 * 0x1p-25f), 0x0002);           /* 1.5 ulp: tie → even (2) */
    assert_int_equal(fp32_to_fp16(5 * 0x1p-25f), 0x0002);           /* 2.5 ulp: tie → even (2) */
    assert_int_equal(fp32_to_fp16(-0x1p-24f), 0x8001);
    assert_int_equal(fp32_to_fp16(1e-10f), 0x0000);
    assert_int_equal(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);        /* tie → even mantissa 0 */
    assert_int_equal(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);    /* tie → even mantissa 2 */
    assert_int_equal(fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01); /* just above the tie */
    assert_int_equal(fp32_to_fp16(2047 * 0x1p-25f), 0x0400);        /* subnormal rounding up into normal */
    assert_int_equal(fp32_to_fp16(1.0f / 3.0f), 0x3555);

    assert_true(fp16_to_fp32(0x3C00) == 1.0f);
    assert_true(fp16_to_fp32(0xC000) == -2.0f);
    assert_true(fp16_to_fp32(0x7BFF) == 65504.0f);
    assert_true(fp16_to_fp32(0x0001) == 0x1p-24f);
    assert_true(fp16_to_fp32(0x03FF) == 1023 * 0x1p-24f);
    assert_true(fp16_to_fp32(0x0400) == 0x1p-14f);
    assert_true(fp16_to_fp32(0x3555) == 0.333251953125f);
    assert_true(isinf(fp16_to_fp32(0x7C00)) && fp16_to_fp32(0x7C00) > 0);
    assert_true(isinf(fp16_to_fp32(0xFC00)) && fp16_to_fp32(0xFC00) < 0);
    assert_true(isnan(fp16_to_fp32(0x7E00)));
    assert_true(isnan(fp16_to_fp32(0x7C01)));
    float nz = fp16_to_fp32(0x8000);
    assert_true(nz == 0.0f && signbit(nz));
}

static void test_fp16_exhaustive_roundtrip(void **state) {
    (void)state;
    /* every non-NaN half survives half → float → half exactly */
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;
        float f = fp16_to_fp32((uint16_t)h);
        if (fp32_to_fp16(f) != h) fail_msg("half 0x%04x → %g → 0x%04x", h, (double)f, fp32_to_fp16(f));
    }
#if defined(__F16C__)
    /* against the hardware converter (round to nearest even) on random bit patterns */
    rng_seed(11);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rng_u64();
        if (i & 1) u = (u & 0x8FFFFFFFu) | 0x30000000u; /* concentrate on the half range */
        float f = u32_as_f32(u);
        uint16_t hw = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
        uint16_t sw = fp32_to_fp16(f);
        if (hw != sw) fail_msg("fp32_to_fp16(0x%08x) = 0x%04x, F16C says 0x%04x", u, sw, hw);
        float hf = _cvtsh_ss(sw), sf = fp16_to_fp32(sw);
        if (f32_as_u32(hf) != f32_as_u32(sf)) fail_msg("fp16_to_fp32(0x%04x)", sw);
    }
#endif
    /* the row helpers agree with the scalar conversions */
    float x[37];
    uint16_t h[37];
    float back[37];
    for (int i = 0; i < 37; i++) x[i] = rng_gauss() * 100.0f;
    quant_fp32_to_fp16_row(x, h, 37);
    quant_fp16_to_fp32_row(h, back, 37);
    for (int i = 0; i < 37; i++) {
        assert_int_equal(h[i], fp32_to_fp16(x[i]));
        assert_true(back[i] == fp16_to_fp32(h[i]));
    }
}

static void test_bf16_known_values(void **state) {
    (void)state;
    assert_int_equal(fp32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(fp32_to_bf16(-2.0f), 0xC000);
    assert_int_equal(fp32_to_bf16(3.140625f), 0x4049);
    assert_int_equal(fp32_to_bf16(u32_as_f32(0x3F808000u)), 0x3F80); /* tie → even */
    assert_int_equal(fp32_to_bf16(u32_as_f32(0x3F818000u)), 0x3F82); /* tie → even */
    assert_int_equal(fp32_to_bf16(u32_as_f32(0x3F808001u)), 0x3F81); /* above tie */
    assert_int_equal(fp32_to_bf16(u32_as_f32(0x3F807FFFu)), 0x3F80); /* below tie */
    assert_int_equal(fp32_to_bf16(INFINITY), 0x7F80);
    assert_int_equal(fp32_to_bf16(-INFINITY), 0xFF80);
    assert_int_equal(fp32_to_bf16(u32_as_f32(0x7F7FFFFFu)), 0x7F80); /* FLT_MAX rounds to inf */
    assert_int_equal(fp32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(fp32_to_bf16(u32_as_f32(0x00010000u)), 0x0001); /* subnormal kept */
    assert_int_equal(fp32_to_bf16(NAN) & 0x7FC0, 0x7FC0);
    uint16_t snan = fp32_to_bf16(u32_as_f32(0x7F800001u));           /* would round to inf: kept NaN */
    assert_true(isnan(bf16_to_fp32(snan)));
    assert_int_equal(snan, 0x7FC0);
    assert_true(isnan(bf16_to_fp32(fp32_to_bf16(u32_as_f32(0xFFFFFFFFu)))));
    assert_true(bf16_to_fp32(0x3F80) == 1.0f);
    assert_true(bf16_to_fp32(0x4049) == 3.140625f);
    assert_true(bf16_to_fp32(0xC000) == -2.0f);
    assert_true(isinf(bf16_to_fp32(0x7F80)));

    /* SIMD row conversion (quant_quantize_row BF16) matches the scalar, NaN and ties included */
    float x[67];
    for (int i = 0; i < 67; i++) x[i] = u32_as_f32((uint32_t)rng_u64());
    x[3] = NAN; x[4] = u32_as_f32(0x3F818000u); x[5] = u32_as_f32(0xFF800001u); x[6] = -INFINITY;
    x[7] = u32_as_f32(0x3F808000u); x[8] = u32_as_f32(0xBF808000u); x[9] = u32_as_f32(0x00018000u);
    uint16_t a[67], b[67];
    quant_quantize_row(GGML_TYPE_BF16, x, a, 67);
    quant_quantize_row_ref(GGML_TYPE_BF16, x, b, 67);
    for (int i = 0; i < 67; i++) {
        assert_int_equal(a[i], fp32_to_bf16(x[i]));
        assert_int_equal(b[i], fp32_to_bf16(x[i]));
    }
}

/* ---- traits ------------------------------------------------------------------------------- */

static void test_traits(void **state) {
    (void)state;
    assert_null(quant_traits_of(-1));
    assert_null(quant_traits_of(4));
    assert_null(quant_traits_of(5));
    assert_null(quant_traits_of(GGML_TYPE_COUNT));
    assert_null(quant_traits_of(1000));
    static const struct { int type; const char *name; int64_t bs; size_t ts; int sup; int vdt; } want[] = {
        {GGML_TYPE_F32, "F32", 1, 4, 1, GGML_TYPE_F32},
        {GGML_TYPE_F16, "F16", 1, 2, 1, GGML_TYPE_F16},
        {GGML_TYPE_BF16, "BF16", 1, 2, 1, GGML_TYPE_BF16},
        {GGML_TYPE_Q4_0, "Q4_0", 32, 18, 1, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q4_1, "Q4_1", 32, 20, 1, GGML_TYPE_Q8_1},
        {GGML_TYPE_Q5_0, "Q5_0", 32, 22, 1, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q5_1, "Q5_1", 32, 24, 1, GGML_TYPE_Q8_1},
        {GGML_TYPE_Q8_0, "Q8_0", 32, 34, 1, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q8_1, "Q8_1", 32, 36, 0, GGML_TYPE_Q8_1},
        {GGML_TYPE_Q2_K, "Q2_K", 256, 84, 1, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q3_K, "Q3_K", 256, 110, 1, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q4_K, "Q4_K", 256, 144, 1, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q5_K, "Q5_K", 256, 176, 1, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q6_K, "Q6_K", 256, 210, 1, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q8_K, "Q8_K", 256, 292, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ2_XXS, "IQ2_XXS", 256, 66, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ2_XS, "IQ2_XS", 256, 74, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ3_XXS, "IQ3_XXS", 256, 98, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ1_S, "IQ1_S", 256, 50, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ4_NL, "IQ4_NL", 32, 18, 1, GGML_TYPE_Q8_0},
        {GGML_TYPE_IQ3_S, "IQ3_S", 256, 110, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ2_S, "IQ2_S", 256, 82, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ4_XS, "IQ4_XS", 256, 136, 1, GGML_TYPE_Q8_K},
        {GGML_TYPE_I8, "I8", 1, 1, 0, -1},
        {GGML_TYPE_I16, "I16", 1, 2, 0, -1},
        {GGML_TYPE_I32, "I32", 1, 4, 0, -1},
        {GGML_TYPE_I64, "I64", 1, 8, 0, -1},
        {GGML_TYPE_F64, "F64", 1, 8, 0, -1},
        {GGML_TYPE_IQ1_M, "IQ1_M", 256, 56, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_TQ1_0, "TQ1_0", 256, 54, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_TQ2_0, "TQ2_0", 256, 66, 0, GGML_TYPE_Q8_K},
        {GGML_TYPE_MXFP4, "MXFP4", 32, 17, 1, GGML_TYPE_Q8_0},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const quant_traits *t = quant_traits_of(want[i].type);
        assert_non_null(t);
        assert_string_equal(t->name, want[i].name);
        assert_int_equal(t->block_size, want[i].bs);
        assert_int_equal(t->type_size, want[i].ts);
        assert_int_equal(t->supported, want[i].sup);
        assert_int_equal(t->vec_dot_type, want[i].vdt);
    }
    assert_int_equal(quant_row_size(GGML_TYPE_Q4_K, 4096), 16 * 144);
    assert_int_equal(quant_row_size(GGML_TYPE_Q8_0, 4096), 128 * 34);
    assert_int_equal(quant_row_size(GGML_TYPE_F16, 7), 14);
    assert_int_equal(quant_row_size(GGML_TYPE_Q4_K, 100), 0);  /* not a multiple of 256 */
    assert_int_equal(quant_row_size(GGML_TYPE_Q4_0, -32), 0);
    assert_int_equal(quant_row_size(4, 32), 0);
    for (int i = 0; i < N_SUPPORTED; i++) {
        assert_true(quant_can_quantize(SUPPORTED[i]));
        assert_true(quant_can_dequantize(SUPPORTED[i]));
    }
    assert_false(quant_can_dequantize(GGML_TYPE_IQ2_XXS));
}

/* ---- hand-built blocks ------------------------------------------------------------------
 * Each block is assembled byte by byte from the GGML layout; expected values are computed
 * here by hand from the format definition, and both the reference and the dispatching
 * dequantizer must produce them. Elements not set explicitly are checked against their
 * closed-form value where it is simple (zero quants). */

static void deq_both(int type, const void *blk, float *out, int64_t n) {
    float tmp[256];
    quant_dequantize_row_ref(type, blk, out, n);
    quant_dequantize_row(type, blk, tmp, n);
    for (int64_t i = 0; i < n; i++)
        if (f32_as_u32(tmp[i]) != f32_as_u32(out[i]))
            fail_msg("%s element %lld: dispatch %g vs ref %g", tname(type), (long long)i, (double)tmp[i], (double)out[i]);
}

/* IQ4_NL: the nibble indexes GGML's non-linear grid (kvalues_iq4nl), low nibbles elements 0..15,
 * high ones 16..31; IQ4_XS: 6-bit sub-block scales split over scales_l (low 4 bits) and scales_h
 * (high 2), biased by 32, each times the super-block d. */
static void test_block_iq4(void **state) {
    (void)state;
    block_iq4_nl b;
    memset(&b, 0, sizeof b);
    b.d = 0x3800;   /* 0.5 */
    b.qs[0] = 0xF0; /* element 0: index 0 (-127), element 16: index 15 (113) */
    b.qs[3] = 0x78; /* element 3: index 8 (1), element 19: index 7 (-10) */
    float y[256];
    deq_both(GGML_TYPE_IQ4_NL, &b, y, 32);
    assert_float_equal(y[0], -127 * 0.5, 0);
    assert_float_equal(y[16], 113 * 0.5, 0);
    assert_float_equal(y[3], 1 * 0.5, 0);
    assert_float_equal(y[19], -10 * 0.5, 0);
    assert_float_equal(y[1], -127 * 0.5, 0);
    block_iq4_xs x;
    memset(&x, 0, sizeof x);
    x.d = 0x3c00;                 /* 1.0 */
    x.scales_l[0] = 0x21;         /* sub-block 0: low bits 1, sub-block 1: low bits 2 */
    x.scales_l[3] = 0xf0;         /* sub-block 7: low bits 15 */
    x.scales_h = 0x2 | (0x3 << 14); /* sub-block 0: high bits 2 (ls 33), 7: high bits 3 (ls 63) */
    x.qs[0] = 0x0f;               /* element 0: index 15 */
    x.qs[16] = 0x0f;              /* element 32 (sub-block 1, ls 2): index 15 */
    x.qs[16 * 7 + 15] = 0x80;     /* element 224 + 31: index 8 */
    deq_both(GGML_TYPE_IQ4_XS, &x, y, 256);
    assert_float_equal(y[0], (33 - 32) * 113.0, 0);
    assert_float_equal(y[32], (2 - 32) * 113.0, 0);
    assert_float_equal(y[224 + 31], (63 - 32) * 1.0, 0);
    assert_float_equal(y[224], (63 - 32) * -127.0, 0);
}

/* MXFP4 (OCP MX spec v1.0): E8M0 scale 2^(e-127), E2M1 codes ±{0, .5, 1, 1.5, 2, 3, 4, 6} with the
 * sign in bit 3, low nibbles elements 0..15, high ones 16..31; values worked out by hand. */
static void test_block_mxfp4(void **state) {
    (void)state;
    uint8_t raw[17 * 2] = {0};
    raw[0] = 127;    /* scale 1 */
    raw[1] = 0x97;   /* element 0: code 7 = 6.0, element 16: code 9 = -0.5 */
    raw[2] = 0x81;   /* element 1: code 1 = 0.5, element 17: code 8 = -0 */
    raw[16] = 0x4b;  /* element 15: code 11 = -1.5, element 31: code 4 = 2.0 */
    raw[17] = 130;   /* block 1: scale 8 */
    raw[18] = 0xf3;  /* element 32: 1.5·8 = 12, element 48: -6·8 = -48 */
    raw[33] = 0x0e;  /* element 47: -4·8 = -32 */
    float y[64];
    deq_both(GGML_TYPE_MXFP4, raw, y, 64);
    assert_float_equal(y[0], 6.0, 0);
    assert_float_equal(y[16], -0.5, 0);
    assert_float_equal(y[1], 0.5, 0);
    assert_float_equal(y[17], 0.0, 0);
    assert_float_equal(y[15], -1.5, 0);
    assert_float_equal(y[31], 2.0, 0);
    assert_float_equal(y[5], 0.0, 0);
    assert_float_equal(y[32], 12.0, 0);
    assert_float_equal(y[48], -48.0, 0);
    assert_float_equal(y[47], -32.0, 0);
    /* the E8M0 extremes: e = 0 is 2^-127 (a float subnormal), 254 is 2^127 */
    memset(raw, 0, sizeof raw);
    raw[0] = 0;
    raw[1] = 0x02;   /* code 2 = 1.0 */
    raw[17] = 254;
    raw[18] = 0x02;
    deq_both(GGML_TYPE_MXFP4, raw, y, 64);
    assert_true(y[0] == ldexpf(1.0f, -127));
    assert_true(y[32] == ldexpf(1.0f, 127));
    /* the quantizer: shared exponent floor(log2 amax) - 2, nearest E2M1 value, ties to even,
     * saturation at 6 */
    float x[32] = {0};
    x[0] = 7.0f;     /* amax: exponent 2 - 2 = 0, scale 1; 7 saturates to 6 */
    x[1] = 0.25f;    /* tie between 0 and 0.5: even (0) */
    x[2] = 0.75f;    /* tie between 0.5 and 1: even (1.0) */
    x[3] = -2.5f;    /* tie between 2 and 3: even (2) */
    x[4] = 5.0f;     /* tie between 4 and 6: even (4) */
    x[5] = -1.2f;    /* nearest: 1.0 */
    x[6] = 3.4f;     /* nearest: 3.0 */
    x[16] = -0.3f;   /* nearest: 0.5 */
    block_mxfp4 q;
    quant_quantize_row_ref(GGML_TYPE_MXFP4, x, &q, 32);
    assert_int_equal(q.e, 127);
    static const float want[32] = {6.0f, 0.0f, 1.0f, -2.0f, 4.0f, -1.0f, 3.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, -0.5f};
    deq_both(GGML_TYPE_MXFP4, &q, y, 32);
    for (int i = 0; i < 32; i++)
        if (y[i] != want[i]) fail_msg("MXFP4 quantized element %d: %g, expected %g", i, (double)y[i], (double)want[i]);
    for (int i = 0; i < 32; i++) x[i] = 0.0f;
    quant_quantize_row_ref(GGML_TYPE_MXFP4, x, &q, 32);
    assert_int_equal(q.e, 0);
    deq_both(GGML_TYPE_MXFP4, &q, y, 32);
    for (int i = 0; i < 32; i++) assert_float_equal(y[i], 0.0, 0);
}

static void test_block_q4_0(void **state) {
    (void)state;
    block_q4_0 b;
    memset(&b, 0, sizeof b);
    b.d = 0x3800;      /* 0.5 */
    b.qs[0] = 0x1F;    /* element 0: 15, element 16: 1 */
    b.qs[5] = 0x80;    /* element 5: 0, element 21: 8 */
    float y[32];
    deq_both(GGML_TYPE_Q4_0, &b, y, 32);
    assert_float_equal(y[0], (15 - 8) * 0.5, 0);
    assert_float_equal(y[16], (1 - 8) * 0.5, 0);
    assert_float_equal(y[5], (0 - 8) * 0.5, 0);
    assert_float_equal(y[21], (8 - 8) * 0.5, 0);
    assert_float_equal(y[1], -4.0, 0); /* quant 0 → -8·d */
}

static void test_block_q4_1(void **state) {
    (void)state;
    block_q4_1 b;
    memset(&b, 0, sizeof b);
    b.d = 0x3400;      /* 0.25 */
    b.m = 0xBC00;      /* -1.0 */
    b.qs[3] = 0xA2;    /* element 3: 2, element 19: 10 */
    float y[32];
    deq_both(GGML_TYPE_Q4_1, &b, y, 32);
    assert_float_equal(y[3], 2 * 0.25 - 1.0, 0);
    assert_float_equal(y[19], 10 * 0.25 - 1.0, 0);
    assert_float_equal(y[0], -1.0, 0);
}

static void test_block_q5_0(void **state) {
    (void)state;
    block_q5_0 b;
    memset(&b, 0, sizeof b);
    b.d = 0x3C00;      /* 1.0 */
    b.qh[0] = 0x01;    /* bit 0: element 0 */
    b.qh[2] = 0x01;    /* bit 16: element 16 */
    b.qh[3] = 0x80;    /* bit 31: element 31 */
    b.qs[0] = 0x3F;    /* element 0 low 4 = 15, element 16 low 4 = 3 */
    b.qs[15] = 0xF0;   /* element 15 low 4 = 0, element 31 low 4 = 15 */
    float y[32];
    deq_both(GGML_TYPE_Q5_0, &b, y, 32);
    assert_float_equal(y[0], (15 + 16) - 16, 0);
    assert_float_equal(y[16], (3 + 16) - 16, 0);
    assert_float_equal(y[15], 0 - 16, 0);
    assert_float_equal(y[31], (15 + 16) - 16, 0);
}

static void test_block_q5_1(void **state) {
    (void)state;
    block_q5_1 b;
    memset(&b, 0, sizeof b);
    b.d = 0x3800;      /* 0.5 */
    b.m = 0x4000;      /* 2.0 */
    b.qh[0] = 0x02;    /* bit 1: element 1 */
    b.qs[1] = 0x21;    /* element 1 low = 1, element 17 = 2 */
    float y[32];
    deq_both(GGML_TYPE_Q5_1, &b, y, 32);
    assert_float_equal(y[1], (1 + 16) * 0.5 + 2.0, 0);
    assert_float_equal(y[17], 2 * 0.5 + 2.0, 0);
    assert_float_equal(y[2], 2.0, 0);
}

static void test_block_q8_0(void **state) {
    (void)state;
    block_q8_0 b;
    memset(&b, 0, sizeof b);
    b.d = 0x3000;      /* 0.125 */
    b.qs[7] = -100;
    b.qs[31] = 127;
    b.qs[0] = -128;
    float y[32];
    deq_both(GGML_TYPE_Q8_0, &b, y, 32);
    assert_float_equal(y[7], -12.5, 0);
    assert_float_equal(y[31], 15.875, 0);
    assert_float_equal(y[0], -16.0, 0);
}

static void test_block_q2_K(void **state) {
    (void)state;
    block_q2_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3C00;      /* 1.0 */
    b.dmin = 0x3800;   /* 0.5 */
    b.scales[0] = 0x32;  /* sub-block 0 (elements 0..15): scale 2, min 3 */
    b.scales[5] = 0x17;  /* sub-block 5 (80..95): scale 7, min 1 */
    b.scales[9] = 0xF4;  /* sub-block 9 (144..159): scale 4, min 15 */
    b.qs[0] = 0x01;      /* element 0 (half 0, shift 0, l 0) = 1 */
    b.qs[20] = 0x30;     /* element 84 (half 0, shift 4, l 20) = 3 */
    b.qs[32 + 17] = 0x02; /* element 145 (half 1, shift 0, l 17) = 2 */
    float y[256];
    deq_both(GGML_TYPE_Q2_K, &b, y, 256);
    assert_float_equal(y[0], 1.0 * 2 * 1 - 0.5 * 3, 0);
    assert_float_equal(y[1], -0.5 * 3, 0);
    assert_float_equal(y[84], 1.0 * 7 * 3 - 0.5 * 1, 0);
    assert_float_equal(y[145], 1.0 * 4 * 2 - 0.5 * 15, 0);
    assert_float_equal(y[20], 0.0, 0); /* sub-block 1: scale 0, min 0 */
}

static void test_block_q3_K(void **state) {
    (void)state;
    block_q3_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3800; /* 0.5 */
    /* 6-bit scales (biased by 32): j=0 → 40 (+8), j=6 → 19 (-13), j=10 → 63 (+31), j=13 → 5 (-27),
     * others 0 (-32).
     * low nibbles: j<8 in scales[j] low, j>=8 in scales[j-8] high; top 2 bits: scales[8 + j%4]
     * at bit 2·(j/4). */
    b.scales[0] = 0x08;        /* j=0 low 8 */
    b.scales[8] |= 0x02;       /* j=0 high 2 (40 = 0b10'1000) */
    b.scales[2] = 0xF0;        /* j=10 low 15 */
    b.scales[10] |= 0x03 << 4; /* j=10 high 3 */
    b.scales[5] = 0x50;        /* j=13 low 5, high 0 */
    b.scales[6] = 0x03;        /* j=6 → 19 (-13): low 3 ... */
    b.scales[10] |= 0x01 << 2; /* ... high 1 at bits 2-3 of scales[8 + 6%4] */
    /* element 3 (j=0): low bits 3 in qs[3], hmask[3] bit 0 set → 3 */
    b.qs[3] = 0x03; b.hmask[3] = 0x01;
    /* element 5 (j=0): low bits 2, hmask clear → 2 - 4 = -2 */
    b.qs[5] = 0x02;
    /* element 210 (j=13; half 1, shift 2, l 18): qs[50] bits 4-5 = 1, hmask[18] bit 6 set → 1 */
    b.qs[50] = 0x10; b.hmask[18] = 0x40;
    /* element 161 (j=10; half 1, shift 1, l 1): qs[33] bits 2-3 = 3, hmask[1] bit 5 clear → -1 */
    b.qs[33] = 0x0C;
    /* element 100 (j=6; half 0, shift 3, l 4): qs[4] bits 6-7 = 2, hmask[4] bit 3 set → 2 */
    b.qs[4] = 0x80; b.hmask[4] = 0x08;
    float y[256];
    deq_both(GGML_TYPE_Q3_K, &b, y, 256);
    assert_float_equal(y[3], 0.5 * 8 * 3, 0);
    assert_float_equal(y[5], 0.5 * 8 * -2, 0);
    assert_float_equal(y[210], 0.5 * -27 * 1, 0);
    assert_float_equal(y[161], 0.5 * 31 * -1, 0);
    assert_float_equal(y[100], 0.5 * -13 * 2, 0);
    assert_float_equal(y[40], 0.5 * -32 * -4, 0); /* all-zero bits: scale -32, quant -4 */
    assert_float_equal(y[0], 0.5 * 8 * -4, 0);
}

/* Q4_K and Q5_K share this scale block: sc[0]=10 m[0]=4, sc[5]=45 m[5]=50, sc[7]=63 m[7]=1.
 * j<4: s[j] = sc[j] | (sc[j+4] >> 4) << 6, s[j+4] = m[j] | (m[j+4] >> 4) << 6;
 * s[j+8] = (sc[j+4] & 15) | (m[j+4] & 15) << 4. */
static void fill_k4_scales(uint8_t s[12]) {
    memset(s, 0, 12);
    s[0] = 10;
    s[4] = 4;
    s[1] = (45 >> 4) << 6;               /* 0x80 */
    s[5] = (50 >> 4) << 6;               /* 0xC0 */
    s[9] = (45 & 15) | ((50 & 15) << 4); /* 0x2D */
    s[3] = (63 >> 4) << 6;               /* 0xC0 */
    s[7] = 0;
    s[11] = (63 & 15) | ((1 & 15) << 4); /* 0x1F */
}

static void test_block_q4_K(void **state) {
    (void)state;
    block_q4_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3800;    /* 0.5 */
    b.dmin = 0x3400; /* 0.25 */
    fill_k4_scales(b.scales);
    assert_int_equal(b.scales[1], 0x80);
    assert_int_equal(b.scales[9], 0x2D);
    b.qs[2] = 0x07;   /* element 2 (sub-block 0, low nibble of qs[2]) = 7 */
    b.qs[74] = 0xC0;  /* element 170 (chunk 2, high nibble of qs[64+10]) = 12 */
    b.qs[127] = 0xF0; /* element 255 (chunk 3, high nibble of qs[96+31]) = 15 */
    float y[256];
    deq_both(GGML_TYPE_Q4_K, &b, y, 256);
    assert_float_equal(y[2], 0.5 * 10 * 7 - 0.25 * 4, 0);
    assert_float_equal(y[170], 0.5 * 45 * 12 - 0.25 * 50, 0);
    assert_float_equal(y[255], 0.5 * 63 * 15 - 0.25 * 1, 0);
    assert_float_equal(y[160], -0.25 * 50, 0);
    assert_float_equal(y[192], 0.0, 0); /* sub-block 6 all zero */
    assert_float_equal(y[10], -0.25 * 4, 0);
}

static void test_block_q5_K(void **state) {
    (void)state;
    block_q5_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3800;
    b.dmin = 0x3400;
    fill_k4_scales(b.scales);
    b.qs[2] = 0x07;  b.qh[2] = 0x01;   /* element 2: 7 + 16 (qh bit 0 = chunk 0 low) */
    b.qs[74] = 0xC0; b.qh[10] = 0x20;  /* element 170: 12 + 16 (qh bit 5 = chunk 2 high) */
    b.qs[127] = 0xF0; b.qh[31] = 0x80; /* element 255: 15 + 16 (qh bit 7 = chunk 3 high) */
    b.qs[96] = 0x0F;                   /* element 192: 15, no 5th bit (sub-block 6: scale 0) */
    float y[256];
    deq_both(GGML_TYPE_Q5_K, &b, y, 256);
    assert_float_equal(y[2], 0.5 * 10 * 23 - 0.25 * 4, 0);
    assert_float_equal(y[170], 0.5 * 45 * 28 - 0.25 * 50, 0);
    assert_float_equal(y[255], 0.5 * 63 * 31 - 0.25 * 1, 0);
    assert_float_equal(y[34], 0.0, 0);  /* sub-block 1: scale 0, min 0 */
    assert_float_equal(y[192], 0.0, 0); /* scale 0 times 15 */
    assert_float_equal(y[160], -0.25 * 50, 0);
}

static void test_block_q6_K(void **state) {
    (void)state;
    block_q6_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3400; /* 0.25 */
    b.scales[0] = 3;
    b.scales[6] = 2;
    b.scales[9] = -7;
    b.scales[15] = 127;
    /* element 1 (half 0, k 0, l 1): ql[1] low = 5, qh[1] bits 0-1 = 2 → 5 + 32 - 32 = 5 */
    b.ql[1] = 0x05; b.qh[1] = 0x02;
    /* element 100 (half 0, k 3, l 4): ql[36] high = 9, qh[4] bits 6-7 = 1 → 25 - 32 = -7 */
    b.ql[36] = 0x90; b.qh[4] = 0x40;
    /* element 40 (half 0, k 1, l 8): ql[40] low = 12, qh[8] bits 2-3 = 1 → 28 - 32 = -4 */
    b.scales[2] = 5;
    b.ql[40] = 0x0C; b.qh[8] = 0x04;
    /* element 70 (half 0, k 2, l 6): ql[6] high = 3, qh[6] bits 4-5 = 2 → 35 - 32 = 3 */
    b.scales[4] = -1;
    b.ql[6] = 0x30; b.qh[6] = 0x20;
    /* element 150 (half 1, k 0, l 22): ql[86] low = 10, qh[54] bits 0-1 = 0 → -22 */
    b.ql[86] = 0x0A;
    /* element 255 (half 1, k 3, l 31): ql[127] high = 15, qh[63] bits 6-7 = 3 → 63 - 32 = 31 */
    b.ql[127] = 0xF0; b.qh[63] = 0xC0;
    float y[256];
    deq_both(GGML_TYPE_Q6_K, &b, y, 256);
    assert_float_equal(y[1], 0.25 * 3 * 5, 0);
    assert_float_equal(y[100], 0.25 * 2 * -7, 0);
    assert_float_equal(y[150], 0.25 * -7 * -22, 0);
    assert_float_equal(y[40], 0.25 * 5 * -4, 0);
    assert_float_equal(y[70], 0.25 * -1 * 3, 0);
    assert_float_equal(y[255], 0.25 * 127 * 31, 0);
    assert_float_equal(y[0], 0.25 * 3 * -32, 0);
}

static void test_block_q8_K(void **state) {
    (void)state;
    block_q8_K b;
    memset(&b, 0, sizeof b);
    b.d = 0.5f;
    b.qs[10] = -3;
    b.qs[255] = 127;
    float y[256];
    deq_both(GGML_TYPE_Q8_K, &b, y, 256);
    assert_float_equal(y[10], -1.5, 0);
    assert_float_equal(y[255], 63.5, 0);
}

/* ---- activation quantizers --------------------------------------------------------------- */

static void fill_activation(float *x, int64_t n, int variant) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss() * (variant == 1 ? 1e-3f : 3.0f);
    if (variant == 2) /* outliers of both signs with equal magnitude, and zeros */
        for (int64_t i = 0; i < n; i += 7) x[i] = (i % 3 == 0) ? 0.0f : (i % 3 == 1 ? 40.0f : -40.0f);
    if (variant == 3) /* block maximum 127 → id = 1 exactly, so x = k + 0.5 are exact ties */
        for (int64_t i = 0; i < n; i++) x[i] = (i % 32 == 0) ? 127.0f : (float)((int)(i % 200) - 100) + 0.5f;
}

static void test_quantize_q8_0(void **state) {
    (void)state;
    rng_seed(21);
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    block_q8_0 *a = malloc(quant_row_size(GGML_TYPE_Q8_0, N)), *b = malloc(quant_row_size(GGML_TYPE_Q8_0, N));
    for (int variant = 0; variant < 4; variant++) {
        fill_activation(x, N, variant);
        quant_quantize_row(GGML_TYPE_Q8_0, x, a, N);
        quant_quantize_row_ref(GGML_TYPE_Q8_0, x, b, N);
        assert_memory_equal(a, b, quant_row_size(GGML_TYPE_Q8_0, N)); /* SIMD == scalar, bit exact */
        quant_dequantize_row(GGML_TYPE_Q8_0, a, y, N);
        for (int blk = 0; blk < N / 32; blk++) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * blk + j]));
            float d = fp16_to_fp32(a[blk].d);
            assert_int_equal(a[blk].d, fp32_to_fp16(amax / 127.0f));
            /* |x - q·d| <= amax/254 (rounding) + 127·|amax/127 - fp16(amax/127)| (scale storage) */
            float bound = amax / 254.0f + 127.0f * fabsf(amax / 127.0f - d) + 1e-6f * amax;
            for (int j = 0; j < 32; j++) {
                float err = fabsf(x[32 * blk + j] - y[32 * blk + j]);
                if (err > bound) fail_msg("Q8_0 block %d elt %d: err %g > %g", blk, j, (double)err, (double)bound);
            }
        }
    }
    /* ties round half to even (x·127/amax exactly k + 0.5 when amax = 127) */
    fill_activation(x, 32, 3);
    quant_quantize_row(GGML_TYPE_Q8_0, x, a, 32);
    assert_int_equal(a[0].qs[0], 127);
    assert_int_equal(a[0].qs[1], -98);  /* x = -98.5 → -98 (even) */
    assert_int_equal(a[0].qs[2], -98);  /* x = -97.5 → -98 (even) */
    assert_int_equal(a[0].qs[4], -96);  /* x = -95.5 → -96 (even) */
    assert_int_equal(a[0].qs[5], -94);  /* x = -94.5 → -94 (even) */
    free(x); free(y); free(a); free(b);
}

static void test_quantize_q8_1(void **state) {
    (void)state;
    rng_seed(22);
    enum { N = 1024 };
    float x[N], y[N];
    block_q8_1 q[N / 32];
    block_q8_1 r[N / 32];
    for (int variant = 0; variant < 4; variant++) { /* SIMD == scalar, bit exact */
        fill_activation(x, N, variant);
        quant_quantize_row(GGML_TYPE_Q8_1, x, q, N);
        quant_quantize_row_ref(GGML_TYPE_Q8_1, x, r, N);
        assert_memory_equal(q, r, sizeof(q));
    }
    fill_activation(x, N, 0);
    quant_quantize_row(GGML_TYPE_Q8_1, x, q, N);
    quant_dequantize_row(GGML_TYPE_Q8_1, q, y, N);
    for (int blk = 0; blk < N / 32; blk++) {
        float amax = 0;
        int sum = 0;
        for (int j = 0; j < 32; j++) { amax = fmaxf(amax, fabsf(x[32 * blk + j])); sum += q[blk].qs[j]; }
        float d = fp16_to_fp32(q[blk].d);
        assert_int_equal(q[blk].s, fp32_to_fp16(amax / 127.0f * (float)sum));
        float bound = amax / 254.0f + 127.0f * fabsf(amax / 127.0f - d) + 1e-6f * amax;
        for (int j = 0; j < 32; j++) assert_true(fabsf(x[32 * blk + j] - y[32 * blk + j]) <= bound);
    }
}

static void test_quantize_q8_K(void **state) {
    (void)state;
    rng_seed(23);
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    size_t rs = quant_row_size(GGML_TYPE_Q8_K, N);
    block_q8_K *a = malloc(rs), *b = malloc(rs);
    for (int variant = 0; variant < 4; variant++) {
        fill_activation(x, N, variant);
        if (variant == 2) { /* magnitude ties between + and -: the first one sets the sign */
            x[0] = 50.0f; x[7] = -50.0f;
            x[256 + 3] = -60.0f; x[256 + 9] = 60.0f;
        }
        quant_quantize_row(GGML_TYPE_Q8_K, x, a, N);
        quant_quantize_row_ref(GGML_TYPE_Q8_K, x, b, N);
        assert_memory_equal(a, b, rs);
        quant_dequantize_row(GGML_TYPE_Q8_K, a, y, N);
        for (int blk = 0; blk < N / 256; blk++) {
            float amax = 0, max = 0;
            for (int j = 0; j < 256; j++)
                if (fabsf(x[256 * blk + j]) > amax) { amax = fabsf(x[256 * blk + j]); max = x[256 * blk + j]; }
            /* d = 1/(-127/max): negative when the largest magnitude is positive */
            assert_float_equal(a[blk].d, 1.0f / (-127.0f / max), 0);
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int l = 0; l < 16; l++) s += a[blk].qs[16 * j + l];
                assert_int_equal(a[blk].bsums[j], s);
            }
            float bound = amax / 254.0f * (1.0f + 1e-5f);
            for (int j = 0; j < 256; j++) {
                float err = fabsf(x[256 * blk + j] - y[256 * blk + j]);
                if (err > bound) fail_msg("Q8_K block %d elt %d: err %g > %g", blk, j, (double)err, (double)bound);
            }
        }
        if (variant == 2) {
            assert_int_equal(a[0].qs[0], -127);  /* +50 first → max = +50 → maps to -127 */
            assert_int_equal(a[0].qs[7], 127);
            assert_int_equal(a[1].qs[3], -127);  /* -60 first → max = -60 → maps to -127 */
            assert_int_equal(a[1].qs[9], 127);
        }
    }
    /* all-zero block: d = 0, quants 0 */
    memset(x, 0, 256 * sizeof(float));
    quant_quantize_row(GGML_TYPE_Q8_K, x, a, 256);
    assert_float_equal(a[0].d, 0.0, 0);
    for (int j = 0; j < 256; j++) assert_int_equal(a[0].qs[j], 0);
    free(x); free(y); free(a); free(b);
}

/* ---- weight quantizers: round-trip error ------------------------------------------------ */

static void test_roundtrip_weights(void **state) {
    (void)state;
    rng_seed(31);
    enum { N = 256 * 64 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    void *q = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = rng_gauss() * 0.02f;
    /* RMS error / RMS value on Gaussian data (measured ~: F16 2e-4, BF16 1.7e-3, Q8_0 5.3e-3,
     * Q6_K 0.017, Q5_K 0.037, Q5_1 0.038, Q5_0 0.043, Q4_K 0.073, Q4_1 0.078, Q4_0 0.086,
     * Q3_K 0.146, Q2_K 0.273); bounds leave ~25% margin and sit far below the ~1.4 of a wrong layout */
    static const struct { int type; double max_rel_rms; } bounds[] = {
        {GGML_TYPE_F32, 0.0}, {GGML_TYPE_F16, 3e-4}, {GGML_TYPE_BF16, 2.2e-3}, {GGML_TYPE_Q8_0, 7e-3},
        {GGML_TYPE_Q8_1, 7e-3}, {GGML_TYPE_Q8_K, 9e-3}, {GGML_TYPE_Q6_K, 0.022}, {GGML_TYPE_Q5_K, 0.046},
        {GGML_TYPE_Q5_1, 0.048}, {GGML_TYPE_Q5_0, 0.054}, {GGML_TYPE_Q4_K, 0.092}, {GGML_TYPE_Q4_1, 0.098},
        {GGML_TYPE_Q4_0, 0.108}, {GGML_TYPE_Q3_K, 0.18}, {GGML_TYPE_Q2_K, 0.34}, {GGML_TYPE_IQ4_NL, 0.11},
        {GGML_TYPE_IQ4_XS, 0.12}, {GGML_TYPE_MXFP4, MXFP4_RMS},
    };
    for (size_t t = 0; t < sizeof(bounds) / sizeof(bounds[0]); t++) {
        int type = bounds[t].type;
        quant_quantize_row(type, x, q, N);
        quant_dequantize_row(type, q, y, N);
        double e = 0, s = 0;
        for (int i = 0; i < N; i++) { e += (double)(x[i] - y[i]) * (x[i] - y[i]); s += (double)x[i] * x[i]; }
        double rel = sqrt(e / s);
        if (rel > bounds[t].max_rel_rms) fail_msg("%s: relative RMS error %g > %g", tname(type), rel, bounds[t].max_rel_rms);
        /* the ref quantizer writes the same bytes (the weight encoders have no SIMD twin, Q8/F16
         * ones are checked bit exact elsewhere) */
        void *q2 = malloc(N * sizeof(float));
        quant_quantize_row_ref(type, x, q2, N);
        assert_memory_equal(q, q2, quant_row_size(type, N));
        free(q2);
    }
    /* Q4_0 per element: |x - x̂| <= |d| (the clamp of +8 to 7 costs one step at most) */
    quant_quantize_row(GGML_TYPE_Q4_0, x, q, N);
    quant_dequantize_row(GGML_TYPE_Q4_0, q, y, N);
    for (int blk = 0; blk < N / 32; blk++) {
        float d = fabsf(fp16_to_fp32(((block_q4_0 *)q)[blk].d));
        for (int j = 0; j < 32; j++) assert_true(fabsf(x[32 * blk + j] - y[32 * blk + j]) <= d * 1.001f);
    }
    /* a constant block and an all-zero block decode exactly enough */
    for (int i = 0; i < 256; i++) x[i] = 0.0f;
    for (int i = 256; i < 512; i++) x[i] = 0.75f;
    for (size_t t = 0; t < sizeof(bounds) / sizeof(bounds[0]); t++) {
        int type = bounds[t].type;
        quant_quantize_row(type, x, q, 512);
        quant_dequantize_row(type, q, y, 512);
        for (int i = 0; i < 256; i++) assert_float_equal(y[i], 0.0, 0);
        for (int i = 256; i < 512; i++)
            if (fabsf(y[i] - 0.75f) > 0.75f * 0.02f) fail_msg("%s constant block: %g", tname(type), (double)y[i]);
    }
    free(x); free(y); free(q);
}

/* ---- dot products ------------------------------------------------------------------------ */

/* w_row (type) · x: SIMD vs scalar reference, and both vs Σ dequant(w)·dequant(x). */
static void check_dot(int type, int64_t n, const void *w, const void *xq, const float *wd, const float *xd,
                      double extra_tol) {
    double dot, abs_sum;
    dot_stats(wd, xd, n, &dot, &abs_sum);
    float simd = quant_vec_dot(type, n, w, xq);
    float ref = quant_vec_dot_ref(type, n, w, xq);
    double tol = 1e-5 * abs_sum + 1e-30;
    if (!(fabs((double)simd - ref) <= tol))
        fail_msg("%s n=%lld: SIMD %.9g vs scalar %.9g (tol %.3g)", tname(type), (long long)n, (double)simd,
                 (double)ref, tol);
    if (!(fabs((double)ref - dot) <= tol + extra_tol))
        fail_msg("%s n=%lld: vec_dot %.9g vs dequantized dot %.9g (tol %.3g)", tname(type), (long long)n,
                 (double)ref, dot, tol + extra_tol);
}

/* The Q4_1/Q5_1 · Q8_1 product uses the stored s = fp16(d·Σq), dequantization d·q: allow
 * for that fp16 rounding of each block's s. */
static double q8_1_s_tolerance(int type, const void *w, const block_q8_1 *x, int64_t n) {
    double t = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        float m = type == GGML_TYPE_Q4_1 ? fp16_to_fp32(((const block_q4_1 *)w)[b].m)
                                         : fp16_to_fp32(((const block_q5_1 *)w)[b].m);
        t += fabs(m) * (fabs(fp16_to_fp32(x[b].s)) * 0x1p-10 + 1e-7);
    }
    return t;
}

static void test_vec_dot_simd_vs_ref(void **state) {
    (void)state;
    rng_seed(41);
    static const int64_t lens[] = {32, 64, 96, 256, 512, 768, 1024, 2048, 4096, 4096 + 256};
    enum { NMAX = 4096 + 256 };
    float *x = malloc(NMAX * sizeof(float)), *wd = malloc(NMAX * sizeof(float)), *xd = malloc(NMAX * sizeof(float));
    float *wf = malloc(NMAX * sizeof(float));
    void *w = malloc(NMAX * sizeof(float) + 64), *xq = malloc(NMAX * sizeof(float) + 64);
    for (int t = 0; t < N_SUPPORTED; t++) {
        int type = SUPPORTED[t];
        const quant_traits *tr = quant_traits_of(type);
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            int64_t n = lens[li];
            if (n % tr->block_size) continue;
            for (int variant = 0; variant < 3; variant++) {
                fill_activation(x, n, variant == 2 ? 2 : 0);
                if (variant == 0) {
                    random_bytes_row(type, w, n);
                } else {
                    for (int64_t i = 0; i < n; i++) wf[i] = rng_gauss() * 0.05f;
                    quant_quantize_row(type, wf, w, n);
                }
                quant_quantize_row(tr->vec_dot_type, x, xq, n);
                quant_dequantize_row(type, w, wd, n);
                quant_dequantize_row(tr->vec_dot_type, xq, xd, n);
                double extra = (tr->vec_dot_type == GGML_TYPE_Q8_1) ? q8_1_s_tolerance(type, w, xq, n) : 0.0;
                check_dot(type, n, w, xq, wd, xd, extra);
            }
        }
        /* odd lengths for the float types (tails of the SIMD loops) */
        if (tr->block_size == 1) {
            for (int64_t n = 1; n < 70; n += 3) {
                random_bytes_row(type, w, n);
                fill_activation(x, n, 0);
                quant_quantize_row(tr->vec_dot_type, x, xq, n);
                quant_dequantize_row(type, w, wd, n);
                quant_dequantize_row(tr->vec_dot_type, xq, xd, n);
                check_dot(type, n, w, xq, wd, xd, 0.0);
            }
        }
    }
    free(x); free(wd); free(xd); free(wf); free(w); free(xq);
}

/* quant_vec_dot_rows: every row equals the per-row scalar reference, for row counts around the
 * 8-row kernels' group size, a padded row stride and a length with a partial 32-block chunk. */
static void test_vec_dot_rows(void **state) {
    (void)state;
    rng_seed(45);
    enum { NMAX = 1024 + 32 * 5, RMAX = 19 };
    static const int64_t lens[] = {256, 1024 + 32 * 5};
    float *x = malloc(NMAX * sizeof(float)), *wd = malloc(NMAX * sizeof(float)), *xd = malloc(NMAX * sizeof(float));
    void *xq = malloc(NMAX * sizeof(float) + 64);
    float out[RMAX];
    for (int t = 0; t < N_SUPPORTED; t++) {
        int type = SUPPORTED[t];
        const quant_traits *tr = quant_traits_of(type);
        for (size_t li = 0; li < 2; li++) {
            int64_t n = lens[li];
            if (n % tr->block_size) continue;
            size_t stride = quant_row_size(type, n) + 8; /* rows need not be packed */
            uint8_t *w = malloc(stride * RMAX);
            for (int r = 0; r < RMAX; r++) random_bytes_row(type, w + (size_t)r * stride, n);
            fill_activation(x, n, 0);
            quant_quantize_row(tr->vec_dot_type, x, xq, n);
            quant_dequantize_row(tr->vec_dot_type, xq, xd, n);
            static const int counts[] = {1, 7, 8, 9, 16, 19};
            for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
                int nrows = counts[ci];
                for (int r = 0; r < RMAX; r++) out[r] = -12345.0f;
                quant_vec_dot_rows(type, n, nrows, w, stride, xq, out);
                for (int r = 0; r < RMAX; r++) {
                    if (r >= nrows) { assert_true(out[r] == -12345.0f); continue; } /* no write past nrows */
                    const void *wr = w + (size_t)r * stride;
                    quant_dequantize_row(type, wr, wd, n);
                    double dot, abs_sum;
                    dot_stats(wd, xd, n, &dot, &abs_sum);
                    float ref = quant_vec_dot_ref(type, n, wr, xq);
                    if (!(fabs((double)out[r] - ref) <= 1e-5 * abs_sum + 1e-30))
                        fail_msg("%s rows n=%lld nrows=%d row %d: %.9g vs scalar %.9g", tname(type), (long long)n,
                                 nrows, r, (double)out[r], (double)ref);
                }
            }
            free(w);
        }
    }
    float o[2];
    uint8_t blk[512] = {0};
    quant_vec_dot_rows(GGML_TYPE_IQ2_XXS, 256, 2, blk, 66, blk, o);
    assert_true(isnan(o[0]) && isnan(o[1]));
    free(x); free(wd); free(xd); free(xq);
}

/* Largest quants against the largest activations: pattern bit 0 sets every quant bit (the
 * maximum unsigned value) or clears it (the most negative value), bit 1 picks the scale extreme
 * where the format has a signed one; the rest of the row is random (random_bytes_row). */
static void extreme_row(int type, uint8_t *w, int64_t n, int pattern) {
    const quant_traits *tr = quant_traits_of(type);
    random_bytes_row(type, w, n);
    int64_t nb = n / tr->block_size;
    uint8_t fillb = (pattern & 1) ? 0xFF : 0x00;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * tr->type_size;
        switch (type) {
        case GGML_TYPE_Q8_0: memset(((block_q8_0 *)blk)->qs, (pattern & 1) ? 0x80 : 0x7F, 32); break;
        case GGML_TYPE_MXFP4: memset(((block_mxfp4 *)blk)->qs, (pattern & 1) ? 0xFF : 0x77, 16); break; /* ∓6 */
        case GGML_TYPE_Q4_0: memset(((block_q4_0 *)blk)->qs, fillb, 16); break;
        case GGML_TYPE_Q4_1: memset(((block_q4_1 *)blk)->qs, fillb, 16); break;
        case GGML_TYPE_Q5_0: memset(((block_q5_0 *)blk)->qs, fillb, 16); memset(((block_q5_0 *)blk)->qh, fillb, 4); break;
        case GGML_TYPE_Q5_1: memset(((block_q5_1 *)blk)->qs, fillb, 16); memset(((block_q5_1 *)blk)->qh, fillb, 4); break;
        case GGML_TYPE_Q2_K: memset(((block_q2_K *)blk)->qs, fillb, 64); memset(((block_q2_K *)blk)->scales, 0xFF, 16); break;
        case GGML_TYPE_Q3_K:
            memset(((block_q3_K *)blk)->qs, fillb, 64);
            memset(((block_q3_K *)blk)->hmask, fillb, 32);
            memset(((block_q3_K *)blk)->scales, pattern & 2 ? 0x00 : 0xFF, 12);
            break;
        case GGML_TYPE_Q4_K: memset(((block_q4_K *)blk)->qs, fillb, 128); memset(((block_q4_K *)blk)->scales, 0xFF, 12); break;
        case GGML_TYPE_Q5_K:
            memset(((block_q5_K *)blk)->qs, fillb, 128);
            memset(((block_q5_K *)blk)->qh, fillb, 32);
            memset(((block_q5_K *)blk)->scales, 0xFF, 12);
            break;
        case GGML_TYPE_Q6_K:
            memset(((block_q6_K *)blk)->ql, fillb, 128);
            memset(((block_q6_K *)blk)->qh, fillb, 64);
            memset(((block_q6_K *)blk)->scales, pattern & 2 ? 0x80 : 0x7F, 16); /* -128 / 127 */
            break;
        default: break;
        }
    }
}

/* The integer paths of the dot products must not saturate. */
static void test_vec_dot_extremes(void **state) {
    (void)state;
    enum { N = 1024 };
    float *x = malloc(N * sizeof(float)), *wd = malloc(N * sizeof(float)), *xd = malloc(N * sizeof(float));
    uint8_t *w = malloc(N * 4), *xq = malloc(N * 4);
    for (int t = 0; t < N_SUPPORTED; t++) {
        int type = SUPPORTED[t];
        const quant_traits *tr = quant_traits_of(type);
        if (tr->block_size == 1) continue;
        for (int pattern = 0; pattern < 4; pattern++) {
            rng_seed(50 + pattern);
            extreme_row(type, w, N, pattern);
            /* activations all at ±amax, so every quant is ±127 */
            for (int i = 0; i < N; i++) x[i] = (pattern & 2) ? -1.0f : 1.0f;
            quant_quantize_row(tr->vec_dot_type, x, xq, N);
            quant_dequantize_row(type, w, wd, N);
            quant_dequantize_row(tr->vec_dot_type, xq, xd, N);
            double extra = (tr->vec_dot_type == GGML_TYPE_Q8_1) ? q8_1_s_tolerance(type, w, (const block_q8_1 *)xq, N) : 0.0;
            check_dot(type, N, w, xq, wd, xd, extra);
        }
    }
    free(x); free(wd); free(xd); free(w); free(xq);
}

/* Q4_0 weights · Q8_0 activations vs the float dot of the unquantized vectors: the difference
 * is the quantization error, estimated here from the per-element error bounds. */
static void test_q4_0_dot_vs_f32(void **state) {
    (void)state;
    rng_seed(61);
    enum { N = 4096 };
    float *w = malloc(N * 4), *x = malloc(N * 4), *wd = malloc(N * 4), *xd = malloc(N * 4);
    block_q4_0 *wq = malloc(quant_row_size(GGML_TYPE_Q4_0, N));
    block_q8_0 *xq = malloc(quant_row_size(GGML_TYPE_Q8_0, N));
    for (int i = 0; i < N; i++) {
        w[i] = rng_gauss();
        x[i] = w[i] + 0.5f * rng_gauss(); /* correlated: the dot is ~N, far from noise */
    }
    quant_quantize_row(GGML_TYPE_Q4_0, w, wq, N);
    quant_quantize_row(GGML_TYPE_Q8_0, x, xq, N);
    quant_dequantize_row(GGML_TYPE_Q4_0, wq, wd, N);
    quant_dequantize_row(GGML_TYPE_Q8_0, xq, xd, N);
    double exact = 0, var_w = 0, var_x = 0;
    for (int i = 0; i < N; i++) {
        exact += (double)w[i] * x[i];
        int b = i / 32;
        double dw = fabs(fp16_to_fp32(wq[b].d)), dx = fabs(fp16_to_fp32(xq[b].d));
        var_w += (double)x[i] * x[i] * dw * dw / 12.0;   /* uniform rounding error of w */
        var_x += (double)wd[i] * wd[i] * dx * dx / 12.0; /* and of x */
    }
    float got = quant_vec_dot(GGML_TYPE_Q4_0, N, wq, xq);
    double sigma = sqrt(var_w + var_x);
    /* the two roundings are independent and zero-mean: 6 sigma */
    if (fabs(got - exact) > 6 * sigma)
        fail_msg("Q4_0·Q8_0 = %g, f32 dot = %g, |diff| > 6σ = %g", (double)got, exact, 6 * sigma);
    assert_true(exact > 0.5 * N); /* the test means something: dot ≈ N, sigma ≈ 5 */
    assert_true(sigma < 0.01 * exact);
    /* against the dequantized weights with the f32 activations: only x's rounding left,
     * bounded per element by amax/254 plus the fp16 scale storage */
    double dq = 0, bound = 0;
    for (int i = 0; i < N; i++) {
        dq += (double)wd[i] * x[i];
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[(i / 32) * 32 + j]));
        bound += fabs(wd[i]) * (amax / 254.0 + 127.0 * fabs(amax / 127.0 - fp16_to_fp32(xq[i / 32].d)));
    }
    assert_true(fabs(got - dq) <= bound + 1e-5 * fabs(dq));
    assert_true(fabs(got - dq) <= 6 * sqrt(var_x) + 1e-4 * fabs(dq));
    free(w); free(x); free(wd); free(xd); free(wq); free(xq);
}

static void test_unsupported_types(void **state) {
    (void)state;
    uint8_t blk[256] = {0};
    float y[256];
    quant_dequantize_row(GGML_TYPE_IQ2_XXS, blk, y, 256);
    assert_true(isnan(y[0]) && isnan(y[255]));
    assert_true(isnan(quant_vec_dot(GGML_TYPE_IQ2_XXS, 256, blk, blk)));
    assert_true(isnan(quant_vec_dot(GGML_TYPE_Q8_K, 256, blk, blk)));
    assert_true(isnan(quant_vec_dot(4, 32, blk, blk)));
    assert_true(isnan(quant_vec_dot(GGML_TYPE_Q4_K, 100, blk, blk))); /* not a block multiple */
    memset(blk, 0xAB, sizeof blk);
    float x[256] = {0};
    quant_quantize_row(GGML_TYPE_IQ2_XXS, x, blk, 256); /* untouched */
    assert_int_equal(blk[0], 0xAB);
    assert_int_equal(blk[135], 0xAB);
}

/* ---- real GGUF data ---------------------------------------------------------------------
 * The syn-llama files hold one model in several types, the quantized ones written by
 * llama.cpp's quantizer: every tensor dequantized here must match the F32 original with the
 * quantization error expected of its type (a wrong layout gives a relative RMS error ~1.4). */

static gguf_file *open_model(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s", tu_shared(), name);
    gguf_file *f = NULL;
    kv_error err = {0};
    if (gguf_open(path, &f, &err) != KV_OK) {
        print_message("cannot open %s: %s\n", path, err.msg);
        return NULL;
    }
    return f;
}

static double type_rms_bound(int type) {
    switch (type) {
    case GGML_TYPE_F16: return 4e-4;   /* measured 2.1e-4 */
    case GGML_TYPE_BF16: return 2.5e-3; /* 1.66e-3 */
    case GGML_TYPE_Q8_0: return 8e-3;  /* 5.3e-3 */
    case GGML_TYPE_Q6_K: return 0.025; /* 0.0177 */
    case GGML_TYPE_Q5_K: return 0.05;  /* 0.036 */
    case GGML_TYPE_Q5_0: return 0.06;  /* ~0.043 */
    case GGML_TYPE_Q4_K: return 0.095; /* 0.0715 */
    case GGML_TYPE_Q4_0: return 0.11;  /* 0.086 */
    default: return 0.35;
    }
}

static void check_model_against_f32(const char *ref_name, const char *name, int *n_checked) {
    gguf_file *ref = open_model(ref_name), *g = open_model(name);
    if (!ref || !g) {
        gguf_close(ref);
        gguf_close(g);
        skip();
    }
    rng_seed(71);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        const gguf_tensor *r = gguf_find_tensor(ref, t->name);
        assert_non_null(r);
        assert_int_equal(r->type, GGML_TYPE_F32);
        assert_int_equal(r->n_elements, t->n_elements);
        if (t->type == GGML_TYPE_F32) continue;
        const quant_traits *tr = quant_traits_of(t->type);
        assert_non_null(tr);
        assert_true(tr->supported);
        int64_t ne0 = t->ne[0], rows = t->n_elements / ne0;
        size_t rb = quant_row_size(t->type, ne0);
        assert_int_equal(rb * (size_t)rows, t->nbytes);
        float *d = malloc((size_t)ne0 * sizeof(float)), *x = malloc((size_t)ne0 * sizeof(float));
        float *xd = malloc((size_t)ne0 * sizeof(float));
        void *xq = malloc((size_t)ne0 * sizeof(float));
        const float *orig = r->data;
        double e = 0, s = 0;
        float max_q8_err_ratio = 0;
        for (int64_t row = 0; row < rows; row++) {
            const uint8_t *wrow = (const uint8_t *)t->data + (size_t)row * rb;
            quant_dequantize_row(t->type, wrow, d, ne0);
            const float *o = orig + row * ne0;
            for (int64_t k = 0; k < ne0; k++) {
                e += (double)(d[k] - o[k]) * (d[k] - o[k]);
                s += (double)o[k] * o[k];
            }
            if (t->type == GGML_TYPE_Q8_0) /* llama.cpp: q = round(x/d), |err| <= d/2 + fp16(d) slop */
                for (int64_t k = 0; k < ne0; k++) {
                    float dd = fabsf(fp16_to_fp32(((const block_q8_0 *)wrow)[k / 32].d));
                    if (dd > 0) max_q8_err_ratio = fmaxf(max_q8_err_ratio, fabsf(d[k] - o[k]) / dd);
                }
            if (row < 8) { /* the dot kernels on llama.cpp-written rows */
                for (int64_t k = 0; k < ne0; k++) x[k] = rng_gauss();
                quant_quantize_row(tr->vec_dot_type, x, xq, ne0);
                quant_dequantize_row(tr->vec_dot_type, xq, xd, ne0);
                double extra = tr->vec_dot_type == GGML_TYPE_Q8_1 ? q8_1_s_tolerance(t->type, wrow, xq, ne0) : 0;
                check_dot(t->type, ne0, wrow, xq, d, xd, extra);
            }
        }
        double rel = sqrt(e / s);
        if (rel > type_rms_bound(t->type))
            fail_msg("%s %s (%s): relative RMS error vs F32 %g > %g", name, t->name, tr->name, rel,
                     type_rms_bound(t->type));
        if (t->type == GGML_TYPE_Q8_0 && max_q8_err_ratio > 0.5f + 127 * 0x1p-11f + 1e-3f)
            fail_msg("%s %s: Q8_0 element error %g·d", name, t->name, (double)max_q8_err_ratio);
        (*n_checked)++;
        free(d); free(x); free(xd); free(xq);
    }
    gguf_close(ref);
    gguf_close(g);
}

static void test_real_gguf_llama(void **state) {
    (void)state;
    static const char *files[] = {"syn-llama-f16.gguf", "syn-llama-bf16.gguf", "syn-llama-q8_0.gguf",
                                  "syn-llama-q4_0.gguf", "syn-llama-q4_k_m.gguf", "syn-llama-q5_k_m.gguf",
                                  "syn-llama-q6_k.gguf"};
    int n = 0;
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) check_model_against_f32("syn-llama-f32.gguf", files[i], &n);
    assert_true(n >= 7 * 16);
}

static void test_real_gguf_qwen2(void **state) {
    (void)state;
    /* rows of 128: llama.cpp falls back to Q5_0 / Q8_0 for some tensors, so Q5_0 gets real data */
    int n = 0;
    check_model_against_f32("syn-qwen2-f32.gguf", "syn-qwen2-q4_k_m.gguf", &n);
    check_model_against_f32("syn-qwen2-f32.gguf", "syn-qwen2-q8_0.gguf", &n);
    check_model_against_f32("syn-qwen2-f32.gguf", "syn-qwen2-f16.gguf", &n);
    assert_true(n > 0);
}

/* ---- matrix kernels on prepared activations (engine/quant_gemm.c) ------------------------- */

/* Reference for row r of a matmul: the scalar vec_dot on the vec_dot_type activation. */
static float ref_row(int type, int64_t n, const void *w_row, const float *x) {
    const quant_traits *tr = quant_traits_of(type);
    void *xq = malloc((size_t)n * 4 + 1024);
    if (tr->vec_dot_type == GGML_TYPE_F32) memcpy(xq, x, (size_t)n * 4);
    else quant_quantize_row_ref(tr->vec_dot_type, x, xq, n);
    float r = quant_vec_dot_ref(type, n, w_row, xq);
    free(xq);
    return r;
}

static double abs_dot(int type, int64_t n, const void *w_row, const float *x) {
    float *wd = malloc((size_t)n * sizeof(float));
    quant_dequantize_row(type, w_row, wd, n);
    double a = 0;
    for (int64_t i = 0; i < n; i++) a += fabs((double)wd[i] * x[i]);
    free(wd);
    return a;
}

/* The Q4_0 / Q5_0 / Q8_0 kernels promise the reference's float order with the scale fused:
 * acc = fma(d_w·d_x, Σ_block q_w·q_x, acc) block by block. This is that, in plain C. */
static float fused_row_q8blk(int type, int64_t n, const void *w_row, const float *x) {
    int64_t nb = n / 32;
    block_q8_0 *xq = malloc(sizeof(block_q8_0) * (size_t)nb);
    quant_quantize_row_ref(GGML_TYPE_Q8_0, x, xq, n);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
        float dw;
        if (type == GGML_TYPE_Q4_0) {
            const block_q4_0 *w = (const block_q4_0 *)w_row + b;
            for (int j = 0; j < 16; j++)
                isum += ((w->qs[j] & 0x0f) - 8) * xq[b].qs[j] + ((w->qs[j] >> 4) - 8) * xq[b].qs[j + 16];
            dw = fp16_to_fp32(w->d);
        } else if (type == GGML_TYPE_Q5_0) {
            const block_q5_0 *w = (const block_q5_0 *)w_row + b;
            uint32_t qh;
            memcpy(&qh, w->qh, 4);
            for (int j = 0; j < 16; j++)
                isum += (((w->qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4)) - 16) * xq[b].qs[j] +
                        (((w->qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4)) - 16) * xq[b].qs[j + 16];
            dw = fp16_to_fp32(w->d);
        } else {
            const block_q8_0 *w = (const block_q8_0 *)w_row + b;
            for (int j = 0; j < 32; j++) isum += w->qs[j] * xq[b].qs[j];
            dw = fp16_to_fp32(w->d);
        }
        float d = dw * fp16_to_fp32(xq[b].d);
        acc = fmaf(d, (float)isum, acc);
    }
    free(xq);
    return acc;
}

/* The Q4_K panel kernel sums a super-block exactly in integers, then scales it in a fixed float
 * order: v = fma(d_w, Σ_j sc_j·Σ q_w·q_x, -(dmin_w · Σ_j m_j·Σ q_x)), acc = fma(d_x, v, acc)
 * super-block after super-block. This is that, in plain C, from the GGUF layout (the 6-bit
 * scales and mins: j < 4 in the low 6 bits of bytes j / j+4; j >= 4 low / high nibble of byte
 * j+4, top 2 bits from the top of bytes j-4 / j). (Q5_K's kernel promises the scalar reference
 * itself, quant_vec_dot_ref.) */
static float fused_row_q4_K(int64_t n, const void *w_row, const float *x) {
    int64_t nb = n / 256;
    block_q8_K *xq = malloc(sizeof(block_q8_K) * (size_t)nb);
    quant_quantize_row_ref(GGML_TYPE_Q8_K, x, xq, n);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const block_q4_K *blk = (const block_q4_K *)w_row + b;
        const uint8_t *sc = blk->scales;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int s6 = j < 4 ? sc[j] & 63 : (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
            int m6 = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
            int t = 0;
            for (int l = 0; l < 32; l++) {
                int c = j / 2, u = (j & 1) ? blk->qs[32 * c + l] >> 4 : blk->qs[32 * c + l] & 15;
                t += u * xq[b].qs[32 * j + l];
            }
            sumi += s6 * t;
            summ += m6 * (xq[b].bsums[2 * j] + xq[b].bsums[2 * j + 1]);
        }
        float v = fmaf(fp16_to_fp32(blk->d), (float)sumi, -(fp16_to_fp32(blk->dmin) * (float)summ));
        acc = fmaf(xq[b].d, v, acc);
    }
    free(xq);
    return acc;
}

/* The types with packed panels (engine/quant_gemm.c). */
static const int PACKED[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                             GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_MXFP4};
#define N_PACKED (sizeof(PACKED) / sizeof(PACKED[0]))

/* The value the panel kernels promise bit for bit for a row, or NAN where only the scalar
 * reference's rounding bound is promised. */
static float fused_row(int type, int64_t n, const void *w_row, const float *x) {
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: return fused_row_q8blk(type, n, w_row, x);
    case GGML_TYPE_Q4_K: return fused_row_q4_K(n, w_row, x);
    case GGML_TYPE_Q5_K: case GGML_TYPE_MXFP4: return ref_row(type, n, w_row, x); /* MXFP4: the reference order */
    default: return NAN;
    }
}

/* quant_gemv on GGUF rows, every supported type: each row equals the scalar reference to
 * rounding order; Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K bit for bit equal the order their panel kernel
 * promises (fused_row). Row counts around 16, lengths with a partial group of blocks, activations
 * with outliers. */
static void test_gemv_vs_ref(void **state) {
    (void)state;
    rng_seed(71);
    static const int64_t lens[] = {256, 32 * 7, 2048 + 32 * 3, 4864};
    static const int counts[] = {1, 5, 16, 17, 37};
    enum { RMAX = 37, NMAX = 4864 };
    float *x = malloc(NMAX * sizeof(float)), out[RMAX];
    for (int t = 0; t < N_SUPPORTED; t++) {
        int type = SUPPORTED[t];
        const quant_traits *tr = quant_traits_of(type);
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            int64_t n = lens[li];
            if (n % tr->block_size) continue;
            size_t rs = quant_row_size(type, n);
            uint8_t *w = malloc(rs * RMAX);
            for (int r = 0; r < RMAX; r++) random_bytes_row(type, w + (size_t)r * rs, n);
            fill_activation(x, n, (int)(li % 3));
            void *act = aligned_alloc(64, quant_act_row_size(type, n) + 64);
            assert_true(quant_act_row_size(type, n) % 64 == 0);
            quant_act_prepare(type, x, n, act);
            for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
                int nrows = counts[ci];
                for (int r = 0; r < RMAX; r++) out[r] = -12345.0f;
                quant_gemv(type, n, nrows, w, rs, act, out);
                for (int r = 0; r < RMAX; r++) {
                    const void *wr = w + (size_t)r * rs;
                    if (r >= nrows) { assert_true(out[r] == -12345.0f); continue; }
                    float ref = ref_row(type, n, wr, x);
                    double tol = 1e-5 * abs_dot(type, n, wr, x) + 1e-30;
                    if (!(fabs((double)out[r] - ref) <= tol))
                        fail_msg("%s gemv n=%lld nrows=%d row %d: %.9g vs scalar %.9g", tname(type), (long long)n,
                                 nrows, r, (double)out[r], (double)ref);
                    float fused = quant_pack_size(type, n, 16) ? fused_row(type, n, wr, x) : NAN;
                    if (!isnan(fused) && out[r] != fused)
                        fail_msg("%s gemv n=%lld row %d: %a is not the fused reference order %a", tname(type),
                                 (long long)n, r, (double)out[r], (double)fused);
                }
            }
            free(act);
            free(w);
        }
    }
    free(x);
}

/* Packed panels (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K): quant_gemm_packed for 1..11 tokens, whole and
 * partial panels, a row range starting at a later panel; every value within rounding of the scalar
 * reference, Q4_0 / Q5_0 / Q8_0 / Q4_K bit-equal to their fused order and Q5_K to the scalar
 * reference itself, and the same bits for 1 token as for a batch (decode and prefill agree). */
static void test_gemm_packed(void **state) {
    (void)state;
    rng_seed(73);
    static const int64_t lens[] = {256, 32 * 9, 1024 + 256, 4864};
    static const int toks[] = {1, 3, 8, 11};
    enum { ROWS = 37, TMAX = 11, NMAX = 4864 };
    float *x = malloc((size_t)NMAX * TMAX * sizeof(float));
    float *out = malloc(sizeof(float) * ROWS * TMAX), *one = malloc(sizeof(float) * ROWS);
    for (size_t ti = 0; ti < N_PACKED; ti++) {
        int type = PACKED[ti];
        const quant_traits *tr = quant_traits_of(type);
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            int64_t n = lens[li];
            if (n % tr->block_size) continue;
            size_t ps = quant_pack_size(type, n, ROWS);
            if (!ps) { print_message("%s: no packed layout at this kernel level\n", tname(type)); continue; }
            size_t rs = quant_row_size(type, n), as = quant_act_row_size(type, n);
            uint8_t *w = malloc(rs * ROWS);
            for (int r = 0; r < ROWS; r++) random_bytes_row(type, w + (size_t)r * rs, n);
            void *packed = aligned_alloc(64, (ps + 63) & ~(size_t)63);
            quant_pack(type, n, ROWS, w, rs, packed);
            uint8_t *act = aligned_alloc(64, as * TMAX);
            for (int t = 0; t < TMAX; t++) {
                fill_activation(x + (size_t)t * n, n, t % 3);
                quant_act_prepare(type, x + (size_t)t * n, n, act + (size_t)t * as);
            }
            for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++) {
                int T = toks[k];
                for (int row0 = 0; row0 <= 16; row0 += 16) {
                    int nrows = ROWS - row0;
                    quant_gemm_packed(type, n, row0, nrows, packed, act, as, T, out, (size_t)nrows);
                    for (int t = 0; t < T; t++) {
                        const float *xt = x + (size_t)t * n;
                        quant_gemm_packed(type, n, row0, nrows, packed, act + (size_t)t * as, as, 1, one, (size_t)nrows);
                        for (int r = 0; r < nrows; r++) {
                            const void *wr = w + (size_t)(row0 + r) * rs;
                            float v = out[(size_t)t * nrows + r], ref = ref_row(type, n, wr, xt);
                            double tol = 1e-5 * abs_dot(type, n, wr, xt) + 1e-30;
                            if (!(fabs((double)v - ref) <= tol))
                                fail_msg("%s packed n=%lld T=%d row %d tok %d: %.9g vs scalar %.9g", tname(type),
                                         (long long)n, T, row0 + r, t, (double)v, (double)ref);
                            if (v != one[r])
                                fail_msg("%s packed n=%lld row %d tok %d: batch of %d gives %a, one token %a",
                                         tname(type), (long long)n, row0 + r, t, T, (double)v, (double)one[r]);
                            float fused = fused_row(type, n, wr, xt);
                            if (!isnan(fused) && v != fused)
                                fail_msg("%s packed n=%lld row %d: %a is not the fused reference order %a",
                                         tname(type), (long long)n, row0 + r, (double)v, (double)fused);
                        }
                    }
                }
            }
            free(act);
            free(packed);
            free(w);
        }
    }
    free(x);
    free(out);
    free(one);
}

/* Packed panels on the largest quants, scales and mins against activations at ±amax (every
 * activation quant ±127), decode and a batch: no integer path may saturate or wrap. */
static void test_gemm_packed_extremes(void **state) {
    (void)state;
    enum { ROWS = 21, N = 4096, T = 5 };
    float *x = malloc(sizeof(float) * N * T), *out = malloc(sizeof(float) * ROWS * T), one[ROWS];
    for (size_t ti = 0; ti < N_PACKED; ti++) {
        int type = PACKED[ti];
        size_t rs = quant_row_size(type, N), as = quant_act_row_size(type, N), ps = quant_pack_size(type, N, ROWS);
        if (!ps) { print_message("%s: no packed layout at this kernel level\n", tname(type)); continue; }
        uint8_t *w = malloc(rs * ROWS), *act = aligned_alloc(64, as * T);
        void *packed = aligned_alloc(64, (ps + 63) & ~(size_t)63);
        for (int pattern = 0; pattern < 4; pattern++) {
            rng_seed(90 + pattern);
            for (int r = 0; r < ROWS; r++) extreme_row(type, w + (size_t)r * rs, N, pattern ^ (r & 1));
            quant_pack(type, N, ROWS, w, rs, packed);
            for (int t = 0; t < T; t++) {
                for (int i = 0; i < N; i++) x[(size_t)t * N + i] = ((pattern >> 1) ^ t) & 1 ? -1.0f : 1.0f;
                quant_act_prepare(type, x + (size_t)t * N, N, act + (size_t)t * as);
            }
            quant_gemm_packed(type, N, 0, ROWS, packed, act, as, T, out, ROWS);
            for (int t = 0; t < T; t++) {
                quant_gemm_packed(type, N, 0, ROWS, packed, act + (size_t)t * as, as, 1, one, ROWS);
                for (int r = 0; r < ROWS; r++) {
                    const void *wr = w + (size_t)r * rs;
                    const float *xt = x + (size_t)t * N;
                    float v = out[t * ROWS + r], ref = ref_row(type, N, wr, xt), fused = fused_row(type, N, wr, xt);
                    double tol = 1e-5 * abs_dot(type, N, wr, xt) + 1e-30;
                    if (!(fabs((double)v - ref) <= tol) || v != one[r] || (!isnan(fused) && v != fused))
                        fail_msg("%s extremes pattern %d row %d tok %d: batch %.9g, one token %.9g, scalar %.9g, fused %.9g",
                                 tname(type), pattern, r, t, (double)v, (double)one[r], (double)ref, (double)fused);
                }
            }
        }
        free(packed);
        free(act);
        free(w);
    }
    free(x);
    free(out);
}

/* quant_gemm for batches of GGUF rows: F32 / F16 (inner-product kernel, tails of rows and
 * tokens), types without panels, which fall back to per-token GEMV, and types with panels at this
 * level, whose rows are packed into scratch panels: the same bits as quant_gemm_packed (a model's
 * first pass reads the matrices not yet packed that way, engine/ops.c). */
static void test_gemm_rows(void **state) {
    (void)state;
    rng_seed(79);
    static const int types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q3_K, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                                GGML_TYPE_Q4_0, GGML_TYPE_MXFP4, GGML_TYPE_Q5_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                GGML_TYPE_Q6_K};
    static const int64_t lens[] = {256, 64 + 7 * 16, 2048 + 5, 1024 + 256};
    enum { ROWS = 11, TMAX = 13, NMAX = 2048 + 5 };
    float *x = malloc((size_t)NMAX * TMAX * sizeof(float)), *out = malloc(sizeof(float) * ROWS * TMAX);
    float *pout = malloc(sizeof(float) * ROWS * TMAX);
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        int type = types[ti];
        const quant_traits *tr = quant_traits_of(type);
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            int64_t n = lens[li];
            if (n % tr->block_size) continue;
            size_t rs = quant_row_size(type, n), as = quant_act_row_size(type, n);
            uint8_t *w = malloc(rs * ROWS);
            for (int r = 0; r < ROWS; r++) random_bytes_row(type, w + (size_t)r * rs, n);
            uint8_t *act = aligned_alloc(64, as * TMAX);
            for (int t = 0; t < TMAX; t++) {
                fill_activation(x + (size_t)t * n, n, 0);
                quant_act_prepare(type, x + (size_t)t * n, n, act + (size_t)t * as);
            }
            size_t ps = quant_pack_size(type, n, ROWS);
            uint8_t *packed = ps ? aligned_alloc(64, (ps + 63) & ~(size_t)63) : NULL;
            if (packed) quant_pack(type, n, ROWS, w, rs, packed);
            for (int T = 2; T <= TMAX; T += 5) {
                quant_gemm(type, n, ROWS, w, rs, act, as, T, out, ROWS);
                if (packed) {
                    quant_gemm_packed(type, n, 0, ROWS, packed, act, as, T, pout, ROWS);
                    for (int i = 0; i < T * ROWS; i++)
                        if (out[i] != pout[i])
                            fail_msg("%s gemm n=%lld T=%d row %d tok %d: %a on GGUF rows, %a packed", tname(type),
                                     (long long)n, T, i % ROWS, i / ROWS, (double)out[i], (double)pout[i]);
                }
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < ROWS; r++) {
                        const void *wr = w + (size_t)r * rs;
                        const float *xt = x + (size_t)t * n;
                        float v = out[t * ROWS + r], ref = ref_row(type, n, wr, xt);
                        double tol = 1e-5 * abs_dot(type, n, wr, xt) + 1e-30;
                        /* MXFP4: every level (i8mm's SMMLA GEMM, the x86 panels) keeps the reference's order */
                        if (!(fabs((double)v - ref) <= tol) || (type == GGML_TYPE_MXFP4 && v != ref))
                            fail_msg("%s gemm n=%lld T=%d row %d tok %d: %.9g vs scalar %.9g", tname(type),
                                     (long long)n, T, r, t, (double)v, (double)ref);
                    }
            }
            free(packed);
            free(act);
            free(w);
        }
    }
    free(x);
    free(out);
    free(pout);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_known_values),
        cmocka_unit_test(test_fp16_exhaustive_roundtrip),
        cmocka_unit_test(test_bf16_known_values),
        cmocka_unit_test(test_traits),
        cmocka_unit_test(test_block_q4_0),
        cmocka_unit_test(test_block_iq4),
        cmocka_unit_test(test_block_mxfp4),
        cmocka_unit_test(test_block_q4_1),
        cmocka_unit_test(test_block_q5_0),
        cmocka_unit_test(test_block_q5_1),
        cmocka_unit_test(test_block_q8_0),
        cmocka_unit_test(test_block_q2_K),
        cmocka_unit_test(test_block_q3_K),
        cmocka_unit_test(test_block_q4_K),
        cmocka_unit_test(test_block_q5_K),
        cmocka_unit_test(test_block_q6_K),
        cmocka_unit_test(test_block_q8_K),
        cmocka_unit_test(test_quantize_q8_0),
        cmocka_unit_test(test_quantize_q8_1),
        cmocka_unit_test(test_quantize_q8_K),
        cmocka_unit_test(test_roundtrip_weights),
        cmocka_unit_test(test_vec_dot_simd_vs_ref),
        cmocka_unit_test(test_vec_dot_rows),
        cmocka_unit_test(test_vec_dot_extremes),
        cmocka_unit_test(test_q4_0_dot_vs_f32),
        cmocka_unit_test(test_gemv_vs_ref),
        cmocka_unit_test(test_gemm_packed),
        cmocka_unit_test(test_gemm_packed_extremes),
        cmocka_unit_test(test_gemm_rows),
        cmocka_unit_test(test_unsupported_types),
        cmocka_unit_test(test_real_gguf_llama),
        cmocka_unit_test(test_real_gguf_qwen2),
    };
    return tu_run_every_isa("quant", tests, sizeof tests / sizeof *tests, NULL, NULL);
}
