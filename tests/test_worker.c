/* test_worker: the generator thread on stories260K — streamed text equals a direct engine_generate, cancel, live parameters, prefix reuse, segments, busy and reset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/generate.h"
#include "engine/worker.h"
#include "tests/support/testutil.h"

typedef struct fixture {
    engine *e;
    sampler *s;
    worker *w;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = tu_path("models/stories260K.gguf");
    ep.n_ctx = 512;
    ep.n_threads = 1;
    kv_error err = {0};
    if (engine_open(&ep, &f->e, &err)) {
        fprintf(stderr, "engine_open: %s\n", err.msg);
        return -1;
    }
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    f->s = sampler_create(engine_model(f->e)->hp.n_vocab, &sp, &err);
    if (!f->s || worker_create(f->e, f->s, &f->w, &err)) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    worker_destroy(f->w);
    sampler_free(f->s);
    engine_close(f->e);
    free(f);
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct result {
    char text[65536];
    size_t len;
    int n_text_events, n_stats_events;
    worker_event done;
    double last_decode_tps;
} result;

/* Drain events until DONE (or timeout); after `cancel_after` bytes of text, cancel; after
 * `params_after` bytes, post *params. */
static void run_until_done(worker *w, result *r, size_t cancel_after, size_t params_after,
                           const sampler_params *params)
{
    memset(r, 0, sizeof *r);
    double t_end = now_ms() + 60000;
    int cancelled = 0, posted = 0;
    while (now_ms() < t_end) {
        struct pollfd pfd = {.fd = worker_fd(w), .events = POLLIN};
        poll(&pfd, 1, 100);
        worker_event ev;
        while (worker_next_event(w, &ev)) {
            if (ev.kind == WORKER_EV_TEXT) {
                assert_true(r->len + ev.len < sizeof r->text);
                memcpy(r->text + r->len, ev.text, ev.len);
                r->len += ev.len;
                r->n_text_events++;
            } else if (ev.kind == WORKER_EV_STATS) {
                r->n_stats_events++;
                if (ev.stats.gen.decode_tps > 0) r->last_decode_tps = ev.stats.gen.decode_tps;
                assert_true(ev.stats.kv.bytes_used == (size_t)ev.stats.kv.n_tokens * ev.stats.kv.bytes_per_token);
            } else if (ev.kind == WORKER_EV_DONE) {
                r->done = ev;
                return;
            }
            if (!cancelled && cancel_after && r->len >= cancel_after) {
                worker_cancel(w);
                cancelled = 1;
            }
            if (!posted && params && r->len >= params_after) {
                worker_set_params(w, params);
                posted = 1;
            }
        }
    }
    fail_msg("no DONE event within 60 s");
}

static void submit_text(worker *w, const char *text, int n_predict, int reset)
{
    worker_segment seg = {text, strlen(text), 0};
    worker_request rq = {.seg = &seg, .n_seg = 1, .n_predict = n_predict, .reset_cache = reset};
    kv_error err = {0};
    assert_int_equal(worker_submit(w, &rq, &err), KV_OK);
}

typedef struct acc {
    char text[65536];
    size_t len;
} acc;

static int acc_text(void *ud, const char *t, size_t n, int32_t tok)
{
    (void)tok;
    acc *a = ud;
    memcpy(a->text + a->len, t, n);
    a->len += n;
    return 0;
}

/* The streamed text equals what a direct engine_generate produces (greedy). */
static void test_stream_equals_direct(void **state)
{
    fixture *f = *state;
    static result r;
    submit_text(f->w, "Once upon a time", 48, 1);
    run_until_done(f->w, &r, 0, 0, NULL);
    assert_int_equal(r.done.status, KV_OK);
    assert_int_equal(r.done.finish, GEN_FINISH_LENGTH);
    assert_int_equal(r.done.stats.gen.n_generated, 48);
    assert_true(r.n_text_events >= 1);
    assert_true(r.n_stats_events >= 1 || r.done.stats.gen.decode_tps > 0);
    assert_int_equal(r.done.stats.kv.n_tokens, r.done.stats.gen.n_prompt + 47);

    /* the same on the engine directly, from an empty cache */
    engine_reset(f->e);
    sampler_reset(f->s);
    kv_error err = {0};
    int32_t *toks;
    size_t n;
    assert_int_equal(engine_tokenize(f->e, "Once upon a time", 16, 0, 0, &toks, &n, &err), KV_OK);
    static acc a;
    a.len = 0;
    gen_callbacks cb = {.on_text = acc_text, .ud = &a};
    int finish;
    assert_int_equal(engine_generate(f->e, toks, n, 48, f->s, &cb, NULL, &finish, &err), KV_OK);
    free(toks);
    assert_int_equal(a.len, r.len);
    assert_memory_equal(a.text, r.text, r.len);
}

