/* bench_batch: time of one batched decode step (model_forward_batch, engine/batch.h) with 1, 2, 4 and 8 sequences at a given depth, and the aggregate tokens/s it gives — the engine's side of `make bench-serve`, without HTTP. A measurement, not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/batch.h"
#include "engine/fwd_prof.h"
#include "engine/kernels/quant.h"
#include "engine/model.h"
#include "engine/ops.h"
#include "tests/support/testutil.h"

static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* usage: bench_batch MODEL [DEPTH=64] [THREADS=2] [STEPS=8] */
int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [DEPTH] [THREADS] [STEPS]\n", argv[0]);
        return 2;
    }
    int depth = argc > 2 ? atoi(argv[2]) : 64, nt = argc > 3 ? atoi(argv[3]) : 2, steps = argc > 4 ? atoi(argv[4]) : 8;
    kv_error err = {0};
    model *m = NULL;
    if (model_load(argv[1], &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    op_weights_settle(m->packed); /* every copy complete, on the pages decode reads */
    enum { MAXS = 8 };
    int n_ctx = depth + steps + 16;
    tpool *pool = tpool_create(nt);
    forward_ctx *fc = forward_ctx_create(m, depth > MAXS ? depth : MAXS, n_ctx, &err);
    kv_cache_params kp = {.n_layer = m->hp.n_layer, .n_embd_kv = m->hp.n_embd_kv, .n_ctx = n_ctx, .type = GGML_TYPE_F16,
                          .n_blocks = MAXS * (n_ctx / KV_BLOCK_SIZE + 2)};
    kv_cache *kv = kv_cache_create_ex(&kp, &err);
    float *logits = malloc(sizeof(float) * MAXS * m->hp.n_vocab);
    if (!fc || !kv || !logits || !pool) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)depth);
    for (int i = 0; i < depth; i++) prompt[i] = 1 + (i * 7919) % (m->hp.n_vocab - 1);
    printf("model %s, depth %d, %d threads, median of %d steps\n", argv[1], depth, nt, steps);
    /* CPU ms per step (all threads) is steadier than wall time on a shared machine; on an idle
     * one with every thread busy, wall ≈ CPU / threads */
    printf("%5s %12s %14s %10s %12s %12s\n", "seqs", "step ms", "aggregate t/s", "vs 1 seq", "CPU ms/step",
           "CPU vs 1 seq");
    double one = 0, one_cpu = 1;
    /* KVCHAT_PROF=1: per-operation CPU ms of the calling thread per step, for each batch size */
    double prof[4][FP_COUNT] = {{0}};
    int si = 0;
    for (int S = 1; S <= MAXS; S *= 2, si++) {
        int seq[MAXS];
        for (int s = 0; s < S; s++) {
            if (s == 0) seq[s] = KV_SEQ_DEFAULT;
            else if (kv_seq_new(kv, &seq[s], &err)) return 1;
            kv_seq_truncate(kv, seq[s], 0);
            if (model_forward_seq(m, fc, kv, seq[s], pool, prompt, depth, logits, 0, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        }
        double ms[64], cpu[64];
        int32_t tok[MAXS];
        fwd_prof_reset();
        for (int i = 0; i < steps && i < 64; i++) {
            for (int s = 0; s < S; s++) tok[s] = 1 + (i * 31 + s) % (m->hp.n_vocab - 1);
            double t = tu_now_ms(), c = cpu_ms();
            if (model_forward_batch(m, fc, kv, pool, tok, seq, S, NULL, logits, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            ms[i] = tu_now_ms() - t;
            cpu[i] = cpu_ms() - c;
        }
        fwd_prof_read(prof[si]);
        for (int k = 0; k < FP_COUNT; k++) prof[si][k] /= steps < 64 ? steps : 64;
        double med = tu_median(ms, steps < 64 ? steps : 64), cmed = tu_median(cpu, steps < 64 ? steps : 64);
        double tps = S * 1e3 / med;
        if (S == 1) one = tps, one_cpu = cmed;
        printf("%5d %12.1f %14.1f %9.2fx %12.1f %11.2fx\n", S, med, tps, tps / one, cmed, cmed / one_cpu);
        for (int s = 1; s < S; s++) kv_seq_free(kv, seq[s]);
    }
    if (fwd_prof_on()) {
        printf("\nper operation, CPU ms per step of the calling thread (KVCHAT_PROF; with 1 thread: all the work)\n");
        printf("%-18s %9s %9s %9s %9s %9s\n", "operation", "1 seq", "2 seqs", "4 seqs", "8 seqs", "4 vs 1");
        double tot[4] = {0};
        for (int k = 0; k < FP_COUNT; k++) {
            printf("%-18s", fwd_prof_name(k));
            for (int i = 0; i < 4; i++) printf(" %9.3f", prof[i][k]), tot[i] += prof[i][k];
            printf(" %8.2fx\n", prof[0][k] > 0 ? prof[2][k] / prof[0][k] : 0.0);
        }
        printf("%-18s", "total");
        for (int i = 0; i < 4; i++) printf(" %9.3f", tot[i]);
        printf(" %8.2fx\n", tot[0] > 0 ? tot[2] / tot[0] : 0.0);
    }
    free(prompt);
    free(logits);
    kv_cache_free(kv);
    forward_ctx_free(fc);
    tpool_free(pool);
    model_free(m);
    return 0;
}
