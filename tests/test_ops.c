/* test_ops: the forward-pass kernels of engine/ops.c — attention against the plain loops, thread-count invariance, matmul chunking. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/testisa.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/tools.h"
#include "engine/model.h"
#include "engine/kernels/kernels.h"
#include "engine/ops.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/threadpool.h"
#include <stdatomic.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static uint64_t rng_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float rng_gauss(void) {
    double u = (double)(rng_u64() >> 11) * 0x1p-53 + 1e-300, v = (double)(rng_u64() >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}

/* The attention of the forward pass written as plain loops: scores summed dimension by
 * dimension (products and sums rounded separately), softmax with expf and a double sum, values
 * summed position by position. */
static void attention_loops(const float *q, const float *K, const float *V, float *out, int T, int pos0, int H,
                            int HKV, int hd) {
    int G = H / HKV, E = H * hd, EKV = HKV * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float *s = malloc(sizeof(float) * (size_t)(pos0 + T));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int len = pos0 + t + 1, g = h / G;
            const float *qv = q + (size_t)t * E + (size_t)h * hd;
            for (int p = 0; p < len; p++) {
                const float *k = K + (size_t)p * EKV + (size_t)g * hd;
                float a = 0.0f;
                for (int d = 0; d < hd; d++) {
                    float prod = qv[d] * k[d];
                    a = a + prod;
                }
                s[p] = a * scale;
            }
            float mx = -INFINITY;
            for (int p = 0; p < len; p++) mx = s[p] > mx ? s[p] : mx;
            double sum = 0.0;
            for (int p = 0; p < len; p++) {
                s[p] = expf(s[p] - mx);
                sum += s[p];
            }
            float inv = (float)(1.0 / sum);
            for (int p = 0; p < len; p++) s[p] *= inv;
            float *o = out + (size_t)t * E + (size_t)h * hd;
            for (int d = 0; d < hd; d++) {
                float a = 0.0f;
                for (int p = 0; p < len; p++) {
                    float prod = s[p] * V[(size_t)p * EKV + (size_t)g * hd + d];
                    a = a + prod;
                }
                o[d] = a;
            }
        }
    free(s);
}

/* op_attention equals the loops (but for an ulp where glibc's expf is not correctly rounded) for
 * head sizes 8 to 128, grouped and plain heads, prefill and decode positions, and gives the same
 * bits for 1, 2 and 3 threads. */
static void test_attention(void **state) {
    (void)state;
    static const int cfg[][5] = {
        /* n_head, n_head_kv, head_dim, pos0, n_tokens */
        {8, 4, 8, 0, 5},   {8, 4, 8, 200, 1}, {32, 4, 64, 0, 37}, {32, 4, 64, 100, 1}, {14, 2, 64, 3, 21},
        {4, 4, 80, 7, 9},  {16, 8, 128, 0, 33}, {7, 1, 16, 40, 3}, {2, 1, 24, 0, 17},   {4, 2, 64, 0, 64},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        int H = cfg[c][0], HKV = cfg[c][1], hd = cfg[c][2], pos0 = cfg[c][3], T = cfg[c][4], n = pos0 + T;
        size_t qn = (size_t)T * H * hd, kn = (size_t)n * HKV * hd;
        float *q = malloc(sizeof(float) * qn), *K = malloc(sizeof(float) * kn), *V = malloc(sizeof(float) * kn);
        float *ref = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * qn), *first = malloc(sizeof(float) * qn);
        for (size_t i = 0; i < qn; i++) q[i] = rng_gauss();
        for (size_t i = 0; i < kn; i++) {
            K[i] = rng_gauss();
            V[i] = rng_gauss();
        }
        attention_loops(q, K, V, ref, T, pos0, H, HKV, hd);
        for (int th = 1; th <= 3; th++) {
            tpool *pool = tpool_create(th);
            assert_non_null(pool);
            memset(out, 0xff, sizeof(float) * qn);
            op_attention(q, K, V, out, T, pos0, H, HKV, hd, pool);
            /* outputs are O(1) (convex combinations of unit-variance values); the kernel's exp is
             * correctly rounded, glibc's expf is within an ulp of it: a few ulp apart at most */
            double worst = 0;
            for (size_t i = 0; i < qn; i++) {
                double e = fabs((double)out[i] - ref[i]);
                worst = e > worst ? e : worst;
            }
            if (worst > 1e-6)
                fail_msg("attention H%d HKV%d hd%d pos0 %d T%d threads %d: error %.3g", H, HKV, hd, pos0, T,
                         th, worst);
            if (th == 1) memcpy(first, out, sizeof(float) * qn);
            else assert_memory_equal(first, out, sizeof(float) * qn);
            tpool_free(pool);
        }
        free(q); free(K); free(V); free(ref); free(out); free(first);
    }
}

