/* test_model_load: model_load (engine/model.c) on writer-made llama/qwen2 files — hyperparameters, defaults and every load error. */
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
#include <unistd.h>

#include <cmocka.h>

#include "app/tools.h"
#include "engine/gguf_writer.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/ops.h"
#include "engine/kernels/quant.h"
#include "tests/support/testcheck.h"
#include "tests/support/testutil.h"

/* A file may claim sizes that make the loader's allocations fail: malloc must return NULL to
 * the code under test rather than abort the test binary. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static int group_setup(void **state) { return tu_tmpdir_make("test-model"); }

/* ---- building llama-shaped files --------------------------------------------------------- */

/* What to write; zero fields take the defaults of spec_default(). */
typedef struct mspec {
    const char *arch;             /* general.architecture; NULL omits the key */
    const char *name;             /* general.name or NULL */
    int n_embd, n_layer, n_head, n_ff, n_vocab, n_ctx;
    int n_head_kv;                /* 0: {arch}.attention.head_count_kv omitted */
    float freq_base;              /* 0: {arch}.rope.freq_base omitted */
    int64_t block_count_key;      /* != 0: written as {arch}.block_count instead of n_layer */
    int tied;                     /* 1: no output.weight */
    const char *omit_key;         /* a metadata key to leave out */
    const char *omit_tensor;      /* a tensor to leave out */
    const char *reshape_tensor;   /* written as [reshape_ne0(, reshape_ne1)] instead */
    int64_t reshape_ne0, reshape_ne1;
    const char *retype_tensor;    /* written as `retype` (zeros, correctly sized) */
    int retype;
    const char *nan_tensor;       /* gets a NaN at element 3 */
} mspec;

static mspec spec_default(void)
{
    mspec s = {0};
    s.arch = "llama";
    s.n_embd = 64;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_ff = 96;
    s.n_vocab = 32;
    s.n_ctx = 128;
    s.tied = 1;
    return s;
}

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* Deterministic weight value of element idx of tensor `name` (norm weights are 1). */
static float weight_value(const char *name, int64_t idx)
{
    if (strstr(name, "norm")) return 1.0f;
    uint32_t h = name_hash(name) ^ (uint32_t)(idx * 2654435761u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return ((float)(h % 2001) - 1000.0f) * 1e-4f;
}

typedef struct fill_ctx {
    const mspec *spec;
} fill_ctx;

static int fill_f32(void *user, const gguf_writer_chunk *c, kv_error *err)
{
    const fill_ctx *fc = user;
    float *dst = c->dst;
    int64_t n = c->n_rows * c->ne[0], base = c->row0 * c->ne[0];
    for (int64_t i = 0; i < n; i++) dst[i] = weight_value(c->name, base + i);
    if (fc->spec->nan_tensor && strcmp(c->name, fc->spec->nan_tensor) == 0 && base <= 3 && base + n > 3)
        dst[3 - base] = NAN;
    return KV_OK;
}

static void add_t(gguf_writer *w, const mspec *s, fill_ctx *fc, const char *name, int64_t ne0, int64_t ne1)
{
    if (s->omit_tensor && strcmp(name, s->omit_tensor) == 0) return;
    if (s->reshape_tensor && strcmp(name, s->reshape_tensor) == 0) {
        ne0 = s->reshape_ne0;
        ne1 = s->reshape_ne1;
    }
    int64_t ne[2] = {ne0, ne1};
    int n_dims = ne1 ? 2 : 1;
    int rc;
    if (s->retype_tensor && strcmp(name, s->retype_tensor) == 0)
        rc = gguf_writer_add_tensor(w, name, s->retype, n_dims, ne, NULL);
    else
        rc = gguf_writer_add_tensor_fill(w, name, GGML_TYPE_F32, n_dims, ne, fill_f32, fc);
    assert_int_equal(rc, KV_OK);
}

static void key_u32(gguf_writer *w, const mspec *s, const char *suffix, int64_t v)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", s->arch ? s->arch : "llama", suffix);
    if (s->omit_key && strcmp(key, s->omit_key) == 0) return;
    gguf_writer_set_u32(w, key, (uint32_t)v);
}

