/* gguf_read.c — the GGUF reader (see gguf.h): mmap, validation of every count,
 * length and offset against the buffer size, metadata/tensor-table access, and
 * row dequantization of the loadable tensor types.
 *
 * Every error from the parser reads "<name>: at byte <offset>: <fault>".
 */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- type tables ---- */

const char *gguf_type_name(uint32_t type) {
    static const char *names[GGUF_TYPE_COUNT] = {"u8",  "i8",     "u16",   "i16", "u32",
                                                 "i32", "f32",    "bool",  "string",
                                                 "array", "u64",  "i64",   "f64"};
    return type < GGUF_TYPE_COUNT ? names[type] : "unknown";
}

/* Size of a scalar metadata type; 0 for string/array/unknown. */
static size_t kv_scalar_size(uint32_t type) {
    switch (type) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* Block layouts from ggml.c type_traits (ids that were removed from ggml are absent). */
int gguf_type_layout(uint32_t type, int *blck, size_t *block_bytes) {
    int b = 1;
    size_t s = 0;
    switch (type) {
    case GGML_TYPE_F32: s = 4; break;
    case GGML_TYPE_F16: s = 2; break;
    case GGML_TYPE_Q4_0: b = 32, s = 18; break;
    case GGML_TYPE_Q4_1: b = 32, s = 20; break;
    case GGML_TYPE_Q5_0: b = 32, s = 22; break;
    case GGML_TYPE_Q5_1: b = 32, s = 24; break;
    case GGML_TYPE_Q8_0: b = 32, s = 34; break;
    case GGML_TYPE_Q8_1: b = 32, s = 36; break;
    case GGML_TYPE_Q2_K: b = 256, s = 84; break;
    case GGML_TYPE_Q3_K: b = 256, s = 110; break;
    case GGML_TYPE_Q4_K: b = 256, s = 144; break;
    case GGML_TYPE_Q5_K: b = 256, s = 176; break;
    case GGML_TYPE_Q6_K: b = 256, s = 210; break;
    case GGML_TYPE_Q8_K: b = 256, s = 292; break;
    case GGML_TYPE_IQ2_XXS: b = 256, s = 66; break;
    case GGML_TYPE_IQ2_XS: b = 256, s = 74; break;
    case GGML_TYPE_IQ3_XXS: b = 256, s = 98; break;
    case GGML_TYPE_IQ1_S: b = 256, s = 50; break;
    case GGML_TYPE_IQ4_NL: b = 32, s = 18; break;
    case GGML_TYPE_IQ3_S: b = 256, s = 110; break;
    case GGML_TYPE_IQ2_S: b = 256, s = 82; break;
    case GGML_TYPE_IQ4_XS: b = 256, s = 136; break;
    case GGML_TYPE_I8: s = 1; break;
    case GGML_TYPE_I16: s = 2; break;
    case GGML_TYPE_I32: s = 4; break;
    case GGML_TYPE_I64: s = 8; break;
    case GGML_TYPE_F64: s = 8; break;
    case GGML_TYPE_IQ1_M: b = 256, s = 56; break;
    case GGML_TYPE_BF16: s = 2; break;
    case 34: b = 256, s = 54; break; /* TQ1_0 */
    case 35: b = 256, s = 66; break; /* TQ2_0 */
    case 39: b = 32, s = 17; break;  /* MXFP4 */
    default: return -1;
    }
    if (blck) *blck = b;
    if (block_bytes) *block_bytes = s;
    return 0;
}

const char *gguf_tensor_type_name(uint32_t type) {
    switch (type) {
    case 34: return "tq1_0";
    case 35: return "tq2_0";
    case 39: return "mxfp4";
    default: return ggml_type_name(type);
    }
}

/* ---- string hash set (duplicate detection and lookup) ---- */

typedef struct strset {
    int64_t *slots; /* index + 1; 0 = empty */
    uint64_t mask;
} strset;

static uint64_t str_hash(const char *s, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int strset_init(strset *set, int64_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    set->slots = calloc(cap, sizeof *set->slots);
    set->mask = cap - 1;
    return set->slots ? 0 : -1;
}

/* Finds `s` among names[]; when absent and insert_idx >= 0, inserts it. Returns
 * the index found, or -1. */
static int64_t strset_find(strset *set, const gguf_str *names, size_t stride, const char *s,
                           uint64_t n, int64_t insert_idx) {
    if (!set->slots) return -1;
    uint64_t h = str_hash(s, n) & set->mask;
    for (;;) {
        int64_t v = set->slots[h];
        if (v == 0) {
            if (insert_idx >= 0) set->slots[h] = insert_idx + 1;
            return -1;
        }
        const gguf_str *e = (const gguf_str *)((const char *)names + (size_t)(v - 1) * stride);
        if (e->len == n && memcmp(e->data, s, n) == 0) return v - 1;
        h = (h + 1) & set->mask;
    }
}

/* ---- the file ---- */

struct gguf_file {
    char *name;
    const uint8_t *base;
    size_t size;
    void *map; /* non-NULL when we own an mmap */
    uint32_t version;
    size_t alignment;
    size_t data_off;
    int64_t n_kv;
    gguf_kv *kvs;
    int64_t n_tensors;
    gguf_tensor *tensors;
    strset kv_set, tensor_set;
};

typedef struct parser {
    gguf_file *f;
    size_t pos;
    st_err *err;
    const char *what; /* section being read, for truncation messages */
} parser;

static int perr(parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *p, size_t at, const char *fmt, ...) {
    char msg[ST_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return st_errf(p->err, "%s: at byte %zu: %s", p->f->name, at, msg);
}

static size_t left(const parser *p) { return p->f->size - p->pos; }

static int need(parser *p, size_t n, const char *item) {
    if (n > left(p))
        return perr(p, p->pos, "truncated %s: %s needs %zu bytes, only %zu left in the file",
                    p->what, item, n, left(p));
    return 0;
}

static int rd_u32(parser *p, uint32_t *v, const char *item) {
    if (need(p, 4, item)) return -1;
    memcpy(v, p->f->base + p->pos, 4);
    p->pos += 4;
    return 0;
}

static int rd_u64(parser *p, uint64_t *v, const char *item) {
    if (need(p, 8, item)) return -1;
    memcpy(v, p->f->base + p->pos, 8);
    p->pos += 8;
    return 0;
}

static int rd_str(parser *p, gguf_str *s, const char *item) {
    size_t at = p->pos;
    uint64_t len;
    if (rd_u64(p, &len, item)) return -1;
    if (len > left(p)) {
        if (len > p->f->size)
            return perr(p, at, "%s length %" PRIu64 " is larger than the file (%zu bytes)", item,
                        len, p->f->size);
        return perr(p, at, "truncated %s: %s is %" PRIu64 " bytes long, only %zu left in the file",
                    p->what, item, len, left(p));
    }
    s->len = len;
    s->data = (const char *)p->f->base + p->pos;
    p->pos += len;
    return 0;
}

/* Prints a key or name for messages: at most 60 bytes, non-printables as '?'. */
static const char *show(const gguf_str *s, char *buf, size_t cap) {
    size_t n = s->len < cap - 4 ? (size_t)s->len : cap - 4, i;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s->data[i];
        buf[i] = (c >= 32 && c < 127) ? (char)c : '?';
    }
    if (n < s->len) buf[i++] = '.', buf[i++] = '.', buf[i++] = '.';
    buf[i] = 0;
    return buf;
}

#define MAX_ARRAY_DEPTH 8

/* Parses one value of `type` at p->pos into kv (kv may be NULL for nested
 * array elements, which are validated only). */
static int parse_value(parser *p, uint32_t type, gguf_kv *kv, int depth, const char *key) {
    size_t at = p->pos;
    size_t sz = kv_scalar_size(type);
    if (sz) {
        if (need(p, sz, "value")) return -1;
        if (kv) memcpy(&kv->v, p->f->base + p->pos, sz);
        if (kv && type == GGUF_TYPE_BOOL) {
            uint8_t b = p->f->base[p->pos];
            if (b > 1) return perr(p, at, "key '%s': bool value %u is not 0 or 1", key, b);
            kv->v.b = b != 0;
        }
        p->pos += sz;
        return 0;
    }
    if (type == GGUF_TYPE_STRING) {
        gguf_str s;
        if (rd_str(p, &s, "string value")) return -1;
        if (kv) kv->v.str = s;
        return 0;
    }
    if (type != GGUF_TYPE_ARRAY)
        return perr(p, at, "key '%s': unknown metadata value type %" PRIu32, key, type);
    if (depth >= MAX_ARRAY_DEPTH)
        return perr(p, at, "key '%s': arrays nested deeper than %d", key, MAX_ARRAY_DEPTH);
    uint32_t et;
    uint64_t n;
    if (rd_u32(p, &et, "array element type")) return -1;
    size_t n_at = p->pos;
    if (rd_u64(p, &n, "array length")) return -1;
    if (et >= GGUF_TYPE_COUNT)
        return perr(p, at, "key '%s': unknown array element type %" PRIu32, key, et);
    size_t esz = kv_scalar_size(et);
    /* Each element takes at least esz bytes (8 for a string length, 12 for an array header). */
    size_t min = esz ? esz : et == GGUF_TYPE_STRING ? 8 : 12;
    if (n > left(p) / min) {
        if (n > p->f->size / min)
            return perr(p, n_at,
                        "key '%s': array count %" PRIu64 " (of %s) is larger than the file "
                        "(%zu bytes) can hold",
                        key, n, gguf_type_name(et), p->f->size);
        return perr(p, n_at,
                    "truncated %s: key '%s': array of %" PRIu64 " %s needs at least %" PRIu64
                    " bytes, only %zu left in the file",
                    p->what, key, n, gguf_type_name(et), (uint64_t)(n * min), left(p));
    }
    if (kv) {
        kv->arr_type = et;
        kv->arr_n = n;
        kv->arr_data = p->f->base + p->pos;
    }
    if (esz) {
        if (et == GGUF_TYPE_BOOL) {
            for (uint64_t i = 0; i < n; i++)
                if (p->f->base[p->pos + i] > 1)
                    return perr(p, p->pos + i, "key '%s': bool array element %" PRIu64
                                " is %u, not 0 or 1", key, i, p->f->base[p->pos + i]);
        }
        p->pos += (size_t)n * esz;
        return 0;
    }
    if (et == GGUF_TYPE_STRING) {
        gguf_str *strs = NULL;
        if (kv && n) {
            strs = malloc((size_t)n * sizeof *strs);
            if (!strs) return perr(p, at, "key '%s': out of memory for %" PRIu64 " strings", key, n);
            kv->arr_str = strs;
        }
        char item[128];
        for (uint64_t i = 0; i < n; i++) {
            gguf_str s;
            snprintf(item, sizeof item, "string %" PRIu64 " of %" PRIu64, i, n);
            if (rd_str(p, &s, item)) return -1;
            if (strs) strs[i] = s;
        }
        return 0;
    }
    for (uint64_t i = 0; i < n; i++)
        if (parse_value(p, et, NULL, depth + 1, key)) return -1;
    return 0;
}

static int parse(gguf_file *f, st_err *err) {
    parser P = {.f = f, .pos = 0, .err = err, .what = "header"}, *p = &P;
    uint32_t magic, version;
    if (f->size < 4)
        return perr(p, 0, "truncated header: %zu bytes, too short for the GGUF magic", f->size);
    memcpy(&magic, f->base, 4);
    if (magic != GGUF_MAGIC)
        return perr(p, 0, "bad magic %02x %02x %02x %02x (expected \"GGUF\"): not a GGUF file",
                    f->base[0], f->base[1], f->base[2], f->base[3]);
    p->pos = 4;
    if (rd_u32(p, &version, "version")) return -1;
    if (version != 2 && version != 3) {
        if (version == 0x02000000u || version == 0x03000000u)
            return perr(p, 4, "unsupported version %" PRIu32 " (a big-endian GGUF file?); "
                        "supported: 2, 3", version);
        return perr(p, 4, "unsupported version %" PRIu32 " (supported: 2, 3)", version);
    }
    f->version = version;
    uint64_t n_tensors, n_kv;
    size_t nt_at = p->pos;
    if (rd_u64(p, &n_tensors, "tensor count")) return -1;
    size_t nkv_at = p->pos;
    if (rd_u64(p, &n_kv, "metadata count")) return -1;
    /* A key/value takes at least 13 bytes; a tensor info at least 24. */
    if (n_kv > f->size / 13)
        return perr(p, nkv_at, "metadata count %" PRIu64 " is larger than the file (%zu bytes) "
                    "can hold", n_kv, f->size);
    if (n_tensors > f->size / 24)
        return perr(p, nt_at, "tensor count %" PRIu64 " is larger than the file (%zu bytes) can "
                    "hold", n_tensors, f->size);

    p->what = "metadata";
    f->kvs = calloc(n_kv ? n_kv : 1, sizeof *f->kvs);
    if (!f->kvs || strset_init(&f->kv_set, (int64_t)n_kv))
        return perr(p, p->pos, "out of memory for %" PRIu64 " keys", n_kv);
    char kb[64];
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &f->kvs[i];
        size_t at = p->pos;
        char item[128];
        snprintf(item, sizeof item, "key %" PRIu64 " of %" PRIu64, i, n_kv);
        if (rd_str(p, &kv->key, item)) return -1;
        show(&kv->key, kb, sizeof kb);
        if (strset_find(&f->kv_set, &f->kvs[0].key, sizeof(gguf_kv), kv->key.data, kv->key.len,
                        (int64_t)i) >= 0)
            return perr(p, at, "duplicate key '%s'", kb);
        f->n_kv = (int64_t)i + 1; /* from here on gguf_close frees its arr_str */
        snprintf(item, sizeof item, "type of key '%s'", kb);
        if (rd_u32(p, &kv->type, item)) return -1;
        if (kv->type >= GGUF_TYPE_COUNT)
            return perr(p, p->pos - 4, "key '%s': unknown metadata value type %" PRIu32, kb,
                        kv->type);
        kv->raw = f->base + p->pos;
        if (parse_value(p, kv->type, kv, 0, kb)) return -1;
        kv->raw_len = (uint64_t)((f->base + p->pos) - (const uint8_t *)kv->raw);
    }

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = gguf_find_key(f, "general.alignment");
    if (ai >= 0) {
        const gguf_kv *kv = &f->kvs[ai];
        size_t at = (size_t)((const uint8_t *)kv->raw - f->base);
        if (kv->type != GGUF_TYPE_UINT32)
            return perr(p, at, "general.alignment has type %s, expected u32",
                        gguf_type_name(kv->type));
        uint32_t a = kv->v.u32;
        if (a == 0 || (a & (a - 1)))
            return perr(p, at, "general.alignment %" PRIu32 " is not a power of two", a);
        f->alignment = a;
    }

    p->what = "tensor table";
    f->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *f->tensors);
    if (!f->tensors || strset_init(&f->tensor_set, (int64_t)n_tensors))
        return perr(p, p->pos, "out of memory for %" PRIu64 " tensors", n_tensors);
    size_t *info_at = calloc(n_tensors ? n_tensors : 1, sizeof *info_at);
    if (!info_at) return perr(p, p->pos, "out of memory");
    int rc = -1;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        size_t at = p->pos;
        info_at[i] = at;
        char item[128];
        snprintf(item, sizeof item, "name of tensor %" PRIu64 " of %" PRIu64, i, n_tensors);
        if (rd_str(p, &t->name, item)) goto out;
        show(&t->name, kb, sizeof kb);
        if (strset_find(&f->tensor_set, &f->tensors[0].name, sizeof(gguf_tensor), t->name.data,
                        t->name.len, (int64_t)i) >= 0) {
            perr(p, at, "duplicate tensor name '%s'", kb);
            goto out;
        }
        f->n_tensors = (int64_t)i + 1;
        snprintf(item, sizeof item, "n_dims of tensor '%s'", kb);
        if (rd_u32(p, &t->n_dims, item)) goto out;
        if (t->n_dims > GGUF_MAX_DIMS) {
            perr(p, p->pos - 4, "tensor '%s': n_dims %" PRIu32 " is more than %d", kb, t->n_dims,
                 GGUF_MAX_DIMS);
            goto out;
        }
        int64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            size_t ne_at = p->pos;
            snprintf(item, sizeof item, "ne[%" PRIu32 "] of tensor '%s'", d, kb);
            if (rd_u64(p, &ne, item)) goto out;
            if (ne > INT64_MAX) {
                perr(p, ne_at, "tensor '%s': ne[%" PRIu32 "] = %" PRIu64 " is out of range", kb, d,
                     ne);
                goto out;
            }
            t->ne[d] = (int64_t)ne;
            if (__builtin_mul_overflow(nel, t->ne[d], &nel)) {
                perr(p, ne_at, "tensor '%s': dimension product overflows (ne[%" PRIu32
                     "] = %" PRIu64 ")", kb, d, ne);
                goto out;
            }
        }
        snprintf(item, sizeof item, "type of tensor '%s'", kb);
        if (rd_u32(p, &t->type, item)) goto out;
        int blck;
        size_t bb;
        if (gguf_type_layout(t->type, &blck, &bb)) {
            perr(p, p->pos - 4, "tensor '%s': unknown tensor type %" PRIu32, kb, t->type);
            goto out;
        }
        if (t->ne[0] % blck) {
            perr(p, p->pos - 4, "tensor '%s': ne[0] = %" PRId64 " is not a multiple of the %s "
                 "block size %d", kb, t->ne[0], gguf_tensor_type_name(t->type), blck);
            goto out;
        }
        uint64_t nb;
        if (__builtin_mul_overflow((uint64_t)(nel / blck), (uint64_t)bb, &nb) ||
            nb > (uint64_t)INT64_MAX) {
            perr(p, p->pos - 4, "tensor '%s': data size (%" PRId64 " elements of %s) overflows",
                 kb, nel, gguf_tensor_type_name(t->type));
            goto out;
        }
        t->nbytes = nb;
        snprintf(item, sizeof item, "offset of tensor '%s'", kb);
        if (rd_u64(p, &t->offset, item)) goto out;
        if (t->offset % f->alignment) {
            perr(p, p->pos - 8, "tensor '%s': offset %" PRIu64 " is not a multiple of the "
                 "alignment %zu", kb, t->offset, f->alignment);
            goto out;
        }
    }

    /* Data section: starts at the next multiple of the alignment. */
    p->what = "data";
    size_t end_info = p->pos;
    size_t data_off = end_info + (f->alignment - end_info % f->alignment) % f->alignment;
    if (data_off < end_info) { /* wrapped */
        perr(p, end_info, "data section offset overflows");
        goto out;
    }
    /* Without tensors there is no data section (and often no padding). */
    f->data_off = n_tensors == 0 && data_off > f->size ? f->size : data_off;
    if (n_tensors > 0 && data_off > f->size) {
        perr(p, f->size, "truncated data: the data section starts at byte %zu but the file has "
             "%zu bytes", data_off, f->size);
        goto out;
    }
    size_t data_size = data_off <= f->size ? f->size - data_off : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        show(&t->name, kb, sizeof kb);
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            if (t->offset > data_size)
                perr(p, info_at[i], "tensor '%s': offset %" PRIu64 " is past the end of the "
                     "data section (%zu bytes from byte %zu)", kb, t->offset, data_size,
                     data_off);
            else
                perr(p, data_off + (size_t)t->offset, "truncated data: tensor '%s' needs %"
                     PRIu64 " bytes at data offset %" PRIu64 ", only %zu left in the file", kb,
                     t->nbytes, t->offset, (size_t)(data_size - t->offset));
            goto out;
        }
        t->data = f->base + data_off + t->offset;
    }
    rc = 0;
