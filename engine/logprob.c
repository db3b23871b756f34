/* logprob: log-softmax of one row of logits at a token, and its top alternatives. */
#include "logprob.h"

#include <math.h>

double logprob_logsumexp(const float *logits, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    if (!isfinite(mx)) return mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

void logprob_token(const float *logits, int n_vocab, int32_t tok, int top_n, token_logprob *out)
{
    if (top_n < 0) top_n = 0;
    if (top_n > LOGPROB_MAX_TOP) top_n = LOGPROB_MAX_TOP;
    double lse = logprob_logsumexp(logits, n_vocab);
    out->tok = tok;
    out->lp = tok >= 0 && tok < n_vocab ? (float)(logits[tok] - lse) : -INFINITY;
    out->n_top = 0;
    for (int i = 0; top_n > 0 && i < n_vocab; i++) { /* insertion into a sorted list of at most top_n */
        float v = logits[i];
        int k = out->n_top;
        if (k == top_n && !(v > logits[out->top[k - 1]])) continue;
        if (k < top_n) out->n_top++;
        else k--;
        while (k > 0 && v > logits[out->top[k - 1]]) {
            out->top[k] = out->top[k - 1];
            k--;
        }
        out->top[k] = i;
    }
    for (int k = 0; k < out->n_top; k++) out->top_lp[k] = (float)(logits[out->top[k]] - lse);
}
