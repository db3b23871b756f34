/* generate: an inference session (model, tokenizer, KV cache, threads) and the generation loop. */
#ifndef KV_GENERATE_H
#define KV_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "gen_stats.h"
#include "kv_error.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"

typedef struct engine_params {
    const char *model_path;
    int n_ctx;      /* positions per sequence; 0: the model's training context, capped so the KV
                       cache and attention scratch of one full sequence take at most half of
                       MemAvailable (/proc/meminfo) — engine_notice() then says so */
    int n_batch;    /* prefill chunk (tokens per forward call); 0: 512 */
    int n_threads;  /* 0: all online CPUs */
    int kv_type;    /* ggml_type of the KV cache: GGML_TYPE_F16 (default), GGML_TYPE_Q8_0 or
                       GGML_TYPE_F32 */
    int kv_blocks;  /* KV block budget over all sequences and cached prefixes (kv_cache.h);
                       0: 2 * ceil(n_ctx / KV_BLOCK_SIZE) */
    int kv_reserve; /* 1: allocate the whole budget up front; 0 (default): grow block by block */
    int kv_seqs;    /* > 1 with kv_blocks 0: a budget of (kv_seqs + 1) full sequences (a server's
                       parallel requests, cached prefixes beside them) */
    int n_keep;     /* context shift: positions kept at the start (at least 4 attention sinks);
                       default for engine_generate / gen_opts.n_keep = 0 */
    int truncate_prompt; /* engine_generate: a prompt longer than the context is truncated
                            (gen_stats.n_truncated says by how much) instead of an error */
    int no_context_shift;/* engine_generate: finish with GEN_FINISH_CONTEXT instead of shifting */
    int kv_swa_full;     /* 1: sliding-window layers keep every position (as llama.cpp's --swa-full);
                            0 (default): only their window (kv_cache.h), freeing older blocks */
} engine_params;

void engine_params_default(engine_params *p);

/* Callbacks of a generation; any may be NULL. on_text receives complete UTF-8 text as it is
 * produced (the piece(s) of `token`; token -1 for the final flush); returning 2 ends
 * generation with GEN_FINISH_STOP (a stop string appeared), any other nonzero value with
 * GEN_FINISH_CANCELLED. on_token is called for every sampled token (an end-of-generation one
 * too, and one whose text is not complete yet), before its text. should_stop is polled between
 * decode steps and between prefill chunks. */
typedef struct gen_callbacks {
    int (*on_text)(void *ud, const char *text, size_t len, int32_t token);
    int (*should_stop)(void *ud);
    void *ud;
    void (*on_token)(void *ud, int32_t token, int is_eog);
    /* Prefill progress: `done` of the prompt's `total` tokens are in the KV cache (reused ones
     * included), called before the first chunk and after every chunk. */
    void (*on_prefill)(void *ud, int done, int total);
    /* > 0: size prefill chunks (at most n_batch) so each takes about this many milliseconds, so
     * should_stop is seen that often (an interactive caller; the first chunk is sized from the
     * model's weights, 2 flops each per token at a conservative speed, the rest from the measured
     * speed). 0: chunks of n_batch. A cancel keeps the chunks computed so far in the cache. */
    double prefill_slice_ms;
    /* With prefill_slice_ms: polled between the layers of a prefill chunk (so a stop waits for
     * one layer, not a whole forward pass — on a busy machine a pass of even a few tokens can take
     * 500 ms); nonzero stops the prefill as should_stop does, the chunk not counted. Must be cheap
     * (an atomic load): it runs n_layer times per chunk. NULL: chunks run whole. */
    int (*should_abort)(void *ud);
} gen_callbacks;

typedef struct engine engine;

/* Load the model and its tokenizer, reserve the KV cache and start the thread pool.
 * Errors: those of model_load / tokenizer_load, KV_ERR_NOMEM. */
int engine_open(const engine_params *p, engine **out, kv_error *err);
void engine_close(engine *e);

const model *engine_model(const engine *e);
const tokenizer *engine_tokenizer(const engine *e);
kv_cache *engine_kv(engine *e);
int engine_n_ctx(const engine *e);
int engine_n_threads(const engine *e);
/* Expert usage of a mixture-of-experts model in the last engine_generate_seq (its prompt and
 * reply): counts[il * n_expert + e] as forward_ctx_expert_counts gives them; NULL for a dense model. */
