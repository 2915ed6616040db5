/* block_manager.c — refcounted KV blocks, the prefix cache's content
 * addresses (a chained hash table keyed by the digest) and the eviction order
 * (a doubly linked list of cached blocks, least recently released first).
 * See block_manager.h. */
#include "coordinator/serve/block_manager.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sha256.h"

struct block_manager {
    int32_t n_blocks, block_size;
    bool caching;
    int32_t *ref;          /* owners of each block */
    uint8_t *addressed;    /* in the hash table (findable) */
    uint8_t *prefix;       /* published in this life (may be shared; stays after a reset) */
    uint8_t *in_lru;       /* cached: refcount 0 and addressed */
    bm_hash *hash;         /* the address, when addressed */
    int32_t *toks;         /* block_size tokens per addressed block (the collision check) */
    int32_t *bucket;       /* hash table heads, n_buckets (a power of two); -1 = empty */
    int32_t *chain;        /* next block in the same bucket */
    int32_t n_buckets;
    int32_t *lru_prev, *lru_next, lru_head, lru_tail, n_lru;
    int32_t *free_stack, n_free; /* plain free blocks; the top is the lowest id */
    uint64_t evictions;
    uint8_t *verify_seen;  /* bm_verify's scratch */
};

block_manager *bm_new(int32_t n_blocks, int32_t block_size, bool prefix_caching, st_err *err) {
    if (n_blocks < 1 || block_size < 1)
        return (void)st_errf(err, "kv: n_blocks (%d) and block_size (%d) must be >= 1",
                             (int)n_blocks, (int)block_size),
               NULL;
    block_manager *m = calloc(1, sizeof *m);
    if (!m) return (void)st_errf(err, "kv: out of memory"), NULL;
    m->n_blocks = n_blocks;
    m->block_size = block_size;
    m->caching = prefix_caching;
    m->n_buckets = 1;
    while (m->n_buckets < n_blocks && m->n_buckets < (1 << 30)) m->n_buckets <<= 1;
    size_t nb = (size_t)n_blocks;
    m->ref = calloc(nb, sizeof *m->ref);
    m->addressed = calloc(nb, 1);
    m->prefix = calloc(nb, 1);
    m->in_lru = calloc(nb, 1);
    m->lru_prev = malloc(nb * sizeof *m->lru_prev);
    m->lru_next = malloc(nb * sizeof *m->lru_next);
    m->free_stack = malloc(nb * sizeof *m->free_stack);
    m->verify_seen = calloc(nb, 1);
    if (prefix_caching) {
        m->hash = calloc(nb, sizeof *m->hash);
        m->toks = calloc(nb * (size_t)block_size, sizeof *m->toks);
        m->bucket = malloc((size_t)m->n_buckets * sizeof *m->bucket);
        m->chain = malloc(nb * sizeof *m->chain);
    }
    if (!m->ref || !m->addressed || !m->prefix || !m->in_lru || !m->lru_prev || !m->lru_next ||
        !m->free_stack || !m->verify_seen ||
        (prefix_caching && (!m->hash || !m->toks || !m->bucket || !m->chain))) {
        bm_free(m);
        return (void)st_errf(err, "kv: out of memory for %d blocks", (int)n_blocks), NULL;
    }
    for (int32_t i = 0; i < n_blocks; i++) m->free_stack[i] = n_blocks - 1 - i;
    m->n_free = n_blocks;
    m->lru_head = m->lru_tail = -1;
    if (m->bucket)
        for (int32_t i = 0; i < m->n_buckets; i++) m->bucket[i] = -1;
    return m;
}

void bm_free(block_manager *m) {
    if (!m) return;
    free(m->ref);
    free(m->addressed);
    free(m->prefix);
    free(m->in_lru);
    free(m->hash);
    free(m->toks);
    free(m->bucket);
    free(m->chain);
    free(m->lru_prev);
    free(m->lru_next);
    free(m->free_stack);
    free(m->verify_seen);
    free(m);
}