/* Writes the model described by s to tmp/<file> and returns its path. */
static const char *build_model(const mspec *s, const char *file)
{
    gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    fill_ctx fc = {s};
    const char *a = s->arch ? s->arch : "llama";
    char key[128];
    if (s->arch && !(s->omit_key && strcmp(s->omit_key, "general.architecture") == 0))
        gguf_writer_set_str(w, "general.architecture", s->arch);
    if (s->name) gguf_writer_set_str(w, "general.name", s->name);
    key_u32(w, s, "context_length", s->n_ctx);
    key_u32(w, s, "embedding_length", s->n_embd);
    key_u32(w, s, "block_count", s->block_count_key ? s->block_count_key : s->n_layer);
    key_u32(w, s, "feed_forward_length", s->n_ff);
    key_u32(w, s, "attention.head_count", s->n_head);
    if (s->n_head_kv) key_u32(w, s, "attention.head_count_kv", s->n_head_kv);
    if (s->freq_base != 0) {
        snprintf(key, sizeof key, "%s.rope.freq_base", a);
        gguf_writer_set_f32(w, key, s->freq_base);
    }
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if (!(s->omit_key && strcmp(s->omit_key, key) == 0)) gguf_writer_set_f32(w, key, 1e-5f);

    const int64_t E = s->n_embd, V = s->n_vocab, FF = s->n_ff;
    const int64_t EKV = (int64_t)(s->n_head_kv ? s->n_head_kv : s->n_head) * (E / s->n_head);
    const int qwen = s->arch && strcmp(s->arch, "qwen2") == 0;
    add_t(w, s, &fc, "token_embd.weight", E, V);
    add_t(w, s, &fc, "output_norm.weight", E, 0);
    if (!s->tied) add_t(w, s, &fc, "output.weight", E, V);
    for (int il = 0; il < s->n_layer; il++) {
        char nm[64];
#define L(suffix, ne0, ne1) snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), add_t(w, s, &fc, nm, ne0, ne1)
        L("attn_norm.weight", E, 0);
        L("attn_q.weight", E, E);
        L("attn_k.weight", E, EKV);
        L("attn_v.weight", E, EKV);
        L("attn_output.weight", E, E);
        L("ffn_norm.weight", E, 0);
        L("ffn_gate.weight", E, FF);
        L("ffn_up.weight", E, FF);
        L("ffn_down.weight", FF, E);
        if (qwen) {
            L("attn_q.bias", E, 0);
            L("attn_k.bias", EKV, 0);
            L("attn_v.bias", EKV, 0);
        }
#undef L
    }
    const char *path = tu_tmp_path(file);
    kv_error err = {0};
    if (gguf_writer_write(w, path, &err) != KV_OK) fail_msg("writing %s: %s", path, err.msg);
    gguf_writer_free(w);
    return path;
}

static model *load_ok(const char *path)
{
    model *m = NULL;
    kv_error err = {0};
    if (model_load(path, &m, &err) != KV_OK) fail_msg("model_load(%s): %s", path, err.msg);
    assert_non_null(m);
    return m;
}

/* model_load must fail with `code` and a message "<path>: …" containing every string given. */
static void expect_load_error(const char *path, int code, ...)
{
    model *m = (model *)1;
    kv_error err = {0};
    int rc = model_load(path, &m, &err);
    if (rc == KV_OK) {
        model_free(m);
        fail_msg("%s loaded, expected an error", path);
    }
    assert_null(m);
    if (code >= 0 && rc != code) fail_msg("code %d, expected %d: %s", rc, code, err.msg);
    va_list ap;
    va_start(ap, code);
    tu_check_msg_v(path, err.msg, ap);
    va_end(ap);
}

#define EXPECT_BUILT_ERROR(spec, file, code, ...)                                                   \
    do {                                                                                           \
        const char *p_ = build_model(&(spec), (file));                                             \
        expect_load_error(p_, (code), __VA_ARGS__, (const char *)NULL);                            \
        unlink(p_);                                                                                \
    } while (0)

/* ---- valid models ------------------------------------------------------------------------- */

