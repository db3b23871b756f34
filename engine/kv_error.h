/* kv_error: the library-style error record every engine/storage call fills on failure. */
#ifndef KV_ERROR_H
#define KV_ERROR_H

#include <stdarg.h>

/* Status codes returned by engine functions (0 = success). */
enum kv_status {
    KV_OK = 0,
    KV_ERR_IO = 1,          /* open/read/mmap failed */
    KV_ERR_FORMAT = 2,      /* malformed or truncated file, bad value */
    KV_ERR_UNSUPPORTED = 3, /* valid but not supported (type, version, architecture) */
    KV_ERR_NOMEM = 4,       /* allocation failed */
    KV_ERR_INVALID = 5,     /* bad argument from the caller */
    KV_ERR_CONTEXT = 6,     /* context (KV cache) is full */
    KV_ERR_NONFINITE = 7,   /* NaN or Inf in logits */
    KV_ERR_CANCELLED = 8,   /* caller asked to stop */
};

/* Human-readable message; always NUL-terminated. */
typedef struct kv_error {
    int code;       /* enum kv_status */
    char msg[512];
} kv_error;

/* Set err (may be NULL) to code and a printf-style message; returns code so callers can
 * write `return kv_error_set(err, KV_ERR_FORMAT, "%s: ...", path);`. */
int kv_error_set(kv_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
