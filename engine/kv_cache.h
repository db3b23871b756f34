/* kv_cache: the paged K/V memory of every sequence — fixed-size blocks, block tables, refcounts, copy-on-write, prefix hashes with LRU reuse, context shift, serialization, accounting. */
#ifndef KV_KV_CACHE_H
#define KV_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_error.h"

/*
 * PagedAttention's memory manager (Kwon et al. 2023, "Efficient Memory Management for Large
 * Language Model Serving with PagedAttention", SOSP'23), sized for one user with many branches:
 *
 * - K/V memory is cut into blocks of KV_BLOCK_SIZE positions; one block holds those positions'
 *   K and V rows for ALL layers (layout [n_layer][K, V][KV_BLOCK_SIZE][row], a row being
 *   n_embd_kv values in the cache type).
 * - A sequence (a conversation or a branch of one) is a block table: logical block i holds its
 *   positions [i*BS, (i+1)*BS). Positions are the indices in the sequence; RoPE uses them.
 * - Blocks carry reference counts: fork shares the source's blocks (refcount + 1, nothing is
 *   copied or recomputed). A block is written only when one sequence owns it and no prefix
 *   hash names it; otherwise the writer gets a private copy first (copy-on-write).
 * - Automatic prefix caching (vLLM): every full block whose positions are a clean prefix (K/V
 *   equal to what a fresh prefill of those tokens computes — true until a context shift) gets
 *   hash = kv_hash_block(parent block's hash, its KV_BLOCK_SIZE tokens). A request reuses every
 *   leading block whose chained hash is in the table (kv_seq_adopt), from any sequence, live or
 *   freed. Freed hashed blocks stay cached (reusable) until their memory is needed: eviction is
 *   least recently released first (LRU).
 * - Memory: a budget of n_blocks blocks, reserved up front or allocated block by block as
 *   needed (never returned before kv_cache_free).
 * - Sliding-window layers (gemma2, gemma3, gpt-oss; kv_cache_params.swa_layers): a block's rows
 *   are two parts, one for the full-attention layers and one for the window layers. A query at
 *   position p of a window layer reads positions p - n_swa + 1 .. p only, so once every sequence
 *   holding a block has moved past it (all its positions < n_tokens - n_swa + 1 - swa_slack),
 *   the block's window part goes back to a pool of window parts, which new blocks take first:
 *   the memory of the window layers is bounded by the window (+ slack + one block) per sequence
 *   however long the sequence grows. The full part (and the block's tokens and hash) stays. A
 *   freed sequence's hashed blocks keep their window parts while cached (prefix reuse of the
 *   exact continuation). Consequences, all explicit: kv_seq_truncate, kv_seq_fork and
 *   kv_seq_adopt keep only a prefix whose window the window layers still hold (a rewind further
 *   back than the slack keeps fewer positions: callers read kv_seq_n_tokens afterwards, and
 *   prefill the rest); kv_seq_save_range cannot save a prefix whose window was freed; a blob
 *   stores the window layers' rows of the window only (format version 3).
 *
 * Sequence ids are small integers; KV_SEQ_DEFAULT (0) always exists (kv_seq_free on it empties
 * it). Not thread-safe: one thread (the generator) uses a cache at a time.
 */

#define KV_BLOCK_SIZE 16   /* positions per block */
#define KV_SEQ_DEFAULT 0
#define KV_HASH_ROOT 0ULL  /* parent hash of a sequence's first block */

typedef struct kv_cache kv_cache;

/* Memory accounting for the gauge and /show: one call, O(1) (counters are kept up to date),
 * cheap enough per token. Bytes unless named otherwise. "Active" sequence = the one the last
 * forward pass, request or restore wrote to. */
