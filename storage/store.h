/* store: kvchat's SQLite database — schema and forward-only migrations, models, conversations and messages (branches, generation records), full-text search, and the KV prefix store. */
#ifndef STORAGE_STORE_H
#define STORAGE_STORE_H

#include <stddef.h>
#include <stdint.h>

/*
 * One database file (DESIGN.md: "storage knows nothing of ours" — it stores rows and bytes;
 * the KV blobs are opaque, their format belongs to the engine). Every connection runs in WAL
 * mode with foreign keys on and a busy timeout; every write is one short IMMEDIATE
 * transaction, so several kvchat processes can write the same file at once.
 *
 * Schema (version STORE_SCHEMA_VERSION, in PRAGMA user_version; application_id 'kvch'):
 *   models         fingerprint (unique), path, name, architecture, weight type, file size
 *   conversations  title, model, system prompt, sampling parameters, created / updated, head
 *                  (the message the chat shows last: the tip of the current branch) and the
 *                  token context of that head (the exact tokens the model saw, for resuming)
 *   messages       conversation, parent (branches: siblings share a parent), role, content,
 *                  token count, time; replies are partial = 1 when stopped, and name the model
 *                  that wrote them (model_id; NULL: unknown — an import)
 *   generations    one per reply: parameters and seed used (seed: the u64 as decimal TEXT), TTFT, prefill / decode tokens/s,
 *                  token counts, finish reason
 *   messages_fts   FTS5 index over messages.content (external content, kept by triggers)
 *   kv_prefixes    a KV blob: model, KV type, its token prefix (n_tokens int32 keys), the
 *                  caller's chained block hashes (kv_blocks) and whole-key hash, size,
 *                  storage checksum, state (0 being written, 1 complete), last use, hits
 *                  and base_id: NULL for a whole blob, else the shared row whose tokens are a
 *                  whole-block prefix of this key and which (with its own bases) holds those
 *                  positions — this blob is then a "delta" holding only the rest (a system prompt shared by many
 *                  chats is stored once). ON DELETE CASCADE: dropping or evicting a base drops
 *                  its deltas, so a delta is never left without the base it needs.
 *   kv_chunks      the blob in chunks of at most 1 MiB, written and read with SQLite's
 *                  incremental blob I/O (zeroblob + sqlite3_blob_write / sqlite3_blob_read)
 * A KV prefix becomes visible only when its last chunk is written and its checksum recorded
 * (state 1, in the transaction that indexes it), so a write cut short — by kill -9, a full
 * disk, a crash — is never used; its rows are removed by store_kv_cleanup.
 *
 * Errors: every function returns STORE_OK or a store_status and fills store_error (may be
 * NULL) with a message that starts with the database path and names the row at fault, e.g.
 * "/home/u/.local/share/kvchat/kvchat.db: message 57 (conversation 3): content is not text".
 * A store handle is used by one thread at a time; use one handle per thread.
 */

#define STORE_SCHEMA_VERSION 4  /* 1: the first schema; 2: kv_prefixes.base_id (deltas); 3: seeds as
                                   unsigned decimal TEXT (INTEGER is signed: seeds >= 2^63 read negative);
                                   4: messages.model_id (the model that wrote a reply) */
#define STORE_APPLICATION_ID 0x6b766368 /* "kvch" */
#define STORE_KV_CHUNK_DEFAULT (1u << 20)

enum store_status {
    STORE_OK = 0,
    STORE_ERR_IO,        /* cannot open / create / read / write the file */
    STORE_ERR_NEWER,     /* written by a newer kvchat (schema version above ours): left untouched */
    STORE_ERR_FOREIGN,   /* an SQLite database that is not kvchat's, or not a database at all */
    STORE_ERR_CORRUPT,   /* a damaged row or page (the message names it) */
    STORE_ERR_BUSY,      /* still locked by another process after the busy timeout and retries */
    STORE_ERR_NOTFOUND,  /* no such conversation / message / prefix */
    STORE_ERR_INVALID,   /* a bad argument */
    STORE_ERR_NOMEM,
    STORE_ERR_READONLY,  /* the file or its directory is not writable */
    STORE_ERR_FULL,      /* the disk is full */
};

typedef struct store_error {
    int code;       /* enum store_status */
    char msg[600];
} store_error;

typedef struct store store;

