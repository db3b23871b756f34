/* test_store_crash: the store under kill -9 (at random moments, and in the middle of KV blob writes) and under two processes writing at once — integrity_check passes, every committed message is there, a half-written KV prefix is never used, no "database is locked" reaches a caller. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/kv_cache.h"
#include "storage/store.h"
#include "tests/support/testcheck.h"
#include "tests/support/testutil.h"

#define KILL_ROUNDS 12

static int setup_dir(void **state) { return tu_tmpdir_make("test-crash"); }

typedef struct kkey {
    store_kv_key k;
    int32_t t[512];
    uint64_t h[64];
} kkey;

static void key_from(kkey *x, int64_t model, size_t n)
{
    int nb = kv_block_hashes(x->t, (int)n, x->h);
    uint64_t h = nb ? x->h[nb - 1] : KV_HASH_ROOT;
    size_t tail = n - (size_t)nb * KV_BLOCK_SIZE;
    x->k = (store_kv_key){.model_id = model, .kv_type = "F16", .tokens = x->t, .n_tokens = n, .block_size = KV_BLOCK_SIZE,
                          .block_hashes = x->h, .n_blocks = (size_t)nb,
                          .key_hash = tail ? kv_hash_block(h, x->t + nb * KV_BLOCK_SIZE, (int)tail) : h};
}

static void make_key(kkey *x, int64_t model, unsigned seed, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x->t[i] = (int32_t)((seed >> 16) % 32000);
    }
    key_from(x, model, n);
}

/* Every half-written prefix: looking up its own tokens never returns it. */
static void check_half_written_unused(store *s, const char *db)
{
    sqlite3 *d;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(db, &d), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(d, "SELECT id, model_id, n_tokens, tokens FROM kv_prefixes WHERE state = 0", -1, &st, NULL),
                     SQLITE_OK);
    static kkey k;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(st, 0);
        size_t n = (size_t)sqlite3_column_int64(st, 2);
        const uint8_t *b = sqlite3_column_blob(st, 3);
        assert_true(n <= 512 && (size_t)sqlite3_column_bytes(st, 3) == n * 4);
        for (size_t i = 0; i < n; i++)
            k.t[i] = (int32_t)((uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
                               (uint32_t)b[4 * i + 3] << 24);
        key_from(&k, sqlite3_column_int64(st, 1), n);
        store_kv_hit hit;
        store_error err = {0};
        int rc = store_kv_find(s, &k.k, &hit, &err);
        assert_true(rc == STORE_ERR_NOTFOUND || (rc == STORE_OK && hit.id != id));
        assert_false(store_kv_has(s, &k.k));
        void *blob;
        size_t len;
        assert_int_equal(store_kv_read(s, id, &blob, &len, &err), STORE_ERR_NOTFOUND);
    }
    sqlite3_finalize(st);
    sqlite3_close(d);
}