typedef struct kv_cache_stats {
    int n_ctx;               /* capacity of one sequence in positions */
    int n_tokens;            /* positions filled in the active sequence */
    int type;                /* ggml_type of the stored K/V (F32, F16, Q8_0) */
    size_t bytes_per_token;  /* K + V over all layers, one position */
    size_t bytes_used;       /* n_tokens * bytes_per_token (the active sequence) */
    size_t bytes_reserved;   /* n_ctx * bytes_per_token: what one full sequence takes (the gauge's
                                scale); the memory actually held is bytes_allocated */
    /* ---- paged cache (see the top of this file) ---- */
    int block_size;          /* KV_BLOCK_SIZE */
    int n_blocks;            /* the budget: blocks the cache may hold */
    int n_blocks_alloc;      /* blocks with memory (bytes_allocated / bytes_per_block) */
    int n_blocks_used;       /* referenced by at least one sequence */
    int n_blocks_shared;     /* referenced by two or more sequences (forks share them) */
    int n_blocks_cached;     /* unreferenced, holding a hashed prefix: reusable until evicted */
    int n_blocks_free;       /* n_blocks - used - cached (includes budget not yet allocated) */
    int n_seqs;              /* live sequences, the default one included */
    int active_seq;
    int reserved_up_front;   /* 1: all memory was allocated at creation */
    size_t bytes_per_block;
    size_t bytes_allocated;      /* memory the cache holds: n_blocks_alloc * bytes_per_block (all of
                                    bytes_limit when reserved up front, else grown block by block) */
    size_t bytes_blocks_used;    /* n_blocks_used * bytes_per_block: all sequences, shared once */
    size_t bytes_limit;          /* n_blocks * bytes_per_block: the most it may hold */
    int n_layer;
    size_t layer_bytes_per_token;   /* bytes_per_token / n_layer */
    size_t layer_bytes_used;        /* bytes_used / n_layer */
    size_t layer_bytes_reserved;    /* bytes_reserved / n_layer */
    size_t layer_bytes_allocated;   /* bytes_allocated / n_layer */
    /* ---- sliding-window layers (0 when the cache has none): bytes_used, bytes_reserved,
     * bytes_allocated, bytes_blocks_used, bytes_per_block and bytes_limit above count the real
     * memory (window parts included, freed window parts not) ---- */
    int n_swa_layers;        /* layers whose blocks keep only the window */
    int n_swa;               /* their window in positions */
    int swa_keep;            /* positions behind the newest one they keep: n_swa - 1 + slack */
    size_t swa_bytes_per_token;   /* K + V of the window layers, one position */
    size_t swa_bytes_per_block;   /* one window part */
    int n_swa_parts;         /* blocks holding a window part now */
    int n_swa_parts_alloc;   /* window parts with memory (held + in the pool) */
    size_t bytes_swa_allocated;   /* n_swa_parts_alloc * swa_bytes_per_block */
    size_t bytes_full_history;    /* what the active sequence would take if the window layers kept
                                     every position (n_tokens * bytes_per_token) */
    /* prefix reuse of the last request (kv_cache_note_request) */
    int last_n_prompt;       /* prompt tokens */
    int last_n_reused;       /* taken from the cache (no computation) */
    int last_n_reused_hash;  /* of which came from the hash table (other or freed sequences) */
    int last_n_prefilled;    /* computed */
    /* totals since creation */
    uint64_t n_hash_hits;    /* blocks adopted through their hash */
    uint64_t n_evictions;    /* cached blocks whose memory was taken for new ones */
    uint64_t n_cow;          /* copy-on-write copies */
    int n_shifts;            /* context shifts */
    int n_shift_discarded;   /* positions they dropped */
} kv_cache_stats;