/* op_attention_paged on F16 rows kept in scattered blocks of 16 positions (a paged KV cache, rows
 * padded apart) gives the bits op_attention gives on the same values widened to contiguous f32
 * rows: decode and prefill read the cache in place without changing a result. */
static void test_attention_paged_f16(void **state) {
    (void)state;
    static const int cfg[][5] = {
        {32, 4, 64, 700, 1}, {8, 4, 8, 33, 1}, {14, 2, 64, 3, 21}, {2, 1, 24, 17, 5}, {4, 4, 80, 40, 1},
    };
    enum { BS = 16 };
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        int H = cfg[c][0], HKV = cfg[c][1], hd = cfg[c][2], pos0 = cfg[c][3], T = cfg[c][4], n = pos0 + T;
        int EKV = HKV * hd, nblk = (n + BS - 1) / BS;
        size_t qn = (size_t)T * H * hd, kn = (size_t)n * EKV, row_bytes = (size_t)EKV * 2 + 32;
        float *q = malloc(sizeof(float) * qn), *K = malloc(sizeof(float) * kn), *V = malloc(sizeof(float) * kn);
        float *ref = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * qn);
        const uint8_t **kb = malloc(sizeof *kb * (size_t)nblk), **vb = malloc(sizeof *vb * (size_t)nblk);
        uint8_t **mem = malloc(sizeof *mem * (size_t)nblk * 2);
        for (size_t i = 0; i < qn; i++) q[i] = rng_gauss();
        for (int b = 0; b < nblk; b++) {
            mem[2 * b] = malloc(row_bytes * BS);
            mem[2 * b + 1] = malloc(row_bytes * BS);
            kb[b] = mem[2 * b];
            vb[b] = mem[2 * b + 1];
        }
        for (int p = 0; p < n; p++)
            for (int i = 0; i < EKV; i++) {
                uint16_t hk = fp32_to_fp16(rng_gauss()), hv = fp32_to_fp16(rng_gauss());
                K[(size_t)p * EKV + i] = fp16_to_fp32(hk);
                V[(size_t)p * EKV + i] = fp16_to_fp32(hv);
                memcpy(mem[2 * (p / BS)] + (size_t)(p % BS) * row_bytes + 2 * i, &hk, 2);
                memcpy(mem[2 * (p / BS) + 1] + (size_t)(p % BS) * row_bytes + 2 * i, &hv, 2);
            }
        tpool *pool = tpool_create(2);
        op_attention(q, K, V, ref, T, pos0, H, HKV, hd, pool);
        op_attention_paged(q, kb, vb, BS, row_bytes, GGML_TYPE_F16, out, T, pos0, H, HKV, hd, pool);
        assert_memory_equal(ref, out, sizeof(float) * qn);
        tpool_free(pool);
        for (int b = 0; b < 2 * nblk; b++) free(mem[b]);
        free(mem); free(kb); free(vb); free(q); free(K); free(V); free(ref); free(out);
    }
}

/* op_matmul on a packed Q4_0 matrix whose row count is not a multiple of the panel height: the
 * same bits for 1 to 3 threads and for a batch as for single tokens (work sharing and panel
 * boundaries never change a result). */
