/* store: opening the database (checks before any write, WAL, pragmas), the schema and its forward-only migrations, models, conversations, messages, search, import and the consistency check. */
#include "store_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BUSY_TIMEOUT_MS 5000
#define BEGIN_RETRIES 6       /* × the busy timeout before STORE_ERR_BUSY reaches anyone */
#define TITLE_MAX_BYTES 80

/* ---- errors and helpers ------------------------------------------------------------------ */

int st_set(store *s, store_error *err, int code, const char *fmt, ...)
{
    if (!err) return code;
    err->code = code;
    int n = snprintf(err->msg, sizeof err->msg, "%s: ", s && s->path ? s->path : "database");
    if (n < 0 || (size_t)n >= sizeof err->msg) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

static int code_of(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_BUSY: case SQLITE_LOCKED: return STORE_ERR_BUSY;
    case SQLITE_CORRUPT: return STORE_ERR_CORRUPT;
    case SQLITE_NOTADB: return STORE_ERR_FOREIGN;
    case SQLITE_NOMEM: return STORE_ERR_NOMEM;
    case SQLITE_READONLY: case SQLITE_PERM: case SQLITE_AUTH: return STORE_ERR_READONLY;
    case SQLITE_FULL: return STORE_ERR_FULL;
    case SQLITE_CONSTRAINT: case SQLITE_MISUSE: case SQLITE_RANGE: case SQLITE_TOOBIG: return STORE_ERR_INVALID;
    default: return STORE_ERR_IO;
    }
}

int st_fail(store *s, store_error *err, int rc, const char *what)
{
    int code = code_of(rc);
    const char *m = s && s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc);
    if (code == STORE_ERR_BUSY)
        return st_set(s, err, code, "%s: the database stayed locked by another process (%s)", what, m);
    if (code == STORE_ERR_CORRUPT)
        return st_set(s, err, code, "%s: %s (run `kvchat check`)", what, m);
    return st_set(s, err, code, "%s: %s", what, m);
}

int st_prepare(store *s, const char *sql, sqlite3_stmt **st, store_error *err)
{
    *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, st, NULL);
    if (rc != SQLITE_OK) {
        sqlite3_finalize(*st);
        *st = NULL;
        return st_fail(s, err, rc, "preparing a query");
    }
    return STORE_OK;
}

int st_exec(store *s, const char *sql, store_error *err)
{
    char *msg = NULL;
    int rc = sqlite3_exec(s->db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
        int code = st_fail(s, err, rc, "executing");
        if (msg && err) st_set(s, err, code, "%s", msg);
        sqlite3_free(msg);
        return code;
    }
    return STORE_OK;
}

int st_begin(store *s, store_error *err)
{
    int rc = SQLITE_OK;
    for (int i = 0; i < BEGIN_RETRIES; i++) {
        rc = sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if ((rc & 0xff) != SQLITE_BUSY) break;
    }
    if (rc != SQLITE_OK) return st_fail(s, err, rc, "starting a write transaction");
    return STORE_OK;
}

int st_commit(store *s, store_error *err)
{
    int rc = SQLITE_OK;
    for (int i = 0; i < BEGIN_RETRIES; i++) {
        rc = sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL);
        if ((rc & 0xff) != SQLITE_BUSY) break;
    }
    if (rc != SQLITE_OK) {
        int code = st_fail(s, err, rc, "committing");
        st_rollback(s);
        return code;
    }
    return STORE_OK;
}

void st_rollback(store *s)
{
    if (!sqlite3_get_autocommit(s->db)) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
}

int st_end(store *s, int rc, store_error *err)
{
    if (!rc) rc = st_commit(s, err);
    if (rc) st_rollback(s);
    return rc;
}

int st_step_done(store *s, sqlite3_stmt *st, const char *what, store_error *err)
{
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {}
    if (rc != SQLITE_DONE) return st_fail(s, err, rc, what);
    return STORE_OK;
}

int st_run_id(store *s, const char *sql, int64_t id, const char *what, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s, sql, &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, id);
    rc = st_step_done(s, st, what, err);
    sqlite3_finalize(st);
    return rc;
}

uint8_t *st_tokens_encode(const int32_t *t, size_t n)
{
    uint8_t *b = malloc(n * 4 + 1);
    if (!b) return NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)t[i];
        b[4 * i] = (uint8_t)v;
        b[4 * i + 1] = (uint8_t)(v >> 8);
        b[4 * i + 2] = (uint8_t)(v >> 16);
        b[4 * i + 3] = (uint8_t)(v >> 24);
    }
    return b;
}

/* ---- checksum ------------------------------------------------------------------------------ */

static uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

void st_sum_init(st_sum *c)
{
    memset(c, 0, sizeof *c);
    c->h = 0xcbf29ce484222325ULL;
}

static void sum_word(st_sum *c, const uint8_t *p)
{
    uint64_t w = 0;
    for (int i = 0; i < 8; i++) w |= (uint64_t)p[i] << (8 * i);
    c->h = (c->h ^ w) * 0x100000001b3ULL;
}

void st_sum_add(st_sum *c, const void *data, size_t n)
{
    const uint8_t *p = data;
    c->n += n;
    while (n && c->n_tail) {
        c->tail[c->n_tail++] = *p++;
        n--;
        if (c->n_tail == 8) {
            sum_word(c, c->tail);
            c->n_tail = 0;
        }
    }
    for (; n >= 8; n -= 8, p += 8) sum_word(c, p);
    while (n--) c->tail[c->n_tail++] = *p++;
}

uint64_t st_sum_final(const st_sum *c)
{
    uint64_t h = c->h;
    for (int i = 0; i < c->n_tail; i++) h = (h ^ c->tail[i]) * 0x100000001b3ULL;
    h = (h ^ c->n) * 0x100000001b3ULL;
    return fmix64(h);
}

int64_t store_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *dup_str(const char *s)
{
    if (!s) s = "";
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* Column text as a malloc'd NUL-terminated copy ("" for NULL); *len its length. */
static char *col_dup(sqlite3_stmt *st, int i, size_t *len)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    size_t n = t ? (size_t)sqlite3_column_bytes(st, i) : 0;
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, t, n);
    d[n] = 0;
    if (len) *len = n;
    return d;
}

/* Read every row of st (prepared and bound) into a malloc'd array of `size`-byte elements, each
 * filled by read; finalizes st. On failure the rows read so far go to drop and the code is
 * returned; `what` names the reading in the messages ("out of memory <what>", "<what>: …"). */
static int read_rows(store *s, sqlite3_stmt *st, size_t size,
                     int (*read)(store *s, sqlite3_stmt *st, void *row, store_error *err),
                     void (*drop)(void *rows, size_t n), const char *what, void **rows, size_t *n, store_error *err)
{
    size_t cap = 0, k = 0;
    char *v = NULL;
    int rc = STORE_OK, r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            size_t nc = cap ? cap * 2 : 32;
            char *nv = realloc(v, nc * size);
            if (!nv) {
                rc = st_set(s, err, STORE_ERR_NOMEM, "out of memory %s", what);
                break;
            }
            v = nv;
            cap = nc;
        }
        if ((rc = read(s, st, v + k * size, err))) break;
        k++;
    }
    if (!rc && r != SQLITE_DONE) rc = st_fail(s, err, r, what);
    sqlite3_finalize(st);
    if (rc) {
        drop(v, k);
        return rc;
    }
    *rows = v;
    *n = k;
    return STORE_OK;
}

/* ---- schema --------------------------------------------------------------------------------- */

/* migrations[v] takes a database from user_version v to v + 1. Forward only: never edit one
 * that shipped; add the next. */
