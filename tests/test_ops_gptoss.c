/* test_ops_gptoss: gpt-oss's forward-pass pieces — attention sinks (with and without a sliding window), YaRN RoPE factors and attention factor, the clamped SwiGLU — each against an independent computation. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/ops.h"
#include "engine/ops_extra.h"
#include "engine/kernels/threadpool.h"

static uint64_t rng = 88172645463325252ULL;
static float urand(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1p-53 * 2.0 - 1.0);
}

/* Attention written out in double, straight from the definition: query t (position pos0 + t) of
 * head h, kv head h / (n_head / n_head_kv), positions [lo, pos0 + t] (lo from the window),
 * weights exp(s_p) / (Σ exp(s_p) + exp(sink_h)), s_p = scale · q·k_p. */
static void naive_attention(const float *q, const float *K, const float *V, double *out, int n_tokens, int pos0,
                            int n_head, int n_head_kv, int hd, float scale, int n_swa, const float *sinks)
{
    int G = n_head / n_head_kv, EQ = n_head * hd, EKV = n_head_kv * hd;
    for (int t = 0; t < n_tokens; t++)
        for (int h = 0; h < n_head; h++) {
            int p1 = pos0 + t, lo = n_swa > 0 && p1 - n_swa + 1 > 0 ? p1 - n_swa + 1 : 0, g = h / G;
            double s[256], mx = sinks ? sinks[h] : -INFINITY, den = 0;
            for (int p = lo; p <= p1; p++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)q[t * EQ + h * hd + i] * K[p * EKV + g * hd + i];
                s[p - lo] = d * scale;
                mx = s[p - lo] > mx ? s[p - lo] : mx;
            }
            for (int p = lo; p <= p1; p++) den += exp(s[p - lo] - mx);
            if (sinks) den += exp(sinks[h] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int p = lo; p <= p1; p++) o += exp(s[p - lo] - mx) / den * V[p * EKV + g * hd + i];
                out[t * EQ + h * hd + i] = o;
            }
        }
}

static void test_attention_sinks(void **state)
{
    (void)state;
    enum { NT = 6, POS0 = 5, NH = 4, NKV = 2, HD = 16, NCTX = POS0 + NT };
    static float q[NT * NH * HD], K[NCTX * NKV * HD], V[NCTX * NKV * HD], out[NT * NH * HD], out2[NT * NH * HD];
    static double want[NT * NH * HD];
    for (int i = 0; i < NT * NH * HD; i++) q[i] = 2.0f * urand();
    for (int i = 0; i < NCTX * NKV * HD; i++) K[i] = urand(), V[i] = urand();
    /* sinks: none to speak of, comparable to the scores, dominant, and negative */
    const float sinks[NH] = {-30.0f, 0.5f, 6.0f, -2.0f};
    tpool *pool = tpool_create(2);
    const float scale = 0.25f;
    for (int n_swa = 0; n_swa <= 4; n_swa += 4) {
        op_attention_sinks(q, K, V, out, NT, POS0, NH, NKV, HD, scale, 0.0f, n_swa, sinks, pool);
        naive_attention(q, K, V, want, NT, POS0, NH, NKV, HD, scale, n_swa, sinks);
        for (int i = 0; i < NT * NH * HD; i++)
            if (fabs(out[i] - want[i]) > 1e-5)
                fail_msg("swa %d element %d: %.8g, expected %.8g", n_swa, i, (double)out[i], want[i]);
        /* the sink takes weight from every position: head 2's output is much smaller than without */
        op_attention_ext(q, K, V, out2, NT, POS0, NH, NKV, HD, scale, 0.0f, n_swa, pool);
        double n_sink = 0, n_plain = 0;
        for (int t = 0; t < NT; t++)
            for (int i = 0; i < HD; i++) {
                n_sink += fabs(out[t * NH * HD + 2 * HD + i]);
                n_plain += fabs(out2[t * NH * HD + 2 * HD + i]);
            }
        assert_true(n_sink < 0.05 * n_plain);
        /* a sink of -inf is no sink at all: bitwise op_attention_ext's result */
        const float none[NH] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        op_attention_sinks(q, K, V, out, NT, POS0, NH, NKV, HD, scale, 0.0f, n_swa, none, pool);
        assert_memory_equal(out, out2, sizeof out);
    }
    tpool_free(pool);
}

/* YaRN as the paper and the Hugging Face implementation state it, in double: inverse frequencies
 * of extrapolation base^(-2i/d) and interpolation base^(-2i/d) / factor, blended by a linear ramp
 * between the correction dimensions floor(d(β_fast)) and ceil(d(β_slow)). */
