/* decode_cmd: the one-shot mode's --beams and --best-of (several candidate replies, one shown). */
#ifndef KV_APP_DECODE_CMD_H
#define KV_APP_DECODE_CMD_H

#include <stddef.h>
#include <stdint.h>

#include "app/output.h"
#include "engine/generate.h"
#include "engine/best_of.h"
#include "engine/logprob.h"

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

#endif
