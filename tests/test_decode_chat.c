/* test_decode_chat: the chat's /best and /beams — candidates ranked by mean log-prob (engine/best_of.c), the worker's candidates request (engine/worker.c: the best one's text streamed, every candidate equal to its seed's sample alone, conversations and stop strings), the sibling-branch bookkeeping and the on-screen note (app/decode_cmd.c). */
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/conv_tree.h"
#include "app/decode_cmd.h"
#include "engine/beam.h"
#include "engine/best_of.h"
#include "engine/worker.h"
#include "tests/support/testutil.h"

static void test_rank(void **state)
{
    (void)state;
    gen_candidate c[5] = {{.mean_lp = -0.5, .seed = 3}, {.mean_lp = -0.1, .seed = 9}, {.mean_lp = -0.5, .seed = 1},
                          {.mean_lp = -2.0, .seed = 0}, {.mean_lp = -0.1, .seed = 4}};
    gen_candidates_rank(c, 5);
    static const uint64_t want[] = {4, 9, 1, 3, 0}; /* best mean first; ties: the lower seed first */
    for (int i = 0; i < 5; i++) assert_int_equal(c[i].seed, want[i]);
}

static int finish_plus_100(int f) { return f + 100; }

static void test_siblings(void **state)
{
    (void)state;
    conv_tree t = {0};
    assert_non_null(conv_append(&t, 1, "hi", 2));
    assert_non_null(conv_append(&t, 2, "old reply", 9)); /* an earlier reply: branch 1 */
    long old = conv_path_pop(&t);
    assert_non_null(conv_append(&t, 2, "best", 4));     /* the chosen sample, on the path */
    long reply = t.path[t.n_path - 1];
    worker_candidate cand[3] = {{.text = "best", .len = 4, .finish = 1},
                                {.text = "second", .len = 6, .finish = 2},
                                {.text = "third", .len = 5, .finish = 3}};
    long first = decode_add_siblings(&t, reply, cand, 3, 2, "stories260K", finish_plus_100);
    assert_int_equal(first, 3);
    assert_int_equal(t.n, 5);
    assert_int_equal(t.n_path, 2); /* the path still shows the chosen one */
    assert_int_equal(t.path[1], reply);
    size_t *count, *rank = conv_sibling_ranks(&t, &count);
    assert_non_null(rank);
    assert_int_equal(count[conv_slot_of(&t, reply)], 4); /* old + chosen + 2 others */
    assert_int_equal(rank[old], 1);
    assert_int_equal(rank[reply], 2);
    assert_int_equal(rank[3], 3);
    assert_int_equal(rank[4], 4);
    assert_string_equal(t.node[3].text, "second");
    assert_string_equal(t.node[4].text, "third");
    assert_int_equal(t.node[3].parent, t.node[reply].parent);
    assert_int_equal(t.node[4].finish, 103);
    assert_string_equal(t.node[4].author, "stories260K");
    assert_int_equal(conv_sibling(&t, reply, 3), 3); /* /branch 3 finds the second sample */
    free(rank);
    free(count);
    /* one candidate: nothing to add */
    assert_int_equal(decode_add_siblings(&t, reply, cand, 1, 2, NULL, NULL), 5);
    assert_int_equal(t.n, 5);
    conv_free(&t);
}

static void test_parse_and_note(void **state)
{
    (void)state;
    int n;
    const char *rest;
    char msg[300];
    assert_int_equal(decode_parse_count("/best", "3 Tell me a story", &n, &rest, msg, sizeof msg), 0);
    assert_int_equal(n, 3);
    assert_string_equal(rest, "Tell me a story");
    assert_int_equal(decode_parse_count("/beams", "16", &n, &rest, msg, sizeof msg), 0);
    assert_int_equal(n, 16);
    assert_string_equal(rest, "");
    static const char *const badv[] = {"", "1", "17", "x", "3x", "-2"};
    for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
        assert_int_equal(decode_parse_count("/best", badv[i], &n, &rest, msg, sizeof msg), -1);
        assert_non_null(strstr(msg, "usage: /best N [MESSAGE]"));
    }
    worker_candidate c[3] = {{.score = -0.25, .seed = 7}, {.score = -0.5}, {.score = -1.125}};
    char buf[400];
    decode_candidates_note(c, 3, 0, 1.0f, 2, 4, buf, sizeof buf);
    assert_string_equal(buf, "best of 3, ranked by mean log-probability per token: this reply -0.2500 (seed 7); the "
                             "others, branches 3-4/4 (/branch N): -0.5000 -1.1250");
    worker_candidate b = {.score = -0.125, .logprob = -2.5, .n_tokens = 20};
    decode_candidates_note(&b, 1, 4, 1.0f, 1, 1, buf, sizeof buf);
    assert_string_equal(buf, "beam search, 4 beams: chose the beam of score -0.1250 (sum of log-probs -2.5000 over "
                             "20 tokens, length penalty 1)");
}

