/* kvstore: the KV prefix store — opaque blobs keyed by model, KV type and token prefix (block hash chain), written and read in chunks with SQLite's incremental blob I/O, found by the longest shared prefix, deduplicated, shared prefixes stored once with the rest as deltas over them (chains, planning, rebasing), evicted least recently used first (a base with its deltas). */
#include "store_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STALE_WRITE_MS (3600 * 1000LL) /* a half-written prefix older than this is abandoned */
#define MAX_CANDIDATES 32

static int key_check(store *s, const store_kv_key *k, store_error *err)
{
    if (!k || k->model_id <= 0 || !k->kv_type || !k->tokens || k->n_tokens == 0 || k->block_size <= 0 ||
        k->n_blocks != k->n_tokens / (size_t)k->block_size || (k->n_blocks && !k->block_hashes) ||
        k->n_tokens > (size_t)1 << 28)
        return st_set(s, err, STORE_ERR_INVALID, "KV prefix: invalid key");
    return STORE_OK;
}

/* Leading tokens a stored key (little-endian bytes) shares with q. */
static size_t common_prefix(const uint8_t *stored, size_t n_stored, const int32_t *q, size_t nq)
{
    size_t n = n_stored < nq ? n_stored : nq, i = 0;
    while (i < n && st_token_at(stored + 4 * i) == q[i]) i++;
    return i;
}

/* The ids of row ?1 and its bases, nearest first (a delta's base, that one's base …), as the
 * table `chain`; the depth bound keeps a damaged (cyclic) chain finite. */
#define MAX_CHAIN_S "64"
#define CHAIN_CTE                                                                                          \
    "WITH RECURSIVE chain(id, depth) AS (SELECT ?1, 0 UNION ALL SELECT p.base_id, c.depth + 1 FROM "    \
    "kv_prefixes p JOIN chain c ON p.id = c.id WHERE p.base_id IS NOT NULL AND c.depth < " MAX_CHAIN_S ") "

/* Record a use of a prefix (a read counts as a hit) and of every base under it: a delta is
 * never used more recently than its base, so the least recently used order evicts deltas
 * before the bases they need. Best effort: a busy database only costs the LRU order. */
static void touch(store *s, int64_t id, int hit)
{
    if (st_begin(s, NULL)) return;
    sqlite3_stmt *st;
    /* (a walk of primary-key updates: cheaper than one recursive statement, on every read) */
    if (!st_prepare(s, "UPDATE kv_prefixes SET last_used = ?2, hits = hits + ?3 WHERE id = ?1 RETURNING base_id", &st, NULL)) {
        int64_t now = store_now_ms();
        for (int depth = 0; id && depth <= 64; depth++) {
            sqlite3_reset(st);
            sqlite3_bind_int64(st, 1, id);
            sqlite3_bind_int64(st, 2, now);
            sqlite3_bind_int(st, 3, depth ? 0 : hit);
            int r = sqlite3_step(st);
            id = r == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
            while (r == SQLITE_ROW) r = sqlite3_step(st);
        }
        sqlite3_finalize(st);
    }
    st_end(s, STORE_OK, NULL);
}

/* The complete row with exactly the first n tokens of k (n a whole number of blocks, or
 * k->n_tokens); 0 if none. */
