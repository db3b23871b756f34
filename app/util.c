/* util: small helpers the app modules share (the `why` message buffer). */
#include "app/util.h"

#include <stdarg.h>
#include <stdio.h>

void util_set_why(char *why, size_t cap, const char *fmt, ...)
{
    if (!why || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
}
