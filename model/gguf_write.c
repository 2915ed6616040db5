/* gguf_write.c — the GGUF v3 writer (see gguf.h): metadata key/values encoded
 * at call time, tensors either copied or produced at write time by a fill
 * callback (streaming, for models larger than memory). Layout: header, kvs,
 * tensor infos, zero padding to the alignment, then each tensor at an aligned
 * offset followed by zero padding to the alignment (as llama.cpp/gguf-py).
 */
#include "model/gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct wkv {
    char *key;
    size_t key_len;
    uint32_t type;
    uint8_t *raw; /* encoded value (after the type field) */
    size_t raw_len;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t nbytes, row_bytes, n_rows;
    uint64_t offset;
    void *data; /* owned copy, or NULL when fill is set */
    gguf_fill_fn fill;
    void *fill_ctx;
    int64_t fill_index;
} wtensor;

struct gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_t, cap_t;
};

gguf_writer *gguf_writer_new(void) { return calloc(1, sizeof(gguf_writer)); }

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) free(w->kvs[i].key), free(w->kvs[i].raw);
    for (size_t i = 0; i < w->n_t; i++) free(w->tensors[i].name), free(w->tensors[i].data);
    free(w->kvs);
    free(w->tensors);
    free(w);
}

int64_t gguf_writer_n_tensors(const gguf_writer *w) { return (int64_t)w->n_t; }

/* Takes ownership of raw (freed on failure). */
static int add_kv(gguf_writer *w, const char *key, size_t key_len, uint32_t type, uint8_t *raw,
                  size_t raw_len, st_err *err) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (w->kvs[i].key_len == key_len && memcmp(w->kvs[i].key, key, key_len) == 0) {
            free(raw);
            return st_errf(err, "gguf writer: duplicate key '%.*s'", (int)key_len, key);
        }
    if (w->n_kv == w->cap_kv) {
        size_t nc = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *n = realloc(w->kvs, nc * sizeof *n);
        if (!n) {
            free(raw);
            return st_errf(err, "gguf writer: out of memory");
        }
        w->kvs = n, w->cap_kv = nc;
    }
    char *k = malloc(key_len + 1);
    if (!k) {
        free(raw);
        return st_errf(err, "gguf writer: out of memory");
    }
    memcpy(k, key, key_len);
    k[key_len] = 0;
    w->kvs[w->n_kv++] = (wkv){k, key_len, type, raw, raw_len};
    return 0;
}

static int add_scalar(gguf_writer *w, const char *key, uint32_t type, const void *v, size_t n,
                      st_err *err) {
    uint8_t *raw = malloc(n);
    if (!raw) return st_errf(err, "gguf writer: out of memory");
    memcpy(raw, v, n);
    return add_kv(w, key, strlen(key), type, raw, n, err);
}

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v, st_err *err) {
    return add_scalar(w, key, GGUF_TYPE_UINT32, &v, 4, err);
}
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v, st_err *err) {
    return add_scalar(w, key, GGUF_TYPE_INT32, &v, 4, err);
}
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v, st_err *err) {
    return add_scalar(w, key, GGUF_TYPE_UINT64, &v, 8, err);
}
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v, st_err *err) {
    return add_scalar(w, key, GGUF_TYPE_FLOAT32, &v, 4, err);
}
int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v, st_err *err) {
    uint8_t b = v ? 1 : 0;
    return add_scalar(w, key, GGUF_TYPE_BOOL, &b, 1, err);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v, st_err *err) {
    uint64_t n = strlen(v);
    uint8_t *raw = malloc(8 + n);
    if (!raw) return st_errf(err, "gguf writer: out of memory");
    memcpy(raw, &n, 8);
    memcpy(raw + 8, v, n);
    return add_kv(w, key, strlen(key), GGUF_TYPE_STRING, raw, 8 + n, err);
}

