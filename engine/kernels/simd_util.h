/* simd_util: small AVX-512 register helpers shared by the kernels (engine-internal). */
#ifndef KV_SIMD_UTIL_H
#define KV_SIMD_UTIL_H

#if defined(__AVX512F__)
#include <immintrin.h>

/* 16×16 f32 transpose in registers: on return v[k] holds element k of every input row. */
static inline void simd_transpose16x16(__m512 v[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        v[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        v[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        v[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        v[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(v[i], v[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(v[i], v[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(v[i + 8], v[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(v[i + 8], v[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        v[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        v[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        v[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

#endif
#endif
