/* test_store: the SQLite store — schema and version checks (newer / foreign / read-only left untouched), conversations with branches, FTS5 search, corrupt rows named, import, and the KV prefix store (chunks, dedup, supersede, shared prefixes, LRU eviction, corruption, half-written rows, the 1 → 2 migration, deltas over shared rows). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/kv_cache.h"
#include "storage/store.h"
#include "tests/support/testcheck.h"
#include "tests/support/testutil.h"

static int setup_dir(void **state) { return tu_tmpdir_make("test-store"); }

static store *open_new(const char *name)
{
    const char *p = tu_tmp_path(name);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -f '%s' '%s-wal' '%s-shm'", p, p, p);
    assert_int_equal(system(cmd), 0);
    store *s = NULL;
    store_error err = {0};
    int rc = store_open(p, 0, &s, &err);
    if (rc) fail_msg("store_open: %s", err.msg);
    return s;
}

/* Run one SQL statement on the file with a plain connection (to inspect or damage it). */
static void raw_exec(const char *path, const char *sql)
{
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) fail_msg("raw_exec %s: %s", sql, msg ? msg : "?");
    sqlite3_close(db);
}

static char *raw_text(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    char *v = strdup(sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) ? (const char *)sqlite3_column_text(st, 0) : "");
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* ---- opening ------------------------------------------------------------------------------------ */

