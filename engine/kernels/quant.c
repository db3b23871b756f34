/* quant.c: the GGML type table (names, block sizes, bytes), row sizes and fp16/bf16 scalar conversions. */
#include "engine/kernels/quant.h"

#include <assert.h>
#include <string.h>

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1 layout");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K layout");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K layout");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K layout");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl layout");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs layout");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 layout");

#define QK QUANT_QK_K

/* Sizes from the GGML block structs (ggml-common.h) as documented for GGUF; the IQ / TQ rows
 * are known so files using them get a clear "unsupported type" message. */
static const quant_traits TRAITS[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32]  = {"F32", 1, 4, 1, GGML_TYPE_F32},
    [GGML_TYPE_F16]  = {"F16", 1, 2, 1, GGML_TYPE_F16},
    [GGML_TYPE_Q4_0] = {"Q4_0", 32, sizeof(block_q4_0), 1, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q4_1] = {"Q4_1", 32, sizeof(block_q4_1), 1, GGML_TYPE_Q8_1},
    [GGML_TYPE_Q5_0] = {"Q5_0", 32, sizeof(block_q5_0), 1, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q5_1] = {"Q5_1", 32, sizeof(block_q5_1), 1, GGML_TYPE_Q8_1},
    [GGML_TYPE_Q8_0] = {"Q8_0", 32, sizeof(block_q8_0), 1, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q8_1] = {"Q8_1", 32, sizeof(block_q8_1), 0, GGML_TYPE_Q8_1},
    [GGML_TYPE_Q2_K] = {"Q2_K", QK, sizeof(block_q2_K), 1, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q3_K] = {"Q3_K", QK, sizeof(block_q3_K), 1, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q4_K] = {"Q4_K", QK, sizeof(block_q4_K), 1, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q5_K] = {"Q5_K", QK, sizeof(block_q5_K), 1, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q6_K] = {"Q6_K", QK, sizeof(block_q6_K), 1, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q8_K] = {"Q8_K", QK, sizeof(block_q8_K), 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ2_XXS] = {"IQ2_XXS", QK, 2 + QK / 4, 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ2_XS]  = {"IQ2_XS", QK, 2 + QK / 4 + QK / 32, 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ3_XXS] = {"IQ3_XXS", QK, 2 + 3 * QK / 8, 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ1_S]   = {"IQ1_S", QK, 2 + QK / 8 + QK / 16, 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ4_NL]  = {"IQ4_NL", 32, sizeof(block_iq4_nl), 1, GGML_TYPE_Q8_0},
    [GGML_TYPE_IQ3_S]   = {"IQ3_S", QK, 2 + QK / 4 + QK / 32 + QK / 8 + QK / 64, 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ2_S]   = {"IQ2_S", QK, 2 + QK / 4 + QK / 32 + QK / 32, 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ4_XS]  = {"IQ4_XS", QK, sizeof(block_iq4_xs), 1, GGML_TYPE_Q8_K},
    [GGML_TYPE_I8]   = {"I8", 1, 1, 0, -1},
    [GGML_TYPE_I16]  = {"I16", 1, 2, 0, -1},
    [GGML_TYPE_I32]  = {"I32", 1, 4, 0, -1},
    [GGML_TYPE_I64]  = {"I64", 1, 8, 0, -1},
    [GGML_TYPE_F64]  = {"F64", 1, 8, 0, -1},
    [GGML_TYPE_IQ1_M]   = {"IQ1_M", QK, QK / 8 + QK / 16 + QK / 32, 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_BF16] = {"BF16", 1, 2, 1, GGML_TYPE_BF16},
    [GGML_TYPE_Q4_0_4_4]   = {"Q4_0_4_4", 32, 18, 0, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q4_0_4_8]   = {"Q4_0_4_8", 32, 18, 0, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q4_0_8_8]   = {"Q4_0_8_8", 32, 18, 0, GGML_TYPE_Q8_0},
    [GGML_TYPE_TQ1_0]  = {"TQ1_0", QK, (QK - 4 * QK / 64) / 5 + QK / 64 + 2, 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_TQ2_0]  = {"TQ2_0", QK, QK / 4 + 2, 0, GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ4_NL_4_4] = {"IQ4_NL_4_4", 32, 18, 0, GGML_TYPE_Q8_0},
    [GGML_TYPE_IQ4_NL_4_8] = {"IQ4_NL_4_8", 32, 18, 0, GGML_TYPE_Q8_0},
    [GGML_TYPE_IQ4_NL_8_8] = {"IQ4_NL_8_8", 32, 18, 0, GGML_TYPE_Q8_0},
    [GGML_TYPE_MXFP4]  = {"MXFP4", 32, sizeof(block_mxfp4), 1, GGML_TYPE_Q8_0},
};

const quant_traits *quant_traits_of(int type) {
    if (type < 0 || type >= GGML_TYPE_COUNT || TRAITS[type].name == NULL) return NULL;
    return &TRAITS[type];
}

size_t quant_row_size(int type, int64_t n) {
    const quant_traits *t = quant_traits_of(type);
    if (!t || n < 0 || n % t->block_size != 0) return 0;
    return (size_t)(n / t->block_size) * t->type_size;
}

int quant_can_quantize(int type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q8_1:
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: case GGML_TYPE_Q8_K: case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS:
    case GGML_TYPE_MXFP4:
        return 1;
    default:
        return 0;
    }
}

int quant_can_dequantize(int type) {
    /* Every type we can write we can also read. */
    return quant_can_quantize(type);
}

/* ---- IEEE half ------------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in binary32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t fp32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 rounds (to even) past 65504: inf, also inf itself */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: half subnormal (or zero), units of 2^-24 */
        uint32_t e = a >> 23;
        uint32_t s = 126u - e; /* shift from the 24-bit significand to 2^-24 units */
        if (s > 24) return sign;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry may bump the exponent */
    return (uint16_t)(sign | h);
}

/* ---- bfloat16 --------------------------------------------------------------------------- */

float bf16_to_fp32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t fp32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
