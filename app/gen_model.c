/* gen_model: `kvchat gen-model` — random-weight llama/qwen2 GGUF files of real model shapes, for benchmarks. */
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
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/tools.h"
#include "engine/gguf.h"
#include "engine/gguf_writer.h"
#include "engine/kernels/quant.h"

typedef struct shape {
    const char *name, *arch, *title;
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx;
    float rope_base, eps;
    int tied;       /* output shares token_embd */
    int qkv_bias;   /* qwen2 */
} model_shape;

static const model_shape SHAPES[] = {
    {"tinyllama", "llama", "TinyLlama-1.1B", 32000, 2048, 22, 32, 4, 5632, 2048, 10000.0f, 1e-5f, 0, 0},
    {"llama3.2-1b", "llama", "Llama-3.2-1B", 128256, 2048, 16, 32, 8, 8192, 131072, 500000.0f, 1e-5f, 1, 0},
    {"qwen2.5-0.5b", "qwen2", "Qwen2.5-0.5B", 151936, 896, 24, 14, 2, 4864, 32768, 1000000.0f, 1e-6f, 1, 1},
    {"tiny", "llama", "tiny", 1024, 256, 2, 4, 2, 512, 2048, 10000.0f, 1e-5f, 0, 0},
};
#define N_SHAPES (sizeof SHAPES / sizeof *SHAPES)

const char *const gen_model_shapes[] = {"tinyllama", "llama3.2-1b", "qwen2.5-0.5b", "tiny", NULL};

