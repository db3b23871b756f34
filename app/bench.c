/* bench: `kvchat bench` — prefill (pp) and decode (tg) speed of a model, in the style of llama-bench. */
/*
 * ppN: N prompt tokens in one forward pass from an empty KV cache (tokens per second).
 * tgN: N tokens generated one forward pass at a time from an empty cache, each fed the
 *      argmax of the previous logits (tokens per second).
 * Each test runs once to warm up (page in the weights, settle the threads), then REPS timed
 * times; the table gives mean ± sd and the median. Model loading is never timed. The decode
 * bandwidth is the bytes of weights a token reads (model_weight_bytes) × tokens per second.
 * -d N (depth, as llama-bench's -d): the cache first holds N prompt tokens (prefilled untimed in
 *      chunks of 512), then ppN / tgN run from there, so decode at depth also reads N positions
 *      of K and V per layer.
 * The machine's read bandwidth is measured with the same threads (a STREAM-like pass, McCalpin
 * 1995: each thread sums its share of a 512 MiB buffer with vector loads, best of 5), and decode GB/s is printed as
 * a fraction of it: the distance to the physical limit of a memory-bound decode. The fraction pairs
 * each timed decode run with one such pass just before it (the median over the runs of decode GB/s
 * ÷ that pass's GB/s): on a shared machine both move together, and a best-of-5 taken at another
 * moment would set one run's quiet minute against the other's busy one. Likewise the
 * FP32 FMA peak (independent FMA chains of the level's widest vectors on every thread) and
 * prefill GFLOP/s as a fraction of it: the compute limit of an F16 / F32 prefill. The model's
 * load (map, checks, repacking) is timed once, wall and CPU seconds.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "app/tools.h"
#include "engine/kernels/probe.h"

#include <cJSON.h>

/* text as a JSON string literal, quotes included (malloc'd; NULL when out of memory). */
static char *json_string(const char *text)
{
    cJSON *s = cJSON_CreateString(text);
    char *out = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    return out;
}
#include "engine/model.h"
#include "engine/ops.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/quant.h"

#define MAX_LIST 16
#define MAX_REPS 1000 /* -r's bound */

typedef struct bench_opts {
    const char *model;
    int pp[MAX_LIST], n_pp;
    int tg[MAX_LIST], n_tg;
    int th[MAX_LIST], n_th;
    int depth[MAX_LIST], n_depth;
    int reps;
    int json;
} bench_opts;

typedef struct result {
    int threads, is_pp, n, depth;
    double *samples;   /* tokens per second, reps entries */
    double mean, sd, median;
    double *bw;        /* tg: bytes/s of the read pass run just before each timed run (reps entries; 0: none) */
    double frac;       /* tg: median over the runs of decode bytes/s ÷ that pass's bytes/s (0: not measured) */
    double bw_median;  /* tg: median of bw (bytes/s) */
} result;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(const double *v, int n)
{
    double *tmp = malloc(sizeof(double) * (size_t)n);
    if (!tmp || n <= 0) {
        free(tmp);
        return n > 0 ? v[0] : 0;
    }
    memcpy(tmp, v, sizeof(double) * (size_t)n);
    qsort(tmp, (size_t)n, sizeof(double), cmp_double);
    double m = n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
    free(tmp);
    return m;
}

/* Mean, sd and median of the samples; when every run had its read pass (r->bw), the median of
 * the per-run fractions wbytes·t/s ÷ pass bytes/s (wbytes: decode's bytes per token). */
static void summarize(result *r, int reps, double wbytes)
{
    double s = 0, ss = 0;
    for (int i = 0; i < reps; i++) s += r->samples[i];
    r->mean = s / reps;
    for (int i = 0; i < reps; i++) ss += (r->samples[i] - r->mean) * (r->samples[i] - r->mean);
    r->sd = reps > 1 ? sqrt(ss / (reps - 1)) : 0.0;
    r->median = median_of(r->samples, reps);
    r->frac = r->bw_median = 0;
    if (wbytes > 0 && r->bw) {
        double f[MAX_REPS];
        int n = 0;
        for (int i = 0; i < reps; i++)
            if (r->bw[i] > 0) f[n++] = wbytes * r->samples[i] / r->bw[i];
        if (n == reps) { /* every run had its pass */
            r->frac = median_of(f, n);
            r->bw_median = median_of(r->bw, n);
        }
    }
}

