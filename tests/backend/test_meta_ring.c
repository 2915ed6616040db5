/* test_meta_ring.c — compute/cuda/meta_ring.h with fake events: a fake GPU
 * "copies" each taken range later; the test checks that the ring never hands
 * out bytes the fake GPU has not finished copying from (every reuse of a
 * segment waited for that segment's event), that it waits only on reuse,
 * that offsets are aligned and stay inside their segment, and that a take
 * larger than a segment and a failing wait are clear errors.
 */
#include <string.h>

#include "compute/cuda/meta_ring.h"
#include "tests/testutil.h"

#define SEG 4096
#define NSEG 4

/* The fake stream: every take becomes a pending copy with a sequence number;
 * an event records the last sequence number issued; a wait "completes" every
 * copy up to it. */
typedef struct fake_gpu {
    uint64_t issued;            /* copies issued so far */
    uint64_t done;              /* copies finished (the GPU's progress) */
    uint64_t event[NSEG];       /* each segment's recorded event */
    int records[NSEG], waits[NSEG];
    uint64_t copy_seq[NSEG * SEG / META_RING_ALIGN]; /* per aligned unit: the copy reading it */
    int fail_wait;
} fake_gpu;

static int f_record(void *ctx, int seg, st_err *err) {
    (void)err;
    fake_gpu *g = ctx;
    g->event[seg] = g->issued;
    g->records[seg]++;
    return 0;
}

static int f_wait(void *ctx, int seg, st_err *err) {
    fake_gpu *g = ctx;
    if (g->fail_wait) return st_errf(err, "event wait timed out");
    if (g->done < g->event[seg]) g->done = g->event[seg];
    g->waits[seg]++;
    return 0;
}

static const meta_ring_ops fops = {f_record, f_wait};

/* Takes n bytes and checks that no byte of them is still being copied. */
static int64_t take_checked(meta_ring *r, fake_gpu *g, size_t n) {
    st_err err;
    int64_t at = meta_ring_take(r, n, &err);
    if (at < 0) return at;
    size_t used = meta_ring_aligned(n);
    CHECK_EQ_INT(at % META_RING_ALIGN, 0);
    CHECK_MSG((size_t)at / SEG == ((size_t)at + used - 1) / SEG, "take of %zu at %lld crosses a segment", n, (long long)at);
    for (size_t u = (size_t)at / META_RING_ALIGN; u < ((size_t)at + used) / META_RING_ALIGN; u++) {
        CHECK_MSG(g->copy_seq[u] <= g->done, "unit %zu still read by copy %llu (GPU done %llu)", u,
                  (unsigned long long)g->copy_seq[u], (unsigned long long)g->done);
        g->copy_seq[u] = g->issued + 1;
    }
    g->issued++; /* the caller's cudaMemcpyAsync from it */
    return at;
}

static void test_first_pass_no_wait(void) {
    fake_gpu g = {0};
    meta_ring r;
    st_err err;
    REQUIRE(meta_ring_init(&r, SEG, NSEG, &fops, &g, &err) == 0);
    /* Five takes fill segment 0 exactly; the sixth opens segment 1. */
    CHECK_EQ_INT(take_checked(&r, &g, 1000), 0);
    CHECK_EQ_INT(take_checked(&r, &g, 1024), 1024);
    CHECK_EQ_INT(take_checked(&r, &g, 1), 2048);
    CHECK_EQ_INT(take_checked(&r, &g, 0), 2304);
    CHECK_EQ_INT(take_checked(&r, &g, 1536), 2560);
    CHECK_EQ_INT(r.closes, 0);
    CHECK_EQ_INT(take_checked(&r, &g, 1), SEG);
    CHECK_EQ_INT(r.closes, 1);
    CHECK_EQ_INT(g.records[0], 1);
    CHECK_EQ_INT(g.event[0], 5); /* after the 5 copies from segment 0 */
    /* Until the ring wraps nothing is waited for. */
    CHECK_EQ_INT(take_checked(&r, &g, SEG), 2 * SEG);
    CHECK_EQ_INT(take_checked(&r, &g, SEG), 3 * SEG);
    CHECK_EQ_INT(r.waits, 0);
    CHECK_EQ_INT(g.done, 0);
    /* The wrap waits for segment 0's event (its 5 copies), and only it. */
    CHECK_EQ_INT(take_checked(&r, &g, 10), 0);
    CHECK_EQ_INT(r.waits, 1);
    CHECK_EQ_INT(g.waits[0], 1);
    CHECK_EQ_INT(g.done, 5);
    CHECK_EQ_INT(g.waits[1] + g.waits[2] + g.waits[3], 0);
}

