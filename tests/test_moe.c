/* test_moe: the mixture-of-experts block (engine/moe.c) against a plain double-precision reference at every kernel level, routing ties, batch = decode, the loader's MoE checks and counts. */
/*
 * The reference here is the definition written out: router logits in double, softmax, the k
 * largest (ties to the lower index), normalisation, SwiGLU experts from the dequantized weights,
 * the weighted sum and the sigmoid-gated shared expert. The kernels quantize the activations to
 * the weight type's vec_dot_type (F16 for F16, Q8_0 / Q8_K for the quantized types), so outputs
 * agree to a tolerance relative to their size; the selected experts agree exactly (the test
 * routers have no near-ties but the deliberate one). The forward pass against llama.cpp is
 * test_arch's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/experts.h"
#include "app/tools.h"
#include "engine/model.h"
#include "engine/moe.h"
#include "engine/ops.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/threadpool.h"
#include "tests/support/testisa.h"
#include "tests/support/testutil.h"

enum { E = 256, F = 256, S = 256, X = 6 };

static uint64_t rng = 88172645463325252ULL;
static float urand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* A tensor of `type` holding vals (rows of ne0) quantized; deq gets what it decodes to. */
typedef struct tens {
    gguf_tensor t;
    void *data;
    float *deq;
} tens;

static void mk(tens *o, const char *name, int type, int nd, int64_t ne0, int64_t ne1, int64_t ne2, float scale)
{
    memset(o, 0, sizeof *o);
    int64_t rows = ne1 * ne2, n = ne0 * rows;
    size_t rb = quant_row_size(type, ne0);
    float *v = malloc(sizeof(float) * (size_t)n);
    o->data = aligned_alloc(64, (rb * (size_t)rows + 63) & ~(size_t)63);
    o->deq = malloc(sizeof(float) * (size_t)n);
    assert_non_null(v);
    assert_non_null(o->data);
    assert_non_null(o->deq);
    for (int64_t i = 0; i < n; i++) v[i] = urand() * scale;
    for (int64_t r = 0; r < rows; r++) {
        quant_quantize_row(type, v + r * ne0, (uint8_t *)o->data + (size_t)r * rb, ne0);
        quant_dequantize_row(type, (uint8_t *)o->data + (size_t)r * rb, o->deq + r * ne0, ne0);
    }
    free(v);
    o->t = (gguf_tensor){.name = (char *)name, .n_dims = (uint32_t)nd, .ne = {ne0, ne1, ne2, 1}, .type = type,
                         .data = o->data, .nbytes = rb * (size_t)rows, .n_elements = n};
}

static void tfree(tens *o)
{
    free(o->data);
    free(o->deq);
}

typedef struct fixture {
    moe_config c;
    tens router, gate, up, down, gs, us, ds;
    float *gate_shexp, *bg, *bu, *bd, *br;
    moe_layer L;
} fixture;

/* variant: 0 qwen3moe-like (norm_w, k 2), 1 qwen2moe-like (shared expert + gate, k 2),
 * 2 gpt-oss-like (SOFTMAX_WEIGHT, router and expert biases, w_scale, k 3) */
