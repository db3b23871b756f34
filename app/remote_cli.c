/* remote_cli: `kvchat -p PROMPT --remote URL` — the one-shot mode on an OpenAI-compatible server: the prompt as one user message, the streamed reply on stdout. */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "app/output.h"
#include "app/remote.h"

int remote_oneshot(const remote_options *o, const char *prompt, const sampler_params *sp, int n_predict,
                   const char *const *stops, int n_stops, int stats, int json, volatile sig_atomic_t *interrupted)
{
    remote *r = NULL;
    kv_error err = {0};
    if (remote_create(o, &r, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        return err.code == KV_ERR_INVALID ? 2 : 1;
    }
    char why[1200];
    if (!o->model || !*o->model) remote_probe(r, why, sizeof why); /* the server's model name, if it lists one */
    remote_set_params(r, sp);
    remote_set_n_predict(r, n_predict);
    remote_set_stops(r, stops, n_stops);
    prompt_msg m = {"user", prompt, strlen(prompt)};
    if (remote_submit(r, &m, 1, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        remote_destroy(r);
        return 1;
    }
    plain_out po = {.f = stdout};
    json_out jo;
    json_out_init(&jo, stdout);
    int rc = 1, cancelled = 0;
    for (;;) {
        if (*interrupted && !cancelled) {
            remote_cancel(r);
            cancelled = 1;
        }
        struct pollfd p = {.fd = remote_fd(r), .events = POLLIN};
        poll(&p, 1, 100);
        worker_event ev;
        int done = 0;
        while (!done && remote_next_event(r, &ev)) {
            if (ev.kind == WORKER_EV_TEXT) {
                if (json) json_out_token(&jo, -1, ev.text, ev.len); /* a server sends text, not token ids */
                else plain_out_write(&po, ev.text, ev.len);
                fflush(stdout);
            } else if (ev.kind == WORKER_EV_DONE) {
                done = 1;
                plain_out_flush(&po);
                if (json) json_out_done(&jo, &ev.stats.gen, ev.finish, ev.status ? ev.err.msg : NULL);
                if (ev.status) fprintf(stderr, "\nkvchat: %s\n", ev.err.msg);
                else rc = 0;
                if (stats && !ev.status)
                    fprintf(stderr, "\n%s (%s): prompt %d tokens (%d cached) | TTFT %.1f ms | completion %d tokens, "
                            "%.1f t/s | finish: %s\n", remote_url(r), *remote_model(r) ? remote_model(r) : "?",
                            ev.stats.gen.n_prompt, ev.stats.gen.n_reused, ev.stats.gen.ttft_ms, ev.stats.gen.n_generated,
                            ev.stats.gen.decode_tps, gen_finish_name(ev.finish));
            }
        }
        if (done) break;
    }
    remote_destroy(r);
    return rc;
}
