/* test_tokenizer: tokenizer conformance (llama.cpp/HF test vectors, golden prompts), round trips, special tokens, streaming detokenization, robustness and speed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/gguf.h"
#include "engine/gguf_writer.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_internal.h" /* white-box: toggles the SPM word-split fast path */
#include "tests/support/testutil.h"

/* ---- helpers ------------------------------------------------------------------------- */

static uint32_t rnd(void);

typedef struct loaded {
    gguf_file *f;
    tokenizer *t;
} loaded;

static int load_path(const char *path, loaded *l, kv_error *err)
{
    l->f = NULL;
    l->t = NULL;
    int rc = gguf_open(path, &l->f, err);
    if (rc) return rc;
    rc = tokenizer_load(l->f, &l->t, err);
    if (rc) {
        gguf_close(l->f);
        l->f = NULL;
    }
    return rc;
}

static void unload(loaded *l)
{
    tokenizer_free(l->t);
    gguf_close(l->f);
}

static loaded must_load(const char *rel)
{
    loaded l;
    kv_error err = { 0 };
    int rc = load_path(tu_path(rel), &l, &err);
    if (rc) fail_msg("%s: %s", rel, err.msg);
    return l;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int32_t *encode(const tokenizer *t, const char *s, size_t len, int bos, int special, size_t *n)
{
    int32_t *ids = NULL;
    kv_error err = { 0 };
    int rc = tokenizer_encode(t, s, len, bos, special, &ids, n, &err);
    if (rc) fail_msg("encode: %s", err.msg);
    assert_non_null(ids);
    return ids;
}

/* Concatenated pieces (render_special 0) into a malloc'd buffer. */
static char *decode(const tokenizer *t, const int32_t *ids, size_t n, size_t *out_len)
{
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++) {
        size_t k = tokenizer_token_to_piece(t, ids[i], 0, NULL, 0);
        while (len + k + 1 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        assert_int_equal(tokenizer_token_to_piece(t, ids[i], 0, buf + len, cap - len), k);
        len += k;
    }
    buf[len] = 0;
    *out_len = len;
    return buf;
}

static int contains_id(const int32_t *ids, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    printf("    %s:", what);
    for (size_t i = 0; i < n && i < 64; i++) printf(" %d", ids[i]);
    printf("\n");
}

/* ---- conformance vectors (models/vocab/ggml-vocab-X.gguf.inp / .out) ------------------- */

static const char k_sep[] = "\n__ggml_vocab_test__\n";

/* Runs every case of one vocab; prints the pass count; returns failures. Each case also
 * checks decode(encode(x)) == x (SPM: after dropping the one prefix space). */
static int run_vocab(const char *name, int expect_cases, int spm)
{
    char rel[256], inp_path[512], out_path[512];
    snprintf(rel, sizeof rel, "models/vocab/ggml-vocab-%s.gguf", name);
    loaded l;
    kv_error err = { 0 };
    if (load_path(tu_path(rel), &l, &err)) {
        printf("  %-15s cannot load: %s\n", name, err.msg);
        return -1;
    }
    snprintf(inp_path, sizeof inp_path, "%s.inp", tu_path(rel));
    snprintf(out_path, sizeof out_path, "%s.out", tu_path(rel));
    size_t ni, no;
    char *inp = tu_read_file(inp_path, &ni), *outp = tu_read_file(out_path, &no);
    assert_non_null(inp);
    assert_non_null(outp);
    int total = 0, pass = 0, rt_fail = 0;
    char *ip = inp, *op = outp;
    for (;;) {
        char *e = memmem(ip, ni - (size_t)(ip - inp), k_sep, sizeof k_sep - 1);
        if (!e) break;
        size_t cl = (size_t)(e - ip);
        char *nl = strchr(op, '\n');
        if (!nl) nl = op + strlen(op);
        size_t n;
        int32_t *ids = encode(l.t, ip, cl, 0, 0, &n);
        char got[8192];
        size_t gl = 0;
        for (size_t i = 0; i < n && gl < sizeof got - 16; i++) gl += (size_t)snprintf(got + gl, sizeof got - gl, " %d", ids[i]);
        total++;
        if (gl == (size_t)(nl - op) && memcmp(got, op, gl) == 0) {
            pass++;
        } else {
            printf("  %s case %d: %.*s\n    got:%s\n    exp:%.*s\n", name, total - 1, (int)(cl > 60 ? 60 : cl), ip, got,
                   (int)(nl - op), op);
        }
        size_t dl;
        char *dec = decode(l.t, ids, n, &dl);
        const char *d = dec;
        if (spm && dl > 0 && d[0] == ' ') {
            d++;
            dl--;
        }
        if (dl != cl || memcmp(d, ip, cl) != 0) {
            rt_fail++;
            printf("  %s case %d: round trip differs: '%s'\n", name, total - 1, dec);
        }
        free(dec);
        free(ids);
        ip = e + sizeof k_sep - 1;
        op = *nl ? nl + 1 : nl;
    }
    printf("  %-15s %d/%d cases pass (%d round-trip failures)%s%s\n", name, pass, total, rt_fail,
           tokenizer_warning(l.t) ? "; warning: " : "", tokenizer_warning(l.t) ? tokenizer_warning(l.t) : "");
    free(inp);
    free(outp);
    unload(&l);
    assert_int_equal(total, expect_cases);
    return (total - pass) + rt_fail;
}

#define VOCAB_TEST(fn, name, cases, spm)                   \
    static void fn(void **state)                           \
    {                                                      \
        (void)state;                                       \
        assert_int_equal(run_vocab(name, cases, spm), 0);  \
    }

VOCAB_TEST(test_vocab_llama_spm, "llama-spm", 46, 1)
VOCAB_TEST(test_vocab_phi3, "phi-3", 46, 1)
VOCAB_TEST(test_vocab_gpt2, "gpt-2", 46, 0)
VOCAB_TEST(test_vocab_falcon, "falcon", 46, 0)
VOCAB_TEST(test_vocab_mpt, "mpt", 46, 0)
VOCAB_TEST(test_vocab_starcoder, "starcoder", 46, 0)
VOCAB_TEST(test_vocab_refact, "refact", 46, 0)
VOCAB_TEST(test_vocab_deepseek_llm, "deepseek-llm", 46, 0)
VOCAB_TEST(test_vocab_deepseek_coder, "deepseek-coder", 46, 0)
VOCAB_TEST(test_vocab_dbrx, "dbrx", 43, 0)

/* bert-bge is a WordPiece vocab: not supported, and it must say so cleanly. */
static void test_vocab_bert_unsupported(void **state)
{
    (void)state;
    loaded l;
    kv_error err = { 0 };
    assert_int_equal(load_path(tu_path("models/vocab/ggml-vocab-bert-bge.gguf"), &l, &err), KV_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "ggml-vocab-bert-bge.gguf"));
    assert_non_null(strstr(err.msg, "'bert'"));
}

