/* test_kv_swa: sliding-window layers keep only their window in the paged KV cache — pool accounting bounded as a sequence grows, fork / truncate / adopt / shift / blobs (whole, delta, rebase, older versions) on a synthetic cache against a full-history cache, and on the gemma3 / gemma2 / gpt-oss synthetic models logits equal to the full-history cache's after a prompt longer than the window, after fork, save / restore and a shift, at every kernel level (gemma3: F16 weights at the best level, Q8_0 below it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/tools.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "engine/model.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/threadpool.h"
#include "tests/support/testisa.h"
#include "tests/support/testutil.h"

#define BS KV_BLOCK_SIZE
#define NL 4  /* layers 0 and 2 slide, 1 and 3 are full */
#define NE 32
#define WIN 20
#define SLACK 20
#define KEEP (WIN - 1 + SLACK)

static const uint8_t win_layers[NL] = {1, 0, 1, 0};

static void check_ok(const kv_cache *c)
{
    kv_error err = {0};
    int rc = kv_cache_check(c, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, KV_OK);
}

/* The same shape with window layers (win = 1) or every position kept (win = 0). */
static kv_cache *cache(int win, int type, int n_ctx, int n_blocks)
{
    kv_error err = {0};
    kv_cache_params p = {.n_layer = NL, .n_embd_kv = NE, .n_ctx = n_ctx, .type = type, .n_blocks = n_blocks,
                         .swa_layers = win ? win_layers : NULL, .n_swa = win ? WIN : 0, .swa_slack = SLACK};
    kv_cache *c = kv_cache_create_ex(&p, &err);
    if (!c) print_message("%s\n", err.msg);
    assert_non_null(c);
    return c;
}

static void row_val(float *r, int layer, int kv, int pos)
{
    for (int i = 0; i < NE; i++) r[i] = (float)((layer * 3 + kv * 7 + pos) % 61) + i / 16.0f;
}

static void append(kv_cache *c, int seq, int32_t tok0, int n)
{
    kv_error err = {0};
    int rc = kv_seq_reserve(c, seq, n, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, KV_OK);
    int pos0 = kv_seq_n_tokens(c, seq);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    float k[NE], v[NE];
    for (int t = 0; t < n; t++) {
        toks[t] = tok0 + pos0 + t;
        for (int l = 0; l < NL; l++) {
            row_val(k, l, 0, pos0 + t);
            row_val(v, l, 1, pos0 + t);
            kv_cache_store(c, seq, l, pos0 + t, k, v);
        }
    }
    kv_seq_commit(c, seq, toks, n);
    free(toks);
}

/* Every row seq must hold (all of a full layer, the window of a window layer) equals a's rows
 * in cache ref (same positions). */
static void expect_window_rows(const kv_cache *c, int seq, const kv_cache *ref, int rseq)
{
    int n = kv_seq_n_tokens(c, seq);
    assert_int_equal(n, kv_seq_n_tokens(ref, rseq));
    assert_memory_equal(kv_seq_tokens(c, seq), kv_seq_tokens(ref, rseq), sizeof(int32_t) * (size_t)n);
    if (!n) return;
    float *a = malloc(sizeof(float) * NE * (size_t)n), *b = malloc(sizeof(float) * NE * (size_t)n);
    for (int l = 0; l < NL; l++) {
        int lo = win_layers[l] ? (n - WIN + 1 > 0 ? n - WIN + 1 : 0) : 0;
        for (int kv = 0; kv < 2; kv++) {
            if (kv == 0) {
                kv_cache_k_from(c, seq, l, lo, n, a);
                kv_cache_k_from(ref, rseq, l, lo, n, b);
            } else {
                kv_cache_v_from(c, seq, l, lo, n, a);
                kv_cache_v_from(ref, rseq, l, lo, n, b);
            }
            assert_memory_equal(a + (size_t)lo * NE, b + (size_t)lo * NE, sizeof(float) * NE * (size_t)(n - lo));
        }
    }
    free(a);
    free(b);
}

/* Memory: the window parts held stay bounded by the window however long the sequence grows;
 * the full parts grow with it; the gauge's bytes are the real ones. */