static void test_valid_defaults(void **state)
{
    mspec s = spec_default(); /* no head_count_kv, no rope.freq_base, no output.weight, no name */
    const char *path = build_model(&s, "valid.gguf");
    model *m = load_ok(path);
    const model_hparams *hp = &m->hp;
    assert_int_equal(hp->arch, ARCH_LLAMA);
    assert_string_equal(m->arch_name, "llama");
    assert_int_equal(hp->n_embd, 64);
    assert_int_equal(hp->n_layer, 2);
    assert_int_equal(hp->n_head, 4);
    assert_int_equal(hp->n_head_kv, 4); /* default = n_head */
    assert_int_equal(hp->head_dim, 16);
    assert_int_equal(hp->n_embd_kv, 64);
    assert_int_equal(hp->n_ff, 96);
    assert_int_equal(hp->n_vocab, 32);
    assert_int_equal(hp->n_ctx_train, 128);
    assert_int_equal(hp->n_rot, 16);    /* default = head_dim */
    assert_int_equal(hp->rope_neox, 0);
    assert_true(hp->rope_freq_base == 10000.0f);
    assert_true(hp->rms_norm_eps == 1e-5f);
    assert_string_equal(m->name, "valid.gguf"); /* no general.name: the file's base name */
    assert_ptr_equal(m->output, m->tok_embd);  /* tied */
    assert_string_equal(m->tok_embd->name, "token_embd.weight");
    assert_null(m->rope_freqs);
    assert_int_equal(m->weight_type, GGML_TYPE_F32);
    /* params: embd + output_norm + 2 x (2 norms + q,k,v,o + 3 ffn) */
    uint64_t want = 64 * 32 + 64 + 2 * (2 * 64 + 4 * 64 * 64 + 3 * 64 * 96);
    assert_int_equal(m->n_params, want);
    for (int i = 0; i < 64; i++) assert_true(m->output_norm[i] == 1.0f);
    for (int il = 0; il < 2; il++) {
        const model_layer *L = &m->layers[il];
        assert_non_null(L->attn_norm);
        assert_non_null(L->ffn_norm);
        assert_true(L->attn_norm[63] == 1.0f);
        assert_null(L->bq);
        assert_null(L->bk);
        assert_null(L->bv);
        char nm[64];
        snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", il);
        assert_string_equal(L->w_down->name, nm);
        assert_int_equal(L->w_down->ne[0], 96);
        assert_int_equal(L->w_down->ne[1], 64);
    }
    /* the weights are the bytes written */
    const float *e = m->tok_embd->data;
    for (int64_t i = 0; i < 64 * 32; i += 97) assert_true(e[i] == weight_value("token_embd.weight", i));
    const float *q = m->layers[1].wq->data;
    for (int64_t i = 0; i < 64 * 64; i += 101) assert_true(q[i] == weight_value("blk.1.attn_q.weight", i));
    /* weight bytes: every 2-D weight once, the tied table once */
    assert_int_equal(model_weight_bytes(m), (64 * 32 + 2 * (4 * 64 * 64 + 3 * 64 * 96)) * 4);
    model_free(m);
    model_free(NULL);
    unlink(path);
}

static void test_valid_gqa_untied(void **state)
{
    mspec s = spec_default();
    s.n_head_kv = 2;
    s.freq_base = 500000.0f;
    s.tied = 0;
    s.name = "tiny test model";
    const char *path = build_model(&s, "gqa.gguf");
    model *m = load_ok(path);
    assert_int_equal(m->hp.n_head_kv, 2);
    assert_int_equal(m->hp.n_embd_kv, 32);
    assert_true(m->hp.rope_freq_base == 500000.0f);
    assert_string_equal(m->name, "tiny test model");
    assert_non_null(m->output);
    assert_true(m->output != m->tok_embd);
    assert_string_equal(m->output->name, "output.weight");
    assert_int_equal(m->layers[0].wk->ne[1], 32);
    assert_int_equal(m->layers[0].wv->ne[1], 32);
    model_free(m);
    unlink(path);
}

static void test_valid_qwen2(void **state)
{
    mspec s = spec_default();
    s.arch = "qwen2";
    s.n_head_kv = 2;
    s.freq_base = 1e6f;
    const char *path = build_model(&s, "qwen2.gguf");
    model *m = load_ok(path);
    assert_int_equal(m->hp.arch, ARCH_QWEN2);
    assert_string_equal(m->arch_name, "qwen2");
    assert_int_equal(m->hp.rope_neox, 1);
    assert_true(m->hp.rope_freq_base == 1e6f);
    for (int il = 0; il < 2; il++) {
        assert_non_null(m->layers[il].bq);
        assert_non_null(m->layers[il].bk);
        assert_non_null(m->layers[il].bv);
        char nm[64];
        snprintf(nm, sizeof nm, "blk.%d.attn_k.bias", il);
        for (int i = 0; i < 32; i++) assert_true(m->layers[il].bk[i] == weight_value(nm, i));
    }
    model_free(m);
    unlink(path);

    /* qwen2 requires its biases */
    s.omit_tensor = "blk.1.attn_v.bias";
    EXPECT_BUILT_ERROR(s, "qwen2-nobias.gguf", KV_ERR_FORMAT, "required tensor 'blk.1.attn_v.bias' is missing");
}

