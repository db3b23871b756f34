/* test_gen_batch: streams stepped together by gen_batch_step (engine/gen_batch.h) produce exactly the text each produces alone through engine_generate_seq — greedy and seeded sampling, different lengths, a stream joining mid-way, prefix blocks another stream computed, best-of forks of one prefill, cancel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/gen_batch.h"
#include "engine/generate.h"
#include "tests/support/testutil.h"

#define N_STREAMS 5

typedef struct out {
    char text[4096];
    size_t len;
    int n_tokens;
    int stop_after; /* > 0: should_stop fires after this many tokens */
} out;

static int on_text(void *ud, const char *t, size_t n, int32_t tok)
{
    (void)tok;
    out *o = ud;
    if (o->len + n < sizeof o->text) memcpy(o->text + o->len, t, n), o->len += n;
    o->text[o->len] = 0;
    return 0;
}

static void on_token(void *ud, int32_t tok, int eog)
{
    (void)tok;
    (void)eog;
    ((out *)ud)->n_tokens++;
}

static int should_stop(void *ud)
{
    out *o = ud;
    return o->stop_after > 0 && o->n_tokens >= o->stop_after;
}

static engine *open_engine_ctx(int n_ctx)
{
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = tu_path("models/stories260K.gguf");
    ep.n_ctx = n_ctx;
    ep.n_batch = 64;
    ep.n_threads = 2;
    ep.kv_blocks = 8 * (n_ctx / 16);
    engine *e = NULL;
    kv_error err = {0};
    if (engine_open(&ep, &e, &err)) print_message("%s\n", err.msg);
    assert_non_null(e);
    return e;
}

static engine *open_engine(void) { return open_engine_ctx(256); }

static const char *prompts[N_STREAMS] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside",
    "The cat",
    "Once upon a time, there was a little girl named Lily. She loved to eat",
    "One day, a big dog ran to the park and saw a ball. The dog wanted to",
    "Tom and Sue",
};
static const float temps[N_STREAMS] = {0, 0, 0.8f, 0, 1.0f};
static const int n_predict[N_STREAMS] = {40, 25, 30, 60, 35};

static sampler *make_sampler(const engine *e, int i)
{
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = temps[i];
    sp.seed = 1234 + (uint64_t)i;
    kv_error err = {0};
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
    assert_non_null(s);
    return s;
}

static void tokenize(engine *e, const char *text, int32_t **toks, size_t *n)
{
    kv_error err = {0};
    assert_int_equal(engine_tokenize(e, text, strlen(text), 0, 0, toks, n, &err), KV_OK);
}

/* every stream alone, on a fresh sequence of a cold cache */
static void alone(engine *e, out *ref, int *fin)
{
    for (int i = 0; i < N_STREAMS; i++) {
        engine_drop_prefix_cache(e);
        int32_t *toks;
        size_t n;
        tokenize(e, prompts[i], &toks, &n);
        int seq;
        kv_error err = {0};
        assert_int_equal(engine_seq_new(e, &seq, &err), KV_OK);
        sampler *s = make_sampler(e, i);
        gen_opts o = {.n_predict = n_predict[i], .no_context_shift = 1};
        gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ud = &ref[i]};
        assert_int_equal(engine_generate_seq(e, seq, toks, n, &o, s, &cb, NULL, &fin[i], &err), KV_OK);
        engine_seq_free(e, seq);
        sampler_free(s);
        free(toks);
    }
    engine_drop_prefix_cache(e);
}

