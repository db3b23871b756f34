/* util: small helpers the app modules share — filling a caller's `why` message buffer. */
#ifndef KV_APP_UTIL_H
#define KV_APP_UTIL_H

#include <stddef.h>

/* printf into why[0..cap) (truncated); nothing when why is NULL or cap is 0. */
void util_set_why(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
