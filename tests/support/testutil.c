/* testutil: file, path, temporary-directory, clock and warning helpers shared by the unit tests and benchmarks. */
#include "testutil.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

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

/* ---- the temporary directory ------------------------------------------------------------- */

static char g_tmpdir[256];

int tu_tmpdir_make(const char *tag)
{
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/kvchat-%s-XXXXXX", tag);
    return mkdtemp(g_tmpdir) ? 0 : -1;
}

const char *tu_tmpdir(void) { return g_tmpdir; }

const char *tu_tmp_path(const char *name)
{
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", g_tmpdir, name);
    return b;
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb;
    (void)type;
    (void)ftw;
    return remove(path) ? -1 : 0;
}

int tu_tmpdir_remove(void)
{
    if (!g_tmpdir[0]) return 0;
    return nftw(g_tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) ? -1 : 0;
}

int tu_tmpdir_teardown(void **state)
{
    (void)state;
    return tu_tmpdir_remove();
}

/* ---- clocks and medians ------------------------------------------------------------------ */

double tu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double tu_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- warnings ------------------------------------------------------------------------------ */

void tu_collect_warning(void *ud, const char *msg)
{
    tu_warnings *w = ud;
    if (w->n < 16) snprintf(w->msg[w->n], sizeof w->msg[0], "%s", msg);
    w->n++;
}