/* ---- golden prompts (llama.cpp's prompt_tokens for each golden file) ------------------- */

static void test_golden_prompts(void **state)
{
    (void)state;
    static const char *const files[] = {
        "stories260K.p1", "stories260K.p2", "stories260K.p3", "stories260K.p4", "stories260K.p5",
        "stories260K.long", "llama-2-tiny-random.p1", "syn-llama-f32.p1", "syn-llama-f32.long",
        "syn-llama-f16.p1", "syn-llama-q8_0.long", "syn-llama3-f32.p1", "syn-llama3-f32.long",
        "syn-qwen2-f32.p1", "syn-qwen2-f32.long", "syn-qwen2-q8_0.p1", NULL,
    };
    int checked = 0, pieces = 0;
    for (int fi = 0; files[fi]; fi++) {
        char rel[256], model[128];
        snprintf(rel, sizeof rel, "golden/%s.json", files[fi]);
        snprintf(model, sizeof model, "%s", files[fi]);
        *strrchr(model, '.') = 0;
        cJSON *js = tu_read_json(tu_path(rel));
        if (!js) fail_msg("cannot read %s", rel);
        char mrel[256];
        snprintf(mrel, sizeof mrel, "models/%s.gguf", model);
        loaded l = must_load(mrel);
        const cJSON *prompt = cJSON_GetObjectItem(js, "prompt");
        const cJSON *want = cJSON_GetObjectItem(js, "prompt_tokens");
        assert_non_null(prompt);
        assert_non_null(want);
        size_t n;
        int32_t *ids = encode(l.t, prompt->valuestring, strlen(prompt->valuestring), tokenizer_add_bos(l.t), 0, &n);
        int nw = cJSON_GetArraySize(want), ok = (size_t)nw == n;
        for (int i = 0; ok && i < nw; i++) ok = cJSON_GetArrayItem(want, i)->valueint == ids[i];
        if (!ok) {
            print_ids("got", ids, n);
            fail_msg("%s: prompt tokens differ (%zu vs %d)", rel, n, nw);
        }
        /* every generated token's piece as llama.cpp printed it */
        const cJSON *step;
        cJSON_ArrayForEach(step, cJSON_GetObjectItem(js, "steps")) {
            const cJSON *tok = cJSON_GetObjectItem(step, "token"), *piece = cJSON_GetObjectItem(step, "piece");
            if (!tok || !piece || !cJSON_IsString(piece)) continue;
            char buf[512];
            size_t k = tokenizer_token_to_piece(l.t, tok->valueint, 0, buf, sizeof buf);
            if (k != strlen(piece->valuestring) || memcmp(buf, piece->valuestring, k) != 0)
                fail_msg("%s: piece of token %d is '%.*s', golden '%s'", rel, tok->valueint, (int)k, buf,
                         piece->valuestring);
            pieces++;
        }
        checked++;
        free(ids);
        unload(&l);
        cJSON_Delete(js);
    }
    printf("  golden: %d prompts and %d pieces match llama.cpp\n", checked, pieces);
}