const uint32_t *engine_expert_counts(const engine *e, int *n_layer, int *n_expert);
/* Tokens whose K/V the default sequence holds, in order (length kv_cache_n_tokens). */
const int32_t *engine_history(const engine *e, int *n);
/* Empty the default sequence (a new conversation); its full blocks stay cached for reuse. */
void engine_reset(engine *e);

/* Tokenize user/prompt text: add_bos per the model unless no_bos; control tokens only when
 * parse_special. *out malloc'd. */
int engine_tokenize(const engine *e, const char *text, size_t len, int no_bos, int parse_special, int32_t **out,
                    size_t *n, kv_error *err);
/* A chat prompt as one text: tokenizer_encode_prompt with the BOS the model asks for unless
 * no_bos (literal[i] != 0: byte i is message text, never a control token; NULL: none). */
int engine_tokenize_prompt(const engine *e, const char *text, size_t len, const unsigned char *literal, int no_bos,
                           int32_t **out, size_t *n, kv_error *err);

/* Feed prompt[0..n_prompt) and generate up to n_predict tokens (< 0: until end of
 * generation, at most n_ctx tokens) with sampler s, on the default sequence, with the
 * engine_params' n_keep / truncate_prompt / no_context_shift (see engine_generate_seq, which
 * this is). The longest prefix of `prompt` already in the KV cache is reused (the sequence's
 * own, then cached blocks by hash); only the rest is prefilled, in chunks of n_batch.
 * Generated tokens are appended to the cache history, so a follow-up request whose prompt
 * extends this conversation prefills only its new tokens. When the context fills up during
 * decoding it shifts (keeps n_keep positions, drops half of the rest) and goes on. The
 * penalties' history gets the prompt and the generated tokens. Returns KV_OK with *finish set
 * (EOG, LENGTH, CONTEXT, CANCELLED), or an error (*finish = GEN_FINISH_ERROR): a prompt of
 * n_ctx tokens or more without truncate_prompt (KV_ERR_CONTEXT, the message gives both
 * numbers), non-finite logits (KV_ERR_NONFINITE). */
int engine_generate(engine *e, const int32_t *prompt, size_t n_prompt, int n_predict, sampler *s,
                    const gen_callbacks *cb, gen_stats *st, int *finish, kv_error *err);

/* Logits of the last forward pass (n_vocab floats), for tests and tools. */
const float *engine_logits(const engine *e);
/* The logits the token being reported was sampled from (n_vocab floats): valid inside
 * gen_callbacks.on_token / on_text; with speculative decoding a row of the verification pass,
 * otherwise engine_logits(). Raw model output: before penalties and temperature. */
const float *engine_token_logits(const engine *e);
int engine_n_batch(const engine *e);
int engine_kv_type(const engine *e);
/* One forward call of n tokens (1..n_batch) on seq: logits gets the last row (all_logits 0) or
 * every row ([n][n_vocab], all_logits 1). Errors of model_forward_seq. */
int engine_forward(engine *e, int seq, const int32_t *tokens, int n, float *logits, int all_logits, kv_error *err);
/* The engine's forward-pass memory (n_batch rows) and thread pool, for the batched
 * multi-sequence pass (gen_batch.h, batch.h); used on the engine's thread only. */
forward_ctx *engine_forward_ctx(engine *e);
tpool *engine_pool(engine *e);