static int64_t exact_row(store *s, const store_kv_key *k, size_t n)
{
    uint64_t kh;
    if (n == k->n_tokens) kh = k->key_hash;
    else if (n % (size_t)k->block_size == 0 && n >= (size_t)k->block_size) kh = k->block_hashes[n / (size_t)k->block_size - 1];
    else return 0;
    sqlite3_stmt *st;
    if (st_prepare(s,
                   "SELECT id, tokens FROM kv_prefixes WHERE model_id = ?1 AND kv_type = ?2 AND n_tokens = ?3 AND "
                   "key_hash = ?4 AND state = 1",
                   &st, NULL))
        return 0;
    sqlite3_bind_int64(st, 1, k->model_id);
    sqlite3_bind_text(st, 2, k->kv_type, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (int64_t)n);
    sqlite3_bind_int64(st, 4, (int64_t)kh);
    int64_t id = 0;
    while (!id && sqlite3_step(st) == SQLITE_ROW) {
        const uint8_t *t = sqlite3_column_blob(st, 1);
        size_t bytes = (size_t)sqlite3_column_bytes(st, 1);
        if (bytes == n * 4 && t && common_prefix(t, n, k->tokens, n) == n) id = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    return id;
}

int store_kv_has(store *s, const store_kv_key *k)
{
    if (key_check(s, k, NULL)) return 0;
    return exact_row(s, k, k->n_tokens) != 0;
}

int store_kv_drop(store *s, int64_t id, store_error *err)
{
    int rc = st_begin(s, err);
    if (rc) return rc;
    return st_end(s, st_run_id(s, "DELETE FROM kv_prefixes WHERE id = ?", id, "dropping a KV prefix", err), err);
}

/* ---- find ------------------------------------------------------------------------------------- */

int store_kv_find(store *s, const store_kv_key *q, store_kv_hit *hit, store_error *err)
{
    memset(hit, 0, sizeof *hit);
    int rc = key_check(s, q, err);
    if (rc) return rc;
    if (q->n_blocks == 0) return st_set(s, err, STORE_ERR_NOTFOUND, "no stored KV prefix shares a block");
    sqlite3_stmt *ex;
    if ((rc = st_prepare(s,
                         "SELECT 1 FROM kv_blocks b JOIN kv_prefixes p ON p.id = b.prefix_id WHERE b.hash = ?1 AND "
                         "b.idx = ?2 AND p.model_id = ?3 AND p.kv_type = ?4 AND p.state = 1 LIMIT 1",
                         &ex, err)))
        return rc;
    sqlite3_bind_int64(ex, 3, q->model_id);
    sqlite3_bind_text(ex, 4, q->kv_type, -1, SQLITE_STATIC);
    /* Chained hashes make "some prefix holds block i" monotone in i: binary search. */
    size_t lo = 1, hi = q->n_blocks, best = 0;
    while (lo <= hi) {
        size_t mid = lo + (hi - lo) / 2;
        sqlite3_reset(ex);
        sqlite3_bind_int64(ex, 1, (int64_t)q->block_hashes[mid - 1]);
        sqlite3_bind_int64(ex, 2, (int64_t)(mid - 1));
        int r = sqlite3_step(ex);
        if (r == SQLITE_ROW) {
            best = mid;
            lo = mid + 1;
        } else if (r == SQLITE_DONE) {
            hi = mid - 1;
        } else {
            rc = st_fail(s, err, r, "looking up a KV prefix");
            break;
        }
    }
    sqlite3_finalize(ex);
    if (rc) return rc;
    if (!best) return st_set(s, err, STORE_ERR_NOTFOUND, "no stored KV prefix shares a block");
    sqlite3_stmt *st;
    if ((rc = st_prepare(s,
                         "SELECT p.id, p.n_tokens, p.tokens, p.size, p.kind, p.base_id, (SELECT n_tokens FROM "
                         "kv_prefixes WHERE id = p.base_id) FROM kv_blocks b JOIN kv_prefixes p ON "
                         "p.id = b.prefix_id WHERE b.hash = ?1 AND b.idx = ?2 AND p.model_id = ?3 AND p.kv_type = ?4 "
                         "AND p.state = 1 ORDER BY p.n_tokens, p.id LIMIT ?5",
                         &st, err)))
        return rc;
    sqlite3_bind_int64(st, 1, (int64_t)q->block_hashes[best - 1]);
    sqlite3_bind_int64(st, 2, (int64_t)(best - 1));
    sqlite3_bind_int64(st, 3, q->model_id);
    sqlite3_bind_text(st, 4, q->kv_type, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, MAX_CANDIDATES);
    /* Prefer a prefix the query uses whole (the conversation's own snapshot, a shared system
     * prompt) over a longer one it shares only the start of (another chat's), unless that one
     * saves at least a further block of prefill. Ties go to the shorter (cheaper to read). */
    store_kv_hit whole = {0}, part = {0};
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        size_t n = (size_t)sqlite3_column_int64(st, 1);
        const uint8_t *t = sqlite3_column_blob(st, 2);
        if (!t || (size_t)sqlite3_column_bytes(st, 2) != n * 4) continue; /* a damaged key: never matches */
        size_t c = common_prefix(t, n, q->tokens, q->n_tokens);
        store_kv_hit *b = c == n ? &whole : &part;
        if (c > b->n_common) {
            b->id = sqlite3_column_int64(st, 0);
            b->n_tokens = n;
            b->n_common = c;
            b->size = (size_t)sqlite3_column_int64(st, 3);
            b->kind = sqlite3_column_int(st, 4);
            b->base_id = sqlite3_column_int64(st, 5);
            b->n_base = b->base_id ? (size_t)sqlite3_column_int64(st, 6) : 0;
        }
    }
    if (r != SQLITE_DONE) rc = st_fail(s, err, r, "looking up a KV prefix");
    sqlite3_finalize(st);
    *hit = whole.id && part.n_common < whole.n_common + (size_t)q->block_size ? whole : part;
    if (!rc && !hit->id) rc = st_set(s, err, STORE_ERR_NOTFOUND, "no stored KV prefix shares a block");
    return rc;
}

/* ---- read ------------------------------------------------------------------------------------- */

/* Read prefix id into a malloc'd buffer, checking every chunk; with hit, record the use. */
static int kv_read(store *s, int64_t id, void **blob, size_t *len, int hit, store_error *err)
{
    *blob = NULL;
    *len = 0;
    /* one read transaction: a consistent snapshot even if another process evicts the row */
    int rc = st_exec(s, "BEGIN", err);
    if (rc) return rc;
    sqlite3_stmt *st = NULL;
    uint8_t *buf = NULL;
    size_t size = 0;
    if ((rc = st_prepare(s, "SELECT size, n_chunks, checksum, state, n_tokens, length(tokens) FROM kv_prefixes WHERE id = ?",
                         &st, err)))
        goto done;
    sqlite3_bind_int64(st, 1, id);
    int r = sqlite3_step(st);
    if (r != SQLITE_ROW) {
        rc = r == SQLITE_DONE ? st_set(s, err, STORE_ERR_NOTFOUND, "KV prefix %lld is gone (evicted)", (long long)id)
                              : st_fail(s, err, r, "reading a KV prefix");
        goto done;
    }
    int64_t isize = sqlite3_column_int64(st, 0), n_chunks = sqlite3_column_int64(st, 1);
    uint64_t want = (uint64_t)sqlite3_column_int64(st, 2);
    int state = sqlite3_column_int(st, 3);
    int64_t n_tok = sqlite3_column_int64(st, 4), tok_bytes = sqlite3_column_int64(st, 5);
    sqlite3_finalize(st);
    st = NULL;
    if (state != 1) {
        rc = st_set(s, err, STORE_ERR_NOTFOUND, "KV prefix %lld is still being written", (long long)id);
        goto done;
    }
    if (isize <= 0 || isize > ((int64_t)1 << 40) || n_chunks <= 0 || tok_bytes != n_tok * 4) {
        rc = st_set(s, err, STORE_ERR_CORRUPT, "KV prefix %lld: its row is damaged (size %lld, %lld chunks, %lld key bytes for %lld tokens)",
                    (long long)id, (long long)isize, (long long)n_chunks, (long long)tok_bytes, (long long)n_tok);
        goto done;
    }
    size = (size_t)isize;
    if (!(buf = malloc(size))) {
        rc = st_set(s, err, STORE_ERR_NOMEM, "KV prefix %lld: out of memory for %zu bytes", (long long)id, size);
        goto done;
    }
    if ((rc = st_prepare(s, "SELECT id, idx, length(data), typeof(data) FROM kv_chunks WHERE prefix_id = ? ORDER BY idx",
                         &st, err)))
        goto done;
    sqlite3_bind_int64(st, 1, id);
    st_sum sum;
    st_sum_init(&sum);
    size_t off = 0, first = 0, odd_len = 0;
    int64_t k = 0, odd = -1;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t rowid = sqlite3_column_int64(st, 0), idx = sqlite3_column_int64(st, 1);
        size_t n = (size_t)sqlite3_column_int64(st, 2);
        const char *type = (const char *)sqlite3_column_text(st, 3);
        if (idx != k) {
            rc = st_set(s, err, STORE_ERR_CORRUPT, "KV prefix %lld: chunk %lld of %lld is missing (truncated)",
                        (long long)id, (long long)k, (long long)n_chunks);
            goto done;
        }
        if (!type || strcmp(type, "blob") || n == 0 || off + n > size) {
            rc = st_set(s, err, STORE_ERR_CORRUPT, "KV prefix %lld: chunk %lld holds %zu bytes of %s; %zu of %zu bytes fit",
                        (long long)id, (long long)idx, n, type ? type : "?", size - (off < size ? off : size), size);
            goto done;
        }
        sqlite3_blob *b = NULL;
        int br = sqlite3_blob_open(s->db, "main", "kv_chunks", "data", rowid, 0, &b);
        if (br == SQLITE_OK) br = sqlite3_blob_read(b, buf + off, (int)n, 0);
        sqlite3_blob_close(b);
        if (br != SQLITE_OK) {
            rc = st_fail(s, err, br, "reading a KV chunk");
            goto done;
        }
        st_sum_add(&sum, buf + off, n);
        if (k == 0) first = n;
        else if (odd < 0 && k < n_chunks - 1 && n != first) odd = k, odd_len = n;
        else if (odd < 0 && k == n_chunks - 1 && n != size - first * (size_t)(n_chunks - 1)) odd = k, odd_len = n;
        off += n;
        k++;
    }
    if (r != SQLITE_DONE) {
        rc = st_fail(s, err, r, "reading KV chunks");
        goto done;
    }
    if (k != n_chunks || off != size) {
        if (odd >= 0 && k == n_chunks)
            rc = st_set(s, err, STORE_ERR_CORRUPT, "KV prefix %lld: chunk %lld holds %zu bytes, expected %zu (truncated)",
                        (long long)id, (long long)odd, odd_len, odd < n_chunks - 1 ? first : size - first * (size_t)(n_chunks - 1));
        else
            rc = st_set(s, err, STORE_ERR_CORRUPT, "KV prefix %lld: %lld of %lld chunks, %zu of %zu bytes (truncated)",
                        (long long)id, (long long)k, (long long)n_chunks, off, size);
        goto done;
    }
    uint64_t got = st_sum_final(&sum);
    if (got != want) {
        rc = st_set(s, err, STORE_ERR_CORRUPT, "KV prefix %lld: checksum %016llx, expected %016llx (the blob changed)",
                    (long long)id, (unsigned long long)got, (unsigned long long)want);
        goto done;
    }
