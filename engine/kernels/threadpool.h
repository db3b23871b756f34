/* threadpool: a persistent pool of worker threads that run one parallel-for at a time. */
#ifndef KV_THREADPOOL_H
#define KV_THREADPOOL_H

#include <stddef.h>

typedef struct tpool tpool;

/* fn is called once on each of the nth threads with ith = 0..nth-1 (the caller is ith 0). */
typedef void (*tpool_fn)(void *arg, int ith, int nth);

/* Create a pool of n_threads in total (the calling thread counts as one, so n_threads - 1
 * workers are started). Workers spin briefly after each job and then sleep on a condition
 * variable, so a decode loop never creates threads and an idle pool costs no CPU.
 * Returns NULL when n_threads < 1 or thread creation fails. */
tpool *tpool_create(int n_threads);
void tpool_free(tpool *p);
int tpool_size(const tpool *p);

/* Run fn on every thread of the pool and return when all have finished. Not reentrant:
 * one job at a time, from one caller thread. A NULL pool runs fn(arg, 0, 1) inline. */
void tpool_run(tpool *p, tpool_fn fn, void *arg);

/* As tpool_run for a job whose threads take their work from a shared counter until it is gone
 * (any thread may do any part; a thread that finds nothing left does nothing): the caller runs
 * fn, then closes the job, and waits only for the workers that had entered it by then. A worker
 * not yet scheduled (a loaded machine) is not waited for — it skips the closed job — so a step
 * does not stall on a descheduled thread once the caller has done its part. fn must not depend
 * on every ith running. */
void tpool_run_shared(tpool *p, tpool_fn fn, void *arg);

/* Cancellation of the running work: while cancel(ud) returns nonzero, tpool_run skips its job
 * (fn is not called) and a job that shares its work in chunks stops taking chunks (it polls
 * tpool_cancelled between them), so a stop waits for one chunk, not one whole operation. The
 * result of a job cut short is undefined: the caller checks cancel(ud) after the work and drops
 * it. cancel must be cheap (an atomic load), thread-safe and sticky (once nonzero it stays so
 * until the caller clears it with tpool_set_cancel(p, NULL, NULL)). Set from the thread that
 * calls tpool_run, between jobs. NULL p: ignored. */
void tpool_set_cancel(tpool *p, int (*cancel)(void *ud), void *ud);
/* Nonzero when the pool's cancel callback says stop (0 without one, and for a NULL pool). */
int tpool_cancelled(const tpool *p);

/* How long a worker waits for the next job, and the caller for the workers, before it sleeps on
 * a condition variable: worker_iters and caller_iters polls (default TPOOL_SPIN each, about a
 * millisecond here). For tests, which set 0 on one side or both so that the hand-offs between a
 * job and a sleep are raced; set them between jobs, from the thread that calls tpool_run. NULL p:
 * ignored; a negative count leaves that side as it was. */
#define TPOOL_SPIN 20000
void tpool_set_spin(tpool *p, int worker_iters, int caller_iters);

/* Per-thread working memory owned by the pool: at least `size` bytes, 64-byte aligned, for
 * thread ith of the running job (only that thread may use it). Kept across jobs and grown
 * geometrically (from 256 KiB) when a job asks for more, so steady-state jobs never allocate;
 * the contents do not survive a growth. Freed by tpool_free. NULL when p is NULL or out of
 * memory. */
void *tpool_scratch(tpool *p, int ith, size_t size);

/* Split [0, n) into nth near-equal contiguous parts; part ith is [*lo, *hi). */
void tpool_split(long n, int ith, int nth, long *lo, long *hi);

#endif