static void fixture_make(fixture *fx, int type, int variant)
{
    memset(fx, 0, sizeof *fx);
    fx->c = (moe_config){.n_expert = X, .n_expert_used = variant == 2 ? 3 : 2, .n_ff_exp = F,
                         .n_ff_shexp = variant == 1 ? S : 0, .gating = variant == 2 ? MOE_GATING_SOFTMAX_WEIGHT : 0,
                         .norm_w = variant == 0, .w_scale = variant == 2 ? 1.5f : 0.0f, .act = MOE_ACT_SILU};
    mk(&fx->router, "router", GGML_TYPE_F32, 2, E, X, 1, 0.2f);
    mk(&fx->gate, "gate_exps", type, 3, E, F, X, 0.1f);
    mk(&fx->up, "up_exps", type, 3, E, F, X, 0.1f);
    mk(&fx->down, "down_exps", type, 3, F, E, X, 0.1f);
    fx->L = (moe_layer){.gate_inp = &fx->router.t, .gate_exps = &fx->gate.t, .up_exps = &fx->up.t,
                        .down_exps = &fx->down.t};
    if (variant == 1) {
        mk(&fx->gs, "gate_shexp", type, 2, E, S, 1, 0.1f);
        mk(&fx->us, "up_shexp", type, 2, E, S, 1, 0.1f);
        mk(&fx->ds, "down_shexp", type, 2, S, E, 1, 0.1f);
        fx->gate_shexp = malloc(sizeof(float) * E);
        for (int i = 0; i < E; i++) fx->gate_shexp[i] = urand() * 0.1f;
        fx->L.gate_shexp = &fx->gs.t, fx->L.up_shexp = &fx->us.t, fx->L.down_shexp = &fx->ds.t;
        fx->L.gate_inp_shexp = fx->gate_shexp;
    }
    if (variant == 2) {
        fx->bg = malloc(sizeof(float) * X * F), fx->bu = malloc(sizeof(float) * X * F);
        fx->bd = malloc(sizeof(float) * X * E), fx->br = malloc(sizeof(float) * X);
        for (int i = 0; i < X * F; i++) fx->bg[i] = urand() * 0.5f, fx->bu[i] = urand() * 0.5f;
        for (int i = 0; i < X * E; i++) fx->bd[i] = urand() * 0.5f;
        for (int i = 0; i < X; i++) fx->br[i] = urand();
        fx->L.gate_exps_b = fx->bg, fx->L.up_exps_b = fx->bu, fx->L.down_exps_b = fx->bd, fx->L.gate_inp_b = fx->br;
    }
}

static void fixture_free(fixture *fx)
{
    tens *ts[] = {&fx->router, &fx->gate, &fx->up, &fx->down, &fx->gs, &fx->us, &fx->ds};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) tfree(ts[i]);
    free(fx->gate_shexp); free(fx->bg); free(fx->bu); free(fx->bd); free(fx->br);
}

static double silu(double g) { return g / (1.0 + exp(-g)); }

/* The definition, in double, on the dequantized weights: out [E], sel [k]. */
static void naive(const fixture *fx, const float *x, double *out, int *sel)
{
    const moe_config *c = &fx->c;
    const int k = c->n_expert_used;
    double lg[X], p[X], w[8];
    for (int e = 0; e < X; e++) {
        double d = fx->br ? fx->br[e] : 0;
        for (int i = 0; i < E; i++) d += (double)fx->router.deq[e * E + i] * x[i];
        lg[e] = d;
    }
    double mx = lg[0], sum = 0;
    for (int e = 0; e < X; e++) mx = lg[e] > mx ? lg[e] : mx;
    for (int e = 0; e < X; e++) sum += p[e] = exp(lg[e] - mx);
    for (int e = 0; e < X; e++) p[e] = c->gating == MOE_GATING_SOFTMAX ? p[e] / sum : lg[e];
    int taken[X] = {0};
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int e = 0; e < X; e++)
            if (!taken[e] && (b < 0 || p[e] > p[b])) b = e;
        taken[b] = 1, sel[j] = b, w[j] = p[b];
    }
    if (c->gating == MOE_GATING_SOFTMAX_WEIGHT) {
        double m2 = w[0], s2 = 0;
        for (int j = 0; j < k; j++) m2 = w[j] > m2 ? w[j] : m2;
        for (int j = 0; j < k; j++) s2 += w[j] = exp(w[j] - m2);
        for (int j = 0; j < k; j++) w[j] /= s2;
    }
    if (c->norm_w) {
        double s2 = 0;
        for (int j = 0; j < k; j++) s2 += w[j];
        for (int j = 0; j < k; j++) w[j] /= s2;
    }
    if (c->w_scale) for (int j = 0; j < k; j++) w[j] *= c->w_scale;
    static double h[F > S ? F : S];
    for (int i = 0; i < E; i++) out[i] = 0;
    for (int j = 0; j < k; j++) {
        int e = sel[j];
        for (int r = 0; r < F; r++) {
            double g = fx->bg ? fx->bg[e * F + r] : 0, u = fx->bu ? fx->bu[e * F + r] : 0;
            for (int i = 0; i < E; i++) {
                g += (double)fx->gate.deq[((size_t)e * F + r) * E + i] * x[i];
                u += (double)fx->up.deq[((size_t)e * F + r) * E + i] * x[i];
            }
            h[r] = silu(g) * u;
        }
        for (int o = 0; o < E; o++) {
            double d = fx->bd ? fx->bd[e * E + o] : 0;
            for (int r = 0; r < F; r++) d += (double)fx->down.deq[((size_t)e * E + o) * F + r] * h[r];
            out[o] += w[j] * d;
        }
    }
    if (c->n_ff_shexp) {
        double gd = 0;
        for (int i = 0; i < E; i++) gd += (double)fx->gate_shexp[i] * x[i];
        double gate = 1.0 / (1.0 + exp(-gd));
        for (int r = 0; r < S; r++) {
            double g = 0, u = 0;
            for (int i = 0; i < E; i++) {
                g += (double)fx->gs.deq[(size_t)r * E + i] * x[i];
                u += (double)fx->us.deq[(size_t)r * E + i] * x[i];
            }
            h[r] = silu(g) * u;
        }
        for (int o = 0; o < E; o++) {
            double d = 0;
            for (int r = 0; r < S; r++) d += (double)fx->ds.deq[(size_t)o * S + r] * h[r];
            out[o] += gate * d;
        }
    }
}

