/* tools: the non-chat subcommands of kvchat — `kvchat bench` and `kvchat gen-model`. */
#ifndef KV_APP_TOOLS_H
#define KV_APP_TOOLS_H

#include <stdint.h>

#include "engine/kv_error.h"

/* `kvchat bench -m MODEL [-p 512] [-n 128] [-t THREADS] [-r REPS] [--json]` (argv[0] is
 * "bench"): prefill and decode speed in the style of llama-bench. Returns an exit status
 * (0 ok, 1 runtime error, 2 usage error, 3 model error). */
int bench_main(int argc, char **argv);

/* `kvchat gen-model --shape SHAPE --type TYPE -o FILE` (argv[0] is "gen-model"): writes a
 * llama/qwen2 GGUF of a real model's shape with random weights, for speed measurements
 * without a download. Returns an exit status like bench_main. */
int gen_model_main(int argc, char **argv);

/* The shapes gen-model knows (NULL-terminated names) and the library call behind it:
 * shape "tinyllama", "llama3.2-1b", "qwen2.5-0.5b" or "tiny" (a 2-layer model for tests), or
 * one of the newer architectures' "qwen3-0.6b", "smollm3-3b", "granite-3-2b", "olmo2-1b",
 * "gemma2-2b", "gemma3-1b", "gemma3-4b", "phi4-mini", "ministral3-3b", "internlm2.5-1.8b", or a
 * mixture of experts: "qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "olmoe-1b-7b";
 * type "f16", "q8_0", "q4_0", "q4_k_m" or "q5_k_m"; n_layer > 0 overrides the shape's layer count.
 * Writes `path` (through path.tmp). */
extern const char *const gen_model_shapes[];
int gen_model_write(const char *path, const char *shape, const char *type, int n_layer, uint64_t seed,
                    kv_error *err);
/* The same with every override: n_layer, n_vocab (>= 260), n_ff, n_swa (the sliding window of the
 * gemma shapes), n_ctx_orig (phi4-mini's and ministral3-3b's rope.scaling.original_context_length); 0 keeps the
 * shape's value. The file depends only on these, the shape, the type and the seed. */
typedef struct gen_model_opts {
    int n_layer, n_vocab, n_ff, n_swa, n_ctx_orig;
    float attn_softcap; /* gemma2's attn_logit_softcapping; 0 keeps the shape's 50 */
    float rope_yarn;    /* > 0: YaRN RoPE of this factor over original_context_length 4096 (any shape) */
    uint64_t seed;
    const char *chat_template; /* tokenizer.chat_template's text (--chat-template FILE); NULL: none */
    /* mixture-of-experts shapes (qwen3-30b-a3b, qwen1.5-moe-a2.7b, olmoe-1b-7b): expert_count,
     * expert_used_count, expert_feed_forward_length (olmoe: n_ff), expert_shared_feed_forward_length */
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    const char *special;       /* comma-separated control tokens (e.g. "<|im_start|>,<|im_end|>") that
                                  take the last ids of the vocabulary, or NULL */
} gen_model_opts;
int gen_model_write_ex(const char *path, const char *shape, const char *type, const gen_model_opts *opts,
                       kv_error *err);

#endif
