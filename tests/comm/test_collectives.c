/* test_collectives.c — the CPU shared-memory collectives (compute/cpu/comm_shm.c)
 * against serial references: all-reduce f32/bf16 (bit-exact rank-order sums),
 * all-gather, broadcast from every root, the counters, mismatch errors on
 * every rank, and a long run of small all-reduces with more ranks than CPUs.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/comm.h"
#include "tests/testutil.h"

/* ------------------------------------------------------------ harness */

typedef int (*rank_fn)(comm *c, void *ctx); /* returns this rank's failures */

typedef struct {
    comm *c;
    rank_fn fn;
    void *ctx;
    int fails;
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    a->fails = a->fn(a->c, a->ctx);
    return NULL;
}

/* Runs fn on every rank of g (one thread each); returns the total failures. */
static int run_group(comm_cpu_group *g, int n, rank_fn fn, void *ctx) {
    pthread_t th[16];
    rank_arg args[16];
    REQUIRE(n <= 16);
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg){.c = comm_cpu_rank(g, r), .fn = fn, .ctx = ctx};
        REQUIRE(args[r].c != NULL);
        REQUIRE(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0);
    }
    int fails = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        fails += args[r].fails;
    }
    return fails;
}

static int run_ranks(int n, rank_fn fn, void *ctx) {
    st_err err;
    comm_cpu_group *g = comm_cpu_group_new(n, &err);
    REQUIRE_MSG(g != NULL, "%s", err.msg);
    int fails = run_group(g, n, fn, ctx);
    comm_cpu_group_free(g);
    return fails;
}

/* --------------------------------------------------------- input values */