/* Pack the weights as op_weights_pack does (a 3-D tensor as one matrix of ne1 * ne2 rows). */
static void pack_all(fixture *fx, void **bufs)
{
    tens *ts[] = {&fx->gate, &fx->up, &fx->down};
    for (int i = 0; i < 3; i++) {
        gguf_tensor *t = &ts[i]->t;
        size_t ps = quant_pack_size(t->type, t->ne[0], t->ne[1] * t->ne[2]);
        bufs[i] = NULL;
        if (!ps) continue;
        bufs[i] = aligned_alloc(64, (ps + 63) & ~(size_t)63);
        assert_non_null(bufs[i]);
        quant_pack(t->type, t->ne[0], t->ne[1] * t->ne[2], t->data, quant_row_size(t->type, t->ne[0]), bufs[i]);
        t->packed = bufs[i];
    }
}

static const int TYPES[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K,
                            GGML_TYPE_Q6_K};

static void check_type(int type, int variant, int packed)
{
    fixture fx;
    fixture_make(&fx, type, variant);
    void *bufs[3] = {0};
    if (packed) pack_all(&fx, bufs);
    const int T = 19, k = fx.c.n_expert_used;
    float *x = malloc(sizeof(float) * T * E), *yb = malloc(sizeof(float) * T * E), *yd = malloc(sizeof(float) * E);
    for (int i = 0; i < T * E; i++) x[i] = urand();
    kv_error err = {0};
    tpool *pool = tpool_create(2);
    moe_scratch *s = moe_scratch_create(&fx.c, E, T, &fx.L, 1, &err);
    assert_non_null(s);
    uint32_t counts[X] = {0};
    moe_ffn(&fx.c, &fx.L, x, T, yb, s, counts, pool);
    int32_t selb[19 * 3];
    for (int t = 0; t < T; t++) memcpy(selb + t * k, moe_last_selected(s, t), sizeof(int32_t) * k);
    uint32_t total = 0;
    for (int e = 0; e < X; e++) total += counts[e];
    assert_int_equal(total, T * k);
    /* quantized activations: a tolerance relative to the output's size (Q4: the activations'
     * 8-bit rounding times the weights' 4-bit ones) */
    double tol = type == GGML_TYPE_F32 ? 1e-5 : type == GGML_TYPE_F16 ? 2e-3 : 3e-2;
    /* batch vs decode: the same kernels' other float order (decode's inner products, the batch's
     * GEMM) — and with F16, whose activations are rounded to fp16, a last-bit difference in a
     * gate / up sum can move the fp16 rounding of its SwiGLU value by one step (2^-11 relative),
     * which the down projection carries: up to ~3e-4 of the output's rms seen at the AVX2 level */
    double tol_bd = type == GGML_TYPE_F16 ? 1e-3 : 2e-4;
    double worst = 0, worst_bd = 0, se = 0, sr = 0;
    for (int t = 0; t < T; t++) {
        double ref[E], rms = 0;
        int sel[8];
        naive(&fx, x + t * E, ref, sel);
        for (int j = 0; j < k; j++) assert_int_equal(selb[t * k + j], sel[j]);
        /* decode: the same token alone */
        moe_ffn(&fx.c, &fx.L, x + t * E, 1, yd, s, NULL, pool);
        for (int j = 0; j < k; j++) assert_int_equal(moe_last_selected(s, 0)[j], sel[j]);
        for (int i = 0; i < E; i++) rms += ref[i] * ref[i];
        sr += rms;
        rms = sqrt(rms / E);
        for (int i = 0; i < E; i++) {
            double d = fabs(yb[t * E + i] - ref[i]) / rms, bd = fabs(yb[t * E + i] - yd[i]) / rms;
            worst = d > worst ? d : worst;
            se += (yb[t * E + i] - ref[i]) * (yb[t * E + i] - ref[i]);
            worst_bd = bd > worst_bd ? bd : worst_bd;
        }
    }
    double rel = sqrt(se / sr); /* |y - ref| / |ref| over the batch */
    if (rel > tol || worst > 5 * tol || worst_bd > tol_bd || getenv("KVCHAT_TEST_VERBOSE"))
        print_message("%s variant %d%s: |d|/|ref| %.2e, worst |d|/rms %.2e (tol %.0e), batch vs decode %.2e\n",
                      quant_traits_of(type)->name, variant, packed ? " packed" : "", rel, worst, tol, worst_bd);
    assert_true(rel <= tol);
    assert_true(worst <= 5 * tol);
    assert_true(worst_bd <= tol_bd);
    moe_scratch_free(s);
    tpool_free(pool);
    free(x); free(yb); free(yd);
    for (int i = 0; i < 3; i++) free(bufs[i]);
    fixture_free(&fx);
}

