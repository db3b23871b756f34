/* gguf_writer: encodes GGUF metadata and tensor tables (ggml docs/gguf.md) and streams tensor data to disk. */
#include "gguf_writer.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "kernels/quant.h"

#define DEFAULT_ALIGNMENT 32u
#define MAX_NAME_LEN 64       /* spec: tensor names are at most 64 bytes */
#define MAX_KEY_LEN 65535     /* spec: keys are at most 2^16 - 1 bytes */
#define CHUNK_BYTES (1u << 20) /* target size of one fill callback chunk */
#define MAX_RAW_DIMS 8

/* Growable byte buffer; `oom` latches an allocation failure. */
typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
    int oom;
} bytes;

static void put(bytes *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) { b->oom = 1; return; }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

/* Little-endian encoders, independent of the host byte order. */
static void put_le(bytes *b, uint64_t v, int n)
{
    uint8_t x[8];
    for (int i = 0; i < n; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, (size_t)n);
}
static void put_u32(bytes *b, uint32_t v) { put_le(b, v, 4); }
static void put_u64(bytes *b, uint64_t v) { put_le(b, v, 8); }
static void put_str(bytes *b, const char *s, uint64_t len)
{
    put_u64(b, len);
    put(b, s, (size_t)len);
}

typedef struct wkv {
    char *key;
    uint32_t type;
    bytes val;        /* encoded value, everything after the type field */
} wkv;

typedef struct wtensor {
    char *name;
    int type, n_dims;
    int64_t ne[4];
    uint64_t nbytes;  /* from type and ne */
    size_t row_size;
    const void *data;
    gguf_fill_fn fill;
    void *user;
    /* raw overrides of the tensor-table entry */
    int has_off, has_type, has_dims;
    uint64_t off;
    uint32_t otype, o_ndims;
    uint64_t o_ne[MAX_RAW_DIMS];
} wtensor;

struct gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    int checks;
    uint32_t version;
    char magic[4];
    int counts_override;
    uint64_t o_n_tensors, o_n_kv;
    int err_code;       /* first setter/adder error, KV_OK if none */
    char err_msg[400];  /* its message, without the path */
};

static int fail(gguf_writer *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(gguf_writer *w, int code, const char *fmt, ...)
{
    if (w->err_code == KV_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err_msg, sizeof w->err_msg, fmt, ap);
        va_end(ap);
        w->err_code = code;
    }
    return code;
}

gguf_writer *gguf_writer_create(void)
{
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->checks = 1;
    w->version = 3;
    memcpy(w->magic, "GGUF", 4);
    return w;
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val.p);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

void gguf_writer_set_checks(gguf_writer *w, int checks) { w->checks = checks != 0; }
void gguf_writer_set_version(gguf_writer *w, uint32_t version) { w->version = version; }
void gguf_writer_set_magic(gguf_writer *w, const char magic[4]) { memcpy(w->magic, magic, 4); }

void gguf_writer_override_counts(gguf_writer *w, uint64_t n_tensors, uint64_t n_kv)
{
    w->counts_override = 1;
    w->o_n_tensors = n_tensors;
    w->o_n_kv = n_kv;
}

/* ---- metadata --------------------------------------------------------------------------- */

static wkv *find_kv(gguf_writer *w, const char *key)
{
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return &w->kv[i];
    return NULL;
}

/* The slot for `key`: the existing one (checks on) emptied, or a new one at the end. */
static wkv *kv_slot(gguf_writer *w, const char *key, int append)
{
    if (!key || !*key || strlen(key) > MAX_KEY_LEN) {
        fail(w, KV_ERR_INVALID, "metadata key '%.64s' is empty or longer than %d bytes", key ? key : "", MAX_KEY_LEN);
        return NULL;
    }
    wkv *kv = (w->checks && !append) ? find_kv(w, key) : NULL;
    if (kv) {
        kv->val.n = 0;
        kv->val.oom = 0;
        return kv;
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *p = realloc(w->kv, cap * sizeof *p);
        if (!p) goto nomem;
        w->kv = p;
        w->cap_kv = cap;
    }
    kv = &w->kv[w->n_kv];
    memset(kv, 0, sizeof *kv);
    if (!(kv->key = strdup(key))) goto nomem;
    w->n_kv++;
    return kv;
nomem:
    fail(w, KV_ERR_NOMEM, "out of memory adding metadata '%.64s'", key);
    return NULL;
}

