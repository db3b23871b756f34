/* test_kernels: the matmul group of every x86 kernel level below AVX-512 (AVX2, AVX-VNNI) against the scalar reference, entry by entry, and against the AVX-512 level's bits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/gemm_float.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/quant.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state = 1;
static void rng_seed(uint64_t s) { rng_state = s ? s : 1; }
static uint64_t rng_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_unit(void) { return (double)(rng_u64() >> 11) * 0x1p-53; }
static float rng_gauss(void) {
    double u = rng_unit() + 1e-300, v = rng_unit();
    return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}
static uint16_t rand_half(float lo, float hi, int allow_neg) {
    float v = lo + (hi - lo) * (float)rng_unit();
    if (allow_neg && (rng_u64() & 1)) v = -v;
    return fp32_to_fp16(v);
}
static const char *tname(int type) { return quant_traits_of(type)->name; }

/* Offsets of the half-float scale fields of a block (d, and dmin/m; -1 when absent). */
typedef struct { int d, m; } half_fields;
static half_fields fields_of(int type) {
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: return (half_fields){0, -1};
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: return (half_fields){0, 2};
    case GGML_TYPE_Q2_K: return (half_fields){offsetof(block_q2_K, d), offsetof(block_q2_K, dmin)};
    case GGML_TYPE_Q3_K: return (half_fields){offsetof(block_q3_K, d), -1};
    case GGML_TYPE_Q6_K: return (half_fields){offsetof(block_q6_K, d), -1};
    default: return (half_fields){-1, -1};
    }
}

/* A row of random bytes (every quant, scale and min pattern) with finite half-float scales;
 * pattern 1: the largest quants (all bits set, Q8_0 −128 / 127 alternating by row) and scales. */
static void weight_row(int type, uint8_t *row, int64_t n, int extreme, int r) {
    const quant_traits *tr = quant_traits_of(type);
    size_t bytes = quant_row_size(type, n);
    for (size_t i = 0; i < bytes; i++) row[i] = (uint8_t)rng_u64();
    int64_t nb = n / tr->block_size;
    for (int64_t i = 0; i < nb; i++) {
        switch (type) {
        case GGML_TYPE_F32: { float f = rng_gauss(); memcpy(row + 4 * i, &f, 4); continue; }
        case GGML_TYPE_F16: { uint16_t h = fp32_to_fp16(rng_gauss()); memcpy(row + 2 * i, &h, 2); continue; }
        case GGML_TYPE_BF16: { uint16_t h = fp32_to_bf16(rng_gauss()); memcpy(row + 2 * i, &h, 2); continue; }
        default: break;
        }
        uint8_t *blk = row + (size_t)i * tr->type_size;
        if (type == GGML_TYPE_MXFP4) { /* E8M0 scales 2^-28..2^11, every 9th block a subnormal (e 0, 1) */
            if (extreme) memset(blk + 1, r & 1 ? 0x77 : 0xff, 16); /* codes ±12 */
            blk[0] = (uint8_t)(extreme ? 120 : i % 9 == 4 ? (int)(i & 1) : 100 + (int)(rng_u64() % 40));
            continue;
        }
        if (extreme) {
            if (type == GGML_TYPE_Q8_0) memset(blk + 2, r & 1 ? 0x80 : 0x7f, 32);
            else memset(blk, 0xff, tr->type_size);
            if (type == GGML_TYPE_Q6_K) memset(blk + offsetof(block_q6_K, scales), r & 2 ? 0x80 : 0x7f, 16);
        }
        half_fields f = fields_of(type);
        int small = tr->block_size == 256;
        uint16_t d = rand_half(small ? 0.0001f : 0.001f, small ? 0.01f : 0.1f, type != GGML_TYPE_Q4_K && type != GGML_TYPE_Q5_K && type != GGML_TYPE_Q2_K);
        memcpy(blk + f.d, &d, 2);
        if (f.m >= 0) {
            uint16_t m = rand_half(0.0001f, 0.01f, 0);
            memcpy(blk + f.m, &m, 2);
        }
    }
}