static void test_vs_reference(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof TYPES / sizeof *TYPES; i++)
        for (int v = 0; v < 3; v++) check_type(TYPES[i], v, 0);
}

/* Weights packed in panels (where the level has a layout): the same outputs. */
static void test_packed(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof TYPES / sizeof *TYPES; i++) check_type(TYPES[i], 0, 1);
}

/* Equal router logits: the lower expert index ranks first, as llama.cpp's sort orders them for up to 16
 * experts (an insertion sort); weights equal. */
static void test_ties(void **state)
{
    (void)state;
    fixture fx;
    fixture_make(&fx, GGML_TYPE_F32, 0);
    float *r = fx.router.data;
    for (int i = 0; i < E; i++) r[1 * E + i] = r[4 * E + i] = 0.5f, r[0 * E + i] = r[2 * E + i] = 0.0f;
    for (int i = 0; i < E; i++) r[3 * E + i] = r[5 * E + i] = -0.5f;
    float x[E], y[E];
    for (int i = 0; i < E; i++) x[i] = 1.0f;
    kv_error err = {0};
    tpool *pool = tpool_create(1);
    moe_scratch *s = moe_scratch_create(&fx.c, E, 1, &fx.L, 1, &err);
    moe_ffn(&fx.c, &fx.L, x, 1, y, s, NULL, pool);
    assert_int_equal(moe_last_selected(s, 0)[0], 1);
    assert_int_equal(moe_last_selected(s, 0)[1], 4);
    assert_float_equal(moe_last_weights(s, 0)[0], 0.5f, 1e-6);
    assert_float_equal(moe_last_weights(s, 0)[1], 0.5f, 1e-6);
    /* k = 3: the next is the tie of 0 and 2, which 0 wins */
    fx.c.n_expert_used = 3;
    moe_scratch_free(s);
    s = moe_scratch_create(&fx.c, E, 1, &fx.L, 1, &err);
    moe_ffn(&fx.c, &fx.L, x, 1, y, s, NULL, pool);
    assert_int_equal(moe_last_selected(s, 0)[2], 0);
    moe_scratch_free(s);
    tpool_free(pool);
    fixture_free(&fx);
}

/* A stop set on the pool (tpool_set_cancel) during the experts' passes. One thread polls in a
 * fixed order: the router's op_matmul twice (its two pool runs), moe_ffn once after the router,
 * then once between every two chunks of the gate / up pass and of the down pass, and once after
 * each pass. A stop at any of those polls ends the pass there, moe_ffn returns at its next check
 * (that poll or the next) and out is never written; with two threads the other thread stops at
 * its next poll. Cleared, the same scratch gives the reference bits again. */
static atomic_int moe_polls, moe_stop_at;
static int stop_at_poll(void *ud)
{
    (void)ud;
    int n = atomic_fetch_add(&moe_polls, 1) + 1, at = atomic_load(&moe_stop_at);
    return at > 0 && n >= at;
}