static int kv_done(gguf_writer *w, wkv *kv)
{
    if (kv->val.oom) return fail(w, KV_ERR_NOMEM, "out of memory encoding metadata '%.64s'", kv->key);
    return KV_OK;
}

static int set_scalar(gguf_writer *w, const char *key, uint32_t type, uint64_t bits, int n)
{
    wkv *kv = kv_slot(w, key, 0);
    if (!kv) return w->err_code;
    kv->type = type;
    put_le(&kv->val, bits, n);
    return kv_done(w, kv);
}

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static uint64_t f64_bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }

int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v) { return set_scalar(w, key, GGUF_VT_UINT8, v, 1); }
int gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v) { return set_scalar(w, key, GGUF_VT_INT8, (uint8_t)v, 1); }
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v) { return set_scalar(w, key, GGUF_VT_UINT16, v, 2); }
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v) { return set_scalar(w, key, GGUF_VT_INT16, (uint16_t)v, 2); }
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) { return set_scalar(w, key, GGUF_VT_UINT32, v, 4); }
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, GGUF_VT_INT32, (uint32_t)v, 4); }
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v) { return set_scalar(w, key, GGUF_VT_FLOAT32, f32_bits(v), 4); }
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, GGUF_VT_UINT64, v, 8); }
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v) { return set_scalar(w, key, GGUF_VT_INT64, (uint64_t)v, 8); }
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v) { return set_scalar(w, key, GGUF_VT_FLOAT64, f64_bits(v), 8); }
int gguf_writer_set_bool(gguf_writer *w, const char *key, int v) { return set_scalar(w, key, GGUF_VT_BOOL, v != 0, 1); }

int gguf_writer_set_str_n(gguf_writer *w, const char *key, const char *s, uint64_t len)
{
    if (!s && len) return fail(w, KV_ERR_INVALID, "metadata '%.64s': NULL string", key ? key : "");
    wkv *kv = kv_slot(w, key, 0);
    if (!kv) return w->err_code;
    kv->type = GGUF_VT_STRING;
    put_str(&kv->val, s, len);
    return kv_done(w, kv);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *s)
{
    if (!s) return fail(w, KV_ERR_INVALID, "metadata '%.64s': NULL string", key ? key : "");
    return gguf_writer_set_str_n(w, key, s, strlen(s));
}

/* Bytes of one scalar of a value type; 0 for STRING, ARRAY and unknown types. */
static int scalar_size(int type)
{
    switch (type) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n)
{
    int es = scalar_size(elem_type);
    if (!es)
        return fail(w, KV_ERR_INVALID, "metadata '%.64s': cannot write an array of %s with gguf_writer_set_arr",
                    key ? key : "", gguf_value_type_name(elem_type));
    if (!data && n) return fail(w, KV_ERR_INVALID, "metadata '%.64s': NULL array data", key ? key : "");
    if (n > SIZE_MAX / 8) return fail(w, KV_ERR_INVALID, "metadata '%.64s': array too long", key ? key : "");
    wkv *kv = kv_slot(w, key, 0);
    if (!kv) return w->err_code;
    kv->type = GGUF_VT_ARRAY;
    put_u32(&kv->val, (uint32_t)elem_type);
    put_u64(&kv->val, n);
    const uint8_t *p = data;
    for (uint64_t i = 0; i < n; i++, p += es) {
        uint64_t v = 0;
        switch (es) {
        case 1: v = p[0]; break;
        case 2: { uint16_t x; memcpy(&x, p, 2); v = x; break; }
        case 4: { uint32_t x; memcpy(&x, p, 4); v = x; break; }
        default: memcpy(&v, p, 8); break;
        }
        if (elem_type == GGUF_VT_BOOL) v = v != 0;
        put_le(&kv->val, v, es);
    }
    return kv_done(w, kv);
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n)
{
    if (!strs && n) return fail(w, KV_ERR_INVALID, "metadata '%.64s': NULL string array", key ? key : "");
    for (uint64_t i = 0; i < n; i++)
        if (!strs[i]) return fail(w, KV_ERR_INVALID, "metadata '%.64s': string %" PRIu64 " is NULL", key ? key : "", i);
    wkv *kv = kv_slot(w, key, 0);
    if (!kv) return w->err_code;
    kv->type = GGUF_VT_ARRAY;
    put_u32(&kv->val, GGUF_VT_STRING);
    put_u64(&kv->val, n);
    for (uint64_t i = 0; i < n; i++) put_str(&kv->val, strs[i], strlen(strs[i]));
    return kv_done(w, kv);
}