static void test_pool_bounded(void **state)
{
    (void)state;
    kv_cache *c = cache(1, GGML_TYPE_F16, 2048, 0), *f = cache(0, GGML_TYPE_F16, 2048, 0);
    kv_cache_stats st, sf;
    int most = (KEEP + BS - 1) / BS + 1;
    for (int n = 0; n < 1000; n += 37) {
        append(c, 0, 100, 37);
        append(f, 0, 100, 37);
        check_ok(c);
        kv_cache_get_stats(c, &st);
        kv_cache_get_stats(f, &sf);
        assert_true(st.n_swa_parts <= most + 37 / BS + 1);
        assert_true(st.n_swa_parts_alloc <= most + 37 / BS + 2);
        assert_int_equal(st.n_swa_layers, 2);
        assert_int_equal(st.swa_keep, KEEP);
        /* half the layers slide: the real bytes approach half of the full history's */
        int len = kv_seq_n_tokens(c, 0);
        size_t held = (size_t)(len - (len - KEEP > 0 ? (len - KEEP) / BS * BS : 0));
        assert_int_equal(st.bytes_used, st.bytes_per_token / 2 * (size_t)len + st.swa_bytes_per_token * held);
        assert_int_equal(st.bytes_full_history, sf.bytes_used);
        assert_true(st.bytes_allocated <= sf.bytes_allocated);
        expect_window_rows(c, 0, f, 0);
    }
    assert_true(st.bytes_used < sf.bytes_used * 6 / 10);
    assert_true(st.bytes_allocated < sf.bytes_allocated * 6 / 10);
    assert_true(st.bytes_reserved < sf.bytes_reserved * 6 / 10);
    print_message("1036 positions, 2 of 4 layers with a window of %d: %zu bytes used (full history %zu), %zu allocated "
                  "(%zu), %d window parts held\n",
                  WIN, st.bytes_used, sf.bytes_used, st.bytes_allocated, sf.bytes_allocated, st.n_swa_parts);
    /* freeing the sequence returns its window parts (none is cached: the window's blocks are
     * partial or hashed and kept for a continuation) */
    kv_seq_free(c, 0);
    check_ok(c);
    kv_cache_drop_cached(c);
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_swa_parts, 0);
    check_ok(c);
    kv_cache_free(c);
    kv_cache_free(f);
}

/* Fork, truncate (inside the slack: exact; further: the longest prefix whose window is held),
 * adopt (only as far as the cached blocks hold the window of their end). */
static void test_fork_truncate_adopt(void **state)
{
    (void)state;
    kv_error err = {0};
    kv_cache *c = cache(1, GGML_TYPE_F32, 512, 0), *f = cache(0, GGML_TYPE_F32, 512, 0);
    append(c, 0, 7, 150);
    append(f, 0, 7, 150);
    int a, fa;
    assert_int_equal(kv_seq_fork(c, 0, -1, &a, &err), KV_OK);
    assert_int_equal(kv_seq_fork(f, 0, -1, &fa, &err), KV_OK);
    check_ok(c);
    expect_window_rows(c, a, f, fa);
    /* both grow apart (copy-on-write of the shared partial block) */
    append(c, a, 1000, 40);
    append(f, fa, 1000, 40);
    append(c, 0, 7, 3);
    append(f, 0, 7, 3);
    check_ok(c);
    expect_window_rows(c, a, f, fa);
    expect_window_rows(c, 0, f, 0);
    /* a rewind inside the slack keeps exactly what was asked */
    assert_true(kv_seq_window_ok(c, a, 190 - SLACK));
    kv_seq_truncate(c, a, 190 - SLACK);
    kv_seq_truncate(f, fa, 190 - SLACK);
    check_ok(c);
    expect_window_rows(c, a, f, fa);
    /* further back the window is gone: nothing is kept (a prefill from the start recomputes it) */
    assert_false(kv_seq_window_ok(c, a, 100));
    kv_seq_truncate(c, a, 100);
    int m = kv_seq_n_tokens(c, a);
    assert_int_equal(m, 0);
    kv_seq_truncate(f, fa, m);
    check_ok(c);
    expect_window_rows(c, a, f, fa);
    /* the rest is prefilled again: the same rows as the full-history cache */
    append(c, a, 7, 150 - m);
    append(f, fa, 7, 150 - m);
    check_ok(c);
    expect_window_rows(c, a, f, fa);
    /* a fork of a prefix whose window is freed is cut the same way */
    int b;
    assert_int_equal(kv_seq_fork(c, 0, 60, &b, &err), KV_OK);
    assert_int_equal(kv_seq_n_tokens(c, b), 0);
    check_ok(c);
    kv_seq_free(c, b);
    /* adopt: sequence 0 (153 positions) freed keeps its hashed window blocks cached */
    int32_t toks[153];
    memcpy(toks, kv_seq_tokens(c, 0), sizeof toks);
    kv_seq_free(c, a);
    kv_seq_free(c, 0);
    check_ok(c);
    int s1, s2;
    assert_int_equal(kv_seq_new(c, &s1, &err), KV_OK);
    int got = kv_seq_adopt(c, s1, toks, 153, NULL);
    assert_int_equal(got, 144); /* 9 full blocks; their end's window is held */
    check_ok(c);
    kv_seq_truncate(f, 0, 144);
    expect_window_rows(c, s1, f, 0);
    /* a prompt that diverges at 50: the blocks before hold no window rows, nothing is adopted */
    assert_int_equal(kv_seq_new(c, &s2, &err), KV_OK);
    int32_t other[153];
    memcpy(other, toks, sizeof other);
    other[50] = 9999;
    assert_int_equal(kv_seq_adopt(c, s2, other, 153, NULL), 0);
    check_ok(c);
    kv_cache_free(c);
    kv_cache_free(f);
}

