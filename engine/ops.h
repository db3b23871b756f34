/* ops: the numeric building blocks of the forward pass (norms, rotary embedding, matmul, softmax). */
#ifndef KV_OPS_H
#define KV_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "threadpool.h"

/* RMSNorm (Zhang & Sennrich 2019): out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], n elements.
 * out may alias x. */
void op_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* Rotary position embedding (Su et al. 2021, RoFormer) applied in place to n_head heads of
 * head_dim floats each (vec is [n_head][head_dim]); only the first n_rot dims of each head
 * rotate. theta_i = pos * freq_base^(-2i/n_rot) / freq_factors[i] (factors may be NULL; they are
 * Llama 3.1's rope_freqs). neox = 0: pairs (2i, 2i+1) as in llama's GGUF layout;
 * neox = 1: pairs (i, i + n_rot/2) as in GPT-NeoX / Qwen2. cs holds n_rot floats of
 * precomputed (cos, sin) pairs from op_rope_cache for this position. */
void op_rope_cache(float *cs, int pos, int n_rot, float freq_base, const float *freq_factors);
void op_rope(float *vec, int n_head, int head_dim, int n_rot, const float *cs, int neox);

/* Re-rotate keys already rotated for position p so they stand at p + delta (delta may be
 * negative): rotations in each pair's plane compose, R(p + delta) = R(delta) R(p), and theta is
 * linear in the position also with rope_freqs factors, so this applies op_rope with the
 * (cos, sin) of position `delta` — same pairs (neox or not) and factors as op_rope_cache /
 * op_rope. vec is [n_head][head_dim]. Used by the KV cache's context shift (StreamingLLM,
 * Xiao et al. 2023; llama.cpp's K-shift). No allocation for n_rot <= 1024. */
void op_rope_shift(float *vec, int n_head, int head_dim, int n_rot, int delta, float freq_base,
                   const float *freq_factors, int neox);

/* Numerically stable softmax in place over n floats. */
void op_softmax(float *x, int n);

/* SwiGLU (Shazeer 2020): gate[i] = silu(gate[i]) * up[i], n elements. */
void op_swiglu(float *gate, const float *up, int n);

/* Scratch a matmul needs for the activations converted to the weight's dot-product type:
 * bytes for n_tokens rows of n_in. */
size_t op_matmul_scratch_size(const gguf_tensor *w, int n_tokens);

/* y[t][o] = sum_i w[o][i] * x[t][i] for t < n_tokens, o < n_out, where w is a 2-D tensor
 * with ne[0] = n_in, ne[1] = n_out in any type quant.h supports. x is [n_tokens][n_in] f32,
 * y is [n_tokens][n_out] f32. F32 weights with n_tokens > 1 go through OpenBLAS sgemm;
 * otherwise the activations are converted once to the weight type's vec_dot_type (as the
 * reference does, e.g. Q8_0 for Q4_0) in `scratch` and rows are split over the pool. */
void op_matmul(const gguf_tensor *w, const float *x, int n_tokens, float *y, void *scratch, tpool *pool);

/* Copy row `row` of a 2-D tensor (any supported type) into dst as f32 (ne[0] floats). */
void op_get_row(const gguf_tensor *w, int64_t row, float *dst);

#endif
