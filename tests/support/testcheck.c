/* testcheck: cmocka checks shared by the unit tests (SQLite probes, store checks, error messages, byte flips). */
#include "testcheck.h"

#include <setjmp.h>
#include <stddef.h>
#include <cmocka.h>

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

long long tu_sql_int(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    long long v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

void tu_store_check_clean(store *s)
{
    char *report = NULL;
    int problems = -1;
    store_error err = {0};
    assert_int_equal(store_check(s, &report, &problems, &err), STORE_OK);
    if (problems) fail_msg("store_check: %d problem(s):\n%s", problems, report);
    free(report);
}

void tu_check_msg_v(const char *path, const char *msg, va_list ap)
{
    size_t pl = strlen(path);
    if (strncmp(msg, path, pl) != 0 || msg[pl] != ':')
        fail_msg("message does not start with '%s:': %s", path, msg);
    const char *s;
    while ((s = va_arg(ap, const char *)))
        if (!strstr(msg, s)) fail_msg("message lacks '%s': %s", s, msg);
}

void tu_check_msg(const char *path, const char *msg, ...)
{
    va_list ap;
    va_start(ap, msg);
    tu_check_msg_v(path, msg, ap);
    va_end(ap);
}

void tu_flip_each_byte(int fd, const uint8_t *orig, uint64_t end, void (*each)(void *ud, uint64_t off), void *ud)
{
    for (uint64_t off = 0; off < end; off++) {
        const uint8_t o = orig[off];
        const uint8_t pats[3] = {(uint8_t)(o ^ 0xff), 0xff, 0x00};
        for (int p = 0; p < 3; p++) {
            if (pats[p] == o || (p == 1 && pats[0] == 0xff) || (p == 2 && pats[0] == 0x00)) continue;
            assert_int_equal(pwrite(fd, &pats[p], 1, (off_t)off), 1);
            each(ud, off);
        }
        assert_int_equal(pwrite(fd, &o, 1, (off_t)off), 1);
    }
}