static size_t elem_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data,
                        uint64_t n, st_err *err) {
    size_t es = elem_size(elem_type);
    if (!es)
        return st_errf(err, "gguf writer: key '%s': %s is not a numeric array element type", key,
                       gguf_type_name(elem_type));
    if (n > (SIZE_MAX - 12) / es) return st_errf(err, "gguf writer: key '%s': array too large", key);
    uint8_t *raw = malloc(12 + n * es);
    if (!raw) return st_errf(err, "gguf writer: out of memory");
    memcpy(raw, &elem_type, 4);
    memcpy(raw + 4, &n, 8);
    if (n) memcpy(raw + 12, data, n * es);
    return add_kv(w, key, strlen(key), GGUF_TYPE_ARRAY, raw, 12 + n * es, err);
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const gguf_str *strs, uint64_t n,
                            st_err *err) {
    size_t total = 12;
    for (uint64_t i = 0; i < n; i++) total += 8 + strs[i].len;
    uint8_t *raw = malloc(total), *p = raw + 12;
    if (!raw) return st_errf(err, "gguf writer: out of memory");
    uint32_t et = GGUF_TYPE_STRING;
    memcpy(raw, &et, 4);
    memcpy(raw + 4, &n, 8);
    for (uint64_t i = 0; i < n; i++) {
        memcpy(p, &strs[i].len, 8);
        if (strs[i].len) memcpy(p + 8, strs[i].data, strs[i].len);
        p += 8 + strs[i].len;
    }
    return add_kv(w, key, strlen(key), GGUF_TYPE_ARRAY, raw, total, err);
}

int gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv, st_err *err) {
    if (kv->type >= GGUF_TYPE_COUNT || !kv->raw)
        return st_errf(err, "gguf writer: key '%.*s': cannot copy a value of type %s",
                       (int)(kv->key.len > 200 ? 200 : kv->key.len), kv->key.data,
                       gguf_type_name(kv->type));
    uint8_t *raw = malloc(kv->raw_len ? kv->raw_len : 1);
    if (!raw) return st_errf(err, "gguf writer: out of memory");
    memcpy(raw, kv->raw, kv->raw_len);
    return add_kv(w, kv->key.data, kv->key.len, kv->type, raw, kv->raw_len, err);
}

static int add_tensor_common(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                             const int64_t *ne, wtensor **out, st_err *err) {
    if (n_dims > GGUF_MAX_DIMS)
        return st_errf(err, "gguf writer: tensor '%s': n_dims %u > %d", name, n_dims,
                       GGUF_MAX_DIMS);
    int blck;
    size_t bb;
    if (gguf_type_layout(type, &blck, &bb))
        return st_errf(err, "gguf writer: tensor '%s': unknown type %u", name, type);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return st_errf(err, "gguf writer: duplicate tensor name '%s'", name);
    wtensor t = {.n_dims = n_dims, .type = type};
    int64_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0 || __builtin_mul_overflow(nel, t.ne[d], &nel))
            return st_errf(err, "gguf writer: tensor '%s': bad shape", name);
    }
    if (t.ne[0] % blck)
        return st_errf(err, "gguf writer: tensor '%s': ne[0] = %" PRId64 " is not a multiple of "
                       "the %s block size %d", name, t.ne[0], gguf_tensor_type_name(type), blck);
    t.row_bytes = (uint64_t)(t.ne[0] / blck) * bb;
    t.n_rows = t.ne[0] ? (uint64_t)(nel / t.ne[0]) : 0;
    t.nbytes = (uint64_t)(nel / blck) * bb;
    if (w->n_t == w->cap_t) {
        size_t nc = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *n = realloc(w->tensors, nc * sizeof *n);
        if (!n) return st_errf(err, "gguf writer: out of memory");
        w->tensors = n, w->cap_t = nc;
    }
    t.name = strdup(name);
    if (!t.name) return st_errf(err, "gguf writer: out of memory");
    w->tensors[w->n_t] = t;
    *out = &w->tensors[w->n_t];
    return 0;
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const int64_t *ne, const void *data, size_t nbytes, st_err *err) {
    wtensor *t;
    if (add_tensor_common(w, name, type, n_dims, ne, &t, err)) return -1;
    if (nbytes != t->nbytes) {
        free(t->name);
        return st_errf(err, "gguf writer: tensor '%s': %zu bytes given, shape needs %" PRIu64,
                       name, nbytes, t->nbytes);
    }
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->data) {
        free(t->name);
        return st_errf(err, "gguf writer: out of memory for tensor '%s'", name);
    }
    if (nbytes) memcpy(t->data, data, nbytes);
    w->n_t++;
    return 0;
}

int gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, uint32_t type,
                                uint32_t n_dims, const int64_t *ne, gguf_fill_fn fill, void *ctx,
                                int64_t tensor_index, st_err *err) {
    wtensor *t;
    if (!fill) return st_errf(err, "gguf writer: tensor '%s': no fill function", name);
    if (add_tensor_common(w, name, type, n_dims, ne, &t, err)) return -1;
    t->fill = fill;
    t->fill_ctx = ctx;
    t->fill_index = tensor_index;
    w->n_t++;
    return 0;
}

/* ---- output ---- */

typedef struct out {
    FILE *fp;
    const char *path;
    uint64_t pos;
    st_err *err;
    int failed;
} out;