/* ---- conversations: sequences on the paged KV cache ------------------------------------
 *
 * A sequence is one token history with its K/V (a conversation, or a branch of one). Sequences
 * share the K/V of common prefixes block by block (PagedAttention, Kwon et al. 2023): forking
 * copies nothing and computes nothing; a request reuses its sequence's own matching prefix
 * and then every following full block (KV_BLOCK_SIZE tokens) whose chained hash is cached —
 * from any live sequence or from freed ones not yet evicted (vLLM automatic prefix caching).
 * ENGINE_SEQ_DEFAULT always exists: engine_generate / engine_history / engine_reset use it.
 * Ids are small non-negative integers; a freed id may be given out again.
 *
 * How the chat's commands map onto this (S = the conversation's sequence, P = the prompt of
 * the last reply: everything up to the assistant's turn, R = the reply's tokens):
 *   /regen   engine_generate_seq(S, P) again — S's cached P is reused up to its last token
 *            (one token is fed to get logits), the old reply is cut off; TTFT ≈ one decode
 *            step. To keep the old reply as a branch: B = engine_seq_fork(S, |P|) and
 *            generate on B.
 *   /undo    engine_seq_truncate(S, n) to the length before the undone message (or simply send
 *            the next prompt: the longest common prefix is kept, the rest dropped; its full
 *            blocks stay cached, so a later redo is cheap too).
 *   /edit    engine_generate_seq(S, P') with the edited prompt: the prefix up to the edited
 *            message is reused; fork first to keep the original as a branch.
 *   /branch  B = engine_seq_fork(S, n) at the branch point (n = -1: all), then generate on B;
 *            both stay live, sharing the prefix blocks copy-on-write.
 *   switch   keep only the shown branch's sequence alive if memory is tight: engine_seq_free
 *            the others; when one is shown again, engine_generate_seq (or engine_prefill_seq)
 *            on a new sequence with its tokens re-adopts every still-cached full block.
 *   close    engine_seq_free.
 * After a context shift a sequence holds fewer tokens than were generated: build the next
 * prompt from engine_seq_tokens(S) (plus the new message), not from the full transcript.
 */
#define ENGINE_SEQ_DEFAULT 0

/* Options of one request; zero-initialised = defaults. */
typedef struct gen_opts {
    int n_predict;       /* tokens to generate; < 0: until end of generation, at most n_ctx
                            tokens in this request (so it always ends, shifts or not) */
    int n_keep;          /* positions a context shift keeps, e.g. the system prompt's length;
                            at least 4 (attention sinks, StreamingLLM), at most 3/4 n_ctx */
    int truncate_prompt; /* a prompt of n_ctx tokens or more keeps its first n_keep and its last
                            (n_ctx - n_keep) / 2 tokens (gen_stats.n_truncated > 0) instead of
                            failing with KV_ERR_CONTEXT */
    int no_context_shift;/* finish with GEN_FINISH_CONTEXT when the sequence is full */
    int no_length_cap;   /* with n_predict < 0: no cap at n_ctx tokens (the caller stops it, e.g.
                            a live token limit or a cancel) */
    const struct spec_params *spec; /* speculative decoding (engine/speculate.h); NULL or mode off:
                            plain decoding, one token per forward pass */
} gen_opts;

/* The gen_opts engine_generate uses (n_keep, truncate_prompt, no_context_shift from the
 * engine_params; n_predict -1). */
void engine_default_opts(const engine *e, gen_opts *o);

/* New empty sequence; *seq = its id. KV_ERR_NOMEM. */
int engine_seq_new(engine *e, int *seq, kv_error *err);
/* New sequence sharing the first n tokens of src (n < 0: all): no copy, no computation.
 * KV_ERR_INVALID (unknown src), KV_ERR_NOMEM. */
int engine_seq_fork(engine *e, int src, int n, int *seq, kv_error *err);
/* Release a sequence (the default one is emptied instead). Its full blocks stay cached for
 * prefix reuse until evicted. KV_ERR_INVALID for an unknown id. */
int engine_seq_free(engine *e, int seq);
/* Context shift of a full sequence (what engine_generate_seq does when it fills n_ctx): keep the
 * first n_keep positions (the caller's resolved n_keep: at least 4 attention sinks), drop half
 * of the rest, re-rotate the kept later keys to their new positions (kv_seq_shift); st (may be
 * NULL) counts the shift and the positions dropped. KV_ERR_CONTEXT (nothing to drop; a model
 * whose layers do not share one RoPE: NoPE layers, a second RoPE base), KV_ERR_INVALID. */
int engine_seq_shift(engine *e, int seq, int n_keep, gen_stats *st, kv_error *err);
/* Keep the first n tokens of seq. KV_ERR_INVALID for an unknown id. */
int engine_seq_truncate(engine *e, int seq, int n);
/* The tokens seq holds K/V for, in order; *n their count. NULL (and *n = 0) for an unknown id. */
const int32_t *engine_seq_tokens(const engine *e, int seq, int *n);

