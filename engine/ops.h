/* ops: the numeric building blocks of the forward pass (norms, rotary embedding, matmul, softmax). */
#ifndef KV_OPS_H
#define KV_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kernels/threadpool.h"

/* RMSNorm (Zhang & Sennrich 2019): out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], n elements.
 * out may alias x. */
void op_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* Rotary position embedding (Su et al. 2021, RoFormer) applied in place to n_head heads of
 * head_dim floats each (vec is [n_head][head_dim]); only the first n_rot dims of each head
 * rotate. theta_i = pos * freq_base^(-2i/n_rot) / freq_factors[i] (factors may be NULL; they are
 * Llama 3.1's rope_freqs). neox = 0: pairs (2i, 2i+1) as in llama's GGUF layout;
 * neox = 1: pairs (i, i + n_rot/2) as in GPT-NeoX / Qwen2. cs holds n_rot floats of
 * precomputed (cos, sin) pairs from op_rope_cache for this position. */
void op_rope_cache(float *cs, int pos, int n_rot, float freq_base, const float *freq_factors);
void op_rope(float *vec, int n_head, int head_dim, int n_rot, const float *cs, int neox);

/* Re-rotate keys already rotated for position p so they stand at p + delta (delta may be
 * negative): rotations in each pair's plane compose, R(p + delta) = R(delta) R(p), and theta is
 * linear in the position also with rope_freqs factors, so this applies op_rope with the
 * (cos, sin) of position `delta` — same pairs (neox or not) and factors as op_rope_cache /
 * op_rope. vec is [n_head][head_dim]. Used by the KV cache's context shift (StreamingLLM,
 * Xiao et al. 2023; llama.cpp's K-shift). No allocation for n_rot <= 1024. */
void op_rope_shift(float *vec, int n_head, int head_dim, int n_rot, int delta, float freq_base,
                   const float *freq_factors, int neox);

/* Numerically stable softmax in place over n floats. */
void op_softmax(float *x, int n);

/* SwiGLU (Shazeer 2020): gate[i] = silu(gate[i]) * up[i], n elements (kern_swiglu: the level's kernel). */
void op_swiglu(float *gate, const float *up, int n);
/* op_swiglu over n values split among the pool's threads (a batched step's n_tokens·n_ff values,
 * or one token's n_ff): the same result as op_swiglu, element by element. pool NULL: inline. */
void op_swiglu_pool(float *gate, const float *up, size_t n, tpool *pool);

/* Scratch a matmul needs for the activations converted to the weight's dot-product type:
 * bytes for n_tokens rows of n_in. */
size_t op_matmul_scratch_size(const gguf_tensor *w, int n_tokens);

/* y[t][o] = sum_i w[o][i] * x[t][i] for t < n_tokens, o < n_out, where w is a 2-D tensor
 * with ne[0] = n_in, ne[1] = n_out in any type quant.h supports. x is [n_tokens][n_in] f32,
 * y is [n_tokens][n_out] f32. The activations are converted once to the weight type's
 * vec_dot_type (as the reference does, e.g. Q8_0 for Q4_0) in `scratch` and rows are split over
 * the pool (engine/kernels: packed panels, F32 / F16 / BF16 through a blocked GEMM). */
void op_matmul(const gguf_tensor *w, const float *x, int n_tokens, float *y, void *scratch, tpool *pool);

/* Rows per work chunk of a matmul of n_out rows of row_bytes weight bytes and n_in inputs over
 * n_tokens activation rows, run by nth threads that take chunks from a shared counter and poll a
 * stop (tpool_cancelled) between them: at least 64 KiB of weights (and, with split, an eighth of
 * a thread's share; one chunk for the whole matrix with one thread), at most ~2^26 multiply-adds
 * (n_in · n_tokens per row: a stop waits for a fraction of a millisecond per thread), whole panels
 * (QUANT_PANEL_ROWS), at most n_out. op_matmul's chunks (split = 1) and the experts' (engine/moe.c,
 * split = 0: many matrices share one pass). No errors. */
long op_matmul_chunk_rows(size_t row_bytes, int64_t n_in, int64_t n_out, int n_tokens, int nth, int split);

/* A decode step (1 to OP_MULTI_MAX_TOKENS tokens: one, or one per sequence of a batched step) through
 * up to OP_MULTI_MAX matrices that read the same input in one pool pass: ys[i][t][o] = sum_k
 * ws[i][o][k] * x[t][k] (x is [n_tokens][n_in] f32, every ws[i] has ne[0] = n_in, ys[i] is
 * [n_tokens][ws[i]->ne[1]]), the results of op_matmul bit for bit (the same chunks and kernels per
 * row); the activation rows are converted once per weight type, into scratch
 * (op_matmul_multi_scratch_size bytes). swiglu (n == 2, both of n_out rows): then ys[0] =
 * SwiGLU(ys[0], ys[1]) (op_swiglu), each chunk of rows as soon as both matrices' rows are done —
 * q/k/v, or gate/up and the activation, take one pass instead of three. Returns 0, or -1 (too many
 * matrices or tokens, inputs of different widths, swiglu on matrices of different heights: nothing
 * done). */
#define OP_MULTI_MAX 3
#define OP_MULTI_MAX_TOKENS 8
size_t op_matmul_multi_scratch_size(const gguf_tensor *const *ws, int n, int n_tokens);
int op_matmul_multi(const gguf_tensor *const *ws, int n, const float *x, int n_tokens, float *const *ys, int swiglu,
                    void *scratch, tpool *pool);

/* Causal grouped-query scaled dot-product attention (Vaswani et al. 2017; GQA, Ainslie et al.
 * 2023) for n_tokens queries at positions pos0 .. pos0+n_tokens-1: query t of head h attends to
 * positions 0 .. pos0+t of kv head h / (n_head / n_head_kv), with scale 1/sqrt(head_dim).
 * q and out are [n_tokens][n_head·head_dim]; K and V are f32 rows [pos0 + n_tokens]
 * [n_head_kv·head_dim]. Prefill runs as small GEMMs (Q·Kᵀ on transposed 16-position tiles,
 * softmax, P·V) per (kv head, block of queries), split over the pool; per-thread scratch comes
 * from tpool_scratch (no allocation after the first call of a given size). */
void op_attention(const float *q, const float *K, const float *V, float *out, int n_tokens, int pos0, int n_head,
                  int n_head_kv, int head_dim, tpool *pool);

/* op_attention on K and V where a paged KV cache stores them: the row of position p (n_head_kv·
 * head_dim values of kv_type, GGML_TYPE_F32 or GGML_TYPE_F16) starts at kb[p / bs] +
 * (p % bs)·row_bytes (V: vb), bs a power of two, so decode reads each stored K and V value once, with no f32 copy of
 * the history. Same results as op_attention on the widened rows (f16 widens exactly). */
void op_attention_paged(const float *q, const uint8_t *const *kb, const uint8_t *const *vb, int bs, size_t row_bytes,
                        int kv_type, float *out, int n_tokens, int pos0, int n_head, int n_head_kv, int head_dim,
                        tpool *pool);

/* op_attention_paged for several sequences at once (a batched decode step): sequence i's
 * n_tokens queries at positions pos0 … read its own blocks kb / vb (same layout, block size,
 * row bytes and type for all). One dispatch over the pool for every (sequence, kv head, query
 * tile); bitwise the results of op_attention_paged per sequence. 0, or -1 out of memory (nothing
 * computed). */
typedef struct op_attn_seq {
    const float *q;
    float *out;
    const uint8_t *const *kb, *const *vb;
    int n_tokens, pos0;
} op_attn_seq;
int op_attention_paged_multi(const op_attn_seq *seqs, int n_seqs, int bs, size_t row_bytes, int kv_type, int n_head,
                             int n_head_kv, int head_dim, tpool *pool);

/* Repack the model's matrices once (after the load: below) into one arena (2 MiB pages where the kernel gives
 * them): types with a panel layout are packed for the panel kernels (quant_pack), other matrices
 * of 1 MiB or more are copied as they are (they stream faster from anonymous memory than from the
 * file mapping). Sets each tensor's `packed`, which op_matmul then reads. skip: a tensor no matmul
 * reads (untied token embeddings), or NULL. The mmap'd pages of every packed tensor are released
 * (MADV_DONTNEED; the file stays in the page cache; a tensor also read by rows, like tied token
 * embeddings, faults back just the rows op_get_row reads), so resident memory holds one copy of
 * the weights. 3-D expert tensors (MoE) are packed in panels as one matrix of ne1 * ne2 rows
 * when ne1 is whole panels and their panels fit in half of MemAvailable (KVCHAT_MOE_MAPPED=1: never);
 * otherwise they stay mapped (never copied), so an unused expert's pages are never touched.
 * *arena: free it with op_weights_free (NULL when nothing was packed). KV_ERR_NOMEM. */
int op_weights_pack(gguf_file *f, const gguf_tensor *skip, void **arena, kv_error *err);
void op_weights_free(gguf_file *f, void *arena);
/* Stops the packing and copies after the load (below) where they are, leaving what is not done
 * read in the mapping, and ends their thread: for a program about to free the model, so that the
 * thread does not take a CPU (and the page-table locks) from the frees. Nothing to do: returns. */
void op_weights_stop(void *arena);

/* The packing and the copies are done after op_weights_pack returns, by a nice-19 thread of their
 * own (KVCHAT_PACK_LATER=0: during the load, by all CPUs): until a matrix is done its rows are read
 * in the file mapping — a copy's same bytes through the same kernels; a panel type's rows through
 * quant_gemv / quant_gemm, which pack them into a scratch panel for the same panel kernel — so the
 * results do not change, bit for bit, and the first token does not wait for the arena's fresh
 * memory to be faulted in (on a VM that hands freed memory back to its host, 0.5-1 s per GB after a
 * few idle seconds). op_weights_of(w) is w->packed read for that (an atomic acquire load): the
 * packed panels or the complete copy of w, or NULL while w is still read in the mapping.
 * op_weights_settle finishes the work on the calling thread as well; op_weights_free stops it after
 * the 8 MiB chunks in flight. */
const void *op_weights_of(const gguf_tensor *w);

/* Huge pages for the arena of op_weights_pack: by default (KVCHAT_HUGEPAGES unset or 1) the load
 * faults 2 MiB transparent huge pages (MADV_HUGEPAGE; decode takes fewer TLB misses, the zeroing of
 * fresh huge pages lies on the load's critical path). KVCHAT_HUGEPAGES=after faults 4 KiB pages,
 * then collapses the arena onto 2 MiB pages (MADV_COLLAPSE, Linux >= 6.1) on a nice-19 thread;
 * op_weights_settle collapses what is left now, on the calling thread, and returns when the arena
 * is done (kvchat bench, before it times anything; a no-op otherwise). 0 never asks for them.
 * op_weights_settle also completes the packing and copies described above first. */
void op_weights_settle(void *arena);

/* Called by every forward pass as it begins (begin = 1) and as it ends (begin = 0); arena:
 * op_weights_pack's, or NULL. The first pass runs on what is packed so far (a prompt packs each
 * mapped panel once for all its tokens), and the packing thread waits for it to end (or, when no
 * pass begins within 100 ms, starts anyway); a later pass settles first (op_weights_settle):
 * decode would pack every mapped panel again for each token, about 3x slower. In a chat the
 * user's typing usually leaves nothing to wait for. */
void op_weights_pass(void *arena, int begin);

/* Copy row `row` of a 2-D tensor (any supported type) into dst as f32 (ne[0] floats). */
void op_get_row(const gguf_tensor *w, int64_t row, float *dst);

#endif
