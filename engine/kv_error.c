/* kv_error: formatting of engine error records. */
#include "kv_error.h"

#include <stdio.h>

int kv_error_set(kv_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}