enum store_open_flags {
    STORE_OPEN_READONLY = 1,    /* never write (CLI reads); a missing file is STORE_ERR_IO */
    STORE_OPEN_NO_CREATE = 2,   /* a missing file is STORE_ERR_NOTFOUND instead of a new database */
    STORE_OPEN_SYNC_NORMAL = 4, /* PRAGMA synchronous = NORMAL (a cache connection); default FULL:
                                   a committed message survives a power cut too */
};

/* Open (creating it and its schema when absent) the database at path and migrate it forward to
 * STORE_SCHEMA_VERSION. Creation and all migrations are one write transaction that other
 * openers wait for (busy timeout; the switch to WAL retries as long), the header checked again
 * once the lock is held, so any number of processes may open a new file at once. Nothing is
 * written before the checks: a newer schema → STORE_ERR_NEWER ("written by a newer kvchat (schema N, this one
 * knows up to M); left untouched"), another application's database or a file that is not
 * SQLite → STORE_ERR_FOREIGN, an unwritable file or directory → STORE_ERR_READONLY / _IO.
 * The parent directory must exist. */
int store_open(const char *path, int flags, store **out, store_error *err);
void store_close(store *s); /* NULL is a no-op */
const char *store_path(const store *s);
/* Milliseconds since the Unix epoch (the unit of every time column). */
int64_t store_now_ms(void);
/* Sleep this many ms after each KV chunk write (a test knob for kill-during-write tests). */
void store_set_kv_write_delay(store *s, int ms);
/* Chunk size of new KV blobs (tests use small ones); 0 restores the default. */
void store_set_kv_chunk_size(store *s, size_t bytes);

/* ---- models ---------------------------------------------------------------------------- */
typedef struct store_model {
    int64_t id;
    char *fingerprint, *path, *name, *arch, *weight_type; /* malloc'd (store_model_clear) */
    int64_t file_size;
} store_model;

/* Insert or update (by fingerprint) a model; *id its row. Errors: INVALID (no fingerprint). */
int store_model_register(store *s, const char *fingerprint, const char *path, const char *name, const char *arch,
                         const char *weight_type, int64_t file_size, int64_t *id, store_error *err);
int store_model_get(store *s, int64_t id, store_model *out, store_error *err); /* NOTFOUND */
void store_model_clear(store_model *m);

/* ---- conversations --------------------------------------------------------------------- */
/* Sampling parameters as numbers (set = 0: none recorded). seed_set = 0: a random seed. */
typedef struct store_params {
    int set;
    double temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int top_k, repeat_last_n, max_tokens;
    int seed_set;
    uint64_t seed;
} store_params;

typedef struct store_conv {
    int64_t id;
    char *title;                 /* "" until the first user message names it */
    int64_t model_id;            /* 0: unknown */
    char *model_name, *model_fingerprint, *model_path; /* of model_id ("" if none) */
    char *system_prompt;         /* NULL: none */
    store_params params;
    int64_t created_at, updated_at;
    int64_t head_id;             /* 0: no messages */
    int n_messages, n_branches;  /* branches = messages without replies (leaves) */
    /* the exact tokens of the conversation up to ctx_head_id, for model ctx_model_id
     * (store_conv_get only; NULL when none were recorded) */
    int64_t ctx_model_id, ctx_head_id;
    int32_t *ctx_tokens;
    size_t n_ctx_tokens;
    /* store_conv_list with a query: the newest matching message's text around the match, the
     * matched words between STORE_HL_ON and STORE_HL_OFF bytes, "…" where it is cut (FTS5
     * snippet()); NULL when only the title matched */
    char *snippet;
} store_conv;
#define STORE_HL_ON '\x02'
#define STORE_HL_OFF '\x03'

void store_conv_clear(store_conv *c);

/* New empty conversation; created_at 0 = now. */
int store_conv_create(store *s, int64_t model_id, const char *system_prompt, const store_params *p,
                      int64_t created_at, int64_t *id, store_error *err);
/* One conversation with its counts and token context. NOTFOUND. */
int store_conv_get(store *s, int64_t id, store_conv *out, store_error *err);
/* The most recently updated conversation. NOTFOUND when there is none. */
int store_conv_last(store *s, int64_t *id, store_error *err);
/* Conversations, most recently updated first; query NULL or "": all, else those whose title
 * contains it or with a message matching it (FTS5; every word a prefix, all words needed).
 * *rows malloc'd (store_conv_list_free); no token contexts. */