typedef struct kv_cache_params {
    int n_layer;
    int n_embd_kv;   /* n_head_kv * head_dim */
    int n_ctx;       /* positions one sequence may hold */
    int type;        /* GGML_TYPE_F32, GGML_TYPE_F16 or GGML_TYPE_Q8_0 (n_embd_kv % 32 == 0) */
    int n_blocks;    /* budget over all sequences and cached prefixes; 0: 2 * ceil(n_ctx / BS) */
    int reserve;     /* 1: allocate every block now (window parts still grow on demand); 0: grow
                        block by block */
    /* sliding-window layers; all zero / NULL: every layer keeps every position */
    const uint8_t *swa_layers; /* NULL or n_layer flags: 1 = a window layer */
    int n_swa;       /* their window: a query at p reads positions p - n_swa + 1 .. p */
    int swa_slack;   /* extra positions kept behind the window (rewinds: speculative drafts, beams'
                        last prompt token); 0: KV_SWA_SLACK; < 0: keep every position (as before) */
} kv_cache_params;

#define KV_SWA_SLACK 64

/* Create a cache. Errors: KV_ERR_INVALID (sizes), KV_ERR_UNSUPPORTED (type, or q8_0 with
 * n_embd_kv not a multiple of 32), KV_ERR_NOMEM. */
kv_cache *kv_cache_create_ex(const kv_cache_params *p, kv_error *err);
/* Shorthand for one sequence, like a contiguous cache: a budget of ceil(n_ctx / BS) blocks,
 * all reserved up front (forks and cached prefixes then compete for those blocks). */
kv_cache *kv_cache_create(int n_layer, int n_embd_kv, int n_ctx, int type, kv_error *err);
void kv_cache_free(kv_cache *c);

int kv_cache_n_ctx(const kv_cache *c);
int kv_cache_type(const kv_cache *c);
void kv_cache_get_stats(const kv_cache *c, kv_cache_stats *st);
/* Record the prefix reuse of a request on seq (for the stats) and make seq the active one. */
void kv_cache_note_request(kv_cache *c, int seq, int n_prompt, int n_reused, int n_reused_hash, int n_prefilled);
/* Drop every cached (unreferenced) prefix block: a cold start for benchmarks and tests. */
void kv_cache_drop_cached(kv_cache *c);
/* Room on demand for sequences the caller keeps only while memory allows (e.g. a server's
 * finished requests kept whole for the next requests' prefixes): when a write (kv_seq_reserve,
 * kv_seq_shift) needs more blocks than the budget has beside the referenced ones (free, not yet
 * allocated, or cached — cached ones are still evicted first), fn(ud) is called until there is
 * room. fn releases one sequence other than the one being written (kv_seq_free) and returns
 * nonzero, or returns 0 when it has nothing left to give back (the write then fails as it would
 * without fn: KV_ERR_CONTEXT). Called on the cache's thread. fn NULL: none (the default). */
typedef int (*kv_reclaim_fn)(void *ud);
void kv_cache_set_reclaim(kv_cache *c, kv_reclaim_fn fn, void *ud);

/* ---- the default sequence (compatibility with the single-sequence cache) ---- */
int kv_cache_n_tokens(const kv_cache *c);   /* = kv_seq_n_tokens(c, KV_SEQ_DEFAULT) */
void kv_cache_truncate(kv_cache *c, int n); /* = kv_seq_truncate(c, KV_SEQ_DEFAULT, n) */

/* ---- sequences ---- */
/* New empty sequence; *seq = its id. KV_ERR_NOMEM. */
int kv_seq_new(kv_cache *c, int *seq, kv_error *err);
/* New sequence sharing the first n positions of src (n < 0 or > its length: all of them;
 * fewer when the window layers no longer hold the window of n, as kv_seq_truncate):
 * refcounts only, no copy, no computation. KV_ERR_INVALID (src), KV_ERR_NOMEM. */
int kv_seq_fork(kv_cache *c, int src, int n, int *seq, kv_error *err);
/* Release a sequence's blocks (hashed ones stay cached for reuse) and its id. The default
 * sequence is emptied instead. KV_ERR_INVALID for an unknown id. */
