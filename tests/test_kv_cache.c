/* test_kv_cache: the paged KV cache — refcounts, copy-on-write, prefix hashes and LRU reuse, reclaiming idle sequences, context shift, blobs (whole and deltas), accounting — and, on stories260K, fork/regen/prefix reuse/shift/restore (whole and base + delta) against fresh runs and q8_0 KV accuracy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/ops.h"
#include "engine/kernels/quant.h"
#include "tests/support/testutil.h"

#define BS KV_BLOCK_SIZE

static void check_ok(const kv_cache *c)
{
    kv_error err = {0};
    int rc = kv_cache_check(c, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, KV_OK);
}

/* A small synthetic cache: 2 layers, 32-wide rows. */
#define NL 2
#define NE 32

static kv_cache *small_cache(int type, int n_ctx, int n_blocks, int reserve)
{
    kv_error err = {0};
    kv_cache_params p = {.n_layer = NL, .n_embd_kv = NE, .n_ctx = n_ctx, .type = type, .n_blocks = n_blocks, .reserve = reserve};
    kv_cache *c = kv_cache_create_ex(&p, &err);
    if (!c) print_message("%s\n", err.msg);
    assert_non_null(c);
    return c;
}

/* Deterministic row content for (tag, layer, kv, pos). */
static void row_val(float *r, int tag, int layer, int kv, int pos)
{
    /* below 64 in steps of 1/16: exact in f16 too */
    for (int i = 0; i < NE; i++) r[i] = (float)((tag * 5 + layer * 3 + kv * 7 + pos) % 61) + i / 16.0f;
}

/* Append n positions with tokens tok0.. and content tag to seq. */
static int append(kv_cache *c, int seq, int tag, int32_t tok0, int n)
{
    kv_error err = {0};
    int rc = kv_seq_reserve(c, seq, n, &err);
    if (rc) return rc;
    int pos0 = kv_seq_n_tokens(c, seq);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++) {
        toks[t] = tok0 + t;
        for (int l = 0; l < NL; l++) {
            float k[NE], v[NE];
            row_val(k, tag, l, 0, pos0 + t);
            row_val(v, tag, l, 1, pos0 + t);
            kv_cache_store(c, seq, l, pos0 + t, k, v);
        }
    }
    kv_seq_commit(c, seq, toks, n);
    free(toks);
    return KV_OK;
}

/* Positions [from, to) of seq hold content tag at position pos + off. */
static void expect_rows(const kv_cache *c, int seq, int tag, int from, int to, int off)
{
    float *tmp = malloc(sizeof(float) * (size_t)NE * (size_t)(to + 1));
    for (int l = 0; l < NL; l++)
        for (int kv = 0; kv < 2; kv++) {
            const float *v = kv ? kv_cache_v(c, seq, l, to, tmp) : kv_cache_k(c, seq, l, to, tmp);
            for (int p = from; p < to; p++) {
                float want[NE];
                row_val(want, tag, l, kv, p + off);
                for (int i = 0; i < NE; i++) {
                    if (v[(size_t)p * NE + i] != want[i])
                        print_message("seq %d layer %d %s pos %d [%d]: %f, want %f\n", seq, l, kv ? "V" : "K", p, i,
                                      v[(size_t)p * NE + i], want[i]);
                    assert_true(v[(size_t)p * NE + i] == want[i]);
                }
            }
        }
    free(tmp);
}

/* ---- hashing ---------------------------------------------------------------------------- */

static void test_hash(void **state)
{
    (void)state;
    int32_t t[3 * BS];
    for (int i = 0; i < 3 * BS; i++) t[i] = 7 * i + 1;
    uint64_t h0 = kv_hash_block(KV_HASH_ROOT, t, BS);
    assert_true(h0 == kv_hash_block(KV_HASH_ROOT, t, BS));
    uint64_t h1 = kv_hash_block(h0, t + BS, BS);
    assert_true(kv_prefix_hash(t, 2 * BS) == h1);
    assert_true(kv_prefix_hash(t, 2 * BS + 5) == h1);        /* only full blocks count */
    assert_true(kv_prefix_hash(t, BS - 1) == KV_HASH_ROOT);
    uint64_t hs[3];
    assert_int_equal(kv_block_hashes(t, 3 * BS - 1, hs), 2);
    assert_true(hs[0] == h0 && hs[1] == h1);
    assert_true(kv_hash_block(h0 ^ 1, t + BS, BS) != h1);      /* the parent is chained in */
    t[BS + 3]++;
    assert_true(kv_hash_block(h0, t + BS, BS) != h1);          /* so are the tokens */
    /* The documented construction: FNV-1a 64 over parent (8 LE bytes) + tokens (4 LE bytes
     * each), then fmix64 — recomputed here independently for one value. */
    uint64_t h = 0xcbf29ce484222325ULL;
    uint8_t bytes[8 + 4];
    uint64_t parent = 0x0123456789abcdefULL;
    for (int i = 0; i < 8; i++) bytes[i] = (uint8_t)(parent >> (8 * i));
    int32_t one = 0x01020304;
    for (int i = 0; i < 4; i++) bytes[8 + i] = (uint8_t)((uint32_t)one >> (8 * i));
    for (int i = 0; i < 12; i++) h = (h ^ bytes[i]) * 0x100000001b3ULL;
    h ^= h >> 33; h *= 0xff51afd7ed558ccdULL; h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ULL; h ^= h >> 33;
    assert_true(kv_hash_block(parent, &one, 1) == h);
    /* The checksum notices every single-byte change. */
    uint8_t buf[101];
    for (int i = 0; i < 101; i++) buf[i] = (uint8_t)(i * 37);
    uint64_t c0 = kv_checksum64(buf, sizeof buf);
    for (int i = 0; i < 101; i++) {
        buf[i] ^= 0x10;
        assert_true(kv_checksum64(buf, sizeof buf) != c0);
        buf[i] ^= 0x10;
    }
    assert_true(kv_checksum64(buf, 100) != c0);
}

/* ---- refcounts, fork, copy-on-write ---------------------------------------------------- */

static void test_fork_refcount_cow(void **state)
{
    (void)state;
    kv_error err = {0};
    kv_cache *c = small_cache(GGML_TYPE_F32, 64, 16, 0);
    kv_cache_stats st;
    assert_int_equal(append(c, 0, 1, 100, 20), KV_OK);   /* block 0 full, block 1 has 4 */
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_used, 2);
    assert_int_equal(st.n_blocks_alloc, 2);              /* grown block by block */
    assert_int_equal(st.n_blocks_shared, 0);
    assert_int_equal(st.n_tokens, 20);
    assert_int_equal(st.bytes_used, 20 * st.bytes_per_token);
    assert_int_equal(st.bytes_allocated, 2 * st.bytes_per_block);
    assert_int_equal(st.bytes_reserved, 64 * st.bytes_per_token);
    assert_int_equal(st.bytes_per_block, (size_t)BS * st.bytes_per_token);
    assert_int_equal(st.layer_bytes_per_token * NL, st.bytes_per_token);
    assert_int_equal(st.bytes_per_token, 2 * NL * NE * sizeof(float));
    check_ok(c);

    int f;
    assert_int_equal(kv_seq_fork(c, 0, -1, &f, &err), KV_OK);
    assert_int_equal(kv_seq_n_tokens(c, f), 20);
    assert_memory_equal(kv_seq_tokens(c, f), kv_seq_tokens(c, 0), 20 * sizeof(int32_t));
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_used, 2);               /* nothing copied */
    assert_int_equal(st.n_blocks_shared, 2);
    assert_int_equal(st.n_seqs, 2);
    assert_int_equal(kv_seq_block_ref(c, 0, 0), 2);
    assert_int_equal(kv_seq_block_ref(c, f, 19), 2);
    check_ok(c);

    /* Appending to the fork copies only its shared partial block. */
    assert_int_equal(append(c, f, 2, 500, 6), KV_OK);
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_cow, 1);
    assert_int_equal(st.n_blocks_used, 3);
    assert_int_equal(st.n_blocks_shared, 1);             /* block 0 only */
    assert_int_equal(kv_seq_block_ref(c, f, 0), 2);
    assert_int_equal(kv_seq_block_ref(c, f, 16), 1);
    assert_int_equal(kv_seq_block_ref(c, 0, 16), 1);
    expect_rows(c, f, 1, 0, 20, 0);                      /* the copied prefix */
    expect_rows(c, f, 2, 20, 26, 0);                     /* its own rows */
    expect_rows(c, 0, 1, 0, 20, 0);                      /* the source is untouched */
    /* And the source appending again does not disturb the fork. */
    assert_int_equal(append(c, 0, 3, 900, 12), KV_OK);
    expect_rows(c, 0, 3, 20, 32, 0);
    expect_rows(c, f, 2, 20, 26, 0);
    check_ok(c);

    /* A fork of part of a sequence shares only the blocks it needs. */
    int g;
    assert_int_equal(kv_seq_fork(c, 0, 10, &g, &err), KV_OK);
    assert_int_equal(kv_seq_n_tokens(c, g), 10);
    assert_int_equal(kv_seq_block_ref(c, 0, 0), 3);
    assert_int_equal(append(c, g, 4, 700, 3), KV_OK);   /* copy-on-write inside block 0 */
    expect_rows(c, g, 1, 0, 10, 0);
    expect_rows(c, g, 4, 10, 13, 0);
    expect_rows(c, 0, 1, 0, 20, 0);
    check_ok(c);

    /* Freeing everything frees every block: hashed full blocks become cached, the rest free. */
    assert_int_equal(kv_seq_free(c, f), KV_OK);
    assert_int_equal(kv_seq_free(c, g), KV_OK);
    assert_int_equal(kv_seq_free(c, f), KV_ERR_INVALID); /* twice */
    assert_int_equal(kv_seq_free(c, 0), KV_OK);          /* the default one is emptied */
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_used, 0);
    assert_int_equal(st.n_blocks_shared, 0);
    assert_int_equal(st.n_seqs, 1);
    assert_int_equal(st.n_blocks_cached, 2);             /* seq 0's two full blocks */
    assert_int_equal(st.n_blocks_free + st.n_blocks_cached, st.n_blocks);
    check_ok(c);
    kv_cache_drop_cached(c);
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_cached, 0);
    assert_int_equal(st.n_blocks_free, st.n_blocks);
    check_ok(c);
    kv_cache_free(c);
}

/* ---- prefix hashes, adoption, LRU eviction --------------------------------------------- */

