/* gen_model: `kvchat gen-model` — random-weight GGUF files of real model shapes (llama, qwen2/3, smollm3, granite, olmo2, gemma2/3, phi3, mistral3, internlm2; MoE qwen3moe, qwen2moe, olmoe), for benchmarks and reference tests. */
/*
 * Speed does not depend on weight values, so these files let `kvchat bench` and llama.cpp's
 * bench measure TinyLlama-, Llama-3.2-1B- and Qwen2.5-0.5B-sized models without a download.
 * Weights are random blocks of the chosen GGML type (random quants, scales sized so every
 * weight has a standard deviation near 0.02, as an initialised network would), norms are 1.
 * The mix of types follows llama-quantize: "q4_k_m" is Q4_K with Q6_K for the output matrix
 * and for attn_v / ffn_down of the layers use_more_bits() picks, and rows whose length is not
 * a multiple of 256 fall back to Q5_0 / Q8_0; "q5_k_m" is the same mix over Q5_K (fallback
 * Q5_1 / Q8_0); the other types are pure (every 2-D weight in that type, like llama-quantize
 * --pure). The tokenizer is a self-contained SentencePiece-style vocabulary — <unk> <s> </s>,
 * the 256 byte tokens <0x00>…<0xFF>, then filler pieces — padded to the shape's vocabulary
 * size, which both kvchat and llama.cpp load.
 * Files are streamed to disk (gguf_writer_add_tensor_fill), never held in memory.
 * The shapes of the newer architectures also carry what those add (q/k norms, post-norms,
 * sliding windows, scales, fused projections, LongRoPE factors), with the metadata keys and
 * tensor names llama.cpp's gguf-py writes; their norm weights are random around 1 (not all 1)
 * so that a norm applied to the wrong vector shows in the logits. The mixture-of-experts shapes
 * write the router ffn_gate_inp (F32, as convert_hf_to_gguf keeps it), the 3-D expert tensors
 * ffn_{gate,up,down}_exps ([n_embd, n_ff_exp, n_expert] / [n_ff_exp, n_embd, n_expert], typed as
 * their dense counterparts) and, for qwen2moe, the shared expert ffn_{gate,up,down}_shexp with its
 * F32 gate vector ffn_gate_inp_shexp, plus expert_count / expert_used_count /
 * expert_feed_forward_length / expert_shared_feed_forward_length. The output is a function of
 * (shape, type, layers, vocab, window, seed) only: byte-identical on every run.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/tools.h"
#include "engine/gguf.h"
#include "engine/gguf_writer.h"
#include "engine/kernels/quant.h"

enum {
    SH_QKV_BIAS = 1,     /* attn_q/k/v.bias (qwen2) */
    SH_QK_NORM_HEAD = 2, /* attn_q_norm / attn_k_norm of [head_dim] (qwen3, gemma3) */
    SH_QK_NORM_FULL = 4, /* attn_q_norm / attn_k_norm of [n_embd_q] / [n_embd_kv] (olmo2) */
    SH_NO_PRE_NORM = 8,  /* no attn_norm / ffn_norm (olmo2) */
    SH_POST_NORM = 16,   /* post_attention_norm / post_ffw_norm (olmo2, gemma) */
    SH_FUSED = 32,       /* attn_qkv and ffn_up = gate|up, no ffn_gate (phi3) */
    SH_RANDOM_NORMS = 64, /* norm weights 1 + U(-0.25, 0.25) instead of 1 */
    SH_GPTOSS = 128       /* gpt-oss: post_attention_norm as the FFN norm, attn_output.bias, attn_sinks,
                             router and expert biases, YaRN (factor 32 over 4096) */
};

typedef struct shape {
    const char *name, *arch, *title;
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx;
    float rope_base, eps;
    int tied;       /* output shares token_embd */
    int flags;      /* SH_* */
    int head_dim;   /* attention.key_length / value_length; 0: n_embd / n_head (no key) */
    int n_rot;      /* rope.dimension_count; 0: head_dim */
    int n_swa;      /* attention.sliding_window; 0: no key */
    int n_ctx_orig; /* rope.scaling.original_context_length and LongRoPE factor tensors; 0: none */
    /* granite's scales: embedding_scale, residual_scale, logit_scale, attention.scale (0: no key) */
    float embd_scale, residual_scale, logit_scale, attn_scale;
    float attn_softcap, final_softcap; /* gemma2's attn_logit_softcapping / final_logit_softcapping (0: no key) */
    float rope_scale;       /* rope.scaling.type linear + rope.scaling.factor (gemma3 4B+; 0: no key) */
    float rope_attn_factor; /* rope.scaling.attn_factor (phi3 LongRoPE; 0: no key) */
    /* YaRN (mistral3): rope.scaling.type yarn, factor, original_context_length (yarn_orig),
     * yarn_beta_fast / slow, yarn_log_multiplier; attention.temperature_scale (0: no key) */
    float yarn_factor;
    int yarn_orig;
    float yarn_beta_fast, yarn_beta_slow, yarn_log_mul, attn_temp_scale;
} model_shape;

/* What the mixture-of-experts shapes add (by shape name; a shape not listed is dense). */
typedef struct moe_shape {
    const char *name;
    int n_expert, n_expert_used;
    int n_ff_exp;   /* expert_feed_forward_length (0: no key, the experts are n_ff wide: olmoe) */
    int n_ff_shexp; /* expert_shared_feed_forward_length and a shared expert (0: none) */
} moe_shape;
static const moe_shape MOE_SHAPES[] = {
    {"qwen3-30b-a3b", 128, 8, 768, 0},      /* 128 experts of 768, 8 per token */
    {"qwen1.5-moe-a2.7b", 60, 4, 1408, 5632}, /* 60 experts of 1408, 4 per token, a shared expert */
    {"olmoe-1b-7b", 64, 8, 0, 0},           /* 64 experts of feed_forward_length 1024, 8 per token */
    {"gpt-oss-20b", 32, 4, 2880, 0},        /* 32 experts of 2880, 4 per token */
};

