/* test_speculate: speculative decoding (greedy = plain decoding token for token; sampled tokens follow the target's distribution: chi-square against plain sampling, and the same test failing a wrong rule), log-probabilities against llama.cpp's logsumexp, beam search's log-prob against greedy's on every golden prompt, best-of-N. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/decode_cmd.h"
#include "engine/beam.h"
#include "engine/generate.h"
#include "engine/logprob.h"
#include "engine/speculate.h"
#include "tests/support/testutil.h"

static engine *open_model(const char *rel, int kv_type)
{
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = tu_path(rel);
    ep.n_ctx = 1024;
    ep.n_threads = 1;
    ep.kv_type = kv_type;
    engine *e = NULL;
    kv_error err = {0};
    if (engine_open(&ep, &e, &err)) fail_msg("%s: %s", rel, err.msg);
    return e;
}

typedef struct toks {
    int32_t t[1024];
    int n;
} toks;

static void collect(void *ud, int32_t tok, int eog)
{
    (void)eog;
    toks *c = ud;
    if (c->n < 1024) c->t[c->n++] = tok;
}

/* Generate n tokens after text with params sp (and spec, NULL = plain) into out. */
static gen_stats run(engine *e, const char *text, int n, const sampler_params *sp, const spec_params *spec, toks *out)
{
    kv_error err = {0};
    int32_t *p;
    size_t np;
    assert_int_equal(engine_tokenize(e, text, strlen(text), 0, 0, &p, &np, &err), 0);
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, sp, &err);
    assert_non_null(s);
    gen_opts o;
    engine_default_opts(e, &o);
    o.n_predict = n;
    o.spec = spec;
    out->n = 0;
    gen_callbacks cb = {.on_token = collect, .ud = out};
    gen_stats st;
    int fin;
    if (engine_generate_seq(e, ENGINE_SEQ_DEFAULT, p, np, &o, s, &cb, &st, &fin, &err)) fail_msg("%s", err.msg);
    sampler_free(s);
    free(p);
    return st;
}

static const char *const REP_PROMPT =
    "Once upon a time, there was a little girl named Lily. She liked to play with her ball. "
    "Once upon a time, there was a little girl named Lily. She liked to";

/* Temperature 0: every drafter and draft length gives plain decoding's tokens. */
static void greedy_case(const char *target, const char *draft_rel, int kv_type)
{
    engine *e = open_model(target, kv_type), *d = NULL;
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    toks ref, got;
    run(e, REP_PROMPT, 96, &sp, NULL, &ref);
    assert_int_equal(ref.n, 96);
    kv_error err = {0};
    /* no draft given: the target is its own draft (everything accepted: the multi-token path) */
    if (spec_draft_open(tu_path(draft_rel ? draft_rel : target), e, 1, &d, &err)) fail_msg("%s", err.msg);
    int total_acc = 0;
    for (int mode = SPEC_LOOKUP; mode <= SPEC_DRAFT; mode++)
        for (int nb = 0; nb <= 1; nb++)
            for (int k = 1; k <= 8; k++) {
                spec_params spec;
                spec_params_default(&spec);
                spec.mode = mode;
                spec.draft_max = k;
                spec.no_backoff = nb;
                spec.draft = d;
                spec.draft_min_p = 0;
                gen_stats st = run(e, REP_PROMPT, 96, &sp, &spec, &got);
                if (got.n != ref.n || memcmp(got.t, ref.t, sizeof(int32_t) * (size_t)ref.n))
                    fail_msg("%s %s draft_max %d no_backoff %d: differs from plain decoding", target,
                             spec_mode_name(mode), k, nb);
                assert_true(st.n_accepted <= st.n_drafted);
                assert_true(st.n_verify > 0);
                total_acc += st.n_accepted;
            }
    assert_true(total_acc > 0); /* drafts were accepted, so the multi-token path ran */
    engine_close(d);
    engine_close(e);
}

