/* probe: the read-bandwidth and FMA-throughput loops of `kvchat bench` — the portable and NEON versions, and the choice by kernel level. */
#include "engine/kernels/probe.h"

#include "engine/kernels/kernels.h"
#include "engine/kernels/threadpool.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

static uint64_t read_portable(const void *buf, size_t bytes)
{
#if defined(__aarch64__)
    const uint64_t *p = buf;
    uint64x2_t a0 = vdupq_n_u64(0), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < bytes / 8; i += 32) {
        a0 = vaddq_u64(a0, vaddq_u64(vld1q_u64(p + i), vld1q_u64(p + i + 2)));
        a1 = vaddq_u64(a1, vaddq_u64(vld1q_u64(p + i + 4), vld1q_u64(p + i + 6)));
        a2 = vaddq_u64(a2, vaddq_u64(vld1q_u64(p + i + 8), vld1q_u64(p + i + 10)));
        a3 = vaddq_u64(a3, vaddq_u64(vld1q_u64(p + i + 12), vld1q_u64(p + i + 14)));
        a0 = vaddq_u64(a0, vaddq_u64(vld1q_u64(p + i + 16), vld1q_u64(p + i + 18)));
        a1 = vaddq_u64(a1, vaddq_u64(vld1q_u64(p + i + 20), vld1q_u64(p + i + 22)));
        a2 = vaddq_u64(a2, vaddq_u64(vld1q_u64(p + i + 24), vld1q_u64(p + i + 26)));
        a3 = vaddq_u64(a3, vaddq_u64(vld1q_u64(p + i + 28), vld1q_u64(p + i + 30)));
    }
    uint64x2_t s = vaddq_u64(vaddq_u64(a0, a1), vaddq_u64(a2, a3));
    return vgetq_lane_u64(s, 0) + vgetq_lane_u64(s, 1);
#else
    const uint64_t *p = buf;
    uint64_t a[8] = {0};
    for (size_t i = 0; i < bytes / 8; i += 8)
        for (int j = 0; j < 8; j++) a[j] += p[i + j];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
#endif
}

static double fma_portable(long iters, float *sink)
{
#if defined(__aarch64__)
    float32x4_t a[12];
    for (int j = 0; j < 12; j++) a[j] = vdupq_n_f32(1.0f + 0.01f * (float)j);
    const float32x4_t b = vdupq_n_f32(0.999f), c = vdupq_n_f32(0.001f);
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = vfmaq_f32(c, a[j], b);
    float32x4_t s = a[0];
    for (int j = 1; j < 12; j++) s = vaddq_f32(s, a[j]);
    *sink = vaddvq_f32(s);
    return (double)iters * 12 * 4 * 2;
#else
    float a[12];
    for (int j = 0; j < 12; j++) a[j] = 1.0f + 0.01f * (float)j;
    const float b = 0.999f, c = 0.001f;
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = a[j] * b + c;
    float s = 0;
    for (int j = 0; j < 12; j++) s += a[j];
    *sink = s;
    return (double)iters * 12 * 2;
#endif
}

uint64_t kern_probe_read(const void *buf, size_t bytes)
{
    switch (kern()->isa) {
    case KERN_AVX2: case KERN_AVXVNNI: return kern_probe_read_avx2(buf, bytes);
    case KERN_AVX512: return kern_probe_read_avx512(buf, bytes);
    default: return read_portable(buf, bytes);
    }
}

double kern_probe_fma(long iters, float *sink)
{
    switch (kern()->isa) {
    case KERN_AVX2: case KERN_AVXVNNI: return kern_probe_fma_avx2(iters, sink);
    case KERN_AVX512: return kern_probe_fma_avx512(iters, sink);
    default: return fma_portable(iters, sink);
    }
}

typedef struct read_job {
    const uint8_t *buf;
    size_t bytes;
    uint64_t sink[64];
} read_job;

static void read_worker(void *arg, int ith, int nth)
{
    read_job *j = arg;
    long lo, hi;
    tpool_split((long)(j->bytes / 4096), ith, nth, &lo, &hi);
    j->sink[ith & 63] = kern_probe_read(j->buf + (size_t)lo * 4096, (size_t)(hi - lo) * 4096);
}

uint64_t kern_probe_read_pool(struct tpool *pool, const void *buf, size_t bytes)
{
    read_job j = {.buf = buf, .bytes = bytes};
    tpool_run(pool, read_worker, &j);
    uint64_t s = 0;
    for (int i = 0; i < 64; i++) s += j.sink[i];
    return s;
}