static void make_rope(kv_rope *r)
{
    *r = (kv_rope){.n_head_kv = 2, .head_dim = 16, .n_rot = 16, .neox = 0, .freq_base = 10000.0f};
}

/* Context shift: the window layers move only the new window's rows; the result equals the
 * full-history cache's shift wherever a row is held; a shift whose window would need freed
 * kept rows fails and changes nothing. */
static void test_shift(void **state)
{
    (void)state;
    kv_error err = {0};
    kv_rope rope;
    make_rope(&rope);
    int types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0};
    for (int ti = 0; ti < 3; ti++) {
        kv_cache *c = cache(1, types[ti], 256, 0), *f = cache(0, types[ti], 256, 0);
        append(c, 0, 3, 200);
        append(f, 0, 3, 200);
        /* keep 4, drop 100: the tail of 96 is longer than the window */
        assert_int_equal(kv_seq_shift(c, 0, 4, 100, &rope, &err), KV_OK);
        assert_int_equal(kv_seq_shift(f, 0, 4, 100, &rope, &err), KV_OK);
        check_ok(c);
        expect_window_rows(c, 0, f, 0);
        append(c, 0, 3, 30);
        append(f, 0, 3, 30);
        check_ok(c);
        expect_window_rows(c, 0, f, 0);
        /* keep 16, drop all but 10 of the rest: the window reaches the kept rows, freed long ago */
        int n = kv_seq_n_tokens(c, 0);
        kv_cache_stats before, after;
        kv_cache_get_stats(c, &before);
        assert_int_equal(kv_seq_shift(c, 0, 16, n - 16 - 10, &rope, &err), KV_ERR_CONTEXT);
        assert_non_null(strstr(err.msg, "sliding-window"));
        kv_cache_get_stats(c, &after);
        assert_int_equal(kv_seq_n_tokens(c, 0), n);
        assert_int_equal(after.n_shifts, before.n_shifts);
        check_ok(c);
        expect_window_rows(c, 0, f, 0);
        /* a short sequence (nothing freed yet) shifts into its kept rows */
        int s, fs;
        assert_int_equal(kv_seq_new(c, &s, &err), KV_OK);
        assert_int_equal(kv_seq_new(f, &fs, &err), KV_OK);
        append(c, s, 5, 30);
        append(f, fs, 5, 30);
        assert_int_equal(kv_seq_shift(c, s, 4, 10, &rope, &err), KV_OK);
        assert_int_equal(kv_seq_shift(f, fs, 4, 10, &rope, &err), KV_OK);
        check_ok(c);
        expect_window_rows(c, s, f, fs);
        kv_cache_free(c);
        kv_cache_free(f);
    }
}

/* Blobs: version 3 holds the full layers' rows and the window layers' window only; whole,
 * delta (base + delta), rebase byte-identical to a saved delta; a version-2 blob of the
 * full-history cache restores into the window cache; a prefix whose window was freed cannot be
 * saved. */