static int put(out *o, const void *p, size_t n) {
    if (o->failed) return -1;
    if (n && fwrite(p, 1, n, o->fp) != n) {
        o->failed = 1;
        return st_errf(o->err, "%s: write failed: %s", o->path, strerror(errno));
    }
    o->pos += n;
    return 0;
}

static int pad(out *o, size_t align) {
    static const uint8_t zeros[256];
    size_t n = (size_t)((align - o->pos % align) % align);
    while (n) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        if (put(o, zeros, k)) return -1;
        n -= k;
    }
    return 0;
}

static size_t writer_alignment(const gguf_writer *w) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, "general.alignment") == 0 &&
            w->kvs[i].type == GGUF_TYPE_UINT32) {
            uint32_t a;
            memcpy(&a, w->kvs[i].raw, 4);
            return a;
        }
    return GGUF_DEFAULT_ALIGNMENT;
}

int gguf_writer_write(gguf_writer *w, const char *path, st_err *err) {
    size_t align = writer_alignment(w);
    if (align == 0 || (align & (align - 1)))
        return st_errf(err, "gguf writer: general.alignment %zu is not a power of two", align);
    /* Offsets. */
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->tensors[i].offset = off;
        off += w->tensors[i].nbytes;
        off += (align - off % align) % align;
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 8);
    if (!tmp) return st_errf(err, "%s: out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    out o = {.fp = fopen(tmp, "wb"), .path = tmp, .err = err};
    if (!o.fp) {
        st_errf(err, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    setvbuf(o.fp, NULL, _IOFBF, 1 << 20);
    uint32_t magic = GGUF_MAGIC, version = 3;
    uint64_t n_t = w->n_t, n_kv = w->n_kv;
    put(&o, &magic, 4), put(&o, &version, 4), put(&o, &n_t, 8), put(&o, &n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        uint64_t kl = w->kvs[i].key_len;
        put(&o, &kl, 8), put(&o, w->kvs[i].key, kl);
        put(&o, &w->kvs[i].type, 4), put(&o, w->kvs[i].raw, w->kvs[i].raw_len);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->tensors[i];
        uint64_t nl = strlen(t->name);
        put(&o, &nl, 8), put(&o, t->name, nl), put(&o, &t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) put(&o, &t->ne[d], 8);
        put(&o, &t->type, 4), put(&o, &t->offset, 8);
    }
    if (w->n_t) pad(&o, align);
    uint64_t data_start = o.pos;
    void *buf = NULL;
    size_t buf_cap = 0;
    for (size_t i = 0; i < w->n_t && !o.failed; i++) {
        const wtensor *t = &w->tensors[i];
        if (o.pos - data_start != t->offset) {
            st_errf(err, "gguf writer: internal offset mismatch at tensor '%s'", t->name);
            o.failed = 1;
            break;
        }
        if (!t->fill) {
            put(&o, t->data, t->nbytes);
        } else if (t->n_rows) {
            /* About 4 MiB per call, at least one row. */
            uint64_t chunk = t->row_bytes ? (4u << 20) / t->row_bytes : t->n_rows;
            if (chunk == 0) chunk = 1;
            if (chunk > t->n_rows) chunk = t->n_rows;
            size_t need = (size_t)(chunk * t->row_bytes);
            if (need > buf_cap) {
                free(buf);
                buf = malloc(need ? need : 1);
                buf_cap = buf ? need : 0;
                if (!buf) {
                    st_errf(err, "%s: out of memory for tensor '%s'", path, t->name);
                    o.failed = 1;
                    break;
                }
            }
            for (uint64_t r = 0; r < t->n_rows && !o.failed; r += chunk) {
                uint64_t n = t->n_rows - r < chunk ? t->n_rows - r : chunk;
                if (t->fill(t->fill_ctx, t->fill_index, (int64_t)r, (int64_t)n, buf, err)) {
                    st_err_prefix(err, "%s: tensor '%s'", path, t->name);
                    o.failed = 1;
                    break;
                }
                put(&o, buf, (size_t)(n * t->row_bytes));
            }
        }
        pad(&o, align);
    }
    free(buf);
    if (fclose(o.fp) != 0 && !o.failed) {
        st_errf(err, "%s: write failed: %s", tmp, strerror(errno));
        o.failed = 1;
    }
    if (!o.failed && rename(tmp, path) != 0) {
        st_errf(err, "%s: cannot rename %s: %s", path, tmp, strerror(errno));
        o.failed = 1;
    }
    if (o.failed) unlink(tmp);
    free(tmp);
    return o.failed ? -1 : 0;
}