int gguf_writer_add_raw_kv(gguf_writer *w, const char *key, uint32_t type, const void *payload, size_t n)
{
    if (!payload && n) return fail(w, KV_ERR_INVALID, "metadata '%.64s': NULL payload", key ? key : "");
    wkv *kv = kv_slot(w, key, 1);
    if (!kv) return w->err_code;
    kv->type = type;
    put(&kv->val, payload, n);
    return kv_done(w, kv);
}

/* ---- tensors ---------------------------------------------------------------------------- */

static wtensor *find_tensor(gguf_writer *w, const char *name)
{
    for (size_t i = w->n_t; i-- > 0;)
        if (strcmp(w->t[i].name, name) == 0) return &w->t[i];
    return NULL;
}

static int add_tensor(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne, const void *data,
                      gguf_fill_fn fill, void *user)
{
    if (!name || !*name) return fail(w, KV_ERR_INVALID, "tensor with an empty name");
    if (w->checks && strlen(name) > MAX_NAME_LEN)
        return fail(w, KV_ERR_INVALID, "tensor '%.80s' has a name longer than %d bytes", name, MAX_NAME_LEN);
    if (w->checks && find_tensor(w, name)) return fail(w, KV_ERR_INVALID, "tensor '%.80s' added twice", name);
    if (n_dims < 1 || n_dims > 4 || !ne)
        return fail(w, KV_ERR_INVALID, "tensor '%.80s' has %d dimensions (1 to 4 allowed)", name, n_dims);
    const quant_traits *qt = quant_traits_of(type);
    if (!qt || qt->block_size <= 0 || qt->type_size == 0)
        return fail(w, KV_ERR_INVALID, "tensor '%.80s' has unknown type id %d", name, type);
    int64_t n_el = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0 || n_el > INT64_MAX / ne[d])
            return fail(w, KV_ERR_INVALID, "tensor '%.80s': dimension %d = %" PRId64 " is not positive or overflows",
                        name, d, ne[d]);
        n_el *= ne[d];
    }
    if (ne[0] % qt->block_size != 0)
        return fail(w, KV_ERR_INVALID, "tensor '%.80s': row of %" PRId64 " is not a multiple of %s's block size %" PRId64,
                    name, ne[0], qt->name, qt->block_size);
    uint64_t blocks_per_row = (uint64_t)(ne[0] / qt->block_size);
    if (blocks_per_row > (uint64_t)INT64_MAX / qt->type_size)
        return fail(w, KV_ERR_INVALID, "tensor '%.80s' is too large", name);
    uint64_t row_size = blocks_per_row * qt->type_size;
    uint64_t n_rows = (uint64_t)(n_el / ne[0]);
    if (n_rows > (uint64_t)INT64_MAX / row_size || row_size > SIZE_MAX)
        return fail(w, KV_ERR_INVALID, "tensor '%.80s' is too large", name);

    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 16;
        wtensor *p = realloc(w->t, cap * sizeof *p);
        if (!p) return fail(w, KV_ERR_NOMEM, "out of memory adding tensor '%.80s'", name);
        w->t = p;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return fail(w, KV_ERR_NOMEM, "out of memory adding tensor '%.80s'", name);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->row_size = (size_t)row_size;
    t->nbytes = n_rows * row_size;
    t->data = data;
    t->fill = fill;
    t->user = user;
    w->n_t++;
    return KV_OK;
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                           const void *data)
{
    return add_tensor(w, name, type, n_dims, ne, data, NULL, NULL);
}

int gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                                gguf_fill_fn fill, void *user)
{
    if (!fill) return fail(w, KV_ERR_INVALID, "tensor '%.80s': NULL fill callback", name ? name : "");
    return add_tensor(w, name, type, n_dims, ne, NULL, fill, user);
}

