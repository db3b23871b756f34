/* worker: the generator thread — owns the engine while a request runs, streams text and live stats through an event queue, honours cancel and live sampling parameters. */
#ifndef KV_WORKER_H
#define KV_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "generate.h"
#include "kv_cache.h"
#include "kv_error.h"
#include "sampler.h"

/*
 * DESIGN.md "The two threads": the UI thread never calls the model. It hands a request to
 * the worker (worker_submit), poll()s worker_fd() next to the terminal, and drains events
 * with worker_next_event(). The worker thread tokenizes, prefills and decodes; between
 * prefill chunks and between decode steps it checks the cancel flag and applies sampling
 * parameters posted with worker_set_params (so a slider moved mid-reply acts on the next
 * token). Events are coalesced: all text produced since the last drain comes as one TEXT
 * event, only the newest stats snapshot is kept, and DONE comes after the last text.
 * No curses, no I/O other than the wake-up descriptor.
 */

/* A piece of prompt text. The segments of a request are joined and tokenized as one text;
 * control-token strings are matched only in parse_special = 1 segments (a chat template's
 * scaffolding), never in parse_special = 0 ones (message contents), so text a user or a model
 * wrote never becomes a control token. */
typedef struct worker_segment {
    const char *text;
    size_t len;
    int parse_special;
} worker_segment;

typedef struct worker_request {
    const worker_segment *seg; /* copied by worker_submit */
    size_t n_seg;              /* 0 (without append): only reset_cache, no generation */
    int no_bos;                /* do not add the model's BOS before the first segment */
    int n_predict;             /* tokens to generate, < 0 until end of text or a full context
                                  (live: see worker_set_n_predict) */
    int reset_cache;           /* engine_reset first (a new conversation) */
    const int32_t *conv;       /* with set_conv: the conversation's tokens (copied by submit) */
    size_t n_conv;
    int set_conv;              /* after reset_cache, make conv the conversation (what append
                                  continues) — e.g. a saved chat being resumed — and offer it to
                                  the restore hook (worker_hooks) */
    int append;                /* the prompt is the conversation so far — the previous request's
                                  prompt and every token it generated, exactly as generated —
                                  followed by the segments (no BOS; with a SentencePiece space
                                  prefix, one leading space of the first segment is dropped as
                                  the prefix stands for it). So a new message prefills only its
                                  own tokens, never re-tokenized history. Without append the
                                  segments are the whole prompt and the engine reuses the longest
                                  cached prefix. */
    const worker_segment *keep_seg; /* the start of the prompt a context shift (and a truncated
                                  prompt) must keep: e.g. the template's prefix and the system
                                  prompt rendered alone. The tokens the prompt shares with their
                                  tokenization are kept (at least the engine's n_keep; at most
                                  3/4 n_ctx: worker_event.keep_wanted then says more was asked).
                                  Copied by worker_submit. */
    size_t n_keep_seg;
    /* Several candidates of the reply instead of one streamed sample (e.g. a chat's /best N,
     * /beams N). best_of > 1: that many samples from one prefill, decoded together
     * (engine/best_of.h, seeds: the sampler's seed + i), ranked by mean log-probability;
     * beams > 1: beam search with that many beams and length_penalty (engine/beam.h), one
     * candidate. The best candidate's text comes as TEXT events once it is chosen (nothing
     * streams before), DONE lists every candidate (worker_event.cand) and its conv is the best
     * one's; stop strings cut each candidate; a beam search is not cancelled mid-way. */
    int best_of;
    int beams;
    float length_penalty;
} worker_request;

/* One candidate reply of a best_of / beams request, best first in worker_event.cand. */
typedef struct worker_candidate {
    const char *text;      /* its text (the end-of-generation token not included), cut at a stop string */
    size_t len;
    const int32_t *conv;   /* the conversation's tokens with it: the prompt and its tokens (as worker_event.conv) */
    size_t n_conv;
    int n_tokens;          /* tokens generated (an end of generation counted) */
    double score;          /* what it was ranked by: mean log-prob (best_of) or the beam's score */
    double logprob;        /* sum of its tokens' log-probs (raw model) */
    int finish;            /* enum gen_finish */
    uint64_t seed;         /* best_of: the seed that drew it; beams: 0 */
} worker_candidate;

enum worker_phase { WORKER_IDLE = 0, WORKER_TOKENIZE, WORKER_PREFILL, WORKER_DECODE };

/* What the UI shows while a request runs. During the request gen holds live estimates
 * (n_generated, ttft_ms, prefill_tps, decode_tps over the tokens so far, itl_ms_mean/max);
 * the DONE event carries the engine's final gen_stats. kv is the engine's real cache. */
typedef struct worker_stats {
    int phase;        /* enum worker_phase */
    int prefill_done; /* PREFILL: prompt tokens in the KV cache so far (reused ones included) … */
    int prefill_total;/* … of this many */
    gen_stats gen;
    kv_cache_stats kv;
    double elapsed_ms; /* since the request started */
} worker_stats;

enum worker_event_kind { WORKER_EV_NONE = 0, WORKER_EV_TEXT, WORKER_EV_STATS, WORKER_EV_DONE };