static void test_greedy_stories(void **state)
{
    (void)state;
    greedy_case("models/stories260K.gguf", "models/stories260K.gguf", 0 /* f32 */);
    greedy_case("models/stories260K.gguf", "models/syn-llama-q4_0.gguf", 1 /* f16 */);
}

static void test_greedy_synthetic(void **state)
{
    (void)state;
    greedy_case("models/syn-llama-f32.gguf", "models/syn-llama-q4_0.gguf", 1);
    greedy_case("models/syn-qwen2-f16.gguf", NULL, 1);
    greedy_case("models/syn-llama-q8_0.gguf", NULL, 1);
}

static void test_draft_vocab_mismatch(void **state)
{
    (void)state;
    engine *e = open_model("models/stories260K.gguf", 1), *d = NULL;
    kv_error err = {0};
    assert_int_equal(spec_draft_open(tu_path("models/syn-qwen2-f16.gguf"), e, 1, &d, &err), KV_ERR_FORMAT);
    assert_null(d);
    assert_non_null(strstr(err.msg, "syn-qwen2-f16.gguf: its vocabulary differs"));
    assert_non_null(strstr(err.msg, "50257 tokens vs 512"));
    engine_close(e);
}

/* Two-sample chi-square over the tokens' counts a, b (equal sample sizes): bins with fewer than
 * 10 in both pooled into one. Returns the statistic, *df the degrees of freedom. */
static double chi2_two(const int *a, const int *b, int n, int *df)
{
    double x = 0;
    int bins = 0, ra = 0, rb = 0;
    for (int i = 0; i < n; i++) {
        if (a[i] + b[i] < 10) {
            ra += a[i];
            rb += b[i];
            continue;
        }
        x += (double)(a[i] - b[i]) * (a[i] - b[i]) / (a[i] + b[i]);
        bins++;
    }
    if (ra + rb > 0) {
        x += (double)(ra - rb) * (ra - rb) / (ra + rb);
        bins++;
    }
    *df = bins - 1;
    return x;
}

/* The chi-square critical value at p = 0.001 (Wilson & Hilferty 1931: z = 3.09). */
static double chi2_crit(int df)
{
    double k = df, z = 3.090232;
    double t = 1 - 2 / (9 * k) + z * sqrt(2 / (9 * k));
    return k * t * t * t;
}

#define N_RUNS 1500
#define N_POS 4

/* Tokens at positions 0..N_POS-1 of N_RUNS samples (seeds 1..N_RUNS): counts[pos][token]. */
static void sample_counts(engine *e, const char *prompt, const sampler_params *base, const spec_params *spec,
                          int *counts, int nv, gen_stats *tot)
{
    /* disjoint seed sets for plain and speculative runs: independent samples (with the same
     * seeds, runs without a draft would repeat plain's tokens and the test would pass trivially) */
    uint64_t seed0 = spec ? 1000000 : 1000;
    memset(counts, 0, sizeof(int) * (size_t)nv * N_POS);
    memset(tot, 0, sizeof *tot);
    for (int r = 0; r < N_RUNS; r++) {
        sampler_params sp = *base;
        sp.seed = seed0 + (uint64_t)r;
        toks t;
        gen_stats st = run(e, prompt, N_POS, &sp, spec, &t);
        tot->n_drafted += st.n_drafted;
        tot->n_accepted += st.n_accepted;
        for (int i = 0; i < N_POS && i < t.n; i++) counts[i * nv + t.t[i]]++;
    }
}

/* Temperature > 0: the tokens speculative decoding emits follow plain sampling's distribution at
 * every position (chi-square, p = 0.001, fixed seeds), for lookup and draft-model drafts with many
 * rejections; a wrong rule (accept every draft) fails the same test. */
