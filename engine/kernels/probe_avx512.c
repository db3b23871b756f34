/* probe_avx512: the read-bandwidth and FMA-throughput loops of `kvchat bench` with 512-bit AVX-512 vectors. */
#include "engine/kernels/probe.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>

uint64_t kern_probe_read_avx512(const void *buf, size_t bytes)
{
    const __m512i *p = buf;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < bytes / 64; i += 4) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 3));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}

double kern_probe_fma_avx512(long iters, float *sink)
{
    __m512 a[12];
    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_ps(1.0f + 0.01f * (float)j);
    const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm512_fmadd_ps(a[j], b, c);
    }
    __m512 s = a[0];
    for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, a[j]);
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * 12 * 16 * 2;
}

#else /* not an x86-64 build: never chosen */

uint64_t kern_probe_read_avx512(const void *buf, size_t bytes)
{
    (void)buf, (void)bytes;
    return 0;
}

double kern_probe_fma_avx512(long iters, float *sink)
{
    (void)iters;
    *sink = 0;
    return 0;
}

#endif