static void activation(float *x, int64_t n, int variant) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss() * (variant == 1 ? 1e-3f : 3.0f);
    if (variant == 2)
        for (int64_t i = 0; i < n; i += 7) x[i] = (i % 3 == 0) ? 0.0f : (i % 3 == 1 ? 40.0f : -40.0f);
    if (variant >= 3) /* every activation quant 127 (variant 3) or -127 (4): no sum may saturate or wrap */
        for (int64_t i = 0; i < n; i++) x[i] = variant == 4 ? -1.0f : 1.0f;
}

/* quant_vec_dot_ref on the reference quantization of x. */
static float ref_row(int type, int64_t n, const void *w, const float *x) {
    int vt = quant_traits_of(type)->vec_dot_type;
    void *xq = malloc(quant_row_size(vt, n) + 64);
    quant_quantize_row_ref(vt, x, xq, n);
    float v = quant_vec_dot_ref(type, n, w, xq);
    free(xq);
    return v;
}

static double abs_dot(int type, int64_t n, const void *w, const float *x) {
    float *wd = malloc((size_t)n * sizeof(float));
    quant_dequantize_row_ref(type, w, wd, n);
    double a = 0;
    for (int64_t i = 0; i < n; i++) a += fabs((double)wd[i] * x[i]);
    free(wd);
    return a;
}

/* Σ over block b of deq(w with d := 1, dmin := 0 (which = 0) or d := 0, dmin := 1 (which = 1))
 * · q_x: the exact integer sums Σ sc·q_w·q_x (or −Σ m·Σq_x) of the scalar reference, read
 * through the reference decoder. */
static double block_isum(int type, const uint8_t *blk, const int8_t *xq, int which) {
    const quant_traits *tr = quant_traits_of(type);
    uint8_t tmp[512];
    float deq[256];
    half_fields f = fields_of(type);
    uint16_t one = 0x3c00, zero = 0;
    memcpy(tmp, blk, tr->type_size);
    memcpy(tmp + f.d, which ? &zero : &one, 2);
    if (f.m >= 0) memcpy(tmp + f.m, which ? &one : &zero, 2);
    quant_dequantize_row_ref(type, tmp, deq, tr->block_size);
    double s = 0;
    for (int i = 0; i < tr->block_size; i++) s += (double)deq[i] * xq[i];
    return s;
}

/* The value the panel kernels promise bit for bit (NAN for types without such a promise):
 * Q4_0 / Q5_0 / Q8_0 acc = fma(d_w·d_x, Σ, acc) block after block; Q4_K acc = fma(d_x, fma(d_w, Σ,
 * −dmin·Σm), acc); Q5_K the scalar reference itself; Q6_K acc = fma(d_w·d_x, Σ, acc). */
static float fused_row(int type, int64_t n, const uint8_t *w, const float *x) {
    const quant_traits *tr = quant_traits_of(type);
    int64_t nb = n / tr->block_size;
    float acc = 0.0f;
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: {
        block_q8_0 *xq = malloc(sizeof(block_q8_0) * (size_t)nb);
        quant_quantize_row_ref(GGML_TYPE_Q8_0, x, xq, n);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + (size_t)b * tr->type_size;
            uint16_t dw;
            memcpy(&dw, blk, 2);
            float isum = (float)block_isum(type, blk, xq[b].qs, 0);
            acc = fmaf(fp16_to_fp32(dw) * fp16_to_fp32(xq[b].d), isum, acc);
        }
        free(xq);
        return acc;
    }
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q6_K: {
        block_q8_K *xq = malloc(sizeof(block_q8_K) * (size_t)nb);
        quant_quantize_row_ref(GGML_TYPE_Q8_K, x, xq, n);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + (size_t)b * tr->type_size;
            half_fields f = fields_of(type);
            uint16_t dh, mh;
            memcpy(&dh, blk + f.d, 2);
            float sumi = (float)block_isum(type, blk, xq[b].qs, 0);
            if (type == GGML_TYPE_Q6_K) {
                acc = fmaf(fp16_to_fp32(dh) * xq[b].d, sumi, acc);
            } else {
                memcpy(&mh, blk + f.m, 2);
                float summ = -(float)block_isum(type, blk, xq[b].qs, 1);
                acc = fmaf(xq[b].d, fmaf(fp16_to_fp32(dh), sumi, -(fp16_to_fp32(mh) * summ)), acc);
            }
        }
        free(xq);
        return acc;
    }
    case GGML_TYPE_Q5_K: case GGML_TYPE_MXFP4: return ref_row(type, n, w, x); /* MXFP4: the fused order is the reference's */
    default: return NAN;
    }
}

