/* bench_kv: KV cache benchmark (not a test) — TTFT of /regen after a long conversation vs a fresh prefill of it, prefix-cache hits after freeing, decode tokens/s, memory per token; through the engine API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "engine/kernels/quant.h"
#include "tests/support/testutil.h"

/* Usage: bench_kv MODEL [N_CONV=1500] [N_CTX=2048] [THREADS=1] [KV_TYPE=f16] */

static int die(const char *what, const kv_error *err)
{
    fprintf(stderr, "bench_kv: %s: %s\n", what, err->msg);
    return 1;
}

#define REPS 7

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_kv MODEL [N_CONV=1500] [N_CTX=2048] [THREADS=1] [KV_TYPE=f16]\n");
        return 2;
    }
    int n_conv = argc > 2 ? atoi(argv[2]) : 1500;
    int n_ctx = argc > 3 ? atoi(argv[3]) : 2048;
    int n_threads = argc > 4 ? atoi(argv[4]) : 1;
    int kv_type = engine_kv_type_from_name(argc > 5 ? argv[5] : "f16");
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = argv[1];
    ep.n_ctx = n_ctx;
    ep.n_threads = n_threads;
    ep.kv_type = kv_type;
    engine *e = NULL;
    kv_error err = {0};
    if (engine_open(&ep, &e, &err)) return die("open", &err);
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    sampler *s = sampler_create(engine_model(e)->hp.n_vocab, &sp, &err);
    if (!s) return die("sampler", &err);

    /* The conversation: story text, tokenized, cut to n_conv tokens. */
    const char *story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
                        "with her friends. One day, she saw a big red ball under a tree. She wanted to play with it, "
                        "so she asked her mom. Her mom said yes, and Lily was very happy. ";
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap);
    text[0] = 0;
    int32_t *conv = NULL;
    size_t n_tok = 0;
    while (n_tok < (size_t)n_conv) {
        size_t sl = strlen(story);
        if (len + sl + 1 > cap) break;
        memcpy(text + len, story, sl + 1);
        len += sl;
        free(conv);
        conv = NULL;
        if (engine_tokenize(e, text, len, 0, 0, &conv, &n_tok, &err)) return die("tokenize", &err);
    }
    if (n_tok < (size_t)n_conv) return fprintf(stderr, "bench_kv: conversation too short\n"), 1;
    size_t n = (size_t)n_conv;
    gen_opts one = {.n_predict = 1}, reply = {.n_predict = 64};
    gen_stats st;
    int finish;
    double fresh[REPS], regen[REPS], branch[REPS], readopt[REPS];

    /* Fresh prefill: a cold cache, a new sequence each time. */
    for (int r = 0; r < REPS; r++) {
        int q;
        engine_drop_prefix_cache(e);
        if (engine_seq_new(e, &q, &err)) return die("seq", &err);
        sampler_reset(s);
        if (engine_generate_seq(e, q, conv, n, &one, s, NULL, &st, &finish, &err)) return die("fresh", &err);
        if (st.n_prefilled != (int)n) return fprintf(stderr, "bench_kv: fresh run reused %d tokens\n", st.n_reused), 1;
        fresh[r] = st.ttft_ms;
        engine_seq_free(e, q);
    }
    /* The conversation with its reply on S, then /regen: the same prompt again on S. */
    engine_drop_prefix_cache(e);
    int S;
    if (engine_seq_new(e, &S, &err)) return die("seq", &err);
    sampler_reset(s);
    if (engine_generate_seq(e, S, conv, n, &reply, s, NULL, &st, &finish, &err)) return die("reply", &err);
    int n_reused = 0, n_prefilled = 0;
    for (int r = 0; r < REPS; r++) {
        sampler_reset(s);
        if (engine_generate_seq(e, S, conv, n, &reply, s, NULL, &st, &finish, &err)) return die("regen", &err);
        regen[r] = st.ttft_ms;
        n_reused = st.n_reused;
        n_prefilled = st.n_prefilled;
    }
    /* /regen keeping the old reply: fork at the prompt, generate on the branch. */
    for (int r = 0; r < REPS; r++) {
        int B;
        if (engine_seq_fork(e, S, (int)n, &B, &err)) return die("fork", &err);
        sampler_reset(s);
        if (engine_generate_seq(e, B, conv, n, &one, s, NULL, &st, &finish, &err)) return die("branch", &err);
        branch[r] = st.ttft_ms;
        engine_seq_free(e, B);
    }
    /* The conversation closed (sequence freed) and reopened: full blocks come back by hash. */
    int hash_reused = 0;
    for (int r = 0; r < REPS; r++) {
        int q;
        engine_seq_free(e, S);
        if (engine_seq_new(e, &q, &err)) return die("seq", &err);
        sampler_reset(s);
        if (engine_generate_seq(e, q, conv, n, &one, s, NULL, &st, &finish, &err)) return die("reopen", &err);
        readopt[r] = st.ttft_ms;
        hash_reused = st.n_reused_hash;
        S = q;
    }
    kv_cache_stats ks;
    kv_cache_get_stats(engine_kv(e), &ks);
    double f = tu_median(fresh, REPS), g = tu_median(regen, REPS), b = tu_median(branch, REPS),
           o = tu_median(readopt, REPS);
    printf("model %s, n_ctx %d, %d thread(s), %s KV, conversation of %zu tokens (median of %d)\n",
           engine_model(e)->name, n_ctx, engine_n_threads(e), quant_traits_of(kv_type)->name, n, REPS);
    printf("  fresh prefill     TTFT %8.3f ms  (%zu tokens prefilled)\n", f, n);
    printf("  /regen            TTFT %8.3f ms  (%d reused, %d prefilled) = %.2f%% of fresh\n", g, n_reused, n_prefilled,
           100 * g / f);
    printf("  /regen as branch  TTFT %8.3f ms  (fork at the prompt)           = %.2f%% of fresh\n", b, 100 * b / f);
    printf("  reopened (freed)  TTFT %8.3f ms  (%d adopted by hash)            = %.2f%% of fresh\n", o, hash_reused,
           100 * o / f);
    printf("  KV: %zu bytes/token, %d of %d blocks allocated (%.1f MiB), %d cached, %llu hash hits, %llu copy-on-write\n",
           ks.bytes_per_token, ks.n_blocks_alloc, ks.n_blocks, ks.bytes_allocated / 1048576.0, ks.n_blocks_cached,
           (unsigned long long)ks.n_hash_hits, (unsigned long long)ks.n_cow);

    /* Decode speed as the CLI measures it: "Once upon a time", 256 tokens, greedy. */
    double dec[REPS];
    int32_t *p = NULL;
    size_t np = 0;
    if (engine_tokenize(e, "Once upon a time", 16, 0, 0, &p, &np, &err)) return die("tokenize", &err);
    gen_opts d = {.n_predict = 256};
    for (int r = 0; r < REPS; r++) {
        engine_reset(e);
        engine_drop_prefix_cache(e);
        sampler_reset(s);
        if (engine_generate_seq(e, ENGINE_SEQ_DEFAULT, p, np, &d, s, NULL, &st, &finish, &err)) return die("decode", &err);
        dec[r] = st.decode_tps;
    }
    double dmax = 0;
    for (int r = 0; r < REPS; r++) dmax = dec[r] > dmax ? dec[r] : dmax;
    printf("  decode \"Once upon a time\" -n 256: median %.0f t/s, best %.0f t/s\n", tu_median(dec, REPS), dmax);
    free(p);
    free(conv);
    free(text);
    sampler_free(s);
    engine_close(e);
    return 0;
}
