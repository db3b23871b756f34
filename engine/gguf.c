/* gguf: mmap a GGUF file, validate every length, type and offset, expose metadata and tensors. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/quant.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

/* Bounds-checked little-endian cursor over the mapping. */
typedef struct cursor {
    const gguf_file *f;
    uint64_t pos;
    kv_error *err;
    const char *what; /* what is being read, for messages */
} cursor;

static int need(cursor *c, uint64_t n)
{
    if (n > c->f->size || c->pos > c->f->size - n)
        return kv_error_set(c->err, KV_ERR_FORMAT,
                            "%s: truncated file: %s needs %" PRIu64 " bytes at offset %" PRIu64
                            " but the file has %" PRIu64,
                            c->f->path, c->what, n, c->pos, c->f->size);
    return KV_OK;
}

static int rd(cursor *c, void *dst, uint64_t n)
{
    int rc = need(c, n);
    if (rc) return rc;
    memcpy(dst, c->f->map + c->pos, n);
    c->pos += n;
    return KV_OK;
}

static int rd_str(cursor *c, gguf_str *s)
{
    uint64_t len;
    int rc = rd(c, &len, 8);
    if (rc) return rc;
    if (len > c->f->size - c->pos)
        return kv_error_set(c->err, KV_ERR_FORMAT,
                            "%s: %s: string length %" PRIu64 " at offset %" PRIu64
                            " runs past the end of the file (%" PRIu64 " bytes)",
                            c->f->path, c->what, len, c->pos - 8, c->f->size);
    s->ptr = (const char *)c->f->map + c->pos;
    s->len = len;
    c->pos += len;
    return KV_OK;
}

static const uint8_t value_size[GGUF_VT_COUNT] = {
    [GGUF_VT_UINT8] = 1, [GGUF_VT_INT8] = 1, [GGUF_VT_UINT16] = 2, [GGUF_VT_INT16] = 2,
    [GGUF_VT_UINT32] = 4, [GGUF_VT_INT32] = 4, [GGUF_VT_FLOAT32] = 4, [GGUF_VT_BOOL] = 1,
    [GGUF_VT_STRING] = 0, [GGUF_VT_ARRAY] = 0, [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8,
    [GGUF_VT_FLOAT64] = 8,
};

const char *gguf_value_type_name(int type)
{
    static const char *names[GGUF_VT_COUNT] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
        "string", "array", "uint64", "int64", "float64",
    };
    return (type >= 0 && type < GGUF_VT_COUNT) ? names[type] : "unknown";
}

/* Print a key for messages: at most 200 bytes, non-printable bytes as '?'. */
static const char *key_for_msg(const gguf_str *k, char buf[256])
{
    size_t n = k->len < 200 ? (size_t)k->len : 200, i;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)k->ptr[i];
        buf[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    buf[i] = 0;
    if (k->len > 200) strcat(buf, "...");
    return buf;
}