static const char *const migrations[] = {
    /* 0 → 1: the first schema */
    "CREATE TABLE models(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  fingerprint TEXT NOT NULL UNIQUE,\n"
    "  path TEXT NOT NULL DEFAULT '',\n"
    "  name TEXT NOT NULL DEFAULT '',\n"
    "  arch TEXT NOT NULL DEFAULT '',\n"
    "  weight_type TEXT NOT NULL DEFAULT '',\n"
    "  file_size INTEGER NOT NULL DEFAULT 0,\n"
    "  created_at INTEGER NOT NULL,\n"
    "  last_used INTEGER NOT NULL);\n"
    "CREATE TABLE conversations(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  title TEXT NOT NULL DEFAULT '',\n"
    "  model_id INTEGER REFERENCES models(id) ON DELETE SET NULL,\n"
    "  system_prompt TEXT,\n"
    "  temperature REAL, top_k INTEGER, top_p REAL, min_p REAL, repeat_penalty REAL,\n"
    "  repeat_last_n INTEGER, presence_penalty REAL, frequency_penalty REAL, seed INTEGER,\n"
    "  max_tokens INTEGER,\n"
    "  created_at INTEGER NOT NULL,\n"
    "  updated_at INTEGER NOT NULL,\n"
    "  head_id INTEGER REFERENCES messages(id) ON DELETE SET NULL,\n"
    "  ctx_model_id INTEGER REFERENCES models(id) ON DELETE SET NULL,\n"
    "  ctx_head_id INTEGER,\n"
    "  ctx_tokens BLOB);\n"
    "CREATE INDEX conversations_updated ON conversations(updated_at);\n"
    "CREATE TABLE messages(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,\n"
    "  parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,\n"
    "  role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),\n"
    "  content TEXT NOT NULL,\n"
    "  n_tokens INTEGER NOT NULL DEFAULT 0,\n"
    "  created_at INTEGER NOT NULL,\n"
    "  partial INTEGER NOT NULL DEFAULT 0);\n"
    "CREATE INDEX messages_conversation ON messages(conversation_id, id);\n"
    "CREATE INDEX messages_parent ON messages(parent_id);\n"
    "CREATE TABLE generations(\n"
    "  message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,\n"
    "  temperature REAL, top_k INTEGER, top_p REAL, min_p REAL, repeat_penalty REAL,\n"
    "  repeat_last_n INTEGER, presence_penalty REAL, frequency_penalty REAL, seed INTEGER,\n"
    "  max_tokens INTEGER,\n"
    "  finish TEXT NOT NULL CHECK (finish IN ('eog', 'length', 'context', 'stopped', 'error', 'stop')),\n"
    "  ttft_ms REAL, prefill_tps REAL, decode_tps REAL,\n"
    "  n_prompt INTEGER, n_reused INTEGER, n_prefilled INTEGER, n_generated INTEGER);\n"
    "CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id',\n"
    "  tokenize='unicode61 remove_diacritics 2');\n"
    "CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN\n"
    "  INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END;\n"
    "CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN\n"
    "  INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content); END;\n"
    "CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN\n"
    "  INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);\n"
    "  INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END;\n"
    "CREATE TABLE kv_prefixes(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,\n"
    "  kv_type TEXT NOT NULL,\n"
    "  n_tokens INTEGER NOT NULL,\n"
    "  n_blocks INTEGER NOT NULL,\n"
    "  key_hash INTEGER NOT NULL,\n"
    "  tokens BLOB NOT NULL,\n"
    "  kind INTEGER NOT NULL DEFAULT 0,\n"
    "  size INTEGER NOT NULL,\n"
    "  n_chunks INTEGER NOT NULL,\n"
    "  checksum INTEGER,\n"
    "  state INTEGER NOT NULL DEFAULT 0,\n"
    "  writer_pid INTEGER,\n"
    "  created_at INTEGER NOT NULL,\n"
    "  last_used INTEGER NOT NULL,\n"
    "  hits INTEGER NOT NULL DEFAULT 0);\n"
    "CREATE UNIQUE INDEX kv_prefixes_key ON kv_prefixes(model_id, kv_type, n_tokens, key_hash) WHERE state = 1;\n"
    "CREATE INDEX kv_prefixes_lru ON kv_prefixes(last_used);\n"
    "CREATE TABLE kv_blocks(\n"
    "  hash INTEGER NOT NULL,\n"
    "  idx INTEGER NOT NULL,\n"
    "  prefix_id INTEGER NOT NULL REFERENCES kv_prefixes(id) ON DELETE CASCADE,\n"
    "  PRIMARY KEY (hash, idx, prefix_id)) WITHOUT ROWID;\n"
    "CREATE INDEX kv_blocks_prefix ON kv_blocks(prefix_id);\n"
    "CREATE TABLE kv_chunks(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  prefix_id INTEGER NOT NULL REFERENCES kv_prefixes(id) ON DELETE CASCADE,\n"
    "  idx INTEGER NOT NULL,\n"
    "  data BLOB NOT NULL,\n"
    "  UNIQUE (prefix_id, idx));\n",
    /* 1 → 2: deltas — a KV prefix may rest on a shared one, its blob holding only the rest */
    "ALTER TABLE kv_prefixes ADD COLUMN base_id INTEGER REFERENCES kv_prefixes(id) ON DELETE CASCADE;\n"
    "CREATE INDEX kv_prefixes_base ON kv_prefixes(base_id);\n",
    /* 2 → 3: seeds as unsigned decimal text. SQLite's INTEGER is signed 64-bit, so a seed >= 2^63
     * (half of the random ones) read back negative in SQL; the old values are converted: x < 0
     * held 2^64 + x = 2^63 + (x + 2^63), added in two 9-digit halves to stay within int64. */
    "ALTER TABLE generations RENAME COLUMN seed TO seed_i64;\n"
    "ALTER TABLE generations ADD COLUMN seed TEXT;\n"
    "UPDATE generations SET seed = CASE WHEN seed_i64 >= 0 THEN CAST(seed_i64 AS TEXT) ELSE CAST(((seed_i64 + 9223372036854775807) + 1) / 1000000000 + 9223372036 + ((((seed_i64 + 9223372036854775807) + 1) % 1000000000) + 854775808) / 1000000000 AS TEXT) || printf('%09d', ((((seed_i64 + 9223372036854775807) + 1) % 1000000000) + 854775808) % 1000000000) END WHERE seed_i64 IS NOT NULL;\n"
    "ALTER TABLE generations DROP COLUMN seed_i64;\n"
    "ALTER TABLE conversations RENAME COLUMN seed TO seed_i64;\n"
    "ALTER TABLE conversations ADD COLUMN seed TEXT;\n"
    "UPDATE conversations SET seed = CASE WHEN seed_i64 >= 0 THEN CAST(seed_i64 AS TEXT) ELSE CAST(((seed_i64 + 9223372036854775807) + 1) / 1000000000 + 9223372036 + ((((seed_i64 + 9223372036854775807) + 1) % 1000000000) + 854775808) / 1000000000 AS TEXT) || printf('%09d', ((((seed_i64 + 9223372036854775807) + 1) % 1000000000) + 854775808) % 1000000000) END WHERE seed_i64 IS NOT NULL;\n"
    "ALTER TABLE conversations DROP COLUMN seed_i64;\n",
    /* 3 → 4: the model that wrote each reply (a chat may switch models: /model). Older replies
     * were all written by their conversation's model. A plain INTEGER (no foreign key: models
     * rows are never deleted, and a column in a foreign key could not be dropped again). */
    "ALTER TABLE messages ADD COLUMN model_id INTEGER;\n"
    "UPDATE messages SET model_id = (SELECT c.model_id FROM conversations c WHERE c.id = messages.conversation_id) "
    "WHERE role = 'assistant';\n",
};
#define N_MIGRATIONS (sizeof migrations / sizeof migrations[0])
_Static_assert(N_MIGRATIONS == STORE_SCHEMA_VERSION, "one migration per schema version");

static int pragma_int(store *s, const char *sql, int64_t *out, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s, sql, &st, err);
    if (rc) return rc;
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) *out = sqlite3_column_int64(st, 0);
    else if (r != SQLITE_DONE) rc = st_fail(s, err, r, "reading the database header");
    sqlite3_finalize(st);
    return rc;
}

/* Names of the objects in the schema (for "not a kvchat database"), comma-separated. */
static int schema_objects(store *s, char *buf, size_t cap, int *n, store_error *err)
{
    sqlite3_stmt *st;
    *n = 0;
    buf[0] = 0;
    int rc = st_prepare(s, "SELECT name FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%' ORDER BY name", &st, err);
    if (rc) return rc;
    size_t o = 0;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        if (*n < 6 && name && o < cap) {
            int w = snprintf(buf + o, cap - o, "%s%s", *n ? ", " : "", name);
            if (w > 0) o += (size_t)w;
        }
        (*n)++;
    }
    if (r != SQLITE_DONE) rc = st_fail(s, err, r, "reading the schema");
    sqlite3_finalize(st);
    return rc;
}

/* The database header and schema as one snapshot: application_id, user_version and the
 * schema's objects (read inside one transaction, so another process's commit never falls
 * between two of the reads). */
typedef struct st_header {
    int64_t appid, ver;
    char objs[256];
    int n_objs;
} st_header;

static int read_header(store *s, st_header *h, store_error *err)
{
    int rc;
    if ((rc = pragma_int(s, "PRAGMA application_id", &h->appid, err)) ||
        (rc = pragma_int(s, "PRAGMA user_version", &h->ver, err)) ||
        (rc = schema_objects(s, h->objs, sizeof h->objs, &h->n_objs, err))) {
        if (rc == STORE_ERR_FOREIGN || rc == STORE_ERR_CORRUPT)
            rc = st_set(s, err, STORE_ERR_FOREIGN, "not a kvchat database (%s)", sqlite3_errmsg(s->db));
    }
    return rc;
}

/* Whose database is it: another application's, a newer kvchat's, or ours (any version up to
 * STORE_SCHEMA_VERSION, 0 = empty). */
static int check_header(store *s, const st_header *h, store_error *err)
{
    if (h->appid != 0 && h->appid != STORE_APPLICATION_ID)
        return st_set(s, err, STORE_ERR_FOREIGN, "not a kvchat database (it belongs to another application: id %#llx)",
                      (unsigned long long)h->appid);
    if (h->ver == 0 && h->n_objs > 0)
        return st_set(s, err, STORE_ERR_FOREIGN, "not a kvchat database (it holds %s%s and no kvchat schema version)",
                      h->objs, h->n_objs > 6 ? ", …" : "");
    if (h->ver > 0 && h->appid != STORE_APPLICATION_ID)
        return st_set(s, err, STORE_ERR_FOREIGN, "not a kvchat database (schema version %lld but no kvchat id)",
                      (long long)h->ver);
    if (h->ver > STORE_SCHEMA_VERSION)
        return st_set(s, err, STORE_ERR_NEWER,
                      "written by a newer kvchat (schema version %lld; this kvchat knows up to %d); it was left "
                      "untouched — use a newer kvchat, or another --db",
                      (long long)h->ver, STORE_SCHEMA_VERSION);
    return STORE_OK;
}