out:
    free(info_at);
    return rc;
}

static gguf_file *file_new(const char *name) {
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->name = strdup(name ? name : "(memory)");
    if (!f->name) {
        free(f);
        return NULL;
    }
    return f;
}

gguf_file *gguf_open_memory(const void *buf, size_t size, const char *name, st_err *err) {
    gguf_file *f = file_new(name);
    if (!f) {
        st_errf(err, "%s: out of memory", name ? name : "(memory)");
        return NULL;
    }
    static const uint8_t empty[1];
    f->base = buf ? buf : empty;
    f->size = buf ? size : 0;
    if (parse(f, err)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

gguf_file *gguf_open(const char *path, st_err *err) {
    /* O_NONBLOCK: a FIFO or a device must not block the open (it is refused below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        st_errf(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    gguf_file *f = gguf_open_fd(fd, path, err);
    close(fd);
    return f;
}

gguf_file *gguf_open_fd(int fd, const char *path, st_err *err) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        st_errf(err, "%s: not a regular file", path);
        return NULL;
    }
    gguf_file *f = file_new(path);
    if (!f) {
        st_errf(err, "%s: out of memory", path);
        return NULL;
    }
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            st_errf(err, "%s: mmap failed: %s", path, strerror(errno));
            gguf_close(f);
            return NULL;
        }
        f->map = m;
        f->base = m;
        f->size = (size_t)st.st_size;
    } else {
        static const uint8_t empty[1];
        f->base = empty;
        f->size = 0;
    }
    if (parse(f, err)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->n_kv; i++) free(f->kvs[i].arr_str);
    free(f->kvs);
    free(f->tensors);
    free(f->kv_set.slots);
    free(f->tensor_set.slots);
    if (f->map) munmap(f->map, f->size);
    free(f->name);
    free(f);
}

uint32_t gguf_version(const gguf_file *f) { return f->version; }
size_t gguf_alignment(const gguf_file *f) { return f->alignment; }
size_t gguf_data_offset(const gguf_file *f) { return f->data_off; }
size_t gguf_file_size(const gguf_file *f) { return f->size; }
const char *gguf_path(const gguf_file *f) { return f->name; }

/* ---- metadata ---- */

int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }

const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_kv ? &f->kvs[i] : NULL;
}

int64_t gguf_find_key(const gguf_file *f, const char *key) {
    return strset_find((strset *)&f->kv_set, &f->kvs[0].key, sizeof(gguf_kv), key, strlen(key),
                       -1);
}

const gguf_kv *gguf_get(const gguf_file *f, const char *key) {
    int64_t i = gguf_find_key(f, key);
    return i >= 0 ? &f->kvs[i] : NULL;
}

static const gguf_kv *get_or_err(const gguf_file *f, const char *key, st_err *err) {
    const gguf_kv *kv = gguf_get(f, key);
    if (!kv) st_errf(err, "%s: metadata key '%s' not found", f->name, key);
    return kv;
}

/* Integer value of a scalar kv: returns 0 and sets neg and mag, or -1 when not an integer. */
static int kv_int(const gguf_kv *kv, bool *neg, uint64_t *mag) {
    int64_t s;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: *neg = false, *mag = kv->v.u8; return 0;
    case GGUF_TYPE_UINT16: *neg = false, *mag = kv->v.u16; return 0;
    case GGUF_TYPE_UINT32: *neg = false, *mag = kv->v.u32; return 0;
    case GGUF_TYPE_UINT64: *neg = false, *mag = kv->v.u64; return 0;
    case GGUF_TYPE_INT8: s = kv->v.i8; break;
    case GGUF_TYPE_INT16: s = kv->v.i16; break;
    case GGUF_TYPE_INT32: s = kv->v.i32; break;
    case GGUF_TYPE_INT64: s = kv->v.i64; break;
    default: return -1;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, st_err *err) {
    const gguf_kv *kv = get_or_err(f, key, err);
    if (!kv) return -1;
    bool neg;
    uint64_t mag;
    if (kv_int(kv, &neg, &mag))
        return st_errf(err, "%s: metadata key '%s' has type %s, expected an integer", f->name,
                       key, gguf_type_name(kv->type));
    if (neg || mag > UINT32_MAX)
        return st_errf(err, "%s: metadata key '%s' = %s%" PRIu64 " does not fit in u32", f->name,
                       key, neg ? "-" : "", mag);
    *out = (uint32_t)mag;
    return 0;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, st_err *err) {
    const gguf_kv *kv = get_or_err(f, key, err);
    if (!kv) return -1;
    bool neg;
    uint64_t mag;
    if (kv_int(kv, &neg, &mag))
        return st_errf(err, "%s: metadata key '%s' has type %s, expected an integer", f->name,
                       key, gguf_type_name(kv->type));
    if (!neg && mag > (uint64_t)INT64_MAX)
        return st_errf(err, "%s: metadata key '%s' = %" PRIu64 " does not fit in i64", f->name,
                       key, mag);
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, st_err *err) {
    const gguf_kv *kv = get_or_err(f, key, err);
    if (!kv) return -1;
    if (kv->type == GGUF_TYPE_FLOAT32) *out = kv->v.f32;
    else if (kv->type == GGUF_TYPE_FLOAT64) *out = (float)kv->v.f64;
    else
        return st_errf(err, "%s: metadata key '%s' has type %s, expected f32", f->name, key,
                       gguf_type_name(kv->type));
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out, st_err *err) {
    const gguf_kv *kv = get_or_err(f, key, err);
    if (!kv) return -1;
    if (kv->type != GGUF_TYPE_BOOL)
        return st_errf(err, "%s: metadata key '%s' has type %s, expected bool", f->name, key,
                       gguf_type_name(kv->type));
    *out = kv->v.b;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, char **out, st_err *err) {
    const gguf_kv *kv = get_or_err(f, key, err);
    if (!kv) return -1;
    if (kv->type != GGUF_TYPE_STRING)
        return st_errf(err, "%s: metadata key '%s' has type %s, expected string", f->name, key,
                       gguf_type_name(kv->type));
    char *s = malloc((size_t)kv->v.str.len + 1);
    if (!s) return st_errf(err, "%s: out of memory", f->name);
    memcpy(s, kv->v.str.data, (size_t)kv->v.str.len);
    s[kv->v.str.len] = 0;
    *out = s;
    return 0;
}

int gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, const gguf_kv **kv_out,
                 st_err *err) {
    const gguf_kv *kv = get_or_err(f, key, err);
    if (!kv) return -1;
    if (kv->type != GGUF_TYPE_ARRAY)
        return st_errf(err, "%s: metadata key '%s' has type %s, expected an array of %s", f->name,
                       key, gguf_type_name(kv->type), gguf_type_name(elem_type));
    if (kv->arr_type != elem_type)
        return st_errf(err, "%s: metadata key '%s' is an array of %s, expected %s", f->name, key,
                       gguf_type_name(kv->arr_type), gguf_type_name(elem_type));
    *kv_out = kv;
    return 0;
}

