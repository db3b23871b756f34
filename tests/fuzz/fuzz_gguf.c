/* fuzz_gguf: libFuzzer harness for the GGUF reader (engine/gguf.c: gguf_open, the typed getters,
 * string arrays), the tokenizer loader and the model loader (engine/model.c: model_load) over one
 * input taken as a whole GGUF file (a memfd).
 * FUZZ_GGUF_SEEDS=DIR writes the seed inputs (gguf_writer: a whole tiny llama model with a
 * SentencePiece vocabulary, a gpt2-vocabulary file, a qwen2 model, each also cut in half) and
 * exits. */
#include "fuzz_util.h"

#include "engine/gguf.h"
#include "engine/gguf_writer.h"
#include "engine/kernels/quant.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

static int fill(void *user, const gguf_writer_chunk *c, kv_error *err)
{
    float *dst = c->dst;
    int64_t n = c->n_rows * c->ne[0];
    for (int64_t i = 0; i < n; i++) dst[i] = (float)((c->row0 * c->ne[0] + i) % 7) * 0.125f - 0.25f;
    return KV_OK;
}

/* A tiny model: n_embd 8, n_head 2, n_ff 16, `layers` layers, a 16-token vocabulary (SPM or gpt2). */
static void write_seed(const char *dir, const char *name, const char *arch, int layers, int bpe, int tensors)
{
    gguf_writer *w = gguf_writer_create();
    char key[128];
    gguf_writer_set_str(w, "general.architecture", arch);
    gguf_writer_set_str(w, "general.name", name);
#define U32(k, v) snprintf(key, sizeof key, "%s." k, arch), gguf_writer_set_u32(w, key, v)
    U32("context_length", 64);
    U32("embedding_length", 8);
    U32("block_count", layers);
    U32("feed_forward_length", 16);
    U32("attention.head_count", 2);
    U32("attention.head_count_kv", 1);
#undef U32
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    gguf_writer_set_f32(w, key, 1e-5f);
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    gguf_writer_set_f32(w, key, 10000.0f);
    static const char *const spm[16] = {"<unk>", "<s>", "</s>", "<0x0A>", "<0x20>", "\xe2\x96\x81", "\xe2\x96\x81h",
                                        "e", "l", "o", "he", "ll", "\xe2\x96\x81he", "<|im_start|>", "w", "r"};
    static const char *const bpe_tok[16] = {"<|endoftext|>", "h", "e", "l", "o", "\xc4\xa0", "w", "r", "d", "he", "ll",
                                            "\xc4\xa0w", "hell", "hello", "<|im_start|>", "<|im_end|>"};
    static const char *const merges[5] = {"h e", "l l", "\xc4\xa0 w", "he ll", "hell o"};
    float scores[16];
    int32_t types[16];
    for (int i = 0; i < 16; i++) {
        scores[i] = -(float)i;
        types[i] = 1;
    }
    if (bpe) {
        types[0] = types[14] = types[15] = 3;
        gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
        gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", bpe_tok, 16);
        gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 16);
        gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 5);
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 15);
        gguf_writer_set_str(w, "tokenizer.chat_template",
                            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
    } else {
        types[0] = 2;
        types[1] = types[2] = types[13] = 3;
        types[3] = types[4] = 6;
        gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", spm, 16);
        gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 16);
        gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 16);
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
        gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1);
    }
    if (tensors) {
        int qwen = !strcmp(arch, "qwen2");
        int64_t ne[2];
#define T(nm, a, b) ne[0] = a, ne[1] = b, gguf_writer_add_tensor_fill(w, nm, GGML_TYPE_F32, b ? 2 : 1, ne, fill, NULL)
        T("token_embd.weight", 8, 16);
        T("output_norm.weight", 8, 0);
        for (int l = 0; l < layers; l++) {
            char nm[64];
#define L(sfx, a, b) snprintf(nm, sizeof nm, "blk.%d.%s", l, sfx), T(nm, a, b)
            L("attn_norm.weight", 8, 0);
            L("attn_q.weight", 8, 8);
            L("attn_k.weight", 8, 4);
            L("attn_v.weight", 8, 4);
            L("attn_output.weight", 8, 8);
            L("ffn_norm.weight", 8, 0);
            L("ffn_gate.weight", 8, 16);
            L("ffn_up.weight", 8, 16);
            L("ffn_down.weight", 16, 8);
            if (qwen) {
                L("attn_q.bias", 8, 0);
                L("attn_k.bias", 4, 0);
                L("attn_v.bias", 4, 0);
            }
#undef L
        }
#undef T
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    kv_error err = {0};
    if (gguf_writer_write(w, path, &err)) {
        fprintf(stderr, "fuzz_gguf: %s\n", err.msg);
        exit(1);
    }
    gguf_writer_free(w);
    /* the first half too: a truncated file */
    size_t len;
    char *b = fuzz_read_file(path, &len);
    snprintf(path, sizeof path, "%s/%s-half.gguf", dir, name);
    FILE *f = b ? fopen(path, "wb") : NULL;
    if (f) {
        fwrite(b, 1, len / 2, f);
        fclose(f);
    }
    free(b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *dir = getenv("FUZZ_GGUF_SEEDS");
    if (!dir) return 0;
    write_seed(dir, "llama-spm", "llama", 1, 0, 1);
    write_seed(dir, "qwen2-bpe", "qwen2", 1, 1, 1);
    write_seed(dir, "vocab-only-spm", "llama", 2, 0, 0);
    exit(0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    if (fuzz_as_file(data, size, path, sizeof path)) return 0;
    kv_error err = {0};
    gguf_file *f = NULL;
    if (gguf_open(path, &f, &err) == KV_OK) {
        /* every key through the getters (the type checks), every string array element */
        for (uint64_t i = 0; i < f->n_kv; i++) {
            const gguf_kv *kv = &f->kv[i];
            char key[256];
            size_t kl = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
            memcpy(key, kv->key.ptr, kl);
            key[kl] = 0;
            uint32_t u;
            int64_t i64;
            float fl;
            int b;
            char *s = NULL;
            (void)gguf_get_u32(f, key, 0, &u, &err);
            (void)gguf_get_i64(f, key, 0, &i64, &err);
            (void)gguf_get_f32(f, key, 0, &fl, &err);
            (void)gguf_get_bool(f, key, 0, &b, &err);
            if (gguf_get_str(f, key, 0, &s, &err) == KV_OK) free(s);
            if (kv->arr_strs)
                for (uint64_t j = 0; j < kv->arr_len; j++) (void)(kv->arr_strs[j].len && kv->arr_strs[j].ptr[0]);
        }
        for (uint64_t i = 0; i < f->n_tensors; i++) (void)gguf_find_tensor(f, f->tensors[i].name);
        tokenizer *t = NULL;
        if (tokenizer_load(f, &t, &err) == KV_OK) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (tokenizer_encode(t, "Hello world <s> 123", 19, 1, 1, &ids, &n, &err) == KV_OK) {
                char buf[4096];
                for (size_t j = 0; j < n; j++) (void)tokenizer_token_to_piece(t, ids[j], 1, buf, sizeof buf);
            }
            free(ids);
            tokenizer_free(t);
        }
        gguf_close(f);
    }
    model *m = NULL;
    if (model_load(path, &m, &err) == KV_OK) model_free(m);
    return 0;
}