/* Creation and every migration in one write transaction (BEGIN IMMEDIATE: other openers wait
 * on the busy timeout), the header read and checked again once the lock is held: another
 * process may have created, migrated — or replaced — the file since we looked. Nobody ever
 * sees a half-made schema or a schema version without the kvchat id. */
static int migrate(store *s, store_error *err)
{
    st_header h;
    int rc = st_begin(s, err);
    if (rc) return rc;
    if ((rc = read_header(s, &h, err)) || (rc = check_header(s, &h, err))) {
        st_rollback(s);
        return rc;
    }
    if (h.ver >= STORE_SCHEMA_VERSION) {
        st_rollback(s);
        return STORE_OK;
    }
    for (int64_t v = h.ver; v < STORE_SCHEMA_VERSION; v++) {
        char tail[96];
        snprintf(tail, sizeof tail, "PRAGMA user_version = %d; PRAGMA application_id = %d;", (int)v + 1,
                 STORE_APPLICATION_ID);
        if ((rc = st_exec(s, migrations[v], err)) || (rc = st_exec(s, tail, err))) {
            st_rollback(s);
            return st_set(s, err, rc, "migrating the schema from version %d to %d: %s", (int)v, (int)v + 1,
                          err ? err->msg : "");
        }
    }
    if ((rc = st_commit(s, err)))
        return st_set(s, err, rc, "migrating the schema from version %d to %d: %s", (int)h.ver, STORE_SCHEMA_VERSION,
                      err ? err->msg : "");
    return STORE_OK;
}

/* PRAGMA journal_mode = WAL needs the database alone for a moment; while other processes open
 * it at the same time SQLite can answer SQLITE_BUSY at once (without calling the busy
 * handler), so retry for as long as the busy timeout × BEGIN_RETRIES. */
static int set_wal(store *s, store_error *err)
{
    int64_t start = store_now_ms();
    for (;;) {
        sqlite3_stmt *st;
        int rc = st_prepare(s, "PRAGMA journal_mode = WAL", &st, err);
        if (rc) return rc;
        int r = sqlite3_step(st);
        int wal = r == SQLITE_ROW && sqlite3_column_text(st, 0) && !strcmp((const char *)sqlite3_column_text(st, 0), "wal");
        sqlite3_finalize(st);
        if (wal) return STORE_OK;
        if (r != SQLITE_ROW && (r & 0xff) != SQLITE_BUSY && (r & 0xff) != SQLITE_LOCKED)
            return st_fail(s, err, r, "switching to WAL");
        int64_t waited = store_now_ms() - start;
        if (waited >= (int64_t)BUSY_TIMEOUT_MS * BEGIN_RETRIES)
            return st_set(s, err, STORE_ERR_BUSY, "switching to WAL: the database stayed locked for %d s",
                          (int)(waited / 1000));
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

static void dir_of(const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", path);
    char *slash = strrchr(buf, '/');
    if (!slash) snprintf(buf, cap, ".");
    else if (slash == buf) buf[1] = 0;
    else *slash = 0;
}

int store_open(const char *path, int flags, store **out, store_error *err)
{
    *out = NULL;
    if (!path || !*path) {
        if (err) {
            err->code = STORE_ERR_INVALID;
            snprintf(err->msg, sizeof err->msg, "no database path");
        }
        return STORE_ERR_INVALID;
    }
    store *s = calloc(1, sizeof *s);
    if (!s || !(s->path = dup_str(path))) {
        free(s);
        if (err) {
            err->code = STORE_ERR_NOMEM;
            snprintf(err->msg, sizeof err->msg, "%s: out of memory", path);
        }
        return STORE_ERR_NOMEM;
    }
    s->readonly = (flags & STORE_OPEN_READONLY) != 0;
    s->kv_chunk = STORE_KV_CHUNK_DEFAULT;
    int rc;
    int exists = file_exists(path);
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    if (!exists) {
        if (flags & (STORE_OPEN_NO_CREATE | STORE_OPEN_READONLY)) {
            rc = st_set(s, err, (flags & STORE_OPEN_NO_CREATE) ? STORE_ERR_NOTFOUND : STORE_ERR_IO,
                        "no such database (%s)", strerror(ENOENT));
            goto fail;
        }
        struct stat sb;
        if (stat(dir, &sb) != 0 && errno != ENOENT && errno != ENOTDIR) {
            rc = st_set(s, err, STORE_ERR_READONLY, "cannot create the database: cannot reach the directory %s (%s)", dir,
                        strerror(errno));
            goto fail;
        }
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            rc = st_set(s, err, STORE_ERR_IO, "cannot create the database: the directory %s does not exist", dir);
            goto fail;
        }
    }
    if (!s->readonly) {
        /* WAL needs the directory (for -wal and -shm) and the file to be writable */
        if (access(dir, W_OK | X_OK) != 0) {
            rc = st_set(s, err, STORE_ERR_READONLY, "cannot write in the directory %s (%s)", dir, strerror(errno));
            goto fail;
        }
        if (exists && access(path, W_OK) != 0) {
            rc = st_set(s, err, STORE_ERR_READONLY, "the database file is not writable (%s)", strerror(errno));
            goto fail;
        }
    }
    int oflags = s->readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    int r = sqlite3_open_v2(path, &s->db, oflags | SQLITE_OPEN_NOMUTEX, NULL);
    if (r != SQLITE_OK) {
        rc = st_fail(s, err, r, "cannot open");
        goto fail;
    }
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, BUSY_TIMEOUT_MS);

    /* Look before writing anything: the header (application_id, user_version) and the schema,
     * as one snapshot. */
    st_header h;
    if ((rc = st_exec(s, "BEGIN", err))) goto fail;
    rc = read_header(s, &h, err);
    st_rollback(s);
    if (rc || (rc = check_header(s, &h, err))) goto fail;
    if (s->readonly) {
        if (h.ver < STORE_SCHEMA_VERSION && h.n_objs > 0) {
            rc = st_set(s, err, STORE_ERR_READONLY, "schema version %lld needs migrating to %d: open it once with write access",
                        (long long)h.ver, STORE_SCHEMA_VERSION);
            goto fail;
        }
        if ((rc = st_exec(s, "PRAGMA foreign_keys = ON; PRAGMA query_only = ON;", err))) goto fail;
        *out = s;
        return STORE_OK;
    }

    if (h.ver == 0 && (rc = st_exec(s, "PRAGMA auto_vacuum = INCREMENTAL;", err))) goto fail;
    /* journal_mode is persistent; set it only when it is not WAL yet (it needs a moment alone) */
    sqlite3_stmt *jm;
    if ((rc = st_prepare(s, "PRAGMA journal_mode", &jm, err))) goto fail;
    int is_wal = sqlite3_step(jm) == SQLITE_ROW && sqlite3_column_text(jm, 0) &&
                 !strcmp((const char *)sqlite3_column_text(jm, 0), "wal");
    sqlite3_finalize(jm);
    if (!is_wal && (rc = set_wal(s, err))) goto fail;
    const char *sync = (flags & STORE_OPEN_SYNC_NORMAL) ? "PRAGMA synchronous = NORMAL; PRAGMA secure_delete = FAST;"
                                                         : "PRAGMA synchronous = FULL;";
    /* the WAL is cut back to 64 MiB after checkpoints (KV blobs would otherwise leave it large) */
    if ((rc = st_exec(s, "PRAGMA foreign_keys = ON; PRAGMA cell_size_check = ON; PRAGMA journal_size_limit = 67108864;",
                      err)) ||
        (rc = st_exec(s, sync, err)))
        goto fail;
    if ((rc = migrate(s, err))) goto fail;
    *out = s;
    return STORE_OK;
fail:
    store_close(s);
    return rc;
}

void store_close(store *s)
{
    if (!s) return;
    if (s->db) sqlite3_close_v2(s->db);
    free(s->path);
    free(s);
}

const char *store_path(const store *s) { return s->path; }
void store_set_kv_write_delay(store *s, int ms) { s->kv_delay_ms = ms > 0 ? ms : 0; }
void store_set_kv_chunk_size(store *s, size_t bytes) { s->kv_chunk = bytes ? bytes : STORE_KV_CHUNK_DEFAULT; }

/* ---- names ------------------------------------------------------------------------------------ */

static const char *const role_names[] = {"system", "user", "assistant"};
static const char *const finish_names[] = {"", "eog", "length", "context", "stopped", "error", "stop"};

const char *store_role_name(int role) { return role >= 0 && role < 3 ? role_names[role] : "?"; }
const char *store_finish_name(int f) { return f >= 0 && f < 7 ? finish_names[f] : "?"; }

int store_role_from_name(const char *s)
{
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, role_names[i])) return i;
    return -1;
}

int store_finish_from_name(const char *s)
{
    for (int i = 1; s && i < 7; i++)
        if (!strcmp(s, finish_names[i])) return i;
    return -1;
}

/* ---- models ----------------------------------------------------------------------------------- */

