/* ops_extra: forward-pass pieces of the newer architectures (gemma, qwen3, olmo2, gpt-oss): masked / soft-capped / sink attention, YaRN, GeGLU, clamped SwiGLU, per-head norms. */
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

/* op_attention_ext with attention sinks: sinks[h] (n_head logits, or NULL for none) is one more
 * logit in head h's softmax denominator that attends to nothing — p_j = exp(s_j) / (Σ_k exp(s_k) +
 * exp(sinks[h])), so a head can put weight on "no position" (StreamingLLM's sink, Xiao et al. 2023,
 * learned per head in gpt-oss: OpenAI gpt-oss model card 2025). The sink is not scaled or capped. */
void op_attention_sinks(const float *q, const float *K, const float *V, float *out, int n_tokens, int pos0,
                        int n_head, int n_head_kv, int head_dim, float scale, float softcap, int n_swa,
                        const float *sinks, tpool *pool);

/* gpt-oss's gated unit (OpenAI gpt-oss reference implementation, `swiglu`): g = min(gate, limit),
 * u = clamp(up, −limit, limit), gate[i] = g·σ(alpha·g)·(u + 1); gpt-oss: alpha 1.702, limit 7. */
void op_swiglu_oai(float *gate, const float *up, int n, float alpha, float limit);

/* GeGLU with the tanh approximation of GELU (Shazeer 2020; Hendrycks & Gimpel 2016):
 * gate[i] = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up[i], n elements. */
void op_geglu_tanh(float *gate, const float *up, int n);

/* Soft-capping in place: x[i] = cap * tanh(x[i] / cap), n elements (Gemma 2's final logits). */
void op_softcap(float *x, int n, float cap);

/* RMSNorm of each of n_head heads of head_dim floats in place, all with the same weight
 * w[head_dim] (Qwen3 / Gemma 3's q_norm and k_norm: "QK-norm", Dehghani et al. 2023). */
void op_rmsnorm_heads(float *x, const float *w, int n_head, int head_dim, float eps);

/* YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models")
 * as per-pair frequency divisors for op_rope_cache: pair i (of n_rot/2) rotates by
 * theta_i = pos * base^(-2i/n_rot) / ff[i] with
 *   ff[i] = freq_factors[i] / (s (1 - r_i) + r_i),  s = 1 / factor (position interpolation),
 * r_i = ext_factor * ramp_i, where ramp_i is 1 for pairs that turn more than beta_fast times over
 * n_ctx_orig positions (kept as trained: extrapolated), 0 for those that turn fewer than beta_slow
 * times (interpolated), linear in between over the pair index: with
 * d(b) = n_rot ln(n_ctx_orig / (2 pi b)) / (2 ln base), low = max(0, floor(d(beta_fast))),
 * high = min(n_rot - 1, ceil(d(beta_slow))), ramp_i = 1 - clamp((i - low) / max(0.001, high - low)).
 * The boundaries are computed in single precision as llama.cpp's ggml does. freq_factors may be
 * NULL (all 1). theta stays linear in the position, so context shift re-rotates with ff too. */
void op_rope_yarn_factors(float *ff, int n_rot, float freq_base, float factor, int n_ctx_orig, float beta_fast,
                          float beta_slow, float ext_factor, const float *freq_factors);

/* YaRN's attention scaling ("mscale", applied to RoPE's cos and sin, so q.k grows by its square):
 * attn_factor (rope.scaling.yarn_attn_factor, 1 when absent) times, unless ext_factor is 0,
 * m(factor, 1) with m(f, k) = 1 + 0.1 k ln f for f > 1, else 1 — the paper's sqrt(1/t) =
 * 0.1 ln(s) + 1 — or, with log_mul > 0 (rope.scaling.yarn_log_multiplier, HF's mscale_all_dim,
 * with mscale 1), m(factor, 1) / m(factor, log_mul), as Hugging Face's transformers computes
 * attention_factor. */
float op_rope_yarn_mscale(float factor, float attn_factor, float ext_factor, float log_mul);

#endif
