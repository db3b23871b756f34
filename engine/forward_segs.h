/* forward_segs: (inside the engine only) the forward pass over rows grouped by KV sequence, which model_forward_seq and model_forward_batch (batch.c) both run. */
#ifndef KV_FORWARD_SEGS_H
#define KV_FORWARD_SEGS_H

#include <stdint.h>

#include "model.h"

/* Rows [row0, row0 + n_rows) of a batch continue sequence seq at positions pos0 ... (pos0 is
 * filled in by model_forward_segs from the cache). */
typedef struct fwd_seg {
    int seq, row0, n_rows, pos0;
} fwd_seg;

/* tokens[0..n_rows) grouped by segment (segs in row order, covering every row once, each
 * sequence in at most one segment); the logits of rows out_rows[0..n_out) go to
 * logits[k][n_vocab] (k < n_out). Checks everything model_forward_batch documents before
 * touching the cache. */
int model_forward_segs(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens, int n_rows,
                       fwd_seg *segs, int n_segs, const int *out_rows, int n_out, float *logits, kv_error *err);

/* Scratch of n_batch entries each that fc keeps for building those arguments: 3 int arrays
 * and a segment array. */
void forward_ctx_batch_scratch(forward_ctx *fc, int **i0, int **i1, int **i2, int32_t **toks, fwd_seg **segs);

#endif
