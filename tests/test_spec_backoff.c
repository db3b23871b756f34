/* test_spec_backoff: the speculative drafter's back-off schedule (engine/speculate.c) — pauses of 4^f - 1 steps after f rejected first drafts in a row, reset by an accepted one, the draft length following the acceptance; a draft model measured to cost a target step per token stops. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine/generate.h"
#include "engine/speculate.h"
#include "tests/support/testutil.h"

/* a context that always has a lookup draft: a period of 3 tokens repeated */
static int32_t H[60];

static spec_state *lookup_state(int draft_max)
{
    for (int i = 0; i < 60; i++) H[i] = 10 + i % 3;
    spec_params p;
    spec_params_default(&p);
    p.mode = SPEC_LOOKUP;
    p.draft_max = draft_max;
    spec_state *st = spec_state_create(&p, 32, 64, 1);
    assert_non_null(st);
    return st;
}

/* Steps until the drafter proposes again (each call is one decode step); its draft length. */
static int pause_then_draft(spec_state *st, int *k)
{
    int32_t d[SPEC_MAX_DRAFT];
    kv_error err = {0};
    for (int steps = 0; steps < 1000; steps++)
        if ((*k = spec_propose(st, H, 60, 8, NULL, d, &err)) > 0) return steps;
    return -1;
}

/* stories260K opened as a draft model (n_ctx positions, 1 thread) and a greedy sampler over its
 * 512 tokens; the draft history hist[0..n): tokens 1..500 in a fixed pseudo-random order. */
static void open_draft(int n_ctx, engine **d, sampler **s, int32_t *hist, int n)
{
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = tu_path("models/stories260K.gguf");
    ep.n_ctx = n_ctx;
    ep.n_threads = 1;
    kv_error err = {0};
    *d = NULL;
    assert_int_equal(engine_open(&ep, d, &err), KV_OK);
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    *s = sampler_create(512, &sp, &err);
    assert_non_null(*s);
    for (int i = 0; i < n; i++) hist[i] = 1 + (i * 37) % 500;
}

/* A draft-model drafter over d: stops before a token of probability below min_p; no_backoff as
 * spec_params. */
static spec_state *draft_state(engine *d, float min_p, int no_backoff)
{
    spec_params p;
    spec_params_default(&p);
    p.mode = SPEC_DRAFT;
    p.draft = d;
    p.draft_min_p = min_p;
    p.no_backoff = no_backoff;
    spec_state *st = spec_state_create(&p, 512, 64, 1);
    assert_non_null(st);
    return st;
}

static void test_pauses(void **state)
{
    (void)state;
    spec_state *st = lookup_state(8);
    int k;
    assert_int_equal(pause_then_draft(st, &k), 0); /* drafts from the start */
    assert_int_equal(k, 2);                        /* a first draft of 2 */
    static const int want[] = {3, 15, 63, 255, 255, 255};
    for (int f = 0; f < 6; f++) { /* its first draft rejected, again and again */
        spec_feedback(st, k, 0);
        assert_int_equal(pause_then_draft(st, &k), want[f]);
        assert_int_equal(k, 1); /* the length follows the acceptance: 0 accepted + 1 */
    }
    spec_feedback(st, 1, 1); /* all accepted: no pause, the length grows by 2 */
    assert_int_equal(pause_then_draft(st, &k), 0);
    assert_int_equal(k, 3);
    spec_feedback(st, 3, 3);
    assert_int_equal(pause_then_draft(st, &k), 0);
    assert_int_equal(k, 5);
    spec_feedback(st, 5, 2); /* 2 of 5: no pause, length 3 */
    assert_int_equal(pause_then_draft(st, &k), 0);
    assert_int_equal(k, 3);
    spec_feedback(st, 3, 0); /* a rejection after an acceptance starts the schedule again */
    assert_int_equal(pause_then_draft(st, &k), 3);
    spec_state_free(st);
}

/* 400 steps of an always-rejected drafter: a handful of passes (the cost of rejected drafts) */
static void test_passes_in_400_steps(void **state)
{
    (void)state;
    spec_state *st = lookup_state(8);
    int32_t d[SPEC_MAX_DRAFT];
    kv_error err = {0};
    int passes = 0;
    for (int step = 0; step < 400; step++) {
        int k = spec_propose(st, H, 60, 8, NULL, d, &err);
        if (k > 0) {
            passes++;
            spec_feedback(st, k, 0);
        }
    }
    assert_int_equal(passes, 5); /* at steps 0, 4, 20, 84, 340 */
    spec_state_free(st);
}

/* A draft model that declines to draft (its top probability is below draft_min_p) ran a step for
 * nothing: it backs off too — 4 runs in 100 steps (0, 4, 20, 84), not 100. */
static void test_declining_draft_backs_off(void **state)
{
    (void)state;
    engine *d;
    sampler *s;
    kv_error err = {0};
    int32_t hist[160], drafts[SPEC_MAX_DRAFT];
    open_draft(256, &d, &s, hist, 160);
    spec_state *st = draft_state(d, 1.0f, 0); /* above any softmax maximum of a real row: always declines */
    int runs = 0, have = 0;
    for (int step = 0; step < 100; step++) {
        int k = spec_propose(st, hist, 20 + step, 8, s, drafts, &err);
        assert_int_equal(k, 0);
        int n;
        engine_seq_tokens(d, ENGINE_SEQ_DEFAULT, &n);
        if (n != have) runs++; /* the draft model read the context: it ran */
        have = n;
        spec_feedback(st, k, 0);
    }
    assert_int_equal(runs, 4);
    sampler_free(s);
    spec_state_free(st);
    engine_close(d);
}

