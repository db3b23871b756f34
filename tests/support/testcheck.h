/* testcheck: cmocka checks shared by the unit tests — a value read from an SQLite file, a store that `kvchat check` finds clean, error messages that name their file, byte flips of a file. Fails the running test on error. */
#ifndef KV_TESTCHECK_H
#define KV_TESTCHECK_H

#include <stdarg.h>
#include <stdint.h>

#include "storage/store.h"

/* The first column of the first row of `sql` run on the database file `path` with a plain
 * connection (to inspect it behind the store's back); -1 when there is no row. */
long long tu_sql_int(const char *path, const char *sql);
/* store_check(s) must succeed and find no problem (the report is shown when it finds any). */
void tu_store_check_clean(store *s);

/* The message must start with "<path>:" and contain every string of the NULL-terminated list. */
void tu_check_msg(const char *path, const char *msg, ...);
/* tu_check_msg with the list in ap. */
void tu_check_msg_v(const char *path, const char *msg, va_list ap);

/* Change every byte of [0, end) of the file open for writing in fd, whose content is orig,
 * three ways (xor 0xff, = 0xff, = 0x00; only values that differ from the original and from each
 * other), calling each(ud, offset) while the byte is changed; the byte is restored after. */
void tu_flip_each_byte(int fd, const uint8_t *orig, uint64_t end, void (*each)(void *ud, uint64_t off), void *ud);

#endif