static void test_prefix_adopt_lru(void **state)
{
    (void)state;
    kv_error err = {0};
    kv_cache *c = small_cache(GGML_TYPE_F16, 128, 8, 1);
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_alloc, 8);              /* reserved up front */
    assert_int_equal(st.reserved_up_front, 1);
    assert_int_equal(st.bytes_allocated, st.bytes_limit);

    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = 100 + i;
    assert_int_equal(append(c, 0, 1, 100, 40), KV_OK);   /* 2 full blocks hashed + 8 */
    int a;
    assert_int_equal(kv_seq_new(c, &a, &err), KV_OK);
    int nb = 0;
    assert_int_equal(kv_seq_adopt(c, a, toks, 64, &nb), 2 * BS);
    assert_int_equal(nb, 2);
    assert_int_equal(kv_seq_block_ref(c, a, 0), 2);
    assert_int_equal(kv_seq_n_clean(c, a), 2 * BS);
    check_ok(c);
    /* n_max stops adoption before a block that would end after it */
    int b;
    assert_int_equal(kv_seq_new(c, &b, &err), KV_OK);
    assert_int_equal(kv_seq_adopt(c, b, toks, 2 * BS - 1, NULL), BS);
    /* a different token in block 1 stops the chain there */
    int32_t other[64];
    memcpy(other, toks, sizeof other);
    other[20] = 5;
    kv_seq_truncate(c, b, 0);
    assert_int_equal(kv_seq_adopt(c, b, other, 64, NULL), BS);
    /* a different token in block 0 changes every later hash */
    other[20] = toks[20];
    other[3] = 5;
    kv_seq_truncate(c, b, 0);
    assert_int_equal(kv_seq_adopt(c, b, other, 64, NULL), 0);
    assert_int_equal(kv_seq_free(c, b), KV_OK);
    check_ok(c);

    /* Freed sequences' blocks stay reusable… */
    assert_int_equal(kv_seq_free(c, a), KV_OK);
    assert_int_equal(kv_seq_free(c, 0), KV_OK);
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_used, 0);
    assert_int_equal(st.n_blocks_cached, 2);
    assert_int_equal(kv_seq_new(c, &a, &err), KV_OK);
    assert_int_equal(kv_seq_adopt(c, a, toks, 64, NULL), 2 * BS);
    expect_rows(c, a, 1, 0, 2 * BS, 0);                  /* with their content */
    /* …and a sequence that continued inside a cached block gets it back too: seq 0 holds 20 of
     * the 40 tokens (its own partial block 1), adoption swaps in the cached full block 1. */
    assert_int_equal(kv_seq_free(c, a), KV_OK);
    assert_int_equal(append(c, 0, 1, 100, 20), KV_OK);
    kv_cache_get_stats(c, &st);
    assert_int_equal(kv_seq_adopt(c, 0, toks, 64, NULL), 2 * BS - 20);
    assert_int_equal(kv_seq_n_tokens(c, 0), 2 * BS);
    check_ok(c);
    assert_int_equal(kv_seq_free(c, 0), KV_OK);

    /* Eviction is least recently released first. Three tagged 1-block prefixes X, Y, Z. */
    kv_cache_drop_cached(c);
    int32_t tx[BS], ty[BS], tz[BS];
    for (int i = 0; i < BS; i++) tx[i] = 1000 + i, ty[i] = 2000 + i, tz[i] = 3000 + i;
    int sx, sy, sz;
    assert_int_equal(kv_seq_new(c, &sx, &err), KV_OK);
    assert_int_equal(kv_seq_new(c, &sy, &err), KV_OK);
    assert_int_equal(kv_seq_new(c, &sz, &err), KV_OK);
    assert_int_equal(append(c, sx, 7, 1000, BS), KV_OK);
    assert_int_equal(append(c, sy, 8, 2000, BS), KV_OK);
    assert_int_equal(append(c, sz, 9, 3000, BS), KV_OK);
    kv_seq_free(c, sy); /* released first: evicted first */
    kv_seq_free(c, sx);
    kv_seq_free(c, sz);
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_cached, 3);
    /* Take 6 blocks: the 5 free ones, then the LRU (Y) is evicted. */
    assert_int_equal(append(c, 0, 5, 1, 6 * BS), KV_OK);
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_evictions, 1);
    assert_int_equal(st.n_blocks_cached, 2);
    int s;
    assert_int_equal(kv_seq_new(c, &s, &err), KV_OK);
    assert_int_equal(kv_seq_adopt(c, s, ty, BS, NULL), 0);       /* gone */
    assert_int_equal(kv_seq_adopt(c, s, tx, BS, NULL), BS);      /* kept */
    expect_rows(c, s, 7, 0, BS, 0);
    kv_seq_truncate(c, s, 0);
    assert_int_equal(kv_seq_adopt(c, s, tz, BS, NULL), BS);
    expect_rows(c, s, 9, 0, BS, 0);
    check_ok(c);

    /* The budget is a hard limit: with every block referenced, a reserve fails clearly. */
    int full;
    assert_int_equal(kv_seq_new(c, &full, &err), KV_OK);
    assert_int_equal(append(c, full, 6, 1, BS), KV_OK); /* evicts X's now-unused cached block */
    memset(&err, 0, sizeof err);
    assert_int_equal(kv_seq_reserve(c, full, 1, &err), KV_ERR_CONTEXT);
    print_message("budget exhausted: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "blocks"));
    check_ok(c);
    kv_cache_free(c);
}

/* Truncating into a hashed block and appending copies it, so the cached version survives. */
static void test_truncate_keeps_cached(void **state)
{
    (void)state;
    kv_error err = {0};
    kv_cache *c = small_cache(GGML_TYPE_Q8_0, 64, 16, 0);
    int32_t toks[2 * BS];
    for (int i = 0; i < 2 * BS; i++) toks[i] = 100 + i;
    assert_int_equal(append(c, 0, 1, 100, 2 * BS), KV_OK);
    kv_seq_truncate(c, 0, BS + 5);                       /* /regen: cut into block 1 */
    assert_int_equal(append(c, 0, 2, 555, 4), KV_OK);    /* the new reply */
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_cow, 1);
    int s;
    assert_int_equal(kv_seq_new(c, &s, &err), KV_OK);
    assert_int_equal(kv_seq_adopt(c, s, toks, 2 * BS, NULL), 2 * BS); /* the old reply is still cached */
    check_ok(c);
    /* seq 0's positions 21.. hold the new rows, its first 21 the old ones */
    float a[NE * 32], b[NE * 32];
    kv_cache_k(c, 0, 1, BS + 5, a);
    kv_cache_k(c, s, 1, BS + 5, b);
    assert_memory_equal(a, b, sizeof(float) * NE * (BS + 5));
    kv_cache_free(c);
}

/* kv_cache_set_reclaim: a caller's idle sequences, released least recently used first, only
 * when a write needs their blocks (cached blocks go first), and only as many as it needs. */
typedef struct idle_seqs {
    kv_cache *c;
    int seq[4], n, calls;
} idle_seqs;

static int release_oldest(void *ud)
{
    idle_seqs *k = ud;
    k->calls++;
    if (!k->n) return 0;
    assert_int_equal(kv_seq_free(k->c, k->seq[0]), KV_OK);
    memmove(k->seq, k->seq + 1, sizeof k->seq[0] * (size_t)--k->n);
    return 1;
}

static void test_reclaim(void **state)
{
    (void)state;
    kv_error err = {0};
    kv_cache *c = small_cache(GGML_TYPE_F16, 256, 8, 0);
    idle_seqs k = {.c = c};
    kv_cache_set_reclaim(c, release_oldest, &k);
    kv_cache_stats st;
    /* idle: K1 = 2 hashed blocks + 5 positions (3 blocks), K2 = 10 positions (1 block); active A */
    int k1, k2, a;
    assert_int_equal(kv_seq_new(c, &k1, &err), KV_OK);
    assert_int_equal(kv_seq_new(c, &k2, &err), KV_OK);
    assert_int_equal(append(c, k1, 1, 100, 2 * BS + 5), KV_OK);
    assert_int_equal(append(c, k2, 2, 500, 10), KV_OK);
    k.seq[k.n++] = k1;
    k.seq[k.n++] = k2;
    assert_int_equal(kv_seq_new(c, &a, &err), KV_OK);
    assert_int_equal(append(c, a, 3, 900, 2 * BS), KV_OK); /* 6 of 8 blocks used: room, no call */
    assert_int_equal(k.calls, 0);
    /* 3 more blocks for A, 2 left: K1 (the oldest) goes, K2 stays; its hashed blocks are cached,
     * its partial one free, and A takes the free one and the unallocated ones before any cached */
    assert_int_equal(append(c, a, 3, 900 + 2 * BS, 3 * BS), KV_OK);
    assert_int_equal(k.calls, 1);
    assert_false(kv_seq_valid(c, k1));
    assert_true(kv_seq_valid(c, k2));
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_cached, 2);
    assert_int_equal(st.n_evictions, 0);
    check_ok(c);
    /* 3 more: K2 goes too; A takes its block and evicts the two cached ones */
    assert_int_equal(append(c, a, 3, 900 + 5 * BS, 3 * BS), KV_OK);
    assert_int_equal(k.calls, 2);
    assert_false(kv_seq_valid(c, k2));
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_used, 8);
    assert_int_equal(st.n_evictions, 2);
    expect_rows(c, a, 3, 0, 8 * BS, 0);
    /* nothing left to give back: the reserve fails as without a callback */
    assert_int_equal(kv_seq_reserve(c, a, 1, &err), KV_ERR_CONTEXT);
    assert_int_equal(k.calls, 3);
    check_ok(c);
    kv_cache_free(c);

    /* A fork of an idle sequence writes into their shared partial block: a full budget releases
     * the idle one, after which the block is A's alone and is written in place (no copy); a
     * context shift that must copy a hashed block releases an idle sequence the same way */
    c = small_cache(GGML_TYPE_F32, 64, 4, 0);
    k = (idle_seqs){.c = c};
    kv_cache_set_reclaim(c, release_oldest, &k);
    assert_int_equal(kv_seq_new(c, &k1, &err), KV_OK);
    assert_int_equal(append(c, k1, 1, 100, BS + 5), KV_OK);
    assert_int_equal(kv_seq_fork(c, k1, -1, &a, &err), KV_OK);
    k.seq[k.n++] = k1;
    int other;
    assert_int_equal(kv_seq_new(c, &other, &err), KV_OK);
    assert_int_equal(append(c, other, 2, 700, 2 * BS), KV_OK); /* the budget is full */
    assert_int_equal(append(c, a, 1, 100 + BS + 5, 3), KV_OK);
    assert_int_equal(k.calls, 1);
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_cow, 0);
    expect_rows(c, a, 1, 0, BS + 8, 0);
    check_ok(c);
    kv_seq_free(c, other);
    assert_int_equal(kv_seq_new(c, &k2, &err), KV_OK);
    assert_int_equal(append(c, k2, 4, 300, 2 * BS), KV_OK); /* full again: A's 2 blocks + K2's 2 */
    k.seq[k.n++] = k2;
    kv_rope rope = {.n_head_kv = 4, .head_dim = 8, .n_rot = 8, .neox = 1, .freq_base = 10000.0f};
    assert_int_equal(kv_seq_shift(c, a, 4, 10, &rope, &err), KV_OK); /* A's hashed block 0 is copied */
    assert_int_equal(k.calls, 2);
    assert_false(kv_seq_valid(c, k2));
    assert_int_equal(kv_seq_n_tokens(c, a), BS + 8 - 10);
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_cow, 1);
    check_ok(c);
    kv_cache_free(c);
}

