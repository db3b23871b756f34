/* model: a LLaMA-family transformer loaded from GGUF (llama, qwen2) and its forward pass. */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kv_cache.h"
#include "kv_error.h"
#include "kernels/threadpool.h"

enum model_arch { ARCH_LLAMA = 0, ARCH_QWEN2 = 1 };

typedef struct model_hparams {
    int arch;             /* enum model_arch */
    int n_vocab;
    int n_ctx_train;      /* {arch}.context_length */
    int n_embd;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;         /* n_embd / n_head */
    int n_embd_kv;        /* n_head_kv * head_dim */
    int n_ff;
    int n_rot;            /* rotary dims per head ({arch}.rope.dimension_count, default head_dim) */
    int rope_neox;        /* 1: NEOX-style pairs (i, i + n_rot/2) */
    float rope_freq_base; /* default 10000 */
    float rms_norm_eps;
} model_hparams;

typedef struct model_layer {
    const float *attn_norm, *ffn_norm;          /* [n_embd], f32 copies */
    const float *bq, *bk, *bv;                  /* attention biases (qwen2) or NULL */
    const gguf_tensor *wq, *wk, *wv, *wo;        /* [n_embd -> n_embd], [n_embd -> n_embd_kv] … */
    const gguf_tensor *w_gate, *w_up, *w_down;   /* SwiGLU FFN */
} model_layer;

typedef struct model {
    gguf_file *gguf;
    model_hparams hp;
    char *name;              /* general.name or the file's base name */
    const char *arch_name;   /* "llama" / "qwen2" */
    int weight_type;         /* ggml_type of most 2-D weights (for the status bar) */
    uint64_t n_params;
    const gguf_tensor *tok_embd, *output;   /* output == tok_embd when tied */
    const float *output_norm;
    const float *rope_freqs;                /* n_rot/2 factors or NULL */
    model_layer *layers;
    float *f32_store;                       /* owns the f32 norm/bias copies */
    void *packed;                           /* matrices repacked at load (op_weights_pack) */
} model;

/* Load and validate a model: the GGUF file (see gguf_open), the architecture
 * (general.architecture: llama or qwen2, else "architecture 'X' is not supported (supported:
 * llama, qwen2)"), required hyperparameters, and every tensor's presence, shape and type (an
 * unsupported weight type is an error naming the tensor and type). Weights stay mmap'd.
 * Errors name the file and the key or tensor. Source: GGUF spec, llama.cpp's tensor naming. */
int model_load(const char *path, model **out, kv_error *err);
void model_free(model *m);

/* Working memory of the forward pass for batches of up to n_batch tokens and a cache of up
 * to n_ctx positions; allocated once, reused for every call (no allocation per token). */
typedef struct forward_ctx forward_ctx;
forward_ctx *forward_ctx_create(const model *m, int n_batch, int n_ctx, kv_error *err);
void forward_ctx_free(forward_ctx *fc);
int forward_ctx_n_batch(const forward_ctx *fc);

/* Run tokens[0..n_tokens) at positions kv_cache_n_tokens(kv) … through the model, storing
 * their K/V in the cache, and write logits: the last token's n_vocab logits to `logits`, or
 * with all_logits every token's ([n_tokens][n_vocab]). n_tokens must be 1..n_batch and fit in
 * the cache (else KV_ERR_CONTEXT / KV_ERR_INVALID). Token ids out of range → KV_ERR_INVALID.
 * Architecture: Touvron et al. 2023 (LLaMA): pre-RMSNorm, RoPE, grouped-query causal
 * attention (Ainslie et al. 2023), SwiGLU FFN; qwen2 adds QKV biases and NEOX rotary pairs. */
int model_forward(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens,
                  int n_tokens, float *logits, int all_logits, kv_error *err);
/* The same on sequence `seq` of a paged cache (kv_cache.h): positions continue at
 * kv_seq_n_tokens(kv, seq); blocks are reserved (copy-on-write) before and committed (hashed)
 * after. model_forward uses KV_SEQ_DEFAULT. KV_ERR_INVALID for an unknown sequence,
 * KV_ERR_CONTEXT when the sequence or the block budget is full. */
int model_forward_seq(const model *m, forward_ctx *fc, kv_cache *kv, int seq, tpool *pool, const int32_t *tokens,
                      int n_tokens, float *logits, int all_logits, kv_error *err);

/* Bytes of weights read per decoded token (every 2-D weight once), for bandwidth figures. */
uint64_t model_weight_bytes(const model *m);

#endif
