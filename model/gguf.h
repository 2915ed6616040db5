/* gguf.h — reading and writing GGUF model files.
 *
 * Spec: ggml's docs/gguf.md (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
 * Versions 2 and 3 are read; version 3 is written. All integers are little-endian.
 *
 * The reader memory-maps the file and validates every count, length and offset
 * against the file size before it is used, so a corrupt or truncated file gives
 * an error naming the file, the byte offset and the fault — never a crash or an
 * out-of-bounds read. Strings returned by the reader point into the mapping and
 * live as long as the gguf_file.
 *
 * Tensor shapes use ggml's convention: ne[0] is the fastest-varying (row length),
 * so a weight stored as ne = [K, N] is N rows of K elements (row-major [N, K]).
 */
#ifndef STRATA_MODEL_GGUF_H
#define STRATA_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

/* Metadata value types (gguf.md). */
enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
};

/* Name of a metadata type ("u32", "string", "array", ...). */
const char *gguf_type_name(uint32_t type);

/* A string in the file: not NUL-terminated. */
typedef struct gguf_str {
    uint64_t len;
    const char *data;
} gguf_str;

/* One metadata key/value. For scalars, exactly one union member is valid
 * according to `type`. For arrays (type == GGUF_TYPE_ARRAY): `arr_type` is the
 * element type, `arr_n` the count; numeric elements are at `arr_data` (packed,
 * little-endian, possibly unaligned: read with memcpy or the accessors below);
 * string elements are in `arr_str` (allocated by the reader). Nested arrays
 * are parsed and validated but their elements are not exposed. */
typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        bool b;
        uint64_t u64;
        int64_t i64;
        double f64;
        gguf_str str;
    } v;
    uint32_t arr_type;
    uint64_t arr_n;
    const void *arr_data;
    gguf_str *arr_str;
    /* The value's encoded bytes in the file (everything after the type
     * field): lets the writer copy any value, nested arrays included. */
    const void *raw;
    uint64_t raw_len;
} gguf_kv;

/* One tensor-table entry. `data` points into the mapping and has been
 * bounds-checked: nbytes bytes are readable there. */
typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* unused dims are 1 */
    uint32_t type;             /* enum ggml_type */
    uint64_t offset;           /* relative to the start of the data section */
    uint64_t nbytes;
    const void *data;
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Opens and validates a file (mmap, read-only). NULL + err on failure; the
 * message names the path, the byte offset and the fault. */
gguf_file *gguf_open(const char *path, st_err *err);
/* Same, from an open descriptor (a regular file; the caller keeps owning
 * fd: it may be closed after this returns). `path` names it in messages. */
gguf_file *gguf_open_fd(int fd, const char *path, st_err *err);
/* Same, over a caller-owned buffer that must outlive the result (fuzzing,
 * tests). `name` is used in error messages. */
gguf_file *gguf_open_memory(const void *buf, size_t size, const char *name, st_err *err);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
size_t gguf_alignment(const gguf_file *f);
size_t gguf_data_offset(const gguf_file *f); /* byte offset of the data section */
size_t gguf_file_size(const gguf_file *f);
const char *gguf_path(const gguf_file *f);

/* Metadata. Keys are looked up by exact name; -1 when absent. */
int64_t gguf_n_kv(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i);
int64_t gguf_find_key(const gguf_file *f, const char *key);
const gguf_kv *gguf_get(const gguf_file *f, const char *key); /* NULL when absent */

/* Typed getters: fill *out and return 0, or return -1 with err naming the key
 * when it is absent or of an incompatible type. Integer getters accept any
 * integer type whose value fits; gguf_get_f32 accepts f32 and f64. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, st_err *err);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, st_err *err);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, st_err *err);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out, st_err *err);
/* Returns a malloc'd NUL-terminated copy. */
int gguf_get_str(const gguf_file *f, const char *key, char **out, st_err *err);
/* An array of `elem_type`: fills *kv_out with the array's entry. */
int gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, const gguf_kv **kv_out,
                 st_err *err);
/* Element i of a numeric array as double / int64 (any numeric element type). */
double gguf_arr_f64(const gguf_kv *kv, uint64_t i);
int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i);

/* Tensors. */
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL when absent */
int64_t gguf_tensor_nelements(const gguf_tensor *t);

/* Block layout of any known on-disk tensor type (loadable or not): elements
 * per block and bytes per block, from ggml.c's type_traits. Returns -1 for an
 * unknown or removed type id. */
int gguf_type_layout(uint32_t type, int *blck, size_t *block_bytes);
/* Name of a tensor type, also for the ids dtype.h does not list (tq1_0, tq2_0,
 * mxfp4); "unknown" otherwise. */
const char *gguf_tensor_type_name(uint32_t type);
/* Number of rows (elements / ne[0]); 0 for an empty tensor. */
int64_t gguf_tensor_nrows(const gguf_tensor *t);

/* Dequantizes rows [row0, row0 + n_rows) of a tensor (a row is ne[0]
 * elements) into dst (n_rows * ne[0] floats). Fails cleanly for unsupported
 * types or out-of-range rows. */
int gguf_tensor_rows_f32(const gguf_tensor *t, int64_t row0, int64_t n_rows, float *dst,
                         st_err *err);

/* Drops the pages of [ptr, ptr+len) (inside f's mapping) from this process's
 * resident set once a loader has copied them, so that loading a model does
 * not hold it twice (mapping + copy). Later reads fault the pages back in from
 * the page cache. Only whole pages inside the range are dropped; a no-op for
 * files opened with gguf_open_memory. */
void gguf_release_pages(const gguf_file *f, const void *ptr, size_t len);

/* ---- Writer: produces GGUF v3, metadata first, then tensors aligned to
 * general.alignment (default 32). Values are copied at call time. ---- */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
/* Each setter fails when the key already exists. */
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v, st_err *err);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v, st_err *err);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v, st_err *err);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v, st_err *err);
int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v, st_err *err);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v, st_err *err);
/* Numeric array: n elements of elem_type, packed little-endian at data. */
int gguf_writer_set_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data,
                        uint64_t n, st_err *err);
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const gguf_str *strs, uint64_t n,
                            st_err *err);
/* Copies one key/value (any type, arrays included) from a reader. */
int gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv, st_err *err);
/* Adds a tensor; `data` (nbytes = row bytes * rows) is copied. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const int64_t *ne, const void *data, size_t nbytes, st_err *err);
/* Streaming variant for large tensors: at write time, `fill` is called with
 * consecutive row ranges [row0, row0 + n_rows) (a row is ne[0] elements of
 * `type`, ggml_row layout) and must write exactly n_rows rows into dst.
 * Rows are requested in order but a fill function should not rely on it.
 * `ctx` must stay valid until gguf_writer_write returns. */
typedef int (*gguf_fill_fn)(void *ctx, int64_t tensor_index, int64_t row0, int64_t n_rows,
                            void *dst, st_err *err);
int gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, uint32_t type,
                                uint32_t n_dims, const int64_t *ne, gguf_fill_fn fill, void *ctx,
                                int64_t tensor_index, st_err *err);
int64_t gguf_writer_n_tensors(const gguf_writer *w);
/* Writes the file: to `path`.tmp first, then renamed over `path`, so a failed
 * write leaves no partial file behind. */
int gguf_writer_write(gguf_writer *w, const char *path, st_err *err);

#endif
