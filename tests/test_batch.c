/* test_batch: model_forward_batch (engine/batch.h) gives every sequence of a mixed prefill + decode batch the greedy tokens and, within a stated tolerance, the logits it gets alone — on stories260K, the synthetic llama / qwen2 files of several weight types and a gen-model file of every newer architecture, at every kernel level. */
/*
 * The reference of a sequence is model_forward_seq on a cache of its own: its prompt in one
 * call, then greedy decoding one token per call. The batched run puts four sequences (prompts
 * of 3 to 45 tokens, the longest past the gemma models' sliding windows) into one cache and
 * steps them together as a continuous-batching server does: a sequence joins at step i, its
 * prompt goes in chunks of 7 tokens (so a step mixes prefill chunks with the decode tokens of
 * the others), the tokens of the batch are interleaved (a sequence's tokens are not adjacent)
 * and their order rotates from step to step.
 *
 * Tolerance: the same row goes through a 1-row GEMV alone and an n-row GEMM in a batch (and a
 * prompt in one call versus chunks), which may sum in another order; activations are quantized
 * per row, so nothing else differs. Logits must agree within TOL_ABS + TOL_REL * max|logit| of
 * the step (TOL_ABS 2e-3, TOL_REL 1e-3) — measured differences are ~1e-5 for F32 weights and
 * ~1e-4 for quantized ones — and the greedy tokens must be equal wherever the reference's top
 * two logits are further apart than that tolerance (it holds everywhere on these models).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/tools.h"
#include "engine/batch.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/threadpool.h"
#include "tests/support/testisa.h"
#include "tests/support/testutil.h"

#define TOL_ABS 2e-3f
#define TOL_REL 1e-3f
#define N_SEQ 4
#define N_GEN 8
#define CHUNK 7
#define N_CTX 128
#define N_BATCH 64

typedef struct batch_case {
    const char *model; /* ../shared/models/<model>, or NULL: generated from gen_shape */
    const char *gen_shape, *gen_type;
    int n_layer;       /* gen-model layers */
    int n_swa;         /* gen-model sliding window (0: the shape's) */
    float softcap;     /* gen-model attention soft-cap */
    int kv_type;
} batch_case;

