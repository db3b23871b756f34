/* model: a decoder-only transformer loaded from GGUF (llama, qwen2, qwen3, smollm3, granite, olmo2, gemma2, gemma3, phi3, mistral3, internlm2; mixture-of-experts qwen2moe, qwen3moe, olmoe, gpt-oss) and its forward pass. */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kv_cache.h"
#include "kv_error.h"
#include "moe.h"
#include "kernels/threadpool.h"

enum model_arch {
    ARCH_LLAMA = 0, ARCH_QWEN2, ARCH_QWEN3, ARCH_SMOLLM3, ARCH_GRANITE, ARCH_OLMO2, ARCH_GEMMA2, ARCH_GEMMA3, ARCH_PHI3,
    ARCH_QWEN2MOE, ARCH_QWEN3MOE, ARCH_OLMOE, /* mixture of experts (engine/moe.h) */
    ARCH_MISTRAL3, ARCH_INTERNLM2,
    ARCH_GPTOSS,                              /* gpt-oss: MoE, attention sinks, alternating sliding windows */
};
enum { QK_NORM_NONE = 0, QK_NORM_HEAD = 1, QK_NORM_FULL = 2 }; /* per head [head_dim] / whole projection */
enum { FFN_SILU = 0, FFN_GELU_TANH = 1 };                         /* the gated FFN's activation */

typedef struct model_hparams {
    int arch;             /* enum model_arch */
    int n_vocab;
    int n_ctx_train;      /* {arch}.context_length */
    int n_embd;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;         /* {arch}.attention.key_length, default n_embd / n_head */
    int n_embd_q;         /* n_head * head_dim: width of q and of the attention output */
    int n_embd_kv;        /* n_head_kv * head_dim */
    int n_ff;
    int n_rot;            /* rotary dims per head ({arch}.rope.dimension_count, default head_dim) */
    int rope_neox;        /* 1: NEOX-style pairs (i, i + n_rot/2) */
    float rope_freq_base; /* default 10000 */
    float rms_norm_eps;
    /* what the newer architectures add to llama (neutral values for llama / qwen2) */
    int qk_norm;          /* QK_NORM_*: RMSNorm of q and k before RoPE (qwen3, gemma3: per head; olmo2: whole) */
    int pre_norm;         /* 1: attn_norm / ffn_norm before the blocks (all but olmo2) */
    int post_norm;        /* 1: post_attention_norm / post_ffw_norm on the blocks' outputs (olmo2, gemma) */
    int ffn_act;          /* FFN_SILU (SwiGLU) or FFN_GELU_TANH (GeGLU, gemma) */
    int fused;            /* 1: attn_qkv and ffn_up holding gate|up (phi3) */
    float embd_scale;     /* token embeddings times this (gemma: sqrt(n_embd); granite: embedding_scale) */
    float residual_scale; /* block outputs times this before the residual add (granite) */
    float logit_scale;    /* logits divided by this (granite) */
    float attn_scale;     /* query scale, default 1/sqrt(head_dim) (granite: attention.scale) */
    float attn_softcap;   /* > 0: attention logits soft-capped (gemma2) */
    float final_softcap;  /* > 0: output logits soft-capped (gemma2) */
    int n_swa;            /* sliding window in positions (0: none) for layers with swa */
    int swa_period;       /* layer il slides when il % swa_period < swa_period - 1 (gemma2 2, gemma3 6) */
    float rope_freq_base_swa; /* RoPE base of the sliding layers (gemma3: 10000) */
    int no_rope_step;     /* > 0: layers with (il + 1) % no_rope_step == 0 have no RoPE (smollm3: 4) */
    int n_ctx_orig;       /* rope.scaling.original_context_length (phi3 LongRoPE), 0 if absent */
    float rope_attn_factor; /* rope.scaling.attn_factor (phi3): RoPE's cos and sin times this, so
                               q.k grows by its square (LongRoPE's attention scaling); default 1 */
    int rope_uniform;     /* 1: every layer rotates alike (context shift can re-rotate the cache) */
    moe_config moe;       /* mixture of experts: moe.n_expert > 0 (qwen2moe, qwen3moe, olmoe), else all 0 */
    float attn_temp_scale;/* > 0: queries at position p times 1 + attn_temp_scale * ln(1 + floor(p /
                             attn_temp_len)) (mistral3's attention.temperature_scale, Llama 4's
                             position-dependent temperature); 0: none */
    int attn_temp_len;    /* positions per temperature step (rope.scaling.original_context_length) */
} model_hparams;

