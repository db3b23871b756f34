/* test_sampler: unit tests for engine/sampler — every stage on hand-made distributions, the RNG against published vectors, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

/* ---------------------------------------------------------------------------------------
 * helpers */

/* All truncation stages and penalties off, temperature 1, a fixed seed. */
static sampler_params off_params(void)
{
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = 1;
    return p;
}

static sampler *mk(int32_t n, const sampler_params *p)
{
    kv_error e = {0};
    sampler *s = sampler_create(n, p, &e);
    if (!s)
        fail_msg("sampler_create: %s", e.msg);
    return s;
}

static int32_t draw(sampler *s, const float *logits)
{
    kv_error e = {0};
    int32_t t = -1;
    int rc = sampler_sample(s, logits, &t, &e);
    if (rc != KV_OK)
        fail_msg("sampler_sample: %s", e.msg);
    return t;
}

/* The surviving ids (ascending) and probabilities; returns their count. */
static int32_t dist(sampler *s, const float *logits, int32_t *ids, float *probs)
{
    kv_error e = {0};
    int32_t n = -1;
    int rc = sampler_dist(s, logits, ids, probs, &n, &e);
    if (rc != KV_OK)
        fail_msg("sampler_dist: %s", e.msg);
    return n;
}

static void expect_ids(const int32_t *got, int32_t n_got, const int32_t *want, int32_t n_want)
{
    assert_int_equal(n_got, n_want);
    for (int32_t i = 0; i < n_want; i++)
        assert_int_equal(got[i], want[i]);
}

static void expect_msg(const kv_error *e, const char *needle)
{
    if (!strstr(e->msg, needle))
        fail_msg("error message '%s' does not contain '%s'", e->msg, needle);
}