static void test_matmul_threads(void **state) {
    (void)state;
    enum { N_IN = 512, N_OUT = 16 * 9 + 5, T = 6 };
    size_t rs = quant_row_size(GGML_TYPE_Q4_0, N_IN);
    uint8_t *data = malloc(rs * N_OUT);
    float *wf = malloc(sizeof(float) * N_IN);
    for (int r = 0; r < N_OUT; r++) {
        for (int i = 0; i < N_IN; i++) wf[i] = rng_gauss() * 0.05f;
        quant_quantize_row(GGML_TYPE_Q4_0, wf, data + (size_t)r * rs, N_IN);
    }
    gguf_tensor w = {.name = "w", .n_dims = 2, .ne = {N_IN, N_OUT, 1, 1}, .type = GGML_TYPE_Q4_0, .data = data,
                     .nbytes = rs * N_OUT, .n_elements = (int64_t)N_IN * N_OUT};
    size_t ps = quant_pack_size(GGML_TYPE_Q4_0, N_IN, N_OUT);
    void *packed = ps ? aligned_alloc(64, (ps + 63) & ~(size_t)63) : NULL;
    if (ps) {
        quant_pack(GGML_TYPE_Q4_0, N_IN, N_OUT, data, rs, packed);
        w.packed = packed;
    }
    float *x = malloc(sizeof(float) * N_IN * T), *y = malloc(sizeof(float) * N_OUT * T);
    float *y1 = malloc(sizeof(float) * N_OUT * T), *yt = malloc(sizeof(float) * N_OUT);
    for (int i = 0; i < N_IN * T; i++) x[i] = rng_gauss();
    void *scratch = malloc(op_matmul_scratch_size(&w, T));
    for (int th = 1; th <= 3; th++) {
        tpool *pool = tpool_create(th);
        op_matmul(&w, x, T, y, scratch, pool);
        if (th == 1) memcpy(y1, y, sizeof(float) * N_OUT * T);
        else assert_memory_equal(y1, y, sizeof(float) * N_OUT * T);
        for (int t = 0; t < T; t++) {
            op_matmul(&w, x + (size_t)t * N_IN, 1, yt, scratch, pool);
            assert_memory_equal(yt, y1 + (size_t)t * N_OUT, sizeof(float) * N_OUT);
        }
        tpool_free(pool);
    }
    free(scratch); free(x); free(y); free(y1); free(yt); free(packed); free(wf); free(data);
}

/* A matrix of n_out random rows of type `type` (n_in wide), packed in panels where the type has them. */
static gguf_tensor rand_matrix(int type, int n_in, int n_out, uint8_t **data, void **packed)
{
    size_t rs = quant_row_size(type, n_in);
    float *wf = malloc(sizeof(float) * n_in);
    *data = malloc(rs * n_out);
    for (int r = 0; r < n_out; r++) {
        for (int i = 0; i < n_in; i++) wf[i] = rng_gauss() * 0.05f;
        quant_quantize_row(type, wf, *data + (size_t)r * rs, n_in);
    }
    free(wf);
    gguf_tensor w = {.name = "w", .n_dims = 2, .ne = {n_in, n_out, 1, 1}, .type = type, .data = *data,
                     .nbytes = rs * n_out, .n_elements = (int64_t)n_in * n_out};
    size_t ps = quant_pack_size(type, n_in, n_out);
    *packed = ps ? aligned_alloc(64, (ps + 63) & ~(size_t)63) : NULL;
    if (ps) {
        quant_pack(type, n_in, n_out, *data, rs, *packed);
        w.packed = *packed;
    }
    return w;
}

/* op_matmul_multi (a decode step's q/k/v and gate/up/SwiGLU passes, 1 to OP_MULTI_MAX_TOKENS
 * tokens): every output bit for bit op_matmul's (and op_swiglu's) at 1 to 3 threads, with matrices
 * of two weight types (activation rows converted once per type) and heights that are not whole
 * panels; more tokens than OP_MULTI_MAX_TOKENS, or swiglu on matrices of different heights, are
 * refused without writing. */