static void test_real_models(void **state)
{
    model *m = load_ok(tu_path("models/stories260K.gguf"));
    const model_hparams *hp = &m->hp;
    assert_int_equal(hp->n_embd, 64);
    assert_int_equal(hp->n_layer, 5);
    assert_int_equal(hp->n_head, 8);
    assert_int_equal(hp->n_head_kv, 4);
    assert_int_equal(hp->n_ff, 172);
    assert_int_equal(hp->n_vocab, 512);
    assert_int_equal(hp->n_ctx_train, 2048);
    assert_int_equal(hp->n_rot, 8);
    assert_int_equal(hp->head_dim, 8);
    assert_true(m->output != m->tok_embd);
    assert_int_equal(m->n_params, 292800);
    model_free(m);

    m = load_ok(tu_path("models/syn-qwen2-f32.gguf"));
    assert_int_equal(m->hp.arch, ARCH_QWEN2);
    assert_int_equal(m->hp.n_embd, 128);
    assert_int_equal(m->hp.n_vocab, 50257);
    assert_ptr_equal(m->output, m->tok_embd); /* tied embeddings */
    assert_true(m->hp.rope_freq_base == 1e6f);
    model_free(m);

    m = load_ok(tu_path("models/syn-llama3-f32.gguf"));
    assert_non_null(m->rope_freqs);
    assert_int_equal(m->hp.n_head_kv, 1);
    assert_true(m->hp.rope_freq_base == 500000.0f);
    model_free(m);
}

/* ---- errors ------------------------------------------------------------------------------- */

static void test_unsupported_arch(void **state)
{
    mspec s = spec_default();
    s.arch = "gpt2";
    const char *path = build_model(&s, "gpt2.gguf");
    char want[512];
    snprintf(want, sizeof want, "%s: architecture 'gpt2' is not supported (supported: %s)", path, MODEL_ARCHS);
    model *m = (model *)1;
    kv_error err = {0};
    assert_int_equal(model_load(path, &m, &err), KV_ERR_UNSUPPORTED);
    assert_null(m);
    assert_string_equal(err.msg, want);
    unlink(path);

    s = spec_default();
    s.arch = NULL; /* no general.architecture */
    EXPECT_BUILT_ERROR(s, "noarch.gguf", KV_ERR_FORMAT, "missing required metadata key 'general.architecture'");
}

static void test_arch_wrong_type(void **state)
{
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_u32(w, "general.architecture", 1);
    const char *path = tu_tmp_path("archtype.gguf");
    kv_error err = {0};
    assert_int_equal(gguf_writer_write(w, path, &err), KV_OK);
    gguf_writer_free(w);
    expect_load_error(path, KV_ERR_FORMAT, "'general.architecture'", "uint32", "string", (const char *)NULL);
    unlink(path);
}

static void test_missing_keys(void **state)
{
    static const char *keys[] = {
        "llama.embedding_length", "llama.context_length", "llama.block_count", "llama.feed_forward_length",
        "llama.attention.head_count", "llama.attention.layer_norm_rms_epsilon",
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        mspec s = spec_default();
        s.omit_key = keys[i];
        char want[160];
        snprintf(want, sizeof want, "missing required metadata key '%s'", keys[i]);
        EXPECT_BUILT_ERROR(s, "nokey.gguf", KV_ERR_FORMAT, want);
    }
}

static void test_bad_hparams(void **state)
{
    mspec s = spec_default();
    s.n_head_kv = 3; /* does not divide 4 */
    EXPECT_BUILT_ERROR(s, "hkv.gguf", KV_ERR_FORMAT, "llama.attention.head_count_kv 3", "head_count 4");
    s = spec_default();
    s.n_head = 5; /* 64 % 5 != 0 */
    EXPECT_BUILT_ERROR(s, "hc.gguf", KV_ERR_FORMAT, "embedding_length 64", "head_count 5");
    s = spec_default();
    s.block_count_key = 0x7FFFFFFF; /* past the loader's range */
    EXPECT_BUILT_ERROR(s, "bc.gguf", KV_ERR_FORMAT, "llama.block_count", "out of range");
    s = spec_default();
    s.block_count_key = 3; /* more layers than the file holds: names the key or the missing layer */
    const char *p = build_model(&s, "bc3.gguf");
    model *m = NULL;
    kv_error err = {0};
    assert_int_equal(model_load(p, &m, &err), KV_ERR_FORMAT);
    assert_null(m);
    assert_true(strncmp(err.msg, p, strlen(p)) == 0);
    if (!strstr(err.msg, "blk.2.attn_norm.weight") && !strstr(err.msg, "block_count 3"))
        fail_msg("block_count 3 with 2 layers: %s", err.msg);
    unlink(p);
}

/* A block_count the loader's range accepts but the file cannot back. */
static void test_absurd_block_count(void **state)
{
    mspec s = spec_default();
    s.block_count_key = 1 << 30; /* the largest the loader accepts, with tensors for 2 layers */
    /* must be rejected for what it is (too many layers for the file / a missing layer), not by
     * first trying to allocate per-layer storage for 2^30 layers */
    const char *p = build_model(&s, "bcbig.gguf");
    model *m = NULL;
    kv_error err = {0};
    int rc = model_load(p, &m, &err);
    unlink(p);
    assert_int_not_equal(rc, KV_OK);
    assert_null(m);
    if (rc == KV_ERR_NOMEM || !(strstr(err.msg, "block_count") || strstr(err.msg, "blk.")))
        fail_msg("block_count 2^30 with 2 layers of tensors: expected an error naming block_count or the "
                 "missing layer, got (code %d) %s", rc, err.msg);
}

