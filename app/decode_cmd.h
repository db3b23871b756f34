/* decode_cmd: the one-shot mode's --beams and --best-of (several candidate replies, one shown). */
#ifndef KV_APP_DECODE_CMD_H
#define KV_APP_DECODE_CMD_H

#include <stddef.h>
#include <stdint.h>

#include "app/output.h"
#include "engine/generate.h"
#include "engine/best_of.h"
#include "engine/logprob.h"
#include "engine/worker.h"
#include "app/conv_tree.h"

#define DECODE_MAX_N BEST_OF_MAX

typedef struct decode_opts {
    int beams;            /* > 1: beam search (engine/beam.h) */
    int best_of;          /* > 1: best-of-N sampling */
    float length_penalty; /* beams: score = sum log p / length^A */
    int n_predict;
    int json;             /* write JSON lines to j instead of text to stdout */
    int top_logprobs;
    const char *prompt_text; /* echoed before the reply in text mode (NULL: none) */
} decode_opts;

/* One candidate of best-of-N (engine/best_of.h). */
typedef gen_candidate decode_sample;

/* N samples from one prefill: the prompt but its last token is prefilled once on seq, each
 * sample is generated on a fork of it with a sampler of s's parameters seeded seed + i
 * (i = 0..n-1), all decoded together (engine/gen_batch.h: one batched forward pass per step;
 * no context shift), and the samples are ranked by mean log-probability of the raw model (best
 * first) into out[0..n). top_n > 0 also keeps every token's top_n alternatives (out[i].tlp, for
 * --json --top-logprobs). s itself is not used for sampling. Errors of gen_batch / the forward
 * pass. The caller frees with decode_samples_free. */
int decode_best_of(engine *e, int seq, sampler *s, const int32_t *prompt, size_t n_prompt, int n, int n_predict,
                   int top_n, decode_sample *out, gen_stats *st, kv_error *err);
void decode_samples_free(decode_sample *s, int n);

/* The one-shot mode with --beams / --best-of: writes the chosen reply (text, or JSON token lines
 * with logprobs) and says on stderr how it was chosen (the beam's score; every sample's mean
 * log-prob). */
int decode_oneshot(engine *e, sampler *s, const int32_t *prompt, size_t n_prompt, const decode_opts *o, json_out *j,
                   gen_stats *st, int *finish, kv_error *err);

/* `/set draft off|lookup|model`, `/set draft_max N`, `/set draft_min_p P` (key CFG_DRAFT,
 * CFG_DRAFT_MAX, CFG_DRAFT_MIN_P; ranges from the settings table) on *sp: "model" (or the draft
 * model's path) needs the draft model opened at start-up (sp->draft; --draft or config.ini), a
 * path of another model is refused (a model is loaded only at start). Writes "draft = lookup" or
 * the error to msg; 0 or -1 (nothing changed). */
struct spec_params;
int decode_set_draft(struct spec_params *sp, int key, const char *value, const char *draft_path, char *msg,
                     size_t cap);
/* The value of one of those keys as /show params prints it. */
void decode_draft_text(const struct spec_params *sp, int key, char *buf, size_t cap);

/* ---- the chat's /best N and /beams N (app/chat.c runs them through the worker) --------------- */

/* "/best N [MESSAGE]" / "/beams N [MESSAGE]": N (2..DECODE_MAX_N) from args, *rest the message
 * after it ("" for none: answer the last message again). 0, or -1 with the usage in msg. */
int decode_parse_count(const char *cmd, const char *args, int *n, const char **rest, char *msg, size_t cap);

/* Conversation bookkeeping of a candidates reply: the reply node `reply` (already on the path,
 * holding cand[0]) gets cand[1..n) as siblings (same parent, role and author, their texts and
 * finish codes), in rank order after it. Returns the index of the first sibling added (t->n when
 * n <= 1), or -1 when out of memory (those added so far stay). */
long decode_add_siblings(conv_tree *t, long reply, const worker_candidate *cand, int n, int role, const char *author,
                         int (*finish_of)(int gen_finish));

/* What the chat says about a candidates reply: best-of's ranking ("best of 3, ranked by mean
 * log-probability per token: this reply -0.412 (seed S); the others (branches 2/3, 3/3 — /branch)
 * -0.533, -0.871") or the beam's score; first_branch = the chosen reply's sibling rank. */
void decode_candidates_note(const worker_candidate *cand, int n, int beams, float length_penalty, size_t first_branch,
                            size_t n_branches, char *buf, size_t cap);

#endif