/* A follow-up request that extends the conversation prefills only its new tokens. */
static void test_prefix_reuse(void **state)
{
    fixture *f = *state;
    static result r1, r2;
    submit_text(f->w, "Once upon a time", 16, 1);
    run_until_done(f->w, &r1, 0, 0, NULL);
    char next[70000];
    snprintf(next, sizeof next, "Once upon a time%.*s The cat", (int)r1.len, r1.text);
    submit_text(f->w, next, 8, 0);
    run_until_done(f->w, &r2, 0, 0, NULL);
    assert_int_equal(r2.done.status, KV_OK);
    assert_true(r2.done.stats.gen.n_reused >= r1.done.stats.gen.n_prompt);
    assert_true(r2.done.stats.gen.n_prefilled < r2.done.stats.gen.n_prompt / 2);
}

/* Appending extends the conversation's own tokens: a new message prefills only itself and the
 * reply's last token (never the re-tokenized history), and Enter-to-continue prefills one. */
static void test_append(void **state)
{
    fixture *f = *state;
    static result r1, r2, r3;
    submit_text(f->w, "Once upon a time", 40, 1);
    run_until_done(f->w, &r1, 0, 0, NULL);
    worker_segment seg = {" The cat", 8, 0};
    worker_request rq = {.seg = &seg, .n_seg = 1, .n_predict = 8, .append = 1};
    kv_error err = {0};
    assert_int_equal(worker_submit(f->w, &rq, &err), KV_OK);
    run_until_done(f->w, &r2, 0, 0, NULL);
    assert_int_equal(r2.done.status, KV_OK);
    /* prompt = 5 prompt tokens + 40 generated + "▁The ▁cat" */
    assert_int_equal(r2.done.stats.gen.n_reused, r1.done.stats.gen.n_prompt + 40 - 1);
    assert_true(r2.done.stats.gen.n_prefilled >= 2 && r2.done.stats.gen.n_prefilled <= 4);
    worker_request cont = {.n_seg = 0, .n_predict = 4, .append = 1};
    assert_int_equal(worker_submit(f->w, &cont, &err), KV_OK);
    run_until_done(f->w, &r3, 0, 0, NULL);
    assert_int_equal(r3.done.status, KV_OK);
    assert_int_equal(r3.done.stats.gen.n_prefilled, 1);
    assert_int_equal(r3.done.stats.gen.n_generated, 4);
}

/* The token limit can change mid-reply and stops it as a normal length finish. */
static void test_live_limit(void **state)
{
    fixture *f = *state;
    static result r;
    submit_text(f->w, "Once upon a time", -1, 1);
    memset(&r, 0, sizeof r);
    /* wait for text, then lower the limit to 30 */
    int seen = 0;
    for (int got = 0; !got;) {
        struct pollfd pfd = {.fd = worker_fd(f->w), .events = POLLIN};
        poll(&pfd, 1, 100);
        worker_event ev;
        while (worker_next_event(f->w, &ev)) {
            got |= ev.kind == WORKER_EV_TEXT;
            if (ev.kind == WORKER_EV_STATS) seen = ev.stats.gen.n_generated;
        }
    }
    worker_set_n_predict(f->w, 30);
    run_until_done(f->w, &r, 0, 0, NULL);
    assert_int_equal(r.done.status, KV_OK);
    assert_int_equal(r.done.finish, GEN_FINISH_LENGTH);
    /* at 30, or at the next token when more were out already when the limit came */
    assert_true(r.done.stats.gen.n_generated <= (seen + 8 > 30 ? seen + 8 : 30));
    assert_true(r.done.stats.gen.n_generated >= 1);
}