/* engine_generate on sequence seq with options o (NULL: defaults, n_predict -1): the longest
 * common prefix of seq's tokens and the prompt is kept (at most n_prompt - 1, so the last
 * prompt token is fed for logits), then cached blocks are adopted by hash, the rest is
 * prefilled in chunks of n_batch, and tokens are sampled and fed until end of generation,
 * n_predict, a cancel, or a full sequence: then (unless no_context_shift) the context shifts —
 * keep n_keep, drop half of the rest, re-rotate the kept keys (kv_seq_shift) — and decoding
 * goes on. st (may be NULL) reports reuse, truncation and shifts; the KV cache stats
 * (kv_cache_get_stats on engine_kv) report the request's prefix hits too.
 * Errors: KV_ERR_INVALID (unknown seq, empty prompt), KV_ERR_CONTEXT (the prompt does not fit
 * and truncate_prompt is off; the block budget is exhausted), KV_ERR_NONFINITE. */
int engine_generate_seq(engine *e, int seq, const int32_t *prompt, size_t n_prompt, const gen_opts *o, sampler *s,
                        const gen_callbacks *cb, gen_stats *st, int *finish, kv_error *err);

/* Make seq hold exactly tokens[0..n) (reuse as above, but up to all n; the rest prefilled),
 * without sampling: e.g. to warm a restored conversation. engine_logits() is valid only when
 * something was computed (st->n_prefilled > 0). cb->should_stop is honoured between chunks
 * (then KV_ERR_CANCELLED). Errors as engine_generate_seq; n must be < n_ctx. */
int engine_prefill_seq(engine *e, int seq, const int32_t *tokens, size_t n, const gen_callbacks *cb, gen_stats *st,
                       kv_error *err);

/* Serialize positions [0, n) of seq (n < 0: all) to a malloc'd blob (format: kv_seq_save in
 * kv_cache.h; versioned, checksummed, tagged with engine_model_fingerprint). The caller frees
 * it. The SQLite prefix store keys it by (engine_model_fingerprint, kv_prefix_hash(tokens, n)). */
int engine_seq_save(engine *e, int seq, int n, void **blob, size_t *len, kv_error *err);
/* Serialize only positions [a, n) of seq (n < 0: to its end) as a delta over its first a
 * tokens (kv_seq_save_range): a a multiple of KV_BLOCK_SIZE within seq's clean part, else
 * KV_ERR_INVALID. The base [0, a) is saved once on its own (engine_seq_save(seq, a)) and
 * shared by every delta that starts with it; restoring = the base, then the delta. */
int engine_seq_save_range(engine *e, int seq, int a, int n, void **blob, size_t *len, kv_error *err);
/* Restore a blob into seq. A whole blob replaces seq's contents; a delta needs seq to hold its
 * base's tokens already (KV_ERR_INVALID otherwise) and replaces what follows them. A corrupt
 * blob, one of another model, KV type or shape is an error (KV_ERR_FORMAT /
 * KV_ERR_UNSUPPORTED / KV_ERR_CONTEXT) and seq is untouched. Logits computed after a restore
 * equal bitwise those of the saved sequence. */
int engine_seq_restore(engine *e, int seq, const void *blob, size_t len, kv_error *err);
/* 64-bit identity of the model file: kv_checksum64 of its GGUF header, metadata and tensor
 * table (everything before the tensor data), mixed with the file size. */
uint64_t engine_model_fingerprint(const engine *e);
/* Drop every cached, unreferenced prefix block (a cold cache, for benchmarks). */
void engine_drop_prefix_cache(engine *e);
/* Sequences the caller keeps only while memory allows (e.g. a server's finished requests kept
 * whole for the next requests' prefixes): when a forward pass or a context shift needs KV blocks
 * the budget no longer has (cached prefix blocks are evicted first), fn(ud) is called until it
 * has them — fn releases one such sequence (engine_seq_free; never one being generated on) and
 * returns nonzero, or returns 0 when none is left (kv_cache_set_reclaim). Called on the engine's
 * thread, from inside engine_generate_seq / gen_batch_step. fn NULL: none (the default). */
void engine_set_reclaim(engine *e, int (*fn)(void *ud), void *ud);

/* A message for the user from engine_open (e.g. "n_ctx capped at … by available memory"), or
 * NULL. */
const char *engine_notice(const engine *e);

/* Parse a KV cache type name: "f16", "q8_0" or "f32" → ggml type id, or -1. */
int engine_kv_type_from_name(const char *name);

#endif