/* llama.cpp's general.file_type names (enum llama_ftype in llama.h), for the type column. */
static const char *const FTYPE_NAMES[] = {
    [0] = "F32",      [1] = "F16",      [2] = "Q4_0",     [3] = "Q4_1",     [7] = "Q8_0",
    [8] = "Q5_0",     [9] = "Q5_1",     [10] = "Q2_K",    [11] = "Q3_K_S",  [12] = "Q3_K_M",
    [13] = "Q3_K_L",  [14] = "Q4_K_S",  [15] = "Q4_K_M",  [16] = "Q5_K_S",  [17] = "Q5_K_M",
    [18] = "Q6_K",    [19] = "IQ2_XXS", [20] = "IQ2_XS",  [21] = "Q2_K_S",  [22] = "IQ3_XS",
    [23] = "IQ3_XXS", [24] = "IQ1_S",   [25] = "IQ4_NL",  [26] = "IQ3_S",   [27] = "IQ3_M",
    [28] = "IQ2_S",   [29] = "IQ2_M",   [30] = "IQ4_XS",  [31] = "IQ1_M",   [32] = "BF16",
    [36] = "TQ1_0",   [37] = "TQ2_0",   [38] = "MXFP4_MOE",
};

static const char *ftype_name(int ft)
{
    return ft >= 0 && (size_t)ft < sizeof FTYPE_NAMES / sizeof FTYPE_NAMES[0] ? FTYPE_NAMES[ft] : NULL;
}

static void human_params(uint64_t n, char *buf, size_t len)
{
    if (n >= 1000000000ULL) snprintf(buf, len, "%.2f B", n / 1e9);
    else if (n >= 1000000ULL) snprintf(buf, len, "%.2f M", n / 1e6);
    else snprintf(buf, len, "%.2f K", n / 1e3);
}

static void human_size(uint64_t b, char *buf, size_t len)
{
    if (b >= (1ULL << 30)) snprintf(buf, len, "%.2f GiB", b / 1073741824.0);
    else snprintf(buf, len, "%.2f MiB", b / 1048576.0);
}

/* A comma-separated list of positive integers. */
static int parse_list(const char *s, const char *opt, int lo, int *out, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > (1 << 20) || *n >= MAX_LIST || (*end && *end != ',')) {
            fprintf(stderr, "kvchat bench: invalid value '%s' for %s (comma-separated integers >= %d)\n", s, opt, lo);
            return -1;
        }
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) {
        fprintf(stderr, "kvchat bench: empty value for %s\n", opt);
        return -1;
    }
    return 0;
}

static void bench_usage(FILE *out)
{
    fprintf(out,
            "Usage: kvchat bench -m MODEL [-p 512] [-n 128] [-t THREADS] [-d DEPTH] [-r 5] [--json]\n"
            "Measure prefill (ppN: N prompt tokens in one batch) and decode (tgN: N tokens one at a\n"
            "time) speed, from an empty KV cache, excluding model loading. -p, -n and -t take\n"
            "comma-separated lists; 0 skips the pp or tg tests.\n"
            "  -m, --model PATH    GGUF model\n"
            "  -p, --n-prompt N    prompt tokens (default 512)\n"
            "  -n, --n-gen N       generated tokens (default 128)\n"
            "  -t, --threads N     threads (default: all CPUs)\n"
            "  -d, --n-depth N     tokens already in the KV cache before each test (default 0)\n"
            "  -r, --repetitions N timed runs per test after one warm-up run (default 5)\n"
            "      --json          print the results as JSON instead of a table\n");
}

/* The read bandwidth measured with `threads` threads. */
static double bw_of(const bench_opts *o, const double *bw, int threads)
{
    for (int i = 0; i < o->n_th; i++)
        if (o->th[i] == threads) return bw[i];
    return 0;
}

/* Decode's share of the read bandwidth: the paired median (summarize), or, where no run had a
 * pass of its own, wbytes·median t/s ÷ peak (the best-of-5 probe, bytes/s); 0 for prefill. */