static int model_register_locked(store *s, const char *fp, const char *path, const char *name, const char *arch,
                                 const char *wtype, int64_t file_size, int64_t *id, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s,
                        "INSERT INTO models(fingerprint, path, name, arch, weight_type, file_size, created_at, last_used) "
                        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) ON CONFLICT(fingerprint) DO UPDATE SET "
                        "path = CASE WHEN ?2 = '' THEN path ELSE ?2 END, name = CASE WHEN ?3 = '' THEN name ELSE ?3 END, "
                        "arch = CASE WHEN ?4 = '' THEN arch ELSE ?4 END, "
                        "weight_type = CASE WHEN ?5 = '' THEN weight_type ELSE ?5 END, "
                        "file_size = CASE WHEN ?6 = 0 THEN file_size ELSE ?6 END, last_used = ?7 RETURNING id",
                        &st, err);
    if (rc) return rc;
    sqlite3_bind_text(st, 1, fp, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, path ? path : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, name ? name : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, arch ? arch : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, wtype ? wtype : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, file_size);
    sqlite3_bind_int64(st, 7, store_now_ms());
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) *id = sqlite3_column_int64(st, 0);
    else rc = st_fail(s, err, r, "registering the model");
    sqlite3_finalize(st);
    return rc;
}

int store_model_register(store *s, const char *fingerprint, const char *path, const char *name, const char *arch,
                         const char *weight_type, int64_t file_size, int64_t *id, store_error *err)
{
    if (!fingerprint || !*fingerprint) return st_set(s, err, STORE_ERR_INVALID, "a model needs a fingerprint");
    int rc = st_begin(s, err);
    if (rc) return rc;
    return st_end(s, model_register_locked(s, fingerprint, path, name, arch, weight_type, file_size, id, err), err);
}

void store_model_clear(store_model *m)
{
    free(m->fingerprint);
    free(m->path);
    free(m->name);
    free(m->arch);
    free(m->weight_type);
    memset(m, 0, sizeof *m);
}

int store_model_get(store *s, int64_t id, store_model *out, store_error *err)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    int rc = st_prepare(s, "SELECT fingerprint, path, name, arch, weight_type, file_size FROM models WHERE id = ?", &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, id);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        out->id = id;
        out->fingerprint = col_dup(st, 0, NULL);
        out->path = col_dup(st, 1, NULL);
        out->name = col_dup(st, 2, NULL);
        out->arch = col_dup(st, 3, NULL);
        out->weight_type = col_dup(st, 4, NULL);
        out->file_size = sqlite3_column_int64(st, 5);
        if (!out->fingerprint || !out->path || !out->name || !out->arch || !out->weight_type) {
            store_model_clear(out);
            rc = st_set(s, err, STORE_ERR_NOMEM, "out of memory");
        }
    } else if (r == SQLITE_DONE) rc = st_set(s, err, STORE_ERR_NOTFOUND, "no model %lld", (long long)id);
    else rc = st_fail(s, err, r, "reading a model");
    sqlite3_finalize(st);
    return rc;
}

/* ---- parameters --------------------------------------------------------------------------------- */

/* Bind p's ten columns (temperature … max_tokens) from index i. */
static void bind_params(sqlite3_stmt *st, int i, const store_params *p)
{
    if (!p || !p->set) {
        for (int k = 0; k < 10; k++) sqlite3_bind_null(st, i + k);
        return;
    }
    sqlite3_bind_double(st, i + 0, p->temperature);
    sqlite3_bind_int(st, i + 1, p->top_k);
    sqlite3_bind_double(st, i + 2, p->top_p);
    sqlite3_bind_double(st, i + 3, p->min_p);
    sqlite3_bind_double(st, i + 4, p->repeat_penalty);
    sqlite3_bind_int(st, i + 5, p->repeat_last_n);
    sqlite3_bind_double(st, i + 6, p->presence_penalty);
    sqlite3_bind_double(st, i + 7, p->frequency_penalty);
    if (p->seed_set) {
        char seed[24];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed); /* TEXT: a u64 (schema 3) */
        sqlite3_bind_text(st, i + 8, seed, -1, SQLITE_TRANSIENT);
    } else {
        sqlite3_bind_null(st, i + 8);
    }
    sqlite3_bind_int(st, i + 9, p->max_tokens);
}

static void read_params(sqlite3_stmt *st, int i, store_params *p)
{
    memset(p, 0, sizeof *p);
    p->set = sqlite3_column_type(st, i) != SQLITE_NULL;
    if (!p->set) return;
    p->temperature = sqlite3_column_double(st, i + 0);
    p->top_k = sqlite3_column_int(st, i + 1);
    p->top_p = sqlite3_column_double(st, i + 2);
    p->min_p = sqlite3_column_double(st, i + 3);
    p->repeat_penalty = sqlite3_column_double(st, i + 4);
    p->repeat_last_n = sqlite3_column_int(st, i + 5);
    p->presence_penalty = sqlite3_column_double(st, i + 6);
    p->frequency_penalty = sqlite3_column_double(st, i + 7);
    p->seed_set = sqlite3_column_type(st, i + 8) != SQLITE_NULL;
    if (sqlite3_column_type(st, i + 8) == SQLITE_INTEGER) {
        p->seed = (uint64_t)sqlite3_column_int64(st, i + 8);
    } else if (p->seed_set) {
        const char *t = (const char *)sqlite3_column_text(st, i + 8);
        p->seed = t ? strtoull(t, NULL, 10) : 0;
    }
    p->max_tokens = sqlite3_column_int(st, i + 9);
}

/* ---- conversations ---------------------------------------------------------------------------- */

static int conv_exists(store *s, int64_t id, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s, "SELECT 1 FROM conversations WHERE id = ?", &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, id);
    int r = sqlite3_step(st);
    if (r == SQLITE_DONE) rc = st_set(s, err, STORE_ERR_NOTFOUND, "no conversation %lld", (long long)id);
    else if (r != SQLITE_ROW) rc = st_fail(s, err, r, "looking up a conversation");
    sqlite3_finalize(st);
    return rc;
}

static int conv_insert_locked(store *s, int64_t model_id, const char *title, const char *system, const store_params *p,
                              int64_t created, int64_t updated, int64_t *id, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s,
                        "INSERT INTO conversations(model_id, title, system_prompt, temperature, top_k, top_p, min_p, "
                        "repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed, max_tokens, created_at, "
                        "updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                        &st, err);
    if (rc) return rc;
    if (model_id > 0) sqlite3_bind_int64(st, 1, model_id);
    else sqlite3_bind_null(st, 1);
    sqlite3_bind_text(st, 2, title ? title : "", -1, SQLITE_STATIC);
    if (system) sqlite3_bind_text(st, 3, system, -1, SQLITE_STATIC);
    else sqlite3_bind_null(st, 3);
    bind_params(st, 4, p);
    sqlite3_bind_int64(st, 14, created);
    sqlite3_bind_int64(st, 15, updated);
    rc = st_step_done(s, st, "creating a conversation", err);
    sqlite3_finalize(st);
    if (!rc) *id = sqlite3_last_insert_rowid(s->db);
    return rc;
}

int store_conv_create(store *s, int64_t model_id, const char *system_prompt, const store_params *p, int64_t created_at,
                      int64_t *id, store_error *err)
{
    int64_t now = created_at ? created_at : store_now_ms();
    int rc = st_begin(s, err);
    if (rc) return rc;
    return st_end(s, conv_insert_locked(s, model_id, "", system_prompt, p, now, now, id, err), err);
}

void store_conv_clear(store_conv *c)
{
    free(c->title);
    free(c->model_name);
    free(c->model_fingerprint);
    free(c->model_path);
    free(c->system_prompt);
    free(c->ctx_tokens);
    free(c->snippet);
    memset(c, 0, sizeof *c);
}

#define CONV_COLUMNS                                                                                                \
    "c.id, c.title, COALESCE(c.model_id, 0), COALESCE(m.name, ''), COALESCE(m.fingerprint, ''), "                 \
    "COALESCE(m.path, ''), c.system_prompt, c.temperature, c.top_k, c.top_p, c.min_p, c.repeat_penalty, "          \
    "c.repeat_last_n, c.presence_penalty, c.frequency_penalty, c.seed, c.max_tokens, c.created_at, c.updated_at, " \
    "COALESCE(c.head_id, 0), "                                                                                      \
    "(SELECT count(*) FROM messages x WHERE x.conversation_id = c.id), "                                           \
    "(SELECT count(*) FROM messages x WHERE x.conversation_id = c.id AND NOT EXISTS "                              \
    "  (SELECT 1 FROM messages y WHERE y.parent_id = x.id)) "

