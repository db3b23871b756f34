/* kv_cache: paged K/V blocks (a full-layer part and a sliding-window-layer part per block; window parts outside every holder's window go back to a pool), per-sequence block tables, refcounts, copy-on-write, chained prefix hashes with an LRU of freed blocks, context shift, blobs (whole, or deltas over a base the sequence already holds), accounting. */
#include "kv_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "kernels/quant.h"

#define BS KV_BLOCK_SIZE

typedef struct kv_block {
    uint8_t *mem;        /* [n_full][2][BS][row_bytes] (full layers); NULL until allocated (grow mode) */
    uint8_t *swa;        /* [n_win][2][BS][row_bytes] (window layers); NULL when freed or none */
    int swa_ref;         /* sequences whose window covers this block (the part is held iff > 0,
                            or while cached) */
    int ref;             /* sequences whose table holds this block */
    int has_hash;        /* full block of a clean prefix: hash/parent/tokens are meaningful */
    int in_table;        /* reachable through the hash table (then immutable) */
    uint64_t hash, parent;
    int32_t tokens[BS];
    int hnext;           /* next block in the same hash bucket */
    int prev, next;      /* LRU list of cached blocks, or the free list (next only) */
} kv_block;

typedef struct kv_seq {
    int live;
    int n_tokens;        /* positions filled */
    int n_clean;         /* positions [0, n_clean) equal a fresh prefill */
    int n_blk;           /* blocks in the table (>= ceil(n_tokens / BS)) */
    int swa_from;        /* table entries [swa_from, n_blk) count in their block's swa_ref:
                            max(win_lo(n_tokens), swa_valid) / BS after every change */
    int swa_valid;       /* window layers: rows [swa_valid, n_tokens) are valid (held); >=
                            swa_from * BS */
    int *blocks;         /* [max_blocks_per_seq] */
    int32_t *tokens;     /* [n_ctx] */
} kv_seq;

struct kv_cache {
    int n_layer, n_embd_kv, n_ctx, type;
    size_t row_bytes, block_bytes;   /* block_bytes: the full-layer part */
    /* window layers: n_win of them (0: none), each keeping positions >= n_tokens - swa_keep */
    int n_win, n_swa, swa_keep;
    uint8_t *lwin;           /* [n_layer] 1: a window layer */
    int *lslot;              /* [n_layer] the layer's index inside its part */
    size_t swa_bytes;        /* one window part */
    uint8_t **swa_pool;      /* [n_blocks] window parts with memory, not attached */
    int n_swa_pool, n_swa_alloc, n_swa_held;
    int *scratch;            /* [max_blk] */
    int n_blocks, max_blk;   /* budget; blocks per sequence */
    int reserve;
    kv_block *blk;
    uint8_t *arena;          /* reserve mode: all block memory */
    int n_alloc;             /* blocks [0, n_alloc) have memory */
    int free_head;           /* unreferenced, unhashed blocks with memory */
    int lru_head, lru_tail;  /* cached blocks, least recently released first */
    int *bucket;             /* hash table heads */
    uint64_t bucket_mask;
    kv_seq *seq;
    int n_seq_cap, n_live;
    int active;
    int n_used, n_shared, n_cached;
    uint64_t n_hash_hits, n_evictions, n_cow;
    int n_shifts, n_shift_discarded;
    int last_n_prompt, last_n_reused, last_n_reused_hash, last_n_prefilled;
    float *rowbuf;           /* n_embd_kv floats (context shift) */
    kv_reclaim_fn reclaim;   /* kv_cache_set_reclaim: releases a caller's idle sequence, or NULL */
    void *reclaim_ud;
};

/* ---- hashing --------------------------------------------------------------------------- */

#define FNV_BASIS 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

uint64_t kv_hash_block(uint64_t parent, const int32_t *tokens, int n)
{
    uint64_t h = FNV_BASIS;
    for (int i = 0; i < 8; i++) {
        h ^= (uint8_t)(parent >> (8 * i));
        h *= FNV_PRIME;
    }
    for (int t = 0; t < n; t++) {
        uint32_t v = (uint32_t)tokens[t];
        for (int i = 0; i < 4; i++) {
            h ^= (uint8_t)(v >> (8 * i));
            h *= FNV_PRIME;
        }
    }
    return fmix64(h);
}

uint64_t kv_prefix_hash(const int32_t *tokens, int n)
{
    uint64_t h = KV_HASH_ROOT;
    for (int b = 0; (b + 1) * BS <= n; b++) h = kv_hash_block(h, tokens + b * BS, BS);
    return h;
}