/* at every kernel level */
static batch_case cases[] = {
    {"stories260K.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_F16},
    {"syn-llama-q4_0.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_F16},
    {"syn-llama-q8_0.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_F16},
    {"syn-llama-q4_k_m.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_F16},
    {"syn-qwen2-q8_0.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_F16},
};
/* at the best kernel level only (as test_arch; the kernels are checked at every level above):
 * other weight and KV types, and gen-model files of the newer architectures (full-width layers) */
static batch_case arch_cases[] = {
    {"stories260K.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_Q8_0},
    {"syn-llama-f32.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_F32},
    {"syn-llama-q6_k.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_F16},
    {"syn-qwen2-f16.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_F16},
    {"syn-qwen2-q4_k_m.gguf", NULL, NULL, 0, 0, 0, GGML_TYPE_F16},
    {NULL, "qwen3-0.6b", "q8_0", 2, 0, 0, GGML_TYPE_F16},
    {NULL, "smollm3-3b", "f16", 4, 0, 0, GGML_TYPE_F16},   /* a NoPE layer every fourth */
    {NULL, "granite-3-2b", "f16", 2, 0, 0, GGML_TYPE_F16},
    {NULL, "olmo2-1b", "f16", 2, 0, 0, GGML_TYPE_F16},
    {NULL, "gemma2-2b", "f16", 2, 16, 30.0f, GGML_TYPE_F16}, /* window 16 < the 45-token prompt, soft-cap */
    {NULL, "gemma3-1b", "f16", 6, 16, 0, GGML_TYPE_F16},     /* five sliding layers, one global */
    {NULL, "phi4-mini", "f16", 2, 0, 0, GGML_TYPE_F16},      /* fused qkv / gate|up, LongRoPE */
};

typedef struct fixture {
    const batch_case *bc;
    model *m;
    tpool *pool;
    forward_ctx *fc;
    int n_vocab;
} fixture;

static int prompt_len[N_SEQ] = {45, 3, 17, 30};

static int32_t prompt_tok(int s, int i, int n_vocab) { return (int32_t)((s * 7919 + i * 104729 + 13) % (n_vocab - 1)) + 1; }

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* |a - b| within the tolerance of logits whose largest magnitude is ref's; returns the worst
 * ratio diff / tolerance */
static double compare(const float *ref, const float *got, int n)
{
    float mx = 0;
    for (int i = 0; i < n; i++) mx = fabsf(ref[i]) > mx ? fabsf(ref[i]) : mx;
    double worst = 0, tol = TOL_ABS + TOL_REL * mx;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)ref[i] - got[i]) / tol;
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* the top two of x are further apart than the tolerance */
static int decided(const float *x, int n)
{
    int a = argmax(x, n);
    float second = -INFINITY, mx = 0;
    for (int i = 0; i < n; i++) {
        if (i != a && x[i] > second) second = x[i];
        mx = fabsf(x[i]) > mx ? fabsf(x[i]) : mx;
    }
    return x[a] - second > 2 * (TOL_ABS + TOL_REL * mx);
}

static int setup(void **state)
{
    const batch_case *bc = *state;
    kv_error err = {0};
    char path[512];
    if (bc->model) {
        snprintf(path, sizeof path, "%s/models/%s", tu_shared(), bc->model);
    } else {
        snprintf(path, sizeof path, "%s", tu_tmp_path(bc->gen_shape));
        gen_model_opts o = {.n_layer = bc->n_layer, .n_vocab = 300, .n_ff = 64, .n_swa = bc->n_swa, .seed = 3};
        if (bc->softcap > 0) o.attn_softcap = bc->softcap;
        if (gen_model_write_ex(path, bc->gen_shape, bc->gen_type, &o, &err)) {
            print_message("%s\n", err.msg);
            return -1;
        }
    }
    fixture *f = calloc(1, sizeof *f);
    if (!f || model_load(path, &f->m, &err)) {
        print_message("%s: %s\n", path, err.msg);
        free(f);
        return -1;
    }
    f->bc = bc;
    f->n_vocab = f->m->hp.n_vocab;
    f->pool = tpool_create(2);
    f->fc = forward_ctx_create(f->m, N_BATCH, N_CTX, &err);
    if (!f->pool || !f->fc) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    if (!f) return 0;
    forward_ctx_free(f->fc);
    tpool_free(f->pool);
    model_free(f->m);
    free(f);
    return 0;
}

static kv_cache *new_cache(const fixture *f, int kv_type, int n_seqs)
{
    kv_error err = {0};
    kv_cache_params p = {.n_layer = f->m->hp.n_layer, .n_embd_kv = f->m->hp.n_embd_kv, .n_ctx = N_CTX, .type = kv_type,
                         .n_blocks = n_seqs * (N_CTX / KV_BLOCK_SIZE + 1)};
    kv_cache *kv = kv_cache_create_ex(&p, &err);
    if (!kv) print_message("%s\n", err.msg);
    assert_non_null(kv);
    return kv;
}

/* One sequence alone: prompt in one call, N_GEN greedy steps; logits[N_GEN + 1][n_vocab] (the
 * prompt's last token, then every fed token), toks[N_GEN + 1] the greedy tokens. */
static void run_alone(const fixture *f, int kv_type, const int32_t *prompt, int n, float *logits, int32_t *toks)
{
    kv_error err = {0};
    kv_cache *kv = new_cache(f, kv_type, 1);
    int rc = model_forward_seq(f->m, f->fc, kv, KV_SEQ_DEFAULT, f->pool, prompt, n, logits, 0, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, KV_OK);
    toks[0] = argmax(logits, f->n_vocab);
    for (int g = 1; g <= N_GEN; g++) {
        float *lg = logits + (size_t)g * f->n_vocab;
        assert_int_equal(model_forward_seq(f->m, f->fc, kv, KV_SEQ_DEFAULT, f->pool, &toks[g - 1], 1, lg, 0, &err), KV_OK);
        toks[g] = argmax(lg, f->n_vocab);
    }
    kv_cache_free(kv);
}

/* Four sequences stepped together (see the top of the file); every sequence's logits and greedy
 * tokens against run_alone's. */
static void test_mixed(void **state)
{
    const fixture *f = *state;
    const int V = f->n_vocab, kv_type = f->bc->kv_type;
    kv_error err = {0};
    int32_t prompts[N_SEQ][64], ref_tok[N_SEQ][N_GEN + 1], got_tok[N_SEQ][N_GEN + 1];
    float *ref = malloc(sizeof(float) * N_SEQ * (N_GEN + 1) * V), *logits = malloc(sizeof(float) * N_BATCH * V);
    assert_non_null(ref);
    assert_non_null(logits);
    for (int s = 0; s < N_SEQ; s++) {
        for (int i = 0; i < prompt_len[s]; i++) prompts[s][i] = prompt_tok(s, i, V);
        run_alone(f, kv_type, prompts[s], prompt_len[s], ref + (size_t)s * (N_GEN + 1) * V, ref_tok[s]);
    }
    kv_cache *kv = new_cache(f, kv_type, N_SEQ);
    int seq[N_SEQ], fed[N_SEQ] = {0}, n_got[N_SEQ] = {0}, n_dec[N_SEQ] = {0};
    seq[0] = KV_SEQ_DEFAULT;
    for (int s = 1; s < N_SEQ; s++) assert_int_equal(kv_seq_new(kv, &seq[s], &err), KV_OK);
    kv_batch b;
    assert_int_equal(kv_batch_init(&b, N_BATCH, &err), KV_OK);
    double worst = 0;
    int n_mixed = 0;
    for (int step = 0;; step++) {
        kv_batch_clear(&b);
        /* each sequence's tokens of this step, then interleaved into the batch */
        int32_t mine[N_SEQ][CHUNK];
        int n_mine[N_SEQ] = {0}, row_of[N_SEQ], any_prefill = 0, any_decode = 0;
        for (int s = 0; s < N_SEQ; s++) {
            row_of[s] = -1;
            if (step < s || n_got[s] > N_GEN) continue;
            if (fed[s] < prompt_len[s]) {
                int k = prompt_len[s] - fed[s] < CHUNK ? prompt_len[s] - fed[s] : CHUNK;
                memcpy(mine[s], prompts[s] + fed[s], sizeof(int32_t) * (size_t)k);
                n_mine[s] = k;
                any_prefill = 1;
            } else {
                mine[s][0] = got_tok[s][n_got[s] - 1];
                n_mine[s] = 1;
                any_decode = 1;
            }
        }
        n_mixed += any_prefill && any_decode;
        int left = 0;
        for (int s = 0; s < N_SEQ; s++) left += n_mine[s];
        if (!left) break;
        for (int j = 0; j < CHUNK; j++)
            for (int r = 0; r < N_SEQ; r++) {
                int s = (r + step) % N_SEQ; /* the order rotates */
                if (j >= n_mine[s]) continue;
                int last = j == n_mine[s] - 1, want = last && fed[s] + n_mine[s] == prompt_len[s];
                want |= fed[s] >= prompt_len[s];
                int row = kv_batch_add(&b, mine[s][j], seq[s], want);
                assert_true(row >= -1);
                if (want) row_of[s] = row;
            }
        int rc = kv_batch_run(f->m, f->fc, kv, f->pool, &b, logits, &err);
        if (rc) print_message("%s\n", err.msg);
        assert_int_equal(rc, KV_OK);
        for (int s = 0; s < N_SEQ; s++) {
            if (!n_mine[s]) continue;
            if (fed[s] < prompt_len[s]) fed[s] += n_mine[s];
            else n_dec[s]++;
            assert_int_equal(kv_seq_n_tokens(kv, seq[s]), fed[s] + n_dec[s]);
            if (row_of[s] < 0) continue;
            const float *lg = logits + (size_t)row_of[s] * V, *rf = ref + ((size_t)s * (N_GEN + 1) + n_got[s]) * V;
            double w = compare(rf, lg, V);
            worst = w > worst ? w : worst;
            if (w > 1) print_message("sequence %d step %d: logits differ by %.2f x the tolerance\n", s, n_got[s], w);
            assert_true(w <= 1);
            got_tok[s][n_got[s]] = argmax(lg, V);
            if (decided(rf, V)) assert_int_equal(got_tok[s][n_got[s]], ref_tok[s][n_got[s]]);
            else got_tok[s][n_got[s]] = ref_tok[s][n_got[s]]; /* follow the reference past a near tie */
            n_got[s]++;
        }
        assert_int_equal(kv_cache_check(kv, &err), KV_OK);
    }
    for (int s = 0; s < N_SEQ; s++) {
        assert_int_equal(n_got[s], N_GEN + 1);
        assert_memory_equal(got_tok[s], ref_tok[s], sizeof ref_tok[s]);
    }
    assert_true(n_mixed > 0);
    print_message("worst logit difference: %.3f of the tolerance\n", worst);
    kv_batch_free(&b);
    kv_cache_free(kv);
    free(ref);
    free(logits);
}

/* A prefix (two full blocks and a partial one) prefilled once and forked three times; one batch
 * feeds every fork a different continuation: each fork's logits equal a fresh run of prefix +
 * continuation, the full prefix blocks stay shared (refcount 3 + the source), the partial block
 * is copied on write, and the source sequence is untouched. */
static void test_forks(void **state)
{
    const fixture *f = *state;
    const int V = f->n_vocab, kv_type = f->bc->kv_type, NP = 37;
    kv_error err = {0};
    int32_t full[3][NP + 3];
    for (int i = 0; i < NP; i++) full[0][i] = full[1][i] = full[2][i] = prompt_tok(9, i, V);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 3; j++) full[k][NP + j] = prompt_tok(k + 20, j, V);
    /* fork k gets k + 1 continuation tokens: 1, 2, 3 rows of the batch */
    float *ref = malloc(sizeof(float) * 3 * V), *logits = malloc(sizeof(float) * 3 * V), *src = malloc(sizeof(float) * V);
    float *src_again = malloc(sizeof(float) * V);
    assert_non_null(ref);
    assert_non_null(logits);
    assert_non_null(src);
    assert_non_null(src_again);
    for (int k = 0; k < 3; k++) {
        kv_cache *one = new_cache(f, kv_type, 1);
        assert_int_equal(model_forward_seq(f->m, f->fc, one, KV_SEQ_DEFAULT, f->pool, full[k], NP + k + 1,
                                           ref + (size_t)k * V, 0, &err), KV_OK);
        kv_cache_free(one);
    }
    kv_cache *kv = new_cache(f, kv_type, 4);
    assert_int_equal(model_forward_seq(f->m, f->fc, kv, KV_SEQ_DEFAULT, f->pool, full[0], NP, src, 0, &err), KV_OK);
    int fk[3];
    for (int k = 0; k < 3; k++) assert_int_equal(kv_seq_fork(kv, KV_SEQ_DEFAULT, -1, &fk[k], &err), KV_OK);
    int32_t toks[6];
    int ids[6], n = 0;
    for (int k = 0; k < 3; k++)
        for (int j = 0; j <= k; j++) {
            toks[n] = full[k][NP + j];
            ids[n++] = fk[k];
        }
    /* want_logits NULL: the last token of each sequence, in batch order (forks 0, 1, 2) */
    int rc = model_forward_batch(f->m, f->fc, kv, f->pool, toks, ids, n, NULL, logits, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, KV_OK);
    for (int k = 0; k < 3; k++) {
        double w = compare(ref + (size_t)k * V, logits + (size_t)k * V, V);
        if (w > 1) print_message("fork %d: logits differ by %.2f x the tolerance\n", k, w);
        assert_true(w <= 1);
        assert_int_equal(kv_seq_n_tokens(kv, fk[k]), NP + k + 1);
        assert_int_equal(kv_seq_block_ref(kv, fk[k], 0), 4);  /* full blocks shared by all four */
        assert_int_equal(kv_seq_block_ref(kv, fk[k], 16), 4);
        assert_int_equal(kv_seq_block_ref(kv, fk[k], 32), 1); /* the partial block: a private copy */
    }
    assert_int_equal(kv_seq_n_tokens(kv, KV_SEQ_DEFAULT), NP);
    assert_int_equal(kv_cache_check(kv, &err), KV_OK);
    /* the source still continues as it would have: its partial block was not written */
    assert_int_equal(model_forward_seq(f->m, f->fc, kv, KV_SEQ_DEFAULT, f->pool, &full[0][NP], 1, src_again, 0, &err),
                     KV_OK);
    assert_true(compare(ref, src_again, V) <= 1);
    kv_cache_free(kv);
    free(ref);
    free(logits);
    free(src);
    free(src_again);
}

/* Bad batches are refused before the cache changes. */
static void test_errors(void **state)
{
    const fixture *f = *state;
    kv_error err = {0};
    kv_cache *kv = new_cache(f, f->bc->kv_type, 2);
    int s1;
    assert_int_equal(kv_seq_new(kv, &s1, &err), KV_OK);
    float *logits = malloc(sizeof(float) * 2 * f->n_vocab);
    assert_non_null(logits);
    int32_t toks[2] = {1, 2};
    int ids[2] = {KV_SEQ_DEFAULT, 77};
    assert_int_equal(model_forward_batch(f->m, f->fc, kv, f->pool, toks, ids, 2, NULL, logits, &err), KV_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no KV sequence"));
    ids[1] = s1;
    toks[1] = f->n_vocab;
    assert_int_equal(model_forward_batch(f->m, f->fc, kv, f->pool, toks, ids, 2, NULL, logits, &err), KV_ERR_INVALID);
    assert_non_null(strstr(err.msg, "out of range"));
    toks[1] = 2;
    assert_int_equal(model_forward_batch(f->m, f->fc, kv, f->pool, toks, ids, 0, NULL, logits, &err), KV_ERR_INVALID);
    assert_int_equal(model_forward_batch(f->m, f->fc, kv, f->pool, toks, ids, N_BATCH + 1, NULL, logits, &err),
                     KV_ERR_INVALID);
    /* a sequence that would pass n_ctx */
    int32_t *fill = malloc(sizeof(int32_t) * N_BATCH);
    int *fid = malloc(sizeof(int) * N_BATCH);
    assert_non_null(fill);
    assert_non_null(fid);
    for (int i = 0; i < N_BATCH; i++) {
        fill[i] = 1 + i % 50;
        fid[i] = s1;
    }
    assert_int_equal(model_forward_batch(f->m, f->fc, kv, f->pool, fill, fid, N_BATCH, NULL, logits, &err), KV_OK);
    assert_int_equal(model_forward_batch(f->m, f->fc, kv, f->pool, fill, fid, N_BATCH, NULL, logits, &err), KV_OK);
    assert_int_equal(model_forward_batch(f->m, f->fc, kv, f->pool, toks, ids, 2, NULL, logits, &err), KV_ERR_CONTEXT);
    assert_int_equal(kv_seq_n_tokens(kv, KV_SEQ_DEFAULT), 0);
    assert_int_equal(kv_seq_n_tokens(kv, s1), N_CTX);
    /* asking for no logits at all is fine without a buffer */
    int no[1] = {0};
    assert_int_equal(model_forward_batch(f->m, f->fc, kv, f->pool, toks, ids, 1, no, NULL, &err), KV_OK);
    assert_int_equal(kv_seq_n_tokens(kv, KV_SEQ_DEFAULT), 1);
    assert_int_equal(kv_cache_check(kv, &err), KV_OK);
    free(fill);
    free(fid);
    free(logits);
    kv_cache_free(kv);
}

static size_t add_tests(struct CMUnitTest *tests, char (*names)[128], size_t k, batch_case *cs, size_t n, int with_errors)
{
    static const char *kv_names[GGML_TYPE_COUNT];
    kv_names[GGML_TYPE_F16] = "f16";
    kv_names[GGML_TYPE_F32] = "f32";
    kv_names[GGML_TYPE_Q8_0] = "q8_0";
    void (*fns[3])(void **) = {test_mixed, test_forks, test_errors};
    const char *what[3] = {"mixed", "forks", "errors"};
    for (size_t i = 0; i < n; i++) {
        const char *name = cs[i].model ? cs[i].model : cs[i].gen_shape;
        for (int t = 0; t < 3; t++) {
            if (t == 2 && (i > 0 || !with_errors)) continue; /* the error paths do not depend on the model */
            if (t == 1 && with_errors && i >= 2) continue; /* forks: two models per level are enough */
            snprintf(names[k], 128, "%s %s %s kv %s", what[t], name, cs[i].gen_type ? cs[i].gen_type : "",
                     kv_names[cs[i].kv_type]);
            tests[k] = (struct CMUnitTest){names[k], fns[t], setup, teardown, &cs[i]};
            k++;
        }
    }
    return k;
}

int main(void)
{
    if (tu_tmpdir_make("batch")) return 1;
    enum { N1 = sizeof cases / sizeof *cases, N2 = sizeof arch_cases / sizeof *arch_cases };
    static struct CMUnitTest t1[3 * N1], t2[3 * N2];
    static char n1[3 * N1][128], n2[3 * N2][128];
    size_t k1 = add_tests(t1, n1, 0, cases, N1, 1), k2 = add_tests(t2, n2, 0, arch_cases, N2, 0);
    int failed = tu_run_every_isa("batch", t1, k1, NULL, NULL);
    failed += _cmocka_run_group_tests("batch (best level)", t2, k2, NULL, NULL);
    tu_tmpdir_remove();
    return failed;
}