double gguf_arr_f64(const gguf_kv *kv, uint64_t i) {
    if (kv->type != GGUF_TYPE_ARRAY || i >= kv->arr_n) return 0;
    size_t sz = kv_scalar_size(kv->arr_type);
    if (!sz) return 0;
    const uint8_t *p = (const uint8_t *)kv->arr_data + i * sz;
    union {
        uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
        float f32; uint64_t u64; int64_t i64; double f64;
    } u;
    memcpy(&u, p, sz);
    switch (kv->arr_type) {
    case GGUF_TYPE_UINT8: return u.u8;
    case GGUF_TYPE_BOOL: return u.u8 != 0;
    case GGUF_TYPE_INT8: return u.i8;
    case GGUF_TYPE_UINT16: return u.u16;
    case GGUF_TYPE_INT16: return u.i16;
    case GGUF_TYPE_UINT32: return u.u32;
    case GGUF_TYPE_INT32: return u.i32;
    case GGUF_TYPE_FLOAT32: return u.f32;
    case GGUF_TYPE_UINT64: return (double)u.u64;
    case GGUF_TYPE_INT64: return (double)u.i64;
    case GGUF_TYPE_FLOAT64: return u.f64;
    default: return 0;
    }
}

int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i) {
    if (kv->type != GGUF_TYPE_ARRAY || i >= kv->arr_n) return 0;
    if (kv->arr_type == GGUF_TYPE_UINT64 || kv->arr_type == GGUF_TYPE_INT64) {
        int64_t v;
        memcpy(&v, (const uint8_t *)kv->arr_data + i * 8, 8);
        return v;
    }
    double d = gguf_arr_f64(kv, i);
    if (d != d) return 0;
    if (d >= 9.2e18) return INT64_MAX;
    if (d <= -9.2e18) return INT64_MIN;
    return (int64_t)d;
}