static double decode_fraction(const result *r, double wbytes, double peak)
{
    if (r->is_pp) return 0;
    if (r->frac > 0) return r->frac;
    return peak > 0 ? wbytes * r->median / peak : 0;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

#define PROBE_BYTES ((size_t)512 << 20)

/* A buffer for the read passes (touched: real pages, not the zero page); on 2 MiB pages where the
 * kernel gives them, as the packed weights are (engine/ops.c), so that the pass and decode pay the
 * same address translation — after a decode run, 4 KiB pages' table walks cost a lone pass more
 * than half its speed. NULL when out of memory. */
static uint64_t *probe_buffer(void)
{
    uint64_t *buf = aligned_alloc((size_t)2 << 20, PROBE_BYTES);
    if (buf) {
        madvise(buf, PROBE_BYTES, MADV_HUGEPAGE); /* advice: 4 KiB pages where refused */
        for (size_t i = 0; i < PROBE_BYTES / 8; i++) buf[i] = i;
    }
    return buf;
}

/* One read pass over buf with the pool's threads: bytes per second. */
static double probe_pass(tpool *pool, const uint64_t *buf)
{
    double t0 = now_s();
    kern_probe_read_pool(pool, buf, PROBE_BYTES);
    double dt = now_s() - t0;
    return dt > 0 ? PROBE_BYTES / dt : 0;
}

/* Read bandwidth of this machine with nth threads: the best of 5 passes in which every thread sums
 * its share of a buffer much larger than the caches with the kernel level's vector loads
 * (kern_probe_read; bytes per second; 0 when the buffer cannot be had). */
static double read_bandwidth(tpool *pool)
{
    uint64_t *buf = probe_buffer();
    if (!buf) return 0;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double bps = probe_pass(pool, buf);
        best = bps > best ? bps : best;
    }
    free(buf);
    return best;
}

/* The process's resident-set high-water mark in KiB: VmHWM of /proc/self/status (proc(5)), or
 * getrusage's ru_maxrss where that cannot be read. */
static long rss_hwm_kib(void)
{
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
        fclose(f);
    }
    if (kib < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kib = ru.ru_maxrss;
    }
    return kib;
}

/* Resets the high-water mark to the current resident set (writing "5" to /proc/self/clear_refs,
 * Linux >= 4.0, proc(5)): the paired read passes' buffer is not the model's memory. 0, or -1
 * when it cannot (then no pass may allocate that buffer: the peak RSS would count it). */
static int rss_hwm_reset(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* FP32 FMA peak with nth threads: every thread runs independent FMA chains of the level's widest
 * vectors (kern_probe_fma), the best of about 20 passes of ~5 ms (flops per second). */
typedef struct fma_job {
    long fma_iters;
    double flops[64];
    uint64_t sink[64];
} fma_job;

static void fma_worker(void *arg, int ith, int nth)
{
    fma_job *j = arg;
    float s;
    j->flops[ith & 63] = kern_probe_fma(j->fma_iters, &s);
    j->sink[ith & 63] = (uint64_t)s;
}

static double fma_peak(tpool *pool, int nth)
{
    /* iterations for ~5 ms a pass, from the fastest of a few short runs on this thread (short
     * passes: a busy machine preempts fewer of them) */
    const long probe = 20000;
    double fastest = 1e9;
    float s;
    for (int i = 0; i < 5; i++) {
        double t0 = now_s();
        kern_probe_fma(probe, &s);
        double dt = now_s() - t0;
        fastest = dt < fastest ? dt : fastest;
    }
    fma_job j = {.fma_iters = fastest > 0 ? (long)(probe * 0.005 / fastest) : probe};
    if (j.fma_iters < probe) j.fma_iters = probe;
    double best = 0;
    for (int rep = 0; rep < 20; rep++) {
        double t0 = now_s();
        tpool_run(pool, fma_worker, &j);
        double dt = now_s() - t0, fl = 0;
        for (int i = 0; i < nth && i < 64; i++) fl += j.flops[i];
        best = fl / dt > best ? fl / dt : best;
    }
    return best;
}

/* Floating-point operations of one forward pass of n tokens after depth ones (0 when the shapes
 * are unknown): 2 per weight of every matrix but the token embeddings (the output matrix only for
 * the last token: the logits of the others are not computed), and the attention's q·k and p·v,
 * 2·2·n_head·head_dim per layer per position seen (causal). */
static double forward_flops(const model *m, int n, int depth)
{
    double per_tok = 0, out = 0;
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        const gguf_tensor *t = &m->gguf->tensors[i];
        if (t->n_dims != 2) continue;
        double w = 2.0 * (double)t->ne[0] * (double)t->ne[1];
        if (t == m->output) out = w;
        else if (t != m->tok_embd) per_tok += w;
    }
    double seen = (double)n * depth + (double)n * (n + 1) / 2; /* positions attended, summed over the tokens */
    return n * per_tok + out + 4.0 * m->hp.n_layer * m->hp.n_head * m->hp.head_dim * seen;
}