/* ftype names and their general.file_type (llama.cpp's enum llama_ftype). */
enum { FT_F16, FT_Q8_0, FT_Q4_0, FT_Q4_K_M, FT_Q5_K_M, FT_Q6_K };
static const struct { const char *name, *title; int file_type; } FTYPES[] = {
    [FT_F16] = {"f16", "F16", 1}, [FT_Q8_0] = {"q8_0", "Q8_0", 7},
    [FT_Q4_0] = {"q4_0", "Q4_0", 2}, [FT_Q4_K_M] = {"q4_k_m", "Q4_K_M", 15},
    [FT_Q5_K_M] = {"q5_k_m", "Q5_K_M", 17}, [FT_Q6_K] = {"q6_k", "Q6_K", 18},
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

enum tensor_kind { TK_EMBD, TK_OUTPUT, TK_Q, TK_K, TK_V, TK_O, TK_GATE, TK_UP, TK_DOWN };

static int tensor_type(int ftype, int kind, int il, int n_layer, int tied, int64_t ne0)
{
    switch (ftype) {
    case FT_F16: return GGML_TYPE_F16;
    case FT_Q8_0: return GGML_TYPE_Q8_0;
    case FT_Q4_0: return GGML_TYPE_Q4_0;
    case FT_Q6_K: return ne0 % QUANT_QK_K ? GGML_TYPE_Q8_0 : GGML_TYPE_Q6_K; /* llama-quantize's fallback */
    default: break;
    }
    /* Q4_K_M / Q5_K_M (llama_tensor_get_type): the base K type; Q6_K for the output (or the
     * token embedding it is tied to) and, in both mixes, for attn_v and ffn_down where
     * use_more_bits holds */
    int base = ftype == FT_Q5_K_M ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K, t = base;
    if (kind == TK_OUTPUT || (kind == TK_EMBD && tied)) t = GGML_TYPE_Q6_K;
    if ((kind == TK_V || kind == TK_DOWN) && use_more_bits(il, n_layer)) t = GGML_TYPE_Q6_K;
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
    case GGML_TYPE_Q6_K: /* d·sc·(q - 32), scales kept within -32..31 */
        for (size_t b = 0; b < nb; b++) {
            block_q6_K *k = (block_q6_K *)(p + b * sizeof(block_q6_K));
            for (int j = 0; j < 16; j++) k->scales[j] = (int8_t)(k->scales[j] >> 2);
            k->d = fp32_to_fp16(6e-5f);
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

int gen_model_write(const char *path, const char *shape_name, const char *type_name, int n_layer_override,
                    uint64_t seed, kv_error *err)
{
    const model_shape *sh = NULL;
    for (size_t i = 0; i < N_SHAPES; i++)
        if (!strcmp(SHAPES[i].name, shape_name)) sh = &SHAPES[i];
    if (!sh)
        return kv_error_set(err, KV_ERR_INVALID, "unknown shape '%s' (tinyllama, llama3.2-1b, qwen2.5-0.5b, tiny)",
                            shape_name);
    int ft = -1;
    for (int i = 0; i < (int)(sizeof FTYPES / sizeof *FTYPES); i++)
        if (!strcmp(FTYPES[i].name, type_name)) ft = i;
    if (ft < 0)
        return kv_error_set(err, KV_ERR_INVALID, "unknown type '%s' (f16, q8_0, q4_0, q6_k, q4_k_m, q5_k_m)", type_name);
    int n_layer = n_layer_override > 0 ? n_layer_override : sh->n_layer;
    const int E = sh->n_embd, head_dim = E / sh->n_head, EKV = head_dim * sh->n_head_kv;
    const char *a = sh->arch;

    gguf_writer *w = gguf_writer_create();
    vocab v = {0};
    float *ones = malloc(sizeof(float) * (size_t)(E > sh->n_ff ? E : sh->n_ff));
    float *bias = malloc(sizeof(float) * (size_t)E);
    if (!w || !ones || !bias || vocab_build(&v, sh->n_vocab)) {
        gguf_writer_free(w);
        vocab_free(&v);
        free(ones);
        free(bias);
        return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < E; i++) ones[i] = 1.0f;
    uint64_t bs = seed ^ 0xb1a5;
    for (int i = 0; i < E; i++) bias[i] = (float)((int64_t)(mix64(&bs) % 2001) - 1000) * 1e-4f;

    char title[160];
    snprintf(title, sizeof title, "synthetic %s-shaped %s (random weights)", sh->title, FTYPES[ft].title);
    gguf_writer_set_str(w, "general.architecture", a);
    gguf_writer_set_str(w, "general.name", title);
    gguf_writer_set_u32(w, "general.file_type", (uint32_t)FTYPES[ft].file_type);
    gguf_writer_set_u32(w, "general.quantization_version", 2);
    set_arch_u32(w, a, "vocab_size", (uint32_t)sh->n_vocab);
    set_arch_u32(w, a, "context_length", (uint32_t)sh->n_ctx);
    set_arch_u32(w, a, "embedding_length", (uint32_t)E);
    set_arch_u32(w, a, "block_count", (uint32_t)n_layer);
    set_arch_u32(w, a, "feed_forward_length", (uint32_t)sh->n_ff);
    set_arch_u32(w, a, "attention.head_count", (uint32_t)sh->n_head);
    set_arch_u32(w, a, "attention.head_count_kv", (uint32_t)sh->n_head_kv);
    set_arch_u32(w, a, "rope.dimension_count", (uint32_t)head_dim);
    set_arch_f32(w, a, "rope.freq_base", sh->rope_base);
    set_arch_f32(w, a, "attention.layer_norm_rms_epsilon", sh->eps);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tokens, (uint64_t)v.n);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, v.scores, (uint64_t)v.n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v.types, (uint64_t)v.n);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1);

    fill_ctx fc = {.seed = seed};
    int64_t ne[4] = {E, sh->n_vocab, 1, 1};
    gguf_writer_add_tensor_fill(w, "token_embd.weight", tensor_type(ft, TK_EMBD, 0, n_layer, sh->tied, E), 2, ne,
                                fill_random, &fc);
    int64_t ne1[4] = {E, 1, 1, 1};
    gguf_writer_add_tensor(w, "output_norm.weight", GGML_TYPE_F32, 1, ne1, ones);
    if (!sh->tied)
        gguf_writer_add_tensor_fill(w, "output.weight", tensor_type(ft, TK_OUTPUT, 0, n_layer, 0, E), 2, ne,
                                    fill_random, &fc);
    static const struct { const char *suffix; int kind; } mats[] = {
        {"attn_q.weight", TK_Q}, {"attn_k.weight", TK_K}, {"attn_v.weight", TK_V}, {"attn_output.weight", TK_O},
        {"ffn_gate.weight", TK_GATE}, {"ffn_up.weight", TK_UP}, {"ffn_down.weight", TK_DOWN},
    };
    for (int il = 0; il < n_layer; il++) {
        char nm[96];
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", il);
        gguf_writer_add_tensor(w, nm, GGML_TYPE_F32, 1, ne1, ones);
        snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", il);
        gguf_writer_add_tensor(w, nm, GGML_TYPE_F32, 1, ne1, ones);
        for (size_t k = 0; k < sizeof mats / sizeof *mats; k++) {
            int kind = mats[k].kind;
            int64_t n_in = kind == TK_DOWN ? sh->n_ff : E;
            int64_t n_out = kind == TK_K || kind == TK_V ? EKV : kind == TK_GATE || kind == TK_UP ? sh->n_ff : E;
            int64_t ne2[4] = {n_in, n_out, 1, 1};
            snprintf(nm, sizeof nm, "blk.%d.%s", il, mats[k].suffix);
            gguf_writer_add_tensor_fill(w, nm, tensor_type(ft, kind, il, n_layer, sh->tied, n_in), 2, ne2,
                                        fill_random, &fc);
        }
        if (sh->qkv_bias) {
            int64_t nq[4] = {E, 1, 1, 1}, nkv[4] = {EKV, 1, 1, 1};
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
    free(ones);
    free(bias);
    return rc;
}

/* ---- command line ---------------------------------------------------------------------------- */

static void gen_usage(FILE *out)
{
    fprintf(out,
            "Usage: kvchat gen-model --shape SHAPE --type TYPE -o FILE [--layers N] [--seed N]\n"
            "Write a GGUF model of a real model's shape with random weights (for kvchat bench).\n"
            "  --shape SHAPE   tinyllama (TinyLlama-1.1B), llama3.2-1b, qwen2.5-0.5b, tiny (2 layers, for tests)\n"
            "  --type TYPE     f16, q8_0, q4_0, q6_k (every matrix in that type), q4_k_m or q5_k_m\n"
            "                  (llama-quantize's mixes: Q4_K / Q5_K, Q6_K for the output and some\n"
            "                  attn_v / ffn_down)\n"
            "  -o FILE         output path (files are large: TinyLlama F16 is 2.1 GiB)\n"
            "  --layers N      override the number of layers\n"
            "  --seed N        random seed (default 1)\n");
}

int gen_model_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"shape", required_argument, 0, 's'}, {"type", required_argument, 0, 'y'},
        {"output", required_argument, 0, 'o'}, {"layers", required_argument, 0, 'l'},
        {"seed", required_argument, 0, 'S'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *shape = NULL, *type = NULL, *out = NULL;
    int layers = 0;
    uint64_t seed = 1;
    optind = 1;
    opterr = 0;
    int o;
    while ((o = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        switch (o) {
        case 's': shape = optarg; break;
        case 'y': type = optarg; break;
        case 'o': out = optarg; break;
        case 'l': layers = atoi(optarg); if (layers < 1 || layers > 1024) goto bad; break;
        case 'S': seed = strtoull(optarg, NULL, 10); break;
        case 'h': gen_usage(stdout); return 0;
        default: goto bad;
        }
    }
    if (!shape || !type || !out || optind < argc) goto bad;
    kv_error err = {0};
    if (gen_model_write(out, shape, type, layers, seed, &err)) {
        fprintf(stderr, "kvchat gen-model: %s\n", err.msg);
        return err.code == KV_ERR_INVALID ? 2 : 1;
    }
    return 0;
bad:
    gen_usage(stderr);
    return 2;
}