/* Test-data generator (independent of the code under test): xorshift64*, Box-Muller. */
static uint64_t tr_state = 88172645463325252u;
static double tr_uniform(void)
{
    tr_state ^= tr_state >> 12;
    tr_state ^= tr_state << 25;
    tr_state ^= tr_state >> 27;
    return (double)((tr_state * 2685821657736338717u) >> 11) * 0x1.0p-53;
}
static float tr_gauss(double sd)
{
    double u1 = tr_uniform(), u2 = tr_uniform();
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sd * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
static float *random_logits(int32_t n, double sd)
{
    float *l = malloc((size_t)n * sizeof *l);
    assert_non_null(l);
    for (int32_t i = 0; i < n; i++)
        l[i] = tr_gauss(sd);
    return l;
}

/* reference ordering: logit descending, then id ascending */
static const float *ref_logits;
static int cmp_ref(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (ref_logits[x] != ref_logits[y])
        return ref_logits[x] > ref_logits[y] ? -1 : 1;
    return (x > y) - (x < y);
}
static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* ---------------------------------------------------------------------------------------
 * RNG */

/* SplitMix64 from seed 1477776061723855037: the first five of the values the rand_xoshiro
 * crate's `reference` test pins, produced there with Vigna's splitmix64.c. */
static void test_rng_splitmix64_reference(void **state)
{
    (void)state;
    const uint64_t want[5] = {1985237415132408290u, 2979275885539914483u,
                              13511426838097143398u, 8488337342461049707u,
                              15141737807933549159u};
    uint64_t st = 1477776061723855037u;
    for (int i = 0; i < 5; i++)
        assert_true(sampler_splitmix64(&st) == want[i]);
}

/* xoshiro256** from state {1,2,3,4}: values produced with Vigna's xoshiro256starstar.c, as
 * pinned by rand_xoshiro's and morinim/xoshiro256ss's reference tests. */
static void test_rng_xoshiro256ss_reference(void **state)
{
    (void)state;
    const uint64_t want[10] = {11520u,
                               0u,
                               1509978240u,
                               1215971899390074240u,
                               1216172134540287360u,
                               607988272756665600u,
                               16172922978634559625u,
                               8476171486693032832u,
                               10595114339597558777u,
                               2904607092377533576u};
    sampler_rng r = {{1, 2, 3, 4}};
    for (int i = 0; i < 10; i++)
        assert_true(sampler_rng_next(&r) == want[i]);
}

/* seeding = four SplitMix64 outputs */
static void test_rng_seed_is_splitmix64(void **state)
{
    (void)state;
    sampler_rng r;
    sampler_rng_seed(&r, 1477776061723855037u);
    assert_true(r.s[0] == 1985237415132408290u);
    assert_true(r.s[1] == 2979275885539914483u);
    assert_true(r.s[2] == 13511426838097143398u);
    assert_true(r.s[3] == 8488337342461049707u);
}

/* uniform = (x >> 11) * 2^-53, in [0,1) */
static void test_rng_uniform_mapping(void **state)
{
    (void)state;
    sampler_rng r = {{1, 2, 3, 4}};
    assert_true(sampler_rng_uniform(&r) == 5.0 * 0x1.0p-53); /* 11520 >> 11 = 5 */
    assert_true(sampler_rng_uniform(&r) == 0.0);             /* output 0: 0 is reachable */
    sampler_rng a, b;
    sampler_rng_seed(&a, 99);
    b = a;
    for (int i = 0; i < 100000; i++) {
        double u = sampler_rng_uniform(&a);
        uint64_t x = sampler_rng_next(&b);
        assert_true(u == (double)(x >> 11) / 9007199254740992.0);
        assert_true(u >= 0.0 && u < 1.0);
    }
    /* the largest output maps below 1 */
    assert_true((double)(UINT64_MAX >> 11) * 0x1.0p-53 < 1.0);
}

/* the sampler's draw is the documented inverse CDF over ascending ids with the documented
 * uniform: reproduce it from the public RNG and sampler_dist */
static void test_draw_is_documented_inverse_cdf(void **state)
{
    (void)state;
    const float l[5] = {logf(0.1f), logf(0.2f), -INFINITY, logf(0.3f), logf(0.4f)};
    sampler_params p = off_params();
    p.seed = 42;
    sampler *s = mk(5, &p);
    int32_t ids[5];
    float probs[5];
    int32_t m = dist(s, l, ids, probs);
    assert_int_equal(m, 4);
    sampler_rng r;
    sampler_rng_seed(&r, 42);
    for (int i = 0; i < 2000; i++) {
        double u = sampler_rng_uniform(&r);
        double cum = 0.0;
        int32_t want = ids[m - 1];
        for (int32_t j = 0; j < m; j++) {
            cum += probs[j];
            if (u < cum) {
                want = ids[j];
                break;
            }
        }
        assert_int_equal(draw(s, l), want);
    }
    sampler_free(s);
}

/* ---------------------------------------------------------------------------------------
 * parameters */

static void test_params_default(void **state)
{
    (void)state;
    sampler_params p;
    sampler_params_default(&p);
    assert_true(p.temperature == 0.8f);
    assert_int_equal(p.top_k, 40);
    assert_true(p.top_p == 0.95f);
    assert_true(p.min_p == 0.05f);
    assert_true(p.repeat_penalty == 1.0f);
    assert_int_equal(p.repeat_last_n, 64);
    assert_true(p.presence_penalty == 0.0f);
    assert_true(p.frequency_penalty == 0.0f);
    assert_true(p.seed == SAMPLER_SEED_RANDOM);
    kv_error e = {0};
    assert_int_equal(sampler_params_validate(&p, &e), KV_OK);
}

static void expect_invalid(sampler_params p, const char *needle)
{
    kv_error e = {0};
    assert_int_equal(sampler_params_validate(&p, &e), KV_ERR_INVALID);
    assert_int_equal(e.code, KV_ERR_INVALID);
    expect_msg(&e, needle);
    /* create refuses it with the same message */
    kv_error e2 = {0};
    assert_null(sampler_create(10, &p, &e2));
    assert_int_equal(e2.code, KV_ERR_INVALID);
    expect_msg(&e2, needle);
}

static void expect_valid(sampler_params p)
{
    kv_error e = {0};
    if (sampler_params_validate(&p, &e) != KV_OK)
        fail_msg("rejected a valid params: %s", e.msg);
}

static void test_validate(void **state)
{
    (void)state;
    sampler_params d;
    sampler_params_default(&d);
    sampler_params p;

    p = d; p.top_p = 1.5f;            expect_invalid(p, "top_p 1.5 not in [0, 1]");
    p = d; p.top_p = -0.25f;          expect_invalid(p, "top_p -0.25");
    p = d; p.top_p = NAN;             expect_invalid(p, "top_p nan");
    p = d; p.min_p = 2.0f;            expect_invalid(p, "min_p 2 not in [0, 1]");
    p = d; p.min_p = -0.5f;           expect_invalid(p, "min_p -0.5");
    p = d; p.temperature = INFINITY;  expect_invalid(p, "temperature inf");
    p = d; p.temperature = NAN;       expect_invalid(p, "temperature nan");
    p = d; p.repeat_penalty = 0.0f;   expect_invalid(p, "repeat_penalty 0");
    p = d; p.repeat_penalty = -1.0f;  expect_invalid(p, "repeat_penalty -1");
    p = d; p.repeat_penalty = NAN;    expect_invalid(p, "repeat_penalty nan");
    p = d; p.repeat_last_n = -2;      expect_invalid(p, "repeat_last_n -2 not in [-1, 65536]");
    p = d; p.repeat_last_n = SAMPLER_MAX_LAST_N + 1; expect_invalid(p, "repeat_last_n 65537");
    p = d; p.presence_penalty = 2.5f; expect_invalid(p, "presence_penalty 2.5 not in [-2, 2]");
    p = d; p.frequency_penalty = -3.0f; expect_invalid(p, "frequency_penalty -3");

    kv_error e = {0};
    assert_int_equal(sampler_params_validate(NULL, &e), KV_ERR_INVALID);

    /* the edges of every range are valid */
    p = d; p.top_p = 0.0f; expect_valid(p);
    p = d; p.top_p = 1.0f; expect_valid(p);
    p = d; p.min_p = 0.0f; expect_valid(p);
    p = d; p.min_p = 1.0f; expect_valid(p);
    p = d; p.temperature = -1.0f; expect_valid(p);
    p = d; p.temperature = 0.0f; expect_valid(p);
    p = d; p.temperature = 100.0f; expect_valid(p);
    p = d; p.top_k = -5; expect_valid(p);
    p = d; p.top_k = INT32_MAX; expect_valid(p);
    p = d; p.repeat_last_n = -1; expect_valid(p);
    p = d; p.repeat_last_n = 0; expect_valid(p);
    p = d; p.repeat_last_n = SAMPLER_MAX_LAST_N; expect_valid(p);
    p = d; p.presence_penalty = -2.0f; p.frequency_penalty = 2.0f; expect_valid(p);
    p = d; p.seed = 0; expect_valid(p);
}

static void test_create_errors(void **state)
{
    (void)state;
    kv_error e = {0};
    assert_null(sampler_create(0, NULL, &e));
    assert_int_equal(e.code, KV_ERR_INVALID);
    expect_msg(&e, "n_vocab 0");
    assert_null(sampler_create(-7, NULL, &e));
    expect_msg(&e, "n_vocab -7");
    /* NULL params = defaults */
    sampler *s = sampler_create(100, NULL, &e);
    assert_non_null(s);
    assert_int_equal(sampler_get_params(s)->top_k, 40);
    sampler_free(s);
    sampler_free(NULL);
}

/* params made invalid through set_params: sample refuses without drawing */
static void test_invalid_params_at_sample(void **state)
{
    (void)state;
    const float l[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    sampler_params p = off_params();
    sampler *a = mk(4, &p), *b = mk(4, &p);
    sampler_params bad = p;
    bad.top_p = 7.0f;
    sampler_set_params(a, &bad);
    kv_error e = {0};
    int32_t t = -123;
    assert_int_equal(sampler_sample(a, l, &t, &e), KV_ERR_INVALID);
    assert_int_equal(t, -123);
    expect_msg(&e, "top_p 7");
    sampler_set_params(a, &p);
    for (int i = 0; i < 50; i++)
        assert_int_equal(draw(a, l), draw(b, l)); /* no RNG output was used */
    assert_int_equal(sampler_sample(a, l, NULL, &e), KV_ERR_INVALID);
    assert_int_equal(sampler_sample(a, NULL, &t, &e), KV_ERR_INVALID);
    sampler_free(a);
    sampler_free(b);
}

/* ---------------------------------------------------------------------------------------
 * greedy and top-k */

static void test_greedy_ties_lowest_id(void **state)
{
    (void)state;
    sampler_params p = off_params();
    p.temperature = 0.0f;
    const float l1[5] = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f};
    sampler *s = mk(5, &p);
    assert_int_equal(draw(s, l1), 1);
    p.temperature = -0.5f; /* any T <= 0 */
    sampler_set_params(s, &p);
    assert_int_equal(draw(s, l1), 1);
    const float l2[5] = {-1.0f, -0.0f, 0.0f, -INFINITY, -2.0f}; /* -0 and +0 tie */
    assert_int_equal(draw(s, l2), 1);
    const float l3[5] = {-INFINITY, -INFINITY, 5.0f, 5.0f, -INFINITY};
    assert_int_equal(draw(s, l3), 2);
    int32_t ids[5];
    float probs[5];
    assert_int_equal(dist(s, l1, ids, probs), 1);
    assert_int_equal(ids[0], 1);
    assert_true(probs[0] == 1.0f);
    sampler_free(s);
}

/* greedy draws no random number: switching to T > 0 afterwards continues the stream from
 * its start */
static void test_greedy_uses_no_rng(void **state)
{
    (void)state;
    const float l[6] = {0.1f, 0.5f, 0.2f, 0.9f, 0.3f, 0.0f};
    sampler_params g = off_params(), t1 = off_params();
    g.temperature = 0.0f;
    sampler *a = mk(6, &g), *b = mk(6, &t1);
    for (int i = 0; i < 20; i++)
        assert_int_equal(draw(a, l), 3);
    sampler_set_params(a, &t1);
    for (int i = 0; i < 100; i++)
        assert_int_equal(draw(a, l), draw(b, l));
    sampler_free(a);
    sampler_free(b);
}

static void test_top_k1_is_greedy(void **state)
{
    (void)state;
    const int32_t n = 3000;
    float *l = random_logits(n, 2.0);
    l[2500] = l[1200] = l[1999] = 12.0f; /* tied maxima: the lowest id, 1200, wins */
    sampler_params p = off_params(), g = off_params();
    p.top_k = 1;
    g.temperature = 0.0f;
    sampler *s = mk(n, &p), *sg = mk(n, &g);
    assert_int_equal(draw(sg, l), 1200);
    for (float T = 0.25f; T < 20.0f; T *= 2.0f) {
        p.temperature = T;
        sampler_set_params(s, &p);
        for (int i = 0; i < 50; i++)
            assert_int_equal(draw(s, l), 1200);
    }
    sampler_free(s);
    sampler_free(sg);
    free(l);
}

static void test_top_k_small_exact(void **state)
{
    (void)state;
    const float l[7] = {0.0f, 5.0f, 3.0f, 5.0f, 1.0f, 3.0f, 4.0f};
    sampler_params p = off_params();
    p.top_k = 3;
    sampler *s = mk(7, &p);
    int32_t ids[7];
    float probs[7];
    int32_t m = dist(s, l, ids, probs);
    expect_ids(ids, m, (const int32_t[]){1, 3, 6}, 3);
    double z = 2.0 * exp(5.0) + exp(4.0);
    assert_float_equal(probs[0], exp(5.0) / z, 1e-6);
    assert_float_equal(probs[1], exp(5.0) / z, 1e-6);
    assert_float_equal(probs[2], exp(4.0) / z, 1e-6);
    /* the boundary falls inside the tie at 3.0: the lower id (2) is kept, 5 is not */
    p.top_k = 4;
    sampler_set_params(s, &p);
    m = dist(s, l, ids, probs);
    expect_ids(ids, m, (const int32_t[]){1, 2, 3, 6}, 4);
    sampler_free(s);
}

/* heap (k <= 1024) and quickselect (k > 1024) paths against a full sort, with many ties */
static void test_top_k_matches_sort(void **state)
{
    (void)state;
    const int32_t n = 20000;
    float *l = random_logits(n, 3.0);
    for (int32_t i = 0; i < n; i++)
        l[i] = roundf(l[i] * 4.0f) / 4.0f; /* coarse values: many ties at every boundary */
    for (int32_t i = 0; i < n; i += 97)
        l[i] = -INFINITY;
    int32_t *order = malloc((size_t)n * sizeof *order), *ids = malloc((size_t)n * sizeof *ids);
    float *probs = malloc((size_t)n * sizeof *probs);
    assert_true(order && ids && probs);
    for (int32_t i = 0; i < n; i++)
        order[i] = i;
    ref_logits = l;
    qsort(order, (size_t)n, sizeof *order, cmp_ref);

    int32_t ks[48] = {1, 2, 7, 40, 1024, 1025, 5000, 19000};
    for (int i = 8; i < 48; i++)
        ks[i] = 1025 + (int32_t)(tr_uniform() * (n - 1100)); /* the quickselect path */
    sampler_params p = off_params();
    sampler *s = mk(n, &p);
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        p.top_k = ks[t];
        sampler_set_params(s, &p);
        int32_t m = dist(s, l, ids, probs);
        int32_t nfinite = n - (n + 96) / 97;
        int32_t want_n = ks[t] < nfinite ? ks[t] : nfinite;
        int32_t *want = malloc((size_t)want_n * sizeof *want);
        memcpy(want, order, (size_t)want_n * sizeof *want);
        qsort(want, (size_t)want_n, sizeof *want, cmp_i32);
        expect_ids(ids, m, want, want_n);
        free(want);
    }
    sampler_free(s);
    free(order);
    free(ids);
    free(probs);
    free(l);
}

