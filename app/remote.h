/* remote: the chat's replies from an OpenAI-compatible server — a streaming POST /v1/chat/completions through libcurl on its own thread, delivering the same events as the local generator (engine/worker.h). */
#ifndef APP_REMOTE_H
#define APP_REMOTE_H

#include <stddef.h>

#include "app/prompt.h"
#include "engine/kv_error.h"
#include "engine/sampler.h"
#include "engine/worker.h"

/*
 * The same contract as engine/worker.h's worker, so app/backend.h can put either behind the
 * chat: the UI thread submits a request, poll()s remote_fd() and drains worker_event's —
 * TEXT (the delta.content pieces as they arrive, coalesced), STATS (live: the pieces so far,
 * TTFT, decode rate) and one DONE (finish from finish_reason; stats.gen from the server's
 * usage: n_prompt = prompt_tokens, n_reused = cached_tokens, n_generated = completion_tokens,
 * with llama.cpp's timings when it sends them; status KV_ERR_IO with a message naming the URL
 * and the problem when the request failed). conv is NULL: the server keeps its own tokens.
 *
 * The request is sent with stream: true and stream_options.include_usage (the SSE framing and
 * the chunks: app/remote_sse.h). Cancel aborts the transfer at once (curl_multi_wakeup); a
 * server that sends nothing for timeout_s seconds fails the request ("stalled"). Sampling
 * parameters, stop strings and the token limit apply from the next request on (a request in
 * flight cannot be changed).
 */

typedef struct remote_options {
    const char *url;      /* the server: http://host:8080 or http://host:8080/v1 (a trailing / or
                             /v1 is dropped; the client adds /v1/chat/completions) */
    const char *api_key;  /* NULL / "": no Authorization header */
    const char *model;    /* NULL / "": the server's first model (remote_probe) or none */
    double timeout_s;     /* no byte for this long fails the request; <= 0: 120 */
} remote_options;

typedef struct remote remote;

/* Start the client thread. Returns KV_OK, or KV_ERR_INVALID (a URL that is not http:// or
 * https://), KV_ERR_NOMEM / KV_ERR_IO (curl, pipe or thread) with err filled. */
int remote_create(const remote_options *o, remote **out, kv_error *err);
/* Abort a running request, join the thread, free everything. NULL is a no-op. */
void remote_destroy(remote *r);

/* GET /v1/models (synchronous, about 3 s at most): when no model was given, the first one listed
 * becomes the model of the requests. Returns 0, or -1 with why ("URL: cannot connect: …") —
 * the chat still opens; the first request then says the same. */
int remote_probe(remote *r, char *why, size_t cap);
const char *remote_url(const remote *r);    /* the base URL as normalized */
const char *remote_model(const remote *r);  /* the model name, "" if none is known */

int remote_fd(const remote *r);
/* A reply to msgs[0..n) (copied into the request body now). n = 0: a request that only
 * finishes (the DONE of a reset, GEN_FINISH_NONE). KV_ERR_INVALID when busy. */
int remote_submit(remote *r, const prompt_msg *msgs, size_t n, kv_error *err);
int remote_busy(remote *r);
void remote_cancel(remote *r);
void remote_set_params(remote *r, const sampler_params *p);
/* Copied; at most STOP_MAX_STRINGS (the server applies them). 0, or -1 (too many). */
int remote_set_stops(remote *r, const char *const *stops, int n);
void remote_set_n_predict(remote *r, int n_predict);
/* As worker_next_event: 1 and *ev, or 0 (queue empty, descriptor cleared). ev->text stays
 * valid until the next call. */
int remote_next_event(remote *r, worker_event *ev);

/* `kvchat -p PROMPT --remote URL` (app/remote_cli.c): the prompt as one user message, the reply
 * streamed to stdout (control bytes neutralised; --json: JSON lines as the local one-shot mode),
 * --stats the server's usage on stderr. *interrupted (SIGINT) aborts the transfer. Returns the
 * exit status: 0, or 1 with the error on stderr. */
#include <signal.h>
int remote_oneshot(const remote_options *o, const char *prompt, const sampler_params *sp, int n_predict,
                   const char *const *stops, int n_stops, int stats, int json, volatile sig_atomic_t *interrupted);

#endif