done:
    sqlite3_finalize(st);
    st_rollback(s); /* ends the read transaction */
    if (rc) {
        free(buf);
        return rc;
    }
    if (hit) touch(s, id, 1);
    *blob = buf;
    *len = size;
    return STORE_OK;
}

int store_kv_read(store *s, int64_t id, void **blob, size_t *len, store_error *err)
{
    return kv_read(s, id, blob, len, 1, err);
}

int store_kv_verify_all(store *s, void (*problem)(void *ud, const char *msg), void *ud, store_error *err);
int store_kv_verify_all(store *s, void (*problem)(void *ud, const char *msg), void *ud, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s, "SELECT id FROM kv_prefixes WHERE state = 1 ORDER BY id", &st, err);
    if (rc) return rc;
    int64_t *ids = NULL;
    size_t n = 0, cap = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            int64_t *ni = realloc(ids, nc * sizeof *ni);
            if (!ni) break;
            ids = ni;
            cap = nc;
        }
        ids[n++] = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    for (size_t i = 0; i < n; i++) {
        void *b;
        size_t len;
        store_error e = {0};
        int r = kv_read(s, ids[i], &b, &len, 0, &e);
        if (r == STORE_OK) free(b);
        else if (r != STORE_ERR_NOTFOUND) problem(ud, e.msg);
    }
    free(ids);
    /* a delta needs its base: complete, shared, of the same model and KV type, a shorter prefix */
    if (!st_prepare(s,
                    "SELECT d.id, d.base_id FROM kv_prefixes d LEFT JOIN kv_prefixes b ON b.id = d.base_id WHERE "
                    "d.state = 1 AND d.base_id IS NOT NULL AND (b.id IS NULL OR b.state != 1 OR b.kind != 1 OR "
                    "b.model_id != d.model_id OR b.kv_type != d.kv_type OR b.n_tokens >= d.n_tokens OR "
                    "substr(d.tokens, 1, length(b.tokens)) != b.tokens)",
                    &st, NULL)) {
        while (sqlite3_step(st) == SQLITE_ROW) {
            char msg[800];
            snprintf(msg, sizeof msg, "%s: KV prefix %lld: its base %lld is missing or does not fit it (the delta cannot be restored)",
                     s->path, (long long)sqlite3_column_int64(st, 0), (long long)sqlite3_column_int64(st, 1));
            problem(ud, msg);
        }
        sqlite3_finalize(st);
    }
    return STORE_OK;
}

/* ---- eviction and cleanup ----------------------------------------------------------------------- */

static int total_bytes(store *s, uint64_t *total, store_error *err)
{
    int64_t v = 0;
    sqlite3_stmt *st;
    int rc = st_prepare(s, "SELECT COALESCE(SUM(size), 0) FROM kv_prefixes", &st, err);
    if (rc) return rc;
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    else rc = st_fail(s, err, r, "summing the KV store");
    sqlite3_finalize(st);
    *total = v > 0 ? (uint64_t)v : 0;
    return rc;
}

static int count_rows(store *s)
{
    sqlite3_stmt *st;
    int n = 0;
    if (st_prepare(s, "SELECT count(*) FROM kv_prefixes", &st, NULL)) return 0;
    if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return n;
}

/* Evict least recently used complete rows until the blobs fit in budget, never row `keep` or
 * its bases (0: none). Among rows used at the same moment, those no delta needs go first.
 * Dropping a base drops its deltas with it (ON DELETE CASCADE): a delta never outlives the
 * base it needs. */
