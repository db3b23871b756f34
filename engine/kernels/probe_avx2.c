/* probe_avx2: the read-bandwidth and FMA-throughput loops of `kvchat bench` with 256-bit AVX2 / FMA vectors. */
#include "engine/kernels/probe.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

uint64_t kern_probe_read_avx2(const void *buf, size_t bytes)
{
    const __m256i *p = buf;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < bytes / 32; i += 8) {
        a0 = _mm256_add_epi64(a0, _mm256_add_epi64(_mm256_load_si256(p + i), _mm256_load_si256(p + i + 1)));
        a1 = _mm256_add_epi64(a1, _mm256_add_epi64(_mm256_load_si256(p + i + 2), _mm256_load_si256(p + i + 3)));
        a2 = _mm256_add_epi64(a2, _mm256_add_epi64(_mm256_load_si256(p + i + 4), _mm256_load_si256(p + i + 5)));
        a3 = _mm256_add_epi64(a3, _mm256_add_epi64(_mm256_load_si256(p + i + 6), _mm256_load_si256(p + i + 7)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return (uint64_t)_mm_cvtsi128_si64(h) + (uint64_t)_mm_extract_epi64(h, 1);
}

double kern_probe_fma_avx2(long iters, float *sink)
{
    __m256 a[12];
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps(1.0f + 0.01f * (float)j);
    const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], b, c);
    }
    __m256 s = a[0];
    for (int j = 1; j < 12; j++) s = _mm256_add_ps(s, a[j]);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    *sink = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    return (double)iters * 12 * 8 * 2;
}

#else /* not an x86-64 build: never chosen */

uint64_t kern_probe_read_avx2(const void *buf, size_t bytes)
{
    (void)buf, (void)bytes;
    return 0;
}

double kern_probe_fma_avx2(long iters, float *sink)
{
    (void)iters;
    *sink = 0;
    return 0;
}

#endif
