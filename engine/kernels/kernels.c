/* kernels: run-time dispatch — finds the CPU's features once, builds the kernel table of the best (or the forced) ISA level, and the quant.h entry points that call through it. */
#include "engine/kernels/kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#endif

static const char *const isa_names[KERN_ISA_COUNT] = {
    [KERN_PORTABLE] = "portable", [KERN_AVX2] = "avx2",       [KERN_AVXVNNI] = "avxvnni",
    [KERN_AVX512] = "avx512",     [KERN_NEON] = "neon",       [KERN_NEON_DOTPROD] = "dotprod",
    [KERN_NEON_I8MM] = "i8mm",
};

const char *kern_isa_name(kern_isa isa)
{
    return (unsigned)isa < KERN_ISA_COUNT ? isa_names[isa] : NULL;
}

int kern_isa_parse(const char *name)
{
    for (int i = 0; name && i < KERN_ISA_COUNT; i++)
        if (!strcmp(name, isa_names[i])) return i;
    return -1;
}

#if defined(__x86_64__) || defined(__i386__)
/* XCR0 through xgetbv: which register states the OS saves on a context switch. */
static unsigned long long xcr0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

/* Bit i set: this CPU (and OS) can run level i. Intel SDM vol. 2A, CPUID leaves 1 and 7; Arm ARM
 * ID_AA64ISAR0/1 as Linux reports them in AT_HWCAP / AT_HWCAP2. */
static unsigned detect(void)
{
    unsigned ok = 1u << KERN_PORTABLE;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return ok;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return ok;
    unsigned long long x = xcr0();
    if ((x & 0x6) != 0x6) return ok; /* XMM and YMM state */
    unsigned b7 = 0, c7 = 0, a71 = 0, t;
    if (__get_cpuid_count(7, 0, &t, &b7, &c7, &d)) {
        unsigned max7 = t;
        if (max7 >= 1) __get_cpuid_count(7, 1, &a71, &t, &t, &t);
    }
    int avx2 = (b7 >> 5) & 1;
    if (!(avx2 && fma && f16c)) return ok;
    ok |= 1u << KERN_AVX2;
    if ((a71 >> 4) & 1) ok |= 1u << KERN_AVXVNNI;
    int f = (b7 >> 16) & 1, dq = (b7 >> 17) & 1, bw = (b7 >> 30) & 1, vl = (b7 >> 31) & 1;
    int vbmi = (c7 >> 1) & 1, vnni = (c7 >> 11) & 1;
    if (f && dq && bw && vl && vbmi && vnni && (x & 0xe6) == 0xe6) ok |= 1u << KERN_AVX512; /* + opmask, ZMM */
#elif defined(__aarch64__)
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    ok |= 1u << KERN_NEON; /* Advanced SIMD is part of every aarch64 CPU Linux runs on */
    if (hw & HWCAP_ASIMDDP) {
        ok |= 1u << KERN_NEON_DOTPROD;
        if (hw2 & HWCAP2_I8MM) ok |= 1u << KERN_NEON_I8MM;
    }
#endif
    return ok;
}

static unsigned supported_mask;
static kern_ops tables[KERN_ISA_COUNT];
static _Atomic(const kern_ops *) current;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char warning[160];

/* The table of a level: the portable entries, then each file's overrides, lowest first. */
static void build(kern_isa isa, kern_ops *o)
{
    memset(o, 0, sizeof *o);
    kern_fill_portable(o);
    switch (isa) {
    case KERN_AVX2:
        kern_fill_x86_avx2(o);
        kern_fill_gemm_avx2(o);
        break;
    case KERN_AVXVNNI:
        kern_fill_x86_avxvnni(o);
        kern_fill_gemm_avxvnni(o);
        break;
    case KERN_AVX512:
        if (supported_mask & (1u << KERN_AVXVNNI)) kern_fill_x86_avxvnni(o);
        else kern_fill_x86_avx2(o);
        kern_fill_x86_avx512(o);
        break;
    case KERN_NEON: kern_fill_arm_neon(o); break;
    case KERN_NEON_DOTPROD:
        kern_fill_arm_neon(o);
        kern_fill_arm_dotprod(o);
        break;
    case KERN_NEON_I8MM:
        kern_fill_arm_neon(o);
        kern_fill_arm_dotprod(o);
        kern_fill_arm_i8mm(o);
        break;
    default: break;
    }
    o->isa = isa;
}