static void test_reserve_errors(void **state)
{
    (void)state;
    kv_error err = {0};
    kv_cache *c = small_cache(GGML_TYPE_F16, 40, 0, 0);
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks, 2 * 3);                /* default budget: 2 * ceil(40 / 16) */
    assert_int_equal(kv_seq_reserve(c, 0, 41, &err), KV_ERR_CONTEXT);
    assert_non_null(strstr(err.msg, "n_ctx 40"));
    assert_int_equal(kv_seq_reserve(c, 7, 1, &err), KV_ERR_INVALID);
    assert_int_equal(append(c, 0, 1, 1, 40), KV_OK);
    assert_int_equal(kv_seq_reserve(c, 0, 1, &err), KV_ERR_CONTEXT);
    check_ok(c);
    kv_cache_free(c);
    /* unsupported types and shapes */
    kv_cache_params p = {.n_layer = 2, .n_embd_kv = 48, .n_ctx = 32, .type = GGML_TYPE_Q8_0};
    assert_null(kv_cache_create_ex(&p, &err));
    assert_int_equal(err.code, KV_ERR_UNSUPPORTED);
    print_message("q8_0 shape: %s\n", err.msg);
    p.type = GGML_TYPE_Q4_0;
    p.n_embd_kv = 64;
    assert_null(kv_cache_create_ex(&p, &err));
    assert_int_equal(err.code, KV_ERR_UNSUPPORTED);
}

/* kv_cache_k_from / _v_from: rows from the block holding a to n equal kv_cache_k's, and tmp
 * before that block is not written (sliding-window layers skip the older blocks). */
static void test_view_from(void **state)
{
    (void)state;
    kv_cache *c = small_cache(GGML_TYPE_F16, 80, 0, 0);
    assert_int_equal(append(c, 0, 3, 1, 70), KV_OK);
    float *all = malloc(sizeof(float) * NE * 70), *part = malloc(sizeof(float) * NE * 70);
    for (int l = 0; l < NL; l++)
        for (int kv = 0; kv < 2; kv++) {
            for (int i = 0; i < NE * 70; i++) part[i] = -12345.0f;
            const float *a = kv ? kv_cache_v(c, 0, l, 70, all) : kv_cache_k(c, 0, l, 70, all);
            const float *b = kv ? kv_cache_v_from(c, 0, l, 37, 70, part) : kv_cache_k_from(c, 0, l, 37, 70, part);
            assert_ptr_equal(b, part);
            assert_memory_equal(b + 32 * NE, a + 32 * NE, sizeof(float) * NE * (70 - 32)); /* block 2 on */
            for (int i = 0; i < 32 * NE; i++) assert_true(part[i] == -12345.0f);
        }
    free(all);
    free(part);
    kv_cache_free(c);
}

/* ---- RoPE shift ------------------------------------------------------------------------ */

static void test_rope_shift_op(void **state)
{
    (void)state;
    const int n_head = 3, hd = 16;
    float factors[8];
    for (int i = 0; i < 8; i++) factors[i] = 1.0f + i * 0.7f;
    for (int neox = 0; neox < 2; neox++)
        for (int ff = 0; ff < 2; ff++)
            for (int n_rot = 8; n_rot <= hd; n_rot += 8) {
                const float *fac = ff && n_rot == 16 ? factors : NULL;
                float x[48], a[48], b[48], cs[16];
                for (int i = 0; i < n_head * hd; i++) x[i] = sinf(i * 1.3f) * 2;
                for (int p = 0; p < 300; p += 37)
                    for (int d = -150; d <= 150; d += 75) {
                        if (p + d < 0) continue;
                        memcpy(a, x, sizeof x);
                        op_rope_cache(cs, p, n_rot, 10000.0f, fac);
                        op_rope(a, n_head, hd, n_rot, cs, neox);
                        op_rope_shift(a, n_head, hd, n_rot, d, 10000.0f, fac, neox);
                        memcpy(b, x, sizeof x);
                        op_rope_cache(cs, p + d, n_rot, 10000.0f, fac);
                        op_rope(b, n_head, hd, n_rot, cs, neox);
                        for (int i = 0; i < n_head * hd; i++) assert_true(fabsf(a[i] - b[i]) < 1e-4f);
                    }
            }
}

/* kv_seq_shift: kept rows untouched, moved K re-rotated, moved V copied, a sharer untouched. */
static void test_shift_unit(void **state)
{
    (void)state;
    kv_error err = {0};
    kv_cache *c = small_cache(GGML_TYPE_F32, 64, 16, 0);
    /* K at position p is rope(x_p, p), V is x_p; 4 heads of 8 */
    kv_rope rope = {.n_head_kv = 4, .head_dim = 8, .n_rot = 8, .neox = 1, .freq_base = 10000.0f};
    const int n = 50;
    int32_t toks[64];
    assert_int_equal(kv_seq_reserve(c, 0, n, &err), KV_OK);
    for (int p = 0; p < n; p++) {
        toks[p] = p + 1;
        for (int l = 0; l < NL; l++) {
            float k[NE], v[NE], cs[8];
            for (int i = 0; i < NE; i++) v[i] = k[i] = cosf(p * 0.37f + i + l);
            op_rope_cache(cs, p, 8, 10000.0f, NULL);
            op_rope(k, 4, 8, 8, cs, 1);
            kv_cache_store(c, 0, l, p, k, v);
        }
    }
    kv_seq_commit(c, 0, toks, n);
    int f;
    assert_int_equal(kv_seq_fork(c, 0, -1, &f, &err), KV_OK);
    float before[NE * 64];
    kv_cache_k(c, f, 1, n, before);
    const int keep = 4, disc = 23;
    assert_int_equal(kv_seq_shift(c, 0, keep, disc, &rope, &err), KV_OK);
    assert_int_equal(kv_seq_n_tokens(c, 0), n - disc);
    assert_int_equal(kv_seq_n_clean(c, 0), keep);
    for (int p = 0; p < n - disc; p++) assert_int_equal(kv_seq_tokens(c, 0)[p], p < keep ? p + 1 : p + disc + 1);
    float tk[NE * 64], tv[NE * 64];
    for (int l = 0; l < NL; l++) {
        kv_cache_k(c, 0, l, n - disc, tk);
        kv_cache_v(c, 0, l, n - disc, tv);
        for (int p = 0; p < n - disc; p++) {
            int src = p < keep ? p : p + disc;
            float k[NE], cs[8];
            for (int i = 0; i < NE; i++) k[i] = cosf(src * 0.37f + i + l);
            for (int i = 0; i < NE; i++) assert_true(tv[(size_t)p * NE + i] == k[i]);
            op_rope_cache(cs, p, 8, 10000.0f, NULL); /* its new position */
            op_rope(k, 4, 8, 8, cs, 1);
            for (int i = 0; i < NE; i++) assert_true(fabsf(tk[(size_t)p * NE + i] - k[i]) < 1e-5f);
        }
    }
    float after[NE * 64];
    kv_cache_k(c, f, 1, n, after);
    assert_memory_equal(before, after, sizeof(float) * NE * n); /* copy-on-write kept the fork */
    check_ok(c);
    assert_int_equal(kv_seq_shift(c, 0, 20, 20, &rope, &err), KV_ERR_INVALID); /* 40 > 27 */
    kv_seq_free(c, f);
    kv_seq_free(c, 0);
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    assert_int_equal(st.n_blocks_used, 0);
    assert_int_equal(st.n_shifts, 1);
    assert_int_equal(st.n_shift_discarded, disc);
    check_ok(c);
    kv_cache_free(c);
}

/* ---- blobs ----------------------------------------------------------------------------- */

