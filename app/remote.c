/* remote: the chat's replies from an OpenAI-compatible server — a streaming POST /v1/chat/completions through libcurl on its own thread, delivering the same events as the local generator (engine/worker.h). */
#include "app/remote.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "app/remote_sse.h"
#include "engine/stop.h"

#define REMOTE_MAX_ERROR_BODY (64 << 10) /* bytes of a non-200 body kept for its message */
#define REMOTE_CONNECT_TIMEOUT_S 10
#define REMOTE_PROBE_TIMEOUT_S 3

struct remote {
    char url[2048];          /* base, normalized */
    char endpoint[2100];     /* url + /v1/chat/completions */
    char auth[1100];         /* "Authorization: Bearer KEY" or "" */
    char model[256];
    double timeout_s;
    CURLM *multi;            /* the client thread's; curl_multi_wakeup from any thread */
    pthread_t th;
    int started;
    int wake[2];             /* the UI's poll() descriptor */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* UI thread → client thread, under mu */
    char *body;              /* the next request's JSON; NULL: none pending */
    int reset_only;          /* the pending request only finishes */
    int quit;
    atomic_int cancel;
    sampler_params sp;       /* UI thread only (used to build the body) */
    int n_predict;
    char *stops[STOP_MAX_STRINGS];
    int n_stops;
    /* client thread → UI thread, under mu */
    int busy;                /* submit → the DONE taken */
    char *text;              /* text not yet taken */
    size_t tlen, tcap;
    int have_stats;
    worker_stats stats;
    int have_done;
    worker_event done;
    int signalled;
    char *out;               /* the TEXT handed out (valid until the next call) */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* mu held */
static void signal_ui(remote *r)
{
    if (r->signalled) return;
    r->signalled = 1;
    ssize_t w = write(r->wake[1], "x", 1);
    (void)w;
}

/* ---- one request (client thread) --------------------------------------------------------------- */

typedef struct xfer {
    remote *r;
    sse_parser sse;
    long status;             /* HTTP status once the headers are in */
    char ctype[96];          /* its Content-Type ("" if none) */
    char *ebody;             /* a non-200 body */
    size_t elen;
    double t0, t_first, t_last_rx, t_prev_piece;
    int n_pieces;            /* delta.content pieces (about one per token) */
    double itl_sum, itl_max;
    int finish;              /* from finish_reason */
    int got_done;            /* [DONE] */
    remote_chunk usage;      /* the last chunk with usage / timings (its text freed) */
    int have_usage, have_timings;
    char model[128];
    char fail[600];          /* why the stream is refused ("" while fine) */
} xfer;

static void live_stats(xfer *x, gen_stats *g)
{
    memset(g, 0, sizeof *g);
    g->n_generated = x->n_pieces;
    if (x->t_first > 0) {
        g->ttft_ms = x->t_first - x->t0;
        double dec = x->t_prev_piece - x->t_first;
        g->decode_ms = dec;
        g->decode_tps = x->n_pieces > 1 && dec > 0 ? (x->n_pieces - 1) * 1e3 / dec : 0;
        g->itl_ms_mean = x->n_pieces > 1 ? x->itl_sum / (x->n_pieces - 1) : 0;
        g->itl_ms_max = x->itl_max;
    }
}

static int on_sse_event(void *ud, const char *data, size_t len)
{
    xfer *x = ud;
    remote_chunk c;
    char why[300];
    if (remote_parse_chunk(data, len, &c, why, sizeof why)) {
        snprintf(x->fail, sizeof x->fail, "a malformed event stream: %s", why);
        return 1;
    }
    if (c.done) {
        x->got_done = 1;
        return 0;
    }
    if (c.error[0]) {
        snprintf(x->fail, sizeof x->fail, "the server reported an error in the stream: %.500s", c.error);
        remote_chunk_free(&c);
        return 1;
    }
    if (c.model[0]) snprintf(x->model, sizeof x->model, "%s", c.model);
    if (c.finish) x->finish = c.finish;
    if (c.have_usage || c.have_timings) {
        int hu = x->have_usage, ht = x->have_timings;
        remote_chunk keep = x->usage;
        x->usage = c;
        x->usage.text = NULL;
        if (!c.have_usage && hu) { /* timings alone: keep the counts of before */
            x->usage.prompt_tokens = keep.prompt_tokens;
            x->usage.completion_tokens = keep.completion_tokens;
            x->usage.cached_tokens = keep.cached_tokens;
        }
        x->have_usage = hu | c.have_usage;
        x->have_timings = ht | c.have_timings;
    }
    if (c.text) {
        double t = now_ms();
        if (x->n_pieces == 0) x->t_first = t;
        else {
            double gap = t - x->t_prev_piece;
            x->itl_sum += gap;
            if (gap > x->itl_max) x->itl_max = gap;
        }
        x->t_prev_piece = t;
        x->n_pieces++;
        remote *r = x->r;
        pthread_mutex_lock(&r->mu);
        if (r->tlen + c.len + 1 > r->tcap) {
            size_t nc = r->tcap ? r->tcap : 4096;
            while (nc < r->tlen + c.len + 1) nc *= 2;
            char *nt = realloc(r->text, nc);
            if (!nt) {
                pthread_mutex_unlock(&r->mu);
                remote_chunk_free(&c);
                snprintf(x->fail, sizeof x->fail, "out of memory");
                return 1;
            }
            r->text = nt;
            r->tcap = nc;
        }
        memcpy(r->text + r->tlen, c.text, c.len);
        r->tlen += c.len;
        memset(&r->stats, 0, sizeof r->stats);
        r->stats.phase = WORKER_DECODE;
        live_stats(x, &r->stats.gen);
        r->stats.elapsed_ms = t - x->t0;
        r->have_stats = 1;
        signal_ui(r);
        pthread_mutex_unlock(&r->mu);
    }
    remote_chunk_free(&c);
    return 0;
}

static size_t on_body(char *ptr, size_t size, size_t n, void *ud)
{
    xfer *x = ud;
    size_t len = size * n;
    x->t_last_rx = now_ms();
    if (atomic_load(&x->r->cancel)) return 0; /* CURLE_WRITE_ERROR: the transfer ends now */
    if (x->status != 200) {                   /* an error body: keep it for its message */
        size_t take = x->elen + len > REMOTE_MAX_ERROR_BODY ? REMOTE_MAX_ERROR_BODY - x->elen : len;
        char *nb = take ? realloc(x->ebody, x->elen + take + 1) : x->ebody;
        if (nb) {
            x->ebody = nb;
            memcpy(x->ebody + x->elen, ptr, take);
            x->elen += take;
            x->ebody[x->elen] = 0;
        }
        return len;
    }
    int rc = sse_feed(&x->sse, ptr, len, on_sse_event, x);
    if (rc < 0 && !x->fail[0])
        snprintf(x->fail, sizeof x->fail, "a malformed event stream: a line or event longer than %u bytes", SSE_MAX_EVENT);
    return rc ? 0 : len;
}

static size_t on_header(char *ptr, size_t size, size_t n, void *ud)
{
    xfer *x = ud;
    size_t len = size * n;
    x->t_last_rx = now_ms();
    if (len > 5 && !strncasecmp(ptr, "HTTP/", 5)) { /* a status line (also of a 100 Continue) */
        const char *sp = memchr(ptr, ' ', len);
        if (sp) x->status = strtol(sp + 1, NULL, 10);
        x->ctype[0] = 0;
    } else if (len > 13 && !strncasecmp(ptr, "Content-Type:", 13)) {
        size_t a = 13, b = len;
        while (a < b && (ptr[a] == ' ' || ptr[a] == '\t')) a++;
        while (b > a && (ptr[b - 1] == '\r' || ptr[b - 1] == '\n' || ptr[b - 1] == ' ')) b--;
        snprintf(x->ctype, sizeof x->ctype, "%.*s", (int)(b - a), ptr + a);
    }
    return len;
}

/* What a status means for the user, after the server's own message. */
static const char *status_hint(long st)
{
    switch (st) {
    case 401: case 403: return " — check the API key (--api-key, [remote] api_key, KVCHAT_REMOTE_API_KEY)";
    case 404: return " — check the URL (the server's base, e.g. http://host:8080 or …/v1) and --model";
    case 429: return " — the server is rate-limiting: try again later";
    default: return st >= 500 ? " — the server failed; its log says more" : "";
    }
}

/* Run one request; fills ev (DONE) with the outcome. */
static void run_request(remote *r, const char *body, worker_event *ev)
{
    xfer x = {.r = r};
    x.t0 = x.t_last_rx = now_ms();
    CURL *h = curl_easy_init();
    struct curl_slist *hdr = NULL;
    hdr = curl_slist_append(hdr, "Content-Type: application/json");
    hdr = curl_slist_append(hdr, "Accept: text/event-stream");
    if (r->auth[0]) hdr = curl_slist_append(hdr, r->auth);
    char cerr[CURL_ERROR_SIZE] = "";
    ev->kind = WORKER_EV_DONE;
    ev->status = KV_OK;
    ev->finish = GEN_FINISH_EOG;
    if (!h || !hdr) {
        ev->status = kv_error_set(&ev->err, KV_ERR_NOMEM, "%s: out of memory starting the request", r->endpoint);
        goto out;
    }
    curl_easy_setopt(h, CURLOPT_URL, r->endpoint);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, (long)REMOTE_CONNECT_TIMEOUT_S);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "kvchat/" KVCHAT_VERSION);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_multi_add_handle(r->multi, h);
    int running = 1, stalled = 0, cancelled = 0;
    CURLcode res = CURLE_OK;
    while (running) {
        if (curl_multi_perform(r->multi, &running) != CURLM_OK) break;
        if (atomic_load(&r->cancel)) {
            cancelled = 1;
            break;
        }
        if (!running) break;
        if (now_ms() - x.t_last_rx > r->timeout_s * 1e3) {
            stalled = 1;
            break;
        }
        curl_multi_poll(r->multi, NULL, 0, 100, NULL);
    }
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(r->multi, &left)))
        if (m->msg == CURLMSG_DONE && m->easy_handle == h) res = m->data.result;
    curl_multi_remove_handle(r->multi, h);
    if (!cancelled && !stalled && !x.fail[0] && x.status == 200 && res == CURLE_OK) sse_finish(&x.sse, on_sse_event, &x);
    if (atomic_load(&r->cancel)) cancelled = 1;
    double t_end = now_ms();

    gen_stats *g = &ev->stats.gen;
    live_stats(&x, g);
    if (x.have_usage) {
        g->n_prompt = x.usage.prompt_tokens;
        g->n_reused = x.usage.cached_tokens < g->n_prompt ? x.usage.cached_tokens : g->n_prompt;
        g->n_prefilled = g->n_prompt - g->n_reused;
        if (x.usage.completion_tokens || !x.n_pieces) g->n_generated = x.usage.completion_tokens;
    }
    if (x.have_timings && x.usage.prompt_per_second > 0) g->prefill_tps = x.usage.prompt_per_second;
    else if (g->ttft_ms > 0 && g->n_prefilled > 0) g->prefill_tps = g->n_prefilled * 1e3 / g->ttft_ms;
    if (x.have_timings && x.usage.predicted_per_second > 0) g->decode_tps = x.usage.predicted_per_second;
    g->prefill_ms = x.have_timings ? x.usage.prompt_ms : g->ttft_ms;
    ev->stats.elapsed_ms = t_end - x.t0;
    ev->stats.kv.n_tokens = g->n_prompt + g->n_generated;
    if (x.model[0] && !r->model[0]) snprintf(r->model, sizeof r->model, "%s", x.model);

    if (cancelled) {
        ev->finish = GEN_FINISH_CANCELLED;
        goto out;
    }
    if (stalled) {
        ev->status = kv_error_set(&ev->err, KV_ERR_IO, "%s: the server sent nothing for %.0f s%s; the request was stopped",
                                  r->endpoint, r->timeout_s, x.status ? " in the middle of the reply" : " (no response)");
        goto out;
    }
    if (x.status && x.status != 200) {
        char msg[400];
        remote_error_message(x.ebody, x.elen, msg, sizeof msg);
        ev->status = kv_error_set(&ev->err, KV_ERR_IO, "%s: HTTP %ld: %s%s", r->endpoint, x.status,
                                  msg[0] ? msg : "(no message)", status_hint(x.status));
        goto out;
    }
    if (x.fail[0]) {
        ev->status = kv_error_set(&ev->err, KV_ERR_IO, "%s: %s", r->endpoint, x.fail);
        goto out;
    }
    if (x.status == 200 && (res == CURLE_PARTIAL_FILE || res == CURLE_RECV_ERROR || res == CURLE_GOT_NOTHING)) {
        ev->status = kv_error_set(&ev->err, KV_ERR_IO, "%s: the server closed the connection before the reply ended "
                                  "(%d piece%s received; %s)", r->endpoint, x.n_pieces, x.n_pieces == 1 ? "" : "s",
                                  cerr[0] ? cerr : curl_easy_strerror(res));
        goto out;
    }
    if (res != CURLE_OK) {
        ev->status = kv_error_set(&ev->err, KV_ERR_IO, "%s: %s%s", r->endpoint, cerr[0] ? cerr : curl_easy_strerror(res),
                                  res == CURLE_COULDNT_CONNECT ? " — is the server running there?" : "");
        goto out;
    }
    if (!x.got_done && !x.finish && x.n_pieces == 0 && x.ctype[0] && strncasecmp(x.ctype, "text/event-stream", 17)) {
        ev->status = kv_error_set(&ev->err, KV_ERR_IO, "%s: the server answered with Content-Type %s, not an event stream "
                                  "(does it support \"stream\": true?)", r->endpoint, x.ctype);
        goto out;
    }
    if (!x.got_done && !x.finish) {
        ev->status = kv_error_set(&ev->err, KV_ERR_IO, "%s: the stream ended before the reply did (no finish_reason, no "
                                  "[DONE]; %d pieces received)", r->endpoint, x.n_pieces);
        goto out;
    }
    ev->finish = x.finish ? x.finish : GEN_FINISH_EOG;
