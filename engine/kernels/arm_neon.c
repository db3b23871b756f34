/* arm_neon: aarch64 NEON kernels — placeholder until the NEON kernels land: keeps the portable entries. */
#include "engine/kernels/kernels.h"

void kern_fill_arm_neon(kern_ops *o) { (void)o; }
void kern_fill_arm_dotprod(kern_ops *o) { (void)o; }
void kern_fill_arm_i8mm(kern_ops *o) { (void)o; }