static int read_kv(cursor *c, gguf_kv *kv, uint64_t index)
{
    char kb[256];
    int rc;
    uint32_t t;
    char what[320];

    snprintf(what, sizeof what, "metadata key #%" PRIu64, index);
    c->what = what;
    if ((rc = rd_str(c, &kv->key))) return rc;
    key_for_msg(&kv->key, kb);
    snprintf(what, sizeof what, "metadata '%s'", kb);
    if (kv->key.len == 0)
        return kv_error_set(c->err, KV_ERR_FORMAT, "%s: metadata key #%" PRIu64 " is empty",
                            c->f->path, index);
    if ((rc = rd(c, &t, 4))) return rc;
    if (t >= GGUF_VT_COUNT)
        return kv_error_set(c->err, KV_ERR_FORMAT, "%s: metadata '%s' has unknown value type %" PRIu32,
                            c->f->path, kb, t);
    kv->type = (int)t;
    kv->data = c->f->map + c->pos;
    if (t == GGUF_VT_STRING) {
        gguf_str s;
        kv->data = c->f->map + c->pos;
        return rd_str(c, &s);
    }
    if (t != GGUF_VT_ARRAY) {
        if ((rc = need(c, value_size[t]))) return rc;
        c->pos += value_size[t];
        return KV_OK;
    }

    uint32_t et;
    if ((rc = rd(c, &et, 4)) || (rc = rd(c, &kv->arr_len, 8))) return rc;
    if (et >= GGUF_VT_COUNT)
        return kv_error_set(c->err, KV_ERR_FORMAT, "%s: metadata '%s' is an array of unknown type %" PRIu32,
                            c->f->path, kb, et);
    if (et == GGUF_VT_ARRAY)
        return kv_error_set(c->err, KV_ERR_FORMAT, "%s: metadata '%s' is a nested array (not supported)",
                            c->f->path, kb);
    kv->arr_type = (int)et;
    kv->data = c->f->map + c->pos;
    if (et != GGUF_VT_STRING) {
        uint64_t esz = value_size[et];
        if (kv->arr_len > (c->f->size - c->pos) / esz)
            return kv_error_set(c->err, KV_ERR_FORMAT,
                                "%s: metadata '%s': array of %" PRIu64 " %s runs past the end of the file",
                                c->f->path, kb, kv->arr_len, gguf_value_type_name((int)et));
        c->pos += kv->arr_len * esz;
        return KV_OK;
    }
    /* Each string needs at least its 8-byte length. */
    if (kv->arr_len > (c->f->size - c->pos) / 8)
        return kv_error_set(c->err, KV_ERR_FORMAT,
                            "%s: metadata '%s': array of %" PRIu64 " strings runs past the end of the file",
                            c->f->path, kb, kv->arr_len);
    gguf_str *strs = malloc((size_t)(kv->arr_len ? kv->arr_len : 1) * sizeof *strs);
    if (!strs)
        return kv_error_set(c->err, KV_ERR_NOMEM, "%s: out of memory reading '%s'", c->f->path, kb);
    kv->arr_strs = strs;
    for (uint64_t i = 0; i < kv->arr_len; i++)
        if ((rc = rd_str(c, &strs[i]))) return rc;
    return KV_OK;
}

static int read_tensor(cursor *c, gguf_tensor *t, uint64_t index)
{
    gguf_str name;
    char what[320], nb[256];
    int rc;
    uint32_t n_dims, type;

    snprintf(what, sizeof what, "tensor info #%" PRIu64, index);
    c->what = what;
    if ((rc = rd_str(c, &name))) return rc;
    key_for_msg(&name, nb);
    snprintf(what, sizeof what, "tensor '%s'", nb);
    if (name.len == 0 || name.len > 255 || memchr(name.ptr, 0, name.len))
        return kv_error_set(c->err, KV_ERR_FORMAT, "%s: tensor #%" PRIu64 " has an invalid name '%s'",
                            c->f->path, index, nb);
    if (!(t->name = strndup(name.ptr, name.len)))
        return kv_error_set(c->err, KV_ERR_NOMEM, "%s: out of memory", c->f->path);
    if ((rc = rd(c, &n_dims, 4))) return rc;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return kv_error_set(c->err, KV_ERR_FORMAT, "%s: tensor '%s' has %" PRIu32 " dimensions (1 to 4 allowed)",
                            c->f->path, t->name, n_dims);
    t->n_dims = n_dims;
    uint64_t n_el = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if ((rc = rd(c, &ne, 8))) return rc;
        if (ne == 0 || ne > (uint64_t)INT64_MAX || n_el > (uint64_t)INT64_MAX / ne)
            return kv_error_set(c->err, KV_ERR_FORMAT,
                                "%s: tensor '%s' has invalid dimension %" PRIu32 " = %" PRIu64
                                " (zero, or the element count overflows)",
                                c->f->path, t->name, d, ne);
        t->ne[d] = (int64_t)ne;
        n_el *= ne;
    }
    t->n_elements = (int64_t)n_el;
    if ((rc = rd(c, &type, 4)) || (rc = rd(c, &t->offset, 8))) return rc;
    const quant_traits *qt = quant_traits_of((int)type);
    if (!qt)
        return kv_error_set(c->err, KV_ERR_FORMAT, "%s: tensor '%s' has unknown type id %" PRIu32,
                            c->f->path, t->name, type);
    t->type = (int)type;
    if (qt->block_size <= 0 || qt->type_size == 0)
        return kv_error_set(c->err, KV_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which GGUF files no longer use",
                            c->f->path, t->name, qt->name);
    if (t->ne[0] % qt->block_size != 0)
        return kv_error_set(c->err, KV_ERR_FORMAT,
                            "%s: tensor '%s' has rows of %" PRId64 " elements, not a multiple of %s's block size %" PRId64,
                            c->f->path, t->name, t->ne[0], qt->name, qt->block_size);
    uint64_t n_blocks = n_el / (uint64_t)qt->block_size;
    if (n_blocks > UINT64_MAX / qt->type_size)
        return kv_error_set(c->err, KV_ERR_FORMAT, "%s: tensor '%s' size overflows", c->f->path, t->name);
    t->nbytes = n_blocks * qt->type_size;
    return KV_OK;
}

