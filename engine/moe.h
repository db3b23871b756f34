/* moe: the mixture-of-experts FFN block — router, top-k selection and weight normalisation, the 3-D expert tensors, grouped expert matmuls, shared expert. */
#ifndef KV_MOE_H
#define KV_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kv_error.h"
#include "kernels/threadpool.h"

/* How the router's logits become expert weights (llama.cpp's expert gating functions). */
enum {
    MOE_GATING_SOFTMAX = 0,        /* p = softmax(logits) over all experts; top-k of p; weights p[sel]
                                      (Qwen2-MoE, Qwen3-MoE, OLMoE, Mixtral) */
    MOE_GATING_SOFTMAX_WEIGHT = 1, /* top-k of the logits; weights = softmax over the k selected
                                      logits (gpt-oss) */
};
/* The experts' gated activation. */
enum {
    MOE_ACT_SILU = 0,       /* SwiGLU: silu(gate) * up (Shazeer 2020) */
    MOE_ACT_SWIGLU_OAI = 1, /* gpt-oss: min(gate, 7) σ(1.702 min(gate, 7)) (clamp(up, ±7) + 1) (op_swiglu_oai) */
};

/* What a model's MoE blocks share (from its GGUF metadata and architecture). */
typedef struct moe_config {
    int n_expert;      /* {arch}.expert_count */
    int n_expert_used; /* {arch}.expert_used_count: k experts per token */
    int n_ff_exp;      /* rows of each expert's gate / up matrix ({arch}.expert_feed_forward_length) */
    int n_ff_shexp;    /* rows of the shared expert's gate / up ({arch}.expert_shared_feed_forward_length), 0: none */
    int gating;        /* MOE_GATING_* */
    int norm_w;        /* 1: the k selected weights are divided by their sum (clamped to >= 2^-14) */
    float w_scale;     /* != 0 and != 1: the weights are multiplied by it afterwards */
    int act;           /* MOE_ACT_* */
} moe_config;

/* One layer's MoE tensors (GGUF names as llama.cpp's gguf-py writes them). */
typedef struct moe_layer {
    const gguf_tensor *gate_inp;                   /* blk.N.ffn_gate_inp: [n_embd -> n_expert], 2-D, any type */
    const float *gate_inp_b;                       /* router bias [n_expert] or NULL */
    const gguf_tensor *gate_exps, *up_exps;        /* blk.N.ffn_{gate,up}_exps: ne [n_embd, n_ff_exp, n_expert] */
    const gguf_tensor *down_exps;                  /* blk.N.ffn_down_exps: ne [n_ff_exp, n_embd, n_expert] */
    const float *gate_exps_b, *up_exps_b;          /* per-expert biases [n_expert][n_ff_exp] or NULL */
    const float *down_exps_b;                      /* [n_expert][n_embd] or NULL */
    const gguf_tensor *gate_shexp, *up_shexp;      /* shared expert [n_embd -> n_ff_shexp] or NULL */
    const gguf_tensor *down_shexp;                 /* [n_ff_shexp -> n_embd] or NULL */
    const float *gate_inp_shexp;                   /* [n_embd]: the shared expert's output times
                                                      sigmoid(gate_inp_shexp . x), or NULL (ungated) */
} moe_layer;

/* Find and check one layer's MoE tensors: ffn_gate_inp, ffn_{gate,up,down}_exps (3-D, shapes
 * from cfg and n_embd) and, when cfg->n_ff_shexp > 0, ffn_{gate,up,down}_shexp. Errors name the
 * file, the tensor and the expected shape (KV_ERR_FORMAT) or an unsupported weight type
 * (KV_ERR_UNSUPPORTED). The shared expert's gate vector (a 1-D tensor) and biases are loaded by
 * the caller, which owns f32 copies. */
int moe_find_layer(const gguf_file *f, int il, int n_embd, const moe_config *cfg, moe_layer *L, kv_error *err);

/* The matrix of one expert e of a 3-D expert tensor, as a 2-D tensor view (ne [ne0, ne1]; data,
 * and packed when the whole tensor was packed in panels or copied by op_weights_pack). */
gguf_tensor moe_expert_view(const gguf_tensor *t, int e);

/* Working memory of moe_ffn for batches of up to n_batch tokens (allocated once). */
typedef struct moe_scratch moe_scratch;
moe_scratch *moe_scratch_create(const moe_config *cfg, int n_embd, int n_batch, const moe_layer *layers, int n_layer,
                                kv_error *err);
void moe_scratch_free(moe_scratch *s);

/* The MoE FFN of one layer for n_tokens (1..n_batch) normalised inputs x [n_tokens][n_embd] into
 * out [n_tokens][n_embd] (overwritten):
 *   logits = gate_inp x (+ gate_inp_b); SOFTMAX: p = softmax(logits), the k = n_expert_used experts
 *   of largest p (ties: the lower expert index first, as the reference's sort does for up to 16
 *   experts), w_j = p[sel_j]; SOFTMAX_WEIGHT: top-k of the logits, w = softmax(selected logits);
 *   norm_w: w_j /= max(sum w, 2^-14); w_scale; then
 *   out = sum_j w_j down_e(act(gate_e x) * up_e x) (j in rank order)
 *       [+ sigmoid(gate_inp_shexp . x) down_s(act(gate_s x) * up_s x)].
 * Only the selected experts' weight rows are read (decode reads k experts' matrices and never
 * touches another's pages). A batch is grouped by expert: each selected expert's gate, up and
 * down matrices stream through the cache once per batch, multiplied with all of its tokens (the
 * panel GEMM where the weights are packed, quant_gemm on the GGUF rows otherwise), all experts'
 * row chunks shared over the pool in one pass (the shared expert's gate and up in the experts'
 * gate / up pass, its down in their down pass); the kernels are the run-time dispatched quant_*
 * ones for every weight type. counts (n_expert entries) is incremented per (token, selected
 * expert), or NULL. Sources: Shazeer et al. 2017 (sparsely-gated MoE), Fedus et al. 2021
 * (Switch), Qwen1.5-MoE / Qwen3 / OLMoE (Muennighoff et al. 2024) reports; llama.cpp's
 * build_moe_ffn for the order of operations. A stop set on the pool (tpool_set_cancel) is
 * polled between the passes' chunks (whole panels, at most ~2^26 multiply-adds each:
 * op_matmul_chunk_rows); once it says stop, moe_ffn returns early and out is undefined. */
void moe_ffn(const moe_config *cfg, const moe_layer *L, const float *x, int n_tokens, float *out, moe_scratch *s,
             uint32_t *counts, tpool *pool);

/* The experts selected for token t of the last moe_ffn call on s (k ids, rank order) and
 * their weights; for tests. */
const int32_t *moe_last_selected(const moe_scratch *s, int t);
const float *moe_last_weights(const moe_scratch *s, int t);

/* Routing margins, for tests against a reference that rounds differently: moe_margin(s, t) is the
 * smallest, over the moe_ffn calls since moe_margin_reset, of token t's gap between the k-th
 * selected expert's score and the best unselected one's (router logits for SOFTMAX_WEIGHT,
 * probabilities for SOFTMAX; +inf when every expert is used). A gap within the two pipelines'
 * rounding is a near-tie: the reference may route the token to the other expert. */
void moe_margin_reset(moe_scratch *s);
float moe_margin(const moe_scratch *s, int t);

#endif