out:
    if (ev->status != KV_OK) ev->finish = GEN_FINISH_ERROR;
    if (h) curl_easy_cleanup(h);
    curl_slist_free_all(hdr);
    sse_free(&x.sse);
    free(x.ebody);
}

static void *client_main(void *arg)
{
    remote *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->quit && !r->body && !r->reset_only) pthread_cond_wait(&r->cv, &r->mu);
        if (r->quit) break;
        char *body = r->body;
        int reset = r->reset_only;
        r->body = NULL;
        r->reset_only = 0;
        pthread_mutex_unlock(&r->mu);
        worker_event ev;
        memset(&ev, 0, sizeof ev);
        if (reset) ev = (worker_event){.kind = WORKER_EV_DONE, .status = KV_OK, .finish = GEN_FINISH_NONE};
        else run_request(r, body, &ev);
        free(body);
        pthread_mutex_lock(&r->mu);
        r->done = ev;
        r->have_done = 1;
        signal_ui(r);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- the API (UI thread) ----------------------------------------------------------------------------- */

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

int remote_create(const remote_options *o, remote **out, kv_error *err)
{
    *out = NULL;
    const char *u = o->url ? o->url : "";
    if (strncasecmp(u, "http://", 7) && strncasecmp(u, "https://", 8))
        return kv_error_set(err, KV_ERR_INVALID, "--remote '%s': not an http:// or https:// URL", u);
    if (strlen(u) >= 2000) return kv_error_set(err, KV_ERR_INVALID, "--remote: the URL is longer than 2000 bytes");
    pthread_once(&g_curl_once, curl_init_once);
    remote *r = calloc(1, sizeof *r);
    if (!r) return kv_error_set(err, KV_ERR_NOMEM, "out of memory");
    snprintf(r->url, sizeof r->url, "%s", u);
    size_t n = strlen(r->url);
    while (n && r->url[n - 1] == '/') r->url[--n] = 0;
    if (n >= 3 && !strcmp(r->url + n - 3, "/v1")) r->url[n -= 3] = 0;
    snprintf(r->endpoint, sizeof r->endpoint, "%s/v1/chat/completions", r->url);
    if (o->api_key && *o->api_key) snprintf(r->auth, sizeof r->auth, "Authorization: Bearer %.1000s", o->api_key);
    if (o->model) snprintf(r->model, sizeof r->model, "%s", o->model);
    r->timeout_s = o->timeout_s > 0 ? o->timeout_s : 120;
    sampler_params_default(&r->sp);
    r->n_predict = -1;
    r->wake[0] = r->wake[1] = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pipe2(r->wake, O_NONBLOCK | O_CLOEXEC)) {
        kv_error_set(err, KV_ERR_IO, "remote client: pipe: %s", strerror(errno));
        remote_destroy(r);
        return KV_ERR_IO;
    }
    if (!(r->multi = curl_multi_init())) {
        remote_destroy(r);
        return kv_error_set(err, KV_ERR_NOMEM, "remote client: curl_multi_init failed");
    }
    if (pthread_create(&r->th, NULL, client_main, r)) {
        remote_destroy(r);
        return kv_error_set(err, KV_ERR_IO, "remote client: cannot start its thread");
    }
    r->started = 1;
    *out = r;
    return KV_OK;
}