/* All five together; stream i joins at step 3 i; prefill budget 5 tokens a step. */
static void test_together(void **state)
{
    (void)state;
    engine *e = open_engine();
    static out ref[N_STREAMS], got[N_STREAMS];
    memset(ref, 0, sizeof ref);
    memset(got, 0, sizeof got);
    int fin_ref[N_STREAMS], fin[N_STREAMS];
    alone(e, ref, fin_ref);
    kv_error err = {0};
    gen_batch *b = gen_batch_create(e, N_STREAMS, &err);
    assert_non_null(b);
    gen_stream *gs[N_STREAMS];
    sampler *smp[N_STREAMS];
    int32_t *toks[N_STREAMS];
    size_t nt[N_STREAMS];
    int n_active = 0, max_rows = 0;
    for (int step = 0; step < 1000; step++) {
        if (step % 3 == 0 && n_active < N_STREAMS) {
            int i = n_active++, seq;
            tokenize(e, prompts[i], &toks[i], &nt[i]);
            assert_int_equal(engine_seq_new(e, &seq, &err), KV_OK);
            smp[i] = make_sampler(e, i);
            gen_opts o = {.n_predict = n_predict[i], .no_context_shift = 1};
            gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ud = &got[i]};
            assert_int_equal(gen_stream_begin(e, seq, toks[i], nt[i], &o, smp[i], &cb, 0, &gs[i], &err), KV_OK);
        }
        int r = gen_batch_step(b, gs, n_active, 5, &err);
        if (r < 0) print_message("%s\n", err.msg);
        assert_true(r >= 0);
        max_rows = r > max_rows ? r : max_rows;
        if (r == 0 && n_active == N_STREAMS) break;
    }
    assert_true(max_rows > 3); /* several sequences did share steps */
    for (int i = 0; i < N_STREAMS; i++) {
        assert_true(gen_stream_done(gs[i], &fin[i]));
        assert_int_equal(fin[i], fin_ref[i]);
        assert_true(ref[i].len > 20);
        assert_string_equal(got[i].text, ref[i].text);
        assert_int_equal(got[i].n_tokens, ref[i].n_tokens);
        const gen_stats *st = gen_stream_stats(gs[i]);
        assert_int_equal(st->n_generated, ref[i].n_tokens);
        assert_int_equal(st->n_prompt, (int)nt[i]);
        engine_seq_free(e, gen_stream_seq(gs[i]));
        gen_stream_free(gs[i]);
        sampler_free(smp[i]);
        free(toks[i]);
    }
    kv_error ce = {0};
    assert_int_equal(kv_cache_check(engine_kv(e), &ce), KV_OK);
    gen_batch_free(b);
    engine_close(e);
}

/* Stream 2 shares its first 16-token block with stream 0: started after stream 0's prefill it
 * adopts that block instead of computing it, and still writes the text it writes alone. A
 * cancelled stream finishes at once and the others go on. */
static void test_prefix_and_cancel(void **state)
{
    (void)state;
    engine *e = open_engine();
    static out ref[N_STREAMS], got[N_STREAMS];
    memset(ref, 0, sizeof ref);
    memset(got, 0, sizeof got);
    int fin_ref[N_STREAMS], fin = 0;
    alone(e, ref, fin_ref);
    kv_error err = {0};
    gen_batch *b = gen_batch_create(e, 3, &err);
    assert_non_null(b);
    int32_t *t0, *t2, *t3;
    size_t n0, n2, n3;
    tokenize(e, prompts[0], &t0, &n0);
    tokenize(e, prompts[2], &t2, &n2);
    tokenize(e, prompts[3], &t3, &n3);
    assert_true(n0 > 16 && n2 > 16 && memcmp(t0, t2, 16 * sizeof *t0) == 0);
    gen_stream *gs[3];
    sampler *s0 = make_sampler(e, 0), *s2 = make_sampler(e, 2), *s3 = make_sampler(e, 3);
    int q0, q2, q3;
    assert_int_equal(engine_seq_new(e, &q0, &err), KV_OK);
    assert_int_equal(engine_seq_new(e, &q2, &err), KV_OK);
    assert_int_equal(engine_seq_new(e, &q3, &err), KV_OK);
    gen_opts o0 = {.n_predict = n_predict[0], .no_context_shift = 1}, o2 = {.n_predict = n_predict[2], .no_context_shift = 1};
    gen_opts o3 = {.n_predict = n_predict[3], .no_context_shift = 1};
    gen_callbacks c0 = {.on_text = on_text, .on_token = on_token, .ud = &got[0]};
    gen_callbacks c2 = {.on_text = on_text, .on_token = on_token, .ud = &got[2]};
    gen_callbacks c3 = {.on_text = on_text, .on_token = on_token, .should_stop = should_stop, .ud = &got[3]};
    got[3].stop_after = 10;
    assert_int_equal(gen_stream_begin(e, q0, t0, n0, &o0, s0, &c0, 0, &gs[0], &err), KV_OK);
    assert_int_equal(gen_stream_begin(e, q3, t3, n3, &o3, s3, &c3, 0, &gs[1], &err), KV_OK);
    assert_true(gen_batch_step(b, gs, 2, 0, &err) > 0); /* both prefills (64 rows of room) */
    assert_int_equal(gen_stream_begin(e, q2, t2, n2, &o2, s2, &c2, 0, &gs[2], &err), KV_OK);
    assert_int_equal(gen_stream_stats(gs[2])->n_reused_hash, 16);
    while (gen_batch_step(b, gs, 3, 0, &err) > 0) {
    }
    assert_true(gen_stream_done(gs[0], &fin));
    assert_string_equal(got[0].text, ref[0].text);
    assert_true(gen_stream_done(gs[2], &fin));
    assert_string_equal(got[2].text, ref[2].text);
    assert_true(gen_stream_done(gs[1], &fin));
    assert_int_equal(fin, GEN_FINISH_CANCELLED);
    assert_int_equal(got[3].n_tokens, 10);
    assert_int_equal(strncmp(got[3].text, ref[3].text, got[3].len), 0);
    for (int i = 0; i < 3; i++) {
        engine_seq_free(e, gen_stream_seq(gs[i]));
        gen_stream_free(gs[i]);
    }
    sampler_free(s0);
    sampler_free(s2);
    sampler_free(s3);
    free(t0);
    free(t2);
    free(t3);
    gen_batch_free(b);
    engine_close(e);
}