/* ---- the worker's candidates request on stories260K ------------------------------------------ */

typedef struct run_out {
    char text[8192];
    size_t len;
    worker_event done;
    worker_candidate cand[BEST_OF_MAX];
    char ctext[BEST_OF_MAX][2048];
    int32_t conv[BEST_OF_MAX][512];
    size_t n_tok;          /* the heat-map spans of DONE: how many, */
    double sum_log_p;      /* the sum of their log-probabilities, */
    int spans_ok;          /* ascending, contiguous from 0, within the streamed text */
} run_out;

static void run_request(worker *w, const worker_request *rq, run_out *r)
{
    memset(r, 0, sizeof *r);
    kv_error err = {0};
    assert_int_equal(worker_submit(w, rq, &err), KV_OK);
    double end = tu_now_ms() + 120000;
    while (tu_now_ms() < end) {
        struct pollfd pfd = {.fd = worker_fd(w), .events = POLLIN};
        poll(&pfd, 1, 100);
        worker_event ev;
        while (worker_next_event(w, &ev)) {
            if (ev.kind == WORKER_EV_TEXT) {
                assert_true(r->len + ev.len < sizeof r->text);
                memcpy(r->text + r->len, ev.text, ev.len);
                r->len += ev.len;
            } else if (ev.kind == WORKER_EV_DONE) {
                r->done = ev;
                r->n_tok = ev.n_tok;
                r->spans_ok = 1;
                for (size_t i = 0; i < ev.n_tok; i++) {
                    r->sum_log_p += log(ev.tok_p[i]);
                    if (ev.tok_start[i] != (i ? ev.tok_end[i - 1] : 0) || ev.tok_end[i] < ev.tok_start[i]) r->spans_ok = 0;
                }
                if (ev.n_tok && ev.tok_end[ev.n_tok - 1] > r->len) r->spans_ok = 0;
                for (int i = 0; i < ev.n_cand; i++) { /* copies: valid until the next submit only */
                    r->cand[i] = ev.cand[i];
                    assert_true(ev.cand[i].len < sizeof r->ctext[i] && ev.cand[i].n_conv <= 512);
                    memcpy(r->ctext[i], ev.cand[i].text, ev.cand[i].len);
                    memcpy(r->conv[i], ev.cand[i].conv, ev.cand[i].n_conv * sizeof(int32_t));
                }
                return;
            }
        }
    }
    fail_msg("no DONE event");
}

/* the text of tokens toks[0..n) (an end of generation dropped) */
static size_t detok(engine *e, const int32_t *toks, int n, char *out, size_t cap)
{
    detok_stream ds;
    detok_stream_init(&ds);
    size_t len = 0;
    const tokenizer *tk = engine_tokenizer(e);
    for (int i = 0; i < n; i++) {
        if (tokenizer_is_eog(tk, toks[i])) continue;
        len += detok_stream_push(&ds, tk, toks[i], out + len, cap - len);
    }
    len += detok_stream_flush(&ds, out + len, cap - len);
    return len;
}