static void test_missing_tensor(void **state)
{
    mspec s = spec_default();
    s.omit_tensor = "blk.1.ffn_up.weight";
    EXPECT_BUILT_ERROR(s, "noffnup.gguf", KV_ERR_FORMAT, "required tensor 'blk.1.ffn_up.weight' is missing");
    s.omit_tensor = "token_embd.weight";
    EXPECT_BUILT_ERROR(s, "noembd.gguf", KV_ERR_FORMAT, "required tensor 'token_embd.weight' is missing");
    s.omit_tensor = "output_norm.weight";
    EXPECT_BUILT_ERROR(s, "nonorm.gguf", KV_ERR_FORMAT, "'output_norm.weight' is missing");
}

static void test_wrong_shape(void **state)
{
    mspec s = spec_default();
    s.n_head_kv = 2;
    s.reshape_tensor = "blk.0.attn_k.weight";
    s.reshape_ne0 = 64;
    s.reshape_ne1 = 64;
    EXPECT_BUILT_ERROR(s, "shape.gguf", KV_ERR_FORMAT, "tensor 'blk.0.attn_k.weight' has shape [64, 64], expected [64, 32]");
    s = spec_default();
    s.reshape_tensor = "blk.0.ffn_down.weight"; /* transposed */
    s.reshape_ne0 = 64;
    s.reshape_ne1 = 96;
    EXPECT_BUILT_ERROR(s, "shapeT.gguf", KV_ERR_FORMAT, "'blk.0.ffn_down.weight' has shape [64, 96], expected [96, 64]");
    s = spec_default();
    s.tied = 0;
    s.reshape_tensor = "output.weight";
    s.reshape_ne0 = 64;
    s.reshape_ne1 = 31;
    EXPECT_BUILT_ERROR(s, "shapeout.gguf", KV_ERR_FORMAT, "'output.weight' has shape [64, 31], expected [64, 32]");
}

/* A 1-D tensor of the wrong length: the expected shape must read "[64]". */
static void test_wrong_shape_1d(void **state)
{
    mspec s = spec_default();
    s.reshape_tensor = "blk.1.ffn_norm.weight";
    s.reshape_ne0 = 32;
    s.reshape_ne1 = 0;
    EXPECT_BUILT_ERROR(s, "shape1d.gguf", KV_ERR_FORMAT, "tensor 'blk.1.ffn_norm.weight' has shape [32", "expected [64]");
}

static void test_unsupported_weight_type(void **state)
{
    mspec s = spec_default();
    s.n_ff = 256; /* IQ2_XXS needs rows of 256 */
    s.retype_tensor = "blk.0.ffn_down.weight";
    s.retype = GGML_TYPE_IQ2_XXS;
    EXPECT_BUILT_ERROR(s, "iq2.gguf", KV_ERR_UNSUPPORTED, "tensor 'blk.0.ffn_down.weight'", "IQ2_XXS",
                       "not support");
    s = spec_default();
    s.retype_tensor = "blk.1.attn_q.weight";
    s.retype = GGML_TYPE_Q8_1;
    EXPECT_BUILT_ERROR(s, "q81.gguf", KV_ERR_UNSUPPORTED, "tensor 'blk.1.attn_q.weight'", "Q8_1");
    s = spec_default();
    s.retype_tensor = "blk.0.attn_v.weight";
    s.retype = GGML_TYPE_I32;
    EXPECT_BUILT_ERROR(s, "i32.gguf", KV_ERR_UNSUPPORTED, "tensor 'blk.0.attn_v.weight'", "I32");
}

static void test_non_finite_norm(void **state)
{
    mspec s = spec_default();
    s.nan_tensor = "blk.1.attn_norm.weight";
    EXPECT_BUILT_ERROR(s, "nan.gguf", KV_ERR_FORMAT, "tensor 'blk.1.attn_norm.weight'", "non-finite value at 3");
}

static void test_q8_0_fixture(void **state)
{
    /* Its ffn_down rows are 172 long, not a multiple of Q8_0's 32 (SOURCES.md). */
    const char *path = tu_path("models/tinyllamas-stories-260k-q8_0.gguf");
    expect_load_error(path, KV_ERR_FORMAT, "ffn_down.weight", "rows of 172 elements", "Q8_0", "block size 32",
                      (const char *)NULL);
}

typedef struct flip_count {
    const char *path; /* the file being damaged */
    long tried, loaded;
} flip_count;

/* model_load on the file damaged at off: it fails with a message naming the file or loads a
 * consistent model. */