static void test_matmul_multi(void **state) {
    (void)state;
    enum { N_IN = 512, TMAX = OP_MULTI_MAX_TOKENS + 1 };
    static const int types[3] = {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    static const int heights[3] = {16 * 9 + 5, 40, 16 * 9 + 5};
    uint8_t *data[3];
    void *packed[3];
    gguf_tensor w[3];
    for (int i = 0; i < 3; i++) w[i] = rand_matrix(types[i], N_IN, heights[i], &data[i], &packed[i]);
    const gguf_tensor *ws[3] = {&w[0], &w[1], &w[2]};
    float *x = malloc(sizeof(float) * N_IN * TMAX);
    for (int i = 0; i < N_IN * TMAX; i++) x[i] = rng_gauss();
    float *ref[3], *y[3];
    for (int i = 0; i < 3; i++) {
        ref[i] = malloc(sizeof(float) * heights[i] * TMAX);
        y[i] = malloc(sizeof(float) * heights[i] * TMAX);
    }
    size_t ss = op_matmul_multi_scratch_size(ws, 3, OP_MULTI_MAX_TOKENS), s1 = op_matmul_scratch_size(&w[1], TMAX);
    void *scratch = malloc(ss > s1 ? ss : s1);
    static const int counts[] = {1, 3, OP_MULTI_MAX_TOKENS};
    for (int th = 1; th <= 3; th++) {
        tpool *pool = tpool_create(th);
        for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
            int T = counts[c];
            for (int i = 0; i < 3; i++) op_matmul(&w[i], x, T, ref[i], scratch, pool);
            for (int i = 0; i < 3; i++) memset(y[i], 0xff, sizeof(float) * heights[i] * T);
            assert_int_equal(op_matmul_multi(ws, 3, x, T, y, 0, scratch, pool), 0);
            for (int i = 0; i < 3; i++) assert_memory_equal(ref[i], y[i], sizeof(float) * heights[i] * T);
            /* gate (w[0]) and up (w[2]) with their SwiGLU */
            for (int t = 0; t < T; t++)
                op_swiglu(ref[0] + (size_t)t * heights[0], ref[2] + (size_t)t * heights[2], heights[0]);
            const gguf_tensor *gu[2] = {&w[0], &w[2]};
            float *ygu[2] = {y[0], y[2]};
            assert_int_equal(op_matmul_multi(gu, 2, x, T, ygu, 1, scratch, pool), 0);
            assert_memory_equal(ref[0], y[0], sizeof(float) * heights[0] * T);
            assert_memory_equal(ref[2], y[2], sizeof(float) * heights[2] * T);
        }
        /* refused: too many tokens, swiglu over different heights */
        memset(y[0], 0xff, sizeof(float) * heights[0]);
        float first = y[0][0];
        assert_int_equal(op_matmul_multi(ws, 3, x, TMAX, y, 0, scratch, pool), -1);
        const gguf_tensor *bad[2] = {&w[0], &w[1]};
        assert_int_equal(op_matmul_multi(bad, 2, x, 1, y, 1, scratch, pool), -1);
        assert_memory_equal(&first, &y[0][0], sizeof first);
        tpool_free(pool);
    }
    for (int i = 0; i < 3; i++) free(ref[i]), free(y[i]), free(data[i]), free(packed[i]);
    free(scratch);
    free(x);
}

/* tpool_set_cancel (issue 16: Esc stops a prefill within 100 ms): a matmul stops taking work
 * chunks once the callback says stop (the rows of later chunks are never written), tpool_run
 * skips a job while it says so, and without it the same matmul gives the reference bits. */