/* Fill row (a store_conv) from a row of CONV_COLUMNS. */
static int read_conv(store *s, sqlite3_stmt *st, void *row, store_error *err)
{
    store_conv *c = row;
    memset(c, 0, sizeof *c);
    c->id = sqlite3_column_int64(st, 0);
    c->title = col_dup(st, 1, NULL);
    c->model_id = sqlite3_column_int64(st, 2);
    c->model_name = col_dup(st, 3, NULL);
    c->model_fingerprint = col_dup(st, 4, NULL);
    c->model_path = col_dup(st, 5, NULL);
    if (sqlite3_column_type(st, 6) != SQLITE_NULL) c->system_prompt = col_dup(st, 6, NULL);
    read_params(st, 7, &c->params);
    c->created_at = sqlite3_column_int64(st, 17);
    c->updated_at = sqlite3_column_int64(st, 18);
    c->head_id = sqlite3_column_int64(st, 19);
    c->n_messages = sqlite3_column_int(st, 20);
    c->n_branches = sqlite3_column_int(st, 21);
    if (!c->title || !c->model_name || !c->model_fingerprint || !c->model_path ||
        (sqlite3_column_type(st, 6) != SQLITE_NULL && !c->system_prompt)) {
        store_conv_clear(c);
        return st_set(s, err, STORE_ERR_NOMEM, "out of memory");
    }
    return STORE_OK;
}

/* read_conv, and column 22: the search's snippet (NULL: the match is in the title only). */
static int read_conv_snippet(store *s, sqlite3_stmt *st, void *row, store_error *err)
{
    int rc = read_conv(s, st, row, err);
    store_conv *c = row;
    if (rc || sqlite3_column_type(st, 22) != SQLITE_TEXT) return rc;
    if (!(c->snippet = col_dup(st, 22, NULL))) {
        store_conv_clear(c);
        return st_set(s, err, STORE_ERR_NOMEM, "out of memory");
    }
    return STORE_OK;
}

static int decode_tokens(const void *b, size_t bytes, int32_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (bytes % 4) return -1;
    size_t k = bytes / 4;
    int32_t *t = malloc((k ? k : 1) * sizeof *t);
    if (!t) return -1;
    const uint8_t *p = b;
    for (size_t i = 0; i < k; i++) t[i] = st_token_at(p + 4 * i);
    *out = t;
    *n = k;
    return 0;
}

int store_conv_get(store *s, int64_t id, store_conv *out, store_error *err)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    int rc = st_prepare(s,
                        "SELECT " CONV_COLUMNS ", COALESCE(c.ctx_model_id, 0), COALESCE(c.ctx_head_id, 0), c.ctx_tokens "
                        "FROM conversations c LEFT JOIN models m ON m.id = c.model_id WHERE c.id = ?",
                        &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, id);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        if (!(rc = read_conv(s, st, out, err))) {
            out->ctx_model_id = sqlite3_column_int64(st, 22);
            out->ctx_head_id = sqlite3_column_int64(st, 23);
            if (sqlite3_column_type(st, 24) == SQLITE_BLOB) {
                const void *b = sqlite3_column_blob(st, 24);
                size_t bytes = (size_t)sqlite3_column_bytes(st, 24);
                if (decode_tokens(b, bytes, &out->ctx_tokens, &out->n_ctx_tokens)) {
                    /* a damaged context only costs the exact resume: drop it, keep the rest */
                    out->ctx_model_id = out->ctx_head_id = 0;
                }
            }
        }
    } else if (r == SQLITE_DONE) rc = st_set(s, err, STORE_ERR_NOTFOUND, "no conversation %lld", (long long)id);
    else rc = st_fail(s, err, r, "reading a conversation");
    sqlite3_finalize(st);
    return rc;
}

int store_conv_last(store *s, int64_t *id, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s, "SELECT id FROM conversations ORDER BY updated_at DESC, id DESC LIMIT 1", &st, err);
    if (rc) return rc;
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) *id = sqlite3_column_int64(st, 0);
    else if (r == SQLITE_DONE) rc = st_set(s, err, STORE_ERR_NOTFOUND, "no saved conversations yet");
    else rc = st_fail(s, err, r, "finding the last conversation");
    sqlite3_finalize(st);
    return rc;
}

/* A user's search text as an FTS5 query: every word a quoted prefix phrase, all required.
 * NULL when there are no words. */
static char *fts_query(const char *q)
{
    size_t n = strlen(q);
    char *out = malloc(n * 2 + 8 * (n + 1) + 1);
    if (!out) return NULL;
    size_t o = 0;
    int words = 0;
    for (const char *p = q; *p;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        if (words++) out[o++] = ' ';
        out[o++] = '"';
        while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            if (*p == '"') out[o++] = '"';
            out[o++] = *p++;
        }
        out[o++] = '"';
        out[o++] = '*';
    }
    out[o] = 0;
    if (!words) {
        free(out);
        return NULL;
    }
    return out;
}

static void drop_convs(void *rows, size_t n) { store_conv_list_free(rows, n); }

static int list_run(store *s, const char *q, const char *fts, store_conv **rows, size_t *n, store_error *err)
{
    sqlite3_stmt *st;
    const char *sql_all = "SELECT " CONV_COLUMNS " FROM conversations c LEFT JOIN models m ON m.id = c.model_id "
                          "ORDER BY c.updated_at DESC, c.id DESC";
    /* with the newest matching message's snippet (FTS5 snippet(): the match between \x02 and \x03,
     * about 12 tokens around it, "…" where it is cut) */
    const char *sql_fts = "SELECT " CONV_COLUMNS ", (SELECT snippet(messages_fts, 0, char(2), char(3), '…', 12) "
                          "FROM messages_fts JOIN messages x ON x.id = messages_fts.rowid WHERE messages_fts MATCH ?2 "
                          "AND x.conversation_id = c.id ORDER BY x.id DESC LIMIT 1) "
                          "FROM conversations c LEFT JOIN models m ON m.id = c.model_id "
                          "WHERE instr(lower(c.title), lower(?1)) > 0 OR c.id IN (SELECT x.conversation_id FROM "
                          "messages_fts f JOIN messages x ON x.id = f.rowid WHERE messages_fts MATCH ?2) "
                          "ORDER BY c.updated_at DESC, c.id DESC";
    const char *sql_title = "SELECT " CONV_COLUMNS " FROM conversations c LEFT JOIN models m ON m.id = c.model_id "
                            "WHERE instr(lower(c.title), lower(?1)) > 0 ORDER BY c.updated_at DESC, c.id DESC";
    int rc = st_prepare(s, !q ? sql_all : fts ? sql_fts : sql_title, &st, err);
    if (rc) return rc;
    if (q) sqlite3_bind_text(st, 1, q, -1, SQLITE_STATIC);
    if (q && fts) sqlite3_bind_text(st, 2, fts, -1, SQLITE_STATIC);
    void *v;
    if ((rc = read_rows(s, st, sizeof **rows, fts ? read_conv_snippet : read_conv, drop_convs, "listing conversations",
                        &v, n, err)))
        return rc;
    *rows = v;
    return STORE_OK;
}

int store_conv_list(store *s, const char *query, store_conv **rows, size_t *n, store_error *err)
{
    *rows = NULL;
    *n = 0;
    if (!query || !query[strspn(query, " \t\r\n")]) return list_run(s, NULL, NULL, rows, n, err);
    char *fts = fts_query(query);
    int rc = list_run(s, query, fts, rows, n, err);
    if (rc && fts) rc = list_run(s, query, NULL, rows, n, err); /* an FTS syntax the user hit: titles only */
    free(fts);
    return rc;
}

void store_conv_list_free(store_conv *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) store_conv_clear(&rows[i]);
    free(rows);
}

/* One UPDATE of a conversation in its own transaction; NOTFOUND when no row changed. */
static int conv_update(store *s, int64_t id, const char *sql, const char *what, void (*bind)(sqlite3_stmt *, const void *),
                       const void *arg, store_error *err)
{
    int rc = st_begin(s, err);
    if (rc) return rc;
    sqlite3_stmt *st;
    if (!(rc = st_prepare(s, sql, &st, err))) {
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_int64(st, 2, store_now_ms());
        if (bind) bind(st, arg);
        rc = st_step_done(s, st, what, err);
        sqlite3_finalize(st);
    }
    if (!rc && sqlite3_changes(s->db) == 0) rc = st_set(s, err, STORE_ERR_NOTFOUND, "no conversation %lld", (long long)id);
    return st_end(s, rc, err);
}

static void bind_text3(sqlite3_stmt *st, const void *a)
{
    if (a) sqlite3_bind_text(st, 3, a, -1, SQLITE_STATIC);
    else sqlite3_bind_null(st, 3);
}
static void bind_params3(sqlite3_stmt *st, const void *a) { bind_params(st, 3, a); }
static void bind_int3(sqlite3_stmt *st, const void *a)
{
    int64_t v = *(const int64_t *)a;
    if (v > 0) sqlite3_bind_int64(st, 3, v);
    else sqlite3_bind_null(st, 3);
}

int store_conv_rename(store *s, int64_t id, const char *title, store_error *err)
{
    return conv_update(s, id, "UPDATE conversations SET title = COALESCE(?3, ''), updated_at = ?2 WHERE id = ?1",
                       "renaming a conversation", bind_text3, title, err);
}

int store_conv_set_system(store *s, int64_t id, const char *system_prompt, store_error *err)
{
    return conv_update(s, id, "UPDATE conversations SET system_prompt = ?3, updated_at = ?2 WHERE id = ?1",
                       "saving the system prompt", bind_text3, system_prompt, err);
}

int store_conv_set_model(store *s, int64_t id, int64_t model_id, store_error *err)
{
    return conv_update(s, id, "UPDATE conversations SET model_id = ?3, updated_at = ?2 WHERE id = ?1",
                       "saving the conversation's model", bind_int3, &model_id, err);
}