static void load_flipped(void *ud, uint64_t off)
{
    flip_count *fc = ud;
    const char *path = fc->path;
    model *m = NULL;
    kv_error err = {0};
    fc->tried++;
    if (model_load(path, &m, &err) == KV_OK) {
        fc->loaded++;
        const model_hparams *hp = &m->hp;
        assert_true(hp->n_embd > 0 && hp->n_layer > 0 && hp->n_head > 0 && hp->n_head_kv > 0);
        assert_int_equal(hp->n_embd % hp->n_head, 0);
        assert_int_equal(hp->n_head % hp->n_head_kv, 0);
        assert_int_equal(m->tok_embd->ne[0], hp->n_embd);
        assert_int_equal(m->tok_embd->ne[1], hp->n_vocab);
        for (int il = 0; il < hp->n_layer; il++) {
            const model_layer *L = &m->layers[il];
            assert_int_equal(L->wk->ne[1], hp->n_embd_kv);
            assert_int_equal(L->w_down->ne[0], hp->n_ff);
        }
        model_free(m);
    } else {
        assert_null(m);
        size_t pl = strlen(path);
        if (strncmp(err.msg, path, pl) != 0) fail_msg("flip at %" PRIu64 ": message without the path: %s", off, err.msg);
    }
}

/* Every byte of the header, metadata and tensor table of a small valid model, flipped three
 * ways: model_load either fails with a message naming the file or loads a consistent model. */
static void test_byte_flips(void **state)
{
    mspec s = spec_default();
    s.n_head_kv = 2;
    s.freq_base = 10000.0f;
    s.tied = 0;
    const char *src = build_model(&s, "flipsrc.gguf");
    size_t size;
    uint8_t *orig = (uint8_t *)tu_read_file(src, &size);
    assert_non_null(orig);
    model *m0 = load_ok(src);
    uint64_t end = m0->gguf->data_offset;
    model_free(m0);
    const char *path = tu_tmp_path("flip.gguf");
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(orig, 1, size, fp), size);
    fclose(fp);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    flip_count fc = {.path = path};
    tu_flip_each_byte(fd, orig, end, load_flipped, &fc);
    close(fd);
    print_message("model_load byte flips: bytes 0..%" PRIu64 " x {xor 0xff, = 0xff, = 0x00} = %ld corrupted loads: "
                  "%ld rejected with a message, %ld loaded consistently\n",
                  end, fc.tried, fc.tried - fc.loaded, fc.loaded);
    free(orig);
    unlink(path);
    unlink(src);
}

/* ---- weights repacked at load ------------------------------------------------------------- */

/* Every tensor op_weights_pack packed or copied holds what quant_pack (or a copy) makes of its
 * mapped GGUF rows; returns how many were checked. */
static int check_packed(const gguf_file *f)
{
    int n = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (!t->packed) continue;
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        size_t ps = quant_pack_size(t->type, t->ne[0], rows), rs = quant_row_size(t->type, t->ne[0]);
        if (ps) {
            uint8_t *want = malloc(ps);
            assert_non_null(want);
            quant_pack(t->type, t->ne[0], rows, t->data, rs, want);
            if (memcmp(want, t->packed, ps)) fail_msg("%s: packed panels differ from quant_pack of its rows", t->name);
            free(want);
        } else if (memcmp(t->data, t->packed, t->nbytes)) {
            fail_msg("%s: the copy differs from its rows", t->name);
        }
        n++;
    }
    return n;
}

/* op_weights_pack reads the rows with pread (or, KVCHAT_PACK_MMAP=1, from the mapping), after the
 * load or during it (KVCHAT_PACK_LATER=0): the arena is the same every way, for whole and partial
 * panels (1003 vocabulary rows), tensors cut into several work items (4096-row FFN matrices) and
 * matrices copied rather than packed. */