/* Best of 3: the prompt but its last token prefilled once (prefill_only), three forks decode
 * together with seeds S, S+1, S+2 — each as the same fork run alone. */
static void test_forks(void **state)
{
    (void)state;
    engine *e = open_engine();
    kv_error err = {0};
    int32_t *t;
    size_t n;
    tokenize(e, prompts[3], &t, &n);
    static out ref[3], got[3];
    memset(ref, 0, sizeof ref);
    memset(got, 0, sizeof got);
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0.9f;
    gen_opts o = {.n_predict = 30, .no_context_shift = 1};
    for (int i = 0; i < 3; i++) {
        engine_drop_prefix_cache(e);
        int seq, fin;
        sp.seed = 77 + (uint64_t)i;
        sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
        assert_int_equal(engine_seq_new(e, &seq, &err), KV_OK);
        gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ud = &ref[i]};
        assert_int_equal(engine_generate_seq(e, seq, t, n, &o, s, &cb, NULL, &fin, &err), KV_OK);
        engine_seq_free(e, seq);
        sampler_free(s);
    }
    engine_drop_prefix_cache(e);
    gen_batch *b = gen_batch_create(e, 3, &err);
    int base;
    assert_int_equal(engine_seq_new(e, &base, &err), KV_OK);
    gen_stream *gs[3];
    assert_int_equal(gen_stream_begin(e, base, t, n - 1, NULL, NULL, NULL, 1, &gs[0], &err), KV_OK);
    while (gen_batch_step(b, gs, 1, 0, &err) > 0) {
    }
    int fin = -1;
    assert_true(gen_stream_done(gs[0], &fin));
    assert_int_equal(fin, GEN_FINISH_NONE);
    gen_stream_free(gs[0]);
    assert_int_equal(kv_seq_n_tokens(engine_kv(e), base), (int)n - 1);
    sampler *s[3];
    for (int i = 0; i < 3; i++) {
        int seq;
        assert_int_equal(engine_seq_fork(e, base, -1, &seq, &err), KV_OK);
        sp.seed = 77 + (uint64_t)i;
        s[i] = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
        gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ud = &got[i]};
        assert_int_equal(gen_stream_begin(e, seq, t, n, &o, s[i], &cb, 0, &gs[i], &err), KV_OK);
        assert_int_equal(gen_stream_stats(gs[i])->n_reused, (int)n - 1);
    }
    int first = gen_batch_step(b, gs, 3, 0, &err);
    assert_int_equal(first, 3); /* one row per fork: nothing recomputed */
    while (gen_batch_step(b, gs, 3, 0, &err) > 0) {
    }
    for (int i = 0; i < 3; i++) {
        assert_true(gen_stream_done(gs[i], &fin));
        assert_string_equal(got[i].text, ref[i].text);
        engine_seq_free(e, gen_stream_seq(gs[i]));
        gen_stream_free(gs[i]);
        sampler_free(s[i]);
    }
    engine_seq_free(e, base);
    assert_int_equal(kv_cache_check(engine_kv(e), &err), KV_OK);
    free(t);
    gen_batch_free(b);
    engine_close(e);
}

/* Context shift: with n_ctx 64, streams asked for 100 and 90 tokens run past the context
 * (shifting between steps: keep n_keep, drop half of the rest) and give every token asked for —
 * exactly the tokens each gives alone through engine_generate_seq, which shifts the same way — while
 * a short stream in the same steps never shifts and is untouched. */
