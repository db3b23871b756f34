/* ops_extra: forward-pass pieces of the newer architectures (gemma, qwen3, olmo2): masked / soft-capped attention, GeGLU, per-head norms. */
#ifndef KV_OPS_EXTRA_H
#define KV_OPS_EXTRA_H

#include "kernels/threadpool.h"

/* Causal grouped-query attention with the options op_attention (ops.h) lacks. Query t (position
 * pos0 + t) of head h attends to kv head h / (n_head / n_head_kv) at positions
 * [lo, pos0 + t], lo = max(0, pos0 + t - n_swa + 1) when n_swa > 0 (sliding window of n_swa
 * positions including its own, as Mistral / Gemma 2 define it), else 0. Scores are
 * s = scale * q.k; with softcap > 0 they become softcap * tanh(s / softcap) (Gemma 2's
 * attention-logit soft-capping, Gemma Team 2024) before the softmax. q and out are
 * [n_tokens][n_head * head_dim]; K, V are f32 rows [pos0 + n_tokens][n_head_kv * head_dim].
 * Split over the pool by (token, head); per-thread scores from tpool_scratch. */
void op_attention_ext(const float *q, const float *K, const float *V, float *out, int n_tokens, int pos0,
                      int n_head, int n_head_kv, int head_dim, float scale, float softcap, int n_swa, tpool *pool);

/* GeGLU with the tanh approximation of GELU (Shazeer 2020; Hendrycks & Gimpel 2016):
 * gate[i] = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up[i], n elements. */
void op_geglu_tanh(float *gate, const float *up, int n);

/* Soft-capping in place: x[i] = cap * tanh(x[i] / cap), n elements (Gemma 2's final logits). */
void op_softcap(float *x, int n, float cap);

/* RMSNorm of each of n_head heads of head_dim floats in place, all with the same weight
 * w[head_dim] (Qwen3 / Gemma 3's q_norm and k_norm: "QK-norm", Dehghani et al. 2023). */
void op_rmsnorm_heads(float *x, const float *w, int n_head, int head_dim, float eps);

#endif
