/* backend: where the chat's replies come from — the local engine's generator thread (engine/worker.h) or an OpenAI-compatible server (app/remote.h) — behind one interface, so app/chat.c and the UI do not know which. */
#ifndef APP_BACKEND_H
#define APP_BACKEND_H

#include <stddef.h>

#include "app/prompt.h"
#include "engine/worker.h"

/*
 * Both deliver engine/worker.h's worker_event's (TEXT, STATS, DONE) through a descriptor the
 * UI thread poll()s. A request carries both forms of the conversation: the rendered prompt
 * segments the local engine tokenizes (local), and the messages a server renders with its own
 * chat template (msgs). A request with neither segments nor messages only finishes (a reset:
 * the local engine clears or restores its KV cache; a server keeps its own).
 */
typedef struct backend_request {
    worker_request local;   /* for the local engine */
    const prompt_msg *msgs; /* for a server: system / user / assistant messages */
    size_t n_msgs;
} backend_request;

typedef struct backend backend;

/* The local engine's worker (owned by the backend from now on: backend_free destroys it). */
backend *backend_local(worker *w);
/* A server's client (owned likewise). */
struct remote;
backend *backend_remote(struct remote *r);
void backend_free(backend *b); /* cancels, joins, frees; NULL is a no-op */

int backend_is_remote(const backend *b);
worker *backend_worker(backend *b);           /* NULL for a server */
struct remote *backend_remote_client(backend *b); /* NULL for the local engine */

int backend_fd(const backend *b);
int backend_submit(backend *b, const backend_request *rq, kv_error *err);
void backend_cancel(backend *b);
void backend_set_params(backend *b, const sampler_params *p);
int backend_set_stops(backend *b, const char *const *stops, int n);
void backend_set_n_predict(backend *b, int n_predict);
int backend_next_event(backend *b, worker_event *ev);

#endif
