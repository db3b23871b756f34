/* backend: where the chat's replies come from — the local engine's generator thread (engine/worker.h) or an OpenAI-compatible server (app/remote.h) — behind one interface, so app/chat.c and the UI do not know which. */
#include "app/backend.h"

#include <stdlib.h>

#include "app/remote.h"

/* One table per kind: the chat calls through it and never asks which one it has. */
typedef struct backend_ops {
    int (*fd)(void *impl);
    int (*submit)(void *impl, const backend_request *rq, kv_error *err);
    void (*cancel)(void *impl);
    void (*set_params)(void *impl, const sampler_params *p);
    int (*set_stops)(void *impl, const char *const *stops, int n);
    void (*set_n_predict)(void *impl, int n_predict);
    int (*next_event)(void *impl, worker_event *ev);
    void (*destroy)(void *impl);
    int remote;
} backend_ops;

struct backend {
    const backend_ops *ops;
    void *impl;
};

static int l_fd(void *w) { return worker_fd(w); }
static int l_submit(void *w, const backend_request *rq, kv_error *err) { return worker_submit(w, &rq->local, err); }
static void l_cancel(void *w) { worker_cancel(w); }
static void l_params(void *w, const sampler_params *p) { worker_set_params(w, p); }
static int l_stops(void *w, const char *const *s, int n) { return worker_set_stops(w, s, n); }
static void l_n_predict(void *w, int n) { worker_set_n_predict(w, n); }
static int l_next(void *w, worker_event *ev) { return worker_next_event(w, ev); }
static void l_destroy(void *w) { worker_destroy(w); }

static int r_fd(void *r) { return remote_fd(r); }
static int r_submit(void *r, const backend_request *rq, kv_error *err) { return remote_submit(r, rq->msgs, rq->n_msgs, err); }
static void r_cancel(void *r) { remote_cancel(r); }
static void r_params(void *r, const sampler_params *p) { remote_set_params(r, p); }
static int r_stops(void *r, const char *const *s, int n) { return remote_set_stops(r, s, n); }
static void r_n_predict(void *r, int n) { remote_set_n_predict(r, n); }
static int r_next(void *r, worker_event *ev) { return remote_next_event(r, ev); }
static void r_destroy(void *r) { remote_destroy(r); }

static const backend_ops local_ops = {l_fd, l_submit, l_cancel, l_params, l_stops, l_n_predict, l_next, l_destroy, 0};
static const backend_ops remote_ops = {r_fd, r_submit, r_cancel, r_params, r_stops, r_n_predict, r_next, r_destroy, 1};

static backend *make(const backend_ops *ops, void *impl)
{
    backend *b = impl ? calloc(1, sizeof *b) : NULL;
    if (!b) return NULL;
    b->ops = ops;
    b->impl = impl;
    return b;
}

backend *backend_local(worker *w) { return make(&local_ops, w); }
backend *backend_remote(struct remote *r) { return make(&remote_ops, r); }

void backend_free(backend *b)
{
    if (!b) return;
    b->ops->destroy(b->impl);
    free(b);
}

int backend_is_remote(const backend *b) { return b->ops->remote; }
worker *backend_worker(backend *b) { return b->ops->remote ? NULL : b->impl; }
struct remote *backend_remote_client(backend *b) { return b->ops->remote ? b->impl : NULL; }
int backend_fd(const backend *b) { return b->ops->fd(b->impl); }
int backend_submit(backend *b, const backend_request *rq, kv_error *err) { return b->ops->submit(b->impl, rq, err); }
void backend_cancel(backend *b) { b->ops->cancel(b->impl); }
void backend_set_params(backend *b, const sampler_params *p) { b->ops->set_params(b->impl, p); }
int backend_set_stops(backend *b, const char *const *s, int n) { return b->ops->set_stops(b->impl, s, n); }
void backend_set_n_predict(backend *b, int n) { b->ops->set_n_predict(b->impl, n); }
int backend_next_event(backend *b, worker_event *ev) { return b->ops->next_event(b->impl, ev); }