/* Fill the cache with depth prompt tokens (untimed), in batches the forward context takes. */
static int fill_depth(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, float *logits,
                      const int32_t *toks, int depth, kv_error *err)
{
    kv_cache_truncate(kv, 0);
    int nb = forward_ctx_n_batch(fc);
    for (int p = 0; p < depth; p += nb) {
        int n = depth - p < nb ? depth - p : nb;
        if (model_forward(m, fc, kv, pool, toks + p, n, logits, 0, err)) return -1;
    }
    return 0;
}

/* One timed test after the `depth` tokens already in the cache (fill_depth; the test's own
 * positions are dropped first); returns tokens per second or a negative value on error. */
static double run_once(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, float *logits, int32_t *toks,
                       int is_pp, int n, int depth, kv_error *err)
{
    kv_cache_truncate(kv, depth);
    double t0 = now_s();
    if (is_pp) {
        if (model_forward(m, fc, kv, pool, toks + depth, n, logits, 0, err)) return -1;
    } else {
        int32_t tok = toks[0];
        for (int i = 0; i < n; i++) {
            if (model_forward(m, fc, kv, pool, &tok, 1, logits, 0, err)) return -1;
            tok = argmax(logits, m->hp.n_vocab);
        }
    }
    double dt = now_s() - t0;
    return n / dt;
}