static void test_cancel(void **state)
{
    (void)state;
    for (int packed = 0; packed < 2; packed++)
        for (int nth = 1; nth <= 2; nth++) {
            fixture fx;
            fixture_make(&fx, GGML_TYPE_Q8_0, 1);
            void *bufs[3] = {0};
            if (packed) pack_all(&fx, bufs);
            enum { T = 19 };
            float *x = malloc(sizeof(float) * T * E), *ref = malloc(sizeof(float) * T * E);
            float *y = malloc(sizeof(float) * T * E);
            for (int i = 0; i < T * E; i++) x[i] = urand();
            kv_error err = {0};
            tpool *pool = tpool_create(nth);
            moe_scratch *s = moe_scratch_create(&fx.c, E, T, &fx.L, 1, &err);
            assert_non_null(s);
            /* a callback that never says stop: the polls of a whole call */
            atomic_store(&moe_polls, 0);
            atomic_store(&moe_stop_at, 0);
            tpool_set_cancel(pool, stop_at_poll, NULL);
            moe_ffn(&fx.c, &fx.L, x, T, ref, s, NULL, pool);
            int total = atomic_load(&moe_polls);
            /* the shared expert's gate and up, each chosen expert's gate and up (one chunk
             * each here), then the down matrices: every chunk after the first of a pass polls,
             * and moe_ffn after each pass */
            int used = 0;
            for (int e = 0; e < X; e++) {
                int hit = 0;
                for (int t = 0; t < T; t++)
                    for (int j = 0; j < fx.c.n_expert_used; j++) hit |= moe_last_selected(s, t)[j] == e;
                used += hit;
            }
            if (nth == 1) assert_int_equal(total, 3 + (2 + 2 * used - 1) + 1 + (1 + used - 1) + 1);
            else assert_true(total >= 3 + (2 + 2 * used - 1) + 1 + (1 + used - 1) + 1);
            for (int at = nth == 1 ? 4 : 6; at <= (nth == 1 ? total : 8); at++) {
                for (int i = 0; i < T * E; i++) y[i] = NAN;
                atomic_store(&moe_polls, 0);
                atomic_store(&moe_stop_at, at);
                moe_ffn(&fx.c, &fx.L, x, T, y, s, NULL, pool);
                assert_true(tpool_cancelled(pool));
                int polls = atomic_load(&moe_polls) - 1; /* less the check just above */
                assert_true(polls >= at && polls <= at + nth);
                for (int i = 0; i < T * E; i++) assert_true(isnan(y[i]));
            }
            tpool_set_cancel(pool, NULL, NULL);
            moe_ffn(&fx.c, &fx.L, x, T, y, s, NULL, pool);
            assert_memory_equal(ref, y, sizeof(float) * T * E);
            moe_scratch_free(s);
            tpool_free(pool);
            free(x); free(ref); free(y);
            for (int i = 0; i < 3; i++) free(bufs[i]);
            fixture_free(&fx);
        }
}

/* op_weights_pack on the real Qwen3-30B-A3B expert tensor shape (Q4_0 [2048, 768, 128]): every
 * expert's panels, the last rows of the last expert included, give what its GGUF rows give (its
 * work items once fell one short for this shape, leaving the tail unpacked). */