static atomic_int cancel_polls;
static int cancel_at_3(void *ud)
{
    (void)ud;
    return atomic_fetch_add(&cancel_polls, 1) + 1 >= 3;
}
static void set_ran(void *arg, int ith, int nth)
{
    (void)ith;
    (void)nth;
    *(int *)arg = 1;
}
static void test_matmul_cancel(void **state) {
    (void)state;
    enum { N_IN = 512, N_OUT = 4096, T = 12 };
    size_t rs = quant_row_size(GGML_TYPE_Q4_0, N_IN);
    uint8_t *data = malloc(rs * N_OUT);
    float *wf = malloc(sizeof(float) * N_IN);
    for (int r = 0; r < N_OUT; r++) {
        for (int i = 0; i < N_IN; i++) wf[i] = rng_gauss() * 0.05f;
        quant_quantize_row(GGML_TYPE_Q4_0, wf, data + (size_t)r * rs, N_IN);
    }
    gguf_tensor w = {.name = "w", .n_dims = 2, .ne = {N_IN, N_OUT, 1, 1}, .type = GGML_TYPE_Q4_0, .data = data,
                     .nbytes = rs * N_OUT, .n_elements = (int64_t)N_IN * N_OUT};
    float *x = malloc(sizeof(float) * N_IN * T), *ref = malloc(sizeof(float) * N_OUT * T);
    float *y = malloc(sizeof(float) * N_OUT * T);
    for (int i = 0; i < N_IN * T; i++) x[i] = rng_gauss();
    void *scratch = malloc(op_matmul_scratch_size(&w, T));
    tpool *pool = tpool_create(2);
    op_matmul(&w, x, T, ref, scratch, pool);
    for (int i = 0; i < N_OUT * T; i++) y[i] = NAN;
    atomic_store(&cancel_polls, 0);
    tpool_set_cancel(pool, cancel_at_3, NULL);
    op_matmul(&w, x, T, y, scratch, pool);
    assert_true(tpool_cancelled(pool));
    int written = 0;
    for (int r = 0; r < N_OUT; r++) written += !isnan(y[r]);
    /* 16 chunks of 256 rows; the stop came at the 3rd poll: a chunk or a few per thread at most */
    assert_true(written > 0 && written <= N_OUT / 2);
    int ran = 0;
    tpool_run(pool, set_ran, &ran);
    assert_int_equal(ran, 0);
    tpool_set_cancel(pool, NULL, NULL);
    assert_false(tpool_cancelled(pool));
    tpool_run(pool, set_ran, &ran);
    assert_int_equal(ran, 1);
    op_matmul(&w, x, T, y, scratch, pool);
    assert_memory_equal(ref, y, sizeof(float) * N_OUT * T);
    assert_false(tpool_cancelled(NULL));
    tpool_free(pool);
    free(scratch); free(x); free(ref); free(y); free(wf); free(data);
}

/* op_matmul_chunk_rows: whole panels; at least 64 KiB of weights, an eighth of a thread's share
 * with split, at most ~2^26 multiply-adds — with one thread too, which otherwise takes the matrix
 * whole — and never more rows than the matrix has. */
static void test_chunk_rows(void **state) {
    (void)state;
    /* a decode step of TinyLlama's gate (Q4_0 2048 -> 5632, 1,152 B rows), 2 threads: 5632 / 16 */
    assert_int_equal(op_matmul_chunk_rows(1152, 2048, 5632, 1, 2, 1), 352);
    /* the experts' passes (split 0): 64 KiB of rows, 57 -> whole panels, 64 */
    assert_int_equal(op_matmul_chunk_rows(1152, 2048, 768, 1, 2, 0), 64);
    /* one thread, decode: the whole matrix in one chunk (2048 · 5632 < 2^26) */
    assert_int_equal(op_matmul_chunk_rows(1152, 2048, 5632, 1, 1, 1), 5632);
    /* one thread, a 512-token prefill of a Qwen3-30B-A3B expert: 2^26 / (2048 · 512) = 64 rows */
    assert_int_equal(op_matmul_chunk_rows(1152, 2048, 768, 512, 1, 0), 64);
    assert_int_equal(op_matmul_chunk_rows(1152, 2048, 5632, 512, 2, 1), 64);
    /* a very wide prefill: never below one panel */
    assert_int_equal(op_matmul_chunk_rows(1152, 16384, 5632, 8192, 1, 1), QUANT_PANEL_ROWS);
    /* a matrix smaller than a panel: its rows */
    assert_int_equal(op_matmul_chunk_rows(1024, 256, 6, 19, 2, 0), 6);
    for (int nth = 1; nth <= 4; nth++)
        for (int t = 1; t <= 1024; t *= 4) {
            long r = op_matmul_chunk_rows(1152, 2048, 5632, t, nth, 1);
            assert_true(r % QUANT_PANEL_ROWS == 0 && r >= QUANT_PANEL_ROWS && r <= 5632);
            assert_true((int64_t)(r - QUANT_PANEL_ROWS) * 2048 * t < ((int64_t)1 << 26));
        }
}

/* kvchat gen-model: a tiny model of each type is written, loads (weights packed for the kernels),
 * has the type mix asked for, and runs a prefill and decode steps to finite logits. */
/* op_swiglu_pool splits the values among threads: bit for bit op_swiglu's result, for sizes that
 * do not divide evenly, below and above the size it starts splitting at. */
