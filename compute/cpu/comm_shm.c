/* comm_shm.c — the CPU shared-memory collectives of compute/comm.h: ranks are
 * threads of one process.
 *
 * Every collective runs the same protocol:
 *   1. the rank publishes a descriptor in its slot (op, count, dtype, root,
 *      buffer pointers, and whether its own arguments were valid);
 *   2. barrier;
 *   3. every rank checks all the descriptors against rank 0's. They all read
 *      the same slots, so they reach the same verdict: either all ranks go on,
 *      or all return -1 with the same message (no rank touches a buffer then);
 *   4. the data phase, reading/writing the other ranks' buffers in place:
 *      - all-reduce: rank r owns chunk r (of `size` near-equal, cache-line
 *        aligned chunks); for each element it sums buf_0 + buf_1 + ... +
 *        buf_{n-1} in rank order (in f32; bf16 rounded once, RNE) into a small
 *        stack block and writes the block into every rank's buffer. The sum is
 *        thus computed once, in a fixed order: bit-identical on every rank and
 *        independent of timing;
 *      - all-gather: rank r copies every rank's send into its own recv;
 *      - broadcast: the other ranks copy from root's published buffer;
 *   5. barrier (the buffers and the slots are free again when it returns).
 *
 * The barrier is a central sense-reversing one: an arrival counter and a
 * 32-bit generation word. The last arriver resets the counter and bumps the
 * generation; the others spin briefly on the generation, then sleep on it with
 * futex(FUTEX_WAIT). The waker only makes the futex syscall when someone is
 * asleep (a sleepers count, ordered with seq_cst against the generation).
 * Spinning is short, and when there are more ranks than CPUs (TP 8 on 2
 * cores) a waiter does not spin at all. Then it yields a few times and sleeps, so
 * the ranks still running get the CPUs.
 */
#define _GNU_SOURCE
#include "common/clock.h"
#include "compute/comm.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sched.h>
#include <unistd.h>

#include "compute/cpu/threadpool.h"

#define CACHE_LINE 64
#define REDUCE_BLOCK 1024 /* elements per stack block of the reduction */
#define MAX_RANKS 1024

enum op_kind { OP_NONE = 0, OP_ALL_REDUCE, OP_ALL_GATHER, OP_BROADCAST, OP_BARRIER };
enum bad_arg { ARG_OK = 0, ARG_NULL, ARG_DTYPE, ARG_ROOT, ARG_SIZE };

static const char *op_name(int k) {
    switch (k) {
    case OP_ALL_REDUCE: return "all_reduce";
    case OP_ALL_GATHER: return "all_gather";
    case OP_BROADCAST: return "broadcast";
    case OP_BARRIER: return "barrier";
    default: return "?";
    }
}

static const char *bad_name(int b) {
    switch (b) {
    case ARG_NULL: return "NULL buffer with a non-zero count";
    case ARG_DTYPE: return "unknown dtype";
    case ARG_ROOT: return "root out of range";
    case ARG_SIZE: return "size overflows size_t";
    default: return "?";
    }
}

/* One rank's published descriptor; one cache line each. */
typedef struct {
    alignas(CACHE_LINE) int kind;
    int dtype;
    int root;
    int bad;
    size_t count; /* elements (all-reduce) or bytes */
    void *buf;    /* all-reduce / broadcast buffer, all-gather recv */
    const void *send;
} shm_slot;

typedef struct {
    alignas(CACHE_LINE) comm c; /* first member: a comm* is a shm_rank* */
    comm_cpu_group *g;
} shm_rank;

struct comm_cpu_group {
    int n;
    int spin;   /* pause iterations before yielding/sleeping */
    int yields; /* sched_yield rounds before sleeping */
    shm_slot *slots;
    shm_rank *ranks;
    alignas(CACHE_LINE) atomic_uint arrived;
    alignas(CACHE_LINE) atomic_uint gen; /* futex word */
    atomic_int sleepers;
};