int32_t bm_n_blocks(const block_manager *m) { return m->n_blocks; }
int32_t bm_block_size(const block_manager *m) { return m->block_size; }
bool bm_prefix_caching(const block_manager *m) { return m->caching; }
int32_t bm_n_free(const block_manager *m) { return m->n_free + m->n_lru; }
int32_t bm_n_evictable(const block_manager *m) { return m->n_lru; }
uint64_t bm_evictions(const block_manager *m) { return m->evictions; }

int32_t bm_blocks_for(const block_manager *m, int64_t n_tokens) {
    if (n_tokens <= 0) return 0;
    return (int32_t)((n_tokens + m->block_size - 1) / m->block_size);
}

int32_t bm_refcount(const block_manager *m, int32_t block) {
    return block >= 0 && block < m->n_blocks ? m->ref[block] : -1;
}

static uint32_t bucket_of(const block_manager *m, const bm_hash *h) {
    uint32_t k;
    memcpy(&k, h->b, sizeof k);
    return k & (uint32_t)(m->n_buckets - 1);
}

static void lru_unlink(block_manager *m, int32_t b) {
    int32_t p = m->lru_prev[b], n = m->lru_next[b];
    if (p >= 0) m->lru_next[p] = n; else m->lru_head = n;
    if (n >= 0) m->lru_prev[n] = p; else m->lru_tail = p;
    m->in_lru[b] = 0;
    m->n_lru--;
}

static void lru_append(block_manager *m, int32_t b) {
    m->lru_prev[b] = m->lru_tail;
    m->lru_next[b] = -1;
    if (m->lru_tail >= 0) m->lru_next[m->lru_tail] = b; else m->lru_head = b;
    m->lru_tail = b;
    m->in_lru[b] = 1;
    m->n_lru++;
}

/* Takes b out of the hash table (it stays a prefix block while owned). */
static void unaddress(block_manager *m, int32_t b) {
    if (!m->addressed[b]) return;
    int32_t *pp = &m->bucket[bucket_of(m, &m->hash[b])];
    while (*pp != b) pp = &m->chain[*pp];
    *pp = m->chain[b];
    m->addressed[b] = 0;
}

int32_t bm_alloc(block_manager *m) {
    int32_t b;
    if (m->n_free > 0) {
        b = m->free_stack[--m->n_free];
    } else if (m->lru_head >= 0) {
        b = m->lru_head;
        lru_unlink(m, b);
        unaddress(m, b);
        m->evictions++;
    } else {
        return -1;
    }
    m->ref[b] = 1;
    m->prefix[b] = 0;
    return b;
}

/* Pushes b on the free stack keeping the lowest id on top (stable ids for
 * tests and logs; the stack is short in the common case). */
static void free_push(block_manager *m, int32_t b) {
    int32_t i = m->n_free++;
    while (i > 0 && m->free_stack[i - 1] < b) {
        m->free_stack[i] = m->free_stack[i - 1];
        i--;
    }
    m->free_stack[i] = b;
}

void bm_release(block_manager *m, int32_t block) {
    if (block < 0 || block >= m->n_blocks || m->ref[block] <= 0) {
        /* A double release would corrupt the pool: refuse it loudly. */
        fprintf(stderr, "block_manager: release of block %d with refcount %d\n", (int)block,
                block >= 0 && block < m->n_blocks ? (int)m->ref[block] : -1);
        abort();
    }
    if (--m->ref[block] > 0) return;
    if (m->addressed[block]) {
        lru_append(m, block);
    } else {
        m->prefix[block] = 0;
        free_push(m, block);
    }
}

void bm_ref(block_manager *m, int32_t block) {
    if (m->ref[block] == 0 && m->in_lru[block]) lru_unlink(m, block);
    m->ref[block]++;
}

int bm_chain_hash(const block_manager *m, const bm_hash *parent, const int32_t *tokens, bm_hash *out) {
    /* int32 little-endian on every host this builds for (x86-64, aarch64). */
    const void *parts[2] = {parent ? parent->b : NULL, tokens};
    size_t lens[2] = {parent ? sizeof parent->b : 0, sizeof(int32_t) * (size_t)m->block_size};
    return st_sha256_parts(parts, lens, 2, out->b);
}

