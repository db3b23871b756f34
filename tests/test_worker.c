/* test_worker: the generator thread on stories260K — streamed text equals a direct engine_generate, cancel, live parameters, prefix reuse, segments, busy and reset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdatomic.h>

#include "app/tools.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/worker.h"
#include "tests/support/testutil.h"

typedef struct fixture {
    engine *e;
    sampler *s;
    worker *w;
} fixture;

/* stories260K with n_ctx positions on one thread; NULL with err filled on failure. */
static engine *stories_engine(int n_ctx, kv_error *err)
{
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = tu_path("models/stories260K.gguf");
    ep.n_ctx = n_ctx;
    ep.n_threads = 1;
    engine *e = NULL;
    return engine_open(&ep, &e, err) == KV_OK ? e : NULL;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    kv_error err = {0};
    if (!(f->e = stories_engine(512, &err))) {
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

typedef struct result {
    char text[65536];
    size_t len;
    int n_text_events, n_stats_events;
    worker_event done;
    double last_decode_tps;
    int max_stats_gen;    /* largest live n_generated seen */
    int stats_gen_shrank; /* a STATS event reported fewer tokens than an earlier one */
    double last_ttft;     /* the TTFT of the last STATS event that had one */
    int max_prefill_total;/* prefill progress seen: its largest total */
} result;

/* Drain events until DONE (or timeout); after `cancel_after` bytes of text, cancel; after
 * `params_after` bytes, post *params. */
static void run_until_done(worker *w, result *r, size_t cancel_after, size_t params_after,
                           const sampler_params *params)
{
    memset(r, 0, sizeof *r);
    double t_end = tu_now_ms() + 60000;
    int cancelled = 0, posted = 0;
    while (tu_now_ms() < t_end) {
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
                if (ev.stats.gen.ttft_ms > 0) r->last_ttft = ev.stats.gen.ttft_ms;
                if (ev.stats.prefill_total > r->max_prefill_total) r->max_prefill_total = ev.stats.prefill_total;
                if (ev.stats.gen.n_generated < r->max_stats_gen) r->stats_gen_shrank = 1;
                if (ev.stats.gen.n_generated > r->max_stats_gen) r->max_stats_gen = ev.stats.gen.n_generated;
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

/* The TTFT the DONE event reports is the one the live stats showed (a figure does not change
 * after the reply ends); prefill progress reports the prompt's length. */
static void test_ttft_stays(void **state)
{
    fixture *f = *state;
    static result r;
    /* stats are coalesced: a fast reply may end before a live snapshot with a TTFT is taken;
     * try a few (long) replies until one is seen */
    for (int attempt = 0; attempt < 8; attempt++) {
        submit_text(f->w, "Once upon a time", 300, 1);
        run_until_done(f->w, &r, 0, 0, NULL);
        assert_int_equal(r.done.status, KV_OK);
        if (r.last_ttft > 0) break;
    }
    assert_true(r.last_ttft > 0);
    assert_true(r.done.stats.gen.ttft_ms == r.last_ttft);
    assert_int_equal(r.max_prefill_total, 5); /* BOS + 4 tokens */
}

typedef struct pf_probe {
    int calls, done[64], total;
    int stop_at; /* should_stop answers 1 once `done` reached this */
} pf_probe;

static void pf_progress(void *ud, int done, int total)
{
    pf_probe *p = ud;
    if (p->calls < 64) p->done[p->calls] = done;
    p->calls++;
    p->total = total;
}

static int pf_stop(void *ud)
{
    pf_probe *p = ud;
    return p->calls > 0 && p->done[(p->calls < 64 ? p->calls : 64) - 1] >= p->stop_at;
}

/* A sliced prefill honours a cancel between its chunks and keeps the chunks it computed: the
 * same prompt again reuses them (issue 16 #1). n_batch 8 bounds the chunks. */
static void test_prefill_cancel_keeps_chunks(void **state)
{
    (void)state;
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = tu_path("models/stories260K.gguf");
    ep.n_ctx = 256;
    ep.n_batch = 8;
    ep.n_threads = 1;
    engine *e = NULL;
    kv_error err = {0};
    assert_int_equal(engine_open(&ep, &e, &err), KV_OK);
    const char *text = "Once upon a time there was a little girl named Lily who loved to play outside in the sun";
    int32_t *t = NULL;
    size_t n = 0;
    assert_int_equal(engine_tokenize(e, text, strlen(text), 0, 0, &t, &n, &err), KV_OK);
    assert_true(n > 16);
    pf_probe p = {.stop_at = 8};
    gen_callbacks cb = {.should_stop = pf_stop, .on_prefill = pf_progress, .ud = &p, .prefill_slice_ms = 80};
    gen_stats st;
    assert_int_equal(engine_prefill_seq(e, ENGINE_SEQ_DEFAULT, t, n, &cb, &st, &err), KV_ERR_CANCELLED);
    assert_int_equal(p.total, (int)n);
    assert_int_equal(p.calls, 2);        /* before the first chunk, after it */
    assert_int_equal(p.done[0], 0);
    assert_int_equal(p.done[1], 8);      /* one chunk of n_batch */
    int held = 0;
    const int32_t *h = engine_seq_tokens(e, ENGINE_SEQ_DEFAULT, &held);
    assert_int_equal(held, 8);
    assert_memory_equal(h, t, 8 * sizeof *t);
    /* again, without a cancel: the 8 positions are reused, the rest prefilled in chunks */
    pf_probe q = {.stop_at = 1 << 30};
    cb.ud = &q;
    assert_int_equal(engine_prefill_seq(e, ENGINE_SEQ_DEFAULT, t, n, &cb, &st, &err), KV_OK);
    assert_int_equal(st.n_reused, 8);
    assert_int_equal(st.n_prefilled, (int)n - 8);
    assert_int_equal(q.done[0], 8);
    assert_int_equal(q.done[q.calls - 1], (int)n);
    free(t);
    engine_close(e);
}

/* should_abort stops a sliced prefill inside a chunk, between matmuls and (with threads) between
 * the pool's work chunks (issue 16: Esc within 100 ms when one forward pass takes longer): the
 * chunk being computed is not kept, the ones before are, and prefilling again gives the logits a
 * fresh engine gives. The stop comes `abort_at` polls into the second chunk (the first chunk's
 * size is the slicer's: n_batch, or fewer for a model whose tokens cost more). */
typedef struct abort_probe {
    engine *e;
    int abort_at;    /* polls after the first chunk is in before saying stop */
    atomic_int polls, fired, polls_chunk1, first; /* first: the tokens the first chunk committed */
} abort_probe;
static int abort_mid_chunk2(void *ud)
{
    abort_probe *a = ud;
    if (atomic_load(&a->fired)) return 1; /* sticky, as the worker's cancel flag */
    int held = kv_seq_n_tokens(engine_kv(a->e), ENGINE_SEQ_DEFAULT);
    int n = atomic_fetch_add(&a->polls, 1) + 1;
    if (held == 0) {
        atomic_store(&a->polls_chunk1, n);
        return 0;
    }
    if (!atomic_load(&a->first)) atomic_store(&a->first, held);
    if (n - atomic_load(&a->polls_chunk1) >= a->abort_at) {
        atomic_store(&a->fired, 1);
        return 1;
    }
    return 0;
}
static int never(void *ud)
{
    (void)ud;
    return 0;
}

static void prefill_abort_case(const char *path, int n_threads, int abort_at)
{
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = path;
    ep.n_ctx = 256;
    ep.n_batch = 8;
    ep.n_threads = n_threads;
    engine *e = NULL, *f = NULL;
    kv_error err = {0};
    assert_int_equal(engine_open(&ep, &e, &err), KV_OK);
    assert_int_equal(engine_open(&ep, &f, &err), KV_OK);
    int n_layer = engine_model(e)->hp.n_layer;
    const char *text = "Once upon a time there was a little girl named Lily who loved to play outside in the sun";
    int32_t *t = NULL;
    size_t n = 0;
    assert_int_equal(engine_tokenize(e, text, strlen(text), 0, 0, &t, &n, &err), KV_OK);
    assert_true(n > 24);
    abort_probe a = {.e = e, .abort_at = abort_at};
    gen_callbacks cb = {.should_stop = never, .should_abort = abort_mid_chunk2, .ud = &a, .prefill_slice_ms = 80};
    gen_stats st;
    assert_int_equal(engine_prefill_seq(e, ENGINE_SEQ_DEFAULT, t, n, &cb, &st, &err), KV_ERR_CANCELLED);
    assert_int_equal(atomic_load(&a.fired), 1);
    /* polled more often than once a layer: after the matmuls and attention, and by the pool */
    assert_true(atomic_load(&a.polls_chunk1) >= 4 * n_layer);
    int held = 0;
    const int32_t *h = engine_seq_tokens(e, ENGINE_SEQ_DEFAULT, &held);
    int first = atomic_load(&a.first);
    assert_true(first > 0 && first <= 8);
    assert_int_equal(held, first);               /* the first chunk; the second was cut short */
    assert_memory_equal(h, t, (size_t)first * sizeof *t);
    /* again, to the end: equal to a fresh engine that was never stopped */
    cb.should_abort = never;
    assert_int_equal(engine_prefill_seq(e, ENGINE_SEQ_DEFAULT, t, n, &cb, &st, &err), KV_OK);
    assert_int_equal(st.n_reused, first);
    assert_int_equal(engine_prefill_seq(f, ENGINE_SEQ_DEFAULT, t, n, &cb, &st, &err), KV_OK);
    int n_vocab = engine_model(e)->hp.n_vocab, best_e = 0, best_f = 0;
    const float *le = engine_logits(e), *lf = engine_logits(f);
    double maxd = 0;
    for (int i = 0; i < n_vocab; i++) {
        double d = fabs((double)le[i] - lf[i]);
        if (d > maxd) maxd = d;
        if (le[i] > le[best_e]) best_e = i;
        if (lf[i] > lf[best_f]) best_f = i;
    }
    assert_int_equal(best_e, best_f);
    assert_true(maxd < 1e-4);
    free(t);
    engine_close(e);
    engine_close(f);
}

static void test_prefill_abort_between_layers(void **state)
{
    (void)state;
    /* the stop falls at many places of the second chunk: the first op, mid-layer, the last op */
    const char *stories = tu_path("models/stories260K.gguf");
    for (int at = 1; at <= 40; at += 6) prefill_abort_case(stories, 1, at);
    for (int at = 1; at <= 40; at += 6) prefill_abort_case(stories, 2, at);
    /* a mixture of experts: a router cut short must not choose experts (moe_ffn looks first) */
    char moe[256];
    snprintf(moe, sizeof moe, "%s/kvchat-test-moe-abort-%d.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    gen_model_opts mo = {.n_layer = 2, .n_vocab = 512, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 64,
                         .n_ff_shexp = 64, .seed = 5};
    kv_error err = {0};
    assert_int_equal(gen_model_write_ex(moe, "qwen1.5-moe-a2.7b", "q8_0", &mo, &err), KV_OK);
    for (int at = 1; at <= 13; at += 4) prefill_abort_case(moe, 2, at);
    remove(moe);
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

/* A reply that runs past a context shift (n_ctx 64): the live token count keeps growing, the
 * DONE conversation is what the sequence holds plus the last token sampled, and the next turn
 * appends to it, reusing all of the cache. */
static void test_context_shift(void **state)
{
    (void)state;
    kv_error err = {0};
    engine *e = stories_engine(64, &err);
    assert_non_null(e);
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
    assert_non_null(s);
    worker *w = NULL;
    assert_int_equal(worker_create(e, s, &w, &err), KV_OK);
    static result r1, r2;
    submit_text(w, "Once upon a time", 62, 1); /* a request makes at most n_ctx tokens */
    run_until_done(w, &r1, 0, 0, NULL);
    assert_int_equal(r1.done.status, KV_OK);
    assert_int_equal(r1.done.finish, GEN_FINISH_LENGTH);
    assert_int_equal(r1.done.stats.gen.n_generated, 62);
    assert_true(r1.done.stats.gen.n_shifts >= 1);
    assert_false(r1.stats_gen_shrank);
    /* live stats are coalesced (only the newest is kept, and DONE supersedes a pending one), so
     * how far the ones seen got depends on when this thread drained them: at most the final */
    assert_true(r1.max_stats_gen <= 62);
    int nh = 0;
    const int32_t *hist = engine_seq_tokens(e, ENGINE_SEQ_DEFAULT, &nh);
    assert_int_equal(r1.done.n_conv, (size_t)nh + 1);
    assert_memory_equal(r1.done.conv, hist, (size_t)nh * sizeof *hist);
    size_t n_conv1 = r1.done.n_conv;
    worker_segment seg = {" The cat", 8, 0};
    worker_request rq = {.seg = &seg, .n_seg = 1, .n_predict = 8, .append = 1};
    assert_int_equal(worker_submit(w, &rq, &err), KV_OK);
    run_until_done(w, &r2, 0, 0, NULL);
    assert_int_equal(r2.done.status, KV_OK);
    assert_int_equal(r2.done.stats.gen.n_generated, 8);
    assert_int_equal(r2.done.stats.gen.n_reused, (int)n_conv1 - 1);
    assert_true(r2.done.stats.gen.n_prefilled >= 2 && r2.done.stats.gen.n_prefilled <= 4);
    assert_true(r2.len > 0);
    worker_destroy(w);
    sampler_free(s);
    engine_close(e);
}

/* A stop string spanning several tokens ends the reply (GEN_FINISH_STOP) and no byte of it is
 * shown: the text is exactly what came before it. */
static void test_stop_string(void **state)
{
    fixture *f = *state;
    static result r0, r1;
    submit_text(f->w, "Once upon a time", 40, 1);
    run_until_done(f->w, &r0, 0, 0, NULL);
    assert_true(r0.len > 40);
    char stop[16];
    memcpy(stop, r0.text + 20, 12);
    stop[12] = 0;
    int32_t *t = NULL;
    size_t nt = 0;
    kv_error err = {0};
    assert_int_equal(engine_tokenize(f->e, stop, 12, 1, 0, &t, &nt, &err), KV_OK);
    free(t);
    assert_true(nt >= 2); /* several tokens */
    const char *first = strstr(r0.text, stop);
    assert_non_null(first);
    size_t before = (size_t)(first - r0.text);
    const char *stops[] = {"never appears in stories 12345", stop};
    assert_int_equal(worker_set_stops(f->w, stops, 2), 0);
    submit_text(f->w, "Once upon a time", 40, 1);
    run_until_done(f->w, &r1, 0, 0, NULL);
    assert_int_equal(r1.done.status, KV_OK);
    assert_int_equal(r1.done.finish, GEN_FINISH_STOP);
    assert_string_equal(gen_finish_name(GEN_FINISH_STOP), "stop string");
    assert_int_equal(r1.len, before);
    assert_memory_equal(r1.text, r0.text, before);
    /* cleared: the whole reply again, nothing held back */
    assert_int_equal(worker_set_stops(f->w, NULL, 0), 0);
    submit_text(f->w, "Once upon a time", 40, 1);
    run_until_done(f->w, &r1, 0, 0, NULL);
    assert_int_equal(r1.done.finish, GEN_FINISH_LENGTH);
    assert_int_equal(r1.len, r0.len);
    assert_memory_equal(r1.text, r0.text, r0.len);
    /* a stop string that is only a prefix of the reply's tail is released at the end */
    char tail[8];
    memcpy(tail, r0.text + r0.len - 3, 3);
    memcpy(tail + 3, "\x01zz", 4);
    tail[7] = 0;
    const char *st2[] = {tail};
    assert_int_equal(worker_set_stops(f->w, st2, 1), 0);
    submit_text(f->w, "Once upon a time", 40, 1);
    run_until_done(f->w, &r1, 0, 0, NULL);
    assert_int_equal(r1.done.finish, GEN_FINISH_LENGTH);
    assert_int_equal(r1.len, r0.len);
    assert_memory_equal(r1.text, r0.text, r0.len);
    assert_int_equal(worker_set_stops(f->w, NULL, 0), 0);
}

/* ---- /edit and /branch at the engine level (engine_seq_*: what the chat does for them) ---- */

typedef struct toks_out {
    int32_t t[1024];
    int n;
    char text[8192];
    size_t len;
} toks_out;

static void tok_collect(void *ud, int32_t tok, int eog)
{
    toks_out *o = ud;
    if (!eog && o->n < 1024) o->t[o->n++] = tok;
}

static int text_collect(void *ud, const char *t, size_t n, int32_t tok)
{
    (void)tok;
    toks_out *o = ud;
    if (o->len + n < sizeof o->text) memcpy(o->text + o->len, t, n), o->len += n;
    return 0;
}

static engine *open_engine(void)
{
    kv_error err = {0};
    engine *e = stories_engine(512, &err);
    assert_non_null(e);
    return e;
}

/* Generate n tokens on seq from prompt p (greedy unless temp > 0), collecting tokens and text. */
static void gen_on(engine *e, sampler *s, int seq, const int32_t *p, size_t n, int n_predict, toks_out *o,
                   gen_stats *st)
{
    memset(o, 0, sizeof *o);
    sampler_reset(s);
    gen_callbacks cb = {.on_text = text_collect, .on_token = tok_collect, .ud = o};
    gen_opts go = {.n_predict = n_predict};
    int finish = 0;
    kv_error err = {0};
    assert_int_equal(engine_generate_seq(e, seq, p, n, &go, s, &cb, st, &finish, &err), KV_OK);
}

static size_t cat_tokens(engine *e, int32_t *dst, size_t n, const char *text, int bos)
{
    int32_t *t = NULL;
    size_t k = 0;
    kv_error err = {0};
    assert_int_equal(engine_tokenize(e, text, strlen(text), !bos, 0, &t, &k, &err), KV_OK);
    memcpy(dst + n, t, k * sizeof *t);
    free(t);
    return n + k;
}

/* /edit: fork the conversation (the original stays a branch), then answer the edited last
 * message on the conversation's sequence — the shared prefix is reused, and the greedy reply
 * equals a fresh run of the edited conversation in a new engine. /branch: a fork at the
 * branch point gets its own reply; both replies stay, each on its own sequence. */
static void test_edit_and_branch(void **state)
{
    (void)state;
    engine *e = open_engine();
    kv_error err = {0};
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
    assert_non_null(s);
    static int32_t conv[2048], edited[2048];
    static toks_out r1, r2, r2e, fresh, rb;
    gen_stats st;
    /* turn 1 and turn 2 */
    size_t n = cat_tokens(e, conv, 0, "Once upon a time", 1);
    gen_on(e, s, ENGINE_SEQ_DEFAULT, conv, n, 16, &r1, &st);
    memcpy(conv + n, r1.t, (size_t)r1.n * sizeof *conv);
    n += (size_t)r1.n;
    size_t n_before_user = n;
    memcpy(edited, conv, n * sizeof *conv);
    n = cat_tokens(e, conv, n, " The cat", 0);
    gen_on(e, s, ENGINE_SEQ_DEFAULT, conv, n, 16, &r2, &st);
    size_t n_orig_prompt = n;
    /* /edit " The cat" → " The dog": keep the original as a branch, re-answer on S */
    int orig = -1;
    assert_int_equal(engine_seq_fork(e, ENGINE_SEQ_DEFAULT, -1, &orig, &err), KV_OK);
    size_t ne = cat_tokens(e, edited, n_before_user, " The dog", 0);
    gen_on(e, s, ENGINE_SEQ_DEFAULT, edited, ne, 16, &r2e, &st);
    assert_true(st.n_reused >= (int)n_before_user); /* the shared prefix was not recomputed */
    assert_true(st.n_prefilled <= (int)(ne - n_before_user) + 1);
    /* a fresh run of the edited conversation in a new engine */
    engine *e2 = open_engine();
    gen_on(e2, s, ENGINE_SEQ_DEFAULT, edited, ne, 16, &fresh, &st);
    assert_int_equal(st.n_reused, 0);
    assert_int_equal(r2e.n, fresh.n);
    assert_memory_equal(r2e.t, fresh.t, (size_t)fresh.n * sizeof *fresh.t);
    assert_int_equal(r2e.len, fresh.len);
    assert_memory_equal(r2e.text, fresh.text, fresh.len);
    engine_close(e2);
    /* the original exchange is still there, on its branch */
    int no = 0;
    const int32_t *to = engine_seq_tokens(e, orig, &no);
    assert_int_equal(no, (int)n_orig_prompt + r2.n - 1); /* the last sampled token is not fed */
    assert_memory_equal(to, conv, n_orig_prompt * sizeof *conv);
    assert_memory_equal(to + n_orig_prompt, r2.t, (size_t)(r2.n - 1) * sizeof *r2.t);
    /* /branch: an alternative reply to the edited message, sampled (seed 7), on a fork */
    int br = -1;
    assert_int_equal(engine_seq_fork(e, ENGINE_SEQ_DEFAULT, (int)ne, &br, &err), KV_OK);
    sampler_params sp2 = sp;
    sp2.temperature = 1.0f;
    sp2.seed = 7;
    sampler_set_params(s, &sp2);
    gen_on(e, s, br, edited, ne, 16, &rb, &st);
    assert_int_equal(st.n_reused, (int)ne - 1); /* nothing but the last prompt token recomputed */
    int nb = 0, nd = 0;
    const int32_t *tb = engine_seq_tokens(e, br, &nb);
    const int32_t *td = engine_seq_tokens(e, ENGINE_SEQ_DEFAULT, &nd);
    assert_int_equal(nb, (int)ne + rb.n - 1);
    assert_int_equal(nd, (int)ne + r2e.n - 1);
    assert_memory_equal(tb, edited, ne * sizeof *edited);
    assert_memory_equal(td, edited, ne * sizeof *edited);
    assert_memory_equal(tb + ne, rb.t, (size_t)(rb.n - 1) * sizeof *rb.t);
    assert_memory_equal(td + ne, r2e.t, (size_t)(r2e.n - 1) * sizeof *r2e.t);
    assert_int_equal(engine_seq_free(e, br), KV_OK);
    assert_int_equal(engine_seq_free(e, orig), KV_OK);
    sampler_free(s);
    engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_equals_direct), cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_append),               cmocka_unit_test(test_live_limit),
        cmocka_unit_test(test_cancel),               cmocka_unit_test(test_live_params),
        cmocka_unit_test(test_segments),             cmocka_unit_test(test_busy_and_reset),
        cmocka_unit_test(test_context_shift),        cmocka_unit_test(test_stop_string),
        cmocka_unit_test(test_edit_and_branch),
        cmocka_unit_test(test_ttft_stays),
        cmocka_unit_test(test_prefill_cancel_keeps_chunks),
        cmocka_unit_test(test_prefill_abort_between_layers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