#define R SH_RANDOM_NORMS
static const model_shape SHAPES[] = {
    {"tinyllama", "llama", "TinyLlama-1.1B", 32000, 2048, 22, 32, 4, 5632, 2048, 10000.0f, 1e-5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"llama3.2-1b", "llama", "Llama-3.2-1B", 128256, 2048, 16, 32, 8, 8192, 131072, 500000.0f, 1e-5f, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen2.5-0.5b", "qwen2", "Qwen2.5-0.5B", 151936, 896, 24, 14, 2, 4864, 32768, 1000000.0f, 1e-6f, 1, SH_QKV_BIAS, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"tiny", "llama", "tiny", 1024, 256, 2, 4, 2, 512, 2048, 10000.0f, 1e-5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* Qwen3-0.6B: head_dim 128 while n_embd / n_head is 64 */
    {"qwen3-0.6b", "qwen3", "Qwen3-0.6B", 151936, 1024, 28, 16, 8, 3072, 40960, 1000000.0f, 1e-6f, 1,
     SH_QK_NORM_HEAD | R, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"smollm3-3b", "smollm3", "SmolLM3-3B", 128256, 2048, 36, 16, 4, 11008, 65536, 5000000.0f, 1e-6f, 1, R, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* granite-3.1-2b: embedding_multiplier 12, residual_multiplier 0.22, logits_scaling 8,
     * attention_multiplier 1/64 */
    {"granite-3-2b", "granite", "Granite-3.1-2B", 49155, 2048, 40, 32, 8, 8192, 131072, 5000000.0f, 1e-5f, 1, R,
     0, 0, 0, 0, 12.0f, 0.22f, 8.0f, 0.015625f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"olmo2-1b", "olmo2", "OLMo-2-0425-1B", 100352, 2048, 16, 16, 16, 8192, 4096, 500000.0f, 1e-6f, 0,
     SH_QK_NORM_FULL | SH_NO_PRE_NORM | SH_POST_NORM | R, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"gemma2-2b", "gemma2", "Gemma-2-2B", 256000, 2304, 26, 8, 4, 9216, 8192, 10000.0f, 1e-6f, 1, SH_POST_NORM | R,
     256, 0, 4096, 0, 0, 0, 0, 0, 50.0f, 30.0f, 0, 0, 0, 0, 0, 0, 0, 0},
    {"gemma3-1b", "gemma3", "Gemma-3-1B", 262144, 1152, 26, 4, 1, 6912, 32768, 1000000.0f, 1e-6f, 1,
     SH_QK_NORM_HEAD | SH_POST_NORM | R, 256, 0, 512, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* Gemma-3-4B: linear RoPE scaling (factor 8) on the global layers */
    {"gemma3-4b", "gemma3", "Gemma-3-4B", 262208, 2560, 34, 8, 4, 10240, 131072, 1000000.0f, 1e-6f, 1,
     SH_QK_NORM_HEAD | SH_POST_NORM | R, 256, 0, 1024, 0, 0, 0, 0, 0, 0, 0, 8.0f, 0, 0, 0, 0, 0, 0, 0},
    /* Phi-4-mini: partial rotary (96 of 128 dims), LongRoPE over 4096 original positions */
    {"phi4-mini", "phi3", "Phi-4-mini", 200064, 3072, 32, 24, 8, 8192, 131072, 10000.0f, 1e-5f, 1, SH_FUSED | R,
     128, 96, 0, 4096, 0, 0, 0, 0, 0, 0, 0, 1.1902f, 0, 0, 0, 0, 0, 0},
    /* mixture of experts (MOE_SHAPES): Qwen3-30B-A3B (top-k weights normalised), Qwen1.5-MoE-A2.7B
     * (a shared expert), OLMoE-1B-7B-0924 */
    {"qwen3-30b-a3b", "qwen3moe", "Qwen3-30B-A3B", 151936, 2048, 48, 32, 4, 6144, 40960, 1000000.0f, 1e-6f, 0,
     SH_QK_NORM_HEAD | R, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen1.5-moe-a2.7b", "qwen2moe", "Qwen1.5-MoE-A2.7B", 151936, 2048, 24, 16, 16, 5632, 8192, 1000000.0f, 1e-6f, 0,
     SH_QKV_BIAS | R, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"olmoe-1b-7b", "olmoe", "OLMoE-1B-7B", 50304, 2048, 16, 16, 16, 1024, 4096, 10000.0f, 1e-5f, 0,
     SH_QK_NORM_FULL | R, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* Ministral-3-3B (the text model of the 2512 release): YaRN x16 over 16384 positions
     * (beta_fast 32, beta_slow 1, mscale_all_dim 1) and llama_4_scaling_beta 0.1 */
    {"ministral3-3b", "mistral3", "Ministral-3-3B", 131072, 3072, 26, 32, 8, 9216, 262144, 1000000.0f, 1e-5f, 1, R,
     128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16.0f, 16384, 32.0f, 1.0f, 1.0f, 0.1f},
    {"internlm2.5-1.8b", "internlm2", "InternLM2.5-1.8B", 92544, 2048, 24, 16, 8, 8192, 32768, 1000000.0f, 1e-5f, 0, R,
     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* gpt-oss-20b: 24 layers of 64 heads of 64 (8 kv heads) on 2880, sliding window 128 on even layers */
    {"gpt-oss-20b", "gpt-oss", "gpt-oss-20b", 201088, 2880, 24, 64, 8, 2880, 131072, 150000.0f, 1e-5f, 0,
     SH_QKV_BIAS | SH_GPTOSS | R, 64, 0, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
#undef R
#define N_SHAPES (sizeof SHAPES / sizeof *SHAPES)

const char *const gen_model_shapes[] = {"tinyllama", "llama3.2-1b", "qwen2.5-0.5b", "tiny", "qwen3-0.6b", "smollm3-3b",
                                        "granite-3-2b", "olmo2-1b", "gemma2-2b", "gemma3-1b", "gemma3-4b", "phi4-mini",
                                        "ministral3-3b", "internlm2.5-1.8b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b",
                                        "olmoe-1b-7b", "gpt-oss-20b", NULL};
#define SHAPE_LIST "tinyllama, llama3.2-1b, qwen2.5-0.5b, tiny, qwen3-0.6b, smollm3-3b, granite-3-2b, olmo2-1b, " \
                   "gemma2-2b, gemma3-1b, gemma3-4b, phi4-mini, ministral3-3b, internlm2.5-1.8b, qwen3-30b-a3b, " \
                   "qwen1.5-moe-a2.7b, olmoe-1b-7b, gpt-oss-20b"

/* ftype names and their general.file_type (llama.cpp's enum llama_ftype). */
enum { FT_F16, FT_Q8_0, FT_Q4_0, FT_Q4_K_M, FT_Q5_K_M, FT_Q6_K, FT_IQ4_NL, FT_IQ4_XS, FT_MXFP4 };
static const struct { const char *name, *title; int file_type; } FTYPES[] = {
    [FT_F16] = {"f16", "F16", 1}, [FT_Q8_0] = {"q8_0", "Q8_0", 7},
    [FT_Q4_0] = {"q4_0", "Q4_0", 2}, [FT_Q4_K_M] = {"q4_k_m", "Q4_K_M", 15},
    [FT_Q5_K_M] = {"q5_k_m", "Q5_K_M", 17}, [FT_Q6_K] = {"q6_k", "Q6_K", 18},
    [FT_IQ4_NL] = {"iq4_nl", "IQ4_NL", 25}, [FT_IQ4_XS] = {"iq4_xs", "IQ4_XS", 30},
    [FT_MXFP4] = {"mxfp4", "MXFP4", 38}, /* LLAMA_FTYPE_MOSTLY_MXFP4_MOE */
};

/* ---- random numbers: splitmix64 ------------------------------------------------------------ */

static uint64_t mix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

/* ---- the type mix -------------------------------------------------------------------------- */

/* llama-quantize's use_more_bits(i_layer, n_layers). */
static int use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

enum tensor_kind { TK_EMBD, TK_OUTPUT, TK_Q, TK_K, TK_V, TK_O, TK_GATE, TK_UP, TK_DOWN, TK_QKV };

static int tensor_type(int ftype, int kind, int il, int n_layer, int tied, int64_t ne0)
{
    switch (ftype) {
    case FT_F16: return GGML_TYPE_F16;
    case FT_Q8_0: return GGML_TYPE_Q8_0;
    case FT_Q4_0: return GGML_TYPE_Q4_0;
    case FT_Q6_K: return ne0 % QUANT_QK_K ? GGML_TYPE_Q8_0 : GGML_TYPE_Q6_K; /* llama-quantize's fallback */
    case FT_IQ4_NL: return GGML_TYPE_IQ4_NL;
    case FT_IQ4_XS: return ne0 % QUANT_QK_K ? GGML_TYPE_IQ4_NL : GGML_TYPE_IQ4_XS; /* llama-quantize's fallback */
    /* as the released gpt-oss files: the FFN (the experts) MXFP4, every other matrix Q8_0 */
    case FT_MXFP4: return kind == TK_GATE || kind == TK_UP || kind == TK_DOWN ? GGML_TYPE_MXFP4 : GGML_TYPE_Q8_0;
    default: break;
    }
    /* Q4_K_M / Q5_K_M (llama_tensor_get_type): the base K type; Q6_K for the output (or the
     * token embedding it is tied to) and, in both mixes, for attn_v and ffn_down where
     * use_more_bits holds */
    int base = ftype == FT_Q5_K_M ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K, t = base;
    if (kind == TK_OUTPUT || (kind == TK_EMBD && tied)) t = GGML_TYPE_Q6_K;
    if ((kind == TK_V || kind == TK_DOWN) && use_more_bits(il, n_layer)) t = GGML_TYPE_Q6_K;
    if (kind == TK_QKV && ftype == FT_Q4_K_M) t = GGML_TYPE_Q5_K; /* fused qkv: one step up */
    if (ne0 % QUANT_QK_K) /* llama-quantize's fallback: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0 */
        t = t == GGML_TYPE_Q6_K ? GGML_TYPE_Q8_0 : base == GGML_TYPE_Q5_K ? GGML_TYPE_Q5_1 : GGML_TYPE_Q5_0;
    return t;
}

/* ---- tensor data ----------------------------------------------------------------------------- */

typedef struct fill_ctx {
    uint64_t seed;
} fill_ctx;

static void put_f16(uint8_t *p, float v)
{
    uint16_t h = fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* Random bytes for a chunk, then every block's scales set so weights have a std near 0.02. */
static int fill_random(void *user, const gguf_writer_chunk *c, kv_error *err)
{
    const fill_ctx *fc = user;
    uint64_t s = fc->seed ^ hash_str(c->name) ^ ((uint64_t)c->row0 * 0x2545f4914f6cdd1dULL);
    uint8_t *p = c->dst;
    size_t n = c->nbytes, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t r = mix64(&s);
        memcpy(p + i, &r, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)mix64(&s);
    const quant_traits *qt = quant_traits_of(c->type);
    size_t nb = n / qt->type_size;
    switch (c->type) {
    case GGML_TYPE_F32: /* uniform in (-0.0346, 0.0346): std 0.02 */
        for (size_t k = 0; k < n / 4; k++) {
            uint32_t u;
            memcpy(&u, p + 4 * k, 4);
            float v = ((float)(u >> 8) / 16777216.0f * 2.0f - 1.0f) * 0.0346f;
            memcpy(p + 4 * k, &v, 4);
        }
        break;
    case GGML_TYPE_F16:
        /* sign, exponent 2^-7 or 2^-6, random mantissa: |w| in [0.0078, 0.031) */
        for (size_t k = 0; k < n / 2; k++) {
            uint16_t h;
            memcpy(&h, p + 2 * k, 2);
            h = (uint16_t)((h & 0x83ffu) | ((8u + ((h >> 10) & 1u)) << 10));
            memcpy(p + 2 * k, &h, 2);
        }
        break;
    case GGML_TYPE_Q8_0: /* q uniform in -128..127 (rms 74) */
        for (size_t b = 0; b < nb; b++) put_f16(p + b * sizeof(block_q8_0), 0.02f / 74.0f);
        break;
    case GGML_TYPE_Q4_0: /* q - 8 uniform in -8..7 (rms 4.6) */
        for (size_t b = 0; b < nb; b++) put_f16(p + b * sizeof(block_q4_0), 0.02f / 4.6f);
        break;
    case GGML_TYPE_Q5_0:
        for (size_t b = 0; b < nb; b++) put_f16(p + b * sizeof(block_q5_0), 0.02f / 9.2f);
        break;
    case GGML_TYPE_Q5_1: /* d·q + m, q uniform in 0..31 (mean 15.5, rms about the mean 9.2) */
        for (size_t b = 0; b < nb; b++) {
            put_f16(p + b * sizeof(block_q5_1), 0.02f / 9.2f);
            put_f16(p + b * sizeof(block_q5_1) + 2, -15.5f * 0.02f / 9.2f);
        }
        break;
    case GGML_TYPE_Q4_K: /* d·sc·q - dmin·m with sc, m, q random */
        for (size_t b = 0; b < nb; b++) {
            block_q4_K *k = (block_q4_K *)(p + b * sizeof(block_q4_K));
            k->d = fp32_to_fp16(1e-4f);
            k->dmin = fp32_to_fp16(7.5e-4f);
        }
        break;
    case GGML_TYPE_Q5_K: /* as Q4_K, with half the d for q in 0..31 */
        for (size_t b = 0; b < nb; b++) {
            block_q5_K *k = (block_q5_K *)(p + b * sizeof(block_q5_K));
            k->d = fp32_to_fp16(5e-5f);
            k->dmin = fp32_to_fp16(7.5e-4f);
        }
        break;
    case GGML_TYPE_MXFP4: /* codes uniform (doubled grid rms 5.85) times 2^(e-128) = 2^-8: std 0.023 */
        for (size_t b = 0; b < nb; b++) p[b * sizeof(block_mxfp4)] = 120;
        break;
    case GGML_TYPE_Q6_K: /* d·sc·(q - 32), scales kept within -32..31 */
        for (size_t b = 0; b < nb; b++) {
            block_q6_K *k = (block_q6_K *)(p + b * sizeof(block_q6_K));
            for (int j = 0; j < 16; j++) k->scales[j] = (int8_t)(k->scales[j] >> 2);
            k->d = fp32_to_fp16(6e-5f);
        }
        break;
    case GGML_TYPE_IQ4_NL: /* d·table[q], the table's rms is 66 */
        for (size_t b = 0; b < nb; b++) put_f16(p + b * sizeof(block_iq4_nl), 0.02f / 66.0f);
        break;
    case GGML_TYPE_IQ4_XS: /* d·(ls - 32)·table[q] with 6-bit ls random (rms of ls - 32: 18.5) */
        for (size_t b = 0; b < nb; b++) {
            block_iq4_xs *k = (block_iq4_xs *)(p + b * sizeof(block_iq4_xs));
            k->d = fp32_to_fp16(0.02f / (66.0f * 18.5f));
        }
        break;
    default:
        return kv_error_set(err, KV_ERR_INVALID, "tensor '%s': no random fill for type %s", c->name, qt->name);
    }
    return KV_OK;
}

/* ---- the vocabulary -------------------------------------------------------------------------- */

typedef struct vocab {
    char **tokens;
    float *scores;
    int32_t *types;
    int n;
} vocab;

static void vocab_free(vocab *v)
{
    if (v->tokens)
        for (int i = 0; i < v->n; i++) free(v->tokens[i]);
    free(v->tokens);
    free(v->scores);
    free(v->types);
}

/* <unk> <s> </s>, <0x00>…<0xFF>, then "▁" + a base-26 word per id (unique, lowest scores last). */
static int vocab_build(vocab *v, int n)
{
    v->n = n;
    v->tokens = calloc((size_t)n, sizeof *v->tokens);
    v->scores = malloc(sizeof(float) * (size_t)n);
    v->types = malloc(sizeof(int32_t) * (size_t)n);
    if (!v->tokens || !v->scores || !v->types) return -1;
    for (int i = 0; i < n; i++) {
        char buf[32];
        int type = 1; /* normal */
        if (i == 0) strcpy(buf, "<unk>"), type = 2;
        else if (i == 1) strcpy(buf, "<s>"), type = 3;
        else if (i == 2) strcpy(buf, "</s>"), type = 3;
        else if (i < 3 + 256) snprintf(buf, sizeof buf, "<0x%02X>", i - 3), type = 6;
        else {
            char w[16];
            int k = 0;
            for (int x = i - 259; k < 15; x = x / 26 - 1) {
                w[k++] = (char)('a' + x % 26);
                if (x < 26) break;
            }
            strcpy(buf, "\xe2\x96\x81"); /* U+2581, SentencePiece's space */
            for (int j = 0; j < k; j++) buf[3 + j] = w[k - 1 - j];
            buf[3 + k] = 0;
        }
        if (!(v->tokens[i] = strdup(buf))) return -1;
        v->scores[i] = type == 1 ? -(float)i : 0.0f;
        v->types[i] = type;
    }
    return 0;
}

/* ---- the file -------------------------------------------------------------------------------- */

static int set_arch_u32(gguf_writer *w, const char *arch, const char *suffix, uint32_t v)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_writer_set_u32(w, key, v);
}

static int set_arch_f32(gguf_writer *w, const char *arch, const char *suffix, float v)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_writer_set_f32(w, key, v);
}

/* 1 + U(-0.25, 0.25) per element, from the seed and the tensor's name (SH_RANDOM_NORMS), or 1. */
static void norm_values(float *dst, int n, int random, uint64_t seed, const char *name)
{
    uint64_t s = seed ^ hash_str(name) ^ 0x6e6f726dULL;
    for (int i = 0; i < n; i++)
        dst[i] = random ? 1.0f + (float)((int64_t)(mix64(&s) % 2001) - 1000) * 2.5e-4f : 1.0f;
}

typedef struct norm_ctx {
    uint64_t seed;
    int random;
} norm_ctx;

static int fill_norm(void *user, const gguf_writer_chunk *c, kv_error *err)
{
    const norm_ctx *nc = user;
    norm_values(c->dst, (int)(c->nbytes / sizeof(float)), nc->random, nc->seed, c->name);
    return KV_OK;
}

/* gpt-oss's attention sinks: (norm_values - 1) · 8 + 1, uniform in [-1, 3]. */
static int fill_sinks(void *user, const gguf_writer_chunk *c, kv_error *err)
{
    const norm_ctx *nc = user;
    float *v = c->dst;
    int n = (int)(c->nbytes / sizeof(float));
    norm_values(v, n, 1, nc->seed, c->name);
    for (int i = 0; i < n; i++) v[i] = (v[i] - 1.0f) * 8.0f + 1.0f;
    (void)err;
    return KV_OK;
}

/* An F32 norm weight of n values (norm_values; written from the name when the file is). */
static int add_norm(gguf_writer *w, const char *name, int n, norm_ctx *nc)
{
    int64_t ne[4] = {n, 1, 1, 1};
    return gguf_writer_add_tensor_fill(w, name, GGML_TYPE_F32, 1, ne, fill_norm, nc);
}

int gen_model_write(const char *path, const char *shape_name, const char *type_name, int n_layer_override,
                    uint64_t seed, kv_error *err)
{
    gen_model_opts o = {.n_layer = n_layer_override, .seed = seed};
    return gen_model_write_ex(path, shape_name, type_name, &o, err);
}

int gen_model_write_ex(const char *path, const char *shape_name, const char *type_name, const gen_model_opts *opt,
                       kv_error *err)
{
    const model_shape *sh = NULL;
    for (size_t i = 0; i < N_SHAPES; i++)
        if (!strcmp(SHAPES[i].name, shape_name)) sh = &SHAPES[i];
    if (!sh) return kv_error_set(err, KV_ERR_INVALID, "unknown shape '%s' (%s)", shape_name, SHAPE_LIST);
    int ft = -1;
    for (int i = 0; i < (int)(sizeof FTYPES / sizeof *FTYPES); i++)
        if (!strcmp(FTYPES[i].name, type_name)) ft = i;
    if (ft < 0)
        return kv_error_set(err, KV_ERR_INVALID, "unknown type '%s' (f16, q8_0, q4_0, q6_k, q4_k_m, q5_k_m, iq4_nl, iq4_xs, mxfp4)", type_name);
    int n_layer = opt->n_layer > 0 ? opt->n_layer : sh->n_layer;
    int n_vocab = opt->n_vocab > 0 ? opt->n_vocab : sh->n_vocab;
    int n_swa = opt->n_swa > 0 && sh->n_swa ? opt->n_swa : sh->n_swa;
    int n_ctx_orig = opt->n_ctx_orig > 0 && sh->n_ctx_orig ? opt->n_ctx_orig : sh->n_ctx_orig;
    int yarn_orig = opt->n_ctx_orig > 0 && sh->yarn_orig ? opt->n_ctx_orig : sh->yarn_orig;
    const int n_ff = opt->n_ff > 0 ? opt->n_ff : sh->n_ff;
    const moe_shape *ms = NULL, dense = {0};
    for (size_t i = 0; i < sizeof MOE_SHAPES / sizeof *MOE_SHAPES; i++)
        if (!strcmp(MOE_SHAPES[i].name, sh->name)) ms = &MOE_SHAPES[i];
    if (!ms) ms = &dense;
    const int n_expert = ms->n_expert && opt->n_expert > 0 ? opt->n_expert : ms->n_expert;
    const int n_expert_used = ms->n_expert && opt->n_expert_used > 0 ? opt->n_expert_used : ms->n_expert_used;
    /* the experts' width: expert_feed_forward_length where the shape has that key, else n_ff */
    const int n_ff_exp = !ms->n_expert ? 0 : !ms->n_ff_exp ? n_ff : opt->n_ff_exp > 0 ? opt->n_ff_exp : ms->n_ff_exp;
    const int n_ff_shexp = ms->n_ff_shexp && opt->n_ff_shexp > 0 ? opt->n_ff_shexp : ms->n_ff_shexp;
    if (n_expert && (n_expert_used < 1 || n_expert_used > n_expert))
        return kv_error_set(err, KV_ERR_INVALID, "%d experts used of %d: must be 1 to the expert count", n_expert_used,
                            n_expert);
    uint64_t seed = opt->seed;
    if (n_vocab < 3 + 256 + 1)
        return kv_error_set(err, KV_ERR_INVALID, "vocabulary of %d tokens: at least 260 needed (<unk> <s> </s> and 256 bytes)",
                            n_vocab);
    const int E = sh->n_embd, head_dim = sh->head_dim ? sh->head_dim : E / sh->n_head;
    const int EQ = head_dim * sh->n_head, EKV = head_dim * sh->n_head_kv, n_rot = sh->n_rot ? sh->n_rot : head_dim;
    const int fl = sh->flags, rnd = (fl & SH_RANDOM_NORMS) != 0;
    float *factors = NULL; /* the LongRoPE tensors' data: kept until the file is written */
    const char *a = sh->arch;

    gguf_writer *w = gguf_writer_create();
    vocab v = {0};
    int nmax = E > EQ ? E : EQ;
    float *bias = malloc(sizeof(float) * (size_t)nmax);
    if (!w || !bias || vocab_build(&v, n_vocab)) {
        gguf_writer_free(w);
        vocab_free(&v);
        free(bias);
        return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
    }
    /* the template's control tokens take the vocabulary's last ids (type 3, as converted models
     * mark them), so a chat template's scaffolding tokenizes as it does for the real model */
    int n_special = 0;
    for (const char *sp = opt->special; sp && *sp; n_special++) {
        const char *e = strchr(sp, ',');
        size_t l = e ? (size_t)(e - sp) : strlen(sp);
        int id = n_vocab - 1 - n_special;
        char *tok = l && id >= 3 + 256 ? strndup(sp, l) : NULL;
        if (!tok) {
            gguf_writer_free(w);
            vocab_free(&v);
            free(bias);
            return kv_error_set(err, KV_ERR_INVALID, "--special: empty token or more tokens than the vocabulary has room for");
        }
        free(v.tokens[id]);
        v.tokens[id] = tok;
        v.types[id] = 3;
        v.scores[id] = 0.0f;
        sp = e ? e + 1 : sp + l;
    }
    uint64_t bs = seed ^ 0xb1a5;
    for (int i = 0; i < nmax; i++) bias[i] = (float)((int64_t)(mix64(&bs) % 2001) - 1000) * 1e-4f;

    char title[160];
    snprintf(title, sizeof title, "synthetic %s-shaped %s (random weights)", sh->title, FTYPES[ft].title);
    gguf_writer_set_str(w, "general.architecture", a);
    gguf_writer_set_str(w, "general.name", title);
    gguf_writer_set_u32(w, "general.file_type", (uint32_t)FTYPES[ft].file_type);
    gguf_writer_set_u32(w, "general.quantization_version", 2);
    set_arch_u32(w, a, "vocab_size", (uint32_t)n_vocab);
    set_arch_u32(w, a, "context_length", (uint32_t)sh->n_ctx);
    set_arch_u32(w, a, "embedding_length", (uint32_t)E);
    set_arch_u32(w, a, "block_count", (uint32_t)n_layer);
    set_arch_u32(w, a, "feed_forward_length", (uint32_t)n_ff);
    set_arch_u32(w, a, "attention.head_count", (uint32_t)sh->n_head);
    set_arch_u32(w, a, "attention.head_count_kv", (uint32_t)sh->n_head_kv);
    if (sh->head_dim) {
        set_arch_u32(w, a, "attention.key_length", (uint32_t)head_dim);
        set_arch_u32(w, a, "attention.value_length", (uint32_t)head_dim);
    }
    set_arch_u32(w, a, "rope.dimension_count", (uint32_t)n_rot);
    set_arch_f32(w, a, "rope.freq_base", sh->rope_base);
    set_arch_f32(w, a, "attention.layer_norm_rms_epsilon", sh->eps);
    if (n_swa) set_arch_u32(w, a, "attention.sliding_window", (uint32_t)n_swa);
    if (n_ctx_orig) set_arch_u32(w, a, "rope.scaling.original_context_length", (uint32_t)n_ctx_orig);
    if (sh->embd_scale) set_arch_f32(w, a, "embedding_scale", sh->embd_scale);
    if (sh->residual_scale) set_arch_f32(w, a, "residual_scale", sh->residual_scale);
    if (sh->logit_scale) set_arch_f32(w, a, "logit_scale", sh->logit_scale);
    if (sh->attn_scale) set_arch_f32(w, a, "attention.scale", sh->attn_scale);
    float attn_softcap = opt->attn_softcap > 0 && sh->attn_softcap ? opt->attn_softcap : sh->attn_softcap;
    if (attn_softcap) set_arch_f32(w, a, "attn_logit_softcapping", attn_softcap);
    if (sh->final_softcap) set_arch_f32(w, a, "final_logit_softcapping", sh->final_softcap);
    if (sh->rope_scale) {
        char key[96];
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        gguf_writer_set_str(w, key, "linear");
        set_arch_f32(w, a, "rope.scaling.factor", sh->rope_scale);
    }
    if (sh->rope_attn_factor) set_arch_f32(w, a, "rope.scaling.attn_factor", sh->rope_attn_factor);
    if (sh->yarn_factor) { /* the keys llama.cpp's convert_hf_to_gguf writes for Ministral 3 */
        char key[96];
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        gguf_writer_set_str(w, key, "yarn");
        set_arch_f32(w, a, "rope.scaling.factor", sh->yarn_factor);
        set_arch_u32(w, a, "rope.scaling.original_context_length", (uint32_t)yarn_orig);
        set_arch_f32(w, a, "rope.scaling.yarn_beta_fast", sh->yarn_beta_fast);
        set_arch_f32(w, a, "rope.scaling.yarn_beta_slow", sh->yarn_beta_slow);
        if (sh->yarn_log_mul) set_arch_f32(w, a, "rope.scaling.yarn_log_multiplier", sh->yarn_log_mul);
    }
    if (sh->attn_temp_scale) set_arch_f32(w, a, "attention.temperature_scale", sh->attn_temp_scale);
    float yarn = opt->rope_yarn > 0 ? opt->rope_yarn : (fl & SH_GPTOSS) ? 32.0f : 0.0f;
    if (yarn && !sh->yarn_factor) { /* --yarn F (gpt-oss: factor 32 over 4096 positions) */
        char key[96];
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        gguf_writer_set_str(w, key, "yarn");
        set_arch_f32(w, a, "rope.scaling.factor", yarn);
        if (!n_ctx_orig) set_arch_u32(w, a, "rope.scaling.original_context_length", 4096);
    }
    if (n_expert) {
        set_arch_u32(w, a, "expert_count", (uint32_t)n_expert);
        set_arch_u32(w, a, "expert_used_count", (uint32_t)n_expert_used);
        if (ms->n_ff_exp) set_arch_u32(w, a, "expert_feed_forward_length", (uint32_t)n_ff_exp);
        if (n_ff_shexp) set_arch_u32(w, a, "expert_shared_feed_forward_length", (uint32_t)n_ff_shexp);
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tokens, (uint64_t)v.n);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, v.scores, (uint64_t)v.n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v.types, (uint64_t)v.n);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1);
    if (opt->chat_template) gguf_writer_set_str(w, "tokenizer.chat_template", opt->chat_template);

    fill_ctx fc = {.seed = seed};
    norm_ctx nc = {.seed = seed, .random = rnd};
    int64_t ne[4] = {E, n_vocab, 1, 1};
    gguf_writer_add_tensor_fill(w, "token_embd.weight", tensor_type(ft, TK_EMBD, 0, n_layer, sh->tied, E), 2, ne,
                                fill_random, &fc);
    add_norm(w, "output_norm.weight", E, &nc);
    if (!sh->tied)
        gguf_writer_add_tensor_fill(w, "output.weight", tensor_type(ft, TK_OUTPUT, 0, n_layer, 0, E), 2, ne,
                                    fill_random, &fc);
    if (n_ctx_orig) {
        /* LongRoPE rescale factors, n_rot/2 each: short ones near 1, long ones growing to ~40
         * with the dimension (as the trained ones do) */
        float *f = factors = malloc(sizeof(float) * (size_t)n_rot);
        if (!f) {
            gguf_writer_free(w);
            vocab_free(&v);
            free(bias);
            return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
        }
        int h = n_rot / 2;
        for (int i = 0; i < h; i++) {
            float x = (float)i / (float)(h - 1);
            f[i] = 1.0f + 39.0f * x * x;
            f[h + i] = 1.0f + 0.25f * x;
        }
        int64_t nf[4] = {h, 1, 1, 1};
        gguf_writer_add_tensor(w, "rope_factors_long.weight", GGML_TYPE_F32, 1, nf, f);
        gguf_writer_add_tensor(w, "rope_factors_short.weight", GGML_TYPE_F32, 1, nf, f + h);
    }
    static const struct { const char *suffix; int kind; } mats[] = {
        {"attn_q.weight", TK_Q}, {"attn_k.weight", TK_K}, {"attn_v.weight", TK_V}, {"attn_qkv.weight", TK_QKV},
        {"attn_output.weight", TK_O}, {"ffn_gate.weight", TK_GATE}, {"ffn_up.weight", TK_UP},
        {"ffn_down.weight", TK_DOWN},
    };
    for (int il = 0; il < n_layer; il++) {
        char nm[96];
#define NORM(suffix, n)                                                                       \
        snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix);                                     \
        add_norm(w, nm, n, &nc);
        if (!(fl & SH_NO_PRE_NORM)) {
            NORM("attn_norm.weight", E)
            if (fl & SH_GPTOSS) {
                NORM("post_attention_norm.weight", E) /* gpt-oss's FFN norm */
            } else {
                NORM("ffn_norm.weight", E)
            }
        }
        if (fl & SH_POST_NORM) {
            NORM("post_attention_norm.weight", E)
            NORM("post_ffw_norm.weight", E)
        }
        if (fl & SH_QK_NORM_HEAD) {
            NORM("attn_q_norm.weight", head_dim)
            NORM("attn_k_norm.weight", head_dim)
        }
        if (fl & SH_QK_NORM_FULL) {
            NORM("attn_q_norm.weight", EQ)
            NORM("attn_k_norm.weight", EKV)
        }
#undef NORM
        for (size_t k = 0; k < sizeof mats / sizeof *mats; k++) {
            int kind = mats[k].kind, fused = (fl & SH_FUSED) != 0;
            if (fused && (kind == TK_Q || kind == TK_K || kind == TK_V || kind == TK_GATE)) continue;
            if (!fused && kind == TK_QKV) continue;
            if (n_expert && (kind == TK_GATE || kind == TK_UP || kind == TK_DOWN)) continue; /* experts below */
            int64_t n_in = kind == TK_DOWN ? n_ff : kind == TK_O ? EQ : E;
            int64_t n_out = kind == TK_K || kind == TK_V ? EKV
                            : kind == TK_Q                ? EQ
                            : kind == TK_QKV              ? EQ + 2 * EKV
                            : kind == TK_GATE             ? n_ff
                            : kind == TK_UP               ? (fused ? 2 : 1) * (int64_t)n_ff
                                                          : E;
            int64_t ne2[4] = {n_in, n_out, 1, 1};
            snprintf(nm, sizeof nm, "blk.%d.%s", il, mats[k].suffix);
            gguf_writer_add_tensor_fill(w, nm, tensor_type(ft, kind, il, n_layer, sh->tied, n_in), 2, ne2,
                                        fill_random, &fc);
        }
        if (n_expert) {
            /* the router (F32, never quantized), the experts (typed as the dense matrices would
             * be), the shared expert and its gate vector */
            int64_t nr[4] = {E, n_expert, 1, 1};
            snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", il);
            gguf_writer_add_tensor_fill(w, nm, GGML_TYPE_F32, 2, nr, fill_random, &fc);
            static const struct { const char *exps, *shexp; int kind; } ex[] = {
                {"ffn_gate_exps.weight", "ffn_gate_shexp.weight", TK_GATE},
                {"ffn_up_exps.weight", "ffn_up_shexp.weight", TK_UP},
                {"ffn_down_exps.weight", "ffn_down_shexp.weight", TK_DOWN},
            };
            for (int k = 0; k < 3; k++) {
                int down = ex[k].kind == TK_DOWN;
                int64_t ne3[4] = {down ? n_ff_exp : E, down ? E : n_ff_exp, n_expert, 1};
                snprintf(nm, sizeof nm, "blk.%d.%s", il, ex[k].exps);
                gguf_writer_add_tensor_fill(w, nm, tensor_type(ft, ex[k].kind, il, n_layer, sh->tied, ne3[0]), 3, ne3,
                                            fill_random, &fc);
            }
            if (fl & SH_GPTOSS) { /* router and expert biases (F32, std 0.02) */
                int64_t nb1[4] = {n_expert, 1, 1, 1}, nbg[4] = {n_ff_exp, n_expert, 1, 1}, nbd[4] = {E, n_expert, 1, 1};
                snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.bias", il);
                gguf_writer_add_tensor_fill(w, nm, GGML_TYPE_F32, 1, nb1, fill_random, &fc);
                snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.bias", il);
                gguf_writer_add_tensor_fill(w, nm, GGML_TYPE_F32, 2, nbg, fill_random, &fc);
                snprintf(nm, sizeof nm, "blk.%d.ffn_up_exps.bias", il);
                gguf_writer_add_tensor_fill(w, nm, GGML_TYPE_F32, 2, nbg, fill_random, &fc);
                snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.bias", il);
                gguf_writer_add_tensor_fill(w, nm, GGML_TYPE_F32, 2, nbd, fill_random, &fc);
            }
            if (n_ff_shexp) {
                for (int k = 0; k < 3; k++) {
                    int down = ex[k].kind == TK_DOWN;
                    int64_t ne2[4] = {down ? n_ff_shexp : E, down ? E : n_ff_shexp, 1, 1};
                    snprintf(nm, sizeof nm, "blk.%d.%s", il, ex[k].shexp);
                    gguf_writer_add_tensor_fill(w, nm, tensor_type(ft, ex[k].kind, il, n_layer, sh->tied, ne2[0]), 2,
                                                ne2, fill_random, &fc);
                }
                int64_t ng[4] = {E, 1, 1, 1};
                snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp_shexp.weight", il);
                gguf_writer_add_tensor_fill(w, nm, GGML_TYPE_F32, 1, ng, fill_random, &fc);
            }
        }
        if (fl & SH_GPTOSS) {
            /* the attention output's bias, and a sink logit per head in [-1, 3) (norm_values' 1 ±
             * 0.25, stretched): as large as the random weights' attention logits, so they show */
            int64_t no[4] = {E, 1, 1, 1}, ns[4] = {sh->n_head, 1, 1, 1};
            snprintf(nm, sizeof nm, "blk.%d.attn_output.bias", il);
            gguf_writer_add_tensor(w, nm, GGML_TYPE_F32, 1, no, bias);
            snprintf(nm, sizeof nm, "blk.%d.attn_sinks.weight", il);
            gguf_writer_add_tensor_fill(w, nm, GGML_TYPE_F32, 1, ns, fill_sinks, &nc);
        }
        if (fl & SH_QKV_BIAS) {
            int64_t nq[4] = {EQ, 1, 1, 1}, nkv[4] = {EKV, 1, 1, 1};
            snprintf(nm, sizeof nm, "blk.%d.attn_q.bias", il);
            gguf_writer_add_tensor(w, nm, GGML_TYPE_F32, 1, nq, bias);
            snprintf(nm, sizeof nm, "blk.%d.attn_k.bias", il);
            gguf_writer_add_tensor(w, nm, GGML_TYPE_F32, 1, nkv, bias);
            snprintf(nm, sizeof nm, "blk.%d.attn_v.bias", il);
            gguf_writer_add_tensor(w, nm, GGML_TYPE_F32, 1, nkv, bias);
        }
    }
    int rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    vocab_free(&v);
    free(bias);
    free(factors);
    return rc;
}

/* ---- command line ---------------------------------------------------------------------------- */

static void gen_usage(FILE *out)
{
    fprintf(out,
            "Usage: kvchat gen-model --shape SHAPE --type TYPE -o FILE [--layers N] [--vocab N] [--ff N]\n"
            "                        [--swa N] [--orig-ctx N] [--attn-softcap X] [--yarn F] [--experts N]\n"
            "                        [--experts-used N] [--ff-exp N] [--ff-shexp N] [--seed N]\n"
            "                        [--chat-template FILE.jinja] [--special TOKENS]\n"
            "Write a GGUF model of a real model's shape with random weights (for kvchat bench).\n"
            "  --shape SHAPE   tinyllama (TinyLlama-1.1B), llama3.2-1b, qwen2.5-0.5b, tiny (2 layers, for tests),\n"
            "                  qwen3-0.6b, smollm3-3b, granite-3-2b, olmo2-1b, gemma2-2b, gemma3-1b, gemma3-4b,\n"
            "                  phi4-mini, ministral3-3b, internlm2.5-1.8b; mixture of experts: qwen3-30b-a3b,\n"
            "                  qwen1.5-moe-a2.7b, olmoe-1b-7b, gpt-oss-20b\n"
            "  --type TYPE     f16, q8_0, q4_0, q6_k, iq4_nl, iq4_xs (every matrix in that type), q4_k_m, q5_k_m\n"
            "                  or mxfp4 (the FFN's matrices MXFP4, the others Q8_0)\n"
            "                  (llama-quantize's mixes: Q4_K / Q5_K, Q6_K for the output and some\n"
            "                  attn_v / ffn_down), or mxfp4 (the FFN / experts MXFP4, other matrices\n"
            "                  Q8_0, as the released gpt-oss files)\n"
            "  -o FILE         output path (files are large: TinyLlama F16 is 2.1 GiB)\n"
            "  --layers N      override the number of layers\n"
            "  --vocab N       override the vocabulary size (at least 260)\n"
            "  --ff N          override the feed-forward width (small test models)\n"
            "  --swa N         override the sliding window (gemma2, gemma3)\n"
            "  --orig-ctx N    override rope.scaling.original_context_length (phi4-mini, ministral3-3b)\n"
            "  --attn-softcap X  override the attention-logit soft-cap (gemma2)\n"
            "  --yarn F        YaRN RoPE scaling by F over 4096 original positions (any shape)\n"
            "  --experts N     override the expert count (MoE shapes)\n"
            "  --experts-used N  override the experts used per token\n"
            "  --ff-exp N      override the experts' width (olmoe: --ff)\n"
            "  --ff-shexp N    override the shared expert's width (qwen1.5-moe-a2.7b)\n"
            "  --seed N        random seed (default 1)\n"
            "  --chat-template FILE  store FILE's text as tokenizer.chat_template (chat tests)\n"
            "  --special TOKENS      comma-separated control tokens given the vocabulary's last ids\n");
}

int gen_model_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"shape", required_argument, 0, 's'}, {"type", required_argument, 0, 'y'},
        {"output", required_argument, 0, 'o'}, {"layers", required_argument, 0, 'l'},
        {"seed", required_argument, 0, 'S'}, {"help", no_argument, 0, 'h'}, {"vocab", required_argument, 0, 'V'},
        {"swa", required_argument, 0, 'W'}, {"ff", required_argument, 0, 'F'}, {"orig-ctx", required_argument, 0, 'C'},
        {"attn-softcap", required_argument, 0, 'A'}, {"chat-template", required_argument, 0, 'T'},
        {"yarn", required_argument, 0, 'Y'}, {"experts", required_argument, 0, 'X'},
        {"experts-used", required_argument, 0, 'K'}, {"ff-exp", required_argument, 0, 'G'},
        {"ff-shexp", required_argument, 0, 'H'}, {"special", required_argument, 0, 'P'},
        {0, 0, 0, 0},
    };
    const char *shape = NULL, *type = NULL, *out = NULL, *tmpl_path = NULL;
    gen_model_opts go = {.seed = 1};
    optind = 1;
    opterr = 0;
    int o;
    while ((o = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        switch (o) {
        case 's': shape = optarg; break;
        case 'y': type = optarg; break;
        case 'o': out = optarg; break;
        case 'l': go.n_layer = atoi(optarg); if (go.n_layer < 1 || go.n_layer > 1024) goto bad; break;
        case 'V': go.n_vocab = atoi(optarg); if (go.n_vocab < 260 || go.n_vocab > (1 << 24)) goto bad; break;
        case 'F': go.n_ff = atoi(optarg); if (go.n_ff < 32 || go.n_ff % 32) goto bad; break;
        case 'W': go.n_swa = atoi(optarg); if (go.n_swa < 1) goto bad; break;
        case 'C': go.n_ctx_orig = atoi(optarg); if (go.n_ctx_orig < 1) goto bad; break;
        case 'A': go.attn_softcap = strtof(optarg, NULL); if (!(go.attn_softcap > 0)) goto bad; break;
        case 'Y': go.rope_yarn = strtof(optarg, NULL); if (!(go.rope_yarn >= 1)) goto bad; break;
        case 'S': go.seed = strtoull(optarg, NULL, 10); break;
        case 'T': tmpl_path = optarg; break;
        case 'X': go.n_expert = atoi(optarg); if (go.n_expert < 1 || go.n_expert > 4096) goto bad; break;
        case 'K': go.n_expert_used = atoi(optarg); if (go.n_expert_used < 1 || go.n_expert_used > 4096) goto bad; break;
        case 'G': go.n_ff_exp = atoi(optarg); if (go.n_ff_exp < 32 || go.n_ff_exp % 32) goto bad; break;
        case 'H': go.n_ff_shexp = atoi(optarg); if (go.n_ff_shexp < 32 || go.n_ff_shexp % 32) goto bad; break;
        case 'P': go.special = optarg; break;
        case 'h': gen_usage(stdout); return 0;
        default: goto bad;
        }
    }
    if (!shape || !type || !out || optind < argc) goto bad;
    kv_error err = {0};
    char *tmpl = NULL;
    if (tmpl_path) {
        FILE *f = fopen(tmpl_path, "rb");
        long n = -1;
        if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
            (tmpl = malloc((size_t)n + 1)) && fread(tmpl, 1, (size_t)n, f) == (size_t)n)
            tmpl[n] = 0;
        else {
            free(tmpl);
            tmpl = NULL;
        }
        if (f) fclose(f);
        if (!tmpl) {
            fprintf(stderr, "kvchat gen-model: %s: cannot read the chat template\n", tmpl_path);
            return 1;
        }
        go.chat_template = tmpl;
    }
    int rc = gen_model_write_ex(out, shape, type, &go, &err);
    free(tmpl);
    if (rc) {
        fprintf(stderr, "kvchat gen-model: %s\n", err.msg);
        return err.code == KV_ERR_INVALID ? 2 : 1;
    }
    return 0;
bad:
    gen_usage(stderr);
    return 2;
}