static int evict(store *s, uint64_t budget, int64_t keep, int *n_evicted, store_error *err)
{
    if (n_evicted) *n_evicted = 0;
    int evicted = 0, rc = STORE_OK;
    for (;;) {
        uint64_t total;
        if ((rc = total_bytes(s, &total, err)) || total <= budget) break;
        sqlite3_stmt *st;
        if ((rc = st_prepare(s,
                             CHAIN_CTE "SELECT p.id FROM kv_prefixes p WHERE p.state = 1 AND p.id NOT IN (SELECT id FROM "
                                       "chain) ORDER BY p.last_used, EXISTS (SELECT 1 FROM kv_prefixes d WHERE "
                                       "d.base_id = p.id), p.id LIMIT 1",
                             &st, err)))
            break;
        sqlite3_bind_int64(st, 1, keep);
        int64_t id = 0;
        if (sqlite3_step(st) == SQLITE_ROW) id = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        if (!id) break; /* only rows being written (or kept) are left */
        int before = count_rows(s);
        if ((rc = store_kv_drop(s, id, err))) break;
        int gone = before - count_rows(s);
        evicted += gone > 1 ? gone : 1;
    }
    if (evicted) {
        /* give the freed pages back to the file system once they add up */
        sqlite3_stmt *st;
        int64_t freelist = 0, page = 4096;
        if (!st_prepare(s, "PRAGMA freelist_count", &st, NULL)) {
            if (sqlite3_step(st) == SQLITE_ROW) freelist = sqlite3_column_int64(st, 0);
            sqlite3_finalize(st);
        }
        if (!st_prepare(s, "PRAGMA page_size", &st, NULL)) {
            if (sqlite3_step(st) == SQLITE_ROW) page = sqlite3_column_int64(st, 0);
            sqlite3_finalize(st);
        }
        if (freelist * page > (64 << 20)) sqlite3_exec(s->db, "PRAGMA incremental_vacuum", NULL, NULL, NULL);
    }
    if (n_evicted) *n_evicted = evicted;
    return rc;
}

int store_kv_evict(store *s, uint64_t budget, int *n_evicted, store_error *err)
{
    return evict(s, budget, 0, n_evicted, err);
}

static int writer_gone(int64_t pid, int64_t created, int64_t now)
{
    if (now - created > STALE_WRITE_MS) return 1;
    if (pid <= 0 || pid > 0x7fffffff) return 1;
    if ((pid_t)pid == getpid()) return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int store_kv_cleanup(store *s, int *n_removed, store_error *err)
{
    if (n_removed) *n_removed = 0;
    sqlite3_stmt *st;
    int rc = st_prepare(s, "SELECT id, writer_pid, created_at FROM kv_prefixes WHERE state = 0", &st, err);
    if (rc) return rc;
    int64_t ids[64];
    int n = 0;
    int64_t now = store_now_ms();
    while (n < 64 && sqlite3_step(st) == SQLITE_ROW)
        if (writer_gone(sqlite3_column_int64(st, 1), sqlite3_column_int64(st, 2), now)) ids[n++] = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    int removed = 0;
    for (int i = 0; i < n && !rc; i++) {
        /* re-check inside the write lock: the row may have been completed meanwhile */
        if ((rc = st_begin(s, err))) break;
        rc = st_run_id(s, "DELETE FROM kv_prefixes WHERE id = ? AND state = 0", ids[i], "removing a half-written KV prefix",
                       err);
        if (!rc) removed += sqlite3_changes(s->db);
        rc = st_end(s, rc, err);
    }
    if (n_removed) *n_removed = removed;
    return rc;
}

/* ---- put -------------------------------------------------------------------------------------- */

/* The complete rows of k's model and KV type holding k's first block (k has one), but row
 * `except` (0: none): on_prefix(ud, id, kind, n) for each that is a strict prefix of k (its n
 * tokens), and *max_shared the longest whole-block prefix k shares with those it diverges
 * from. `what` names the scan in a failure. */
static int scan_related(store *s, const store_kv_key *k, int64_t except,
                        void (*on_prefix)(void *ud, int64_t id, int kind, size_t n), void *ud, size_t *max_shared,
                        const char *what, store_error *err)
{
    *max_shared = 0;
    sqlite3_stmt *st;
    int rc = st_prepare(s,
                        "SELECT p.id, p.kind, p.n_tokens, p.tokens FROM kv_prefixes p WHERE p.model_id = ?1 AND "
                        "p.kv_type = ?2 AND p.state = 1 AND p.id != ?3 AND EXISTS (SELECT 1 FROM kv_blocks b WHERE "
                        "b.prefix_id = p.id AND b.idx = 0 AND b.hash = ?4)",
                        &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, k->model_id);
    sqlite3_bind_text(st, 2, k->kv_type, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, except);
    sqlite3_bind_int64(st, 4, (int64_t)k->block_hashes[0]);
    size_t bs = (size_t)k->block_size;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        size_t n = (size_t)sqlite3_column_int64(st, 2);
        const uint8_t *t = sqlite3_column_blob(st, 3);
        if (!t || (size_t)sqlite3_column_bytes(st, 3) != n * 4) continue;
        size_t c = common_prefix(t, n, k->tokens, k->n_tokens);
        if (c == n && n < k->n_tokens) { /* a prefix of k */
            on_prefix(ud, sqlite3_column_int64(st, 0), sqlite3_column_int(st, 1), n);
        } else if (c < n && c < k->n_tokens) { /* diverges from k: the common whole blocks are shared */
            size_t L = c / bs * bs;
            if (L > *max_shared) *max_shared = L;
        }
    }
    if (r != SQLITE_DONE) rc = st_fail(s, err, r, what);
    sqlite3_finalize(st);
    return rc;
}

/* Stored prefixes of a key, as relate collects them. */
typedef struct rel { int64_t id; int kind; size_t n; } rel;
typedef struct rel_list {
    rel *v;
    size_t n, cap;
} rel_list;

static void add_rel(void *ud, int64_t id, int kind, size_t n)
{
    rel_list *l = ud;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        rel *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return;
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = (rel){id, kind, n};
}

/* After storing (or finding) row self for key k: drop snapshot rows that are strict prefixes of
 * k, touch shared ones, and find the longest whole-block prefix k shares with a row it
 * diverges from (res->shared_len when no row holds exactly it). */