static void test_swiglu_pool(void **state) {
    (void)state;
    tpool *pool = tpool_create(3);
    assert_non_null(pool);
    static const size_t sizes[] = {1, 17, 2047, 2048, 5632, 4 * 5632 + 5};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        float *g = malloc(sizeof(float) * n), *g2 = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n);
        assert_non_null(g);
        assert_non_null(g2);
        assert_non_null(u);
        for (size_t i = 0; i < n; i++) {
            g[i] = g2[i] = (float)((int)(i * 7919 % 2001) - 1000) / 97.0f;
            u[i] = (float)((int)(i * 104729 % 1001) - 500) / 211.0f;
        }
        op_swiglu(g, u, (int)n);
        op_swiglu_pool(g2, u, n, pool);
        assert_memory_equal(g, g2, sizeof(float) * n);
        free(g);
        free(g2);
        free(u);
    }
    tpool_free(pool);
}

/* kern_swiglu at this level against silu(g)·u in double: within 1e-6 relative (~17 ulp; a wrong
 * coefficient or range reduction is off by 1e-4 or more) or 1e-30 absolute (g below -87, where
 * the SIMD levels clamp e^-g and expf overflows: both give ~0); NaN in gives NaN out; and each
 * element's bits do not depend on where a call's slice starts or ends (a batch's pool split vs a
 * decode step's chunks). */
