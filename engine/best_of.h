/* best_of: best-of-N sampling — N samples of one reply from one prefill, decoded together on forks of the prompt's KV sequence, ranked by mean log-probability. */
#ifndef KV_BEST_OF_H
#define KV_BEST_OF_H

#include <stddef.h>
#include <stdint.h>

#include "generate.h"
#include "logprob.h"
#include "sampler.h"

#define BEST_OF_MAX 16 /* samples at most */

/* One candidate reply: its tokens and their log-probabilities under the raw model. */
typedef struct gen_candidate {
    int32_t *tokens;      /* malloc'd; an end-of-generation token included */
    float *lp;            /* lp[i] = log p(tokens[i]) (log-softmax of the raw logits) */
    token_logprob *tlp;   /* with top_n > 0: each token's log-prob and its top_n alternatives (else NULL) */
    int n;
    double mean_lp;       /* mean of lp over the tokens (the end-of-generation token included); -1e30 when n = 0 */
    int finish;           /* enum gen_finish */
    uint64_t seed;        /* the sampler seed that drew it */
} gen_candidate;

/* Best first: higher mean_lp, ties by lower seed (a total order, so the ranking is the same on
 * every run). */
void gen_candidates_rank(gen_candidate *c, int n);
void gen_candidates_free(gen_candidate *c, int n);

/* n samples (1..BEST_OF_MAX) from one prefill: prompt[0..n_prompt-1) is prefilled once on seq
 * (prefix reuse as engine_prefill_seq), each sample is generated on a fork of it with a sampler of
 * s's parameters seeded seed(s) + i (i = 0..n-1; so sample i equals what seed + i gives alone),
 * all decoded together (engine/gen_batch.h: one batched forward pass per step; no context
 * shift), n_predict tokens at most (< 0: until an end of generation or the context is full), and
 * ranked by gen_candidates_rank into out[0..n). top_n > 0 also keeps every token's top_n
 * alternatives (out[i].tlp). cb: its should_stop (if any) is polled every step (nonzero ends
 * every sample: finish GEN_FINISH_CANCELLED); its other callbacks are not used. seq keeps the
 * prefilled prompt; the forks are freed. s itself does not sample. Errors of the prefill, of
 * gen_batch / the forward pass, KV_ERR_NOMEM; the caller frees out with gen_candidates_free. */
int engine_best_of(engine *e, int seq, sampler *s, const int32_t *prompt, size_t n_prompt, int n, int n_predict,
                   int top_n, const gen_callbacks *cb, gen_candidate *out, gen_stats *st, kv_error *err);

#endif