static int relate(store *s, const store_kv_key *k, int64_t self, store_kv_put_result *res, store_error *err)
{
    if (k->n_blocks == 0) return STORE_OK;
    rel_list pre = {0};
    size_t max_shared;
    int rc = scan_related(s, k, self, add_rel, &pre, &max_shared, "relating KV prefixes", err);
    if (!rc && pre.n) {
        if (!(rc = st_begin(s, err))) {
            int64_t now = store_now_ms();
            sqlite3_stmt *st;
            for (size_t i = 0; i < pre.n && !rc; i++) {
                const char *sql = pre.v[i].kind == STORE_KV_SHARED || pre.v[i].n == max_shared
                                      ? "UPDATE kv_prefixes SET kind = 1, last_used = ?2 WHERE id = ?1"
                                      : "DELETE FROM kv_prefixes WHERE id = ?1 AND ?2 IS NOT NULL";
                if (!(rc = st_prepare(s, sql, &st, err))) {
                    sqlite3_bind_int64(st, 1, pre.v[i].id);
                    sqlite3_bind_int64(st, 2, now);
                    rc = st_step_done(s, st, "superseding a KV prefix", err);
                    sqlite3_finalize(st);
                    if (!rc && pre.v[i].kind != STORE_KV_SHARED && pre.v[i].n != max_shared) res->n_superseded++;
                }
            }
            rc = st_end(s, rc, err);
        }
    }
    free(pre.v);
    if (!rc && max_shared >= (size_t)k->block_size && !exact_row(s, k, max_shared)) res->shared_len = max_shared;
    return rc;
}

/* The fields of a row's key as stored (tokens as little-endian bytes). */
typedef struct row_key {
    int64_t model_id;
    const char *kv_type;
    size_t n_tokens, n_blocks;
    uint64_t key_hash;
    const uint8_t *tokens;
} row_key;

/* May base_id be the base of a row with key rk? A complete shared row of the same model and KV
 * type whose key is a whole-block strict prefix of rk's. NOTFOUND when it is gone or not
 * complete, INVALID when it does not fit. Inside the caller's transaction or not. */
static int base_check(store *s, int64_t base_id, const row_key *rk, int block_size, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s, "SELECT state, kind, model_id, kv_type, n_tokens, tokens FROM kv_prefixes WHERE id = ?", &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, base_id);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        const char *type = (const char *)sqlite3_column_text(st, 3);
        size_t n = (size_t)sqlite3_column_int64(st, 4);
        const uint8_t *t = sqlite3_column_blob(st, 5);
        if (sqlite3_column_int(st, 0) != 1)
            rc = st_set(s, err, STORE_ERR_NOTFOUND, "KV prefix %lld (a base) is still being written", (long long)base_id);
        else if (sqlite3_column_int(st, 1) != STORE_KV_SHARED || sqlite3_column_int64(st, 2) != rk->model_id || !type ||
                 strcmp(type, rk->kv_type) || n == 0 || n >= rk->n_tokens || n % (size_t)block_size ||
                 (size_t)sqlite3_column_bytes(st, 5) != n * 4 || !t || memcmp(t, rk->tokens, n * 4))
            rc = st_set(s, err, STORE_ERR_INVALID,
                        "KV prefix %lld cannot be the base of a prefix of %zu tokens (not a shared prefix of it, of the "
                        "same model and KV type, in whole blocks)",
                        (long long)base_id, rk->n_tokens);
    } else {
        rc = r == SQLITE_DONE ? st_set(s, err, STORE_ERR_NOTFOUND, "KV prefix %lld (a base) is gone (evicted)", (long long)base_id)
                              : st_fail(s, err, r, "reading a KV base");
    }
    sqlite3_finalize(st);
    return rc;
}

/* Bytes of row id and every base under it. */
static uint64_t chain_bytes(store *s, int64_t id)
{
    sqlite3_stmt *st;
    int64_t v = 0;
    if (st_prepare(s, CHAIN_CTE "SELECT COALESCE(SUM(size), 0) FROM kv_prefixes WHERE id IN (SELECT id FROM chain)", &st, NULL))
        return 0;
    sqlite3_bind_int64(st, 1, id);
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v > 0 ? (uint64_t)v : 0;
}

/* Steps 1 and 2 of a write: the row, invisible to readers until it is complete (state 0),
 * with base_id checked in the same transaction; then the chunks, one short transaction each
 * (zeroblob, then incremental blob I/O). *id the row, *sum the checksum of the chunks. */
