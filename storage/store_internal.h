/* store_internal: what the files of storage/ share — the store handle, error mapping, transactions and statement helpers. Not for use outside storage/. */
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
/* Step a statement that returns no rows (or whose rows are ignored). */
int st_step_done(store *s, sqlite3_stmt *st, const char *what, store_error *err);
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
