/* sampler: the per-request sampling chain (penalties → top-k → top-p → min-p → temperature → draw) and its seeded RNG. */
#ifndef KV_SAMPLER_H
#define KV_SAMPLER_H

#include <stdint.h>

#include "kv_error.h"

/* seed value meaning "pick a random seed" (from getrandom(2)); sampler_seed() then reports
 * the seed actually chosen, which is never this value, so it can be recorded and replayed. */
#define SAMPLER_SEED_RANDOM UINT64_MAX

/* Most tokens of history the sampler keeps for the penalties (a ring buffer preallocated by
 * sampler_create, 256 KiB). repeat_last_n may be anything in [0, SAMPLER_MAX_LAST_N], or -1
 * for "every token accepted since the last reset, up to SAMPLER_MAX_LAST_N" (llama.cpp's -1
 * means n_ctx; pass n_ctx itself for the exact llama.cpp behaviour). */
#define SAMPLER_MAX_LAST_N 65536

/* Sampling parameters. Every stage has an "off" value that makes it an exact no-op: the stage
 * is skipped, so the result is bitwise identical to a chain without it.
 *   temperature        logits are divided by it before the final softmax; <= 0 = greedy
 *                      (argmax of the penalized logits, ties to the lowest token id, no RNG draw).
 *                      Any finite value is valid. Default 0.8.
 *   top_k              keep the top_k most likely tokens (Fan et al. 2018); <= 0 off. Default 40.
 *   top_p              nucleus: keep the smallest set of most likely tokens whose probability
 *                      sums to >= top_p (Holtzman et al. 2019); in [0,1]; 1 = off. Default 0.95.
 *   min_p              keep tokens with p >= min_p * p_max (Nguyen et al. 2024, "min-p
 *                      sampling"); in [0,1]; 0 = off. Default 0.05.
 *   repeat_penalty     for tokens in the last repeat_last_n accepted: logit > 0 → logit /
 *                      repeat_penalty, else logit * repeat_penalty (Keskar et al. 2019, CTRL,
 *                      with llama.cpp's sign fix); finite, > 0; 1 = off. Default 1.0.
 *   repeat_last_n      how many of the most recent accepted tokens the three penalties look at;
 *                      -1 or [0, SAMPLER_MAX_LAST_N]; 0 = penalties off. Default 64.
 *   presence_penalty   subtracted once from the logit of every token that occurs in the window
 *                      (OpenAI API definition); in [-2,2]; 0 = off. Default 0.
 *   frequency_penalty  subtracted count times (count = occurrences in the window); in [-2,2];
 *                      0 = off. Default 0.
 *   seed               RNG seed; SAMPLER_SEED_RANDOM = pick one. Default SAMPLER_SEED_RANDOM. */
typedef struct sampler_params {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float repeat_penalty;
    int32_t repeat_last_n;
    float presence_penalty;
    float frequency_penalty;
    uint64_t seed;
} sampler_params;

/* Fill p with llama.cpp's defaults (listed above). p must not be NULL. */
void sampler_params_default(sampler_params *p);

/* Check every field's range (listed above). Returns KV_OK, or KV_ERR_INVALID with a message
 * naming the first bad field and its value, e.g. "sampler: top_p 1.5 not in [0, 1]".
 * p == NULL is KV_ERR_INVALID. */
int sampler_params_validate(const sampler_params *p, kv_error *err);

typedef struct sampler sampler;

/* Create a sampler for a vocabulary of n_vocab tokens with parameters p (NULL = defaults).
 * Preallocates every buffer sample() needs (about 25 bytes per vocabulary entry, 3.8 MB at
 * n_vocab 152064, plus the 256 KiB history), so sampling never allocates. Seeds the RNG
 * from p->seed. A sampler is not thread-safe: one thread at a time (the generator) uses it.
 * Returns NULL and fills err on: n_vocab <= 0 or >= 2^31-1 (KV_ERR_INVALID), invalid p
 * (KV_ERR_INVALID, see sampler_params_validate), out of memory (KV_ERR_NOMEM). */
sampler *sampler_create(int32_t n_vocab, const sampler_params *p, kv_error *err);

/* Release s and everything it owns; NULL is a no-op. */
void sampler_free(sampler *s);

/* Replace the parameters; may be called between any two samples (the UI moves sliders
 * mid-reply). History and RNG state are kept, unless p->seed differs from the current
 * params' seed field, in which case the RNG is reseeded from p->seed (a new random seed if
 * it is SAMPLER_SEED_RANDOM). p is not validated here (this cannot fail): an invalid p makes
 * the next sampler_sample() return KV_ERR_INVALID. NULL s or p is a no-op. */
void sampler_set_params(sampler *s, const sampler_params *p);

/* The current parameters (the seed field as given, possibly SAMPLER_SEED_RANDOM). */
const sampler_params *sampler_get_params(const sampler *s);

/* The seed actually in use: p->seed, or the random seed picked for SAMPLER_SEED_RANDOM.
 * Creating a sampler with this value reproduces the same token stream. */