static void test_blobs(void **state)
{
    (void)state;
    kv_error err = {0};
    int types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0};
    for (int ti = 0; ti < 3; ti++) {
        kv_cache *c = cache(1, types[ti], 512, 256), *f = cache(0, types[ti], 512, 256);
        append(c, 0, 11, 200);
        append(f, 0, 11, 200);
        void *w, *full;
        size_t lw, lf;
        assert_int_equal(kv_seq_save(c, 0, -1, 42, &w, &lw, &err), KV_OK);
        assert_int_equal(kv_seq_save(f, 0, -1, 42, &full, &lf, &err), KV_OK);
        assert_int_equal(((uint8_t *)w)[4], 3);
        assert_int_equal(((uint8_t *)full)[4], 2);
        kv_cache_stats st;
        kv_cache_get_stats(c, &st);
        int swa_lo = (200 - KEEP) / BS * BS;
        /* tokens, full layers' rows of 200 positions, window layers' rows from swa_lo */
        assert_int_equal(lw, 72 + 4 * 200 + (st.bytes_per_token - st.swa_bytes_per_token) * 200 +
                                 st.swa_bytes_per_token * (size_t)(200 - swa_lo) + 8);
        assert_true(lw < lf * 65 / 100); /* (200 + 40) / 400 of the rows */
        int r;
        assert_int_equal(kv_seq_new(c, &r, &err), KV_OK);
        assert_int_equal(kv_seq_restore(c, r, w, lw, 42, 1000, &err), KV_OK);
        check_ok(c);
        expect_window_rows(c, r, f, 0);
        /* the full-history (version 2) blob restores into the window cache too */
        int r2;
        assert_int_equal(kv_seq_new(c, &r2, &err), KV_OK);
        assert_int_equal(kv_seq_restore(c, r2, full, lf, 42, 1000, &err), KV_OK);
        check_ok(c);
        expect_window_rows(c, r2, f, 0);
        /* a window blob cannot go into a full-history cache: it lacks rows */
        int fr;
        assert_int_equal(kv_seq_new(f, &fr, &err), KV_OK);
        assert_int_equal(kv_seq_restore(f, fr, w, lw, 42, 1000, &err), KV_ERR_UNSUPPORTED);
        /* a freed window: no blob of the first 100 positions */
        void *x;
        size_t lx;
        assert_false(kv_seq_window_ok(c, 0, 100));
        assert_int_equal(kv_seq_save_range(c, 0, 0, 100, 42, &x, &lx, &err), KV_ERR_INVALID);
        assert_null(x);
        /* base + delta: the base saved while its window was held */
        int s;
        assert_int_equal(kv_seq_new(c, &s, &err), KV_OK);
        append(c, s, 11, 40);
        void *base, *delta, *rb;
        size_t lb, ld, lrb;
        assert_int_equal(kv_seq_save_range(c, s, 0, 32, 42, &base, &lb, &err), KV_OK);
        append(c, s, 11, 160);
        assert_int_equal(kv_seq_save_range(c, s, 32, -1, 42, &delta, &ld, &err), KV_OK);
        assert_int_equal(kv_blob_rebase(w, lw, 32, &rb, &lrb, &err), KV_OK);
        assert_int_equal(lrb, ld);
        assert_memory_equal(rb, delta, ld);
        free(rb);
        int t;
        assert_int_equal(kv_seq_new(c, &t, &err), KV_OK);
        assert_int_equal(kv_seq_restore(c, t, delta, ld, 42, 1000, &err), KV_ERR_INVALID); /* no base yet */
        assert_int_equal(kv_seq_restore(c, t, base, lb, 42, 1000, &err), KV_OK);
        assert_int_equal(kv_seq_restore(c, t, delta, ld, 42, 1000, &err), KV_OK);
        check_ok(c);
        expect_window_rows(c, t, f, 0);
        /* and the restored sequences go on like the original */
        append(c, t, 11, 20);
        append(f, 0, 11, 20);
        check_ok(c);
        expect_window_rows(c, t, f, 0);
        free(base);
        free(delta);
        free(w);
        free(full);
        kv_cache_free(c);
        kv_cache_free(f);
    }
}

/* The gemma3-1b shape (26 layers, 1 KV head of 256, window 512 on five layers of six) at 4096
 * and 8192 positions, f16: what the gauge shows against the full history. */