static void test_pack_pread(void **state)
{
    (void)state;
    static const char *const types[] = {"q4_0", "q8_0", "q4_k_m", "q5_k_m", "q6_k", "f16"};
    gen_model_opts o = {.n_layer = 1, .n_vocab = 1003, .n_ff = 4096, .seed = 5};
    const char *p = tu_tmp_path("pack.gguf");
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        kv_error err = {0};
        if (gen_model_write_ex(p, "tiny", types[i], &o, &err)) fail_msg("%s", err.msg);
        for (int mm = 0; mm < 4; mm++) { /* pread / mapping, after / during the load */
            if (mm & 1) setenv("KVCHAT_PACK_MMAP", "1", 1);
            if (mm & 2) setenv("KVCHAT_PACK_LATER", "0", 1);
            model *m = load_ok(p);
            unsetenv("KVCHAT_PACK_MMAP");
            unsetenv("KVCHAT_PACK_LATER");
            op_weights_settle(m->packed); /* moved onto huge pages where the kernel can: same bytes */
            int n = check_packed(m->gguf);
            /* the 256 x 4096 FFN matrices have panels at every level with a panel layout */
            const gguf_tensor *up = gguf_find_tensor(m->gguf, "blk.0.ffn_up.weight");
            if (up && quant_pack_size(up->type, up->ne[0], up->ne[1])) assert_true(n >= 3);
            model_free(m);
        }
    }
    /* the file replaced after it was mapped: the rows come from the mapping, not the new file */
    const char *q = tu_tmp_path("other.gguf");
    kv_error err = {0};
    if (gen_model_write_ex(p, "tiny", "q8_0", &o, &err)) fail_msg("%s", err.msg);
    o.seed = 6;
    if (gen_model_write_ex(q, "tiny", "q8_0", &o, &err)) fail_msg("%s", err.msg);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(p, &f, &err), KV_OK);
    assert_int_equal(rename(q, p), 0);
    void *arena = NULL;
    assert_int_equal(op_weights_pack(f, NULL, &arena, &err), KV_OK);
    op_weights_settle(arena);
    if (quant_pack_size(GGML_TYPE_Q8_0, 256, 8)) assert_true(check_packed(f) > 0);
    op_weights_free(f, arena);
    gguf_close(f);
    unlink(p);
}

/* Logits of the last of n_first prompt tokens and of one decoded token after them (8: the batch
 * GEMM then the single-token path; 1: the single-token path twice), 2 threads; out holds
 * 2 · n_vocab floats. */
static void logits_of(const model *m, int n_first, float *out)
{
    kv_error err = {0};
    tpool *pool = tpool_create(2);
    forward_ctx *fc = forward_ctx_create(m, 8, 32, &err);
    kv_cache_params kp = {.n_layer = m->hp.n_layer, .n_embd_kv = m->hp.n_embd_kv, .n_ctx = 32,
                          .type = GGML_TYPE_F16, .n_blocks = 32 / KV_BLOCK_SIZE + 2};
    kv_cache *kv = kv_cache_create_ex(&kp, &err);
    assert_non_null(pool);
    assert_non_null(fc);
    assert_non_null(kv);
    int32_t toks[9];
    for (int i = 0; i < 9; i++) toks[i] = 1 + (i * 37) % (m->hp.n_vocab - 1);
    if (model_forward_seq(m, fc, kv, KV_SEQ_DEFAULT, pool, toks, n_first, out, 0, &err) ||
        model_forward_seq(m, fc, kv, KV_SEQ_DEFAULT, pool, toks + n_first, 1, out + m->hp.n_vocab, 0, &err))
        fail_msg("%s", err.msg);
    kv_cache_free(kv);
    forward_ctx_free(fc);
    tpool_free(pool);
}

/* The packing and the plain copies (matrices of 2 MiB here) are done after the load by a thread
 * of their own, which waits for the first pass to end, or 100 ms when none begins. A model's first
 * pass reads the matrices not yet done in the mapping (a panel type's rows packed into scratch
 * panels for the same kernels): its logits equal bit for bit those of a model packed during the
 * load (KVCHAT_PACK_LATER=0), as a prompt (batch GEMM) and as a single token (GEMV), before the
 * packing and while it runs; the second pass settles first, so after it every matrix is packed or
 * copied, and equals quant_pack of its rows or the rows; a model freed while the packing runs
 * stops it (ASan: no leak, nothing used after it is freed). */
