/* gemm_avxvnni: gemm_avx2.c's panel kernels built with AVX-VNNI (-mavxvnni). */
#define KERN_VNNI 1
#include "gemm_avx2.c"
