/* test_gguf: the GGUF reader (engine/gguf.c) on the real stories260K file, truncated and byte-flipped copies, and writer-made files. */
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/gguf.h"
#include "engine/gguf_writer.h"
#include "engine/kernels/quant.h"
#include "tests/support/testcheck.h"
#include "tests/support/testutil.h"

#define STORIES "models/stories260K.gguf"

/* ---- helpers ----------------------------------------------------------------------------- */

static int group_setup(void **state) { return tu_tmpdir_make("test-gguf"); }

/* gguf_open(path) must fail with `code` (any when < 0) and a message holding the strings. */
static void expect_open_error(const char *path, int code, ...)
{
    gguf_file *f = (gguf_file *)1;
    kv_error err = {0};
    int rc = gguf_open(path, &f, &err);
    if (rc == KV_OK) {
        gguf_close(f);
        fail_msg("%s opened, expected an error", path);
    }
    assert_null(f);
    assert_int_equal(err.code, rc);
    if (code >= 0 && rc != code) fail_msg("code %d, expected %d: %s", rc, code, err.msg);
    va_list ap;
    va_start(ap, code);
    tu_check_msg_v(path, err.msg, ap);
    va_end(ap);
}

static gguf_file *open_ok(const char *path)
{
    gguf_file *f = NULL;
    kv_error err = {0};
    if (gguf_open(path, &f, &err) != KV_OK) fail_msg("gguf_open(%s): %s", path, err.msg);
    return f;
}

static void write_ok(gguf_writer *w, const char *path)
{
    kv_error err = {0};
    if (gguf_writer_write(w, path, &err) != KV_OK) fail_msg("gguf_writer_write: %s", err.msg);
}

/* A small valid file's content: a few keys, an F32 vector 'a' [64] and a Q4_0 matrix 'b' [64, 2]. */
static gguf_writer *base_writer(void)
{
    gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "test.n", 7);
    int64_t ne_a[1] = {64}, ne_b[2] = {64, 2};
    gguf_writer_add_tensor(w, "a", GGML_TYPE_F32, 1, ne_a, NULL);
    gguf_writer_add_tensor(w, "b", GGML_TYPE_Q4_0, 2, ne_b, NULL);
    return w;
}

/* Write w (then free it) and expect gguf_open to fail with the given strings in the message. */
#define EXPECT_WRITTEN_ERROR(w, name, code, ...)                                                    \
    do {                                                                                           \
        const char *p_ = tu_tmp_path(name);                                                        \
        write_ok((w), p_);                                                                         \
        gguf_writer_free(w);                                                                       \
        expect_open_error(p_, (code), __VA_ARGS__, (const char *)NULL);                            \
        unlink(p_);                                                                                \
    } while (0)

static int copy_file(const char *src, const char *dst, uint8_t **content, size_t *len)
{
    size_t n;
    char *buf = tu_read_file(src, &n);
    if (!buf) return -1;
    FILE *fp = fopen(dst, "wb");
    if (!fp || fwrite(buf, 1, n, fp) != n) {
        if (fp) fclose(fp);
        free(buf);
        return -1;
    }
    fclose(fp);
    *content = (uint8_t *)buf;
    *len = n;
    return 0;
}

static int value_size(int type)
{
    switch (type) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

static int inside(const gguf_file *f, const void *p, uint64_t n)
{
    const uint8_t *b = p;
    return b >= f->map && b <= f->map + f->size && n <= (uint64_t)(f->map + f->size - b);
}

/* Everything an opened file exposes must lie inside the mapping and be self-consistent; the
 * typed getters must work on every key. Used on corrupted files that still open. */
static void check_opened_file(const gguf_file *f)
{
    assert_true(f->version == 2 || f->version == 3);
    assert_true(f->alignment > 0 && (f->alignment & (f->alignment - 1)) == 0);
    assert_true(f->n_tensors == 0 || f->data_offset <= f->size);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        assert_true(t->n_dims >= 1 && t->n_dims <= 4);
        int64_t n = 1;
        for (int d = 0; d < 4; d++) {
            assert_true(t->ne[d] >= 1);
            n *= t->ne[d];
        }
        assert_true(n == t->n_elements);
        assert_true(t->nbytes == quant_row_size(t->type, t->ne[0]) * (uint64_t)(n / t->ne[0]));
        assert_true(t->offset % f->alignment == 0);
        assert_ptr_equal(t->data, f->map + f->data_offset + t->offset);
        if (!inside(f, t->data, t->nbytes)) fail_msg("tensor '%s' lies outside the file", t->name);
        if (t->nbytes) {
            volatile uint8_t sink = ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)sink;
        }
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        assert_true(inside(f, kv->key.ptr, kv->key.len));
        assert_true(kv->type >= 0 && kv->type < GGUF_VT_COUNT);
        if (kv->type == GGUF_VT_STRING) {
            uint64_t len;
            assert_true(inside(f, kv->data, 8));
            memcpy(&len, kv->data, 8);
            assert_true(inside(f, kv->data + 8, len));
        } else if (kv->type == GGUF_VT_ARRAY) {
            if (kv->arr_type == GGUF_VT_STRING) {
                assert_non_null(kv->arr_strs);
                for (uint64_t j = 0; j < kv->arr_len; j++) assert_true(inside(f, kv->arr_strs[j].ptr, kv->arr_strs[j].len));
            } else {
                assert_true(value_size(kv->arr_type) > 0);
                assert_true(inside(f, kv->data, kv->arr_len * (uint64_t)value_size(kv->arr_type)));
            }
        } else {
            assert_true(inside(f, kv->data, (uint64_t)value_size(kv->type)));
        }
        /* Typed getters by name (keys with a NUL byte cannot be named). */
        if (memchr(kv->key.ptr, 0, kv->key.len)) continue;
        char *key = strndup(kv->key.ptr, kv->key.len);
        assert_non_null(key);
        kv_error err = {0};
        int64_t iv;
        uint32_t uv;
        float fv;
        int bv;
        char *sv = NULL;
        const gguf_kv *arr;
        (void)gguf_get_i64(f, key, 1, &iv, &err);
        (void)gguf_get_u32(f, key, 1, &uv, &err);
        (void)gguf_get_f32(f, key, 1, &fv, &err);
        (void)gguf_get_bool(f, key, 1, &bv, &err);
        if (gguf_get_str(f, key, 1, &sv, &err) == KV_OK) free(sv);
        if (kv->type == GGUF_VT_ARRAY) assert_int_equal(gguf_get_arr(f, key, kv->arr_type, -1, &arr, &err), KV_OK);
        free(key);
    }
}

/* ---- the real file --------------------------------------------------------------------- */

