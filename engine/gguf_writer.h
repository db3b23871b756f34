/* gguf_writer: builds GGUF v3 files (metadata, tensor table, streamed tensor data), plus raw overrides for corrupt test files. */
#ifndef KV_GGUF_WRITER_H
#define KV_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "kv_error.h"

/* Layout written (GGUF specification, ggml docs/gguf.md), header fields little-endian:
 *   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
 *   kv_count × { string key | u32 value_type | value }
 *   tensor_count × { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
 *   zero padding to general.alignment (default 32)
 *   tensor data: each tensor at its offset (a multiple of the alignment, relative to the start
 *   of the data section), in the order added, each followed by zero padding to the alignment.
 * A string is u64 length + bytes (no NUL); an array is u32 element type + u64 count + elements.
 *
 * Usage: create, set metadata, add tensors, gguf_writer_write() once (it may be called again;
 * every call writes the same file), free. Setters and adders return KV_OK or an error code;
 * the first error is also remembered and returned again by gguf_writer_write(), so a caller
 * may check only that. Value types and ggml types are the numbers of engine/gguf.h
 * (enum gguf_value_type) and engine/quant.h (enum ggml_type). */
typedef struct gguf_writer gguf_writer;

/* A new empty writer (version 3, checks on); NULL when out of memory. */
gguf_writer *gguf_writer_create(void);
/* Frees the writer and its copies of keys, values and names (never tensor data). NULL is fine. */
void gguf_writer_free(gguf_writer *w);

/* ---- metadata --------------------------------------------------------------------------------
 * Each setter copies key and value. Setting a key that already exists replaces its value in
 * place (keeps its position); with checks off (gguf_writer_set_checks) it appends a duplicate.
 * Errors: KV_ERR_INVALID for an empty key or one longer than 65535 bytes, KV_ERR_NOMEM. */
int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, int v); /* written as one byte 0 / 1 */
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *s);
/* A string of `len` arbitrary bytes (may contain NUL). */
int gguf_writer_set_str_n(gguf_writer *w, const char *key, const char *s, uint64_t len);
/* Array of n scalars of elem_type (any type but STRING and ARRAY), read from `data` laid out
 * as a C array of that type (uint8_t … double; bool as one byte each). Nested arrays are not
 * writable this way (use gguf_writer_add_raw_kv). Errors also: KV_ERR_INVALID for a bad
 * elem_type or data == NULL with n > 0. */
int gguf_writer_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n);
/* Array of n NUL-terminated strings. */
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);

/* ---- tensors ---------------------------------------------------------------------------------
 * Dimensions ne[0..n_dims) as GGML orders them: ne[0] is the row length (innermost).
 * Checked always (they decide the data layout): n_dims 1..4, every ne > 0, the element count
 * and byte size fit in int64, `type` a ggml type with a block size (quant_traits_of), and ne[0]
 * a multiple of its block size. With checks on also: the name is 1..64 bytes (the spec's
 * limit) and not already used. Errors: KV_ERR_INVALID, KV_ERR_NOMEM. */

/* Tensor whose bytes (quant_row_size(type, ne[0]) × rows, GGML layout) are at `data`; the
 * pointer is kept, not copied, and must stay valid until the last gguf_writer_write().
 * data == NULL writes zeros. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                           const void *data);

/* One piece of a tensor to produce: rows [row0, row0 + n_rows) of ne[0] elements each, to be
 * written as `nbytes` bytes at `dst` (the GGML encoding of `type`). */
typedef struct gguf_writer_chunk {
    const char *name;
    int type;
    int n_dims;
    const int64_t *ne;   /* 4 entries, unused ones 1 */
    int64_t row0, n_rows;
    void *dst;
    size_t nbytes;
} gguf_writer_chunk;

/* Fills one chunk; returns KV_OK or an error code (then the write stops and returns that
 * error, and no file is written). `err` may be filled with a message. */
typedef int (*gguf_fill_fn)(void *user, const gguf_writer_chunk *chunk, kv_error *err);

/* Tensor whose bytes come from `fill`, called during gguf_writer_write() in row order with
 * chunks of whole rows, about 1 MiB each (at least one row), so that files of any size are
 * streamed to disk without holding a tensor in memory. */
int gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                                gguf_fill_fn fill, void *user);

/* ---- writing ---------------------------------------------------------------------------------
 * Writes the file to `path` through "<path>.tmp", renamed over `path` once complete; on any
 * failure the temporary file is removed and `path` is left as it was. The alignment is
 * general.alignment when set as a uint32 (checks on: it must be a power of two and a multiple
 * of 8, as the spec requires), else 32. Tensor bytes are written as given (host order; GGML
 * files are little-endian). The file is the magic/version/counts header, the keys in the
 * order first set, the tensor table in the order added, then the padded data.
 * Errors (message starts with the path): the first setter/adder error, KV_ERR_INVALID for a
 * bad general.alignment, KV_ERR_IO, KV_ERR_NOMEM, or a fill callback's error. */
int gguf_writer_write(gguf_writer *w, const char *path, kv_error *err);

/* ---- raw mode, for building corrupt files in tests --------------------------------------------
 * These change only the bytes written in the header / tensor table; the data section is still
 * laid out from the tensors as added, so a test can make the header lie about a valid file. */

/* checks = 0: keys and tensor names may repeat (setters append), tensor names of any length,
 * any general.alignment value (the layout then uses 32 unless it is a usable power of two). */
void gguf_writer_set_checks(gguf_writer *w, int checks);
/* Version field (default 3). Only the field changes: the layout stays v2/v3 (u64 lengths),
 * so version 1 produces a file a v1 reader would misparse — which is what tests want. */
void gguf_writer_set_version(gguf_writer *w, uint32_t version);
/* The four magic bytes (default "GGUF"). */
void gguf_writer_set_magic(gguf_writer *w, const char magic[4]);
/* Header counts written instead of the real numbers of tensors / keys. */
void gguf_writer_override_counts(gguf_writer *w, uint64_t n_tensors, uint64_t n_kv);
/* Appends a key whose value_type field is `type` (any number, known or not) followed by the
 * `n` bytes at `payload` verbatim (e.g. a string length with no string behind it). */
int gguf_writer_add_raw_kv(gguf_writer *w, const char *key, uint32_t type, const void *payload, size_t n);
/* Overrides for the tensor-table entry of the most recently added tensor called `name`:
 * the offset field, the type id field, and the dims (n_dims entries of ne, any values,
 * n_dims 0..8). Errors: KV_ERR_INVALID when no tensor has that name or n_dims > 8. */
int gguf_writer_override_offset(gguf_writer *w, const char *name, uint64_t offset);
int gguf_writer_override_type(gguf_writer *w, const char *name, uint32_t type);
int gguf_writer_override_dims(gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *ne);

#endif
