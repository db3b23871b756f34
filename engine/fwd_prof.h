/* fwd_prof: an optional per-operation timer of the forward pass (which share of a decode or batched step each kind of work takes), in CPU time of the calling thread. */
#ifndef KV_FWD_PROF_H
#define KV_FWD_PROF_H

/* The kinds of work a forward pass is cut into (fwd_prof_name gives their names). */
typedef enum fwd_prof_op {
    FP_EMBD = 0,  /* token embedding rows, RoPE tables, KV block reservation */
    FP_NORM,      /* RMS norms before attention and FFN (and the residual adds) */
    FP_QKV,       /* q, k, v projections (+ bias) */
    FP_ROPE,      /* q/k norms, RoPE, storing k and v in the cache */
    FP_ATTN,      /* attention over the paged cache, every sequence */
    FP_WO,        /* output projection of attention */
    FP_FFN_UP,    /* gate and up projections */
    FP_FFN_ACT,   /* SwiGLU / GeGLU */
    FP_FFN_DOWN,  /* down projection (a mixture of experts: FP_MOE_*) */
    FP_LOGITS,    /* final norm and the output matrix */
    FP_MOE_ROUTE, /* mixture of experts: router matmul, top-k, grouping, input preparation */
    FP_MOE_UP,    /* the selected (and shared) experts' gate and up matrices, one pool pass */
    FP_MOE_ACT,   /* their SwiGLU and the down matrices' input preparation */
    FP_MOE_DOWN,  /* their down matrices, one pool pass */
    FP_MOE_SUM,   /* the weighted sum of the experts' outputs (+ the shared expert's) */
    FP_COUNT
} fwd_prof_op;

/* Nonzero when KVCHAT_PROF is set to something other than "" or "0" (read once). KVCHAT_PROF=wall
 * times with the monotonic clock instead (wall time of the calling thread's whole step, waits for
 * the pool included: where a multi-threaded step's time goes). */
int fwd_prof_on(void);

/* Start timing (the clock of the calling thread, CLOCK_THREAD_CPUTIME_ID: time this thread ran,
 * whatever else the machine does; the pool's other threads are not counted, so run it with
 * one thread — or read it as the caller's share — to see the whole work). */
void fwd_prof_begin(void);
/* Add the time since the last begin / mark to op's total and restart the clock. */
void fwd_prof_mark(fwd_prof_op op);

/* Totals in milliseconds since the last reset ([FP_COUNT]); reset sets them to 0. Process-wide,
 * not thread-safe: one forward pass at a time (a benchmark). */
void fwd_prof_read(double ms[FP_COUNT]);
void fwd_prof_reset(void);
const char *fwd_prof_name(fwd_prof_op op);

/* Used by model.c: zero cost when profiling is off (one predictable branch). */
#define FWD_PROF_BEGIN()    do { if (fwd_prof_on()) fwd_prof_begin(); } while (0)
#define FWD_PROF_MARK(op)   do { if (fwd_prof_on()) fwd_prof_mark(op); } while (0)

#endif