static void test_gemma3_1b_memory(void **state)
{
    (void)state;
    enum { L = 26, EKV = 256, W = 512, N = 8192 };
    uint8_t win[L];
    for (int l = 0; l < L; l++) win[l] = l % 6 < 5;
    kv_error err = {0};
    kv_cache_params p = {.n_layer = L, .n_embd_kv = EKV, .n_ctx = N, .type = GGML_TYPE_F16, .swa_layers = win, .n_swa = W};
    kv_cache *c = kv_cache_create_ex(&p, &err);
    assert_non_null(c);
    int32_t toks[512];
    for (int n = 0; n < N; n += 512) {
        for (int i = 0; i < 512; i++) toks[i] = (n + i) % 1000;
        assert_int_equal(kv_seq_reserve(c, 0, 512, &err), KV_OK);
        kv_seq_commit(c, 0, toks, 512);
        if (n + 512 == 4096 || n + 512 == N) {
            kv_cache_stats st;
            kv_cache_get_stats(c, &st);
            check_ok(c);
            /* 4 full layers of every position, 22 of the window + slack + at most a block */
            size_t full_tok = st.bytes_per_token - st.swa_bytes_per_token;
            assert_int_equal(st.n_swa_layers, 22);
            assert_true(st.bytes_used <= full_tok * (size_t)(n + 512) + st.swa_bytes_per_token * (W + KV_SWA_SLACK + BS));
            assert_true(st.bytes_allocated <= st.bytes_used + st.bytes_per_block * 40); /* + one prefill chunk */
            print_message("gemma3-1b shape, f16 KV, %d positions: %.1f MiB used, %.1f MiB allocated; full history "
                          "%.1f MiB (%.0f%% saved)\n",
                          n + 512, st.bytes_used / 1048576.0, st.bytes_allocated / 1048576.0,
                          st.bytes_full_history / 1048576.0, 100.0 - 100.0 * st.bytes_used / st.bytes_full_history);
        }
    }
    kv_cache_free(c);
}

/* ---- on the synthetic models (tests/arch-ref): the window cache computes the same logits ---- */

typedef struct model_case {
    const char *ref;
    int n_batch;
    int n_types;       /* KV types tried: f16, then f32 */
    const char *wtype; /* NULL: the reference's weight type (F16); else gen-model's --type */
} model_case;

static int json_int(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valueint : 0;
}

static model *load_ref_model(const char *name, const char *wtype, cJSON **ref_out)
{
    char rpath[256];
    snprintf(rpath, sizeof rpath, "tests/arch-ref/%s.json", name);
    cJSON *ref = tu_read_json(rpath);
    assert_non_null(ref);
    gen_model_opts o = {
        .n_layer = json_int(ref, "layers"), .n_vocab = json_int(ref, "vocab"), .n_ff = json_int(ref, "ff"),
        .n_swa = json_int(ref, "swa"), .seed = (uint64_t)json_int(ref, "seed"),
        .n_expert = json_int(ref, "experts"), .n_expert_used = json_int(ref, "experts_used"),
        .n_ff_exp = json_int(ref, "ff_exp"),
    };
    const cJSON *cap = cJSON_GetObjectItem(ref, "attn_softcap");
    if (cJSON_IsNumber(cap)) o.attn_softcap = (float)cap->valuedouble;
    kv_error err = {0};
    const char *mpath = tu_tmp_path("swa.gguf");
    int rc = gen_model_write_ex(mpath, cJSON_GetObjectItem(ref, "shape")->valuestring,
                                wtype ? wtype : cJSON_GetObjectItem(ref, "type")->valuestring, &o, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, KV_OK);
    model *m = NULL;
    rc = model_load(mpath, &m, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, KV_OK);
    *ref_out = ref;
    return m;
}

static kv_cache *model_cache(const model *m, int win, int n_ctx, int type)
{
    kv_error err = {0};
    kv_cache_params p = {.n_layer = m->hp.n_layer, .n_embd_kv = m->hp.n_embd_kv, .n_ctx = n_ctx, .type = type};
    uint8_t *f = win ? model_swa_layers(m, &p.n_swa) : NULL;
    if (win) assert_non_null(f);
    p.swa_layers = f;
    kv_cache *c = kv_cache_create_ex(&p, &err);
    free(f);
    assert_non_null(c);
    return c;
}