static void test_blob(void **state)
{
    (void)state;
    kv_error err = {0};
    kv_cache *c = small_cache(GGML_TYPE_Q8_0, 64, 16, 0);
    assert_int_equal(append(c, 0, 3, 10, 37), KV_OK);
    void *blob = NULL;
    size_t len = 0;
    assert_int_equal(kv_seq_save(c, 0, -1, 0xabcdef, &blob, &len, &err), KV_OK);
    int n;
    uint64_t ph;
    assert_int_equal(kv_blob_info(blob, len, &n, &ph, NULL, NULL, &err), KV_OK);
    assert_int_equal(n, 37);
    assert_true(ph == kv_prefix_hash(kv_seq_tokens(c, 0), 37));
    int s;
    assert_int_equal(kv_seq_new(c, &s, &err), KV_OK);
    assert_int_equal(append(c, s, 5, 1, 3), KV_OK);
    assert_int_equal(kv_seq_restore(c, s, blob, len, 0xabcdef, 100, &err), KV_OK);
    assert_int_equal(kv_seq_n_tokens(c, s), 37);
    assert_memory_equal(kv_seq_tokens(c, s), kv_seq_tokens(c, 0), 37 * sizeof(int32_t));
    float a[NE * 40], b[NE * 40];
    for (int l = 0; l < NL; l++) {
        assert_memory_equal(kv_cache_k(c, 0, l, 37, a), kv_cache_k(c, s, l, 37, b), sizeof(float) * NE * 37);
        assert_memory_equal(kv_cache_v(c, 0, l, 37, a), kv_cache_v(c, s, l, 37, b), sizeof(float) * NE * 37);
    }
    check_ok(c);
    /* Every single corrupted byte is caught, and the target sequence is left as it was. */
    int32_t keep_tok[40];
    memcpy(keep_tok, kv_seq_tokens(c, s), sizeof(int32_t) * 37);
    uint8_t *p = blob;
    for (size_t i = 0; i < len; i += (i < 64 ? 1 : 97)) {
        p[i] ^= 0x04;
        memset(&err, 0, sizeof err);
        int rc = kv_seq_restore(c, s, blob, len, 0xabcdef, 100, &err);
        p[i] ^= 0x04;
        assert_int_equal(rc, KV_ERR_FORMAT);
        assert_int_equal(kv_seq_n_tokens(c, s), 37);
    }
    assert_memory_equal(keep_tok, kv_seq_tokens(c, s), sizeof(int32_t) * 37);
    assert_int_equal(kv_seq_restore(c, s, blob, len - 1, 0xabcdef, 100, &err), KV_ERR_FORMAT);
    assert_int_equal(kv_seq_restore(c, s, blob, 20, 0xabcdef, 100, &err), KV_ERR_FORMAT);
    assert_int_equal(kv_seq_restore(c, s, blob, len, 0x1234, 100, &err), KV_ERR_UNSUPPORTED);
    print_message("other model: %s\n", err.msg);
    assert_int_equal(kv_seq_restore(c, s, blob, len, 0xabcdef, 20, &err), KV_ERR_FORMAT); /* token 46 >= 20 */
    /* another KV type */
    kv_cache *c16 = small_cache(GGML_TYPE_F16, 64, 16, 0);
    assert_int_equal(kv_seq_restore(c16, 0, blob, len, 0xabcdef, 100, &err), KV_ERR_UNSUPPORTED);
    print_message("other type: %s\n", err.msg);
    /* no room in the block budget: the target keeps what it held */
    kv_cache *cb = small_cache(GGML_TYPE_Q8_0, 64, 3, 0);
    assert_int_equal(append(cb, 0, 6, 10, 20), KV_OK);
    float before[NE * 20], after[NE * 20];
    memcpy(before, kv_cache_k(cb, 0, 1, 20, a), sizeof before);
    assert_int_equal(kv_seq_restore(cb, 0, blob, len, 0xabcdef, 100, &err), KV_ERR_CONTEXT);
    assert_int_equal(kv_seq_n_tokens(cb, 0), 20);
    memcpy(after, kv_cache_k(cb, 0, 1, 20, a), sizeof after);
    assert_memory_equal(before, after, sizeof before);
    check_ok(cb);
    kv_cache_stats st;
    kv_cache_get_stats(cb, &st);
    assert_int_equal(st.n_seqs, 1);
    assert_int_equal(st.n_blocks_used, 2);
    kv_cache_free(cb);
    /* too long for the context */
    kv_cache *cs = small_cache(GGML_TYPE_Q8_0, 32, 16, 0);
    assert_int_equal(kv_seq_restore(cs, 0, blob, len, 0xabcdef, 100, &err), KV_ERR_CONTEXT);
    kv_cache_free(cs);
    kv_cache_free(c16);
    free(blob);
    kv_cache_free(c);
}

/* Two sequences hold the same tokens and bytewise the same K/V rows. */
static void expect_same_seq(const kv_cache *c, int s1, const kv_cache *c2, int s2)
{
    int n = kv_seq_n_tokens(c, s1);
    assert_int_equal(kv_seq_n_tokens(c2, s2), n);
    assert_memory_equal(kv_seq_tokens(c, s1), kv_seq_tokens(c2, s2), sizeof(int32_t) * (size_t)n);
    float *a = malloc(sizeof(float) * NE * (size_t)(n + 1)), *b = malloc(sizeof(float) * NE * (size_t)(n + 1));
    for (int l = 0; l < NL; l++) {
        assert_memory_equal(kv_cache_k(c, s1, l, n, a), kv_cache_k(c2, s2, l, n, b), sizeof(float) * NE * (size_t)n);
        assert_memory_equal(kv_cache_v(c, s1, l, n, a), kv_cache_v(c2, s2, l, n, b), sizeof(float) * NE * (size_t)n);
    }
    free(a);
    free(b);
}

/* seq's whole blob equals (len, bytes) exactly: same tokens, clean length and K/V bytes. */
static void expect_blob(const kv_cache *c, int seq, const void *want, size_t want_len)
{
    kv_error err = {0};
    void *b;
    size_t len;
    assert_int_equal(kv_seq_save(c, seq, -1, 0xabcdef, &b, &len, &err), KV_OK);
    assert_int_equal(len, want_len);
    assert_memory_equal(b, want, len);
    free(b);
}

/* A v1 blob (before deltas) with the same content as a whole v2 blob. */
static uint8_t *blob_v1_of(const uint8_t *v2, size_t len, size_t *len1)
{
    *len1 = len - 16;
    uint8_t *b = malloc(*len1);
    memcpy(b, v2, 48);
    b[4] = 1, b[5] = b[6] = b[7] = 0;
    memcpy(b + 48, v2 + 64, len - 64 - 8);
    uint64_t h = kv_checksum64(b, *len1 - 8);
    for (int i = 0; i < 8; i++) b[*len1 - 8 + i] = (uint8_t)(h >> (8 * i));
    return b;
}

/* Deltas: [0, a) saved once, [a, n) on top of it; restore = base, then delta. */
static void test_blob_delta(void **state)
{
    (void)state;
    int types[] = {GGML_TYPE_Q8_0, GGML_TYPE_F16, GGML_TYPE_F32};
    for (int ti = 0; ti < 3; ti++) {
        kv_error err = {0};
        kv_cache *c = small_cache(types[ti], 64, 32, 0);
        kv_cache_stats ks;
        kv_cache_get_stats(c, &ks);
        assert_int_equal(append(c, 0, 3, 10, 37), KV_OK);
        void *full, *base, *delta, *delta2;
        size_t lf, lb, ld, ld2;
        assert_int_equal(kv_seq_save(c, 0, -1, 0xabcdef, &full, &lf, &err), KV_OK);
        assert_int_equal(kv_seq_save_range(c, 0, 0, 32, 0xabcdef, &base, &lb, &err), KV_OK);
        assert_int_equal(kv_seq_save_range(c, 0, 32, -1, 0xabcdef, &delta, &ld, &err), KV_OK);
        /* the delta holds exactly the positions the base does not */
        assert_int_equal(lf - ld, 32 * (4 + ks.bytes_per_token));
        assert_int_equal(lb - 64 - 8, 32 * (4 + ks.bytes_per_token));
        int n, nb;
        uint64_t ph, bh;
        assert_int_equal(kv_blob_info(delta, ld, &n, &ph, &nb, &bh, &err), KV_OK);
        assert_int_equal(n, 37);
        assert_int_equal(nb, 32);
        assert_true(bh == kv_prefix_hash(kv_seq_tokens(c, 0), 32));
        assert_true(ph == kv_prefix_hash(kv_seq_tokens(c, 0), 37));
        assert_int_equal(kv_blob_info(full, lf, &n, &ph, &nb, &bh, &err), KV_OK);
        assert_int_equal(nb, 0);
        assert_true(bh == KV_HASH_ROOT);
        /* the start must be whole blocks within [0, n] */
        void *x;
        size_t lx;
        assert_int_equal(kv_seq_save_range(c, 0, 8, -1, 0xabcdef, &x, &lx, &err), KV_ERR_INVALID);
        assert_null(x);
        assert_int_equal(kv_seq_save_range(c, 0, 48, -1, 0xabcdef, &x, &lx, &err), KV_ERR_INVALID);
        assert_int_equal(kv_seq_save_range(c, 0, 32, 20, 0xabcdef, &x, &lx, &err), KV_ERR_INVALID);
        /* a whole blob cut to a delta by kv_blob_rebase is byte for byte the saved delta */
        void *rb;
        size_t lrb;
        assert_int_equal(kv_blob_rebase(full, lf, 32, &rb, &lrb, &err), KV_OK);
        assert_int_equal(lrb, ld);
        assert_memory_equal(rb, delta, ld);
        free(rb);
        assert_int_equal(kv_blob_rebase(full, lf, 16, &rb, &lrb, &err), KV_OK);
        void *d16;
        size_t l16;
        assert_int_equal(kv_seq_save_range(c, 0, 16, -1, 0xabcdef, &d16, &l16, &err), KV_OK);
        assert_memory_equal(rb, d16, l16);
        void *rb2; /* a delta rebased further */
        size_t lrb2;
        assert_int_equal(kv_blob_rebase(rb, lrb, 32, &rb2, &lrb2, &err), KV_OK);
        assert_int_equal(lrb2, ld);
        assert_memory_equal(rb2, delta, ld);
        free(rb2);
        free(d16);
        assert_int_equal(kv_blob_rebase(rb, lrb, 0, &rb2, &lrb2, &err), KV_ERR_INVALID);  /* below its base */
        assert_int_equal(kv_blob_rebase(full, lf, 20, &rb2, &lrb2, &err), KV_ERR_INVALID); /* not whole blocks */
        assert_int_equal(kv_blob_rebase(full, lf, 48, &rb2, &lrb2, &err), KV_ERR_INVALID); /* past the end */
        free(rb);

        /* a delta alone, on a sequence without its base: refused, the sequence untouched */
        int s;
        assert_int_equal(kv_seq_new(c, &s, &err), KV_OK);
        assert_int_equal(append(c, s, 5, 1, 20), KV_OK);
        void *keep;
        size_t lk;
        assert_int_equal(kv_seq_save(c, s, -1, 0xabcdef, &keep, &lk, &err), KV_OK);
        assert_int_equal(kv_seq_restore(c, s, delta, ld, 0xabcdef, 100, &err), KV_ERR_INVALID);
        assert_non_null(strstr(err.msg, "restore its base first"));
        expect_blob(c, s, keep, lk);
        free(keep);
        /* base, then delta: the original tokens and bytes */
        assert_int_equal(kv_seq_restore(c, s, base, lb, 0xabcdef, 100, &err), KV_OK);
        assert_int_equal(kv_seq_n_tokens(c, s), 32);
        assert_int_equal(kv_seq_restore(c, s, delta, ld, 0xabcdef, 100, &err), KV_OK);
        expect_same_seq(c, 0, c, s);
        assert_int_equal(kv_seq_n_clean(c, s), 37);
        check_ok(c);
        /* a delta over a longer sequence with the same base replaces what follows the base */
        assert_int_equal(append(c, s, 7, 90, 5), KV_OK);
        assert_int_equal(kv_seq_restore(c, s, delta, ld, 0xabcdef, 100, &err), KV_OK);
        expect_same_seq(c, 0, c, s);
        /* copy-on-write: another delta on a fork leaves the shared blocks and the original alone */
        int f;
        assert_int_equal(kv_seq_fork(c, s, -1, &f, &err), KV_OK);
        int w;
        assert_int_equal(kv_seq_new(c, &w, &err), KV_OK);
        assert_int_equal(kv_seq_restore(c, w, base, lb, 0xabcdef, 100, &err), KV_OK);
        assert_int_equal(append(c, w, 9, 40, 12), KV_OK);
        assert_int_equal(kv_seq_save_range(c, w, 32, -1, 0xabcdef, &delta2, &ld2, &err), KV_OK);
        assert_int_equal(kv_seq_save(c, w, -1, 0xabcdef, &keep, &lk, &err), KV_OK);
        kv_seq_free(c, w);
        assert_int_equal(kv_seq_restore(c, f, delta2, ld2, 0xabcdef, 100, &err), KV_OK);
        assert_int_equal(kv_seq_n_tokens(c, f), 44);
        assert_int_equal(kv_seq_block_ref(c, f, 0), 2);  /* the base stays shared with s */
        assert_int_equal(kv_seq_block_ref(c, f, 32), 1); /* the delta's positions are its own */
        expect_blob(c, f, keep, lk);                     /* = w: the base, then w's own rows */
        free(keep);
        expect_same_seq(c, 0, c, s);
        check_ok(c);
        /* onto a wrong base (same length, other tokens): refused, untouched */
        int o;
        assert_int_equal(kv_seq_new(c, &o, &err), KV_OK);
        assert_int_equal(append(c, o, 4, 11, 40), KV_OK);
        assert_int_equal(kv_seq_save(c, o, -1, 0xabcdef, &keep, &lk, &err), KV_OK);
        assert_int_equal(kv_seq_restore(c, o, delta, ld, 0xabcdef, 100, &err), KV_ERR_INVALID);
        if (ti == 0) print_message("wrong base: %s\n", err.msg);
        expect_blob(c, o, keep, lk);
        free(keep);
        /* a corrupt delta: every changed byte is caught, the target untouched */
        uint8_t *p = delta;
        for (size_t i = 0; i < ld; i += (i < 64 ? 1 : 53)) {
            p[i] ^= 0x10;
            int rc = kv_seq_restore(c, s, delta, ld, 0xabcdef, 100, &err);
            p[i] ^= 0x10;
            assert_int_equal(rc, KV_ERR_FORMAT);
            assert_int_equal(kv_seq_n_tokens(c, s), 37);
        }
        expect_same_seq(c, 0, c, s);
        assert_int_equal(kv_seq_restore(c, s, delta, ld - 4, 0xabcdef, 100, &err), KV_ERR_FORMAT);
        /* a base that is not clean (after a context shift) cannot be a base */
        int sh;
        assert_int_equal(kv_seq_fork(c, 0, -1, &sh, &err), KV_OK);
        kv_rope rope = {.n_head_kv = 4, .head_dim = 8, .n_rot = 8, .neox = 1, .freq_base = 10000.0f};
        assert_int_equal(kv_seq_shift(c, sh, 4, 8, &rope, &err), KV_OK);
        assert_int_equal(kv_seq_n_clean(c, sh), 4);
        assert_int_equal(kv_seq_save_range(c, sh, 16, -1, 0xabcdef, &x, &lx, &err), KV_ERR_INVALID);
        assert_int_equal(kv_seq_restore(c, sh, delta, ld, 0xabcdef, 100, &err), KV_ERR_INVALID);
        /* an old (version 1) blob still restores */
        size_t l1;
        uint8_t *v1 = blob_v1_of(full, lf, &l1);
        assert_int_equal(kv_blob_info(v1, l1, &n, &ph, &nb, &bh, &err), KV_OK);
        assert_int_equal(n, 37);
        assert_int_equal(nb, 0);
        int r1;
        assert_int_equal(kv_seq_new(c, &r1, &err), KV_OK);
        assert_int_equal(kv_seq_restore(c, r1, v1, l1, 0xabcdef, 100, &err), KV_OK);
        expect_same_seq(c, 0, c, r1);
        assert_int_equal(kv_blob_rebase(v1, l1, 32, &rb, &lrb, &err), KV_OK); /* and converts to a v2 delta */
        assert_memory_equal(rb, delta, ld);
        free(rb);
        v1[4] = 4; /* a version this kvchat does not know (3: caches with sliding-window layers) */
        assert_int_equal(kv_seq_restore(c, r1, v1, l1, 0xabcdef, 100, &err), KV_ERR_FORMAT);
        assert_non_null(strstr(err.msg, "version 4"));
        free(v1);
        check_ok(c);
        free(full);
        free(base);
        free(delta);
        free(delta2);
        kv_cache_free(c);
    }
}

