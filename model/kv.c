/* kv.c — the paged KV block allocator (a free bitmap, lowest id first) and
 * per-sequence block tables. See kv.h. */
#include "model/kv.h"

#include <stdlib.h>
#include <string.h>

struct kv_alloc {
    int32_t n_blocks, block_size, n_free;
    uint8_t *used;   /* used[b] = 1 when taken */
    int32_t hint;    /* no free block below this id */
};

kv_alloc *kv_alloc_new(int32_t n_blocks, int32_t block_size, st_err *err) {
    if (n_blocks < 1 || block_size < 1) {
        st_errf(err, "kv: n_blocks (%d) and block_size (%d) must be >= 1", (int)n_blocks,
                (int)block_size);
        return NULL;
    }
    kv_alloc *a = calloc(1, sizeof *a);
    if (a) a->used = calloc((size_t)n_blocks, 1);
    if (!a || !a->used) {
        free(a);
        st_errf(err, "kv: out of memory for %d blocks", (int)n_blocks);
        return NULL;
    }
    a->n_blocks = n_blocks;
    a->block_size = block_size;
    a->n_free = n_blocks;
    return a;
}

void kv_alloc_free(kv_alloc *a) {
    if (!a) return;
    free(a->used);
    free(a);
}

int32_t kv_alloc_n_blocks(const kv_alloc *a) { return a->n_blocks; }
int32_t kv_alloc_block_size(const kv_alloc *a) { return a->block_size; }
int32_t kv_alloc_n_free(const kv_alloc *a) { return a->n_free; }

int32_t kv_blocks_for(const kv_alloc *a, int64_t n_tokens) {
    if (n_tokens <= 0) return 0;
    return (int32_t)((n_tokens + a->block_size - 1) / a->block_size);
}

int32_t kv_block_get(kv_alloc *a, st_err *err) {
    if (a->n_free == 0) {
        st_errf(err, "kv: out of KV blocks (all %d in use)", (int)a->n_blocks);
        return -1;
    }
    for (int32_t b = a->hint; b < a->n_blocks; b++) {
        if (!a->used[b]) {
            a->used[b] = 1;
            a->n_free--;
            a->hint = b + 1;
            return b;
        }
    }
    st_errf(err, "kv: free count inconsistent");
    return -1;
}

int kv_block_put(kv_alloc *a, int32_t block, st_err *err) {
    if (block < 0 || block >= a->n_blocks)
        return st_errf(err, "kv: block id %d out of range [0, %d)", (int)block, (int)a->n_blocks);
    if (!a->used[block]) return st_errf(err, "kv: block %d is already free", (int)block);
    a->used[block] = 0;
    a->n_free++;
    if (block < a->hint) a->hint = block;
    return 0;
}

void kv_table_init(kv_table *t) { memset(t, 0, sizeof *t); }

int kv_table_reserve(kv_alloc *a, kv_table *t, int64_t n_tokens, st_err *err) {
    int32_t need = kv_blocks_for(a, n_tokens);
    if (need <= t->n_blocks) return 0;
    int32_t more = need - t->n_blocks;
    if (more > a->n_free)
        return st_errf(err, "kv: %d more KV blocks needed for %lld tokens, %d free", (int)more,
                       (long long)n_tokens, (int)a->n_free);
    if (need > t->cap) {
        int32_t cap = t->cap ? t->cap : 8;
        while (cap < need) cap *= 2;
        int32_t *nb = realloc(t->blocks, (size_t)cap * sizeof *nb);
        if (!nb) return st_errf(err, "kv: out of memory for a block table of %d", (int)cap);
        t->blocks = nb;
        t->cap = cap;
    }
    for (int32_t i = 0; i < more; i++) t->blocks[t->n_blocks++] = kv_block_get(a, NULL);
    return 0;
}

void kv_table_release(kv_alloc *a, kv_table *t) {
    for (int32_t i = 0; i < t->n_blocks; i++) kv_block_put(a, t->blocks[i], NULL);
    free(t->blocks);
    kv_table_init(t);
}