/* ---- the sweep -------------------------------------------------------------------------------- */

static const int TYPES[] = {
    GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0,
    GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_BF16, GGML_TYPE_Q4_1, GGML_TYPE_Q5_1, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
    GGML_TYPE_MXFP4,
};
#define N_TYPES (int)(sizeof(TYPES) / sizeof(TYPES[0]))

/* TOK_BIG: one more batch for the float types, past KERN_AVX2_FLOAT_SMALL (their third order) */
enum { ROWS = 33, TOK = 17, TOK_BIG = KERN_AVX2_FLOAT_SMALL + 5 };

typedef struct sweep {
    const kern_ops *o;
    int type, bitwise, split_one; /* split_one: decode (1 token) and batches of more than
                                     KERN_AVX2_FLOAT_SMALL tokens have float orders of their own (F32, F16, BF16) */
    int64_t n;
    size_t rs, as;
    uint8_t *w, *act;
    float *x, *want, *want1, *wantL; /* want[t][r]: the first value seen (every entry must give the same
                                        bits); want1 / wantL: the same for calls with one token / more
                                        than KERN_AVX2_FLOAT_SMALL tokens when split_one */
    float ref[TOK_BIG][ROWS];
    double tol[TOK_BIG][ROWS];
    const char *isa;
    const kern_ops *o512; /* the AVX-512 level's table when this CPU has it, else NULL */
} sweep;

static void check(sweep *s, const char *what, int ntok, int t, int r, float v) {
    float ref = s->ref[t][r];
    if (!(fabs((double)v - ref) <= s->tol[t][r]))
        fail_msg("%s %s %s n=%lld row %d tok %d: %.9g vs scalar reference %.9g", s->isa, tname(s->type), what,
                 (long long)s->n, r, t, (double)v, (double)ref);
    float *want = !s->split_one                ? &s->want[t * ROWS + r]
                  : ntok == 1                    ? &s->want1[t * ROWS + r]
                  : ntok > KERN_AVX2_FLOAT_SMALL ? &s->wantL[t * ROWS + r]
                                                 : &s->want[t * ROWS + r];
    if (isnan(*want)) *want = v;
    else if (s->bitwise && v != *want)
        fail_msg("%s %s %s n=%lld row %d tok %d: %a, but %a before (batch / row range / entry changed the bits)",
                 s->isa, tname(s->type), what, (long long)s->n, r, t, (double)v, (double)*want);
}