/* ---- on stories260K -------------------------------------------------------------------- */

typedef struct text_buf {
    char s[16384];
    size_t n;
} text_buf;

static int on_text(void *ud, const char *t, size_t len, int32_t tok)
{
    (void)tok;
    text_buf *b = ud;
    if (b->n + len < sizeof b->s) {
        memcpy(b->s + b->n, t, len);
        b->n += len;
        b->s[b->n] = 0;
    }
    return 0;
}

static engine *open_model(const char *path, int kv_type, int n_ctx, int n_batch, int n_blocks)
{
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = tu_path(path);
    ep.kv_blocks = n_blocks;
    ep.n_ctx = n_ctx;
    ep.n_batch = n_batch;
    ep.n_threads = 1;
    ep.kv_type = kv_type;
    engine *e = NULL;
    kv_error err = {0};
    if (engine_open(&ep, &e, &err)) print_message("engine_open: %s\n", err.msg);
    assert_non_null(e);
    return e;
}

static engine *open_engine(int kv_type, int n_ctx, int n_batch)
{
    return open_model("models/stories260K.gguf", kv_type, n_ctx, n_batch, 0);
}

static sampler *greedy(const engine *e)
{
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    kv_error err = {0};
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
    assert_non_null(s);
    return s;
}

static int32_t *tokenize(engine *e, const char *text, size_t *n)
{
    int32_t *t = NULL;
    kv_error err = {0};
    assert_int_equal(engine_tokenize(e, text, strlen(text), 0, 0, &t, n, &err), KV_OK);
    return t;
}

/* Greedy continuation of prompt on seq; returns the finish reason. */
static int gen(engine *e, sampler *s, int seq, const int32_t *p, size_t n, int n_predict, text_buf *out, gen_stats *st)
{
    kv_error err = {0};
    gen_callbacks cb = {.on_text = on_text, .ud = out};
    gen_opts o = {.n_predict = n_predict};
    int finish;
    out->n = 0;
    out->s[0] = 0;
    sampler_reset(s);
    int rc = engine_generate_seq(e, seq, p, n, &o, s, &cb, st, &finish, &err);
    if (rc) print_message("generate: %s\n", err.msg);
    assert_int_equal(rc, KV_OK);
    return finish;
}

static const char *STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";

static void test_fork_regen_equals_fresh(void **state)
{
    (void)state;
    engine *e = open_engine(GGML_TYPE_F16, 256, 0);
    sampler *s = greedy(e);
    size_t n;
    int32_t *p = tokenize(e, STORY, &n);
    text_buf first, again, fork_txt, fresh;
    gen_stats st;
    gen(e, s, ENGINE_SEQ_DEFAULT, p, n, 60, &first, &st);
    assert_int_equal(st.n_reused, 0);
    /* /regen: the same prompt on the same sequence reuses all but its last token */
    gen(e, s, ENGINE_SEQ_DEFAULT, p, n, 60, &again, &st);
    assert_int_equal(st.n_reused, (int)n - 1);
    assert_int_equal(st.n_prefilled, 1);
    assert_string_equal(first.s, again.s);
    /* /branch at the prompt: a fork shares the prompt's blocks and generates the same */
    kv_error err = {0};
    int f;
    assert_int_equal(engine_seq_fork(e, ENGINE_SEQ_DEFAULT, (int)n, &f, &err), KV_OK);
    kv_cache_stats ks;
    kv_cache_get_stats(engine_kv(e), &ks);
    assert_true(ks.n_blocks_shared >= (int)n / BS);
    gen(e, s, f, p, n, 60, &fork_txt, &st);
    assert_int_equal(st.n_reused, (int)n - 1);
    assert_string_equal(first.s, fork_txt.s);
    /* /edit: a changed last sentence re-answers from the shared prefix; equals a fresh run */
    size_t n2;
    int32_t *p2 = tokenize(e, "Once upon a time, there was a little girl named Lily. She loved her red ball.", &n2);
    text_buf edit, edit_fresh;
    gen(e, s, f, p2, n2, 60, &edit, &st);
    assert_true(st.n_reused > 10);
    /* a fresh engine from scratch */
    engine *e2 = open_engine(GGML_TYPE_F16, 256, 0);
    sampler *s2 = greedy(e2);
    gen(e2, s2, ENGINE_SEQ_DEFAULT, p, n, 60, &fresh, &st);
    assert_int_equal(st.n_reused, 0);
    assert_string_equal(first.s, fresh.s);
    engine_reset(e2);
    gen(e2, s2, ENGINE_SEQ_DEFAULT, p2, n2, 60, &edit_fresh, &st);
    assert_string_equal(edit.s, edit_fresh.s);
    print_message("regen/fork/edit text equals a fresh run: \"%.60s…\"\n", first.s);
    /* the branch and the original both stay: the original sequence still holds prompt + reply */
    int n0;
    const int32_t *t0 = engine_seq_tokens(e, ENGINE_SEQ_DEFAULT, &n0);
    assert_true(n0 > (int)n);
    assert_memory_equal(t0, p, n * sizeof *p);
    engine_seq_free(e, f);
    kv_cache_check(engine_kv(e), &err);
    assert_int_equal(kv_cache_check(engine_kv(e), &err), KV_OK);
    free(p);
    free(p2);
    sampler_free(s);
    sampler_free(s2);
    engine_close(e);
    engine_close(e2);
}

/* Logits after reusing cached blocks equal those of a full prefill: bitwise for the same KV
 * type with quantized / F16 weights, whose batched matmul computes each token's row the same
 * whatever the batch size. F32 weights go through OpenBLAS sgemm for batches, whose kernels
 * round differently for different batch sizes (measured: rows of a 239-row call differ from
 * the same rows of a 527-row call in the last bit), so there reused and recomputed rows agree
 * to ~1e-5. Feeding the last token alone (/regen) uses the single-token kernels, which need
 * not sum in the batched kernels' order: printed for information. */
typedef struct reuse_case {
    const char *model;
    float tol;   /* 0: bitwise */
} reuse_case;