int store_conv_list(store *s, const char *query, store_conv **rows, size_t *n, store_error *err);
void store_conv_list_free(store_conv *rows, size_t n);
int store_conv_rename(store *s, int64_t id, const char *title, store_error *err);
/* Delete a conversation and all its messages. NOTFOUND. */
int store_conv_delete(store *s, int64_t id, store_error *err);
int store_conv_set_system(store *s, int64_t id, const char *system_prompt, store_error *err);
int store_conv_set_params(store *s, int64_t id, const store_params *p, store_error *err);
/* The model the conversation goes on with (after /model); --resume without -m opens it. */
int store_conv_set_model(store *s, int64_t id, int64_t model_id, store_error *err);
/* Move the head (e.g. /undo: back to an earlier message; 0: before the first). */
int store_conv_set_head(store *s, int64_t id, int64_t head_id, store_error *err);
/* Record the conversation's exact tokens at head_id for model_id (replaces the previous). */
int store_conv_set_context(store *s, int64_t id, int64_t model_id, int64_t head_id, const int32_t *tokens,
                           size_t n, store_error *err);

/* ---- messages -------------------------------------------------------------------------- */
enum store_role { STORE_ROLE_SYSTEM = 0, STORE_ROLE_USER, STORE_ROLE_ASSISTANT };
enum store_finish {
    STORE_FINISH_NONE = 0, STORE_FINISH_EOG, STORE_FINISH_LENGTH, STORE_FINISH_CONTEXT, STORE_FINISH_STOPPED,
    STORE_FINISH_ERROR,
    STORE_FINISH_STOP,  /* a stop string appeared */
};
const char *store_role_name(int role);      /* "system" "user" "assistant" */
const char *store_finish_name(int finish);  /* "" "eog" "length" "context" "stopped" "error" "stop" */
int store_role_from_name(const char *s);    /* -1 if unknown */
int store_finish_from_name(const char *s);  /* -1 if unknown */

/* The generation record of a reply. */
typedef struct store_gen {
    int set;
    store_params params;        /* parameters used; params.seed = the seed actually used */
    int finish;                 /* enum store_finish */
    double ttft_ms, prefill_tps, decode_tps;
    int n_prompt, n_reused, n_prefilled, n_generated;
    int64_t model_id;           /* writing: the model that wrote the reply (messages.model_id; 0:
                                   unknown); reading gives it in store_msg.model_id */
} store_gen;

typedef struct store_msg {
    int64_t id, parent_id;      /* parent_id 0: the first message */
    int role;                   /* enum store_role */
    char *content;              /* malloc'd, NUL-terminated; len bytes (may hold NULs) */
    size_t len;
    int n_tokens;               /* tokens the message added to the context (0: unknown) */
    int64_t created_at;
    int partial;                /* a reply that was stopped or failed before its end */
    int64_t model_id;           /* the model that wrote it (0: unknown, or not a reply) */
    store_gen gen;
    char problem[200];          /* "" or why the stored row is unreadable (content is "" then) */
} store_msg;

/* Append a message under parent_id (0: first) and make it the conversation's head, in one
 * transaction; the first user message names an untitled conversation. gen may be NULL.
 * created_at 0 = now. Errors: NOTFOUND (conversation), INVALID (parent of another
 * conversation, role). */
int store_msg_add(store *s, int64_t conv_id, int64_t parent_id, int role, const char *content, size_t len,
                  int n_tokens, int64_t created_at, const store_gen *gen, int64_t *id, store_error *err);
/* Replace a message's content, token count, partial flag and (gen != NULL) generation record
 * (a continued reply). NOTFOUND. */
int store_msg_update(store *s, int64_t id, const char *content, size_t len, int n_tokens, const store_gen *gen,
                     store_error *err);
int store_msg_set_tokens(store *s, int64_t id, int n_tokens, store_error *err);
/* The messages from the first one to head_id following parents (head_id 0: none). A row with
 * an unreadable field comes back with problem set (naming the row) rather than failing the
 * whole path; a broken parent chain (a cycle, a parent in another conversation) is
 * STORE_ERR_CORRUPT naming the message. */
int store_conv_path(store *s, int64_t conv_id, int64_t head_id, store_msg **msgs, size_t *n, store_error *err);
/* The same, but a broken chain does not fail: the path is the part that is whole, from the
 * head back to the message whose parent is missing or already on the path (a loop) — that
 * message's id in *cut (0: the path is whole, back to a first message). For the chat, which
 * shows what it can of a damaged conversation. */
int store_conv_path_cut(store *s, int64_t conv_id, int64_t head_id, store_msg **msgs, size_t *n, int64_t *cut,
                        store_error *err);
/* Every message of a conversation in id order (parents before children). */
int store_conv_messages(store *s, int64_t conv_id, store_msg **msgs, size_t *n, store_error *err);
void store_msgs_free(store_msg *msgs, size_t n);

