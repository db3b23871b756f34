/* gemm_avx2: AVX2 matmul group (panel kernels) — placeholder until the AVX2 panels land: keeps the portable group. */
#include "engine/kernels/kernels.h"

#if defined(KERN_VNNI) /* set by gemm_avxvnni.c, on every architecture */
void kern_fill_gemm_avxvnni(kern_ops *o) { (void)o; }
#else
void kern_fill_gemm_avx2(kern_ops *o) { (void)o; }
#endif
