/* testutil: shared helpers of the unit tests (paths to ../shared, reading files and golden JSON). */
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

#endif