int kv_seq_free(kv_cache *c, int seq);
int kv_seq_valid(const kv_cache *c, int seq);
int kv_seq_n_tokens(const kv_cache *c, int seq);          /* 0 for an unknown id */
/* Positions [0, n_clean) hold what a fresh prefill of their tokens would (n_tokens until a
 * context shift, then the kept prefix): only they are hashed and shared as prefixes. */
int kv_seq_n_clean(const kv_cache *c, int seq);
/* The tokens whose K/V the sequence holds, in position order (kv_seq_n_tokens of them);
 * valid until the sequence changes. NULL for an unknown id. */
const int32_t *kv_seq_tokens(const kv_cache *c, int seq);
/* Forget positions >= n (n < n_tokens); the next write continues at n — or, with window
 * layers, at the largest m <= n whose window they still hold (see the top of this file): read
 * kv_seq_n_tokens afterwards. */
void kv_seq_truncate(kv_cache *c, int seq, int n);
/* 1 when the window layers of seq still hold the window of its first n positions (always 1
 * without window layers): what kv_seq_save_range(.., n) and a truncation to n need. */
int kv_seq_window_ok(const kv_cache *c, int seq, int n);
/* Prefix reuse across sequences: seq must hold exactly tokens[0..n_tokens). While seq's
 * length is at a block boundary or inside a block, look up the chained hash of the next full
 * block of `tokens` (only blocks ending at or before n_max) and, when a block with that hash,
 * parent and tokens is in the table, take it (refcount + 1) instead of computing it. Returns
 * the number of positions added (0 when nothing matched or seq is not clean); *n_blocks gets
 * the blocks adopted (may be NULL). */
int kv_seq_adopt(kv_cache *c, int seq, const int32_t *tokens, int n_max, int *n_blocks);

/* ---- the forward pass ---- */
/* Make positions [n_tokens, n_tokens + n) of seq writable: allocate blocks (free list, then
 * new memory within the budget, then the least recently used cached block) and copy shared or
 * hashed partial blocks (copy-on-write). KV_ERR_CONTEXT when n_tokens + n > n_ctx or every
 * block of the budget is referenced (the message says which). */
int kv_seq_reserve(kv_cache *c, int seq, int n, kv_error *err);
/* Store the f32 K and V rows (n_embd_kv floats each) of one reserved position of one layer,
 * converted to the cache type. */
void kv_cache_store(kv_cache *c, int seq, int layer, int pos, const float *k, const float *v);
/* Mark the n reserved positions filled with tokens[0..n) and hash blocks that became full
 * (when the sequence is clean); seq becomes the active sequence. */
void kv_seq_commit(kv_cache *c, int seq, const int32_t *tokens, int n);
/* f32 view of K or V rows [0, n) of a layer of seq: [n][n_embd_kv] in tmp (n * n_embd_kv
 * floats), gathered block by block; returns tmp. */
const float *kv_cache_k(const kv_cache *c, int seq, int layer, int n, float *tmp);
/* Where the K (kind 0) or V (kind 1) rows [0, n) of a layer of seq are stored, without a copy:
 * out[b] (b < ceil(n / KV_BLOCK_SIZE)) is block b's first row; rows are kv_cache_row_bytes apart
 * inside a block, in the cache type. Valid until the sequence changes. */
void kv_cache_blocks(const kv_cache *c, int seq, int layer, int kind, int n, const uint8_t **out);
size_t kv_cache_row_bytes(const kv_cache *c);
const float *kv_cache_v(const kv_cache *c, int seq, int layer, int n, float *tmp);
/* The same for rows [a, n) only (a sliding-window layer reads no older row): rows from the
 * block holding a on are gathered at their usual place in tmp; earlier rows of tmp are left as
 * they were (stale: do not read them). */
const float *kv_cache_k_from(const kv_cache *c, int seq, int layer, int a, int n, float *tmp);
const float *kv_cache_v_from(const kv_cache *c, int seq, int layer, int a, int n, float *tmp);

