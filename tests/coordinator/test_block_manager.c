/* test_block_manager.c — the KV block pool (coordinator/serve/block_manager.h):
 * allocation order and refcounts, chain hashes (a block's address depends on
 * every token before it), the token check behind a digest match, LRU
 * eviction of cached blocks, the cache reset, the invariant check catching
 * each kind of violation, and a double release aborting. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coordinator/serve/block_manager.h"
#include "tests/testutil.h"

#define BS 4

static void fill(int32_t *t, int n, int base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

/* owners[] from the refcounts (what a correct scheduler would count). */
static void owners_of(const block_manager *m, int32_t *owners) {
    for (int32_t b = 0; b < bm_n_blocks(m); b++) owners[b] = bm_refcount(m, b);
}

static void test_alloc_and_refcounts(void) {
    st_err e;
    CHECK(bm_new(0, 4, true, &e) == NULL);
    CHECK(bm_new(4, 0, true, &e) == NULL);
    block_manager *m = bm_new(4, BS, false, &e);
    REQUIRE(m);
    CHECK_EQ_INT(bm_blocks_for(m, 0), 0);
    CHECK_EQ_INT(bm_blocks_for(m, 4), 1);
    CHECK_EQ_INT(bm_blocks_for(m, 5), 2);
    CHECK_EQ_INT(bm_alloc(m), 0); /* lowest id first */
    CHECK_EQ_INT(bm_alloc(m), 1);
    CHECK_EQ_INT(bm_alloc(m), 2);
    CHECK_EQ_INT(bm_alloc(m), 3);
    CHECK_EQ_INT(bm_alloc(m), -1);
    CHECK_EQ_INT(bm_n_free(m), 0);
    bm_release(m, 2);
    bm_release(m, 0);
    CHECK_EQ_INT(bm_n_free(m), 2);
    CHECK_EQ_INT(bm_alloc(m), 0);
    CHECK_EQ_INT(bm_alloc(m), 2);
    /* Caching off: publish does nothing, so nothing is ever found or cached. */
    int32_t t[BS];
    fill(t, BS, 10);
    bm_hash h;
    REQUIRE(bm_chain_hash(m, NULL, t, &h) == 0);
    bm_publish(m, 0, &h, t);
    CHECK_EQ_INT(bm_find(m, &h, t), -1);
    bm_release(m, 0);
    CHECK_EQ_INT(bm_n_evictable(m), 0);
    CHECK_EQ_INT(bm_n_free(m), 1);
    int32_t owners[4];
    owners_of(m, owners);
    char msg[200];
    CHECK_EQ_INT(bm_verify(m, owners, msg, sizeof msg), 0);
    bm_free(m);
}

static void test_chain_hash(void) {
    st_err e;
    block_manager *m = bm_new(8, BS, true, &e);
    int32_t a[2 * BS], b[2 * BS];
    fill(a, 2 * BS, 100);
    fill(b, 2 * BS, 100);
    b[0] = 7; /* same second block, different first block */
    bm_hash ha0, ha1, hb0, hb1, again;
    REQUIRE(bm_chain_hash(m, NULL, a, &ha0) == 0);
    REQUIRE(bm_chain_hash(m, &ha0, a + BS, &ha1) == 0);
    REQUIRE(bm_chain_hash(m, NULL, b, &hb0) == 0);
    REQUIRE(bm_chain_hash(m, &hb0, b + BS, &hb1) == 0);
    CHECK(memcmp(ha0.b, hb0.b, 32) != 0);
    CHECK(memcmp(ha1.b, hb1.b, 32) != 0); /* the prefix is part of the address */
    REQUIRE(bm_chain_hash(m, &ha0, a + BS, &again) == 0);
    CHECK(memcmp(ha1.b, again.b, 32) == 0); /* deterministic */
    /* The first block's address is SHA-256 of its 4 int32 (little-endian). */
    int32_t one[BS] = {1, 2, 3, 4};
    bm_hash h1;
    REQUIRE(bm_chain_hash(m, NULL, one, &h1) == 0);
    /* sha256(01000000 02000000 03000000 04000000) */
    static const unsigned char want[8] = {0xcf, 0x97, 0xad, 0xee, 0xdb, 0x59, 0xe0, 0x5b};
    CHECK(memcmp(h1.b, want, sizeof want) == 0);
    bm_free(m);
}