static void test_swiglu_kernel(void **state) {
    (void)state;
    enum { N = 4099 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    float *y2 = malloc(sizeof(float) * N);
    assert_true(g && u && y && y2);
    for (int i = 0; i < N; i++) {
        /* a sweep of [-120, 120] densest near 0, then random values of every size */
        double t = (double)i / (N - 1) * 2.0 - 1.0;
        g[i] = i < N / 2 ? (float)(120.0 * t * t * t) : rng_gauss() * (float)pow(10.0, (double)(i % 9) - 5.0);
        u[i] = rng_gauss();
    }
    g[7] = 0.0f, g[8] = -0.0f, g[9] = 1e-40f, g[10] = -1e-40f, g[11] = 87.5f, g[12] = -87.5f, g[13] = -88.5f;
    memcpy(y, g, sizeof(float) * N);
    kern_swiglu(y, u, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double gd = g[i], want = gd / (1.0 + exp(-gd)) * u[i], d = fabs(y[i] - want);
        if (d > 1e-30) {
            double rel = d / fabs(want);
            worst = rel > worst ? rel : worst;
            if (rel > 1e-6) print_message("g %.9g u %.9g: %.9g, want %.9g\n", g[i], u[i], y[i], want);
            assert_true(rel <= 1e-6);
        }
    }
    if (getenv("KVCHAT_TEST_VERBOSE")) print_message("swiglu @%s: worst relative error %.2e\n", kern_isa_name(kern()->isa), worst);
    /* slices of every length 1..13 from every start: the same bits */
    for (int len = 1; len <= 13; len++)
        for (int i0 = 0; i0 < 64; i0 += len) {
            memcpy(y2 + i0, g + i0, sizeof(float) * (size_t)len);
            kern_swiglu(y2 + i0, u + i0, len);
            assert_memory_equal(y + i0, y2 + i0, sizeof(float) * (size_t)len);
        }
    float gn[3] = {NAN, 1.0f, NAN}, un[3] = {1.0f, NAN, 2.0f};
    kern_swiglu(gn, un, 3);
    assert_true(isnan(gn[0]) && isnan(gn[1]) && isnan(gn[2]));
    free(g), free(u), free(y), free(y2);
}

static void test_gen_model(void **state) {
    (void)state;
    static const char *types[] = {"f16", "q8_0", "q4_0", "q4_k_m", "q5_k_m"};
    static const int main_type[] = {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K};
    char path[256];
    snprintf(path, sizeof path, "%s/kvchat-test-gen-%d.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        kv_error err = {0};
        assert_int_equal(gen_model_write(path, "tiny", types[i], 0, 7, &err), KV_OK);
        model *m = NULL;
        if (model_load(path, &m, &err)) fail_msg("%s: %s", types[i], err.msg);
        assert_int_equal(m->weight_type, main_type[i]);
        assert_int_equal(m->hp.n_layer, 2);
        assert_int_equal(m->hp.n_vocab, 1024);
        if (i >= 3) { /* llama-quantize's Q4_K_M / Q5_K_M: Q6_K output, attn_v / ffn_down where
                       * use_more_bits (of 2 layers: the last), the base K type elsewhere */
            assert_int_equal(m->output->type, GGML_TYPE_Q6_K);
            assert_int_equal(m->layers[0].wv->type, main_type[i]);
            assert_int_equal(m->layers[0].w_down->type, main_type[i]);
            assert_int_equal(m->layers[1].wv->type, GGML_TYPE_Q6_K);
            assert_int_equal(m->layers[1].w_down->type, GGML_TYPE_Q6_K);
            assert_int_equal(m->layers[1].wq->type, main_type[i]);
            assert_int_equal(m->tok_embd->type, main_type[i]);
        }
        kv_cache *kv = kv_cache_create(m->hp.n_layer, m->hp.n_embd_kv, 64, GGML_TYPE_F16, &err);
        forward_ctx *fc = forward_ctx_create(m, 16, 64, &err);
        tpool *pool = tpool_create(2);
        float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
        int32_t toks[12];
        for (int t = 0; t < 12; t++) toks[t] = 3 + 37 * t;
        assert_int_equal(model_forward(m, fc, kv, pool, toks, 12, logits, 0, &err), KV_OK);
        for (int s = 0; s < 4; s++) {
            for (int v = 0; v < m->hp.n_vocab; v++)
                if (!isfinite(logits[v])) fail_msg("%s: logit %d is %g", types[i], v, (double)logits[v]);
            assert_int_equal(model_forward(m, fc, kv, pool, &toks[s], 1, logits, 0, &err), KV_OK);
        }
        free(logits);
        tpool_free(pool);
        forward_ctx_free(fc);
        kv_cache_free(kv);
        model_free(m);
    }
    remove(path);
    kv_error err = {0};
    assert_int_not_equal(gen_model_write(path, "no-such-shape", "q4_0", 0, 1, &err), KV_OK);
    assert_non_null(strstr(err.msg, "no-such-shape"));
}

/* A worker slower than tpool_run's spin (so the caller sleeps until the last worker signals):
 * tpool_run returns only after every thread ran the job, job after job. */
typedef struct slow_job {
    atomic_int done[3];
    int round;
} slow_job;

static void slow_fn(void *arg, int ith, int nth)
{
    slow_job *j = arg;
    (void)nth;
    if (ith == nth - 1 && j->round % 2 == 0) usleep(3000);
    atomic_fetch_add(&j->done[ith], 1);
}

static void test_pool_slow_worker(void **state)
{
    (void)state;
    tpool *p = tpool_create(3);
    assert_non_null(p);
    slow_job j = {0};
    for (j.round = 0; j.round < 40; j.round++) {
        tpool_run(p, slow_fn, &j);
        for (int t = 0; t < 3; t++) assert_int_equal(atomic_load(&j.done[t]), j.round + 1);
    }
    tpool_free(p);
}

/* tpool_run_shared: every item of a job that threads take from a shared counter is done exactly
 * once, and no thread is still inside fn when the call returns (a worker that entered late, here
 * one that sleeps first on even rounds, is waited for; one that had not entered skips the job);
 * plain tpool_run jobs in between still run on every thread. */
typedef struct shared_job {
    atomic_int next, in_fn, item[64];
    int round;
} shared_job;

static void shared_fn(void *arg, int ith, int nth)
{
    shared_job *j = arg;
    atomic_fetch_add(&j->in_fn, 1);
    if (ith == nth - 1 && j->round % 2 == 0) usleep(2000);
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < 64;) {
        if (i % 16 == 0) usleep(100);
        atomic_fetch_add(&j->item[i], 1);
    }
    atomic_fetch_sub(&j->in_fn, 1);
}

static void test_pool_shared(void **state)
{
    (void)state;
    tpool *p = tpool_create(3);
    assert_non_null(p);
    slow_job sj = {0};
    for (int round = 0; round < 60; round++) {
        shared_job j = {.round = round};
        tpool_run_shared(p, shared_fn, &j);
        assert_int_equal(atomic_load(&j.in_fn), 0);
        for (int i = 0; i < 64; i++) assert_int_equal(atomic_load(&j.item[i]), 1);
        if (round % 3 == 0) {
            tpool_run(p, slow_fn, &sj);
            sj.round++;
            for (int t = 0; t < 3; t++) assert_int_equal(atomic_load(&sj.done[t]), sj.round);
        }
    }
    tpool_free(p);
}

