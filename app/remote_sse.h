/* remote_sse: the pure part of the remote chat client — Server-Sent Events framing (text/event-stream), the OpenAI chat.completion.chunk JSON inside each event, error bodies, and the request body; no I/O, so unit tests and a fuzzer drive it. */
#ifndef APP_REMOTE_SSE_H
#define APP_REMOTE_SSE_H

#include <stddef.h>

#include "app/prompt.h"
#include "engine/sampler.h"

/*
 * SSE framing as the WHATWG HTML standard, "Server-sent events" § 9.2.6 (interpreting an event
 * stream) defines it: lines end in CRLF, LF or CR; "data:" lines (one optional space after the
 * colon) append to the event's data, joined with "\n"; lines starting with ':' are comments;
 * other fields (event, id, retry) are ignored here; an empty line dispatches the event (nothing
 * when its data is empty). OpenAI-compatible servers send one JSON chunk per event and end with
 * "data: [DONE]".
 */
#define SSE_MAX_EVENT (4u << 20) /* bytes of one line or one event's data: beyond, the stream is refused */

typedef struct sse_parser {
    char *line;        /* the line being read */
    size_t len, cap;
    char *data;        /* the event being read: its data lines joined with '\n' */
    size_t dlen, dcap;
    int have_data;     /* a data field was seen (an empty "data:" line counts) */
    int last_cr;       /* the previous byte was CR (a following LF belongs to it) */
} sse_parser;

/* on_event gets the data of each dispatched event (data[len] == 0); a nonzero return stops. */
typedef int (*sse_event_fn)(void *ud, const char *data, size_t len);

/* Feed n bytes. Returns 0; the first nonzero value of on_event (parsing stops there); or -1
 * when a line or an event's data exceeds SSE_MAX_EVENT or memory runs out. */
int sse_feed(sse_parser *p, const char *buf, size_t n, sse_event_fn on_event, void *ud);
/* The end of the stream: an event whose blank line never came is dispatched anyway (servers
 * that close right after "data: [DONE]"). Returns as sse_feed. */
int sse_finish(sse_parser *p, sse_event_fn on_event, void *ud);
void sse_free(sse_parser *p); /* and ready for another stream */

/* One event of a /v1/chat/completions stream. */
typedef struct remote_chunk {
    int done;                 /* "[DONE]" */
    char *text;               /* choices[0].delta.content (malloc'd, NUL-terminated), NULL if none */
    size_t len;
    int finish;               /* enum gen_finish from choices[0].finish_reason: "length" → LENGTH,
                                 any other reason → EOG; GEN_FINISH_NONE when absent / null */
    int have_usage;           /* a "usage" object: the token counts below */
    int prompt_tokens, completion_tokens, cached_tokens; /* cached: usage.prompt_tokens_details.cached_tokens
                                 (or llama.cpp's timings.cache_n), 0 when not reported */
    int have_timings;         /* llama.cpp's "timings": prompt and decode speed as the server measured */
    double prompt_ms, prompt_per_second, predicted_ms, predicted_per_second;
    char model[128];          /* the chunk's "model" ("" if none) */
    char error[600];          /* an {"error": …} object in the stream: its message ("" if none) */
} remote_chunk;

/* Parse one event's data. Returns 0, or -1 with why ("not JSON", "not an object") — a
 * malformed stream. A chunk with neither choices nor usage nor error is valid and empty. */
int remote_parse_chunk(const char *data, size_t len, remote_chunk *out, char *why, size_t why_cap);
void remote_chunk_free(remote_chunk *c);

/* The message of an error body: OpenAI's {"error": {"message", "type", "code"}} (with the type
 * in parentheses), {"error": "text"}, or {"message": "text"} (vLLM, ollama), into buf. Returns
 * 0, or -1 when the body is none of these (buf then holds the body's start, printable bytes only). */
int remote_error_message(const char *body, size_t len, char *buf, size_t cap);

/* The body of a streaming POST /v1/chat/completions (malloc'd JSON, NULL when out of memory):
 * model (omitted when NULL or empty), the messages, stream + stream_options.include_usage, and
 * the sampling fields — temperature, top_p, seed (unless random), max_tokens (max_tokens > 0),
 * stop, presence_penalty, frequency_penalty; and llama.cpp / vLLM / kvchat serve's top_k,
 * min_p, repeat_penalty, repeat_last_n, sent only when not "off" (top_k > 0, min_p > 0,
 * repeat_penalty != 1) so servers holding to OpenAI's field list get none they do not know. */
char *remote_request_json(const char *model, const prompt_msg *msgs, size_t n, const sampler_params *sp,
                          int max_tokens, const char *const *stops, int n_stops);

#endif