static void test_worker_best_of(void **state)
{
    (void)state;
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = tu_path("models/stories260K.gguf");
    ep.n_ctx = 512;
    ep.n_threads = 1;
    engine *e = NULL;
    kv_error err = {0};
    assert_int_equal(engine_open(&ep, &e, &err), KV_OK);
    sampler_params sp;
    sampler_params_default(&sp);
    sp.seed = 11;
    sp.temperature = 1.0f;
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
    worker *w = NULL;
    assert_int_equal(worker_create(e, s, &w, &err), KV_OK);
    static const char prompt[] = "Once upon a time";
    worker_segment seg = {prompt, sizeof prompt - 1, 0};
    worker_request rq = {.seg = &seg, .n_seg = 1, .n_predict = 24, .best_of = 4};
    run_out *r = malloc(sizeof *r);
    run_request(w, &rq, r);
    assert_int_equal(r->done.status, KV_OK);
    assert_int_equal(r->done.n_cand, 4);
    /* the chosen one's text is what streamed; the DONE conversation and seed are its */
    assert_int_equal(r->len, r->cand[0].len);
    assert_memory_equal(r->text, r->ctext[0], r->len);
    assert_int_equal(r->done.n_conv, r->cand[0].n_conv);
    assert_int_equal(r->done.seed, r->cand[0].seed);

    /* the same samples as the one-shot best-of (engine_best_of with the same seed) */
    int32_t *p;
    size_t np;
    assert_int_equal(engine_tokenize(e, prompt, sizeof prompt - 1, 0, 0, &p, &np, &err), 0);
    sampler *s2 = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
    gen_candidate c[4];
    assert_int_equal(engine_best_of(e, ENGINE_SEQ_DEFAULT, s2, p, np, 4, 24, 0, NULL, c, NULL, &err), KV_OK);
    for (int i = 0; i < 4; i++) {
        assert_true(fabs(r->cand[i].score - c[i].mean_lp) < 1e-9);
        if (i) assert_true(r->cand[i - 1].score >= r->cand[i].score); /* best first */
        assert_int_equal(r->cand[i].seed, c[i].seed);
        assert_int_equal(r->cand[i].n_tokens, c[i].n);
        char t[2048];
        size_t n = detok(e, c[i].tokens, c[i].n, t, sizeof t);
        assert_int_equal(r->cand[i].len, n);
        assert_memory_equal(r->ctext[i], t, n);
        /* its conversation: the prompt, then its tokens */
        assert_memory_equal(r->conv[i], p, np * sizeof *p);
        assert_memory_equal(r->conv[i] + np, c[i].tokens, (r->cand[i].n_conv - np) * sizeof *p);
        double sum = 0;
        for (int k = 0; k < c[i].n; k++) sum += c[i].lp[k];
        assert_true(fabs(r->cand[i].logprob - sum) < 1e-6);
    }
    assert_true(r->cand[0].score > r->cand[3].score);
    /* the heat-map of the chosen sample: a span per token with text, their log-probs summing to its */
    assert_true(r->spans_ok);
    if (c[0].finish != GEN_FINISH_EOG) {
        assert_int_equal(r->n_tok, (size_t)c[0].n);
        assert_true(fabs(r->sum_log_p - r->cand[0].logprob) < 1e-3);
    }
    gen_candidates_free(c, 4);

    /* a stop string cuts every candidate (its text before it; finish STOP) */
    const char *stops[] = {" was"};
    assert_int_equal(worker_set_stops(w, stops, 1), 0);
    run_request(w, &rq, r);
    int n_stopped = 0;
    for (int i = 0; i < r->done.n_cand; i++) {
        r->ctext[i][r->cand[i].len] = 0;
        assert_null(strstr(r->ctext[i], " was"));
        n_stopped += r->cand[i].finish == GEN_FINISH_STOP;
    }
    assert_true(n_stopped > 0);
    worker_set_stops(w, NULL, 0);

    /* beams: one candidate, the beam search's result */
    worker_request bq = {.seg = &seg, .n_seg = 1, .n_predict = 16, .beams = 3, .length_penalty = 1.0f};
    run_request(w, &bq, r);
    assert_int_equal(r->done.n_cand, 1);
    beam_result br;
    gen_stats st;
    assert_int_equal(engine_beam_search(e, ENGINE_SEQ_DEFAULT, p, (int)np, 3, 1.0f, 16, &br, &st, &err), KV_OK);
    assert_true(fabs(r->cand[0].score - br.score) < 1e-9);
    char t[2048];
    size_t n = detok(e, br.tokens, br.n_tokens, t, sizeof t);
    assert_int_equal(r->len, n);
    assert_memory_equal(r->text, t, n);
    /* the beam's heat-map, replayed: its log-probs sum to the beam's */
    assert_true(r->spans_ok);
    assert_int_equal(br.finish, GEN_FINISH_LENGTH);
    assert_int_equal(r->n_tok, (size_t)br.n_tokens);
    assert_true(fabs(r->sum_log_p - br.logprob) < 1e-3);
    beam_result_free(&br);

    /* a plain reply's heat-map: spans over its streamed text */
    worker_request pq = {.seg = &seg, .n_seg = 1, .n_predict = 24};
    run_request(w, &pq, r);
    assert_int_equal(r->done.n_cand, 0);
    assert_true(r->spans_ok && r->n_tok > 10 && r->sum_log_p < 0);

    free(p);
    free(r);
    sampler_free(s2);
    worker_destroy(w);
    sampler_free(s);
    engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rank), cmocka_unit_test(test_siblings),
                                       cmocka_unit_test(test_parse_and_note), cmocka_unit_test(test_worker_best_of)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