static void test_stories260k(void **state)
{
    const char *path = tu_path(STORIES);
    gguf_file *f = open_ok(path);
    kv_error err = {0};
    assert_int_equal(f->version, 3);
    assert_int_equal(f->n_tensors, 48);
    assert_int_equal(f->n_kv, 19);
    assert_int_equal(f->alignment, 32);
    assert_int_equal(f->data_offset, 14176);
    assert_int_equal(f->size, 1185376);

    static const struct { const char *key; uint32_t v; } u32s[] = {
        {"llama.embedding_length", 64}, {"llama.block_count", 5}, {"llama.attention.head_count", 8},
        {"llama.attention.head_count_kv", 4}, {"llama.context_length", 2048}, {"llama.feed_forward_length", 172},
        {"llama.rope.dimension_count", 8}, {"tokenizer.ggml.bos_token_id", 1}, {"tokenizer.ggml.eos_token_id", 2},
        {"tokenizer.ggml.padding_token_id", 0xFFFFFFFFu},
    };
    for (size_t i = 0; i < sizeof u32s / sizeof *u32s; i++) {
        uint32_t v = 0;
        if (gguf_get_u32(f, u32s[i].key, 1, &v, &err) != KV_OK) fail_msg("%s", err.msg);
        if (v != u32s[i].v) fail_msg("%s = %" PRIu32 ", expected %" PRIu32, u32s[i].key, v, u32s[i].v);
    }
    float eps = 0;
    assert_int_equal(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", 1, &eps, &err), KV_OK);
    assert_float_equal(eps, 1e-5f, 1e-9f);
    char *arch = NULL;
    assert_int_equal(gguf_get_str(f, "general.architecture", 1, &arch, &err), KV_OK);
    assert_string_equal(arch, "llama");
    free(arch);

    const gguf_kv *tok = NULL, *scores = NULL, *types = NULL;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, 512, &tok, &err), KV_OK);
    assert_int_equal(tok->arr_len, 512);
    assert_non_null(tok->arr_strs);
    assert_true(tok->arr_strs[0].len == 5 && memcmp(tok->arr_strs[0].ptr, "<unk>", 5) == 0);
    assert_true(tok->arr_strs[1].len == 3 && memcmp(tok->arr_strs[1].ptr, "<s>", 3) == 0);
    assert_true(tok->arr_strs[2].len == 4 && memcmp(tok->arr_strs[2].ptr, "</s>", 4) == 0);
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, 512, &scores, &err), KV_OK);
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_INT32, 512, &types, &err), KV_OK);
    int32_t tt0;
    memcpy(&tt0, types->data, 4);
    assert_int_equal(tt0, 2); /* <unk> is UNKNOWN */
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, 513, &tok, &err), KV_ERR_FORMAT);
    tu_check_msg(path, err.msg, "tokenizer.ggml.tokens", "512", "513", NULL);

    const gguf_tensor *t0 = &f->tensors[0];
    assert_string_equal(t0->name, "token_embd.weight");
    assert_int_equal(t0->n_dims, 2);
    assert_int_equal(t0->ne[0], 64);
    assert_int_equal(t0->ne[1], 512);
    assert_int_equal(t0->ne[2], 1);
    assert_int_equal(t0->ne[3], 1);
    assert_int_equal(t0->type, GGML_TYPE_F32);
    assert_int_equal(t0->offset, 0);
    assert_int_equal(t0->nbytes, 64 * 512 * 4);
    assert_int_equal(t0->n_elements, 64 * 512);
    assert_ptr_equal(t0->data, f->map + 14176);
    assert_ptr_equal(gguf_find_tensor(f, "token_embd.weight"), t0);
    const gguf_tensor *on = gguf_find_tensor(f, "output_norm.weight");
    assert_non_null(on);
    assert_int_equal(on->n_dims, 1);
    assert_int_equal(on->ne[0], 64);
    assert_int_equal(on->offset, 131072);
    assert_null(gguf_find_tensor(f, "no.such.tensor"));
    assert_null(gguf_find_kv(f, "no.such.key"));

    uint64_t total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        assert_int_equal(t->type, GGML_TYPE_F32);
        assert_int_equal(t->nbytes, (uint64_t)t->n_elements * 4);
        assert_true((const uint8_t *)t->data >= f->map + f->data_offset);
        assert_true((const uint8_t *)t->data + t->nbytes <= f->map + f->size);
        total += (uint64_t)t->n_elements;
    }
    assert_int_equal(total, 292800); /* SOURCES.md: 292800 params */
    check_opened_file(f);

    /* The llama2.c checkpoint of the same model holds the same embedding table after its
     * 7 x int32 header (SOURCES.md). */
    size_t bin_len = 0;
    char *bin = tu_read_file(tu_path("models/stories260K.bin"), &bin_len);
    if (bin) {
        assert_true(bin_len >= 28 + t0->nbytes);
        assert_memory_equal(bin + 28, t0->data, t0->nbytes);
        free(bin);
    }
    gguf_close(f);
}

static void test_legacy_v1(void **state)
{
    const char *path = tu_path("models/legacy/tinyllamas-stories-260k-f32.ggufv1.gguf");
    expect_open_error(path, KV_ERR_UNSUPPORTED, "GGUF version 1 is not supported", (const char *)NULL);
}

static void test_missing_and_not_regular(void **state)
{
    const char *path = tu_tmp_path("does-not-exist.gguf");
    expect_open_error(path, KV_ERR_IO, "cannot open", (const char *)NULL);
    expect_open_error(tu_tmpdir(), KV_ERR_IO, "not a regular file", (const char *)NULL);
    const char *empty = tu_tmp_path("empty.gguf");
    FILE *fp = fopen(empty, "wb");
    assert_non_null(fp);
    fwrite("GGUF", 1, 4, fp);
    fclose(fp);
    expect_open_error(empty, KV_ERR_FORMAT, "too short", (const char *)NULL);
    unlink(empty);
}

/* ---- truncation ------------------------------------------------------------------------- */

static void truncated_must_fail(const char *path, uint64_t len)
{
    gguf_file *f = NULL;
    kv_error err = {0};
    int rc = gguf_open(path, &f, &err);
    if (rc == KV_OK) {
        gguf_close(f);
        fail_msg("%s truncated to %" PRIu64 " bytes opened", path, len);
    }
    assert_null(f);
    tu_check_msg(path, err.msg, NULL);
}

static void test_truncation(void **state)
{
    const char *path = tu_tmp_path("trunc.gguf");
    uint8_t *orig;
    size_t size;
    assert_int_equal(copy_file(tu_path(STORIES), path, &orig, &size), 0);
    gguf_file *f = open_ok(path);
    uint64_t data_offset = f->data_offset;
    gguf_close(f);

    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    int n_data = 0, n_head = 0;
    /* Descending lengths, so the copy only ever shrinks: first a spread into the data section
     * (every tensor boundary ± 1 and 400 evenly spaced points), then every length of the
     * header + metadata + tensor table (+ padding). */
    uint64_t lens[1000];
    int n_lens = 0;
    lens[n_lens++] = size - 1;
    lens[n_lens++] = data_offset + 1;
    for (int i = 1; i < 400; i++) lens[n_lens++] = data_offset + (size - data_offset) * (uint64_t)i / 400;
    {
        gguf_file *g = open_ok(tu_path(STORIES));
        for (uint64_t i = 0; i < g->n_tensors && n_lens + 3 < 1000; i++) {
            uint64_t end = g->data_offset + g->tensors[i].offset + g->tensors[i].nbytes;
            if (end - 1 < size) lens[n_lens++] = end - 1;
            if (end < size) lens[n_lens++] = end;
            if (end + 1 < size) lens[n_lens++] = end + 1;
        }
        gguf_close(g);
    }
    /* sort descending, unique */
    for (int i = 0; i < n_lens; i++)
        for (int j = i + 1; j < n_lens; j++)
            if (lens[j] > lens[i]) { uint64_t x = lens[i]; lens[i] = lens[j]; lens[j] = x; }
    uint64_t prev = UINT64_MAX;
    for (int i = 0; i < n_lens; i++) {
        if (lens[i] == prev || lens[i] <= data_offset) continue;
        prev = lens[i];
        assert_int_equal(ftruncate(fd, (off_t)lens[i]), 0);
        truncated_must_fail(path, lens[i]);
        n_data++;
    }
    for (uint64_t len = data_offset + 1; len-- > 0;) {
        assert_int_equal(ftruncate(fd, (off_t)len), 0);
        truncated_must_fail(path, len);
        n_head++;
    }
    close(fd);
    unlink(path);
    free(orig);
    print_message("truncation: %d offsets in the data section + %d in the header/metadata/tensor table "
                  "(every length 0..%" PRIu64 ") = %d truncated copies, all rejected\n",
                  n_data, n_head, data_offset, n_data + n_head);
}

/* ---- byte flips ------------------------------------------------------------------------- */

