/* test_golden: the forward pass against llama.cpp's reference logits and greedy tokens (../shared/golden). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/support/testisa.h"

#include "engine/model.h"
#include "engine/kernels/quant.h"
#include "engine/tokenizer.h"
#include "tests/support/testutil.h"

typedef struct golden_case {
    const char *model;     /* models/… */
    const char *golden;    /* golden/… */
    float tol;             /* absolute logit tolerance: every logit (stories260K), or the mean (syn-*) */
    int greedy;            /* 1: strict — every logit within tol and our argmax equal to the
                            * reference token at every step (a real model in F32) */
    int n_threads;
    int n_batch;           /* prefill chunk; < prompt length exercises chunked prefill */
} golden_case;

/* Random-weight quantized models: the reference rounds activations to 8 bits (bf16: 8-bit
 * mantissa) inside its matmuls, so a value within float noise of a rounding boundary can
 * flip and move later logits by several times the typical difference. Those models must
 * agree within tol on average over all checked logits and within 5 x tol everywhere;
 * stories260K (F32) within tol everywhere.
 * Where the remaining differences come from (measured 2026-11): float summation order. With
 * llama.cpp's x86 AVX2 orders copied — q.k and P.V as 4 accumulators x 8 lanes with FMA, a
 * fixed reduction tree, and the Q8_0 dot kept as 8 integer lanes per block until the end —
 * syn-llama-q8_0.long, syn-llama-q6_k.long and the qwen2 q8_0/q4_k_m files agree bit for bit,
 * but syn-llama-q8_0.p1 then moves to 0.28 max: the p1 and long files seem to come from
 * builds with different kernel orders, so neither order is copied; Q4_0/Q4_K/Q5_K (repacked
 * 8x8 in the reference) and F16/BF16 would need their own orders as well. */
static float max_tol(const golden_case *gc)
{
    return gc->greedy ? gc->tol : 5 * gc->tol;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Checks one step's logits against the reference; returns the number of violations and
 * prints the first few. */
static int check_step(const golden_case *gc, int step, const cJSON *js, const float *logits, int n_vocab,
                      float *max_diff, double *sum_diff, long *n_diff)
{
    int bad = 0;
    const cJSON *top = cJSON_GetObjectItem(js, "top");
    const cJSON *full = cJSON_GetObjectItem(js, "logits");
    float tenth = INFINITY;
    int in_top[16], n_top = 0;
    const cJSON *pair;
    cJSON_ArrayForEach(pair, top) {
        int id = cJSON_GetArrayItem(pair, 0)->valueint;
        float ref = (float)cJSON_GetArrayItem(pair, 1)->valuedouble;
        float d = fabsf(logits[id] - ref);
        if (d > *max_diff) *max_diff = d;
        *sum_diff += d;
        (*n_diff)++;
        if (d > max_tol(gc) && bad++ < 3)
            print_message("%s step %d: logit[%d] = %f, reference %f (diff %g > %g)\n", gc->golden, step, id,
                          logits[id], ref, d, max_tol(gc));
        if (ref < tenth) tenth = ref;
        if (n_top < 16) in_top[n_top++] = id;
    }
    /* Our top-10 may differ from the reference only by tokens within the tolerance of its
     * 10th logit (near-ties). */
    float *tmp = malloc(sizeof(float) * (size_t)n_vocab);
    memcpy(tmp, logits, sizeof(float) * (size_t)n_vocab);
    for (int k = 0; k < 10; k++) {
        int id = argmax(tmp, n_vocab);
        int found = 0;
        for (int i = 0; i < n_top; i++) found |= in_top[i] == id;
        if (!found && tmp[id] > tenth + max_tol(gc) && bad++ < 3)
            print_message("%s step %d: token %d (logit %f) is in our top-10 but not the reference's (10th %f)\n",
                          gc->golden, step, id, tmp[id], tenth);
        tmp[id] = -INFINITY;
    }
    free(tmp);
    if (full) {
        int n = cJSON_GetArraySize(full);
        if (n != n_vocab && bad++ < 3) print_message("%s: full logits have %d entries, n_vocab %d\n", gc->golden, n, n_vocab);
        int i = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, full) {
            if (i >= n_vocab) break;
            float d = fabsf(logits[i] - (float)v->valuedouble);
            if (d > *max_diff) *max_diff = d;
            if (d > max_tol(gc) && bad++ < 3)
                print_message("%s step %d: full logit[%d] = %f, reference %f\n", gc->golden, step, i, logits[i],
                              v->valuedouble);
            i++;
        }
    }
    return bad;
}