/* all-equal logits: top-k keeps the k lowest ids, on the heap path (in the scalar tail and
 * after skipped blocks) and on the quickselect path, where -0 and +0 must tie too */
static void test_top_k_ties_keep_lowest_ids(void **state)
{
    (void)state;
    const int32_t sizes[] = {7, 20, 1000, 3000};
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        const int32_t n = sizes[t];
        float *l = malloc((size_t)n * sizeof *l);
        int32_t *ids = malloc((size_t)n * sizeof *ids), *want = malloc((size_t)n * sizeof *want);
        float *probs = malloc((size_t)n * sizeof *probs);
        assert_true(l && ids && probs && want);
        for (int32_t i = 0; i < n; i++) {
            l[i] = (i % 2) ? -0.0f : 0.0f;
            want[i] = i;
        }
        const int32_t ks[] = {1, 2, 3, 6, 1500, 2999};
        sampler_params p = off_params();
        sampler *s = mk(n, &p);
        for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) {
            if (ks[c] >= n)
                continue;
            p.top_k = ks[c];
            sampler_set_params(s, &p);
            expect_ids(ids, dist(s, l, ids, probs), want, ks[c]);
        }
        sampler_free(s);
        free(l);
        free(ids);
        free(want);
        free(probs);
    }
}

/* ---------------------------------------------------------------------------------------
 * top-p and min-p */

