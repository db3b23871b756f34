/* fuzz_remote_sse: libFuzzer harness for the remote client's stream parsing (app/remote_sse.c):
 * the input as a text/event-stream fed to sse_feed in pieces of a size from byte 0, every event
 * through remote_parse_chunk, then the whole input as an error body (remote_error_message). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/remote_sse.h"

static int on_event(void *ud, const char *data, size_t len)
{
    size_t *n = ud;
    if (data[len] != 0) abort(); /* documented: NUL-terminated */
    remote_chunk c;
    char why[300];
    if (remote_parse_chunk(data, len, &c, why, sizeof why) == 0) {
        if (c.text && strlen(c.text) != c.len) abort(); /* a NUL inside content ends it: len agrees */
        if (c.prompt_tokens < 0 || c.completion_tokens < 0 || c.cached_tokens < 0) abort();
        if (memchr(c.error, 0, sizeof c.error) == NULL || memchr(c.model, 0, sizeof c.model) == NULL) abort();
        remote_chunk_free(&c);
    } else if (!memchr(why, 0, sizeof why)) abort();
    (*n)++;
    return *n > 10000; /* a stop from the callback is honoured too */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 20) return 0;
    size_t step = 1 + data[0] % 64;
    const char *s = (const char *)data + 1;
    size_t n = size - 1, events = 0;
    sse_parser p = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i += step) rc = sse_feed(&p, s + i, n - i < step ? n - i : step, on_event, &events);
    if (!rc) sse_finish(&p, on_event, &events);
    sse_free(&p);
    char msg[400];
    remote_error_message(s, n, msg, sizeof msg);
    if (!memchr(msg, 0, sizeof msg)) abort();
    return 0;
}