static void test_open_creates_schema(void **state)
{
    (void)state;
    store *s = open_new("a.db");
    store_close(s);
    const char *p = tu_tmp_path("a.db");
    assert_int_equal(tu_sql_int(p, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
    assert_int_equal(tu_sql_int(p, "PRAGMA application_id"), STORE_APPLICATION_ID);
    char *jm = raw_text(p, "PRAGMA journal_mode");
    assert_string_equal(jm, "wal");
    free(jm);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM sqlite_schema WHERE name = 'messages_fts'"), 1);
    /* reopening an up-to-date database changes nothing */
    store_error err = {0};
    assert_int_equal(store_open(p, 0, &s, &err), STORE_OK);
    store_close(s);
    assert_int_equal(tu_sql_int(p, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
    /* a missing file with NO_CREATE */
    assert_int_equal(store_open(tu_tmp_path("missing.db"), STORE_OPEN_NO_CREATE, &s, &err), STORE_ERR_NOTFOUND);
    assert_int_equal(access(tu_tmp_path("missing.db"), F_OK), -1);
    /* a missing directory */
    assert_int_equal(store_open(tu_tmp_path("no/such/dir.db"), 0, &s, &err), STORE_ERR_IO);
    assert_non_null(strstr(err.msg, "does not exist"));
}

static void test_newer_version_untouched(void **state)
{
    (void)state;
    store *s = open_new("newer.db");
    store_close(s);
    const char *p = tu_tmp_path("newer.db");
    raw_exec(p, "PRAGMA journal_mode = DELETE; PRAGMA user_version = 99;");
    size_t n1, n2;
    char *before = tu_read_file(p, &n1);
    assert_non_null(before);
    struct stat st1, st2;
    stat(p, &st1);
    store_error err = {0};
    assert_int_equal(store_open(p, 0, &s, &err), STORE_ERR_NEWER);
    assert_null(s);
    assert_non_null(strstr(err.msg, "newer kvchat"));
    assert_non_null(strstr(err.msg, "99"));
    assert_non_null(strstr(err.msg, "untouched"));
    assert_non_null(strstr(err.msg, p));
    char *after = tu_read_file(p, &n2);
    assert_non_null(after);
    stat(p, &st2);
    assert_int_equal(n1, n2);
    assert_memory_equal(before, after, n1);
    assert_int_equal(st1.st_mtime, st2.st_mtime);
    free(before);
    free(after);
    assert_int_equal(tu_sql_int(p, "PRAGMA user_version"), 99);
    char *jm = raw_text(p, "PRAGMA journal_mode");
    assert_string_equal(jm, "delete"); /* not switched to WAL either */
    free(jm);
}

static void test_foreign_databases(void **state)
{
    (void)state;
    store *s = NULL;
    store_error err = {0};
    const char *p = tu_tmp_path("other.db");
    unlink(p);
    raw_exec(p, "CREATE TABLE recipes(id INTEGER PRIMARY KEY, name TEXT); INSERT INTO recipes(name) VALUES ('soup');");
    size_t n1, n2;
    char *before = tu_read_file(p, &n1);
    assert_non_null(before);
    assert_int_equal(store_open(p, 0, &s, &err), STORE_ERR_FOREIGN);
    assert_non_null(strstr(err.msg, "not a kvchat database"));
    assert_non_null(strstr(err.msg, "recipes"));
    char *after = tu_read_file(p, &n2);
    assert_non_null(after);
    assert_int_equal(n1, n2);
    assert_memory_equal(before, after, n1);
    free(before);
    free(after);
    /* another application's id */
    const char *q = tu_tmp_path("app.db");
    unlink(q);
    raw_exec(q, "PRAGMA application_id = 1234; PRAGMA user_version = 1;");
    assert_int_equal(store_open(q, 0, &s, &err), STORE_ERR_FOREIGN);
    assert_non_null(strstr(err.msg, "another application"));
    /* not SQLite at all */
    const char *t = tu_tmp_path("text.db");
    FILE *f = fopen(t, "w");
    for (int i = 0; i < 200; i++) fputs("this is not a database, just some text\n", f);
    fclose(f);
    assert_int_equal(store_open(t, 0, &s, &err), STORE_ERR_FOREIGN);
    assert_non_null(strstr(err.msg, "not a kvchat database"));
    assert_non_null(strstr(err.msg, t));
}

static void test_readonly_directory(void **state)
{
    (void)state;
    const char *d = tu_tmp_path("ro");
    chmod(tu_tmpdir(), 0755);
    mkdir(d, 0755);
    chmod(d, 0555);
    char p[600];
    snprintf(p, sizeof p, "%s/kvchat.db", d);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* as an ordinary user: root writes anywhere */
        if (geteuid() == 0 && (setgid(65534) || setuid(65534))) _exit(3);
        store *s = NULL;
        store_error err = {0};
        int rc = store_open(p, 0, &s, &err);
        _exit(rc == STORE_ERR_READONLY && strstr(err.msg, "cannot write in the directory") && access(p, F_OK) != 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    chmod(d, 0755);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- conversations -------------------------------------------------------------------------------- */

static int64_t add(store *s, int64_t conv, int64_t parent, int role, const char *text)
{
    int64_t id = 0;
    store_error err = {0};
    store_gen g = {0};
    if (role == STORE_ROLE_ASSISTANT) {
        g.set = 1;
        g.finish = STORE_FINISH_EOG;
        g.params.set = 1;
        g.params.temperature = 0.7;
        g.params.seed_set = 1;
        g.params.seed = 0xfedcba9876543210ULL;
        g.ttft_ms = 12.5;
        g.n_generated = 7;
    }
    if (store_msg_add(s, conv, parent, role, text, strlen(text), 3, 0, role == STORE_ROLE_ASSISTANT ? &g : NULL, &id, &err))
        fail_msg("store_msg_add: %s", err.msg);
    return id;
}

static void test_conversations_and_branches(void **state)
{
    (void)state;
    store *s = open_new("conv.db");
    store_error err = {0};
    int64_t model = 0, conv = 0;
    assert_int_equal(store_model_register(s, "00112233445566778899aabbccddeeff", "/m/x.gguf", "x", "llama", "F16", 123, &model, &err), STORE_OK);
    store_params p = {.set = 1, .temperature = 0.8, .top_k = 40, .top_p = 0.95, .min_p = 0.05, .repeat_penalty = 1,
                      .repeat_last_n = 64, .max_tokens = -1};
    assert_int_equal(store_conv_create(s, model, "You are terse.", &p, 0, &conv, &err), STORE_OK);
    const char *first = "  \n  Tell me a very long story about a dragon who lived under a mountain made of glass and snow\nsecond line";
    int64_t u1 = add(s, conv, 0, STORE_ROLE_USER, first);
    int64_t a1 = add(s, conv, u1, STORE_ROLE_ASSISTANT, "Once upon a time...");
    int64_t u2 = add(s, conv, a1, STORE_ROLE_USER, "More!");
    int64_t a2 = add(s, conv, u2, STORE_ROLE_ASSISTANT, "The dragon slept.");
    /* /regen: a sibling reply */
    int64_t a2b = add(s, conv, u2, STORE_ROLE_ASSISTANT, "The dragon woke.");
    store_conv c;
    assert_int_equal(store_conv_get(s, conv, &c, &err), STORE_OK);
    assert_int_equal(c.n_messages, 5);
    assert_int_equal(c.n_branches, 2);
    assert_int_equal(c.head_id, a2b);
    assert_string_equal(c.system_prompt, "You are terse.");
    assert_string_equal(c.model_name, "x");
    assert_true(c.params.set);
    assert_true(c.params.temperature == 0.8);
    /* the title: first line, trimmed, cut at 80 bytes with an ellipsis */
    assert_true(strncmp(c.title, "Tell me a very long story", 25) == 0);
    assert_true(strlen(c.title) <= 83);
    assert_non_null(strstr(c.title, "\xe2\x80\xa6"));
    assert_null(strchr(c.title, '\n'));
    store_conv_clear(&c);
    store_msg *m;
    size_t n;
    assert_int_equal(store_conv_path(s, conv, a2b, &m, &n, &err), STORE_OK);
    assert_int_equal(n, 4);
    assert_int_equal(m[0].id, u1);
    assert_int_equal(m[3].id, a2b);
    assert_string_equal(m[3].content, "The dragon woke.");
    assert_true(m[3].gen.set);
    assert_int_equal(m[3].gen.finish, STORE_FINISH_EOG);
    assert_true(m[3].gen.params.seed_set);
    assert_true(m[3].gen.params.seed == 0xfedcba9876543210ULL); /* all 64 bits */
    store_msgs_free(m, n);
    /* /undo: the head goes back; the messages stay */
    assert_int_equal(store_conv_set_head(s, conv, a1, &err), STORE_OK);
    assert_int_equal(store_conv_get(s, conv, &c, &err), STORE_OK);
    assert_int_equal(c.head_id, a1);
    assert_int_equal(c.n_messages, 5);
    store_conv_clear(&c);
    assert_int_equal(store_conv_path(s, conv, a1, &m, &n, &err), STORE_OK);
    assert_int_equal(n, 2);
    store_msgs_free(m, n);
    (void)a2;
    /* a parent from another conversation is refused */
    int64_t conv2 = 0, bad = 0;
    assert_int_equal(store_conv_create(s, model, NULL, NULL, 0, &conv2, &err), STORE_OK);
    assert_int_equal(store_msg_add(s, conv2, u1, STORE_ROLE_USER, "x", 1, 0, 0, NULL, &bad, &err), STORE_ERR_INVALID);
    /* a stopped reply is partial */
    store_gen g = {.set = 1, .finish = STORE_FINISH_STOPPED};
    int64_t part;
    assert_int_equal(store_msg_add(s, conv2, 0, STORE_ROLE_ASSISTANT, "half a rep", 10, 4, 0, &g, &part, &err), STORE_OK);
    assert_int_equal(store_conv_path(s, conv2, part, &m, &n, &err), STORE_OK);
    assert_int_equal(n, 1);
    assert_true(m[0].partial);
    assert_int_equal(m[0].gen.finish, STORE_FINISH_STOPPED);
    store_msgs_free(m, n);
    /* the exact token context */
    int32_t toks[5] = {1, 2, -3, 400000, 5};
    assert_int_equal(store_conv_set_context(s, conv, model, a1, toks, 5, &err), STORE_OK);
    assert_int_equal(store_conv_get(s, conv, &c, &err), STORE_OK);
    assert_int_equal(c.n_ctx_tokens, 5);
    assert_memory_equal(c.ctx_tokens, toks, sizeof toks);
    assert_int_equal(c.ctx_head_id, a1);
    store_conv_clear(&c);
    /* list: most recent first; rename; last */
    store_conv *rows;
    size_t nr;
    assert_int_equal(store_conv_list(s, NULL, &rows, &nr, &err), STORE_OK);
    assert_int_equal(nr, 2);
    store_conv_list_free(rows, nr);
    assert_int_equal(store_conv_rename(s, conv, "Glass mountain", &err), STORE_OK);
    int64_t last;
    assert_int_equal(store_conv_last(s, &last, &err), STORE_OK);
    assert_int_equal(last, conv);
    assert_int_equal(store_conv_rename(s, 999, "x", &err), STORE_ERR_NOTFOUND);
    /* delete cascades */
    assert_int_equal(store_conv_delete(s, conv, &err), STORE_OK);
    assert_int_equal(store_conv_get(s, conv, &c, &err), STORE_ERR_NOTFOUND);
    assert_int_equal(store_conv_delete(s, conv, &err), STORE_ERR_NOTFOUND);
    store_close(s);
    assert_int_equal(tu_sql_int(tu_tmp_path("conv.db"), "SELECT count(*) FROM messages"), 1);
    assert_int_equal(tu_sql_int(tu_tmp_path("conv.db"), "SELECT count(*) FROM generations"), 1);
}

static size_t count_hits(store *s, const char *q)
{
    store_conv *rows;
    size_t n;
    store_error err = {0};
    if (store_conv_list(s, q, &rows, &n, &err)) fail_msg("list: %s", err.msg);
    store_conv_list_free(rows, n);
    return n;
}

static void test_search(void **state)
{
    (void)state;
    store *s = open_new("search.db");
    store_error err = {0};
    int64_t c1, c2, c3;
    store_conv_create(s, 0, NULL, NULL, 0, &c1, &err);
    store_conv_create(s, 0, NULL, NULL, 0, &c2, &err);
    store_conv_create(s, 0, NULL, NULL, 0, &c3, &err);
    int64_t m = add(s, c1, 0, STORE_ROLE_USER, "A dragon lived in the mountains");
    add(s, c1, m, STORE_ROLE_ASSISTANT, "It breathed fire at the café.");
    add(s, c2, 0, STORE_ROLE_USER, "Tell me about cats");
    add(s, c3, 0, STORE_ROLE_USER, "Dragons and cats, together");
    assert_int_equal(count_hits(s, "dragon"), 2);     /* prefix: "dragons" too */
    assert_int_equal(count_hits(s, "DRAG"), 2);
    assert_int_equal(count_hits(s, "cafe"), 1);        /* diacritics folded */
    assert_int_equal(count_hits(s, "cats dragon"), 1); /* every word */
    assert_int_equal(count_hits(s, "fire\" OR \"x"), 0); /* FTS syntax is quoted away */
    assert_int_equal(count_hits(s, "NEAR("), 0);
    assert_int_equal(count_hits(s, "   "), 3);
    assert_int_equal(store_conv_rename(s, c2, "Felines", &err), STORE_OK);
    assert_int_equal(count_hits(s, "feli"), 1); /* titles too */
    /* each hit carries the newest matching message's snippet, the match marked (FTS5 snippet()) */
    {
        store_conv *rows;
        size_t n;
        assert_int_equal(store_conv_list(s, "cafe", &rows, &n, &err), STORE_OK);
        assert_int_equal(n, 1);
        assert_string_equal(rows[0].snippet, "It breathed fire at the \x02" "café\x03.");
        store_conv_list_free(rows, n);
        assert_int_equal(store_conv_list(s, "drag", &rows, &n, &err), STORE_OK);
        assert_int_equal(n, 2);
        assert_string_equal(rows[0].snippet, "\x02" "Dragons\x03 and cats, together"); /* c3, updated last */
        assert_string_equal(rows[1].snippet, "A \x02" "dragon\x03 lived in the mountains");
        store_conv_list_free(rows, n);
        assert_int_equal(store_conv_list(s, "feli", &rows, &n, &err), STORE_OK);
        assert_int_equal(n, 1);
        assert_null(rows[0].snippet); /* the title matched, no message */
        store_conv_list_free(rows, n);
        int64_t c4, m4 = 0;
        store_conv_create(s, 0, NULL, NULL, 0, &c4, &err);
        static char longtext[4000];
        size_t o = 0;
        for (int i = 0; i < 60; i++) o += (size_t)snprintf(longtext + o, sizeof longtext - o, "word%d 日本語 ", i);
        snprintf(longtext + o, sizeof longtext - o, "needle and more words after it to cut");
        m4 = add(s, c4, 0, STORE_ROLE_USER, longtext);
        (void)m4;
        assert_int_equal(store_conv_list(s, "needle", &rows, &n, &err), STORE_OK);
        assert_int_equal(n, 1);
        assert_non_null(strstr(rows[0].snippet, "\x02" "needle\x03"));
        assert_true(!strncmp(rows[0].snippet, "…", 3)); /* cut before: marked */
        assert_true(strlen(rows[0].snippet) < 200);
        store_conv_list_free(rows, n);
    }
    assert_int_equal(store_conv_delete(s, c1, &err), STORE_OK);
    assert_int_equal(count_hits(s, "breathed"), 0);
    char *report = NULL;
    int problems = -1;
    assert_int_equal(store_check(s, &report, &problems, &err), STORE_OK);
    assert_int_equal(problems, 0);
    assert_string_equal(report, "ok\n");
    free(report);
    store_close(s);
}

static void test_corrupt_rows_named(void **state)
{
    (void)state;
    store *s = open_new("bad.db");
    store_error err = {0};
    int64_t conv;
    store_conv_create(s, 0, NULL, NULL, 0, &conv, &err);
    int64_t u = add(s, conv, 0, STORE_ROLE_USER, "hello");
    int64_t a = add(s, conv, u, STORE_ROLE_ASSISTANT, "hi there");
    int64_t u2 = add(s, conv, a, STORE_ROLE_USER, "bye");
    store_close(s);
    char sql[300];
    snprintf(sql, sizeof sql,
             "PRAGMA ignore_check_constraints = ON; UPDATE messages SET content = x'00ff' WHERE id = %lld; "
             "UPDATE messages SET role = 'wizard' WHERE id = %lld;",
             (long long)a, (long long)u2);
    raw_exec(tu_tmp_path("bad.db"), sql);
    assert_int_equal(store_open(tu_tmp_path("bad.db"), 0, &s, &err), STORE_OK);
    store_msg *m;
    size_t n;
    assert_int_equal(store_conv_path(s, conv, u2, &m, &n, &err), STORE_OK);
    assert_int_equal(n, 3); /* nothing is dropped */
    assert_string_equal(m[0].content, "hello");
    assert_string_equal(m[0].problem, "");
    char want[120];
    snprintf(want, sizeof want, "message %lld (conversation %lld): content is a blob", (long long)a, (long long)conv);
    assert_non_null(strstr(m[1].problem, want));
    snprintf(want, sizeof want, "message %lld (conversation %lld): role 'wizard'", (long long)u2, (long long)conv);
    assert_non_null(strstr(m[2].problem, want));
    store_msgs_free(m, n);
    char *report = NULL;
    int problems = 0;
    assert_int_equal(store_check(s, &report, &problems, &err), STORE_OK);
    /* SQLite's own check sees the role (a CHECK constraint); ours names both rows */
    if (problems != 3) fail_msg("%d problems:\n%s", problems, report);
    assert_non_null(strstr(report, "CHECK constraint failed in messages"));
    assert_non_null(strstr(report, "content is a blob"));
    assert_non_null(strstr(report, "role 'wizard'"));
    free(report);
    /* a broken parent chain is an error naming the message */
    store_close(s);
    snprintf(sql, sizeof sql, "PRAGMA foreign_keys = OFF; UPDATE messages SET parent_id = 777 WHERE id = %lld;", (long long)u2);
    raw_exec(tu_tmp_path("bad.db"), sql);
    assert_int_equal(store_open(tu_tmp_path("bad.db"), 0, &s, &err), STORE_OK);
    assert_int_equal(store_conv_path(s, conv, u2, &m, &n, &err), STORE_ERR_CORRUPT);
    snprintf(want, sizeof want, "message %lld (conversation %lld): its parent 777", (long long)u2, (long long)conv);
    assert_non_null(strstr(err.msg, want));
    store_close(s);
    assert_int_equal(tu_sql_int(tu_tmp_path("bad.db"), "SELECT count(*) FROM messages"), 3);
}

static void test_import(void **state)
{
    (void)state;
    store *s = open_new("import.db");
    store_error err = {0};
    store_conv c = {0};
    c.title = "Imported";
    c.system_prompt = "sys";
    c.created_at = 1700000000123;
    c.updated_at = 1700000005000;
    store_msg m[3] = {0};
    m[0] = (store_msg){.role = STORE_ROLE_USER, .content = "q", .len = 1, .created_at = 1700000001000};
    m[1] = (store_msg){.role = STORE_ROLE_ASSISTANT, .content = "a1", .len = 2, .created_at = 1700000002000, .partial = 1,
                       .gen = {.set = 1, .finish = STORE_FINISH_STOPPED}};
    m[2] = (store_msg){.role = STORE_ROLE_ASSISTANT, .content = "a2", .len = 2, .created_at = 1700000003000};
    long parents[3] = {-1, 0, 0};
    int64_t id;
    assert_int_equal(store_conv_import(s, &c, "ffff", "mdl", "/x", "llama", "Q8_0", m, parents, 3, 2, &id, &err), STORE_OK);
    store_conv g;
    assert_int_equal(store_conv_get(s, id, &g, &err), STORE_OK);
    assert_string_equal(g.title, "Imported");
    assert_int_equal(g.created_at, 1700000000123);
    assert_int_equal(g.updated_at, 1700000005000);
    assert_int_equal(g.n_messages, 3);
    assert_int_equal(g.n_branches, 2);
    assert_string_equal(g.model_fingerprint, "ffff");
    store_msg *p;
    size_t n;
    assert_int_equal(store_conv_path(s, id, g.head_id, &p, &n, &err), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(p[1].content, "a2");
    store_msgs_free(p, n);
    store_conv_clear(&g);
    /* a parent after its child is refused, and nothing is written */
    long badp[3] = {-1, 2, 0};
    assert_int_equal(store_conv_import(s, &c, NULL, NULL, NULL, NULL, NULL, m, badp, 3, -1, &id, &err), STORE_ERR_INVALID);
    assert_int_equal(count_hits(s, NULL), 1);
    store_close(s);
}

/* ---- the KV prefix store --------------------------------------------------------------------------- */

typedef struct key {
    store_kv_key k;
    uint64_t h[256];
    int32_t t[4096];
} key;

static void make_key(key *x, int64_t model, const int32_t *toks, size_t n)
{
    memcpy(x->t, toks, n * sizeof *toks);
    size_t nb = n / KV_BLOCK_SIZE;
    uint64_t h = KV_HASH_ROOT;
    for (size_t i = 0; i < nb; i++) x->h[i] = h = kv_hash_block(h, x->t + i * KV_BLOCK_SIZE, KV_BLOCK_SIZE);
    size_t tail = n - nb * KV_BLOCK_SIZE;
    x->k = (store_kv_key){.model_id = model, .kv_type = "F16", .tokens = x->t, .n_tokens = n, .block_size = KV_BLOCK_SIZE,
                          .block_hashes = x->h, .n_blocks = nb,
                          .key_hash = tail ? kv_hash_block(h, x->t + nb * KV_BLOCK_SIZE, (int)tail) : h};
}

static uint8_t *blob_of(size_t n, unsigned seed)
{
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        b[i] = (uint8_t)(seed >> 16);
    }
    return b;
}

static void put(store *s, const key *k, int kind, const uint8_t *b, size_t n, uint64_t budget, store_kv_put_result *r)
{
    store_error err = {0};
    if (store_kv_put(s, &k->k, kind, b, n, budget, r, &err)) fail_msg("put: %s", err.msg);
}

static void test_kv_store(void **state)
{
    (void)state;
    store *s = open_new("kv.db");
    store_set_kv_chunk_size(s, 1000); /* several chunks per blob */
    store_error err = {0};
    int64_t model, other;
    store_model_register(s, "aaaa", "", "m", "", "", 0, &model, &err);
    store_model_register(s, "bbbb", "", "m2", "", "", 0, &other, &err);
    int32_t base[400];
    for (int i = 0; i < 400; i++) base[i] = 1000 + i;
    static key A, B, C, Q, S;
    make_key(&A, model, base, 100);
    uint8_t *ba = blob_of(3500, 1);
    store_kv_put_result r;
    put(s, &A, STORE_KV_SNAPSHOT, ba, 3500, 0, &r);
    assert_true(r.stored);
    assert_int_equal(tu_sql_int(tu_tmp_path("kv.db"), "SELECT count(*) FROM kv_chunks"), 4);
    /* found by a longer query; read back byte for byte */
    make_key(&Q, model, base, 130);
    store_kv_hit hit;
    assert_int_equal(store_kv_find(s, &Q.k, &hit, &err), STORE_OK);
    assert_int_equal(hit.id, r.id);
    assert_int_equal(hit.n_common, 100);
    void *got;
    size_t len;
    assert_int_equal(store_kv_read(s, hit.id, &got, &len, &err), STORE_OK);
    assert_int_equal(len, 3500);
    assert_memory_equal(got, ba, 3500);
    free(got);
    /* another model or KV type never matches */
    make_key(&Q, other, base, 130);
    assert_int_equal(store_kv_find(s, &Q.k, &hit, &err), STORE_ERR_NOTFOUND);
    make_key(&Q, model, base, 130);
    Q.k.kv_type = "Q8_0";
    assert_int_equal(store_kv_find(s, &Q.k, &hit, &err), STORE_ERR_NOTFOUND);
    /* the same key again: nothing new */
    put(s, &A, STORE_KV_SNAPSHOT, ba, 3500, 0, &r);
    assert_false(r.stored);
    assert_int_equal(tu_sql_int(tu_tmp_path("kv.db"), "SELECT count(*) FROM kv_prefixes"), 1);
    /* a longer snapshot of the same chat supersedes it */
    make_key(&B, model, base, 150);
    uint8_t *bb = blob_of(5000, 2);
    put(s, &B, STORE_KV_SNAPSHOT, bb, 5000, 0, &r);
    assert_true(r.stored);
    assert_int_equal(r.n_superseded, 1);
    assert_int_equal(tu_sql_int(tu_tmp_path("kv.db"), "SELECT count(*) FROM kv_prefixes"), 1);
    int64_t id_b = r.id;
    /* a chat sharing the first 40 tokens: a shared prefix of 32 (whole blocks) is suggested */
    int32_t other_toks[200];
    memcpy(other_toks, base, 40 * sizeof *base);
    for (int i = 40; i < 200; i++) other_toks[i] = 7;
    make_key(&C, model, other_toks, 120);
    uint8_t *bc = blob_of(4000, 3);
    put(s, &C, STORE_KV_SNAPSHOT, bc, 4000, 0, &r);
    assert_int_equal(r.shared_len, 32);
    make_key(&S, model, base, 32);
    uint8_t *bs = blob_of(1000, 4);
    put(s, &S, STORE_KV_SHARED, bs, 1000, 0, &r);
    assert_true(r.stored);
    int64_t id_s = r.id;
    /* a new chat with the same start gets the shared prefix (the shortest that covers it) */
    memcpy(other_toks, base, 35 * sizeof *base);
    other_toks[35] = 99;
    make_key(&Q, model, other_toks, 60);
    assert_int_equal(store_kv_find(s, &Q.k, &hit, &err), STORE_OK);
    assert_int_equal(hit.id, id_s);
    assert_int_equal(hit.n_common, 32);
    assert_int_equal(hit.kind, STORE_KV_SHARED);
    /* storing B again neither drops the shared row nor suggests another */
    put(s, &B, STORE_KV_SNAPSHOT, bb, 5000, 0, &r);
    assert_false(r.stored);
    assert_int_equal(r.shared_len, 0);
    store_kv_stats st;
    assert_int_equal(store_kv_stats_get(s, &st, &err), STORE_OK);
    assert_int_equal(st.n_prefixes, 3);
    assert_int_equal(st.n_shared, 1);
    assert_int_equal(st.bytes, 5000 + 4000 + 1000);
    /* LRU eviction: read B (a use), then a budget that keeps two of the three */
    assert_int_equal(store_kv_read(s, id_b, &got, &len, &err), STORE_OK);
    free(got);
    int ev = 0;
    assert_int_equal(store_kv_evict(s, 9000, &ev, &err), STORE_OK);
    assert_int_equal(ev, 1);
    assert_int_equal(store_kv_stats_get(s, &st, &err), STORE_OK);
    assert_true(st.bytes <= 9000);
    assert_int_equal(tu_sql_int(tu_tmp_path("kv.db"), "SELECT count(*) FROM kv_prefixes WHERE id = (SELECT max(id) FROM kv_prefixes WHERE n_tokens = 150)"), 1);
    /* larger than the whole budget: skipped, not stored */
    make_key(&Q, model, base, 300);
    uint8_t *big = blob_of(20000, 5);
    put(s, &Q, STORE_KV_SNAPSHOT, big, 20000, 9000, &r);
    assert_true(r.skipped);
    assert_false(r.stored);
    /* a put keeps the total within the budget */
    put(s, &Q, STORE_KV_SNAPSHOT, big, 20000, 26000, &r);
    assert_true(r.stored);
    assert_int_equal(store_kv_stats_get(s, &st, &err), STORE_OK);
    assert_true(st.bytes <= 26000);
    free(ba);
    free(bb);
    free(bc);
    free(bs);
    free(big);
    store_close(s);
}

static void test_kv_corruption_named(void **state)
{
    (void)state;
    store *s = open_new("kvbad.db");
    store_set_kv_chunk_size(s, 1000);
    store_error err = {0};
    int64_t model;
    store_model_register(s, "cccc", "", "m", "", "", 0, &model, &err);
    int32_t t[64];
    for (int i = 0; i < 64; i++) t[i] = i;
    static key K;
    make_key(&K, model, t, 64);
    uint8_t *b = blob_of(2500, 9);
    store_kv_put_result r;
    put(s, &K, STORE_KV_SNAPSHOT, b, 2500, 0, &r);
    store_close(s);
    const char *p = tu_tmp_path("kvbad.db");
    char sql[300], want[80];
    void *got;
    size_t len;
    /* one changed byte */
    snprintf(sql, sizeof sql,
             "UPDATE kv_chunks SET data = CAST(substr(data, 1, 10) || x'5a' || substr(data, 12) AS BLOB) WHERE prefix_id = %lld AND idx = 1",
             (long long)r.id);
    raw_exec(p, sql);
    assert_int_equal(store_open(p, 0, &s, &err), STORE_OK);
    assert_int_equal(store_kv_read(s, r.id, &got, &len, &err), STORE_ERR_CORRUPT);
    snprintf(want, sizeof want, "KV prefix %lld: checksum", (long long)r.id);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, p));
    char *report = NULL;
    int problems = 0;
    assert_int_equal(store_check(s, &report, &problems, &err), STORE_OK);
    assert_int_equal(problems, 1);
    assert_non_null(strstr(report, want));
    free(report);
    store_close(s);
    /* a truncated chunk */
    snprintf(sql, sizeof sql, "UPDATE kv_chunks SET data = CAST(substr(data, 1, 10) AS BLOB) WHERE prefix_id = %lld AND idx = 1", (long long)r.id);
    raw_exec(p, sql);
    assert_int_equal(store_open(p, 0, &s, &err), STORE_OK);
    assert_int_equal(store_kv_read(s, r.id, &got, &len, &err), STORE_ERR_CORRUPT);
    if (!strstr(err.msg, "chunk 1 holds 10 bytes, expected 1000")) fail_msg("%s", err.msg);
    store_close(s);
    /* a missing chunk */
    snprintf(sql, sizeof sql, "DELETE FROM kv_chunks WHERE prefix_id = %lld AND idx = 1", (long long)r.id);
    raw_exec(p, sql);
    assert_int_equal(store_open(p, 0, &s, &err), STORE_OK);
    assert_int_equal(store_kv_read(s, r.id, &got, &len, &err), STORE_ERR_CORRUPT);
    assert_non_null(strstr(err.msg, "chunk 1 of 3 is missing"));
    /* dropping it leaves the store consistent */
    assert_int_equal(store_kv_drop(s, r.id, &err), STORE_OK);
    tu_store_check_clean(s);
    store_close(s);
    free(b);
}

static void test_kv_half_written_never_used(void **state)
{
    (void)state;
    store *s = open_new("kvhalf.db");
    store_error err = {0};
    int64_t model;
    store_model_register(s, "dddd", "", "m", "", "", 0, &model, &err);
    int32_t t[64];
    for (int i = 0; i < 64; i++) t[i] = 5 * i;
    static key K;
    make_key(&K, model, t, 64);
    store_close(s);
    /* a writer that died after its first chunk: the row is there in state 0 */
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    const char *p = tu_tmp_path("kvhalf.db");
    char sql[600];
    snprintf(sql, sizeof sql,
             "INSERT INTO kv_prefixes(id, model_id, kv_type, n_tokens, n_blocks, key_hash, tokens, kind, size, n_chunks, "
             "state, writer_pid, created_at, last_used) VALUES (50, %lld, 'F16', 64, 4, %lld, zeroblob(256), 0, 4000, 4, 0, "
             "%d, 0, 0); INSERT INTO kv_chunks(prefix_id, idx, data) VALUES (50, 0, zeroblob(1000));"
             "INSERT INTO kv_blocks(hash, idx, prefix_id) VALUES (%lld, 0, 50);",
             (long long)model, (long long)K.k.key_hash, (int)dead, (long long)K.h[0]);
    raw_exec(p, sql);
    assert_int_equal(store_open(p, 0, &s, &err), STORE_OK);
    store_kv_hit hit;
    assert_int_equal(store_kv_find(s, &K.k, &hit, &err), STORE_ERR_NOTFOUND);
    void *got;
    size_t len;
    assert_int_equal(store_kv_read(s, 50, &got, &len, &err), STORE_ERR_NOTFOUND);
    assert_false(store_kv_has(s, &K.k));
    int removed = 0;
    assert_int_equal(store_kv_cleanup(s, &removed, &err), STORE_OK);
    assert_int_equal(removed, 1);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_chunks"), 0);
    /* a live writer's row stays */
    snprintf(sql, sizeof sql,
             "INSERT INTO kv_prefixes(id, model_id, kv_type, n_tokens, n_blocks, key_hash, tokens, kind, size, n_chunks, "
             "state, writer_pid, created_at, last_used) VALUES (51, %lld, 'F16', 64, 4, 1, zeroblob(256), 0, 4000, 4, 0, "
             "%d, %lld, 0);",
             (long long)model, (int)getppid(), (long long)store_now_ms());
    store_close(s);
    raw_exec(p, sql);
    assert_int_equal(store_open(p, 0, &s, &err), STORE_OK);
    assert_int_equal(store_kv_cleanup(s, &removed, &err), STORE_OK);
    assert_int_equal(removed, 0);
    store_close(s);
}

/* ---- schema 1 → 2; KV deltas --------------------------------------------------------------------- */

/* Parent links that are no tree: store_check names a loop by its messages and a parent in
 * another conversation; store_conv_path fails on the loop, store_conv_path_cut gives the whole
 * part and where it breaks. */
static void test_parent_loops(void **state)
{
    (void)state;
    store *s = open_new("loops.db");
    const char *p = tu_tmp_path("loops.db");
    store_error err = {0};
    int64_t conv = 0, conv2 = 0;
    assert_int_equal(store_conv_create(s, 0, NULL, NULL, 0, &conv, &err), STORE_OK);
    assert_int_equal(store_conv_create(s, 0, NULL, NULL, 0, &conv2, &err), STORE_OK);
    int64_t u1 = add(s, conv, 0, STORE_ROLE_USER, "one");
    int64_t a1 = add(s, conv, u1, STORE_ROLE_ASSISTANT, "two");
    int64_t u2 = add(s, conv, a1, STORE_ROLE_USER, "three");
    int64_t a2 = add(s, conv, u2, STORE_ROLE_ASSISTANT, "four");
    int64_t x = add(s, conv2, 0, STORE_ROLE_USER, "elsewhere");
    char *report = NULL;
    int n_problems = -1;
    assert_int_equal(store_check(s, &report, &n_problems, &err), STORE_OK);
    assert_int_equal(n_problems, 0);
    free(report);
    char sql[200];
    snprintf(sql, sizeof sql, "UPDATE messages SET parent_id = %lld WHERE id = %lld; UPDATE messages SET parent_id = %lld "
             "WHERE id = %lld;", (long long)a2, (long long)a1, (long long)u1, (long long)x);
    raw_exec(p, sql);
    assert_int_equal(store_check(s, &report, &n_problems, &err), STORE_OK);
    assert_int_equal(n_problems, 2);
    char want[200];
    snprintf(want, sizeof want, "conversation %lld: the parents of messages %lld → %lld → %lld → %lld form a loop",
             (long long)conv, (long long)a1, (long long)a2, (long long)u2, (long long)a1);
    if (!strstr(report, want)) fail_msg("report: %s\nwanted: %s", report, want);
    snprintf(want, sizeof want, "message %lld (conversation %lld): its parent %lld belongs to conversation %lld",
             (long long)x, (long long)conv2, (long long)u1, (long long)conv);
    if (!strstr(report, want)) fail_msg("report: %s\nwanted: %s", report, want);
    free(report);
    store_msg *m;
    size_t n;
    assert_int_equal(store_conv_path(s, conv, a2, &m, &n, &err), STORE_ERR_CORRUPT);
    assert_non_null(strstr(err.msg, "form a loop"));
    int64_t cut = -1;
    assert_int_equal(store_conv_path_cut(s, conv, a2, &m, &n, &cut, &err), STORE_OK);
    assert_int_equal(n, 3);
    assert_int_equal(cut, a1);
    assert_int_equal(m[0].id, a1);
    assert_int_equal(m[1].id, u2);
    assert_int_equal(m[2].id, a2);
    store_msgs_free(m, n);
    /* a whole path: cut 0 */
    assert_int_equal(store_conv_path_cut(s, conv2, x, &m, &n, &cut, &err), STORE_OK);
    store_msgs_free(m, n);
    assert_int_equal(store_conv_path_cut(s, conv, u1, &m, &n, &cut, &err), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(cut, 0);
    store_msgs_free(m, n);
    store_close(s);
}

/* Seeds are u64: stored as their unsigned decimal (SQLite's INTEGER is signed, a seed >= 2^63
 * read negative in SQL before schema 3), and a schema-2 file's negative values are converted. */
static void test_seed_u64(void **state)
{
    (void)state;
    store *s = open_new("seed.db");
    const char *p = tu_tmp_path("seed.db");
    store_error err = {0};
    int64_t conv = 0;
    store_params cp = {.set = 1, .temperature = 0.5, .seed_set = 1, .seed = UINT64_MAX};
    assert_int_equal(store_conv_create(s, 0, NULL, &cp, 0, &conv, &err), STORE_OK);
    int64_t u = add(s, conv, 0, STORE_ROLE_USER, "hi");
    int64_t a = add(s, conv, u, STORE_ROLE_ASSISTANT, "hello"); /* seed 0xfedcba9876543210 */
    char *t = raw_text(p, "SELECT seed FROM generations");
    assert_string_equal(t, "18364758544493064720");
    free(t);
    t = raw_text(p, "SELECT typeof(seed) || ' ' || seed FROM conversations");
    assert_string_equal(t, "text 18446744073709551615");
    free(t);
    store_msg *m;
    size_t n;
    assert_int_equal(store_conv_messages(s, conv, &m, &n, &err), STORE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(m[1].id, a);
    assert_true(m[1].gen.params.seed_set);
    assert_true(m[1].gen.params.seed == 0xfedcba9876543210ULL);
    store_msgs_free(m, n);
    store_conv c;
    assert_int_equal(store_conv_get(s, conv, &c, &err), STORE_OK);
    assert_true(c.params.seed == UINT64_MAX);
    store_conv_clear(&c);
    store_close(s);
    /* a schema-2 file: INTEGER seeds, two's complement */
    raw_exec(p, "ALTER TABLE generations DROP COLUMN seed; ALTER TABLE generations ADD COLUMN seed INTEGER;"
                "UPDATE generations SET seed = -81985529216486896;"
                "ALTER TABLE conversations DROP COLUMN seed; ALTER TABLE conversations ADD COLUMN seed INTEGER;"
                "UPDATE conversations SET seed = -1; ALTER TABLE messages DROP COLUMN model_id; PRAGMA user_version = 2;");
    raw_exec(p, "INSERT INTO conversations(title, created_at, updated_at, temperature, seed) VALUES ('b', 0, 0, 1, 42);"
                "INSERT INTO conversations(title, created_at, updated_at, temperature, seed) VALUES ('c', 0, 0, 1, "
                "-9223372036854775808);"
                "INSERT INTO conversations(title, created_at, updated_at, temperature, seed) VALUES ('d', 0, 0, 1, "
                "9223372036854775807);"
                "INSERT INTO conversations(title, created_at, updated_at, temperature, seed) VALUES ('e', 0, 0, 1, "
                "-1000000000);"
                "INSERT INTO conversations(title, created_at, updated_at) VALUES ('f', 0, 0);");
    assert_int_equal(store_open(p, 0, &s, &err), STORE_OK);
    assert_int_equal(tu_sql_int(p, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
    t = raw_text(p, "SELECT group_concat(typeof(seed) || ':' || coalesce(seed, '-'), ' ') FROM "
                    "(SELECT seed FROM conversations ORDER BY id)");
    assert_string_equal(t, "text:18446744073709551615 text:42 text:9223372036854775808 text:9223372036854775807 "
                           "text:18446744072709551616 null:-");
    free(t);
    t = raw_text(p, "SELECT seed FROM generations");
    assert_string_equal(t, "18364758544493064720");
    free(t);
    assert_int_equal(store_conv_messages(s, conv, &m, &n, &err), STORE_OK);
    assert_true(m[1].gen.params.seed == 0xfedcba9876543210ULL);
    store_msgs_free(m, n);
    store_close(s);
}

/* Schema 4: each reply names the model that wrote it; a schema-3 file's replies get their
 * conversation's model, user messages none; a continued reply keeps or takes the new one. */
static void test_migration_3_to_4(void **state)
{
    (void)state;
    store *s = open_new("v3.db");
    store_error err = {0};
    int64_t ma, mb, conv, u1, r1, u2, r2;
    assert_int_equal(store_model_register(s, "aaaa", "/m/a.gguf", "A", "llama", "F32", 1, &ma, &err), STORE_OK);
    assert_int_equal(store_model_register(s, "bbbb", "/m/b.gguf", "B", "llama", "F32", 1, &mb, &err), STORE_OK);
    assert_int_equal(store_conv_create(s, ma, NULL, NULL, 0, &conv, &err), STORE_OK);
    store_gen g = {.set = 1, .finish = STORE_FINISH_EOG, .model_id = ma};
    assert_int_equal(store_msg_add(s, conv, 0, STORE_ROLE_USER, "hi", 2, 0, 0, NULL, &u1, &err), STORE_OK);
    assert_int_equal(store_msg_add(s, conv, u1, STORE_ROLE_ASSISTANT, "one", 3, 0, 0, &g, &r1, &err), STORE_OK);
    g.model_id = mb;
    assert_int_equal(store_msg_add(s, conv, r1, STORE_ROLE_USER, "again", 5, 0, 0, NULL, &u2, &err), STORE_OK);
    assert_int_equal(store_msg_add(s, conv, u2, STORE_ROLE_ASSISTANT, "two", 3, 0, 0, &g, &r2, &err), STORE_OK);
    store_msg *m;
    size_t n;
    assert_int_equal(store_conv_messages(s, conv, &m, &n, &err), STORE_OK);
    assert_int_equal(n, 4);
    assert_true(m[0].model_id == 0 && m[1].model_id == ma && m[2].model_id == 0 && m[3].model_id == mb);
    store_msgs_free(m, n);
    /* an update without a model keeps the one it had */
    store_gen g0 = {.set = 1, .finish = STORE_FINISH_LENGTH};
    assert_int_equal(store_msg_update(s, r2, "two more", 8, 0, &g0, &err), STORE_OK);
    assert_int_equal(tu_sql_int(tu_tmp_path("v3.db"), "SELECT model_id FROM messages WHERE content = 'two more'"), mb);
    assert_int_equal(store_conv_set_model(s, conv, mb, &err), STORE_OK);
    store_conv c;
    assert_int_equal(store_conv_get(s, conv, &c, &err), STORE_OK);
    assert_true(c.model_id == mb);
    store_conv_clear(&c);
    assert_int_equal(store_conv_set_model(s, conv, ma, &err), STORE_OK);
    store_close(s);
    /* back to schema 3, as kvchat 3 wrote it */
    const char *p = tu_tmp_path("v3.db");
    raw_exec(p, "ALTER TABLE messages DROP COLUMN model_id; PRAGMA user_version = 3;");
    assert_int_equal(store_open(p, STORE_OPEN_READONLY, &s, &err), STORE_ERR_READONLY);
    assert_int_equal(store_open(p, 0, &s, &err), STORE_OK);
    assert_int_equal(tu_sql_int(p, "PRAGMA user_version"), 4);
    assert_int_equal(store_conv_messages(s, conv, &m, &n, &err), STORE_OK);
    assert_int_equal(n, 4);
    /* every reply: the conversation's model (A); user messages: none */
    assert_true(m[0].model_id == 0 && m[1].model_id == ma && m[2].model_id == 0 && m[3].model_id == ma);
    store_msgs_free(m, n);
    store_close(s);
}

static void test_migration_1_to_2(void **state)
{
    (void)state;
    store *s = open_new("v1.db");
    store_error err = {0};
    int64_t model;
    store_model_register(s, "eeee", "", "m", "", "", 0, &model, &err);
    int32_t t[100];
    for (int i = 0; i < 100; i++) t[i] = 3 * i + 1;
    static key A, S, Q;
    make_key(&A, model, t, 100);
    uint8_t *ba = blob_of(2500, 7);
    store_kv_put_result r;
    put(s, &A, STORE_KV_SNAPSHOT, ba, 2500, 0, &r);
    int64_t conv;
    assert_int_equal(store_conv_create(s, model, "sys", NULL, 0, &conv, &err), STORE_OK);
    store_close(s);
    /* back to schema 1, as the first kvchat wrote it (with a prefix and a conversation in it) */
    const char *p = tu_tmp_path("v1.db");
    raw_exec(p, "DROP INDEX kv_prefixes_base; ALTER TABLE kv_prefixes DROP COLUMN base_id; "
                "ALTER TABLE messages DROP COLUMN model_id; PRAGMA user_version = 1;");
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM pragma_table_info('kv_prefixes') WHERE name = 'base_id'"), 0);
    /* read-only, it cannot be migrated: said so, untouched */
    assert_int_equal(store_open(p, STORE_OPEN_READONLY, &s, &err), STORE_ERR_READONLY);
    assert_non_null(strstr(err.msg, "needs migrating"));
    assert_int_equal(tu_sql_int(p, "PRAGMA user_version"), 1);
    /* opened for writing: migrated forward, the rows kept */
    assert_int_equal(store_open(p, 0, &s, &err), STORE_OK);
    assert_int_equal(tu_sql_int(p, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
    assert_int_equal(STORE_SCHEMA_VERSION, 4);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM pragma_table_info('kv_prefixes') WHERE name = 'base_id'"), 1);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM sqlite_schema WHERE name = 'kv_prefixes_base'"), 1);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM conversations"), 1);
    make_key(&Q, model, t, 100);
    store_kv_hit hit;
    assert_int_equal(store_kv_find(s, &Q.k, &hit, &err), STORE_OK);
    assert_int_equal(hit.id, r.id);
    assert_int_equal(hit.base_id, 0); /* an old row is a whole blob */
    void *got;
    size_t len;
    assert_int_equal(store_kv_read(s, hit.id, &got, &len, &err), STORE_OK);
    assert_memory_equal(got, ba, 2500);
    free(got);
    /* and new rows may rest on old ones */
    make_key(&S, model, t, 48);
    put(s, &S, STORE_KV_SHARED, ba, 1000, 0, &r);
    store_kv_put_result rd;
    make_key(&A, model, t, 99);
    assert_int_equal(store_kv_put_delta(s, &A.k, STORE_KV_SNAPSHOT, r.id, ba, 800, 0, &rd, &err), STORE_OK);
    assert_true(rd.stored);
    tu_store_check_clean(s);
    store_close(s);
    free(ba);
}

/* A test transform: the "delta" is the blob's second half. */
static int half_blob(void *ud, const void *blob, size_t len, size_t n_base, void **out, size_t *out_len)
{
    int *calls = ud;
    (*calls)++;
    assert_true(n_base > 0);
    *out_len = len / 2;
    *out = malloc(*out_len);
    memcpy(*out, (const uint8_t *)blob + len - *out_len, *out_len);
    return 0;
}

static long long row_of(const char *p, const char *what, long long id)
{
    char sql[300];
    snprintf(sql, sizeof sql, "SELECT %s FROM kv_prefixes WHERE id = %lld", what, id);
    return tu_sql_int(p, sql);
}

static void test_kv_deltas(void **state)
{
    (void)state;
    store *s = open_new("kvdelta.db");
    const char *p = tu_tmp_path("kvdelta.db");
    store_set_kv_chunk_size(s, 1000);
    store_error err = {0};
    int64_t model, other;
    store_model_register(s, "ffff", "", "m", "", "", 0, &model, &err);
    store_model_register(s, "gggg", "", "m2", "", "", 0, &other, &err);
    int32_t base[400], div[400];
    for (int i = 0; i < 400; i++) base[i] = 1000 + i, div[i] = i < 80 ? base[i] : 7;
    static key S, A, B, B80, X, C, Q;
    make_key(&S, model, base, 64);   /* a system prompt: 4 blocks */
    make_key(&A, model, base, 150);  /* chat A */
    make_key(&B, model, div, 120);   /* chat B: A's first 80 tokens, then its own */
    make_key(&B80, model, base, 80);
    make_key(&X, model, div + 100, 90);
    make_key(&C, other, base, 150);
    uint8_t *bs = blob_of(3000, 1), *ba = blob_of(2000, 2), *bb = blob_of(1500, 3), *b80 = blob_of(400, 4);
    store_kv_put_result r;
    /* a base must be a complete shared row, a whole-block prefix of the key, same model and type */
    put(s, &S, STORE_KV_SNAPSHOT, bs, 3000, 0, &r);
    int64_t id_s = r.id;
    assert_int_equal(store_kv_put_delta(s, &A.k, STORE_KV_SNAPSHOT, id_s, ba, 2000, 0, &r, &err), STORE_ERR_INVALID);
    assert_int_equal(store_kv_put_delta(s, &A.k, STORE_KV_SNAPSHOT, 9999, ba, 2000, 0, &r, &err), STORE_ERR_NOTFOUND);
    put(s, &S, STORE_KV_SHARED, bs, 3000, 0, &r); /* asked to share an existing row: it is shared now */
    assert_false(r.stored);
    assert_int_equal(r.id, id_s);
    assert_int_equal(row_of(p, "kind", id_s), 1);
    assert_int_equal(store_kv_put_delta(s, &X.k, STORE_KV_SNAPSHOT, id_s, ba, 2000, 0, &r, &err), STORE_ERR_INVALID);
    assert_int_equal(store_kv_put_delta(s, &C.k, STORE_KV_SNAPSHOT, id_s, ba, 2000, 0, &r, &err), STORE_ERR_INVALID);
    assert_int_equal(store_kv_put_delta(s, &S.k, STORE_KV_SNAPSHOT, id_s, ba, 2000, 0, &r, &err), STORE_OK); /* itself: there */
    assert_false(r.stored);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_prefixes"), 1);
    /* the plan for A: rest on the shared prompt */
    store_kv_plan_result plan;
    assert_int_equal(store_kv_plan(s, &A.k, &plan, &err), STORE_OK);
    assert_int_equal(plan.base_id, id_s);
    assert_int_equal(plan.n_base, 64);
    assert_int_equal(plan.shared_len, 0);
    assert_int_equal(store_kv_put_delta(s, &A.k, STORE_KV_SNAPSHOT, id_s, ba, 2000, 0, &r, &err), STORE_OK);
    assert_true(r.stored);
    int64_t id_a = r.id;
    assert_int_equal(row_of(p, "base_id", id_a), id_s);
    /* found with its base; the chain lists the blobs to read, base first */
    make_key(&Q, model, base, 170);
    store_kv_hit hit;
    assert_int_equal(store_kv_find(s, &Q.k, &hit, &err), STORE_OK);
    assert_int_equal(hit.id, id_a);
    assert_int_equal(hit.base_id, id_s);
    assert_int_equal(hit.n_base, 64);
    assert_int_equal(hit.size, 2000);
    store_kv_link links[STORE_KV_MAX_CHAIN];
    int nl = 0;
    assert_int_equal(store_kv_chain(s, id_a, links, STORE_KV_MAX_CHAIN, &nl, &err), STORE_OK);
    assert_int_equal(nl, 2);
    assert_int_equal(links[0].id, id_s);
    assert_int_equal(links[0].n_base, 0);
    assert_int_equal(links[0].n_tokens, 64);
    assert_int_equal(links[1].id, id_a);
    assert_int_equal(links[1].n_base, 64);
    assert_int_equal(links[1].n_tokens, 150);
    assert_int_equal(store_kv_chain(s, id_a, links, 1, &nl, &err), STORE_ERR_CORRUPT); /* deeper than cap */
    /* the plan for B, which diverges from A after 80 tokens: store [0, 80) shared, over S */
    assert_int_equal(store_kv_plan(s, &B.k, &plan, &err), STORE_OK);
    assert_int_equal(plan.base_id, id_s);
    assert_int_equal(plan.n_base, 64);
    assert_int_equal(plan.shared_len, 80);
    assert_int_equal(store_kv_put_delta(s, &B80.k, STORE_KV_SHARED, id_s, b80, 400, 0, &r, &err), STORE_OK);
    int64_t id_s2 = r.id;
    assert_int_equal(store_kv_put_delta(s, &B.k, STORE_KV_SNAPSHOT, id_s2, bb, 1500, 0, &r, &err), STORE_OK);
    int64_t id_b = r.id;
    assert_int_equal(store_kv_plan(s, &B.k, &plan, &err), STORE_OK);
    assert_int_equal(plan.base_id, id_s2);
    assert_int_equal(plan.shared_len, 0);
    /* A still holds [64, 80) itself: re-stored as a delta over the new shared row */
    int calls = 0, n_rebased = 0;
    assert_int_equal(store_kv_rebase(s, id_s2, 8, half_blob, &calls, &n_rebased, &err), STORE_OK);
    assert_int_equal(calls, 1);
    assert_int_equal(n_rebased, 1);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_prefixes"), 4);
    assert_int_equal(store_kv_find(s, &Q.k, &hit, &err), STORE_OK);
    assert_true(hit.id != id_a);
    assert_int_equal(row_of(p, "count(*)", id_a), 0);
    id_a = hit.id;
    assert_int_equal(hit.base_id, id_s2);
    assert_int_equal(hit.n_base, 80);
    assert_int_equal(hit.size, 1000);
    void *got;
    size_t len;
    assert_int_equal(store_kv_read(s, id_a, &got, &len, &err), STORE_OK);
    assert_memory_equal(got, ba + 1000, 1000);
    free(got);
    assert_int_equal(store_kv_chain(s, id_a, links, STORE_KV_MAX_CHAIN, &nl, &err), STORE_OK);
    assert_int_equal(nl, 3);
    assert_int_equal(links[0].id, id_s);
    assert_int_equal(links[1].id, id_s2);
    assert_int_equal(links[2].id, id_a);
    assert_int_equal(links[2].n_base, 80);
    /* nothing left to rebase; a row already on a base as long is left alone */
    assert_int_equal(store_kv_rebase(s, id_s2, 8, half_blob, &calls, &n_rebased, &err), STORE_OK);
    assert_int_equal(n_rebased, 0);
    assert_int_equal(store_kv_rebase(s, id_s, 8, half_blob, &calls, &n_rebased, &err), STORE_OK);
    assert_int_equal(n_rebased, 0);
    assert_int_equal(calls, 1);
    /* stats: each blob once */
    store_kv_stats ks;
    assert_int_equal(store_kv_stats_get(s, &ks, &err), STORE_OK);
    assert_int_equal(ks.n_prefixes, 4);
    assert_int_equal(ks.n_shared, 2);
    assert_int_equal(ks.n_delta, 3);
    assert_int_equal(ks.bytes, 3000 + 400 + 1500 + 1000);
    assert_int_equal(ks.bytes_delta, 400 + 1500 + 1000);
    tu_store_check_clean(s);
    /* using a delta uses its bases */
    raw_exec(p, "UPDATE kv_prefixes SET last_used = 1, hits = 0");
    assert_int_equal(store_kv_read(s, id_a, &got, &len, &err), STORE_OK);
    free(got);
    assert_true(row_of(p, "last_used", id_s) > 1);
    assert_true(row_of(p, "last_used", id_s2) > 1);
    assert_int_equal(row_of(p, "last_used", id_b), 1);
    assert_int_equal(row_of(p, "hits", id_a), 1);
    assert_int_equal(row_of(p, "hits", id_s), 0);
    /* LRU: among rows used at the same moment, deltas go before the bases they need */
    raw_exec(p, "UPDATE kv_prefixes SET last_used = 5");
    int ev = 0;
    assert_int_equal(store_kv_evict(s, 5900 - 1, &ev, &err), STORE_OK);
    assert_int_equal(ev, 1);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_prefixes WHERE kind = 1"), 2);
    /* dropping a delta leaves its base; dropping a base takes its deltas */
    long long left = tu_sql_int(p, "SELECT id FROM kv_prefixes WHERE kind = 0");
    assert_int_equal(store_kv_drop(s, left, &err), STORE_OK);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_prefixes"), 2);
    assert_int_equal(store_kv_put_delta(s, &A.k, STORE_KV_SNAPSHOT, id_s2, ba, 1000, 0, &r, &err), STORE_OK);
    assert_int_equal(store_kv_drop(s, id_s, &err), STORE_OK);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_prefixes"), 0);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_chunks"), 0);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_blocks"), 0);
    /* a shorter shared row that comes after a longer one: the longer one is re-stored over it
     * and hands on its deltas */
    put(s, &B80, STORE_KV_SHARED, b80, 400, 0, &r);
    id_s2 = r.id;
    assert_int_equal(store_kv_put_delta(s, &B.k, STORE_KV_SNAPSHOT, id_s2, bb, 1500, 0, &r, &err), STORE_OK);
    id_b = r.id;
    put(s, &S, STORE_KV_SHARED, bs, 3000, 0, &r);
    id_s = r.id;
    assert_int_equal(store_kv_rebase(s, id_s, 8, half_blob, &calls, &n_rebased, &err), STORE_OK);
    assert_int_equal(n_rebased, 1); /* B rests on [0, 80) already */
    assert_int_equal(store_kv_chain(s, id_b, links, STORE_KV_MAX_CHAIN, &nl, &err), STORE_OK);
    assert_int_equal(nl, 3);
    assert_int_equal(links[0].id, id_s);
    assert_int_equal(links[1].n_tokens, 80);
    assert_int_equal(links[1].n_base, 64);
    assert_int_equal(links[1].size, 200);
    assert_int_equal(links[2].id, id_b);
    tu_store_check_clean(s);
    assert_int_equal(store_kv_drop(s, id_s, &err), STORE_OK);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_prefixes"), 0);
    /* the budget: a delta counts with its bases, which are never evicted to make room for it */
    put(s, &S, STORE_KV_SHARED, bs, 3000, 0, &r);
    id_s = r.id;
    assert_int_equal(store_kv_put_delta(s, &A.k, STORE_KV_SNAPSHOT, id_s, ba, 2000, 4500, &r, &err), STORE_OK);
    assert_true(r.skipped);
    assert_int_equal(store_kv_put_delta(s, &A.k, STORE_KV_SNAPSHOT, id_s, ba, 2000, 5000, &r, &err), STORE_OK);
    assert_true(r.stored);
    put(s, &X, STORE_KV_SNAPSHOT, bb, 1000, 5500, &r); /* the delta goes, its base stays */
    assert_true(r.stored);
    assert_int_equal(r.n_evicted, 1);
    assert_int_equal(tu_sql_int(p, "SELECT count(*) FROM kv_prefixes WHERE n_tokens = 150"), 0); /* (ids are reused) */
    assert_int_equal(row_of(p, "count(*)", id_s), 1);
    /* `kvchat check` names a delta whose base does not fit it */
    assert_int_equal(store_kv_put_delta(s, &A.k, STORE_KV_SNAPSHOT, id_s, ba, 1000, 0, &r, &err), STORE_OK);
    char sql[200];
    snprintf(sql, sizeof sql, "UPDATE kv_prefixes SET base_id = (SELECT id FROM kv_prefixes WHERE n_tokens = 90) WHERE id = %lld",
             (long long)r.id);
    raw_exec(p, sql);
    char *report;
    int problems = 0;
    assert_int_equal(store_check(s, &report, &problems, &err), STORE_OK);
    assert_int_equal(problems, 1);
    assert_non_null(strstr(report, "its base"));
    free(report);
    free(bs);
    free(ba);
    free(bb);
    free(b80);
    store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_creates_schema),
        cmocka_unit_test(test_newer_version_untouched),
        cmocka_unit_test(test_foreign_databases),
        cmocka_unit_test(test_readonly_directory),
        cmocka_unit_test(test_conversations_and_branches),
        cmocka_unit_test(test_search),
        cmocka_unit_test(test_corrupt_rows_named),
        cmocka_unit_test(test_import),
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_kv_corruption_named),
        cmocka_unit_test(test_kv_half_written_never_used),
        cmocka_unit_test(test_migration_1_to_2),
        cmocka_unit_test(test_migration_3_to_4),
        cmocka_unit_test(test_seed_u64),
        cmocka_unit_test(test_parent_loops),
        cmocka_unit_test(test_kv_deltas),
    };
    return cmocka_run_group_tests(tests, setup_dir, tu_tmpdir_teardown);
}