static void forward(const model *m, forward_ctx *fc, kv_cache *kv, int seq, tpool *pool, const int32_t *t, int n,
                    int n_batch, float *logits)
{
    kv_error err = {0};
    for (int i = 0, k; i < n; i += k) {
        k = n - i < n_batch ? n - i : n_batch;
        int rc = model_forward_seq(m, fc, kv, seq, pool, t + i, k, logits, 0, &err);
        if (rc) print_message("%s\n", err.msg);
        assert_int_equal(rc, KV_OK);
    }
}

static void run_model(void **state)
{
    const model_case *mc = *state;
    cJSON *ref;
    /* below the best level the Q8_0 file (see main) */
    const char *wtype = mc->wtype && kern()->isa != kern_best() ? mc->wtype : NULL;
    model *m = load_ref_model(mc->ref, wtype, &ref);
    const int nv = m->hp.n_vocab, n_ctx = json_int(ref, "n_ctx");
    assert_true(m->hp.n_swa > 0);
    /* the long prompt (longer than the window and its slack: blocks are freed) */
    const cJSON *jt = NULL, *jp;
    cJSON_ArrayForEach(jp, cJSON_GetObjectItem(ref, "prompts")) jt = cJSON_GetObjectItem(jp, "tokens");
    int n0 = cJSON_GetArraySize(jt), n = n0;
    assert_true(n0 > m->hp.n_swa + KV_SWA_SLACK);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) toks[i] = cJSON_GetArrayItem(jt, i % n0)->valueint;
    float *lw = malloc(sizeof(float) * (size_t)nv), *lf = malloc(sizeof(float) * (size_t)nv);
    float *l2 = malloc(sizeof(float) * (size_t)nv);
    kv_error err = {0};
    tpool *pool = tpool_create(2);
    forward_ctx *fc = forward_ctx_create(m, mc->n_batch, n_ctx, &err);
    assert_non_null(fc);
    int types[] = {GGML_TYPE_F16, GGML_TYPE_F32};
    for (int ti = 0; ti < mc->n_types; ti++) {
        kv_cache *w = model_cache(m, 1, n_ctx, types[ti]), *f = model_cache(m, 0, n_ctx, types[ti]);
        forward(m, fc, w, 0, pool, toks, n, mc->n_batch, lw);
        forward(m, fc, f, 0, pool, toks, n, mc->n_batch, lf);
        assert_memory_equal(lw, lf, sizeof(float) * (size_t)nv); /* the same rows are read: bitwise */
        check_ok(w);
        kv_cache_stats sw, sf;
        kv_cache_get_stats(w, &sw);
        kv_cache_get_stats(f, &sf);
        assert_true(sw.n_swa_layers > 0);
        assert_true(sw.bytes_used < sf.bytes_used);
        assert_true(sw.n_swa_parts <= (sw.swa_keep + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE + 1 + mc->n_batch / KV_BLOCK_SIZE + 1);
        /* decode a few tokens one by one */
        for (int i = 0; i < 6; i++) {
            int32_t t = toks[i];
            forward(m, fc, w, 0, pool, &t, 1, 1, lw);
            forward(m, fc, f, 0, pool, &t, 1, 1, lf);
            assert_memory_equal(lw, lf, sizeof(float) * (size_t)nv);
        }
        /* fork: both branches decode like the full-history cache */
        int b;
        assert_int_equal(kv_seq_fork(w, 0, -1, &b, &err), KV_OK);
        int32_t t = 5;
        forward(m, fc, w, b, pool, &t, 1, 1, l2);
        forward(m, fc, w, 0, pool, &t, 1, 1, lw);
        forward(m, fc, f, 0, pool, &t, 1, 1, lf);
        assert_memory_equal(lw, lf, sizeof(float) * (size_t)nv);
        assert_memory_equal(l2, lf, sizeof(float) * (size_t)nv);
        kv_seq_free(w, b);
        check_ok(w);
        /* save / restore (version 3) into a fresh sequence: the next token's logits */
        void *blob;
        size_t len;
        assert_int_equal(kv_seq_save(w, 0, -1, 9, &blob, &len, &err), KV_OK);
        int r;
        assert_int_equal(kv_seq_new(w, &r, &err), KV_OK);
        assert_int_equal(kv_seq_restore(w, r, blob, len, 9, nv, &err), KV_OK);
        free(blob);
        t = 7;
        forward(m, fc, w, r, pool, &t, 1, 1, l2);
        forward(m, fc, f, 0, pool, &t, 1, 1, lf);
        assert_memory_equal(l2, lf, sizeof(float) * (size_t)nv);
        kv_seq_free(w, 0);
        check_ok(w);
        /* context shift (one RoPE for every layer: the cache's operation, compared cache to cache) */
        kv_rope rope = {.n_head_kv = m->hp.n_head_kv, .head_dim = m->hp.head_dim, .n_rot = m->hp.n_rot,
                        .neox = m->hp.rope_neox, .freq_base = m->hp.rope_freq_base};
        /* as the engine does: a tail at least as long as what the window layers keep */
        int nr = kv_seq_n_tokens(w, r), keep = 4, drop = (nr - keep) / 2;
        if (nr - keep - drop < sw.swa_keep) drop = nr - keep - sw.swa_keep;
        assert_true(drop > 0);
        assert_int_equal(kv_seq_shift(w, r, keep, drop, &rope, &err), KV_OK);
        assert_int_equal(kv_seq_shift(f, 0, keep, drop, &rope, &err), KV_OK);
        check_ok(w);
        t = 9;
        forward(m, fc, w, r, pool, &t, 1, 1, l2);
        forward(m, fc, f, 0, pool, &t, 1, 1, lf);
        assert_memory_equal(l2, lf, sizeof(float) * (size_t)nv);
        print_message("%s%s%s (%s KV): %d positions, window %d: %zu bytes used, full history %zu (%.0f%%)\n", mc->ref,
                      wtype ? " " : "", wtype ? wtype : "", ti ? "f32" : "f16", n, m->hp.n_swa, sw.bytes_used, sf.bytes_used,
                      100.0 * (double)sw.bytes_used / (double)sf.bytes_used);
        kv_cache_free(w);
        kv_cache_free(f);
    }
    free(toks);
    free(lw);
    free(lf);
    free(l2);
    forward_ctx_free(fc);
    tpool_free(pool);
    model_free(m);
    cJSON_Delete(ref);
}

