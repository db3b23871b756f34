/* stop: stop strings over streamed text — holds back any tail that could begin a stop string. */
#ifndef KV_STOP_H
#define KV_STOP_H

#include <stddef.h>

#define STOP_MAX_STRINGS 16
#define STOP_MAX_LEN 256

/* Matcher state; init with stop_init, no allocation. */
typedef struct stop_matcher {
    char stops[STOP_MAX_STRINGS][STOP_MAX_LEN];
    size_t stop_len[STOP_MAX_STRINGS];
    int n_stops;
    char held[STOP_MAX_LEN];   /* text not yet released: a possible stop-string prefix */
    size_t n_held;
    int matched;               /* index of the stop string that matched, -1 if none */
} stop_matcher;

/* Set up a matcher for stops[0..n) (empty strings are ignored). Returns 0, or -1 when there
 * are more than STOP_MAX_STRINGS strings or one is STOP_MAX_LEN bytes or longer. */
int stop_init(stop_matcher *m, const char *const *stops, int n);

/* Feed text[0..len) of the stream. The bytes that can safely be shown are written to out
 * (capacity len + STOP_MAX_LEN is always enough) and their count returned in *out_len: the
 * stream so far minus whatever tail could still turn into a stop string. Returns 1 when a
 * stop string has been completed: out then holds the text before it, and the stop string
 * and anything after it are dropped (generation should end). Returns 0 otherwise.
 * The match is on bytes, so a stop string split over several tokens is never shown partly. */
int stop_push(stop_matcher *m, const char *text, size_t len, char *out, size_t *out_len);

/* End of the stream without a match: release the held-back tail into out (capacity
 * STOP_MAX_LEN); returns its length. */
size_t stop_flush(stop_matcher *m, char *out);

#endif