static void test_yarn(void **state)
{
    (void)state;
    static const struct { int n_rot; float base, factor; int orig; int lo, hi; } cases[] = {
        {64, 150000.0f, 32.0f, 4096, 8, 18},  /* gpt-oss-20b / 120b */
        {64, 10000.0f, 32.0f, 4096, 10, 23},  /* tests/arch-ref/yarn.json's tiny llama */
        {128, 1000000.0f, 4.0f, 32768, 0, 0}, /* Qwen3's long-context YaRN (lo/hi computed below) */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int d = cases[c].n_rot;
        double base = cases[c].base, factor = cases[c].factor;
        double dlo = floor(d * log(cases[c].orig / (32.0 * 2 * M_PI)) / (2 * log(base)));
        double dhi = ceil(d * log(cases[c].orig / (1.0 * 2 * M_PI)) / (2 * log(base)));
        dlo = dlo < 0 ? 0 : dlo;
        dhi = dhi > d - 1 ? d - 1 : dhi;
        if (cases[c].lo || cases[c].hi) {
            assert_int_equal((int)dlo, cases[c].lo);
            assert_int_equal((int)dhi, cases[c].hi);
        }
        float ff[128];
        op_rope_yarn_factors(ff, d, cases[c].base, cases[c].factor, cases[c].orig, 32.0f, 1.0f, 1.0f, NULL);
        for (int i = 0; i < d / 2; i++) {
            double extra = pow(base, -2.0 * i / d), inter = extra / factor;
            double lin = (i - dlo) / (dhi - dlo > 0.001 ? dhi - dlo : 0.001);
            double mask_extra = 1.0 - (lin < 0 ? 0 : lin > 1 ? 1 : lin);
            double want = inter * (1 - mask_extra) + extra * mask_extra;
            double got = extra / ff[i];
            if (fabs(got - want) > 1e-6 * want) /* float arithmetic: a few ulp */ fail_msg("case %zu pair %d: frequency %.9g, expected %.9g", c, i, got, want);
            if (i <= (int)dlo) assert_float_equal(ff[i], 1.0f, 0);
            if (i >= (int)dhi) assert_float_equal(ff[i], cases[c].factor, 1e-5 * factor);
        }
        /* ext_factor 0: plain linear interpolation everywhere */
        op_rope_yarn_factors(ff, d, cases[c].base, cases[c].factor, cases[c].orig, 32.0f, 1.0f, 0.0f, NULL);
        for (int i = 0; i < d / 2; i++) assert_float_equal(ff[i], cases[c].factor, 1e-5 * factor);
    }
    /* the attention factor sqrt(1/t) = 0.1 ln(s) + 1 (the paper's eq. for the temperature) */
    assert_float_equal(op_rope_yarn_mscale(32.0f, 1.0f, 1.0f, 0.0f), 1.0 + 0.1 * log(32.0), 1e-6);
    assert_float_equal(op_rope_yarn_mscale(32.0f, 0.5f, 1.0f, 0.0f), 0.5 * (1.0 + 0.1 * log(32.0)), 1e-6);
    assert_float_equal(op_rope_yarn_mscale(32.0f, 1.0f, 0.0f, 0.0f), 1.0, 0);
    /* through op_rope_cache: a pair's angle at position p is p · base^(-2i/d) / ff[i] */
    float ff[32], cs[64];
    op_rope_yarn_factors(ff, 64, 150000.0f, 32.0f, 4096, 32.0f, 1.0f, 1.0f, NULL);
    op_rope_cache(cs, 1000, 64, 150000.0f, ff);
    for (int i = 0; i < 32; i++) {
        double th = 1000.0 * pow(150000.0, -2.0 * i / 64) / ff[i];
        assert_float_equal(cs[2 * i], cos(th), 2e-4);
        assert_float_equal(cs[2 * i + 1], sin(th), 2e-4);
    }
}

/* gpt-oss's SwiGLU: gate clamped above at 7, up clamped to ±7, g·σ(1.702 g)·(u + 1). */
static void test_swiglu_oai(void **state)
{
    (void)state;
    float gate[8] = {10.0f, -10.0f, 0.0f, 1.0f, -1.0f, 3.0f, 7.0f, 6.5f};
    const float up[8] = {-9.0f, 2.0f, 5.0f, -1.0f, 0.5f, 20.0f, 0.0f, -7.5f};
    double want[8];
    for (int i = 0; i < 8; i++) {
        double g = gate[i] > 7 ? 7 : gate[i], u = up[i] > 7 ? 7 : up[i] < -7 ? -7 : up[i];
        want[i] = g / (1 + exp(-1.702 * g)) * (u + 1);
    }
    op_swiglu_oai(gate, up, 8, 1.702f, 7.0f);
    for (int i = 0; i < 8; i++) assert_float_equal(gate[i], want[i], 1e-5 * (1 + fabs(want[i])));
    assert_float_equal(gate[0], 7.0 / (1 + exp(-1.702 * 7)) * -6.0, 1e-5); /* both clamps */
    assert_float_equal(gate[1], -10.0 / (1 + exp(17.02)) * 3.0, 1e-6);    /* no lower clamp on the gate */
    assert_float_equal(gate[3], 0.0, 0);                                  /* up = -1 closes the gate */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_sinks),
        cmocka_unit_test(test_yarn),
        cmocka_unit_test(test_swiglu_oai),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
