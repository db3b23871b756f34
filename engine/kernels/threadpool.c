/* threadpool: persistent workers, spin-then-sleep wake-up, one parallel-for job at a time. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* The job word: generation << 32 | CLOSED | workers that entered the job. A worker runs a job
 * only after a compare-and-swap on this word counted it in (the generation it saw still current,
 * the job not closed): a shared job (tpool_run_shared) is closed by its caller once the work is
 * gone, and workers that had not entered it by then skip it instead of being waited for. */
#define JOB_CLOSED ((uint64_t)1 << 16)
#define JOB_GEN(s) ((uint32_t)((s) >> 32))
#define JOB_ENTERED(s) ((int)((s) & 0xffff))

struct tpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t job;     /* the job word (above); the generation is bumped for every job */
    atomic_int done;          /* workers that finished the current job */
    atomic_int stop;
    atomic_int sleepers;
    atomic_int waiting;       /* the caller sleeps on done_cv until enough workers finished */
    atomic_int spin_worker;   /* polls before a sleep (tpool_set_spin) */
    atomic_int spin_caller;
    pthread_cond_t done_cv;
    tpool_fn fn;
    void *arg;
    void **scratch;           /* per thread, grown on demand (tpool_scratch) */
    int (*cancel)(void *);    /* tpool_set_cancel: polled before a job and between chunks */
    void *cancel_ud;
    size_t *scratch_size;
};

typedef struct worker_arg {
    tpool *p;
    int ith;
} worker_arg;

static void *worker_main(void *vp)
{
    worker_arg *wa = vp;
    tpool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    /* Jobs are numbered from 1: a job posted before this thread got here is still seen. */
    uint32_t seen = 0;
    for (;;) {
        uint64_t s;
        int spins = 0, spin = atomic_load_explicit(&p->spin_worker, memory_order_relaxed);
        while (JOB_GEN(s = atomic_load_explicit(&p->job, memory_order_acquire)) == seen && !atomic_load(&p->stop) &&
               spins < spin) {
            if (spins % 1024 == 1023) sched_yield();
            else cpu_relax();
            spins++;
        }
        if (JOB_GEN(s) == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (JOB_GEN(s = atomic_load(&p->job)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        /* enter the newest job unless its caller closed it (a failed swap reloads s: a newer job) */
        int entered = 0;
        while (!(s & JOB_CLOSED)) {
            if (atomic_compare_exchange_weak(&p->job, &s, s + 1)) {
                entered = 1;
                break;
            }
        }
        seen = JOB_GEN(s);
        if (!entered) continue;
        p->fn(p->arg, ith, p->n_threads);
        /* seq_cst, paired with the caller's store to waiting then load of done: either it sees
         * this worker's count or this sees it waiting */
        atomic_fetch_add(&p->done, 1);
        if (atomic_load(&p->waiting)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

tpool *tpool_create(int n_threads)
{
    if (n_threads < 1) return NULL;
    tpool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    atomic_init(&p->spin_worker, TPOOL_SPIN);
    atomic_init(&p->spin_caller, TPOOL_SPIN);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->scratch = calloc((size_t)n_threads, sizeof *p->scratch);
    p->scratch_size = calloc((size_t)n_threads, sizeof *p->scratch_size);
    if (!p->threads || !p->scratch || !p->scratch_size) {
        free(p->threads);
        free(p->scratch);
        free(p->scratch_size);
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, (wa->p = p, wa->ith = i, wa)) != 0) {
            free(wa);
            p->n_threads = i; /* only the started ones are joined */
            tpool_free(p);
            return NULL;
        }
    }
    return p;
}

void tpool_free(tpool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    for (int i = 0; i < p->n_threads && p->scratch; i++) free(p->scratch[i]);
    free(p->scratch);
    free(p->scratch_size);
    free(p);
}

void *tpool_scratch(tpool *p, int ith, size_t size)
{
    if (!p || ith < 0 || ith >= p->n_threads) return NULL;
    if (p->scratch_size[ith] < size) {
        /* grow geometrically from 256 KiB, so a job whose need creeps up (attention over a
         * growing context) reallocates a handful of times per session, not every few tokens */
        size_t grow = 2 * p->scratch_size[ith];
        if (grow < ((size_t)256 << 10)) grow = (size_t)256 << 10;
        if (size < grow) size = grow;
        free(p->scratch[ith]);
        size = (size + 63) & ~(size_t)63;
        p->scratch[ith] = aligned_alloc(64, size);
        p->scratch_size[ith] = p->scratch[ith] ? size : 0;
    }
    return p->scratch[ith];
}

int tpool_size(const tpool *p)
{
    return p ? p->n_threads : 1;
}

void tpool_set_cancel(tpool *p, int (*cancel)(void *ud), void *ud)
{
    if (!p) return;
    p->cancel = cancel;
    p->cancel_ud = ud;
}

void tpool_set_spin(tpool *p, int worker_iters, int caller_iters)
{
    if (!p) return;
    if (worker_iters >= 0) atomic_store_explicit(&p->spin_worker, worker_iters, memory_order_relaxed);
    if (caller_iters >= 0) atomic_store_explicit(&p->spin_caller, caller_iters, memory_order_relaxed);
}

int tpool_cancelled(const tpool *p)
{
    return p && p->cancel && p->cancel(p->cancel_ud);
}

/* Post fn as the next job, run it on the calling thread, and wait until `need` workers (all of
 * them), or for a shared job the workers that entered it before it was closed, have finished. */
static void run_job(tpool *p, tpool_fn fn, void *arg, int shared)
{
    if (tpool_cancelled(p)) return; /* a stop was asked for: the caller drops the result */
    if (!p || p->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    /* every worker that entered the last job has finished it (we waited), so the word's count is
     * stale. Posting it and then reading sleepers pairs with a worker's sleepers increment and then
     * its read of the word: one of the two must see the other's write. The post is an exchange, a
     * read-modify-write, not a seq_cst store: C11 orders either, but qemu-aarch64 (7.2) on an
     * x86-64 host runs stlr; ldar as a plain store and load, and the load passed the store (a
     * store-buffer litmus test there: both loads read 0 in 300 of 200,000 tries, none with
     * exchanges) — a worker slept through its job and make test hung. */
    uint64_t s = atomic_load(&p->job);
    (void)atomic_exchange(&p->job, (uint64_t)(JOB_GEN(s) + 1u) << 32);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->n_threads);
    int need = p->n_threads - 1;
    if (shared) need = JOB_ENTERED(atomic_fetch_or(&p->job, JOB_CLOSED));
    /* Spin briefly (workers finish within microseconds when they have cores), then sleep until
     * the last worker signals: on an oversubscribed machine (more threads than free cores) a
     * yield loop would burn CPU time, and the core, that a preempted worker needs. */
    int spin = atomic_load_explicit(&p->spin_caller, memory_order_relaxed);
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < need; spins++) {
        if (spins < spin) {
            cpu_relax();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        (void)atomic_exchange(&p->waiting, 1); /* then read done: an exchange, as the post above */
        while (atomic_load(&p->done) < need) pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->waiting, 0);
        pthread_mutex_unlock(&p->mu);
        break;
    }
}

void tpool_run(tpool *p, tpool_fn fn, void *arg) { run_job(p, fn, arg, 0); }

void tpool_run_shared(tpool *p, tpool_fn fn, void *arg) { run_job(p, fn, arg, 1); }

void tpool_split(long n, int ith, int nth, long *lo, long *hi)
{
    long base = n / nth, rem = n % nth;
    *lo = ith * base + (ith < rem ? ith : rem);
    *hi = *lo + base + (ith < rem ? 1 : 0);
}
