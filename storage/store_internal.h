/* store_internal: what the files of storage/ share — the store handle, error mapping, transactions and statement helpers, stored tokens, the chunk checksum. Not for use outside storage/. */
#ifndef STORAGE_STORE_INTERNAL_H
#define STORAGE_STORE_INTERNAL_H

#include <sqlite3.h>

#include "store.h"

struct store {
    sqlite3 *db;
    char *path;
    int readonly;
    int kv_delay_ms;     /* test knob: sleep after each KV chunk */
    size_t kv_chunk;     /* bytes per KV chunk */
};

/* Fill err with "<path>: <message>" and return code. */
int st_set(store *s, store_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* An SQLite failure rc while doing `what`: maps rc to a store_status and returns it; the
 * message is "<path>: <what>: <sqlite message>". */
int st_fail(store *s, store_error *err, int rc, const char *what);
int st_prepare(store *s, const char *sql, sqlite3_stmt **st, store_error *err);
int st_exec(store *s, const char *sql, store_error *err);
/* BEGIN IMMEDIATE (the write lock up front, so a busy database waits in the busy handler
 * instead of failing at the first write), retried a few times past the busy timeout. */
int st_begin(store *s, store_error *err);
int st_commit(store *s, store_error *err);
void st_rollback(store *s);
/* End the write transaction st_begin began: commit when rc is STORE_OK, roll back when it is not
 * or the commit fails; returns rc, or the commit's failure. */
int st_end(store *s, int rc, store_error *err);
/* Step a statement that returns no rows (or whose rows are ignored). */
int st_step_done(store *s, sqlite3_stmt *st, const char *what, store_error *err);
/* Prepare sql, bind ?1 to id, step it to the end (`what` names it in a failure), finalize. */
int st_run_id(store *s, const char *sql, int64_t id, const char *what, store_error *err);
/* Tokens as stored (a key, a conversation's context): 4 little-endian bytes each. A malloc'd
 * copy of t[0..n) in that form (n * 4 bytes, at least 1 allocated); NULL when out of memory. */
uint8_t *st_tokens_encode(const int32_t *t, size_t n);
/* The token whose 4 stored bytes start at p. */
static inline int32_t st_token_at(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}
/* 64-bit checksum of bytes (FNV-1a over 64-bit little-endian words, then the tail bytes and
 * the length, finalized with a murmur3 mix): storage's own, for KV chunks. Incremental. */
typedef struct st_sum {
    uint64_t h;
    uint64_t n;
    uint8_t tail[8];
    int n_tail;
} st_sum;
void st_sum_init(st_sum *c);
void st_sum_add(st_sum *c, const void *data, size_t n);
uint64_t st_sum_final(const st_sum *c);

#endif
