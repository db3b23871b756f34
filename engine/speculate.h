/* speculate: speculative decoding — drafts from n-grams of the context (prompt lookup) or from a draft model of the same vocabulary, and the verification rule that keeps the target's output distribution exact. */
#ifndef KV_SPECULATE_H
#define KV_SPECULATE_H

#include <stdint.h>

#include "kv_error.h"
#include "sampler.h"

/* How it runs (engine_generate_seq with gen_opts.spec): the last sampled token t and up to
 * draft_max drafted tokens d1..dk go through the target in ONE forward pass that returns every
 * row's logits (model_forward_seq, all_logits); row i is the distribution after d_i (row 0 after
 * t). Drafts are checked left to right; the first rejected one is replaced by a token of the
 * target's, after the last accepted one a "bonus" token is sampled from the next row, so every
 * pass yields between 1 and k+1 tokens. The target's (and the draft model's) KV cache is cut back
 * past the first rejection (kv_seq_truncate).
 *   temperature 0: a draft is accepted iff it is the target's greedy token, so the output is
 *                  token for token that of plain decoding.
 *   temperature > 0: p = the target's distribution (sampler_dist: after penalties, top-k, top-p,
 *                  min-p and temperature), q = the drafter's (the draft model's sampler_dist with
 *                  the same filters and temperature, no penalties; a one-hot q for lookup drafts).
 *                  Draft d is accepted with probability min(1, p(d) / q(d)); on rejection the token
 *                  is drawn from max(0, p - q) renormalised (Leviathan, Kalman & Matias 2023,
 *                  "Fast Inference from Transformers via Speculative Decoding", Algorithm 1; Chen
 *                  et al. 2023, "Accelerating Large Language Model Decoding with Speculative
 *                  Sampling"), which makes every emitted token follow p exactly.
 * The drafter backs off: after a pass whose first draft is rejected it drafts nothing for 3, 15,
 * 63, 255 steps (plain decoding; 4^f - 1 after f such passes in a row, f at most
 * SPEC_BACKOFF_MAX), and the draft length follows the last acceptance (the accepted count + 1,
 * growing by 2 while everything is accepted), so rejected drafts cost little: a failed pass costs
 * about half a step (a second row in the verification pass, about 0.45 of a step at 1 thread on
 * a Q4_0 TinyLlama; a draft model step; its batched catch-up on the tokens of the pause), which
 * 4^f pauses keep to 4 passes in the first 100 tokens (2^f ones took 7), and the draft model
 * reads the prompt during the prefill (spec_prefill), not on its first draft. A draft model that
 * runs and declines (its first token's probability below draft_min_p) backs off the same way
 * (it used to run a step at every token for nothing); no lookup match costs nothing and does not.
 * A paused step is plain decoding's step (one row; the drafter is not asked, the context not
 * gathered). The draft model does not read the tokens of a pause one by one nor all of them
 * after it: a pass more than SPEC_RESYNC_MAX tokens behind restarts the draft model's sequence on
 * the last SPEC_RESYNC_MAX tokens (its context is that window from then on), so it reads a
 * bounded amount per pass — it used to catch up on every token of every pause, which made a
 * rejected draft model cost on every step (1.5 steps of a TinyLlama for its 2-layer draft after a
 * 63-step pause; more than the decoding itself for a draft model costlier than stories260K).
 * And the pauses grow with the draft model's relative cost c (spec_set_cost): (4^f - 1)(1 +
 * ceil(c)). */

enum spec_mode { SPEC_OFF = 0, SPEC_LOOKUP, SPEC_DRAFT };

#define SPEC_MAX_DRAFT 32          /* draft_max at most */
#define SPEC_DEFAULT_DRAFT_MAX 8
#define SPEC_DEFAULT_MIN_P 0.5f
#define SPEC_NGRAM_MAX 4           /* lookup: longest n-gram matched (then shorter, down to 2) */
#define SPEC_NGRAM_MIN 2
#define SPEC_BACKOFF_MAX 4         /* the longest pause: 4^4 - 1 = 255 steps without drafting */
#define SPEC_RESYNC_MAX 16         /* a draft model further behind re-reads only this many last tokens */

struct engine;