static void test_stories_once_upon(void **state)
{
    (void)state;
    loaded l = must_load("models/stories260K.gguf");
    size_t n;
    int32_t *ids = encode(l.t, "Once upon a time", 16, 1, 0, &n);
    const int32_t want[] = { 1, 403, 407, 261, 378 };
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    assert_int_equal(tokenizer_n_vocab(l.t), 512);
    assert_int_equal(tokenizer_bos(l.t), 1);
    assert_int_equal(tokenizer_eos(l.t), 2);
    assert_true(tokenizer_add_bos(l.t));
    assert_true(tokenizer_is_eog(l.t, 2));
    assert_false(tokenizer_is_eog(l.t, 403));
    assert_true(tokenizer_is_control(l.t, 1));
    assert_false(tokenizer_is_control(l.t, 403));
    assert_null(tokenizer_warning(l.t));
    /* empty text: just BOS */
    free(ids);
    ids = encode(l.t, "", 0, 1, 0, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    free(ids);
    ids = encode(l.t, NULL, 0, 0, 0, &n);
    assert_int_equal(n, 0);
    free(ids);
    unload(&l);
}

/* ---- special tokens ------------------------------------------------------------------- */

static void test_special_spm(void **state)
{
    (void)state;
    loaded l = must_load("models/vocab/ggml-vocab-llama-spm.gguf");
    size_t n;
    int32_t *ids = encode(l.t, "<s>hi</s>", 9, 0, 0, &n);
    assert_false(contains_id(ids, n, 1));
    assert_false(contains_id(ids, n, 2));
    for (size_t i = 0; i < n; i++) assert_false(tokenizer_is_control(l.t, ids[i]));
    free(ids);
    ids = encode(l.t, "<s>hi</s>", 9, 0, 1, &n);
    assert_true(n >= 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[n - 1], 2);
    free(ids);
    /* render_special */
    char buf[16];
    assert_int_equal(tokenizer_token_to_piece(l.t, 1, 0, buf, sizeof buf), 0);
    assert_int_equal(tokenizer_token_to_piece(l.t, 1, 1, buf, sizeof buf), 3);
    assert_memory_equal(buf, "<s>", 3);
    assert_string_equal(tokenizer_token_text(l.t, 1), "<s>");
    assert_string_equal(tokenizer_token_text(l.t, 15043), "\xe2\x96\x81Hello");
    assert_string_equal(tokenizer_token_text(l.t, -1), "");
    assert_string_equal(tokenizer_token_text(l.t, 32000), "");
    /* snprintf-like: too small a buffer → length, nothing written */
    memset(buf, 'x', sizeof buf);
    assert_int_equal(tokenizer_token_to_piece(l.t, 15043, 0, buf, 3), 6);
    assert_int_equal(buf[0], 'x');
    assert_int_equal(tokenizer_token_to_piece(l.t, 15043, 0, buf, 6), 6);
    assert_memory_equal(buf, " Hello", 6);
    assert_int_equal(tokenizer_token_to_piece(l.t, 99999, 0, buf, sizeof buf), 0);
    assert_int_equal(tokenizer_token_id(l.t, "\xe2\x96\x81Hello", 8), 15043);
    assert_int_equal(tokenizer_token_id(l.t, "no such token!", 14), -1);
    unload(&l);
}

static void test_special_phi3(void **state)
{
    (void)state;
    loaded l = must_load("models/vocab/ggml-vocab-phi-3.gguf");
    const char *s = "<|user|>\nHi<|end|>\n<|assistant|>";
    size_t n;
    int32_t *ids = encode(l.t, s, strlen(s), 0, 0, &n);
    for (size_t i = 0; i < n; i++) assert_false(tokenizer_is_control(l.t, ids[i]));
    assert_false(contains_id(ids, n, 32007));
    free(ids);
    ids = encode(l.t, s, strlen(s), 1, 1, &n);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 32010);
    assert_true(contains_id(ids, n, 32007));
    assert_int_equal(ids[n - 1], 32001);
    free(ids);
    assert_true(tokenizer_is_eog(l.t, 32007));   /* <|end|> */
    assert_true(tokenizer_is_eog(l.t, 32000));   /* <|endoftext|> = eos */
    assert_false(tokenizer_is_eog(l.t, 32010));  /* <|user|> */
    unload(&l);
}

static void test_special_bpe(void **state)
{
    (void)state;
    loaded l = must_load("models/vocab/ggml-vocab-gpt-2.gguf");
    const char *s = "a<|endoftext|>b";
    size_t n;
    int32_t *ids = encode(l.t, s, strlen(s), 0, 0, &n);
    assert_false(contains_id(ids, n, 50256));
    size_t dl;
    char *d = decode(l.t, ids, n, &dl);
    assert_string_equal(d, s);
    free(d);
    free(ids);
    ids = encode(l.t, s, strlen(s), 0, 1, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 50256);
    free(ids);
    assert_int_equal(tokenizer_bos(l.t), 50256);
    assert_false(tokenizer_add_bos(l.t));
    assert_true(tokenizer_is_eog(l.t, 50256));
    unload(&l);
}

/* ---- synthetic vocabularies (written with gguf_writer) -------------------------------- */

typedef struct synth {
    char path[64];
} synth;

static void synth_write(gguf_writer *w, synth *s)
{
    snprintf(s->path, sizeof s->path, "/tmp/kvchat-tok-XXXXXX");
    int fd = mkstemp(s->path);
    assert_true(fd >= 0);
    close(fd);
    kv_error err = { 0 };
    if (gguf_writer_write(w, s->path, &err)) fail_msg("gguf_writer_write: %s", err.msg);
    gguf_writer_free(w);
}

/* GPT-2 byte alphabet code point of byte b (GPT-2 bytes_to_unicode). */
static unsigned byte_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    if (b <= 32) return 256 + b;
    if (b <= 160) return 256 + 33 + (b - 127);
    return 256 + 67;
}

static void put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        o[1] = 0;
    } else {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        o[2] = 0;
    }
}

/* A ChatML-style byte-level vocab: 256 byte tokens, a few merges, <|im_start|>, <|im_end|>. */
static gguf_writer *chatml_writer(const char *pre)
{
    static char bytes[256][4];
    const char *tokens[262];
    int32_t types[262];
    for (int b = 0; b < 256; b++) {
        put_utf8(bytes[b], byte_cp((unsigned)b));
        tokens[b] = bytes[b];
        types[b] = 1;
    }
    tokens[256] = "he";
    tokens[257] = "ll";
    tokens[258] = "hell";
    tokens[259] = "<|im_start|>";
    tokens[260] = "<|im_end|>";
    tokens[261] = "\xc4\xa0hell"; /* "Ġhell" */
    types[256] = types[257] = types[258] = types[261] = 1;
    types[259] = types[260] = 3;
    const char *merges[] = { "h e", "l l", "he ll", "\xc4\xa0 hell" };
    gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (pre) gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 262);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 262);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 4);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 260);
    return w;
}

