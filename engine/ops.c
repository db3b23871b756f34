/* ops: the forward pass's operations on model tensors — norms, RoPE, matmul scheduling and weight packing, attention tiling; the arithmetic lives in engine/kernels/. */
#include "ops.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kernels/quant.h"

void op_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    /* the squares (exact in double) summed in four interleaved partial sums: one serial chain of
     * n double adds took 4 cycles per element (n_embd 896-2048: 1-2.5 us per norm, 3% of a small
     * model's prefill) */
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)x[i] * x[i];
        s1 += (double)x[i + 1] * x[i + 1];
        s2 += (double)x[i + 2] * x[i + 2];
        s3 += (double)x[i + 3] * x[i + 3];
    }
    for (; i < n; i++) s0 += (double)x[i] * x[i];
    double ss = (s0 + s1) + (s2 + s3);
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void op_rope_cache(float *cs, int pos, int n_rot, float freq_base, const float *freq_factors)
{
    /* theta_i = pos * base^(-2i/n_rot), evaluated as the reference (ggml) does: in single
     * precision by repeated multiplication with base^(-2/n_rot). A double-precision angle
     * differs from it by ~1e-4 rad at positions in the hundreds, which is enough to flip the
     * 8-bit rounding of activations in quantized matmuls and move logits by ~0.1. */
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        float t = freq_factors ? theta / freq_factors[i] : theta;
        cs[2 * i] = cosf(t);
        cs[2 * i + 1] = sinf(t);
        theta *= theta_scale;
    }
}