int store_conv_set_params(store *s, int64_t id, const store_params *p, store_error *err)
{
    return conv_update(s, id,
                       "UPDATE conversations SET temperature = ?3, top_k = ?4, top_p = ?5, min_p = ?6, repeat_penalty = ?7, "
                       "repeat_last_n = ?8, presence_penalty = ?9, frequency_penalty = ?10, seed = ?11, max_tokens = ?12 "
                       "WHERE id = ?1 AND ?2 IS NOT NULL",
                       "saving the parameters", bind_params3, p, err);
}

int store_conv_set_head(store *s, int64_t id, int64_t head_id, store_error *err)
{
    return conv_update(s, id, "UPDATE conversations SET head_id = ?3, updated_at = ?2 WHERE id = ?1", "moving the head",
                       bind_int3, &head_id, err);
}

int store_conv_set_context(store *s, int64_t id, int64_t model_id, int64_t head_id, const int32_t *tokens, size_t n,
                           store_error *err)
{
    uint8_t *b = st_tokens_encode(tokens, n);
    if (!b) return st_set(s, err, STORE_ERR_NOMEM, "out of memory");
    int rc = st_begin(s, err);
    sqlite3_stmt *st = NULL;
    if (!rc && !(rc = st_prepare(s,
                                 "UPDATE conversations SET ctx_model_id = ?2, ctx_head_id = ?3, ctx_tokens = ?4 WHERE id = ?1",
                                 &st, err))) {
        sqlite3_bind_int64(st, 1, id);
        if (model_id > 0) sqlite3_bind_int64(st, 2, model_id);
        else sqlite3_bind_null(st, 2);
        sqlite3_bind_int64(st, 3, head_id);
        sqlite3_bind_blob(st, 4, b, (int)(n * 4), SQLITE_STATIC);
        rc = st_step_done(s, st, "saving the token context", err);
        if (!rc && sqlite3_changes(s->db) == 0) rc = st_set(s, err, STORE_ERR_NOTFOUND, "no conversation %lld", (long long)id);
    }
    sqlite3_finalize(st);
    rc = st_end(s, rc, err);
    free(b);
    return rc;
}

int store_conv_delete(store *s, int64_t id, store_error *err)
{
    int rc = st_begin(s, err);
    if (rc) return rc;
    /* The KV snapshots of exactly this conversation's context go with it (shared prefixes,
     * which other chats use, stay until they are evicted). */
    rc = st_run_id(s,
                   "DELETE FROM kv_prefixes WHERE kind = 0 AND id IN (SELECT p.id FROM kv_prefixes p, conversations c "
                   "WHERE c.id = ?1 AND p.model_id = c.ctx_model_id AND length(c.ctx_tokens) >= length(p.tokens) "
                   "AND substr(c.ctx_tokens, 1, length(p.tokens)) = p.tokens AND length(p.tokens) + 64 >= "
                   "length(c.ctx_tokens))",
                   id, "deleting the conversation's KV snapshots", err);
    if (!rc && !(rc = st_run_id(s, "DELETE FROM conversations WHERE id = ?", id, "deleting a conversation", err)) &&
        sqlite3_changes(s->db) == 0)
        rc = st_set(s, err, STORE_ERR_NOTFOUND, "no conversation %lld", (long long)id);
    return st_end(s, rc, err);
}

/* ---- messages --------------------------------------------------------------------------------- */

/* A title from a message: its first non-empty line, trimmed, at most TITLE_MAX_BYTES bytes
 * cut at a character boundary (with "…" when cut). */
static void make_title(const char *text, size_t len, char *out, size_t cap)
{
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r')) i++;
    size_t e = i;
    while (e < len && text[e] != '\n' && text[e] != '\r' && text[e] != 0) e++;
    while (e > i && (text[e - 1] == ' ' || text[e - 1] == '\t')) e--;
    size_t n = e - i, max = cap - 4 < TITLE_MAX_BYTES ? cap - 4 : TITLE_MAX_BYTES;
    int cut = 0;
    if (n > max) {
        n = max;
        while (n > 0 && ((unsigned char)text[i + n] & 0xC0) == 0x80) n--; /* not inside a character */
        cut = 1;
    }
    memcpy(out, text + i, n);
    if (cut) memcpy(out + n, "\xe2\x80\xa6", 3), n += 3;
    out[n] = 0;
}

static int gen_insert_locked(store *s, int64_t msg_id, const store_gen *g, store_error *err)
{
    sqlite3_stmt *st;
    int rc = st_prepare(s,
                        "INSERT OR REPLACE INTO generations(message_id, temperature, top_k, top_p, min_p, repeat_penalty, "
                        "repeat_last_n, presence_penalty, frequency_penalty, seed, max_tokens, finish, ttft_ms, "
                        "prefill_tps, decode_tps, n_prompt, n_reused, n_prefilled, n_generated) VALUES (?1, ?2, ?3, ?4, "
                        "?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
                        &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, msg_id);
    bind_params(st, 2, &g->params);
    int f = g->finish >= STORE_FINISH_EOG && g->finish <= STORE_FINISH_STOP ? g->finish : STORE_FINISH_ERROR;
    sqlite3_bind_text(st, 12, finish_names[f], -1, SQLITE_STATIC);
    double d[3] = {g->ttft_ms, g->prefill_tps, g->decode_tps};
    for (int i = 0; i < 3; i++) {
        if (d[i] == d[i] && d[i] < 1e300 && d[i] > -1e300) sqlite3_bind_double(st, 13 + i, d[i]);
        else sqlite3_bind_null(st, 13 + i);
    }
    sqlite3_bind_int(st, 16, g->n_prompt);
    sqlite3_bind_int(st, 17, g->n_reused);
    sqlite3_bind_int(st, 18, g->n_prefilled);
    sqlite3_bind_int(st, 19, g->n_generated);
    rc = st_step_done(s, st, "saving a generation record", err);
    sqlite3_finalize(st);
    return rc;
}