int kv_block_hashes(const int32_t *tokens, int n, uint64_t *out)
{
    uint64_t h = KV_HASH_ROOT;
    int b = 0;
    for (; (b + 1) * BS <= n; b++) out[b] = h = kv_hash_block(h, tokens + b * BS, BS);
    return b;
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

uint64_t kv_checksum64(const void *data, size_t n)
{
    const uint8_t *p = data;
    uint64_t h = FNV_BASIS;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        h ^= rd64(p + i);
        h *= FNV_PRIME;
    }
    for (; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    h ^= (uint64_t)n;
    h *= FNV_PRIME;
    return fmix64(h);
}

/* ---- blocks ---------------------------------------------------------------------------- */

static uint8_t *row_ptr(const kv_cache *c, int b, int layer, int kv, int slot)
{
    uint8_t *part = c->lwin[layer] ? c->blk[b].swa : c->blk[b].mem;
    return part + (((size_t)c->lslot[layer] * 2 + kv) * BS + slot) * c->row_bytes;
}

/* ---- window parts ---------------------------------------------------------------------- */

/* Give block b a window part (from the pool, else new memory). */
static int swa_attach(kv_cache *c, int b, kv_error *err)
{
    kv_block *k = &c->blk[b];
    if (!c->n_win || k->swa) return KV_OK;
    uint8_t *p;
    if (c->n_swa_pool) p = c->swa_pool[--c->n_swa_pool];
    else if (!(p = malloc(c->swa_bytes)))
        return kv_error_set(err, KV_ERR_NOMEM, "KV cache: out of memory for a window part (%zu KiB)", c->swa_bytes >> 10);
    else c->n_swa_alloc++;
    k->swa = p;
    c->n_swa_held++;
    return KV_OK;
}

/* Return block b's window part to the pool. */
static void swa_detach(kv_cache *c, int b)
{
    kv_block *k = &c->blk[b];
    if (!k->swa) return;
    c->swa_pool[c->n_swa_pool++] = k->swa;
    k->swa = NULL;
    c->n_swa_held--;
}

static void swa_inc(kv_cache *c, int b) { c->blk[b].swa_ref++; }

/* One sequence less needs block b's window rows; nobody: the part goes back to the pool, unless
 * the block is cached (unreferenced and hashed: a continuation may adopt it). */
static void swa_dec(kv_cache *c, int b)
{
    kv_block *k = &c->blk[b];
    if (--k->swa_ref == 0 && (k->ref > 0 || !k->in_table)) swa_detach(c, b);
}

/* First position whose window-layer rows a sequence of n positions keeps (window + slack). */
static int win_lo(const kv_cache *c, int n)
{
    int lo = n - c->swa_keep;
    return lo > 0 ? lo : 0;
}

/* First position the window layers read for the next query of a sequence of n positions. */
static int need_lo(const kv_cache *c, int n)
{
    int lo = n - c->n_swa + 1;
    return lo > 0 ? lo : 0;
}

/* Move seq's counted range to its window: blocks entering it count (they hold their part),
 * blocks leaving it are uncounted (their part may be freed, so their rows are no longer valid). */
static void window_sync(kv_cache *c, kv_seq *s)
{
    if (!c->n_win) return;
    int to = win_lo(c, s->n_tokens) / BS, from = s->swa_from;
    if (to < s->swa_valid / BS) to = s->swa_valid / BS;
    for (int bi = to; bi < from && bi < s->n_blk; bi++) swa_inc(c, s->blocks[bi]);
    for (int bi = from; bi < to && bi < s->n_blk; bi++) swa_dec(c, s->blocks[bi]);
    s->swa_from = to;
    if (s->swa_valid < to * BS) s->swa_valid = to * BS;
}

/* n when the window layers of s hold the rows its first n positions need (always without
 * window layers), else 0: older rows are gone, only a prefill from the start recomputes them. */
static int window_cut(const kv_cache *c, const kv_seq *s, int n)
{
    if (!c->n_win || s->swa_valid == 0 || need_lo(c, n) >= s->swa_valid) return n;
    return 0;
}

static int table_find(const kv_cache *c, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    for (int b = c->bucket[hash & c->bucket_mask]; b >= 0; b = c->blk[b].hnext) {
        const kv_block *k = &c->blk[b];
        if (k->hash == hash && k->parent == parent && memcmp(k->tokens, tokens, sizeof k->tokens) == 0) return b;
    }
    return -1;
}

static void table_insert(kv_cache *c, int b)
{
    kv_block *k = &c->blk[b];
    int *head = &c->bucket[k->hash & c->bucket_mask];
    k->hnext = *head;
    *head = b;
    k->in_table = 1;
}

static void table_remove(kv_cache *c, int b)
{
    kv_block *k = &c->blk[b];
    int *pp = &c->bucket[k->hash & c->bucket_mask];
    while (*pp >= 0 && *pp != b) pp = &c->blk[*pp].hnext;
    if (*pp == b) *pp = k->hnext;
    k->hnext = -1;
    k->in_table = 0;
}

static void lru_unlink(kv_cache *c, int b)
{
    kv_block *k = &c->blk[b];
    if (k->prev >= 0) c->blk[k->prev].next = k->next;
    else c->lru_head = k->next;
    if (k->next >= 0) c->blk[k->next].prev = k->prev;
    else c->lru_tail = k->prev;
    k->prev = k->next = -1;
}

static void lru_push(kv_cache *c, int b)
{
    kv_block *k = &c->blk[b];
    k->prev = c->lru_tail;
    k->next = -1;
    if (c->lru_tail >= 0) c->blk[c->lru_tail].next = b;
    else c->lru_head = b;
    c->lru_tail = b;
}

static void free_push(kv_cache *c, int b)
{
    kv_block *k = &c->blk[b];
    k->has_hash = 0;
    k->prev = -1;
    k->next = c->free_head;
    c->free_head = b;
}

/* Take one more reference; a cached block leaves the LRU list. */
static void block_ref(kv_cache *c, int b)
{
    kv_block *k = &c->blk[b];
    if (k->ref == 0) {
        lru_unlink(c, b); /* only hashed (cached) blocks are ever found with ref 0 */
        c->n_cached--;
        c->n_used++;
    }
    if (++k->ref == 2) c->n_shared++;
}

/* Drop a reference; at zero a hashed block becomes cached (LRU), any other is free. */
static void block_unref(kv_cache *c, int b)
{
    kv_block *k = &c->blk[b];
    if (k->ref == 2) c->n_shared--;
    if (--k->ref > 0) return;
    c->n_used--;
    if (k->in_table) {
        lru_push(c, b);
        c->n_cached++;
    } else {
        free_push(c, b);
    }
}

/* A fresh block with refcount 1, or -1 with err set. */
static int block_alloc(kv_cache *c, kv_error *err)
{
    int b = -1;
    if (c->free_head >= 0) {
        b = c->free_head;
        c->free_head = c->blk[b].next;
    } else if (c->n_alloc < c->n_blocks) {
        b = c->n_alloc;
        if (!(c->blk[b].mem = malloc(c->block_bytes))) {
            kv_error_set(err, KV_ERR_NOMEM, "KV cache: out of memory growing to %d blocks (%zu KiB each)",
                         c->n_alloc + 1, c->block_bytes >> 10);
            return -1;
        }
        c->n_alloc++;
    } else if (c->lru_head >= 0) {
        b = c->lru_head;
        lru_unlink(c, b);
        table_remove(c, b);
        c->n_cached--;
        c->n_evictions++;
    } else {
        kv_error_set(err, KV_ERR_CONTEXT,
                     "KV cache: all %d blocks (%d positions) are in use by %d sequence(s); free a branch or raise -c",
                     c->n_blocks, c->n_blocks * BS, c->n_live);
        return -1;
    }
    kv_block *k = &c->blk[b];
    k->ref = 1;
    k->has_hash = 0;
    k->in_table = 0;
    k->prev = k->next = k->hnext = -1;
    k->swa_ref = 0;
    c->n_used++;
    if (swa_attach(c, b, err)) { /* give it back (unreferenced, unhashed: free) */
        k->ref = 0;
        c->n_used--;
        free_push(c, b);
        return -1;
    }
    return b;
}

/* ---- creation -------------------------------------------------------------------------- */

kv_cache *kv_cache_create_ex(const kv_cache_params *p, kv_error *err)
{
    if (p->n_layer < 1 || p->n_embd_kv < 1 || p->n_ctx < 1 || p->n_blocks < 0 || p->n_ctx > (1 << 28)) {
        kv_error_set(err, KV_ERR_INVALID, "KV cache: invalid size (n_layer %d, n_embd_kv %d, n_ctx %d, n_blocks %d)",
                     p->n_layer, p->n_embd_kv, p->n_ctx, p->n_blocks);
        return NULL;
    }
    if (p->type != GGML_TYPE_F32 && p->type != GGML_TYPE_F16 && p->type != GGML_TYPE_Q8_0) {
        const quant_traits *qt = quant_traits_of(p->type);
        kv_error_set(err, KV_ERR_UNSUPPORTED, "KV cache type %s is not supported (f32, f16, q8_0)", qt ? qt->name : "?");
        return NULL;
    }
    if (p->type == GGML_TYPE_Q8_0 && p->n_embd_kv % 32) {
        kv_error_set(err, KV_ERR_UNSUPPORTED,
                     "KV cache type q8_0 needs n_head_kv * head_dim (%d) to be a multiple of 32; use f16", p->n_embd_kv);
        return NULL;
    }
    kv_cache *c = calloc(1, sizeof *c);
    if (!c) goto nomem;
    c->n_layer = p->n_layer;
    c->n_embd_kv = p->n_embd_kv;
    c->n_ctx = p->n_ctx;
    c->type = p->type;
    c->row_bytes = quant_row_size(p->type, p->n_embd_kv);
    c->lwin = calloc((size_t)p->n_layer, 1);
    c->lslot = malloc(sizeof(int) * (size_t)p->n_layer);
    if (!c->lwin || !c->lslot) goto nomem;
    if (p->swa_layers && p->n_swa > 0 && p->swa_slack >= 0) {
        c->n_swa = p->n_swa;
        c->swa_keep = p->n_swa - 1 + (p->swa_slack ? p->swa_slack : KV_SWA_SLACK);
        for (int l = 0; l < p->n_layer; l++) c->n_win += c->lwin[l] = p->swa_layers[l] != 0;
    }
    for (int l = 0, nf = 0, nw = 0; l < p->n_layer; l++) c->lslot[l] = c->lwin[l] ? nw++ : nf++;
    c->block_bytes = (size_t)(p->n_layer - c->n_win) * 2 * BS * c->row_bytes;
    c->swa_bytes = (size_t)c->n_win * 2 * BS * c->row_bytes;
    if (!c->block_bytes) c->block_bytes = 1; /* every layer a window layer: a token block's header only */
    c->max_blk = (p->n_ctx + BS - 1) / BS;
    c->n_blocks = p->n_blocks ? p->n_blocks : 2 * c->max_blk;
    c->reserve = p->reserve;
    c->free_head = c->lru_head = c->lru_tail = -1;
    size_t nb = 16;
    while (nb < 2 * (size_t)c->n_blocks) nb <<= 1;
    c->bucket_mask = nb - 1;
    c->blk = calloc((size_t)c->n_blocks, sizeof *c->blk);
    c->bucket = malloc(nb * sizeof *c->bucket);
    c->rowbuf = malloc(sizeof(float) * (size_t)c->n_embd_kv);
    c->n_seq_cap = 8;
    c->seq = calloc((size_t)c->n_seq_cap, sizeof *c->seq);
    c->swa_pool = malloc(sizeof *c->swa_pool * (size_t)c->n_blocks);
    c->scratch = malloc(sizeof(int) * (size_t)c->max_blk);
    if (!c->blk || !c->bucket || !c->rowbuf || !c->seq || !c->swa_pool || !c->scratch) goto nomem;
    for (size_t i = 0; i < nb; i++) c->bucket[i] = -1;
    for (int b = 0; b < c->n_blocks; b++) c->blk[b].prev = c->blk[b].next = c->blk[b].hnext = -1;
    if (c->reserve) {
        if (!(c->arena = malloc(c->block_bytes * (size_t)c->n_blocks))) goto nomem;
        for (int b = c->n_blocks - 1; b >= 0; b--) {
            c->blk[b].mem = c->arena + c->block_bytes * (size_t)b;
            free_push(c, b);
        }
        c->n_alloc = c->n_blocks;
    }
    int s0;
    if (kv_seq_new(c, &s0, err)) goto fail;
    return c;
nomem:
    kv_error_set(err, KV_ERR_NOMEM, "KV cache: cannot allocate %zu MiB for %d blocks of %d positions",
                 (c ? c->block_bytes * (size_t)c->n_blocks : 0) >> 20, c ? c->n_blocks : 0, BS);
fail:
    kv_cache_free(c);
    return NULL;
}

kv_cache *kv_cache_create(int n_layer, int n_embd_kv, int n_ctx, int type, kv_error *err)
{
    kv_cache_params p = {.n_layer = n_layer, .n_embd_kv = n_embd_kv, .n_ctx = n_ctx, .type = type,
                         .n_blocks = n_ctx > 0 ? (n_ctx + BS - 1) / BS : 0, .reserve = 1};
    return kv_cache_create_ex(&p, err);
}

void kv_cache_free(kv_cache *c)
{
    if (!c) return;
    if (c->seq)
        for (int i = 0; i < c->n_seq_cap; i++) {
            free(c->seq[i].blocks);
            free(c->seq[i].tokens);
        }
    if (c->blk && !c->arena)
        for (int b = 0; b < c->n_alloc; b++) free(c->blk[b].mem);
    if (c->blk)
        for (int b = 0; b < c->n_blocks; b++) free(c->blk[b].swa);
    for (int i = 0; c->swa_pool && i < c->n_swa_pool; i++) free(c->swa_pool[i]);
    free(c->swa_pool);
    free(c->scratch);
    free(c->lwin);
    free(c->lslot);
    free(c->arena);
    free(c->seq);
    free(c->blk);
    free(c->bucket);
    free(c->rowbuf);
    free(c);
}

int kv_cache_n_ctx(const kv_cache *c) { return c->n_ctx; }
int kv_cache_type(const kv_cache *c) { return c->type; }

void kv_cache_get_stats(const kv_cache *c, kv_cache_stats *st)
{
    memset(st, 0, sizeof *st);
    const kv_seq *s = kv_seq_valid(c, c->active) ? &c->seq[c->active] : &c->seq[0];
    st->n_ctx = c->n_ctx;
    st->n_tokens = s->n_tokens;
    st->type = c->type;
    st->bytes_per_token = 2 * c->row_bytes * (size_t)c->n_layer;
    size_t win_tok = 2 * c->row_bytes * (size_t)c->n_win, full_tok = st->bytes_per_token - win_tok;
    /* window layers hold positions from their first counted block on (at most swa_keep + BS) */
    int held = s->n_tokens - (c->n_win ? s->swa_from * BS : 0), most = c->swa_keep + BS;
    if (held < 0) held = 0;
    st->bytes_used = full_tok * (size_t)s->n_tokens + win_tok * (size_t)held;
    st->bytes_reserved = c->n_win ? full_tok * (size_t)c->n_ctx + win_tok * (size_t)(most < c->n_ctx ? most : c->n_ctx)
                                  : st->bytes_per_token * (size_t)c->n_ctx;
    size_t full_block = c->n_win == c->n_layer ? 0 : c->block_bytes;
    st->bytes_allocated = full_block * (size_t)c->n_alloc + c->swa_bytes * (size_t)c->n_swa_alloc;
    st->n_swa_layers = c->n_win;
    st->n_swa = c->n_swa;
    st->swa_keep = c->swa_keep;
    st->swa_bytes_per_token = win_tok;
    st->swa_bytes_per_block = c->swa_bytes;
    st->n_swa_parts = c->n_swa_held;
    st->n_swa_parts_alloc = c->n_swa_alloc;
    st->bytes_swa_allocated = c->swa_bytes * (size_t)c->n_swa_alloc;
    st->bytes_full_history = st->bytes_per_token * (size_t)s->n_tokens;
    st->block_size = BS;
    st->n_blocks = c->n_blocks;
    st->n_blocks_alloc = c->n_alloc;
    st->n_blocks_used = c->n_used;
    st->n_blocks_shared = c->n_shared;
    st->n_blocks_cached = c->n_cached;
    st->n_blocks_free = c->n_blocks - c->n_used - c->n_cached;
    st->n_seqs = c->n_live;
    st->active_seq = c->active;
    st->reserved_up_front = c->reserve;
    st->bytes_per_block = full_block + c->swa_bytes;
    st->bytes_blocks_used = full_block * (size_t)c->n_used + c->swa_bytes * (size_t)c->n_swa_held;
    st->bytes_limit = (full_block + c->swa_bytes) * (size_t)c->n_blocks;
    st->n_layer = c->n_layer;
    st->layer_bytes_per_token = 2 * c->row_bytes;
    st->layer_bytes_used = st->bytes_used / (size_t)c->n_layer;
    st->layer_bytes_reserved = st->bytes_reserved / (size_t)c->n_layer;
    st->layer_bytes_allocated = st->bytes_allocated / (size_t)c->n_layer;
    st->last_n_prompt = c->last_n_prompt;
    st->last_n_reused = c->last_n_reused;
    st->last_n_reused_hash = c->last_n_reused_hash;
    st->last_n_prefilled = c->last_n_prefilled;
    st->n_hash_hits = c->n_hash_hits;
    st->n_evictions = c->n_evictions;
    st->n_cow = c->n_cow;
    st->n_shifts = c->n_shifts;
    st->n_shift_discarded = c->n_shift_discarded;
}

void kv_cache_note_request(kv_cache *c, int seq, int n_prompt, int n_reused, int n_reused_hash, int n_prefilled)
{
    if (kv_seq_valid(c, seq)) c->active = seq;
    c->last_n_prompt = n_prompt;
    c->last_n_reused = n_reused;
    c->last_n_reused_hash = n_reused_hash;
    c->last_n_prefilled = n_prefilled;
}

void kv_cache_drop_cached(kv_cache *c)
{
    while (c->lru_head >= 0) {
        int b = c->lru_head;
        lru_unlink(c, b);
        table_remove(c, b);
        c->n_cached--;
        swa_detach(c, b);
        free_push(c, b);
    }
}

void kv_cache_set_reclaim(kv_cache *c, kv_reclaim_fn fn, void *ud)
{
    c->reclaim = fn;
    c->reclaim_ud = ud;
}

/* ---- sequences ------------------------------------------------------------------------- */

int kv_seq_valid(const kv_cache *c, int seq) { return seq >= 0 && seq < c->n_seq_cap && c->seq[seq].live; }

static kv_seq *get_seq(const kv_cache *c, int seq)
{
    return kv_seq_valid(c, seq) ? &c->seq[seq] : NULL;
}

int kv_cache_n_tokens(const kv_cache *c) { return c->seq[0].n_tokens; }
void kv_cache_truncate(kv_cache *c, int n) { kv_seq_truncate(c, KV_SEQ_DEFAULT, n); }

int kv_seq_new(kv_cache *c, int *out, kv_error *err)
{
    int id = -1;
    for (int i = 0; i < c->n_seq_cap; i++)
        if (!c->seq[i].live) {
            id = i;
            break;
        }
    if (id < 0) {
        int nc = c->n_seq_cap * 2;
        kv_seq *ns = realloc(c->seq, (size_t)nc * sizeof *ns);
        if (!ns) return kv_error_set(err, KV_ERR_NOMEM, "KV cache: out of memory for %d sequences", nc);
        memset(ns + c->n_seq_cap, 0, (size_t)(nc - c->n_seq_cap) * sizeof *ns);
        id = c->n_seq_cap;
        c->seq = ns;
        c->n_seq_cap = nc;
    }
    kv_seq *s = &c->seq[id];
    if (!s->blocks) s->blocks = malloc(sizeof(int) * (size_t)c->max_blk);
    if (!s->tokens) s->tokens = malloc(sizeof(int32_t) * (size_t)c->n_ctx);
    if (!s->blocks || !s->tokens) return kv_error_set(err, KV_ERR_NOMEM, "KV cache: out of memory for a sequence");
    s->live = 1;
    s->n_tokens = s->n_clean = s->n_blk = s->swa_from = s->swa_valid = 0;
    c->n_live++;
    *out = id;
    return KV_OK;
}

int kv_seq_fork(kv_cache *c, int src, int n, int *out, kv_error *err)
{
    if (!get_seq(c, src)) return kv_error_set(err, KV_ERR_INVALID, "KV cache: no sequence %d to fork", src);
    int id, rc = kv_seq_new(c, &id, err);
    if (rc) return rc;
    kv_seq *s = &c->seq[src], *d = &c->seq[id]; /* after kv_seq_new: it may move the array */
    if (n < 0 || n > s->n_tokens) n = s->n_tokens;
    n = window_cut(c, s, n);
    int nb = (n + BS - 1) / BS;
    for (int i = 0; i < nb; i++) {
        d->blocks[i] = s->blocks[i];
        block_ref(c, s->blocks[i]);
    }
    memcpy(d->tokens, s->tokens, sizeof(int32_t) * (size_t)n);
    d->n_blk = nb;
    d->n_tokens = n;
    d->n_clean = s->n_clean < n ? s->n_clean : n;
    d->swa_from = nb; /* nothing counted yet: the sync counts the window */
    d->swa_valid = n ? s->swa_valid : 0;
    window_sync(c, d);
    *out = id;
    return KV_OK;
}

/* Release table entries [from, n_blk). */
static void seq_release_from(kv_cache *c, kv_seq *s, int from)
{
    for (int i = s->n_blk - 1; i >= from; i--) {
        block_unref(c, s->blocks[i]); /* first: a block now cached keeps its window part */
        if (c->n_win && i >= s->swa_from) swa_dec(c, s->blocks[i]);
    }
    if (s->n_blk > from) s->n_blk = from;
}

int kv_seq_free(kv_cache *c, int seq)
{
    kv_seq *s = get_seq(c, seq);
    if (!s) return KV_ERR_INVALID;
    seq_release_from(c, s, 0);
    s->n_tokens = s->n_clean = s->swa_from = s->swa_valid = 0;
    if (seq != KV_SEQ_DEFAULT) {
        s->live = 0;
        c->n_live--;
        if (c->active == seq) c->active = KV_SEQ_DEFAULT;
    }
    return KV_OK;
}

int kv_seq_n_tokens(const kv_cache *c, int seq)
{
    const kv_seq *s = get_seq(c, seq);
    return s ? s->n_tokens : 0;
}

int kv_seq_n_clean(const kv_cache *c, int seq)
{
    const kv_seq *s = get_seq(c, seq);
    return s ? s->n_clean : 0;
}

const int32_t *kv_seq_tokens(const kv_cache *c, int seq)
{
    const kv_seq *s = get_seq(c, seq);
    return s ? s->tokens : NULL;
}

void kv_seq_truncate(kv_cache *c, int seq, int n)
{
    kv_seq *s = get_seq(c, seq);
    if (!s || n < 0 || n >= s->n_tokens) return;
    n = window_cut(c, s, n);
    s->n_tokens = n;
    if (s->n_clean > n) s->n_clean = n;
    seq_release_from(c, s, (n + BS - 1) / BS);
    if (!n) s->swa_valid = s->swa_from = 0;
    window_sync(c, s);
}

int kv_seq_window_ok(const kv_cache *c, int seq, int n)
{
    const kv_seq *s = get_seq(c, seq);
    if (!s) return 0;
    if (n < 0 || n > s->n_tokens) n = s->n_tokens;
    return window_cut(c, s, n) == n;
}

int kv_seq_block_ref(const kv_cache *c, int seq, int pos)
{
    const kv_seq *s = get_seq(c, seq);
    if (!s || pos < 0 || pos / BS >= s->n_blk) return -1;
    return c->blk[s->blocks[pos / BS]].ref;
}

int kv_seq_adopt(kv_cache *c, int seq, const int32_t *tokens, int n_max, int *n_blocks)
{
    kv_seq *s = get_seq(c, seq);
    int added = 0, nb = 0;
    if (n_blocks) *n_blocks = 0;
    if (!s || s->n_clean != s->n_tokens) return 0;
    if (n_max > c->n_ctx) n_max = c->n_ctx;
    /* the chain of matching blocks first (nothing taken yet) */
    int bi0 = s->n_tokens / BS, k = 0;
    uint64_t parent = bi0 ? c->blk[s->blocks[bi0 - 1]].hash : KV_HASH_ROOT;
    if (bi0 && !c->blk[s->blocks[bi0 - 1]].has_hash) return 0; /* cannot happen for a clean sequence */
    while (bi0 + k < c->max_blk && (bi0 + k + 1) * BS <= n_max) {
        int start = (bi0 + k) * BS, b = table_find(c, kv_hash_block(parent, tokens + start, BS), parent, tokens + start);
        if (b < 0) break;
        c->scratch[k++] = b;
        parent = c->blk[b].hash;
    }
    /* window layers: only as far as the rows the end's window needs are held — the sequence's
     * own from swa_valid, an adopted block's if it kept its window part (a cached block's part
     * holds valid rows: it was in a window when its sequence let it go) */
    int valid = s->swa_valid;
    while (c->n_win && k > 0) {
        valid = s->swa_valid;
        for (int j = 0; j < k; j++)
            if (!c->blk[c->scratch[j]].swa) valid = (bi0 + j + 1) * BS;
        if (valid == 0 || need_lo(c, (bi0 + k) * BS) >= valid) break;
        k--;
    }
    if (c->n_win && k > 0) s->swa_valid = valid; /* (the sync below counts from there) */
    for (int j = 0; j < k; j++) {
        int bi = bi0 + j, start = bi * BS, b = c->scratch[j];
        block_ref(c, b);
        if (c->n_win && bi >= s->swa_from) swa_inc(c, b);
        if (bi < s->n_blk) {
            block_unref(c, s->blocks[bi]);
            if (c->n_win && bi >= s->swa_from) swa_dec(c, s->blocks[bi]);
        } else {
            s->n_blk = bi + 1;
        }
        s->blocks[bi] = b;
        added += start + BS - s->n_tokens;
        memcpy(s->tokens + s->n_tokens, tokens + s->n_tokens, sizeof(int32_t) * (size_t)(start + BS - s->n_tokens));
        s->n_tokens = s->n_clean = start + BS;
        nb++;
        c->n_hash_hits++;
    }
    window_sync(c, s);
    if (n_blocks) *n_blocks = nb;
    return added;
}

/* ---- writing --------------------------------------------------------------------------- */

/* Blocks a write to table entries [bi0, bi1] of s takes: new entries, and shared or hashed ones
 * (make_writable copies those). */
static int blocks_needed(const kv_cache *c, const kv_seq *s, int bi0, int bi1)
{
    int n = 0;
    for (int bi = bi0; bi <= bi1; bi++)
        if (bi >= s->n_blk || c->blk[s->blocks[bi]].ref > 1 || c->blk[s->blocks[bi]].in_table) n++;
    return n;
}

/* Before such a write: while the budget beside the referenced blocks (free, unallocated and
 * cached ones) is short of it, the reclaim callback gives back a caller's idle sequence — which
 * may also unshare blocks of seq, so the need is counted again each time. */
static void make_room(kv_cache *c, int seq, int bi0, int bi1)
{
    while (c->reclaim && c->n_blocks - c->n_used < blocks_needed(c, &c->seq[seq], bi0, bi1))
        if (!c->reclaim(c->reclaim_ud)) break;
}

/* Give seq a private, unhashed copy of table entry bi (its first n_valid slots matter). */
static int make_writable(kv_cache *c, kv_seq *s, int bi, int n_valid, kv_error *err)
{
    int b = s->blocks[bi];
    kv_block *k = &c->blk[b];
    if (k->ref == 1 && !k->in_table) {
        k->has_hash = 0;
        return KV_OK;
    }
    int nb = block_alloc(c, err);
    if (nb < 0) return err ? err->code : KV_ERR_CONTEXT;
    k = &c->blk[b]; /* (block_alloc does not move blk, but be plain about it) */
    int counted = c->n_win && bi >= s->swa_from; /* else the window part is not needed */
    if (n_valid > 0) {
        if (n_valid == BS) {
            memcpy(c->blk[nb].mem, k->mem, c->block_bytes);
            if (counted && k->swa) memcpy(c->blk[nb].swa, k->swa, c->swa_bytes);
        } else {
            for (int l = 0; l < c->n_layer; l++)
                if (!c->lwin[l] || (counted && k->swa))
                    for (int kv = 0; kv < 2; kv++)
                        memcpy(row_ptr(c, nb, l, kv, 0), row_ptr(c, b, l, kv, 0), c->row_bytes * (size_t)n_valid);
        }
        memcpy(c->blk[nb].tokens, k->tokens, sizeof k->tokens);
    }
    s->blocks[bi] = nb;
    if (counted) swa_inc(c, nb);
    else swa_detach(c, nb);
    block_unref(c, b);
    if (counted) swa_dec(c, b);
    c->n_cow++;
    return KV_OK;
}

int kv_seq_reserve(kv_cache *c, int seq, int n, kv_error *err)
{
    kv_seq *s = get_seq(c, seq);
    if (!s) return kv_error_set(err, KV_ERR_INVALID, "KV cache: no sequence %d", seq);
    int pos0 = s->n_tokens;
    if (n < 0 || pos0 + n > c->n_ctx)
        return kv_error_set(err, KV_ERR_CONTEXT, "context is full: %d + %d tokens exceed n_ctx %d", pos0, n, c->n_ctx);
    if (n == 0) return KV_OK;
    int last = (pos0 + n - 1) / BS;
    make_room(c, seq, pos0 / BS, last);
    s = &c->seq[seq];
    for (int bi = pos0 / BS; bi <= last; bi++) {
        if (bi < s->n_blk) {
            int n_valid = pos0 - bi * BS;
            int rc = make_writable(c, s, bi, n_valid < 0 ? 0 : n_valid > BS ? BS : n_valid, err);
            if (rc) return rc;
        } else {
            int b = block_alloc(c, err);
            if (b < 0) return err ? err->code : KV_ERR_CONTEXT;
            s->blocks[bi] = b;
            s->n_blk = bi + 1;
            if (c->n_win && bi >= s->swa_from) swa_inc(c, b);
            else swa_detach(c, b);
        }
    }
    c->active = seq;
    return KV_OK;
}

void kv_cache_store(kv_cache *c, int seq, int layer, int pos, const float *k, const float *v)
{
    kv_seq *s = &c->seq[seq];
    int b = s->blocks[pos / BS], slot = pos % BS;
    quant_quantize_row(c->type, k, row_ptr(c, b, layer, 0, slot), c->n_embd_kv);
    quant_quantize_row(c->type, v, row_ptr(c, b, layer, 1, slot), c->n_embd_kv);
}

/* n positions filled with tokens; hash newly full blocks while the sequence is clean up to
 * clean_limit. */
static void commit(kv_cache *c, kv_seq *s, const int32_t *tokens, int n, int clean_limit)
{
    int pos0 = s->n_tokens;
    memcpy(s->tokens + pos0, tokens, sizeof(int32_t) * (size_t)n);
    for (int p = pos0; p < pos0 + n; p++) c->blk[s->blocks[p / BS]].tokens[p % BS] = tokens[p - pos0];
    int was_clean = s->n_clean == pos0;
    s->n_tokens = pos0 + n;
    window_sync(c, s); /* blocks that left the window free their window part */
    if (!was_clean) return;
    s->n_clean = s->n_tokens < clean_limit ? s->n_tokens : clean_limit;
    for (int bi = pos0 / BS; (bi + 1) * BS <= s->n_clean; bi++) {
        kv_block *k = &c->blk[s->blocks[bi]];
        uint64_t parent = bi ? c->blk[s->blocks[bi - 1]].hash : KV_HASH_ROOT;
        k->parent = parent;
        k->hash = kv_hash_block(parent, k->tokens, BS);
        k->has_hash = 1;
        if (!k->in_table && table_find(c, k->hash, parent, k->tokens) < 0) table_insert(c, s->blocks[bi]);
    }
}

void kv_seq_commit(kv_cache *c, int seq, const int32_t *tokens, int n)
{
    kv_seq *s = get_seq(c, seq);
    if (!s || n <= 0) return;
    commit(c, s, tokens, n, c->n_ctx);
    c->active = seq;
}

static const float *view(const kv_cache *c, int seq, int layer, int kv, int a, int n, float *tmp)
{
    const kv_seq *s = &c->seq[seq];
    for (int bi = a > 0 ? a / BS : 0; bi * BS < n; bi++) {
        int rows = n - bi * BS < BS ? n - bi * BS : BS;
        const uint8_t *src = row_ptr(c, s->blocks[bi], layer, kv, 0);
        float *dst = tmp + (size_t)bi * BS * c->n_embd_kv;
        if (c->type == GGML_TYPE_F32) memcpy(dst, src, sizeof(float) * (size_t)rows * c->n_embd_kv);
        else quant_dequantize_row(c->type, src, dst, (int64_t)rows * c->n_embd_kv);
    }
    return tmp;
}

const float *kv_cache_k(const kv_cache *c, int seq, int layer, int n, float *tmp) { return view(c, seq, layer, 0, 0, n, tmp); }
const float *kv_cache_v(const kv_cache *c, int seq, int layer, int n, float *tmp) { return view(c, seq, layer, 1, 0, n, tmp); }
const float *kv_cache_k_from(const kv_cache *c, int seq, int layer, int a, int n, float *tmp)
{
    return view(c, seq, layer, 0, a, n, tmp);
}
const float *kv_cache_v_from(const kv_cache *c, int seq, int layer, int a, int n, float *tmp)
{
    return view(c, seq, layer, 1, a, n, tmp);
}

void kv_cache_blocks(const kv_cache *c, int seq, int layer, int kind, int n, const uint8_t **out)
{
    const kv_seq *s = &c->seq[seq];
    for (int bi = 0; bi * BS < n; bi++)
        out[bi] = c->lwin[layer] && !c->blk[s->blocks[bi]].swa ? NULL : row_ptr(c, s->blocks[bi], layer, kind, 0);
}

size_t kv_cache_row_bytes(const kv_cache *c) { return c->row_bytes; }

/* ---- context shift --------------------------------------------------------------------- */

int kv_seq_shift(kv_cache *c, int seq, int n_keep, int n_discard, const kv_rope *rope, kv_error *err)
{
    kv_seq *s = get_seq(c, seq);
    if (!s) return kv_error_set(err, KV_ERR_INVALID, "KV cache: no sequence %d", seq);
    int n = s->n_tokens;
    if (n_keep < 0 || n_discard < 1 || n_keep + n_discard > n)
        return kv_error_set(err, KV_ERR_INVALID, "context shift: cannot keep %d and drop %d of %d positions", n_keep,
                            n_discard, n);
    if (rope->n_head_kv * rope->head_dim != c->n_embd_kv || rope->n_rot > rope->head_dim)
        return kv_error_set(err, KV_ERR_INVALID, "context shift: RoPE shape %d x %d does not match n_embd_kv %d",
                            rope->n_head_kv, rope->head_dim, c->n_embd_kv);
    int n_new = n - n_discard;
    /* window layers move only the rows of the new window [lo_new, n_new); the kept positions in
     * it must still be held (their sources past n_keep are in the old window: lo_new +
     * n_discard >= the old window's start) */
    int lo_new = c->n_win ? win_lo(c, n_new) : 0;
    /* valid afterwards: the moved rows from max(n_keep, lo_new), below them the kept rows from
     * swa_valid (when it is within the kept part) */
    int valid = lo_new >= n_keep ? lo_new : s->swa_valid <= n_keep ? s->swa_valid : n_keep;
    if (c->n_win && valid > 0 && need_lo(c, n_new) < valid)
        return kv_error_set(err, KV_ERR_CONTEXT,
                            "context shift: the sliding-window layers no longer hold kept positions %d..%d that the "
                            "shifted window needs; drop fewer positions (keep at least %d after the first %d)",
                            need_lo(c, n_new), valid - 1, c->swa_keep, n_keep);
    /* Blocks that will be written get private copies first (their content is kept, so
     * reading sources through the table stays right). */
    if (n_new > n_keep) make_room(c, seq, n_keep / BS, (n_new - 1) / BS);
    s = &c->seq[seq];
    if (n_new > n_keep)
        for (int bi = n_keep / BS; bi <= (n_new - 1) / BS; bi++) {
            int n_valid = n - bi * BS;
            int rc = make_writable(c, s, bi, n_valid > BS ? BS : n_valid, err);
            if (rc) return rc;
            /* a destination inside the new window but before the old one gets a (private)
             * window part: it is counted again by the sync below */
            if (c->n_win && (bi + 1) * BS > lo_new && !c->blk[s->blocks[bi]].swa &&
                (rc = swa_attach(c, s->blocks[bi], err)))
                return rc;
        }
    float cs[2048];
    int cs_ok = rope->n_rot <= 2048;
    if (cs_ok) op_rope_cache(cs, -n_discard, rope->n_rot, rope->freq_base, rope->freq_factors);
    /* Ascending: destination p < source p + n_discard, and a position is overwritten only after
     * it was read. */
    for (int l = 0; l < c->n_layer; l++)
        for (int p = c->lwin[l] && lo_new > n_keep ? lo_new : n_keep; p < n_new; p++) {
            int q = p + n_discard;
            const uint8_t *sk = row_ptr(c, s->blocks[q / BS], l, 0, q % BS);
            const uint8_t *sv = row_ptr(c, s->blocks[q / BS], l, 1, q % BS);
            uint8_t *dk = row_ptr(c, s->blocks[p / BS], l, 0, p % BS);
            uint8_t *dv = row_ptr(c, s->blocks[p / BS], l, 1, p % BS);
            quant_dequantize_row(c->type, sk, c->rowbuf, c->n_embd_kv);
            if (cs_ok) op_rope(c->rowbuf, rope->n_head_kv, rope->head_dim, rope->n_rot, cs, rope->neox);
            else op_rope_shift(c->rowbuf, rope->n_head_kv, rope->head_dim, rope->n_rot, -n_discard, rope->freq_base,
                               rope->freq_factors, rope->neox);
            quant_quantize_row(c->type, c->rowbuf, dk, c->n_embd_kv);
            memcpy(dv, sv, c->row_bytes);
        }
    memmove(s->tokens + n_keep, s->tokens + n_keep + n_discard, sizeof(int32_t) * (size_t)(n_new - n_keep));
    for (int p = n_keep; p < n_new; p++) c->blk[s->blocks[p / BS]].tokens[p % BS] = s->tokens[p];
    seq_release_from(c, s, (n_new + BS - 1) / BS);
    s->n_tokens = n_new;
    if (c->n_win) s->swa_valid = valid;
    window_sync(c, s);
    if (s->n_clean > n_keep) s->n_clean = n_keep;
    c->n_shifts++;
    c->n_shift_discarded += n_discard;
    c->active = seq;
    return KV_OK;
}

/* ---- serialization --------------------------------------------------------------------- */

#define BLOB_MAGIC "KVSQ"
#define BLOB_VERSION 3
#define BLOB_HEADER_V1 48
#define BLOB_HEADER 64    /* version 2 */
#define BLOB_HEADER_V3 72

/* A blob's header, read and checked by blob_parse (any version this file reads). */
typedef struct blob_hdr {
    uint32_t version;
    size_t header;           /* bytes before the tokens */
    uint64_t fingerprint;
    uint32_t type, n_layer, n_embd_kv, block_size;
    uint32_t n, n_clean;     /* end position; clean positions of [0, n) */
    uint32_t n_base;         /* positions [0, n_base) not in the blob (0: a whole one) */
    uint64_t prefix_hash, base_hash;
    uint32_t n_win, swa_lo;  /* version 3: window layers (stored last) and their first row; else 0, n_base */
} blob_hdr;

/* Chained hash of the full blocks of tokens[0..n) continuing from parent h. */
static uint64_t chain_hash(uint64_t h, const int32_t *tokens, int n)
{
    for (int b = 0; (b + 1) * BS <= n; b++) h = kv_hash_block(h, tokens + b * BS, BS);
    return h;
}

/* Size, magic, version, checksum; then the header's fields into *h. */
static int blob_parse(const void *blob, size_t len, blob_hdr *h, kv_error *err)
{
    const uint8_t *b = blob;
    memset(h, 0, sizeof *h);
    if (!b || len < BLOB_HEADER_V1 + 8 || memcmp(b, BLOB_MAGIC, 4) != 0)
        return kv_error_set(err, KV_ERR_FORMAT, "KV blob: not a kvchat KV blob (%zu bytes, bad magic or too short)", len);
    h->version = rd32(b + 4);
    if (h->version < 1 || h->version > BLOB_VERSION)
        return kv_error_set(err, KV_ERR_FORMAT, "KV blob: format version %u, this kvchat reads versions 1 to %d",
                            h->version, BLOB_VERSION);
    h->header = h->version == 1 ? BLOB_HEADER_V1 : h->version == 2 ? BLOB_HEADER : BLOB_HEADER_V3;
    if (len < h->header + 8)
        return kv_error_set(err, KV_ERR_FORMAT, "KV blob: corrupt (%zu bytes, shorter than its header)", len);
    uint64_t want = rd64(b + len - 8), got = kv_checksum64(b, len - 8);
    if (want != got)
        return kv_error_set(err, KV_ERR_FORMAT, "KV blob: corrupt (checksum %016llx, expected %016llx)",
                            (unsigned long long)got, (unsigned long long)want);
    h->fingerprint = rd64(b + 8);
    h->type = rd32(b + 16);
    h->n_layer = rd32(b + 20);
    h->n_embd_kv = rd32(b + 24);
    h->block_size = rd32(b + 28);
    h->n = rd32(b + 32);
    h->n_clean = rd32(b + 36);
    h->prefix_hash = rd64(b + 40);
    h->base_hash = KV_HASH_ROOT;
    if (h->version >= 2) {
        h->n_base = rd32(b + 48);
        h->base_hash = rd64(b + 56);
        if (rd32(b + 52) != 0)
            return kv_error_set(err, KV_ERR_FORMAT, "KV blob: corrupt (reserved header field is %u)", rd32(b + 52));
    }
    h->swa_lo = h->n_base;
    if (h->version >= 3) {
        h->n_win = rd32(b + 64);
        h->swa_lo = rd32(b + 68);
        if (h->n_win > h->n_layer || h->swa_lo < h->n_base || h->swa_lo > h->n || (h->swa_lo % BS && h->swa_lo != h->n))
            return kv_error_set(err, KV_ERR_FORMAT, "KV blob: corrupt header (%u window layers of %u, rows from %u)",
                                h->n_win, h->n_layer, h->swa_lo);
    }
    /* a delta's base is whole blocks of a clean prefix, and the blob covers the rest */
    if (h->n_clean > h->n || h->n_base > h->n || (h->n_base && (h->n_base % BS || h->n_clean < h->n_base)))
        return kv_error_set(err, KV_ERR_FORMAT, "KV blob: corrupt header (%u positions, %u clean, base %u)", h->n,
                            h->n_clean, h->n_base);
    return KV_OK;
}

/* Bytes of a blob holding n_own positions of n_full layers and n_own_win of n_win layers. */
static size_t blob_size(size_t header, size_t n_own, size_t n_full, size_t n_win, size_t n_own_win, size_t row_bytes)
{
    return header + 4 * n_own + (n_full * n_own + n_win * n_own_win) * 2 * row_bytes + 8;
}

static void blob_write_header(uint8_t *b, uint64_t fingerprint, uint32_t type, uint32_t n_layer, uint32_t n_embd_kv,
                              uint32_t n, uint32_t n_clean, uint64_t prefix_hash, uint32_t n_base, uint64_t base_hash,
                              uint32_t n_win, uint32_t swa_lo)
{
    memcpy(b, BLOB_MAGIC, 4);
    wr32(b + 4, n_win ? 3 : 2); /* no window layers: the same bytes as before version 3 */
    wr64(b + 8, fingerprint);
    wr32(b + 16, type);
    wr32(b + 20, n_layer);
    wr32(b + 24, n_embd_kv);
    wr32(b + 28, BS);
    wr32(b + 32, n);
    wr32(b + 36, n_clean);
    wr64(b + 40, prefix_hash);
    wr32(b + 48, n_base);
    wr32(b + 52, 0);
    wr64(b + 56, base_hash);
    if (n_win) {
        wr32(b + 64, n_win);
        wr32(b + 68, swa_lo);
    }
}

/* The order layers are stored in: full layers, then (version 3) window layers. */
static int blob_layer(const kv_cache *c, int i)
{
    if (!c->n_win) return i;
    int nf = c->n_layer - c->n_win;
    for (int l = 0, f = 0, w = 0; l < c->n_layer; l++) {
        if (!c->lwin[l] && f++ == i) return l;
        if (c->lwin[l] && nf + w++ == i) return l;
    }
    return i;
}

/* First position a sequence of n positions must hold for its window layers in a blob over a. */
static int blob_swa_lo(const kv_cache *c, int a, int n)
{
    int lo = win_lo(c, n) / BS * BS;
    return lo > a ? lo : a;
}

int kv_seq_save_range(const kv_cache *c, int seq, int a, int n, uint64_t fingerprint, void **blob, size_t *len,
                      kv_error *err)
{
    *blob = NULL;
    *len = 0;
    const kv_seq *s = get_seq(c, seq);
    if (!s) return kv_error_set(err, KV_ERR_INVALID, "KV cache: no sequence %d to save", seq);
    if (n < 0 || n > s->n_tokens) n = s->n_tokens;
    if (a < 0 || a % BS || a > n)
        return kv_error_set(err, KV_ERR_INVALID,
                            "KV cache: cannot save positions [%d, %d) of sequence %d: the start must be a multiple of %d "
                            "within [0, %d]",
                            a, n, seq, BS, n);
    if (a > s->n_clean)
        return kv_error_set(err, KV_ERR_INVALID,
                            "KV cache: cannot save sequence %d from position %d: only its first %d positions equal a "
                            "fresh prefill (a context shift), so they cannot be a shared base",
                            seq, a, s->n_clean);
    int swa_lo = c->n_win ? blob_swa_lo(c, a, n) : a;
    if (c->n_win && s->swa_valid > swa_lo) swa_lo = (s->swa_valid + BS - 1) / BS * BS; /* whole valid blocks */
    if (swa_lo > n) swa_lo = n;
    if (c->n_win && swa_lo > a && need_lo(c, n) < swa_lo)
        return kv_error_set(err, KV_ERR_INVALID,
                            "KV cache: cannot save the first %d positions of sequence %d: its sliding-window layers "
                            "already freed positions before %d of that window (the sequence is at %d)",
                            n, seq, swa_lo, s->n_tokens);
    size_t own = (size_t)(n - a), own_win = (size_t)(n - swa_lo);
    size_t hdr = c->n_win ? BLOB_HEADER_V3 : BLOB_HEADER;
    size_t total = blob_size(hdr, own, (size_t)(c->n_layer - c->n_win), (size_t)c->n_win, own_win, c->row_bytes);
    uint8_t *b = malloc(total);
    if (!b) return kv_error_set(err, KV_ERR_NOMEM, "KV cache: out of memory serializing %zu positions (%zu MiB)", own, total >> 20);
    int n_clean = s->n_clean < n ? s->n_clean : n;
    blob_write_header(b, fingerprint, (uint32_t)c->type, (uint32_t)c->n_layer, (uint32_t)c->n_embd_kv, (uint32_t)n,
                      (uint32_t)n_clean, kv_prefix_hash(s->tokens, n_clean), (uint32_t)a, kv_prefix_hash(s->tokens, a),
                      (uint32_t)c->n_win, (uint32_t)swa_lo);
    uint8_t *p = b + hdr;
    for (int i = a; i < n; i++, p += 4) wr32(p, (uint32_t)s->tokens[i]);
    for (int i = 0; i < c->n_layer; i++) {
        int l = blob_layer(c, i), lo = c->lwin[l] ? swa_lo : a;
        for (int kv = 0; kv < 2; kv++)
            for (int q = lo; q < n;) {
                int r = BS - q % BS < n - q ? BS - q % BS : n - q;
                memcpy(p, row_ptr(c, s->blocks[q / BS], l, kv, q % BS), c->row_bytes * (size_t)r);
                p += c->row_bytes * (size_t)r;
                q += r;
            }
    }
    wr64(p, kv_checksum64(b, (size_t)(p - b)));
    *blob = b;
    *len = total;
    return KV_OK;
}

int kv_seq_save(const kv_cache *c, int seq, int n, uint64_t fingerprint, void **blob, size_t *len, kv_error *err)
{
    return kv_seq_save_range(c, seq, 0, n, fingerprint, blob, len, err);
}

int kv_blob_info(const void *blob, size_t len, int *n_tokens, uint64_t *prefix_hash, int *n_base, uint64_t *base_hash,
                 kv_error *err)
{
    blob_hdr h;
    int rc = blob_parse(blob, len, &h, err);
    if (rc) return rc;
    if (n_tokens) *n_tokens = (int)h.n;
    if (prefix_hash) *prefix_hash = h.prefix_hash;
    if (n_base) *n_base = (int)h.n_base;
    if (base_hash) *base_hash = h.base_hash;
    return KV_OK;
}

int kv_blob_rebase(const void *blob, size_t len, int n_base, void **out, size_t *out_len, kv_error *err)
{
    *out = NULL;
    *out_len = 0;
    blob_hdr h;
    int rc = blob_parse(blob, len, &h, err);
    if (rc) return rc;
    if (h.type != GGML_TYPE_F32 && h.type != GGML_TYPE_F16 && h.type != GGML_TYPE_Q8_0)
        return kv_error_set(err, KV_ERR_UNSUPPORTED, "KV blob: K/V type %u is not one this kvchat stores", h.type);
    if (h.block_size != BS || h.n_layer < 1 || h.n_embd_kv < 1 || h.n_embd_kv > (1u << 20) || h.n_layer > 4096)
        return kv_error_set(err, KV_ERR_UNSUPPORTED, "KV blob: shape %u layers x %u (block %u) is not one this kvchat reads",
                            h.n_layer, h.n_embd_kv, h.block_size);
    if (n_base < 0 || n_base % BS || (uint32_t)n_base < h.n_base || (uint32_t)n_base > h.n_clean)
        return kv_error_set(err, KV_ERR_INVALID,
                            "KV blob: cannot make a delta over the first %d positions of a blob of %u (base %u, %u clean; "
                            "the base must be whole blocks of %d within the clean part)",
                            n_base, h.n, h.n_base, h.n_clean, BS);
    size_t rb = quant_row_size((int)h.type, h.n_embd_kv), nf = h.n_layer - h.n_win;
    size_t own = h.n - h.n_base, keep = h.n - (uint32_t)n_base, cut = own - keep;
    /* window layers: rows from max(n_base, swa_lo) */
    uint32_t swa_lo2 = (uint32_t)n_base > h.swa_lo ? (uint32_t)n_base : h.swa_lo;
    size_t own_win = h.n - h.swa_lo, keep_win = h.n - swa_lo2, cut_win = own_win - keep_win;
    size_t want = blob_size(h.header, own, nf, h.n_win, own_win, rb);
    if (len != want)
        return kv_error_set(err, KV_ERR_FORMAT, "KV blob: corrupt (%zu bytes for %zu positions, expected %zu)", len, own,
                            want);
    size_t hdr = h.n_win ? BLOB_HEADER_V3 : BLOB_HEADER;
    size_t total = blob_size(hdr, keep, nf, h.n_win, keep_win, rb);
    uint8_t *d = malloc(total);
    if (!d) return kv_error_set(err, KV_ERR_NOMEM, "KV blob: out of memory (%zu MiB)", total >> 20);
    const uint8_t *src = (const uint8_t *)blob + h.header;
    int32_t *cut_toks = malloc(sizeof(int32_t) * (cut ? cut : 1));
    if (!cut_toks) {
        free(d);
        return kv_error_set(err, KV_ERR_NOMEM, "KV blob: out of memory");
    }
    for (size_t i = 0; i < cut; i++) cut_toks[i] = (int32_t)rd32(src + 4 * i);
    uint64_t base_hash = chain_hash(h.base_hash, cut_toks, (int)cut);
    free(cut_toks);
    blob_write_header(d, h.fingerprint, h.type, h.n_layer, h.n_embd_kv, h.n, h.n_clean, h.prefix_hash, (uint32_t)n_base,
                      base_hash, h.n_win, swa_lo2);
    uint8_t *p = d + hdr;
    memcpy(p, src + 4 * cut, 4 * keep);
    p += 4 * keep;
    const uint8_t *rows = src + 4 * own;
    for (uint32_t l = 0; l < h.n_layer; l++) {
        int win = l >= nf;
        size_t o = win ? own_win : own, k = win ? keep_win : keep, ct = win ? cut_win : cut;
        for (int kv = 0; kv < 2; kv++) {
            memcpy(p, rows + ct * rb, k * rb);
            p += k * rb;
            rows += o * rb;
        }
    }
    wr64(p, kv_checksum64(d, (size_t)(p - d)));
    *out = d;
    *out_len = total;
    return KV_OK;
}

int kv_seq_restore(kv_cache *c, int seq, const void *blob, size_t len, uint64_t fingerprint, int n_vocab,
                   kv_error *err)
{
    kv_seq *s = get_seq(c, seq);
    if (!s) return kv_error_set(err, KV_ERR_INVALID, "KV cache: no sequence %d to restore into", seq);
    blob_hdr h;
    int rc = blob_parse(blob, len, &h, err);
    if (rc) return rc;
    const uint8_t *b = blob;
    uint32_t n = h.n, n_clean = h.n_clean, a = h.n_base, own = n - a;
    if (h.fingerprint != fingerprint)
        return kv_error_set(err, KV_ERR_UNSUPPORTED, "KV blob: made with another model (fingerprint %016llx, this model %016llx)",
                            (unsigned long long)h.fingerprint, (unsigned long long)fingerprint);
    if ((int)h.type != c->type || (int)h.n_layer != c->n_layer || (int)h.n_embd_kv != c->n_embd_kv || h.block_size != BS) {
        const quant_traits *qt = quant_traits_of((int)h.type);
        return kv_error_set(err, KV_ERR_UNSUPPORTED,
                            "KV blob: holds %s K/V of %u layers x %u (block %u), this cache %s of %d x %d (block %d)",
                            qt ? qt->name : "?", h.n_layer, h.n_embd_kv, h.block_size, quant_traits_of(c->type)->name,
                            c->n_layer, c->n_embd_kv, BS);
    }
    if (n > (uint32_t)c->n_ctx)
        return kv_error_set(err, KV_ERR_CONTEXT, "KV blob: %u positions do not fit the context of %d", n, c->n_ctx);
    /* window layers: a version-3 blob holds their rows from swa_lo (older ones every row); this
     * cache needs them from dst_lo */
    uint32_t dst_lo = c->n_win ? (uint32_t)blob_swa_lo(c, (int)a, (int)n) : a;
    if (h.swa_lo > dst_lo) dst_lo = h.swa_lo;
    if (h.n_win && ((int)h.n_win != c->n_win || (dst_lo > a && (uint32_t)need_lo(c, (int)n) < dst_lo)))
        return kv_error_set(err, KV_ERR_UNSUPPORTED,
                            "KV blob: its %u sliding-window layers hold positions from %u, this cache has %d window "
                            "layers needing positions from %d",
                            h.n_win, h.swa_lo, c->n_win, c->n_win ? need_lo(c, (int)n) : (int)a);
    size_t want = blob_size(h.header, own, h.n_layer - h.n_win, h.n_win, n - h.swa_lo, c->row_bytes);
    if (len != want)
        return kv_error_set(err, KV_ERR_FORMAT, "KV blob: corrupt (%zu bytes for %u positions, expected %zu)", len, own, want);
    const uint8_t *tp = b + h.header;
    int32_t *toks = malloc(sizeof(int32_t) * (own ? own : 1));
    if (!toks) return kv_error_set(err, KV_ERR_NOMEM, "KV blob: out of memory");
    for (uint32_t i = 0; i < own; i++) {
        toks[i] = (int32_t)rd32(tp + 4 * i);
        if (toks[i] < 0 || (n_vocab > 0 && toks[i] >= n_vocab)) {
            free(toks);
            return kv_error_set(err, KV_ERR_FORMAT, "KV blob: token %d at position %u is outside the vocabulary (%d)",
                                (int)rd32(tp + 4 * i), a + i, n_vocab);
        }
    }
    /* the clean full blocks chain on from the base's hash (a is whole blocks, n_clean >= a) */
    if (chain_hash(h.base_hash, toks, (int)(n_clean - a)) != h.prefix_hash) {
        free(toks);
        return kv_error_set(err, KV_ERR_FORMAT, "KV blob: corrupt (prefix hash does not match its tokens)");
    }
    /* A delta continues the sequence's own clean prefix of exactly the blob's base tokens (whose
     * window the window layers still hold). */
    if (a > 0) {
        uint64_t have = s->n_tokens >= (int)a ? kv_prefix_hash(s->tokens, (int)a) : KV_HASH_ROOT;
        if (s->n_tokens < (int)a || s->n_clean < (int)a || have != h.base_hash || window_cut(c, s, (int)a) != (int)a) {
            free(toks);
            return kv_error_set(err, KV_ERR_INVALID,
                                "KV blob: a delta over the first %u positions (prefix hash %016llx), but sequence %d "
                                "holds %d positions (%d clean%s): restore its base first",
                                a, (unsigned long long)h.base_hash, seq, s->n_tokens, s->n_clean,
                                s->n_tokens >= (int)a && s->n_clean >= (int)a
                                    ? (have != h.base_hash ? ", other tokens" : ", its window already freed")
                                    : "");
        }
    }
    /* Fill a scratch sequence — sharing seq's first a positions (refcounts, no copy) — then hand
     * its table to seq: a failure (no free block) leaves seq as it was. */
    int tmp = -1;
    if ((rc = kv_seq_fork(c, seq, (int)a, &tmp, err)) || (rc = kv_seq_reserve(c, tmp, (int)own, err))) {
        if (tmp >= 0 && kv_seq_valid(c, tmp)) kv_seq_free(c, tmp);
        free(toks);
        return rc;
    }
    kv_seq *t = &c->seq[tmp];
    if (c->n_win && dst_lo > a) t->swa_valid = (int)dst_lo; /* rows before it are not in the blob */
    const uint8_t *p = tp + 4 * (size_t)own;
    for (int i = 0; i < c->n_layer; i++) {
        /* the blob's i-th stored layer: in layer order (versions 1, 2) or full ones first (3) */
        int l = h.n_win ? blob_layer(c, i) : i;
        uint32_t from = c->lwin[l] ? h.swa_lo : a, to = c->lwin[l] ? dst_lo : a;
        for (int kv = 0; kv < 2; kv++) {
            p += c->row_bytes * (size_t)(to - from); /* rows older than this cache's window */
            for (int q = (int)to; q < (int)n;) {
                int r = BS - q % BS < (int)n - q ? BS - q % BS : (int)n - q;
                memcpy(row_ptr(c, t->blocks[q / BS], l, kv, q % BS), p, c->row_bytes * (size_t)r);
                p += c->row_bytes * (size_t)r;
                q += r;
            }
        }
    }
    if (own) commit(c, t, toks, (int)own, (int)n_clean);
    free(toks);
    s = &c->seq[seq];
    seq_release_from(c, s, 0);
    kv_seq swap = *s;
    *s = *t;
    *t = swap;            /* t keeps seq's old arrays (emptied) for reuse */
    s->live = 1;
    t->live = 0;
    t->n_tokens = t->n_clean = t->n_blk = t->swa_from = t->swa_valid = 0;
    c->n_live--;
    c->active = seq;
    return KV_OK;
}

/* ---- invariants ------------------------------------------------------------------------ */

int kv_cache_check(const kv_cache *c, kv_error *err)
{
    int *refs = calloc(2 * (size_t)c->n_blocks, sizeof *refs), *wrefs = refs + c->n_blocks;
    if (!refs) return kv_error_set(err, KV_ERR_NOMEM, "check: out of memory");
    int rc = KV_OK, live = 0;
    for (int i = 0; i < c->n_seq_cap && !rc; i++) {
        const kv_seq *s = &c->seq[i];
        if (!s->live) continue;
        live++;
        if (s->n_tokens < 0 || s->n_tokens > c->n_ctx || s->n_clean > s->n_tokens || s->n_blk < (s->n_tokens + BS - 1) / BS ||
            s->n_blk > c->max_blk)
            rc = kv_error_set(err, KV_ERR_INVALID, "check: sequence %d has n_tokens %d, n_clean %d, %d blocks", i,
                              s->n_tokens, s->n_clean, s->n_blk);
        int want_from = win_lo(c, s->n_tokens) / BS > s->swa_valid / BS ? win_lo(c, s->n_tokens) / BS : s->swa_valid / BS;
        if (c->n_win && !rc && s->n_blk && (s->swa_from != want_from || s->swa_valid < s->swa_from * BS))
            rc = kv_error_set(err, KV_ERR_INVALID,
                              "check: sequence %d counts its window from block %d, not %d (rows valid from %d)", i,
                              s->swa_from, want_from, s->swa_valid);
        for (int bi = 0; bi < s->n_blk && !rc; bi++) {
            int b = s->blocks[bi];
            if (b < 0 || b >= c->n_alloc) rc = kv_error_set(err, KV_ERR_INVALID, "check: sequence %d block %d is %d", i, bi, b);
            else refs[b]++, wrefs[b] += c->n_win && bi >= s->swa_from;
        }
        /* clean full blocks carry the chained hash of their tokens */
        uint64_t h = KV_HASH_ROOT;
        for (int bi = 0; (bi + 1) * BS <= s->n_clean && !rc; bi++) {
            h = kv_hash_block(h, s->tokens + bi * BS, BS);
            const kv_block *k = &c->blk[s->blocks[bi]];
            if (!k->has_hash || k->hash != h)
                rc = kv_error_set(err, KV_ERR_INVALID, "check: sequence %d block %d: hash %s", i, bi,
                                  k->has_hash ? "differs from its tokens' chain" : "missing");
        }
    }
    int used = 0, shared = 0, cached = 0, nfree = 0, n_held = 0;
    for (int b = 0; b < c->n_blocks && !rc; b++) {
        const kv_block *k = &c->blk[b];
        if (k->ref != refs[b])
            rc = kv_error_set(err, KV_ERR_INVALID, "check: block %d has refcount %d but %d table entries", b, k->ref, refs[b]);
        if (!rc && c->n_win &&
            (k->swa_ref != wrefs[b] || (k->ref > 0 && !k->swa != !k->swa_ref) || (k->ref == 0 && k->swa && !k->in_table)))
            rc = kv_error_set(err, KV_ERR_INVALID,
                              "check: block %d (ref %d%s) has window refcount %d, %d windows cover it, window part %s", b,
                              k->ref, k->in_table ? ", hashed" : "", k->swa_ref, wrefs[b], k->swa ? "held" : "freed");
        n_held += k->swa != NULL;
        used += k->ref > 0;
        shared += k->ref > 1;
        cached += k->ref == 0 && k->in_table;
        if (k->in_table && table_find(c, k->hash, k->parent, k->tokens) < 0)
            rc = kv_error_set(err, KV_ERR_INVALID, "check: block %d is marked hashed but not found", b);
    }
    for (int b = c->free_head; b >= 0 && !rc; b = c->blk[b].next) {
        nfree++;
        if (c->blk[b].ref || c->blk[b].in_table || nfree > c->n_blocks)
            rc = kv_error_set(err, KV_ERR_INVALID, "check: free list holds block %d (ref %d)", b, c->blk[b].ref);
    }
    int n_lru = 0;
    for (int b = c->lru_head; b >= 0 && !rc; b = c->blk[b].next)
        if (++n_lru > c->n_blocks || c->blk[b].ref || !c->blk[b].in_table)
            rc = kv_error_set(err, KV_ERR_INVALID, "check: LRU list holds block %d (ref %d)", b, c->blk[b].ref);
    if (!rc && (used != c->n_used || shared != c->n_shared || cached != c->n_cached || n_lru != cached ||
                live != c->n_live || used + cached + nfree != c->n_alloc))
        rc = kv_error_set(err, KV_ERR_INVALID,
                          "check: counted used %d shared %d cached %d (LRU %d) free %d live %d; counters say %d %d %d, "
                          "%d allocated, %d live",
                          used, shared, cached, n_lru, nfree, live, c->n_used, c->n_shared, c->n_cached, c->n_alloc,
                          c->n_live);
    if (!rc && (n_held != c->n_swa_held || c->n_swa_held + c->n_swa_pool != c->n_swa_alloc))
        rc = kv_error_set(err, KV_ERR_INVALID, "check: %d blocks hold a window part, counters say %d held + %d pooled of %d",
                          n_held, c->n_swa_held, c->n_swa_pool, c->n_swa_alloc);
    free(refs);
    return rc;
}