/* ---- context shift ---- */
/* RoPE of the model, for re-rotating kept keys (see op_rope_shift). */
typedef struct kv_rope {
    int n_head_kv, head_dim, n_rot, neox;
    float freq_base;
    const float *freq_factors; /* n_rot/2 or NULL */
} kv_rope;
/* StreamingLLM-style shift (Xiao et al. 2023, "Efficient Streaming Language Models with
 * Attention Sinks"; as llama.cpp's context shift): keep positions [0, n_keep), drop
 * [n_keep, n_keep + n_discard), move the rest down by n_discard and rotate their keys by
 * -n_discard so they are valid at their new positions. Written blocks are copied first when
 * shared or hashed; the sequence is clean only up to n_keep afterwards. Window layers move only
 * the rows of the new window. KV_ERR_INVALID for a bad range, KV_ERR_CONTEXT when no block is
 * free for a copy, or when the new window would reach kept positions [0, n_keep) whose
 * window-layer rows were already freed (drop less: keep the tail at least swa_keep long); the
 * sequence is unchanged then. */
int kv_seq_shift(kv_cache *c, int seq, int n_keep, int n_discard, const kv_rope *rope, kv_error *err);

/* ---- hashing (the key of the SQLite prefix store) ---- */
/* Hash of one block: 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3)
 * over the parent hash as 8 little-endian bytes followed by the n tokens as 4 little-endian
 * bytes each, then murmur3's fmix64 finalizer. The first block's parent is KV_HASH_ROOT.
 * Depends only on the tokens: the same for every KV type and model (key blobs by the model
 * fingerprint too). */
uint64_t kv_hash_block(uint64_t parent, const int32_t *tokens, int n);
/* Chained hash of the floor(n / KV_BLOCK_SIZE) full blocks of tokens[0..n): the hash of the
 * last full block, KV_HASH_ROOT when n < KV_BLOCK_SIZE. Equals the hash the cache gives the
 * block covering positions up to floor(n / BS) * BS of a clean sequence holding these tokens. */
uint64_t kv_prefix_hash(const int32_t *tokens, int n);
/* Every chained block hash of tokens[0..n): out[i] = hash of block i (covering tokens
 * [0, (i+1) * KV_BLOCK_SIZE)), for i < floor(n / KV_BLOCK_SIZE); returns that count. out needs
 * room for n / KV_BLOCK_SIZE values (the SQLite prefix store's block_hashes). */
int kv_block_hashes(const int32_t *tokens, int n, uint64_t *out);
/* Checksum of a byte string: FNV-1a over 64-bit little-endian words (then the tail bytes and
 * the length), finalized with fmix64. Detects any single changed word with certainty. */
uint64_t kv_checksum64(const void *data, size_t n);

/* ---- serialization ---- */
/* Serialize positions [a, n) of seq (n < 0 or past its end: all; a = 0: the whole prefix)
 * into a malloc'd blob (*len bytes). A blob with a > 0 is a "delta": it holds only its own
 * positions and restores on top of a sequence that already holds the first a tokens (its
 * "base", e.g. a system prompt shared by many chats, saved once as a blob of [0, a)). Format
 * version 2, little-endian, owned by the engine:
 *   0  char[4] "KVSQ"          4  u32 version = 2       8  u64 model fingerprint (caller's)
 *   16 u32 ggml type           20 u32 n_layer           24 u32 n_embd_kv
 *   28 u32 block size          32 u32 n_tokens (the end position n: the sequence's length
 *                                  after a restore)      36 u32 n_clean (of [0, n))
 *   40 u64 prefix hash (kv_prefix_hash of the clean full blocks of tokens [0, n_clean))
 *   48 u32 n_base = a          52 u32 0 (reserved)
 *   56 u64 base hash (kv_prefix_hash of tokens [0, a); KV_HASH_ROOT when a = 0)
 *   64 i32 tokens[n - a] (positions a .. n-1)
 *      per layer: K rows [n - a][row bytes], then V rows [n - a][row bytes]
 *   end-8 u64 kv_checksum64 of every byte before it
 * A cache with window layers writes version 3: after field 56,
 *   64 u32 number of window layers   68 u32 swa_lo (first position whose window-layer rows the
 *                                       blob holds: max(a, window start of n rounded down to a
 *                                       block))
 *   72 i32 tokens[n - a], then per layer K then V rows: first the full layers in layer order,
 *      rows [a, n), then the window layers in layer order, rows [swa_lo, n); then the checksum.
 * Version 1 blobs (no fields 48..63, tokens from offset 48, always a = 0) and version 2 blobs
 * (every row) still restore; a window cache keeps only the rows its window needs.
 * Errors: KV_ERR_INVALID (seq; a not a multiple of KV_BLOCK_SIZE within [0, n]; a past the
 * clean part — after a context shift the first a positions are no base; the window of n already
 * freed, see kv_seq_window_ok), KV_ERR_NOMEM. */