static uint64_t mix(uint64_t x) { /* splitmix64 finalizer */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

enum mode { INTS = 0, RANDOM = 1, SPECIAL = 2 };

/* Values that exercise rounding and the IEEE corner cases: overflow to inf,
 * inf - inf = NaN, NaN propagation, signed zeros, subnormals, ties. */
static const float special[] = {0.0f,     -0.0f,         1.0f,   -1.0f,     3e38f,  -3e38f,         1.0f / 0.0f,
                                -1.0f / 0.0f, 0.0f / 0.0f, 1.00390625f, 1e-40f, -1e-40f, 65504.0f, 0.5f,
                                1.0078125f, 257.0f};

/* Element i of rank r's input. INTS: integers in [-1000, 1000] (sums exact);
 * RANDOM: signed values with 24 random mantissa bits over 16 binades;
 * SPECIAL: picks from special[]. */
static float input_f32(enum mode m, uint64_t seed, int r, size_t i) {
    uint64_t h = mix(seed * 0x100000001b3ull ^ mix(((uint64_t)r << 40) ^ i));
    if (m == INTS) return (float)((int)(h % 2001) - 1000);
    if (m == SPECIAL) return special[h % (sizeof special / sizeof special[0])];
    float mant = (float)(h >> 40) / 16777216.0f - 0.5f;
    int e = (int)((h >> 8) % 16) - 8;
    float scale = 1.0f;
    for (; e > 0; e--) scale *= 2.0f;
    for (; e < 0; e++) scale *= 0.5f;
    return mant * scale;
}

static uint16_t input_bf16(enum mode m, uint64_t seed, int r, size_t i) {
    return st_f32_to_bf16(input_f32(m, seed, r, i));
}

/* ----------------------------------------------------------- all-reduce */

typedef struct {
    enum comm_dtype dt;
    enum mode mode;
    uint64_t seed;
    size_t count;
    const void *ref; /* the rank-order sum, computed serially */
    uint64_t hash[16]; /* FNV-1a of each rank's result bytes: all equal */
} ar_case;

static uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Bit-for-bit equal, except that any NaN equals any NaN: which NaN an
 * addition returns (sign, payload) depends on the operand order the compiler
 * picks for a commutative +, which IEEE 754 leaves open. */
static int same_elem(const void *a, const void *b, size_t elem) {
    if (!memcmp(a, b, elem)) return 1;
    if (elem == 4) {
        float x, y;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        return x != x && y != y;
    }
    uint16_t x, y;
    memcpy(&x, a, 2);
    memcpy(&y, b, 2);
    return (x & 0x7fff) > 0x7f80 && (y & 0x7fff) > 0x7f80;
}

static int ar_rank(comm *c, void *p) {
    ar_case *k = p;
    size_t elem = k->dt == COMM_F32 ? 4 : 2;
    void *buf = malloc(k->count * elem);
    if (!buf) return 1;
    for (size_t i = 0; i < k->count; i++) {
        if (k->dt == COMM_F32) ((float *)buf)[i] = input_f32(k->mode, k->seed, c->rank, i);
        else ((uint16_t *)buf)[i] = input_bf16(k->mode, k->seed, c->rank, i);
    }
    st_err err;
    int fails = 0;
    if (comm_all_reduce_sum(c, buf, k->count, k->dt, &err) != 0) {
        fprintf(stderr, "rank %d: all_reduce failed: %s\n", c->rank, err.msg);
        fails++;
    } else if (memcmp(buf, k->ref, k->count * elem) != 0) {
        for (size_t i = 0; i < k->count; i++)
            if (!same_elem((char *)buf + i * elem, (const char *)k->ref + i * elem, elem)) {
                fprintf(stderr, "rank %d of %d: %s count %zu: first difference at element %zu\n", c->rank, c->size,
                        k->dt == COMM_F32 ? "f32" : "bf16", k->count, i);
                fails++;
                break;
            }
    }
    k->hash[c->rank] = fnv1a(buf, k->count * elem);
    free(buf);
    return fails;
}

static void check_all_reduce(int n, enum comm_dtype dt, enum mode mode, size_t count, uint64_t seed) {
    ar_case k = {.dt = dt, .mode = mode, .seed = seed, .count = count};
    void *ref = malloc(count * (dt == COMM_F32 ? 4 : 2));
    REQUIRE(ref != NULL);
    for (size_t i = 0; i < count; i++) {
        float s;
        if (dt == COMM_F32) {
            s = input_f32(mode, seed, 0, i);
            for (int r = 1; r < n; r++) s += input_f32(mode, seed, r, i);
            ((float *)ref)[i] = s;
        } else {
            s = st_bf16_to_f32(input_bf16(mode, seed, 0, i));
            for (int r = 1; r < n; r++) s += st_bf16_to_f32(input_bf16(mode, seed, r, i));
            ((uint16_t *)ref)[i] = st_f32_to_bf16(s);
        }
    }
    k.ref = ref;
    int fails = run_ranks(n, ar_rank, &k);
    for (int r = 1; r < n; r++) CHECK_MSG(k.hash[r] == k.hash[0], "all_reduce n=%d: rank %d's bytes differ", n, r);
    CHECK_MSG(fails == 0, "all_reduce %s %s n=%d count=%zu: %d rank(s) wrong", dt == COMM_F32 ? "f32" : "bf16",
              mode == INTS ? "ints" : mode == RANDOM ? "random" : "special", n, count, fails);
    free(ref);
}

/* Integer sums are exact: also check one against the arithmetic directly. */
static void check_int_sum_value(void) {
    int n = 3;
    size_t count = 5;
    float *ref = malloc(count * 4);
    for (size_t i = 0; i < count; i++) {
        double d = 0;
        for (int r = 0; r < n; r++) d += input_f32(INTS, 7, r, i);
        ref[i] = (float)d;
    }
    ar_case k = {.dt = COMM_F32, .mode = INTS, .seed = 7, .count = count, .ref = ref};
    CHECK_EQ_INT(run_ranks(n, ar_rank, &k), 0);
    free(ref);
}

/* ----------------------------------------------------------- all-gather */

typedef struct {
    size_t bytes;
    int in_place;
} ag_case;

static uint8_t gather_byte(int r, size_t i) { return (uint8_t)(mix(((uint64_t)r << 48) ^ i) >> 56); }

static int ag_rank(comm *c, void *p) {
    const ag_case *k = p;
    int n = c->size;
    uint8_t *recv = malloc(k->bytes * (size_t)n + 1);
    uint8_t *send = k->in_place ? recv + (size_t)c->rank * k->bytes : malloc(k->bytes + 1);
    if (!recv || !send) return 1;
    memset(recv, 0xEE, k->bytes * (size_t)n);
    for (size_t i = 0; i < k->bytes; i++) send[i] = gather_byte(c->rank, i);
    st_err err;
    int fails = 0;
    if (comm_all_gather(c, send, recv, k->bytes, &err) != 0) {
        fprintf(stderr, "rank %d: all_gather failed: %s\n", c->rank, err.msg);
        fails++;
    } else {
        for (int r = 0; r < n && !fails; r++)
            for (size_t i = 0; i < k->bytes; i++)
                if (recv[(size_t)r * k->bytes + i] != gather_byte(r, i)) {
                    fprintf(stderr, "rank %d: all_gather %zu bytes: wrong byte %zu of rank %d's part\n", c->rank,
                            k->bytes, i, r);
                    fails++;
                    break;
                }
    }
    if (!k->in_place) free(send);
    free(recv);
    return fails;
}

static void check_all_gather(int n, size_t bytes, int in_place) {
    ag_case k = {.bytes = bytes, .in_place = in_place};
    int fails = run_ranks(n, ag_rank, &k);
    CHECK_MSG(fails == 0, "all_gather n=%d bytes=%zu in_place=%d: %d rank(s) wrong", n, bytes, in_place, fails);
}

/* ------------------------------------------------------------ broadcast */

typedef struct {
    size_t bytes;
    int root;
} bc_case;

static int bc_rank(comm *c, void *p) {
    const bc_case *k = p;
    uint8_t *buf = malloc(k->bytes + 1);
    if (!buf) return 1;
    for (size_t i = 0; i < k->bytes; i++) buf[i] = gather_byte(c->rank, i); /* non-roots hold garbage */
    st_err err;
    int fails = 0;
    if (comm_broadcast(c, buf, k->bytes, k->root, &err) != 0) {
        fprintf(stderr, "rank %d: broadcast failed: %s\n", c->rank, err.msg);
        fails++;
    } else {
        for (size_t i = 0; i < k->bytes; i++)
            if (buf[i] != gather_byte(k->root, i)) {
                fprintf(stderr, "rank %d: broadcast root %d %zu bytes: wrong byte %zu\n", c->rank, k->root,
                        k->bytes, i);
                fails++;
                break;
            }
    }
    free(buf);
    return fails;
}

static void check_broadcast(int n, size_t bytes) {
    for (int root = 0; root < n; root++) {
        bc_case k = {.bytes = bytes, .root = root};
        int fails = run_ranks(n, bc_rank, &k);
        CHECK_MSG(fails == 0, "broadcast n=%d bytes=%zu root=%d: %d rank(s) wrong", n, bytes, root, fails);
    }
}

/* ------------------------------------------------------------- counters */

static int counter_rank(comm *c, void *p) {
    (void)p;
    st_err err;
    int fails = 0;
    float v[4] = {1, 2, 3, 4};
    uint8_t send[8], recv[8 * 8], b[8] = {0};
    memset(send, c->rank, sizeof send);
    for (int i = 0; i < 5; i++) fails += comm_all_reduce_sum(c, v, 4, COMM_F32, &err) != 0;
    for (int i = 0; i < 3; i++) fails += comm_all_gather(c, send, recv, sizeof send, &err) != 0;
    for (int i = 0; i < 2; i++) fails += comm_broadcast(c, b, sizeof b, 1, &err) != 0;
    fails += comm_barrier(c, &err) != 0;
    /* A failed call does not count: rank 0 asks for a different count. */
    fails += comm_all_reduce_sum(c, v, c->rank == 0 ? 3 : 4, COMM_F32, &err) != -1;
    return fails;
}

static void check_counters(void) {
    int n = 3;
    st_err err;
    comm_cpu_group *g = comm_cpu_group_new(n, &err);
    REQUIRE(g != NULL);
    CHECK_EQ_INT(run_group(g, n, counter_rank, NULL), 0);
    for (int r = 0; r < n; r++) {
        comm *c = comm_cpu_rank(g, r);
        CHECK_EQ_INT(c->rank, r);
        CHECK_EQ_INT(c->size, n);
        CHECK_EQ_INT(c->stats.all_reduce_calls, 5);
        CHECK_EQ_INT(c->stats.all_gather_calls, 3);
        CHECK_EQ_INT(c->stats.broadcast_calls, 2);
        CHECK_EQ_INT(c->stats.barrier_calls, 1);
        CHECK(c->stats.seconds > 0.0 && c->stats.seconds < 60.0);
    }
    /* Second run on the same group: the counters keep accumulating. */
    CHECK_EQ_INT(run_group(g, n, counter_rank, NULL), 0);
    CHECK_EQ_INT(comm_cpu_rank(g, 2)->stats.all_reduce_calls, 10);
    CHECK_EQ_INT(comm_cpu_rank(g, 0)->stats.barrier_calls, 2);
    comm_cpu_group_free(g);
}

/* ------------------------------------------------------------ mismatches */

enum bad_case {
    BAD_COUNT,       /* the last rank passes one more element */
    BAD_DTYPE_MIX,   /* rank 1 says bf16 */
    BAD_DTYPE_VALUE, /* rank 0 passes an unknown dtype */
    BAD_NULL,        /* rank 1 passes NULL with a count */
    BAD_OP,          /* rank 0 calls barrier, the others all-reduce */
    BAD_ROOT_MIX,    /* broadcast with different roots */
    BAD_ROOT_RANGE,  /* broadcast root == size on all ranks */
    BAD_GATHER_SIZE, /* all-gather with different sizes */
    BAD_N
};

typedef struct {
    enum bad_case which;
    char msgs[16][ST_ERR_MSG_MAX];
} bad_ctx;

static int bad_rank(comm *c, void *p) {
    bad_ctx *k = p;
    int r = c->rank, n = c->size, fails = 0, rc = 0;
    float buf[64];
    uint8_t recv[64 * 16];
    for (int i = 0; i < 64; i++) buf[i] = (float)(r + 1);
    st_err err = {{0}};
    switch (k->which) {
    case BAD_COUNT: rc = comm_all_reduce_sum(c, buf, r == n - 1 ? 33 : 32, COMM_F32, &err); break;
    case BAD_DTYPE_MIX: rc = comm_all_reduce_sum(c, buf, 32, r == 1 ? COMM_BF16 : COMM_F32, &err); break;
    case BAD_DTYPE_VALUE: rc = comm_all_reduce_sum(c, buf, 32, r == 0 ? (enum comm_dtype)7 : COMM_F32, &err); break;
    case BAD_NULL: rc = comm_all_reduce_sum(c, r == 1 ? NULL : buf, 32, COMM_F32, &err); break;
    case BAD_OP: rc = r == 0 ? comm_barrier(c, &err) : comm_all_reduce_sum(c, buf, 32, COMM_F32, &err); break;
    case BAD_ROOT_MIX: rc = comm_broadcast(c, buf, 16, r == 0 ? 1 : 0, &err); break;
    case BAD_ROOT_RANGE: rc = comm_broadcast(c, buf, 16, n, &err); break;
    case BAD_GATHER_SIZE: rc = comm_all_gather(c, buf, recv, r == 0 ? 8 : 16, &err); break;
    default: break;
    }
    if (rc != -1) fails++;
    snprintf(k->msgs[r], ST_ERR_MSG_MAX, "%s", err.msg);
    /* No buffer was touched. */
    for (int i = 0; i < 64; i++)
        if (buf[i] != (float)(r + 1)) {
            fails++;
            break;
        }
    /* The group still works afterwards. */
    if (comm_all_reduce_sum(c, buf, 64, COMM_F32, &err) != 0) fails++;
    float want = (float)(n * (n + 1) / 2);
    for (int i = 0; i < 64; i++)
        if (buf[i] != want) {
            fails++;
            break;
        }
    return fails;
}

static void check_mismatches(void) {
    static const char *expect[BAD_N] = {"count mismatch", "dtype mismatch", "unknown dtype", "NULL buffer",
                                        "collective mismatch", "root mismatch", "root out of range",
                                        "byte count mismatch"};
    int ns[] = {2, 3, 8};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        int n = ns[t];
        for (int w = 0; w < BAD_N; w++) {
            bad_ctx *k = calloc(1, sizeof *k);
            k->which = (enum bad_case)w;
            int fails = run_ranks(n, bad_rank, k);
            CHECK_MSG(fails == 0, "mismatch case %d n=%d: %d failure(s)", w, n, fails);
            for (int r = 0; r < n; r++) {
                CHECK_MSG(strstr(k->msgs[r], expect[w]) != NULL, "case %d n=%d rank %d: message \"%s\"", w, n, r,
                          k->msgs[r]);
            }
            free(k);
        }
    }
}