static void test_synthetic_chatml(void **state)
{
    (void)state;
    synth s;
    synth_write(chatml_writer("qwen2"), &s);
    loaded l;
    kv_error err = { 0 };
    assert_int_equal(load_path(s.path, &l, &err), KV_OK);
    assert_null(tokenizer_warning(l.t));
    const char *txt = "<|im_start|>hello<|im_end|> hello";
    size_t n;
    int32_t *ids = encode(l.t, txt, strlen(txt), 0, 0, &n);
    assert_false(contains_id(ids, n, 259));
    assert_false(contains_id(ids, n, 260));
    size_t dl;
    char *d = decode(l.t, ids, n, &dl);
    assert_string_equal(d, txt);
    free(d);
    free(ids);
    ids = encode(l.t, txt, strlen(txt), 0, 1, &n);
    /* <|im_start|> hell o <|im_end|> Ġhell o */
    const int32_t want[] = { 259, 258, 'o', 260, 261, 'o' };
    if (n != 6 || memcmp(ids, want, sizeof want) != 0) print_ids("got", ids, n);
    assert_int_equal(n, 6);
    assert_memory_equal(ids, want, sizeof want);
    assert_true(tokenizer_is_eog(l.t, 260));
    assert_false(tokenizer_is_eog(l.t, 259));
    assert_false(tokenizer_add_bos(l.t));
    assert_int_equal(tokenizer_bos(l.t), -1);
    free(ids);
    unload(&l);
    unlink(s.path);
}

/* An unknown pre-tokenizer is an error naming the file, the key and the value (issue 13: never
 * a silent default); a missing one keeps the GPT-2 rules with a warning (old files). */
static void test_unknown_pre_is_error(void **state)
{
    (void)state;
    synth s;
    synth_write(chatml_writer("no-such-family"), &s);
    loaded l;
    kv_error err = { 0 };
    assert_int_equal(load_path(s.path, &l, &err), KV_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, s.path));
    assert_non_null(strstr(err.msg, "unknown pre-tokenizer 'no-such-family' (tokenizer.ggml.pre)"));
    assert_non_null(strstr(err.msg, "known: gpt-2 default"));
    assert_non_null(strstr(err.msg, "qwen2"));
    unlink(s.path);
    synth_write(chatml_writer(NULL), &s);
    assert_int_equal(load_path(s.path, &l, &err), KV_OK);
    assert_non_null(tokenizer_warning(l.t));
    assert_non_null(strstr(tokenizer_warning(l.t), "no tokenizer.ggml.pre"));
    size_t n;
    int32_t *ids = encode(l.t, "hello", 5, 0, 0, &n);  /* GPT-2 rules */
    assert_int_equal(n, 2);
    free(ids);
    unload(&l);
    unlink(s.path);
}

/* A 512-token SentencePiece vocab (<unk> <s> </s>, 256 byte tokens, "t259".."t511"), scores
 * -i, one special id key set by the caller (or none when key is NULL). */
static gguf_writer *spm512_writer(void)
{
    static char names[512][12];
    const char *tokens[512];
    float scores[512];
    int32_t types[512];
    for (int i = 0; i < 512; i++) {
        if (i < 3) snprintf(names[i], sizeof names[i], "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259) snprintf(names[i], sizeof names[i], "<0x%02X>", i - 3);
        else snprintf(names[i], sizeof names[i], "t%d", i);
        tokens[i] = names[i];
        scores[i] = (float)-i;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 512);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 512);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 512);
    return w;
}

static void expect_tok_error(gguf_writer *w, const char *what, ...)
{
    synth s;
    synth_write(w, &s);
    loaded l;
    kv_error err = { 0 };
    int rc = load_path(s.path, &l, &err);
    if (rc == KV_OK) {
        unload(&l);
        fail_msg("%s: loaded, expected an error", what);
    }
    if (rc != KV_ERR_FORMAT) fail_msg("%s: code %d: %s", what, rc, err.msg);
    if (!strstr(err.msg, s.path)) fail_msg("%s: message does not name the file: %s", what, err.msg);
    va_list ap;
    va_start(ap, what);
    for (const char *want; (want = va_arg(ap, const char *));)
        if (!strstr(err.msg, want)) fail_msg("%s: message lacks '%s': %s", what, want, err.msg);
    va_end(ap);
    unlink(s.path);
}

/* Special token ids outside the vocabulary are load errors naming the key (they changed the
 * output silently: a BOS of 600 in a 512 vocab was dropped, the default used); the "none"
 * sentinels -1 / 0xFFFFFFFF and the last id are accepted. */
static void test_special_id_out_of_vocab(void **state)
{
    (void)state;
    static const char *const keys[] = { "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                        "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                                        "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id" };
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        gguf_writer *w = spm512_writer();
        gguf_writer_set_u32(w, keys[k], 600);
        expect_tok_error(w, keys[k], keys[k], "= 600 is outside the vocabulary (512 tokens", (const char *)NULL);
        w = spm512_writer();
        gguf_writer_set_u32(w, keys[k], 1u << 31);
        expect_tok_error(w, keys[k], keys[k], "= 2147483648 is outside", (const char *)NULL);
        w = spm512_writer();
        gguf_writer_set_i32(w, keys[k], -5);
        expect_tok_error(w, keys[k], keys[k], "= -5 is outside", (const char *)NULL);
        w = spm512_writer();
        gguf_writer_set_u32(w, keys[k], 512);
        expect_tok_error(w, keys[k], keys[k], "= 512 is outside", (const char *)NULL);
    }
    /* accepted: the last id, and the "none" sentinels */
    gguf_writer *w = spm512_writer();
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 511);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 0xFFFFFFFFu);
    gguf_writer_set_i32(w, "tokenizer.ggml.padding_token_id", -1);
    synth s;
    synth_write(w, &s);
    loaded l;
    kv_error err = { 0 };
    if (load_path(s.path, &l, &err)) fail_msg("%s", err.msg);
    assert_int_equal(tokenizer_bos(l.t), 511);
    assert_int_equal(tokenizer_eos(l.t), -1);
    unload(&l);
    unlink(s.path);
}

