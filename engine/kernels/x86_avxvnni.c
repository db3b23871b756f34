/* x86_avxvnni: x86_avx2.c's kernels built with AVX-VNNI (-mavxvnni): vpdpbusd / vpdpwssd in 256-bit form. */
#define KERN_VNNI 1
#include "x86_avx2.c"
