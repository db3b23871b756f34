/* version: `kvchat --version` — the version, build options, libraries, and the SIMD level compiled in and in use on this CPU. */
#ifndef KV_APP_VERSION_H
#define KV_APP_VERSION_H

#include <stdio.h>

/* Prints:
 *   kvchat 0.1.0
 *   build: C11, gcc 12.2.0, optimized; data dir /usr/local/share/kvchat
 *   libraries: OpenBLAS …, SQLite …, ncurses …, readline …
 *   SIMD compiled in: AVX2 FMA F16C …      (the macros engine/quant_simd.c picks kernels by)
 *   this CPU has: AVX2 FMA F16C …          (__builtin_cpu_supports, at run time)
 *   SIMD in use: AVX2 kernels …            (and what is missing, if the CPU lacks a feature) */
void version_print(FILE *out);

#endif