static void test_pack_later(void **state)
{
    (void)state;
    static const char *const types[] = {"f16", "q4_0", "q8_0", "q4_k_m", "q5_k_m", "q6_k"};
    gen_model_opts o = {.n_layer = 3, .n_vocab = 1003, .n_ff = 4096, .seed = 7};
    const char *p = tu_tmp_path("later.gguf");
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        kv_error err = {0};
        if (gen_model_write_ex(p, "tiny", types[ti], &o, &err)) fail_msg("%s", err.msg);
        setenv("KVCHAT_PACK_LATER", "0", 1);
        model *m0 = load_ok(p);
        unsetenv("KVCHAT_PACK_LATER");
        /* packed during the load: all there already (at least gate, up, down of 3 layers where the
         * level has panels for the type or the matrices are large enough to be copied) */
        int n0 = check_packed(m0->gguf);
        const gguf_tensor *up = gguf_find_tensor(m0->gguf, "blk.0.ffn_up.weight");
        assert_non_null(up);
        if (quant_pack_size(up->type, up->ne[0], up->ne[1]) || up->nbytes >= (1u << 20)) assert_true(n0 >= 9);
        const int nv = m0->hp.n_vocab;
        float *want = malloc(sizeof(float) * 4 * (size_t)nv), *got = malloc(sizeof(float) * 2 * (size_t)nv);
        assert_non_null(want);
        assert_non_null(got);
        logits_of(m0, 8, want);
        logits_of(m0, 1, want + 2 * nv);
        model_free(m0);
        for (int round = 0; round < 3; round++) {
            for (int k = 0; k < 3; k++) {
                model *m = load_ok(p);
                /* at once (the packing waits for the first pass to end), or when the packing has
                 * started on its own (100 ms without a pass) and is under way */
                if (k == 2) usleep(100000 + 1000 * (useconds_t)round);
                logits_of(m, k == 1 ? 1 : 8, got);
                if (memcmp(got, want + 2 * (k == 1) * nv, sizeof(float) * 2 * (size_t)nv))
                    fail_msg("%s round %d: logits of a %s first pass %s differ", types[ti], round,
                             k == 1 ? "1-token" : "8-token", k == 2 ? "during the packing" : "before it");
                assert_int_equal(check_packed(m->gguf), n0); /* the second pass settled */
                model_free(m);
            }
            model_free(load_ok(p)); /* freed while its packing runs */
        }
        /* stopped where it was (op_weights_stop, as engine_close does before its frees): what is
         * not packed stays read in the mapping, with the same logits pass after pass */
        model *m = load_ok(p);
        usleep(105000);
        op_weights_stop(m->packed);
        int np = check_packed(m->gguf);
        assert_true(np <= n0);
        for (int pass = 0; pass < 2; pass++) {
            logits_of(m, 8, got);
            if (memcmp(got, want, sizeof(float) * 2 * (size_t)nv))
                fail_msg("%s: logits of pass %d after op_weights_stop differ", types[ti], pass);
        }
        assert_int_equal(check_packed(m->gguf), np);
        model_free(m);
        free(want);
        free(got);
    }
    unlink(p);
}

/* KVCHAT_HUGEPAGES=after: packed during the load onto 4 KiB pages, then moved onto 2 MiB pages
 * by the later thread (MADV_COLLAPSE, where the kernel has it): after the settle every matrix is
 * there and equals quant_pack of its rows, the logits equal the default's bit for bit, and a model
 * freed while the collapse runs stops it. */
static void test_hugepages_after(void **state)
{
    (void)state;
    gen_model_opts o = {.n_layer = 2, .n_vocab = 1003, .n_ff = 4096, .seed = 9};
    const char *p = tu_tmp_path("after.gguf");
    kv_error err = {0};
    if (gen_model_write_ex(p, "tiny", "q4_k_m", &o, &err)) fail_msg("%s", err.msg);
    model *m0 = load_ok(p);
    op_weights_settle(m0->packed);
    int n0 = check_packed(m0->gguf);
    const int nv = m0->hp.n_vocab;
    float *want = malloc(sizeof(float) * 2 * (size_t)nv), *got = malloc(sizeof(float) * 2 * (size_t)nv);
    assert_non_null(want);
    assert_non_null(got);
    logits_of(m0, 8, want);
    model_free(m0);
    setenv("KVCHAT_HUGEPAGES", "after", 1);
    model *m = load_ok(p);
    assert_int_equal(check_packed(m->gguf), n0); /* packed during the load */
    logits_of(m, 8, got);
    if (memcmp(got, want, sizeof(float) * 2 * (size_t)nv)) fail_msg("logits with KVCHAT_HUGEPAGES=after differ");
    op_weights_settle(m->packed);
    assert_int_equal(check_packed(m->gguf), n0);
    model_free(m);
    m = load_ok(p);
    usleep(120000); /* the collapse has started on its own */
    model_free(m);
    unsetenv("KVCHAT_HUGEPAGES");
    free(want);
    free(got);
    unlink(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_defaults),
        cmocka_unit_test(test_valid_gqa_untied),
        cmocka_unit_test(test_valid_qwen2),
        cmocka_unit_test(test_real_models),
        cmocka_unit_test(test_unsupported_arch),
        cmocka_unit_test(test_arch_wrong_type),
        cmocka_unit_test(test_missing_keys),
        cmocka_unit_test(test_bad_hparams),
        cmocka_unit_test(test_absurd_block_count),
        cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_wrong_shape),
        cmocka_unit_test(test_wrong_shape_1d),
        cmocka_unit_test(test_unsupported_weight_type),
        cmocka_unit_test(test_non_finite_norm),
        cmocka_unit_test(test_q8_0_fixture),
        cmocka_unit_test(test_byte_flips),
        cmocka_unit_test(test_pack_pread),
        cmocka_unit_test(test_pack_later),
        cmocka_unit_test(test_hugepages_after),
    };
    return cmocka_run_group_tests(tests, group_setup, tu_tmpdir_teardown);
}