static void test_prefix_reuse_bitwise(void **state)
{
    (void)state;
    static const reuse_case cases[] = {
        {"models/syn-llama-q8_0.gguf", 0},
        {"models/syn-qwen2-q8_0.gguf", 0},  /* NEOX RoPE, QKV biases */
        {"models/syn-llama-f16.gguf", 0},
        {"models/syn-llama-q4_k_m.gguf", 0},
        {"models/stories260K.gguf", 1e-4f}, /* F32 weights: sgemm (see above); 0.05 for f16/q8_0 KV */
    };
    cJSON *g = tu_read_json(tu_path("golden/stories260K.long.json"));
    assert_non_null(g);
    const cJSON *jpt = cJSON_GetObjectItem(g, "prompt_tokens");
    int n = cJSON_GetArraySize(jpt);
    int32_t *p = malloc(sizeof(int32_t) * (size_t)n);
    int types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int ti = 0; ti < 3; ti++) {
            engine *e = open_model(cases[ci].model, types[ti], 1024, 512, 0);
            int n_vocab = engine_model(e)->hp.n_vocab;
            for (int i = 0; i < n; i++) {
                int t = cJSON_GetArrayItem(jpt, i)->valueint;
                p[i] = t < n_vocab ? t : t % n_vocab;
            }
            kv_error err = {0};
            gen_stats st;
            /* full prefill of the whole prompt */
            assert_int_equal(engine_prefill_seq(e, ENGINE_SEQ_DEFAULT, p, (size_t)n, NULL, &st, &err), KV_OK);
            assert_int_equal(st.n_prefilled, n);
            float *ref = malloc(sizeof(float) * (size_t)n_vocab);
            memcpy(ref, engine_logits(e), sizeof(float) * (size_t)n_vocab);
            /* a shorter conversation first, on another sequence of a fresh engine, freed; then
             * the long prompt on a new sequence adopts its blocks by hash, prefills the rest */
            engine *e2 = open_model(cases[ci].model, types[ti], 1024, 512, 0);
            int a, b;
            assert_int_equal(engine_seq_new(e2, &a, &err), KV_OK);
            assert_int_equal(engine_prefill_seq(e2, a, p, 300, NULL, &st, &err), KV_OK);
            assert_int_equal(engine_seq_free(e2, a), KV_OK);
            assert_int_equal(engine_seq_new(e2, &b, &err), KV_OK);
            assert_int_equal(engine_prefill_seq(e2, b, p, (size_t)n, NULL, &st, &err), KV_OK);
            int reused = 300 / BS * BS;
            assert_int_equal(st.n_reused, reused);
            assert_int_equal(st.n_reused_hash, reused);
            assert_int_equal(st.n_prefilled, n - reused);
            kv_cache_stats ks;
            kv_cache_get_stats(engine_kv(e2), &ks);
            assert_int_equal(ks.last_n_reused, reused);
            assert_int_equal(ks.last_n_prefilled, n - reused);
            int same = memcmp(ref, engine_logits(e2), sizeof(float) * (size_t)n_vocab) == 0;
            float md = 0;
            for (int i = 0; i < n_vocab; i++) md = fmaxf(md, fabsf(ref[i] - engine_logits(e2)[i]));
            /* /regen-style: the whole prompt cached, its last token fed alone */
            assert_int_equal(engine_seq_truncate(e2, b, n - 1), KV_OK);
            assert_int_equal(engine_prefill_seq(e2, b, p, (size_t)n, NULL, &st, &err), KV_OK);
            assert_int_equal(st.n_prefilled, 1);
            int same1 = memcmp(ref, engine_logits(e2), sizeof(float) * (size_t)n_vocab) == 0;
            float md1 = 0;
            for (int i = 0; i < n_vocab; i++) md1 = fmaxf(md1, fabsf(ref[i] - engine_logits(e2)[i]));
            print_message("prefix reuse %-42s %-4s KV: %d of %d reused: logits %s (max diff %.2g); last token alone: %s "
                          "(%.2g)\n", cases[ci].model, quant_traits_of(types[ti])->name, reused, n,
                          same ? "bitwise equal" : "differ", md, same1 ? "bitwise equal" : "differ", md1);
            if (cases[ci].tol == 0) {
                if (!same)
                    print_message("  the matmul kernels are not batch-invariant: a token's K/V differ between a "
                                  "batch of %d and one of %d\n", n - reused, n);
                assert_true(same);
                /* One token alone goes through the single-row kernels, a batch through the
                 * batched ones: equal only while those sum in the same order (printed only —
                 * a property of the matmul kernels, not of the cache). */
            } else { /* a last-bit difference of a K/V row can round to another f16 / q8_0 value */
                float tol = types[ti] == GGML_TYPE_F32 ? cases[ci].tol : 0.05f;
                assert_true(md <= tol);
            }
            free(ref);
            engine_close(e2);
            engine_close(e);
        }
    free(p);
    cJSON_Delete(g);
}

/* Context shift: -c 64 generates 300 tokens and stops; -1 stops after a context's worth. */
static void test_context_shift(void **state)
{
    (void)state;
    int types[] = {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_F32};
    for (int ti = 0; ti < 3; ti++) {
        engine *e = open_engine(types[ti], 64, 0);
        sampler *s = greedy(e);
        size_t n;
        int32_t *p = tokenize(e, "Once upon a time", &n);
        text_buf out;
        gen_stats st;
        kv_error err = {0};
        /* a model that does not stop: ignore end of text by asking for a fixed count */
        int fin = gen(e, s, ENGINE_SEQ_DEFAULT, p, n, 300, &out, &st);
        print_message("%s KV, -c 64: %d tokens, finish %s, %d shifts dropping %d positions (n_keep %d)\n",
                      quant_traits_of(types[ti])->name, st.n_generated, gen_finish_name(fin), st.n_shifts,
                      st.n_discarded, st.n_keep);
        assert_true(fin == GEN_FINISH_LENGTH || fin == GEN_FINISH_EOG);
        if (fin == GEN_FINISH_LENGTH) assert_int_equal(st.n_generated, 300);
        assert_true(st.n_shifts > 0);
        assert_int_equal(st.n_keep, 4);
        int nh;
        const int32_t *h = engine_seq_tokens(e, ENGINE_SEQ_DEFAULT, &nh);
        assert_true(nh <= 64);
        assert_memory_equal(h, p, 4 * sizeof *p);       /* the sinks are kept */
        assert_int_equal(kv_cache_check(engine_kv(e), &err), KV_OK);
        /* n_predict -1 never runs away */
        engine_reset(e);
        fin = gen(e, s, ENGINE_SEQ_DEFAULT, p, n, -1, &out, &st);
        assert_true(fin == GEN_FINISH_EOG || fin == GEN_FINISH_CONTEXT);
        assert_true(st.n_generated <= 64);
        /* without shifting, a full context finishes */
        gen_opts o = {.n_predict = 300, .no_context_shift = 1};
        int finish;
        engine_reset(e);
        sampler_reset(s);
        assert_int_equal(engine_generate_seq(e, ENGINE_SEQ_DEFAULT, p, n, &o, s, NULL, &st, &finish, &err), KV_OK);
        assert_true(finish == GEN_FINISH_CONTEXT || finish == GEN_FINISH_EOG);
        free(p);
        sampler_free(s);
        engine_close(e);
    }
}

/* A prompt longer than the context: a clear error, or truncation when asked. */
static void test_prompt_too_long(void **state)
{
    (void)state;
    engine *e = open_engine(GGML_TYPE_F16, 64, 0);
    sampler *s = greedy(e);
    char text[4096] = "";
    for (int i = 0; i < 12; i++) strcat(text, "The dog ran to the park and played with a ball. ");
    size_t n;
    int32_t *p = tokenize(e, text, &n);
    assert_true(n > 64);
    kv_error err = {0};
    gen_stats st;
    int finish;
    gen_opts o = {.n_predict = 8};
    assert_int_equal(engine_generate_seq(e, ENGINE_SEQ_DEFAULT, p, n, &o, s, NULL, &st, &finish, &err), KV_ERR_CONTEXT);
    print_message("too long: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "context holds 64"));
    o.truncate_prompt = 1;
    o.n_keep = 10;
    assert_int_equal(engine_generate_seq(e, ENGINE_SEQ_DEFAULT, p, n, &o, s, NULL, &st, &finish, &err), KV_OK);
    assert_int_equal(st.n_truncated, (int)n - (10 + (64 - 10) / 2));
    int nh;
    const int32_t *h = engine_seq_tokens(e, ENGINE_SEQ_DEFAULT, &nh);
    assert_memory_equal(h, p, 10 * sizeof *p);
    assert_memory_equal(h + 10, p + n - 27, 27 * sizeof *p);
    free(p);
    sampler_free(s);
    engine_close(e);
}

/* Many sequences, forks and requests: every block is free once every sequence is. */
static void test_no_block_leak(void **state)
{
    (void)state;
    engine *e = open_model("models/stories260K.gguf", GGML_TYPE_F16, 128, 0, 64);
    sampler *s = greedy(e);
    kv_error err = {0};
    size_t n;
    int32_t *p = tokenize(e, STORY, &n);
    text_buf out;
    gen_stats st;
    int seqs[6], ns = 0;
    gen(e, s, ENGINE_SEQ_DEFAULT, p, n, 40, &out, &st);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(engine_seq_fork(e, ENGINE_SEQ_DEFAULT, (int)n + 5 * i, &seqs[ns], &err), KV_OK);
        gen(e, s, seqs[ns], p, n, 20 + 30 * i, &out, &st); /* shifts on the last one */
        ns++;
    }
    assert_int_equal(engine_seq_new(e, &seqs[ns], &err), KV_OK);
    gen(e, s, seqs[ns++], p, n, 100, &out, &st);
    assert_int_equal(engine_seq_fork(e, seqs[0], -1, &seqs[ns], &err), KV_OK);
    engine_seq_truncate(e, seqs[ns], 7);
    gen(e, s, seqs[ns++], p + 2, n - 2, 10, &out, &st);
    kv_cache_stats ks;
    kv_cache_get_stats(engine_kv(e), &ks);
    print_message("%d sequences: %d blocks used (%d shared), %d cached, %d free of %d; %llu copy-on-write\n", ks.n_seqs,
                  ks.n_blocks_used, ks.n_blocks_shared, ks.n_blocks_cached, ks.n_blocks_free, ks.n_blocks,
                  (unsigned long long)ks.n_cow);
    assert_int_equal(ks.n_seqs, ns + 1);
    assert_int_equal(kv_cache_check(engine_kv(e), &err), KV_OK);
    for (int i = 0; i < ns; i++) assert_int_equal(engine_seq_free(e, seqs[i]), KV_OK);
    assert_int_equal(engine_seq_free(e, ENGINE_SEQ_DEFAULT), KV_OK);
    kv_cache_get_stats(engine_kv(e), &ks);
    assert_int_equal(ks.n_blocks_used, 0);
    assert_int_equal(ks.n_blocks_shared, 0);
    assert_int_equal(ks.n_seqs, 1);
    assert_int_equal(ks.n_blocks_free + ks.n_blocks_cached, ks.n_blocks);
    assert_int_equal(kv_cache_check(engine_kv(e), &err), KV_OK);
    assert_int_equal(engine_seq_free(e, 99), KV_ERR_INVALID);
    free(p);
    sampler_free(s);
    engine_close(e);
}