static void say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int fd, const char *fmt, ...)
{
    char b[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (write(fd, b, (size_t)n) < 0) _exit(9);
}

/* A writer that never stops: messages (reported once committed) and KV blobs written slowly in
 * small chunks (reported when they start and when they are complete). */
static void writer(const char *db, int fd, unsigned seed)
{
    store *s;
    store_error err = {0};
    if (store_open(db, 0, &s, &err)) _exit(2);
    store_set_kv_chunk_size(s, 4096);
    store_set_kv_write_delay(s, 2);
    int64_t model, conv, parent = 0;
    if (store_model_register(s, "feedfeedfeedfeed", "", "m", "", "", 0, &model, &err) ||
        store_conv_create(s, model, NULL, NULL, 0, &conv, &err))
        _exit(3);
    size_t blob_len = 96 * 1024;
    uint8_t *blob = malloc(blob_len);
    for (size_t i = 0; i < blob_len; i++) blob[i] = (uint8_t)(i * 31 + seed);
    static kkey k;
    for (unsigned i = 0;; i++) {
        char text[64];
        snprintf(text, sizeof text, "message %u of writer %u", i, seed);
        int64_t id;
        if (store_msg_add(s, conv, parent, i % 2 ? STORE_ROLE_ASSISTANT : STORE_ROLE_USER, text, strlen(text), 1, 0, NULL,
                          &id, &err))
            _exit(4);
        say(fd, "M %lld\n", (long long)id);
        parent = id;
        if (i % 4 == 3) {
            make_key(&k, model, seed * 1000 + i, 200);
            say(fd, "K\n");
            store_kv_put_result r;
            if (store_kv_put(s, &k.k, STORE_KV_SNAPSHOT, blob, blob_len, 0, &r, &err)) _exit(5);
            say(fd, "k %lld\n", (long long)r.id);
        }
    }
}

static void test_kill9_loop(void **state)
{
    (void)state;
    const char *db = tu_tmp_path("crash.db");
    store *s;
    store_error err = {0};
    assert_int_equal(store_open(db, 0, &s, &err), STORE_OK);
    store_close(s);
    srand(12345);
    int mid_blob = 0, total_msgs = 0, total_blobs = 0;
    double t_start = tu_now_ms();
    for (int round = 0; round < KILL_ROUNDS && tu_now_ms() - t_start < 30000; round++) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(p[0]);
            writer(db, p[1], (unsigned)round + 1);
        }
        close(p[1]);
        /* even rounds: a random moment; odd rounds: just after a KV blob write began */
        double kill_at = tu_now_ms() + 30 + rand() % 400;
        int blob_wait = round % 2, killed = 0, blobs_to_skip = (round / 2) % 3;
        long long *ids = malloc(sizeof *ids * 100000), *kvs = malloc(sizeof *kvs * 10000);
        size_t n_ids = 0, n_kvs = 0;
        char buf[4096], line[128];
        size_t ll = 0;
        for (;;) {
            int timeout = killed ? 1000 : (int)(kill_at - tu_now_ms());
            if (!killed && blob_wait) timeout = 3000;
            if (timeout < 0) timeout = 0;
            struct pollfd pf = {.fd = p[0], .events = POLLIN};
            int pr = poll(&pf, 1, timeout);
            if (!killed && (pr == 0 || (!blob_wait && tu_now_ms() >= kill_at))) {
                kill(pid, SIGKILL);
                killed = 1;
                continue;
            }
            if (pr <= 0) break;
            ssize_t r = read(p[0], buf, sizeof buf);
            if (r <= 0) break; /* the writer is gone and its last words are read */
            for (ssize_t i = 0; i < r; i++) {
                if (buf[i] != '\n') {
                    if (ll < sizeof line - 1) line[ll++] = buf[i];
                    continue;
                }
                line[ll] = 0;
                ll = 0;
                if (line[0] == 'M') ids[n_ids++] = atoll(line + 2);
                else if (line[0] == 'k') kvs[n_kvs++] = atoll(line + 2);
                else if (line[0] == 'K' && blob_wait && !killed && blobs_to_skip-- <= 0) {
                    struct timespec ts = {0, (long)(rand() % 40) * 1000000L}; /* 0–40 ms into the write */
                    nanosleep(&ts, NULL);
                    kill(pid, SIGKILL);
                    killed = 1;
                }
            }
        }
        close(p[0]);
        int status;
        waitpid(pid, &status, 0);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        /* after the crash */
        long long writing = tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE state = 0");
        if (writing > 0) mid_blob++;
        assert_int_equal(store_open(db, 0, &s, &err), STORE_OK);
        char *report = NULL;
        int problems = -1;
        assert_int_equal(store_check(s, &report, &problems, &err), STORE_OK);
        if (problems) fail_msg("round %d: %s", round, report);
        free(report);
        for (size_t i = 0; i < n_ids; i++) {
            char sql[96];
            snprintf(sql, sizeof sql, "SELECT count(*) FROM messages WHERE id = %lld", ids[i]);
            if (tu_sql_int(db, sql) != 1) fail_msg("round %d: committed message %lld is missing", round, ids[i]);
        }
        for (size_t i = 0; i < n_kvs; i++) { /* every completed blob reads back whole */
            void *b;
            size_t len;
            if (store_kv_read(s, kvs[i], &b, &len, &err) == STORE_OK) free(b);
            else if (err.code != STORE_ERR_NOTFOUND) fail_msg("round %d: %s", round, err.msg);
        }
        /* the half-written prefix is never found, and cleanup takes it away */
        check_half_written_unused(s, db);
        int removed = 0;
        assert_int_equal(store_kv_cleanup(s, &removed, &err), STORE_OK);
        assert_int_equal(removed, writing);
        assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE state = 0"), 0);
        store_close(s);
        total_msgs += (int)n_ids;
        total_blobs += (int)n_kvs;
        free(ids);
        free(kvs);
    }
    printf("kill -9: %d rounds, %d committed messages and %d KV blobs checked, %d kills in the middle of a blob write\n",
           KILL_ROUNDS, total_msgs, total_blobs, mid_blob);
    assert_true(mid_blob >= KILL_ROUNDS / 4);
    assert_true(total_msgs > 0);
}

