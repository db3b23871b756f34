/* fwd_prof: the forward pass's per-operation CPU-time totals (KVCHAT_PROF=1; see fwd_prof.h). */
#include "fwd_prof.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static int on = -1, wall;
static double total[FP_COUNT], last;

static const char *const NAMES[FP_COUNT] = {
    [FP_EMBD] = "embd+rope tables", [FP_NORM] = "norms+residual", [FP_QKV] = "q,k,v matmul",
    [FP_ROPE] = "rope+kv store",    [FP_ATTN] = "attention",      [FP_WO] = "wo matmul",
    [FP_FFN_UP] = "gate,up matmul", [FP_FFN_ACT] = "swiglu",      [FP_FFN_DOWN] = "down matmul",
    [FP_LOGITS] = "logits matmul",  [FP_MOE_ROUTE] = "moe router+prep", [FP_MOE_UP] = "moe gate,up",
    [FP_MOE_ACT] = "moe swiglu",      [FP_MOE_DOWN] = "moe down",       [FP_MOE_SUM] = "moe weighted sum",
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int fwd_prof_on(void)
{
    if (on < 0) {
        const char *e = getenv("KVCHAT_PROF");
        on = e && *e && strcmp(e, "0") != 0;
        wall = on && strcmp(e, "wall") == 0;
    }
    return on;
}

void fwd_prof_begin(void) { last = now_ms(); }

void fwd_prof_mark(fwd_prof_op op)
{
    double t = now_ms();
    if (op >= 0 && op < FP_COUNT) total[op] += t - last;
    last = t;
}

void fwd_prof_read(double ms[FP_COUNT]) { memcpy(ms, total, sizeof total); }
void fwd_prof_reset(void) { memset(total, 0, sizeof total); }
const char *fwd_prof_name(fwd_prof_op op) { return op >= 0 && op < FP_COUNT ? NAMES[op] : "?"; }