static void test_pack_experts(void **state)
{
    (void)state;
    const int64_t n = 2048, f = 768, x = 128;
    size_t rb = quant_row_size(GGML_TYPE_Q4_0, n), bytes = rb * (size_t)(f * x);
    if (!quant_pack_size(GGML_TYPE_Q4_0, n, f * x)) skip(); /* no panel layout at this level */
    uint8_t *data = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095), *copy = malloc(bytes);
    assert_non_null(data);
    assert_non_null(copy);
    for (size_t i = 0; i < bytes; i++) data[i] = (uint8_t)(urand() * 127);
    for (size_t r = 0; r < (size_t)(f * x); r++) { /* sane scales */
        uint16_t d = fp32_to_fp16(0.01f);
        for (int b = 0; b < n / 32; b++) memcpy(data + r * rb + (size_t)b * sizeof(block_q4_0), &d, 2);
    }
    memcpy(copy, data, bytes);
    gguf_tensor t = {.name = "blk.0.ffn_up_exps.weight", .n_dims = 3, .ne = {n, f, x, 1}, .type = GGML_TYPE_Q4_0,
                     .data = data, .nbytes = bytes, .n_elements = n * f * x};
    gguf_file gf = {.path = "mem.gguf", .n_tensors = 1, .tensors = &t};
    void *arena = NULL;
    kv_error err = {0};
    setenv("KVCHAT_MOE_MAPPED", "0", 1);
    assert_int_equal(op_weights_pack(&gf, NULL, &arena, &err), KV_OK);
    op_weights_settle(arena); /* packed after the load: done now */
    assert_non_null(t.packed);
    float xin[2048], a[64], b[64];
    for (int i = 0; i < n; i++) xin[i] = urand();
    uint8_t *act = aligned_alloc(64, quant_act_row_size(GGML_TYPE_Q4_0, n));
    quant_act_prepare(GGML_TYPE_Q4_0, xin, n, act);
    const int experts[] = {0, 1, 64, 126, 127};
    for (size_t k = 0; k < sizeof experts / sizeof *experts; k++)
        for (int64_t r0 = 0; r0 < f; r0 += f - 64) { /* the first and the last 64 rows */
            gguf_tensor v = moe_expert_view(&t, experts[k]);
            assert_non_null(v.packed);
            quant_gemm_packed(GGML_TYPE_Q4_0, n, r0, 64, v.packed, act, 0, 1, a, 64);
            quant_gemv(GGML_TYPE_Q4_0, n, 64, copy + ((size_t)experts[k] * f + (size_t)r0) * rb, rb, act, b);
            for (int i = 0; i < 64; i++) assert_float_equal(a[i], b[i], 1e-3f * (fabsf(b[i]) + 1.0f));
        }
    op_weights_free(&gf, arena);
    free(act);
    free(copy);
    free(data);
}

/* ---- the loader ---------------------------------------------------------------------------- */

static const char *gen_small(const char *shape, const char *file)
{
    gen_model_opts o = {.n_layer = 2, .n_vocab = 300, .n_ff = 128, .seed = 3, .n_expert = 16, .n_expert_used = 4,
                        .n_ff_exp = 64, .n_ff_shexp = 96};
    const char *p = tu_tmp_path(file);
    kv_error err = {0};
    int rc = gen_model_write_ex(p, shape, "f16", &o, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, KV_OK);
    return p;
}