static void test_sampled_distribution(void **state)
{
    (void)state;
    engine *e = open_model("models/stories260K.gguf", 1), *d = NULL;
    kv_error err = {0};
    if (spec_draft_open(tu_path("models/syn-llama-q4_0.gguf"), e, 1, &d, &err)) fail_msg("%s", err.msg);
    int nv = engine_model(e)->hp.n_vocab;
    int *plain = calloc((size_t)nv * N_POS, sizeof(int)), *sp_c = calloc((size_t)nv * N_POS, sizeof(int));
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0;
    const char *prompt = "Lily saw a big dog. The dog was happy. Lily saw a big";
    gen_stats tot;
    sample_counts(e, prompt, &sp, NULL, plain, nv, &tot);
    /* 0: lookup drafts, the full distribution; 1: lookup under top-k / top-p / min-p / T 0.8;
     * 2: the target as its own draft with a repeat penalty on the target only (p != q, most
     * drafts accepted); 3: a random-weight draft (syn-llama-q4_0, same vocabulary: nearly every
     * draft rejected, the residual max(0, p - q) drawn); 4: the wrong rule "accept every draft"
     * with that random draft — which the same test must reject */
    engine *self = NULL;
    if (spec_draft_open(tu_path("models/stories260K.gguf"), e, 1, &self, &err)) fail_msg("%s", err.msg);
    for (int variant = 0; variant < 5; variant++) {
        spec_params spec;
        spec_params_default(&spec);
        spec.mode = variant >= 2 ? SPEC_DRAFT : SPEC_LOOKUP;
        spec.draft = variant == 2 ? self : d;
        spec.draft_max = 3;
        spec.draft_min_p = 0;
        spec.no_backoff = 1;
        spec.test_accept_all = variant == 4;
        sampler_params p2 = sp;
        if (variant == 1) p2.top_k = 40, p2.top_p = 0.95f, p2.min_p = 0.05f, p2.temperature = 0.8f;
        if (variant == 2) p2.repeat_penalty = 1.3f;
        int *ref = plain;
        gen_stats t2;
        if (variant == 1 || variant == 2) { /* its own plain reference under those parameters */
            ref = calloc((size_t)nv * N_POS, sizeof(int));
            sample_counts(e, prompt, &p2, NULL, ref, nv, &t2);
        }
        sample_counts(e, prompt, &p2, &spec, sp_c, nv, &tot);
        double worst = 0;
        int all_ok = 1;
        for (int pos = 0; pos < N_POS; pos++) {
            int df;
            double x = chi2_two(ref + pos * nv, sp_c + pos * nv, nv, &df);
            double c = df > 0 ? chi2_crit(df) : 1e30;
            if (x > c) all_ok = 0;
            if (x / c > worst) worst = x / c;
            print_message("variant %d position %d: chi2 %.1f, df %d, critical %.1f\n", variant, pos, x, df, c);
        }
        print_message("variant %d: %d drafted, %d accepted\n", variant, tot.n_drafted, tot.n_accepted);
        /* drafts were made and both accepted and rejected, so both branches of the rule ran */
        assert_true(tot.n_drafted >= (variant >= 2 ? N_RUNS : N_RUNS / 10));
        if (variant < 4) {
            assert_true(tot.n_accepted > 10);
            assert_true(tot.n_accepted < tot.n_drafted - 50);
            assert_true(all_ok);
        } else {
            assert_false(all_ok); /* the wrong rule is caught */
            assert_true(worst > 3);
        }
        if (ref != plain) free(ref);
    }
    free(plain);
    free(sp_c);
    engine_close(self);
    engine_close(d);
    engine_close(e);
}

/* logprob_token against llama.cpp's logsumexp and top logits (../shared/golden), and the full
 * log-softmax computed here from the golden logits. */