/* save → restore (in another engine) → the next logits are bitwise the same. */
static void test_save_restore_logits(void **state)
{
    (void)state;
    int types[] = {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_F32};
    for (int ti = 0; ti < 3; ti++) {
        engine *e = open_engine(types[ti], 256, 0);
        sampler *s = greedy(e);
        size_t n;
        int32_t *p = tokenize(e, STORY, &n);
        text_buf out, out2;
        gen_stats st;
        kv_error err = {0};
        gen(e, s, ENGINE_SEQ_DEFAULT, p, n, 50, &out, &st);
        void *blob;
        size_t len;
        assert_int_equal(engine_seq_save(e, ENGINE_SEQ_DEFAULT, -1, &blob, &len, &err), KV_OK);
        int nh;
        const int32_t *h = engine_seq_tokens(e, ENGINE_SEQ_DEFAULT, &nh);
        int32_t *hist = malloc(sizeof(int32_t) * (size_t)(nh + 1));
        memcpy(hist, h, sizeof(int32_t) * (size_t)nh);
        hist[nh] = 42;
        engine *e2 = open_engine(types[ti], 256, 0);
        sampler *s2 = greedy(e2);
        int r;
        assert_int_equal(engine_seq_new(e2, &r, &err), KV_OK);
        assert_int_equal(engine_seq_restore(e2, r, blob, len, &err), KV_OK);
        /* both continue with the same token: no reuse decision differs, one token is fed */
        gen(e, s, ENGINE_SEQ_DEFAULT, hist, (size_t)nh + 1, 30, &out, &st);
        assert_int_equal(st.n_prefilled, 1);
        gen(e2, s2, r, hist, (size_t)nh + 1, 30, &out2, &st);
        assert_int_equal(st.n_prefilled, 1);
        assert_string_equal(out.s, out2.s);
        /* bitwise: one more identical forward step on each */
        int n_vocab = engine_model(e)->hp.n_vocab;
        float *l1 = malloc(sizeof(float) * (size_t)n_vocab);
        assert_int_equal(engine_seq_truncate(e, ENGINE_SEQ_DEFAULT, nh), KV_OK);
        assert_int_equal(engine_seq_truncate(e2, r, nh), KV_OK);
        assert_int_equal(engine_prefill_seq(e, ENGINE_SEQ_DEFAULT, hist, (size_t)nh + 1, NULL, &st, &err), KV_OK);
        memcpy(l1, engine_logits(e), sizeof(float) * (size_t)n_vocab);
        assert_int_equal(engine_prefill_seq(e2, r, hist, (size_t)nh + 1, NULL, &st, &err), KV_OK);
        assert_memory_equal(l1, engine_logits(e2), sizeof(float) * (size_t)n_vocab);
        print_message("%s KV: %d positions saved in %zu bytes, restored: logits bitwise equal\n",
                      quant_traits_of(types[ti])->name, nh, len);
        /* a blob of another KV type or a corrupt one is refused */
        if (types[ti] != GGML_TYPE_F16) {
            engine *e3 = open_engine(GGML_TYPE_F16, 256, 0);
            assert_int_equal(engine_seq_restore(e3, 0, blob, len, &err), KV_ERR_UNSUPPORTED);
            engine_close(e3);
        }
        ((uint8_t *)blob)[len / 2] ^= 1;
        assert_int_equal(engine_seq_restore(e2, r, blob, len, &err), KV_ERR_FORMAT);
        assert_non_null(strstr(err.msg, "corrupt"));
        free(l1);
        free(hist);
        free(blob);
        free(p);
        sampler_free(s);
        sampler_free(s2);
        engine_close(e);
        engine_close(e2);
    }
}

/* A base saved once plus a delta, restored into another engine (base, then delta), computes
 * bitwise the logits of the fresh prefill they were saved from. */
static void test_delta_restore_logits(void **state)
{
    (void)state;
    cJSON *g = tu_read_json(tu_path("golden/stories260K.long.json"));
    assert_non_null(g);
    const cJSON *jpt = cJSON_GetObjectItem(g, "prompt_tokens");
    const int n = 200, a = 128; /* a system-prompt-like base of 8 blocks, 72 positions of its own */
    assert_true(cJSON_GetArraySize(jpt) > n);
    int32_t p[201];
    for (int i = 0; i <= n; i++) p[i] = cJSON_GetArrayItem(jpt, i)->valueint;
    cJSON_Delete(g);
    int types[] = {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_F32};
    for (int ti = 0; ti < 3; ti++) {
        kv_error err = {0};
        gen_stats st;
        engine *e = open_engine(types[ti], 512, 0);
        int n_vocab = engine_model(e)->hp.n_vocab;
        assert_int_equal(engine_prefill_seq(e, ENGINE_SEQ_DEFAULT, p, (size_t)n, NULL, &st, &err), KV_OK);
        assert_int_equal(st.n_prefilled, n);
        void *full, *base, *delta;
        size_t lf, lb, ld;
        assert_int_equal(engine_seq_save(e, ENGINE_SEQ_DEFAULT, -1, &full, &lf, &err), KV_OK);
        assert_int_equal(engine_seq_save(e, ENGINE_SEQ_DEFAULT, a, &base, &lb, &err), KV_OK);
        assert_int_equal(engine_seq_save_range(e, ENGINE_SEQ_DEFAULT, a, -1, &delta, &ld, &err), KV_OK);
        kv_cache_stats ks;
        kv_cache_get_stats(engine_kv(e), &ks);
        assert_int_equal(lf - ld, (size_t)a * (4 + ks.bytes_per_token));
        void *bad;
        size_t lbad;
        assert_int_equal(engine_seq_save_range(e, ENGINE_SEQ_DEFAULT, a + 3, -1, &bad, &lbad, &err), KV_ERR_INVALID);
        assert_null(bad);
        /* the fresh path: one more token on top of the prefill */
        assert_int_equal(engine_prefill_seq(e, ENGINE_SEQ_DEFAULT, p, (size_t)n + 1, NULL, &st, &err), KV_OK);
        assert_int_equal(st.n_prefilled, 1);
        float *ref = malloc(sizeof(float) * (size_t)n_vocab);
        memcpy(ref, engine_logits(e), sizeof(float) * (size_t)n_vocab);
        /* the restored path: a new engine, a new sequence; the delta alone is refused */
        engine *e2 = open_engine(types[ti], 512, 0);
        int r;
        assert_int_equal(engine_seq_new(e2, &r, &err), KV_OK);
        assert_int_equal(engine_seq_restore(e2, r, delta, ld, &err), KV_ERR_INVALID);
        int nr;
        engine_seq_tokens(e2, r, &nr);
        assert_int_equal(nr, 0);
        assert_int_equal(engine_seq_restore(e2, r, base, lb, &err), KV_OK);
        assert_int_equal(engine_seq_restore(e2, r, delta, ld, &err), KV_OK);
        const int32_t *rt = engine_seq_tokens(e2, r, &nr);
        assert_int_equal(nr, n);
        assert_memory_equal(rt, p, sizeof(int32_t) * (size_t)n);
        assert_int_equal(kv_cache_check(engine_kv(e2), &err), KV_OK);
        /* the restored sequence saves to exactly the blob of the original */
        void *again;
        size_t la;
        assert_int_equal(engine_seq_save(e2, r, -1, &again, &la, &err), KV_OK);
        assert_int_equal(la, lf);
        assert_memory_equal(again, full, lf);
        free(again);
        /* a corrupt delta: refused, the sequence keeps what it holds */
        ((uint8_t *)delta)[ld / 3] ^= 0x20;
        assert_int_equal(engine_seq_restore(e2, r, delta, ld, &err), KV_ERR_FORMAT);
        assert_non_null(strstr(err.msg, "corrupt"));
        ((uint8_t *)delta)[ld / 3] ^= 0x20;
        engine_seq_tokens(e2, r, &nr);
        assert_int_equal(nr, n);
        assert_int_equal(engine_prefill_seq(e2, r, p, (size_t)n + 1, NULL, &st, &err), KV_OK);
        assert_int_equal(st.n_reused, n);
        assert_int_equal(st.n_prefilled, 1);
        assert_memory_equal(ref, engine_logits(e2), sizeof(float) * (size_t)n_vocab); /* bitwise */
        /* the base already in the sequence (restored earlier): only the delta is read */
        assert_int_equal(engine_seq_truncate(e2, r, a + 5), KV_OK);
        assert_int_equal(engine_seq_restore(e2, r, delta, ld, &err), KV_OK);
        assert_int_equal(engine_prefill_seq(e2, r, p, (size_t)n + 1, NULL, &st, &err), KV_OK);
        assert_int_equal(st.n_prefilled, 1);
        assert_memory_equal(ref, engine_logits(e2), sizeof(float) * (size_t)n_vocab);
        print_message("%s KV: base %d positions in %zu bytes + delta %d in %zu bytes (whole: %zu): restored logits "
                      "bitwise equal\n",
                      quant_traits_of(types[ti])->name, a, lb, n - a, ld, lf);
        free(ref);
        free(full);
        free(base);
        free(delta);
        engine_close(e2);
        engine_close(e);
    }
}

/* q8_0 KV vs f16 KV on the golden prompts, teacher-forced on the reference tokens: greedy
 * agreement and the largest logit difference from llama.cpp's (f32 KV) reference. */