static void test_top_p_keeps_two_of_three(void **state)
{
    (void)state;
    const float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    sampler_params p = off_params();
    p.top_p = 0.6f;
    p.seed = 2024;
    sampler *s = mk(3, &p);
    int32_t ids[3];
    float probs[3];
    int32_t m = dist(s, l, ids, probs);
    expect_ids(ids, m, (const int32_t[]){0, 1}, 2);
    assert_float_equal(probs[0], 0.625, 1e-6);
    assert_float_equal(probs[1], 0.375, 1e-6);

    /* 100k draws: only 0 and 1, in ratio 5:3. count0 ~ Binomial(N, 5/8): sd = 153.1;
     * the bound is 5 sd (two-sided p ~ 6e-7) */
    const int N = 100000;
    int cnt[3] = {0, 0, 0};
    for (int i = 0; i < N; i++)
        cnt[draw(s, l)]++;
    assert_int_equal(cnt[2], 0);
    assert_int_equal(cnt[0] + cnt[1], N);
    double sd = sqrt(N * 0.625 * 0.375);
    if (fabs(cnt[0] - N * 0.625) > 5.0 * sd)
        fail_msg("count of token 0 = %d, expected %g +- %g", cnt[0], N * 0.625, 5.0 * sd);
    sampler_free(s);
}

/* four equal tokens (p = 0.25 exactly): top_p 0.5 keeps exactly the two lowest ids */
static void test_top_p_four_way_tie(void **state)
{
    (void)state;
    float l[10];
    for (int i = 0; i < 10; i++)
        l[i] = -INFINITY;
    l[2] = l[4] = l[6] = l[8] = 1.0f;
    sampler_params p = off_params();
    sampler *s = mk(10, &p);
    int32_t ids[10];
    float probs[10];
    struct {
        float top_p;
        int32_t n;
    } cases[] = {{0.5f, 2}, {0.51f, 3}, {0.25f, 1}, {0.0f, 1}, {0.75f, 3}, {0.99f, 4}};
    const int32_t all[4] = {2, 4, 6, 8};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        p.top_p = cases[c].top_p;
        sampler_set_params(s, &p);
        int32_t m = dist(s, l, ids, probs);
        expect_ids(ids, m, all, cases[c].n);
        for (int32_t j = 0; j < m; j++)
            assert_float_equal(probs[j], 1.0 / m, 1e-7);
    }
    sampler_free(s);

    /* the same on a large vocabulary (the partition path): 2000 tied tokens, top_p 0.5
     * keeps the 1000 lowest ids among them */
    const int32_t n = 5000;
    float *big = malloc((size_t)n * sizeof *big);
    int32_t *bids = malloc((size_t)n * sizeof *bids);
    float *bprobs = malloc((size_t)n * sizeof *bprobs);
    int32_t *want = malloc(1000 * sizeof *want);
    assert_true(big && bids && bprobs && want);
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        int tied = (i * 7919) % 5 < 2; /* a scattered 2000 of them */
        big[i] = tied ? 0.0f : -INFINITY;
        if (tied && k < 1000)
            want[k++] = i;
    }
    p = off_params();
    p.top_p = 0.5f;
    sampler *sb = mk(n, &p);
    int32_t m = dist(sb, big, bids, bprobs);
    expect_ids(bids, m, want, 1000);
    sampler_free(sb);
    free(big);
    free(bids);
    free(bprobs);
    free(want);
}

/* top-p on a big random vocabulary equals the definition computed with a full sort */
static void test_top_p_matches_sort(void **state)
{
    (void)state;
    const int32_t n = 50000;
    float *l = random_logits(n, 3.0);
    int32_t *order = malloc((size_t)n * sizeof *order), *ids = malloc((size_t)n * sizeof *ids);
    float *probs = malloc((size_t)n * sizeof *probs);
    double *w = malloc((size_t)n * sizeof *w);
    assert_true(order && ids && probs && w);
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        mx = l[i] > mx ? l[i] : mx;
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) {
        w[i] = expf(l[i] - mx);
        z += w[i];
        order[i] = i;
    }
    ref_logits = l;
    qsort(order, (size_t)n, sizeof *order, cmp_ref);

    const float tps[] = {0.0f, 0.1f, 0.5f, 0.9f, 0.95f, 0.999f};
    sampler_params p = off_params();
    sampler *s = mk(n, &p);
    for (size_t t = 0; t < sizeof tps / sizeof tps[0]; t++) {
        double target = (double)tps[t] * z, cum = 0.0;
        int32_t c = 0;
        while (c < n) {
            cum += w[order[c++]];
            if (cum >= target)
                break;
        }
        int32_t *want = malloc((size_t)c * sizeof *want);
        memcpy(want, order, (size_t)c * sizeof *want);
        qsort(want, (size_t)c, sizeof *want, cmp_i32);
        p.top_p = tps[t];
        sampler_set_params(s, &p);
        int32_t m = dist(s, l, ids, probs);
        expect_ids(ids, m, want, c);
        free(want);
    }
    sampler_free(s);
    free(order);
    free(ids);
    free(probs);
    free(w);
    free(l);
}