kern_isa kern_best(void)
{
    kern(); /* detects */
    for (int i = KERN_ISA_COUNT - 1; i > 0; i--)
        if (supported_mask & (1u << i)) return (kern_isa)i;
    return KERN_PORTABLE;
}

int kern_supported(kern_isa isa)
{
    kern();
    return (unsigned)isa < KERN_ISA_COUNT && (supported_mask >> isa) & 1;
}

static void init(void)
{
    supported_mask = detect();
    kern_isa use = KERN_PORTABLE;
    for (int i = KERN_ISA_COUNT - 1; i > 0; i--)
        if (supported_mask & (1u << i)) {
            use = (kern_isa)i;
            break;
        }
    const char *env = getenv("KVCHAT_ISA");
    if (env && *env) {
        int want = kern_isa_parse(env);
        if (want < 0)
            snprintf(warning, sizeof warning, "KVCHAT_ISA=%.40s is not a kernel level (portable, avx2, avxvnni, avx512, "
                     "neon, dotprod, i8mm); using %s", env, isa_names[use]);
        else if (!((supported_mask >> want) & 1))
            snprintf(warning, sizeof warning, "KVCHAT_ISA=%s: this CPU lacks it; using %s", env, isa_names[use]);
        else
            use = (kern_isa)want;
    }
    build(use, &tables[use]);
    atomic_store(&current, &tables[use]);
}

const kern_ops *kern(void)
{
    const kern_ops *k = atomic_load_explicit(&current, memory_order_acquire);
    if (k) return k;
    pthread_once(&once, init);
    return atomic_load(&current);
}

int kern_select(kern_isa isa)
{
    if (!kern_supported(isa)) return -1;
    if (tables[isa].isa != isa || !tables[isa].vec_dot) build(isa, &tables[isa]);
    atomic_store(&current, &tables[isa]);
    return 0;
}

const char *kern_warning(void)
{
    kern();
    return warning[0] ? warning : NULL;
}

/* ---- quant.h entry points ------------------------------------------------------------------ */

float quant_vec_dot(int type, int64_t n, const void *w_row, const void *x_act)
{
    return kern()->vec_dot(type, n, w_row, x_act);
}

void quant_vec_dot_rows(int type, int64_t n, int64_t nrows, const void *w, size_t row_stride, const void *x_act,
                        float *out)
{
    kern()->vec_dot_rows(type, n, nrows, w, row_stride, x_act, out);
}

void quant_quantize_row(int type, const float *src, void *dst, int64_t n) { kern()->quantize_row(type, src, dst, n); }

void quant_dequantize_row(int type, const void *src, float *dst, int64_t n)
{
    kern()->dequantize_row(type, src, dst, n);
}

void quant_fp16_to_fp32_row(const uint16_t *src, float *dst, int64_t n) { kern()->fp16_to_fp32_row(src, dst, n); }

void quant_fp32_to_fp16_row(const float *src, uint16_t *dst, int64_t n) { kern()->fp32_to_fp16_row(src, dst, n); }

void kern_swiglu(float *gate, const float *up, int64_t n) { kern()->swiglu(gate, up, n); }

size_t quant_act_row_size(int wtype, int64_t n) { return kern()->act_row_size(wtype, n); }

void quant_act_prepare(int wtype, const float *x, int64_t n, void *act) { kern()->act_prepare(wtype, x, n, act); }

void quant_gemv(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act, float *out)
{
    kern()->gemv(wtype, n, nrows, w, w_stride, act, out);
}

void quant_gemm(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, const void *act,
                size_t act_stride, int n_tokens, float *out, size_t out_stride)
{
    kern()->gemm(wtype, n, nrows, w, w_stride, act, act_stride, n_tokens, out, out_stride);
}

size_t quant_pack_size(int wtype, int64_t n, int64_t nrows) { return kern()->pack_size(wtype, n, nrows); }

void quant_pack(int wtype, int64_t n, int64_t nrows, const void *w, size_t w_stride, void *dst)
{
    kern()->pack(wtype, n, nrows, w, w_stride, dst);
}

void quant_gemm_packed(int wtype, int64_t n, int64_t row0, int64_t nrows, const void *packed, const void *act,
                       size_t act_stride, int n_tokens, float *out, size_t out_stride)
{
    kern()->gemm_packed(wtype, n, row0, nrows, packed, act, act_stride, n_tokens, out, out_stride);
}
