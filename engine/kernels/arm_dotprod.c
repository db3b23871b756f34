/* arm_dotprod: the NEON kernels of arm_neon.c built with SDOT (Armv8.2 dotprod) — kern_fill_arm_dotprod. */
#define KERN_DOTPROD 1
#include "engine/kernels/arm_neon.c"
