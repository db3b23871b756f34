/* probe: the machine's limits for benchmarks — a read-bandwidth pass and an FP32 FMA-throughput loop, at the kernel level in use. */
#ifndef KV_PROBE_H
#define KV_PROBE_H

#include <stddef.h>
#include <stdint.h>

/* Reads bytes (a multiple of 256, buf 64-byte aligned) of buf once, front to back, with the
 * widest loads of the kernel level in use (kern()), summing them as 64-bit integers (the read
 * kernel of STREAM-like bandwidth tests, McCalpin 1995: no stores, several independent
 * accumulators so that only memory limits it). Returns the sum (so that the reads happen). */
uint64_t kern_probe_read(const void *buf, size_t bytes);

struct tpool;
/* kern_probe_read of bytes (a multiple of 4096, buf 4096-byte aligned) split by 4 KiB pages over
 * the threads of pool: one pass of the machine's read bandwidth with those threads (time it
 * around the call). Returns the threads' sums added (so that the reads happen). */
uint64_t kern_probe_read_pool(struct tpool *pool, const void *buf, size_t bytes);

/* Runs iters steps of 12 independent chains of FP32 fused multiply-adds of the level's widest
 * vectors (enough chains to cover the FMA latency on every x86-64 and aarch64 core), and returns
 * the floating-point operations done (2 per lane per FMA); *sink receives a value of the chains so
 * that they are computed. The portable level counts a multiply and an add as 2 operations. */
double kern_probe_fma(long iters, float *sink);

/* The per-level versions (probe_avx2.c, probe_avx512.c; each a stub returning 0 in a build for
 * another architecture). */
uint64_t kern_probe_read_avx2(const void *buf, size_t bytes);
double kern_probe_fma_avx2(long iters, float *sink);
uint64_t kern_probe_read_avx512(const void *buf, size_t bytes);
double kern_probe_fma_avx512(long iters, float *sink);

#endif
