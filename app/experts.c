/* experts: the text of `/show experts` (per-layer histograms of a MoE model's expert choices). */
#include "app/experts.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct out {
    char *buf;
    size_t cap, len;
} out;

static void put(out *o, const char *fmt, ...)
{
    if (o->len + 1 >= o->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n < o->cap - o->len ? (size_t)n : o->cap - o->len - 1;
}

size_t experts_report(const uint32_t *counts, int n_layer, int n_expert, int ascii, char *buf, size_t cap)
{
    static const char *const bars[] = {" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
    static const char ramp[] = " .:-=+*#%@";
    out o = {buf, cap, 0};
    if (cap) buf[0] = 0;
    if (!counts || n_layer < 1 || n_expert < 1 || !cap) return 0;
    unsigned long long total = 0;
    for (long i = 0; i < (long)n_layer * n_expert; i++) total += counts[i];
    if (!total) return 0;
    int per = n_expert > 64 ? 2 : 1; /* experts per bar */
    put(&o, "expert usage of the last reply: %llu selections per layer over %d experts (one bar per %s)\n",
        total / (unsigned long long)n_layer, n_expert, per == 1 ? "expert" : "two experts");
    for (int il = 0; il < n_layer; il++) {
        const uint32_t *c = counts + (size_t)il * n_expert;
        uint32_t mx = 0;
        unsigned long long sum = 0;
        int used = 0, top[3] = {-1, -1, -1};
        for (int e = 0; e < n_expert; e++) {
            sum += c[e];
            used += c[e] > 0;
            mx = c[e] > mx ? c[e] : mx;
            for (int j = 0; j < 3; j++) /* the three largest, the lower index first on a tie */
                if (c[e] > 0 && (top[j] < 0 || c[e] > c[top[j]])) {
                    for (int q = 2; q > j; q--) top[q] = top[q - 1];
                    top[j] = e;
                    break;
                }
        }
        put(&o, "L%-3d ", il);
        for (int e = 0; e < n_expert; e += per) {
            uint32_t v = c[e];
            if (per == 2 && e + 1 < n_expert && c[e + 1] > v) v = c[e + 1];
            int h = mx ? (int)((v * 8ull + mx - 1) / mx) : 0; /* 1..8 for any use, 0 for none */
            if (ascii) put(&o, "%c", ramp[mx ? (v * 9ull + mx - 1) / mx : 0]);
            else put(&o, "%s", bars[h]);
        }
        put(&o, "  %d/%d used", used, n_expert);
        for (int j = 0; j < 3 && top[j] >= 0 && sum; j++)
            put(&o, "%s e%d %.0f%%", j ? "" : " · top", top[j], 100.0 * c[top[j]] / (double)sum);
        put(&o, "\n");
    }
    if (o.len && o.buf[o.len - 1] == '\n') o.buf[--o.len] = 0;
    return o.len;
}