static int find_key_n(const gguf_file *f, const char *key, size_t kl, uint64_t upto)
{
    for (uint64_t i = 0; i < upto; i++)
        if (f->kv[i].key.len == kl && memcmp(f->kv[i].key.ptr, key, kl) == 0) return (int)i;
    return -1;
}

static int find_key(const gguf_file *f, const char *key, uint64_t upto)
{
    return find_key_n(f, key, strlen(key), upto);
}

/* Open-addressing hash set of entry indices (slot = index + 1, 0 = empty), so duplicate keys
 * and tensor names are found in O(1) each instead of by comparing every pair. */
typedef struct name_set {
    uint64_t *slot;
    uint64_t mask;
} name_set;

static int name_set_init(name_set *s, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    s->mask = cap - 1;
    s->slot = calloc((size_t)cap, sizeof *s->slot);
    return s->slot ? 0 : -1;
}

static uint64_t hash_bytes(const char *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

/* The slot holding (p, n) or the empty slot where it belongs; name_of(i) gives entry i's name. */
static uint64_t *name_set_lookup(const name_set *s, const char *p, uint64_t n, const gguf_file *f,
                                 gguf_str (*name_of)(const gguf_file *, uint64_t))
{
    for (uint64_t h = hash_bytes(p, n);; h++) {
        uint64_t *sl = &s->slot[h & s->mask];
        if (!*sl) return sl;
        gguf_str o = name_of(f, *sl - 1);
        if (o.len == n && memcmp(o.ptr, p, (size_t)n) == 0) return sl;
    }
}

static gguf_str kv_name(const gguf_file *f, uint64_t i) { return f->kv[i].key; }
static gguf_str tensor_name(const gguf_file *f, uint64_t i)
{
    gguf_str s = {f->tensors[i].name, strlen(f->tensors[i].name)};
    return s;
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The file mapped read-only at an address aligned to 2 MiB, with MADV_HUGEPAGE: where the page
 * cache holds a file in 2 MiB folios (ext4 / XFS on recent kernels) the mapping then takes them
 * as 2 MiB pages — far fewer page faults on the first pass over weights read in place, and fewer
 * TLB misses after. Elsewhere the advice changes nothing. MAP_FAILED as mmap. */
static void *map_file(int fd, size_t size)
{
    const size_t huge = (size_t)2 << 20;
    uint8_t *r = size > huge ? mmap(NULL, size + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (r == MAP_FAILED) return mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    uint8_t *a = (uint8_t *)(((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1));
    void *m = mmap(a, size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    if (m == MAP_FAILED) {
        munmap(r, size + huge);
        return mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    }
    /* the reservation's slack before and after the mapping */
    if (a > r) munmap(r, (size_t)(a - r));
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *t = (uint8_t *)(((uintptr_t)(a + size) + page - 1) & ~(uintptr_t)(page - 1));
    if (t < r + size + huge) munmap(t, (size_t)(r + size + huge - t));
    madvise(m, size, MADV_HUGEPAGE);
    return m;
}

/* Two tensors whose byte ranges [offset, offset + nbytes) share a byte: the file lies about
 * one of them (writing one would change the other). O(n log n) by sorting on the offset. */
static int check_overlaps(const gguf_file *f, kv_error *err)
{
    if (f->n_tensors < 2) return KV_OK;
    const gguf_tensor **by_off = malloc((size_t)f->n_tensors * sizeof *by_off);
    if (!by_off) return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", f->path);
    for (uint64_t i = 0; i < f->n_tensors; i++) by_off[i] = &f->tensors[i];
    qsort(by_off, (size_t)f->n_tensors, sizeof *by_off, cmp_tensor_offset);
    int rc = KV_OK;
    const gguf_tensor *prev = NULL;
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++) {
        const gguf_tensor *t = by_off[i];
        if (t->nbytes == 0) continue;
        if (prev && t->offset < prev->offset + prev->nbytes)
            rc = kv_error_set(err, KV_ERR_FORMAT,
                              "%s: tensor '%s' (data bytes %" PRIu64 "..%" PRIu64 ") overlaps tensor '%s' (bytes %" PRIu64
                              "..%" PRIu64 ")",
                              f->path, t->name, t->offset, t->offset + t->nbytes, prev->name, prev->offset,
                              prev->offset + prev->nbytes);
        if (!prev || t->offset + t->nbytes > prev->offset + prev->nbytes) prev = t;
    }
    free(by_off);
    return rc;
}

int gguf_open(const char *path, gguf_file **out, kv_error *err)
{
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
    }
    int rc = KV_OK;
    name_set names = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = kv_error_set(err, KV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = kv_error_set(err, KV_ERR_IO, "%s: not a regular file", path);
        close(fd);
        goto fail;
    }
    f->size = (uint64_t)st.st_size;
    f->dev = (uint64_t)st.st_dev;
    f->ino = (uint64_t)st.st_ino;
    if (f->size < 8) {
        rc = kv_error_set(err, KV_ERR_FORMAT, "%s: file is %" PRIu64 " bytes, too short for a GGUF header",
                          path, f->size);
        close(fd);
        goto fail;
    }
    void *m = map_file(fd, (size_t)f->size);
    close(fd);
    if (m == MAP_FAILED) {
        rc = kv_error_set(err, KV_ERR_IO, "%s: cannot mmap: %s", path, strerror(errno));
        goto fail;
    }
    f->map = m;

    cursor c = {.f = f, .pos = 0, .err = err, .what = "header"};
    if (memcmp(f->map, "GGUF", 4) != 0) {
        rc = kv_error_set(err, KV_ERR_FORMAT, "%s: not a GGUF file (magic is %02x %02x %02x %02x, expected \"GGUF\")",
                          path, f->map[0], f->map[1], f->map[2], f->map[3]);
        goto fail;
    }
    c.pos = 4;
    if ((rc = rd(&c, &f->version, 4))) goto fail;
    if (f->version == 1) {
        rc = kv_error_set(err, KV_ERR_UNSUPPORTED,
                          "%s: GGUF version 1 is not supported (re-convert the model with a current converter)", path);
        goto fail;
    }
    {
        uint32_t v = f->version, swapped = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
        if (swapped >= 1 && swapped <= 3) {
            rc = kv_error_set(err, KV_ERR_UNSUPPORTED,
                              "%s: a big-endian GGUF file (version %" PRIu32 " in big-endian byte order); kvchat reads "
                              "little-endian GGUF files only (convert it on a little-endian machine, or byte-swap it)",
                              path, swapped);
            goto fail;
        }
    }
    if (f->version != 2 && f->version != 3) {
        rc = kv_error_set(err, KV_ERR_UNSUPPORTED, "%s: GGUF version %" PRIu32 " is not supported (2 and 3 are)",
                          path, f->version);
        goto fail;
    }
    if ((rc = rd(&c, &f->n_tensors, 8)) || (rc = rd(&c, &f->n_kv, 8))) goto fail;
    /* A key/value takes at least 13 bytes and a tensor info at least 29: reject absurd counts
     * before allocating. */
    if (f->n_kv > f->size / 13 || f->n_tensors > f->size / 29) {
        rc = kv_error_set(err, KV_ERR_FORMAT,
                          "%s: header claims %" PRIu64 " metadata keys and %" PRIu64
                          " tensors, more than a %" PRIu64 "-byte file can hold",
                          path, f->n_kv, f->n_tensors, f->size);
        goto fail;
    }
    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) {
        rc = kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    uint64_t n_kv_header = f->n_kv, n_kept = 0;
    if (name_set_init(&names, n_kv_header > f->n_tensors ? n_kv_header : f->n_tensors)) {
        rc = kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (uint64_t i = 0; i < n_kv_header; i++) {
        gguf_kv *kv = &f->kv[n_kept];
        memset(kv, 0, sizeof *kv);
        f->n_kv = n_kept + 1; /* so gguf_close frees what read_kv allocated */
        if ((rc = read_kv(&c, kv, i))) goto fail;
        kv->value_bytes = c.pos - (uint64_t)(kv->data - f->map);
        uint64_t *sl = name_set_lookup(&names, kv->key.ptr, kv->key.len, f, kv_name);
        if (*sl) {
            const gguf_kv *d = &f->kv[*sl - 1];
            char kb[256];
            if (d->type != kv->type || d->arr_type != kv->arr_type || d->value_bytes != kv->value_bytes ||
                memcmp(d->data, kv->data, (size_t)kv->value_bytes) != 0) {
                rc = kv_error_set(err, KV_ERR_FORMAT, "%s: metadata key '%s' appears twice with different values",
                                  path, key_for_msg(&kv->key, kb));
                goto fail;
            }
            free((void *)kv->arr_strs); /* identical repeat: keep the first */
            continue;
        }
        *sl = n_kept + 1;
        n_kept++;
    }
    f->n_kv = n_kept;

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = gguf_find_kv(f, "general.alignment");
    if (al) {
        uint32_t a;
        if (al->type != GGUF_VT_UINT32) {
            rc = kv_error_set(err, KV_ERR_FORMAT, "%s: metadata 'general.alignment' has type %s, expected uint32",
                              path, gguf_value_type_name(al->type));
            goto fail;
        }
        memcpy(&a, al->data, 4);
        if (a == 0 || (a & (a - 1)) != 0) {
            rc = kv_error_set(err, KV_ERR_FORMAT, "%s: general.alignment = %" PRIu32 " is not a power of two",
                              path, a);
            goto fail;
        }
        f->alignment = a;
    }

    memset(names.slot, 0, (size_t)(names.mask + 1) * sizeof *names.slot); /* now for tensor names */
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        if ((rc = read_tensor(&c, &f->tensors[i], i))) goto fail;
        const char *nm = f->tensors[i].name;
        uint64_t *sl = name_set_lookup(&names, nm, strlen(nm), f, tensor_name);
        if (*sl) {
            rc = kv_error_set(err, KV_ERR_FORMAT, "%s: tensor '%s' appears twice", path, nm);
            goto fail;
        }
        *sl = i + 1;
    }
    free(names.slot);
    names.slot = NULL;
    f->data_offset = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
    if (f->n_tensors > 0 && f->data_offset > f->size) {
        rc = kv_error_set(err, KV_ERR_FORMAT, "%s: truncated file: the tensor data section would start at %" PRIu64
                          " but the file has %" PRIu64 " bytes", path, f->data_offset, f->size);
        goto fail;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment != 0) {
            rc = kv_error_set(err, KV_ERR_FORMAT, "%s: tensor '%s' offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                              path, t->name, t->offset, f->alignment);
            goto fail;
        }
        uint64_t avail = f->size - f->data_offset;
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            rc = kv_error_set(err, KV_ERR_FORMAT,
                              "%s: tensor '%s' ends past the end of the file (offset %" PRIu64 " + %" PRIu64
                              " > %" PRIu64 ")",
                              path, t->name, f->data_offset + t->offset, t->nbytes, f->size);
            goto fail;
        }
        t->data = f->map + f->data_offset + t->offset;
    }
    if ((rc = check_overlaps(f, err))) goto fail;
    *out = f;
    return KV_OK;

fail:
    free(names.slot);
    gguf_close(f);
    return rc ? rc : KV_ERR_FORMAT;
}

void gguf_close(gguf_file *f)
{
    if (!f) return;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) free((void *)f->kv[i].arr_strs);
    if (f->tensors)
        for (uint64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    if (f->map) munmap((void *)f->map, (size_t)f->size);
    free(f->path);
    free(f);
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key)
{
    int i = find_key(f, key, f->n_kv);
    return i < 0 ? NULL : &f->kv[i];
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static int lookup(const gguf_file *f, const char *key, int required, const gguf_kv **kv, kv_error *err)
{
    *kv = gguf_find_kv(f, key);
    if (!*kv && required)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: missing required metadata key '%s'", f->path, key);
    return KV_OK;
}

static int wrong_type(const gguf_file *f, const char *key, const gguf_kv *kv, const char *want, kv_error *err)
{
    return kv_error_set(err, KV_ERR_FORMAT, "%s: metadata '%s' has type %s, expected %s", f->path, key,
                        gguf_value_type_name(kv->type), want);
}

/* Reads any integer scalar as int64; 0 on success, 1 if the stored value exceeds int64. */
static int int_value(const gguf_kv *kv, int64_t *v, int *is_int)
{
    const uint8_t *p = kv->data;
    *is_int = 1;
    switch (kv->type) {
    case GGUF_VT_UINT8: *v = p[0]; return 0;
    case GGUF_VT_INT8: *v = (int8_t)p[0]; return 0;
    case GGUF_VT_UINT16: { uint16_t x; memcpy(&x, p, 2); *v = x; return 0; }
    case GGUF_VT_INT16: { int16_t x; memcpy(&x, p, 2); *v = x; return 0; }
    case GGUF_VT_UINT32: { uint32_t x; memcpy(&x, p, 4); *v = x; return 0; }
    case GGUF_VT_INT32: { int32_t x; memcpy(&x, p, 4); *v = x; return 0; }
    case GGUF_VT_INT64: { int64_t x; memcpy(&x, p, 8); *v = x; return 0; }
    case GGUF_VT_UINT64: { uint64_t x; memcpy(&x, p, 8); if (x > INT64_MAX) return 1; *v = (int64_t)x; return 0; }
    default: *is_int = 0; return 1;
    }
}

int gguf_get_i64(const gguf_file *f, const char *key, int required, int64_t *out, kv_error *err)
{
    const gguf_kv *kv;
    int rc = lookup(f, key, required, &kv, err), is_int;
    if (rc || !kv) return rc;
    int64_t v;
    if (int_value(kv, &v, &is_int)) {
        if (!is_int) return wrong_type(f, key, kv, "an integer", err);
        return kv_error_set(err, KV_ERR_FORMAT, "%s: metadata '%s' is out of range", f->path, key);
    }
    *out = v;
    return KV_OK;
}

int gguf_get_u32(const gguf_file *f, const char *key, int required, uint32_t *out, kv_error *err)
{
    int64_t v = 0;
    const gguf_kv *kv = gguf_find_kv(f, key);
    int rc = gguf_get_i64(f, key, required, &v, err);
    if (rc || !kv) return rc;
    if (v < 0 || v > UINT32_MAX)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: metadata '%s' = %" PRId64 " is out of range", f->path, key, v);
    *out = (uint32_t)v;
    return KV_OK;
}

int gguf_get_f32(const gguf_file *f, const char *key, int required, float *out, kv_error *err)
{
    const gguf_kv *kv;
    int rc = lookup(f, key, required, &kv, err);
    if (rc || !kv) return rc;
    if (kv->type == GGUF_VT_FLOAT32) {
        memcpy(out, kv->data, 4);
    } else if (kv->type == GGUF_VT_FLOAT64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
    } else {
        return wrong_type(f, key, kv, "float32", err);
    }
    return KV_OK;
}

int gguf_get_bool(const gguf_file *f, const char *key, int required, int *out, kv_error *err)
{
    const gguf_kv *kv;
    int rc = lookup(f, key, required, &kv, err);
    if (rc || !kv) return rc;
    if (kv->type != GGUF_VT_BOOL) return wrong_type(f, key, kv, "bool", err);
    *out = kv->data[0] != 0;
    return KV_OK;
}

int gguf_get_str(const gguf_file *f, const char *key, int required, char **out, kv_error *err)
{
    const gguf_kv *kv;
    int rc = lookup(f, key, required, &kv, err);
    if (rc || !kv) return rc;
    if (kv->type != GGUF_VT_STRING) return wrong_type(f, key, kv, "string", err);
    uint64_t len;
    memcpy(&len, kv->data, 8);
    char *s = malloc((size_t)len + 1);
    if (!s) return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory reading '%s'", f->path, key);
    memcpy(s, kv->data + 8, (size_t)len);
    s[len] = 0;
    *out = s;
    return KV_OK;
}

int gguf_get_arr(const gguf_file *f, const char *key, int elem_type, int64_t expect_len,
                 const gguf_kv **out, kv_error *err)
{
    const gguf_kv *kv;
    *out = NULL;
    int rc = lookup(f, key, 1, &kv, err);
    if (rc) return rc;
    if (kv->type != GGUF_VT_ARRAY || kv->arr_type != elem_type) {
        char want[64];
        snprintf(want, sizeof want, "an array of %s", gguf_value_type_name(elem_type));
        if (kv->type == GGUF_VT_ARRAY)
            return kv_error_set(err, KV_ERR_FORMAT, "%s: metadata '%s' is an array of %s, expected %s", f->path,
                                key, gguf_value_type_name(kv->arr_type), want);
        return wrong_type(f, key, kv, want, err);
    }
    if (expect_len >= 0 && kv->arr_len != (uint64_t)expect_len)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: metadata '%s' has %" PRIu64 " entries, expected %" PRId64,
                            f->path, key, kv->arr_len, expect_len);
    *out = kv;
    return KV_OK;
}