/* The pool's hand-offs between a job and a sleep: with no spinning (tpool_set_spin 0) a worker
 * goes to sleep as soon as it has done a job, while the caller posts the next one, and the
 * caller sleeps as soon as it has done its part, while the workers finish theirs — every job
 * races both. Each hand-off is a pair of "write mine, then read theirs" (the job word and the
 * sleepers count; waiting and done) of which one side must see the other's write. With a
 * release store before an acquire load there, qemu-aarch64 on an x86-64 host let the load pass
 * the store and a worker slept through its job (make test hung in test_golden at 2 threads). A
 * lost wake-up hangs rather than fails, so a watchdog ends the process with a message after
 * POOL_WATCHDOG_S. */
#define POOL_WATCHDOG_S 120
typedef struct wake_job {
    atomic_int ran;
    int work_us;
} wake_job;

static void wake_fn(void *arg, int ith, int nth)
{
    wake_job *j = arg;
    if (ith == nth - 1 && j->work_us) usleep((useconds_t)j->work_us);
    atomic_fetch_add(&j->ran, 1);
}

static atomic_int wake_finished;

static void *pool_watchdog(void *arg)
{
    (void)arg;
    for (int i = 0; i < POOL_WATCHDOG_S * 10 && !atomic_load(&wake_finished); i++) usleep(100000);
    if (!atomic_load(&wake_finished)) {
        fprintf(stderr, "test_pool_wakeups: a job was still unfinished after %d s: a lost wake-up in the pool\n",
                POOL_WATCHDOG_S);
        _exit(3);
    }
    return NULL;
}

static void test_pool_wakeups(void **state)
{
    (void)state;
    atomic_store(&wake_finished, 0);
    pthread_t wd;
    assert_int_equal(pthread_create(&wd, NULL, pool_watchdog, NULL), 0);
    /* polls before a sleep, worker / caller: workers that sleep at once against a caller that
     * posts the next job at once, a caller that sleeps at once against workers that finish with
     * it, both, and a little of each */
    static const int spins[][2] = {{0, TPOOL_SPIN}, {TPOOL_SPIN, 0}, {0, 0}, {40, 40}};
    int bad = 0; /* counted, not asserted in the loop: a failed assertion would leave the watchdog running */
    for (int nth = 2; nth <= 3; nth++)
        for (int k = 0; k < 4; k++) {
            tpool *p = tpool_create(nth);
            assert_non_null(p);
            tpool_set_spin(p, spins[k][0], spins[k][1]);
            for (int i = 0; i < 1500; i++) {
                if (i % 11 == 0) usleep((useconds_t)(i % 7)); /* now and then the caller comes late */
                wake_job j = {.work_us = i % 7 == 0 ? i % 5 : 0}; /* or the last worker finishes late */
                if (i % 2) tpool_run(p, wake_fn, &j);
                else tpool_run_shared(p, wake_fn, &j);
                int ran = atomic_load(&j.ran);
                if ((i % 2 ? ran != nth : ran < 1 || ran > nth) && bad++ < 5)
                    print_message("job %d, %d threads, spins %d / %d: fn ran %d times\n", i, nth, spins[k][0],
                                  spins[k][1], ran);
            }
            tpool_free(p);
        }
    atomic_store(&wake_finished, 1);
    pthread_join(wd, NULL);
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_swiglu_pool),
        cmocka_unit_test(test_attention_paged_f16),
        cmocka_unit_test(test_matmul_threads),
        cmocka_unit_test(test_matmul_multi),
        cmocka_unit_test(test_matmul_cancel),
        cmocka_unit_test(test_chunk_rows),
        cmocka_unit_test(test_swiglu_kernel),
        cmocka_unit_test(test_gen_model),
        cmocka_unit_test(test_pool_slow_worker),
        cmocka_unit_test(test_pool_shared),
        cmocka_unit_test(test_pool_wakeups),
    };
    return tu_run_every_isa("ops", tests, sizeof tests / sizeof *tests, NULL, NULL);
}