static void test_logprob_golden(void **state)
{
    (void)state;
    const char *files[] = {"golden/stories260K.p1.json", "golden/stories260K.p2.json", "golden/stories260K.p3.json",
                           "golden/stories260K.p4.json", "golden/stories260K.p5.json", "golden/stories260K.long.json"};
    int checked_full = 0;
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        cJSON *g = tu_read_json(tu_path(files[f]));
        assert_non_null(g);
        const cJSON *steps = cJSON_GetObjectItem(g, "steps"), *js;
        cJSON_ArrayForEach(js, steps) {
            const cJSON *full = cJSON_GetObjectItem(js, "logits");
            if (!full) continue;
            int n = cJSON_GetArraySize(full), i = 0;
            float *l = malloc(sizeof(float) * (size_t)n);
            const cJSON *v;
            cJSON_ArrayForEach(v, full) l[i++] = (float)v->valuedouble;
            double lse_ref = cJSON_GetObjectItem(js, "logsumexp")->valuedouble;
            assert_true(fabs(logprob_logsumexp(l, n) - lse_ref) < 1e-4);
            token_logprob tl;
            int tok = cJSON_GetObjectItem(js, "token")->valueint;
            logprob_token(l, n, tok, 10, &tl);
            const cJSON *top = cJSON_GetObjectItem(js, "top");
            assert_int_equal(tl.n_top, 10);
            for (int k = 0; k < 10; k++) {
                const cJSON *pair = cJSON_GetArrayItem(top, k);
                assert_int_equal(tl.top[k], cJSON_GetArrayItem(pair, 0)->valueint);
                double ref = cJSON_GetArrayItem(pair, 1)->valuedouble - lse_ref;
                assert_true(fabs(tl.top_lp[k] - ref) < 1e-4);
            }
            /* the sampled token's, and the probabilities sum to 1 */
            assert_true(fabs(tl.lp - (l[tok] - lse_ref)) < 1e-4);
            double sum = 0;
            for (int k = 0; k < n; k++) sum += exp(l[k] - lse_ref);
            assert_true(fabs(sum - 1) < 1e-4);
            free(l);
            checked_full++;
        }
        cJSON_Delete(g);
    }
    assert_true(checked_full >= 1);
}

/* Sum of log p of toks after prompt (teacher-forced, raw log-softmax). */
static double seq_logprob(engine *e, const int32_t *prompt, int np, const int32_t *t, int n)
{
    kv_error err = {0};
    int s, nv = engine_model(e)->hp.n_vocab;
    assert_int_equal(engine_seq_new(e, &s, &err), 0);
    float *l = malloc(sizeof(float) * (size_t)nv);
    for (int i = 0; i < np; i += engine_n_batch(e)) {
        int k = np - i < engine_n_batch(e) ? np - i : engine_n_batch(e);
        assert_int_equal(engine_forward(e, s, prompt + i, k, l, 0, &err), 0);
    }
    double sum = 0;
    for (int i = 0; i < n; i++) {
        token_logprob tl;
        logprob_token(l, nv, t[i], 0, &tl);
        sum += tl.lp;
        if (i + 1 < n) assert_int_equal(engine_forward(e, s, &t[i], 1, l, 0, &err), 0);
    }
    free(l);
    engine_seq_free(e, s);
    return sum;
}