static void q8_case(const char *golden, int *agree_ref, int *agree_f16, int *steps, float *md_q8, float *md_f16)
{
    cJSON *g = tu_read_json(tu_path(golden));
    assert_non_null(g);
    model *m = NULL;
    kv_error err = {0};
    assert_int_equal(model_load(tu_path("models/stories260K.gguf"), &m, &err), KV_OK);
    const cJSON *jpt = cJSON_GetObjectItem(g, "prompt_tokens"), *js = cJSON_GetObjectItem(g, "steps");
    int n_prompt = cJSON_GetArraySize(jpt), n_steps = cJSON_GetArraySize(js), nv = m->hp.n_vocab;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    for (int i = 0; i < n_prompt; i++) prompt[i] = cJSON_GetArrayItem(jpt, i)->valueint;
    int n_ctx = n_prompt + n_steps + 1;
    kv_cache *kq = kv_cache_create(m->hp.n_layer, m->hp.n_embd_kv, n_ctx, GGML_TYPE_Q8_0, &err);
    kv_cache *kf = kv_cache_create(m->hp.n_layer, m->hp.n_embd_kv, n_ctx, GGML_TYPE_F16, &err);
    forward_ctx *fc = forward_ctx_create(m, 512, n_ctx, &err);
    assert_non_null(kq);
    assert_non_null(kf);
    float *lq = malloc(sizeof(float) * (size_t)nv), *lf = malloc(sizeof(float) * (size_t)nv);
    for (int i = 0; i < n_prompt; i += 512) {
        int k = n_prompt - i < 512 ? n_prompt - i : 512;
        assert_int_equal(model_forward(m, fc, kq, NULL, prompt + i, k, lq, 0, &err), KV_OK);
        assert_int_equal(model_forward(m, fc, kf, NULL, prompt + i, k, lf, 0, &err), KV_OK);
    }
    for (int s = 0; s < n_steps; s++) {
        const cJSON *st = cJSON_GetArrayItem(js, s);
        int32_t ref = cJSON_GetObjectItem(st, "token")->valueint;
        int aq = 0, af = 0;
        for (int i = 1; i < nv; i++) {
            if (lq[i] > lq[aq]) aq = i;
            if (lf[i] > lf[af]) af = i;
        }
        *agree_ref += aq == ref;
        *agree_f16 += aq == af;
        (*steps)++;
        const cJSON *pair;
        cJSON_ArrayForEach(pair, cJSON_GetObjectItem(st, "top")) {
            int id = cJSON_GetArrayItem(pair, 0)->valueint;
            float rv = (float)cJSON_GetArrayItem(pair, 1)->valuedouble;
            *md_q8 = fmaxf(*md_q8, fabsf(lq[id] - rv));
            *md_f16 = fmaxf(*md_f16, fabsf(lf[id] - rv));
        }
        const cJSON *full = cJSON_GetObjectItem(st, "logits");
        if (full) {
            int i = 0;
            const cJSON *v;
            cJSON_ArrayForEach(v, full) {
                if (i >= nv) break;
                *md_q8 = fmaxf(*md_q8, fabsf(lq[i] - (float)v->valuedouble));
                *md_f16 = fmaxf(*md_f16, fabsf(lf[i] - (float)v->valuedouble));
                i++;
            }
        }
        if (s + 1 < n_steps) {
            assert_int_equal(model_forward(m, fc, kq, NULL, &ref, 1, lq, 0, &err), KV_OK);
            assert_int_equal(model_forward(m, fc, kf, NULL, &ref, 1, lf, 0, &err), KV_OK);
        }
    }
    free(lq);
    free(lf);
    free(prompt);
    forward_ctx_free(fc);
    kv_cache_free(kq);
    kv_cache_free(kf);
    model_free(m);
    cJSON_Delete(g);
}

/* Free-running greedy: steps until q8_0 KV first picks another token than f16 KV. */
static int q8_free_run(const char *prompt_text, int n_predict, int *n_out)
{
    engine *ef = open_engine(GGML_TYPE_F16, 512, 0), *eq = open_engine(GGML_TYPE_Q8_0, 512, 0);
    sampler *sf = greedy(ef), *sq = greedy(eq);
    size_t n;
    int32_t *p = tokenize(ef, prompt_text, &n);
    text_buf a, b;
    gen_stats st;
    gen(ef, sf, 0, p, n, n_predict, &a, &st);
    gen(eq, sq, 0, p, n, n_predict, &b, &st);
    int na, nb;
    const int32_t *ta = engine_seq_tokens(ef, 0, &na), *tb = engine_seq_tokens(eq, 0, &nb);
    int same = 0;
    while (same + (int)n < na && same + (int)n < nb && ta[n + same] == tb[n + same]) same++;
    *n_out = (na < nb ? na : nb) - (int)n;
    free(p);
    sampler_free(sf);
    sampler_free(sq);
    engine_close(ef);
    engine_close(eq);
    return same;
}

static void test_q8_0_accuracy(void **state)
{
    (void)state;
    const char *cases[] = {"golden/stories260K.p1.json", "golden/stories260K.p2.json", "golden/stories260K.p3.json",
                           "golden/stories260K.p4.json", "golden/stories260K.p5.json", "golden/stories260K.long.json"};
    int tot_ref = 0, tot_f16 = 0, tot = 0;
    float worst_q8 = 0, worst_f16 = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int ar = 0, af = 0, n = 0;
        float mq = 0, mf = 0;
        q8_case(cases[i], &ar, &af, &n, &mq, &mf);
        print_message("q8_0 KV %-30s %3d/%d greedy steps agree with f16 KV, %3d/%d with the reference; "
                      "max |dlogit| vs reference: q8_0 %.4f, f16 %.4f\n", cases[i], af, n, ar, n, mq, mf);
        tot_ref += ar;
        tot_f16 += af;
        tot += n;
        worst_q8 = fmaxf(worst_q8, mq);
        worst_f16 = fmaxf(worst_f16, mf);
    }
    print_message("q8_0 KV overall: %d/%d steps agree with f16 KV, %d/%d with the reference; max |dlogit| q8_0 %.4f "
                  "(f16 %.4f)\n", tot_f16, tot, tot_ref, tot, worst_q8, worst_f16);
    int nn, same = q8_free_run("Once upon a time", 256, &nn);
    print_message("q8_0 KV free-running greedy from \"Once upon a time\": first %d of %d tokens equal f16 KV's\n", same, nn);
    /* guards against regressions of what was measured (see the printed numbers) */
    assert_true(tot_f16 >= tot * 95 / 100);
    assert_true(worst_q8 < 1.5f);
    assert_true(worst_f16 < 0.05f);
}

/* The gauge's numbers on an engine: one sequence, memory grown by blocks. */
static void test_engine_stats(void **state)
{
    (void)state;
    engine *e = open_engine(GGML_TYPE_Q8_0, 256, 0);
    kv_cache_stats a, b;
    kv_cache_get_stats(engine_kv(e), &a);
    const model_hparams *hp = &engine_model(e)->hp;
    assert_int_equal(a.n_ctx, 256);
    assert_int_equal(a.bytes_per_token, 2 * (size_t)hp->n_layer * quant_row_size(GGML_TYPE_Q8_0, hp->n_embd_kv));
    assert_int_equal(a.bytes_allocated, 0);
    assert_int_equal(a.bytes_reserved, 256 * a.bytes_per_token);
    assert_int_equal(a.n_blocks, 2 * 256 / BS);
    assert_int_equal(a.bytes_limit, (size_t)a.n_blocks * a.bytes_per_block);
    sampler *s = greedy(e);
    size_t n;
    int32_t *p = tokenize(e, STORY, &n);
    text_buf out;
    gen_stats st;
    gen(e, s, 0, p, n, 30, &out, &st);
    kv_cache_get_stats(engine_kv(e), &b);
    int nt = (int)n + st.n_generated - 1;
    assert_int_equal(b.n_tokens, nt);
    assert_int_equal(b.bytes_used, (size_t)nt * b.bytes_per_token);
    assert_int_equal(b.n_blocks_used, (nt + BS - 1) / BS);
    assert_int_equal(b.bytes_allocated, (size_t)b.n_blocks_alloc * b.bytes_per_block);
    assert_int_equal(b.layer_bytes_allocated * (size_t)hp->n_layer, b.bytes_allocated);
    assert_int_equal(b.layer_bytes_used * (size_t)hp->n_layer, b.bytes_used);
    assert_int_equal(b.last_n_prompt, (int)n);
    assert_int_equal(b.last_n_prefilled, (int)n);
    kv_cache_stats f16;
    engine *e16 = open_engine(GGML_TYPE_F16, 256, 0);
    kv_cache_get_stats(engine_kv(e16), &f16);
    print_message("bytes per token on stories260K: f16 %zu, q8_0 %zu (%.1f%%)\n", f16.bytes_per_token, b.bytes_per_token,
                  100.0 * b.bytes_per_token / f16.bytes_per_token);
    /* a TinyLlama-shaped cache (22 layers, 4 KV heads of 64) */
    kv_error err = {0};
    kv_cache *t16 = kv_cache_create_ex(&(kv_cache_params){.n_layer = 22, .n_embd_kv = 256, .n_ctx = 2048, .type = GGML_TYPE_F16}, &err);
    kv_cache *t8 = kv_cache_create_ex(&(kv_cache_params){.n_layer = 22, .n_embd_kv = 256, .n_ctx = 2048, .type = GGML_TYPE_Q8_0}, &err);
    kv_cache_stats s16, s8;
    kv_cache_get_stats(t16, &s16);
    kv_cache_get_stats(t8, &s8);
    print_message("bytes per token, TinyLlama shape: f16 %zu, q8_0 %zu; 2048 tokens: %.1f MiB vs %.1f MiB\n",
                  s16.bytes_per_token, s8.bytes_per_token, 2048.0 * s16.bytes_per_token / 1048576,
                  2048.0 * s8.bytes_per_token / 1048576);
    assert_int_equal(s16.bytes_per_token, 22 * 2 * 256 * 2);
    assert_int_equal(s8.bytes_per_token, 22 * 2 * 256 / 32 * 34);
    kv_cache_free(t16);
    kv_cache_free(t8);
    free(p);
    sampler_free(s);
    engine_close(e);
    engine_close(e16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_view_from),
        cmocka_unit_test(test_fork_refcount_cow),
        cmocka_unit_test(test_prefix_adopt_lru),
        cmocka_unit_test(test_truncate_keeps_cached),
        cmocka_unit_test(test_reclaim),
        cmocka_unit_test(test_reserve_errors),
        cmocka_unit_test(test_rope_shift_op),
        cmocka_unit_test(test_shift_unit),
        cmocka_unit_test(test_blob),
        cmocka_unit_test(test_blob_delta),
        cmocka_unit_test(test_fork_regen_equals_fresh),
        cmocka_unit_test(test_prefix_reuse_bitwise),
        cmocka_unit_test(test_context_shift),
        cmocka_unit_test(test_prompt_too_long),
        cmocka_unit_test(test_no_block_leak),
        cmocka_unit_test(test_save_restore_logits),
        cmocka_unit_test(test_delta_restore_logits),
        cmocka_unit_test(test_q8_0_accuracy),
        cmocka_unit_test(test_engine_stats),
    };
    return cmocka_run_group_tests_name("kv_cache", tests, NULL, NULL);
}