/* Hyperparameters, tensors, total and active parameters, bytes a token reads. */
static void test_load(void **state)
{
    (void)state;
    static const struct { const char *shape, *arch; int norm, ff_exp, shexp; } cases[] = {
        {"qwen3-30b-a3b", "qwen3moe", 1, 64, 0},
        {"qwen1.5-moe-a2.7b", "qwen2moe", 0, 64, 96},
        {"olmoe-1b-7b", "olmoe", 0, 128, 0}, /* olmoe: the experts are feed_forward_length wide */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *p = gen_small(cases[i].shape, "m.gguf");
        model *m = NULL;
        kv_error err = {0};
        int rc = model_load(p, &m, &err);
        if (rc) print_message("%s\n", err.msg);
        assert_int_equal(rc, KV_OK);
        assert_string_equal(m->arch_name, cases[i].arch);
        const moe_config *c = &m->hp.moe;
        assert_int_equal(c->n_expert, 16);
        assert_int_equal(c->n_expert_used, 4);
        assert_int_equal(c->n_ff_exp, cases[i].ff_exp);
        assert_int_equal(c->n_ff_shexp, cases[i].shexp);
        assert_int_equal(c->norm_w, cases[i].norm);
        const moe_layer *L = &m->layers[1].moe;
        assert_non_null(L->gate_inp);
        assert_int_equal(L->gate_exps->ne[2], 16);
        assert_true((L->gate_shexp != NULL) == (cases[i].shexp > 0));
        assert_true((L->gate_inp_shexp != NULL) == (cases[i].shexp > 0));
        assert_null(m->layers[0].w_gate);
        /* active = total - 12/16 of the expert tensors; per-token bytes likewise */
        uint64_t exp_el = 0, exp_b = 0, dense_b = 0;
        for (uint64_t t = 0; t < m->gguf->n_tensors; t++) {
            const gguf_tensor *g = &m->gguf->tensors[t];
            if (g->n_dims == 3) exp_el += (uint64_t)g->n_elements, exp_b += g->nbytes;
            else if (g->n_dims == 2 && g != m->tok_embd) dense_b += g->nbytes;
        }
        assert_int_equal(exp_el, 2ull * 3 * 16 * 2048 * cases[i].ff_exp);
        assert_int_equal(m->n_params_active, m->n_params - exp_el / 16 * 12);
        assert_int_equal(model_weight_bytes(m), dense_b + exp_b / 16 * 4);
        /* the forward pass counts each layer's choices: 4 per token */
        forward_ctx *fc = forward_ctx_create(m, 8, 64, &err);
        kv_cache *kv = kv_cache_create(m->hp.n_layer, m->hp.n_embd_kv, 64, GGML_TYPE_F32, &err);
        tpool *pool = tpool_create(2);
        float *logits = malloc(sizeof(float) * m->hp.n_vocab);
        int32_t toks[5] = {1, 260, 270, 280, 290};
        assert_int_equal(model_forward(m, fc, kv, pool, toks, 5, logits, 0, &err), KV_OK);
        assert_int_equal(model_forward(m, fc, kv, pool, toks, 1, logits, 0, &err), KV_OK);
        int nl, ne;
        const uint32_t *cnt = forward_ctx_expert_counts(fc, &nl, &ne);
        assert_non_null(cnt);
        assert_int_equal(nl, 2);
        assert_int_equal(ne, 16);
        for (int il = 0; il < nl; il++) {
            uint32_t sum = 0;
            for (int e = 0; e < ne; e++) sum += cnt[il * ne + e];
            assert_int_equal(sum, 6 * 4);
        }
        forward_ctx_expert_counts_reset(fc);
        assert_int_equal(cnt[0] + cnt[1] + cnt[ne], 0);
        free(logits);
        tpool_free(pool);
        kv_cache_free(kv);
        forward_ctx_free(fc);
        model_free(m);
    }
    /* a dense model has no counts */
    gen_model_opts o = {.n_layer = 1, .n_vocab = 300, .n_ff = 64, .seed = 1};
    kv_error err = {0};
    const char *p = tu_tmp_path("d.gguf");
    assert_int_equal(gen_model_write_ex(p, "qwen3-0.6b", "f16", &o, &err), KV_OK);
    model *m = NULL;
    assert_int_equal(model_load(p, &m, &err), KV_OK);
    assert_int_equal(m->hp.moe.n_expert, 0);
    assert_int_equal(m->n_params_active, m->n_params);
    forward_ctx *fc = forward_ctx_create(m, 4, 16, &err);
    int nl = -1, ne = -1;
    assert_null(forward_ctx_expert_counts(fc, &nl, &ne));
    assert_int_equal(nl + ne, 0);
    forward_ctx_free(fc);
    model_free(m);
}

/* Overwrite the first occurrence of `what` (n bytes) after `after` in a file with `with`. */
static void patch(const char *path, const char *after, const void *what, const void *with, size_t n)
{
    size_t len = 0;
    char *d = tu_read_file(path, &len);
    assert_non_null(d);
    char *a = memmem(d, len, after, strlen(after));
    assert_non_null(a);
    char *w = memmem(a, len - (size_t)(a - d), what, n);
    assert_non_null(w);
    memcpy(w, with, n);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(d, 1, len, f), len);
    fclose(f);
    free(d);
}

static void expect_error(const char *path, int code, const char *part1, const char *part2)
{
    model *m = NULL;
    kv_error err = {0};
    int rc = model_load(path, &m, &err);
    if (rc != code || !strstr(err.msg, path) || !strstr(err.msg, part1) || (part2 && !strstr(err.msg, part2)))
        print_message("got %d: %s\n", rc, err.msg);
    assert_int_equal(rc, code);
    assert_null(m);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, part1));
    if (part2) assert_non_null(strstr(err.msg, part2));
}