static int msg_insert_locked(store *s, int64_t conv_id, int64_t parent_id, int role, const char *content, size_t len,
                             int n_tokens, int64_t created, int partial, const store_gen *gen, int64_t *id,
                             store_error *err)
{
    sqlite3_stmt *st;
    int rc;
    if (parent_id > 0) {
        if ((rc = st_prepare(s, "SELECT conversation_id FROM messages WHERE id = ?", &st, err))) return rc;
        sqlite3_bind_int64(st, 1, parent_id);
        int r = sqlite3_step(st);
        if (r == SQLITE_ROW && sqlite3_column_int64(st, 0) != conv_id)
            rc = st_set(s, err, STORE_ERR_INVALID, "message %lld belongs to another conversation", (long long)parent_id);
        else if (r == SQLITE_DONE) rc = st_set(s, err, STORE_ERR_NOTFOUND, "no message %lld", (long long)parent_id);
        else if (r != SQLITE_ROW) rc = st_fail(s, err, r, "looking up the parent message");
        sqlite3_finalize(st);
        if (rc) return rc;
    }
    if ((rc = st_prepare(s,
                         "INSERT INTO messages(conversation_id, parent_id, role, content, n_tokens, created_at, partial, "
                         "model_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         &st, err)))
        return rc;
    sqlite3_bind_int64(st, 1, conv_id);
    if (parent_id > 0) sqlite3_bind_int64(st, 2, parent_id);
    else sqlite3_bind_null(st, 2);
    sqlite3_bind_text(st, 3, role_names[role], -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, content ? content : "", (int)len, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, n_tokens);
    sqlite3_bind_int64(st, 6, created);
    sqlite3_bind_int(st, 7, partial);
    if (gen && gen->model_id > 0) sqlite3_bind_int64(st, 8, gen->model_id);
    else sqlite3_bind_null(st, 8);
    rc = st_step_done(s, st, "saving a message", err);
    sqlite3_finalize(st);
    if (rc) return rc;
    *id = sqlite3_last_insert_rowid(s->db);
    if (gen && gen->set && (rc = gen_insert_locked(s, *id, gen, err))) return rc;
    return STORE_OK;
}

static int gen_partial(const store_gen *g)
{
    return g && g->set && (g->finish == STORE_FINISH_STOPPED || g->finish == STORE_FINISH_ERROR);
}

int store_msg_add(store *s, int64_t conv_id, int64_t parent_id, int role, const char *content, size_t len,
                  int n_tokens, int64_t created_at, const store_gen *gen, int64_t *id, store_error *err)
{
    if (role < 0 || role > 2) return st_set(s, err, STORE_ERR_INVALID, "unknown message role %d", role);
    if (len > INT_MAX) return st_set(s, err, STORE_ERR_INVALID, "a message of %zu bytes is too long", len);
    int64_t now = created_at ? created_at : store_now_ms();
    int rc = st_begin(s, err);
    if (rc) return rc;
    sqlite3_stmt *st = NULL;
    if ((rc = conv_exists(s, conv_id, err)) ||
        (rc = msg_insert_locked(s, conv_id, parent_id, role, content, len, n_tokens, now, gen_partial(gen), gen, id, err)))
        goto done;
    char title[TITLE_MAX_BYTES + 8] = "";
    if (role == STORE_ROLE_USER) make_title(content ? content : "", len, title, sizeof title);
    if ((rc = st_prepare(s,
                         "UPDATE conversations SET head_id = ?2, updated_at = ?3, "
                         "title = CASE WHEN title = '' AND ?4 != '' THEN ?4 ELSE title END WHERE id = ?1",
                         &st, err)))
        goto done;
    sqlite3_bind_int64(st, 1, conv_id);
    sqlite3_bind_int64(st, 2, *id);
    sqlite3_bind_int64(st, 3, now);
    sqlite3_bind_text(st, 4, title, -1, SQLITE_STATIC);
    rc = st_step_done(s, st, "moving the head", err);
    sqlite3_finalize(st);
done:
    return st_end(s, rc, err);
}

int store_msg_update(store *s, int64_t id, const char *content, size_t len, int n_tokens, const store_gen *gen,
                     store_error *err)
{
    if (len > INT_MAX) return st_set(s, err, STORE_ERR_INVALID, "a message of %zu bytes is too long", len);
    int rc = st_begin(s, err);
    if (rc) return rc;
    sqlite3_stmt *st = NULL;
    if ((rc = st_prepare(s, "UPDATE messages SET content = ?2, n_tokens = ?3, partial = ?4, "
                            "model_id = COALESCE(?5, model_id) WHERE id = ?1", &st, err)))
        goto done;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, content ? content : "", (int)len, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, n_tokens);
    sqlite3_bind_int(st, 4, gen_partial(gen));
    if (gen && gen->model_id > 0) sqlite3_bind_int64(st, 5, gen->model_id);
    else sqlite3_bind_null(st, 5);
    rc = st_step_done(s, st, "updating a message", err);
    sqlite3_finalize(st);
    if (!rc && sqlite3_changes(s->db) == 0) rc = st_set(s, err, STORE_ERR_NOTFOUND, "no message %lld", (long long)id);
    if (!rc && gen && gen->set) rc = gen_insert_locked(s, id, gen, err);
    if (!rc && !(rc = st_prepare(s,
                                 "UPDATE conversations SET updated_at = ?2 WHERE id = (SELECT conversation_id FROM messages "
                                 "WHERE id = ?1)",
                                 &st, err))) {
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_int64(st, 2, store_now_ms());
        rc = st_step_done(s, st, "updating a conversation", err);
        sqlite3_finalize(st);
    }
done:
    return st_end(s, rc, err);
}

int store_msg_set_tokens(store *s, int64_t id, int n_tokens, store_error *err)
{
    int rc = st_begin(s, err);
    if (rc) return rc;
    sqlite3_stmt *st;
    if (!(rc = st_prepare(s, "UPDATE messages SET n_tokens = ?2 WHERE id = ?1", &st, err))) {
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_int(st, 2, n_tokens);
        rc = st_step_done(s, st, "updating a message", err);
        sqlite3_finalize(st);
    }
    return st_end(s, rc, err);
}

void store_msgs_free(store_msg *msgs, size_t n)
{
    for (size_t i = 0; msgs && i < n; i++) free(msgs[i].content);
    free(msgs);
}

/* Read one message row (MSG_COLUMNS) into row (a store_msg), checking each field; problems go to
 * m->problem. */
#define MSG_COLUMNS                                                                                               \
    "m.id, COALESCE(m.parent_id, 0), m.role, m.content, m.n_tokens, m.created_at, m.partial, g.message_id, "   \
    "g.temperature, g.top_k, g.top_p, g.min_p, g.repeat_penalty, g.repeat_last_n, g.presence_penalty, "         \
    "g.frequency_penalty, g.seed, g.max_tokens, g.finish, g.ttft_ms, g.prefill_tps, g.decode_tps, g.n_prompt, " \
    "g.n_reused, g.n_prefilled, g.n_generated, m.conversation_id, m.model_id "

static int read_msg(store *s, sqlite3_stmt *st, void *row, store_error *err)
{
    store_msg *m = row;
    memset(m, 0, sizeof *m);
    m->id = sqlite3_column_int64(st, 0);
    m->parent_id = sqlite3_column_int64(st, 1);
    int64_t conv = sqlite3_column_int64(st, 26);
    const char *role = (const char *)sqlite3_column_text(st, 2);
    m->role = store_role_from_name(role);
    int ctype = sqlite3_column_type(st, 3);
    if (m->role < 0) {
        snprintf(m->problem, sizeof m->problem, "message %lld (conversation %lld): role '%.40s' is not system, user or assistant",
                 (long long)m->id, (long long)conv, role ? role : "NULL");
        m->role = STORE_ROLE_ASSISTANT;
    } else if (ctype != SQLITE_TEXT) {
        snprintf(m->problem, sizeof m->problem, "message %lld (conversation %lld): content is %s, not text", (long long)m->id,
                 (long long)conv, ctype == SQLITE_NULL ? "NULL" : ctype == SQLITE_BLOB ? "a blob" : "a number");
    } else if (sqlite3_column_type(st, 5) != SQLITE_INTEGER) {
        snprintf(m->problem, sizeof m->problem, "message %lld (conversation %lld): created_at is not a time",
                 (long long)m->id, (long long)conv);
    }
    if (m->problem[0]) {
        m->content = dup_str("");
        m->len = 0;
    } else {
        m->content = col_dup(st, 3, &m->len);
    }
    if (!m->content) return st_set(s, err, STORE_ERR_NOMEM, "out of memory reading messages");
    m->n_tokens = sqlite3_column_int(st, 4);
    m->created_at = sqlite3_column_int64(st, 5);
    m->partial = sqlite3_column_int(st, 6) != 0;
    m->model_id = sqlite3_column_type(st, 27) == SQLITE_INTEGER ? sqlite3_column_int64(st, 27) : 0;
    if (sqlite3_column_type(st, 7) != SQLITE_NULL) {
        store_gen *g = &m->gen;
        g->set = 1;
        read_params(st, 8, &g->params);
        int f = store_finish_from_name((const char *)sqlite3_column_text(st, 18));
        g->finish = f < 0 ? STORE_FINISH_ERROR : f;
        g->ttft_ms = sqlite3_column_double(st, 19);
        g->prefill_tps = sqlite3_column_double(st, 20);
        g->decode_tps = sqlite3_column_double(st, 21);
        g->n_prompt = sqlite3_column_int(st, 22);
        g->n_reused = sqlite3_column_int(st, 23);
        g->n_prefilled = sqlite3_column_int(st, 24);
        g->n_generated = sqlite3_column_int(st, 25);
    }
    return STORE_OK;
}

static void drop_msgs(void *rows, size_t n) { store_msgs_free(rows, n); }

int store_conv_messages(store *s, int64_t conv_id, store_msg **msgs, size_t *n, store_error *err)
{
    *msgs = NULL;
    *n = 0;
    sqlite3_stmt *st;
    int rc = st_prepare(s,
                        "SELECT " MSG_COLUMNS " FROM messages m LEFT JOIN generations g ON g.message_id = m.id "
                        "WHERE m.conversation_id = ? ORDER BY m.id",
                        &st, err);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, conv_id);
    void *v;
    if ((rc = read_rows(s, st, sizeof **msgs, read_msg, drop_msgs, "reading messages", &v, n, err))) return rc;
    *msgs = v;
    return STORE_OK;
}

static size_t find_msg(const store_msg *v, size_t n, int64_t id)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && v[lo].id == id ? lo : (size_t)-1;
}

int store_conv_path_cut(store *s, int64_t conv_id, int64_t head_id, store_msg **msgs, size_t *n, int64_t *cut,
                        store_error *err)
{
    *msgs = NULL;
    *n = 0;
    *cut = 0;
    store_msg *all = NULL;
    size_t n_all = 0;
    int rc = store_conv_messages(s, conv_id, &all, &n_all, err);
    if (rc || head_id <= 0) {
        store_msgs_free(all, n_all);
        return rc;
    }
    size_t *chain = malloc((n_all + 1) * sizeof *chain);
    unsigned char *seen = calloc(n_all + 1, 1);
    if (!chain || !seen) {
        free(chain);
        free(seen);
        store_msgs_free(all, n_all);
        return st_set(s, err, STORE_ERR_NOMEM, "out of memory");
    }
    size_t depth = 0;
    int64_t id = head_id, child = 0;
    while (id > 0) {
        size_t i = find_msg(all, n_all, id);
        if (i == (size_t)-1 || seen[i]) {
            if (!child)
                rc = st_set(s, err, STORE_ERR_CORRUPT, "conversation %lld: its head %lld is not one of its messages",
                            (long long)conv_id, (long long)id);
            else *cut = child; /* the chain is whole up to child; its parent is missing or repeats */
            break;
        }
        seen[i] = 1;
        chain[depth++] = i;
        child = id;
        id = all[i].parent_id;
    }
    store_msg *path = NULL;
    if (!rc && !(path = calloc(depth ? depth : 1, sizeof *path))) rc = st_set(s, err, STORE_ERR_NOMEM, "out of memory");
    if (!rc) {
        for (size_t k = 0; k < depth; k++) {
            path[k] = all[chain[depth - 1 - k]];
            all[chain[depth - 1 - k]].content = NULL; /* moved */
        }
        *msgs = path;
        *n = depth;
    }
    free(chain);
    free(seen);
    store_msgs_free(all, n_all);
    return rc;
}