/* The chosen beam's total log-prob >= greedy's, on every golden prompt; 1 beam = greedy. */
static void test_beam_vs_greedy(void **state)
{
    (void)state;
    engine *e = open_model("models/stories260K.gguf", 0);
    const char *files[] = {"golden/stories260K.p1.json", "golden/stories260K.p2.json", "golden/stories260K.p3.json",
                           "golden/stories260K.p4.json", "golden/stories260K.p5.json", "golden/stories260K.long.json"};
    int better = 0;
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        cJSON *g = tu_read_json(tu_path(files[f]));
        assert_non_null(g);
        const cJSON *jpt = cJSON_GetObjectItem(g, "prompt_tokens");
        int np = cJSON_GetArraySize(jpt);
        int32_t *p = malloc(sizeof(int32_t) * (size_t)np);
        for (int i = 0; i < np; i++) p[i] = cJSON_GetArrayItem(jpt, i)->valueint;
        const int n = 24;
        sampler_params sp;
        sampler_params_default(&sp);
        sp.temperature = 0;
        kv_error err = {0};
        sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
        toks gr = {0};
        gen_opts o;
        engine_default_opts(e, &o);
        o.n_predict = n;
        gen_callbacks cb = {.on_token = collect, .ud = &gr};
        int fin;
        assert_int_equal(engine_generate_seq(e, ENGINE_SEQ_DEFAULT, p, (size_t)np, &o, s, &cb, NULL, &fin, &err), 0);
        double lp_greedy = seq_logprob(e, p, np, gr.t, gr.n);
        for (int nb = 1; nb <= 4; nb += 3) {
            beam_result r;
            assert_int_equal(engine_beam_search(e, ENGINE_SEQ_DEFAULT, p, np, nb, 0.0f, n, &r, NULL, &err), 0);
            double lp_check = seq_logprob(e, p, np, r.tokens, r.n_tokens);
            assert_true(fabs(lp_check - r.logprob) < 1e-3); /* the reported score is the sequence's */
            print_message("%s: %d beams %.4f (%d tokens), greedy %.4f (%d tokens)\n", files[f], nb, r.logprob,
                          r.n_tokens, lp_greedy, gr.n);
            if (nb == 1) { /* greedy itself */
                assert_int_equal(r.n_tokens, gr.n);
                assert_memory_equal(r.tokens, gr.t, sizeof(int32_t) * (size_t)gr.n);
            } else {
                if (r.n_tokens == gr.n) assert_true(r.logprob >= lp_greedy - 1e-4);
                else assert_true(r.finish == GEN_FINISH_EOG && r.logprob >= lp_greedy - 1e-4);
                if (r.logprob > lp_greedy + 1e-3) better++;
            }
            beam_result_free(&r);
        }
        sampler_free(s);
        free(p);
        cJSON_Delete(g);
    }
    print_message("beam search beat greedy on %d of 6 prompts\n", better);
    assert_true(better >= 1); /* it is not greedy in disguise */
    engine_close(e);
}

/* Best-of-N: the samples are ranked by their mean log-prob, which is their tokens' own; each equals
 * its seed's sample generated alone. */
static void test_best_of(void **state)
{
    (void)state;
    engine *e = open_model("models/stories260K.gguf", 1);
    kv_error err = {0};
    int32_t *p;
    size_t np;
    assert_int_equal(engine_tokenize(e, "Once upon a time", 16, 0, 0, &p, &np, &err), 0);
    sampler_params sp;
    sampler_params_default(&sp);
    sp.seed = 42;
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
    decode_sample ds[4];
    assert_int_equal(decode_best_of(e, ENGINE_SEQ_DEFAULT, s, p, np, 4, 20, 0, ds, NULL, &err), 0);
    for (int i = 0; i < 4; i++) {
        assert_true(ds[i].n > 0);
        double lp = seq_logprob(e, p, (int)np, ds[i].tokens, ds[i].n);
        assert_true(fabs(lp / ds[i].n - ds[i].mean_lp) < 1e-3);
        if (i) assert_true(ds[i - 1].mean_lp >= ds[i].mean_lp);
        /* decoded in one batch, each sample is what its seed gives alone */
        sampler_params one = sp;
        one.seed = ds[i].seed;
        toks alone;
        run(e, "Once upon a time", 20, &one, NULL, &alone);
        assert_int_equal(alone.n, ds[i].n);
        assert_memory_equal(alone.t, ds[i].tokens, sizeof(int32_t) * (size_t)alone.n);
    }
    assert_true(ds[0].mean_lp > ds[3].mean_lp); /* different samples */
    decode_samples_free(ds, 4);
    sampler_free(s);
    free(p);
    engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logprob_golden),      cmocka_unit_test(test_greedy_stories),
        cmocka_unit_test(test_greedy_synthetic),    cmocka_unit_test(test_draft_vocab_mismatch),
        cmocka_unit_test(test_sampled_distribution), cmocka_unit_test(test_beam_vs_greedy),
        cmocka_unit_test(test_best_of),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