void op_rope(float *vec, int n_head, int head_dim, int n_rot, const float *cs, int neox)
{
    int half = n_rot / 2;
    for (int h = 0; h < n_head; h++) {
        float *v = vec + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

void op_rope_shift(float *vec, int n_head, int head_dim, int n_rot, int delta, float freq_base,
                   const float *freq_factors, int neox)
{
    float cs[1024];
    if (n_rot > 1024 || delta == 0) {
        if (delta == 0) return;
        /* never happens for real models (n_rot <= head_dim <= 256): rotate pair by pair */
        for (int i = 0; i < n_rot / 2; i++) {
            float c2[2];
            double theta = (double)delta * pow((double)freq_base, -2.0 * i / n_rot);
            if (freq_factors) theta /= freq_factors[i];
            c2[0] = (float)cos(theta), c2[1] = (float)sin(theta);
            for (int h = 0; h < n_head; h++) {
                float *v = vec + (size_t)h * head_dim;
                int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c2[0] - x1 * c2[1];
                v[b] = x0 * c2[1] + x1 * c2[0];
            }
        }
        return;
    }
    op_rope_cache(cs, delta, n_rot, freq_base, freq_factors);
    op_rope(vec, n_head, head_dim, n_rot, cs, neox);
}

void op_softmax(float *x, int n) { kern_softmax(x, n); }

void op_swiglu(float *gate, const float *up, int n) { kern_swiglu(gate, up, n); }

typedef struct swiglu_job {
    float *gate;
    const float *up;
    size_t n;
} swiglu_job;

static void swiglu_worker(void *arg, int ith, int nth)
{
    const swiglu_job *j = arg;
    long lo, hi;
    tpool_split((long)(j->n / 16), ith, nth, &lo, &hi); /* parts of whole 64-byte lines */
    size_t a = (size_t)lo * 16, b = ith == nth - 1 ? j->n : (size_t)hi * 16;
    if (b > a) op_swiglu(j->gate + a, j->up + a, (int)(b - a));
}

void op_swiglu_pool(float *gate, const float *up, size_t n, tpool *pool)
{
    swiglu_job j = {gate, up, n};
    if (n < 2048 || tpool_size(pool) < 2) swiglu_worker(&j, 0, 1);
    else tpool_run(pool, swiglu_worker, &j);
}

size_t op_matmul_scratch_size(const gguf_tensor *w, int n_tokens)
{
    /* prepared activation rows (64-byte aligned inside the buffer) */
    return (size_t)n_tokens * quant_act_row_size(w->type, w->ne[0]) + 64;
}

typedef struct matmul_job {
    const gguf_tensor *w;
    const float *x;
    float *y;
    int n_tokens;
    int64_t n_in, n_out;
    size_t w_row_bytes, act_row_bytes;
    uint8_t *act;
    const uint8_t *rows;        /* GGUF-layout rows: the mapped tensor or its copy (op_weights_pack) */
    const void *panels;         /* the tensor packed in panels (op_weights_pack), or NULL */
    long chunk_rows, n_chunks;  /* work sharing: rows per chunk (a multiple of the panel height) */
    atomic_long next;           /* next chunk to take */
    const tpool *pool;          /* its cancellation (tpool_set_cancel) is polled between chunks */
} matmul_job;

static void matmul_prepare(void *arg, int ith, int nth)
{
    matmul_job *j = arg;
    long lo, hi;
    tpool_split(j->n_tokens, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) quant_act_prepare(j->w->type, j->x + t * j->n_in, j->n_in, j->act + t * j->act_row_bytes);
}

/* The rows are cut into chunks that the threads take in turn from a shared counter, so a
 * thread that the OS preempts (a busy machine) delays the matmul by one chunk, not by half of it.
 * Packed weights run the panel kernels for decode and batches alike; GGUF rows stream through
 * quant_gemv (decode) or quant_gemm (batch). */
/* Chunk c of j: its rows through the kernels. */
static void matmul_chunk(matmul_job *j, long c)
{
    long lo = c * j->chunk_rows, hi = lo + j->chunk_rows < j->n_out ? lo + j->chunk_rows : j->n_out;
    const uint8_t *w = j->rows + (size_t)lo * j->w_row_bytes;
    if (j->panels)
        quant_gemm_packed(j->w->type, j->n_in, lo, hi - lo, j->panels, j->act, j->act_row_bytes, j->n_tokens,
                          j->y + lo, (size_t)j->n_out);
    else if (j->n_tokens == 1)
        quant_gemv(j->w->type, j->n_in, hi - lo, w, j->w_row_bytes, j->act, j->y + lo);
    else
        quant_gemm(j->w->type, j->n_in, hi - lo, w, j->w_row_bytes, j->act, j->act_row_bytes, j->n_tokens,
                   j->y + lo, (size_t)j->n_out);
}

static void matmul_rows(void *arg, int ith, int nth)
{
    matmul_job *j = arg;
    (void)ith;
    (void)nth;
    for (long c; (c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_chunks;) {
        if (c > 0 && tpool_cancelled(j->pool)) break; /* a stop: the caller drops y */
        matmul_chunk(j, c);
    }
}

long op_matmul_chunk_rows(size_t row_bytes, int64_t n_in, int64_t n_out, int n_tokens, int nth, int split)
{
    long rows = (long)((65536 + row_bytes - 1) / row_bytes), by_count = split ? (long)(n_out / (8 * nth)) : 0;
    rows = nth == 1 ? (long)n_out : rows > by_count ? rows : by_count;
    /* and at most ~2^26 multiply-adds (a fraction of a millisecond with the SIMD kernels), with one
     * thread too: a stop (Esc, a client gone) waits for one chunk per thread, and a long prefill's
     * chunks had been 1-2 G */
    long by_work = (long)(((int64_t)1 << 26) / (n_in * (n_tokens > 0 ? n_tokens : 1)));
    if (by_work < rows) rows = by_work;
    rows = (rows + QUANT_PANEL_ROWS - 1) / QUANT_PANEL_ROWS * QUANT_PANEL_ROWS;
    if (rows < QUANT_PANEL_ROWS) rows = QUANT_PANEL_ROWS;
    return rows < n_out ? rows : (long)n_out;
}

/* The job of w · x (n_tokens rows) into y, act not yet set: row sizes, the packed panels or rows,
 * and the chunks (op_matmul_chunk_rows, about 8 per thread). */
static void matmul_job_init(matmul_job *j, const gguf_tensor *w, const float *x, int n_tokens, float *y, tpool *pool)
{
    int64_t n_in = w->ne[0], n_out = w->ne[1];
    *j = (matmul_job){
        .w = w, .x = x, .y = y, .n_tokens = n_tokens, .n_in = n_in, .n_out = n_out,
        .w_row_bytes = quant_row_size(w->type, n_in),
        .act_row_bytes = quant_act_row_size(w->type, n_in),
        .rows = w->data, .pool = pool,
    };
    const void *pk = op_weights_of(w);
    if (pk && quant_pack_size(w->type, n_in, n_out)) j->panels = pk;
    else if (pk) j->rows = pk; /* a plain copy of the rows */
    j->chunk_rows = op_matmul_chunk_rows(j->w_row_bytes, n_in, n_out, n_tokens, tpool_size(pool), 1);
    j->n_chunks = (n_out + j->chunk_rows - 1) / j->chunk_rows;
}

void op_matmul(const gguf_tensor *w, const float *x, int n_tokens, float *y, void *scratch, tpool *pool)
{
    matmul_job j;
    matmul_job_init(&j, w, x, n_tokens, y, pool);
    j.act = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    atomic_init(&j.next, 0);
    /* a few rows (decode, a batched decode step) are converted here: a pool dispatch would cost more */
    if (n_tokens > 8) tpool_run(pool, matmul_prepare, &j);
    else matmul_prepare(&j, 0, 1);
    tpool_run_shared(pool, matmul_rows, &j);
}

size_t op_matmul_multi_scratch_size(const gguf_tensor *const *ws, int n, int n_tokens)
{
    size_t s = 64;
    for (int i = 0; i < n; i++)
        s += ((size_t)n_tokens * quant_act_row_size(ws[i]->type, ws[i]->ne[0]) + 63) & ~(size_t)63;
    return s;
}

/* One pass over several matrices of one input (a decode step: one token, or one per sequence of
 * a batch): chunks numbered across the matrices (each matrix's chunking as op_matmul's), or, with
 * swiglu, chunk c is the same rows of both matrices and then their SwiGLU, token by token. */
typedef struct multi_job {
    matmul_job m[OP_MULTI_MAX];
    int n, swiglu;
    long first[OP_MULTI_MAX + 1]; /* first global chunk of each matrix; first[n] = the total */
    atomic_long next;
} multi_job;

static void multi_worker(void *arg, int ith, int nth)
{
    multi_job *mj = arg;
    (void)ith;
    (void)nth;
    for (long c; (c = atomic_fetch_add_explicit(&mj->next, 1, memory_order_relaxed)) < mj->first[mj->n];) {
        if (c > 0 && tpool_cancelled(mj->m[0].pool)) break; /* a stop: the caller drops y */
        if (mj->swiglu) {
            matmul_job *g = &mj->m[0];
            matmul_chunk(g, c);
            matmul_chunk(&mj->m[1], c);
            long lo = c * g->chunk_rows, hi = lo + g->chunk_rows < g->n_out ? lo + g->chunk_rows : g->n_out;
            for (int t = 0; t < g->n_tokens; t++)
                op_swiglu(g->y + (size_t)t * g->n_out + lo, mj->m[1].y + (size_t)t * g->n_out + lo, (int)(hi - lo));
            continue;
        }
        int i = 0;
        while (c >= mj->first[i + 1]) i++;
        matmul_chunk(&mj->m[i], c - mj->first[i]);
    }
}

int op_matmul_multi(const gguf_tensor *const *ws, int n, const float *x, int n_tokens, float *const *ys, int swiglu,
                    void *scratch, tpool *pool)
{
    if (n < 1 || n > OP_MULTI_MAX || n_tokens < 1 || n_tokens > OP_MULTI_MAX_TOKENS ||
        (swiglu && (n != 2 || ws[0]->ne[1] != ws[1]->ne[1])))
        return -1;
    multi_job mj = {.n = n, .swiglu = swiglu};
    uint8_t *a = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    mj.first[0] = 0;
    for (int i = 0; i < n; i++) {
        const gguf_tensor *w = ws[i];
        if (w->ne[0] != ws[0]->ne[0]) return -1;
        matmul_job *j = &mj.m[i];
        matmul_job_init(j, w, x, n_tokens, ys[i], pool);
        /* the activation rows once per weight type */
        for (int k = 0; k < i && !j->act; k++)
            if (ws[k]->type == w->type) j->act = mj.m[k].act;
        if (!j->act) {
            j->act = a;
            a += ((size_t)n_tokens * j->act_row_bytes + 63) & ~(size_t)63;
            matmul_prepare(j, 0, 1);
        }
        /* op_matmul's chunks (with swiglu both matrices take the first one's) */
        if (swiglu && i == 1) {
            j->chunk_rows = mj.m[0].chunk_rows;
            j->n_chunks = mj.m[0].n_chunks;
        }
        mj.first[i + 1] = swiglu ? j->n_chunks : mj.first[i] + j->n_chunks;
    }
    atomic_init(&mj.next, 0);
    tpool_run_shared(pool, multi_worker, &mj);
    return 0;
}

void op_get_row(const gguf_tensor *w, int64_t row, float *dst)
{
    size_t rb = quant_row_size(w->type, w->ne[0]);
    quant_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)row * rb, dst, w->ne[0]);
}

/* What op_weights_pack does with a matrix: 1 = panels (quant_pack), 2 = a plain copy of the rows
 * (a copy in anonymous memory on 2 MiB pages streams faster than the file mapping's 4 KiB page-
 * cache pages: fewer TLB misses, prefetch streams not cut every 4 KiB), 0 = nothing. */
static int pack_kind(const gguf_tensor *w, size_t *bytes, int experts)
{
    *bytes = 0;
    if (w->n_dims == 3 && !experts) return 0;
    /* a 3-D tensor of experts is packed as one matrix of ne1 * ne2 rows when every expert's matrix
     * is whole panels (so expert e's panels start at e * pack_size(ne1 rows), engine/moe.c) and the
     * experts are to be packed at all (op_weights_pack) */
    if (w->n_dims == 3 && w->ne[3] == 1 && w->ne[1] % QUANT_PANEL_ROWS == 0)
        return (*bytes = quant_pack_size(w->type, w->ne[0], w->ne[1] * w->ne[2])) ? 1 : 0;
    if (w->n_dims != 2) return 0;
    if ((*bytes = quant_pack_size(w->type, w->ne[0], w->ne[1]))) return 1;
    if (w->nbytes < (1u << 20)) return 0; /* small matrices stay in the mapping */
    *bytes = w->nbytes;
    return 2;
}

/* One piece of the packing work: rows [r0, r1) of tensor t into the arena at dst. */
typedef struct pack_item {
    gguf_tensor *t;
    int kind;
    int64_t r0, r1;
    uint8_t *dst;
} pack_item;

typedef struct pack_job {
    pack_item *items;
    long n_items;
    atomic_long next;
    long page;
    int fd;          /* the model file opened again, or -1: the rows are read from the mapping */
    uint64_t base;   /* file offset of the mapping's byte 0 (0) */
    const uint8_t *map;
    tpool *pool;     /* for per-thread read buffers (tpool_scratch) */
} pack_job;

/* Read n bytes at file offset off into dst; 0 when all were read. */
static int read_at(int fd, void *dst, size_t n, uint64_t off)
{
    uint8_t *d = dst;
    while (n) {
        ssize_t k = pread(fd, d, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        d += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* The model file again, by path, for pread: -1 when it cannot be opened or is no longer the
 * mapped file (another inode or size), so the rows are then read from the mapping. */
static int reopen_model(const gguf_file *f)
{
    struct stat st;
    int fd = f->path && f->ino ? open(f->path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd >= 0 && (fstat(fd, &st) || (uint64_t)st.st_dev != f->dev || (uint64_t)st.st_ino != f->ino ||
                    (uint64_t)st.st_size != f->size)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Release the whole pages of [p, p + n) from the process (the page cache keeps the file). */
static void drop_pages(const void *p, size_t n, long page)
{
    uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Rows are read with pread (the copied ones straight into the arena, the packed ones into a
 * per-thread buffer that stays in the cache): mapping the file's pages just to read them once
 * costs a page-table entry, a memory-cgroup charge and an unmap per 4 KiB page. */
static void pack_worker(void *arg, int ith, int nth)
{
    pack_job *j = arg;
    (void)nth;
    for (long i; (i = atomic_fetch_add(&j->next, 1)) < j->n_items;) {
        const pack_item *it = &j->items[i];
        const gguf_tensor *w = it->t;
        size_t rs = quant_row_size(w->type, w->ne[0]), n = (size_t)(it->r1 - it->r0) * rs;
        const uint8_t *src = (const uint8_t *)w->data + (size_t)it->r0 * rs;
        if (j->fd >= 0) {
            uint64_t off = (uint64_t)(src - j->map);
            if (it->kind != 1 && !read_at(j->fd, it->dst, n, off)) continue;
            uint8_t *buf = it->kind == 1 ? tpool_scratch(j->pool, ith, n) : NULL;
            if (buf && !read_at(j->fd, buf, n, off)) {
                quant_pack(w->type, w->ne[0], it->r1 - it->r0, buf, rs, it->dst);
                continue;
            }
        }
        if (it->kind == 1) quant_pack(w->type, w->ne[0], it->r1 - it->r0, src, rs, it->dst);
        else memcpy(it->dst, src, n);
        /* the rows are not read from the mapping again (a tensor also read by rows, like tied
         * token embeddings, faults back just the rows op_get_row reads) */
        drop_pages(src, n, j->page);
    }
}

/* MemAvailable of /proc/meminfo in bytes, 0 when unknown. */
static uint64_t mem_available(void)
{
    FILE *fp = fopen("/proc/meminfo", "r");
    char line[128];
    unsigned long long kb = 0;
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (fp) fclose(fp);
    return (uint64_t)kb * 1024;
}

/* Pack a MoE model's 3-D expert tensors too? Yes when their panels fit in half of the memory
 * available now (prefill then runs the panel GEMM on them); else, or with KVCHAT_MOE_MAPPED=1,
 * they stay in the file mapping, where the pages of experts that are not used stay reclaimable
 * page cache and decode faults in only the selected experts' rows. */
static int experts_packable(const gguf_file *f)
{
    const char *env = getenv("KVCHAT_MOE_MAPPED");
    if (env && *env && strcmp(env, "0")) return 0;
    uint64_t need = 0;
    size_t b;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].n_dims == 3 && pack_kind(&f->tensors[i], &b, 1)) need += b;
    if (!need) return 0;
    uint64_t avail = mem_available();
    return avail == 0 || need <= avail / 2;
}

/* Rows per packing work item of w (about `piece` bytes of source rows, whole panels when packed). */
static int64_t pack_step(const gguf_tensor *w, int kind, size_t piece)
{
    int64_t unit = kind == 1 ? QUANT_PANEL_ROWS : 1;
    size_t rs = quant_row_size(w->type, w->ne[0]);
    int64_t step = (int64_t)(piece / (rs * (size_t)unit)) * unit;
    return step < unit ? unit : step;
}

/* An environment variable set to something other than "" or "0". */
static int getenv_flag(const char *name)
{
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0");
}

enum { HUGE_NEVER, HUGE_AT_LOAD, HUGE_AFTER };

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif
#define HUGE_BYTES ((size_t)2 << 20)

/* Packing and copying after the load. The panels (pack kind 1) and the plain copies (kind 2: F16 /
 * BF16 / F32, and the types without panels at this level) exist for speed: panels for the panel
 * kernels, copies for their 2 MiB pages (decode reads them 12-20% faster there than in the page
 * cache's mapping). Until a matrix's panels or copy are complete the forward pass reads its rows in
 * the mapping — a plain copy's same bytes through the same kernels; a panel type's rows through
 * quant_gemv / quant_gemm, which pack them into a scratch panel and run the same panel kernel — so
 * the results are the same bit for bit either way, and the first token does not wait for fresh
 * memory to be faulted in (on a VM that hands freed memory back to its host, 1-2 s for 2 GB after
 * an idle minute). Each matrix is published (op_weights_of) when its last chunk is done, and its
 * mapped pages are then dropped, so resident memory never holds two copies.
 * The same job moves an arena packed at load onto 2 MiB pages after it (KVCHAT_HUGEPAGES=after):
 * MADV_COLLAPSE, one 2 MiB piece per chunk. Faulting 2 MiB pages as the arena is filled (the
 * default) costs each of them a fresh, zeroed huge page then; "after" faults 4 KiB pages and the
 * collapse copies them later. */
typedef struct later_tensor {
    gguf_tensor *t;
    int kind;         /* 1 panels, 2 copy (pack_kind) */
    uint8_t *dst;
    atomic_long left; /* chunks not yet done */
} later_tensor;

typedef struct later_chunk {
    int ti;         /* its tensor, or -1: 2 MiB piece r0 of the arena, to be collapsed */
    int64_t r0, r1; /* its rows (whole panels when packed) */
} later_chunk;

typedef struct later_job {
    const void *arena; /* the arena this job fills (op_weights_settle / op_weights_free find it by it) */
    int passes;        /* forward passes begun (op_weights_pass), under later_mu */
    int running;       /* passes begun and not yet ended, under later_mu */
    int hurry;         /* being finished or stopped (later_finish): start at once, under later_mu */
    later_tensor *tensors;
    later_chunk *chunks;
    long n_chunks;
    atomic_long next;
    atomic_int stop;
    int fd; /* the model file again (pread), or -1: the rows are read in the mapping */
    const uint8_t *map;
    long page;
    pthread_t th;
    int started;
    struct later_job *link;
} later_job;

static pthread_mutex_t later_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t later_cv = PTHREAD_COND_INITIALIZER; /* a pass ended, or a job is hurried */
static later_job *later_list;

/* How long the packing thread waits for a first pass to begin before it starts anyway (a chat
 * waiting for the user's first message), ms */
#define LATER_IDLE_MS 100

/* Source bytes per chunk, packed (kind 1) or copied (kind 2): a stop waits for one such chunk.
 * Packed chunks are read into a buffer of LATER_PIECE: with 8 MiB, TinyLlama Q8_0 -p Hello -n 1
 * exited ~35 ms after its last token (the chunk then being read faulted in the fresh buffer too).
 * Copies are read straight into the arena, where two threads settling 1 MiB pieces side by side
 * met in the same 2 MiB pages: TinyLlama F16's copies took 190-210 ms instead of 140-150. */
#define LATER_PIECE ((size_t)1 << 20)
#define LATER_COPY_PIECE ((size_t)8 << 20)
#define later_piece(kind) ((kind) == 1 ? LATER_PIECE : LATER_COPY_PIECE)

const void *op_weights_of(const gguf_tensor *w)
{
    return __atomic_load_n(&w->packed, __ATOMIC_ACQUIRE);
}

/* Do the next chunk; 0 when none is left or the job was stopped. buf (cap bytes, or NULL) takes
 * the source rows of a packed chunk read with pread; without it they are packed from the mapping. */
static int later_next(later_job *c, uint8_t *buf, size_t cap)
{
    if (atomic_load(&c->stop)) return 0;
    long i = atomic_fetch_add(&c->next, 1);
    if (i >= c->n_chunks) return 0;
    const later_chunk *k = &c->chunks[i];
    if (k->ti < 0) {
        uint8_t *piece = (uint8_t *)c->arena + (size_t)k->r0 * HUGE_BYTES;
        if (madvise(piece, HUGE_BYTES, MADV_COLLAPSE) && (errno == EINVAL || errno == ENOSYS)) {
            atomic_store(&c->stop, 1); /* a kernel without MADV_COLLAPSE: nothing more to do */
            return 0;
        }
        return 1;
    }
    later_tensor *lt = &c->tensors[k->ti];
    const gguf_tensor *w = lt->t;
    size_t rs = quant_row_size(w->type, w->ne[0]), n = (size_t)(k->r1 - k->r0) * rs;
    const uint8_t *src = (const uint8_t *)w->data + (size_t)k->r0 * rs;
    uint64_t off = (uint64_t)(src - c->map);
    if (lt->kind == 1) {
        uint8_t *dst = lt->dst + (size_t)(k->r0 / QUANT_PANEL_ROWS) * quant_pack_size(w->type, w->ne[0], QUANT_PANEL_ROWS);
        if (buf && n <= cap && c->fd >= 0 && !read_at(c->fd, buf, n, off)) src = buf;
        quant_pack(w->type, w->ne[0], k->r1 - k->r0, src, rs, dst);
    } else if (c->fd < 0 || read_at(c->fd, lt->dst + (size_t)k->r0 * rs, n, off))
        memcpy(lt->dst + (size_t)k->r0 * rs, src, n);
    if (atomic_fetch_sub(&lt->left, 1) == 1) {
        __atomic_store_n(&lt->t->packed, (const void *)lt->dst, __ATOMIC_RELEASE);
        /* a pass that took the mapping's address just before faults back what it still reads */
        drop_pages(w->data, w->nbytes, c->page);
    }
    return 1;
}

/* nice 19: the first token's passes get the CPUs, the packing takes what they leave (the chat's
 * idle time; with every CPU decoding, ~1.5% of a core). Not SCHED_IDLE: a collapse holds the mmap
 * lock while it copies a piece, and a thread that may be starved indefinitely must not hold what
 * the matmul threads' page faults wait for. */
static void *later_main(void *arg)
{
    later_job *c = arg;
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    /* not while the first pass runs: at nice 19 it still takes the CPU whenever the pass's workers
     * yield between steps, and its fresh pages and reads compete with the pass (TinyLlama Q6_K
     * -p Hello: TTFT 232-275 ms waiting vs 290-418 ms not); the second pass hurries it */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += LATER_IDLE_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&later_mu);
    while (!c->hurry && (c->running > 0 || c->passes == 0)) {
        if (c->passes > 0) pthread_cond_wait(&later_cv, &later_mu);
        else if (pthread_cond_timedwait(&later_cv, &later_mu, &until) == ETIMEDOUT && c->passes == 0) break;
    }
    pthread_mutex_unlock(&later_mu);
    size_t cap = LATER_PIECE;
    uint8_t *buf = malloc(cap);
    while (later_next(c, buf, buf ? cap : 0)) {}
    free(buf);
    return NULL;
}

static void later_job_free(later_job *c)
{
    if (c->fd >= 0) close(c->fd);
    free(c->tensors);
    free(c->chunks);
    free(c);
}

/* The later job of arena, unlinked (NULL when none). */
static later_job *later_take(const void *arena)
{
    pthread_mutex_lock(&later_mu);
    later_job **pp = &later_list, *c;
    while ((c = *pp) && c->arena != arena) pp = &c->link;
    if (c) *pp = c->link;
    pthread_mutex_unlock(&later_mu);
    return c;
}

/* Finish the job on the calling thread too (stop = 0) or stop it after the chunks in flight
 * (stop = 1), join the thread and free the job. */
static void later_finish(later_job *c, int stop)
{
    if (!c) return;
    if (stop) atomic_store(&c->stop, 1);
    pthread_mutex_lock(&later_mu);
    c->hurry = 1; /* the thread, if still waiting, starts (or, stopped, ends) now */
    pthread_cond_broadcast(&later_cv);
    pthread_mutex_unlock(&later_mu);
    if (!stop)
        while (later_next(c, NULL, 0)) {}
    if (c->started) pthread_join(c->th, NULL);
    later_job_free(c);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

/* The first pass reads the later job's matrices in the mapping: their page-table entries are made
 * beforehand (MADV_POPULATE_READ), by all CPUs, which costs less than a page fault per 4 KiB page
 * in the pass (TinyLlama Q6_K -p Hello -n 1 after 3 idle s: 0.30-0.37 s vs 0.38-0.48 s of wall
 * time): one madvise per run of a tensor's chunks within a group of POPULATE_GROUP (one per chunk
 * had cost TinyLlama F16's load 15-20 ms more than per 8 MiB). Kernels without it: nothing happens. */
#define POPULATE_GROUP 8

typedef struct populate_job {
    const later_job *lj;
    atomic_long next; /* the next group */
} populate_job;

static void populate_worker(void *arg, int ith, int nth)
{
    populate_job *pj = arg;
    const later_job *lj = pj->lj;
    (void)ith;
    (void)nth;
    for (long g; (g = atomic_fetch_add(&pj->next, 1)) * POPULATE_GROUP < lj->n_chunks;) {
        long i = g * POPULATE_GROUP, end = i + POPULATE_GROUP < lj->n_chunks ? i + POPULATE_GROUP : lj->n_chunks;
        while (i < end) {
            const later_chunk *k = &lj->chunks[i]; /* a packing job's: every chunk has its tensor */
            long j = i + 1;
            while (j < end && lj->chunks[j].ti == k->ti && lj->chunks[j].r0 == lj->chunks[j - 1].r1) j++;
            const gguf_tensor *w = lj->tensors[k->ti].t;
            size_t rs = quant_row_size(w->type, w->ne[0]), page = (size_t)lj->page;
            uintptr_t a = (uintptr_t)w->data + (size_t)k->r0 * rs,
                      b = (uintptr_t)w->data + (size_t)lj->chunks[j - 1].r1 * rs;
            a &= ~(uintptr_t)(page - 1);
            if (madvise((void *)a, b - a, MADV_POPULATE_READ) && errno == EINVAL) return;
            i = j;
        }
    }
}

/* KVCHAT_PACK_LATER: 1 (default) pack and copy the matrices after the load, 0 during it. */
static int later_policy(void)
{
    const char *e = getenv("KVCHAT_PACK_LATER");
    return !(e && !strcmp(e, "0"));
}

/* Start lj's thread (or, without one, do its chunks now) and list it for op_weights_settle / _free. */
static void later_start(later_job *lj)
{
    atomic_init(&lj->next, 0);
    atomic_init(&lj->stop, 0);
    lj->started = pthread_create(&lj->th, NULL, later_main, lj) == 0;
    if (!lj->started) {
        later_finish(lj, 0);
        return;
    }
    pthread_mutex_lock(&later_mu);
    lj->link = later_list;
    later_list = lj;
    pthread_mutex_unlock(&later_mu);
}

void op_weights_settle(void *arena)
{
    later_finish(later_take(arena), 0);
}

void op_weights_pass(void *arena, int begin)
{
    if (!arena) return;
    pthread_mutex_lock(&later_mu);
    later_job *c = later_list;
    while (c && c->arena != arena) c = c->link;
    int settle = 0;
    if (c && begin) {
        settle = c->passes++ > 0;
        c->running++;
    } else if (c && c->running > 0 && --c->running == 0)
        pthread_cond_broadcast(&later_cv);
    pthread_mutex_unlock(&later_mu);
    if (settle) later_finish(later_take(arena), 0);
}

/* KVCHAT_HUGEPAGES: 0 never, 1 at load (default), after: ask for huge pages after packing. On the
 * idle 2-core VM the later collapse cost more than it saved: one-shot TinyLlama Q4_0 decoded 128
 * tokens at 36-50 t/s while the collapse ran vs 60-75 t/s with 2 MiB pages from the load, whose
 * load-to-first-token wall time was no longer (0.50-1.03 s vs 0.47-0.80 s; llama-simple 0.67-0.73). */
static int huge_policy(void)
{
    const char *e = getenv("KVCHAT_HUGEPAGES");
    if (e && !strcmp(e, "after")) return HUGE_AFTER;
    return e && !strcmp(e, "0") ? HUGE_NEVER : HUGE_AT_LOAD;
}

int op_weights_pack(gguf_file *f, const gguf_tensor *skip, void **arena, kv_error *err)
{
    *arena = NULL;
    size_t total = 0, bytes;
    long n_items = 0, n_chunks = 0;
    int n_later = 0;
    const size_t piece = (size_t)1 << 20; /* about 1 MiB of source rows per work item at load */
    int experts = experts_packable(f), kd, hp = huge_policy();
    /* after the load (later_job above), unless the arena is to be collapsed later */
    int later = later_policy() && hp != HUGE_AFTER;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (&f->tensors[i] != skip && (kd = pack_kind(&f->tensors[i], &bytes, experts))) {
            /* exactly the items and chunks the loop below makes */
            int64_t rows = f->tensors[i].ne[1] * f->tensors[i].ne[2];
            int64_t step = pack_step(&f->tensors[i], kd, piece), lstep = pack_step(&f->tensors[i], kd, later_piece(kd));
            total += (bytes + 63) & ~(size_t)63;
            n_items += (long)((rows + step - 1) / step);
            n_chunks += (long)((rows + lstep - 1) / lstep);
            n_later++;
        }
    if (!total) return KV_OK;
    size_t huge = (size_t)2 << 20, alloc = (total + huge - 1) & ~(huge - 1);
    uint8_t *p = aligned_alloc(huge, alloc);
    pack_item *items = malloc(sizeof *items * (size_t)n_items);
    if (!p || !items) {
        free(p);
        free(items);
        return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory for %zu MiB of repacked weights", f->path,
                            total >> 20);
    }
    if (hp == HUGE_AT_LOAD) madvise(p, alloc, MADV_HUGEPAGE);
    else madvise(p, alloc, MADV_NOHUGEPAGE);
    later_job *lj = later ? calloc(1, sizeof *lj) : NULL;
    if (lj) {
        lj->fd = -1;
        lj->tensors = calloc((size_t)n_later, sizeof *lj->tensors);
        lj->chunks = malloc(sizeof *lj->chunks * (size_t)n_chunks);
        if (!lj->tensors || !lj->chunks) { /* then all of it now, by the pool */
            later_job_free(lj);
            lj = NULL;
        }
    }
    /* cut every tensor into pieces of whole panels (packed) or rows (copied): work items of the
     * pool now, or chunks of the later job, published by later_next once done */
    size_t off = 0;
    long k = 0, c = 0;
    int n_lt = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *w = &f->tensors[i];
        int kind = w != skip ? pack_kind(w, &bytes, experts) : 0;
        if (!kind) continue;
        int64_t rows = w->ne[1] * w->ne[2];
        if (lj) {
            later_tensor *lt = &lj->tensors[n_lt];
            int64_t step = pack_step(w, kind, later_piece(kind));
            long nc = 0;
            for (int64_t r0 = 0; r0 < rows && c < n_chunks; r0 += step, nc++)
                lj->chunks[c++] = (later_chunk){n_lt, r0, r0 + step < rows ? r0 + step : rows};
            lt->t = w;
            lt->kind = kind;
            lt->dst = p + off;
            atomic_init(&lt->left, nc);
            n_lt++;
        } else {
            int64_t unit = kind == 1 ? QUANT_PANEL_ROWS : 1, step = pack_step(w, kind, piece);
            size_t unit_bytes = kind == 1 ? quant_pack_size(w->type, w->ne[0], QUANT_PANEL_ROWS)
                                          : quant_row_size(w->type, w->ne[0]);
            for (int64_t r0 = 0; r0 < rows && k < n_items; r0 += step) {
                int64_t r1 = r0 + step < rows ? r0 + step : rows;
                items[k++] = (pack_item){w, kind, r0, r1, p + off + (size_t)(r0 / unit) * unit_bytes};
            }
            w->packed = p + off;
        }
        off += (bytes + 63) & ~(size_t)63;
    }
    long page = sysconf(_SC_PAGESIZE);
    if (k) {
        /* a pool of all CPUs for the load (zeroing the new pages and reading the file are the cost) */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        tpool *pool = tpool_create(ncpu > 1 ? (int)ncpu : 1);
        pack_job job = {.items = items, .n_items = k, .page = page, .fd = -1, .map = f->map, .pool = pool};
        if (pool && !getenv_flag("KVCHAT_PACK_MMAP")) job.fd = reopen_model(f);
        atomic_init(&job.next, 0);
        tpool_run(pool, pack_worker, &job);
        tpool_free(pool);
        if (job.fd >= 0) close(job.fd);
    }
    free(items);
    if (lj) {
        lj->arena = p;
        lj->n_chunks = c;
        lj->map = f->map;
        lj->page = page;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        tpool *pool = tpool_create(ncpu > 1 ? (int)ncpu : 1);
        populate_job pj = {.lj = lj};
        atomic_init(&pj.next, 0);
        if (pool) tpool_run(pool, populate_worker, &pj);
        tpool_free(pool);
        lj->fd = getenv_flag("KVCHAT_PACK_MMAP") ? -1 : reopen_model(f);
        later_start(lj);
    }
    if (hp == HUGE_AFTER) { /* later_job above: the arena's 2 MiB pieces */
        madvise(p, alloc, MADV_HUGEPAGE);
        later_job *cj = calloc(1, sizeof *cj);
        long n = (long)(alloc / HUGE_BYTES);
        if (cj && (cj->chunks = malloc(sizeof *cj->chunks * (size_t)n))) {
            for (long i = 0; i < n; i++) cj->chunks[i] = (later_chunk){-1, i, i + 1};
            cj->arena = p;
            cj->n_chunks = n;
            cj->fd = -1;
            cj->page = page;
            later_start(cj);
        } else
            free(cj);
    }
    *arena = p;
    return KV_OK;
}

void op_weights_stop(void *arena)
{
    if (arena) later_finish(later_take(arena), 1);
}

void op_weights_free(gguf_file *f, void *arena)
{
    op_weights_stop(arena);
    for (uint64_t i = 0; f && i < f->n_tensors; i++) f->tensors[i].packed = NULL;
    free(arena);
}

/* ---- attention ------------------------------------------------------------------------------ */

typedef struct attn_job {
    kern_attn a;     /* the operands, as the tile kernels read them */
    int tq, n_tiles; /* queries per tile, tiles per kv head */
    tpool *pool;
    atomic_int next; /* the next (kv head, tile) job to take */
} attn_job;

static size_t attn_scratch_floats(const attn_job *j)
{
    const kern_attn *a = &j->a;
    int G = a->n_head / a->n_head_kv, ld = ((a->pos0 + a->n_tokens + 15) & ~15);
    return (size_t)G * j->tq * ld + (size_t)(a->hd + 15) * 16 + 16;
}

static void attn_worker(void *arg, int ith, int nth)
{
    attn_job *j = arg;
    const kern_attn *a = &j->a;
    const kern_ops *k = kern();
    int n_jobs = a->n_head_kv * j->n_tiles;
    float *S = tpool_scratch(j->pool, ith, sizeof(float) * attn_scratch_floats(j)), *own = NULL;
    if (!S && !(S = own = aligned_alloc(64, sizeof(float) * attn_scratch_floats(j) + 64))) return;
    int ld = (a->pos0 + a->n_tokens + 15) & ~15, G = a->n_head / a->n_head_kv;
    float *KT = S + (size_t)G * j->tq * ld;
    KT = (float *)(((uintptr_t)KT + 63) & ~(uintptr_t)63);
    /* taken in turn from a shared counter (the long, late query tiles of the causal mask spread
     * over the threads; a descheduled thread is not waited for: tpool_run_shared) */
    (void)nth;
    for (int jb, first = 1; (jb = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < n_jobs;
         first = 0) {
        if (!first && tpool_cancelled(j->pool)) break; /* a stop: the caller drops out */
        int g = jb % a->n_head_kv, tile = jb / a->n_head_kv;
        int t0 = tile * j->tq, t1 = t0 + j->tq < a->n_tokens ? t0 + j->tq : a->n_tokens;
        k->attn_tile(a, g, t0, t1, S, ld, KT);
    }
    free(own);
}

void op_attention(const float *q, const float *K, const float *V, float *out, int n_tokens, int pos0, int n_head,
                  int n_head_kv, int head_dim, tpool *pool)
{
    const uint8_t *kb = (const uint8_t *)K, *vb = (const uint8_t *)V; /* one block of contiguous rows */
    op_attention_paged(q, &kb, &vb, 1 << 30, sizeof(float) * (size_t)n_head_kv * head_dim, GGML_TYPE_F32, out,
                       n_tokens, pos0, n_head, n_head_kv, head_dim, pool);
}

void op_attention_paged(const float *q, const uint8_t *const *kb, const uint8_t *const *vb, int bs, size_t row_bytes,
                        int kv_type, float *out, int n_tokens, int pos0, int n_head, int n_head_kv, int head_dim,
                        tpool *pool)
{
    attn_job j = {
        .a = {.q = q, .out = out, .kb = kb, .vb = vb, .bs = bs, .row_bytes = row_bytes, .kv_type = kv_type,
              .n_tokens = n_tokens, .pos0 = pos0, .n_head = n_head, .n_head_kv = n_head_kv, .hd = head_dim,
              .scale = 1.0f / sqrtf((float)head_dim)},
        .pool = pool,
    };
    /* query tiles small enough that a tile's scores (G·tq rows of the context) stay in L2 */
    int G = n_head / n_head_kv, n_kv = pos0 + n_tokens;
    long tq = 65536L / ((long)G * n_kv);
    j.tq = tq < 1 ? 1 : tq > 32 ? 32 : (int)tq;
    if (j.tq > n_tokens) j.tq = n_tokens;
    j.n_tiles = (n_tokens + j.tq - 1) / j.tq;
    atomic_init(&j.next, 0);
    tpool_run_shared(pool, attn_worker, &j);
}

/* Several sequences' paged attention in one pass over the pool: the jobs are (sequence, kv head,
 * query tile) triples of all of them, so a decode step of many sequences pays one thread-pool
 * dispatch per layer, not one per sequence. Each job runs the same tile kernel as
 * op_attention_paged, so the results are bitwise those of one op_attention_paged per sequence. */
typedef struct attn_multi {
    attn_job *jobs;  /* [n]: one per sequence */
    long *first;     /* [n + 1]: index of each sequence's first job */
    int n;
    size_t scratch;  /* floats: the largest of the sequences' */
    tpool *pool;
    atomic_long next; /* the next job to take */
} attn_multi;

static void attn_multi_worker(void *arg, int ith, int nth)
{
    attn_multi *m = arg;
    const kern_ops *k = kern();
    float *S = tpool_scratch(m->pool, ith, sizeof(float) * m->scratch), *own = NULL;
    if (!S && !(S = own = aligned_alloc(64, sizeof(float) * m->scratch + 64))) return;
    int s = 0;
    (void)nth;
    for (long jb; (jb = atomic_fetch_add_explicit(&m->next, 1, memory_order_relaxed)) < m->first[m->n];) {
        while (jb >= m->first[s + 1]) s++;
        const attn_job *j = &m->jobs[s];
        const kern_attn *a = &j->a;
        long local = jb - m->first[s];
        int g = (int)(local % a->n_head_kv), tile = (int)(local / a->n_head_kv);
        int ld = (a->pos0 + a->n_tokens + 15) & ~15, G = a->n_head / a->n_head_kv;
        float *KT = S + (size_t)G * j->tq * ld;
        KT = (float *)(((uintptr_t)KT + 63) & ~(uintptr_t)63);
        int t0 = tile * j->tq, t1 = t0 + j->tq < a->n_tokens ? t0 + j->tq : a->n_tokens;
        k->attn_tile(a, g, t0, t1, S, ld, KT);
    }
    free(own);
}

int op_attention_paged_multi(const op_attn_seq *seqs, int n_seqs, int bs, size_t row_bytes, int kv_type, int n_head,
                             int n_head_kv, int head_dim, tpool *pool)
{
    attn_job *jobs = malloc(sizeof *jobs * (size_t)n_seqs);
    long *first = malloc(sizeof *first * (size_t)(n_seqs + 1));
    if (!jobs || !first) {
        free(jobs);
        free(first);
        return -1;
    }
    attn_multi m = {.jobs = jobs, .first = first, .n = n_seqs, .pool = pool};
    first[0] = 0;
    for (int i = 0; i < n_seqs; i++) {
        const op_attn_seq *q = &seqs[i];
        attn_job *j = &jobs[i];
        *j = (attn_job){
            .a = {.q = q->q, .out = q->out, .kb = q->kb, .vb = q->vb, .bs = bs, .row_bytes = row_bytes,
                  .kv_type = kv_type, .n_tokens = q->n_tokens, .pos0 = q->pos0, .n_head = n_head,
                  .n_head_kv = n_head_kv, .hd = head_dim, .scale = 1.0f / sqrtf((float)head_dim)},
            .pool = pool,
        };
        int G = n_head / n_head_kv, n_kv = q->pos0 + q->n_tokens;
        long tq = 65536L / ((long)G * n_kv);
        j->tq = tq < 1 ? 1 : tq > 32 ? 32 : (int)tq;
        if (j->tq > q->n_tokens) j->tq = q->n_tokens;
        j->n_tiles = (q->n_tokens + j->tq - 1) / j->tq;
        first[i + 1] = first[i] + (long)n_head_kv * j->n_tiles;
        size_t sf = attn_scratch_floats(j);
        if (sf > m.scratch) m.scratch = sf;
    }
    atomic_init(&m.next, 0);
    tpool_run_shared(pool, attn_multi_worker, &m);
    free(jobs);
    free(first);
    return 0;
}