typedef struct worker_event {
    int kind;              /* enum worker_event_kind */
    const char *text;      /* TEXT: complete UTF-8 as the model produced it (may hold control
                              bytes: display it sanitized); valid until the next call */
    size_t len;
    worker_stats stats;    /* STATS and DONE */
    int finish;            /* DONE: enum gen_finish; GEN_FINISH_NONE after a reset-only request */
    int status;            /* DONE: KV_OK, or the error of the request (err says what) */
    kv_error err;
    uint64_t seed;         /* DONE: the sampler's seed in use (to replay the reply) */
    const int32_t *conv;   /* DONE: the conversation's tokens after the request: the tokens the
                              KV cache holds (prompt and reply, minus what a context shift
                              dropped) and the last token sampled — valid until the next
                              worker_submit */
    size_t n_conv;
    int keep_wanted;       /* DONE: the positions keep_seg asked a shift to keep (0: none);
                              above stats.gen.n_keep when the engine could not keep them all */
    const worker_candidate *cand; /* DONE of a best_of / beams request: the candidates, best
                              first (cand[0] is the reply the TEXT events carried); NULL
                              otherwise. Valid until the next worker_submit */
    int n_cand;
    const uint32_t *tok_start; /* DONE: the reply's token probabilities (raw model, before
                              temperature) — bytes [tok_start[i], tok_end[i]) of the generated text
                              as the TEXT events carried it came with a token of probability
                              tok_p[i] (a best-of reply: its chosen sample's; a beam's: replayed).
                              Valid until the next worker_submit */
    const uint32_t *tok_end;
    const float *tok_p;
    size_t n_tok;
} worker_event;

typedef struct worker worker;

/* Start the generator thread for engine e and sampler s (both stay owned by the caller and
 * must not be used by any other thread while the worker lives). Returns KV_OK, or
 * KV_ERR_NOMEM / KV_ERR_IO (pipe or thread creation failed) with err filled. */
int worker_create(engine *e, sampler *s, worker **out, kv_error *err);

/* Cancel any running request, stop and join the thread, free everything. NULL is a no-op. */
void worker_destroy(worker *w);

/* Descriptor that becomes readable when events are pending (for poll()). worker_next_event
 * clears it once the queue is empty. */
int worker_fd(const worker *w);

/* Queue a request (segments are copied). KV_ERR_INVALID if the worker is busy: a request is
 * running, or its DONE event has not been taken by worker_next_event yet. */
int worker_submit(worker *w, const worker_request *r, kv_error *err);

/* 1 from worker_submit until worker_next_event has returned the request's DONE event. */
int worker_busy(worker *w);

/* Ask the running request to stop: honoured between decode steps and between prefill chunks,
 * which the worker sizes to take about WORKER_PREFILL_SLICE_MS each (the DONE event then says
 * GEN_FINISH_CANCELLED; the chunks computed stay in the KV cache for reuse). No-op when idle. */
#define WORKER_PREFILL_SLICE_MS 80
void worker_cancel(worker *w);

/* Speculative decoding (engine/speculate.h) for the requests from the next one on (copied; a
 * draft engine in it must outlive the worker's use of it; NULL: off). */
struct spec_params;
void worker_set_spec(worker *w, const struct spec_params *p);

/* Post new sampling parameters (validated by the caller: sampler_params_validate). They are
 * applied with sampler_set_params before the next token of a running request, and at the
 * start of every request. */
void worker_set_params(worker *w, const sampler_params *p);

/* Set the stop strings of the requests from the next one on (copied; n = 0: none; empty strings
 * are ignored). The worker passes every generated text through a stop matcher (stop.h): a stop
 * string is never shown, not even partly, and the reply ends with GEN_FINISH_STOP when one
 * appears (its tokens stay in the conversation's tokens; the text excludes it). Returns 0, or
 * -1 (nothing changed) for more than STOP_MAX_STRINGS strings or one of STOP_MAX_LEN bytes or
 * more. */
int worker_set_stops(worker *w, const char *const *stops, int n);

/* Change the token limit (< 0: none) of the running request, effective at its next token;
 * a limit at or below the tokens generated so far stops it (finish GEN_FINISH_LENGTH). The
 * next worker_submit sets it from its request. */
void worker_set_n_predict(worker *w, int n_predict);

/* Take the next pending event without blocking: returns 1 and fills *ev, or 0 when the queue
 * is empty (and the wake-up descriptor has been cleared). */
int worker_next_event(worker *w, worker_event *ev);

/* Hooks of the caller that run on the generator thread (they may use the engine there, and may
 * block it: the next request waits). No engine knowledge of what they do (e.g. the app's KV
 * prefix store). */
typedef struct worker_hooks {
    /* Before a request's prefill, with its prompt toks[0..n) (or, for set_conv, the
     * conversation): may replace the contents of ENGINE_SEQ_DEFAULT (engine_seq_restore) with
     * K/V that covers more of toks than it holds; the engine then keeps the longest common
     * prefix and prefills only the rest. */
    void (*restore)(void *ud, engine *e, const int32_t *toks, size_t n);
    /* After the DONE event of a request that ran the model was posted: conv[0..n_conv) as in
     * worker_event.conv, finish its gen_finish (e.g. to save the KV cache). */
    void (*saved)(void *ud, engine *e, const int32_t *conv, size_t n_conv, int finish);
    void *ud;
} worker_hooks;

/* Install hooks (NULL: none); they apply from the next request on. */
void worker_set_hooks(worker *w, const worker_hooks *h);

#endif
