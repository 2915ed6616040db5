/* tok_util.h — the tokenizer's small containers: a string→id hash map, a
 * binary heap, a growable id array, and llama.cpp's UTF-8 sequence length.
 * They know nothing of vocabularies. Not a public API (model/tok*.c only).
 */
#ifndef STRATA_MODEL_TOK_UTIL_H
#define STRATA_MODEL_TOK_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- string → int32 map (open addressing, FNV-1a). Keys are not copied:
 * they must outlive the map. ---- */
typedef struct tok_map_entry {
    const char *key; /* NULL: empty slot */
    uint32_t len;
    int32_t val;
    uint64_t hash;
} tok_map_entry;

typedef struct tok_map {
    tok_map_entry *slots;
    size_t cap; /* power of two */
    size_t n;
} tok_map;

int tok_map_init(tok_map *m, size_t expected);
void tok_map_free(tok_map *m);
/* Inserts key→val. An existing key is overwritten when `overwrite`, else
 * kept. -1 when the map is full (it holds `expected` keys; it never grows). */
int tok_map_put(tok_map *m, const char *key, size_t len, int32_t val, bool overwrite);
/* Value of key, or -1. */
int32_t tok_map_get(const tok_map *m, const char *key, size_t len);
/* Value of the key a + sep + b (sep one byte), built without copying, or -1. */
int32_t tok_map_get_pair(const tok_map *m, const char *a, size_t alen, char sep, const char *b,
                         size_t blen);

/* ---- binary max-heap of fixed-size elements; `lower(a, b)` says a has lower
 * priority than b (std::priority_queue's comparator). ---- */
typedef struct tok_heap {
    char *data;
    size_t n, cap, esz;
    bool (*lower)(const void *a, const void *b);
} tok_heap;

void tok_heap_init(tok_heap *h, size_t esz, bool (*lower)(const void *, const void *));
void tok_heap_free(tok_heap *h);
int tok_heap_push(tok_heap *h, const void *elem); /* -1 on out of memory */
bool tok_heap_pop(tok_heap *h, void *out);        /* false when empty */

/* ---- growable int32 array ---- */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *a, int32_t id); /* -1 on out of memory */

/* ---- UTF-8 ---- */
/* Length of a UTF-8 sequence from its first byte, llama.cpp's
 * unicode_len_utf8 (continuation and invalid lead bytes count 1).
 * Strict decoding and encoding: common/utf8.h (utf8_decode, utf8_encode). */
size_t tok_utf8_len(uint8_t lead);

#endif