static void run_sweep(sweep *s, int extreme) {
    const kern_ops *o = s->o;
    int type = s->type;
    int64_t n = s->n;
    int n_tok = s->split_one ? TOK_BIG : TOK;
    float *out = malloc(sizeof(float) * ROWS * TOK_BIG);
    for (int r = 0; r < ROWS; r++) weight_row(type, s->w + (size_t)r * s->rs, n, extreme, r);
    for (int t = 0; t < n_tok; t++) {
        activation(s->x + (size_t)t * n, n, extreme ? 3 + (t & 1) : t % 3);
        o->act_prepare(type, s->x + (size_t)t * n, n, s->act + (size_t)t * s->as);
    }
    for (int t = 0; t < n_tok; t++)
        for (int r = 0; r < ROWS; r++) {
            const uint8_t *wr = s->w + (size_t)r * s->rs;
            const float *xt = s->x + (size_t)t * n;
            s->ref[t][r] = ref_row(type, n, wr, xt);
            s->tol[t][r] = 1e-5 * abs_dot(type, n, wr, xt) + 1e-30;
            s->want[t * ROWS + r] = s->want1[t * ROWS + r] = s->wantL[t * ROWS + r] = NAN;
            float fz = s->bitwise ? fused_row(type, n, wr, xt) : NAN;
            if (!isnan(fz)) s->want[t * ROWS + r] = fz;
        }
    /* gemv on GGUF rows: every row count, one token; untouched outputs past nrows */
    for (int nrows = 1; nrows <= ROWS; nrows += (n > 1024 ? 4 : 1)) {
        int t = nrows % TOK;
        for (int r = 0; r < ROWS; r++) out[r] = -12345.0f;
        o->gemv(type, n, nrows, s->w, s->rs, s->act + (size_t)t * s->as, out);
        for (int r = 0; r < ROWS; r++) {
            if (r >= nrows) assert_true(out[r] == -12345.0f);
            else check(s, "gemv", 1, t, r, out[r]);
        }
    }
    /* gemm on GGUF rows: 1..17 tokens */
    for (int T = 1; T <= TOK; T += (n > 1024 ? 4 : 1)) {
        int nrows = 1 + (T * 7) % ROWS;
        o->gemm(type, n, nrows, s->w, s->rs, s->act, s->as, T, out, (size_t)nrows);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < nrows; r++) check(s, "gemm", T, t, r, out[(size_t)t * nrows + r]);
    }
    /* the float types' large batches (the blocked GEMM at AVX2): all rows, then a row range */
    if (s->split_one)
        for (int T = TOK_BIG - 3; T <= TOK_BIG; T += 3)
            for (int row0 = 0; row0 <= 16; row0 += 16) {
                int nrows = ROWS - row0;
                o->gemm(type, n, nrows, s->w + (size_t)row0 * s->rs, s->rs, s->act, s->as, T, out, (size_t)nrows);
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < nrows; r++)
                        check(s, "gemm (large batch)", T, t, row0 + r, out[(size_t)t * nrows + r]);
            }
    /* packed panels: whole and in the pieces of QUANT_PANEL_ROWS rows op_weights_pack writes */
    size_t ps = o->pack_size(type, n, ROWS);
    if (ps) {
        size_t unit = o->pack_size(type, n, QUANT_PANEL_ROWS);
        assert_true(unit > 0 && ps <= unit * ((ROWS + QUANT_PANEL_ROWS - 1) / QUANT_PANEL_ROWS));
        uint8_t *p = aligned_alloc(64, (ps + 63) & ~(size_t)63), *q = aligned_alloc(64, (ps + 63) & ~(size_t)63);
        memset(q, 0xa5, ps);
        o->pack(type, n, ROWS, s->w, s->rs, p);
        for (int r0 = 0; r0 < ROWS; r0 += QUANT_PANEL_ROWS) {
            int r1 = r0 + QUANT_PANEL_ROWS < ROWS ? r0 + QUANT_PANEL_ROWS : ROWS;
            o->pack(type, n, r1 - r0, s->w + (size_t)r0 * s->rs, s->rs, q + (size_t)(r0 / QUANT_PANEL_ROWS) * unit);
        }
        assert_memory_equal(p, q, ps);
        for (int T = 1; T <= TOK; T++)
            for (int row0 = 0; row0 <= 16; row0 += 16) {
                int nrows = row0 ? ROWS - row0 : 1 + (T * 5) % ROWS;
                o->gemm_packed(type, n, row0, nrows, p, s->act, s->as, T, out, (size_t)nrows);
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < nrows; r++) check(s, "gemm_packed", T, t, row0 + r, out[(size_t)t * nrows + r]);
            }
        /* the AVX-512 level's panels give the same bits (its own packing and activation layout) */
        if (s->o512) {
            const kern_ops *z = s->o512;
            size_t zps = z->pack_size(type, n, ROWS), zas = z->act_row_size(type, n);
            if (zps) {
                uint8_t *zp = aligned_alloc(64, (zps + 63) & ~(size_t)63), *za = aligned_alloc(64, zas * TOK);
                z->pack(type, n, ROWS, s->w, s->rs, zp);
                for (int t = 0; t < TOK; t++) z->act_prepare(type, s->x + (size_t)t * n, n, za + (size_t)t * zas);
                z->gemm_packed(type, n, 0, ROWS, zp, za, zas, TOK, out, ROWS);
                for (int t = 0; t < TOK; t++)
                    for (int r = 0; r < ROWS; r++) check(s, "avx512 gemm_packed (same bits)", TOK, t, r, out[(size_t)t * ROWS + r]);
                free(zp);
                free(za);
            }
        }
        free(p);
        free(q);
    } else {
        assert_true(o->pack_size(type, n, QUANT_PANEL_ROWS) == 0);
    }
    free(out);
}