void remote_destroy(remote *r)
{
    if (!r) return;
    if (r->started) {
        atomic_store(&r->cancel, 1);
        pthread_mutex_lock(&r->mu);
        r->quit = 1;
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
        curl_multi_wakeup(r->multi);
        pthread_join(r->th, NULL);
    }
    if (r->multi) curl_multi_cleanup(r->multi);
    if (r->wake[0] >= 0) close(r->wake[0]), close(r->wake[1]);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->body);
    free(r->text);
    free(r->out);
    free(r);
}

const char *remote_url(const remote *r) { return r->url; }
const char *remote_model(const remote *r) { return r->model; }
int remote_fd(const remote *r) { return r->wake[0]; }

static size_t collect(char *ptr, size_t size, size_t n, void *ud)
{
    size_t len = size * n;
    char **buf = ud;
    size_t have = *buf ? strlen(*buf) : 0;
    if (have + len > (1u << 20)) return 0;
    char *nb = realloc(*buf, have + len + 1);
    if (!nb) return 0;
    memcpy(nb + have, ptr, len);
    nb[have + len] = 0;
    *buf = nb;
    return len;
}

int remote_probe(remote *r, char *why, size_t cap)
{
    char url[2100], cerr[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "%s/v1/models", r->url);
    CURL *h = curl_easy_init();
    struct curl_slist *hdr = r->auth[0] ? curl_slist_append(NULL, r->auth) : NULL;
    char *body = NULL;
    if (!h) {
        snprintf(why, cap, "%s: out of memory", url);
        return -1;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)REMOTE_PROBE_TIMEOUT_S);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode res = curl_easy_perform(h);
    long st = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    int rc = -1;
    if (res != CURLE_OK)
        snprintf(why, cap, "%s: %s%s", url, cerr[0] ? cerr : curl_easy_strerror(res),
                 res == CURLE_COULDNT_CONNECT ? " — is the server running there?" : "");
    else if (st != 200) {
        char msg[300];
        remote_error_message(body, body ? strlen(body) : 0, msg, sizeof msg);
        snprintf(why, cap, "%s: HTTP %ld: %s%s", url, st, msg[0] ? msg : "(no message)", status_hint(st));
    } else {
        cJSON *root = body ? cJSON_Parse(body) : NULL;
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
        const cJSON *m0 = cJSON_IsArray(data) ? cJSON_GetArrayItem(data, 0) : NULL;
        const cJSON *id = cJSON_IsObject(m0) ? cJSON_GetObjectItemCaseSensitive(m0, "id") : NULL;
        if (cJSON_IsString(id)) {
            if (!r->model[0]) snprintf(r->model, sizeof r->model, "%s", id->valuestring);
            rc = 0;
        } else if (r->model[0]) rc = 0; /* a model was given: the list does not matter */
        else snprintf(why, cap, "%s: the server lists no model (no data[0].id); requests go without a \"model\"", url);
        cJSON_Delete(root);
    }
    curl_easy_cleanup(h);
    curl_slist_free_all(hdr);
    free(body);
    return rc;
}