/* Many random-sized takes: never a byte reused before its copy is done, and
 * each segment waited for exactly once per reuse. */
static void test_many_wraps(void) {
    fake_gpu g = {0};
    meta_ring r;
    st_err err;
    REQUIRE(meta_ring_init(&r, SEG, NSEG, &fops, &g, &err) == 0);
    uint32_t x = 12345;
    for (int i = 0; i < 20000; i++) {
        x = x * 1664525u + 1013904223u;
        size_t n = (x >> 8) % (SEG + 1);
        REQUIRE(take_checked(&r, &g, n) >= 0);
    }
    CHECK(r.closes > 100);
    /* Every close but the last NSEG - 1 was followed by a wait on reuse. */
    CHECK_EQ_INT(r.waits, r.closes - (NSEG - 1));
    int total = 0;
    for (int s = 0; s < NSEG; s++) total += g.waits[s];
    CHECK_EQ_INT(total, (int)r.waits);
    CHECK_EQ_INT(r.takes, 20000);
}

static void test_errors(void) {
    fake_gpu g = {0};
    meta_ring r;
    st_err err;
    CHECK(meta_ring_init(&r, 1000, NSEG, &fops, &g, &err) == -1); /* not a multiple of the alignment */
    CHECK(meta_ring_init(&r, SEG, 1, &fops, &g, &err) == -1);
    CHECK(meta_ring_init(&r, SEG, META_RING_MAX_SEGS + 1, &fops, &g, &err) == -1);
    REQUIRE(meta_ring_init(&r, SEG, 2, &fops, &g, &err) == 0);
    CHECK_EQ_INT(meta_ring_take(&r, SEG + 1, &err), -1);
    CHECK_MSG(strstr(err.msg, "4097 bytes of op metadata exceed its 4096-byte segments") != NULL, "%s", err.msg);
    CHECK_EQ_INT(meta_ring_take(&r, SEG, &err), 0);
    CHECK_EQ_INT(meta_ring_take(&r, SEG, &err), SEG);
    g.fail_wait = 1; /* the wrap's wait fails (a hung GPU): the take fails */
    CHECK_EQ_INT(meta_ring_take(&r, 1, &err), -1);
    CHECK_MSG(strstr(err.msg, "event wait timed out") != NULL, "%s", err.msg);
    g.fail_wait = 0; /* and waits again next time rather than hand out busy bytes */
    CHECK_EQ_INT(meta_ring_take(&r, 1, &err), 0);
    CHECK_EQ_INT(g.waits[0], 1);
    CHECK_EQ_INT(meta_ring_seg_bytes_for(10), 1 << 20);
    CHECK_EQ_INT(meta_ring_seg_bytes_for((3 << 20) + 1), (3 << 20) + META_RING_ALIGN);
}

/* A reference to an earlier take stays valid until its segment is reopened. */
static void test_refs(void) {
    fake_gpu g = {0};
    meta_ring r;
    st_err err;
    REQUIRE(meta_ring_init(&r, SEG, NSEG, &fops, &g, &err) == 0);
    int64_t a = meta_ring_take(&r, 100, &err);
    meta_ring_ref ra = meta_ring_ref_of(&r, a, 100);
    CHECK_EQ_INT(ra.seg, 0);
    CHECK(meta_ring_still_has(&r, &ra));
    /* Segments 1, 2 and then 3 keep segment 0 (and ra) untouched. */
    CHECK_EQ_INT(meta_ring_take(&r, SEG, &err), SEG);
    CHECK_EQ_INT(meta_ring_take(&r, SEG, &err), 2 * SEG);
    CHECK(meta_ring_still_has(&r, &ra));
    int64_t b = meta_ring_take(&r, 1024, &err);
    CHECK_EQ_INT(b, 3 * SEG);
    meta_ring_ref rb = meta_ring_ref_of(&r, b, 1024);
    CHECK_EQ_INT(rb.seg, 3);
    CHECK(meta_ring_still_has(&r, &ra));
    /* The wrap reopens segment 0: ra is gone, rb stays. */
    REQUIRE(meta_ring_take(&r, SEG, &err) == 0);
    CHECK(!meta_ring_still_has(&r, &ra));
    CHECK(meta_ring_still_has(&r, &rb));
    meta_ring_ref none = meta_ring_ref_of(&r, -1, 0);
    CHECK(!meta_ring_still_has(&r, &none));
    CHECK(!meta_ring_still_has(&r, NULL));
}

int main(void) {
    test_refs();
    test_first_pass_no_wait();
    test_many_wraps();
    test_errors();
    return test_summary();
}
