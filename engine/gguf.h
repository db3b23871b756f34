/* gguf: read-only, validated view of a GGUF model file (mmap'd), its metadata and tensor table. */
#ifndef KV_GGUF_H
#define KV_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "kv_error.h"

/* Metadata value types, numbered as in the GGUF specification (ggml docs/gguf.md). */
enum gguf_value_type {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
    GGUF_VT_COUNT
};

/* A string inside the mapped file: not NUL-terminated, may contain any bytes. */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

/* One metadata key/value. For arrays, `arr_type`/`arr_len` describe the elements and `data`
 * points at the first element in the file (strings are laid out as u64 length + bytes; use
 * gguf_arr_str() to walk them). For scalars, `data` points at the value (little-endian). */
typedef struct gguf_kv {
    gguf_str key;
    int type;                 /* enum gguf_value_type */
    int arr_type;             /* element type when type == GGUF_VT_ARRAY */
    uint64_t arr_len;
    const uint8_t *data;
    const gguf_str *arr_strs; /* for string arrays: arr_len decoded strings, else NULL */
    uint64_t value_bytes;     /* encoded size of the value from `data` on */
} gguf_kv;

/* One tensor of the tensor table; ne[0] is the row length (innermost dimension). */
typedef struct gguf_tensor {
    char *name;               /* NUL-terminated copy */
    uint32_t n_dims;          /* 1..4 */
    int64_t ne[4];            /* dimensions, unused ones are 1 */
    int type;                 /* enum ggml_type (engine/quant.h) */
    uint64_t offset;          /* from the start of the data section */
    const void *data;         /* inside the mapping */
    uint64_t nbytes;
    int64_t n_elements;
    const void *packed;       /* the weights repacked for the matmul kernels (op_weights_pack), or NULL */
} gguf_tensor;

typedef struct gguf_file {
    char *path;
    const uint8_t *map;       /* whole file, read-only */
    uint64_t size;
    uint64_t dev, ino;        /* the file's st_dev / st_ino (op_weights_pack reads it again by path) */
    uint32_t version;         /* 2 or 3 */
    uint64_t alignment;       /* general.alignment, default 32 */
    uint64_t data_offset;     /* start of the tensor data section */
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
} gguf_file;

/* Open and validate a GGUF file (versions 2 and 3). Checks, before anything is used: magic,
 * version (1 → "GGUF version 1 is not supported"; a byte-swapped version field → "a big-endian
 * GGUF file", KV_ERR_UNSUPPORTED), every string/array length within the
 * file, value types known, tensor dims 1..4 with positive sizes and no overflow in their
 * product, tensor types known to GGML, row lengths a multiple of the type's block size,
 * offsets aligned and offset + size within the file, no two tensors' data ranges overlapping, unique tensor names and keys (a key
 * repeated with a byte-identical value, as some old converters wrote, is kept once).
 * Errors: KV_ERR_IO (cannot open/map), KV_ERR_FORMAT (corrupt/truncated), KV_ERR_UNSUPPORTED
 * (version); every message starts with the path and names the key or tensor.
 * Source: GGUF specification, ggml/docs/gguf.md. Returns KV_OK and *out on success. */
int gguf_open(const char *path, gguf_file **out, kv_error *err);
void gguf_close(gguf_file *f);

/* Lookup by exact key / tensor name; NULL if absent. */
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: KV_OK, or KV_ERR_FORMAT naming file + key when present with another type,
 * or KV_ERR_FORMAT "missing required key" when absent and `required`; when absent and not
 * required they leave *out untouched (so callers pre-set the default) and return KV_OK.
 * Integer getters accept any integer type whose value fits. */
int gguf_get_u32(const gguf_file *f, const char *key, int required, uint32_t *out, kv_error *err);
int gguf_get_i64(const gguf_file *f, const char *key, int required, int64_t *out, kv_error *err);
int gguf_get_f32(const gguf_file *f, const char *key, int required, float *out, kv_error *err);
int gguf_get_bool(const gguf_file *f, const char *key, int required, int *out, kv_error *err);
/* String value as a fresh NUL-terminated malloc'd copy (caller frees); *out stays NULL when
 * absent and not required. */
int gguf_get_str(const gguf_file *f, const char *key, int required, char **out, kv_error *err);
/* Array of elem_type (strings: use kv->arr_strs). Checks type and, if expect_len >= 0, length. */
int gguf_get_arr(const gguf_file *f, const char *key, int elem_type, int64_t expect_len,
                 const gguf_kv **out, kv_error *err);

/* Name of a value type ("uint32", "string" …) for messages. */
const char *gguf_value_type_name(int type);

#endif
