/* bench_resume: not a test — TTFT of the first reply after resuming an N-token chat whose KV cache comes back from the SQLite prefix store, vs a fresh prefill of the same chat; through the app's own path (worker + chatstore hooks). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app/chatstore.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/worker.h"
#include "tests/support/testutil.h"

/*
 * Usage: bench_resume MODEL [N_TOKENS=1500] [THREADS=2] [REPS=3] [KV_TYPE=f16]
 *
 * The chat: N_TOKENS tokens of story text, then a new message of a few tokens.
 *   fresh   a new engine, an empty KV cache: the reply's TTFT prefills all N + the message
 *   resume  a new engine, the chat opened as `kvchat --resume` does: the worker gets the
 *           chat's tokens, the restore hook reads the KV blob from the store and restores it
 *           (timed: "restore"), then the reply's TTFT prefills only the message
 * Reported: medians over REPS; the ratio resume TTFT / fresh TTFT, and (restore + resume
 * TTFT) / fresh TTFT for a chat opened and answered at once.
 */

typedef struct rig {
    engine *e;
    sampler *s;
    worker *w;
    chatstore *cs;
} rig;

static int rig_open(rig *r, const char *model_path, int n_ctx, int threads, int kv_type, const char *db)
{
    memset(r, 0, sizeof *r);
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = model_path;
    ep.n_ctx = n_ctx;
    ep.n_threads = threads;
    ep.kv_type = kv_type;
    kv_error ke = {0};
    if (engine_open(&ep, &r->e, &ke)) {
        fprintf(stderr, "bench_resume: %s\n", ke.msg);
        return -1;
    }
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    r->s = sampler_create(engine_model(r->e)->hp.n_vocab, &sp, &ke);
    if (!r->s || worker_create(r->e, r->s, &r->w, &ke)) {
        fprintf(stderr, "bench_resume: %s\n", ke.msg);
        return -1;
    }
    if (db) {
        char why[700];
        if (!(r->cs = chatstore_open(r->e, db, 4ull << 30, why, sizeof why))) {
            fprintf(stderr, "bench_resume: %s\n", why);
            return -1;
        }
        worker_hooks h;
        chatstore_worker_hooks(r->cs, &h);
        worker_set_hooks(r->w, &h);
    }
    return 0;
}

static void rig_close(rig *r)
{
    worker_destroy(r->w);
    chatstore_close(r->cs);
    sampler_free(r->s);
    engine_close(r->e);
}