static wtensor *override_target(gguf_writer *w, const char *name)
{
    wtensor *t = name ? find_tensor(w, name) : NULL;
    if (!t) fail(w, KV_ERR_INVALID, "override of unknown tensor '%.80s'", name ? name : "");
    return t;
}

int gguf_writer_override_offset(gguf_writer *w, const char *name, uint64_t offset)
{
    wtensor *t = override_target(w, name);
    if (!t) return KV_ERR_INVALID;
    t->has_off = 1;
    t->off = offset;
    return KV_OK;
}

int gguf_writer_override_type(gguf_writer *w, const char *name, uint32_t type)
{
    wtensor *t = override_target(w, name);
    if (!t) return KV_ERR_INVALID;
    t->has_type = 1;
    t->otype = type;
    return KV_OK;
}

int gguf_writer_override_dims(gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *ne)
{
    wtensor *t = override_target(w, name);
    if (!t) return KV_ERR_INVALID;
    if (n_dims > MAX_RAW_DIMS || (n_dims && !ne))
        return fail(w, KV_ERR_INVALID, "tensor '%.80s': cannot override %" PRIu32 " dimensions", name, n_dims);
    t->has_dims = 1;
    t->o_ndims = n_dims;
    for (uint32_t d = 0; d < n_dims; d++) t->o_ne[d] = ne[d];
    return KV_OK;
}

/* ---- writing ---------------------------------------------------------------------------- */

/* The alignment to lay out the data with; KV_ERR_INVALID (checks on) when general.alignment
 * is unusable. */
static int pick_alignment(gguf_writer *w, uint64_t *align, kv_error *err, const char *path)
{
    *align = DEFAULT_ALIGNMENT;
    const wkv *kv = find_kv(w, "general.alignment");
    if (!kv) return KV_OK;
    uint32_t a = 0;
    int ok = kv->type == GGUF_VT_UINT32 && kv->val.n == 4;
    if (ok) {
        a = (uint32_t)kv->val.p[0] | (uint32_t)kv->val.p[1] << 8 | (uint32_t)kv->val.p[2] << 16 |
            (uint32_t)kv->val.p[3] << 24;
        ok = a != 0 && (a & (a - 1)) == 0;
    }
    if (w->checks && (!ok || a % 8 != 0))
        return kv_error_set(err, KV_ERR_INVALID,
                            "%s: general.alignment must be a uint32 power of two and a multiple of 8", path);
    if (ok) *align = a;
    return KV_OK;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int write_zeros(FILE *fp, uint64_t n)
{
    static const uint8_t zeros[4096];
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (fwrite(zeros, 1, k, fp) != k) return -1;
        n -= k;
    }
    return 0;
}

/* Streams one tensor's bytes: from memory, zeros, or its fill callback in chunks of rows.
 * Returns KV_OK, -1 when writing to the file failed (errno set), or an error code with `err`
 * filled. */
static int write_tensor_data(const wtensor *t, FILE *fp, uint8_t **chunk, size_t *chunk_cap, const char *path,
                             kv_error *err)
{
    if (t->data) {
        if (fwrite(t->data, 1, (size_t)t->nbytes, fp) != (size_t)t->nbytes) goto io;
        return KV_OK;
    }
    if (!t->fill) return write_zeros(fp, t->nbytes) ? -1 : KV_OK;
    int64_t n_rows_total = (int64_t)(t->nbytes / t->row_size);
    int64_t rows_per_chunk = (int64_t)(CHUNK_BYTES / t->row_size);
    if (rows_per_chunk < 1) rows_per_chunk = 1;
    size_t need = (size_t)rows_per_chunk * t->row_size;
    if (need > *chunk_cap) {
        uint8_t *p = realloc(*chunk, need);
        if (!p) return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory for a chunk of tensor '%s'", path, t->name);
        *chunk = p;
        *chunk_cap = need;
    }
    for (int64_t r = 0; r < n_rows_total; r += rows_per_chunk) {
        int64_t n = n_rows_total - r < rows_per_chunk ? n_rows_total - r : rows_per_chunk;
        gguf_writer_chunk c = {
            .name = t->name, .type = t->type, .n_dims = t->n_dims, .ne = t->ne,
            .row0 = r, .n_rows = n, .dst = *chunk, .nbytes = (size_t)n * t->row_size,
        };
        kv_error ferr = {0};
        int rc = t->fill(t->user, &c, &ferr);
        if (rc != KV_OK)
            return kv_error_set(err, rc, "%s: tensor '%s': %s", path, t->name,
                                ferr.msg[0] ? ferr.msg : "the fill callback failed");
        if (fwrite(*chunk, 1, c.nbytes, fp) != c.nbytes) goto io;
    }
    return KV_OK;
io:
    return -1;
}

