/* fuzz_serve: libFuzzer harness for the HTTP request path of `kvchat serve` — routing, the API
 * key, body limits, every request field's checks, prompt building and tokenization, generation
 * and the JSON / SSE responses — through a real server (app/serve.c's serve_main on
 * stories260K, loopback, its own thread) and a real socket. app/serve.c is included (its state
 * is static), so the link leaves out its object.
 *
 * Input: byte 0 chooses the request line and headers (below), the rest is the body; with the
 * raw bit the whole input after byte 0 is sent as it is (HTTP parsing is libmicrohttpd's, so
 * most inputs go through the framed form). Checked beyond the sanitizers: every framed request
 * gets a complete response within the timeout (a hang aborts), an HTTP status the server is
 * documented to give, a JSON body (an OpenAI error object for every status but 200), and for
 * streams every `data:` line JSON or `[DONE]`. */
#include "fuzz_util.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "../../app/serve.c"

#define FZ_KEY "fuzz-key"
#define FZ_TIMEOUT_MS 20000 /* a complete response (generation included) takes milliseconds */

static int fz_port;
static int fz_err = 2; /* stderr as it was before libFuzzer's -close_fd_mask closed it */
#define FZ_FAIL(...) (dprintf(fz_err, "fuzz_serve: " __VA_ARGS__), abort())

static void *fz_server(void *arg)
{
    char **argv = arg;
    int argc = 0;
    while (argv[argc]) argc++;
    int rc = serve_main(argc, argv);
    FZ_FAIL("serve_main returned %d\n", rc);
}

/* connect to the server; -1 when it does not answer */
static int fz_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fz_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int fz_send(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read until the server closes (or timeout_ms passes: returns -2). *out malloc'd, NUL-ended.
 * libFuzzer's -timeout alarm interrupts poll and recv every second: EINTR is not an end. */
static int fz_read_all(int fd, int timeout_ms, char **out, size_t *len)
{
    size_t cap = 1 << 14, n = 0;
    char *b = malloc(cap);
    if (!b) return -1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long left = timeout_ms - ((t1.tv_sec - t0.tv_sec) * 1000L + (t1.tv_nsec - t0.tv_nsec) / 1000000L);
        if (left <= 0) {
            rc = -2;
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)left);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) {
            rc = -2;
            break;
        }
        if (pr < 0) break;
        if (n + 4097 > cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) break;
            b = nb;
        }
        ssize_t r = recv(fd, b + n, 4096, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    b[n] = 0;
    *out = b, *len = n;
    return rc;
}

/* The port the kernel gives a socket bound to port 0 (free now, almost surely at listen). */
static int fz_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l)) abort();
    close(fd);
    return ntohs(a.sin_port);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_err = dup(2);
    static char model[4096], port[16];
    snprintf(model, sizeof model, "%s/models/stories260K.gguf", fuzz_shared());
    fz_port = fz_free_port();
    snprintf(port, sizeof port, "%d", fz_port);
    /* -c 128 bounds every generation (stories260K decodes thousands of tokens a second) */
    static char *sargv[] = {"serve", "-m", model, "--port", port, "-c", "128", "-t", "1",
                            "--api-key", FZ_KEY, "--max-body", "65536", "--parallel", "64", NULL};
    pthread_t t;
    if (pthread_create(&t, NULL, fz_server, sargv)) abort();
    pthread_detach(t);
    for (int i = 0; i < 600; i++) { /* up to 60 s for the model to load */
        int fd = fz_connect();
        if (fd >= 0) {
            const char *req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            char *resp = NULL;
            size_t n = 0;
            int ok = !fz_send(fd, req, strlen(req)) && fz_read_all(fd, 2000, &resp, &n) == 0 &&
                     !strncmp(resp, "HTTP/1.1 200", 12);
            free(resp);
            close(fd);
            if (ok) return 0;
        }
        usleep(100000);
    }
    abort();
}

/* byte 0: bits 0-2 the request line, bit 3 a wrong key, bit 4 no key, bit 5 a Content-Length
 * larger than --max-body, bit 6 Transfer-Encoding: chunked, bit 7 raw (the rest sent as is) */
static const struct {
    const char *method, *path;
} fz_lines[8] = {
    {"POST", "/v1/chat/completions"}, {"POST", "/v1/completions"}, {"GET", "/v1/models"}, {"GET", "/health"},
    {"POST", "/v1/chat/completions"}, {"GET", "/v1/chat/completions"}, {"POST", "/v2/nothing"}, {"DELETE", "/v1/models"},
};