/* A NaN score and a repeated token text are load errors naming the index and the token. */
static void test_nan_score_and_duplicate_token(void **state)
{
    (void)state;
    static char names[512][12];
    const char *tokens[512];
    float scores[512];
    for (int i = 0; i < 512; i++) {
        snprintf(names[i], sizeof names[i], i < 3 ? (i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>") : "t%d", i);
        tokens[i] = names[i];
        scores[i] = (float)-i;
    }
    scores[300] = NAN;
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 512);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 512);
    expect_tok_error(w, "NaN score", "tokenizer.ggml.scores[300] is NaN", "'t300'", (const char *)NULL);
    scores[300] = -300;
    tokens[400] = "t10";
    w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 512);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 512);
    expect_tok_error(w, "duplicate", "tokenizer.ggml.tokens[400] 't10' repeats tokenizer.ggml.tokens[10]",
                     (const char *)NULL);
    /* BPE too */
    gguf_writer *b = chatml_writer("qwen2");
    static char bytes[256][4];
    const char *btok[262];
    for (int i = 0; i < 256; i++) {
        put_utf8(bytes[i], byte_cp((unsigned)i));
        btok[i] = bytes[i];
    }
    btok[256] = "he"; btok[257] = "ll"; btok[258] = "hell"; btok[259] = "<|im_start|>"; btok[260] = "<|im_end|>";
    btok[261] = "ll";
    gguf_writer_set_arr_str(b, "tokenizer.ggml.tokens", btok, 262);
    expect_tok_error(b, "bpe duplicate", "tokenizer.ggml.tokens[261] 'll' repeats tokenizer.ggml.tokens[257]",
                     (const char *)NULL);
    /* two empty texts are not duplicates (they never match text) */
    tokens[400] = "";
    tokens[401] = "";
    w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 512);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 512);
    synth s;
    synth_write(w, &s);
    loaded l;
    kv_error err = { 0 };
    if (load_path(s.path, &l, &err)) fail_msg("%s", err.msg);
    unload(&l);
    unlink(s.path);
}

/* Every pre-tokenizer family compiles, is recognized, and round-trips text. */
static void test_all_pre_tokenizers(void **state)
{
    (void)state;
    static const char *const pres[] = { "gpt-2", "default", "mpt", "starcoder", "refact", "smollm", "command-r", "falcon",
                                        "llama3", "llama-bpe", "dbrx", "smaug-bpe", "chatglm-bpe", "qwen2",
                                        "deepseek-r1-qwen", "stablelm2", "gpt-4o", "llama4", "tekken", "deepseek-llm",
                                        "deepseek-v3", "deepseek-coder", NULL };
    const char *txt = "Hello world! It's 2024-05-01, \xe4\xbd\xa0\xe5\xa5\xbd\xe3\x81\x82 \xce\xb1\xce\xb2  \n\n\tdone \xf0\x9f\xa6\x99 x\xff";
    for (int i = 0; pres[i]; i++) {
        synth s;
        synth_write(chatml_writer(pres[i]), &s);
        loaded l;
        kv_error err = { 0 };
        if (load_path(s.path, &l, &err)) fail_msg("pre '%s': %s", pres[i], err.msg);
        if (tokenizer_warning(l.t)) fail_msg("pre '%s': unexpected warning %s", pres[i], tokenizer_warning(l.t));
        size_t n, dl;
        int32_t *ids = encode(l.t, txt, strlen(txt), 0, 0, &n);
        char *d = decode(l.t, ids, n, &dl);
        assert_string_equal(d, txt);
        free(d);
        free(ids);
        unload(&l);
        unlink(s.path);
    }
}

/* The SPM word-by-word fast path gives exactly what merging the whole text at once gives. */
static void test_spm_word_split_equivalent(void **state)
{
    (void)state;
    static const char *const models[] = { "models/vocab/ggml-vocab-llama-spm.gguf", "models/stories260K.gguf", NULL };
    static const char *const words[] = { "the", "  ", "   ", "Hello", ",", "world", "\n", "\t", " ", "3", "333", "\xc3\xbc",
                                         "\xe5\xb7\xa5", "\xf0\x9f\xa6\x99", "don't", "(", ")", "...", "\xe2\x96\x81", "a" };
    for (int m = 0; models[m]; m++) {
        loaded l = must_load(models[m]);
        assert_true(l.t->spm_word_split);
        for (int it = 0; it < 50; it++) {
            char buf[2048];
            size_t len = 0;
            while (len < 1500) {
                const char *w = words[rnd() % (sizeof words / sizeof words[0])];
                memcpy(buf + len, w, strlen(w));
                len += strlen(w);
            }
            size_t n1, n2;
            int32_t *a = encode(l.t, buf, len, 0, 0, &n1);
            l.t->spm_word_split = 0;
            int32_t *b = encode(l.t, buf, len, 0, 0, &n2);
            l.t->spm_word_split = 1;
            assert_int_equal(n1, n2);
            assert_memory_equal(a, b, n1 * sizeof *a);
            free(a);
            free(b);
        }
        unload(&l);
    }
}

/* An SPM vocab without byte tokens: unknown characters become <unk>. */
static void test_synthetic_spm_unk(void **state)
{
    (void)state;
    const char *tokens[] = { "<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab" };
    float scores[] = { 0, 0, 0, -1, -2, -2, -1.5f, -0.5f };
    int32_t types[] = { 2, 3, 3, 1, 1, 1, 1, 1 };
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 8);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 8);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 8);
    synth s;
    synth_write(w, &s);
    loaded l;
    kv_error err = { 0 };
    assert_int_equal(load_path(s.path, &l, &err), KV_OK);
    size_t n;
    /* "▁a b a b" → ab merges (score -0.5) beat ▁a (-1.5): ▁ ab … */
    int32_t *ids = encode(l.t, "ab xa", 5, 1, 0, &n);
    const int32_t want[] = { 1, 3, 7, 3, 0, 4 };
    if (n != 6 || memcmp(ids, want, sizeof want) != 0) print_ids("got", ids, n);
    assert_int_equal(n, 6);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    char buf[8];
    assert_int_equal(tokenizer_token_to_piece(l.t, 0, 0, buf, sizeof buf), 0);
    unload(&l);
    unlink(s.path);
}