/* -------------------------------------------------------------- stress */

typedef struct {
    int iters;
    size_t count;
} stress_ctx;

/* Many small all-reduces, each checked: no hang, no stale reads between
 * consecutive calls (the values change every iteration). */
static int stress_rank(comm *c, void *p) {
    const stress_ctx *k = p;
    int n = c->size, fails = 0;
    float buf[256];
    st_err err;
    for (int it = 0; it < k->iters; it++) {
        for (size_t i = 0; i < k->count; i++) buf[i] = (float)((it + c->rank * 3 + (int)i) % 1000);
        if (comm_all_reduce_sum(c, buf, k->count, COMM_F32, &err) != 0) return fails + 1;
        for (size_t i = 0; i < k->count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++) want += (float)((it + r * 3 + (int)i) % 1000);
            if (buf[i] != want) {
                fails++;
                break;
            }
        }
        if (it % 97 == 0 && comm_barrier(c, &err) != 0) fails++;
    }
    return fails;
}

/* ----------------------------------------------------------------- main */

int main(void) {
    st_err err;
    CHECK(comm_cpu_group_new(0, &err) == NULL);
    CHECK(strstr(err.msg, "ranks") != NULL);
    {
        comm_cpu_group *g = comm_cpu_group_new(2, &err);
        REQUIRE(g != NULL);
        CHECK(comm_cpu_rank(g, 2) == NULL);
        CHECK(comm_cpu_rank(g, -1) == NULL);
        comm_cpu_group_free(g);
    }

    static const size_t sizes[] = {1, 2, 3, 17, 1000, 65537};
    static const int ranks[] = {2, 3, 4, 8};
    for (size_t a = 0; a < sizeof ranks / sizeof ranks[0]; a++) {
        int n = ranks[a];
        for (size_t b = 0; b < sizeof sizes / sizeof sizes[0]; b++) {
            size_t s = sizes[b];
            check_all_reduce(n, COMM_F32, INTS, s, 1);
            check_all_reduce(n, COMM_F32, RANDOM, s, 2 + s);
            check_all_reduce(n, COMM_BF16, INTS, s, 3);
            check_all_reduce(n, COMM_BF16, RANDOM, s, 4 + s);
            check_all_gather(n, s, 0);
            check_all_gather(n, s, 1);
            check_broadcast(n, s);
        }
    }
    /* One rank: a no-op that still validates and counts. */
    check_all_reduce(1, COMM_F32, RANDOM, 1000, 9);
    check_broadcast(1, 100);
    check_int_sum_value();
    for (int n = 2; n <= 4; n++) {
        check_all_reduce(n, COMM_F32, SPECIAL, 1000, 21);
        check_all_reduce(n, COMM_BF16, SPECIAL, 1000, 22);
    }

    /* The big ones: 16 MiB of f32 (4 Mi elements) and of bf16 (8 Mi). */
    check_all_reduce(8, COMM_F32, RANDOM, (size_t)4 << 20, 11);
    check_all_reduce(3, COMM_F32, INTS, (size_t)4 << 20, 12);
    check_all_reduce(4, COMM_BF16, RANDOM, (size_t)8 << 20, 13);
    check_all_gather(8, (size_t)2 << 20, 1); /* 16 MiB gathered per rank */
    {
        bc_case k = {.bytes = (size_t)16 << 20, .root = 5};
        CHECK_EQ_INT(run_ranks(8, bc_rank, &k), 0);
    }

    check_counters();
    check_mismatches();

    /* Decode-like: thousands of small all-reduces, 8 ranks on few CPUs. */
    {
        stress_ctx k = {.iters = 5000, .count = 64};
        CHECK_EQ_INT(run_ranks(8, stress_rank, &k), 0);
        stress_ctx k2 = {.iters = 20000, .count = 3};
        CHECK_EQ_INT(run_ranks(2, stress_rank, &k2), 0);
    }
    return test_summary();
}