/* ---------------------------------------------------------------- barrier */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(atomic_uint *addr, unsigned val) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(atomic_uint *addr) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void shm_barrier_wait(comm_cpu_group *g) {
    /* The generation cannot move before this rank arrives, so this is the
     * current one. */
    unsigned gen = atomic_load_explicit(&g->gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&g->arrived, 1, memory_order_acq_rel) == (unsigned)g->n - 1) {
        atomic_store_explicit(&g->arrived, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&g->gen, 1, memory_order_seq_cst); /* releases the reset too */
        if (atomic_load_explicit(&g->sleepers, memory_order_seq_cst) > 0) futex_wake_all(&g->gen);
        return;
    }
    for (int i = 0; i < g->spin; i++) {
        if (atomic_load_explicit(&g->gen, memory_order_acquire) != gen) return;
        cpu_relax();
    }
    for (int i = 0; i < g->yields; i++) {
        if (atomic_load_explicit(&g->gen, memory_order_acquire) != gen) return;
        sched_yield();
    }
    while (atomic_load_explicit(&g->gen, memory_order_acquire) == gen) {
        atomic_fetch_add_explicit(&g->sleepers, 1, memory_order_seq_cst);
        /* Returns at once (EAGAIN) when the generation already moved. */
        futex_wait(&g->gen, gen);
        atomic_fetch_sub_explicit(&g->sleepers, 1, memory_order_relaxed);
    }
}

/* ------------------------------------------------------------- protocol */

/* Steps 1-3: publish, barrier, check. On a mismatch every rank closes with
 * the second barrier and returns -1 with the same message. */