typedef struct flip_stats {
    const char *path; /* the file being damaged */
    long tried, opened, rejected;
} flip_stats;

/* Open the damaged file st->path (damaged at off, or at several places): it opens with every
 * tensor inside it, or fails with a message naming it. */
static void open_flipped(void *ud, uint64_t off)
{
    (void)off;
    flip_stats *st = ud;
    const char *path = st->path;
    gguf_file *f = NULL;
    kv_error err = {0};
    int rc = gguf_open(path, &f, &err);
    st->tried++;
    if (rc == KV_OK) {
        st->opened++;
        check_opened_file(f);
        gguf_close(f);
    } else {
        st->rejected++;
        assert_null(f);
        tu_check_msg(path, err.msg, NULL);
        assert_true(strlen(err.msg) > strlen(path) + 2);
    }
}

/* Flip every byte of [0, end) of `src` (copied to a temp file) with three patterns. */
static flip_stats flip_region(const char *src, const char *tmpname, uint64_t end_or_0)
{
    const char *path = tu_tmp_path(tmpname);
    uint8_t *orig;
    size_t size;
    assert_int_equal(copy_file(src, path, &orig, &size), 0);
    uint64_t end = end_or_0 ? end_or_0 : size;
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    flip_stats st = {.path = path};
    tu_flip_each_byte(fd, orig, end, open_flipped, &st);
    /* Random multi-byte damage (fixed seed): 1-8 bytes at random places of the region. */
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int it = 0; it < 3000; it++) {
        int k = 1 + (int)((rng >> 60) & 7);
        uint64_t offs[8];
        for (int j = 0; j < k; j++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            offs[j] = (rng >> 16) % end;
            uint8_t v = (uint8_t)(rng >> 56);
            assert_int_equal(pwrite(fd, &v, 1, (off_t)offs[j]), 1);
        }
        open_flipped(&st, 0);
        for (int j = 0; j < k; j++) assert_int_equal(pwrite(fd, &orig[offs[j]], 1, (off_t)offs[j]), 1);
    }
    close(fd);
    unlink(path);
    free(orig);
    return st;
}

static void test_byte_flips_stories(void **state)
{
    gguf_file *f = open_ok(tu_path(STORIES));
    uint64_t end = f->data_offset;
    gguf_close(f);
    flip_stats st = flip_region(tu_path(STORIES), "flip.gguf", end);
    print_message("byte flips (stories260K.gguf): bytes 0..%" PRIu64 " (header, metadata, tensor table, padding) x "
                  "{xor 0xff, = 0xff, = 0x00} (distinct values only) + 3000 random multi-byte hits = %ld corrupted opens: "
                  "%ld rejected with a message, %ld opened with every tensor inside the file\n",
                  end, st.tried, st.rejected, st.opened);
    assert_true(st.tried >= (long)end + 3000);
}

/* ---- writer-made files: one rule each ------------------------------------------------- */

static void test_bad_magic(void **state)
{
    gguf_writer *w = base_writer();
    gguf_writer_set_magic(w, "GGML");
    EXPECT_WRITTEN_ERROR(w, "magic.gguf", KV_ERR_FORMAT, "not a GGUF file", "47 47 4d 4c");
}

static void test_versions(void **state)
{
    gguf_writer *w = base_writer();
    gguf_writer_set_version(w, 4);
    EXPECT_WRITTEN_ERROR(w, "v4.gguf", KV_ERR_UNSUPPORTED, "GGUF version 4 is not supported");
    w = base_writer();
    gguf_writer_set_version(w, 1);
    EXPECT_WRITTEN_ERROR(w, "v1.gguf", KV_ERR_UNSUPPORTED, "GGUF version 1 is not supported");
    w = base_writer();
    gguf_writer_set_version(w, 0);
    EXPECT_WRITTEN_ERROR(w, "v0.gguf", KV_ERR_UNSUPPORTED, "GGUF version 0 is not supported");
    w = base_writer();
    gguf_writer_set_version(w, 0x03000000u); /* a big-endian v3 file read little-endian */
    EXPECT_WRITTEN_ERROR(w, "vbe.gguf", KV_ERR_UNSUPPORTED, "is not supported");
}

static void test_string_past_end(void **state)
{
    gguf_writer *w = base_writer();
    uint64_t len = 1ull << 40;
    gguf_writer_add_raw_kv(w, "test.str", GGUF_VT_STRING, &len, 8);
    EXPECT_WRITTEN_ERROR(w, "str.gguf", KV_ERR_FORMAT, "metadata 'test.str'", "string length 1099511627776",
                         "runs past the end of the file");
    /* the maximum length: no overflow in the bounds check */
    w = base_writer();
    len = UINT64_MAX;
    gguf_writer_add_raw_kv(w, "test.str", GGUF_VT_STRING, &len, 8);
    EXPECT_WRITTEN_ERROR(w, "str2.gguf", KV_ERR_FORMAT, "test.str", "runs past the end of the file");
    /* a key whose own length runs past the end: a bare header claiming one key */
    const char *p = tu_tmp_path("keylen.gguf");
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    uint32_t hv[2] = {0x46554747u /* "GGUF" */, 3};
    uint64_t hc[3] = {0, 1, 1000000};
    fwrite(hv, 4, 2, fp);
    fwrite(hc, 8, 3, fp);
    fclose(fp);
    expect_open_error(p, KV_ERR_FORMAT, "metadata key #0", "string length 1000000", "runs past the end",
                      (const char *)NULL);
    unlink(p);
    /* a string array whose count fits but one string's length does not */
    w = base_writer();
    uint8_t payload[4 + 8 + 8 + 2 + 8];
    uint32_t et = GGUF_VT_STRING;
    uint64_t n = 2, l0 = 2, l1 = 1ull << 50;
    memcpy(payload, &et, 4);
    memcpy(payload + 4, &n, 8);
    memcpy(payload + 12, &l0, 8);
    memcpy(payload + 20, "hi", 2);
    memcpy(payload + 22, &l1, 8);
    gguf_writer_add_raw_kv(w, "test.strs", GGUF_VT_ARRAY, payload, sizeof payload);
    EXPECT_WRITTEN_ERROR(w, "strs.gguf", KV_ERR_FORMAT, "test.strs", "string length 1125899906842624",
                         "runs past the end");
}

static void test_array_past_end(void **state)
{
    uint8_t payload[12];
    uint32_t et = GGUF_VT_UINT32;
    uint64_t n = 1ull << 40;
    memcpy(payload, &et, 4);
    memcpy(payload + 4, &n, 8);
    gguf_writer *w = base_writer();
    gguf_writer_add_raw_kv(w, "test.arr", GGUF_VT_ARRAY, payload, sizeof payload);
    EXPECT_WRITTEN_ERROR(w, "arr.gguf", KV_ERR_FORMAT, "metadata 'test.arr'", "array of 1099511627776 uint32",
                         "runs past the end of the file");
    /* n * 8 wraps around 2^64: must still be caught */
    et = GGUF_VT_UINT64;
    n = (1ull << 61) + 1;
    memcpy(payload, &et, 4);
    memcpy(payload + 4, &n, 8);
    w = base_writer();
    gguf_writer_add_raw_kv(w, "test.arr", GGUF_VT_ARRAY, payload, sizeof payload);
    EXPECT_WRITTEN_ERROR(w, "arr2.gguf", KV_ERR_FORMAT, "test.arr", "uint64 runs past the end");
    et = GGUF_VT_STRING;
    n = UINT64_MAX;
    memcpy(payload, &et, 4);
    memcpy(payload + 4, &n, 8);
    w = base_writer();
    gguf_writer_add_raw_kv(w, "test.arr", GGUF_VT_ARRAY, payload, sizeof payload);
    EXPECT_WRITTEN_ERROR(w, "arr3.gguf", KV_ERR_FORMAT, "test.arr", "strings runs past the end");
}