/* Through the engine (gemma3, window 32): greedy replies equal to a --swa-full engine's; a
 * request that rewinds past the freed window recomputes from the start, one that continues the
 * conversation reuses all of it. */
typedef struct toks_out {
    int32_t t[64];
    int n;
} toks_out;

static void on_tok(void *ud, int32_t token, int is_eog)
{
    toks_out *o = ud;
    (void)is_eog;
    if (o->n < 64) o->t[o->n++] = token;
}

static void test_engine_rewind(void **state)
{
    (void)state;
    cJSON *ref;
    model *m0 = load_ref_model("gemma3", NULL, &ref); /* writes tu_tmp_path("swa.gguf") */
    char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp_path("swa.gguf"));
    model_free(m0);
    engine *e[2];
    sampler *smp[2];
    kv_error err = {0};
    for (int i = 0; i < 2; i++) {
        engine_params p;
        engine_params_default(&p);
        p.model_path = path;
        p.n_ctx = 512;
        p.n_batch = 48;
        p.n_threads = 2;
        p.kv_type = GGML_TYPE_F32;
        p.kv_swa_full = i;
        int rc = engine_open(&p, &e[i], &err);
        if (rc) print_message("%s\n", err.msg);
        assert_int_equal(rc, KV_OK);
        sampler_params sp;
        sampler_params_default(&sp);
        sp.temperature = 0;
        smp[i] = sampler_create(engine_model(e[i])->hp.n_vocab, &sp, &err);
        assert_non_null(smp[i]);
    }
    const cJSON *jt = NULL, *jp;
    cJSON_ArrayForEach(jp, cJSON_GetObjectItem(ref, "prompts")) jt = cJSON_GetObjectItem(jp, "tokens");
    int n0 = cJSON_GetArraySize(jt);
    int32_t prompt[400];
    for (int i = 0; i < n0; i++) prompt[i] = cJSON_GetArrayItem(jt, i)->valueint;
    /* 1: the long prompt; 2: its first 40 tokens and another turn; 3: request 2 continued by 60 more */
    int lens[3] = {n0, 60, 0};
    toks_out out[2][3];
    gen_stats st[2][3];
    int32_t req[3][400];
    memcpy(req[0], prompt, sizeof(int32_t) * (size_t)n0);
    memcpy(req[1], prompt, sizeof(int32_t) * 40);
    for (int i = 40; i < 60; i++) req[1][i] = (prompt[i] * 7 + 3) % 500;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 2; i++) {
            gen_callbacks cb = {.on_token = on_tok, .ud = &out[i][r]};
            out[i][r].n = 0;
            int fin;
            int rc = engine_generate(e[i], req[r], (size_t)lens[r], 24, smp[i], &cb, &st[i][r], &fin, &err);
            if (rc) print_message("%s\n", err.msg);
            assert_int_equal(rc, KV_OK);
        }
        assert_int_equal(out[0][r].n, out[1][r].n);
        assert_memory_equal(out[0][r].t, out[1][r].t, sizeof(int32_t) * (size_t)out[0][r].n);
        if (r == 1) { /* request 3: request 2, its reply, 60 more tokens */
            lens[2] = lens[1];
            memcpy(req[2], req[1], sizeof(int32_t) * (size_t)lens[1]);
            for (int k = 0; k < out[0][1].n; k++) req[2][lens[2]++] = out[0][1].t[k];
            for (int k = 0; k < 60; k++) req[2][lens[2]++] = (17 + 13 * k) % 500; /* past the window */
        }
    }
    /* request 2 rewinds to 40 of ~180 positions: the full engine reuses 40, the window one nothing */
    assert_int_equal(st[1][1].n_reused, 40);
    assert_int_equal(st[0][1].n_reused, 0);
    /* request 3 continues request 2: both reuse what they hold (the reply's last token not yet fed) */
    assert_true(st[0][2].n_reused >= lens[1] + out[0][1].n - 1);
    assert_int_equal(st[0][2].n_reused, st[1][2].n_reused);
    kv_cache_stats ks[2];
    for (int i = 0; i < 2; i++) {
        kv_cache_get_stats(engine_kv(e[i]), &ks[i]);
        check_ok(engine_kv(e[i]));
    }
    assert_true(ks[0].n_swa_layers > 0);
    assert_int_equal(ks[1].n_swa_layers, 0);
    assert_true(ks[0].bytes_used < ks[1].bytes_used);
    assert_int_equal(ks[0].bytes_full_history, ks[1].bytes_used);
    for (int i = 0; i < 2; i++) {
        sampler_free(smp[i]);
        engine_close(e[i]);
    }
    cJSON_Delete(ref);
}

