/* version: `kvchat --version` — the version, build options, libraries, and the kernel level in use on this CPU. */
#include "app/version.h"

#include <cblas.h>
#include <ncurses.h>
#include <readline/readline.h>
#include <sqlite3.h>
#include <string.h>

#include "engine/kernels/kernels.h"

#ifndef KVCHAT_VERSION
#define KVCHAT_VERSION "unknown"
#endif
#ifndef KVCHAT_DATADIR
#define KVCHAT_DATADIR "/usr/local/share/kvchat"
#endif

/* What each kernel level is, for the line that lists them. */
static const char *const level_text[KERN_ISA_COUNT] = {
    [KERN_PORTABLE] = "portable C",
    [KERN_AVX2] = "x86-64 AVX2 + FMA + F16C",
    [KERN_AVXVNNI] = "x86-64 AVX2 + AVX-VNNI",
    [KERN_AVX512] = "x86-64 AVX-512 F/BW/VL/DQ/VNNI/VBMI",
    [KERN_NEON] = "aarch64 NEON",
    [KERN_NEON_DOTPROD] = "aarch64 NEON + dotprod",
    [KERN_NEON_I8MM] = "aarch64 NEON + dotprod + i8mm",
};

void version_print(FILE *out)
{
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
    const kern_ops *k = kern();
    fprintf(out, "kernels: %s (%s)", kern_isa_name(k->isa), level_text[k->isa]);
    if (k->isa != kern_best()) fprintf(out, ", forced by KVCHAT_ISA; best on this CPU: %s", kern_isa_name(kern_best()));
    fprintf(out, "\nkernel levels this CPU can run:");
    for (int i = 0; i < KERN_ISA_COUNT; i++)
        if (kern_supported((kern_isa)i)) fprintf(out, " %s", kern_isa_name((kern_isa)i));
    fprintf(out, " (KVCHAT_ISA=LEVEL forces one)\n");
    const char *w = kern_warning();
    if (w) fprintf(out, "warning: %s\n", w);
}