int store_conv_path(store *s, int64_t conv_id, int64_t head_id, store_msg **msgs, size_t *n, store_error *err)
{
    int64_t cut = 0;
    int rc = store_conv_path_cut(s, conv_id, head_id, msgs, n, &cut, err);
    if (rc || !cut) return rc;
    int64_t parent = (*msgs)[0].parent_id;
    store_msgs_free(*msgs, *n);
    *msgs = NULL;
    *n = 0;
    return st_set(s, err, STORE_ERR_CORRUPT,
                  "message %lld (conversation %lld): its parent %lld is missing or the parents form a loop",
                  (long long)cut, (long long)conv_id, (long long)parent);
}

/* ---- import ------------------------------------------------------------------------------------- */

int store_conv_import(store *s, const store_conv *c, const char *model_fingerprint, const char *model_name,
                      const char *model_path, const char *model_arch, const char *model_weight_type,
                      const store_msg *msgs, const long *parent_index, size_t n, long head_index, int64_t *id,
                      store_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (parent_index[i] >= (long)i || parent_index[i] < -1)
            return st_set(s, err, STORE_ERR_INVALID, "message %zu: parent %ld must be an earlier message (or none)", i,
                          parent_index[i]);
        if (msgs[i].role < 0 || msgs[i].role > 2)
            return st_set(s, err, STORE_ERR_INVALID, "message %zu: unknown role", i);
        if (msgs[i].len > INT_MAX) return st_set(s, err, STORE_ERR_INVALID, "message %zu is too long", i);
    }
    if (head_index < -1 || head_index >= (long)n)
        return st_set(s, err, STORE_ERR_INVALID, "head %ld is not one of the %zu messages", head_index, n);
    int64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return st_set(s, err, STORE_ERR_NOMEM, "out of memory");
    int rc = st_begin(s, err);
    int64_t model_id = 0, conv_id = 0;
    if (!rc && model_fingerprint && *model_fingerprint)
        rc = model_register_locked(s, model_fingerprint, model_path, model_name, model_arch, model_weight_type, 0,
                                   &model_id, err);
    int64_t now = store_now_ms();
    if (!rc)
        rc = conv_insert_locked(s, model_id, c->title, c->system_prompt, &c->params, c->created_at ? c->created_at : now,
                                c->updated_at ? c->updated_at : now, &conv_id, err);
    for (size_t i = 0; !rc && i < n; i++) {
        const store_msg *m = &msgs[i];
        rc = msg_insert_locked(s, conv_id, parent_index[i] >= 0 ? ids[parent_index[i]] : 0, m->role, m->content, m->len,
                               m->n_tokens, m->created_at ? m->created_at : now, m->partial, &m->gen, &ids[i], err);
    }
    if (!rc && head_index >= 0) {
        sqlite3_stmt *st;
        if (!(rc = st_prepare(s, "UPDATE conversations SET head_id = ?2 WHERE id = ?1", &st, err))) {
            sqlite3_bind_int64(st, 1, conv_id);
            sqlite3_bind_int64(st, 2, ids[head_index]);
            rc = st_step_done(s, st, "setting the head", err);
            sqlite3_finalize(st);
        }
    }
    if (!(rc = st_end(s, rc, err))) *id = conv_id;
    free(ids);
    return rc;
}

/* ---- check -------------------------------------------------------------------------------------- */

typedef struct report {
    char *buf;
    size_t len, cap;
    int n;
} report;

static void report_add(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report_add(report *r, const char *fmt, ...)
{
    char line[800];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    size_t l = strlen(line);
    r->n++;
    if (r->len + l + 2 > r->cap) {
        size_t nc = r->cap ? r->cap * 2 : 1024;
        while (nc < r->len + l + 2) nc *= 2;
        char *nb = realloc(r->buf, nc);
        if (!nb) return;
        r->buf = nb;
        r->cap = nc;
    }
    memcpy(r->buf + r->len, line, l);
    r->len += l;
    r->buf[r->len++] = '\n';
    r->buf[r->len] = 0;
}

int store_kv_verify_all(store *s, void (*problem)(void *ud, const char *msg), void *ud, store_error *err);

static void kv_problem(void *ud, const char *msg) { report_add(ud, "%s", msg); }

/* One message's parent link, for check_parents. */
typedef struct parent_link {
    int64_t id, parent, conv;
} parent_link;

/* Index of v[i]'s parent in v (sorted by id), or n when it has none / it is not there. */
static size_t parent_index(const parent_link *v, size_t n, size_t i)
{
    if (!v[i].parent) return n;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid].id < v[i].parent) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && v[lo].id == v[i].parent ? lo : n;
}

/* Parent links that are not a tree: a message whose parent is in another conversation, and
 * every loop of parents (each reported once, by its members in order). O(messages · log). */
static void check_parents(store *s, report *r)
{
    sqlite3_stmt *st;
    if (st_prepare(s, "SELECT m.id, COALESCE(m.parent_id, 0), m.conversation_id, p.conversation_id FROM messages m "
                      "LEFT JOIN messages p ON p.id = m.parent_id ORDER BY m.id",
                   &st, NULL))
        return;
    size_t n = 0, cap = 0;
    parent_link *v = NULL;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 256;
            parent_link *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                report_add(r, "parents: out of memory (not checked)");
                break;
            }
            v = nv;
            cap = nc;
        }
        v[n].id = sqlite3_column_int64(st, 0);
        v[n].parent = sqlite3_column_int64(st, 1);
        v[n].conv = sqlite3_column_int64(st, 2);
        if (v[n].parent && sqlite3_column_type(st, 3) != SQLITE_NULL && sqlite3_column_int64(st, 3) != v[n].conv) {
            report_add(r, "message %lld (conversation %lld): its parent %lld belongs to conversation %lld",
                       (long long)v[n].id, (long long)v[n].conv, (long long)v[n].parent,
                       (long long)sqlite3_column_int64(st, 3));
            v[n].parent = 0; /* not followed */
        }
        n++;
    }
    sqlite3_finalize(st);
    /* walk each chain once: 0 = unseen, 1 = on the walk in progress, 2 = done */
    unsigned char *state = calloc(n ? n : 1, 1);
    for (size_t i = 0; state && i < n; i++) {
        size_t k = i, p;
        while (state[k] == 0) {
            state[k] = 1;
            if ((p = parent_index(v, n, k)) == n) break;
            k = p;
        }
        if (state[k] == 1 && parent_index(v, n, k) != n) { /* the walk came back to k: a loop */
            char ids[200];
            size_t o = 0, j = k, len = 0;
            do {
                if (o < sizeof ids - 24)
                    o += (size_t)snprintf(ids + o, sizeof ids - o, "%s%lld", len ? " → " : "", (long long)v[j].id);
                len++;
                j = parent_index(v, n, j);
            } while (j != k && j != n && len <= n);
            report_add(r, "conversation %lld: the parents of messages %s%s → %lld form a loop", (long long)v[k].conv,
                       ids, o >= sizeof ids - 24 ? " …" : "", (long long)v[k].id);
        }
        for (size_t j = i; j != n && state[j] == 1; j = parent_index(v, n, j)) state[j] = 2;
    }
    if (!state && n) report_add(r, "parents: out of memory (not checked)");
    free(state);
    free(v);
}

int store_check(store *s, char **out, int *n_problems, store_error *err)
{
    *out = NULL;
    *n_problems = 0;
    report r = {0};
    sqlite3_stmt *st;
    int rc = st_prepare(s, "PRAGMA integrity_check", &st, err);
    if (rc) return rc;
    int row;
    while ((row = sqlite3_step(st)) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(st, 0);
        if (t && strcmp(t, "ok")) report_add(&r, "integrity: %s", t);
    }
    if (row != SQLITE_DONE) report_add(&r, "integrity: %s", sqlite3_errmsg(s->db));
    sqlite3_finalize(st);
    if (!st_prepare(s, "PRAGMA foreign_key_check", &st, NULL)) {
        while (sqlite3_step(st) == SQLITE_ROW)
            report_add(&r, "foreign key: %s row %lld refers to a missing row of %s", sqlite3_column_text(st, 0),
                       (long long)sqlite3_column_int64(st, 1), sqlite3_column_text(st, 2));
        sqlite3_finalize(st);
    }
    if (!s->readonly) {
        int x = sqlite3_exec(s->db, "INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)", NULL,
                             NULL, NULL);
        if (x != SQLITE_OK) report_add(&r, "search index: %s", sqlite3_errmsg(s->db));
    }
    if (!st_prepare(s, "SELECT " MSG_COLUMNS " FROM messages m LEFT JOIN generations g ON g.message_id = m.id", &st,
                    NULL)) {
        while (sqlite3_step(st) == SQLITE_ROW) {
            store_msg m;
            if (read_msg(s, st, &m, NULL) == STORE_OK && m.problem[0]) report_add(&r, "%s", m.problem);
            free(m.content);
        }
        sqlite3_finalize(st);
    }
    check_parents(s, &r);
    store_kv_verify_all(s, kv_problem, &r, NULL);
    *n_problems = r.n;
    if (!r.n) report_add(&r, "ok");
    if (!r.buf) return st_set(s, err, STORE_ERR_NOMEM, "out of memory");
    *out = r.buf;
    return rc;
}