/* Insert a whole conversation in one transaction (kvchat import): c's title, system prompt,
 * params and times; msgs[i] with parent index parent_index[i] (< i, or -1); head_index the
 * head (-1: none); the model by fingerprint (registered if new; NULL fingerprint: none).
 * *id the new conversation. INVALID for a parent index out of order. */
int store_conv_import(store *s, const store_conv *c, const char *model_fingerprint, const char *model_name,
                      const char *model_path, const char *model_arch, const char *model_weight_type,
                      const store_msg *msgs, const long *parent_index, size_t n, long head_index, int64_t *id,
                      store_error *err);

/* ---- KV prefix store ------------------------------------------------------------------- */
/* A key: the tokens of a prefix (n_tokens int32 values, stored to compare keys exactly), the
 * caller's chained hash of each full block of block_size tokens (block_hashes[i] covers tokens
 * [0, (i+1) * block_size); n_blocks = n_tokens / block_size) and of the whole key (for a key of
 * whole blocks it must be block_hashes[n_blocks - 1]). */
typedef struct store_kv_key {
    int64_t model_id;
    const char *kv_type;
    const int32_t *tokens;
    size_t n_tokens;
    int block_size;
    const uint64_t *block_hashes;
    size_t n_blocks;
    uint64_t key_hash;
} store_kv_key;

enum store_kv_kind { STORE_KV_SNAPSHOT = 0, STORE_KV_SHARED = 1 };

typedef struct store_kv_hit {
    int64_t id;
    size_t n_tokens;     /* the stored prefix's length */
    size_t n_common;     /* how many leading tokens it shares with the query */
    size_t size;         /* blob bytes (of this row alone) */
    int kind;
    int64_t base_id;     /* 0: a whole blob; else a delta over this row (store_kv_chain lists
                            every blob to read, base first) */
    size_t n_base;       /* the base's length (0 when none) */
} store_kv_hit;

/* The complete prefix (same model and KV type) sharing the most leading tokens with q — found
 * through the block hashes, confirmed by comparing tokens; ties go to the shorter prefix.
 * NOTFOUND when none shares a full block. */
int store_kv_find(store *s, const store_kv_key *q, store_kv_hit *hit, store_error *err);
/* Read prefix id's blob (malloc'd, *len bytes) chunk by chunk with sqlite3_blob_read, check
 * its size and checksum, and record the use (last_used, hits; its bases' last_used too). CORRUPT
 * names the row and chunk (a changed byte, a short or missing chunk); NOTFOUND if it was
 * evicted meanwhile. A delta's blob alone restores nothing: read its chain. */
int store_kv_read(store *s, int64_t id, void **blob, size_t *len, store_error *err);

/* One blob of a chain: row id holds positions [n_base, n_tokens) of the prefix. */
typedef struct store_kv_link {
    int64_t id;
    size_t n_tokens, n_base, size;
} store_kv_link;
#define STORE_KV_MAX_CHAIN 16
/* The blobs that make up prefix id, root first: links[0] is a whole blob ([0, n_tokens)), each
 * next one a delta over the one before, the last is id itself (*n = 1 for a whole blob). cap
 * links fit (STORE_KV_MAX_CHAIN). NOTFOUND when a row of it is gone or still being written,
 * CORRUPT for a chain deeper than cap (or a loop) or a base not shorter than its delta. */
int store_kv_chain(store *s, int64_t id, store_kv_link *links, int cap, int *n, store_error *err);

typedef struct store_kv_put_result {
    int64_t id;            /* the row (new or already there) */
    int stored;            /* 1 written now, 0 already there (touched) or skipped */
    int skipped;           /* larger than the budget: not stored */
    int n_superseded;      /* snapshot rows that were prefixes of this key and were dropped */
    int n_evicted;         /* rows evicted (least recently used first) to stay in budget */
    size_t shared_len;     /* > 0: another stored prefix shares this many leading tokens (whole
                              blocks) and no prefix of exactly those tokens is stored yet: the
                              caller may store it as STORE_KV_SHARED */
} store_kv_put_result;

/* Store blob under key k unless an equal key is complete already (then only touch it; asked
 * for STORE_KV_SHARED, it becomes shared). The blob goes in chunks, one short transaction each,
 * through zeroblob + sqlite3_blob_write; the last transaction records the checksum, indexes the
 * block hashes and makes the row visible. Then snapshot rows whose keys are strict prefixes of k
 * are dropped (k supersedes them; shared ones stay), shared rows that are prefixes of k are
 * touched, and the least recently used rows are evicted until all blobs fit in budget bytes
 * (0: no limit). A blob larger than the budget is not stored (skipped). */
