/* arm_i8mm: the NEON kernels of arm_neon.c built for Armv8.6 with dotprod + i8mm — kern_fill_arm_i8mm. */
#define KERN_DOTPROD 1
#define KERN_I8MM 1
#include "engine/kernels/arm_neon.c"
