/* fuzz_kv_restore: libFuzzer harness for the KV blob readers (engine/kv_cache.c): kv_blob_info,
 * kv_seq_restore of whole blobs and of deltas over a restored base, kv_blob_rebase, then
 * kv_cache_check's invariants. Byte 0 of the input is a control byte, the rest the blob:
 *   bit 0  recompute the trailing checksum (so mutations of the header and rows get past it)
 *   bit 1  recompute the prefix hash of the blob's tokens (version 2 layout)
 *   bit 2  delta: restore a 16-token base first and point the blob's base at it
 *   bits 3-4  cache type: f32, f16, q8_0 (2 layers x 32, 64 positions, 8 blocks)
 *   bit 5  take the caller's fingerprint from the blob (else 0x1234)
 * FUZZ_KV_SEEDS=DIR writes seed inputs (real blobs of each type, whole and delta) and exits. */
#include "fuzz_util.h"

#include "engine/kernels/quant.h"
#include "engine/kv_cache.h"

#define N_LAYER 2
#define N_EMBD 32
#define N_CTX 64
#define FP 0x1234ULL
#define N_VOCAB 512

static const int types[3] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0};
static kv_cache *caches[3];
static void *base_blob[3];
static size_t base_len[3];
static int32_t base_tokens[KV_BLOCK_SIZE];

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i); }
static void wr64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i); }

/* Fill seq with tokens[0..n) and rows derived from them. */
static void fill(kv_cache *c, int seq, const int32_t *tokens, int n)
{
    kv_error err = {0};
    int at = kv_seq_n_tokens(c, seq);
    if (kv_seq_reserve(c, seq, n, &err)) abort();
    float k[N_EMBD], v[N_EMBD];
    for (int p = 0; p < n; p++)
        for (int l = 0; l < N_LAYER; l++) {
            for (int j = 0; j < N_EMBD; j++) {
                k[j] = (float)((tokens[p] * 7 + j + l) % 13) / 4.0f - 1.5f;
                v[j] = (float)((tokens[p] * 3 + j * 5 + l) % 11) / 8.0f;
            }
            kv_cache_store(c, seq, l, at + p, k, v);
        }
    kv_seq_commit(c, seq, tokens, n);
}