static int write_row(store *s, const row_key *rk, int block_size, int kind, int64_t base_id, const void *blob, size_t len,
                     int64_t *id, uint64_t *sum, store_error *err)
{
    size_t chunk = s->kv_chunk, n_chunks = (len + chunk - 1) / chunk;
    int64_t now = store_now_ms();
    sqlite3_stmt *st = NULL;
    int rc;
    *id = 0;
    if (!(rc = st_begin(s, err)) && !(rc = base_id ? base_check(s, base_id, rk, block_size, err) : STORE_OK) &&
        !(rc = st_prepare(s,
                          "INSERT INTO kv_prefixes(model_id, kv_type, n_tokens, n_blocks, key_hash, tokens, kind, size, "
                          "n_chunks, state, writer_pid, created_at, last_used, base_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, "
                          "?8, ?9, 0, ?10, ?11, ?11, ?12)",
                          &st, err))) {
        sqlite3_bind_int64(st, 1, rk->model_id);
        sqlite3_bind_text(st, 2, rk->kv_type, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (int64_t)rk->n_tokens);
        sqlite3_bind_int64(st, 4, (int64_t)rk->n_blocks);
        sqlite3_bind_int64(st, 5, (int64_t)rk->key_hash);
        sqlite3_bind_blob(st, 6, rk->tokens, (int)(rk->n_tokens * 4), SQLITE_STATIC);
        sqlite3_bind_int(st, 7, kind == STORE_KV_SHARED ? 1 : 0);
        sqlite3_bind_int64(st, 8, (int64_t)len);
        sqlite3_bind_int64(st, 9, (int64_t)n_chunks);
        sqlite3_bind_int64(st, 10, (int64_t)getpid());
        sqlite3_bind_int64(st, 11, now);
        if (base_id) sqlite3_bind_int64(st, 12, base_id);
        else sqlite3_bind_null(st, 12);
        rc = st_step_done(s, st, "storing a KV prefix", err);
        sqlite3_finalize(st);
        st = NULL;
        if (!rc) *id = sqlite3_last_insert_rowid(s->db);
        if (!rc) rc = st_commit(s, err);
    }
    if (rc) {
        st_rollback(s);
        *id = 0;
        return rc;
    }
    st_sum ck;
    st_sum_init(&ck);
    const uint8_t *p = blob;
    for (size_t c = 0; c < n_chunks && !rc; c++) {
        size_t off = c * chunk, n = len - off < chunk ? len - off : chunk;
        if ((rc = st_begin(s, err))) break;
        if (!(rc = st_prepare(s, "INSERT INTO kv_chunks(prefix_id, idx, data) VALUES (?, ?, zeroblob(?))", &st, err))) {
            sqlite3_bind_int64(st, 1, *id);
            sqlite3_bind_int64(st, 2, (int64_t)c);
            sqlite3_bind_int64(st, 3, (int64_t)n);
            rc = st_step_done(s, st, "storing a KV chunk", err);
            sqlite3_finalize(st);
            st = NULL;
        }
        if (!rc) {
            sqlite3_blob *b = NULL;
            int br = sqlite3_blob_open(s->db, "main", "kv_chunks", "data", sqlite3_last_insert_rowid(s->db), 1, &b);
            if (br == SQLITE_OK) br = sqlite3_blob_write(b, p + off, (int)n, 0);
            int cr = sqlite3_blob_close(b);
            if (br == SQLITE_OK) br = cr;
            if (br != SQLITE_OK) rc = st_fail(s, err, br, "writing a KV chunk");
        }
        rc = st_end(s, rc, err);
        st_sum_add(&ck, p + off, n);
        if (!rc && s->kv_delay_ms) {
            struct timespec ts = {s->kv_delay_ms / 1000, (long)(s->kv_delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    *sum = st_sum_final(&ck);
    if (rc) store_kv_drop(s, *id, NULL); /* best effort; store_kv_cleanup catches what stays */
    return rc;
}

int store_kv_put_delta(store *s, const store_kv_key *k, int kind, int64_t base_id, const void *blob, size_t len,
                       uint64_t budget, store_kv_put_result *res, store_error *err)
{
    memset(res, 0, sizeof *res);
    int rc = key_check(s, k, err);
    if (rc) return rc;
    if (!blob || !len) return st_set(s, err, STORE_ERR_INVALID, "KV prefix: empty blob");
    if (base_id < 0) return st_set(s, err, STORE_ERR_INVALID, "KV prefix: invalid base %lld", (long long)base_id);
    if (s->readonly) return st_set(s, err, STORE_ERR_READONLY, "opened read-only");
    int64_t id = exact_row(s, k, k->n_tokens);
    if (id) {
        if (kind == STORE_KV_SHARED && !st_begin(s, NULL)) /* asked to share it: it is shared now */
            st_end(s, st_run_id(s, "UPDATE kv_prefixes SET kind = 1 WHERE id = ?", id, "", NULL), NULL);
        touch(s, id, 0);
        res->id = id;
        return relate(s, k, id, res, err);
    }
    uint64_t under = 0; /* the bases this blob needs count against the budget too */
    if (base_id) {
        touch(s, base_id, 0);
        under = chain_bytes(s, base_id);
    }
    if (budget && (len > budget || under > budget - len)) {
        res->skipped = 1;
        return STORE_OK;
    }
    store_kv_cleanup(s, NULL, NULL);
    int ev = 0;
    if ((rc = evict(s, budget ? budget - len : UINT64_MAX, base_id, &ev, err))) return rc;
    res->n_evicted = ev;

    uint8_t *keyb = st_tokens_encode(k->tokens, k->n_tokens);
    if (!keyb) return st_set(s, err, STORE_ERR_NOMEM, "out of memory");
    row_key rk = {k->model_id, k->kv_type, k->n_tokens, k->n_blocks, k->key_hash, keyb};
    uint64_t sum = 0;
    rc = write_row(s, &rk, k->block_size, kind, base_id, blob, len, &id, &sum, err);
    free(keyb);
    if (rc) return rc;
    sqlite3_stmt *st = NULL;
    /* 3. complete: checksum, block index, visible — unless another writer finished the same key */
    int64_t other = 0;
    if (!(rc = st_begin(s, err))) {
        other = exact_row(s, k, k->n_tokens);
        if (other) {
            rc = st_run_id(s, "DELETE FROM kv_prefixes WHERE id = ?", id, "dropping a duplicate KV prefix", err);
        } else {
            rc = st_prepare(s, "UPDATE kv_prefixes SET state = 1, checksum = ?2, last_used = ?3 WHERE id = ?1 AND state = 0",
                            &st, err);
            if (!rc) {
                sqlite3_bind_int64(st, 1, id);
                sqlite3_bind_int64(st, 2, (int64_t)sum);
                sqlite3_bind_int64(st, 3, store_now_ms());
                rc = st_step_done(s, st, "completing a KV prefix", err);
                sqlite3_finalize(st);
                /* (a base evicted meanwhile took this row with it) */
                if (!rc && sqlite3_changes(s->db) != 1)
                    rc = st_set(s, err, STORE_ERR_NOTFOUND, "KV prefix %lld was removed while being written%s", (long long)id,
                                base_id ? " (its base was evicted)" : "");
            }
            if (!rc && !(rc = st_prepare(s, "INSERT OR IGNORE INTO kv_blocks(hash, idx, prefix_id) VALUES (?, ?, ?)", &st,
                                         err))) {
                for (size_t i = 0; i < k->n_blocks && !rc; i++) {
                    sqlite3_reset(st);
                    sqlite3_bind_int64(st, 1, (int64_t)k->block_hashes[i]);
                    sqlite3_bind_int64(st, 2, (int64_t)i);
                    sqlite3_bind_int64(st, 3, id);
                    rc = st_step_done(s, st, "indexing a KV prefix", err);
                }
                sqlite3_finalize(st);
            }
        }
        rc = st_end(s, rc, err);
    }
    if (rc) {
        store_kv_drop(s, id, NULL); /* best effort; store_kv_cleanup catches what stays */
        return rc;
    }
    res->id = other ? other : id;
    res->stored = !other;
    touch(s, res->id, 0); /* and its bases */
    if ((rc = relate(s, k, res->id, res, err))) return rc;
    if (budget && !(rc = evict(s, budget, res->id, &ev, err))) res->n_evicted += ev;
    return rc;
}

int store_kv_put(store *s, const store_kv_key *k, int kind, const void *blob, size_t len, uint64_t budget,
                 store_kv_put_result *res, store_error *err)
{
    return store_kv_put_delta(s, k, kind, 0, blob, len, budget, res, err);
}

/* ---- deltas: chains, planning, rebasing ------------------------------------------------------ */

int store_kv_chain(store *s, int64_t id, store_kv_link *links, int cap, int *n, store_error *err)
{
    *n = 0;
    int depth = 0, rc = STORE_OK;
    int64_t cur = id;
    sqlite3_stmt *st;
    if ((rc = st_prepare(s, "SELECT base_id, n_tokens, size, state FROM kv_prefixes WHERE id = ?", &st, err))) return rc;
    while (cur) {
        if (depth == cap) {
            rc = st_set(s, err, STORE_ERR_CORRUPT, "KV prefix %lld: its chain of bases is deeper than %d (or loops)",
                        (long long)id, cap);
            break;
        }
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, cur);
        int r = sqlite3_step(st);
        if (r != SQLITE_ROW || sqlite3_column_int(st, 3) != 1) {
            rc = r == SQLITE_ROW || r == SQLITE_DONE
                     ? st_set(s, err, STORE_ERR_NOTFOUND, "KV prefix %lld is gone (evicted)%s", (long long)cur,
                              cur != id ? ", a base of the one found" : "")
                     : st_fail(s, err, r, "reading a KV prefix chain");
            break;
        }
        links[depth] = (store_kv_link){.id = cur, .n_tokens = (size_t)sqlite3_column_int64(st, 1),
                                       .size = (size_t)sqlite3_column_int64(st, 2)};
        cur = sqlite3_column_int64(st, 0);
        depth++;
    }
    sqlite3_finalize(st);
    if (rc) return rc;
    for (int i = 0; i < depth / 2; i++) { /* root first */
        store_kv_link t = links[i];
        links[i] = links[depth - 1 - i];
        links[depth - 1 - i] = t;
    }
    for (int i = 0; i < depth; i++) {
        links[i].n_base = i ? links[i - 1].n_tokens : 0;
        if (i && links[i].n_base >= links[i].n_tokens)
            return st_set(s, err, STORE_ERR_CORRUPT, "KV prefix %lld: its base %lld is not shorter than it",
                          (long long)links[i].id, (long long)links[i - 1].id);
    }
    *n = depth;
    return STORE_OK;
}

/* A stored strict prefix of the key is a base when it is shared and in whole blocks: the longest. */
typedef struct base_pick {
    store_kv_plan_result *plan;
    size_t block_size;
} base_pick;

static void pick_base(void *ud, int64_t id, int kind, size_t n)
{
    base_pick *b = ud;
    if (kind == STORE_KV_SHARED && n % b->block_size == 0 && n > b->plan->n_base) {
        b->plan->base_id = id;
        b->plan->n_base = n;
    }
}

int store_kv_plan(store *s, const store_kv_key *k, store_kv_plan_result *plan, store_error *err)
{
    memset(plan, 0, sizeof *plan);
    int rc = key_check(s, k, err);
    if (rc || k->n_blocks == 0) return rc;
    size_t bs = (size_t)k->block_size, max_shared;
    base_pick pick = {plan, bs};
    rc = scan_related(s, k, 0, pick_base, &pick, &max_shared, "planning a KV prefix", err);
    if (rc || max_shared <= plan->n_base || max_shared < bs) return rc;
    /* a stored prefix of exactly the shared tokens (a snapshot that ended there) becomes shared */
    int64_t exact = exact_row(s, k, max_shared);
    if (exact && !s->readonly && !st_begin(s, NULL)) {
        if (st_end(s, st_run_id(s, "UPDATE kv_prefixes SET kind = 1 WHERE id = ? AND state = 1", exact, "", NULL), NULL))
            exact = 0;
        if (exact) {
            plan->base_id = exact;
            plan->n_base = max_shared;
            return STORE_OK;
        }
    }
    if (!exact) plan->shared_len = max_shared;
    return STORE_OK;
}

/* Replace row old's blob with blob, a delta over base_id: a new row with the same key is
 * written (state 0), then one transaction moves the block index, hands old's deltas to it,
 * drops old and makes it visible with old's use record. NOTFOUND when old or the base went
 * away meanwhile (nothing changes then). */
static int kv_replace(store *s, int64_t old, int64_t base_id, int block_size, const void *blob, size_t len, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s,
                        "SELECT model_id, kv_type, n_tokens, n_blocks, key_hash, tokens, kind FROM kv_prefixes WHERE id = ? "
                        "AND state = 1",
                        &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, old);
    int r = sqlite3_step(st);
    if (r != SQLITE_ROW) {
        sqlite3_finalize(st);
        return r == SQLITE_DONE ? st_set(s, err, STORE_ERR_NOTFOUND, "KV prefix %lld is gone (evicted)", (long long)old)
                                : st_fail(s, err, r, "reading a KV prefix");
    }
    char type[64];
    snprintf(type, sizeof type, "%s", sqlite3_column_text(st, 1) ? (const char *)sqlite3_column_text(st, 1) : "");
    size_t n_tok = (size_t)sqlite3_column_int64(st, 2), tb = (size_t)sqlite3_column_bytes(st, 5);
    uint8_t *toks = malloc(tb ? tb : 1);
    if (toks && tb) memcpy(toks, sqlite3_column_blob(st, 5), tb);
    row_key rk = {sqlite3_column_int64(st, 0), type, n_tok, (size_t)sqlite3_column_int64(st, 3),
                  (uint64_t)sqlite3_column_int64(st, 4), toks};
    int kind = sqlite3_column_int(st, 6);
    sqlite3_finalize(st);
    if (!toks) return st_set(s, err, STORE_ERR_NOMEM, "out of memory");
    if (tb != n_tok * 4) {
        free(toks);
        return st_set(s, err, STORE_ERR_CORRUPT, "KV prefix %lld: its key is damaged", (long long)old);
    }
    int64_t id = 0;
    uint64_t sum = 0;
    rc = write_row(s, &rk, block_size, kind, base_id, blob, len, &id, &sum, err);
    free(toks);
    if (rc) return rc;
    if ((rc = st_begin(s, err))) {
        store_kv_drop(s, id, NULL);
        return rc;
    }
    static const char *const steps[] = {
        /* both rows still there (a base evicted meanwhile took the new one with it) */
        "SELECT (SELECT count(*) FROM kv_prefixes WHERE id = ?1 AND state = 0) + (SELECT count(*) FROM kv_prefixes "
        "WHERE id = ?2 AND state = 1)",
        "INSERT OR IGNORE INTO kv_blocks(hash, idx, prefix_id) SELECT hash, idx, ?1 FROM kv_blocks WHERE prefix_id = ?2",
        "UPDATE kv_prefixes SET base_id = ?1 WHERE base_id = ?2",
        "UPDATE kv_prefixes SET (last_used, hits) = (SELECT last_used, hits FROM kv_prefixes WHERE id = ?2) WHERE id = ?1",
        "DELETE FROM kv_prefixes WHERE id = ?2",
        "UPDATE kv_prefixes SET state = 1, checksum = ?3 WHERE id = ?1",
    };
    for (size_t i = 0; i < sizeof steps / sizeof *steps && !rc; i++) {
        if ((rc = st_prepare(s, steps[i], &st, err))) break;
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_int64(st, 2, old);
        if (i == 5) sqlite3_bind_int64(st, 3, (int64_t)sum);
        if (i == 0) {
            r = sqlite3_step(st);
            if (r != SQLITE_ROW) rc = st_fail(s, err, r, "replacing a KV prefix");
            else if (sqlite3_column_int(st, 0) != 2)
                rc = st_set(s, err, STORE_ERR_NOTFOUND, "KV prefix %lld or its new base %lld went away while it was rebased",
                            (long long)old, (long long)base_id);
        } else {
            rc = st_step_done(s, st, "replacing a KV prefix", err);
        }
        sqlite3_finalize(st);
    }
    if ((rc = st_end(s, rc, err))) store_kv_drop(s, id, NULL);
    return rc;
}

int store_kv_rebase(store *s, int64_t base_id, int max_rows, store_kv_transform fn, void *ud, int *n_rebased,
                    store_error *err)
{
    if (n_rebased) *n_rebased = 0;
    if (s->readonly) return st_set(s, err, STORE_ERR_READONLY, "opened read-only");
    if (max_rows <= 0) return STORE_OK;
    sqlite3_stmt *st;
    int rc = st_prepare(s,
                        "SELECT p.id, b.n_tokens, b.n_blocks FROM kv_prefixes b JOIN kv_blocks bb ON bb.prefix_id = b.id AND "
                        "bb.idx = b.n_blocks - 1 JOIN kv_blocks pb ON pb.hash = bb.hash AND pb.idx = bb.idx AND "
                        "pb.prefix_id != b.id JOIN kv_prefixes p ON p.id = pb.prefix_id LEFT JOIN kv_prefixes cur ON "
                        "cur.id = p.base_id WHERE b.id = ?1 AND b.state = 1 AND b.kind = 1 AND p.state = 1 AND "
                        "p.model_id = b.model_id AND p.kv_type = b.kv_type AND p.n_tokens > b.n_tokens AND "
                        "substr(p.tokens, 1, length(b.tokens)) = b.tokens AND (p.base_id IS NULL OR cur.n_tokens < "
                        "b.n_tokens) ORDER BY p.last_used DESC, p.id LIMIT ?2",
                        &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, base_id);
    sqlite3_bind_int(st, 2, max_rows);
    int64_t ids[64];
    int n = 0, r;
    size_t n_base = 0, n_blocks = 0;
    while (n < 64 && (r = sqlite3_step(st)) == SQLITE_ROW) {
        ids[n++] = sqlite3_column_int64(st, 0);
        n_base = (size_t)sqlite3_column_int64(st, 1);
        n_blocks = (size_t)sqlite3_column_int64(st, 2);
    }
    sqlite3_finalize(st);
    if (!n_blocks) return STORE_OK;
    int done = 0;
    for (int i = 0; i < n; i++) {
        void *blob = NULL, *out = NULL;
        size_t len = 0, out_len = 0;
        if (kv_read(s, ids[i], &blob, &len, 0, NULL)) continue; /* damaged: found and dropped when used */
        if (fn(ud, blob, len, n_base, &out, &out_len) == 0 && out) {
            if (!kv_replace(s, ids[i], base_id, (int)(n_base / n_blocks), out, out_len, NULL)) done++;
        }
        free(out);
        free(blob);
    }
    if (n_rebased) *n_rebased = done;
    return STORE_OK;
}

int store_kv_stats_get(store *s, store_kv_stats *out, store_error *err)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    int rc = st_prepare(s,
                        "SELECT COALESCE(SUM(size) FILTER (WHERE state = 1), 0), count(*) FILTER (WHERE state = 1), "
                        "count(*) FILTER (WHERE state = 1 AND kind = 1), count(*) FILTER (WHERE state = 0), "
                        "COALESCE(SUM(hits), 0), count(DISTINCT model_id), count(*) FILTER (WHERE state = 1 AND base_id "
                        "IS NOT NULL), COALESCE(SUM(size) FILTER (WHERE state = 1 AND base_id IS NOT NULL), 0) FROM "
                        "kv_prefixes",
                        &st, err);
    if (rc) return rc;
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        out->bytes = (uint64_t)sqlite3_column_int64(st, 0);
        out->n_prefixes = sqlite3_column_int(st, 1);
        out->n_shared = sqlite3_column_int(st, 2);
        out->n_writing = sqlite3_column_int(st, 3);
        out->hits = (uint64_t)sqlite3_column_int64(st, 4);
        out->n_models = sqlite3_column_int(st, 5);
        out->n_delta = sqlite3_column_int(st, 6);
        out->bytes_delta = (uint64_t)sqlite3_column_int64(st, 7);
    } else rc = st_fail(s, err, r, "reading the KV store's size");
    sqlite3_finalize(st);
    return rc;
}