static void test_unknown_value_type(void **state)
{
    uint32_t v = 1;
    gguf_writer *w = base_writer();
    gguf_writer_add_raw_kv(w, "test.weird", 13, &v, 4);
    EXPECT_WRITTEN_ERROR(w, "vt.gguf", KV_ERR_FORMAT, "metadata 'test.weird'", "unknown value type 13");
    w = base_writer();
    gguf_writer_add_raw_kv(w, "test.weird", 0xFFFFFFFFu, &v, 4);
    EXPECT_WRITTEN_ERROR(w, "vt2.gguf", KV_ERR_FORMAT, "test.weird", "unknown value type 4294967295");
    uint8_t payload[12];
    uint32_t et = 99;
    uint64_t n = 1;
    memcpy(payload, &et, 4);
    memcpy(payload + 4, &n, 8);
    w = base_writer();
    gguf_writer_add_raw_kv(w, "test.weird", GGUF_VT_ARRAY, payload, sizeof payload);
    EXPECT_WRITTEN_ERROR(w, "vt3.gguf", KV_ERR_FORMAT, "test.weird", "array of unknown type 99");
}

static void test_nested_array(void **state)
{
    uint8_t payload[12 + 12 + 4];
    uint32_t et = GGUF_VT_ARRAY, inner = GGUF_VT_UINT32, x = 5;
    uint64_t n = 1, ni = 1;
    memcpy(payload, &et, 4);
    memcpy(payload + 4, &n, 8);
    memcpy(payload + 12, &inner, 4);
    memcpy(payload + 16, &ni, 8);
    memcpy(payload + 24, &x, 4);
    gguf_writer *w = base_writer();
    gguf_writer_add_raw_kv(w, "test.nested", GGUF_VT_ARRAY, payload, sizeof payload);
    EXPECT_WRITTEN_ERROR(w, "nested.gguf", KV_ERR_FORMAT, "metadata 'test.nested'", "nested array");
}

static void test_duplicate_key(void **state)
{
    gguf_writer *w = base_writer();
    gguf_writer_set_checks(w, 0);
    gguf_writer_set_u32(w, "test.n", 8);
    EXPECT_WRITTEN_ERROR(w, "dupkey.gguf", KV_ERR_FORMAT, "metadata key 'test.n' appears twice");
    /* same bytes, another type */
    w = base_writer();
    gguf_writer_set_checks(w, 0);
    gguf_writer_set_i32(w, "test.n", 7);
    EXPECT_WRITTEN_ERROR(w, "dupkey2.gguf", KV_ERR_FORMAT, "metadata key 'test.n' appears twice");
    /* a string array repeated with one string changed */
    static const char *a1[] = {"x", "yy"}, *a2[] = {"x", "yz"};
    w = base_writer();
    gguf_writer_set_checks(w, 0);
    gguf_writer_set_arr_str(w, "test.s", a1, 2);
    gguf_writer_set_arr_str(w, "test.s", a2, 2);
    EXPECT_WRITTEN_ERROR(w, "dupkey3.gguf", KV_ERR_FORMAT, "metadata key 'test.s' appears twice");

    /* a byte-identical repeat (old converters wrote some) is kept once */
    w = base_writer();
    gguf_writer_set_checks(w, 0);
    gguf_writer_set_u32(w, "test.n", 7);
    gguf_writer_set_arr_str(w, "test.s", a1, 2);
    gguf_writer_set_arr_str(w, "test.s", a1, 2);
    const char *p = tu_tmp_path("dupsame.gguf");
    write_ok(w, p);
    gguf_writer_free(w);
    gguf_file *f = open_ok(p);
    assert_int_equal(f->n_kv, 3);
    uint32_t v = 0;
    kv_error err = {0};
    assert_int_equal(gguf_get_u32(f, "test.n", 1, &v, &err), KV_OK);
    assert_int_equal(v, 7);
    const gguf_kv *kv = NULL;
    assert_int_equal(gguf_get_arr(f, "test.s", GGUF_VT_STRING, 2, &kv, &err), KV_OK);
    assert_true(kv->arr_strs[1].len == 2 && memcmp(kv->arr_strs[1].ptr, "yy", 2) == 0);
    check_opened_file(f);
    gguf_close(f);
    unlink(p);
}

static void test_bad_dims(void **state)
{
    uint64_t zero[2] = {64, 0};
    gguf_writer *w = base_writer();
    gguf_writer_override_dims(w, "b", 2, zero);
    EXPECT_WRITTEN_ERROR(w, "dim0.gguf", KV_ERR_FORMAT, "tensor 'b'", "invalid dimension 1 = 0");

    uint64_t big[2] = {1ull << 32, 1ull << 32};
    w = base_writer();
    gguf_writer_override_dims(w, "a", 2, big);
    EXPECT_WRITTEN_ERROR(w, "dimovf.gguf", KV_ERR_FORMAT, "tensor 'a'", "invalid dimension 1 = 4294967296",
                         "overflows");
    uint64_t huge[1] = {1ull << 63};
    w = base_writer();
    gguf_writer_override_dims(w, "a", 1, huge);
    EXPECT_WRITTEN_ERROR(w, "dimhuge.gguf", KV_ERR_FORMAT, "tensor 'a'", "invalid dimension 0 = 9223372036854775808");
    /* product exactly INT64_MAX is representable: passes the dimension check, then the size
     * check ("ends past the end") rejects it */
    uint64_t edge[2] = {32, INT64_MAX / 32};
    w = base_writer();
    gguf_writer_override_dims(w, "b", 2, edge);
    EXPECT_WRITTEN_ERROR(w, "dimedge.gguf", KV_ERR_FORMAT, "tensor 'b'", "ends past the end of the file");

    uint64_t five[5] = {64, 1, 1, 1, 1};
    w = base_writer();
    gguf_writer_override_dims(w, "a", 5, five);
    EXPECT_WRITTEN_ERROR(w, "dims5.gguf", KV_ERR_FORMAT, "tensor 'a' has 5 dimensions (1 to 4 allowed)");
    w = base_writer();
    gguf_writer_override_dims(w, "a", 0, NULL);
    EXPECT_WRITTEN_ERROR(w, "dims0.gguf", KV_ERR_FORMAT, "tensor 'a' has 0 dimensions");
}

static void test_bad_tensor_type(void **state)
{
    static const uint32_t bad[] = {4, 5, 40, 1000, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[64];
        snprintf(want, sizeof want, "unknown type id %" PRIu32, bad[i]);
        gguf_writer *w = base_writer();
        gguf_writer_override_type(w, "a", bad[i]);
        EXPECT_WRITTEN_ERROR(w, "type.gguf", KV_ERR_FORMAT, "tensor 'a'", want);
    }
}

static void test_row_not_multiple_of_block(void **state)
{
    uint64_t ne[2] = {48, 2};
    gguf_writer *w = base_writer();
    gguf_writer_override_dims(w, "b", 2, ne);
    EXPECT_WRITTEN_ERROR(w, "q4row.gguf", KV_ERR_FORMAT, "tensor 'b' has rows of 48 elements",
                         "not a multiple of Q4_0's block size 32");
    /* K-quants: 256 */
    w = base_writer();
    gguf_writer_override_type(w, "a", GGML_TYPE_Q4_K);
    EXPECT_WRITTEN_ERROR(w, "q4krow.gguf", KV_ERR_FORMAT, "tensor 'a' has rows of 64 elements",
                         "Q4_K's block size 256");
}

