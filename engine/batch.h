/* batch: the multi-sequence forward pass (tokens of several KV sequences in one pass, weights read once for all of them) and a small builder for its arguments. */
#ifndef KV_BATCH_H
#define KV_BATCH_H

#include <stdint.h>

#include "kv_cache.h"
#include "kv_error.h"
#include "model.h"
#include "kernels/threadpool.h"

/*
 * Iteration-level batching (Yu et al. 2022, "Orca: A Distributed Serving System for
 * Transformer-Based Generative Models", OSDI'22): one forward pass runs a decode token of every
 * active request and prefill chunks of new ones together; every token-wise operation (norms,
 * projections, FFN, output) is one GEMM over all rows, so each weight is read once per step for
 * all sequences, while attention runs per sequence over that sequence's own blocks of the paged
 * cache (Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with
 * PagedAttention", SOSP'23).
 */

/* Run tokens[0..n_tokens) through the model, token i continuing sequence seq_ids[i] of kv.
 * Several tokens of one sequence are allowed (a prefill chunk): they take that sequence's next
 * positions in the order they appear in the batch (they need not be adjacent), and attend
 * causally to the sequence's cache and to its earlier tokens in this batch — never to another
 * sequence's. Every sequence's new positions are reserved (copy-on-write of shared blocks)
 * before and committed (hashed for prefix reuse) after, exactly as model_forward_seq does.
 * Works for every architecture model_forward_seq runs (sliding-window and soft-capped layers,
 * fused projections, per-head norms ...); per sequence the result equals model_forward_seq on
 * that sequence's tokens alone up to the GEMM kernels' summation order (a row's matmul result
 * may differ in the last bits between a 1-row GEMV and an n-row GEMM; see tests/test_batch.c
 * for the tolerance).
 *
 * want_logits[i] != 0: token i's n_vocab logits are written to logits, rows in batch order
 * ([n_want][n_vocab], n_want = the number of tokens asked for). want_logits NULL: the last token
 * of each distinct sequence is asked for (so logits is [n_seqs][n_vocab], sequences in the order
 * of their last token in the batch). logits may be NULL when no row is asked for.
 *
 * Shapes: tokens, seq_ids, want_logits: [n_tokens]; 1 <= n_tokens <= forward_ctx_n_batch(fc).
 * Errors (nothing is written to the cache on the first three): KV_ERR_INVALID (n_tokens out of
 * range, a token id out of [0, n_vocab), an unknown sequence id), KV_ERR_CONTEXT (a sequence's
 * positions would pass n_ctx of the cache or of fc — the message names the sequence), KV_ERR_NOMEM;
 * KV_ERR_CONTEXT from kv_seq_reserve when the block budget is exhausted (then the sequences
 * reserved before keep their blocks but no tokens: a retry or kv_seq_free is safe). */
int model_forward_batch(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens,
                        const int *seq_ids, int n_tokens, const int *want_logits, float *logits, kv_error *err);

/* The arguments of model_forward_batch, grown as a scheduler adds tokens. */
typedef struct kv_batch {
    int n, cap;
    int32_t *tokens; /* [cap] */
    int *seq_ids;    /* [cap] */
    int *want;       /* [cap]: 1 = logits of this token */
    int n_want;      /* tokens with want != 0: rows of the logits */
} kv_batch;

/* Room for cap tokens. KV_ERR_NOMEM / KV_ERR_INVALID (cap < 1). */
int kv_batch_init(kv_batch *b, int cap, kv_error *err);
void kv_batch_free(kv_batch *b);
void kv_batch_clear(kv_batch *b);
/* Append one token of seq; returns its logits row (0, 1, ... in the order asked) when want,
 * -1 when not asked, -2 when the batch is full. */
int kv_batch_add(kv_batch *b, int32_t token, int seq, int want);
/* model_forward_batch on the batch (logits: [b->n_want][n_vocab]). */
int kv_batch_run(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const kv_batch *b, float *logits,
                 kv_error *err);

#endif