int bench_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"n-prompt", required_argument, 0, 'p'},
        {"n-gen", required_argument, 0, 'n'}, {"threads", required_argument, 0, 't'},
        {"repetitions", required_argument, 0, 'r'}, {"json", no_argument, 0, 'j'},
        {"n-depth", required_argument, 0, 'd'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    bench_opts o = {.pp = {512}, .n_pp = 1, .tg = {128}, .n_tg = 1, .depth = {0}, .n_depth = 1, .reps = 5};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o.th[0] = ncpu > 0 ? (int)ncpu : 1;
    o.n_th = 1;
    o.model = getenv("KVCHAT_MODEL");
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:p:n:t:d:r:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'p': if (parse_list(optarg, "-p", 0, o.pp, &o.n_pp)) return 2; break;
        case 'n': if (parse_list(optarg, "-n", 0, o.tg, &o.n_tg)) return 2; break;
        case 't': if (parse_list(optarg, "-t", 1, o.th, &o.n_th)) return 2; break;
        case 'd': if (parse_list(optarg, "-d", 0, o.depth, &o.n_depth)) return 2; break;
        case 'r': {
            int n, v[MAX_LIST];
            if (parse_list(optarg, "-r", 1, v, &n) || n != 1) return 2;
            if (v[0] > MAX_REPS) {
                fprintf(stderr, "kvchat bench: invalid value '%s' for -r (at most %d repetitions)\n", optarg, MAX_REPS);
                return 2;
            }
            o.reps = v[0];
            break;
        }
        case 'j': o.json = 1; break;
        case 'h': bench_usage(stdout); return 0;
        case ':': fprintf(stderr, "kvchat bench: option '%s' needs a value\n", argv[optind - 1]); return 2;
        default: fprintf(stderr, "kvchat bench: unknown option '%s'\n", argv[optind - 1]); bench_usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvchat bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o.model) {
        fprintf(stderr, "kvchat bench: no model given (-m MODEL.gguf)\n");
        return 2;
    }

    kv_error err = {0};
    model *m = NULL;
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    double load_t0 = now_s();
    int load_rc = model_load(o.model, &m, &err);
    double load_s = now_s() - load_t0; /* map, validate, repack the weights (not timed in the tests) */
    getrusage(RUSAGE_SELF, &ru1);
    double load_cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                      (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    if (load_rc) {
        fprintf(stderr, "kvchat bench: %s\n", err.msg);
        return err.code == KV_ERR_NOMEM ? 1 : 3;
    }
    op_weights_settle(m->packed); /* time decode on the huge pages a running chat ends up on */
    int max_pp = 1, max_tg = 1, max_d = 0;
    for (int i = 0; i < o.n_pp; i++) max_pp = o.pp[i] > max_pp ? o.pp[i] : max_pp;
    for (int i = 0; i < o.n_tg; i++) max_tg = o.tg[i] > max_tg ? o.tg[i] : max_tg;
    for (int i = 0; i < o.n_depth; i++) max_d = o.depth[i] > max_d ? o.depth[i] : max_d;
    int n_ctx = max_d + (max_pp > max_tg ? max_pp : max_tg) + 1;
    int n_batch = max_d > 0 && max_pp < 512 ? 512 : max_pp;
    /* as the engine: sliding-window layers keep only their window (KVCHAT_SWA_FULL=1: every position) */
    kv_cache_params kp = {.n_layer = m->hp.n_layer, .n_embd_kv = m->hp.n_embd_kv, .n_ctx = n_ctx, .type = GGML_TYPE_F16,
                          .n_blocks = (n_ctx + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE, .reserve = 1};
    const char *swa_full = getenv("KVCHAT_SWA_FULL");
    uint8_t *swa = swa_full && *swa_full == '1' ? NULL : model_swa_layers(m, &kp.n_swa);
    kp.swa_layers = swa;
    kv_cache *kv = kv_cache_create_ex(&kp, &err);
    free(swa);
    forward_ctx *fc = kv ? forward_ctx_create(m, n_batch, n_ctx, &err) : NULL;
    float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(max_d + max_pp));
    int n_res = o.n_th * o.n_depth * (o.n_pp + o.n_tg);
    double *bw = calloc((size_t)o.n_th * 2, sizeof(double)); /* read bandwidth (bytes/s), then FMA peak (flop/s), per thread count */
    result *res = calloc((size_t)n_res, sizeof *res);
    double *samples = calloc((size_t)n_res * (size_t)o.reps * 2, sizeof(double)); /* t/s, then paired bytes/s */
    int rc = 0;
    /* the peak RSS so far (the load's), kept while the mark is reset around the paired passes */
    long rss_peak = rss_hwm_kib();
    int paired = rss_hwm_reset() == 0;
    if (!kv || !fc || !logits || !toks || !res || !samples || !bw) {
        fprintf(stderr, "kvchat bench: %s\n", err.msg[0] ? err.msg : "out of memory");
        rc = 1;
        goto done;
    }
    /* the prompt llamacpp-bench.mjs uses: ordinary token ids 100 + (7i mod 200) */
    for (int i = 0; i < max_d + max_pp; i++) toks[i] = (100 + (i * 7) % 200) % m->hp.n_vocab;

    int k = 0;
    for (int ti = 0; ti < o.n_th && !rc; ti++) {
        tpool *pool = tpool_create(o.th[ti]);
        if (!pool) {
            fprintf(stderr, "kvchat bench: cannot start %d threads\n", o.th[ti]);
            rc = 1;
            break;
        }
        for (int di = 0; di < o.n_depth && !rc; di++)
            for (int pass = 0; pass < 2 && !rc; pass++) {
                int cnt = pass == 0 ? o.n_pp : o.n_tg;
                for (int i = 0; i < cnt && !rc; i++) {
                    int n = pass == 0 ? o.pp[i] : o.tg[i];
                    if (n == 0) continue;
                    result *r = &res[k++];
                    r->threads = o.th[ti];
                    r->is_pp = pass == 0;
                    r->n = n;
                    r->depth = o.depth[di];
                    r->samples = samples + (size_t)(k - 1) * o.reps;
                    r->bw = samples + (size_t)n_res * o.reps + (size_t)(k - 1) * o.reps;
                    if (fill_depth(m, fc, kv, pool, logits, toks, r->depth, &err)) {
                        fprintf(stderr, "kvchat bench: %s\n", err.msg);
                        rc = 1;
                        break;
                    }
                    uint64_t *pbuf = NULL; /* decode: a read pass just before each timed run */
                    if (!r->is_pp && paired) {
                        long hwm = rss_hwm_kib();
                        rss_peak = hwm > rss_peak ? hwm : rss_peak;
                        pbuf = probe_buffer();
                    }
                    for (int rep = -1; rep < o.reps; rep++) {
                        double bps = pbuf && rep >= 0 ? probe_pass(pool, pbuf) : 0;
                        double tps = run_once(m, fc, kv, pool, logits, toks, r->is_pp, n, r->depth, &err);
                        if (tps < 0) {
                            fprintf(stderr, "kvchat bench: %s\n", err.msg);
                            rc = 1;
                            break;
                        }
                        if (rep >= 0) r->samples[rep] = tps, r->bw[rep] = bps;
                    }
                    if (pbuf) {
                        free(pbuf);
                        if (rss_hwm_reset()) paired = 0;
                    }
                    if (!rc) summarize(r, o.reps, (double)model_weight_bytes(m));
                }
            }
        tpool_free(pool);
    }
    n_res = k;

    if (!rc) {
        const char *base = strrchr(o.model, '/');
        base = base ? base + 1 : o.model;
        int64_t ft = -1;
        kv_error e2 = {0};
        gguf_get_i64(m->gguf, "general.file_type", 0, &ft, &e2);
        const char *tname = ftype_name((int)ft);
        if (!tname) tname = quant_traits_of(m->weight_type)->name;
        uint64_t size = 0;
        for (uint64_t i = 0; i < m->gguf->n_tensors; i++) size += m->gguf->tensors[i].nbytes;
        uint64_t wbytes = model_weight_bytes(m);
        kv_cache_stats ks;
        kv_cache_get_stats(kv, &ks);
        long hwm = rss_hwm_kib();
        if (hwm > rss_peak) rss_peak = hwm;
        /* after the peak RSS is read: the bandwidth pass's buffer is not the model's memory */
        for (int ti = 0; ti < o.n_th; ti++) {
            tpool *pool = tpool_create(o.th[ti]);
            if (pool) bw[ti] = read_bandwidth(pool);
            if (pool) bw[o.n_th + ti] = fma_peak(pool, o.th[ti]);
            tpool_free(pool);
        }
        double rss_mib = rss_peak / 1024.0, file_mib = m->gguf->size / 1048576.0,
               kv_mib = ks.bytes_reserved / 1048576.0;
        char sz[32], np[64], desc[96];
        human_size(size, sz, sizeof sz);
        human_params(m->n_params, np, sizeof np);
        if (m->n_params_active != m->n_params) { /* MoE: total (active per token) */
            char na[32];
            human_params(m->n_params_active, na, sizeof na);
            size_t l = strlen(np);
            snprintf(np + l, sizeof np - l, " (%s active)", na);
        }
        snprintf(desc, sizeof desc, "%s %s", m->arch_name, tname);
        if (o.json) {
            char *fj = json_string(base); /* a file name may hold quotes, backslashes, controls */
            printf("[\n");
            for (int i = 0; i < n_res; i++) {
                const result *r = &res[i];
                double gbps = r->is_pp ? 0.0 : wbytes * r->median / 1e9, peak = bw_of(&o, bw, r->threads) / 1e9;
                double gflops = forward_flops(m, r->n, r->depth) / r->n * r->median / 1e9,
                       fpeak = bw_of(&o, bw + o.n_th, r->threads) / 1e9;
                printf("  {\"model\": \"%s\", \"file\": %s, \"type\": \"%s\", \"size\": %llu, \"params\": %llu, "
                       "\"params_active\": %llu, \"threads\": %d, \"kernels\": \"%s\", \"test\": \"%s%d\", \"n_prompt\": %d, \"n_gen\": %d, "
                       "\"n_depth\": %d, \"avg_ts\": %.4f, \"stddev_ts\": %.4f, \"median_ts\": %.4f, "
                       "\"weight_bytes_per_token\": %llu, \"decode_gbps\": %.4f, \"read_gbps\": %.4f, "
                       "\"read_gbps_paired\": %.4f, \"decode_bw_fraction\": %.4f, \"samples_ts\": [",
                       m->arch_name, fj ? fj : "null", tname, (unsigned long long)size, (unsigned long long)m->n_params,
                       (unsigned long long)m->n_params_active, r->threads, kern_isa_name(kern()->isa), r->is_pp ? "pp" : "tg", r->n, r->is_pp ? r->n : 0,
                       r->is_pp ? 0 : r->n, r->depth, r->mean, r->sd, r->median, (unsigned long long)wbytes, gbps,
                       peak, r->bw_median / 1e9, decode_fraction(r, wbytes, bw_of(&o, bw, r->threads)));
                for (int j = 0; j < o.reps; j++) printf("%s%.4f", j ? ", " : "", r->samples[j]);
                printf("], \"gflops\": %.4f, \"fma_peak_gflops\": %.4f, \"fma_peak_fraction\": %.4f", gflops, fpeak,
                       fpeak > 0 ? gflops / fpeak : 0.0);
                printf(", \"load_s\": %.4f, \"load_cpu_s\": %.4f", load_s, load_cpu);
                printf(", \"peak_rss_mib\": %.1f, \"file_mib\": %.1f, \"kv_mib\": %.1f}%s\n", rss_mib, file_mib,
                       kv_mib, i + 1 < n_res ? "," : "");
            }
            printf("]\n");
            free(fj);
        } else {
            printf("| model | size | params | type | threads | test | t/s | median t/s | decode GB/s | of read BW | GFLOP/s | of FMA peak |\n");
            printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
            for (int i = 0; i < n_res; i++) {
                const result *r = &res[i];
                char test[32], gbps[16] = "", frac[16] = "";
                int l = snprintf(test, sizeof test, "%s%d", r->is_pp ? "pp" : "tg", r->n);
                if (r->depth) snprintf(test + l, sizeof test - (size_t)l, " @ d%d", r->depth);
                double peak = bw_of(&o, bw, r->threads);
                if (!r->is_pp) snprintf(gbps, sizeof gbps, "%.1f", wbytes * r->median / 1e9);
                double df = decode_fraction(r, wbytes, peak);
                if (df > 0) snprintf(frac, sizeof frac, "%.0f%%", 100.0 * df);
                double gfl = forward_flops(m, r->n, r->depth) / r->n * r->median / 1e9,
                       fpeak = bw_of(&o, bw + o.n_th, r->threads) / 1e9;
                char ffrac[16] = "";
                if (fpeak > 0) snprintf(ffrac, sizeof ffrac, "%.0f%%", 100.0 * gfl / fpeak);
                printf("| %s | %s | %s | %s | %d | %s | %.2f ± %.2f | %.2f | %s | %s | %.1f | %s |\n", base, sz, np, desc,
                       r->threads, test, r->mean, r->sd, r->median, gbps, frac, gfl, ffrac);
            }
            printf("\nmodel load %.2f s (CPU %.2f s: map, check, repack); decode reads %.1f MiB of weights per token "
                   "(decode GB/s = that × median t/s); peak RSS %.1f MiB = file %.1f MiB + KV cache %.1f MiB %s %.1f MiB\n",
                   load_s, load_cpu, wbytes / 1048576.0, rss_mib, file_mib, kv_mib, rss_mib >= file_mib + kv_mib ? "+" : "-",
                   fabs(rss_mib - file_mib - kv_mib));
            printf("kernels %s; read bandwidth measured here (STREAM-like vector sum, best of 5):", kern_isa_name(kern()->isa));
            for (int ti = 0; ti < o.n_th; ti++) printf(" %.1f GB/s with %d thread%s", bw[ti] / 1e9, o.th[ti], o.th[ti] > 1 ? "s" : "");
            int any_paired = 0;
            for (int i = 0; i < n_res; i++) any_paired |= res[i].frac > 0;
            if (any_paired) {
                printf("; of read BW = the median over the decode runs of decode GB/s / a read pass just before each (median pass:");
                for (int i = 0; i < n_res; i++)
                    if (res[i].frac > 0)
                        printf(" %.1f GB/s by tg%d%s%.0d", res[i].bw_median / 1e9, res[i].n, res[i].depth ? " @ d" : "",
                               res[i].depth);
                printf(")");
            }
            printf("; FP32 FMA peak of this level:");
            for (int ti = 0; ti < o.n_th; ti++)
                printf(" %.1f GFLOP/s with %d thread%s", bw[o.n_th + ti] / 1e9, o.th[ti], o.th[ti] > 1 ? "s" : "");
            printf("\nGFLOP/s = the forward pass's floating-point operations per token (2 per matrix weight, "
                   "attention's q.k and p.v) x median t/s; the FMA peak bounds F16 / F32 / BF16 matmuls (quantized "
                   "ones run integer dot products)\n");
        }
    }
done:
    free(bw);
    free(samples);
    free(res);
    free(toks);
    free(logits);
    forward_ctx_free(fc);
    kv_cache_free(kv);
    model_free(m);
    return rc;
}