/* top-p's probabilities are renormalized over what top-k kept (llama.cpp): probabilities
 * .4 .3 .2 .1 with top_k 2 become 4/7, 3/7, so top_p 0.5 keeps one token, where it would
 * keep two without top-k */
static void test_top_p_after_top_k_renormalizes(void **state)
{
    (void)state;
    const float l[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    sampler_params p = off_params();
    p.top_p = 0.5f;
    sampler *s = mk(4, &p);
    int32_t ids[4];
    float probs[4];
    expect_ids(ids, dist(s, l, ids, probs), (const int32_t[]){0, 1}, 2);
    p.top_k = 2;
    sampler_set_params(s, &p);
    expect_ids(ids, dist(s, l, ids, probs), (const int32_t[]){0}, 1);
    sampler_free(s);
}

static void test_min_p(void **state)
{
    (void)state;
    const float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    sampler_params p = off_params();
    sampler *s = mk(3, &p);
    int32_t ids[3];
    float probs[3];
    struct {
        float min_p;
        int32_t n;
    } cases[] = {{0.5f, 2}, {0.7f, 1}, {0.3f, 3}, {1.0f, 1}, {0.01f, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        p.min_p = cases[c].min_p;
        sampler_set_params(s, &p);
        int32_t m = dist(s, l, ids, probs);
        expect_ids(ids, m, (const int32_t[]){0, 1, 2}, cases[c].n);
    }
    p.min_p = 0.5f;
    sampler_set_params(s, &p);
    dist(s, l, ids, probs);
    assert_float_equal(probs[0], 0.625, 1e-6);
    /* min_p 1 keeps every token tied at the max */
    const float t[3] = {2.0f, 1.0f, 2.0f};
    p.min_p = 1.0f;
    sampler_set_params(s, &p);
    expect_ids(ids, dist(s, t, ids, probs), (const int32_t[]){0, 2}, 2);
    sampler_free(s);
}

/* temperature comes after top-p and min-p: they select on the untempered distribution. With
 * T = 0.5 applied first, .5/.3 would become .735/.265 and top_p 0.6 / min_p 0.5 would each
 * keep only token 0. */
static void test_temperature_after_truncation(void **state)
{
    (void)state;
    const float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    sampler_params p = off_params();
    p.temperature = 0.5f;
    p.top_p = 0.6f;
    sampler *s = mk(3, &p);
    int32_t ids[3];
    float probs[3];
    expect_ids(ids, dist(s, l, ids, probs), (const int32_t[]){0, 1}, 2);
    assert_float_equal(probs[0], 0.25 / 0.34, 1e-6);
    assert_float_equal(probs[1], 0.09 / 0.34, 1e-6);
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    sampler_set_params(s, &p);
    expect_ids(ids, dist(s, l, ids, probs), (const int32_t[]){0, 1}, 2);
    /* temperature alone: p^(1/T) renormalized */
    p = off_params();
    p.temperature = 2.0f;
    sampler_set_params(s, &p);
    dist(s, l, ids, probs);
    double z = sqrt(0.5) + sqrt(0.3) + sqrt(0.2);
    assert_float_equal(probs[0], sqrt(0.5) / z, 1e-6);
    assert_float_equal(probs[1], sqrt(0.3) / z, 1e-6);
    assert_float_equal(probs[2], sqrt(0.2) / z, 1e-6);
    sampler_free(s);
}

/* ---------------------------------------------------------------------------------------
 * penalties */

static void expect_penalized(sampler *s, const float *l, const float *want, int32_t n)
{
    float out[16];
    kv_error e = {0};
    if (sampler_penalize(s, l, out, &e) != KV_OK)
        fail_msg("sampler_penalize: %s", e.msg);
    for (int32_t i = 0; i < n; i++)
        if (out[i] != want[i])
            fail_msg("token %d: penalized logit %.9g, expected %.9g", i, out[i], want[i]);
}

static void test_repeat_penalty_exact(void **state)
{
    (void)state;
    const float l[6] = {2.0f, -2.0f, 0.0f, 1.0f, 3.0f, 0.5f};
    sampler_params p = off_params();
    p.repeat_penalty = 2.0f;
    sampler *s = mk(6, &p);
    sampler_accept(s, 0);
    sampler_accept(s, 1);
    sampler_accept(s, 2);
    sampler_accept(s, 0);
    /* > 0 divided, <= 0 multiplied; a token repeated in the window is penalized once */
    expect_penalized(s, l, (const float[]){1.0f, -4.0f, 0.0f, 1.0f, 3.0f, 0.5f}, 6);
    p.repeat_last_n = 2; /* only the last two: 2, 0 */
    sampler_set_params(s, &p);
    expect_penalized(s, l, (const float[]){1.0f, -2.0f, 0.0f, 1.0f, 3.0f, 0.5f}, 6);
    p.repeat_last_n = -1; /* everything held */
    sampler_set_params(s, &p);
    expect_penalized(s, l, (const float[]){1.0f, -4.0f, 0.0f, 1.0f, 3.0f, 0.5f}, 6);
    /* the penalized logits are what greedy sees: 3.0 vs 1.0 → 4 either way; make 0 win
     * without penalty and lose with it */
    const float g[3] = {3.0f, 2.9f, 1.0f};
    p = off_params();
    p.temperature = 0.0f;
    p.repeat_penalty = 1.5f;
    sampler *sg = mk(3, &p);
    assert_int_equal(draw(sg, g), 0);
    sampler_accept(sg, 0);
    assert_int_equal(draw(sg, g), 1);
    sampler_free(sg);
    sampler_free(s);
}

static void test_presence_frequency_exact(void **state)
{
    (void)state;
    const float l[6] = {2.0f, -2.0f, 0.0f, 1.0f, 3.0f, 0.5f};
    sampler_params p = off_params();
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    sampler *s = mk(6, &p);
    sampler_accept(s, 0);
    sampler_accept(s, 1);
    sampler_accept(s, 2);
    sampler_accept(s, 0);
    /* logit -= count * frequency + presence: token 0 twice, 1 and 2 once */
    expect_penalized(s, l, (const float[]){1.0f, -2.75f, -0.75f, 1.0f, 3.0f, 0.5f}, 6);
    /* all three: repeat first, then the subtraction (llama.cpp's order) */
    p.repeat_penalty = 2.0f;
    sampler_set_params(s, &p);
    expect_penalized(s, l, (const float[]){0.0f, -4.75f, -0.75f, 1.0f, 3.0f, 0.5f}, 6);
    /* negative values encourage repeats */
    p = off_params();
    p.presence_penalty = -0.5f;
    sampler_set_params(s, &p);
    expect_penalized(s, l, (const float[]){2.5f, -1.5f, 0.5f, 1.0f, 3.0f, 0.5f}, 6);
    p.presence_penalty = 0.0f;
    p.frequency_penalty = -2.0f;
    sampler_set_params(s, &p);
    expect_penalized(s, l, (const float[]){6.0f, 0.0f, 2.0f, 1.0f, 3.0f, 0.5f}, 6);
    /* a penalty that raises a token above the old max moves greedy to it */
    p.temperature = 0.0f;
    sampler_set_params(s, &p);
    assert_int_equal(draw(s, l), 0);
    sampler_free(s);
}

/* the history ring keeps the last SAMPLER_MAX_LAST_N tokens; out-of-range tokens are ignored */
static void test_history_ring(void **state)
{
    (void)state;
    const float l[4] = {100.0f, 100.0f, 100.0f, 100.0f};
    sampler_params p = off_params();
    p.frequency_penalty = 0.0009765625f; /* 2^-10: every product below is exact */
    p.repeat_last_n = -1;
    sampler *s = mk(4, &p);
    sampler_accept(s, -1);
    sampler_accept(s, 4);
    sampler_accept(s, INT32_MAX);
    expect_penalized(s, l, l, 4);
    sampler_accept(s, 3); /* pushed out of the ring below */
    for (int i = 0; i < SAMPLER_MAX_LAST_N; i++)
        sampler_accept(s, 1);
    sampler_accept(s, 2);
    /* ring: 65535 x token 1, then token 2 */
    expect_penalized(s, l, (const float[]){100.0f, 100.0f - 65535.0f / 1024.0f,
                                            100.0f - 1.0f / 1024.0f, 100.0f}, 4);
    p.repeat_last_n = 3;
    sampler_set_params(s, &p);
    expect_penalized(s, l, (const float[]){100.0f, 100.0f - 2.0f / 1024.0f,
                                            100.0f - 1.0f / 1024.0f, 100.0f}, 4);
    sampler_reset(s);
    expect_penalized(s, l, l, 4);
    sampler_free(s);
}

/* ---------------------------------------------------------------------------------------
 * off stages are exact no-ops */

static void test_off_stages_bitwise_noop(void **state)
{
    (void)state;
    const int32_t n = 4000;
    float *l = random_logits(n, 2.0);
    for (int32_t i = 0; i < n; i += 10)
        l[i] = -INFINITY; /* 400 masked → 3600 finite */
    float *out = malloc((size_t)n * sizeof *out);
    int32_t *ia = malloc((size_t)n * sizeof *ia), *ib = malloc((size_t)n * sizeof *ib);
    float *pa = malloc((size_t)n * sizeof *pa), *pb = malloc((size_t)n * sizeof *pb);
    assert_true(out && ia && ib && pa && pb);

    /* penalties off (repeat 1, presence 0, frequency 0) with a history, and penalties on
     * with repeat_last_n 0: the logits come through bit for bit */
    sampler_params p = off_params();
    sampler *s = mk(n, &p);
    for (int i = 0; i < 500; i++)
        sampler_accept(s, (int32_t)(tr_uniform() * n));
    kv_error e = {0};
    assert_int_equal(sampler_penalize(s, l, out, &e), KV_OK);
    assert_memory_equal(out, l, (size_t)n * sizeof *l);
    sampler_params q = p;
    q.repeat_penalty = 1.3f;
    q.presence_penalty = 0.5f;
    q.frequency_penalty = 0.5f;
    q.repeat_last_n = 0;
    sampler_set_params(s, &q);
    assert_int_equal(sampler_penalize(s, l, out, &e), KV_OK);
    assert_memory_equal(out, l, (size_t)n * sizeof *l);

    /* a sampler with that history and one without: the same tokens */
    sampler_set_params(s, &p);
    sampler *fresh = mk(n, &p);
    for (int i = 0; i < 300; i++)
        assert_int_equal(draw(s, l), draw(fresh, l));
    sampler_free(fresh);
    sampler_free(s);

    /* top_k 0 / -3 / n_vocab / INT32_MAX / the number of finite tokens, with top_p 1 and
     * min_p 0: identical distributions (bitwise) and identical token streams */
    const int32_t ks[] = {-3, n, INT32_MAX, 3600};
    sampler *ref = mk(n, &p);
    int32_t ma = dist(ref, l, ia, pa);
    assert_int_equal(ma, 3600);
    int32_t ref_tokens[200];
    for (int i = 0; i < 200; i++)
        ref_tokens[i] = draw(ref, l);
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        sampler_params r = p;
        r.top_k = ks[t];
        sampler *x = mk(n, &r);
        int32_t mb = dist(x, l, ib, pb);
        assert_int_equal(mb, ma);
        assert_memory_equal(ia, ib, (size_t)ma * sizeof *ia);
        assert_memory_equal(pa, pb, (size_t)ma * sizeof *pa);
        for (int i = 0; i < 200; i++)
            assert_int_equal(draw(x, l), ref_tokens[i]);
        sampler_free(x);
    }
    /* a min_p so small it removes nothing: same set, so the same tokens */
    sampler_params r = p;
    r.min_p = 1e-30f;
    sampler *x = mk(n, &r);
    assert_int_equal(dist(x, l, ib, pb), ma);
    assert_memory_equal(pa, pb, (size_t)ma * sizeof *pa);
    for (int i = 0; i < 200; i++)
        assert_int_equal(draw(x, l), ref_tokens[i]);
    sampler_free(x);
    sampler_free(ref);
    free(out);
    free(ia);
    free(ib);
    free(pa);
    free(pb);
    free(l);
}

/* ---------------------------------------------------------------------------------------
 * non-finite logits */

static void test_nonfinite(void **state)
{
    (void)state;
    const int32_t n = 16;
    float l[16];
    for (int i = 0; i < n; i++)
        l[i] = (float)i * 0.1f;
    sampler_params p;
    sampler_params_default(&p);
    p.seed = 5;
    sampler *s = mk(n, &p), *twin = mk(n, &p);
    kv_error e = {0};
    int32_t t = -123;
    int32_t ids[16];
    float probs[16], out[16];
    int32_t m = -1;

    l[7] = NAN;
    assert_int_equal(sampler_sample(s, l, &t, &e), KV_ERR_NONFINITE);
    assert_int_equal(t, -123);
    expect_msg(&e, "token 7");
    assert_int_equal(sampler_dist(s, l, ids, probs, &m, &e), KV_ERR_NONFINITE);
    assert_int_equal(sampler_penalize(s, l, out, &e), KV_ERR_NONFINITE);
    l[7] = 0.7f;
    l[3] = INFINITY;
    assert_int_equal(sampler_sample(s, l, &t, &e), KV_ERR_NONFINITE);
    expect_msg(&e, "token 3");
    /* greedy checks too */
    sampler_params g = p;
    g.temperature = 0.0f;
    sampler_set_params(s, &g);
    assert_int_equal(sampler_sample(s, l, &t, &e), KV_ERR_NONFINITE);
    assert_int_equal(t, -123);
    sampler_set_params(s, &p);
    l[3] = 0.3f;
    /* the failed calls drew nothing */
    for (int i = 0; i < 50; i++)
        assert_int_equal(draw(s, l), draw(twin, l));

    /* every token masked */
    float all[16];
    for (int i = 0; i < n; i++)
        all[i] = -INFINITY;
    assert_int_equal(sampler_sample(s, all, &t, &e), KV_ERR_NONFINITE);
    expect_msg(&e, "-inf");
    assert_int_equal(t, -123);

    /* some masked: never drawn, also when top_k exceeds the finite count */
    float some[16];
    for (int i = 0; i < n; i++)
        some[i] = (i % 3 == 0) ? 0.5f : -INFINITY;
    sampler_params q = off_params();
    q.temperature = 1.5f;
    q.top_k = 12;
    sampler_set_params(s, &q);
    for (int i = 0; i < 5000; i++)
        assert_int_equal(draw(s, some) % 3, 0);
    sampler_free(s);
    sampler_free(twin);
}

/* a penalty that overflows a logit to +inf is reported, and leaves no state behind */
static void test_penalty_overflow(void **state)
{
    (void)state;
    float l[4] = {3e38f, 1.0f, 2.0f, 0.0f};
    sampler_params p = off_params();
    p.repeat_penalty = 0.5f; /* 3e38 / 0.5 = 6e38 > FLT_MAX */
    sampler *s = mk(4, &p);
    sampler_accept(s, 2);
    sampler_accept(s, 0);
    sampler_accept(s, 0);
    kv_error e = {0};
    int32_t t = -123;
    assert_int_equal(sampler_sample(s, l, &t, &e), KV_ERR_NONFINITE);
    expect_msg(&e, "token 0");
    assert_int_equal(t, -123);
    p.repeat_penalty = 2.0f;
    sampler_set_params(s, &p);
    expect_penalized(s, l, (const float[]){1.5e38f, 1.0f, 1.0f, 0.0f}, 4);
    sampler_free(s);
}

/* ---------------------------------------------------------------------------------------
 * statistics and seeds */

static double chi_square(const int *obs, const double *p, int k, int n)
{
    double chi2 = 0.0;
    for (int i = 0; i < k; i++) {
        double ex = n * p[i];
        chi2 += (obs[i] - ex) * (obs[i] - ex) / ex;
    }
    return chi2;
}

/* 100k draws against the exact softmax. Critical values of the chi-square distribution at
 * p = 0.001: 27.877 for 9 degrees of freedom, 18.467 for 4 (standard tables; checked by
 * integrating the regularized upper incomplete gamma function: Q = 0.0010001, 0.0009999). */
static void test_frequencies_chi_square(void **state)
{
    (void)state;
    const float l[10] = {0.0f, 0.5f, 1.0f, -1.0f, 2.0f, 0.25f, -0.5f, 1.5f, 0.75f, -2.0f};
    const int N = 100000;
    double pe[10], z = 0.0;
    for (int i = 0; i < 10; i++)
        z += exp((double)l[i]);
    for (int i = 0; i < 10; i++)
        pe[i] = exp((double)l[i]) / z;
    sampler_params p = off_params();
    p.seed = 12345;
    sampler *s = mk(10, &p);
    int cnt[10] = {0};
    for (int i = 0; i < N; i++)
        cnt[draw(s, l)]++;
    double c1 = chi_square(cnt, pe, 10, N);
    if (c1 >= 27.877)
        fail_msg("chi-square %g >= 27.877 (df 9, p = 0.001)", c1);

    /* T = 0.7 with top_k 5: softmax(logit / 0.7) over the five best (ids 4 7 2 8 1) */
    const int keep[5] = {4, 7, 2, 8, 1};
    double pk[5];
    z = 0.0;
    for (int i = 0; i < 5; i++)
        z += exp((double)l[keep[i]] / 0.7);
    for (int i = 0; i < 5; i++)
        pk[i] = exp((double)l[keep[i]] / 0.7) / z;
    p.temperature = 0.7f;
    p.top_k = 5;
    sampler_set_params(s, &p);
    int all[10] = {0}, ck[5];
    for (int i = 0; i < N; i++)
        all[draw(s, l)]++;
    int inside = 0;
    for (int i = 0; i < 5; i++) {
        ck[i] = all[keep[i]];
        inside += ck[i];
    }
    assert_int_equal(inside, N);
    double c2 = chi_square(ck, pk, 5, N);
    if (c2 >= 18.467)
        fail_msg("chi-square %g >= 18.467 (df 4, p = 0.001)", c2);
    sampler_free(s);
}

static void test_seed_reproducible(void **state)
{
    (void)state;
    float l[50];
    for (int i = 0; i < 50; i++)
        l[i] = (float)(i % 7) * 0.3f;
    sampler_params p = off_params();
    p.seed = 7;
    sampler *a = mk(50, &p), *b = mk(50, &p);
    p.seed = 8;
    sampler *c = mk(50, &p);
    int32_t first[300];
    int differ = 0;
    for (int i = 0; i < 300; i++) {
        first[i] = draw(a, l);
        assert_int_equal(first[i], draw(b, l));
        differ += first[i] != draw(c, l);
    }
    assert_true(differ > 100);
    assert_true(sampler_seed(a) == 7);
    /* reset restarts the stream of a fixed seed */
    sampler_reset(a);
    for (int i = 0; i < 300; i++)
        assert_int_equal(draw(a, l), first[i]);
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
}

/* parameters may change between any two samples: the RNG position only depends on how many
 * non-greedy samples were drawn; a changed seed reseeds */
static void test_params_change_mid_stream(void **state)
{
    (void)state;
    const int32_t n = 500;
    float *l = random_logits(n, 1.5);
    sampler_params p1 = off_params(), p2;
    sampler_params_default(&p2);
    p1.seed = p2.seed = 31;
    p2.top_k = 5;
    p2.temperature = 0.6f;
    sampler *a = mk(n, &p1), *b = mk(n, &p2);
    for (int i = 0; i < 25; i++) {
        (void)draw(a, l);
        (void)draw(b, l);
    }
    /* swap the sliders: both now sample with the other's params, at the same RNG position */
    sampler_set_params(a, &p2);
    sampler_set_params(b, &p2);
    for (int i = 0; i < 100; i++)
        assert_int_equal(draw(a, l), draw(b, l));
    /* set_params with the same seed keeps the stream: compare with an untouched twin */
    sampler *c = mk(n, &p2), *d = mk(n, &p2);
    for (int i = 0; i < 50; i++) {
        sampler_set_params(c, &p2);
        assert_int_equal(draw(c, l), draw(d, l));
    }
    /* a new seed reseeds */
    sampler_params p3 = p2;
    p3.seed = 99;
    sampler_set_params(c, &p3);
    sampler *e = mk(n, &p3);
    for (int i = 0; i < 50; i++)
        assert_int_equal(draw(c, l), draw(e, l));
    assert_true(sampler_seed(c) == 99);
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
    sampler_free(d);
    sampler_free(e);
    free(l);
}

/* SAMPLER_SEED_RANDOM picks a seed that can be read back and replayed */
static void test_random_seed_replayable(void **state)
{
    (void)state;
    float l[64];
    for (int i = 0; i < 64; i++)
        l[i] = (float)(i % 5) * 0.4f;
    sampler_params p = off_params();
    p.seed = SAMPLER_SEED_RANDOM;
    sampler *a = mk(64, &p), *a2 = mk(64, &p);
    assert_true(sampler_seed(a) != SAMPLER_SEED_RANDOM);
    assert_true(sampler_get_params(a)->seed == SAMPLER_SEED_RANDOM);
    assert_true(sampler_seed(a) != sampler_seed(a2)); /* equal with probability 2^-64 */
    sampler_params r = p;
    r.seed = sampler_seed(a);
    sampler *b = mk(64, &r);
    for (int i = 0; i < 200; i++)
        assert_int_equal(draw(a, l), draw(b, l));
    /* reset picks a fresh seed, again readable */
    uint64_t old = sampler_seed(a);
    sampler_reset(a);
    assert_true(sampler_seed(a) != old);
    r.seed = sampler_seed(a);
    sampler *c = mk(64, &r);
    for (int i = 0; i < 200; i++)
        assert_int_equal(draw(a, l), draw(c, l));
    sampler_free(a);
    sampler_free(a2);
    sampler_free(b);
    sampler_free(c);
}

/* a Qwen2-sized vocabulary with the default chain and a repeat penalty: every token comes
 * from the 40 best after penalties, so from the 40 + 30 best raw logits */
static void test_large_vocab_defaults(void **state)
{
    (void)state;
    const int32_t n = 152064;
    float *l = random_logits(n, 2.5);
    int32_t *order = malloc((size_t)n * sizeof *order);
    assert_non_null(order);
    for (int32_t i = 0; i < n; i++)
        order[i] = i;
    ref_logits = l;
    qsort(order, (size_t)n, sizeof *order, cmp_ref);
    sampler_params p;
    sampler_params_default(&p);
    p.seed = 3;
    p.repeat_penalty = 1.1f;
    sampler *s = mk(n, &p);
    for (int i = 0; i < 30; i++) {
        int32_t t = draw(s, l);
        sampler_accept(s, t);
        int top = 0;
        for (int j = 0; j < 70; j++)
            top |= order[j] == t;
        assert_true(top);
    }
    sampler_free(s);
    free(order);
    free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_splitmix64_reference),
        cmocka_unit_test(test_rng_xoshiro256ss_reference),
        cmocka_unit_test(test_rng_seed_is_splitmix64),
        cmocka_unit_test(test_rng_uniform_mapping),
        cmocka_unit_test(test_draw_is_documented_inverse_cdf),
        cmocka_unit_test(test_params_default),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_invalid_params_at_sample),
        cmocka_unit_test(test_greedy_ties_lowest_id),
        cmocka_unit_test(test_greedy_uses_no_rng),
        cmocka_unit_test(test_top_k1_is_greedy),
        cmocka_unit_test(test_top_k_small_exact),
        cmocka_unit_test(test_top_k_matches_sort),
        cmocka_unit_test(test_top_k_ties_keep_lowest_ids),
        cmocka_unit_test(test_top_p_keeps_two_of_three),
        cmocka_unit_test(test_top_p_four_way_tie),
        cmocka_unit_test(test_top_p_matches_sort),
        cmocka_unit_test(test_top_p_after_top_k_renormalizes),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_temperature_after_truncation),
        cmocka_unit_test(test_repeat_penalty_exact),
        cmocka_unit_test(test_presence_frequency_exact),
        cmocka_unit_test(test_history_ring),
        cmocka_unit_test(test_off_stages_bitwise_noop),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_penalty_overflow),
        cmocka_unit_test(test_frequencies_chi_square),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_params_change_mid_stream),
        cmocka_unit_test(test_random_seed_replayable),
        cmocka_unit_test(test_large_vocab_defaults),
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