int store_kv_put(store *s, const store_kv_key *k, int kind, const void *blob, size_t len, uint64_t budget,
                 store_kv_put_result *res, store_error *err);
/* store_kv_put of a delta: blob holds only the positions after base_id's (0: a whole blob, =
 * store_kv_put). base_id must be a complete STORE_KV_SHARED row of the same model and KV type
 * whose key is a whole-block strict prefix of k (INVALID otherwise; NOTFOUND when it is gone —
 * also when it is evicted while this one is written). The base (and its bases) is touched,
 * never evicted to make room for this blob, and counts against the budget: skipped when blob +
 * its chain exceed it. */
int store_kv_put_delta(store *s, const store_kv_key *k, int kind, int64_t base_id, const void *blob, size_t len,
                       uint64_t budget, store_kv_put_result *res, store_error *err);

/* How to store key k so that shared positions are stored once (call before store_kv_put_delta):
 *   base_id, n_base  the longest complete STORE_KV_SHARED row whose key is a whole-block strict
 *                    prefix of k (0, 0: none) — store k as a delta over it;
 *   shared_len       > n_base: k shares this many leading tokens (whole blocks, < n_tokens) with
 *                    a stored prefix it diverges from, and no row holds exactly them: store
 *                    [0, shared_len) first as STORE_KV_SHARED (a delta over base_id), then k as
 *                    a delta over that; else 0.
 * A snapshot row holding exactly the shared tokens is made STORE_KV_SHARED and returned as the
 * base instead. */
typedef struct store_kv_plan_result {
    int64_t base_id;
    size_t n_base;
    size_t shared_len;
} store_kv_plan_result;
int store_kv_plan(store *s, const store_kv_key *k, store_kv_plan_result *plan, store_error *err);

/* The caller's blob transform for store_kv_rebase: the same K/V as a delta over its first n_base
 * positions (a new malloc'd blob in *out); 0 on success. */
typedef int (*store_kv_transform)(void *ud, const void *blob, size_t len, size_t n_base, void **out, size_t *out_len);
/* After a new shared row base_id: re-store (at most max_rows, most recently used first) the
 * complete prefixes that start with its tokens, are longer, and do not already rest on a base at
 * least as long — as deltas over base_id, through fn (the blob format is the caller's). Each is
 * replaced atomically (same key, use record and deltas of its own); one that cannot be read or
 * transformed, or goes away meanwhile, stays as it was. *n_rebased counts the replaced rows. */
int store_kv_rebase(store *s, int64_t base_id, int max_rows, store_kv_transform fn, void *ud, int *n_rebased,
                    store_error *err);
/* 1 if a complete prefix with exactly this key is stored, else 0 (errors count as 0). */
int store_kv_has(store *s, const store_kv_key *k);
/* Drop a prefix; the deltas resting on it go with it (a delta dropped leaves its base). */
int store_kv_drop(store *s, int64_t id, store_error *err);
/* Evict least recently used prefixes until all fit in budget bytes (a base with its deltas). */
int store_kv_evict(store *s, uint64_t budget, int *n_evicted, store_error *err);
/* Remove prefixes left half-written by a writer that is gone (its process no longer runs, or
 * it started more than an hour ago). */
int store_kv_cleanup(store *s, int *n_removed, store_error *err);

typedef struct store_kv_stats {
    uint64_t bytes;        /* blobs of complete prefixes (each blob once: a delta's bytes are its own) */
    int n_prefixes, n_shared, n_writing;
    int n_delta;           /* prefixes stored as deltas over a shared one */
    uint64_t bytes_delta;  /* their blobs */
    uint64_t hits;         /* reads over the store's lifetime */
    int n_models;          /* models with prefixes */
} store_kv_stats;
int store_kv_stats_get(store *s, store_kv_stats *st, store_error *err);

/* ---- checks ---------------------------------------------------------------------------- */
/* PRAGMA integrity_check and foreign_key_check, the FTS5 index, every message row's fields,
 * parent links (a loop of parents, a parent in another conversation), and every complete KV
 * prefix's chunks and checksum. (Token ids in conversations.ctx_tokens need the model's
 * vocabulary: the app checks those.) *report (malloc'd) lists each problem on
 * its own line ("ok" when none); *n_problems counts them. */
int store_check(store *s, char **report, int *n_problems, store_error *err);

#endif
