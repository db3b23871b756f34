/* stop: byte-level stop-string matching with hold-back of partial matches. */
#include "stop.h"

#include <string.h>

int stop_init(stop_matcher *m, const char *const *stops, int n)
{
    memset(m, 0, sizeof *m);
    m->matched = -1;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0) continue;
        if (l >= STOP_MAX_LEN || m->n_stops == STOP_MAX_STRINGS) return -1;
        memcpy(m->stops[m->n_stops], stops[i], l);
        m->stop_len[m->n_stops++] = l;
    }
    return 0;
}

/* Length of the longest suffix of buf[0..n) that is a proper prefix of some stop string. */
static size_t partial_tail(const stop_matcher *m, const char *buf, size_t n)
{
    size_t best = 0;
    for (int s = 0; s < m->n_stops; s++) {
        size_t max = m->stop_len[s] - 1 < n ? m->stop_len[s] - 1 : n;
        for (size_t k = max; k > best; k--)
            if (memcmp(buf + n - k, m->stops[s], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

int stop_push(stop_matcher *m, const char *text, size_t len, char *out, size_t *out_len)
{
    *out_len = 0;
    if (m->matched >= 0) return 1;
    if (m->n_stops == 0) {
        memcpy(out, text, len);
        *out_len = len;
        return 0;
    }
    /* Work on held + text, written into out (which has room for both). */
    size_t n = m->n_held;
    memcpy(out, m->held, n);
    memcpy(out + n, text, len);
    n += len;
    m->n_held = 0;
    /* Earliest complete occurrence of any stop string. */
    size_t first = n;
    for (int s = 0; s < m->n_stops; s++) {
        const char *hit = memmem(out, n, m->stops[s], m->stop_len[s]);
        if (hit && (size_t)(hit - out) < first) {
            first = (size_t)(hit - out);
            m->matched = s;
        }
    }
    if (m->matched >= 0) {
        *out_len = first;
        return 1;
    }
    size_t keep = partial_tail(m, out, n);
    memcpy(m->held, out + n - keep, keep);
    m->n_held = keep;
    *out_len = n - keep;
    return 0;
}

size_t stop_flush(stop_matcher *m, char *out)
{
    size_t n = m->matched >= 0 ? 0 : m->n_held;
    memcpy(out, m->held, n);
    m->n_held = 0;
    return n;
}