/* Submit and wait for DONE; *st its stats. */
static int run(rig *r, const worker_request *rq, gen_stats *st, double *ms)
{
    kv_error ke = {0};
    double t0 = tu_now_ms();
    if (worker_submit(r->w, rq, &ke)) {
        fprintf(stderr, "bench_resume: %s\n", ke.msg);
        return -1;
    }
    for (;;) {
        struct pollfd p = {.fd = worker_fd(r->w), .events = POLLIN};
        poll(&p, 1, 100);
        worker_event ev;
        while (worker_next_event(r->w, &ev))
            if (ev.kind == WORKER_EV_DONE) {
                if (ms) *ms = tu_now_ms() - t0;
                if (st) *st = ev.stats.gen;
                if (ev.status) fprintf(stderr, "bench_resume: %s\n", ev.err.msg);
                return ev.status ? -1 : 0;
            }
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_resume MODEL [N_TOKENS=1500] [THREADS=2] [REPS=3] [KV_TYPE=f16]\n");
        return 2;
    }
    const char *model_path = argv[1];
    int n_tok = argc > 2 ? atoi(argv[2]) : 1500, threads = argc > 3 ? atoi(argv[3]) : 2, reps = argc > 4 ? atoi(argv[4]) : 3;
    int kv_type = engine_kv_type_from_name(argc > 5 ? argv[5] : "f16");
    if (reps < 1 || reps > 50) reps = 3;
    int n_ctx = (n_tok + 64 + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE * KV_BLOCK_SIZE + 64;
    if (tu_tmpdir_make("bench-resume")) return 1;
    char dbp[600];
    snprintf(dbp, sizeof dbp, "%s", tu_tmp_path("bench.db"));

    /* the chat's tokens: story text until N tokens, exactly */
    rig r;
    if (rig_open(&r, model_path, n_ctx, threads, kv_type, dbp)) return 1;
    static const char *story =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she saw a big red ball under a tree. She ran to the ball and kicked it very hard. The ball "
        "flew over the fence and into the garden of an old man. Lily was scared, but she knocked on the door and "
        "said sorry. The old man smiled and gave her the ball back, and they became friends. ";
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap);
    int32_t *toks = NULL;
    size_t n = 0;
    kv_error ke = {0};
    while (n < (size_t)n_tok) {
        size_t sl = strlen(story);
        if (len + sl + 1 > cap) break;
        memcpy(text + len, story, sl + 1);
        len += sl;
        free(toks);
        if (engine_tokenize(r.e, text, len, 0, 0, &toks, &n, &ke)) {
            fprintf(stderr, "bench_resume: %s\n", ke.msg);
            return 1;
        }
    }
    free(text);
    n = (size_t)n_tok;
    static const char *msg = " And then they went home for dinner.";
    int32_t *mt = NULL;
    size_t nm = 0;
    engine_tokenize(r.e, msg, strlen(msg), 1, 0, &mt, &nm, &ke);

    /* store the chat's KV: prefill it once and let the save hook write it */
    worker_request conv = {.reset_cache = 1, .set_conv = 1, .conv = toks, .n_conv = n};
    double save_ms = 0;
    if (run(&r, &conv, NULL, NULL)) return 1; /* nothing stored yet: no restore */
    worker_segment seg = {"", 0, 0};
    worker_request warm = {.seg = &seg, .n_seg = 0, .append = 1, .n_predict = 1};
    gen_stats st;
    if (run(&r, &warm, &st, &save_ms)) return 1; /* prefills the chat, generates 1, then saves */
    rig_close(&r); /* joins the worker after its KV save */
    /* every resume starts from this store (a resumed reply saves a longer snapshot of its own) */
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s.pristine'", dbp, dbp);
    if (system(cmd)) return 1;
    printf("model %s · %zu-token chat + %zu-token message · %d threads · KV %s · %d reps\n", model_path, n, nm, threads,
           argc > 5 ? argv[5] : "f16", reps);

    double *fresh = calloc((size_t)reps, sizeof *fresh), *rest = calloc((size_t)reps, sizeof *rest),
           *ttft = calloc((size_t)reps, sizeof *ttft), *open_ms = calloc((size_t)reps, sizeof *open_ms);
    int n_prefilled_fresh = 0, n_prefilled_resume = 0;
    double blob_mib = 0;
    worker_segment ms = {msg, strlen(msg), 0};
    for (int i = 0; i < reps; i++) {
        /* fresh: an empty cache, the whole chat and the message prefilled */
        rig f;
        if (rig_open(&f, model_path, n_ctx, threads, kv_type, NULL)) return 1;
        run(&f, &conv, NULL, NULL); /* no store: nothing is restored */
        worker_request go = {.seg = &ms, .n_seg = 1, .append = 1, .n_predict = 1};
        if (run(&f, &go, &st, NULL)) return 1;
        fresh[i] = st.ttft_ms;
        n_prefilled_fresh = st.n_prefilled;
        rig_close(&f);
        /* resume: a new engine; open the chat (restore from the store), then the message */
        rig x;
        snprintf(cmd, sizeof cmd, "cp '%s.pristine' '%s' && rm -f '%s-wal' '%s-shm'", dbp, dbp, dbp, dbp);
        if (system(cmd)) return 1;
        if (rig_open(&x, model_path, n_ctx, threads, kv_type, dbp)) return 1;
        if (run(&x, &conv, NULL, &open_ms[i])) return 1;
        char rep[1600];
        chatstore_report(x.cs, rep, sizeof rep);
        const char *p = strstr(rep, "restored in ");
        rest[i] = p ? atof(p + 12) : -1;
        kv_cache_stats ks;
        kv_cache_get_stats(engine_kv(x.e), &ks);
        blob_mib = ks.bytes_used / 1048576.0;
        worker_request rr = {.seg = &ms, .n_seg = 1, .append = 1, .n_predict = 1};
        if (run(&x, &rr, &st, NULL)) return 1;
        ttft[i] = st.ttft_ms;
        n_prefilled_resume = st.n_prefilled;
        rig_close(&x);
    }
    double mf = tu_median(fresh, reps), mr = tu_median(rest, reps), mt2 = tu_median(ttft, reps),
           mo = tu_median(open_ms, reps);
    printf("fresh prefill   TTFT %9.2f ms   (%d tokens prefilled)\n", mf, n_prefilled_fresh);
    printf("resume          TTFT %9.2f ms   (%d tokens prefilled; KV restored at open: %.2f ms for %.1f MiB, open "
           "request %.2f ms)\n",
           mt2, n_prefilled_resume, mr, blob_mib, mo);
    printf("ratio           TTFT resume / fresh = %.1f%%;  (restore + TTFT) / fresh = %.1f%%\n", 100 * mt2 / mf,
           100 * (mr + mt2) / mf);
    tu_tmpdir_remove();
    free(fresh);
    free(rest);
    free(ttft);
    free(open_ms);
    free(toks);
    free(mt);
    return 0;
}