int kv_seq_save_range(const kv_cache *c, int seq, int a, int n, uint64_t fingerprint, void **blob, size_t *len,
                      kv_error *err);
/* kv_seq_save_range from 0: a whole blob of positions [0, n). */
int kv_seq_save(const kv_cache *c, int seq, int n, uint64_t fingerprint, void **blob, size_t *len, kv_error *err);
/* Make seq hold what the blob describes. A whole blob (base 0) replaces seq's contents; a delta
 * over a base of a positions requires seq to hold at least a tokens, clean, whose chained
 * prefix hash equals the blob's base hash (else KV_ERR_INVALID "restore its base first"):
 * seq is truncated to a and the blob's positions appended (the base blocks stay shared as they
 * were; the new ones are fresh blocks). Everything is checked before the sequence is touched:
 * size, magic, version, checksum, header consistency, the tokens' prefix hash (KV_ERR_FORMAT
 * "corrupt"), type, shape, block size and fingerprint equal to this cache's / the caller's
 * (KV_ERR_UNSUPPORTED), n_tokens <= n_ctx and free blocks (KV_ERR_CONTEXT), token ids in
 * [0, n_vocab) (KV_ERR_FORMAT); on any error seq is unchanged. Rows are copied bytewise, so the
 * restored sequence computes bitwise the same logits as the saved one. */
int kv_seq_restore(kv_cache *c, int seq, const void *blob, size_t len, uint64_t fingerprint, int n_vocab,
                   kv_error *err);
/* Read the header of a blob without restoring it (checks size, magic, version, checksum,
 * header consistency): its end position n_tokens, prefix hash, base length (0: a whole blob)
 * and base hash. Any out-pointer may be NULL. */
int kv_blob_info(const void *blob, size_t len, int *n_tokens, uint64_t *prefix_hash, int *n_base, uint64_t *base_hash,
                 kv_error *err);
/* The same K/V as a delta over its first n_base positions: a new malloc'd blob holding only
 * positions [n_base, n) (base hash chained from the dropped tokens), byte-identical rows; no
 * cache needed. n_base must be a multiple of KV_BLOCK_SIZE, at least the blob's own base and
 * within its clean part (KV_ERR_INVALID); a damaged blob is KV_ERR_FORMAT, an unknown type or
 * shape KV_ERR_UNSUPPORTED, KV_ERR_NOMEM. */
int kv_blob_rebase(const void *blob, size_t len, int n_base, void **out, size_t *out_len, kv_error *err);

/* ---- invariants (tests) ---- */
/* Recount every block from the sequences' tables and compare with the counters and lists;
 * KV_OK or KV_ERR_INVALID with the first inconsistency in err. O(n_blocks + positions). */
int kv_cache_check(const kv_cache *c, kv_error *err);
/* Reference count of the block holding position pos of seq (-1 if none); for tests. */
int kv_seq_block_ref(const kv_cache *c, int seq, int pos);

#endif
