/* generate: owns an inference session (model, tokenizer, paged KV cache, threads), its sequences, and runs prefix reuse + prefill + decode with context shift, sampling and timing. */
#include "generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/quant.h"
#include "ops.h"
#include "speculate.h"

#define DEFAULT_N_BATCH 512
#define MIN_N_KEEP 4          /* attention sinks (StreamingLLM, Xiao et al. 2023) */
#define MIN_SLICE_CHUNK 4     /* the smallest chunk of a sliced prefill (next_chunk) */

struct engine {
    model *m;
    tokenizer *tok;
    kv_cache *kv;
    forward_ctx *fc;
    tpool *pool;
    int n_ctx, n_batch, n_threads;
    int n_keep, truncate_prompt, no_context_shift; /* engine_generate's gen_opts */
    uint64_t fingerprint;
    char notice[320];
    float *logits;      /* n_vocab */
    const float *tok_logits; /* engine_token_logits: the row the current token was sampled from */
    int kv_type;
    char *text;         /* detokenizer output of one token */
    size_t text_cap;
};

const uint32_t *engine_expert_counts(const engine *e, int *n_layer, int *n_expert)
{
    return forward_ctx_expert_counts(e->fc, n_layer, n_expert);
}

void engine_params_default(engine_params *p)
{
    memset(p, 0, sizeof *p);
    p->kv_type = GGML_TYPE_F16;
}

