/* fuzz_tok: the body shared by the two tokenizer harnesses — encode the input text (plain, with
 * special tokens, masked, as a chat prompt), decode it back, and decode the input read as token
 * ids through token_to_piece and the streaming detokenizer. The vocabulary is a fixed GGUF. */
#include "fuzz_util.h"

#include "engine/gguf.h"
#include "engine/tokenizer.h"

static gguf_file *tok_gguf;
static tokenizer *tok;

static int tok_init(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", fuzz_shared(), rel);
    kv_error err = {0};
    if (gguf_open(path, &tok_gguf, &err) || tokenizer_load(tok_gguf, &tok, &err)) {
        fprintf(stderr, "fuzz: cannot load the vocabulary %s: %s (set KVCHAT_SHARED)\n", path, err.msg);
        exit(1);
    }
    return 0;
}

static void tok_decode(const int32_t *ids, size_t n)
{
    size_t cap = 64 + 3 * tokenizer_max_piece_len(tok);
    char *buf = malloc(cap);
    if (!buf) return;
    detok_stream s;
    detok_stream_init(&s);
    for (size_t i = 0; i < n; i++) {
        size_t need = tokenizer_token_to_piece(tok, ids[i], i & 1, buf, cap);
        if (need > cap) abort(); /* max_piece_len is a promise */
        size_t w = detok_stream_push(&s, tok, ids[i], buf, cap);
        if (w > cap) abort();
        (void)tokenizer_token_text(tok, ids[i]);
        (void)tokenizer_is_control(tok, ids[i]);
        (void)tokenizer_is_eog(tok, ids[i]);
    }
    if (detok_stream_flush(&s, buf, cap) > 3) abort();
    free(buf);
}

static int tok_one(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    kv_error err = {0};
    const char *text = (const char *)data;
    int32_t *ids = NULL;
    size_t n = 0;
    for (int special = 0; special < 2; special++) {
        if (tokenizer_encode(tok, text, size, special, special, &ids, &n, &err) == KV_OK) {
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(tok)) abort();
            tok_decode(ids, n);
        }
        free(ids);
        ids = NULL;
    }
    /* the mask: bit 0 of each byte's position-hash marks literal bytes */
    unsigned char *lit = malloc(size ? size : 1);
    if (lit) {
        for (size_t i = 0; i < size; i++) lit[i] = (unsigned char)(((i * 2654435761u) >> 7) & 1) & (unsigned char)(size > 8 ? data[size / 2] : 0);
        if (tokenizer_encode_masked(tok, text, size, 0, lit, &ids, &n, &err) == KV_OK) tok_decode(ids, n);
        free(ids);
        ids = NULL;
        if (tokenizer_encode_prompt(tok, text, size, 1, lit, &ids, &n, &err) == KV_OK) tok_decode(ids, n);
        free(ids);
        ids = NULL;
        free(lit);
    }
    /* the input as token ids (any int32, out-of-range ones included) */
    size_t nid = size / 4;
    int32_t *raw = malloc((nid ? nid : 1) * sizeof *raw);
    if (raw) {
        memcpy(raw, data, nid * 4);
        tok_decode(raw, nid);
        free(raw);
    }
    return 0;
}
