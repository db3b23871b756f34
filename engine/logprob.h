/* logprob: log-probabilities of a token and its most likely alternatives under a row of logits (log-softmax), for --json, the server and beam search. */
#ifndef KV_LOGPROB_H
#define KV_LOGPROB_H

#include <stdint.h>

#define LOGPROB_MAX_TOP 20 /* alternatives reported per token at most (OpenAI's top_logprobs limit) */

typedef struct token_logprob {
    int32_t tok;
    float lp;                        /* log p(tok) = logit[tok] - logsumexp(logits), natural log */
    int n_top;                       /* alternatives in top / top_lp */
    int32_t top[LOGPROB_MAX_TOP];    /* most likely first; ties: lower id first */
    float top_lp[LOGPROB_MAX_TOP];
} token_logprob;

/* log(sum(exp(logits[0..n)))) in double, shifted by the maximum (exact for any finite row;
 * -Inf entries count as 0). */
double logprob_logsumexp(const float *logits, int n);

/* The log-softmax of logits (n_vocab floats: the raw model output, before penalties and
 * temperature — the distribution OpenAI's API reports) at tok, and the top_n (clamped to
 * [0, LOGPROB_MAX_TOP]) most likely tokens with theirs. tok outside [0, n_vocab) gives lp -Inf.
 * O(n_vocab * top_n) worst case, O(n_vocab) typically. */
void logprob_token(const float *logits, int n_vocab, int32_t tok, int top_n, token_logprob *out);

#endif