static void test_load_errors(void **state)
{
    (void)state;
    kv_error err = { 0 };
    loaded l;
    synth s;
    /* unsupported model */
    gguf_writer *w = gguf_writer_create();
    const char *tokens[] = { "<unk>", "<s>", "</s>" };
    gguf_writer_set_str(w, "tokenizer.ggml.model", "t5");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 3);
    synth_write(w, &s);
    assert_int_equal(load_path(s.path, &l, &err), KV_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, s.path));
    assert_non_null(strstr(err.msg, "'t5'"));
    unlink(s.path);
    /* scores of the wrong length */
    float scores[2] = { 0, 0 };
    w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 3);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 2);
    synth_write(w, &s);
    assert_int_equal(load_path(s.path, &l, &err), KV_ERR_FORMAT);
    assert_non_null(strstr(err.msg, s.path));
    assert_non_null(strstr(err.msg, "tokenizer.ggml.scores has 2 entries, expected 3"));
    unlink(s.path);
    /* missing scores for SPM */
    w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 3);
    synth_write(w, &s);
    assert_int_equal(load_path(s.path, &l, &err), KV_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.scores"));
    unlink(s.path);
    /* bad token type */
    float sc3[3] = { 0, 0, 0 };
    int32_t ty[3] = { 2, 3, 9 };
    w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 3);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, sc3, 3);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, ty, 3);
    synth_write(w, &s);
    assert_int_equal(load_path(s.path, &l, &err), KV_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "token_type[2]"));
    unlink(s.path);
    /* merges: a merge without a space; merges missing */
    const char *btok[] = { "a", "b", "ab" };
    const char *bad_merges[] = { "ab" };
    w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", btok, 3);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", bad_merges, 1);
    synth_write(w, &s);
    assert_int_equal(load_path(s.path, &l, &err), KV_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.merges[0]"));
    unlink(s.path);
    w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", btok, 3);
    synth_write(w, &s);
    assert_int_equal(load_path(s.path, &l, &err), KV_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.merges"));
    unlink(s.path);
    /* tokens of the wrong type */
    w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_u32(w, "tokenizer.ggml.tokens", 7);
    synth_write(w, &s);
    assert_int_equal(load_path(s.path, &l, &err), KV_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.tokens"));
    unlink(s.path);
    /* arguments */
    tokenizer *t = (tokenizer *)1;
    assert_int_equal(tokenizer_load(NULL, &t, &err), KV_ERR_INVALID);
    assert_null(t);
}

/* ---- streaming detokenization --------------------------------------------------------- */

static void test_detok_stream_spm(void **state)
{
    (void)state;
    loaded l = must_load("models/vocab/ggml-vocab-llama-spm.gguf");
    size_t n;
    int32_t *ids = encode(l.t, "\xf0\x9f\xa6\x99!", 5, 0, 0, &n);  /* 🦙 has no token: 4 byte tokens */
    const int32_t want[] = { 29871, 243, 162, 169, 156, 29991 };
    assert_int_equal(n, 6);
    assert_memory_equal(ids, want, sizeof want);
    detok_stream ds;
    detok_stream_init(&ds);
    char out[256];
    size_t w;
    assert_int_equal(detok_stream_push(&ds, l.t, 1, out, sizeof out), 0);          /* <s>: nothing */
    assert_int_equal(detok_stream_push(&ds, l.t, ids[0], out, sizeof out), 1);     /* ▁ → ' ' */
    assert_int_equal(out[0], ' ');
    assert_int_equal(detok_stream_push(&ds, l.t, ids[1], out, sizeof out), 0);
    assert_int_equal(detok_stream_push(&ds, l.t, ids[2], out, sizeof out), 0);
    assert_int_equal(detok_stream_push(&ds, l.t, ids[3], out, sizeof out), 0);
    w = detok_stream_push(&ds, l.t, ids[4], out, sizeof out);
    assert_int_equal(w, 4);
    assert_memory_equal(out, "\xf0\x9f\xa6\x99", 4);                              /* once, whole */
    assert_int_equal(detok_stream_push(&ds, l.t, ids[5], out, sizeof out), 1);
    assert_int_equal(detok_stream_flush(&ds, out, sizeof out), 0);
    free(ids);

    /* invalid: lead byte then ASCII → U+FFFD, then the ASCII */
    int32_t f0 = tokenizer_token_id(l.t, "<0xF0>", 6), x80 = tokenizer_token_id(l.t, "<0x80>", 6);
    int32_t e6 = tokenizer_token_id(l.t, "<0xE6>", 6), ff = tokenizer_token_id(l.t, "<0xFF>", 6);
    int32_t a = tokenizer_token_id(l.t, "a", 1);
    assert_true(f0 >= 0 && x80 >= 0 && e6 >= 0 && ff >= 0 && a >= 0);
    detok_stream_init(&ds);
    assert_int_equal(detok_stream_push(&ds, l.t, f0, out, sizeof out), 0);
    w = detok_stream_push(&ds, l.t, a, out, sizeof out);
    assert_int_equal(w, 4);
    assert_memory_equal(out, "\xef\xbf\xbd" "a", 4);
    /* stray continuation byte, and 0xFF */
    w = detok_stream_push(&ds, l.t, x80, out, sizeof out);
    assert_int_equal(w, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    w = detok_stream_push(&ds, l.t, ff, out, sizeof out);
    assert_int_equal(w, 3);
    /* E6 80 then end of stream: one U+FFFD for the unfinished character */
    assert_int_equal(detok_stream_push(&ds, l.t, e6, out, sizeof out), 0);
    assert_int_equal(detok_stream_push(&ds, l.t, x80, out, sizeof out), 0);
    w = detok_stream_flush(&ds, out, sizeof out);
    assert_int_equal(w, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    assert_int_equal(detok_stream_flush(&ds, out, sizeof out), 0);
    /* F0 then F0 9F A6 99: first lead is abandoned, the second character is whole */
    detok_stream_init(&ds);
    assert_int_equal(detok_stream_push(&ds, l.t, f0, out, sizeof out), 0);
    assert_int_equal(detok_stream_push(&ds, l.t, f0, out, sizeof out), 3);
    assert_int_equal(detok_stream_push(&ds, l.t, 162, out, sizeof out), 0);
    assert_int_equal(detok_stream_push(&ds, l.t, 169, out, sizeof out), 0);
    assert_int_equal(detok_stream_push(&ds, l.t, 156, out, sizeof out), 4);
    /* overlong / surrogate leads are invalid at once */
    int32_t c0 = tokenizer_token_id(l.t, "<0xC0>", 6), ed = tokenizer_token_id(l.t, "<0xED>", 6);
    int32_t a0 = tokenizer_token_id(l.t, "<0xA0>", 6);
    assert_int_equal(detok_stream_push(&ds, l.t, c0, out, sizeof out), 3);
    assert_int_equal(detok_stream_push(&ds, l.t, ed, out, sizeof out), 0);
    assert_int_equal(detok_stream_push(&ds, l.t, a0, out, sizeof out), 6);   /* ED A0 = surrogate: 2× U+FFFD */
    unload(&l);
}

static void test_detok_stream_bpe(void **state)
{
    (void)state;
    loaded l = must_load("models/vocab/ggml-vocab-gpt-2.gguf");
    const char *s = "I \xf0\x9f\xa6\x99 llamas \xe5\xb7\xa5\xe4\xbd\x9c and \xc3\xbc.";
    size_t n;
    int32_t *ids = encode(l.t, s, strlen(s), 0, 0, &n);
    detok_stream ds;
    detok_stream_init(&ds);
    char out[4096];
    size_t w = 0;
    int split_chars = 0;
    for (size_t i = 0; i < n; i++) {
        char piece[256];
        size_t k = tokenizer_token_to_piece(l.t, ids[i], 0, piece, sizeof piece);
        size_t got = detok_stream_push(&ds, l.t, ids[i], out + w, sizeof out - w);
        if (got != k) split_chars++;
        /* every chunk is valid UTF-8 on its own */
        for (size_t j = 0; j < got; j++) assert_true((unsigned char)out[w + j] != 0xFF);
        w += got;
    }
    w += detok_stream_flush(&ds, out + w, sizeof out - w);
    assert_int_equal(w, strlen(s));
    assert_memory_equal(out, s, w);
    assert_true(split_chars > 0);   /* the emoji / CJK really were split over tokens */
    free(ids);
    unload(&l);
}

/* ---- robustness ----------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)rng_state;
}

/* Bytes the vocab can carry on their own: SPM <0xNN> tokens, BPE byte-alphabet tokens whose
 * piece is that byte (Falcon lacks a few never-seen bytes such as 0xFF; DeepSeek stores some
 * as user-defined tokens that render as their UTF-8 text). */
static void representable_bytes(const tokenizer *t, int spm, unsigned char ok[256])
{
    for (int b = 0; b < 256; b++) {
        char name[8], piece[8];
        size_t k;
        if (spm) {
            snprintf(name, sizeof name, "<0x%02X>", b);
            k = 6;
        } else {
            unsigned cp = byte_cp((unsigned)b);
            put_utf8(name, cp);
            k = strlen(name);
        }
        int32_t id = tokenizer_token_id(t, name, k);
        ok[b] = id >= 0 && tokenizer_token_to_piece(t, id, 0, piece, sizeof piece) == 1 && (unsigned char)piece[0] == b;
    }
}

/* Random bytes (invalid UTF-8, NULs, lone surrogates …) never crash, and byte-level
 * encodings round-trip exactly (SPM by byte fallback, BPE by the byte alphabet). */
static void test_invalid_utf8_round_trip(void **state)
{
    (void)state;
    static const char *const vocabs[] = { "models/vocab/ggml-vocab-llama-spm.gguf", "models/vocab/ggml-vocab-gpt-2.gguf",
                                          "models/vocab/ggml-vocab-falcon.gguf", "models/vocab/ggml-vocab-deepseek-llm.gguf",
                                          "models/vocab/ggml-vocab-mpt.gguf", "models/vocab/ggml-vocab-starcoder.gguf",
                                          NULL };
    static const char *const fixed[] = { "\xff", "\xc3", "\xe2\x82", "a\x80" "b", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                         "\xc0\xaf", "x\xf0\x9f\xa6", "  \xfe \n\xff\t", NULL };
    for (int v = 0; vocabs[v]; v++) {
        loaded l = must_load(vocabs[v]);
        int spm = strstr(vocabs[v], "spm") != NULL, checked = 0, skipped = 0;
        unsigned char ok[256];
        representable_bytes(l.t, spm, ok);
        for (int it = 0; it < 300; it++) {
            char buf[64];
            size_t len;
            if (it < 9) {
                len = strlen(fixed[it]);
                memcpy(buf, fixed[it], len);
            } else {
                len = rnd() % sizeof buf;
                for (size_t i = 0; i < len; i++) {
                    uint32_t r = rnd();
                    buf[i] = (char)((r & 3) == 0 ? 32u : (r & 7) == 1 ? 97u + (r >> 8) % 26u : (r >> 8));
                }
            }
            int all_ok = 1;
            for (size_t i = 0; i < len; i++) all_ok &= ok[(unsigned char)buf[i]];
            size_t n, dl;
            for (int special = 0; special < 2; special++) {
                int32_t *ids = encode(l.t, buf, len, 0, special, &n);
                for (size_t i = 0; i < n; i++) assert_true(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(l.t));
                char *d = decode(l.t, ids, n, &dl);
                const char *dp = d;
                if (spm && len > 0 && dl > 0 && d[0] == ' ') {
                    dp++;
                    dl--;
                }
                if (!all_ok) {
                    skipped++;
                } else {
                    if (dl != len || memcmp(dp, buf, len) != 0) {
                        printf("  %s: round trip of %zu random bytes (case %d, parse_special %d) failed:", vocabs[v], len,
                               it, special);
                        for (size_t i = 0; i < len; i++) printf(" %02x", (unsigned char)buf[i]);
                        printf("\n");
                        print_ids("ids", ids, n);
                    }
                    assert_int_equal(dl, len);
                    assert_memory_equal(dp, buf, len);
                    checked++;
                }
                free(d);
                free(ids);
            }
        }
        printf("  %-40s %d random/invalid inputs round-trip exactly (%d skipped: bytes the vocab cannot carry)\n",
               vocabs[v] + 13, checked, skipped);
        unload(&l);
    }
}

/* ---- speed ---------------------------------------------------------------------------- */

static char *make_text(size_t target, size_t *len)
{
    static const char *const words[] = { "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
                                         "Once", "upon", "a", "time", "there", "was", "little", "girl",
                                         "named", "Lily", "tokenizer", "priority", "queue", "1234", "3.14",
                                         "\xc3\xbc" "ber", "\xe5\xb7\xa5\xe4\xbd\x9c", "\xf0\x9f\xa6\x99", "don't",
                                         "(x)", "--", "\n", "  ", "ĠHello" };
    size_t nw = sizeof words / sizeof words[0];
    char *s = malloc(target + 64);
    size_t n = 0;
    while (n < target) {
        const char *w = words[rnd() % nw];
        size_t k = strlen(w);
        memcpy(s + n, w, k);
        n += k;
        s[n++] = (rnd() % 11 == 0) ? ',' : ' ';
    }
    s[n] = 0;
    *len = n;
    return s;
}

static void time_encode(const char *rel, const char *text, size_t len, const char *label)
{
    loaded l = must_load(rel);
    double t0 = now_s();
    size_t n;
    int32_t *ids = encode(l.t, text, len, 1, 0, &n);
    double dt = now_s() - t0;
    printf("  %-32s %-11s %8zu bytes -> %7zu tokens in %7.1f ms (%.2f M tokens/s, ASan build)\n", rel + 13, label, len,
           n, dt * 1e3, n / dt / 1e6);
    /* round trip of the long text too */
    size_t dl;
    char *d = decode(l.t, ids + 1, n - 1, &dl);
    const char *dp = d;
    if (strstr(rel, "spm")) {
        dp++;
        dl--;
    }
    assert_int_equal(dl, len);
    assert_memory_equal(dp, text, len);
    free(d);
    free(ids);
    unload(&l);
}

static void test_speed(void **state)
{
    (void)state;
    size_t len;
    char *s = make_text(60000, &len);   /* ≈ 10,000 words */
    time_encode("models/vocab/ggml-vocab-llama-spm.gguf", s, len, "10k words");
    time_encode("models/vocab/ggml-vocab-gpt-2.gguf", s, len, "10k words");
    free(s);
    s = make_text(1 << 20, &len);        /* 1 MB */
    time_encode("models/vocab/ggml-vocab-llama-spm.gguf", s, len, "1 MB");
    time_encode("models/vocab/ggml-vocab-gpt-2.gguf", s, len, "1 MB");
    time_encode("models/vocab/ggml-vocab-deepseek-llm.gguf", s, len, "1 MB");
    time_encode("models/vocab/ggml-vocab-falcon.gguf", s, len, "1 MB");
    free(s);
    /* pathological: one 200 KB "word" with no spaces, and a 200 KB run of spaces */
    s = malloc(200001);
    for (int i = 0; i < 200000; i++) s[i] = (char)('a' + i % 7);
    time_encode("models/vocab/ggml-vocab-gpt-2.gguf", s, 200000, "1 word");
    time_encode("models/vocab/ggml-vocab-llama-spm.gguf", s, 200000, "1 word");
    memset(s, ' ', 200000);
    time_encode("models/vocab/ggml-vocab-mpt.gguf", s, 200000, "spaces");
    time_encode("models/vocab/ggml-vocab-llama-spm.gguf", s, 200000, "spaces");
    free(s);
    /* loading a 100k vocab */
    double t0 = now_s();
    loaded l = must_load("models/vocab/ggml-vocab-deepseek-llm.gguf");
    printf("  load deepseek-llm (%d tokens, 99757 merges): %.1f ms\n", tokenizer_n_vocab(l.t), (now_s() - t0) * 1e3);
    unload(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_llama_spm),
        cmocka_unit_test(test_vocab_phi3),
        cmocka_unit_test(test_vocab_gpt2),
        cmocka_unit_test(test_vocab_falcon),
        cmocka_unit_test(test_vocab_mpt),
        cmocka_unit_test(test_vocab_starcoder),
        cmocka_unit_test(test_vocab_refact),
        cmocka_unit_test(test_vocab_deepseek_llm),
        cmocka_unit_test(test_vocab_deepseek_coder),
        cmocka_unit_test(test_vocab_dbrx),
        cmocka_unit_test(test_vocab_bert_unsupported),
        cmocka_unit_test(test_golden_prompts),
        cmocka_unit_test(test_stories_once_upon),
        cmocka_unit_test(test_special_spm),
        cmocka_unit_test(test_special_phi3),
        cmocka_unit_test(test_special_bpe),
        cmocka_unit_test(test_synthetic_chatml),
        cmocka_unit_test(test_unknown_pre_is_error),
        cmocka_unit_test(test_special_id_out_of_vocab),
        cmocka_unit_test(test_nan_score_and_duplicate_token),
        cmocka_unit_test(test_synthetic_spm_unk),
        cmocka_unit_test(test_all_pre_tokenizers),
        cmocka_unit_test(test_spm_word_split_equivalent),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_detok_stream_spm),
        cmocka_unit_test(test_detok_stream_bpe),
        cmocka_unit_test(test_invalid_utf8_round_trip),
        cmocka_unit_test(test_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