static model_case mcases[] = {{"gemma3", 48, 1, "q8_0"}, {"gemma2", 48, 2, NULL}, {"gpt-oss", 48, 2, NULL}};

int main(void)
{
    if (tu_tmpdir_make("kv_swa")) return 1;
    const struct CMUnitTest cache_tests[] = {
        cmocka_unit_test(test_pool_bounded),
        cmocka_unit_test(test_fork_truncate_adopt),
        cmocka_unit_test(test_shift),
        cmocka_unit_test(test_blobs),
        cmocka_unit_test(test_gemma3_1b_memory),
    };
    int fails = cmocka_run_group_tests_name("kv_swa", cache_tests, NULL, NULL);
    const struct CMUnitTest model_tests[] = {
        {"swa_gemma2", run_model, NULL, NULL, &mcases[1]},
        {"swa_gpt-oss", run_model, NULL, NULL, &mcases[2]},
        {"swa_engine_rewind", test_engine_rewind, NULL, NULL, NULL},
    };
    const char *only = getenv("KVCHAT_TEST_ONLY");
    if (only && *only) cmocka_set_test_filter(only);
    fails += cmocka_run_group_tests_name("kv_swa_models", model_tests, NULL, NULL);
    /* gemma3 at every kernel level (the attention's dot products and the matmuls of each ISA): its
     * F16 file at the best level; below it the same model in Q8_0 — the window cache's logits must
     * equal the full cache's bitwise whatever the weights, and the F16 matmuls took 118 of the
     * binary's 185 CPU s at the portable level under ASan (one call per weight to convert it) while
     * test_kernels / test_golden check every matmul of every level against the reference */
    const struct CMUnitTest isa_tests[] = {{"swa_gemma3", run_model, NULL, NULL, &mcases[0]}};
    fails += tu_run_every_isa("kv_swa_gemma3", isa_tests, 1, NULL, NULL);
    tu_tmpdir_teardown(NULL);
    return fails;
}
