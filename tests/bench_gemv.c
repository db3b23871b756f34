/* bench_gemv: decode's weight stream in isolation — the read bandwidth of `kvchat bench`'s probe, every matmul of one decoded token (op_matmul, 1 token) without the other ops, and the whole decode step, alternating in one process (kernel vs pipeline). A measurement, not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kernels/kernels.h"
#include "engine/kernels/probe.h"
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

static size_t tbytes(const gguf_tensor *w) { return quant_row_size(w->type, w->ne[0]) * (size_t)w->ne[1]; }

/* usage: bench_gemv MODEL [THREADS=2] [ROUNDS=7] [TOKENS=16] */
int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [THREADS] [ROUNDS] [TOKENS]\n", argv[0]);
        return 2;
    }
    int nt = argc > 2 ? atoi(argv[2]) : 2, rounds = argc > 3 ? atoi(argv[3]) : 7, ntok = argc > 4 ? atoi(argv[4]) : 16;
    kv_error err = {0};
    model *m = NULL;
    if (model_load(argv[1], &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    op_weights_settle(m->packed); /* every copy complete, on the pages decode reads */
    tpool *pool = tpool_create(nt);
    const model_hparams *hp = &m->hp;
    /* the matrices of one decoded token, in the order the pass reads them */
    int nm = 0;
    const gguf_tensor **mats = calloc((size_t)hp->n_layer * 8 + 1, sizeof *mats);
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer *L = &m->layers[il];
        const gguf_tensor *ws[] = {L->wqkv, L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
        for (int i = 0; i < 8; i++)
            if (ws[i]) mats[nm++] = ws[i];
    }
    mats[nm++] = m->output;
    size_t scratch = 0, maxin = 0, maxout = 0, wbytes = 0;
    for (int i = 0; i < nm; i++) {
        size_t s = op_matmul_scratch_size(mats[i], 1);
        scratch = s > scratch ? s : scratch;
        maxin = (size_t)mats[i]->ne[0] > maxin ? (size_t)mats[i]->ne[0] : maxin;
        maxout = (size_t)mats[i]->ne[1] > maxout ? (size_t)mats[i]->ne[1] : maxout;
        wbytes += tbytes(mats[i]);
    }
    void *act = aligned_alloc(64, (scratch + 63) & ~(size_t)63);
    float *x = malloc(sizeof(float) * maxin), *y = malloc(sizeof(float) * maxout);
    for (size_t i = 0; i < maxin; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;

    const size_t bbytes = (size_t)512 << 20;
    uint64_t *buf = aligned_alloc(4096, bbytes);
    for (size_t i = 0; i < bbytes / 8; i++) buf[i] = i;

    int n_ctx = ntok + 8;
    forward_ctx *fc = forward_ctx_create(m, 1, n_ctx, &err);
    kv_cache *kv = kv_cache_create(hp->n_layer, hp->n_embd_kv, n_ctx, GGML_TYPE_F16, &err);
    float *logits = malloc(sizeof(float) * hp->n_vocab);
    if (!pool || !act || !x || !y || !buf || !fc || !kv || !logits) {
        fprintf(stderr, "out of memory: %s\n", err.msg);
        return 1;
    }
    printf("%s: %d matrices, %.1f MiB per token, %d threads, kernels %s\n", argv[1], nm, wbytes / 1048576.0, nt,
           kern_isa_name(kern()->isa));
    double *probe = calloc((size_t)rounds, sizeof(double)), *mm = calloc((size_t)rounds, sizeof(double)),
           *mmc = calloc((size_t)rounds, sizeof(double)), *step = calloc((size_t)rounds, sizeof(double)),
           *stepc = calloc((size_t)rounds, sizeof(double));
    /* the kernel's compute rate, weights in cache: one thread, layer 0's smallest matrix again and again */
    for (int ti = 0; ti < nm; ti++) { /* each weight type once: its smallest matrix */
        const gguf_tensor *h = mats[ti];
        int seen = 0;
        for (int i = 0; i < ti; i++) seen |= mats[i]->type == h->type;
        if (seen) continue;
        for (int i = ti + 1; i < nm; i++)
            if (mats[i]->type == h->type && tbytes(mats[i]) < tbytes(h)) h = mats[i];
        int reps = (int)(((size_t)40 << 20) / tbytes(h)) * 5; /* windows of ~8 MiB: the best one ran alone */
        double best = 0;
        for (int k = 0; k < 200; k++) {
            double c0 = cpu_ms();
            for (int i = 0; i < reps / 5; i++) op_matmul(h, x, 1, y, act, NULL);
            double g = (double)tbytes(h) * (reps / 5) / ((cpu_ms() - c0) * 1e6);
            best = g > best ? g : best;
        }
        printf("in cache (%s, %s, %.0f KiB, 1 thread, CPU time): %.1f GB/s of weights\n", h->name, quant_traits_of(h->type)->name, tbytes(h) / 1024.0, best);
        if (h->packed && quant_pack_size(h->type, h->ne[0], h->ne[1])) { /* the panel kernel alone */
            quant_act_prepare(h->type, x, h->ne[0], act);
            best = 0;
            for (int k = 0; k < 200; k++) {
                double c0 = cpu_ms();
                for (int i = 0; i < reps / 5; i++)
                    quant_gemm_packed(h->type, h->ne[0], 0, h->ne[1], h->packed, act, 0, 1, y, (size_t)h->ne[1]);
                double g = (double)tbytes(h) * (reps / 5) / ((cpu_ms() - c0) * 1e6);
                best = g > best ? g : best;
            }
            printf("in cache, the panel kernel alone: %.1f GB/s of weights\n", best);
        }
    }
    double best_mm = 1e30, best_step = 1e30;
    for (int r = 0; r < rounds; r++) {
        /* the probe: best of 3 */
        for (int k = 0; k < 3; k++) {
            double t0 = tu_now_ms();
            kern_probe_read_pool(pool, buf, bbytes);
            double g = bbytes / ((tu_now_ms() - t0) * 1e6);
            probe[r] = g > probe[r] ? g : probe[r];
        }
        /* the matmuls of ntok tokens (and the fastest token: on a shared machine, the one that ran alone) */
        double t0 = tu_now_ms(), c0 = cpu_ms();
        for (int t = 0; t < ntok; t++) {
            double tt = tu_now_ms();
            for (int i = 0; i < nm; i++) op_matmul(mats[i], x, 1, y, act, pool);
            tt = tu_now_ms() - tt;
            best_mm = tt < best_mm ? tt : best_mm;
        }
        double dt = tu_now_ms() - t0;
        mm[r] = (double)wbytes * ntok / (dt * 1e6);
        mmc[r] = (cpu_ms() - c0) / ntok;
        /* whole decode steps */
        kv_seq_truncate(kv, KV_SEQ_DEFAULT, 0);
        t0 = tu_now_ms(), c0 = cpu_ms();
        for (int t = 0; t < ntok; t++) {
            int32_t tok = 1 + (t * 31) % (hp->n_vocab - 1);
            double tt = tu_now_ms();
            if (model_forward(m, fc, kv, pool, &tok, 1, logits, 0, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            tt = tu_now_ms() - tt;
            best_step = tt < best_step ? tt : best_step;
        }
        dt = tu_now_ms() - t0;
        step[r] = (double)model_weight_bytes(m) * ntok / (dt * 1e6);
        stepc[r] = (cpu_ms() - c0) / ntok;
        printf("round %d: probe %.1f GB/s, matmuls %.1f GB/s (%.0f%%, CPU %.2f ms/token), decode step %.1f GB/s (%.0f%%, CPU %.2f ms/token)\n",
               r, probe[r], mm[r], 100 * mm[r] / probe[r], mmc[r], step[r], 100 * step[r] / probe[r], stepc[r]);
    }
    double rm[64], rs[64];
    for (int r = 0; r < rounds && r < 64; r++) rm[r] = mm[r] / probe[r], rs[r] = step[r] / probe[r];
    int n = rounds < 64 ? rounds : 64;
    printf("medians: probe %.1f GB/s, matmuls %.1f GB/s = %.0f%% of it (CPU %.2f ms/token), step %.1f GB/s = %.0f%% (CPU %.2f ms/token)\n",
           tu_median(probe, n), tu_median(mm, n), 100 * tu_median(rm, n), tu_median(mmc, n), tu_median(step, n),
           100 * tu_median(rs, n), tu_median(stepc, n));
    double bp = 0;
    for (int r = 0; r < n; r++) bp = probe[r] > bp ? probe[r] : bp;
    printf("best: probe %.1f GB/s, the matmuls of a token %.3f ms = %.1f GB/s (%.0f%%), a decode step %.3f ms = %.1f GB/s (%.0f%%)\n",
           bp, best_mm, wbytes / (best_mm * 1e6), 100 * wbytes / (best_mm * 1e6) / bp, best_step,
           model_weight_bytes(m) / (best_step * 1e6), 100 * model_weight_bytes(m) / (best_step * 1e6) / bp);
    return 0;
}