uint64_t sampler_seed(const sampler *s);

/* Append token to the penalty history (prompt tokens too, as llama.cpp does). Tokens outside
 * [0, n_vocab) are ignored. Only the last SAMPLER_MAX_LAST_N tokens are kept. */
void sampler_accept(sampler *s, int32_t token);

/* Start a new request: clear the history and reseed the RNG from the params' seed (so a fixed
 * seed restarts the same stream; SAMPLER_SEED_RANDOM picks a fresh seed). */
void sampler_reset(sampler *s);

/* Run the chain on logits (n_vocab floats, not modified) and draw one token into *token_out.
 *   penalties (over the last repeat_last_n accepted tokens) → top-k → top-p → min-p →
 *   temperature → draw
 * Orders and ties: top-k ranks by logit descending, then token id ascending; top-p ranks by
 * probability descending, then token id ascending; so ties at either boundary keep the lowest
 * ids. Top-p's probabilities are the softmax of the penalized logits over the tokens top-k
 * kept (as llama.cpp renormalizes after top-k), its cumulative mass is summed in double and
 * compared with >= (the smallest set reaching top_p, never empty). Min-p compares logits
 * like llama.cpp (logit >= max_logit + ln(min_p), i.e. p >= min_p * p_max). Temperature is
 * applied only after these three stages, as in llama.cpp's default chain, so top-p and min-p
 * select on the untempered distribution; T only reshapes what survives.
 * The draw: weights exp((logit - max_logit) / T) over the survivors taken in ascending token
 * id (so the token depends only on the surviving set and the RNG), one 64-bit RNG output
 * mapped to u in [0,1) by sampler_rng_uniform, and the first survivor whose cumulative weight
 * exceeds u * total (cumulative sums are taken per block of 64 survivors, then across
 * blocks). exp() here is an inline polynomial accurate to ~1e-7 relative that flushes
 * weights below e^-86 to 0. Every non-greedy sample consumes exactly one RNG output whatever
 * the parameters, so the stream depends only on the seed and the number of non-greedy
 * samples drawn since the seed was set. Tokens with logit -Inf are masked (never drawn).
 * Errors (no token is emitted, *token_out untouched, RNG and history unchanged):
 *   KV_ERR_NONFINITE  a logit is NaN or +Inf, or becomes +Inf after a penalty (the message
 *                     names the token id), or every logit is -Inf
 *   KV_ERR_INVALID    NULL argument, or the current params fail sampler_params_validate.
 * Time: O(n_vocab + repeat_last_n), no full sort: top-k is a bounded heap (quickselect for
 * top_k > 1024), top-p a quickselect on probability mass. Measured (-O2 -march=native, one
 * core): at n_vocab 152064 about 35 us with the defaults, 0.2 ms with top_k 0, 0.7-0.9 ms
 * with top_k 0 and min_p 0 (top-p over the whole vocabulary). */
int sampler_sample(sampler *s, const float *logits, int32_t *token_out, kv_error *err);

/* The distribution sampler_sample would draw from, without drawing: writes the surviving
 * tokens in ascending id into ids[0..*n_out) and their final probabilities (after
 * temperature; they sum to 1 up to rounding) into probs. ids and probs must each hold
 * n_vocab entries. Greedy (temperature <= 0) gives the single argmax with probability 1.
 * Consumes no randomness. Errors as sampler_sample. */
int sampler_dist(sampler *s, const float *logits, int32_t *ids, float *probs, int32_t *n_out,
                 kv_error *err);

/* Write logits with the current penalties applied (what top-k and later stages see) into out
 * (n_vocab floats; out may equal logits). Errors as sampler_sample. */
int sampler_penalize(sampler *s, const float *logits, float *out, kv_error *err);

/* --- the RNG, exposed so its output can be pinned by tests and reproduced elsewhere --------
 * xoshiro256** 1.0 (Blackman & Vigna, "Scrambled linear pseudorandom number generators",
 * ACM TOMS 2021; reference code prng.di.unimi.it/xoshiro256starstar.c), its 256-bit state
 * filled with four successive outputs of SplitMix64 (Steele, Lea & Flood 2014; reference code
 * prng.di.unimi.it/splitmix64.c) started from the 64-bit seed, as Vigna recommends. */
typedef struct sampler_rng {
    uint64_t s[4];
} sampler_rng;

/* One SplitMix64 step: advances *state by 0x9e3779b97f4a7c15 and returns the mixed value. */
uint64_t sampler_splitmix64(uint64_t *state);

/* Seed r: s[i] = the i-th SplitMix64 output from state = seed (never all zero). */
void sampler_rng_seed(sampler_rng *r, uint64_t seed);

/* Next 64-bit xoshiro256** output. */
uint64_t sampler_rng_next(sampler_rng *r);

/* Next output mapped to a double in [0,1): (x >> 11) * 2^-53 (the top 53 bits, every value
 * a multiple of 2^-53; Vigna, "Generating uniform doubles in the unit interval"). */
double sampler_rng_uniform(sampler_rng *r);

#endif