int remote_submit(remote *r, const prompt_msg *msgs, size_t n, kv_error *err)
{
    pthread_mutex_lock(&r->mu);
    int busy = r->busy;
    pthread_mutex_unlock(&r->mu);
    if (busy) return kv_error_set(err, KV_ERR_INVALID, "a request is already running");
    char *body = NULL;
    if (n) {
        body = remote_request_json(r->model, msgs, n, &r->sp, r->n_predict, (const char *const *)r->stops, r->n_stops);
        if (!body) return kv_error_set(err, KV_ERR_NOMEM, "out of memory building the request");
    }
    pthread_mutex_lock(&r->mu);
    atomic_store(&r->cancel, 0);
    r->body = body;
    r->reset_only = !n;
    r->busy = 1;
    r->tlen = 0;
    r->have_stats = r->have_done = 0;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return KV_OK;
}

int remote_busy(remote *r)
{
    pthread_mutex_lock(&r->mu);
    int b = r->busy;
    pthread_mutex_unlock(&r->mu);
    return b;
}

void remote_cancel(remote *r)
{
    atomic_store(&r->cancel, 1);
    curl_multi_wakeup(r->multi);
}

void remote_set_params(remote *r, const sampler_params *p) { r->sp = *p; }
void remote_set_n_predict(remote *r, int n_predict) { r->n_predict = n_predict; }