static void test_offsets(void **state)
{
    gguf_writer *w = base_writer();
    gguf_writer_override_offset(w, "b", 4096);
    EXPECT_WRITTEN_ERROR(w, "past.gguf", KV_ERR_FORMAT, "tensor 'b' ends past the end of the file", "+ 72 >");
    w = base_writer();
    gguf_writer_override_offset(w, "a", UINT64_MAX - 31); /* aligned, and offset + size wraps */
    EXPECT_WRITTEN_ERROR(w, "wrap.gguf", KV_ERR_FORMAT, "tensor 'a' ends past the end of the file");
    w = base_writer();
    gguf_writer_override_offset(w, "b", 4);
    EXPECT_WRITTEN_ERROR(w, "misal.gguf", KV_ERR_FORMAT, "tensor 'b' offset 4 is not a multiple of the alignment 32");
    /* the last tensor ends exactly at the end of the file: fine */
    w = base_writer();
    const char *p = tu_tmp_path("exact.gguf");
    write_ok(w, p);
    gguf_writer_free(w);
    gguf_file *f = open_ok(p);
    const gguf_tensor *b = gguf_find_tensor(f, "b");
    uint64_t end = f->data_offset + b->offset + b->nbytes;
    gguf_close(f);
    assert_int_equal(truncate(p, (off_t)end), 0);
    f = open_ok(p);
    gguf_close(f);
    assert_int_equal(truncate(p, (off_t)end - 1), 0);
    expect_open_error(p, KV_ERR_FORMAT, "tensor 'b' ends past the end of the file", (const char *)NULL);
    unlink(p);
}

static void test_alignment_key(void **state)
{
    gguf_writer *w = base_writer();
    gguf_writer_set_checks(w, 0);
    gguf_writer_set_u32(w, "general.alignment", 48);
    EXPECT_WRITTEN_ERROR(w, "al48.gguf", KV_ERR_FORMAT, "general.alignment = 48 is not a power of two");
    w = base_writer();
    gguf_writer_set_checks(w, 0);
    gguf_writer_set_u32(w, "general.alignment", 0);
    EXPECT_WRITTEN_ERROR(w, "al0.gguf", KV_ERR_FORMAT, "general.alignment = 0 is not a power of two");
    w = base_writer();
    gguf_writer_set_checks(w, 0);
    gguf_writer_set_u64(w, "general.alignment", 32);
    EXPECT_WRITTEN_ERROR(w, "alty.gguf", KV_ERR_FORMAT, "'general.alignment' has type uint64, expected uint32");
    w = base_writer();
    gguf_writer_set_checks(w, 0);
    gguf_writer_set_str(w, "general.alignment", "32");
    EXPECT_WRITTEN_ERROR(w, "alstr.gguf", KV_ERR_FORMAT, "has type string, expected uint32");

    /* A valid non-default alignment is honoured by both sides. */
    w = base_writer();
    gguf_writer_set_u32(w, "general.alignment", 256);
    const char *p = tu_tmp_path("al256.gguf");
    write_ok(w, p);
    gguf_writer_free(w);
    gguf_file *f = open_ok(p);
    assert_int_equal(f->alignment, 256);
    assert_int_equal(f->data_offset % 256, 0);
    for (uint64_t i = 0; i < f->n_tensors; i++) assert_int_equal(f->tensors[i].offset % 256, 0);
    assert_int_equal(gguf_find_tensor(f, "b")->offset, 256);
    gguf_close(f);
    /* a misaligned offset under the larger alignment */
    w = base_writer();
    gguf_writer_set_u32(w, "general.alignment", 256);
    gguf_writer_override_offset(w, "b", 32);
    EXPECT_WRITTEN_ERROR(w, "al256b.gguf", KV_ERR_FORMAT, "offset 32 is not a multiple of the alignment 256");
    unlink(p);
}

static void test_duplicate_tensor(void **state)
{
    gguf_writer *w = base_writer();
    gguf_writer_set_checks(w, 0);
    int64_t ne[1] = {64};
    gguf_writer_add_tensor(w, "a", GGML_TYPE_F32, 1, ne, NULL);
    EXPECT_WRITTEN_ERROR(w, "duptensor.gguf", KV_ERR_FORMAT, "tensor 'a' appears twice");
}

static void test_bad_tensor_name(void **state)
{
    char name[301];
    memset(name, 'x', 300);
    name[300] = 0;
    gguf_writer *w = base_writer();
    gguf_writer_set_checks(w, 0);
    int64_t ne[1] = {32};
    gguf_writer_add_tensor(w, name, GGML_TYPE_F32, 1, ne, NULL);
    EXPECT_WRITTEN_ERROR(w, "longname.gguf", KV_ERR_FORMAT, "tensor #2 has an invalid name");
}

static void test_absurd_counts(void **state)
{
    static const uint64_t counts[][2] = {
        {1ull << 40, 2}, {2, 1ull << 40}, {UINT64_MAX, UINT64_MAX}, {0, UINT64_MAX / 13 + 1}, {1ull << 60, 0},
    };
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        gguf_writer *w = base_writer();
        gguf_writer_override_counts(w, counts[i][0], counts[i][1]);
        EXPECT_WRITTEN_ERROR(w, "counts.gguf", KV_ERR_FORMAT, "header claims", "more than a");
    }
    /* plausible but wrong counts: one key or tensor too many runs into the next section */
    gguf_writer *w = base_writer();
    gguf_writer_override_counts(w, 2, 3);
    EXPECT_WRITTEN_ERROR(w, "kv+1.gguf", KV_ERR_FORMAT, "");
    w = base_writer();
    gguf_writer_override_counts(w, 3, 2);
    EXPECT_WRITTEN_ERROR(w, "t+1.gguf", KV_ERR_FORMAT, "");
}

/* ---- round trip of every value type ---------------------------------------------------- */

typedef struct fill_log {
    int calls;
    int64_t next_row;
} fill_log;

/* F32 value of element (row, col) of the streamed tensor. */
static float fill_value(int64_t row, int64_t col) { return (float)(row * 1000 + col) * 0.5f; }

static int fill_rows(void *user, const gguf_writer_chunk *c, kv_error *err)
{
    fill_log *log = user;
    if (c->row0 != log->next_row) return kv_error_set(err, KV_ERR_INVALID, "chunk out of order");
    assert_int_equal(c->nbytes, (size_t)c->n_rows * (size_t)c->ne[0] * 4);
    float *dst = c->dst;
    for (int64_t r = 0; r < c->n_rows; r++)
        for (int64_t i = 0; i < c->ne[0]; i++) dst[r * c->ne[0] + i] = fill_value(c->row0 + r, i);
    log->next_row += c->n_rows;
    log->calls++;
    return KV_OK;
}