typedef struct model_layer {
    const float *attn_norm, *ffn_norm;          /* [n_embd], f32 copies (NULL without pre-norms) */
    const float *attn_post_norm, *ffn_post_norm;/* [n_embd] or NULL */
    const float *q_norm, *k_norm;               /* [head_dim] (per head) or [n_embd_q] / [n_embd_kv], or NULL */
    int swa;                                    /* 1: sliding-window layer */
    int use_rope;                               /* 0: no RoPE in this layer (smollm3) */
    const float *bq, *bk, *bv;                  /* attention biases (qwen2) or NULL */
    const float *bo;                            /* attention output bias [n_embd] (gpt-oss) or NULL */
    const float *sinks;                         /* attention sink logits [n_head] (gpt-oss) or NULL */
    const gguf_tensor *wq, *wk, *wv, *wo;        /* [n_embd -> n_embd_q], [n_embd -> n_embd_kv] … */
    const gguf_tensor *wqkv;                     /* fused [n_embd -> n_embd_q + 2 n_embd_kv] (phi3) or NULL */
    const gguf_tensor *w_gate, *w_up, *w_down;   /* gated FFN; fused: no gate, w_up [n_embd -> 2 n_ff] */
    moe_layer moe;                               /* MoE FFN (moe.gate_inp != NULL) instead of w_gate/up/down */
} model_layer;

typedef struct model {
    gguf_file *gguf;
    model_hparams hp;
    char *name;              /* general.name or the file's base name */
    const char *arch_name;   /* general.architecture: "llama", "qwen2", "qwen3", ... */
    int weight_type;         /* ggml_type of most 2-D weights (for the status bar) */
    uint64_t n_params;
    uint64_t n_params_active;  /* parameters a token uses: n_params less the unselected experts'
                                  (n_params for dense models) */
    const gguf_tensor *tok_embd, *output;   /* output == tok_embd when tied */
    const float *output_norm;
    const float *rope_freqs;                /* n_rot/2 factors or NULL */
    const float *rope_long, *rope_short;    /* LongRoPE factors (phi3), n_rot/2 each, or NULL */
    const float *rope_yarn;                 /* YaRN (rope.scaling.type yarn): per-pair frequency divisors
                                               (ops_extra.h op_rope_yarn_factors, rope_freqs folded in),
                                               n_rot/2, or NULL */
    const float *rope_freqs_linear;         /* gemma3 rope.scaling.factor as n_rot/2 equal factors
                                               for the global layers, or NULL */
    model_layer *layers;
    float *f32_store;                       /* owns the f32 norm/bias copies */
    void *packed;                           /* matrices repacked at load (op_weights_pack) */
} model;

/* Load and validate a model: the GGUF file (see gguf_open), the architecture
 * (general.architecture: one of MODEL_ARCHS, else "architecture 'X' is not supported (supported:
 * ...)"), required hyperparameters, and every tensor's presence, shape and type (an
 * unsupported weight type is an error naming the tensor and type). Weights stay mmap'd.
 * Errors name the file and the key or tensor. Source: GGUF spec, llama.cpp's tensor naming. */
int model_load(const char *path, model **out, kv_error *err);
#define MODEL_ARCHS "llama, qwen2, qwen3, smollm3, granite, olmo2, gemma2, gemma3, phi3, mistral3, internlm2, qwen2moe, qwen3moe, olmoe, gpt-oss"
void model_free(model *m);

/* Working memory of the forward pass for batches of up to n_batch tokens and a cache of up
 * to n_ctx positions; allocated once, reused for every call (no allocation per token). */
typedef struct forward_ctx forward_ctx;
forward_ctx *forward_ctx_create(const model *m, int n_batch, int n_ctx, kv_error *err);
void forward_ctx_free(forward_ctx *fc);
int forward_ctx_n_batch(const forward_ctx *fc);
/* Let a forward call stop mid-pass: abort_cb(ud) is polled after every matmul and attention of
 * every layer and, as the pool's cancellation (tpool_set_cancel), between the work chunks of
 * each op. When it returns nonzero the call returns KV_ERR_CANCELLED with nothing committed
 * (the sequence's length and tokens unchanged; its reserved blocks stay for the next call).
 * abort_cb must be cheap, thread-safe (the pool's workers call it) and sticky (see
 * tpool_set_cancel). NULL: never. So a stop waits for one chunk of one matmul (about 1/16 of
 * it), not one layer or one whole pass (a prefill chunk on a busy machine). */