const char *gen_finish_name(int finish)
{
    switch (finish) {
    case GEN_FINISH_EOG: return "end of text";
    case GEN_FINISH_LENGTH: return "length";
    case GEN_FINISH_CONTEXT: return "context full";
    case GEN_FINISH_CANCELLED: return "stopped";
    case GEN_FINISH_STOP: return "stop string";
    case GEN_FINISH_ERROR: return "error";
    default: return "none";
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int engine_kv_type_from_name(const char *name)
{
    if (!name) return -1;
    if (!strcmp(name, "f16")) return GGML_TYPE_F16;
    if (!strcmp(name, "q8_0")) return GGML_TYPE_Q8_0;
    if (!strcmp(name, "f32")) return GGML_TYPE_F32;
    return -1;
}

/* MemAvailable from /proc/meminfo in bytes, or -1. */
static long long mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb > 0 ? kb * 1024 : -1;
}

/* The default n_ctx: the training context, capped so that one full sequence's K/V plus the
 * attention's f32 scratch (forward_ctx: K and V views, scores) take at most half of the
 * memory available now. */
static int default_n_ctx(engine *e, int kv_type)
{
    const model_hparams *hp = &e->m->hp;
    int n = hp->n_ctx_train;
    size_t per_tok = 2 * (size_t)hp->n_layer * quant_row_size(kv_type, hp->n_embd_kv) +
                     2 * sizeof(float) * (size_t)hp->n_embd_kv + sizeof(float) * (size_t)hp->n_head;
    long long avail = mem_available();
    if (avail <= 0 || per_tok == 0) return n;
    long long cap = avail / 2 / (long long)per_tok;
    if (cap >= n) return n;
    int floor_ = hp->n_ctx_train < 256 ? hp->n_ctx_train : 256;
    int capped = (int)(cap / KV_BLOCK_SIZE * KV_BLOCK_SIZE);
    if (capped < floor_) capped = floor_;
    const quant_traits *qt = quant_traits_of(kv_type);
    snprintf(e->notice, sizeof e->notice,
             "n_ctx capped at %d tokens (the model was trained for %d): its %s KV cache and attention scratch for "
             "%d tokens would take %lld MiB, more than half of the %lld MiB available; choose with -c",
             capped, hp->n_ctx_train, qt ? qt->name : "?", hp->n_ctx_train,
             (long long)((size_t)hp->n_ctx_train * per_tok >> 20), avail >> 20);
    return capped;
}

int engine_open(const engine_params *p, engine **out, kv_error *err)
{
    *out = NULL;
    engine *e = calloc(1, sizeof *e);
    if (!e) return kv_error_set(err, KV_ERR_NOMEM, "out of memory");
    int rc = model_load(p->model_path, &e->m, err);
    if (rc || (rc = tokenizer_load(e->m->gguf, &e->tok, err))) goto fail;
    if (tokenizer_n_vocab(e->tok) != e->m->hp.n_vocab) {
        rc = kv_error_set(err, KV_ERR_FORMAT, "%s: the tokenizer has %d tokens but token_embd.weight has %d rows",
                          p->model_path, tokenizer_n_vocab(e->tok), e->m->hp.n_vocab);
        goto fail;
    }
    e->n_ctx = p->n_ctx > 0 ? p->n_ctx : default_n_ctx(e, p->kv_type);
    e->n_keep = p->n_keep;
    e->kv_type = p->kv_type;
    e->truncate_prompt = p->truncate_prompt;
    e->no_context_shift = p->no_context_shift;
    {
        const gguf_file *g = e->m->gguf;
        uint64_t id[2] = {kv_checksum64(g->map, (size_t)g->data_offset), g->size};
        e->fingerprint = kv_checksum64(id, sizeof id);
    }
    e->n_batch = p->n_batch > 0 ? p->n_batch : DEFAULT_N_BATCH;
    if (e->n_batch > e->n_ctx) e->n_batch = e->n_ctx;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    e->n_threads = p->n_threads > 0 ? p->n_threads : (ncpu > 0 ? (int)ncpu : 1);
    /* No BLAS call in the engine (every matmul is engine/kernels'), so no openblas_set_num_threads
     * either: it woke OpenBLAS's idle thread, which then spun on sched_yield beside the decoding
     * (perf: 15% of a stories260K reply's samples when a draft model was opened just before). */
    kv_cache_params kp = {
        .n_layer = e->m->hp.n_layer, .n_embd_kv = e->m->hp.n_embd_kv, .n_ctx = e->n_ctx, .type = p->kv_type,
        .n_blocks = p->kv_blocks, .reserve = p->kv_reserve,
    };
    if (!kp.n_blocks && p->kv_seqs > 1) kp.n_blocks = (p->kv_seqs + 1) * ((e->n_ctx + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE);
    uint8_t *swa = model_swa_layers(e->m, &kp.n_swa); /* window layers keep only their window */
    kp.swa_layers = swa;
    kp.swa_slack = p->kv_swa_full ? -1 : 0;
    e->kv = kv_cache_create_ex(&kp, err);
    free(swa);
    if (!e->kv ||
        !(e->fc = forward_ctx_create(e->m, e->n_batch, e->n_ctx, err))) {
        rc = err ? err->code : KV_ERR_NOMEM;
        goto fail;
    }
    e->pool = tpool_create(e->n_threads);
    e->logits = malloc(sizeof(float) * (size_t)e->m->hp.n_vocab);
    /* Worst case of one token: its longest piece with every byte invalid (3 bytes of U+FFFD
     * each) plus the pending bytes of an unfinished character. */
    e->text_cap = 64 + 3 * tokenizer_max_piece_len(e->tok);
    e->text = malloc(e->text_cap);
    if (!e->pool || !e->logits || !e->text) {
        rc = kv_error_set(err, KV_ERR_NOMEM, "out of memory starting %d threads", e->n_threads);
        goto fail;
    }
    *out = e;
    return KV_OK;
fail:
    engine_close(e);
    return rc ? rc : KV_ERR_NOMEM;
}

void engine_close(engine *e)
{
    if (!e) return;
    if (e->m) op_weights_stop(e->m->packed); /* first: the packing thread would slow every free below */
    tpool_free(e->pool);
    forward_ctx_free(e->fc);
    kv_cache_free(e->kv);
    tokenizer_free(e->tok);
    model_free(e->m);
    free(e->logits);
    free(e->text);
    free(e);
}

const model *engine_model(const engine *e) { return e->m; }
const tokenizer *engine_tokenizer(const engine *e) { return e->tok; }
kv_cache *engine_kv(engine *e) { return e->kv; }
int engine_n_ctx(const engine *e) { return e->n_ctx; }
int engine_n_threads(const engine *e) { return e->n_threads; }
const float *engine_logits(const engine *e) { return e->logits; }
const float *engine_token_logits(const engine *e) { return e->tok_logits ? e->tok_logits : e->logits; }
int engine_n_batch(const engine *e) { return e->n_batch; }
int engine_kv_type(const engine *e) { return e->kv_type; }
forward_ctx *engine_forward_ctx(engine *e) { return e->fc; }
tpool *engine_pool(engine *e) { return e->pool; }
const char *engine_notice(const engine *e) { return e->notice[0] ? e->notice : NULL; }
uint64_t engine_model_fingerprint(const engine *e) { return e->fingerprint; }
void engine_drop_prefix_cache(engine *e) { kv_cache_drop_cached(e->kv); }
void engine_set_reclaim(engine *e, int (*fn)(void *ud), void *ud) { kv_cache_set_reclaim(e->kv, fn, ud); }

const int32_t *engine_history(const engine *e, int *n)
{
    return engine_seq_tokens(e, ENGINE_SEQ_DEFAULT, n);
}

void engine_reset(engine *e)
{
    kv_seq_truncate(e->kv, ENGINE_SEQ_DEFAULT, 0);
}

int engine_seq_new(engine *e, int *seq, kv_error *err) { return kv_seq_new(e->kv, seq, err); }
int engine_seq_fork(engine *e, int src, int n, int *seq, kv_error *err) { return kv_seq_fork(e->kv, src, n, seq, err); }
int engine_seq_free(engine *e, int seq) { return kv_seq_free(e->kv, seq); }

int engine_seq_truncate(engine *e, int seq, int n)
{
    if (!kv_seq_valid(e->kv, seq)) return KV_ERR_INVALID;
    kv_seq_truncate(e->kv, seq, n);
    return KV_OK;
}

const int32_t *engine_seq_tokens(const engine *e, int seq, int *n)
{
    *n = kv_seq_n_tokens(e->kv, seq);
    return kv_seq_tokens(e->kv, seq);
}

int engine_seq_save(engine *e, int seq, int n, void **blob, size_t *len, kv_error *err)
{
    return kv_seq_save(e->kv, seq, n, e->fingerprint, blob, len, err);
}

int engine_seq_save_range(engine *e, int seq, int a, int n, void **blob, size_t *len, kv_error *err)
{
    return kv_seq_save_range(e->kv, seq, a, n, e->fingerprint, blob, len, err);
}

int engine_seq_restore(engine *e, int seq, const void *blob, size_t len, kv_error *err)
{
    return kv_seq_restore(e->kv, seq, blob, len, e->fingerprint, e->m->hp.n_vocab, err);
}

int engine_tokenize(const engine *e, const char *text, size_t len, int no_bos, int parse_special, int32_t **out,
                    size_t *n, kv_error *err)
{
    return tokenizer_encode(e->tok, text, len, !no_bos && tokenizer_add_bos(e->tok), parse_special, out, n, err);
}

int engine_tokenize_prompt(const engine *e, const char *text, size_t len, const unsigned char *literal, int no_bos,
                           int32_t **out, size_t *n, kv_error *err)
{
    return tokenizer_encode_prompt(e->tok, text, len, !no_bos && tokenizer_add_bos(e->tok), literal, out, n, err);
}

/* One forward call over tokens on seq (the cache records the tokens). */
static int feed(engine *e, int seq, const int32_t *tokens, int n, kv_error *err)
{
    return model_forward_seq(e->m, e->fc, e->kv, seq, e->pool, tokens, n, e->logits, 0, err);
}

int engine_forward(engine *e, int seq, const int32_t *tokens, int n, float *logits, int all_logits, kv_error *err)
{
    return model_forward_seq(e->m, e->fc, e->kv, seq, e->pool, tokens, n, logits, all_logits, err);
}

static int feed_rows(engine *e, int seq, const int32_t *tokens, int n, float *rows, kv_error *err)
{
    return model_forward_seq(e->m, e->fc, e->kv, seq, e->pool, tokens, n, rows, 1, err);
}

static int emit(engine *e, detok_stream *ds, int32_t tok, const gen_callbacks *cb)
{
    size_t n = detok_stream_push(ds, e->tok, tok, e->text, e->text_cap);
    if (n > e->text_cap) n = e->text_cap;
    if (n && cb && cb->on_text) return cb->on_text(cb->ud, e->text, n, tok);
    return 0;
}

static int resolve_keep(const engine *e, int n_keep)
{
    if (n_keep < MIN_N_KEEP) n_keep = MIN_N_KEEP;
    if (n_keep > e->n_ctx * 3 / 4) n_keep = e->n_ctx * 3 / 4;
    return n_keep;
}

/* The first prefill chunk of a sliced prefill (gen_callbacks.prefill_slice_ms): the tokens a
 * conservative 10 GFLOP/s computes in slice_ms at 2 flops per weight and token (the weights
 * counted from the shapes: attention, feed-forward, output), at most n_batch. */
static int first_chunk(const engine *e, double slice_ms)
{
    const model_hparams *hp = &e->m->hp;
    double per_layer = 2.0 * hp->n_embd * hp->n_embd + 2.0 * hp->n_embd * hp->n_embd_kv + 3.0 * hp->n_embd * hp->n_ff;
    double flops = 2.0 * (hp->n_layer * per_layer + (double)hp->n_vocab * hp->n_embd);
    double k = flops > 0 ? 10e9 * slice_ms / 1e3 / flops : e->n_batch;
    if (k < MIN_SLICE_CHUNK) k = MIN_SLICE_CHUNK;
    return k > e->n_batch ? e->n_batch : (int)k;
}

/* Sizing a sliced prefill's chunks. A forward call of k tokens takes about F + c k ms: F is
 * what every call pays whatever its size (thread-pool syncs per op, the output row, scratch),
 * c the cost per token. F and c are fitted from the last two chunks of different sizes; the next
 * chunk takes slice_ms when F is small, and 2F when F is not (so at least half of every call is
 * useful work: a busy machine's fixed costs never shrink the chunks into a prefill many times
 * slower). Between fits it doubles while chunks are quicker than slice_ms. Always within
 * [k/2, 2k], [MIN_SLICE_CHUNK, n_batch]. */
typedef struct slicer {
    int k_prev;
    double ms_prev;
    double c;      /* the last fit's cost per token (0: none yet) */
} slicer;

static int next_chunk(const engine *e, slicer *sl, int k, double ms, double slice_ms)
{
    double want = ms < slice_ms ? 2.0 * k : k;
    if (sl->k_prev && sl->k_prev != k) {
        double c = (ms - sl->ms_prev) / (k - sl->k_prev);
        if (c > 0) sl->c = c;
    }
    if (sl->c > 0) { /* F from this chunk with the last c (attention makes both grow with the position) */
        double F = ms - sl->c * k;
        if (F < 0) F = 0;
        double a = (slice_ms - F) / sl->c, b = F / sl->c;
        want = a > b ? a : b;
    }
    sl->k_prev = k;
    sl->ms_prev = ms;
    if (want > 2.0 * k) want = 2.0 * k;
    if (want < 0.5 * k) want = 0.5 * k;
    int n = (int)want;
    if (n < MIN_SLICE_CHUNK) n = MIN_SLICE_CHUNK;
    return n > e->n_batch ? e->n_batch : n;
}

/* Make seq hold prompt[0..n): keep the longest common prefix with what it holds (at most
 * reuse_max), adopt cached blocks by hash (up to reuse_max), prefill the rest. Fills the reuse
 * fields of st; *cancelled when should_stop fired between chunks. */
static int prepare(engine *e, int seq, const int32_t *prompt, int n, int reuse_max, const gen_callbacks *cb,
                   gen_stats *st, int *cancelled, kv_error *err)
{
    *cancelled = 0;
    int n_have = kv_seq_n_tokens(e->kv, seq), common = 0;
    const int32_t *have = kv_seq_tokens(e->kv, seq);
    while (common < n_have && common < reuse_max && have[common] == prompt[common]) common++;
    kv_seq_truncate(e->kv, seq, common);
    int adopted = kv_seq_adopt(e->kv, seq, prompt, reuse_max, NULL);
    int reused = kv_seq_n_tokens(e->kv, seq);
    st->n_prompt = n;
    st->n_reused = reused;
    st->n_reused_hash = adopted;
    st->n_prefilled = n - reused;
    kv_cache_note_request(e->kv, seq, n, reused, adopted, n - reused);
    int chunk = e->n_batch;
    double slice = cb ? cb->prefill_slice_ms : 0;
    slicer sl = {0};
    if (slice > 0) chunk = first_chunk(e, slice);
    if (cb && cb->on_prefill) cb->on_prefill(cb->ud, reused, n);
    for (int i = reused; i < n;) {
        if (cb && cb->should_stop && cb->should_stop(cb->ud)) {
            *cancelled = 1;
            return KV_OK;
        }
        int k = n - i < chunk ? n - i : chunk;
        double t = now_ms();
        /* a sliced (interactive) prefill also stops inside a chunk, between layers */
        if (slice > 0 && cb->should_abort) forward_ctx_set_abort(e->fc, cb->should_abort, cb->ud);
        int rc = feed(e, seq, prompt + i, k, err);
        forward_ctx_set_abort(e->fc, NULL, NULL);
        if (rc == KV_ERR_CANCELLED) {
            *cancelled = 1;
            return KV_OK;
        }
        if (rc) return rc;
        i += k;
        if (cb && cb->on_prefill) cb->on_prefill(cb->ud, i, n);
        if (slice > 0) chunk = next_chunk(e, &sl, k, now_ms() - t, slice);
    }
    return KV_OK;
}

/* The sequence is full: keep n_keep positions, drop half of the rest, re-rotate the kept keys. */
static int shift(engine *e, int seq, int n_keep, gen_stats *st, kv_error *err)
{
    const model_hparams *hp = &e->m->hp;
    int n = kv_seq_n_tokens(e->kv, seq);
    int n_discard = (n - n_keep) / 2;
    /* sliding-window layers: keep a tail at least as long as their window, so the shifted
     * window never needs kept positions whose window rows are freed (kv_seq_shift) */
    kv_cache_stats ks;
    kv_cache_get_stats(e->kv, &ks);
    if (ks.n_swa_layers && n - n_keep - n_discard < ks.swa_keep && n - n_keep - ks.swa_keep >= 1)
        n_discard = n - n_keep - ks.swa_keep;
    if (n_discard < 1) return kv_error_set(err, KV_ERR_CONTEXT, "context shift: nothing to drop (%d kept of %d)", n_keep, n);
    /* one rotation for every layer: NoPE layers (smollm3) or a second RoPE base (gemma3) would
     * need per-layer re-rotation, which kv_seq_shift does not do */
    if (!hp->rope_uniform)
        return kv_error_set(err, KV_ERR_CONTEXT, "context is full and context shift is not supported for %s models",
                            e->m->arch_name);
    kv_rope rope = {
        .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .n_rot = hp->n_rot, .neox = hp->rope_neox,
        .freq_base = hp->rope_freq_base, .freq_factors = model_rope_factors(e->m, e->n_ctx),
    };
    int rc = kv_seq_shift(e->kv, seq, n_keep, n_discard, &rope, err);
    if (rc) return rc;
    if (st) st->n_shifts++, st->n_discarded += n_discard;
    return KV_OK;
}

int engine_seq_shift(engine *e, int seq, int n_keep, gen_stats *st, kv_error *err)
{
    if (!kv_seq_valid(e->kv, seq)) return kv_error_set(err, KV_ERR_INVALID, "context shift: no KV sequence %d", seq);
    return shift(e, seq, n_keep, st, err);
}

int engine_prefill_seq(engine *e, int seq, const int32_t *tokens, size_t n, const gen_callbacks *cb, gen_stats *st,
                       kv_error *err)
{
    gen_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    if (!kv_seq_valid(e->kv, seq)) return kv_error_set(err, KV_ERR_INVALID, "no KV sequence %d", seq);
    if (n > (size_t)e->n_ctx)
        return kv_error_set(err, KV_ERR_CONTEXT, "%zu tokens do not fit the context of %d; raise -c", n, e->n_ctx);
    double t0 = now_ms();
    int cancelled = 0;
    int rc = prepare(e, seq, tokens, (int)n, (int)n, cb, st, &cancelled, err);
    st->prefill_ms = now_ms() - t0;
    st->prefill_tps = st->prefill_ms > 0 ? st->n_prefilled / (st->prefill_ms / 1e3) : 0;
    if (!rc && cancelled) rc = kv_error_set(err, KV_ERR_CANCELLED, "prefill cancelled");
    return rc;
}

void engine_default_opts(const engine *e, gen_opts *o)
{
    *o = (gen_opts){.n_predict = -1, .n_keep = e->n_keep, .truncate_prompt = e->truncate_prompt,
                    .no_context_shift = e->no_context_shift};
}

int engine_generate(engine *e, const int32_t *prompt, size_t n_prompt, int n_predict, sampler *s,
                    const gen_callbacks *cb, gen_stats *st, int *finish, kv_error *err)
{
    gen_opts o = {
        .n_predict = n_predict, .n_keep = e->n_keep, .truncate_prompt = e->truncate_prompt,
        .no_context_shift = e->no_context_shift,
    };
    return engine_generate_seq(e, ENGINE_SEQ_DEFAULT, prompt, n_prompt, &o, s, cb, st, finish, err);
}

/* The decode loop's state: what deliver() needs for every sampled token. */
typedef struct dec_state {
    engine *e;
    int seq;
    const gen_opts *o;
    sampler *s;
    const gen_callbacks *cb;
    gen_stats *st;
    detok_stream ds;
    double t0, t_prev, t_first, itl_sum;
} dec_state;

/* A sampled token (e->tok_logits: the row it came from): timings, penalty history, callbacks,
 * text, and the end conditions. Returns a gen_finish (GEN_FINISH_NONE: go on). */
static int deliver(dec_state *d, int32_t tok)
{
    engine *e = d->e;
    gen_stats *st = d->st;
    const gen_callbacks *cb = d->cb;
    double t = now_ms();
    st->n_generated++;
    if (st->n_generated == 1) {
        st->ttft_ms = t - d->t0;
        d->t_first = t;
    } else {
        double gap = t - d->t_prev;
        d->itl_sum += gap;
        if (gap > st->itl_ms_max) st->itl_ms_max = gap;
    }
    d->t_prev = t;
    sampler_accept(d->s, tok);
    int eog = tokenizer_is_eog(e->tok, tok);
    if (cb && cb->on_token) cb->on_token(cb->ud, tok, eog);
    if (eog) return GEN_FINISH_EOG;
    int stop = emit(e, &d->ds, tok, cb);
    if (stop) return stop == 2 ? GEN_FINISH_STOP : GEN_FINISH_CANCELLED;
    if (d->o->n_predict >= 0 && st->n_generated >= d->o->n_predict) return GEN_FINISH_LENGTH;
    if (d->o->n_predict < 0 && !d->o->no_length_cap && st->n_generated >= e->n_ctx)
        return GEN_FINISH_CONTEXT; /* a whole context's worth: never endless */
    if (cb && cb->should_stop && cb->should_stop(cb->ud)) return GEN_FINISH_CANCELLED;
    return GEN_FINISH_NONE;
}

/* The weights a token streams through (the matrices of the layers and the output; not the
 * embedding table, of which it reads one row). */
static double token_weights(const model *m)
{
    double n = (double)m->n_params_active;
    if (m->tok_embd && m->output != m->tok_embd) n -= (double)m->tok_embd->n_elements;
    return n > 0 ? n : 1;
}

/* A draft model's cost per token relative to the target's: the ratio of the weights each token
 * goes through (multiply-adds per token; Leviathan et al. 2023's c). */
static double draft_cost(const engine *target, const engine *draft)
{
    return draft ? token_weights(draft->m) / token_weights(target->m) : 0;
}

/* One pass of speculative decoding (engine/speculate.h): the pending token *tok and up to k
 * drafts through the target at once, then each row decides a token until the first rejection;
 * the sequence is cut back to hold everything emitted but the last token, which becomes *tok. */
static int spec_step(dec_state *d, spec_state *sp, int32_t *tok, int *fin, kv_error *err)
{
    engine *e = d->e;
    int base = kv_seq_n_tokens(e->kv, d->seq);
    int max_k = e->n_ctx - base - 1;
    if (d->o->n_predict >= 0 && d->o->n_predict - d->st->n_generated - 1 < max_k)
        max_k = d->o->n_predict - d->st->n_generated - 1;
    int32_t batch[SPEC_MAX_DRAFT + 1];
    batch[0] = *tok;
    int k = 0;
    /* a paused drafter (the back-off) skips gathering the context: the step is plain decoding's */
    if (max_k > 0 && !spec_paused(sp)) {
        /* the context: the sequence's tokens and the pending one */
        int n_hist = base + 1;
        int32_t *hist = malloc(sizeof(int32_t) * (size_t)n_hist);
        if (!hist) return kv_error_set(err, KV_ERR_NOMEM, "out of memory drafting");
        memcpy(hist, kv_seq_tokens(e->kv, d->seq), sizeof(int32_t) * (size_t)base);
        hist[base] = *tok;
        double t = now_ms();
        k = spec_propose(sp, hist, n_hist, max_k, d->s, batch + 1, err);
        free(hist);
        if (k < 0) return err && err->code ? err->code : KV_ERR_INVALID;
        if (k > 0) spec_time(sp, k, now_ms() - t);
    }
    float *rows = spec_rows(sp);
    double t_feed = now_ms();
    int rc = feed_rows(e, d->seq, batch, k + 1, rows, err);
    if (rc) return rc;
    if (k == 0) spec_time(sp, 0, now_ms() - t_feed);
    d->st->draft_stopped = spec_too_costly(sp);
    d->st->n_verify++;
    d->st->n_drafted += k;
    int m = 0, j = 0;
    for (int i = 0; i <= k; i++) {
        int32_t t;
        int acc;
        const float *row = rows + (size_t)i * e->m->hp.n_vocab;
        if ((rc = spec_verify(sp, d->s, row, i, i < k ? batch[i + 1] : -1, &t, &acc, err))) break;
        j += acc;
        m++;
        e->tok_logits = row;
        *tok = t;
        *fin = deliver(d, t);
        if (*fin || !acc) break;
    }
    e->tok_logits = NULL;
    d->st->n_accepted += j;
    spec_feedback(sp, k, j);
    kv_seq_truncate(e->kv, d->seq, base + m);
    return rc;
}

int engine_generate_seq(engine *e, int seq, const int32_t *prompt, size_t n_prompt, const gen_opts *o, sampler *s,
                        const gen_callbacks *cb, gen_stats *st, int *finish, kv_error *err)
{
    gen_stats local;
    gen_opts defaults = {.n_predict = -1};
    if (!st) st = &local;
    if (!o) o = &defaults;
    memset(st, 0, sizeof *st);
    *finish = GEN_FINISH_ERROR;
    if (!kv_seq_valid(e->kv, seq)) return kv_error_set(err, KV_ERR_INVALID, "no KV sequence %d", seq);
    if (n_prompt == 0) return kv_error_set(err, KV_ERR_INVALID, "the prompt is empty");
    forward_ctx_expert_counts_reset(e->fc); /* engine_expert_counts: this request's */
    int n_keep = resolve_keep(e, o->n_keep);
    st->n_keep = n_keep;
    const int32_t *P = prompt;
    int32_t *trunc = NULL;
    int n = (int)n_prompt;
    if (n_prompt >= (size_t)e->n_ctx) {
        if (!o->truncate_prompt)
            return kv_error_set(err, KV_ERR_CONTEXT,
                                "the prompt is %zu tokens but the context holds %d; shorten it or raise -c", n_prompt,
                                e->n_ctx);
        /* keep the start (system prompt / sinks) and the most recent tokens */
        int tail = (e->n_ctx - n_keep) / 2;
        if (!(trunc = malloc(sizeof(int32_t) * (size_t)(n_keep + tail))))
            return kv_error_set(err, KV_ERR_NOMEM, "out of memory truncating the prompt");
        memcpy(trunc, prompt, sizeof(int32_t) * (size_t)n_keep);
        memcpy(trunc + n_keep, prompt + n_prompt - tail, sizeof(int32_t) * (size_t)tail);
        P = trunc;
        n = n_keep + tail;
        st->n_truncated = (int)n_prompt - n;
    }
    double t0 = now_ms();

    /* Reuse the longest cached prefix; at least one token is always fed to get logits. */
    int cancelled = 0;
    int rc = prepare(e, seq, P, n, n - 1, cb, st, &cancelled, err);
    st->n_prompt = (int)n_prompt;
    if (rc || cancelled) {
        st->prefill_ms = now_ms() - t0;
        free(trunc);
        if (!rc) *finish = GEN_FINISH_CANCELLED;
        return rc;
    }
    for (int i = 0; i < n; i++) sampler_accept(s, P[i]);
    free(trunc);
    P = NULL;
    spec_state *sp = NULL;
    if (o->spec && o->spec->mode != SPEC_OFF &&
        !(sp = spec_state_create(o->spec, e->m->hp.n_vocab, e->n_batch, sampler_seed(s))))
        rc = kv_error_set(err, KV_ERR_NOMEM, "out of memory for speculative decoding");
    if (sp && o->spec->mode == SPEC_DRAFT) spec_set_cost(sp, draft_cost(e, o->spec->draft));
    /* a draft model reads the prompt now: part of the prefill (TTFT), not of the first draft */
    if (sp && !rc) rc = spec_prefill(sp, kv_seq_tokens(e->kv, seq), kv_seq_n_tokens(e->kv, seq), err);
    double t_prefill = now_ms();
    st->prefill_ms = t_prefill - t0;
    st->prefill_tps = st->prefill_ms > 0 ? st->n_prefilled / (st->prefill_ms / 1e3) : 0;

    dec_state d = {.e = e, .seq = seq, .o = o, .s = s, .cb = cb, .st = st, .t0 = t0};
    detok_stream_init(&d.ds);
    int fin = GEN_FINISH_NONE;
    int32_t tok;
    if (!rc && !(rc = sampler_sample(s, e->logits, &tok, err))) {
        e->tok_logits = e->logits;
        fin = deliver(&d, tok);
    }
    while (!rc && !fin) {
        if (kv_seq_n_tokens(e->kv, seq) >= e->n_ctx) {
            if (o->no_context_shift) {
                fin = GEN_FINISH_CONTEXT;
                break;
            }
            if ((rc = shift(e, seq, n_keep, st, err))) break;
        }
        if (sp) {
            rc = spec_step(&d, sp, &tok, &fin, err);
            continue;
        }
        if ((rc = feed(e, seq, &tok, 1, err))) break;
        if ((rc = sampler_sample(s, e->logits, &tok, err))) break;
        e->tok_logits = e->logits;
        fin = deliver(&d, tok);
    }
    spec_state_free(sp);
    e->tok_logits = NULL;
    detok_stream ds = d.ds;
    double t_prev = d.t_prev, t_first = d.t_first, itl_sum = d.itl_sum;
    size_t nt = detok_stream_flush(&ds, e->text, e->text_cap);
    if (nt && cb && cb->on_text) cb->on_text(cb->ud, e->text, nt < e->text_cap ? nt : e->text_cap, -1);
    if (st->n_generated > 1) {
        st->decode_ms = t_prev - t_first;
        st->itl_ms_mean = itl_sum / (st->n_generated - 1);
        st->decode_tps = st->decode_ms > 0 ? (st->n_generated - 1) / (st->decode_ms / 1e3) : 0;
    }
    if (rc) return rc;
    *finish = fin;
    return KV_OK;
}
