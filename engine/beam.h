/* beam: beam search over forked KV sequences (each beam a copy-on-write fork of its parent), scored by the raw model's log-probabilities. */
#ifndef KV_BEAM_H
#define KV_BEAM_H

#include <stdint.h>

#include "generate.h"

#define BEAM_MAX 16

typedef struct beam_result {
    int32_t *tokens;   /* the chosen beam's generated tokens (malloc'd; an end-of-generation token included) */
    int n_tokens;
    double logprob;    /* sum of log p(token) under the raw model (log-softmax of its logits, no temperature) */
    double score;      /* logprob / n_tokens^length_penalty: what the beams are ranked by at the end */
    int finish;        /* GEN_FINISH_EOG or GEN_FINISH_LENGTH (or CONTEXT: the sequence filled up) */
    int n_finished;    /* hypotheses that ended in end-of-generation */
} beam_result;

/* Beam search (the textbook algorithm, e.g. Graves 2012 / Wu et al. 2016 for the length
 * normalisation): the prompt is prefilled once on seq (prefix reuse as engine_prefill_seq);
 * every step each live beam proposes its n_beams most likely next tokens, the n_beams best
 * (beam, token) pairs by cumulative log-probability survive, each on a fork of its parent's
 * sequence fed that token (kv_seq_fork: shared blocks, copy-on-write). A pair whose token ends
 * generation becomes a finished hypothesis; the search ends after n_predict tokens (< 0: until
 * n_ctx), when n_beams hypotheses have finished, or when no beam is left. The result is the
 * hypothesis (finished or live) of the highest score = logprob / length^length_penalty
 * (length_penalty 0: the plain sum; 1: the mean). With n_beams 1 it is greedy decoding.
 * Every step decodes all beams in one batched forward pass (model_forward_batch; with
 * want_logits NULL: one row per beam, in the order given). seq keeps the prompt;
 * every fork is freed. Errors: KV_ERR_INVALID (n_beams outside 1..BEAM_MAX, empty prompt),
 * KV_ERR_CONTEXT, KV_ERR_NOMEM, those of the forward pass. */
int engine_beam_search(engine *e, int seq, const int32_t *prompt, int n_prompt, int n_beams, float length_penalty,
                       int n_predict, beam_result *out, gen_stats *st, kv_error *err);

void beam_result_free(beam_result *r);

#endif