/* Header, metadata and tensor table as bytes; tensor offsets from `align`. */
static int build_header(gguf_writer *w, uint64_t align, bytes *h, uint64_t *offsets)
{
    put(h, w->magic, 4);
    put_u32(h, w->version);
    put_u64(h, w->counts_override ? w->o_n_tensors : w->n_t);
    put_u64(h, w->counts_override ? w->o_n_kv : w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        put_str(h, kv->key, strlen(kv->key));
        put_u32(h, kv->type);
        put(h, kv->val.p, kv->val.n);
    }
    uint64_t pos = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        offsets[i] = align_up(pos, align);
        pos = offsets[i] + t->nbytes;
        put_str(h, t->name, strlen(t->name));
        if (t->has_dims) {
            put_u32(h, t->o_ndims);
            for (uint32_t d = 0; d < t->o_ndims; d++) put_u64(h, t->o_ne[d]);
        } else {
            put_u32(h, (uint32_t)t->n_dims);
            for (int d = 0; d < t->n_dims; d++) put_u64(h, (uint64_t)t->ne[d]);
        }
        put_u32(h, t->has_type ? t->otype : (uint32_t)t->type);
        put_u64(h, t->has_off ? t->off : offsets[i]);
    }
    return h->oom ? KV_ERR_NOMEM : KV_OK;
}

int gguf_writer_write(gguf_writer *w, const char *path, kv_error *err)
{
    if (w->err_code != KV_OK) return kv_error_set(err, w->err_code, "%s: %s", path, w->err_msg);
    uint64_t align;
    int rc = pick_alignment(w, &align, err, path);
    if (rc) return rc;

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    uint64_t *offsets = malloc((w->n_t ? w->n_t : 1) * sizeof *offsets);
    bytes h = {0};
    uint8_t *chunk = NULL;
    size_t chunk_cap = 0;
    FILE *fp = NULL;
    if (!tmp || !offsets) {
        rc = kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    if ((rc = build_header(w, align, &h, offsets))) {
        rc = kv_error_set(err, rc, "%s: out of memory building the header", path);
        goto done;
    }
    if (!(fp = fopen(tmp, "wb"))) {
        rc = kv_error_set(err, KV_ERR_IO, "%s: cannot create %s: %m", path, tmp);
        goto done;
    }
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    uint64_t data_start = align_up(h.n, align), pos = 0;
    if (fwrite(h.p, 1, h.n, fp) != h.n || write_zeros(fp, data_start - h.n)) goto io;
    for (size_t i = 0; i < w->n_t; i++) {
        if (write_zeros(fp, offsets[i] - pos)) goto io;
        rc = write_tensor_data(&w->t[i], fp, &chunk, &chunk_cap, path, err);
        if (rc < 0) goto io;
        if (rc) goto done;
        pos = offsets[i] + w->t[i].nbytes;
    }
    if (write_zeros(fp, align_up(pos, align) - pos)) goto io;
    FILE *f = fp;
    fp = NULL;
    if (fclose(f) != 0) goto io;
    if (rename(tmp, path) != 0) {
        rc = kv_error_set(err, KV_ERR_IO, "%s: cannot rename %s to it: %m", path, tmp);
        goto done;
    }
    rc = KV_OK;
    goto done;
io:
    rc = kv_error_set(err, KV_ERR_IO, "%s: write failed: %m", path);
done:
    if (fp) fclose(fp);
    if (rc != KV_OK && tmp) unlink(tmp);
    free(chunk);
    free(h.p);
    free(offsets);
    free(tmp);
    return rc;
}