/* ---- tensors ---- */

int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    int64_t i = strset_find((strset *)&f->tensor_set, &f->tensors[0].name, sizeof(gguf_tensor),
                            name, strlen(name), -1);
    return i >= 0 ? &f->tensors[i] : NULL;
}

int64_t gguf_tensor_nelements(const gguf_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) n *= t->ne[d]; /* checked at open */
    return n;
}

int64_t gguf_tensor_nrows(const gguf_tensor *t) {
    return t->ne[0] > 0 ? gguf_tensor_nelements(t) / t->ne[0] : 0;
}

int gguf_tensor_rows_f32(const gguf_tensor *t, int64_t row0, int64_t n_rows, float *dst,
                         st_err *err) {
    char nb[64];
    show(&t->name, nb, sizeof nb);
    if (!ggml_type_supported(t->type))
        return st_errf(err, "tensor '%s' has type %s, which cannot be loaded (supported: f32, "
                       "f16, bf16, q8_0, q4_0)", nb, gguf_tensor_type_name(t->type));
    int64_t nrows = gguf_tensor_nrows(t);
    if (row0 < 0 || n_rows < 0 || row0 > nrows || n_rows > nrows - row0)
        return st_errf(err, "tensor '%s': rows [%" PRId64 ", %" PRId64 ") out of range (%" PRId64
                       " rows)", nb, row0, row0 + n_rows, nrows);
    size_t rb = ggml_row_bytes(t->type, t->ne[0]);
    if (n_rows && (rb == 0 || (uint64_t)(row0 + n_rows) * rb > t->nbytes))
        return st_errf(err, "tensor '%s': bad row size", nb);
    const uint8_t *src = (const uint8_t *)t->data + (size_t)row0 * rb;
    for (int64_t r = 0; r < n_rows; r++)
        if (st_dequant_row(t->type, src + (size_t)r * rb, dst + r * t->ne[0], t->ne[0]))
            return st_errf(err, "tensor '%s': cannot dequantize %s", nb,
                           gguf_tensor_type_name(t->type));
    return 0;
}

void gguf_release_pages(const gguf_file *f, const void *ptr, size_t len) {
    if (!f || !f->map || len == 0) return;
    const long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)ptr + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)ptr + len) & ~(uintptr_t)(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
