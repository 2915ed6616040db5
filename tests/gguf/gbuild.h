/* gbuild.h — builds GGUF byte images by hand for the malformed-file tests. */
#ifndef STRATA_TESTS_GGUF_GBUILD_H
#define STRATA_TESTS_GGUF_GBUILD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct gbuf {
    uint8_t *p;
    size_t n, cap;
} gbuf;

static inline void gb_put(gbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void gb_u8(gbuf *b, uint8_t v) { gb_put(b, &v, 1); }
static inline void gb_u32(gbuf *b, uint32_t v) { gb_put(b, &v, 4); }
static inline void gb_u64(gbuf *b, uint64_t v) { gb_put(b, &v, 8); }
static inline void gb_f32(gbuf *b, float v) { gb_put(b, &v, 4); }
static inline void gb_str(gbuf *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static inline void gb_header(gbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_u32(b, 0x46554747u);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
/* key + u32 value */
static inline void gb_kv_u32(gbuf *b, const char *key, uint32_t v) {
    gb_str(b, key);
    gb_u32(b, 4);
    gb_u32(b, v);
}
static inline void gb_tensor_info(gbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                                  uint32_t type, uint64_t offset) {
    gb_str(b, name);
    gb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) gb_u64(b, ne[i]);
    gb_u32(b, type);
    gb_u64(b, offset);
}
static inline void gb_pad(gbuf *b, size_t align) {
    while (b->n % align) gb_u8(b, 0);
}
static inline void gb_zeros(gbuf *b, size_t n) {
    for (size_t i = 0; i < n; i++) gb_u8(b, 0);
}

#endif