static void round_trip(uint32_t version)
{
    gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    gguf_writer_set_version(w, version);
    assert_int_equal(gguf_writer_set_u8(w, "t.u8", 255), KV_OK);
    gguf_writer_set_i8(w, "t.i8", -128);
    gguf_writer_set_u16(w, "t.u16", 65535);
    gguf_writer_set_i16(w, "t.i16", -32768);
    gguf_writer_set_u32(w, "t.u32", 0xFFFFFFFFu);
    gguf_writer_set_i32(w, "t.i32", INT32_MIN);
    gguf_writer_set_f32(w, "t.f32", -1.5e-7f);
    gguf_writer_set_bool(w, "t.bool", 1);
    gguf_writer_set_bool(w, "t.false", 0);
    static const char weird[] = "h\xc3\xa9llo\0w\xe2\x96\x81rld";
    gguf_writer_set_str_n(w, "t.str", weird, sizeof weird - 1);
    gguf_writer_set_str(w, "t.empty", "");
    gguf_writer_set_u64(w, "t.u64", UINT64_MAX);
    gguf_writer_set_i64(w, "t.i64", INT64_MIN);
    gguf_writer_set_f64(w, "t.f64", 3.141592653589793);
    gguf_writer_set_u32(w, "t.replaced", 1);
    gguf_writer_set_u32(w, "t.replaced", 2); /* replaces in place */

    static const uint8_t a_u8[] = {0, 1, 255};
    static const int8_t a_i8[] = {-128, 0, 127};
    static const uint16_t a_u16[] = {0, 65535};
    static const int16_t a_i16[] = {-32768, 32767, -1};
    static const uint32_t a_u32[] = {0, 0xFFFFFFFFu, 12345};
    static const int32_t a_i32[] = {INT32_MIN, INT32_MAX};
    static const float a_f32[] = {1.0f, -0.0f, INFINITY, 1e-38f};
    static const uint8_t a_bool[] = {1, 0, 1};
    static const uint64_t a_u64[] = {UINT64_MAX, 0};
    static const int64_t a_i64[] = {INT64_MIN, INT64_MAX, -1};
    static const double a_f64[] = {2.5, -1e300};
    static const struct { const char *key; int type; const void *data; uint64_t n; size_t esz; } arrs[] = {
        {"a.u8", GGUF_VT_UINT8, a_u8, 3, 1}, {"a.i8", GGUF_VT_INT8, a_i8, 3, 1},
        {"a.u16", GGUF_VT_UINT16, a_u16, 2, 2}, {"a.i16", GGUF_VT_INT16, a_i16, 3, 2},
        {"a.u32", GGUF_VT_UINT32, a_u32, 3, 4}, {"a.i32", GGUF_VT_INT32, a_i32, 2, 4},
        {"a.f32", GGUF_VT_FLOAT32, a_f32, 4, 4}, {"a.bool", GGUF_VT_BOOL, a_bool, 3, 1},
        {"a.u64", GGUF_VT_UINT64, a_u64, 2, 8}, {"a.i64", GGUF_VT_INT64, a_i64, 3, 8},
        {"a.f64", GGUF_VT_FLOAT64, a_f64, 2, 8}, {"a.empty", GGUF_VT_UINT32, a_u32, 0, 4},
    };
    for (size_t i = 0; i < sizeof arrs / sizeof *arrs; i++)
        assert_int_equal(gguf_writer_set_arr(w, arrs[i].key, arrs[i].type, arrs[i].data, arrs[i].n), KV_OK);
    static const char *strs[] = {"", "one", "\xe2\x96\x81two", "<s>"};
    assert_int_equal(gguf_writer_set_arr_str(w, "a.str", strs, 4), KV_OK);
    assert_int_equal(gguf_writer_set_arr_str(w, "a.str0", strs, 0), KV_OK);

    /* tensors: several types and ranks, bytes from memory, zeros and a streamed callback */
    static uint8_t q8[2 * 34 * 3], f16[2 * 8 * 3 * 2 * 2], q4k[144 * 2];
    for (size_t i = 0; i < sizeof q8; i++) q8[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof f16; i++) f16[i] = (uint8_t)(i * 13 + 5);
    for (size_t i = 0; i < sizeof q4k; i++) q4k[i] = (uint8_t)(i * 3 + 2);
    float v1[5] = {1, 2, 3, 4, 5};
    int64_t ne_q8[2] = {64, 3}, ne_f16[4] = {2, 8, 3, 2}, ne_q4k[2] = {256, 2}, ne_v1[1] = {5}, ne_z[3] = {32, 2, 2};
    int64_t ne_big[2] = {256, 2100}; /* 2.05 MiB: three chunks */
    fill_log log = {0};
    assert_int_equal(gguf_writer_add_tensor(w, "t.q8", GGML_TYPE_Q8_0, 2, ne_q8, q8), KV_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "t.f16", GGML_TYPE_F16, 4, ne_f16, f16), KV_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "t.v1", GGML_TYPE_F32, 1, ne_v1, v1), KV_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "t.q4k", GGML_TYPE_Q4_K, 2, ne_q4k, q4k), KV_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "t.zero", GGML_TYPE_BF16, 3, ne_z, NULL), KV_OK);
    assert_int_equal(gguf_writer_add_tensor_fill(w, "t.big", GGML_TYPE_F32, 2, ne_big, fill_rows, &log), KV_OK);

    char name[32];
    snprintf(name, sizeof name, "rt_v%" PRIu32 ".gguf", version);
    const char *path = tu_tmp_path(name);
    write_ok(w, path);
    assert_int_equal(log.calls, 3);
    assert_int_equal(log.next_row, 2100);
    /* writing twice gives the same file */
    char name2[40];
    snprintf(name2, sizeof name2, "rt_v%" PRIu32 "_again.gguf", version);
    const char *path2 = tu_tmp_path(name2);
    log = (fill_log){0};
    write_ok(w, path2);
    gguf_writer_free(w);
    size_t n1, n2;
    char *c1 = tu_read_file(path, &n1), *c2 = tu_read_file(path2, &n2);
    assert_non_null(c1);
    assert_non_null(c2);
    assert_int_equal(n1, n2);
    assert_memory_equal(c1, c2, n1);
    free(c1);
    free(c2);
    unlink(path2);
    char tmpname[300];
    snprintf(tmpname, sizeof tmpname, "%s.tmp", path);
    assert_int_equal(access(tmpname, F_OK), -1);

    gguf_file *f = open_ok(path);
    kv_error err = {0};
    assert_int_equal(f->version, version);
    assert_int_equal(f->n_kv, 15 + 12 + 2);
    assert_int_equal(f->n_tensors, 6);
    assert_int_equal(f->size % 32, 0);
    assert_int_equal(f->kv[0].key.len, 4);
    assert_memory_equal(f->kv[0].key.ptr, "t.u8", 4);

    /* scalars: type and bytes */
    static const struct { const char *key; int type; int64_t iv; } ints[] = {
        {"t.u8", GGUF_VT_UINT8, 255}, {"t.i8", GGUF_VT_INT8, -128}, {"t.u16", GGUF_VT_UINT16, 65535},
        {"t.i16", GGUF_VT_INT16, -32768}, {"t.u32", GGUF_VT_UINT32, 0xFFFFFFFFll}, {"t.i32", GGUF_VT_INT32, INT32_MIN},
        {"t.i64", GGUF_VT_INT64, INT64_MIN}, {"t.replaced", GGUF_VT_UINT32, 2},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        const gguf_kv *kv = gguf_find_kv(f, ints[i].key);
        assert_non_null(kv);
        assert_int_equal(kv->type, ints[i].type);
        int64_t v = 0;
        if (gguf_get_i64(f, ints[i].key, 1, &v, &err) != KV_OK) fail_msg("%s", err.msg);
        if (v != ints[i].iv) fail_msg("%s = %" PRId64 ", expected %" PRId64, ints[i].key, v, ints[i].iv);
    }
    uint32_t u32 = 0;
    assert_int_equal(gguf_get_u32(f, "t.u32", 1, &u32, &err), KV_OK);
    assert_int_equal(u32, 0xFFFFFFFFu);
    assert_int_equal(gguf_get_u32(f, "t.u8", 1, &u32, &err), KV_OK);
    assert_int_equal(u32, 255);
    /* range checks of the integer getters */
    assert_int_equal(gguf_get_u32(f, "t.i8", 1, &u32, &err), KV_ERR_FORMAT);
    tu_check_msg(path, err.msg, "t.i8", "-128", "out of range", NULL);
    int64_t i64 = 0;
    assert_int_equal(gguf_get_i64(f, "t.u64", 1, &i64, &err), KV_ERR_FORMAT);
    tu_check_msg(path, err.msg, "t.u64", "out of range", NULL);
    const gguf_kv *kv = gguf_find_kv(f, "t.u64");
    uint64_t u64;
    memcpy(&u64, kv->data, 8);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(kv->type, GGUF_VT_UINT64);

    float f32 = 0;
    assert_int_equal(gguf_get_f32(f, "t.f32", 1, &f32, &err), KV_OK);
    assert_true(f32 == -1.5e-7f);
    assert_int_equal(gguf_get_f32(f, "t.f64", 1, &f32, &err), KV_OK);
    assert_true(f32 == (float)3.141592653589793);
    kv = gguf_find_kv(f, "t.f64");
    double d;
    memcpy(&d, kv->data, 8);
    assert_true(d == 3.141592653589793);
    int b = -1;
    assert_int_equal(gguf_get_bool(f, "t.bool", 1, &b, &err), KV_OK);
    assert_int_equal(b, 1);
    assert_int_equal(gguf_get_bool(f, "t.false", 1, &b, &err), KV_OK);
    assert_int_equal(b, 0);
    assert_int_equal(gguf_find_kv(f, "t.bool")->data[0], 1);

    kv = gguf_find_kv(f, "t.str");
    assert_int_equal(kv->type, GGUF_VT_STRING);
    uint64_t slen;
    memcpy(&slen, kv->data, 8);
    assert_int_equal(slen, sizeof weird - 1);
    assert_memory_equal(kv->data + 8, weird, sizeof weird - 1);
    char *s = NULL;
    assert_int_equal(gguf_get_str(f, "t.str", 1, &s, &err), KV_OK);
    assert_memory_equal(s, weird, sizeof weird); /* copy is NUL-terminated after all bytes */
    free(s);
    s = NULL;
    assert_int_equal(gguf_get_str(f, "t.empty", 1, &s, &err), KV_OK);
    assert_string_equal(s, "");
    free(s);

    /* arrays: element type, count and bytes */
    for (size_t i = 0; i < sizeof arrs / sizeof *arrs; i++) {
        const gguf_kv *a = NULL;
        if (gguf_get_arr(f, arrs[i].key, arrs[i].type, (int64_t)arrs[i].n, &a, &err) != KV_OK) fail_msg("%s", err.msg);
        assert_int_equal(a->type, GGUF_VT_ARRAY);
        assert_int_equal(a->arr_type, arrs[i].type);
        assert_int_equal(a->arr_len, arrs[i].n);
        if (arrs[i].n) assert_memory_equal(a->data, arrs[i].data, arrs[i].n * arrs[i].esz);
        assert_null(a->arr_strs);
    }
    const gguf_kv *as = NULL;
    assert_int_equal(gguf_get_arr(f, "a.str", GGUF_VT_STRING, 4, &as, &err), KV_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(as->arr_strs[i].len, strlen(strs[i]));
        assert_memory_equal(as->arr_strs[i].ptr, strs[i], strlen(strs[i]));
    }
    assert_int_equal(gguf_get_arr(f, "a.str0", GGUF_VT_STRING, 0, &as, &err), KV_OK);
    assert_int_equal(as->arr_len, 0);

    /* tensors: table entries and bytes */
    const gguf_tensor *t = gguf_find_tensor(f, "t.q8");
    assert_int_equal(t->type, GGML_TYPE_Q8_0);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->nbytes, sizeof q8);
    assert_int_equal(t->offset, 0);
    assert_memory_equal(t->data, q8, sizeof q8);
    t = gguf_find_tensor(f, "t.f16");
    assert_int_equal(t->n_dims, 4);
    assert_true(t->ne[0] == 2 && t->ne[1] == 8 && t->ne[2] == 3 && t->ne[3] == 2);
    assert_int_equal(t->n_elements, 96);
    assert_int_equal(t->offset, 224); /* 204 bytes of Q8_0 rounded up to 32 */
    assert_memory_equal(t->data, f16, sizeof f16);
    t = gguf_find_tensor(f, "t.v1");
    assert_int_equal(t->nbytes, 20);
    assert_memory_equal(t->data, v1, sizeof v1);
    t = gguf_find_tensor(f, "t.q4k");
    assert_int_equal(t->type, GGML_TYPE_Q4_K);
    assert_memory_equal(t->data, q4k, sizeof q4k);
    t = gguf_find_tensor(f, "t.zero");
    assert_int_equal(t->type, GGML_TYPE_BF16);
    assert_int_equal(t->n_dims, 3);
    for (uint64_t i = 0; i < t->nbytes; i++) assert_int_equal(((const uint8_t *)t->data)[i], 0);
    t = gguf_find_tensor(f, "t.big");
    assert_int_equal(t->nbytes, 256 * 2100 * 4);
    const float *fb = t->data;
    for (int64_t r = 0; r < 2100; r++)
        for (int64_t i = 0; i < 256; i += 37)
            if (fb[r * 256 + i] != fill_value(r, i)) fail_msg("t.big[%lld][%lld] differs", (long long)r, (long long)i);
    check_opened_file(f);
    gguf_close(f);

    /* every byte of this file's header, metadata and tensor table, flipped, must be handled */
    f = open_ok(path);
    uint64_t hdr_end = f->data_offset;
    gguf_close(f);
    flip_stats st = flip_region(path, "rt_flip.gguf", hdr_end);
    print_message("byte flips (v%" PRIu32 " round-trip file, bytes 0..%" PRIu64 "): %ld corrupted opens: %ld rejected, "
                  "%ld opened\n", version, hdr_end, st.tried, st.rejected, st.opened);
    unlink(path);
}