int32_t bm_find(const block_manager *m, const bm_hash *h, const int32_t *tokens) {
    if (!m->caching) return -1;
    size_t bytes = sizeof(int32_t) * (size_t)m->block_size;
    for (int32_t b = m->bucket[bucket_of(m, h)]; b >= 0; b = m->chain[b])
        if (memcmp(m->hash[b].b, h->b, sizeof h->b) == 0 &&
            memcmp(m->toks + (size_t)b * (size_t)m->block_size, tokens, bytes) == 0)
            return b;
    return -1;
}

void bm_publish(block_manager *m, int32_t block, const bm_hash *h, const int32_t *tokens) {
    if (!m->caching || block < 0 || block >= m->n_blocks || m->ref[block] < 1 ||
        m->addressed[block] || m->prefix[block])
        return;
    if (bm_find(m, h, tokens) >= 0) return;
    m->hash[block] = *h;
    memcpy(m->toks + (size_t)block * (size_t)m->block_size, tokens,
           sizeof(int32_t) * (size_t)m->block_size);
    uint32_t k = bucket_of(m, h);
    m->chain[block] = m->bucket[k];
    m->bucket[k] = block;
    m->addressed[block] = 1;
    m->prefix[block] = 1;
}

void bm_reset_cache(block_manager *m) {
    if (!m->caching) return;
    while (m->lru_head >= 0) {
        int32_t b = m->lru_head;
        lru_unlink(m, b);
        m->addressed[b] = 0;
        m->prefix[b] = 0;
        free_push(m, b);
    }
    for (int32_t i = 0; i < m->n_buckets; i++) m->bucket[i] = -1;
    memset(m->addressed, 0, (size_t)m->n_blocks);
}

int bm_verify(const block_manager *m, const int32_t *owners, char *msg, size_t cap) {
    int32_t n_free = 0, n_lru = 0;
    uint8_t *seen = m->verify_seen; /* scratch: no heap block per check (sched.c) */
    memset(seen, 0, (size_t)m->n_blocks);
    int rc = -1;
    for (int32_t i = 0; i < m->n_free; i++) {
        int32_t b = m->free_stack[i];
        if (b < 0 || b >= m->n_blocks || seen[b]) {
            snprintf(msg, cap, "free list holds block %d twice or out of range", (int)b);
            goto out;
        }
        seen[b] = 1;
        n_free++;
    }
    for (int32_t b = m->lru_head; b >= 0; b = m->lru_next[b]) {
        if (seen[b]) {
            snprintf(msg, cap, "block %d is both free and cached (or cached twice)", (int)b);
            goto out;
        }
        seen[b] = 2;
        n_lru++;
    }
    if (n_lru != m->n_lru) {
        snprintf(msg, cap, "the eviction list has %d blocks but counts %d", (int)n_lru, (int)m->n_lru);
        goto out;
    }
    for (int32_t b = 0; b < m->n_blocks; b++) {
        if (owners[b] != m->ref[b]) {
            snprintf(msg, cap, "block %d has refcount %d but %d block tables hold it", (int)b,
                     (int)m->ref[b], (int)owners[b]);
            goto out;
        }
        if (owners[b] > 1 && !m->prefix[b]) {
            snprintf(msg, cap, "block %d is held by %d live sequences but is not a shared prefix block",
                     (int)b, (int)owners[b]);
            goto out;
        }
        if (m->ref[b] == 0 && !seen[b]) {
            snprintf(msg, cap, "block %d has refcount 0 but is neither free nor cached", (int)b);
            goto out;
        }
        if (m->ref[b] > 0 && seen[b]) {
            snprintf(msg, cap, "block %d has refcount %d but is on the %s list", (int)b,
                     (int)m->ref[b], seen[b] == 1 ? "free" : "cached");
            goto out;
        }
        if (seen[b] == 1 && (m->addressed[b] || m->prefix[b])) {
            snprintf(msg, cap, "free block %d still has a content address", (int)b);
            goto out;
        }
        if (seen[b] == 2 && !m->addressed[b]) {
            snprintf(msg, cap, "cached block %d has no content address", (int)b);
            goto out;
        }
    }
    (void)n_free;
    rc = 0;
out:
    return rc;
}