static void test_publish_find_and_share(void) {
    st_err e;
    block_manager *m = bm_new(4, BS, true, &e);
    int32_t t[BS], u[BS];
    fill(t, BS, 1);
    fill(u, BS, 1);
    u[3] = 99;
    bm_hash h;
    REQUIRE(bm_chain_hash(m, NULL, t, &h) == 0);
    int32_t b = bm_alloc(m);
    CHECK_EQ_INT(bm_find(m, &h, t), -1); /* not published yet */
    bm_publish(m, b, &h, t);
    CHECK_EQ_INT(bm_find(m, &h, t), b);
    /* The same digest with other tokens (a collision) is not a match. */
    CHECK_EQ_INT(bm_find(m, &h, u), -1);
    /* A second block with the same address is not published: the first stays. */
    int32_t b2 = bm_alloc(m);
    bm_publish(m, b2, &h, t);
    CHECK_EQ_INT(bm_find(m, &h, t), b);
    /* Shared: two owners. */
    bm_ref(m, b);
    CHECK_EQ_INT(bm_refcount(m, b), 2);
    int32_t owners[4];
    char msg[200];
    owners_of(m, owners);
    CHECK_EQ_INT(bm_verify(m, owners, msg, sizeof msg), 0);
    /* An unpublished block held twice is a violation. */
    bm_ref(m, b2);
    owners_of(m, owners);
    CHECK_EQ_INT(bm_verify(m, owners, msg, sizeof msg), -1);
    CHECK(strstr(msg, "not a shared prefix block") != NULL);
    bm_release(m, b2);
    /* Refcount and owners disagree. */
    owners_of(m, owners);
    owners[b] = 1;
    CHECK_EQ_INT(bm_verify(m, owners, msg, sizeof msg), -1);
    CHECK(strstr(msg, "refcount 2 but 1 block tables") != NULL);
    /* Released by both: cached (findable, allocatable), not free. */
    bm_release(m, b);
    bm_release(m, b);
    CHECK_EQ_INT(bm_refcount(m, b), 0);
    CHECK_EQ_INT(bm_n_evictable(m), 1);
    CHECK_EQ_INT(bm_n_free(m), 3); /* 2 free + 1 cached; b2 still owned */
    CHECK_EQ_INT(bm_find(m, &h, t), b);
    owners_of(m, owners);
    CHECK_EQ_INT(bm_verify(m, owners, msg, sizeof msg), 0);
    /* Re-referenced from the cache: off the eviction list. */
    bm_ref(m, b);
    CHECK_EQ_INT(bm_n_evictable(m), 0);
    CHECK_EQ_INT(bm_n_free(m), 2);
    bm_release(m, b);
    bm_release(m, b2);
    owners_of(m, owners);
    CHECK_EQ_INT(bm_verify(m, owners, msg, sizeof msg), 0);
    bm_free(m);
}

/* Cached blocks are evicted least recently released first, only when no
 * free block is left; an evicted block's address is gone. */
static void test_lru_eviction(void) {
    st_err e;
    block_manager *m = bm_new(4, BS, true, &e);
    int32_t t[4][BS];
    bm_hash h[4];
    int32_t blk[4];
    for (int i = 0; i < 4; i++) {
        fill(t[i], BS, 10 * (i + 1));
        REQUIRE(bm_chain_hash(m, NULL, t[i], &h[i]) == 0);
        blk[i] = bm_alloc(m);
        bm_publish(m, blk[i], &h[i], t[i]);
    }
    /* Released in the order 2, 0, 3, 1: the eviction order. */
    bm_release(m, blk[2]);
    bm_release(m, blk[0]);
    bm_release(m, blk[3]);
    bm_release(m, blk[1]);
    CHECK_EQ_INT(bm_n_evictable(m), 4);
    CHECK_EQ_INT(bm_n_free(m), 4);
    /* Touch 0 (a cache hit) and give it back: now the most recent. */
    bm_ref(m, blk[0]);
    bm_release(m, blk[0]);
    CHECK_EQ_INT(bm_alloc(m), blk[2]);
    CHECK_EQ_INT(bm_evictions(m), 1);
    CHECK_EQ_INT(bm_find(m, &h[2], t[2]), -1);
    CHECK_EQ_INT(bm_find(m, &h[3], t[3]), blk[3]);
    CHECK_EQ_INT(bm_alloc(m), blk[3]);
    CHECK_EQ_INT(bm_alloc(m), blk[1]);
    CHECK_EQ_INT(bm_find(m, &h[0], t[0]), blk[0]); /* the most recent survives */
    CHECK_EQ_INT(bm_alloc(m), blk[0]);
    CHECK_EQ_INT(bm_alloc(m), -1);
    CHECK_EQ_INT(bm_evictions(m), 4);
    int32_t owners[4];
    char msg[200];
    owners_of(m, owners);
    CHECK_EQ_INT(bm_verify(m, owners, msg, sizeof msg), 0);
    /* A free block is preferred to evicting a cached one. */
    for (int i = 0; i < 4; i++) bm_release(m, i);
    int32_t c = bm_alloc(m);
    bm_publish(m, c, &h[1], t[1]);
    bm_release(m, c);
    CHECK_EQ_INT(bm_n_evictable(m), 1);
    int32_t d = bm_alloc(m);
    CHECK(d != c);
    CHECK_EQ_INT(bm_find(m, &h[1], t[1]), c);
    /* The reset forgets every address: cached blocks become free. */
    bm_reset_cache(m);
    CHECK_EQ_INT(bm_find(m, &h[1], t[1]), -1);
    CHECK_EQ_INT(bm_n_evictable(m), 0);
    CHECK_EQ_INT(bm_n_free(m), 3);
    owners_of(m, owners);
    CHECK_EQ_INT(bm_verify(m, owners, msg, sizeof msg), 0);
    /* A refcount-0 block missing from both lists is reported. */
    owners[d] = 0;
    CHECK_EQ_INT(bm_verify(m, owners, msg, sizeof msg), -1);
    bm_release(m, d);
    bm_free(m);
}

/* A release of a block nobody owns corrupts the pool: it aborts. */
static void test_double_release_aborts(void) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        st_err e;
        block_manager *m = bm_new(2, BS, true, &e);
        int32_t b = bm_alloc(m);
        bm_release(m, b);
        bm_release(m, b);
        _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

int main(void) {
    test_alloc_and_refcounts();
    test_chain_hash();
    test_publish_find_and_share();
    test_lru_eviction();
    test_double_release_aborts();
    return test_summary();
}