static void run_case(void **state)
{
    const golden_case *gc = *state;
    cJSON *g = tu_read_json(tu_path(gc->golden));
    assert_non_null(g);
    model *m = NULL;
    kv_error err = {0};
    int rc = model_load(tu_path(gc->model), &m, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, KV_OK);
    int n_vocab = m->hp.n_vocab;

    /* The prompt tokens must match the reference tokenizer exactly. */
    tokenizer *tok = NULL;
    assert_int_equal(tokenizer_load(m->gguf, &tok, &err), KV_OK);
    const cJSON *jp = cJSON_GetObjectItem(g, "prompt");
    const cJSON *jpt = cJSON_GetObjectItem(g, "prompt_tokens");
    const cJSON *steps = cJSON_GetObjectItem(g, "steps");
    int n_prompt = cJSON_GetArraySize(jpt), n_steps = cJSON_GetArraySize(steps);
    int32_t *ours = NULL;
    size_t n_ours = 0;
    assert_int_equal(tokenizer_encode(tok, jp->valuestring, strlen(jp->valuestring), tokenizer_add_bos(tok), 0, &ours,
                                      &n_ours, &err), KV_OK);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    for (int i = 0; i < n_prompt; i++) prompt[i] = cJSON_GetArrayItem(jpt, i)->valueint;
    assert_int_equal((int)n_ours, n_prompt);
    assert_memory_equal(ours, prompt, sizeof(int32_t) * (size_t)n_prompt);

    int n_ctx = n_prompt + n_steps + 1;
    kv_cache *kv = kv_cache_create(m->hp.n_layer, m->hp.n_embd_kv, n_ctx, GGML_TYPE_F32, &err);
    forward_ctx *fc = forward_ctx_create(m, gc->n_batch, n_ctx, &err);
    tpool *pool = tpool_create(gc->n_threads);
    float *logits = malloc(sizeof(float) * (size_t)n_vocab);
    assert_non_null(kv);
    assert_non_null(fc);
    for (int i = 0; i < n_prompt; i += gc->n_batch) {
        int n = n_prompt - i < gc->n_batch ? n_prompt - i : gc->n_batch;
        assert_int_equal(model_forward(m, fc, kv, pool, prompt + i, n, logits, 0, &err), KV_OK);
    }
    int bad = 0, greedy_ok = 0;
    float max_diff = 0;
    double sum_diff = 0;
    long n_diff = 0;
    for (int s = 0; s < n_steps; s++) {
        const cJSON *js = cJSON_GetArrayItem(steps, s);
        int32_t ref = cJSON_GetObjectItem(js, "token")->valueint;
        bad += check_step(gc, s, js, logits, n_vocab, &max_diff, &sum_diff, &n_diff);
        int mine = argmax(logits, n_vocab);
        if (mine == ref) greedy_ok++;
        else if (gc->greedy && bad++ < 3)
            print_message("%s step %d: greedy token %d, reference %d\n", gc->golden, s, mine, ref);
        if (s + 1 < n_steps) assert_int_equal(model_forward(m, fc, kv, pool, &ref, 1, logits, 0, &err), KV_OK);
    }
    print_message("%-28s %-26s threads %d batch %3d: %d prompt tokens, %d/%d greedy steps agree, |dlogit| max %.2e mean %.1e (tol %.0e)\n",
                  gc->golden, gc->model, gc->n_threads, gc->n_batch, n_prompt, greedy_ok, n_steps, max_diff,
                  n_diff ? sum_diff / n_diff : 0.0, gc->tol);
    assert_int_equal(bad, 0);
    assert_true(n_diff > 0);
    assert_true(sum_diff / n_diff <= gc->tol);
    free(logits);
    free(prompt);
    free(ours);
    tpool_free(pool);
    forward_ctx_free(fc);
    kv_cache_free(kv);
    tokenizer_free(tok);
    model_free(m);
    cJSON_Delete(g);
}

#define STORIES(file, th, nb) {"models/stories260K.gguf", "golden/stories260K." file ".json", 1e-3f, 1, th, nb}
#define SYN(name, tol) {"models/syn-" name ".gguf", "golden/syn-" name ".p1.json", tol, 0, 1, 512}, \
                       {"models/syn-" name ".gguf", "golden/syn-" name ".long.json", tol, 0, 2, 64}

/* Tolerances: ../shared/golden/README.md (F32/F16/BF16 2e-2, Q8_0 5e-2, Q4/Q5/Q6 1e-1). */
static golden_case cases[] = {
    STORIES("p1", 1, 512), STORIES("p2", 1, 512), STORIES("p3", 1, 512), STORIES("p4", 1, 512),
    STORIES("p5", 1, 512), STORIES("long", 1, 512),
    /* Thread counts and chunked prefill must not change the result. */
    STORIES("p1", 2, 512), STORIES("long", 2, 100), STORIES("long", 4, 512),
    SYN("llama-f32", 2e-2f), SYN("llama-f16", 2e-2f), SYN("llama-bf16", 2e-2f), SYN("llama-q8_0", 5e-2f),
    SYN("llama-q4_0", 1e-1f), SYN("llama-q4_k_m", 1e-1f), SYN("llama-q5_k_m", 1e-1f), SYN("llama-q6_k", 1e-1f),
    SYN("llama3-f32", 2e-2f), SYN("qwen2-f32", 2e-2f), SYN("qwen2-f16", 2e-2f), SYN("qwen2-q8_0", 5e-2f),
    SYN("qwen2-q4_k_m", 1e-1f),
    {"models/llama-2-tiny-random.gguf", "golden/llama-2-tiny-random.p1.json", 2e-2f, 0, 1, 512},
};

int main(void)
{
    size_t n = sizeof cases / sizeof *cases;
    struct CMUnitTest tests[sizeof cases / sizeof *cases];
    static char names[sizeof cases / sizeof *cases][160];
    for (size_t i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "%s t%d b%d", cases[i].golden, cases[i].n_threads, cases[i].n_batch);
        tests[i] = (struct CMUnitTest){names[i], run_case, NULL, NULL, &cases[i]};
    }
    return tu_run_every_isa("golden", tests, n, NULL, NULL);
}