static void test_context_shift(void **state)
{
    (void)state;
    enum { NS = 3 };
    static const int which[NS] = {0, 1, 2}, n_pred[NS] = {100, 25, 90}, keep[NS] = {0, 0, 8};
    engine *e = open_engine_ctx(64);
    static out ref[NS], got[NS];
    memset(ref, 0, sizeof ref);
    memset(got, 0, sizeof got);
    kv_error err = {0};
    int32_t *toks[NS];
    size_t nt[NS];
    int fin_ref[NS], shifts_ref[NS];
    for (int i = 0; i < NS; i++) {
        tokenize(e, prompts[which[i]], &toks[i], &nt[i]);
        assert_true(nt[i] < 40);
        engine_drop_prefix_cache(e);
        int seq;
        assert_int_equal(engine_seq_new(e, &seq, &err), KV_OK);
        sampler *s = make_sampler(e, which[i]);
        gen_opts o = {.n_predict = n_pred[i], .n_keep = keep[i]};
        gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ud = &ref[i]};
        gen_stats st = {0};
        if (engine_generate_seq(e, seq, toks[i], nt[i], &o, s, &cb, &st, &fin_ref[i], &err)) print_message("%s\n", err.msg);
        shifts_ref[i] = st.n_shifts;
        engine_seq_free(e, seq);
        sampler_free(s);
    }
    engine_drop_prefix_cache(e);
    assert_true(shifts_ref[0] >= 2 && shifts_ref[2] >= 1 && shifts_ref[1] == 0);
    gen_batch *b = gen_batch_create(e, NS, &err);
    assert_non_null(b);
    gen_stream *gs[NS];
    sampler *smp[NS];
    for (int i = 0; i < NS; i++) {
        int seq;
        assert_int_equal(engine_seq_new(e, &seq, &err), KV_OK);
        smp[i] = make_sampler(e, which[i]);
        gen_opts o = {.n_predict = n_pred[i], .n_keep = keep[i]};
        gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ud = &got[i]};
        assert_int_equal(gen_stream_begin(e, seq, toks[i], nt[i], &o, smp[i], &cb, 0, &gs[i], &err), KV_OK);
    }
    int steps = 0, r;
    while ((r = gen_batch_step(b, gs, NS, 8, &err)) > 0) {
        steps++;
        for (int i = 0; i < NS; i++) /* positions stay inside the context, never past it */
            if (!gen_stream_done(gs[i], NULL)) assert_true(kv_seq_n_tokens(engine_kv(e), gen_stream_seq(gs[i])) <= 64);
    }
    if (r < 0) print_message("%s\n", err.msg);
    assert_int_equal(r, 0);
    assert_true(steps >= 90);
    for (int i = 0; i < NS; i++) {
        int fin;
        assert_true(gen_stream_done(gs[i], &fin));
        assert_int_equal(fin, GEN_FINISH_LENGTH);
        assert_int_equal(fin_ref[i], GEN_FINISH_LENGTH);
        assert_int_equal(got[i].n_tokens, n_pred[i]);
        assert_int_equal(ref[i].n_tokens, n_pred[i]);
        assert_string_equal(got[i].text, ref[i].text);
        const gen_stats *st = gen_stream_stats(gs[i]);
        assert_int_equal(st->n_shifts, shifts_ref[i]);
        assert_int_equal(st->n_generated, n_pred[i]);
        engine_seq_free(e, gen_stream_seq(gs[i]));
        gen_stream_free(gs[i]);
        sampler_free(smp[i]);
        free(toks[i]);
    }
    assert_int_equal(kv_cache_check(engine_kv(e), &err), KV_OK);
    /* no_context_shift: the same long stream ends at the full context instead */
    int seq;
    assert_int_equal(engine_seq_new(e, &seq, &err), KV_OK);
    sampler *s = make_sampler(e, 0);
    out o1 = {0};
    int32_t *t0;
    size_t n0;
    tokenize(e, prompts[0], &t0, &n0);
    gen_opts o = {.n_predict = 100, .no_context_shift = 1};
    gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ud = &o1};
    assert_int_equal(gen_stream_begin(e, seq, t0, n0, &o, s, &cb, 0, &gs[0], &err), KV_OK);
    while (gen_batch_step(b, gs, 1, 8, &err) > 0) {
    }
    int fin;
    assert_true(gen_stream_done(gs[0], &fin));
    assert_int_equal(fin, GEN_FINISH_CONTEXT);
    assert_int_equal(o1.n_tokens, 64 - (int)n0 + 1);
    assert_int_equal(gen_stream_stats(gs[0])->n_shifts, 0);
    gen_stream_free(gs[0]);
    engine_seq_free(e, seq);
    sampler_free(s);
    free(t0);
    gen_batch_free(b);
    engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_together),
        cmocka_unit_test(test_prefix_and_cancel),
        cmocka_unit_test(test_forks),
        cmocka_unit_test(test_context_shift),
    };
    return cmocka_run_group_tests_name("gen_batch", tests, NULL, NULL);
}
