/* gen_batch: continuous batching — many generations (streams), each on its own KV sequence with its own sampler and callbacks, stepped together: one model_forward_batch per step over a decode token of every decoding stream and prefill chunks of new ones. */
#ifndef KV_GEN_BATCH_H
#define KV_GEN_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "gen_stats.h"
#include "generate.h"

/*
 * Iteration-level scheduling (Yu et al. 2022, "Orca", OSDI'22): streams join and leave between
 * steps; every step runs one forward pass (batch.h) over
 *   - the pending token of every decoding stream (one row each, logits asked for), then
 *   - prefill chunks of streams still taking their prompt, in the order they were given, until
 *     the step holds `budget` tokens (so a long prompt never stalls the others' decode for
 *     more than a chunk; with no decoding stream the budget is the engine's n_batch),
 * and then samples, for every stream that got logits, its next token with the stream's own
 * sampler, stop strings (through its callbacks) and limits, exactly as engine_generate_seq does
 * for one sequence — so at temperature 0 every stream produces the tokens it produces alone
 * (tests/test_gen_batch.c). Prefix reuse as engine_generate_seq: the sequence's own common
 * prefix, then cached blocks by hash (vLLM automatic prefix caching) — looked up again before
 * every chunk, so a stream whose prompt shares blocks that another stream finished computing in
 * an earlier step adopts them instead of computing them twice.
 *
 * A stream whose sequence fills n_ctx shifts its context between steps exactly as
 * engine_generate_seq does (engine_seq_shift: keep n_keep, drop half of the rest; the other
 * streams are not touched) and goes on — or, with gen_opts.no_context_shift or a model that
 * cannot shift, finishes with GEN_FINISH_CONTEXT. Not done here: sliced prefill by time.
 * One thread (the engine's) calls everything here.
 */

typedef struct gen_stream gen_stream;

/* A stream on sequence seq for prompt[0..n_prompt) (copied), with options o (NULL: defaults),
 * sampler s and callbacks cb (both kept by reference until gen_stream_free; cb->should_stop is
 * polled at every step, on_prefill after every chunk; prefill_slice_ms is ignored).
 * prefill_only: take the prompt into the cache (all of it reused or computed) and finish with
 * GEN_FINISH_NONE, without sampling — e.g. the shared prefix of best-of-n forks. Errors:
 * KV_ERR_INVALID (unknown seq, empty prompt), KV_ERR_CONTEXT (the prompt does not fit and
 * o->truncate_prompt is off), KV_ERR_NOMEM. */
int gen_stream_begin(engine *e, int seq, const int32_t *prompt, size_t n_prompt, const gen_opts *o, sampler *s,
                     const gen_callbacks *cb, int prefill_only, gen_stream **out, kv_error *err);
void gen_stream_free(gen_stream *gs);
/* 1 once the stream has finished (*finish: why; GEN_FINISH_ERROR after a failed step). */
int gen_stream_done(const gen_stream *gs, int *finish);
int gen_stream_seq(const gen_stream *gs);
/* The stream's timings and reuse so far (final once done). */
const gen_stats *gen_stream_stats(const gen_stream *gs);
/* The n_vocab logits the stream's last token was sampled from (valid inside its on_token
 * callback and until the next step), or NULL before its first token. */
const float *gen_stream_logits(const gen_stream *gs);

/* The scheduler's memory: a batch of up to the engine's n_batch tokens and logits rows for up
 * to max_streams streams. */
typedef struct gen_batch gen_batch;
gen_batch *gen_batch_create(engine *e, int max_streams, kv_error *err);
void gen_batch_free(gen_batch *b);

/* One step over streams[0..n) (finished ones are skipped; n <= max_streams): a stream whose
 * should_stop fires finishes with GEN_FINISH_CANCELLED before the forward pass. budget: prefill
 * tokens a step may add while some stream decodes (<= 0: 32). Returns the number of tokens the
 * forward pass ran (0: nothing to do — every stream is done), or -1 with err set when the
 * forward pass failed (every stream that had tokens in it finishes with GEN_FINISH_ERROR; the
 * others go on). */
int gen_batch_step(gen_batch *b, gen_stream **streams, int n, int budget, kv_error *err);

#endif