/* Bad counts and shapes are errors naming the file and the key or tensor. */
static void test_load_errors(void **state)
{
    (void)state;
    uint32_t v4 = 4, v99 = 99, v16 = 16, v8 = 8, v0 = 0;
    /* expert_used_count 99 > expert_count 16 (the u32 value right after the key and its type) */
    const char *p = gen_small("qwen3-30b-a3b", "e1.gguf");
    uint8_t old[8], neu[8];
    uint32_t vt = GGUF_VT_UINT32;
    memcpy(old, &vt, 4), memcpy(old + 4, &v4, 4), memcpy(neu, &vt, 4), memcpy(neu + 4, &v99, 4);
    patch(p, "qwen3moe.expert_used_count", old, neu, 8);
    expect_error(p, KV_ERR_FORMAT, "expert_used_count 99", "expert_count 16");
    p = gen_small("qwen3-30b-a3b", "e2.gguf");
    memcpy(neu + 4, &v0, 4);
    patch(p, "qwen3moe.expert_used_count", old, neu, 8);
    expect_error(p, KV_ERR_FORMAT, "expert_used_count 0", NULL);
    /* expert_count 8 while the tensors hold 16: the router's shape is named */
    p = gen_small("olmoe-1b-7b", "e3.gguf");
    memcpy(old + 4, &v16, 4), memcpy(neu + 4, &v8, 4);
    patch(p, "olmoe.expert_count", old, neu, 8);
    expect_error(p, KV_ERR_FORMAT, "'blk.0.ffn_gate_inp.weight' has shape [2048, 16]", "expected [2048, 8]");
    /* the down experts' first two dims swapped (same size): named with both shapes */
    p = gen_small("qwen3-30b-a3b", "e4.gguf");
    uint64_t dims[3] = {64, 2048, 16}, bad[3] = {2048, 64, 16};
    patch(p, "blk.1.ffn_down_exps.weight", dims, bad, sizeof dims);
    expect_error(p, KV_ERR_FORMAT, "'blk.1.ffn_down_exps.weight' has shape [2048, 64, 16]", "expected [64, 2048, 16]");
    /* a missing expert tensor (its name changed) */
    p = gen_small("qwen1.5-moe-a2.7b", "e5.gguf");
    patch(p, "blk.0.ffn_up_shexp", "up_shexp", "up_shexq", 8);
    expect_error(p, KV_ERR_FORMAT, "required tensor 'blk.0.ffn_up_shexp.weight' is missing", NULL);
}

/* /show experts: bars scaled to each layer's most used expert, used counts, the top three. */
static void test_experts_report(void **state)
{
    (void)state;
    uint32_t c[2 * 8] = {0, 8, 4, 0, 1, 0, 0, 3, /* layer 1: */ 2, 2, 2, 2, 2, 2, 2, 2};
    char buf[1024];
    size_t n = experts_report(c, 2, 8, 0, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(n, strlen(buf));
    const char *want0 = "L0    █▄ ▁  ▃  4/8 used · top e1 50% e2 25% e7 19%";
    const char *want1 = "L1   ████████  8/8 used · top e0 12% e1 12% e2 12%";
    if (!strstr(buf, want0) || !strstr(buf, want1)) print_message("%s\n", buf);
    assert_non_null(strstr(buf, "16 selections per layer over 8 experts (one bar per expert)"));
    assert_non_null(strstr(buf, want0));
    assert_non_null(strstr(buf, want1));
    assert_int_equal(experts_report(c, 2, 8, 1, buf, sizeof buf) > 0, 1);
    assert_non_null(strstr(buf, "L0    @+ :  =  4/8 used"));
    /* over 64 experts: one bar per pair (the larger) */
    uint32_t big[128] = {0};
    big[0] = 1, big[127] = 2;
    experts_report(big, 1, 128, 1, buf, sizeof buf);
    assert_non_null(strstr(buf, "one bar per two experts"));
    char *l = strstr(buf, "L0   ");
    assert_non_null(l);
    assert_int_equal(l[5], '+');  /* ceil(1 * 9 / 2) = 5: '+' */
    assert_int_equal(l[5 + 63], '@');
    assert_int_equal(l[5 + 64], ' ');
    /* nothing counted: nothing written; a small buffer is cut, still terminated */
    uint32_t z[8] = {0};
    assert_int_equal(experts_report(z, 1, 8, 0, buf, sizeof buf), 0);
    assert_int_equal(buf[0], 0);
    assert_true(experts_report(c, 2, 8, 0, buf, 20) < 20);
    assert_int_equal(strlen(buf), 19);
}

int main(void)
{
    if (tu_tmpdir_make("moe")) return 1;
    const struct CMUnitTest every_isa[] = {
        cmocka_unit_test(test_vs_reference),
        cmocka_unit_test(test_packed),
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_pack_experts),
    };
    const struct CMUnitTest once[] = {
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_experts_report),
    };
    int failed = tu_run_every_isa("moe", every_isa, sizeof every_isa / sizeof *every_isa, NULL, NULL);
    failed += cmocka_run_group_tests(once, NULL, NULL);
    tu_tmpdir_teardown(NULL);
    return failed ? 1 : 0;
}