static void fz_check_json(const char *p, size_t n, const char *what)
{
    cJSON *j = cJSON_ParseWithLength(p, n);
    if (!j) {
        FZ_FAIL("%s is not JSON: %.*s\n", what, (int)(n > 400 ? 400 : n), p);
    }
    cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 60000) return 0;
    unsigned ctl = data[0];
    const uint8_t *body = data + 1;
    size_t n_body = size - 1;
    int fd = -1;
    for (int i = 0; i < 5 && fd < 0; i++) fd = fz_connect(); /* a connect the timer interrupted */
    if (fd < 0) FZ_FAIL("the server stopped accepting connections\n");
    if (ctl & 0x80) { /* raw bytes: whatever libmicrohttpd makes of them; no hang, no crash */
        fz_send(fd, body, n_body);
        shutdown(fd, SHUT_WR);
        char *resp = NULL;
        size_t n = 0;
        fz_read_all(fd, 200, &resp, &n);
        free(resp);
        close(fd);
        return 0;
    }
    int li = ctl & 7;
    char head[512];
    int chunked = (ctl & 0x40) != 0, oversized = (ctl & 0x20) && !chunked;
    const char *auth = (ctl & 0x10) ? "" : (ctl & 0x08) ? "Authorization: Bearer wrong\r\n" : "Authorization: Bearer " FZ_KEY "\r\n";
    char clen[64];
    if (chunked) snprintf(clen, sizeof clen, "Transfer-Encoding: chunked\r\n");
    else snprintf(clen, sizeof clen, "Content-Length: %zu\r\n", oversized ? (size_t)1 << 30 : n_body);
    int hl = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s\r\n",
                      fz_lines[li].method, fz_lines[li].path, auth,
                      "Content-Type: application/json\r\n", clen);
    if (fz_send(fd, head, (size_t)hl) == 0) {
        if (chunked) {
            char cl[32];
            int k = snprintf(cl, sizeof cl, "%zx\r\n", n_body);
            if (n_body) fz_send(fd, cl, (size_t)k), fz_send(fd, body, n_body), fz_send(fd, "\r\n", 2);
            fz_send(fd, "0\r\n\r\n", 5);
        } else if (!oversized) {
            fz_send(fd, body, n_body);
        }
    }
    char *resp = NULL;
    size_t n = 0;
    int rr = fz_read_all(fd, FZ_TIMEOUT_MS, &resp, &n);
    close(fd);
    if (rr == -2) {
        FZ_FAIL("no complete response in %d ms to %s %s (got %zu bytes)\n", FZ_TIMEOUT_MS,
                fz_lines[li].method, fz_lines[li].path, n);
    }
    if (oversized) { /* a body announced larger than --max-body: 413 (or a closed connection) */
        if (n && !strstr(resp, " 413 ") && !strstr(resp, " 401 ") && !strstr(resp, " 404 ") && !strstr(resp, " 405 ")) {
            FZ_FAIL("an oversized body got: %.200s\n", resp);
        }
        free(resp);
        return 0;
    }
    if (n == 0) { /* the server closed without a word */
        FZ_FAIL("no response to %s %s\n", fz_lines[li].method, fz_lines[li].path);
    }
    int status = 0;
    if (sscanf(resp, "HTTP/1.%*d %d", &status) != 1) {
        FZ_FAIL("not an HTTP response: %.200s\n", resp);
    }
    static const int allowed[] = {200, 400, 401, 404, 405, 413, 503};
    int ok = 0;
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++) ok |= status == allowed[i];
    if (!ok) {
        FZ_FAIL("status %d: %.300s\n", status, resp);
    }
    char *bp = strstr(resp, "\r\n\r\n");
    if (!bp) FZ_FAIL("a response without the end of its headers: %.300s\n", resp);
    bp += 4;
    size_t bn = n - (size_t)(bp - resp);
    int is_stream = strstr(resp, "text/event-stream") && strstr(resp, "text/event-stream") < bp;
    int is_chunked = strcasestr(resp, "Transfer-Encoding: chunked") && strcasestr(resp, "Transfer-Encoding: chunked") < bp;
    if (is_chunked) { /* de-chunk in place */
        char *w = bp, *r = bp, *end = bp + bn;
        while (r < end) {
            char *e;
            unsigned long k = strtoul(r, &e, 16);
            if (e == r || e + 2 > end) break;
            r = e + 2;
            if (k == 0) break;
            if (r + k > end) k = (unsigned long)(end - r);
            memmove(w, r, k);
            w += k;
            r += k + 2;
        }
        bn = (size_t)(w - bp);
        bp[bn] = 0;
    }
    if (is_stream && status == 200) {
        char *line = bp;
        while (line < bp + bn) {
            char *nl = memchr(line, '\n', (size_t)(bp + bn - line));
            size_t ll = nl ? (size_t)(nl - line) : (size_t)(bp + bn - line);
            if (ll >= 6 && !strncmp(line, "data: ", 6) && !(ll == 12 && !strncmp(line + 6, "[DONE]", 6)))
                fz_check_json(line + 6, ll - 6, "an SSE data line");
            if (!nl) break;
            line = nl + 1;
        }
    } else {
        fz_check_json(bp, bn, "a response body");
        if (status != 200 && !strstr(bp, "\"error\"")) {
            FZ_FAIL("status %d without an error object: %.300s\n", status, bp);
        }
    }
    free(resp);
    return 0;
}
