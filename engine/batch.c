/* batch: model_forward_batch's bookkeeping (grouping a batch's tokens by sequence, the logits rows asked for) and the kv_batch builder. */
#include "batch.h"

#include <stdlib.h>
#include <string.h>

#include "forward_segs.h"

int model_forward_batch(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens,
                        const int *seq_ids, int n_tokens, const int *want_logits, float *logits, kv_error *err)
{
    int n_batch = forward_ctx_n_batch(fc);
    if (n_tokens < 1 || n_tokens > n_batch)
        return kv_error_set(err, KV_ERR_INVALID, "forward: batch of %d tokens (1 to %d allowed)", n_tokens, n_batch);
    /* row (the order the forward pass runs): tokens grouped by sequence, each group in batch
     * order, groups in the order of their first token. where[i] = token i's row. */
    int *where, *next, *out_rows;
    int32_t *rtok;
    fwd_seg *segs;
    forward_ctx_batch_scratch(fc, &where, &next, &out_rows, &rtok, &segs);
    int n_segs = 0;
    for (int i = 0; i < n_tokens; i++) where[i] = -1;
    for (int i = 0; i < n_tokens; i++) {
        if (where[i] != -1) continue; /* already in a segment */
        if (!kv_seq_valid(kv, seq_ids[i]))
            return kv_error_set(err, KV_ERR_INVALID, "forward: batch token %d names no KV sequence (%d)", i, seq_ids[i]);
        where[i] = -2 - n_segs; /* first token of segment n_segs; rows are assigned below */
        segs[n_segs].seq = seq_ids[i];
        segs[n_segs].n_rows = 1;
        for (int j = i + 1; j < n_tokens; j++)
            if (seq_ids[j] == seq_ids[i]) {
                where[j] = -2 - n_segs;
                segs[n_segs].n_rows++;
            }
        n_segs++;
    }
    int row = 0;
    for (int g = 0; g < n_segs; g++) {
        segs[g].row0 = row;
        next[g] = row;
        row += segs[g].n_rows;
    }
    for (int i = 0; i < n_tokens; i++) {
        int g = -2 - where[i];
        where[i] = next[g]++;
        rtok[where[i]] = tokens[i];
    }
    /* the logits rows, in batch order */
    int n_out = 0;
    if (want_logits) {
        for (int i = 0; i < n_tokens; i++)
            if (want_logits[i]) out_rows[n_out++] = where[i];
    } else {
        for (int i = 0; i < n_tokens; i++) {
            int last = 1;
            for (int j = i + 1; j < n_tokens && last; j++) last = seq_ids[j] != seq_ids[i];
            if (last) out_rows[n_out++] = where[i];
        }
    }
    if (n_out && !logits) return kv_error_set(err, KV_ERR_INVALID, "forward: %d logits rows asked for, no buffer", n_out);
    return model_forward_segs(m, fc, kv, pool, rtok, n_tokens, segs, n_segs, out_rows, n_out, logits, err);
}

int kv_batch_init(kv_batch *b, int cap, kv_error *err)
{
    memset(b, 0, sizeof *b);
    if (cap < 1) return kv_error_set(err, KV_ERR_INVALID, "batch: capacity %d", cap);
    b->tokens = malloc(sizeof *b->tokens * (size_t)cap);
    b->seq_ids = malloc(sizeof *b->seq_ids * (size_t)cap);
    b->want = malloc(sizeof *b->want * (size_t)cap);
    if (!b->tokens || !b->seq_ids || !b->want) {
        kv_batch_free(b);
        return kv_error_set(err, KV_ERR_NOMEM, "batch: out of memory for %d tokens", cap);
    }
    b->cap = cap;
    return KV_OK;
}

void kv_batch_free(kv_batch *b)
{
    free(b->tokens);
    free(b->seq_ids);
    free(b->want);
    memset(b, 0, sizeof *b);
}

void kv_batch_clear(kv_batch *b) { b->n = b->n_want = 0; }

int kv_batch_add(kv_batch *b, int32_t token, int seq, int want)
{
    if (b->n >= b->cap) return -2;
    b->tokens[b->n] = token;
    b->seq_ids[b->n] = seq;
    b->want[b->n] = want != 0;
    b->n++;
    return want ? b->n_want++ : -1;
}

int kv_batch_run(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const kv_batch *b, float *logits,
                 kv_error *err)
{
    return model_forward_batch(m, fc, kv, pool, b->tokens, b->seq_ids, b->n, b->want, logits, err);
}