/* A draft model whose drafts are all rejected, over 400 decode steps after a 40-token prompt:
 * paused steps read nothing, and a pass after a long pause re-reads at most SPEC_RESYNC_MAX
 * tokens — the draft model reads the prompt and a bounded amount per pass, not every token of
 * every pause (it used to catch up on all of them: 40 + 400 tokens and more). With its relative
 * cost set (spec_set_cost), the pauses stretch by 1 + ceil(c). */
static void test_rejected_draft_reads_little(void **state)
{
    (void)state;
    engine *d;
    sampler *s;
    kv_error err = {0};
    static int32_t hist[480];
    open_draft(512, &d, &s, hist, 480);
    for (int costly = 0; costly < 2; costly++) {
        spec_state *st = draft_state(d, 0, 0); /* always drafts */
        engine_seq_truncate(d, ENGINE_SEQ_DEFAULT, 0);
        if (costly) spec_set_cost(st, 4.2); /* pauses x 6 */
        assert_int_equal(spec_prefill(st, hist, 40, &err), KV_OK);
        assert_int_equal(spec_draft_read(st), 40); /* the prompt, whole */
        int32_t drafts[SPEC_MAX_DRAFT];
        int passes = 0, paused = 0;
        long read = 40;
        for (int step = 0; step < 400; step++) {
            int n = 41 + step; /* the prompt, the tokens so far and the pending one */
            int k = spec_propose(st, hist, n, 8, s, drafts, &err);
            assert_true(k >= 0);
            long now = spec_draft_read(st);
            if (k == 0) {
                paused++;
                assert_int_equal(now, read); /* a paused step: the draft model did not run */
            } else {
                passes++;
                /* the catch-up (at most SPEC_RESYNC_MAX) and k - 1 draft steps */
                assert_true(now - read <= SPEC_RESYNC_MAX + k);
                spec_feedback(st, k, 0);
            }
            read = now;
        }
        /* at steps 0, 4, 20, 84, 340; with c = 4.2: 0, 19, 110 */
        assert_int_equal(passes, costly ? 3 : 5);
        assert_int_equal(paused, 400 - passes);
        assert_true(read <= 40 + passes * (SPEC_RESYNC_MAX + 2));
        spec_state_free(st);
    }
    sampler_free(s);
    engine_close(d);
}

/* The measured cost (spec_time): a draft model that took at least a target step per drafted token
 * drafts no more (it never runs again: spec_propose returns 0 without reading a token); a cheaper
 * one goes on; lookup drafting, and a drafter with back-off off, are never stopped. */
static void test_costly_draft_stops(void **state)
{
    (void)state;
    engine *d;
    sampler *s;
    kv_error err = {0};
    static int32_t hist[200];
    open_draft(256, &d, &s, hist, 200);
    /* draft ms per token vs a plain step of 1 ms; no_backoff; want stopped */
    static const struct { double draft_ms_tok; int no_backoff; int want; } cases[] = {
        {1.5, 0, 1}, {1.0, 0, 1}, {0.4, 0, 0}, {3.0, 1, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        spec_state *st = draft_state(d, 0, cases[c].no_backoff);
        engine_seq_truncate(d, ENGINE_SEQ_DEFAULT, 0);
        assert_int_equal(spec_prefill(st, hist, 20, &err), KV_OK);
        int32_t drafts[SPEC_MAX_DRAFT];
        int k = spec_propose(st, hist, 21, 8, s, drafts, &err);
        assert_true(k > 0);
        spec_time(st, k, cases[c].draft_ms_tok * k);
        assert_int_equal(spec_too_costly(st), 0); /* no plain step timed yet: no verdict */
        spec_time(st, 0, 1.0);
        spec_time(st, 0, 1.0);
        assert_int_equal(spec_too_costly(st), cases[c].want);
        spec_feedback(st, k, k); /* accepted: no back-off pause */
        long read = spec_draft_read(st);
        int passes = 0;
        for (int step = 0; step < 100; step++) {
            int n = 22 + step;
            int kk = spec_propose(st, hist, n, 8, s, drafts, &err);
            assert_true(kk >= 0);
            if (kk > 0) {
                passes++;
                spec_feedback(st, kk, kk);
            }
        }
        if (cases[c].want) {
            assert_int_equal(passes, 0);
            assert_int_equal(spec_draft_read(st), read); /* the draft model never ran again */
        } else {
            assert_true(passes > 50);
        }
        spec_state_free(st);
    }
    /* lookup: never stopped however its passes are timed */
    spec_state *st = lookup_state(8);
    spec_time(st, 2, 10.0);
    spec_time(st, 0, 1.0);
    assert_int_equal(spec_too_costly(st), 0);
    spec_state_free(st);
    sampler_free(s);
    engine_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_pauses), cmocka_unit_test(test_passes_in_400_steps),
                                       cmocka_unit_test(test_declining_draft_backs_off),
                                       cmocka_unit_test(test_rejected_draft_reads_little),
                                       cmocka_unit_test(test_costly_draft_stops)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
