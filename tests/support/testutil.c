/* testutil: file and path helpers shared by the unit tests. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>

const char *tu_shared(void)
{
    const char *s = getenv("KVCHAT_SHARED");
    return s && *s ? s : "../shared";
}

const char *tu_path(const char *rel)
{
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", tu_shared(), rel);
    return b;
}

char *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len) *len = (size_t)n;
    }
    return buf;
}

cJSON *tu_read_json(const char *path)
{
    size_t n;
    char *s = tu_read_file(path, &n);
    if (!s) return NULL;
    cJSON *j = cJSON_ParseWithLength(s, n);
    free(s);
    return j;
}