static void test_round_trip_v3(void **state) { round_trip(3); }
static void test_round_trip_v2(void **state) { round_trip(2); }

static void test_byte_flips_small(void **state)
{
    /* every byte (header and data) of a small writer-made file with every value type */
    gguf_writer *w = base_writer();
    static const int32_t xs[] = {1, -2, 3};
    static const char *strs[] = {"a", "bc", ""};
    gguf_writer_set_arr(w, "x.i32", GGUF_VT_INT32, xs, 3);
    gguf_writer_set_arr_str(w, "x.s", strs, 3);
    gguf_writer_set_f64(w, "x.f64", 1.0);
    gguf_writer_set_bool(w, "x.b", 1);
    gguf_writer_set_u32(w, "general.alignment", 64);
    const char *p = tu_tmp_path("small.gguf");
    write_ok(w, p);
    gguf_writer_free(w);
    flip_stats st = flip_region(p, "small_flip.gguf", 0);
    size_t n;
    char *c = tu_read_file(p, &n);
    free(c);
    print_message("byte flips (writer-made file, %zu bytes, every byte): %ld corrupted opens: %ld rejected, %ld opened\n",
                  n, st.tried, st.rejected, st.opened);
    unlink(p);
}

/* ---- typed getters ---------------------------------------------------------------------- */

