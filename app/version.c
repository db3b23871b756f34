/* version: `kvchat --version` — the version, build options, libraries, and the SIMD level compiled in and in use on this CPU. */
#include "app/version.h"

#include <cblas.h>
#include <ncurses.h>
#include <readline/readline.h>
#include <sqlite3.h>
#include <string.h>

#ifndef KVCHAT_VERSION
#define KVCHAT_VERSION "unknown"
#endif
#ifndef KVCHAT_DATADIR
#define KVCHAT_DATADIR "/usr/local/share/kvchat"
#endif

/* What the dot-product kernels (engine/quant_simd.c) were compiled for: the same macros pick
 * them there. */
static const char *compiled_level(void)
{
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__) && defined(__F16C__)
    return "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    return "AVX2";
#else
    return "scalar";
#endif
}

typedef struct feature {
    const char *name;
    int compiled;
    int cpu;
} feature;

#if defined(__x86_64__) || defined(__i386__)
#define CPU(x) __builtin_cpu_supports(x)
#else
#define CPU(x) 0
#endif

static int features(feature *f)
{
    int n = 0;
#define F(label, macro_on, cpu_name) f[n++] = (feature){label, macro_on, CPU(cpu_name)}
#ifdef __AVX2__
    F("AVX2", 1, "avx2");
#else
    F("AVX2", 0, "avx2");
#endif
#ifdef __FMA__
    F("FMA", 1, "fma");
#else
    F("FMA", 0, "fma");
#endif
#ifdef __F16C__
    F("F16C", 1, "f16c");
#else
    F("F16C", 0, "f16c");
#endif
#ifdef __AVX512F__
    F("AVX512F", 1, "avx512f");
#else
    F("AVX512F", 0, "avx512f");
#endif
#ifdef __AVX512BW__
    F("AVX512BW", 1, "avx512bw");
#else
    F("AVX512BW", 0, "avx512bw");
#endif
#ifdef __AVX512VL__
    F("AVX512VL", 1, "avx512vl");
#else
    F("AVX512VL", 0, "avx512vl");
#endif
#ifdef __AVX512VNNI__
    F("AVX512-VNNI", 1, "avx512vnni");
#else
    F("AVX512-VNNI", 0, "avx512vnni");
#endif
#ifdef __AVX512BF16__
    F("AVX512-BF16", 1, "avx512bf16");
#else
    F("AVX512-BF16", 0, "avx512bf16");
#endif
#undef F
    return n;
}

void version_print(FILE *out)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
#endif
    fprintf(out, "kvchat %s\n", KVCHAT_VERSION);
    fprintf(out, "build: C11");
#if defined(__clang__)
    fprintf(out, ", clang %s", __clang_version__);
#elif defined(__GNUC__)
    fprintf(out, ", gcc %s", __VERSION__);
#endif
#ifdef __OPTIMIZE__
    fprintf(out, ", optimized");
#else
    fprintf(out, ", not optimized");
#endif
#if defined(__SANITIZE_ADDRESS__)
    fprintf(out, ", AddressSanitizer");
#endif
    fprintf(out, "; data dir %s\n", KVCHAT_DATADIR);
    const char *blas = openblas_get_config();
    fprintf(out, "libraries: %s, SQLite %s, %s, readline %s\n", blas ? blas : "OpenBLAS", sqlite3_libversion(),
            curses_version(), rl_library_version ? rl_library_version : "?");
    feature f[16];
    int n = features(f);
    fprintf(out, "SIMD compiled in:");
    int any = 0;
    for (int i = 0; i < n; i++)
        if (f[i].compiled) fprintf(out, " %s", f[i].name), any = 1;
    fprintf(out, "%s\nthis CPU has:", any ? "" : " none");
    any = 0;
    for (int i = 0; i < n; i++)
        if (f[i].cpu) fprintf(out, " %s", f[i].name), any = 1;
    fprintf(out, "%s\n", any ? "" : " none of these");
    int missing = 0;
    for (int i = 0; i < n; i++) missing |= f[i].compiled && !f[i].cpu;
    const char *lvl = compiled_level();
    if (missing) {
        fprintf(out, "SIMD in use: %s kernels, but this CPU lacks:", lvl);
        for (int i = 0; i < n; i++)
            if (f[i].compiled && !f[i].cpu) fprintf(out, " %s", f[i].name);
        fprintf(out, " (rebuild here: make clean && make)\n");
    } else {
        fprintf(out, "SIMD in use: %s kernels for the quantized dot products", lvl);
        int unused = 0;
        for (int i = 0; i < n; i++) unused |= !f[i].compiled && f[i].cpu;
        if (unused && strcmp(lvl, "AVX-512")) fprintf(out, " (the CPU could do more: build with -march=native)");
        fprintf(out, "\n");
    }
}