typedef struct spec_params {
    int mode;                 /* enum spec_mode */
    int draft_max;            /* tokens drafted per pass at most, 1..SPEC_MAX_DRAFT (0: default 8) */
    float draft_min_p;        /* draft model: stop drafting before a token whose probability under the
                                 draft (softmax of its logits) is below this, in [0, 1] */
    struct engine *draft;     /* SPEC_DRAFT: the draft model (spec_draft_open); not owned */
    int no_backoff;           /* tests: always draft draft_max tokens when a draft exists */
    int test_accept_all;      /* tests only: accept every draft — a WRONG rule that lets a statistical
                                 test show it can fail */
} spec_params;

void spec_params_default(spec_params *p);

/* "off", "lookup" or "draft" → enum spec_mode, or -1. */
int spec_mode_from_name(const char *name);
const char *spec_mode_name(int mode);

/* Open draft_path as a draft model for target: same n_ctx, batch and KV type as the target's,
 * n_threads threads (0: the target's). Its vocabulary must be the target's: the same n_vocab and
 * the same text of every token (KV_ERR_FORMAT otherwise: "DRAFT: its vocabulary differs from
 * TARGET's: N tokens vs M" or "token ID is 'x' there and 'y' here"). Errors of engine_open. */
int spec_draft_open(const char *draft_path, const struct engine *target, int n_threads, struct engine **out,
                    kv_error *err);

/* ---- internals of the decode loop (engine/generate.c) ------------------------------------- */

typedef struct spec_state spec_state;

/* Buffers for a request (rows of logits, dense p and q, the RNG seeded from seed). NULL: no memory. */
spec_state *spec_state_create(const spec_params *p, int n_vocab, int n_batch, uint64_t seed);
void spec_state_free(spec_state *st);

/* Propose up to max_k drafts after hist[0..n_hist) (the target sequence's tokens and the pending
 * token, which is hist[n_hist-1]) into drafts; returns k >= 0, or < 0 with err set (a draft model
 * error). The sampler s gives the parameters (temperature, filters) the draft model drafts with. */
int spec_propose(spec_state *st, const int32_t *hist, int n_hist, int max_k, const sampler *s, int32_t *drafts,
                 kv_error *err);

/* The prompt read by the draft model (SPEC_DRAFT; nothing for lookup): its sequence made to hold
 * toks[0..n) — the target's sequence after the prefill — so the first draft does not read the
 * prompt in the decode phase. Errors of the draft model's forward pass. */
int spec_prefill(spec_state *st, const int32_t *toks, int n, kv_error *err);

/* Row storage for the verification pass: (SPEC_MAX_DRAFT + 1) rows of n_vocab floats. */
float *spec_rows(spec_state *st);

/* Decide position i of a pass: row = the target's logits there; draft = d_{i+1}, or -1 for the
 * bonus token after the last draft. *tok gets the token to emit, *accepted 1 when it is the draft.
 * Errors of sampler_sample / sampler_dist. */
int spec_verify(spec_state *st, sampler *s, const float *row, int i, int32_t draft, int32_t *tok, int *accepted,
                kv_error *err);

/* After a pass of k drafts of which j were accepted: adapt the length, back off. */
void spec_feedback(spec_state *st, int k, int j);

/* A paused step of the back-off (consumes it: the drafter drafts nothing this step): 1, else 0
 * (the step may draft). Lets the decode loop skip gathering the context for spec_propose. */
int spec_paused(spec_state *st);

/* The draft model's cost per token relative to the target's, c >= 0 (Leviathan et al. 2023's c):
 * pauses become (4^f - 1) * (1 + ceil(c)) steps, so the draft steps of failed passes stay a small
 * share of decoding however costly the draft model (0, the default: lookup, unknown). */
void spec_set_cost(spec_state *st, double c);

/* Measured cost (speculative decoding's c, Leviathan et al. 2023, section 3.4): k > 0, drafting k
 * tokens took ms (spec_propose: the catch-up and the draft steps); k == 0, a target step without
 * drafts took ms. With back-off on, a draft model found to cost at least a target step per drafted
 * token drafts no more (spec_paused stays 1): no acceptance rate can make it pay (its first pass
 * is all it costs). The parameter count (spec_set_cost) misjudges small models, whose steps are
 * not bandwidth-bound, and low-bit drafts of the target itself: time is what counts. */
void spec_time(spec_state *st, int k, double ms);
/* 1 when spec_time found the draft model too costly (drafting stopped). */
int spec_too_costly(const spec_state *st);

/* Tokens the draft model has read (prompt, catch-ups, draft steps): tests count them. */
long spec_draft_read(const spec_state *st);

#endif