static void test_getters(void **state)
{
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "g.str", "text");
    gguf_writer_set_u32(w, "g.u32", 42);
    gguf_writer_set_f32(w, "g.f32", 0.5f);
    gguf_writer_set_bool(w, "g.bool", 1);
    static const float fs[] = {1, 2};
    gguf_writer_set_arr(w, "g.arr", GGUF_VT_FLOAT32, fs, 2);
    const char *p = tu_tmp_path("getters.gguf");
    write_ok(w, p);
    gguf_writer_free(w);
    gguf_file *f = open_ok(p);
    kv_error err = {0};

    /* wrong type: names the file, the key and both types */
    uint32_t u = 77;
    assert_int_equal(gguf_get_u32(f, "g.str", 1, &u, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "'g.str'", "string", "integer", NULL);
    assert_int_equal(u, 77);
    int64_t i = 77;
    assert_int_equal(gguf_get_i64(f, "g.f32", 0, &i, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "'g.f32'", "float32", "integer", NULL);
    float fl = 7;
    assert_int_equal(gguf_get_f32(f, "g.u32", 1, &fl, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "metadata 'g.u32' has type uint32, expected float32", NULL);
    assert_true(fl == 7);
    int b = 7;
    assert_int_equal(gguf_get_bool(f, "g.u32", 1, &b, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "metadata 'g.u32' has type uint32, expected bool", NULL);
    char *s = NULL;
    assert_int_equal(gguf_get_str(f, "g.bool", 1, &s, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "metadata 'g.bool' has type bool, expected string", NULL);
    assert_null(s);
    const gguf_kv *kv = (const gguf_kv *)1;
    assert_int_equal(gguf_get_arr(f, "g.arr", GGUF_VT_INT32, -1, &kv, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "'g.arr'", "array of float32", "array of int32", NULL);
    assert_null(kv);
    assert_int_equal(gguf_get_arr(f, "g.u32", GGUF_VT_UINT32, -1, &kv, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "'g.u32'", "type uint32", "array of uint32", NULL);
    assert_int_equal(gguf_get_arr(f, "g.arr", GGUF_VT_FLOAT32, 3, &kv, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "'g.arr' has 2 entries, expected 3", NULL);

    /* missing and required */
    assert_int_equal(gguf_get_u32(f, "g.none", 1, &u, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "missing required metadata key 'g.none'", NULL);
    assert_int_equal(gguf_get_i64(f, "g.none", 1, &i, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "missing required metadata key 'g.none'", NULL);
    assert_int_equal(gguf_get_f32(f, "g.none", 1, &fl, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "missing required metadata key", NULL);
    assert_int_equal(gguf_get_bool(f, "g.none", 1, &b, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "missing required metadata key", NULL);
    assert_int_equal(gguf_get_str(f, "g.none", 1, &s, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "missing required metadata key", NULL);
    assert_int_equal(gguf_get_arr(f, "g.none", GGUF_VT_UINT32, -1, &kv, &err), KV_ERR_FORMAT);
    tu_check_msg(p, err.msg, "missing required metadata key 'g.none'", NULL);

    /* optional and absent: default untouched, KV_OK */
    u = 11; i = -12; fl = 13.5f; b = 14; s = NULL;
    assert_int_equal(gguf_get_u32(f, "g.none", 0, &u, &err), KV_OK);
    assert_int_equal(gguf_get_i64(f, "g.none", 0, &i, &err), KV_OK);
    assert_int_equal(gguf_get_f32(f, "g.none", 0, &fl, &err), KV_OK);
    assert_int_equal(gguf_get_bool(f, "g.none", 0, &b, &err), KV_OK);
    assert_int_equal(gguf_get_str(f, "g.none", 0, &s, &err), KV_OK);
    assert_int_equal(u, 11);
    assert_int_equal(i, -12);
    assert_true(fl == 13.5f);
    assert_int_equal(b, 14);
    assert_null(s);
    /* present: read */
    assert_int_equal(gguf_get_u32(f, "g.u32", 0, &u, &err), KV_OK);
    assert_int_equal(u, 42);
    assert_int_equal(gguf_get_i64(f, "g.u32", 0, &i, &err), KV_OK);
    assert_int_equal(i, 42);

    assert_string_equal(gguf_value_type_name(GGUF_VT_FLOAT64), "float64");
    assert_string_equal(gguf_value_type_name(GGUF_VT_COUNT), "unknown");
    assert_string_equal(gguf_value_type_name(-1), "unknown");
    gguf_close(f);
    gguf_close(NULL);
    unlink(p);
}

/* ---- the writer's own errors ------------------------------------------------------------ */

static int fill_fails(void *user, const gguf_writer_chunk *c, kv_error *err)
{
    return kv_error_set(err, KV_ERR_INVALID, "no data for row %lld", (long long)c->row0);
}

static void test_writer_errors(void **state)
{
    const char *p = tu_tmp_path("werr.gguf");
    kv_error err = {0};
    int64_t ne_bad[2] = {48, 2}, ne_zero[2] = {32, 0}, ne_ok[1] = {32};

    gguf_writer *w = gguf_writer_create();
    assert_int_equal(gguf_writer_add_tensor(w, "q", GGML_TYPE_Q4_0, 2, ne_bad, NULL), KV_ERR_INVALID);
    assert_int_equal(gguf_writer_add_tensor(w, "z", GGML_TYPE_F32, 2, ne_zero, NULL), KV_ERR_INVALID);
    assert_int_equal(gguf_writer_write(w, p, &err), KV_ERR_INVALID);
    tu_check_msg(p, err.msg, "tensor 'q'", "48", "Q4_0", NULL); /* the first error is reported */
    assert_int_equal(access(p, F_OK), -1);
    gguf_writer_free(w);

    w = gguf_writer_create();
    assert_int_equal(gguf_writer_add_tensor(w, "x", GGML_TYPE_F32, 5, ne_ok, NULL), KV_ERR_INVALID);
    gguf_writer_free(w);
    w = gguf_writer_create();
    assert_int_equal(gguf_writer_add_tensor(w, "x", 4, 1, ne_ok, NULL), KV_ERR_INVALID);
    gguf_writer_free(w);
    w = gguf_writer_create();
    assert_int_equal(gguf_writer_add_tensor(w, "x", GGML_TYPE_F32, 1, ne_ok, NULL), KV_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "x", GGML_TYPE_F32, 1, ne_ok, NULL), KV_ERR_INVALID);
    gguf_writer_free(w);
    w = gguf_writer_create();
    assert_int_equal(gguf_writer_set_u32(w, "", 1), KV_ERR_INVALID);
    gguf_writer_free(w);
    w = gguf_writer_create();
    assert_int_equal(gguf_writer_set_arr(w, "k", GGUF_VT_STRING, "x", 1), KV_ERR_INVALID);
    gguf_writer_free(w);
    w = gguf_writer_create();
    assert_int_equal(gguf_writer_override_offset(w, "nope", 0), KV_ERR_INVALID);
    gguf_writer_free(w);

    /* general.alignment the spec forbids */
    w = gguf_writer_create();
    gguf_writer_set_u32(w, "general.alignment", 24);
    assert_int_equal(gguf_writer_write(w, p, &err), KV_ERR_INVALID);
    tu_check_msg(p, err.msg, "general.alignment", NULL);
    gguf_writer_free(w);

    /* a failing fill callback: error passed on, no file and no temporary left */
    w = gguf_writer_create();
    int64_t ne[2] = {32, 4};
    assert_int_equal(gguf_writer_add_tensor_fill(w, "f", GGML_TYPE_F32, 2, ne, fill_fails, NULL), KV_OK);
    assert_int_equal(gguf_writer_write(w, p, &err), KV_ERR_INVALID);
    tu_check_msg(p, err.msg, "tensor 'f'", "no data for row 0", NULL);
    assert_int_equal(access(p, F_OK), -1);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    assert_int_equal(access(tmp, F_OK), -1);
    /* an unwritable place */
    assert_int_equal(gguf_writer_write(w, "/nonexistent-dir/x.gguf", &err), KV_ERR_IO);
    tu_check_msg("/nonexistent-dir/x.gguf", err.msg, "cannot create", NULL);
    gguf_writer_free(w);
    gguf_writer_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_legacy_v1),
        cmocka_unit_test(test_missing_and_not_regular),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_byte_flips_stories),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_string_past_end),
        cmocka_unit_test(test_array_past_end),
        cmocka_unit_test(test_unknown_value_type),
        cmocka_unit_test(test_nested_array),
        cmocka_unit_test(test_duplicate_key),
        cmocka_unit_test(test_bad_dims),
        cmocka_unit_test(test_bad_tensor_type),
        cmocka_unit_test(test_row_not_multiple_of_block),
        cmocka_unit_test(test_offsets),
        cmocka_unit_test(test_alignment_key),
        cmocka_unit_test(test_duplicate_tensor),
        cmocka_unit_test(test_bad_tensor_name),
        cmocka_unit_test(test_absurd_counts),
        cmocka_unit_test(test_round_trip_v3),
        cmocka_unit_test(test_round_trip_v2),
        cmocka_unit_test(test_byte_flips_small),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_writer_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, tu_tmpdir_teardown);
}