void forward_ctx_set_abort(forward_ctx *fc, int (*abort_cb)(void *ud), void *ud);
/* The MoE FFN buffers of fc (moe_margin, moe_last_selected; tests), or NULL for a dense model. */
moe_scratch *forward_ctx_moe(forward_ctx *fc);

/* Run tokens[0..n_tokens) at positions kv_cache_n_tokens(kv) … through the model, storing
 * their K/V in the cache, and write logits: the last token's n_vocab logits to `logits`, or
 * with all_logits every token's ([n_tokens][n_vocab]). n_tokens must be 1..n_batch and fit in
 * the cache (else KV_ERR_CONTEXT / KV_ERR_INVALID). Token ids out of range → KV_ERR_INVALID.
 * Architecture: Touvron et al. 2023 (LLaMA): pre-RMSNorm, RoPE, grouped-query causal
 * attention (Ainslie et al. 2023), SwiGLU FFN; qwen2 adds QKV biases and NEOX rotary pairs;
 * qwen3 per-head q/k RMSNorm (Qwen3 technical report 2025); smollm3 no RoPE on every fourth
 * layer (NoPE, Kazemnejad et al. 2023); granite scales embeddings, residuals, attention and
 * logits (IBM Granite 3.0 report); olmo2 norms after the blocks and over whole q/k (OLMo 2,
 * 2024); gemma2/gemma3 sqrt(n_embd) embeddings, post-norms, GeGLU, sliding-window layers and
 * soft-capping (Gemma Team 2024, 2025); phi3 fused projections and LongRoPE factors
 * (Ding et al. 2024), the long ones when the context exceeds original_context_length;
 * qwen2moe / qwen3moe / olmoe replace the FFN with a mixture of experts (moe_ffn, engine/moe.h:
 * qwen3moe normalises the top-k weights, qwen2moe adds a sigmoid-gated shared expert) and count
 * each layer's expert choices (forward_ctx_expert_counts); gpt-oss (OpenAI gpt-oss model card,
 * 2025) has biases on q, k, v and the attention output, a learned attention-sink logit per head
 * (op_attention_sinks), sliding-window (attention.sliding_window, 128) and full layers
 * alternating (even layers slide), YaRN RoPE, and experts chosen by top-k over the router's
 * logits with a softmax over the chosen ones, each with biases and the clamped SwiGLU.
 * mistral3 (Ministral 3, Mistral Small 3.x) is llama with YaRN (Peng et al. 2023) and a
 * position-dependent query temperature; YaRN applies to any architecture whose file says
 * rope.scaling.type = yarn; internlm2 is llama's graph.
 * Tensor names and metadata keys as llama.cpp's gguf-py writes them. */
int model_forward(const model *m, forward_ctx *fc, kv_cache *kv, tpool *pool, const int32_t *tokens,
                  int n_tokens, float *logits, int all_logits, kv_error *err);
/* The same on sequence `seq` of a paged cache (kv_cache.h): positions continue at
 * kv_seq_n_tokens(kv, seq); blocks are reserved (copy-on-write) before and committed (hashed)
 * after. model_forward uses KV_SEQ_DEFAULT. KV_ERR_INVALID for an unknown sequence,
 * KV_ERR_CONTEXT when the sequence or the block budget is full. */
int model_forward_seq(const model *m, forward_ctx *fc, kv_cache *kv, int seq, tpool *pool, const int32_t *tokens,
                      int n_tokens, float *logits, int all_logits, kv_error *err);

/* The RoPE factors a context of n_ctx positions uses (phi3: long factors past
 * original_context_length, else short ones; others: rope_freqs), NULL for none. */
const float *model_rope_factors(const model *m, int n_ctx);
/* The sliding-window layers for kv_cache_params.swa_layers: a malloc'd [n_layer] array of flags
 * (1: layer il attends to a window of *n_swa positions), or NULL (and *n_swa = 0) when the model
 * has none or out of memory (then every layer keeps every position: correct, only larger). */
uint8_t *model_swa_layers(const model *m, int *n_swa);

/* Bytes of weights read per decoded token (every 2-D weight once; of each 3-D expert tensor the
 * n_expert_used / n_expert share a token selects), for bandwidth figures. */
uint64_t model_weight_bytes(const model *m);

/* Expert usage of a MoE model since the last reset: counts[il * n_expert + e] is how many
 * (token, expert) selections layer il made of expert e (prefill and decode alike). NULL with
 * *n_layer = *n_expert = 0 for a dense model. */
const uint32_t *forward_ctx_expert_counts(const forward_ctx *fc, int *n_layer, int *n_expert);
void forward_ctx_expert_counts_reset(forward_ctx *fc);

#endif