int remote_set_stops(remote *r, const char *const *stops, int n)
{
    if (n < 0 || n > STOP_MAX_STRINGS) return -1;
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    r->n_stops = 0;
    for (int i = 0; i < n; i++)
        if (stops[i] && *stops[i] && (r->stops[r->n_stops] = strdup(stops[i]))) r->n_stops++;
    return 0;
}

int remote_next_event(remote *r, worker_event *ev)
{
    memset(ev, 0, sizeof *ev);
    pthread_mutex_lock(&r->mu);
    int got = 1;
    if (r->tlen) {
        free(r->out);
        r->out = r->text;
        ev->kind = WORKER_EV_TEXT;
        ev->text = r->out;
        ev->len = r->tlen;
        r->text = NULL;
        r->tlen = r->tcap = 0;
    } else if (r->have_stats) {
        ev->kind = WORKER_EV_STATS;
        ev->stats = r->stats;
        r->have_stats = 0;
    } else if (r->have_done) {
        *ev = r->done;
        r->have_done = 0;
        r->busy = 0;
    } else got = 0;
    if (!got || (!r->tlen && !r->have_stats && !r->have_done)) { /* the queue is empty: clear the descriptor */
        char buf[64];
        while (read(r->wake[0], buf, sizeof buf) > 0) {}
        r->signalled = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return got;
}