/* Cancel stops the reply within a decode step: far fewer tokens than asked. */
static void test_cancel(void **state)
{
    fixture *f = *state;
    static result r;
    submit_text(f->w, "Once upon a time", 400, 1);
    run_until_done(f->w, &r, 20, 0, NULL);
    assert_int_equal(r.done.status, KV_OK);
    assert_int_equal(r.done.finish, GEN_FINISH_CANCELLED);
    assert_true(r.done.stats.gen.n_generated < 400);
    assert_true(r.len >= 20);
}

/* Parameters posted mid-reply reach the sampler before the reply ends, and parameters
 * posted before a request apply from its first token. */
static void test_live_params(void **state)
{
    fixture *f = *state;
    static result r;
    sampler_params p = *sampler_get_params(f->s);
    p.temperature = 0.55f;
    p.top_k = 7;
    submit_text(f->w, "Once upon a time", 120, 1);
    run_until_done(f->w, &r, 0, 10, &p);
    assert_int_equal(r.done.status, KV_OK);
    assert_true(r.done.finish == GEN_FINISH_LENGTH || r.done.finish == GEN_FINISH_EOG);
    assert_float_equal(sampler_get_params(f->s)->temperature, 0.55f, 1e-6);
    assert_int_equal(sampler_get_params(f->s)->top_k, 7);

    /* greedy again, posted before the request: equal to a greedy reference */
    p.temperature = 0;
    worker_set_params(f->w, &p);
    static result g1, g2;
    submit_text(f->w, "Lily", 32, 1);
    run_until_done(f->w, &g1, 0, 0, NULL);
    submit_text(f->w, "Lily", 32, 1);
    run_until_done(f->w, &g2, 0, 0, NULL);
    assert_int_equal(g1.len, g2.len);
    assert_memory_equal(g1.text, g2.text, g1.len);
}

/* Scaffolding segments parse control tokens, content segments never do. */
static void test_segments(void **state)
{
    fixture *f = *state;
    static result r1, r2;
    worker_segment seg[2] = {{"<s>", 3, 1}, {"<s>", 3, 0}};
    worker_request rq = {.seg = seg, .n_seg = 1, .n_predict = 1, .reset_cache = 1, .no_bos = 1};
    kv_error err = {0};
    assert_int_equal(worker_submit(f->w, &rq, &err), KV_OK);
    run_until_done(f->w, &r1, 0, 0, NULL);
    rq.seg = &seg[1];
    assert_int_equal(worker_submit(f->w, &rq, &err), KV_OK);
    run_until_done(f->w, &r2, 0, 0, NULL);
    assert_int_equal(r1.done.stats.gen.n_prompt, 1);    /* the control token <s> */
    assert_true(r2.done.stats.gen.n_prompt > 1);        /* '<', 's', '>' as text */
}

/* A second submit while busy is refused; a reset-only request empties the cache. */
static void test_busy_and_reset(void **state)
{
    fixture *f = *state;
    static result r;
    submit_text(f->w, "Once upon a time", 200, 1);
    assert_true(worker_busy(f->w));
    worker_segment seg = {"x", 1, 0};
    worker_request rq = {.seg = &seg, .n_seg = 1, .n_predict = 1};
    kv_error err = {0};
    assert_int_equal(worker_submit(f->w, &rq, &err), KV_ERR_INVALID);
    run_until_done(f->w, &r, 1, 0, NULL);
    assert_int_equal(r.done.finish, GEN_FINISH_CANCELLED);
    assert_false(worker_busy(f->w));
    assert_true(r.done.stats.kv.n_tokens > 0);
    worker_request reset = {.n_seg = 0, .reset_cache = 1};
    assert_int_equal(worker_submit(f->w, &reset, &err), KV_OK);
    run_until_done(f->w, &r, 0, 0, NULL);
    assert_int_equal(r.done.finish, GEN_FINISH_NONE);
    assert_int_equal(r.done.stats.kv.n_tokens, 0);
    assert_int_equal(r.done.stats.kv.bytes_used, 0);
    assert_true(r.done.stats.kv.bytes_reserved > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_equals_direct), cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_append),               cmocka_unit_test(test_live_limit),
        cmocka_unit_test(test_cancel),               cmocka_unit_test(test_live_params),
        cmocka_unit_test(test_segments),             cmocka_unit_test(test_busy_and_reset),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