/* The level's table as engine/kernels/kernels.c builds it: portable, the level's dot products,
 * then its matmul group. */
static void test_level(kern_isa isa, void (*fill_dots)(kern_ops *), void (*fill)(kern_ops *)) {
    if (!kern_supported(isa)) {
        print_message("%s: not supported by this CPU / build, skipped\n", kern_isa_name(isa));
        skip();
    }
    kern_ops o;
    memset(&o, 0, sizeof o);
    kern_fill_portable(&o);
    fill_dots(&o);
    fill(&o);
    assert_non_null(o.act_row_size);
    assert_non_null(o.act_prepare);
    assert_non_null(o.gemv);
    assert_non_null(o.gemm);
    assert_non_null(o.pack_size);
    assert_non_null(o.pack);
    assert_non_null(o.gemm_packed);
    static const int64_t lens[] = {32, 256, 32 * 9, 1024 + 256, 2048 + 5, 4864};
    enum { NMAX = 4864 };
    sweep s = {.o = &o, .isa = kern_isa_name(isa)};
    kern_ops z;
    if (kern_supported(KERN_AVX512)) {
        memset(&z, 0, sizeof z);
        kern_fill_portable(&z);
        kern_fill_x86_avx2(&z);
        kern_fill_x86_avx512(&z);
        s.o512 = &z;
    }
    s.x = malloc(sizeof(float) * NMAX * TOK_BIG);
    s.want = malloc(sizeof(float) * TOK_BIG * ROWS);
    s.want1 = malloc(sizeof(float) * TOK_BIG * ROWS);
    s.wantL = malloc(sizeof(float) * TOK_BIG * ROWS);
    for (int ti = 0; ti < N_TYPES; ti++) {
        const quant_traits *tr = quant_traits_of(TYPES[ti]);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            if (lens[li] % tr->block_size) continue;
            s.type = TYPES[ti];
            s.n = lens[li];
            s.rs = quant_row_size(s.type, s.n);
            s.as = o.act_row_size(s.type, s.n);
            assert_true(s.as > 0 && s.as % 64 == 0);
            /* bit-equal results across entries, batches and row ranges: every type with a kernel
             * of its own here (the rest go through quant_vec_dot_rows) */
            s.split_one = s.type == GGML_TYPE_F32 || s.type == GGML_TYPE_F16 || s.type == GGML_TYPE_BF16;
            s.bitwise = s.split_one || o.pack_size(s.type, s.n, 1) > 0;
            s.w = malloc(s.rs * ROWS);
            s.act = aligned_alloc(64, s.as * TOK_BIG);
            rng_seed(1000 + 17 * (uint64_t)ti + li);
            run_sweep(&s, 0);
            if (tr->block_size > 1 && s.n == 4864) run_sweep(&s, 1);
            free(s.w);
            free(s.act);
        }
    }
    free(s.x);
    free(s.want);
    free(s.want1);
    free(s.wantL);
}

static void test_avx2(void **state) {
    (void)state;
    test_level(KERN_AVX2, kern_fill_x86_avx2, kern_fill_gemm_avx2);
}

static void test_avxvnni(void **state) {
    (void)state;
    test_level(KERN_AVXVNNI, kern_fill_x86_avxvnni, kern_fill_gemm_avxvnni);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_avx2),
        cmocka_unit_test(test_avxvnni),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
