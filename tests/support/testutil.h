/* testutil: shared helpers of the unit tests and benchmarks (paths to ../shared, reading files and golden JSON, a temporary directory per binary, clocks and medians, collected warnings). No cmocka here: the benchmarks link it too. */
#ifndef KV_TESTUTIL_H
#define KV_TESTUTIL_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Directory of the shared test data: $KVCHAT_SHARED or "../shared". */
const char *tu_shared(void);
/* tu_path("models/x.gguf") → static buffer "<shared>/models/x.gguf" (rotating, 8 slots). */
const char *tu_path(const char *rel);
/* Whole file into a malloc'd NUL-terminated buffer; NULL if unreadable. */
char *tu_read_file(const char *path, size_t *len);
/* Parse a JSON file with cJSON; NULL if unreadable or invalid. */
cJSON *tu_read_json(const char *path);

/* Create the binary's temporary directory /tmp/kvchat-<tag>-XXXXXX (mkdtemp); 0, or -1 when
 * it cannot be made. */
int tu_tmpdir_make(const char *tag);
/* The directory tu_tmpdir_make made. */
const char *tu_tmpdir(void);
/* tu_tmp_path("x.db") → static buffer "<tmpdir>/x.db" (rotating, 8 slots). */
const char *tu_tmp_path(const char *name);
/* Remove the temporary directory and everything below it; 0, or -1 when something stayed. */
int tu_tmpdir_remove(void);
/* tu_tmpdir_remove as a cmocka group teardown. */
int tu_tmpdir_teardown(void **state);

/* Milliseconds on the monotonic clock. */
double tu_now_ms(void);
/* Median of v[0..n) (n > 0); sorts v. */
double tu_median(double *v, int n);

/* Warnings collected from a callback `void (*)(void *ud, const char *msg)`: the first 16 kept. */
typedef struct tu_warnings {
    char msg[16][700];
    int n;
} tu_warnings;
/* The callback: ud is a tu_warnings; counts every warning, keeps the first 16. */
void tu_collect_warning(void *ud, const char *msg);

#endif