static void write_seed(const char *dir, const char *name, uint8_t ctl, const void *blob, size_t len)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return;
    fputc(ctl, f);
    fwrite(blob, 1, len, f);
    fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    kv_error err = {0};
    for (int i = 0; i < KV_BLOCK_SIZE; i++) base_tokens[i] = (i * 37 + 1) % N_VOCAB;
    const char *seeds = getenv("FUZZ_KV_SEEDS");
    for (int t = 0; t < 3; t++) {
        kv_cache_params p = {N_LAYER, N_EMBD, N_CTX, types[t], 8, 0};
        caches[t] = kv_cache_create_ex(&p, &err);
        if (!caches[t]) {
            fprintf(stderr, "fuzz_kv_restore: %s\n", err.msg);
            exit(1);
        }
        fill(caches[t], KV_SEQ_DEFAULT, base_tokens, KV_BLOCK_SIZE);
        if (kv_seq_save(caches[t], KV_SEQ_DEFAULT, KV_BLOCK_SIZE, FP, &base_blob[t], &base_len[t], &err)) abort();
        if (seeds) {
            int32_t more[21];
            for (int i = 0; i < 21; i++) more[i] = (i * 11 + 5) % N_VOCAB;
            fill(caches[t], KV_SEQ_DEFAULT, more, 21);
            void *b;
            size_t l;
            char name[64];
            uint8_t tb = (uint8_t)(t << 3);
            if (kv_seq_save(caches[t], KV_SEQ_DEFAULT, -1, FP, &b, &l, &err)) abort();
            snprintf(name, sizeof name, "whole-%d", t);
            write_seed(seeds, name, tb, b, l);
            free(b);
            if (kv_seq_save_range(caches[t], KV_SEQ_DEFAULT, KV_BLOCK_SIZE, -1, FP, &b, &l, &err)) abort();
            snprintf(name, sizeof name, "delta-%d", t);
            write_seed(seeds, name, tb | 4, b, l);
            free(b);
            kv_seq_truncate(caches[t], KV_SEQ_DEFAULT, 5);
            if (kv_seq_save(caches[t], KV_SEQ_DEFAULT, -1, FP, &b, &l, &err)) abort();
            snprintf(name, sizeof name, "short-%d", t);
            write_seed(seeds, name, tb, b, l);
            free(b);
        }
        kv_seq_truncate(caches[t], KV_SEQ_DEFAULT, 0);
    }
    if (seeds) exit(0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 20) return 0;
    uint8_t ctl = data[0];
    size_t len = size - 1;
    uint8_t *b = malloc(len ? len : 1);
    if (!b) return 0;
    memcpy(b, data + 1, len);
    int t = (ctl >> 3 & 3) % 3;
    kv_cache *c = caches[t];
    int delta = ctl & 4;
    if (len >= 72 && rd32(b + 4) == 2) {
        uint32_t n = rd32(b + 32), n_clean = rd32(b + 36), n_base = rd32(b + 48);
        if (delta) {
            n_base = KV_BLOCK_SIZE;
            wr32(b + 48, n_base);
            wr64(b + 56, kv_prefix_hash(base_tokens, KV_BLOCK_SIZE));
        }
        if ((ctl & 2) && n >= n_base && n_clean >= n_base && n_clean <= n && 64 + 4 * (size_t)(n - n_base) + 8 <= len) {
            /* chained from the base over the blob's own clean full blocks */
            uint64_t h = rd64(b + 56);
            int32_t *tk = malloc(4 * (size_t)(n - n_base) + 4);
            if (tk) {
                for (uint32_t i = 0; i < n - n_base; i++) tk[i] = (int32_t)rd32(b + 64 + 4 * i);
                for (uint32_t blk = 0; (blk + 1) * KV_BLOCK_SIZE <= n_clean - n_base; blk++)
                    h = kv_hash_block(h, tk + blk * KV_BLOCK_SIZE, KV_BLOCK_SIZE);
                free(tk);
                wr64(b + 40, h);
            }
        }
    }
    if ((ctl & 1) && len >= 8) wr64(b + len - 8, kv_checksum64(b, len - 8));
    uint64_t fp = (ctl & 0x20) && len >= 16 ? rd64(b + 8) : FP;

    kv_error err = {0};
    int n_tokens, n_base;
    uint64_t ph, bh;
    int info = kv_blob_info(b, len, &n_tokens, &ph, &n_base, &bh, &err);
    int seq = KV_SEQ_DEFAULT;
    if (kv_seq_new(c, &seq, &err) == KV_OK) {
        if (delta && kv_seq_restore(c, seq, base_blob[t], base_len[t], FP, N_VOCAB, &err)) abort();
        int before = kv_seq_n_tokens(c, seq);
        int rc = kv_seq_restore(c, seq, b, len, fp, N_VOCAB, &err);
        if (rc == KV_OK && info != KV_OK) abort(); /* restore accepted what info refused */
        if (rc != KV_OK && kv_seq_n_tokens(c, seq) != before) abort(); /* "on any error seq is unchanged" */
        if (kv_cache_check(c, &err) != KV_OK) {
            fprintf(stderr, "fuzz_kv_restore: %s\n", err.msg);
            abort();
        }
        if (rc == KV_OK) {
            float tmp[N_CTX * N_EMBD];
            int n = kv_seq_n_tokens(c, seq);
            for (int l = 0; l < N_LAYER; l++) {
                (void)kv_cache_k(c, seq, l, n, tmp);
                (void)kv_cache_v(c, seq, l, n, tmp);
            }
        }
        kv_seq_free(c, seq);
    }
    if (info == KV_OK) {
        void *out = NULL;
        size_t out_len = 0;
        for (int nb = 0; nb <= 32; nb += KV_BLOCK_SIZE)
            if (kv_blob_rebase(b, len, nb, &out, &out_len, &err) == KV_OK) {
                if (kv_blob_info(out, out_len, NULL, NULL, NULL, NULL, &err) != KV_OK) abort();
                free(out);
            }
    }
    kv_cache_drop_cached(c);
    free(b);
    return 0;
}