/* Two processes, each with its own conversation, writing messages and KV blobs as fast as
 * they can: nothing is refused as locked, nothing is lost. */
static void test_two_writers(void **state)
{
    (void)state;
    const char *db = tu_tmp_path("two.db");
    store *s;
    store_error err = {0};
    assert_int_equal(store_open(db, 0, &s, &err), STORE_OK);
    store_close(s);
    enum { N_MSG = 100 };
    pid_t pids[2];
    for (int w = 0; w < 2; w++) {
        pids[w] = fork();
        assert_true(pids[w] >= 0);
        if (pids[w] == 0) {
            store *c;
            store_error e = {0};
            if (store_open(db, 0, &c, &e)) {
                fprintf(stderr, "writer %d: %s\n", w, e.msg);
                _exit(1);
            }
            store_set_kv_chunk_size(c, 8192);
            int64_t model, conv, parent = 0;
            char fp[32];
            snprintf(fp, sizeof fp, "writer%d", w);
            if (store_model_register(c, fp, "", fp, "", "", 0, &model, &e) ||
                store_conv_create(c, model, NULL, NULL, 0, &conv, &e)) {
                fprintf(stderr, "writer %d: %s\n", w, e.msg);
                _exit(1);
            }
            uint8_t *blob = calloc(1, 64 * 1024);
            static kkey k;
            for (int i = 0; i < N_MSG; i++) {
                char text[64];
                snprintf(text, sizeof text, "writer %d says %d", w, i);
                int64_t id;
                if (store_msg_add(c, conv, parent, i % 2 ? STORE_ROLE_ASSISTANT : STORE_ROLE_USER, text, strlen(text), 1, 0,
                                  NULL, &id, &e)) {
                    fprintf(stderr, "writer %d: %s\n", w, e.msg);
                    _exit(1);
                }
                parent = id;
                if (i % 10 == 5) {
                    make_key(&k, model, (unsigned)(w * 100000 + i), 300);
                    store_kv_put_result r;
                    if (store_kv_put(c, &k.k, STORE_KV_SNAPSHOT, blob, 64 * 1024, 4 << 20, &r, &e)) {
                        fprintf(stderr, "writer %d: %s\n", w, e.msg);
                        _exit(1);
                    }
                }
                if (i % 25 == 0) {
                    store_conv *rows;
                    size_t n;
                    if (store_conv_list(c, "says", &rows, &n, &e)) {
                        fprintf(stderr, "writer %d: %s\n", w, e.msg);
                        _exit(1);
                    }
                    store_conv_list_free(rows, n);
                }
            }
            free(blob);
            store_close(c);
            _exit(0);
        }
    }
    for (int w = 0; w < 2; w++) {
        int status;
        waitpid(pids[w], &status, 0);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM messages"), 2 * N_MSG);
    assert_int_equal(tu_sql_int(db, "SELECT count(DISTINCT conversation_id) FROM messages"), 2);
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE state = 1"), 2 * (N_MSG / 10));
    assert_int_equal(store_open(db, 0, &s, &err), STORE_OK);
    tu_store_check_clean(s);
    store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9_loop),
        cmocka_unit_test(test_two_writers),
    };
    if (getenv("KVCHAT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVCHAT_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup_dir, tu_tmpdir_teardown);
}