static int shm_begin(shm_rank *h, const shm_slot *mine, st_err *err) {
    comm_cpu_group *g = h->g;
    shm_slot *s = &g->slots[h->c.rank];
    s->kind = mine->kind;
    s->dtype = mine->dtype;
    s->root = mine->root;
    s->bad = mine->bad;
    s->count = mine->count;
    s->buf = mine->buf;
    s->send = mine->send;
    shm_barrier_wait(g);

    const shm_slot *s0 = &g->slots[0];
    for (int k = 0; k < g->n; k++) {
        const shm_slot *sk = &g->slots[k];
        int rc = 0;
        if (sk->kind != s0->kind)
            rc = st_errf(err, "comm (rank %d of %d): collective mismatch: rank 0 called %s, rank %d called %s",
                         h->c.rank, g->n, op_name(s0->kind), k, op_name(sk->kind));
        else if (sk->bad != ARG_OK)
            rc = st_errf(err, "comm %s (rank %d of %d): rank %d: %s", op_name(sk->kind), h->c.rank, g->n, k,
                         bad_name(sk->bad));
        else if (sk->count != s0->count)
            rc = st_errf(err, "comm %s (rank %d of %d): %s mismatch: rank 0 has %zu, rank %d has %zu",
                         op_name(sk->kind), h->c.rank, g->n, sk->kind == OP_ALL_REDUCE ? "count" : "byte count",
                         s0->count, k, sk->count);
        else if (sk->dtype != s0->dtype)
            rc = st_errf(err, "comm %s (rank %d of %d): dtype mismatch: rank 0 has %d, rank %d has %d",
                         op_name(sk->kind), h->c.rank, g->n, s0->dtype, k, sk->dtype);
        else if (sk->root != s0->root)
            rc = st_errf(err, "comm %s (rank %d of %d): root mismatch: rank 0 has %d, rank %d has %d",
                         op_name(sk->kind), h->c.rank, g->n, s0->root, k, sk->root);
        if (rc) {
            shm_barrier_wait(g);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ reduction */

/* Same rounding as st_f32_to_bf16 / st_bf16_to_f32 (common/dtype.c), inlined
 * so that the block loops vectorize. */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t nan = (uint32_t)((x & 0x7fffffffu) > 0x7f800000u);
    uint32_t rne = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t qnan = (x >> 16) | 0x40u;
    return (uint16_t)(nan ? qnan : rne);
}

/* [lo, hi) of chunk r of count elements, chunk edges on cache lines. */
static void shm_chunk(size_t count, size_t elem, int r, int n, size_t *lo, size_t *hi) {
    size_t unit = CACHE_LINE / elem;
    size_t units = (count + unit - 1) / unit;
    long l, h;
    st_split_range((long)units, r, n, &l, &h);
    *lo = (size_t)l * unit;
    *hi = (size_t)h * unit;
    if (*lo > count) *lo = count;
    if (*hi > count) *hi = count;
}

/* The loops below run in fixed groups of VEC elements (a constant trip
 * count, which GCC's -O2 cost model vectorizes) plus a scalar tail. Per
 * element the order of the additions is unchanged: rank 0, 1, ..., n-1. */
#define VEC 16

static inline void add_f32(float *restrict acc, const float *restrict src, size_t m) {
    size_t i = 0;
    for (; i + VEC <= m; i += VEC)
        for (int j = 0; j < VEC; j++) acc[i + j] += src[i + j];
    for (; i < m; i++) acc[i] += src[i];
}

static inline void load_bf16(float *restrict acc, const uint16_t *restrict src, size_t m) {
    size_t i = 0;
    for (; i + VEC <= m; i += VEC)
        for (int j = 0; j < VEC; j++) acc[i + j] = bf16_to_f32(src[i + j]);
    for (; i < m; i++) acc[i] = bf16_to_f32(src[i]);
}

static inline void add_bf16(float *restrict acc, const uint16_t *restrict src, size_t m) {
    size_t i = 0;
    for (; i + VEC <= m; i += VEC)
        for (int j = 0; j < VEC; j++) acc[i + j] += bf16_to_f32(src[i + j]);
    for (; i < m; i++) acc[i] += bf16_to_f32(src[i]);
}

static inline void round_bf16(uint16_t *restrict out, const float *restrict acc, size_t m) {
    size_t i = 0;
    for (; i + VEC <= m; i += VEC)
        for (int j = 0; j < VEC; j++) out[i + j] = f32_to_bf16(acc[i + j]);
    for (; i < m; i++) out[i] = f32_to_bf16(acc[i]);
}

static void reduce_f32(comm_cpu_group *g, size_t lo, size_t hi) {
    int n = g->n;
    float tmp[REDUCE_BLOCK];
    for (size_t b = lo; b < hi; b += REDUCE_BLOCK) {
        size_t m = hi - b < REDUCE_BLOCK ? hi - b : REDUCE_BLOCK;
        memcpy(tmp, (const float *)g->slots[0].buf + b, m * sizeof(float));
        for (int k = 1; k < n; k++) add_f32(tmp, (const float *)g->slots[k].buf + b, m);
        for (int k = 0; k < n; k++) memcpy((float *)g->slots[k].buf + b, tmp, m * sizeof(float));
    }
}

static void reduce_bf16(comm_cpu_group *g, size_t lo, size_t hi) {
    int n = g->n;
    float tmp[REDUCE_BLOCK];
    uint16_t out[REDUCE_BLOCK];
    for (size_t b = lo; b < hi; b += REDUCE_BLOCK) {
        size_t m = hi - b < REDUCE_BLOCK ? hi - b : REDUCE_BLOCK;
        load_bf16(tmp, (const uint16_t *)g->slots[0].buf + b, m);
        for (int k = 1; k < n; k++) add_bf16(tmp, (const uint16_t *)g->slots[k].buf + b, m);
        round_bf16(out, tmp, m);
        for (int k = 0; k < n; k++) memcpy((uint16_t *)g->slots[k].buf + b, out, m * sizeof(uint16_t));
    }
}

/* ------------------------------------------------------------------ ops */

static int shm_all_reduce_sum(comm *c, void *buf, size_t count, enum comm_dtype dtype, st_err *err) {
    if (!c) return st_errf(err, "comm all_reduce: NULL comm");
    shm_rank *h = (shm_rank *)c;
    double t0 = st_now_s();
    shm_slot me = {.kind = OP_ALL_REDUCE, .dtype = (int)dtype, .root = 0, .count = count, .buf = buf};
    if (dtype != COMM_F32 && dtype != COMM_BF16) me.bad = ARG_DTYPE;
    else if (!buf && count) me.bad = ARG_NULL;
    else if (count > SIZE_MAX / 4) me.bad = ARG_SIZE;
    int rc = shm_begin(h, &me, err);
    if (rc == 0) {
        comm_cpu_group *g = h->g;
        size_t elem = dtype == COMM_F32 ? 4 : 2, lo, hi;
        shm_chunk(count, elem, c->rank, g->n, &lo, &hi);
        if (dtype == COMM_F32) reduce_f32(g, lo, hi);
        else reduce_bf16(g, lo, hi);
        shm_barrier_wait(g);
        c->stats.all_reduce_calls++;
    }
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

static int shm_all_gather(comm *c, const void *send, void *recv, size_t bytes, st_err *err) {
    if (!c) return st_errf(err, "comm all_gather: NULL comm");
    shm_rank *h = (shm_rank *)c;
    comm_cpu_group *g = h->g;
    double t0 = st_now_s();
    shm_slot me = {.kind = OP_ALL_GATHER, .count = bytes, .buf = recv, .send = send};
    if (bytes && (!send || !recv)) me.bad = ARG_NULL;
    else if (bytes > SIZE_MAX / (size_t)g->n) me.bad = ARG_SIZE;
    int rc = shm_begin(h, &me, err);
    if (rc == 0) {
        for (int k = 0; k < g->n && bytes; k++) {
            const void *src = g->slots[k].send;
            void *dst = (char *)recv + (size_t)k * bytes;
            if (src != dst) memcpy(dst, src, bytes); /* in place: rank k's slot already holds it */
        }
        shm_barrier_wait(g);
        c->stats.all_gather_calls++;
    }
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

static int shm_broadcast(comm *c, void *buf, size_t bytes, int root, st_err *err) {
    if (!c) return st_errf(err, "comm broadcast: NULL comm");
    shm_rank *h = (shm_rank *)c;
    comm_cpu_group *g = h->g;
    double t0 = st_now_s();
    shm_slot me = {.kind = OP_BROADCAST, .root = root, .count = bytes, .buf = buf};
    if (root < 0 || root >= g->n) me.bad = ARG_ROOT;
    else if (bytes && !buf) me.bad = ARG_NULL;
    int rc = shm_begin(h, &me, err);
    if (rc == 0) {
        const void *src = g->slots[root].buf;
        if (c->rank != root && bytes && src != buf) memcpy(buf, src, bytes);
        shm_barrier_wait(g);
        c->stats.broadcast_calls++;
    }
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

static int shm_barrier(comm *c, st_err *err) {
    if (!c) return st_errf(err, "comm barrier: NULL comm");
    shm_rank *h = (shm_rank *)c;
    double t0 = st_now_s();
    shm_slot me = {.kind = OP_BARRIER};
    int rc = shm_begin(h, &me, err);
    if (rc == 0) {
        shm_barrier_wait(h->g);
        c->stats.barrier_calls++;
    }
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

static const comm_ops shm_ops = {
    .all_reduce_sum = shm_all_reduce_sum,
    .all_gather = shm_all_gather,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
};

/* ---------------------------------------------------------------- group */

comm_cpu_group *comm_cpu_group_new(int n_ranks, st_err *err) {
    if (n_ranks < 1 || n_ranks > MAX_RANKS)
        return st_errf(err, "comm_cpu_group_new: %d ranks (want 1..%d)", n_ranks, MAX_RANKS), NULL;
    comm_cpu_group *g = aligned_alloc(CACHE_LINE, sizeof *g);
    shm_slot *slots = aligned_alloc(CACHE_LINE, (size_t)n_ranks * sizeof *slots);
    shm_rank *ranks = aligned_alloc(CACHE_LINE, (size_t)n_ranks * sizeof *ranks);
    if (!g || !slots || !ranks) {
        free(g);
        free(slots);
        free(ranks);
        return st_errf(err, "comm_cpu_group_new: out of memory"), NULL;
    }
    memset(g, 0, sizeof *g);
    memset(slots, 0, (size_t)n_ranks * sizeof *slots);
    memset(ranks, 0, (size_t)n_ranks * sizeof *ranks);
    g->n = n_ranks;
    g->slots = slots;
    g->ranks = ranks;
    /* Waiting: a few pauses (a pause is ~20-40 ns here), then sched_yield
     * rounds, then the futex. Yielding behaves like spinning when a core is
     * free and hands the core over when a peer rank (or a pool thread) is
     * waiting for it. Measured on the 2-core box: with 2000 pauses before
     * sleeping a small 2-rank all-reduce took ~1 µs idle but ~100 µs with
     * other load; with 20 pauses + 4 yields, ~2-3 µs either way. When ranks
     * outnumber CPUs a spinner only steals the CPU a peer needs: no pauses. */
    g->spin = n_ranks > st_cpu_count() ? 0 : 20;
    g->yields = 4;
    atomic_init(&g->arrived, 0);
    atomic_init(&g->gen, 0);
    atomic_init(&g->sleepers, 0);
    for (int r = 0; r < n_ranks; r++) {
        ranks[r].c.ops = &shm_ops;
        ranks[r].c.rank = r;
        ranks[r].c.size = n_ranks;
        ranks[r].g = g;
    }
    return g;
}

comm *comm_cpu_rank(comm_cpu_group *g, int rank) {
    if (!g || rank < 0 || rank >= g->n) return NULL;
    return &g->ranks[rank].c;
}

void comm_cpu_group_set_spin(comm_cpu_group *g, int spin_iters) {
    if (g) g->spin = spin_iters < 0 ? 0 : spin_iters;
}

void comm_cpu_group_free(comm_cpu_group *g) {
    if (!g) return;
    free(g->slots);
    free(g->ranks);
    free(g);
}
