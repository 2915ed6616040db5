/* tok_util.c — the tokenizer's small containers (string→id map, heap, id
 * array) and llama.cpp's UTF-8 sequence length. No vocabulary knowledge lives
 * here; strict UTF-8 decoding is common/utf8.h's.
 */
#include <stdlib.h>
#include <string.h>

#include "model/tok_util.h"

/* ---- map ---- */

#define FNV_OFF 1469598103934665603ull
#define FNV_PRIME 1099511628211ull

static uint64_t fnv_step(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= FNV_PRIME;
    }
    return h;
}

int tok_map_init(tok_map *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 1) cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    m->cap = m->slots ? cap : 0;
    m->n = 0;
    return m->slots ? 0 : -1;
}

void tok_map_free(tok_map *m) {
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

int tok_map_put(tok_map *m, const char *key, size_t len, int32_t val, bool overwrite) {
    /* The map is sized at init for all its keys; it never grows. */
    if (!m->cap || m->n * 2 + 2 > m->cap) return -1;
    uint64_t h = fnv_step(FNV_OFF, key, len);
    size_t i = (size_t)h & (m->cap - 1);
    for (;;) {
        tok_map_entry *e = &m->slots[i];
        if (!e->key) {
            e->key = key;
            e->len = (uint32_t)len;
            e->val = val;
            e->hash = h;
            m->n++;
            return 0;
        }
        if (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0) {
            if (overwrite) e->val = val;
            return 0;
        }
        i = (i + 1) & (m->cap - 1);
    }
}

int32_t tok_map_get(const tok_map *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    uint64_t h = fnv_step(FNV_OFF, key, len);
    size_t i = (size_t)h & (m->cap - 1);
    for (;;) {
        const tok_map_entry *e = &m->slots[i];
        if (!e->key) return -1;
        if (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0) return e->val;
        i = (i + 1) & (m->cap - 1);
    }
}

int32_t tok_map_get_pair(const tok_map *m, const char *a, size_t alen, char sep, const char *b,
                         size_t blen) {
    if (!m->cap) return -1;
    uint64_t h = fnv_step(fnv_step(fnv_step(FNV_OFF, a, alen), &sep, 1), b, blen);
    size_t len = alen + 1 + blen;
    size_t i = (size_t)h & (m->cap - 1);
    for (;;) {
        const tok_map_entry *e = &m->slots[i];
        if (!e->key) return -1;
        if (e->hash == h && e->len == len && memcmp(e->key, a, alen) == 0 &&
            e->key[alen] == sep && memcmp(e->key + alen + 1, b, blen) == 0)
            return e->val;
        i = (i + 1) & (m->cap - 1);
    }
}

/* ---- heap ---- */

void tok_heap_init(tok_heap *h, size_t esz, bool (*lower)(const void *, const void *)) {
    h->data = NULL;
    h->n = h->cap = 0;
    h->esz = esz;
    h->lower = lower;
}

void tok_heap_free(tok_heap *h) {
    free(h->data);
    h->data = NULL;
    h->n = h->cap = 0;
}

static void swap_elems(tok_heap *h, size_t i, size_t j) {
    char tmp[64];
    char *a = h->data + i * h->esz, *b = h->data + j * h->esz;
    memcpy(tmp, a, h->esz);
    memcpy(a, b, h->esz);
    memcpy(b, tmp, h->esz);
}

#define ELEM(h, i) ((h)->data + (i) * (h)->esz)

int tok_heap_push(tok_heap *h, const void *elem) {
    if (h->esz > 64) return -1;
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        char *nd = realloc(h->data, nc * h->esz);
        if (!nd) return -1;
        h->data = nd;
        h->cap = nc;
    }
    memcpy(ELEM(h, h->n), elem, h->esz);
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!h->lower(ELEM(h, p), ELEM(h, i))) break;
        swap_elems(h, p, i);
        i = p;
    }
    return 0;
}

bool tok_heap_pop(tok_heap *h, void *out) {
    if (h->n == 0) return false;
    memcpy(out, ELEM(h, 0), h->esz);
    h->n--;
    if (h->n == 0) return true;
    memcpy(ELEM(h, 0), ELEM(h, h->n), h->esz);
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        if (l < h->n && h->lower(ELEM(h, best), ELEM(h, l))) best = l;
        if (r < h->n && h->lower(ELEM(h, best), ELEM(h, r))) best = r;
        if (best == i) break;
        swap_elems(h, i, best);
        i = best;
    }
    return true;
}

/* ---- ids ---- */

int tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 32;
        int32_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = id;
    return 0;
}

/* ---- UTF-8 ---- */

size_t tok_utf8_len(uint8_t lead) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}
